// common.cuh — what every kernel file shares. NVRTC compiles each .cu file
// on its own, with no include path, so build.rs pastes this file in place of
// a file's `#include "common.cuh"` line (for NVRTC and for the emulator alike).

typedef long long i64;
typedef unsigned long long u64;

// ---------------------------------------------------------------------------
// Vendor-specific: the wave size and shuffles (NVIDIA, or AMD through
// kernels-hip/sg_hip.h, which defines SG_HIP and SG_WARP).
// ---------------------------------------------------------------------------

// SG_WARP: threads per warp (NVIDIA: 32) or wave (AMD: 64 on CDNA, 32 on
// RDNA). Launches use blocks of a multiple of 64 threads, so a block is
// whole waves on every device.
#ifndef SG_WARP
#define SG_WARP 32
#endif

// sg_shfl_xor(v, o): v of lane (lane ^ o) of the same warp/wave (SG_WARP
// lanes), o < SG_WARP. sg_shfl_xor32(v, o): the same within the lane's
// group of 32, o < 32, for kernels that map their work onto groups of 32
// lanes (matrix-vector rows, attention keys) whatever the wave size. Every
// lane of the group must take part.
#if defined(SG_HIP)
#define sg_shfl_xor(v, o) __shfl_xor((v), (o), SG_WARP)
#define sg_shfl_xor32(v, o) __shfl_xor((v), (o), 32)
#else
#define sg_shfl_xor(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#define sg_shfl_xor32(v, o) __shfl_xor_sync(0xffffffffu, (v), (o))
#endif

// Sum of v over the lane's group of 32 (every lane gets it).
template <typename T>
__device__ __forceinline__ T sg_sum32(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += sg_shfl_xor32(v, o);
    return v;
}

// f16 <-> f32: exact widening, narrowing rounded to nearest even. NVIDIA:
// PTX `cvt` (NVRTC has no cuda_fp16.h); AMD: the compiler's _Float16
// (v_cvt_f32_f16 / v_cvt_f16_f32); the emulator does the same in C++.
__device__ __forceinline__ float sg_h2f(unsigned short h) {
    float f;
#if defined(SG_CUDA_EMU)
    f = sg_emu_h2f(h);
#elif defined(SG_HIP)
    f = (float) __builtin_bit_cast(_Float16, h);
#else
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
#endif
    return f;
}

// NVIDIA: the f16 leaves the asm zero-extended in a 32-bit register. With
// a 16-bit ("=h") output, ptxas 13.0 for sm_90 stored the low byte of the
// wrong half when that register went straight to a byte store (`st.u8`, as
// sg_st_h below does): every quantized block's f16 scale lost its low byte
// on an H200 (seen 2026-12-04), while 2-byte stores of the same value were
// right. The emulator cannot see this; scripts/gpu-check.sh's cuda_diff can.
__device__ __forceinline__ unsigned short sg_f2h(float f) {
#if defined(SG_CUDA_EMU)
    return sg_emu_f2h(f);
#elif defined(SG_HIP)
    return __builtin_bit_cast(unsigned short, (_Float16) f);
#else
    unsigned int h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; cvt.u32.u16 %0, t; }" : "=r"(h) : "f"(f));
    return (unsigned short) h;
#endif
}

// An f16 stored at any byte address (quant blocks are only 2-byte aligned
// within rows that may start anywhere), read and written byte-wise.
__device__ __forceinline__ float sg_ld_h(const unsigned char *p) {
    return sg_h2f((unsigned short) (p[0] | (p[1] << 8)));
}

__device__ __forceinline__ void sg_st_h(unsigned char *p, float v) {
    const unsigned int h = sg_f2h(v);
    p[0] = (unsigned char) (h & 0xffu);
    p[1] = (unsigned char) ((h >> 8) & 0xffu);
}

// BF16: exact widening; narrowing as GGML_FP32_TO_BF16 (round to nearest
// even, NaN kept quiet with its sign and high payload bits).
__device__ __forceinline__ float sg_bf2f(unsigned short h) { return __uint_as_float((unsigned int) h << 16); }

__device__ __forceinline__ unsigned short sg_f2bf(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short) ((u >> 16) | 64u);
    return (unsigned short) ((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

__device__ __forceinline__ float sg_neg_inf() { return __int_as_float(0xff800000); }
