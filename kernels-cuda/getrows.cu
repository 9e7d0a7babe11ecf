// getrows.cu — get_rows and set_rows of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml (ggml.c ggml_get_rows / ggml_set_rows, ggml-cpu
// ops.cpp ggml_compute_forward_get_rows_* / ..._set_rows_f32); block layouts
// are ggml-common.h's, dequantisation is dequantize_row_* and quantisation
// quantize_row_q8_0_ref / quantize_row_q4_0_ref of ggml-quants.c (products
// and sums rounded separately, no fused multiply-add). Self-contained: no
// headers; f16 <-> f32 via the PTX `cvt` instructions.
//
// Block layouts (bytes; blocks are only 2-byte aligned, read byte-wise):
//   Q8_0  34 B / 32 values: f16 d, int8 qs[32];            x = d*q
//   Q4_1  20 B / 32 values: f16 d, f16 m, u8 qs[16];  x[j] = d*(qs[j] & 15) + m,
//                                              x[j+16] = d*(qs[j] >> 4) + m
//   Q4_0  18 B / 32 values: f16 d, u8 qs[16];  x[j] = d*((qs[j] & 15) - 8),
//                                              x[j+16] = d*((qs[j] >> 4) - 8)
//   Q5_0  22 B / 32 values: f16 d, u8 qh[4], u8 qs[16]; as Q4_0 with a fifth bit
//        (bit j of the little-endian u32 qh for value j), x = d*(q - 16)
//   Q5_1  24 B / 32 values: f16 d, f16 m, u8 qh[4], u8 qs[16]; x = d*q + m
//   Q2_K  84 B / 256 values: u8 scales[16], u8 qs[64], f16 d, f16 dmin
//   Q3_K 110 B / 256 values: u8 hmask[32], u8 qs[64], u8 scales[12], f16 d
//   Q4_K 144 B / 256 values: f16 d, f16 dmin, u8 scales[12], u8 qs[128]
//   Q5_K 176 B / 256 values: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]
//   Q6_K 210 B / 256 values: u8 ql[128], u8 qh[64], int8 scales[16], f16 d
//
// get_rows (ggml_get_rows): dst[:, i10, i11, i12] =
//   to_f32(src0[:, idx[i10, i11, i12], i11, i12]), dst F32 [ne00, ne10, ne11, ne12]
//   (for an I32 table dst is I32 and the rows are copied).
//   sg_get_rows_f32, sg_get_rows_f16, sg_get_rows_bf16, sg_get_rows_q8_0,
//   sg_get_rows_q4_0, sg_get_rows_q4_1, sg_get_rows_q5_0, sg_get_rows_q5_1,
//   sg_get_rows_q2_K, sg_get_rows_q3_K, sg_get_rows_q4_K, sg_get_rows_q5_K,
//   sg_get_rows_q6_K, sg_get_rows_i32
//   (const char *src0, const char *idx, char *dst,
//    i64 ne00, i64 ne01,              // row length (multiple of the block size
//                                     //   for quantized tables), rows in the table
//    i64 nb00, nb01, nb02, nb03,      // table strides (nb00 used by f32/f16/bf16/i32 only)
//    i64 ne10, ne11, ne12,            // I32 index tensor shape
//    i64 nb10, nb11, nb12,            // index strides (bytes)
//    i64 nb0, nb1, nb2, nb3,          // dst strides (bytes)
//    int *err)                        // nullptr, or a flag set to 1 on a bad index
//   An index outside [0, ne01) (ggml aborts) writes a row of zeros and sets *err.
//   Launch: blockDim = (B, 1, 1), B a multiple of 64 (256 recommended);
//   gridDim = (gx, gy, 1): x strides over the ne00 elements of a row
//   (gx = min(ceil(ne00 / B), 1024)), y over the ne10*ne11*ne12 output rows
//   (gy = min(rows, 65535)); both are grid-stride loops.
//
// set_rows (ggml_set_rows): dst[:, idx[i, i02 % ne11, i03 % ne12], i02, i03] =
//   from_f32(src[:, i, i02, i03]) for every source row (i, i02, i03) of the F32
//   source [ne00, ne01, ne02, ne03]; dst rows that no index names keep their
//   contents. When an index repeats within one (i02, i03) slice the LAST source
//   row wins (as shardgraph's CPU kernel; ggml's sequential loop gives the same).
//   sg_set_rows_<dst>_<idx> for dst in {f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
//   q5_1}, idx in {i32, i64}
//   (const char *src, const char *idx, char *dst,
//    i64 ne00, ne01, ne02, ne03,      // source shape; ne00 % 32 == 0 for block types
//    i64 nb00, nb01, nb02, nb03,      // source strides (bytes)
//    i64 ne11, ne12,                  // index dims 1 and 2 (index dim 0 is ne01)
//    i64 nb10, nb11, nb12,            // index strides (bytes)
//    i64 ne1,                         // rows of dst (valid index range [0, ne1))
//    i64 nb0, nb1, nb2, nb3,          // dst strides (nb0 used by f32/f16 only)
//    int *err)                        // nullptr, or a flag set to 1 on a bad index
//   An index outside [0, ne1) (ggml aborts) is skipped and sets *err.
//   Q8_0: d = amax/127, q = roundf(x/d) (x * (1/d)); Q4_0: d = max/-8 with max
//   the signed value of largest magnitude (first one on ties),
//   q = min(15, (int8)(x*(1/d) + 8.5)); d stored as f16 (round to nearest even);
//   BF16: ggml_compute_fp32_to_bf16 (round to nearest even, NaN kept quiet).
//   Q4_1 / Q5_1: d = (max - min)/15 (/31), m = min, q = (int)((x - min)*(1/d) + 0.5)
//   (at most 15 for Q4_1); Q5_0: d = max/-16 (max as for Q4_0),
//   q = min(31, (int8)(x*(1/d) + 16.5)); as quantize_row_*_ref.
//   Launch: one block per source row, blockDim = (B, 1, 1) with B a multiple
//   of 32 (128 or 256 recommended), gridDim = (gx, 1, 1) with
//   gx = min(ne01*ne02*ne03, 2^31 - 1) (grid-stride over rows).

