// mul_mat.cu — tiled F32 x F32 -> F32 matrix product of the CUDA backend
// (NVRTC, C++17), for ggml_mul_mat with many columns where cuBLAS is not
// available (quant_matvec.cu covers the few-column case).
//
// Semantics follow ggml (ggml.c ggml_mul_mat, ggml-cpu ggml_compute_forward_mul_mat):
//   a [K, M, ne02, ne03], b [K, N, ne12, ne13] -> dst [M, N, ne12, ne13],
//   dst[m, n, i2, i3] = sum_k a[k, m, i2 / (ne12/ne02), i3 / (ne13/ne03)] * b[k, n, i2, i3]
//   (ne12 % ne02 == 0, ne13 % ne03 == 0: a's batch dims broadcast by integer
//   division, as ggml). The sum runs over k in increasing order with fused
//   multiply-adds in f32 (ggml-cpu uses SIMD partial sums: results agree to
//   rounding, not bit for bit). Self-contained: no headers are included.
//
// sg_mul_mat_f32
//   (const char *a, const char *b, char *dst,
//    i64 K, i64 M, i64 N,
//    i64 ne02, ne03, ne12, ne13,
//    i64 nb00, nb01, nb02, nb03,      // a strides (bytes); any (views, transposes)
//    i64 nb10, nb11, nb12, nb13,      // b strides (bytes)
//    i64 nb0, nb1, nb2, nb3)          // dst strides (bytes)
//   Each block computes 32 x 32 output tiles (m x n), staging 32 x 16 slices
//   of a and b in static shared memory (4.2 KB).
//   Launch: blockDim = (B, 1, 1), B a multiple of 64 in [64, 1024] (256
//   recommended: 4 outputs per thread); gridDim = (gx, gy, 1): x is a
//   grid-stride loop over the ceil(M/32)*ceil(N/32) tiles of a matrix, y over
//   the ne12*ne13 batch matrices; any grid is correct; good choice
//   gx = min(tiles, 65535), gy = min(ne12*ne13, 65535).
//   dst must not overlap a or b.
//
// sg_add_id_f32 (ggml_add_id, the MoE bias):
//   dst[:, i1, i2, i3] = a[:, i1, i2, i3] + b[:, ids[i1, i2]]
//   (const char *a, const char *b, const char *ids, char *dst,
//    i64 ne0, ne1, ne2, ne3,          // a's (= dst's) shape
//    i64 nb00, nb01, nb02, nb03,      // a strides (bytes)
//    i64 nb10, nb11,                  // b strides (bytes); b is F32 [ne0, n_expert]
//    i64 n_expert,
//    i64 nbi0, nbi1,                  // I32 ids [ne1, ne2] strides (bytes)
//    i64 nb0, nb1, nb2, nb3,          // dst strides (bytes)
//    int *err)                        // nullptr, or a flag set to 1 on a bad id
//   An id outside [0, n_expert) (ggml aborts) writes a's row unchanged and sets *err.
//   Launch: blockDim = (B, 1, 1), B a multiple of 64 (256 recommended);
//   gridDim = (gx, gy, 1): x strides over ne0 (gx = min(ceil(ne0 / B), 1024)),
//   y over the ne1*ne2*ne3 rows (gy = min(rows, 65535)); both grid-stride.
//   dst may be a itself (in place).

#include "common.cuh"

#define SG_MM_T 32    // output tile edge (m and n)
#define SG_MM_TK 16   // k slice per shared-memory stage

