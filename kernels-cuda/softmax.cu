// softmax.cu — soft_max_ext, argmax and top_k of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml-cpu ops.cpp (ggml_compute_forward_soft_max_f32,
// ..._argmax_f32, ..._top_k_f32) and vec.h (ggml_vec_argmax_f32).
// Self-contained: no headers; f16 -> f32 via the PTX `cvt` instruction.
//
// Launch (all kernels): one block per row, blockDim = (B, 1, 1) with B a
// multiple of 64 in [64, 1024] (256 recommended); gridDim = (gx, 1, 1),
// gx = min(nrows, 2^31 - 1). Blocks loop over rows with a grid stride, so
// any gx >= 1 is correct. No dynamic shared memory.
//
// sg_soft_max_f32            mask F32 (or none)
// sg_soft_max_f32_mask_f16   mask F16 (or none)
//   ggml_soft_max_ext(a, mask, scale, max_bias) with optional sinks
//   (ggml_soft_max_add_sinks). Arguments:
//     const char *src,              // F32 [ne00, ne01, ne02, ne03]
//     const char *mask,             // nullptr, or [>= ne00, >= ne01, ne12, ne13]
//     const char *sinks,            // nullptr, or F32 [ne02] (one per head)
//     char *dst,                    // F32, same shape as src
//     i64 ne00, ne01, ne02, ne03,
//     i64 nb00, nb01, nb02, nb03,   // src strides (bytes)
//     i64 ne12, ne13,               // mask dims 2 and 3 (broadcast: i02 % ne12, i03 % ne13)
//     i64 nb10, nb11, nb12, nb13,   // mask strides (bytes)
//     i64 nb0, nb1, nb2, nb3,       // dst strides (bytes)
//     float scale, float max_bias
//   Per row (i01, i02, i03), as ggml: w = x*scale (+ slope*mask[i0, i01,
//   i02 % ne12, i03 % ne13]), the mask row being i01 itself (a mask with more
//   rows than ne01 is allowed, rows beyond ne01 are unused); m = max(w)
//   (and the sink of head i02 if present); e = expf(w - m); sum in f64 (plus
//   expf(sink - m)); y = e * (float)(1/sum). ALiBi: with max_bias > 0 the slope
//   of head h = i02 is powf(m0, h+1) for h < n_head_log2, else
//   powf(m1, 2*(h - n_head_log2) + 1), n_head = ne02, n_head_log2 the largest
//   power of two <= n_head, m0 = 2^(-max_bias/n_head_log2),
//   m1 = 2^(-(max_bias/2)/n_head_log2); slope = 1 otherwise. The products
//   x*scale and slope*mask are rounded separately (no fused multiply-add).
//   dst is used as scratch between passes; in-place (dst == src) is allowed.
//
// sg_argmax_f32 (ggml_argmax): I32 index of the maximum of each of the ne01
//   rows of a F32 matrix, reproducing ggml_vec_argmax_f32 exactly: ties keep
//   the LAST maximal index, and NaN behaves as in its sequential loop
//   (`max = MAX(max, x); if (max == x) idx = i;`): trailing NaNs are ignored,
//   a NaN restarts the running maximum, an all-NaN (or empty) row gives 0.
//   Arguments: (const char *src, char *dst, i64 ne00, i64 ne01, i64 nb00,
//   i64 nb01, i64 nb0)  — dst is I32 [ne01] with stride nb0.
//
// sg_top_k_f32 (ggml_top_k): the k indices (I32) of the largest values of
//   each row, in a deterministic order: descending value, ties by lower index,
//   values compared by IEEE total order with -0 == +0 (NaN never breaks it:
//   +NaN above +inf, -NaN below -inf). ggml leaves the order unspecified (its
//   CPU swaps the first two entries); this order equals shardgraph's CPU
//   kernel. Arguments:
//     (const char *src, char *dst, i64 ne00, ne01, ne02, ne03,
//      i64 nb00, nb01, nb02, nb03, i64 k, i64 nb0, nb1, nb2, nb3)
//   dst is I32 [k, ne01, ne02, ne03]; 0 <= k <= ne00. Cost: k block-wide
//   selection passes over the row (O(k*ne00/B) per thread), meant for small k.

