// quant.cuh — ggml's reference quantisers (quantize_row_*_ref) of one
// 32-value block, written with single IEEE operations so NVRTC cannot fuse
// them and change the bytes: `Q::quant(x[32], block)`, and for Q8_0 / Q4_0
// also `Q::dequant(block, x[32])`. Shared by elementwise.cu (cpy into and
// out of blocks, quantized add) and getrows.cu (set_rows). Pasted in by
// build.rs (see common.cuh).

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

