// reduce.cu — sum, sum_rows, mean and argsort of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml-cpu ops.cpp (ggml_compute_forward_sum_*,
// ..._sum_rows_f32, ..._mean_f32, ..._argsort_f32). Self-contained: no
// headers; f16 <-> f32 via the PTX `cvt` instructions, bf16 <-> f32 by bit
// manipulation (ggml's GGML_FP32_TO_BF16 rounding).
//
// Conventions shared by every kernel in this file
// -----------------------------------------------
// * Tensors are byte pointers plus ggml's shape (ne0 innermost) and byte
//   strides, all `long long` (int64). Any strides work (views, permutations).
// * blockDim = (B, 1, 1) with B a multiple of 64 in [64, 1024] (256
//   recommended). No dynamic shared memory.
// * dst must not overlap the source.
//
// sg_sum_f32, sg_sum_f16, sg_sum_bf16 (ggml_sum): the sum of every element
//   of src into dst[0], dst of the same type as src (one element).
//   Accumulated in f64 whatever the type, then rounded once to dst's type
//   (ggml accumulates F32 in f64 and F16/BF16 in f32; f64 is at least as
//   accurate and the order of the additions differs from ggml's anyway).
//   Launch: gridDim = (1, 1, 1) (one block does the whole tensor; blocks
//   other than block 0 return at once).
//   (const char *src, char *dst,
//    i64 ne00, ne01, ne02, ne03,      // src shape
//    i64 nb00, nb01, nb02, nb03)      // src strides (bytes)
//
// sg_sum_rows_f32 (ggml_sum_rows), sg_mean_f32 (ggml_mean): F32 src
//   [ne00, ne01, ne02, ne03] -> F32 dst [1, ne01, ne02, ne03]; each row summed
//   in f64 and rounded to f32 (mean then divides in f32 by (float) ne00, as
//   ggml). Launch: one block per row, gridDim = (gx, 1, 1) with
//   gx = min(nrows, 2^31 - 1), nrows = ne01*ne02*ne03 (grid-stride over
//   rows, so any gx >= 1 is correct).
//   (const char *src, char *dst,
//    i64 ne00, ne01, ne02, ne03,      // src shape
//    i64 nb00, nb01, nb02, nb03,      // src strides (bytes)
//    i64 nb0, nb1, nb2, nb3)          // dst strides (bytes; nb0 unused)
//
// sg_argsort_f32 (ggml_argsort): I32 dst of src's shape; each row of dst
//   holds the indices 0..ne00-1 ordered by the row's values, ascending
//   (order == 0, GGML_SORT_ORDER_ASC) or descending (order == 1). The order
//   is total and deterministic: values compare by IEEE total order with
//   -0 == +0 (NaN never breaks the sort: +NaN above +inf, -NaN below -inf),
//   equal values keep index order (a stable sort, in both directions); ggml
//   leaves ties unspecified. This equals shardgraph's CPU kernel.
//   Method: a bitonic sorting network over the next power of two >= ne00,
//   run in place on dst's row (the virtual elements beyond ne00 sort last
//   and are never touched), re-reading the values through the indices; one
//   block per row. Cost per row: O(log^2(ne00)) block-wide passes of ne00/2
//   comparisons. Requires ne00 <= 2^31 - 1.
//   Launch: as sum_rows (one block per row, grid-stride).
//   (const char *src, char *dst,
//    i64 ne00, ne01, ne02, ne03,      // shape of src == dst
//    i64 nb00, nb01, nb02, nb03,      // src strides (bytes)
//    i64 nb0, nb1, nb2, nb3,          // dst strides (bytes)
//    int order)                       // 0 ascending, 1 descending

#include "common.cuh"

#include "block_reduce.cuh"

// ---------------------------------------------------------------------------
// sum
// ---------------------------------------------------------------------------

struct LdF32 {
    static __device__ __forceinline__ float ld(const char *p) { return *(const float *) p; }
    static __device__ __forceinline__ void st(char *p, float v) { *(float *) p = v; }
};
struct LdF16 {
    static __device__ __forceinline__ float ld(const char *p) { return sg_h2f(*(const unsigned short *) p); }
    static __device__ __forceinline__ void st(char *p, float v) { *(unsigned short *) p = sg_f2h(v); }
};
struct LdBF16 {
    static __device__ __forceinline__ float ld(const char *p) { return sg_bf2f(*(const unsigned short *) p); }
    static __device__ __forceinline__ void st(char *p, float v) { *(unsigned short *) p = sg_f2bf(v); }
};

template <typename IO>
__device__ __forceinline__ void sum_all(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03) {
    __shared__ double sh[33];
    if (blockIdx.x != 0) return;       // uniform across the block
    const i64 n = ne00 * ne01 * ne02 * ne03;
    double s = 0.0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        const i64 i0 = i % ne00;
        const i64 r = i / ne00;
        const i64 i1 = r % ne01;
        const i64 i2 = (r / ne01) % ne02;
        const i64 i3 = r / (ne01 * ne02);
        s += (double) IO::ld(src + i0 * nb00 + i1 * nb01 + i2 * nb02 + i3 * nb03);
    }
    s = sg_block_sum(s, sh);
    if (threadIdx.x == 0) IO::st(dst, (float) s);
}

