// dequant.cuh — value j of a row of each storage type as f32 (ggml's
// dequantize_row_* per value; block layouts of ggml-common.h, QK_K = 256),
// shared by getrows.cu (get_rows, dequantisation for many-column mul_mat),
// quant_matvec.cu (types without a vectorised dot), elementwise.cu (copies
// out of blocks), distributed.cu and flash_attn.cu. Pasted in by build.rs
// (see common.cuh). `DQ::at(row, j, nb00)`: nb00 is the element stride of
// the unquantised types, ignored by block types (rows of blocks are packed).
//
// The types of ggml 0.25.3 added after the K-quants (IQ*, TQ*, MXFP4, NVFP4,
// Q1_0, Q2_0; the second half of this file) are decoded eight values at a
// time: `DQ::get8(block, c, v)` writes values 8c..8c+7 of one block (c in
// [0, QK/8)), the one place each format is written down here; `at` picks one
// value of it (sg_chunk_at), except for the formats where one value is as
// cheap on its own. Every value is the CPU's (src/tensor/quant: iquants.rs,
// lowbit.rs, fp4.rs) bit for bit: the same f32 operations in the same order,
// each rounded on its own (__fmul_rn / __fadd_rn: nothing fused).

#include "iq_tables.cuh"

// ---------------------------------------------------------------------------
// Per-element dequantisation: value j of a row (j in [0, ne00))
// ---------------------------------------------------------------------------

struct DqF32 {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64 nb00) { return *(const float *) (row + j * nb00); }
};
struct DqF16 {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64 nb00) {
        return sg_h2f(*(const unsigned short *) (row + j * nb00));
    }
};
struct DqBF16 {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64 nb00) {
        return __uint_as_float((unsigned) *(const unsigned short *) (row + j * nb00) << 16);
    }
};
struct DqI32 {
    typedef int T;
    __device__ static __forceinline__ int at(const char *row, i64 j, i64 nb00) { return *(const int *) (row + j * nb00); }
};
struct DqQ8_0 {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 32) * 34;
        const float d = sg_ld_h(b);
        return d * (float) (signed char) b[2 + (j % 32)];
    }
};
struct DqQ4_0 {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 32) * 18;
        const int t = (int) (j % 32);
        const float d = sg_ld_h(b);
        const unsigned char q = b[2 + (t & 15)];
        const int v = (t < 16 ? (q & 15) : (q >> 4)) - 8;
        return (float) v * d;
    }
};

struct DqQ4_1 {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 32) * 20;
        const int t = (int) (j % 32);
        const float d = sg_ld_h(b), m = sg_ld_h(b + 2);
        const unsigned char q = b[4 + (t & 15)];
        const int v = t < 16 ? (q & 15) : (q >> 4);
        return __fadd_rn(__fmul_rn((float) v, d), m);
    }
};

struct DqQ5_0 {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 32) * 22;
        const int t = (int) (j % 32);
        const float d = sg_ld_h(b);
        const unsigned qh = (unsigned) b[2] | ((unsigned) b[3] << 8) | ((unsigned) b[4] << 16) | ((unsigned) b[5] << 24);
        const unsigned char q = b[6 + (t & 15)];
        const int v = ((t < 16 ? (q & 15) : (q >> 4)) | (((qh >> t) & 1) << 4)) - 16;
        return __fmul_rn((float) v, d);
    }
};
struct DqQ5_1 {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 32) * 24;
        const int t = (int) (j % 32);
        const float d = sg_ld_h(b), m = sg_ld_h(b + 2);
        const unsigned qh = (unsigned) b[4] | ((unsigned) b[5] << 8) | ((unsigned) b[6] << 16) | ((unsigned) b[7] << 24);
        const unsigned char q = b[8 + (t & 15)];
        const int v = (t < 16 ? (q & 15) : (q >> 4)) | (((qh >> t) & 1) << 4);
        return __fadd_rn(__fmul_rn((float) v, d), m);
    }
};
// Q2_K / Q3_K: value t of a super-block lies in 128-value half n = t/128, and
// in it at r = t%128: shift 2*(r/32), sub-block of 16 is = 8n + r/16, quant
// byte 32n + r%32.
struct DqQ2_K {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 256) * 84;
        const int t = (int) (j % 256);
        const int n = t / 128, r = t % 128;
        const int is = 8 * n + r / 16;
        const unsigned char sc = b[is];
        const float d = sg_ld_h(b + 80), dmin = sg_ld_h(b + 82);
        const int q = (b[16 + 32 * n + r % 32] >> (2 * (r / 32))) & 3;
        const float dl = __fmul_rn(d, (float) (sc & 0xF)), ml = __fmul_rn(dmin, (float) (sc >> 4));
        return __fsub_rn(__fmul_rn(dl, (float) q), ml);
    }
};
struct DqQ3_K {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 256) * 110;
        const int t = (int) (j % 256);
        const int n = t / 128, r = t % 128, sh = r / 32;
        const int is = 8 * n + r / 16;
        const unsigned char *scales = b + 96;
        const int lo = is < 8 ? (scales[is] & 0xF) : (scales[is - 8] >> 4);
        const int hi = (scales[8 + (is % 4)] >> (2 * (is / 4))) & 3;
        const int sc = (lo | (hi << 4)) - 32;
        const float d = sg_ld_h(b + 108);
        const int q = ((b[32 + 32 * n + r % 32] >> (2 * sh)) & 3) - ((b[r % 32] & (1 << (4 * n + sh))) ? 0 : 4);
        return __fmul_rn(__fmul_rn(d, (float) sc), (float) q);
    }
};

