// quant_matvec.cu — matrix-vector products (ggml_mul_mat with few columns) of
// the CUDA backend (NVRTC, C++17).
//
// dst[i01, i11, i12, i13] = sum_k W[k, i01, i12 / r2, i13 / r3] * X[k, i11, i12, i13]
// with r2 = ne12 / ne02, r3 = ne13 / ne03: ggml_mul_mat's semantics and its
// broadcast of the weights over dims 2 and 3 (ne12 % ne02 == 0,
// ne13 % ne03 == 0; weight matrix i12 / r2 serves the r2 consecutive
// matrices of X — integer division, unlike the element-wise ops' modulo).
//
// The weights are dequantised exactly as ggml's dequantize_row_* (block
// layouts of ggml-common.h, QK_K = 256) and dotted with the F32 activations in
// f32. Note: ggml's CPU (and shardgraph's) first quantises the activations to
// Q8_0 / Q8_K and ggml's CUDA to Q8_1; these kernels keep them in f32, so
// results agree with those backends up to that activation rounding and to
// summation order.
//
// Kernels: sg_mul_mat_vec_f32, sg_mul_mat_vec_f16, sg_mul_mat_vec_q8_0,
//          sg_mul_mat_vec_q4_0, sg_mul_mat_vec_q4_K, sg_mul_mat_vec_q5_K,
//          sg_mul_mat_vec_q6_K, and (one value per lane, dequantised one by one
//          as ggml's dequantize_row_*) sg_mul_mat_vec_bf16, sg_mul_mat_vec_q4_1,
//          sg_mul_mat_vec_q5_0, sg_mul_mat_vec_q5_1, sg_mul_mat_vec_q2_K,
//          sg_mul_mat_vec_q3_K
// Arguments (all kernels):
//   const char *w,                   // weights [ne00 = K, ne01 = M, ne02, ne03]; rows
//                                    //   contiguous (blocks back to back), as ggml requires
//   const char *x,                   // F32 activations [K, ne11 = N, ne12, ne13]
//   char *dst,                       // F32 [M, N, ne12, ne13]
//   i64 ne00, ne01, ne02, ne03,
//   i64 nb01, nb02, nb03,            // weight strides (bytes)
//   i64 ne11, ne12, ne13,
//   i64 nb10, nb11, nb12, nb13,      // activation strides (bytes; nb10 is usually 4)
//   i64 nb0, nb1, nb2, nb3           // dst strides (bytes)
// K must be a multiple of the block size: 32 for Q8_0 / Q4_0 / Q4_1 / Q5_0 /
// Q5_1, 256 for Q2_K / Q3_K / Q4_K / Q5_K / Q6_K.
// Launch: one group of 32 lanes per output row (a warp on NVIDIA, half a
// wave on CDNA; sums stay within the group, sg_sum32). blockDim = (32*R, 1, 1)
// with R groups (R = 4 recommended, i.e. 128 threads: whole waves on every device); gridDim = (gx, gy, 1) with
// gx = min(ceil(M / R), 2^31 - 1) over the rows and gy = min(N*ne12*ne13, 65535)
// over the activation columns; both are grid-stride loops. Meant for small N
// (decoding); each column re-reads the weights.
//
//
// Expert products (ggml_mul_mat_id), one kernel per weight type as above:
//   sg_mul_mat_id_vec_f32, sg_mul_mat_id_vec_f16, sg_mul_mat_id_vec_q8_0,
//   sg_mul_mat_id_vec_q4_0, sg_mul_mat_id_vec_q4_K, sg_mul_mat_id_vec_q5_K,
//   sg_mul_mat_id_vec_q6_K, sg_mul_mat_id_vec_bf16, sg_mul_mat_id_vec_q4_1,
//   sg_mul_mat_id_vec_q5_0, sg_mul_mat_id_vec_q5_1, sg_mul_mat_id_vec_q2_K,
//   sg_mul_mat_id_vec_q3_K
//   dst[i01, slot, t] = sum_k W[k, i01, ids[slot, t]] * X[k, slot % ne11, t]
// Arguments:
//   const char *w,                   // experts [ne00 = K, ne01 = M, n_expert]; rows contiguous
//   const char *x,                   // F32 activations [K, ne11, n_tok] (ne11 divides n_used)
//   const char *ids,                 // I32 expert ids [n_used, n_tok]
//   char *dst,                       // F32 [M, n_used, n_tok]
//   i64 ne00, ne01, n_expert,
//   i64 nb01, nb02,                  // weight strides (bytes)
//   i64 ne11,
//   i64 nb10, nb11, nb12,            // activation strides (bytes)
//   i64 n_used, n_tok,
//   i64 nbi0, nbi1,                  // id strides (bytes)
//   i64 nb0, nb1, nb2,               // dst strides (bytes)
//   int *err                         // nullptr, or a flag set to 1 on a bad id
//   An id outside [0, n_expert) (ggml aborts) gives a column of zeros and sets *err.
// Launch: as sg_mul_mat_vec_*, with gy = min(n_used*n_tok, 65535) over the
// (slot, token) columns.
//
// Block layouts (bytes; blocks are only 2-byte aligned, read byte-wise):
//   Q8_0  34 B / 32 values: f16 d, int8 qs[32];                   w = d*q
//   Q4_0  18 B / 32 values: f16 d, u8 qs[16]; w[j] = d*((qs[j] & 15) - 8),
//                                              w[j+16] = d*((qs[j] >> 4) - 8)
//   Q4_K 144 B / 256 values: f16 d, f16 dmin, u8 scales[12], u8 qs[128];
//        8 sub-blocks of 32 with 6-bit scale sc and min m (get_scale_min_k4);
//        w = d*sc*q - dmin*m, q a nibble (low nibbles of qs[32g..32g+31] are
//        sub-block 2g, high nibbles sub-block 2g+1)
//   Q5_K 176 B / 256 values: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128];
//        as Q4_K with a fifth bit from qh (bit 2g for sub-block 2g, 2g+1 for 2g+1)
//   Q6_K 210 B / 256 values: u8 ql[128], u8 qh[64], int8 scales[16], f16 d;
//        w = d*scale*(q - 32), q 6 bits (4 from ql, 2 from qh), 16 sub-blocks of 16
//   BF16: the high half of an f32.
//   Q4_1  20 B / 32 values: f16 d, f16 m, u8 qs[16]; w = d*q + m, nibbles as Q4_0
//   Q5_0  22 B / 32 values: f16 d, u8 qh[4], u8 qs[16]; w = d*(q - 16), q the
//        nibble (as Q4_0) with bit j of the little-endian u32 qh as its fifth bit
//   Q5_1  24 B / 32 values: f16 d, f16 m, u8 qh[4], u8 qs[16]; w = d*q + m
//   Q2_K  84 B / 256 values: u8 scales[16], u8 qs[64], f16 d, f16 dmin; 16
//        sub-blocks of 16 with 4-bit scale (low) and min (high), 2-bit q
//   Q3_K 110 B / 256 values: u8 hmask[32], u8 qs[64], u8 scales[12], f16 d;
//        16 6-bit scales (minus 32), 2-bit q minus 4 where the hmask bit is clear