#include "common.cuh"

#include "block_reduce.cuh"

// ---------------------------------------------------------------------------
// soft_max_ext
// ---------------------------------------------------------------------------

template <bool MASK_F16>
__device__ __forceinline__ void soft_max_rows(
        const char *src, const char *mask, const char *sinks, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 ne12, i64 ne13,
        i64 nb10, i64 nb11, i64 nb12, i64 nb13,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        float scale, float max_bias) {
    __shared__ float shf[33];
    __shared__ double shd[33];

    // ALiBi constants (n_head = ne02).
    unsigned int n_head_log2 = 1;
    while ((i64) n_head_log2 * 2 <= ne02) n_head_log2 *= 2;
    const float m0 = powf(2.0f, -(max_bias) / (float) n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float) n_head_log2);

    const i64 nrows = ne01 * ne02 * ne03;
    for (i64 r = blockIdx.x; r < nrows; r += gridDim.x) {
        const i64 i01 = r % ne01;
        const i64 i02 = (r / ne01) % ne02;
        const i64 i03 = r / (ne01 * ne02);
        const char *x = src + i01 * nb01 + i02 * nb02 + i03 * nb03;
        char *y = dst + i01 * nb1 + i02 * nb2 + i03 * nb3;
        const char *mrow = mask ? mask + i01 * nb11 + (i02 % ne12) * nb12 + (i03 % ne13) * nb13 : nullptr;

        float slope = 1.0f;
        if (max_bias > 0.0f) {
            const unsigned int h = (unsigned int) i02;
            slope = h < n_head_log2 ? powf(m0, (float) (h + 1)) : powf(m1, (float) (2 * (h - n_head_log2) + 1));
        }

        // pass 1: w = x*scale + slope*mask, kept in dst; row maximum
        float lmax = sg_neg_inf();
        for (i64 i0 = threadIdx.x; i0 < ne00; i0 += blockDim.x) {
            float w = __fmul_rn(*(const float *) (x + i0 * nb00), scale);
            if (mrow) {
                const float m = MASK_F16 ? sg_h2f(*(const unsigned short *) (mrow + i0 * nb10))
                                         : *(const float *) (mrow + i0 * nb10);
                w = __fadd_rn(w, __fmul_rn(slope, m));
            }
            *(float *) (y + i0 * nb0) = w;
            lmax = lmax > w ? lmax : w;
        }
        float mx = sg_block_reduce<RMaxF>(lmax, shf, sg_neg_inf());
        float sink = 0.0f;
        if (sinks) {
            sink = *(const float *) (sinks + i02 * 4);
            mx = mx > sink ? mx : sink;
        }

        // pass 2: e = exp(w - max), sum in f64
        double s = 0.0;
        for (i64 i0 = threadIdx.x; i0 < ne00; i0 += blockDim.x) {
            const float e = expf(*(const float *) (y + i0 * nb0) - mx);
            *(float *) (y + i0 * nb0) = e;
            s += (double) e;
        }
        s = sg_block_reduce<RSum>(s, shd, 0.0);
        if (sinks) s += (double) expf(sink - mx);
        const float inv = (float) (1.0 / s);

        // pass 3: normalise
        for (i64 i0 = threadIdx.x; i0 < ne00; i0 += blockDim.x) {
            float *p = (float *) (y + i0 * nb0);
            *p = *p * inv;
        }
    }
}