// 6-bit scale and min number `j` (0..7) of a Q4_K / Q5_K block (get_scale_min_k4).
__device__ __forceinline__ void sg_scale_min_k4(int j, const unsigned char *q, int &sc, int &m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

struct DqQ4_K {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 256) * 144;
        const int t = (int) (j % 256);
        const int g = t / 64, w = t % 64, l = w % 32;
        const float d = sg_ld_h(b), dmin = sg_ld_h(b + 2);
        int sc, m;
        sg_scale_min_k4(2 * g + (w >= 32), b + 4, sc, m);
        const unsigned char q = b[16 + g * 32 + l];
        const int v = w < 32 ? (q & 0xF) : (q >> 4);
        return __fsub_rn(__fmul_rn(__fmul_rn(d, (float) sc), (float) v), __fmul_rn(dmin, (float) m));
    }
};
struct DqQ5_K {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 256) * 176;
        const int t = (int) (j % 256);
        const int g = t / 64, w = t % 64, l = w % 32;
        const float d = sg_ld_h(b), dmin = sg_ld_h(b + 2);
        int sc, m;
        sg_scale_min_k4(2 * g + (w >= 32), b + 4, sc, m);
        const unsigned char qh = b[16 + l];
        const unsigned char ql = b[48 + g * 32 + l];
        const int hbit = w < 32 ? (1 << (2 * g)) : (2 << (2 * g));
        const int v = (w < 32 ? (ql & 0xF) : (ql >> 4)) + ((qh & hbit) ? 16 : 0);
        return __fsub_rn(__fmul_rn(__fmul_rn(d, (float) sc), (float) v), __fmul_rn(dmin, (float) m));
    }
};
struct DqQ6_K {
    typedef float T;
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 256) * 210;
        const int t = (int) (j % 256);
        const int n = t / 128, r = t % 128, qq = r / 32, l = r % 32;
        const unsigned char *ql = b + n * 64;
        const unsigned char *qh = b + 128 + n * 32;
        const signed char *sc = (const signed char *) (b + 192) + n * 8;
        const float d = sg_ld_h(b + 208);
        const unsigned char lo = (qq & 1) ? ql[l + 32] : ql[l];
        const int v = (((qq & 2) ? (lo >> 4) : (lo & 0xF)) | (((qh[l] >> (2 * qq)) & 3) << 4)) - 32;
        return __fmul_rn(__fmul_rn(d, (float) sc[l / 16 + 2 * qq]), (float) v);
    }
};


// ---------------------------------------------------------------------------
// ggml 0.25.3's newer block types, eight values at a time
// ---------------------------------------------------------------------------

__device__ __forceinline__ unsigned sg_le16(const unsigned char *p) { return (unsigned) p[0] | ((unsigned) p[1] << 8); }
__device__ __forceinline__ unsigned sg_le32(const unsigned char *p) {
    return (unsigned) p[0] | ((unsigned) p[1] << 8) | ((unsigned) p[2] << 16) | ((unsigned) p[3] << 24);
}

// v[k] = db * (coordinate k of grid point g, negated where bit k of s is set),
// for 8 one-byte coordinates (IQ2 grids; two IQ3 points side by side).
__device__ __forceinline__ void sg_grid8(u64 g, unsigned s, float db, float *v) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int c = (int) (signed char) (unsigned char) (g >> (8 * k));
        v[k] = __fmul_rn(db, (float) ((s >> k) & 1 ? -c : c));
    }
}

