// sg_emu.h — the CUDA C dialect of kernels-cuda/*.cu as host C++, for the
// GPU emulator (cargo feature `cuda-emu`). Every kernel file is compiled
// twice more by the host C++ compiler with this header in front and
// SG_CUDA_EMU defined: as CUDA compiles it (32-wide warps), and as HIP
// compiles it for a CDNA GPU (kernels-hip/sg_hip.h in front as well,
// SG_WARP 64: 64-wide waves). The runtime (runtime.cpp) runs a launch's
// blocks one after another and a block's threads as cooperative fibers, so
// __syncthreads, __syncthreads_or and warp shuffles have CUDA's and HIP's meaning.
// It exists to test the CUDA backend's host side (launch shapes, arguments,
// op dispatch) and the kernels' arithmetic on machines without a GPU; it is
// not fast.
#pragma once

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#define SG_CUDA_EMU 1

// Function and variable qualifiers. Each kernel file is wrapped in its own
// namespace, so its helpers cannot clash with another file's.
#define __global__
#define __device__ inline
#define __host__
#define __forceinline__
#define __noinline__
#define __restrict__
#define __launch_bounds__(...)
// A block's threads run as fibers of one host thread and blocks run one
// after another, so one static instance per kernel is the block's memory.
#define __shared__ static

// CUDA's math library names in the global namespace.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

struct sg_emu_dim3 {
    unsigned x, y, z;
};

// The running thread's coordinates, set by the runtime before it resumes a fiber.
struct sg_emu_state_t {
    sg_emu_dim3 tid, bid, bdim, gdim;
};
extern "C" sg_emu_state_t sg_emu_state;

#define threadIdx (sg_emu_state.tid)
#define blockIdx (sg_emu_state.bid)
#define blockDim (sg_emu_state.bdim)
#define gridDim (sg_emu_state.gdim)

// Barriers, implemented by the runtime (a fiber waits; the scheduler
// releases the group when every live member waits).
extern "C" void sg_emu_syncthreads(void);
extern "C" int sg_emu_syncthreads_or(int pred);
extern "C" unsigned long long sg_emu_shfl_xor(unsigned long long bits, int lane_mask, int width);

static inline void __syncthreads() { sg_emu_syncthreads(); }
static inline int __syncthreads_or(int p) { return sg_emu_syncthreads_or(p); }

// Shuffles: v of lane (lane ^ lane_mask) within the lane's segment of
// `width` lanes. CUDA's spelling (a 32-lane warp) and HIP's (__shfl_xor,
// a segment of `width` lanes of the wave). Every lane of the segment must
// be at the same shuffle, else the launch fails (a divergent shuffle).
template <typename T>
static inline T sg_emu_shfl(T v, int lane_mask, int width) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    unsigned long long b = 0;
    std::memcpy(&b, &v, sizeof(T));
    b = sg_emu_shfl_xor(b, lane_mask, width);
    T r;
    std::memcpy(&r, &b, sizeof(T));
    return r;
}
template <typename T>
static inline T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
    return sg_emu_shfl(v, lane_mask, width);
}
template <typename T>
static inline T __shfl_xor(T v, int lane_mask, int width) {
    return sg_emu_shfl(v, lane_mask, width);
}

// Threads of a block never run at the same time, so plain updates are atomic.
template <typename T>
static inline T atomicExch(T *p, T v) {
    T old = *p;
    *p = v;
    return old;
}
template <typename T>
static inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
static inline T atomicMax(T *p, T v) {
    T old = *p;
    *p = old < v ? v : old;
    return old;
}

// Arithmetic intrinsics with explicit rounding: one IEEE operation each
// (the emulator is compiled with -ffp-contract=off, so nothing is fused).
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline int __float2int_rz(float x) { return (int) x; }
static inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
static inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
static inline unsigned __float_as_uint(float f) {
    unsigned i;
    std::memcpy(&i, &f, 4);
    return i;
}
static inline float __uint_as_float(unsigned i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

// f16 <-> f32 as PTX cvt does them: exact widening; narrowing rounds to
// nearest even, with subnormals, infinities and NaN.
static inline float sg_emu_h2f(unsigned short h) {
    unsigned sign = (unsigned) (h & 0x8000u) << 16;
    unsigned exp = (h >> 10) & 0x1fu;
    unsigned man = h & 0x3ffu;
    unsigned bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            float f = std::ldexp((float) man, -24);
            return sign ? -f : f;
        }
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return __uint_as_float(bits);
}

static inline unsigned short sg_emu_f2h(float f) {
    unsigned x = __float_as_uint(f);
    unsigned sign = (x >> 16) & 0x8000u;
    unsigned ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or NaN (NaN stays a quiet NaN)
        return (unsigned short) (sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
    }
    if (ax >= 0x477ff000u) {  // rounds to >= 65520: infinity
        return (unsigned short) (sign | 0x7c00u);
    }
    if (ax < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
        float a = __uint_as_float(ax);
        // a * 2^24 is the subnormal's integer mantissa; nearbyint rounds half to even.
        float m = std::nearbyint(a * 16777216.0f);
        return (unsigned short) (sign | (unsigned) m);
    }
    unsigned e = (ax >> 23) - 112u;
    unsigned m = ax & 0x7fffffu;
    unsigned h = (e << 10) | (m >> 13);
    unsigned rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1;  // carry into the exponent is right
    return (unsigned short) (sign | h);
}

// Calls kernel `f` with its arguments read from `args[i]` (cuLaunchKernel's
// convention: one pointer per parameter, to a value of the parameter's type).
template <typename... A, std::size_t... I>
static inline void sg_emu_invoke(void (*f)(A...), void **args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A> *>(args[I])...);
}
template <typename... A>
static inline void sg_emu_call(void (*f)(A...), void **args) {
    sg_emu_invoke(f, args, std::index_sequence_for<A...>{});
}

// One registry entry per kernel.
struct sg_emu_entry {
    const char *name;
    void (*call)(void **args);
    int cooperative;  // the file uses block barriers or shuffles: run threads as fibers
};