#define SG_SUM(NAME, IO)                                                                 \
    extern "C" __global__ void NAME(                                                     \
            const char *src, char *dst,                                                  \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03) {                                    \
        sum_all<IO>(src, dst, ne00, ne01, ne02, ne03, nb00, nb01, nb02, nb03);           \
    }

SG_SUM(sg_sum_f32, LdF32)
SG_SUM(sg_sum_f16, LdF16)
SG_SUM(sg_sum_bf16, LdBF16)

// ---------------------------------------------------------------------------
// sum_rows, mean
// ---------------------------------------------------------------------------

template <bool MEAN>
__device__ __forceinline__ void row_sums(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb1, i64 nb2, i64 nb3) {
    __shared__ double sh[33];
    const i64 nrows = ne01 * ne02 * ne03;
    for (i64 r = blockIdx.x; r < nrows; r += gridDim.x) {
        const i64 i1 = r % ne01;
        const i64 i2 = (r / ne01) % ne02;
        const i64 i3 = r / (ne01 * ne02);
        const char *x = src + i1 * nb01 + i2 * nb02 + i3 * nb03;
        double s = 0.0;
        for (i64 i0 = threadIdx.x; i0 < ne00; i0 += blockDim.x) {
            s += (double) *(const float *) (x + i0 * nb00);
        }
        s = sg_block_sum(s, sh);       // begins with a barrier: sh is free again
        if (threadIdx.x == 0) {
            float v = (float) s;
            if (MEAN) v = v / (float) ne00;
            *(float *) (dst + i1 * nb1 + i2 * nb2 + i3 * nb3) = v;
        }
    }
}

extern "C" __global__ void sg_sum_rows_f32(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    (void) nb0;
    row_sums<false>(src, dst, ne00, ne01, ne02, ne03, nb00, nb01, nb02, nb03, nb1, nb2, nb3);
}

extern "C" __global__ void sg_mean_f32(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    (void) nb0;
    row_sums<true>(src, dst, ne00, ne01, ne02, ne03, nb00, nb01, nb02, nb03, nb1, nb2, nb3);
}

// ---------------------------------------------------------------------------
// argsort
// ---------------------------------------------------------------------------

// Sort key of element i: the value's order (inverted for descending) above
// the index, so keys are unique and ascending keys give the wanted order.
__device__ __forceinline__ u64 sg_sort_key(const char *x, i64 nb00, int i, int desc) {
    unsigned int k = sg_ord_key(*(const float *) (x + (i64) i * nb00));
    if (desc) k = ~k;
    return ((u64) k << 32) | (u64) (unsigned int) i;
}

// Orders positions lo < hi of the index row y ascending by key.
__device__ __forceinline__ void sg_cmp_swap(const char *x, i64 nb00, char *y, i64 nb0, i64 lo, i64 hi, int desc) {
    int *pl = (int *) (y + lo * nb0);
    int *ph = (int *) (y + hi * nb0);
    const int a = *pl;
    const int b = *ph;
    if (sg_sort_key(x, nb00, a, desc) > sg_sort_key(x, nb00, b, desc)) {
        *pl = b;
        *ph = a;
    }
}

extern "C" __global__ void sg_argsort_f32(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int order) {
    const int desc = order != 0;
    i64 npow = 1;
    while (npow < ne00) npow <<= 1;
    const i64 half = npow >> 1;
    const i64 nrows = ne01 * ne02 * ne03;
    for (i64 r = blockIdx.x; r < nrows; r += gridDim.x) {
        const i64 i1 = r % ne01;
        const i64 i2 = (r / ne01) % ne02;
        const i64 i3 = r / (ne01 * ne02);
        const char *x = src + i1 * nb01 + i2 * nb02 + i3 * nb03;
        char *y = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        __syncthreads();               // the previous row is finished
        for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) *(int *) (y + i * nb0) = (int) i;
        __syncthreads();
        // Bitonic network where every merge sorts ascending: the first step
        // of a merge of size k compares mirrored positions, the later steps
        // compare positions j apart. Virtual elements (>= ne00) count as
        // +infinity, so a comparison involving one never swaps: skipped.
        for (i64 k = 2; k <= npow; k <<= 1) {
            const i64 hk = k >> 1;
            for (i64 t = threadIdx.x; t < half; t += blockDim.x) {
                const i64 base = (t / hk) * k;
                const i64 off = t % hk;
                const i64 lo = base + off;
                const i64 hi = base + k - 1 - off;
                if (hi < ne00) sg_cmp_swap(x, nb00, y, nb0, lo, hi, desc);
            }
            __syncthreads();
            for (i64 j = hk >> 1; j >= 1; j >>= 1) {
                for (i64 t = threadIdx.x; t < half; t += blockDim.x) {
                    const i64 lo = (t / j) * 2 * j + t % j;
                    const i64 hi = lo + j;
                    if (hi < ne00) sg_cmp_swap(x, nb00, y, nb0, lo, hi, desc);
                }
                __syncthreads();
            }
        }
    }
}