// v[k] = dl * (coordinate k + delta) of an IQ1 grid point (coordinates -1, 0, 1).
__device__ __forceinline__ void sg_grid8_iq1(u64 g, float dl, float delta, float *v) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int c = (int) (signed char) (unsigned char) (g >> (8 * k));
        v[k] = __fmul_rn(dl, __fadd_rn((float) c, delta));
    }
}

// Value j of a packed row of a type decoded eight at a time: value j % 8 of
// the chunk holding it (a register select, no local array indexing).
template <typename DQ>
__device__ __forceinline__ float sg_chunk_at(const char *row, i64 j) {
    const unsigned char *b = (const unsigned char *) row + (j / DQ::QK) * DQ::BYTES;
    const int t = (int) (j % DQ::QK);
    float v[8];
    DQ::get8(b, t >> 3, v);
    float r = v[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) r = (t & 7) == k ? v[k] : r;
    return r;
}

// IQ2_XXS, 66 B / 256 values: f16 d, then per group g of 32 values two
// little-endian u32: four grid indices (bytes), and four 7-bit sign fields
// with a 4-bit scale sc in the top bits. w = d*(0.5 + sc)*0.25 * (±grid).
struct DqIQ2_XXS {
    typedef float T;
    static constexpr int QK = 256, BYTES = 66;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const int g = c >> 2, l = c & 3;
        const unsigned char *q = b + 2 + 8 * g;
        const unsigned aux = sg_le32(q + 4);
        const float db = __fmul_rn(__fmul_rn(sg_ld_h(b), __fadd_rn(0.5f, (float) (aux >> 28))), 0.25f);
        sg_grid8(sg_iq2xxs_grid[q[l]], sg_ksigns_iq2xs[(aux >> (7 * l)) & 127], db, v);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) { return sg_chunk_at<DqIQ2_XXS>(row, j); }
};

// The 4-bit scale of value group c/2 (16 values) of IQ2_XS / IQ2_S:
// low nibble of scales[c/4] for even groups, high for odd.
__device__ __forceinline__ float sg_iq2_db16(const unsigned char *b, const unsigned char *scales, int c) {
    const int sc = (scales[c >> 2] >> (4 * ((c >> 1) & 1))) & 0xf;
    return __fmul_rn(__fmul_rn(sg_ld_h(b), __fadd_rn(0.5f, (float) sc)), 0.25f);
}

// IQ2_XS, 74 B / 256 values: f16 d, u16 qs[32] (9-bit grid index, 7-bit
// sign field), u8 scales[8] (two 4-bit scales, per 16 values).
struct DqIQ2_XS {
    typedef float T;
    static constexpr int QK = 256, BYTES = 74;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const unsigned q = sg_le16(b + 2 + 2 * c);
        sg_grid8(sg_iq2xs_grid[q & 511], sg_ksigns_iq2xs[q >> 9], sg_iq2_db16(b, b + 66, c), v);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) { return sg_chunk_at<DqIQ2_XS>(row, j); }
};

// IQ2_S, 82 B / 256 values: f16 d, u8 qs[32] (low 8 bits of the 10-bit grid
// indices), u8 signs[32], u8 qh[8] (2 high bits per index), u8 scales[8].
struct DqIQ2_S {
    typedef float T;
    static constexpr int QK = 256, BYTES = 82;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const int g = c >> 2, l = c & 3;
        const unsigned idx = b[2 + c] | (((unsigned) b[66 + g] << (8 - 2 * l)) & 0x300);
        sg_grid8(sg_iq2s_grid[idx], b[34 + c], sg_iq2_db16(b, b + 74, c), v);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) { return sg_chunk_at<DqIQ2_S>(row, j); }
};

// IQ3_XXS, 98 B / 256 values: f16 d, u8 qs[64] (grid indices of 4-value
// points), then per group of 32 a u32: four 7-bit sign fields and a 4-bit
// scale. w = d*(0.5 + sc)*0.5 * (±grid).
struct DqIQ3_XXS {
    typedef float T;
    static constexpr int QK = 256, BYTES = 98;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const int g = c >> 2, l = c & 3;
        const unsigned aux = sg_le32(b + 66 + 4 * g);
        const float db = __fmul_rn(__fmul_rn(sg_ld_h(b), __fadd_rn(0.5f, (float) (aux >> 28))), 0.5f);
        const u64 pts = (u64) sg_iq3xxs_grid[b[2 + 2 * c]] | ((u64) sg_iq3xxs_grid[b[3 + 2 * c]] << 32);
        sg_grid8(pts, sg_ksigns_iq2xs[(aux >> (7 * l)) & 127], db, v);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) { return sg_chunk_at<DqIQ3_XXS>(row, j); }
};

