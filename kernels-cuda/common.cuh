// common.cuh — what every kernel file shares. NVRTC compiles each .cu file
// on its own, with no include path, so build.rs pastes this file in place of
// a file's `#include "common.cuh"` line (for NVRTC and for the emulator alike).

typedef long long i64;
typedef unsigned long long u64;

// f16 <-> f32 through PTX `cvt` (NVRTC has no cuda_fp16.h): exact widening,
// narrowing rounded to nearest even. The emulator does the same in C++.
__device__ __forceinline__ float sg_h2f(unsigned short h) {
    float f;
#ifdef SG_CUDA_EMU
    f = sg_emu_h2f(h);
#else
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
#endif
    return f;
}

__device__ __forceinline__ unsigned short sg_f2h(float f) {
    unsigned short h;
#ifdef SG_CUDA_EMU
    h = sg_emu_f2h(f);
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
#endif
    return h;
}

// An f16 stored at any byte address (quant blocks are only 2-byte aligned
// within rows that may start anywhere), read and written byte-wise.
__device__ __forceinline__ float sg_ld_h(const unsigned char *p) {
    return sg_h2f((unsigned short) (p[0] | (p[1] << 8)));
}

__device__ __forceinline__ void sg_st_h(unsigned char *p, float v) {
    const unsigned short h = sg_f2h(v);
    p[0] = (unsigned char) (h & 0xff);
    p[1] = (unsigned char) (h >> 8);
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