//
// dequantize (mul_mat's many-column path: weights to F32 for a GEMM):
//   dst[j, i1, i2, i3] = to_f32(src[j, i1, i2, i3]), dst F32 and contiguous.
//   sg_dequant_f16, sg_dequant_bf16, sg_dequant_q8_0, sg_dequant_q4_0,
//   sg_dequant_q4_1, sg_dequant_q5_0, sg_dequant_q5_1, sg_dequant_q2_K,
//   sg_dequant_q3_K, sg_dequant_q4_K, sg_dequant_q5_K, sg_dequant_q6_K
//   (const char *src, char *dst,
//    i64 ne00, ne01, ne02, ne03,      // shape; ne00 a multiple of the block size
//    i64 nb00, nb01, nb02, nb03)      // source strides (bytes; nb00 used by f16/bf16 only)
//   Launch: blockDim = (B, 1, 1), B a multiple of 64 (256 recommended);
//   gridDim = (gx, gy, 1): x strides over ne00 (gx = min(ceil(ne00 / B), 1024)),
//   y over the ne01*ne02*ne03 rows (gy = min(rows, 65535)); both grid-stride.

#include "common.cuh"

#include "dequant.cuh"
#include "quant.cuh"

template <typename DQ>
__device__ __forceinline__ void get_rows_impl(
        const char *src0, const char *idx, char *dst,
        i64 ne00, i64 ne01,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 ne10, i64 ne11, i64 ne12,
        i64 nb10, i64 nb11, i64 nb12,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int *err) {
    const i64 nrows = ne10 * ne11 * ne12;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i10 = r % ne10;
        const i64 i11 = (r / ne10) % ne11;
        const i64 i12 = r / (ne10 * ne11);
        const i64 i01 = *(const int *) (idx + i10 * nb10 + i11 * nb11 + i12 * nb12);
        char *d = dst + i10 * nb1 + i11 * nb2 + i12 * nb3;
        const bool ok = i01 >= 0 && i01 < ne01;
        if (!ok && err && blockIdx.x == 0 && threadIdx.x == 0) atomicExch(err, 1);
        const char *row = src0 + i01 * nb01 + i11 * nb02 + i12 * nb03;
        for (i64 j = (i64) blockIdx.x * blockDim.x + threadIdx.x; j < ne00; j += (i64) gridDim.x * blockDim.x) {
            *(typename DQ::T *) (d + j * nb0) = ok ? DQ::at(row, j, nb00) : (typename DQ::T) 0;
        }
    }
}