// IQ3_S, 110 B / 256 values: f16 d, u8 qs[64] (low 8 bits of 9-bit grid
// indices), u8 qh[8] (their 9th bits), u8 signs[32], u8 scales[4] (4-bit,
// per 32 values). w = d*(1 + 2*sc) * (±grid).
struct DqIQ3_S {
    typedef float T;
    static constexpr int QK = 256, BYTES = 110;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const int g = c >> 2, l = c & 3;
        const unsigned qh = b[66 + g];
        const int sc = (b[106 + (g >> 1)] >> (4 * (g & 1))) & 0xf;
        const unsigned i1 = b[2 + 2 * c] | ((qh << (8 - 2 * l)) & 256);
        const unsigned i2 = b[3 + 2 * c] | ((qh << (7 - 2 * l)) & 256);
        const float db = __fmul_rn(sg_ld_h(b), (float) (1 + 2 * sc));
        sg_grid8((u64) sg_iq3s_grid[i1] | ((u64) sg_iq3s_grid[i2] << 32), b[74 + c], db, v);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) { return sg_chunk_at<DqIQ3_S>(row, j); }
};

// IQ1_S, 50 B / 256 values: f16 d, u8 qs[32] (low 8 bits of 11-bit grid
// indices), u16 qh[8] (per 32 values: 3 high bits per index, a 3-bit scale,
// the sign of the shift). w = d*(2*sc + 1) * (grid ± 1/8).
struct DqIQ1_S {
    typedef float T;
    static constexpr int QK = 256, BYTES = 50;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const int g = c >> 2, l = c & 3;
        const unsigned qh = sg_le16(b + 34 + 2 * g);
        const unsigned idx = b[2 + c] | (((qh >> (3 * l)) & 7) << 8);
        const float dl = __fmul_rn(sg_ld_h(b), (float) (2 * (int) ((qh >> 12) & 7) + 1));
        sg_grid8_iq1(sg_iq1s_grid[idx], dl, (qh & 0x8000) ? -0.125f : 0.125f, v);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) { return sg_chunk_at<DqIQ1_S>(row, j); }
};

// IQ1_M, 56 B / 256 values: u8 qs[32], u8 qh[16] (per 8 values: 3 high index
// bits and the shift's sign, two per byte), u16 scales[4] (3-bit scales per
// 16 values; the f16 d in their four top nibbles).
struct DqIQ1_M {
    typedef float T;
    static constexpr int QK = 256, BYTES = 56;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const int g = c >> 2, l = c & 3;
        const unsigned s0 = sg_le16(b + 48), s1 = sg_le16(b + 50), s2 = sg_le16(b + 52), s3 = sg_le16(b + 54);
        const float d = sg_h2f((unsigned short) ((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000)));
        const unsigned sv = sg_le16(b + 48 + 2 * (g >> 1));
        const int sc = (int) ((sv >> (6 * (g & 1) + 3 * (l >> 1))) & 7);
        const unsigned h = b[32 + 2 * g + (l >> 1)];
        const unsigned idx = b[c] | ((h << (8 - 4 * (l & 1))) & 0x700);
        const float delta = (h & (0x08u << (4 * (l & 1)))) ? -0.125f : 0.125f;
        sg_grid8_iq1(sg_iq1s_grid[idx], __fmul_rn(d, (float) (2 * sc + 1)), delta, v);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) { return sg_chunk_at<DqIQ1_M>(row, j); }
};

// IQ4_NL, 18 B / 32 values: f16 d, u8 qs[16] (value t: low nibble of qs[t]
// for t < 16, high nibble of qs[t - 16] after); w = d * kvalues_iq4nl[code].
struct DqIQ4_NL {
    typedef float T;
    static constexpr int QK = 32, BYTES = 18;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const float d = sg_ld_h(b);
        const unsigned char *q = b + 2 + 8 * (c & 1);
        const int sh = 4 * (c >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(d, (float) sg_kvalues_iq4nl[(q[k] >> sh) & 0xf]);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 32) * 18;
        const int t = (int) (j % 32);
        return __fmul_rn(sg_ld_h(b), (float) sg_kvalues_iq4nl[(b[2 + (t & 15)] >> (4 * (t >> 4))) & 0xf]);
    }
};

