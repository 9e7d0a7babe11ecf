// flash_attn.cu — flash_attn_ext forward of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml (ggml.c ggml_flash_attn_ext, ggml-cpu ops.cpp
// ggml_compute_forward_flash_attn_ext_f16_one_chunk): per query row,
// softmax(scale * K q (softcapped) + slope * mask) applied to V, with an
// online (streaming) softmax in f32. K and V values come from dequant.cuh
// (ggml's dequantize_row_* value by value; block layouts of ggml-common.h),
// pasted in by build.rs with common.cuh (f16 -> f32 via the PTX `cvt`).
//
// Kernels: sg_flash_attn_ext_<K type>_<V type>, each type one of
// f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (64 kernels, e.g.
// sg_flash_attn_ext_f16_f16, sg_flash_attn_ext_q8_0_q5_1), plus
// sg_flash_attn_ext_bf16_bf16 (BF16 K and V; bf16 -> f32 is exact).
// Q is F32, the mask F16, the result F32.
//   (const char *q,          // F32 [DK, n_q, H, ne3], rows packed
//    const char *k,          // [DK, n_kv, Hk, nek3], rows packed (blocks for block types)
//    const char *v,          // [DV, n_kv, Hv, nev3], rows packed
//    const char *mask,       // nullptr, or F16 [>= n_kv, >= n_q, nem2, nem3], rows packed
//    const char *sinks,      // nullptr, or F32 [H] (ggml_flash_attn_ext_add_sinks)
//    char *dst,              // F32 [DV, H, n_q, ne3] (ggml's permuted result), nb0 = 4
//    i64 DK, i64 DV,         // head sizes, each <= 1024 (see below)
//    i64 n_q, i64 H, i64 ne3,
//    i64 nbq1, nbq2, nbq3,   // q strides (bytes)
//    i64 n_kv, i64 Hk, i64 nek3,
//    i64 nbk1, nbk2, nbk3,   // k strides (bytes)
//    i64 Hv, i64 nev3,
//    i64 nbv1, nbv2, nbv3,   // v strides (bytes)
//    i64 nem2, i64 nem3,     // mask broadcast dims (H % nem2 == 0, ne3 % nem3 == 0)
//    i64 nbm1, nbm2, nbm3,   // mask strides (bytes)
//    i64 nb1, nb2, nb3,      // dst strides (bytes): element (d, h, i, i3) at
//                            //   d*4 + h*nb1 + i*nb2 + i3*nb3
//    float scale, float max_bias, float logit_softcap)
//
// Per query row (i, h, i3), as ggml: query head h reads K head h / (H / Hk)
// and K batch i3 / (ne3 / nek3), V likewise with Hv, nev3 (GQA / MQA
// broadcast); the mask row is mask[:, i, h % nem2, i3 % nem3].
// For each key c: s = dot(q, k_c) * scale', with scale' = scale/softcap and
// s = softcap * tanhf(s) when logit_softcap != 0 (else scale' = scale);
// then s += slope * mask[c]. Keys whose slope*mask is -inf are skipped (as
// the CPU's `continue`). ALiBi: slope = 1 when max_bias == 0, else
// powf(m0, h+1) for h < n_head_log2 and powf(m1, 2*(h - n_head_log2) + 1)
// otherwise, n_head_log2 the largest power of two <= H,
// m0 = powf(2, -max_bias / n_head_log2), m1 = powf(2, -(max_bias/2) / n_head_log2)
// (ggml requires a mask when max_bias > 0; without one the mask term is 0).
// Result: sum_c exp(s_c - M) v_c / sum_c exp(s_c - M), M the running
// maximum; with a sink sk = sinks[h] the denominator also gets exp(sk - M')
// (M' = max(M, sk)). A row whose keys are all skipped (and no sink) gives 0.
//
// Precision differences from ggml-cpu (same formulas, different rounding):
// q is used in f32 (the CPU first rounds q to F16 / BF16 for F16 / BF16 K,
// to Q8_0 blocks for Q8_0/Q4_0/Q5_0/IQ4_NL K and to Q8_1 blocks for Q4_1/Q5_1 K,
// and accumulates V in F16 for F16 V); keys are processed in tiles of 64
// (one rescale per tile, not per key); dot products are lane-strided partial
// sums reduced by warp shuffles. Expect agreement
// to ~1e-6 relative of f32 math, not bit equality.
//
// Launch: one block per query row and head: blockDim = (B, 1, 1), B a
// multiple of 64 in [64, 1024] (128 recommended); gridDim = (gx, 1, 1), a
// grid-stride loop over the n_q*H*ne3 rows, gx = min(n_q*H*ne3, 2^31 - 1).
// No dynamic shared memory (about 8.6 KB static). DK or DV above 1024: the
// kernel writes nothing (ggml's largest head size is 576).

#include "common.cuh"

#include "dequant.cuh"

#define SG_FA_DMAX 1024
#define SG_FA_TILE 64

