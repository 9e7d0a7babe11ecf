// rope.cu — rotary position embedding of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml-cpu ops.cpp (ggml_compute_forward_rope_flt, forward
// direction, with ggml_rope_cache_init / ggml_mrope_cache_init / rope_yarn).
// Self-contained: no headers; f16 <-> f32 via the PTX `cvt` instructions.
//
// sg_rope_f32  (F32 -> F32)
// sg_rope_f16  (F16 -> F16, rotation computed in f32)
//   Arguments:
//     const char  *src,            // [ne0, ne1 = heads, ne2 = tokens, ne3]
//     const int   *pos,            // I32 positions: [ne2] for NORMAL / NEOX,
//                                  //   [4*ne2] (t, h, w, e streams) for MROPE / IMROPE
//     const float *freq_factors,   // nullptr, or F32 [>= n_dims/2] (ggml's src2)
//     char        *dst,            // same shape and type as src
//     i64 ne0, ne1, ne2, ne3,
//     i64 nb00, nb01, nb02, nb03,  // src strides (bytes)
//     i64 nb0, nb1, nb2, nb3,      // dst strides (bytes)
//     int   n_dims,                // rotated dims, even, 0 < n_dims <= min(ne0, 1024)
//     int   mode,                  // 0 NORMAL, 2 NEOX, 8 MROPE, 40 IMROPE
//     float theta_scale,           // powf(freq_base, -2.0f/n_dims), computed on the host
//                                  //   exactly as the CPU backend does
//     float freq_scale,
//     float ext_factor,            // YaRN mix (0 disables it)
//     float attn_factor,           // magnitude scale (ggml's mscale)
//     float corr_dim0, float corr_dim1,  // ggml_rope_yarn_corr_dims(n_dims, n_ctx_orig,
//                                  //   freq_base, beta_fast, beta_slow), from the host
//     int sec0, int sec1, int sec2, int sec3   // MROPE / IMROPE sections (else ignored)
//   Launch: one block per token (i2, i3): blockDim = (B, 1, 1), B a multiple
//   of 32 in [32, 1024] (128 or 256 recommended); gridDim = (gx, 1, 1) with
//   gx = min(ne2*ne3, 2^31 - 1); blocks loop over tokens with a grid stride.
//   Static shared memory: 4 KiB (angles of up to 512 pairs).
//   Per token, one thread builds the angles with ggml's exact f32 recurrence
//   (theta = p, then theta *= theta_scale pair after pair, one recurrence per
//   position stream for MROPE/IMROPE); cos/sin follow rope_yarn (YaRN ramp
//   between corr_dim0/1 when ext_factor != 0, magnitude attn_factor, times
//   1 + 0.1*logf(1/freq_scale) when ext_factor != 0), with freq_factors
//   dividing theta. Pairs: NORMAL rotates (x[2i], x[2i+1]); NEOX, MROPE and
//   IMROPE rotate (x[i], x[i + n_dims/2]); y0 = x0*cos - x1*sin,
//   y1 = x0*sin + x1*cos (products rounded separately, no fused
//   multiply-add, as ggml's CPU). Elements n_dims..ne0-1 are copied unchanged.
//   In-place (dst == src with the same strides) is allowed.
//   Not supported: GGML_ROPE_TYPE_VISION (mode 24) and the backward
//   direction (ggml_rope_back, sin sign flipped); n_dims > 1024 does nothing
//   (the host must refuse it).

#include "common.cuh"

struct TF32 {
    __device__ static __forceinline__ float load(const char *p) { return *(const float *) p; }
    __device__ static __forceinline__ void store(char *p, float v) { *(float *) p = v; }
    __device__ static __forceinline__ void copy(char *d, const char *s) { *(unsigned int *) d = *(const unsigned int *) s; }
};
struct TF16 {
    __device__ static __forceinline__ float load(const char *p) { return sg_h2f(*(const unsigned short *) p); }
    __device__ static __forceinline__ void store(char *p, float v) { *(unsigned short *) p = sg_f2h(v); }
    __device__ static __forceinline__ void copy(char *d, const char *s) { *(unsigned short *) d = *(const unsigned short *) s; }
};

#define SG_ROPE_MAX_PAIRS 512

__device__ __forceinline__ float sg_cmaxf(float a, float b) { return a > b ? a : b; }
__device__ __forceinline__ float sg_cminf(float a, float b) { return a < b ? a : b; }

// 1 below the correction range, 0 above it, linear between (rope_yarn_ramp).
__device__ __forceinline__ float sg_yarn_ramp(float low, float high, int i0) {
    const float y = ((float) (i0 / 2) - low) / sg_cmaxf(0.001f, high - low);
    return 1.0f - sg_cminf(1.0f, sg_cmaxf(0.0f, y));
}

