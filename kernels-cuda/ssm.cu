// ssm.cu — recurrent-layer ops of the CUDA backend (NVRTC, C++17):
// ssm_conv and gated_delta_net.
//
// Semantics: ssm_conv follows ggml (ggml.c ggml_ssm_conv, ggml-cpu ops.cpp
// ggml_compute_forward_ssm_conv_f32); gated_delta_net follows shardgraph's
// definition (src/ops/ssm.rs `Context::gated_delta_net`, CPU kernel
// src/backend/cpu/kernels/ssm.rs), ggml's ggml_gated_delta_net extended with
// K state snapshot slots. All F32. Self-contained: no headers are included
// (no f16 is involved).
//
// Tensors are byte pointers plus int64 shape/strides in ggml order (ne0
// innermost, nb in bytes).
//
// sg_ssm_conv_f32 (ggml_ssm_conv(sx, c)): depthwise causal convolution.
//   sx [d_conv - 1 + n_t, d_inner, n_s], c [d_conv, d_inner],
//   dst [d_inner, n_t, n_s]:
//   dst[i, t, s] = sum_{j = 0}^{d_conv - 1} sx[t + j, i, s] * c[j, i],
//   accumulated in f32 in order of j from 0, each product rounded before the
//   add (no fused multiply-add), as ggml's and shardgraph's CPU loops.
//   (const char *sx, const char *c, char *dst,
//    i64 d_conv, i64 d_inner, i64 n_t, i64 n_s,
//    i64 nbx0, nbx1, nbx2,            // sx strides (bytes)
//    i64 nbc0, nbc1,                  // c strides (bytes)
//    i64 nb0, nb1, nb2)               // dst strides (bytes)
//   Launch: blockDim = (B, 1, 1), B a multiple of 64 (256 recommended);
//   gridDim = (gx, gy, 1); x is a grid-stride loop over the d_inner channels,
//   y over the n_t*n_s (token, sequence) pairs; any grid is correct; good
//   choice gx = min(ceil(d_inner / B), 1024), gy = min(n_t*n_s, 65535).
//
// Gated delta rule (shardgraph `gated_delta_net`, S = head size, H heads,
// T tokens, B sequences):
//   sg_gated_delta_net_f32_s64    S <= 64   (state row held in registers)
//   sg_gated_delta_net_f32_s128   S <= 128  (state row held in registers)
//   sg_gated_delta_net_f32_any    any S     (state row kept in dst, see below)
//   (const char *q, const char *k, const char *v, const char *g,
//    const char *beta, const char *state, char *dst,
//    i64 S, i64 H, i64 T, i64 B,
//    i64 neq1, i64 neq3,              // q heads H_qk (H % H_qk == 0), q sequences (B % neq3 == 0)
//    i64 nbq1, nbq2, nbq3,            // q strides (bytes); rows packed (nbq0 = 4)
//    i64 nek1, i64 nek3,              // same for k
//    i64 nbk1, nbk2, nbk3,
//    i64 nbv1, nbv2, nbv3,            // v [S, H, T, B] strides; rows packed
//    i64 neg0,                        // 1 (scalar log-decay) or S (per channel, KDA)
//    i64 nbg1, nbg2, nbg3,            // g [neg0, H, T, B] strides; rows packed
//    i64 nbb1, nbb2, nbb3,            // beta [1, H, T, B] strides
//    i64 nbs1, nbs2, nbs3,            // state [S, S, H, B] strides; rows packed
//    i64 k_snapshots)                 // K >= 1
//   dst: contiguous F32 [S*H, T*B + K*S*B] (the result of gated_delta_net).
//   Head h reads q/k head h % H_qk and q/k sequence b / (B / neq3) (resp. nek3).
//   The state of (h, b) is S x S; its stored row j (state[:, j, h, b]) is
//   column j of the mathematical matrix, and every stored row evolves
//   independently. Per token t, with e = exp(g) (g[i] per element i of the
//   row when neg0 == S and S != 1, else one scalar per (h, t, b)):
//     row_j[i] *= e(_i)
//     delta_j   = (v[j] - dot(row_j, k)) * beta
//     row_j[i]  = fma(k[i], delta_j, row_j[i])
//     out[j]    = dot(row_j, q) * (1/sqrt(S))
//   out goes to dst at float offset ((b*T + t)*H + h)*S + j. Snapshot slot s
//   (s < K) holds the state after token T-1-s, written for K > 1 at float
//   offset (T*B*H + s*S*H*B + (b*H + h)*S + j)*S + i; with K == 1 only slot 0
//   is written, after the last token (for T == 0: the initial state).
//   dot() sums i = 0..S-1 in order with fused multiply-adds in f32 (the CPU
//   uses SIMD partial sums: results agree to rounding, not bit for bit).
//   The _any variant keeps the evolving row in its slot-0 location of dst, so
//   with K > 1 and T == 0 slot 0 receives the initial state (which the CPU
//   leaves unwritten); otherwise all variants write the same values.
//   Launch (all three): flat over the S*H*B state rows, one row per thread:
//   blockDim = (B, 1, 1), B a multiple of 64 (128 recommended), gridDim =
//   (gx, 1, 1) grid-stride, gx = min(ceil(S*H*B / B), 65535). Threads of one
//   warp mostly share (h, b), so their q/k loads coalesce to broadcasts.
//   The _s64/_s128 variants must not be launched with S above their bound
//   (they then write nothing).

