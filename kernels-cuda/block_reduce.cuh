// block_reduce.cuh — block-wide reductions and value order keys shared by
// softmax.cu, reduce.cu and distributed.cu (pasted in place of their
// `#include "block_reduce.cuh"` by build.rs, after common.cuh).

// Reduction operators.
struct RSum { template <typename T> __device__ static __forceinline__ T f(T a, T b) { return a + b; } };
struct RMaxF { __device__ static __forceinline__ float f(float a, float b) { return fmaxf(a, b); } };
struct RMaxI { __device__ static __forceinline__ i64 f(i64 a, i64 b) { return a > b ? a : b; } };
struct RMinU { __device__ static __forceinline__ u64 f(u64 a, u64 b) { return a < b ? a : b; } };

template <typename R, typename T>
__device__ __forceinline__ T sg_warp_reduce(T v) {
    for (int o = 16; o > 0; o >>= 1) v = R::f(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block reduction (blockDim.x a multiple of 32; every thread gets the
// result). `sh` must hold at least 33 elements of T; `ident` is the identity of R.
template <typename R, typename T>
__device__ __forceinline__ T sg_block_reduce(T v, T *sh, T ident) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
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