#define SG_SOFT_MAX(NAME, MASK_F16)                                                      \
    extern "C" __global__ void NAME(                                                     \
            const char *src, const char *mask, const char *sinks, char *dst,             \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne12, i64 ne13,                                                          \
            i64 nb10, i64 nb11, i64 nb12, i64 nb13,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            float scale, float max_bias) {                                               \
        soft_max_rows<MASK_F16>(src, mask, sinks, dst, ne00, ne01, ne02, ne03,           \
                                nb00, nb01, nb02, nb03, ne12, ne13, nb10, nb11, nb12, nb13, \
                                nb0, nb1, nb2, nb3, scale, max_bias);                    \
    }

SG_SOFT_MAX(sg_soft_max_f32, false)
SG_SOFT_MAX(sg_soft_max_f32_mask_f16, true)

// ---------------------------------------------------------------------------
// argmax
// ---------------------------------------------------------------------------

extern "C" __global__ void sg_argmax_f32(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 nb00, i64 nb01, i64 nb0) {
    __shared__ i64 shi[33];
    __shared__ float shf[33];
    for (i64 r = blockIdx.x; r < ne01; r += gridDim.x) {
        const char *x = src + r * nb01;

        // L: last non-NaN position (-1 if none).
        i64 l = -1;
        for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
            const float v = *(const float *) (x + i * nb00);
            if (!isnan(v)) l = i;
        }
        const i64 last = sg_block_reduce<RMaxI>(l, shi, (i64) -1);
        if (last < 0) {
            if (threadIdx.x == 0) *(int *) (dst + r * nb0) = 0;
            continue;   // uniform across the block
        }

        // P: last NaN position before L (-1 if none); the sequential loop's
        // running maximum restarts right after it.
        i64 p = -1;
        for (i64 i = threadIdx.x; i < last; i += blockDim.x) {
            if (isnan(*(const float *) (x + i * nb00))) p = i;
        }
        const i64 start = sg_block_reduce<RMaxI>(p, shi, (i64) -1) + 1;

        // maximum over [start, last] (NaN-free), then its last position.
        float m = sg_neg_inf();
        for (i64 i = start + threadIdx.x; i <= last; i += blockDim.x) {
            const float v = *(const float *) (x + i * nb00);
            m = m > v ? m : v;
        }
        const float mx = sg_block_reduce<RMaxF>(m, shf, sg_neg_inf());
        i64 idx = -1;
        for (i64 i = start + threadIdx.x; i <= last; i += blockDim.x) {
            if (*(const float *) (x + i * nb00) == mx) idx = i;
        }
        const i64 res = sg_block_reduce<RMaxI>(idx, shi, (i64) -1);
        if (threadIdx.x == 0) *(int *) (dst + r * nb0) = (int) res;
    }
}

// ---------------------------------------------------------------------------
// top_k
// ---------------------------------------------------------------------------

extern "C" __global__ void sg_top_k_f32(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 k,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    __shared__ u64 shu[33];
    const u64 NONE = ~0ull;
    const i64 nrows = ne01 * ne02 * ne03;
    for (i64 r = blockIdx.x; r < nrows; r += gridDim.x) {
        const i64 i1 = r % ne01;
        const i64 i2 = (r / ne01) % ne02;
        const i64 i3 = r / (ne01 * ne02);
        const char *x = src + i1 * nb01 + i2 * nb02 + i3 * nb03;
        char *y = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        // Keys are unique (they hold the index), so the j-th selection is the
        // smallest key strictly greater than the (j-1)-th one.
        u64 prev = 0;
        bool first = true;
        for (i64 j = 0; j < k; ++j) {
            u64 best = NONE;
            for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
                const u64 key = sg_desc_key(*(const float *) (x + i * nb00), i);
                if ((first || key > prev) && key < best) best = key;
            }
            const u64 sel = sg_block_reduce<RMinU>(best, shu, NONE);
            if (threadIdx.x == 0) *(int *) (y + j * nb0) = (int) (unsigned int) (sel & 0xffffffffu);
            prev = sel;
            first = false;
        }
    }
}
