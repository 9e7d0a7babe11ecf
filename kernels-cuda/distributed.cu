// distributed.cu — the meta backend's ops (src/ops/distributed.rs) on the
// CUDA backend (NVRTC, C++17): the two halves of a per-row op whose rows
// are split across devices (row_stats on each device's part, row_finish
// from every device's statistics), get_rows from a table holding some of
// its rows (get_rows_part), and the sum of a partial tensor's addends
// (add_n). Semantics are shardgraph's CPU kernels
// (src/backend/cpu/kernels/distributed.rs), which reproduce one device's
// row ops: ggml-cpu ops.cpp's rms_norm/norm/l2_norm/soft_max (f64 sums),
// ggml_vec_argmax_f32's scan, and shardgraph's top_k order.
//
// Statistics are F32 words, `w` per row: an f64 sum travels as (hi, lo) =
// ((float) s, (float) (s - hi)); indices travel as the bits of an int in a
// float word (__int_as_float).
//
// sg_row_stats_f32 (const char *x, const char *mask, int mask_f16, char *st,
//     i64 ne00, ne01, ne02, ne03, i64 nb00, nb01, nb02, nb03,   // x, F32
//     i64 nb11,                                                 // mask row stride (2-D mask [ne00, >= ne01])
//     int kind, float scale, i64 k,
//     i64 r0a, r0b, r1a, r1b, r2a, r2b, r3a, r3b)               // global ranges of the part (up to 4; empty: a = b)
//   One block per row (grid-stride), blockDim a multiple of 64; st is F32
//   [w, ne01*ne02*ne03] contiguous. kind: 0 Σx² (w 2), 1 Σx (w 2),
//   2 (Σx, Σ(x − mean)²) (w 2), 3 soft_max's (max v, Σexp(v − max)) of
//   v = x*scale + mask[i0, i01] (w 2), 4 argmax scan summary (w 2: value,
//   code), 5 top_k: the k best (value, global index) in order, padded with
//   (−inf, −1) (w 2k).
//   Argmax codes: kind in bits 30..31 (0 plain: a NaN-free part; 1 reset:
//   after the part's last NaN; 2 plain, then a trailing NaN run), the global
//   index in bits 0..29 (2^30 − 1: none).
//
// sg_sum_all (const char *x, int ty, char *st, i64 ne00, ne01, ne02, ne03,
//     i64 nb00, nb01, nb02, nb03)
//   One block: st[0] = (float) Σ of every element (f64), ty 0 F32, 1 F16, 2 BF16.
//
// sg_row_finish_f32 (const char *st, const char *x, const char *mask, int mask_f16, char *dst,
//     i64 rows, i64 ndev, i64 w,
//     i64 ne00, ne01, ne02, ne03, i64 nb00, nb01, nb02, nb03,  // x (kinds 0..3)
//     i64 nb11,                                                // mask row stride
//     i64 nb0, nb1, nb2, nb3,                                  // dst strides
//     int kind, float eps, float scale, i64 k, i64 n_global,
//     i64 len0, len1, len2, len3, len4, len5, len6, len7)      // part lengths (kind 2; up to 8 devices)
//   st F32 [w, rows, ndev] contiguous. One block per row. kind: 0 rms_norm,
//   1 l2_norm, 2 norm, 3 soft_max (dst F32 of x's shape); 4 argmax (dst I32
//   [rows]); 5 top_k (dst I32 [k, ne01, ne02, ne03]); 6 sum_rows, 7 mean
//   (dst F32 [1, ne01, ne02, ne03]); 8 sum (dst [1], ty in `k`: 0 F32, 1 F16, 2 BF16).
//
// sg_get_rows_part_<t>_<idx> (const char *src0, const char *idx, char *dst,
//     i64 ne00, i64 n_rows, i64 nb00, nb01, nb02, nb03, i64 ne10, ne11, ne12,
//     i64 nb10, nb11, nb12, i64 nb0, nb1, nb2, nb3, int *err,
//     i64 r0a, r0b, r1a, r1b, r2a, r2b, r3a, r3b)
//   get_rows where the table holds the global rows of the ranges (in order):
//   ids it does not hold give zero rows; ids outside [0, n_rows) give zero
//   rows and set *err. Launch as get_rows in getrows.cu.
//
// sg_add_n_<t> (char *dst, i64 n, i64 count, const char *s0, ..., const char *s7)
//   dst[i] = s0[i] + … over `count` (1..8) contiguous sources of n elements:
//   floats summed in f32 and rounded once, integers wrapping.
//   Grid-stride over elements.