// IQ4_XS, 136 B / 256 values: f16 d, u16 scales_h (2 high bits per group of
// 32), u8 scales_l[4] (4 low bits per group), u8 qs[128] (16 bytes per group,
// nibbles as IQ4_NL); w = d*(ls - 32) * kvalues_iq4nl[code].
struct DqIQ4_XS {
    typedef float T;
    static constexpr int QK = 256, BYTES = 136;
    __device__ static __forceinline__ float dl(const unsigned char *b, int g) {
        const int ls = ((b[4 + (g >> 1)] >> (4 * (g & 1))) & 0xf) | (((sg_le16(b + 2) >> (2 * g)) & 3) << 4);
        return __fmul_rn(sg_ld_h(b), (float) (ls - 32));
    }
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const int g = c >> 2, w = c & 3;
        const float d = dl(b, g);
        const unsigned char *q = b + 8 + 16 * g + 8 * (w & 1);
        const int sh = 4 * (w >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(d, (float) sg_kvalues_iq4nl[(q[k] >> sh) & 0xf]);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 256) * 136;
        const int t = (int) (j % 256), g = t >> 5, r = t & 31;
        return __fmul_rn(dl(b, g), (float) sg_kvalues_iq4nl[(b[8 + 16 * g + (r & 15)] >> (4 * (r >> 4))) & 0xf]);
    }
};

// TQ1_0, 54 B / 256 values: u8 qs[48], u8 qh[4], f16 d. Each byte holds 5
// trits (qh: 4) as a fixed-point fraction of 3^5; trit k is the top of
// byte*3^k (mod 256) times 3. Values 0..159: trit v/32 of qs[v%32]; 160..239:
// trit (v-160)/16 of qs[32 + v%16]; 240..255: trit (v-240)/4 of qh[v%4].
// w = (trit - 1) * d.
struct DqTQ1_0 {
    typedef float T;
    static constexpr int QK = 256, BYTES = 54;
    __device__ static __forceinline__ float val(const unsigned char *b, int t, float d) {
        int byte, k;
        if (t < 160) {
            byte = t & 31;
            k = t >> 5;
        } else if (t < 240) {
            byte = 32 + ((t - 160) & 15);
            k = (t - 160) >> 4;
        } else {
            byte = 48 + ((t - 240) & 3);
            k = (t - 240) >> 2;
        }
        const unsigned p3 = k == 0 ? 1u : k == 1 ? 3u : k == 2 ? 9u : k == 3 ? 27u : 81u;
        const int trit = (int) ((((b[byte] * p3) & 0xffu) * 3u) >> 8);
        return __fmul_rn((float) (trit - 1), d);
    }
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const float d = sg_ld_h(b + 52);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = val(b, 8 * c + k, d);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 256) * 54;
        return val(b, (int) (j % 256), sg_ld_h(b + 52));
    }
};

// TQ2_0, 66 B / 256 values: u8 qs[64], f16 d; value t: bits 2*((t%128)/32)
// of qs[32*(t/128) + t%32]; w = (q - 1) * d.
struct DqTQ2_0 {
    typedef float T;
    static constexpr int QK = 256, BYTES = 66;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const float d = sg_ld_h(b + 64);
        const int t = 8 * c;
        const unsigned char *q = b + 32 * (t >> 7) + (t & 31);
        const int sh = 2 * ((t & 127) >> 5);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn((float) ((int) ((q[k] >> sh) & 3) - 1), d);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 256) * 66;
        const int t = (int) (j % 256);
        const int q = (b[32 * (t >> 7) + (t & 31)] >> (2 * ((t & 127) >> 5))) & 3;
        return __fmul_rn((float) (q - 1), sg_ld_h(b + 64));
    }
};