// Element j of a packed row of each storage type, as f32: dequant.cuh's
// per-value dequantisers (ggml's dequantize_row_* value by value), with the
// element stride of the unquantised types.
template <typename DQ, int ESIZE>
struct LDq {
    __device__ static __forceinline__ float at(const char *row, i64 j) { return DQ::at(row, j, ESIZE); }
};
typedef LDq<DqF32, 4> LF32;
typedef LDq<DqF16, 2> LF16;
typedef LDq<DqBF16, 2> LBF16;
typedef LDq<DqQ8_0, 0> LQ8_0;
typedef LDq<DqQ4_0, 0> LQ4_0;
typedef LDq<DqQ4_1, 0> LQ4_1;
typedef LDq<DqQ5_0, 0> LQ5_0;
typedef LDq<DqQ5_1, 0> LQ5_1;
typedef LDq<DqIQ4_NL, 0> LIQ4_NL;

template <typename KT, typename VT>
static __device__ __forceinline__ void flash_attn_impl(
        const char *q, const char *k, const char *v, const char *mask, const char *sinks, char *dst,
        i64 DK, i64 DV, i64 n_q, i64 H, i64 ne3,
        i64 nbq1, i64 nbq2, i64 nbq3,
        i64 n_kv, i64 Hk, i64 nek3, i64 nbk1, i64 nbk2, i64 nbk3,
        i64 Hv, i64 nev3, i64 nbv1, i64 nbv2, i64 nbv3,
        i64 nem2, i64 nem3, i64 nbm1, i64 nbm2, i64 nbm3,
        i64 nb1, i64 nb2, i64 nb3,
        float scale, float max_bias, float logit_softcap) {
    __shared__ float qs[SG_FA_DMAX];
    __shared__ float acc[SG_FA_DMAX];
    __shared__ float sc[SG_FA_TILE];
    if (DK > SG_FA_DMAX || DV > SG_FA_DMAX) return;

    const float neg_inf = sg_neg_inf();
    const float scl = logit_softcap != 0.0f ? scale / logit_softcap : scale;
    unsigned n_head_log2 = 1;
    while ((i64) n_head_log2 * 2 <= H) n_head_log2 *= 2;
    const float m0 = powf(2.0f, -(max_bias) / (float) n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / (float) n_head_log2);
    // Groups of 32 lanes, whatever the wave size (see sg_shfl_xor32).
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    const i64 rk2 = H / Hk, rk3 = ne3 / nek3, rv2 = H / Hv, rv3 = ne3 / nev3;

    const i64 nrows = n_q * H * ne3;
    for (i64 r = blockIdx.x; r < nrows; r += gridDim.x) {
        const i64 iq1 = r % n_q;
        const i64 iq2 = (r / n_q) % H;
        const i64 iq3 = r / (n_q * H);
        const unsigned h = (unsigned) iq2;
        const float slope = max_bias > 0.0f
                ? (h < n_head_log2 ? powf(m0, (float) (h + 1)) : powf(m1, (float) (2 * (h - n_head_log2) + 1)))
                : 1.0f;
        const char *kb = k + (iq2 / rk2) * nbk2 + (iq3 / rk3) * nbk3;
        const char *vb = v + (iq2 / rv2) * nbv2 + (iq3 / rv3) * nbv3;
        const unsigned short *mp = mask
                ? (const unsigned short *) (mask + iq1 * nbm1 + (iq2 % nem2) * nbm2 + (iq3 % nem3) * nbm3)
                : nullptr;

        __syncthreads();   // the previous row is done with qs / sc
        const float *qr = (const float *) (q + iq1 * nbq1 + iq2 * nbq2 + iq3 * nbq3);
        for (i64 d = threadIdx.x; d < DK; d += blockDim.x) qs[d] = qr[d];
        for (i64 d = threadIdx.x; d < DV; d += blockDim.x) acc[d] = 0.0f;
        __syncthreads();

        float M = neg_inf;   // running maximum (same value in every thread)
        float S = 0.0f;      // running denominator
        for (i64 c0 = 0; c0 < n_kv; c0 += SG_FA_TILE) {
            const int n = (int) (n_kv - c0 < SG_FA_TILE ? n_kv - c0 : SG_FA_TILE);
            // Scores of this tile: one group of 32 lanes per key (a warp on
            // NVIDIA, half a wave on CDNA; sg_sum32 stays within it).
            for (int t = warp; t < n; t += nwarps) {
                const i64 c = c0 + t;
                const float mv = mp ? slope * sg_h2f(mp[c]) : 0.0f;
                float s = neg_inf;
                if (mv != neg_inf) {
                    const char *kr = kb + c * nbk1;
                    float part = 0.0f;
                    for (i64 d = lane; d < DK; d += 32) part += qs[d] * KT::at(kr, d);
                    s = sg_sum32(part) * scl;
                    if (logit_softcap != 0.0f) s = logit_softcap * tanhf(s);
                    s += mv;
                }
                if (lane == 0) sc[t] = s;
            }
            __syncthreads();
            float tmax = neg_inf;
            for (int t = 0; t < n; ++t) tmax = fmaxf(tmax, sc[t]);
            const float Mnew = fmaxf(M, tmax);
            if (Mnew != neg_inf) {   // uniform: every thread computed the same Mnew
                const float ms = expf(M - Mnew);   // 0 when M == -inf
                __syncthreads();                   // every thread has read sc for tmax
                // p = exp(s - M) >= 0, or -1 marking a skipped key.
                for (int t = threadIdx.x; t < n; t += blockDim.x) {
                    const float s = sc[t];
                    sc[t] = s == neg_inf ? -1.0f : expf(s - Mnew);
                }
                __syncthreads();
                float psum = 0.0f;
                for (int t = 0; t < n; ++t) {
                    if (sc[t] >= 0.0f) psum += sc[t];
                }
                S = S * ms + psum;
                M = Mnew;
                for (i64 d = threadIdx.x; d < DV; d += blockDim.x) {
                    float a = acc[d] * ms;
                    for (int t = 0; t < n; ++t) {
                        const float p = sc[t];
                        if (p >= 0.0f) a += p * VT::at(vb + (c0 + t) * nbv1, d);
                    }
                    acc[d] = a;
                }
            }
            __syncthreads();   // sc is rewritten by the next tile
        }

        if (sinks) {
            const float sk = ((const float *) sinks)[iq2];
            float ms = 1.0f, vs = 1.0f;
            if (sk > M) {
                ms = expf(M - sk);
                M = sk;
            } else {
                vs = expf(sk - M);
            }
            S = S * ms + vs;
            for (i64 d = threadIdx.x; d < DV; d += blockDim.x) acc[d] *= ms;
        }

        const float inv = S == 0.0f ? 0.0f : 1.0f / S;
        float *o = (float *) (dst + iq2 * nb1 + iq1 * nb2 + iq3 * nb3);
        for (i64 d = threadIdx.x; d < DV; d += blockDim.x) o[d] = acc[d] * inv;
    }
}