template <typename T>
__device__ __forceinline__ void rope_tokens(
        const char *src, const int *pos, const float *freq_factors, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int n_dims, int mode, float theta_scale, float freq_scale, float ext_factor,
        float attn_factor, float corr_dim0, float corr_dim1,
        int sec0, int sec1, int sec2, int sec3) {
    __shared__ float s_cos[SG_ROPE_MAX_PAIRS];
    __shared__ float s_sin[SG_ROPE_MAX_PAIRS];

    if (n_dims <= 0 || n_dims > 2 * SG_ROPE_MAX_PAIRS) return;
    const int n_pairs = n_dims / 2;
    const bool mrope = (mode & 8) != 0;
    const bool imrope = mode == 40;
    const bool neox_style = mode != 0;

    float mscale = attn_factor;
    if (ext_factor != 0.0f) mscale *= __fadd_rn(1.0f, __fmul_rn(0.1f, logf(1.0f / freq_scale)));

    const i64 ntok = ne2 * ne3;
    for (i64 t = blockIdx.x; t < ntok; t += gridDim.x) {
        const i64 i2 = t % ne2;
        const i64 i3 = t / ne2;

        __syncthreads();   // the previous token's tables may still be in use
        if (threadIdx.x == 0) {
            // Angles (before frequency factors / YaRN) with ggml's recurrence;
            // stored in s_cos for now.
            if (!mrope) {
                float theta = (float) pos[i2];
                for (int i = 0; i < n_pairs; ++i) {
                    s_cos[i] = theta;
                    theta *= theta_scale;
                }
            } else {
                float th_t = (float) pos[i2];
                float th_h = (float) pos[i2 + ne2];
                float th_w = (float) pos[i2 + ne2 * 2];
                float th_e = (float) pos[i2 + ne2 * 3];
                const int sect_dims = sec0 + sec1 + sec2 + sec3;
                const int sec_w = sec0 + sec1;
                for (int i = 0; i < n_pairs; ++i) {
                    const int sector = sect_dims > 0 ? i % sect_dims : 0;
                    float theta;
                    if (imrope) {
                        if (sector % 3 == 1 && sector < 3 * sec1) theta = th_h;
                        else if (sector % 3 == 2 && sector < 3 * sec2) theta = th_w;
                        else if (sector % 3 == 0 && sector < 3 * sec0) theta = th_t;
                        else theta = th_e;
                    } else {
                        theta = th_t;
                        if (sector >= sec0 && sector < sec_w) theta = th_h;
                        else if (sector >= sec_w && sector < sec_w + sec2) theta = th_w;
                        else if (sector >= sec_w + sec2) theta = th_e;
                    }
                    s_cos[i] = theta;
                    th_t *= theta_scale;
                    th_w *= theta_scale;
                    th_h *= theta_scale;
                    th_e *= theta_scale;
                }
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
            const float ff = freq_factors ? freq_factors[i] : 1.0f;
            const float theta_extrap = s_cos[i] / ff;
            const float theta_interp = freq_scale * theta_extrap;
            float theta = theta_interp;
            if (ext_factor != 0.0f) {
                const float mix = sg_yarn_ramp(corr_dim0, corr_dim1, 2 * i) * ext_factor;
                theta = __fadd_rn(__fmul_rn(theta_interp, 1.0f - mix), __fmul_rn(theta_extrap, mix));
            }
            s_cos[i] = cosf(theta) * mscale;
            s_sin[i] = sinf(theta) * mscale;
        }
        __syncthreads();

        // Every head of the token: ne0 is covered by ceil(ne0/2) slots per
        // head; slot j < n_pairs rotates pair j, later slots copy x[2j], x[2j+1].
        const i64 slots = (ne0 + 1) / 2;
        const i64 total = ne1 * slots;
        for (i64 s = threadIdx.x; s < total; s += blockDim.x) {
            const i64 i1 = s / slots;
            const i64 j = s - i1 * slots;
            const char *x = src + i1 * nb01 + i2 * nb02 + i3 * nb03;
            char *y = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
            if (j < n_pairs) {
                const i64 e0 = neox_style ? j : 2 * j;
                const i64 e1 = neox_style ? j + n_pairs : 2 * j + 1;
                const float x0 = T::load(x + e0 * nb00);
                const float x1 = T::load(x + e1 * nb00);
                const float c = s_cos[j];
                const float sn = s_sin[j];
                T::store(y + e0 * nb0, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn)));
                T::store(y + e1 * nb0, __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c)));
            } else {
                const i64 e0 = 2 * j;
                T::copy(y + e0 * nb0, x + e0 * nb00);
                if (e0 + 1 < ne0) T::copy(y + (e0 + 1) * nb0, x + (e0 + 1) * nb00);
            }
        }
    }
}

#define SG_ROPE(NAME, T)                                                                 \
    extern "C" __global__ void NAME(                                                     \
            const char *src, const int *pos, const float *freq_factors, char *dst,       \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            int n_dims, int mode, float theta_scale, float freq_scale, float ext_factor, \
            float attn_factor, float corr_dim0, float corr_dim1,                         \
            int sec0, int sec1, int sec2, int sec3) {                                    \
        rope_tokens<T>(src, pos, freq_factors, dst, ne0, ne1, ne2, ne3,                  \
                       nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3,                       \
                       n_dims, mode, theta_scale, freq_scale, ext_factor, attn_factor,   \
                       corr_dim0, corr_dim1, sec0, sec1, sec2, sec3);                    \
    }

SG_ROPE(sg_rope_f32, TF32)
SG_ROPE(sg_rope_f16, TF16)
