// quant.cuh — ggml's reference quantisers (quantize_row_*_ref) of one
// 32-value block, written with single IEEE operations so NVRTC cannot fuse
// them and change the bytes: `Q::quant(x[32], block)`, and for Q8_0 / Q4_0
// also `Q::dequant(block, x[32])`. Shared by elementwise.cu (cpy into and
// out of blocks, quantized add) and getrows.cu (set_rows). Pasted in by
// build.rs (see common.cuh).

#include "iq_tables.cuh"

// Largest |x| and the signed value attaining it (first one on ties).
__device__ __forceinline__ float sg_abs_max_signed(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
        const float a = fabsf(x[j]);
        if (amax < a) { amax = a; max = x[j]; }
    }
    return max;
}

struct QQ8_0 {
    static constexpr int BYTES = 34;
    __device__ static __forceinline__ void quant(const float *x, unsigned char *y) {
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) {
            const float a = fabsf(x[j]);
            amax = amax > a ? amax : a;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        sg_st_h(y, d);
        for (int j = 0; j < 32; ++j) y[2 + j] = (unsigned char) (signed char) (int) roundf(__fmul_rn(x[j], id));
    }
    __device__ static __forceinline__ void dequant(const unsigned char *b, float *out) {
        const float d = sg_ld_h(b);
        for (int j = 0; j < 32; ++j) out[j] = __fmul_rn((float) (signed char) b[2 + j], d);
    }
};
struct QQ4_0 {
    static constexpr int BYTES = 18;
    __device__ static __forceinline__ void quant(const float *x, unsigned char *y) {
        const float d = sg_abs_max_signed(x) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        sg_st_h(y, d);
        for (int j = 0; j < 16; ++j) {
            int q0 = (signed char) (int) __fadd_rn(__fmul_rn(x[j], id), 8.5f);
            int q1 = (signed char) (int) __fadd_rn(__fmul_rn(x[j + 16], id), 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[2 + j] = (unsigned char) ((q0 & 0xff) | (q1 << 4));
        }
    }
    __device__ static __forceinline__ void dequant(const unsigned char *b, float *out) {
        const float d = sg_ld_h(b);
        for (int j = 0; j < 16; ++j) {
            out[j] = __fmul_rn((float) ((b[2 + j] & 15) - 8), d);
            out[j + 16] = __fmul_rn((float) ((b[2 + j] >> 4) - 8), d);
        }
    }
};
struct QQ4_1 {
    static constexpr int BYTES = 20;
    __device__ static __forceinline__ void quant(const float *x, unsigned char *y) {
        float min = 3.402823466e+38f, max = -3.402823466e+38f;   // +-FLT_MAX
        for (int j = 0; j < 32; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        sg_st_h(y, d);
        sg_st_h(y + 2, min);
        for (int j = 0; j < 16; ++j) {
            int q0 = (signed char) (int) __fadd_rn(__fmul_rn(__fsub_rn(x[j], min), id), 0.5f);
            int q1 = (signed char) (int) __fadd_rn(__fmul_rn(__fsub_rn(x[j + 16], min), id), 0.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[4 + j] = (unsigned char) ((q0 & 0xff) | (q1 << 4));
        }
    }
};
struct QQ5_0 {
    static constexpr int BYTES = 22;
    __device__ static __forceinline__ void quant(const float *x, unsigned char *y) {
        const float d = sg_abs_max_signed(x) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        sg_st_h(y, d);
        unsigned qh = 0;
        for (int j = 0; j < 16; ++j) {
            int q0 = (signed char) (int) __fadd_rn(__fmul_rn(x[j], id), 16.5f);
            int q1 = (signed char) (int) __fadd_rn(__fmul_rn(x[j + 16], id), 16.5f);
            q0 = q0 < 31 ? q0 : 31;
            q1 = q1 < 31 ? q1 : 31;
            y[6 + j] = (unsigned char) ((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= ((unsigned) ((q0 & 0x10) >> 4)) << j;
            qh |= ((unsigned) ((q1 & 0x10) >> 4)) << (j + 16);
        }
        for (int b = 0; b < 4; ++b) y[2 + b] = (unsigned char) (qh >> (8 * b));
    }
};

struct QQ5_1 {
    static constexpr int BYTES = 24;
    __device__ static __forceinline__ void quant(const float *x, unsigned char *y) {
        float min = 3.402823466e+38f, max = -3.402823466e+38f;   // +-FLT_MAX
        for (int j = 0; j < 32; ++j) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        sg_st_h(y, d);
        sg_st_h(y + 2, min);
        unsigned qh = 0;
        for (int j = 0; j < 16; ++j) {
            // (uint8_t) v, as ggml's quantize_row_q5_1_ref.
            const int q0 = (unsigned char) (int) __fadd_rn(__fmul_rn(__fsub_rn(x[j], min), id), 0.5f);
            const int q1 = (unsigned char) (int) __fadd_rn(__fmul_rn(__fsub_rn(x[j + 16], min), id), 0.5f);
            y[8 + j] = (unsigned char) ((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= ((unsigned) ((q0 & 0x10) >> 4)) << j;
            qh |= ((unsigned) ((q1 & 0x10) >> 4)) << (j + 16);
        }
        for (int b = 0; b < 4; ++b) y[4 + b] = (unsigned char) (qh >> (8 * b));
    }
};


// IQ4_NL as ggml's CPU writes it in cpy / set_rows (quantize_row_iq4_nl_ref,
// src/tensor/quant/iq_quantize.rs): the codes nearest to x * id with
// id = 1 / (max / -127) (max the signed value of largest magnitude), then the
// least-squares scale d = sum(w*q*x) / sum(w*q*q) of those codes (w = x*x),
// stored as f16. A block whose largest |x| is below 1e-15 gets d = 0 and
// codes 8 (0x88 bytes).
struct QIQ4_NL {
    static constexpr int BYTES = 18;
    // Index of the table value nearest to x (the lower one on ties; the ends
    // beyond them; 15 for NaN), by bisection as ggml's best_index_int8.
    __device__ static __forceinline__ int best(float x) {
        const signed char *v = sg_kvalues_iq4nl;
        if (x <= (float) v[0]) return 0;
        if (x >= (float) v[15]) return 15;
        int ml = 0, mu = 15;
        while (mu - ml > 1) {
            const int mav = (ml + mu) / 2;
            if (x < (float) v[mav]) mu = mav;
            else ml = mav;
        }
        return __fsub_rn(x, (float) v[mu - 1]) < __fsub_rn((float) v[mu], x) ? mu - 1 : mu;
    }
    __device__ static __forceinline__ void quant(const float *x, unsigned char *y) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j) {
            const float a = fabsf(x[j]);
            if (a > amax) { amax = a; max = x[j]; }
        }
        if (amax < 1e-15f) {
            sg_st_h(y, 0.0f);
            for (int j = 0; j < 16; ++j) y[2 + j] = 0x88;
            return;
        }
        const float id = __fdiv_rn(1.0f, __fdiv_rn(max, (float) sg_kvalues_iq4nl[0]));
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int j = 0; j < 32; ++j) {
            const float q = (float) sg_kvalues_iq4nl[best(__fmul_rn(id, x[j]))];
            const float w = __fmul_rn(x[j], x[j]);
            sumqx = __fadd_rn(sumqx, __fmul_rn(__fmul_rn(w, q), x[j]));
            sumq2 = __fadd_rn(sumq2, __fmul_rn(__fmul_rn(w, q), q));
        }
        sg_st_h(y, sumq2 > 0.0f ? __fdiv_rn(sumqx, sumq2) : 0.0f);
        for (int j = 0; j < 16; ++j) {
            y[2 + j] = (unsigned char) (best(__fmul_rn(id, x[j])) | (best(__fmul_rn(id, x[j + 16])) << 4));
        }
    }
};