#include "common.cuh"

#include "dequant.cuh"

// Activation value k of the current column.
#define XV(k) (*(const float *) (xc + (i64) (k) * nb10))

// Each DOT::row returns this lane's partial dot product of one weight row
// (`wr`, ne00 values) with the column `xc`; the warp sums the partials.

struct DotF32 {
    __device__ static __forceinline__ float row(const unsigned char *wr, const char *xc, i64 nb10, i64 ne00, int lane) {
        const float *w = (const float *) wr;
        float acc = 0.0f;
        for (i64 k = lane; k < ne00; k += 32) acc += w[k] * XV(k);
        return acc;
    }
};

struct DotF16 {
    __device__ static __forceinline__ float row(const unsigned char *wr, const char *xc, i64 nb10, i64 ne00, int lane) {
        const unsigned short *w = (const unsigned short *) wr;
        float acc = 0.0f;
        for (i64 k = lane; k < ne00; k += 32) acc += sg_h2f(w[k]) * XV(k);
        return acc;
    }
};

// Q8_0: 8 lanes per block, 4 consecutive values per lane, 4 blocks per step.
struct DotQ8_0 {
    __device__ static __forceinline__ float row(const unsigned char *wr, const char *xc, i64 nb10, i64 ne00, int lane) {
        const i64 nb = ne00 / 32;
        const int sub = lane & 7;
        float acc = 0.0f;
        for (i64 ib = lane >> 3; ib < nb; ib += 4) {
            const unsigned char *b = wr + ib * 34;
            const float d = sg_ld_h(b);
            const signed char *q = (const signed char *) (b + 2) + sub * 4;
            const i64 k0 = ib * 32 + sub * 4;
            float s = 0.0f;
#pragma unroll
            for (int t = 0; t < 4; ++t) s += (float) q[t] * XV(k0 + t);
            acc += d * s;
        }
        return acc;
    }
};

