// block_reduce.cuh — block-wide reductions and value order keys shared by
// softmax.cu, reduce.cu, norm.cu and distributed.cu (pasted in place of their
// `#include "block_reduce.cuh"` by build.rs, after common.cuh).

// Reduction operators.
struct RSum { template <typename T> __device__ static __forceinline__ T f(T a, T b) { return a + b; } };
struct RMaxF { __device__ static __forceinline__ float f(float a, float b) { return fmaxf(a, b); } };
struct RMaxI { __device__ static __forceinline__ i64 f(i64 a, i64 b) { return a > b ? a : b; } };
struct RMinU { __device__ static __forceinline__ u64 f(u64 a, u64 b) { return a < b ? a : b; } };

// Reduction over the warp/wave (SG_WARP lanes; every lane gets the result).
template <typename R, typename T>
__device__ __forceinline__ T sg_warp_reduce(T v) {
#pragma unroll
    for (int o = SG_WARP / 2; o > 0; o >>= 1) v = R::f(v, sg_shfl_xor(v, o));
    return v;
}

// Block reduction (blockDim.x a multiple of SG_WARP; every thread gets the
// result). `sh` must hold at least 33 elements of T; `ident` is the
// identity of R. Waves: at most 1024 / SG_WARP = 32 (NVIDIA, RDNA) or 16
// (CDNA) partial results in sh[0..], the total in sh[32].
template <typename R, typename T>
__device__ __forceinline__ T sg_block_reduce(T v, T *sh, T ident) {
    const int lane = threadIdx.x % SG_WARP;
    const int warp = threadIdx.x / SG_WARP;
    const int nwarps = (blockDim.x + SG_WARP - 1) / SG_WARP;
    v = sg_warp_reduce<R>(v);
    __syncthreads();                   // a previous call may still be reading sh
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T t = lane < nwarps ? sh[lane] : ident;
        t = sg_warp_reduce<R>(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}

// Sum over the block (as sg_block_reduce).
template <typename T>
__device__ __forceinline__ T sg_block_sum(T v, T *sh) {
    return sg_block_reduce<RSum>(v, sh, (T) 0);
}

// u32 whose unsigned order is the IEEE total order of v, with -0 == +0
// (+NaN above +inf, -NaN below -inf).
__device__ __forceinline__ unsigned int sg_ord_key(float v) {
    const unsigned int bits = (v == 0.0f) ? 0u : __float_as_uint(v);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Smaller key = earlier: descending value, then lower index (top_k's order).
__device__ __forceinline__ u64 sg_desc_key(float v, i64 i) {
    return ((u64) (~sg_ord_key(v)) << 32) | (u64) (unsigned int) i;
}