#include "common.cuh"

#include "block_reduce.cuh"

#include "dequant.cuh"

// Global position of local position i of a part holding up to 4 ranges.
struct Ranges {
    i64 a[4], b[4];
    __device__ __forceinline__ i64 global(i64 i) const {
        for (int r = 0; r < 4; ++r) {
            const i64 n = b[r] - a[r];
            if (i < n) return a[r] + i;
            i -= n;
        }
        return -1;
    }
    // Local position of global g, or -1.
    __device__ __forceinline__ i64 local(i64 g) const {
        i64 base = 0;
        for (int r = 0; r < 4; ++r) {
            if (g >= a[r] && g < b[r]) return base + g - a[r];
            base += b[r] - a[r];
        }
        return -1;
    }
};

__device__ __forceinline__ float dist_mask(const char *mrow, int f16, i64 i) {
    return f16 ? sg_h2f(*(const unsigned short *) (mrow + i * 2)) : *(const float *) (mrow + i * 4);
}

#define NONE_IDX 1073741823ll

// The NaN-free scan of x[a, b): its maximum and last position (local), or (-inf, -1).
__device__ __forceinline__ void dist_plain(const char *x, i64 nb00, i64 a, i64 b, float *shf, i64 *shi,
                                           float *mx, i64 *at) {
    float m = sg_neg_inf();
    bool any = false;
    for (i64 i = a + threadIdx.x; i < b; i += blockDim.x) {
        const float v = *(const float *) (x + i * nb00);
        m = m > v ? m : v;
        any = true;
    }
    const float best = sg_block_reduce<RMaxF>(m, shf, sg_neg_inf());
    i64 idx = -1;
    for (i64 i = a + threadIdx.x; i < b; i += blockDim.x) {
        if (*(const float *) (x + i * nb00) == best) idx = i;
    }
    (void) any;
    *at = sg_block_reduce<RMaxI>(idx, shi, (i64) -1);
    *mx = best;
}