// Q4_0: 8 lanes per block; lane sub handles bytes 2*sub, 2*sub+1, i.e. values
// 2*sub, 2*sub+1 (low nibbles) and 2*sub+16, 2*sub+17 (high nibbles).
struct DotQ4_0 {
    __device__ static __forceinline__ float row(const unsigned char *wr, const char *xc, i64 nb10, i64 ne00, int lane) {
        const i64 nb = ne00 / 32;
        const int sub = lane & 7;
        float acc = 0.0f;
        for (i64 ib = lane >> 3; ib < nb; ib += 4) {
            const unsigned char *b = wr + ib * 18;
            const float d = sg_ld_h(b);
            const unsigned char q0 = b[2 + 2 * sub], q1 = b[3 + 2 * sub];
            const i64 k0 = ib * 32 + 2 * sub;
            float s = (float) ((q0 & 15) - 8) * XV(k0);
            s += (float) ((q1 & 15) - 8) * XV(k0 + 1);
            s += (float) ((q0 >> 4) - 8) * XV(k0 + 16);
            s += (float) ((q1 >> 4) - 8) * XV(k0 + 17);
            acc += d * s;
        }
        return acc;
    }
};

// Q4_K / Q5_K: the warp takes one 256-value super-block per step; lane
// (g = lane/8, p = 4*(lane%8)) handles qs[32g+p .. 32g+p+3]: values
// 64g+p+t (low nibbles, sub-block 2g) and 64g+32+p+t (high, sub-block 2g+1).
template <bool Q5>
struct DotQ45_K {
    __device__ static __forceinline__ float row(const unsigned char *wr, const char *xc, i64 nb10, i64 ne00, int lane) {
        const i64 nb = ne00 / 256;
        const int g = lane >> 3;
        const int p = (lane & 7) * 4;
        const int bsize = Q5 ? 176 : 144;
        const int qs_off = Q5 ? 48 : 16;
        float acc = 0.0f;
        for (i64 ib = 0; ib < nb; ++ib) {
            const unsigned char *b = wr + ib * bsize;
            const float d = sg_ld_h(b), dmin = sg_ld_h(b + 2);
            int sc0, m0, sc1, m1;
            sg_scale_min_k4(2 * g, b + 4, sc0, m0);
            sg_scale_min_k4(2 * g + 1, b + 4, sc1, m1);
            const unsigned char *q = b + qs_off + 32 * g + p;
            const unsigned char *qh = b + 16 + p;
            const i64 k0 = ib * 256 + 64 * g + p;
            float s0 = 0.0f, s1 = 0.0f, x0 = 0.0f, x1 = 0.0f;
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                int v0 = q[t] & 0xF, v1 = q[t] >> 4;
                if (Q5) {
                    v0 += (qh[t] & (1 << (2 * g))) ? 16 : 0;
                    v1 += (qh[t] & (2 << (2 * g))) ? 16 : 0;
                }
                const float a0 = XV(k0 + t), a1 = XV(k0 + 32 + t);
                s0 += (float) v0 * a0;
                s1 += (float) v1 * a1;
                x0 += a0;
                x1 += a1;
            }
            acc += (d * (float) sc0) * s0 - (dmin * (float) m0) * x0;
            acc += (d * (float) sc1) * s1 - (dmin * (float) m1) * x1;
        }
        return acc;
    }
};

// Q6_K: the warp takes one super-block per step; lane l handles, in each
// 128-value half n, the values 128n + l + 32*qq for qq = 0..3.
struct DotQ6_K {
    __device__ static __forceinline__ float row(const unsigned char *wr, const char *xc, i64 nb10, i64 ne00, int lane) {
        const i64 nb = ne00 / 256;
        const int l = lane;
        float acc = 0.0f;
        for (i64 ib = 0; ib < nb; ++ib) {
            const unsigned char *b = wr + ib * 210;
            const float d = sg_ld_h(b + 208);
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                const unsigned char *ql = b + 64 * n;
                const unsigned char h = b[128 + 32 * n + l];
                const signed char *sc = (const signed char *) (b + 192) + 8 * n + l / 16;
                const i64 k0 = ib * 256 + 128 * n + l;
                const int q0 = ((ql[l] & 0xF) | (((h >> 0) & 3) << 4)) - 32;
                const int q1 = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) - 32;
                const int q2 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32;
                acc += (d * (float) sc[0]) * ((float) q0 * XV(k0));
                acc += (d * (float) sc[2]) * ((float) q1 * XV(k0 + 32));
                acc += (d * (float) sc[4]) * ((float) q2 * XV(k0 + 64));
                acc += (d * (float) sc[6]) * ((float) q3 * XV(k0 + 96));
            }
        }
        return acc;
    }
};