// Half the value of an E8M0 exponent byte, 2^(e - 128) (e = 0, 1: f32 subnormals).
__device__ __forceinline__ float sg_e8m0_half(unsigned e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// Half the value of a UE4M3 scale byte (bit 7 ignored; 0 and 0x7f are zero).
__device__ __forceinline__ float sg_ue4m3_half(unsigned x) {
    if (x == 0 || x == 0x7f) return 0.0f;
    const unsigned exp = (x >> 3) & 0xf, man = x & 7;
    const float raw = exp == 0 ? __fmul_rn((float) man, 1.0f / 512.0f)
                               : __fmul_rn(__fadd_rn(1.0f, (float) man / 8.0f), __uint_as_float((exp + 120) << 23));
    return __fmul_rn(raw, 0.5f);
}

// MXFP4, 17 B / 32 values: u8 e (E8M0), u8 qs[16] (nibbles as IQ4_NL);
// w = kvalues_fp4[code] * 2^(e - 128).
struct DqMXFP4 {
    typedef float T;
    static constexpr int QK = 32, BYTES = 17;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const float d = sg_e8m0_half(b[0]);
        const unsigned char *q = b + 1 + 8 * (c & 1);
        const int sh = 4 * (c >> 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn((float) sg_kvalues_fp4[(q[k] >> sh) & 0xf], d);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 32) * 17;
        const int t = (int) (j % 32);
        return __fmul_rn((float) sg_kvalues_fp4[(b[1 + (t & 15)] >> (4 * (t >> 4))) & 0xf], sg_e8m0_half(b[0]));
    }
};

// NVFP4, 36 B / 64 values: u8 d[4] (UE4M3, one per 16 values), u8 qs[32]
// (8 bytes per 16 values, nibbles as IQ4_NL within the 16);
// w = kvalues_fp4[code] * d[s]/2.
struct DqNVFP4 {
    typedef float T;
    static constexpr int QK = 64, BYTES = 36;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const int s = c >> 1;
        const float d = sg_ue4m3_half(b[s]);
        const unsigned char *q = b + 4 + 8 * s;
        const int sh = 4 * (c & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn((float) sg_kvalues_fp4[(q[k] >> sh) & 0xf], d);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 64) * 36;
        const int t = (int) (j % 64), s = t >> 4, r = t & 15;
        return __fmul_rn((float) sg_kvalues_fp4[(b[4 + 8 * s + (r & 7)] >> (4 * (r >> 3))) & 0xf], sg_ue4m3_half(b[s]));
    }
};

// Q1_0, 18 B / 128 values: f16 d, u8 qs[16]; w = bit j of the row ? d : -d.
struct DqQ1_0 {
    typedef float T;
    static constexpr int QK = 128, BYTES = 18;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const float d = sg_ld_h(b);
        const unsigned q = b[2 + c];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = (q >> k) & 1 ? d : -d;
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 128) * 18;
        const int t = (int) (j % 128);
        const float d = sg_ld_h(b);
        return (b[2 + (t >> 3)] >> (t & 7)) & 1 ? d : -d;
    }
};

// Q2_0, 18 B / 64 values: f16 d, u8 qs[16] (value t: bits 2*(t%4) of
// qs[t/4]); w = (q - 1) * d.
struct DqQ2_0 {
    typedef float T;
    static constexpr int QK = 64, BYTES = 18;
    __device__ static __forceinline__ void get8(const unsigned char *b, int c, float *v) {
        const float d = sg_ld_h(b);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = __fmul_rn((float) ((int) ((b[2 + 2 * c + (k >> 2)] >> (2 * (k & 3))) & 3) - 1), d);
    }
    __device__ static __forceinline__ float at(const char *row, i64 j, i64) {
        const unsigned char *b = (const unsigned char *) row + (j / 64) * 18;
        const int t = (int) (j % 64);
        return __fmul_rn((float) ((int) ((b[2 + (t >> 2)] >> (2 * (t & 3))) & 3) - 1), sg_ld_h(b));
    }
};

// Every type decoded eight at a time, with its kernel-name suffix:
// SG_CHUNK_TYPES(X) calls X(suffix, DqType) for each (one list for every
// file that instantiates kernels per type).
#define SG_CHUNK_TYPES(X)                                                                \
    X(iq2_xxs, DqIQ2_XXS) X(iq2_xs, DqIQ2_XS) X(iq2_s, DqIQ2_S) X(iq3_xxs, DqIQ3_XXS)    \
    X(iq3_s, DqIQ3_S) X(iq1_s, DqIQ1_S) X(iq1_m, DqIQ1_M) X(iq4_nl, DqIQ4_NL)            \
    X(iq4_xs, DqIQ4_XS) X(tq1_0, DqTQ1_0) X(tq2_0, DqTQ2_0) X(mxfp4, DqMXFP4)            \
    X(nvfp4, DqNVFP4) X(q1_0, DqQ1_0) X(q2_0, DqQ2_0)