extern "C" __global__ void sg_row_stats_f32(
        const char *x, const char *mask, int mask_f16, char *st,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb11,
        int kind, float scale, i64 k,
        i64 r0a, i64 r0b, i64 r1a, i64 r1b, i64 r2a, i64 r2b, i64 r3a, i64 r3b) {
    __shared__ double shd[33];
    __shared__ float shf[33];
    __shared__ i64 shi[33];
    __shared__ u64 shu[33];
    const Ranges rg = {{r0a, r1a, r2a, r3a}, {r0b, r1b, r2b, r3b}};
    const i64 nrows = ne01 * ne02 * ne03;
    const i64 w = kind == 5 ? 2 * k : 2;
    for (i64 r = blockIdx.x; r < nrows; r += gridDim.x) {
        const i64 i01 = r % ne01;
        const i64 i02 = (r / ne01) % ne02;
        const i64 i03 = r / (ne01 * ne02);
        const char *xr = x + i01 * nb01 + i02 * nb02 + i03 * nb03;
        float *out = (float *) st + r * w;
        if (kind == 0 || kind == 1 || kind == 2) {
            double s = 0.0;
            for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
                const double v = (double) *(const float *) (xr + i * nb00);
                s += kind == 0 ? v * v : v;
            }
            s = sg_block_reduce<RSum>(s, shd, 0.0);
            if (kind == 2) {
                const double mean = ne00 > 0 ? s / (double) ne00 : 0.0;
                double m2 = 0.0;
                for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
                    const double d = (double) *(const float *) (xr + i * nb00) - mean;
                    m2 += d * d;
                }
                m2 = sg_block_reduce<RSum>(m2, shd, 0.0);
                if (threadIdx.x == 0) {
                    out[0] = (float) s;
                    out[1] = (float) m2;
                }
            } else if (threadIdx.x == 0) {
                const float hi = (float) s;
                out[0] = hi;
                out[1] = (float) (s - (double) hi);
            }
        } else if (kind == 3) {
            const char *mrow = mask ? mask + i01 * nb11 : nullptr;
            float m = sg_neg_inf();
            for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
                float v = __fmul_rn(*(const float *) (xr + i * nb00), scale);
                if (mrow) v = __fadd_rn(v, dist_mask(mrow, mask_f16, i));
                m = m > v ? m : v;
            }
            const float mx = sg_block_reduce<RMaxF>(m, shf, sg_neg_inf());
            double s = 0.0;
            if (mx != sg_neg_inf()) {
                for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
                    float v = __fmul_rn(*(const float *) (xr + i * nb00), scale);
                    if (mrow) v = __fadd_rn(v, dist_mask(mrow, mask_f16, i));
                    s += (double) expf(v - mx);
                }
            }
            s = sg_block_reduce<RSum>(s, shd, 0.0);
            if (threadIdx.x == 0) {
                out[0] = mx;
                out[1] = (float) s;
            }
        } else if (kind == 4) {
            // The last NaN, then the scan of what decides the index.
            i64 ln = -1, lv = -1;
            for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
                if (isnan(*(const float *) (xr + i * nb00))) ln = i; else lv = i;
            }
            const i64 last_nan = sg_block_reduce<RMaxI>(ln, shi, (i64) -1);
            const i64 end = sg_block_reduce<RMaxI>(lv, shi, (i64) -1) + 1;
            float mx;
            i64 at;
            unsigned int code_kind;
            if (last_nan < 0) {
                dist_plain(xr, nb00, 0, ne00, shf, shi, &mx, &at);
                code_kind = 0;
            } else if (last_nan + 1 < ne00) {
                dist_plain(xr, nb00, last_nan + 1, ne00, shf, shi, &mx, &at);
                code_kind = 1;
            } else {
                i64 p = -1;
                for (i64 i = threadIdx.x; i < end; i += blockDim.x) {
                    if (isnan(*(const float *) (xr + i * nb00))) p = i;
                }
                const i64 inner = sg_block_reduce<RMaxI>(p, shi, (i64) -1);
                if (inner >= 0) {
                    dist_plain(xr, nb00, inner + 1, end, shf, shi, &mx, &at);
                    mx = __int_as_float(0x7fc00000);
                    code_kind = 1;
                } else {
                    dist_plain(xr, nb00, 0, end, shf, shi, &mx, &at);
                    code_kind = 2;
                }
            }
            if (threadIdx.x == 0) {
                const i64 g = at >= 0 ? rg.global(at) : NONE_IDX;
                out[0] = mx;
                out[1] = __int_as_float((int) ((code_kind << 30) | (unsigned int) (g & NONE_IDX)));
            }
        } else if (kind == 5) {
            const u64 NONE = ~0ull;
            u64 prev = 0;
            bool first = true;
            for (i64 j = 0; j < k; ++j) {
                u64 best = NONE;
                for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
                    const u64 key = sg_desc_key(*(const float *) (xr + i * nb00), i);
                    if ((first || key > prev) && key < best) best = key;
                }
                const u64 sel = sg_block_reduce<RMinU>(best, shu, NONE);
                if (threadIdx.x == 0) {
                    if (sel == NONE) {
                        out[2 * j] = sg_neg_inf();
                        out[2 * j + 1] = __int_as_float(-1);
                    } else {
                        const i64 li = (i64) (sel & 0xffffffffull);
                        out[2 * j] = *(const float *) (xr + li * nb00);
                        out[2 * j + 1] = __int_as_float((int) rg.global(li));
                    }
                }
                prev = sel;
                first = false;
            }
        }
    }
}

extern "C" __global__ void sg_sum_all(
        const char *x, int ty, char *st,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03) {
    __shared__ double shd[33];
    double s = 0.0;
    const i64 n = ne00 * ne01 * ne02 * ne03;
    for (i64 e = threadIdx.x; e < n; e += blockDim.x) {
        const i64 i0 = e % ne00;
        const i64 i1 = (e / ne00) % ne01;
        const i64 i2 = (e / (ne00 * ne01)) % ne02;
        const i64 i3 = e / (ne00 * ne01 * ne02);
        const char *p = x + i0 * nb00 + i1 * nb01 + i2 * nb02 + i3 * nb03;
        const float v = ty == 0 ? *(const float *) p
                      : ty == 1 ? sg_h2f(*(const unsigned short *) p) : sg_bf2f(*(const unsigned short *) p);
        s += (double) v;
    }
    s = sg_block_reduce<RSum>(s, shd, 0.0);
    if (threadIdx.x == 0) *(float *) st = (float) s;
}