extern "C" __global__ void sg_mul_mat_f32(
        const char *a, const char *b, char *dst,
        i64 K, i64 M, i64 N,
        i64 ne02, i64 ne03, i64 ne12, i64 ne13,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb10, i64 nb11, i64 nb12, i64 nb13,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    __shared__ float as[SG_MM_TK][SG_MM_T + 1];
    __shared__ float bs[SG_MM_TK][SG_MM_T + 1];
    const int tid = threadIdx.x, nt = blockDim.x;
    const i64 tm = (M + SG_MM_T - 1) / SG_MM_T, tn = (N + SG_MM_T - 1) / SG_MM_T;
    const i64 ntiles = tm * tn, nbatch = ne12 * ne13;
    const i64 r2 = ne12 / ne02, r3 = ne13 / ne03;
    for (i64 bt = blockIdx.y; bt < nbatch; bt += gridDim.y) {
        const i64 i2 = bt % ne12, i3 = bt / ne12;
        const char *ab = a + (i2 / r2) * nb02 + (i3 / r3) * nb03;
        const char *bb = b + i2 * nb12 + i3 * nb13;
        char *db = dst + i2 * nb2 + i3 * nb3;
        for (i64 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
            const i64 m0 = (tile % tm) * SG_MM_T, n0 = (tile / tm) * SG_MM_T;
            // Output e of the tile (e = tid + j*nt < 1024): m = e % 32, n = e / 32.
            float acc[SG_MM_T * SG_MM_T / 32];
#pragma unroll
            for (int j = 0; j < SG_MM_T * SG_MM_T / 32; ++j) acc[j] = 0.0f;
            for (i64 k0 = 0; k0 < K; k0 += SG_MM_TK) {
                __syncthreads();   // previous stage fully consumed
                for (int e = tid; e < SG_MM_TK * SG_MM_T; e += nt) {
                    const int kk = e % SG_MM_TK, mm = e / SG_MM_TK;
                    const i64 k = k0 + kk;
                    const i64 m = m0 + mm, n = n0 + mm;
                    as[kk][mm] = (k < K && m < M) ? *(const float *) (ab + k * nb00 + m * nb01) : 0.0f;
                    bs[kk][mm] = (k < K && n < N) ? *(const float *) (bb + k * nb10 + n * nb11) : 0.0f;
                }
                __syncthreads();
                const int kn = (int) (K - k0 < SG_MM_TK ? K - k0 : SG_MM_TK);
#pragma unroll
                for (int j = 0; j < SG_MM_T * SG_MM_T / 32; ++j) {
                    const int e = tid + j * nt;
                    if (e < SG_MM_T * SG_MM_T) {
                        const int mm = e % SG_MM_T, nn = e / SG_MM_T;
                        float s = acc[j];
                        for (int kk = 0; kk < kn; ++kk) s = fmaf(as[kk][mm], bs[kk][nn], s);
                        acc[j] = s;
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < SG_MM_T * SG_MM_T / 32; ++j) {
                const int e = tid + j * nt;
                if (e < SG_MM_T * SG_MM_T) {
                    const i64 m = m0 + e % SG_MM_T, n = n0 + e / SG_MM_T;
                    if (m < M && n < N) *(float *) (db + m * nb0 + n * nb1) = acc[j];
                }
            }
        }
    }
}

extern "C" __global__ void sg_add_id_f32(
        const char *a, const char *b, const char *ids, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb10, i64 nb11,
        i64 n_expert,
        i64 nbi0, i64 nbi1,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int *err) {
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const i64 e = *(const int *) (ids + i1 * nbi0 + i2 * nbi1);
        const bool ok = e >= 0 && e < n_expert;
        if (!ok && err && blockIdx.x == 0 && threadIdx.x == 0) atomicExch(err, 1);
        const char *ar = a + i1 * nb01 + i2 * nb02 + i3 * nb03;
        const char *br = b + (ok ? e : 0) * nb11;
        char *dr = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 j = (i64) blockIdx.x * blockDim.x + threadIdx.x; j < ne0; j += (i64) gridDim.x * blockDim.x) {
            const float v = *(const float *) (ar + j * nb00);
            *(float *) (dr + j * nb0) = ok ? v + *(const float *) (br + j * nb10) : v;
        }
    }
}
