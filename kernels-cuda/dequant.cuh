// dequant.cuh — value j of a row of each storage type as f32 (ggml's
// dequantize_row_* per value; block layouts of ggml-common.h, QK_K = 256),
// shared by getrows.cu (get_rows, dequantisation for many-column mul_mat) and
// quant_matvec.cu (types without a vectorised dot). Pasted in by build.rs
// (see common.cuh). `DQ::at(row, j, nb00)`: nb00 is the element stride of
// the unquantised types, ignored by block types (rows of blocks are packed).

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