extern "C" __global__ void sg_row_finish_f32(
        const char *st, const char *x, const char *mask, int mask_f16, char *dst,
        i64 rows, i64 ndev, i64 w,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb11,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int kind, float eps, float scale, i64 k, i64 n_global,
        i64 len0, i64 len1, i64 len2, i64 len3, i64 len4, i64 len5, i64 len6, i64 len7) {
    __shared__ float shs[2];
    __shared__ u64 shu[33];
    const i64 lens[8] = {len0, len1, len2, len3, len4, len5, len6, len7};
    const float *g = (const float *) st;
    // Word q of row r of device d.
#define W(q, r, d) g[(q) + w * ((r) + rows * (d))]
    if (kind == 8) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            double s = 0.0;
            for (i64 d = 0; d < ndev; ++d) s += (double) W(0, 0, d);
            const float v = (float) s;
            if (k == 0) *(float *) dst = v;
            else if (k == 1) *(unsigned short *) dst = sg_f2h(v);
            else *(unsigned short *) dst = sg_f2bf(v);
        }
        return;
    }
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const i64 i01 = r % ne01;
        const i64 i02 = (r / ne01) % ne02;
        const i64 i03 = r / (ne01 * ne02);
        if (kind == 4) {
            if (threadIdx.x == 0) {
                bool plain = true;
                for (i64 d = 0; d < ndev; ++d) plain = plain && (((unsigned int) __float_as_int(W(1, r, d))) >> 30) == 0;
                i64 at = 0;
                if (plain) {
                    float bv = 0.0f;
                    i64 bi = -1;
                    for (i64 d = 0; d < ndev; ++d) {
                        const float v = W(0, r, d);
                        const i64 i = (i64) (((unsigned int) __float_as_int(W(1, r, d))) & NONE_IDX);
                        if (i != NONE_IDX && (bi < 0 || v > bv || (v == bv && i > bi))) {
                            bv = v;
                            bi = i;
                        }
                    }
                    at = bi < 0 ? 0 : bi;
                } else {
                    float mx = sg_neg_inf();
                    for (i64 d = 0; d < ndev; ++d) {
                        const float v = W(0, r, d);
                        const unsigned int c = (unsigned int) __float_as_int(W(1, r, d));
                        const i64 i = (i64) (c & NONE_IDX);
                        if ((c >> 30) == 1) {
                            mx = v;
                            at = i;
                        } else {
                            if (i != NONE_IDX && (isnan(mx) || v >= mx)) {
                                mx = v;
                                at = i;
                            }
                            if ((c >> 30) == 2) mx = __int_as_float(0x7fc00000);
                        }
                    }
                }
                *(int *) (dst + r * nb0) = (int) at;
            }
            continue;
        }
        if (kind == 5) {
            const u64 NONE = ~0ull;
            u64 prev = 0;
            bool first = true;
            char *y = dst + i01 * nb1 + i02 * nb2 + i03 * nb3;
            const i64 nc = ndev * k;
            for (i64 j = 0; j < k; ++j) {
                u64 best = NONE;
                for (i64 c = threadIdx.x; c < nc; c += blockDim.x) {
                    const i64 d = c / k, q = c % k;
                    const int gi = __float_as_int(W(2 * q + 1, r, d));
                    if (gi < 0) continue;
                    const u64 key = sg_desc_key(W(2 * q, r, d), gi);
                    if ((first || key > prev) && key < best) best = key;
                }
                const u64 sel = sg_block_reduce<RMinU>(best, shu, NONE);
                if (threadIdx.x == 0) *(int *) (y + j * nb0) = (int) (unsigned int) (sel & 0xffffffffull);
                prev = sel;
                first = false;
            }
            continue;
        }
        if (kind == 6 || kind == 7) {
            if (threadIdx.x == 0) {
                double s = 0.0;
                for (i64 d = 0; d < ndev; ++d) s += (double) W(0, r, d) + (double) W(1, r, d);
                float v = (float) s;
                if (kind == 7) v = v / (float) n_global;
                *(float *) (dst + i01 * nb1 + i02 * nb2 + i03 * nb3) = v;
            }
            continue;
        }
        // Norms and soft_max: the row's factors, then the part rescaled.
        if (threadIdx.x == 0) {
            float a = 0.0f, b = 0.0f;
            if (kind == 0 || kind == 1) {
                double s = 0.0;
                for (i64 d = 0; d < ndev; ++d) s += (double) W(0, r, d) + (double) W(1, r, d);
                a = kind == 0 ? 1.0f / sqrtf((float) (s / (double) (n_global > 0 ? n_global : 1)) + eps)
                              : 1.0f / fmaxf((float) sqrt(s), eps);
            } else if (kind == 2) {
                const double n = (double) (n_global > 0 ? n_global : 1);
                double tot = 0.0;
                for (i64 d = 0; d < ndev; ++d) tot += (double) W(0, r, d);
                const double mean = tot / n;
                double m2 = 0.0;
                for (i64 d = 0; d < ndev && d < 8; ++d) {
                    if (lens[d] > 0) {
                        const double nd = (double) lens[d];
                        const double dm = (double) W(0, r, d) / nd - mean;
                        m2 += (double) W(1, r, d) + nd * dm * dm;
                    }
                }
                a = 1.0f / sqrtf((float) (m2 / n) + eps);
                b = (float) mean;
            } else {
                float gmax = sg_neg_inf();
                for (i64 d = 0; d < ndev; ++d) gmax = gmax > W(0, r, d) ? gmax : W(0, r, d);
                double s = 0.0;
                for (i64 d = 0; d < ndev; ++d) {
                    if (W(0, r, d) != sg_neg_inf()) s += (double) W(1, r, d) * exp((double) (W(0, r, d) - gmax));
                }
                a = (float) (1.0 / s);
                b = gmax;
            }
            shs[0] = a;
            shs[1] = b;
        }
        __syncthreads();
        const float a = shs[0], b = shs[1];
        const char *xr = x + i01 * nb01 + i02 * nb02 + i03 * nb03;
        char *y = dst + i01 * nb1 + i02 * nb2 + i03 * nb3;
        const char *mrow = mask ? mask + i01 * nb11 : nullptr;
        for (i64 i = threadIdx.x; i < ne00; i += blockDim.x) {
            const float v = *(const float *) (xr + i * nb00);
            float o;
            if (kind == 2) o = (v - b) * a;
            else if (kind == 3) {
                float u = __fmul_rn(v, scale);
                if (mrow) u = __fadd_rn(u, dist_mask(mrow, mask_f16, i));
                o = expf(u - b) * a;
            } else o = v * a;
            *(float *) (y + i * nb0) = o;
        }
        __syncthreads();
    }