// Types without a vectorised dot: value j of a packed row dequantised on
// its own (dequant.cuh's DQ::at with the element stride ES, ignored by
// block types), one value per lane per step.
template <typename DQ, int ES = 0>
struct DqPacked {
    __device__ static __forceinline__ float at(const unsigned char *row, i64 j) { return DQ::at((const char *) row, j, ES); }
};

// BF16 rows: 2-byte elements.
typedef DqPacked<DqBF16, 2> DqPackedBF16;

template <typename DQ>
struct DotDq {
    __device__ static __forceinline__ float row(const unsigned char *wr, const char *xc, i64 nb10, i64 ne00, int lane) {
        float acc = 0.0f;
        for (i64 k = lane; k < ne00; k += 32) acc += DQ::at(wr, k) * XV(k);
        return acc;
    }
};

// The types dequant.cuh decodes eight values at a time (SG_CHUNK_TYPES):
// lane l takes chunks l, l+32, ... of the row (for 256-value blocks one
// block per warp step, each lane 8 consecutive values), decodes its 8
// weights and dots them with 8 consecutive activations.
template <typename DQ>
struct DotChunk8 {
    __device__ static __forceinline__ float row(const unsigned char *wr, const char *xc, i64 nb10, i64 ne00, int lane) {
        const i64 nc = ne00 / 8;
        float acc = 0.0f;
        for (i64 c = lane; c < nc; c += 32) {
            float v[8];
            DQ::get8(wr + (c / (DQ::QK / 8)) * DQ::BYTES, (int) (c % (DQ::QK / 8)), v);
            const i64 k0 = 8 * c;
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) s += v[k] * XV(k0 + k);
            acc += s;
        }
        return acc;
    }
};

#undef XV

template <typename DOT>
__device__ __forceinline__ void mul_mat_vec_impl(
        const char *w, const char *x, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb01, i64 nb02, i64 nb03,
        i64 ne11, i64 ne12, i64 ne13,
        i64 nb10, i64 nb11, i64 nb12, i64 nb13,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    const i64 r2 = ne12 / ne02;
    const i64 r3 = ne13 / ne03;
    const i64 ncols = ne11 * ne12 * ne13;
    for (i64 c = blockIdx.y; c < ncols; c += gridDim.y) {
        const i64 i11 = c % ne11;
        const i64 i12 = (c / ne11) % ne12;
        const i64 i13 = c / (ne11 * ne12);
        const char *xc = x + i11 * nb11 + i12 * nb12 + i13 * nb13;
        const unsigned char *wm = (const unsigned char *) w + (i12 / r2) * nb02 + (i13 / r3) * nb03;
        char *dc = dst + i11 * nb1 + i12 * nb2 + i13 * nb3;
        for (i64 row = (i64) blockIdx.x * nwarps + warp; row < ne01; row += (i64) gridDim.x * nwarps) {
            float acc = DOT::row(wm + row * nb01, xc, nb10, ne00, lane);
            acc = sg_sum32(acc);
            if (lane == 0) *(float *) (dc + row * nb0) = acc;
        }
    }
}

#define SG_MMV(NAME, DOT)                                                                \
    extern "C" __global__ void NAME(                                                     \
            const char *w, const char *x, char *dst,                                     \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb01, i64 nb02, i64 nb03,                                                \
            i64 ne11, i64 ne12, i64 ne13,                                                \
            i64 nb10, i64 nb11, i64 nb12, i64 nb13,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        mul_mat_vec_impl<DOT>(w, x, dst, ne00, ne01, ne02, ne03, nb01, nb02, nb03,       \
                              ne11, ne12, ne13, nb10, nb11, nb12, nb13, nb0, nb1, nb2, nb3); \
    }

SG_MMV(sg_mul_mat_vec_f32, DotF32)
SG_MMV(sg_mul_mat_vec_f16, DotF16)
SG_MMV(sg_mul_mat_vec_q8_0, DotQ8_0)
SG_MMV(sg_mul_mat_vec_q4_0, DotQ4_0)
SG_MMV(sg_mul_mat_vec_q4_K, DotQ45_K<false>)
SG_MMV(sg_mul_mat_vec_q5_K, DotQ45_K<true>)
SG_MMV(sg_mul_mat_vec_q6_K, DotQ6_K)
SG_MMV(sg_mul_mat_vec_bf16, DotDq<DqPackedBF16>)
SG_MMV(sg_mul_mat_vec_q4_1, DotDq<DqPacked<DqQ4_1>>)
SG_MMV(sg_mul_mat_vec_q5_0, DotDq<DqPacked<DqQ5_0>>)
SG_MMV(sg_mul_mat_vec_q5_1, DotDq<DqPacked<DqQ5_1>>)
SG_MMV(sg_mul_mat_vec_q2_K, DotDq<DqPacked<DqQ2_K>>)
SG_MMV(sg_mul_mat_vec_q3_K, DotDq<DqPacked<DqQ3_K>>)
#define SG_MMV_CHUNK(S, DQ) SG_MMV(sg_mul_mat_vec_##S, DotChunk8<DQ>)
SG_CHUNK_TYPES(SG_MMV_CHUNK)