#include "common.cuh"

// ---------------------------------------------------------------------------
// ssm_conv
// ---------------------------------------------------------------------------

extern "C" __global__ void sg_ssm_conv_f32(
        const char *sx, const char *c, char *dst,
        i64 d_conv, i64 d_inner, i64 n_t, i64 n_s,
        i64 nbx0, i64 nbx1, i64 nbx2,
        i64 nbc0, i64 nbc1,
        i64 nb0, i64 nb1, i64 nb2) {
    const i64 nrows = n_t * n_s;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 t = r % n_t;
        const i64 s = r / n_t;
        const char *xs = sx + t * nbx0 + s * nbx2;
        char *d = dst + t * nb1 + s * nb2;
        for (i64 i = (i64) blockIdx.x * blockDim.x + threadIdx.x; i < d_inner; i += (i64) gridDim.x * blockDim.x) {
            const char *xr = xs + i * nbx1;
            const char *cr = c + i * nbc1;
            float sum = 0.0f;
            for (i64 j = 0; j < d_conv; ++j) {
                sum = __fadd_rn(sum, __fmul_rn(*(const float *) (xr + j * nbx0), *(const float *) (cr + j * nbc0)));
            }
            *(float *) (d + i * nb0) = sum;
        }
    }
}

// ---------------------------------------------------------------------------
// gated_delta_net
// ---------------------------------------------------------------------------

// Row storage: registers (compile-time bound) or a global-memory row.
template <int SMAX>
struct RegRow {
    float m[SMAX];
    __device__ __forceinline__ float &at(int i) { return m[i]; }
};
struct GlobalRow {
    float *p;
    __device__ __forceinline__ float &at(int i) { return p[i]; }
};

template <int SMAX, typename ROW>
static __device__ __forceinline__ void gdn_row(
        ROW &row, int S,
        const char *qb, const char *kb, const char *vb, const char *gb, const char *bb,
        i64 nbq2, i64 nbk2, i64 nbv2, i64 nbg2, i64 nbb2, bool kda, int j,
        float *outp, i64 out_tstride, float *snap, i64 snap_stride, i64 T, i64 K) {
    // Loop bound: the compile-time SMAX (fully unrolled, row in registers) or S.
    const int lim = SMAX > 0 ? SMAX : S;
    const float scale = 1.0f / sqrtf((float) S);
    for (i64 t = 0; t < T; ++t) {
        const float *qr = (const float *) (qb + t * nbq2);
        const float *kr = (const float *) (kb + t * nbk2);
        const float *gr = (const float *) (gb + t * nbg2);
        const float vj = ((const float *) (vb + t * nbv2))[j];
        const float bt = *(const float *) (bb + t * nbb2);
        if (kda) {
#pragma unroll
            for (int i = 0; i < lim; ++i) {
                if (i < S) row.at(i) = row.at(i) * expf(gr[i]);
            }
        } else {
            const float e = expf(gr[0]);
#pragma unroll
            for (int i = 0; i < lim; ++i) {
                if (i < S) row.at(i) = row.at(i) * e;
            }
        }
        float dk = 0.0f;
#pragma unroll
        for (int i = 0; i < lim; ++i) {
            if (i < S) dk = fmaf(row.at(i), kr[i], dk);
        }
        const float delta = (vj - dk) * bt;
        float dq = 0.0f;
#pragma unroll
        for (int i = 0; i < lim; ++i) {
            if (i < S) {
                row.at(i) = fmaf(kr[i], delta, row.at(i));
                dq = fmaf(row.at(i), qr[i], dq);
            }
        }
        outp[t * out_tstride] = dq * scale;
        if (K > 1) {
            const i64 slot = T - 1 - t;
            if (slot < K) {
                float *sp = snap + slot * snap_stride;
#pragma unroll
                for (int i = 0; i < lim; ++i) {
                    if (i < S) sp[i] = row.at(i);
                }
            }
        }
    }
}