#define SG_FA(NAME, KT, VT)                                                              \
    extern "C" __global__ void NAME(                                                     \
            const char *q, const char *k, const char *v, const char *mask,               \
            const char *sinks, char *dst,                                                \
            i64 DK, i64 DV, i64 n_q, i64 H, i64 ne3,                                     \
            i64 nbq1, i64 nbq2, i64 nbq3,                                                \
            i64 n_kv, i64 Hk, i64 nek3, i64 nbk1, i64 nbk2, i64 nbk3,                    \
            i64 Hv, i64 nev3, i64 nbv1, i64 nbv2, i64 nbv3,                              \
            i64 nem2, i64 nem3, i64 nbm1, i64 nbm2, i64 nbm3,                            \
            i64 nb1, i64 nb2, i64 nb3,                                                   \
            float scale, float max_bias, float logit_softcap) {                          \
        flash_attn_impl<KT, VT>(q, k, v, mask, sinks, dst, DK, DV, n_q, H, ne3,          \
                                nbq1, nbq2, nbq3, n_kv, Hk, nek3, nbk1, nbk2, nbk3,      \
                                Hv, nev3, nbv1, nbv2, nbv3, nem2, nem3, nbm1, nbm2, nbm3, \
                                nb1, nb2, nb3, scale, max_bias, logit_softcap);          \
    }

#define SG_FA_V(KN, KT)                                                                  \
    SG_FA(sg_flash_attn_ext_##KN##_f32, KT, LF32)                                        \
    SG_FA(sg_flash_attn_ext_##KN##_f16, KT, LF16)                                        \
    SG_FA(sg_flash_attn_ext_##KN##_q8_0, KT, LQ8_0)                                      \
    SG_FA(sg_flash_attn_ext_##KN##_q4_0, KT, LQ4_0)                                      \
    SG_FA(sg_flash_attn_ext_##KN##_q4_1, KT, LQ4_1)                                      \
    SG_FA(sg_flash_attn_ext_##KN##_q5_0, KT, LQ5_0)                                      \
    SG_FA(sg_flash_attn_ext_##KN##_q5_1, KT, LQ5_1)                                      \
    SG_FA(sg_flash_attn_ext_##KN##_iq4_nl, KT, LIQ4_NL)

SG_FA_V(f32, LF32)
SG_FA_V(f16, LF16)
SG_FA_V(q8_0, LQ8_0)
SG_FA_V(q4_0, LQ4_0)
SG_FA_V(q4_1, LQ4_1)
SG_FA_V(q5_0, LQ5_0)
SG_FA_V(q5_1, LQ5_1)
SG_FA_V(iq4_nl, LIQ4_NL)
SG_FA(sg_flash_attn_ext_bf16_bf16, LBF16, LBF16)