template <typename DOT>
__device__ __forceinline__ void mul_mat_id_vec_impl(
        const char *w, const char *x, const char *ids, char *dst,
        i64 ne00, i64 ne01, i64 n_expert,
        i64 nb01, i64 nb02,
        i64 ne11,
        i64 nb10, i64 nb11, i64 nb12,
        i64 n_used, i64 n_tok,
        i64 nbi0, i64 nbi1,
        i64 nb0, i64 nb1, i64 nb2,
        int *err) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    const i64 ncols = n_used * n_tok;
    for (i64 c = blockIdx.y; c < ncols; c += gridDim.y) {
        const i64 slot = c % n_used;
        const i64 t = c / n_used;
        const i64 e = *(const int *) (ids + slot * nbi0 + t * nbi1);
        const bool ok = e >= 0 && e < n_expert;   // uniform across the block
        if (!ok && err && blockIdx.x == 0 && threadIdx.x == 0) atomicExch(err, 1);
        const char *xc = x + (slot % ne11) * nb11 + t * nb12;
        const unsigned char *wm = (const unsigned char *) w + (ok ? e : 0) * nb02;
        char *dc = dst + slot * nb1 + t * nb2;
        for (i64 row = (i64) blockIdx.x * nwarps + warp; row < ne01; row += (i64) gridDim.x * nwarps) {
            float acc = ok ? DOT::row(wm + row * nb01, xc, nb10, ne00, lane) : 0.0f;
            acc = sg_sum32(acc);
            if (lane == 0) *(float *) (dc + row * nb0) = acc;
        }
    }
}

#define SG_MMV_ID(NAME, DOT)                                                             \
    extern "C" __global__ void NAME(                                                     \
            const char *w, const char *x, const char *ids, char *dst,                    \
            i64 ne00, i64 ne01, i64 n_expert,                                            \
            i64 nb01, i64 nb02,                                                          \
            i64 ne11,                                                                    \
            i64 nb10, i64 nb11, i64 nb12,                                                \
            i64 n_used, i64 n_tok,                                                       \
            i64 nbi0, i64 nbi1,                                                          \
            i64 nb0, i64 nb1, i64 nb2,                                                   \
            int *err) {                                                                  \
        mul_mat_id_vec_impl<DOT>(w, x, ids, dst, ne00, ne01, n_expert, nb01, nb02, ne11, \
                                 nb10, nb11, nb12, n_used, n_tok, nbi0, nbi1,            \
                                 nb0, nb1, nb2, err);                                    \
    }

SG_MMV_ID(sg_mul_mat_id_vec_f32, DotF32)
SG_MMV_ID(sg_mul_mat_id_vec_f16, DotF16)
SG_MMV_ID(sg_mul_mat_id_vec_q8_0, DotQ8_0)
SG_MMV_ID(sg_mul_mat_id_vec_q4_0, DotQ4_0)
SG_MMV_ID(sg_mul_mat_id_vec_q4_K, DotQ45_K<false>)
SG_MMV_ID(sg_mul_mat_id_vec_q5_K, DotQ45_K<true>)
SG_MMV_ID(sg_mul_mat_id_vec_q6_K, DotQ6_K)
SG_MMV_ID(sg_mul_mat_id_vec_bf16, DotDq<DqPackedBF16>)
SG_MMV_ID(sg_mul_mat_id_vec_q4_1, DotDq<DqPacked<DqQ4_1>>)
SG_MMV_ID(sg_mul_mat_id_vec_q5_0, DotDq<DqPacked<DqQ5_0>>)
SG_MMV_ID(sg_mul_mat_id_vec_q5_1, DotDq<DqPacked<DqQ5_1>>)
SG_MMV_ID(sg_mul_mat_id_vec_q2_K, DotDq<DqPacked<DqQ2_K>>)
SG_MMV_ID(sg_mul_mat_id_vec_q3_K, DotDq<DqPacked<DqQ3_K>>)
#define SG_MMV_ID_CHUNK(S, DQ) SG_MMV_ID(sg_mul_mat_id_vec_##S, DotChunk8<DQ>)
SG_CHUNK_TYPES(SG_MMV_ID_CHUNK)