#undef W
}

template <typename DQ, typename IX>
__device__ __forceinline__ void get_rows_part_impl(
        const char *src0, const char *idx, char *dst,
        i64 ne00, i64 n_rows,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 ne10, i64 ne11, i64 ne12,
        i64 nb10, i64 nb11, i64 nb12,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int *err, const Ranges rg) {
    const i64 nrows = ne10 * ne11 * ne12;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i10 = r % ne10;
        const i64 i11 = (r / ne10) % ne11;
        const i64 i12 = r / (ne10 * ne11);
        const i64 id = IX::at(idx + i10 * nb10 + i11 * nb11 + i12 * nb12);
        char *d = dst + i10 * nb1 + i11 * nb2 + i12 * nb3;
        const bool ok = id >= 0 && id < n_rows;
        if (!ok && err && blockIdx.x == 0 && threadIdx.x == 0) atomicExch(err, 1);
        const i64 l = ok ? rg.local(id) : -1;
        const char *row = src0 + l * nb01 + i11 * nb02 + i12 * nb03;
        for (i64 j = (i64) blockIdx.x * blockDim.x + threadIdx.x; j < ne00; j += (i64) gridDim.x * blockDim.x) {
            *(float *) (d + j * nb0) = l >= 0 ? (float) DQ::at(row, j, nb00) : 0.0f;
        }
    }
}

struct PartI32 { __device__ static __forceinline__ i64 at(const char *p) { return (i64) *(const int *) p; } };
struct PartI64 { __device__ static __forceinline__ i64 at(const char *p) { return *(const i64 *) p; } };

#define SG_GET_ROWS_PART(NAME, DQ, IX)                                                   \
    extern "C" __global__ void NAME(                                                     \
            const char *src0, const char *idx, char *dst,                                \
            i64 ne00, i64 n_rows,                                                        \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne10, i64 ne11, i64 ne12,                                                \
            i64 nb10, i64 nb11, i64 nb12,                                                \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            int *err,                                                                    \
            i64 r0a, i64 r0b, i64 r1a, i64 r1b, i64 r2a, i64 r2b, i64 r3a, i64 r3b) {    \
        const Ranges rg = {{r0a, r1a, r2a, r3a}, {r0b, r1b, r2b, r3b}};                  \
        get_rows_part_impl<DQ, IX>(src0, idx, dst, ne00, n_rows, nb00, nb01, nb02, nb03, \
                                   ne10, ne11, ne12, nb10, nb11, nb12, nb0, nb1, nb2, nb3, err, rg); \
    }