// SMAX > 0: row in registers (S <= SMAX); SMAX == 0: row in dst's slot 0.
template <int SMAX>
static __device__ __forceinline__ void gdn_impl(
        const char *q, const char *k, const char *v, const char *g,
        const char *beta, const char *state, char *dst,
        i64 S, i64 H, i64 T, i64 B,
        i64 neq1, i64 neq3, i64 nbq1, i64 nbq2, i64 nbq3,
        i64 nek1, i64 nek3, i64 nbk1, i64 nbk2, i64 nbk3,
        i64 nbv1, i64 nbv2, i64 nbv3,
        i64 neg0, i64 nbg1, i64 nbg2, i64 nbg3,
        i64 nbb1, i64 nbb2, i64 nbb3,
        i64 nbs1, i64 nbs2, i64 nbs3,
        i64 K) {
    if (SMAX > 0 && S > SMAX) return;
    const bool kda = neg0 == S && S != 1;
    const i64 nrows = S * H * B;
    const i64 rq3 = B / neq3, rk3 = B / nek3;
    float *out = (float *) dst;
    const i64 out_floats = T * B * H * S;        // outputs before the snapshot slots
    const i64 snap_stride = S * S * H * B;       // floats per snapshot slot
    for (i64 u = (i64) blockIdx.x * blockDim.x + threadIdx.x; u < nrows; u += (i64) gridDim.x * blockDim.x) {
        const int j = (int) (u % S);
        const i64 h = (u / S) % H;
        const i64 b = u / (S * H);
        const char *qb = q + (h % neq1) * nbq1 + (b / rq3) * nbq3;
        const char *kb = k + (h % nek1) * nbk1 + (b / rk3) * nbk3;
        const char *vb = v + h * nbv1 + b * nbv3;
        const char *gb = g + h * nbg1 + b * nbg3;
        const char *bb = beta + h * nbb1 + b * nbb3;
        const float *init = (const float *) (state + j * nbs1 + h * nbs2 + b * nbs3);
        float *outp = out + (b * T * H + h) * S + j;           // + t*H*S per token
        float *slot0 = out + out_floats + ((b * H + h) * S + j) * S;
        if constexpr (SMAX > 0) {
            RegRow<SMAX> row;
#pragma unroll
            for (int i = 0; i < SMAX; ++i) {
                if (i < S) row.m[i] = init[i];
            }
            gdn_row<SMAX>(row, (int) S, qb, kb, vb, gb, bb, nbq2, nbk2, nbv2, nbg2, nbb2, kda, j,
                          outp, H * S, slot0, snap_stride, T, K);
            if (K == 1) {
#pragma unroll
                for (int i = 0; i < SMAX; ++i) {
                    if (i < S) slot0[i] = row.m[i];
                }
            }
        } else {
            for (i64 i = 0; i < S; ++i) slot0[i] = init[i];
            GlobalRow row{slot0};
            gdn_row<0>(row, (int) S, qb, kb, vb, gb, bb, nbq2, nbk2, nbv2, nbg2, nbb2, kda, j,
                       outp, H * S, slot0, snap_stride, T, K);
        }
    }
}

#define SG_GDN(NAME, SMAX)                                                               \
    extern "C" __global__ void NAME(                                                     \
            const char *q, const char *k, const char *v, const char *g,                  \
            const char *beta, const char *state, char *dst,                              \
            i64 S, i64 H, i64 T, i64 B,                                                  \
            i64 neq1, i64 neq3, i64 nbq1, i64 nbq2, i64 nbq3,                            \
            i64 nek1, i64 nek3, i64 nbk1, i64 nbk2, i64 nbk3,                            \
            i64 nbv1, i64 nbv2, i64 nbv3,                                                \
            i64 neg0, i64 nbg1, i64 nbg2, i64 nbg3,                                      \
            i64 nbb1, i64 nbb2, i64 nbb3,                                                \
            i64 nbs1, i64 nbs2, i64 nbs3,                                                \
            i64 k_snapshots) {                                                           \
        gdn_impl<SMAX>(q, k, v, g, beta, state, dst, S, H, T, B,                         \
                       neq1, neq3, nbq1, nbq2, nbq3, nek1, nek3, nbk1, nbk2, nbk3,       \
                       nbv1, nbv2, nbv3, neg0, nbg1, nbg2, nbg3, nbb1, nbb2, nbb3,       \
                       nbs1, nbs2, nbs3, k_snapshots);                                   \
    }

SG_GDN(sg_gated_delta_net_f32_s64, 64)
SG_GDN(sg_gated_delta_net_f32_s128, 128)
SG_GDN(sg_gated_delta_net_f32_any, 0)