#define SG_GET_ROWS(NAME, DQ)                                                            \
    extern "C" __global__ void NAME(                                                     \
            const char *src0, const char *idx, char *dst,                                \
            i64 ne00, i64 ne01,                                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne10, i64 ne11, i64 ne12,                                                \
            i64 nb10, i64 nb11, i64 nb12,                                                \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            int *err) {                                                                  \
        get_rows_impl<DQ>(src0, idx, dst, ne00, ne01, nb00, nb01, nb02, nb03,            \
                          ne10, ne11, ne12, nb10, nb11, nb12, nb0, nb1, nb2, nb3, err);  \
    }

SG_GET_ROWS(sg_get_rows_f32, DqF32)
SG_GET_ROWS(sg_get_rows_f16, DqF16)
SG_GET_ROWS(sg_get_rows_bf16, DqBF16)
SG_GET_ROWS(sg_get_rows_i32, DqI32)
SG_GET_ROWS(sg_get_rows_q4_1, DqQ4_1)
SG_GET_ROWS(sg_get_rows_q5_0, DqQ5_0)
SG_GET_ROWS(sg_get_rows_q5_1, DqQ5_1)
SG_GET_ROWS(sg_get_rows_q2_K, DqQ2_K)
SG_GET_ROWS(sg_get_rows_q3_K, DqQ3_K)
SG_GET_ROWS(sg_get_rows_q8_0, DqQ8_0)
SG_GET_ROWS(sg_get_rows_q4_0, DqQ4_0)
SG_GET_ROWS(sg_get_rows_q4_K, DqQ4_K)
SG_GET_ROWS(sg_get_rows_q5_K, DqQ5_K)
SG_GET_ROWS(sg_get_rows_q6_K, DqQ6_K)

template <typename DQ>
__device__ __forceinline__ void dequant_impl(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03) {
    const i64 nrows = ne01 * ne02 * ne03;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne01;
        const i64 i2 = (r / ne01) % ne02;
        const i64 i3 = r / (ne01 * ne02);
        const char *row = src + i1 * nb01 + i2 * nb02 + i3 * nb03;
        float *d = (float *) dst + r * ne00;
        for (i64 j = (i64) blockIdx.x * blockDim.x + threadIdx.x; j < ne00; j += (i64) gridDim.x * blockDim.x) {
            d[j] = DQ::at(row, j, nb00);
        }
    }
}

#define SG_DEQUANT(NAME, DQ)                                                             \
    extern "C" __global__ void NAME(                                                     \
            const char *src, char *dst,                                                  \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03) {                                    \
        dequant_impl<DQ>(src, dst, ne00, ne01, ne02, ne03, nb00, nb01, nb02, nb03);      \
    }

SG_DEQUANT(sg_dequant_f16, DqF16)
SG_DEQUANT(sg_dequant_bf16, DqBF16)
SG_DEQUANT(sg_dequant_q8_0, DqQ8_0)
SG_DEQUANT(sg_dequant_q4_0, DqQ4_0)
SG_DEQUANT(sg_dequant_q4_1, DqQ4_1)
SG_DEQUANT(sg_dequant_q5_0, DqQ5_0)
SG_DEQUANT(sg_dequant_q5_1, DqQ5_1)
SG_DEQUANT(sg_dequant_q2_K, DqQ2_K)
SG_DEQUANT(sg_dequant_q3_K, DqQ3_K)
SG_DEQUANT(sg_dequant_q4_K, DqQ4_K)
SG_DEQUANT(sg_dequant_q5_K, DqQ5_K)
SG_DEQUANT(sg_dequant_q6_K, DqQ6_K)

// The types dequant.cuh decodes eight values at a time (SG_CHUNK_TYPES: IQ*,
// TQ*, MXFP4, NVFP4, Q1_0, Q2_0): get_rows and dequantize as above, with
// each thread writing one chunk of 8 values (x strides over the ne00/8
// chunks of a row).
template <typename DQ>
__device__ __forceinline__ void get_rows_chunk_impl(
        const char *src0, const char *idx, char *dst,
        i64 ne00, i64 ne01,
        i64 nb01, i64 nb02, i64 nb03,
        i64 ne10, i64 ne11, i64 ne12,
        i64 nb10, i64 nb11, i64 nb12,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int *err) {
    const i64 nrows = ne10 * ne11 * ne12;
    const i64 nc = ne00 / 8;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i10 = r % ne10;
        const i64 i11 = (r / ne10) % ne11;
        const i64 i12 = r / (ne10 * ne11);
        const i64 i01 = *(const int *) (idx + i10 * nb10 + i11 * nb11 + i12 * nb12);
        char *d = dst + i10 * nb1 + i11 * nb2 + i12 * nb3;
        const bool ok = i01 >= 0 && i01 < ne01;
        if (!ok && err && blockIdx.x == 0 && threadIdx.x == 0) atomicExch(err, 1);
        const unsigned char *row = (const unsigned char *) src0 + i01 * nb01 + i11 * nb02 + i12 * nb03;
        for (i64 c = (i64) blockIdx.x * blockDim.x + threadIdx.x; c < nc; c += (i64) gridDim.x * blockDim.x) {
            float v[8];
            if (ok) {
                DQ::get8(row + (c / (DQ::QK / 8)) * DQ::BYTES, (int) (c % (DQ::QK / 8)), v);
            } else {
#pragma unroll
                for (int k = 0; k < 8; ++k) v[k] = 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) *(float *) (d + (8 * c + k) * nb0) = v[k];
        }
    }
}