#define SG_GET_ROWS_PART_BOTH(T, DQ)                                 \
    SG_GET_ROWS_PART(sg_get_rows_part_##T##_i32, DQ, PartI32)        \
    SG_GET_ROWS_PART(sg_get_rows_part_##T##_i64, DQ, PartI64)

SG_GET_ROWS_PART_BOTH(f32, DqF32)
SG_GET_ROWS_PART_BOTH(f16, DqF16)
SG_GET_ROWS_PART_BOTH(bf16, DqBF16)
SG_GET_ROWS_PART_BOTH(q8_0, DqQ8_0)
SG_GET_ROWS_PART_BOTH(q4_0, DqQ4_0)
SG_GET_ROWS_PART_BOTH(q4_1, DqQ4_1)
SG_GET_ROWS_PART_BOTH(q5_0, DqQ5_0)
SG_GET_ROWS_PART_BOTH(q5_1, DqQ5_1)
SG_GET_ROWS_PART_BOTH(q2_K, DqQ2_K)
SG_GET_ROWS_PART_BOTH(q3_K, DqQ3_K)
SG_GET_ROWS_PART_BOTH(q4_K, DqQ4_K)
SG_GET_ROWS_PART_BOTH(q5_K, DqQ5_K)
SG_GET_ROWS_PART_BOTH(q6_K, DqQ6_K)
SG_CHUNK_TYPES(SG_GET_ROWS_PART_BOTH)

// add_n: element loaders and stores by type.
struct AnF32 {
    typedef float A;
    __device__ static __forceinline__ float ld(const char *p, i64 i) { return ((const float *) p)[i]; }
    __device__ static __forceinline__ void st(char *p, i64 i, float v) { ((float *) p)[i] = v; }
};
struct AnF16 {
    typedef float A;
    __device__ static __forceinline__ float ld(const char *p, i64 i) { return sg_h2f(((const unsigned short *) p)[i]); }
    __device__ static __forceinline__ void st(char *p, i64 i, float v) { ((unsigned short *) p)[i] = sg_f2h(v); }
};
struct AnBF16 {
    typedef float A;
    __device__ static __forceinline__ float ld(const char *p, i64 i) { return sg_bf2f(((const unsigned short *) p)[i]); }
    __device__ static __forceinline__ void st(char *p, i64 i, float v) { ((unsigned short *) p)[i] = sg_f2bf(v); }
};
struct AnI32 {
    typedef unsigned int A;
    __device__ static __forceinline__ unsigned int ld(const char *p, i64 i) { return ((const unsigned int *) p)[i]; }
    __device__ static __forceinline__ void st(char *p, i64 i, unsigned int v) { ((unsigned int *) p)[i] = v; }
};
struct AnI64 {
    typedef u64 A;
    __device__ static __forceinline__ u64 ld(const char *p, i64 i) { return ((const u64 *) p)[i]; }
    __device__ static __forceinline__ void st(char *p, i64 i, u64 v) { ((u64 *) p)[i] = v; }
};

template <typename T>
__device__ __forceinline__ void add_n_impl(char *dst, i64 n, i64 count, const char *const *s) {
    for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64) gridDim.x * blockDim.x) {
        typename T::A acc = T::ld(s[0], i);
        for (i64 c = 1; c < count; ++c) acc = acc + T::ld(s[c], i);
        T::st(dst, i, acc);
    }
}

#define SG_ADD_N(NAME, T)                                                                        \
    extern "C" __global__ void NAME(char *dst, i64 n, i64 count,                                 \
                                    const char *s0, const char *s1, const char *s2, const char *s3, \
                                    const char *s4, const char *s5, const char *s6, const char *s7) { \
        const char *s[8] = {s0, s1, s2, s3, s4, s5, s6, s7};                                     \
        add_n_impl<T>(dst, n, count, s);                                                         \
    }

SG_ADD_N(sg_add_n_f32, AnF32)
SG_ADD_N(sg_add_n_f16, AnF16)
SG_ADD_N(sg_add_n_bf16, AnBF16)
SG_ADD_N(sg_add_n_i32, AnI32)
SG_ADD_N(sg_add_n_i64, AnI64)