template <typename DQ>
__device__ __forceinline__ void dequant_chunk_impl(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb01, i64 nb02, i64 nb03) {
    const i64 nrows = ne01 * ne02 * ne03;
    const i64 nc = ne00 / 8;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne01;
        const i64 i2 = (r / ne01) % ne02;
        const i64 i3 = r / (ne01 * ne02);
        const unsigned char *row = (const unsigned char *) src + i1 * nb01 + i2 * nb02 + i3 * nb03;
        float *d = (float *) dst + r * ne00;
        for (i64 c = (i64) blockIdx.x * blockDim.x + threadIdx.x; c < nc; c += (i64) gridDim.x * blockDim.x) {
            float v[8];
            DQ::get8(row + (c / (DQ::QK / 8)) * DQ::BYTES, (int) (c % (DQ::QK / 8)), v);
#pragma unroll
            for (int k = 0; k < 8; ++k) d[8 * c + k] = v[k];
        }
    }
}

#define SG_GET_ROWS_CHUNK(S, DQ)                                                         \
    extern "C" __global__ void sg_get_rows_##S(                                          \
            const char *src0, const char *idx, char *dst,                                \
            i64 ne00, i64 ne01,                                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne10, i64 ne11, i64 ne12,                                                \
            i64 nb10, i64 nb11, i64 nb12,                                                \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            int *err) {                                                                  \
        get_rows_chunk_impl<DQ>(src0, idx, dst, ne00, ne01, nb01, nb02, nb03,            \
                                ne10, ne11, ne12, nb10, nb11, nb12, nb0, nb1, nb2, nb3, err); \
    }                                                                                    \
    extern "C" __global__ void sg_dequant_##S(                                           \
            const char *src, char *dst,                                                  \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03) {                                    \
        dequant_chunk_impl<DQ>(src, dst, ne00, ne01, ne02, ne03, nb01, nb02, nb03);      \
    }

SG_CHUNK_TYPES(SG_GET_ROWS_CHUNK)

// ---------------------------------------------------------------------------
// set_rows
// ---------------------------------------------------------------------------

struct IdxI32 { __device__ static __forceinline__ i64 at(const char *p) { return (i64) *(const int *) p; } };
struct IdxI64 { __device__ static __forceinline__ i64 at(const char *p) { return *(const i64 *) p; } };

// Element-wise destinations: one thread per element.
struct StF32 {
    __device__ static __forceinline__ void row(const char *x, i64 nb00, char *y, i64 nb0, i64 ne00) {
        for (i64 j = threadIdx.x; j < ne00; j += blockDim.x) *(float *) (y + j * nb0) = *(const float *) (x + j * nb00);
    }
};
struct StF16 {
    __device__ static __forceinline__ void row(const char *x, i64 nb00, char *y, i64 nb0, i64 ne00) {
        for (i64 j = threadIdx.x; j < ne00; j += blockDim.x)
            *(unsigned short *) (y + j * nb0) = sg_f2h(*(const float *) (x + j * nb00));
    }
};
struct StBF16 {
    __device__ static __forceinline__ void row(const char *x, i64 nb00, char *y, i64 nb0, i64 ne00) {
        for (i64 j = threadIdx.x; j < ne00; j += blockDim.x) {
            const unsigned u = __float_as_uint(*(const float *) (x + j * nb00));
            const unsigned short h = (u & 0x7fffffffu) > 0x7f800000u
                                         ? (unsigned short) ((u >> 16) | 64)
                                         : (unsigned short) ((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
            *(unsigned short *) (y + j * nb0) = h;
        }
    }
};
// Block destinations: one thread per 32-value block, ggml's reference quantizers.
// Block types: each thread quantises whole 32-value blocks of the row
// (quant.cuh's reference quantisers).
template <typename Q>
struct StBlock {
    __device__ static __forceinline__ void row(const char *x, i64 nb00, char *y, i64, i64 ne00) {
        for (i64 ib = threadIdx.x; ib < ne00 / 32; ib += blockDim.x) {
            float v[32];
            for (int j = 0; j < 32; ++j) v[j] = *(const float *) (x + (ib * 32 + j) * nb00);
            Q::quant(v, (unsigned char *) y + ib * Q::BYTES);
        }
    }
};

template <typename ST, typename IDX>
__device__ __forceinline__ void set_rows_impl(
        const char *src, const char *idx, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 ne11, i64 ne12,
        i64 nb10, i64 nb11, i64 nb12,
        i64 ne1,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int *err) {
    const i64 nrows = ne01 * ne02 * ne03;
    for (i64 r = blockIdx.x; r < nrows; r += gridDim.x) {
        const i64 i = r % ne01;
        const i64 i02 = (r / ne01) % ne02;
        const i64 i03 = r / (ne01 * ne02);
        const char *icol = idx + (i02 % ne11) * nb11 + (i03 % ne12) * nb12;
        const i64 i1 = IDX::at(icol + i * nb10);
        if (i1 < 0 || i1 >= ne1) {
            if (err && threadIdx.x == 0) atomicExch(err, 1);
            continue;   // uniform across the block
        }
        // A later source row with the same destination row overwrites this one.
        int later = 0;
        for (i64 k = i + 1 + threadIdx.x; k < ne01; k += blockDim.x) {
            if (IDX::at(icol + k * nb10) == i1) later = 1;
        }
        if (__syncthreads_or(later)) continue;
        ST::row(src + i * nb01 + i02 * nb02 + i03 * nb03, nb00,
                dst + i1 * nb1 + i02 * nb2 + i03 * nb3, nb0, ne00);
    }
}

#define SG_SET_ROWS(NAME, ST, IDX)                                                       \
    extern "C" __global__ void NAME(                                                     \
            const char *src, const char *idx, char *dst,                                 \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne11, i64 ne12,                                                          \
            i64 nb10, i64 nb11, i64 nb12,                                                \
            i64 ne1,                                                                     \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            int *err) {                                                                  \
        set_rows_impl<ST, IDX>(src, idx, dst, ne00, ne01, ne02, ne03, nb00, nb01, nb02, nb03, \
                               ne11, ne12, nb10, nb11, nb12, ne1, nb0, nb1, nb2, nb3, err); \
    }

SG_SET_ROWS(sg_set_rows_f32_i32, StF32, IdxI32)
SG_SET_ROWS(sg_set_rows_f32_i64, StF32, IdxI64)
SG_SET_ROWS(sg_set_rows_f16_i32, StF16, IdxI32)
SG_SET_ROWS(sg_set_rows_f16_i64, StF16, IdxI64)
SG_SET_ROWS(sg_set_rows_bf16_i32, StBF16, IdxI32)
SG_SET_ROWS(sg_set_rows_bf16_i64, StBF16, IdxI64)
SG_SET_ROWS(sg_set_rows_q8_0_i32, StBlock<QQ8_0>, IdxI32)
SG_SET_ROWS(sg_set_rows_q8_0_i64, StBlock<QQ8_0>, IdxI64)
SG_SET_ROWS(sg_set_rows_q4_0_i32, StBlock<QQ4_0>, IdxI32)
SG_SET_ROWS(sg_set_rows_q4_0_i64, StBlock<QQ4_0>, IdxI64)
SG_SET_ROWS(sg_set_rows_q4_1_i32, StBlock<QQ4_1>, IdxI32)
SG_SET_ROWS(sg_set_rows_q4_1_i64, StBlock<QQ4_1>, IdxI64)
SG_SET_ROWS(sg_set_rows_q5_0_i32, StBlock<QQ5_0>, IdxI32)
SG_SET_ROWS(sg_set_rows_q5_0_i64, StBlock<QQ5_0>, IdxI64)
SG_SET_ROWS(sg_set_rows_q5_1_i32, StBlock<QQ5_1>, IdxI32)
SG_SET_ROWS(sg_set_rows_q5_1_i64, StBlock<QQ5_1>, IdxI64)
SG_SET_ROWS(sg_set_rows_iq4_nl_i32, StBlock<QIQ4_NL>, IdxI32)
SG_SET_ROWS(sg_set_rows_iq4_nl_i64, StBlock<QIQ4_NL>, IdxI64)
