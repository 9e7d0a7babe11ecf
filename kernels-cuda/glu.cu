// glu.cu — gated linear unit family of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml (ggml.c ggml_glu_impl / ggml_glu / ggml_glu_split /
// ggml_swiglu_oai, ggml-cpu ops.cpp ggml_compute_forward_glu and vec.h
// ggml_vec_<op>_f32): out = ACT(x) * g, element-wise, in f32, with x the
// activated ("gate") operand and g the linear one. Self-contained: no headers
// are included; f16 <-> f32 conversions (used only by the *_lut variants that
// reproduce ggml-cpu's F16 tables) are PTX `cvt` instructions.
//
// Conventions shared by every kernel in this file
// -----------------------------------------------
// * Tensors are byte pointers plus ggml's shape (ne0 innermost) and byte
//   strides, all `long long` (int64). Any strides work.
// * Row launch: blockDim = (B, 1, 1), B a multiple of 64 up to 1024 (256
//   recommended); gridDim = (gx, gy, 1). x is a grid-stride loop over the
//   ne0 output elements of a row, y over the ne1*ne2*ne3 rows, so any grid
//   is correct; good choice gx = min(ceil(ne0 / B), 1024), gy = min(rows, 65535).
// * dst must not overlap its inputs (ggml allocates a fresh result).
// * Types: every kernel exists as _f32 (inputs and dst F32) and _f16 (inputs
//   and dst F16; values widened to f32, ACT(x) * g computed in f32 exactly
//   as for F32, the product rounded once to f16, as ggml-cpu's
//   ggml_vec_<op>_f16). The names below say _f32; read _f16 for F16.
//   For F16 input the *_lut variants equal ggml-cpu's F16 tables (its F16
//   path has no range clamp; on F16 inputs the clamp changes at most the
//   sign of a zero result).
//
// Fused form (ggml_glu(a, op, swapped), ggml_swiglu(a) ...): one tensor a of
// shape [2*nc, ne1, ne2, ne3]; the result is [nc, ne1, ne2, ne3]. With
// swapped = 0, x = a[i0] and g = a[i0 + nc]; with swapped != 0, x = a[i0 + nc]
// and g = a[i0] (ggml's `_swapped` variants).
//   sg_<op>_f32
//   (const char *src, char *dst,
//    i64 ne0, ne1, ne2, ne3,          // RESULT shape: ne0 = nc = src ne0 / 2
//    i64 nb00, nb01, nb02, nb03,      // src strides (bytes)
//    i64 nb0, nb1, nb2, nb3,          // dst strides (bytes)
//    int swapped)
//
// Split form (ggml_glu_split(a, b, op), ggml_swiglu_split(a, b) ...): x = a,
// g = b, same shape as the result.
//   sg_<op>_split_f32
//   (const char *a, const char *b, char *dst,
//    i64 ne0, ne1, ne2, ne3,          // shape of a == b == dst
//    i64 nba0, nba1, nba2, nba3,      // a strides (bytes)
//    i64 nbb0, nbb1, nbb2, nbb3,      // b strides (bytes)
//    i64 nb0, nb1, nb2, nb3)          // dst strides (bytes)
//
// <op> and the formula of ACT(x) (GGML_GLU_OP_*):
//   swiglu           x / (1 + expf(-x))                                (SWIGLU)
//   geglu            0.5*x*(1 + tanhf(sqrt(2/pi)*x*(1 + 0.044715*x*x)))  (GEGLU)
//   reglu            x > 0 ? x : 0  (the result is exactly 0 when x <= 0)  (REGLU)
//   geglu_erf        0.5*x*(1 + erff(x/sqrt(2)))                       (GEGLU_ERF)
//   geglu_quick      x * (1 / (1 + expf(-1.702*x)))                    (GEGLU_QUICK)
//   geglu_lut        ggml-cpu's F32 GEGLU through its F16 table: 0 for
//                    x <= -10, x*g for x >= 10, otherwise
//                    f16(gelu(f16(x))) * g (rounded f16 -> f32 table value)
//   geglu_quick_lut  ggml-cpu's F32 GEGLU_QUICK through its F16 table:
//                    f16(gelu_quick(f16(x))) * g (no range clamp)
//   (ggml-cpu evaluates GEGLU and GEGLU_QUICK on F32 through these tables;
//   the plain variants are the exact formulas, as ggml's GPU backends.)
//
// swiglu_oai (ggml_swiglu_oai(a, b, alpha, limit), GGML_GLU_OP_SWIGLU_OAI):
//   xc = min(x, limit); gc = clamp(g, -limit, limit) (std::min / std::clamp
//   semantics); out = (xc / (1 + expf(alpha * -xc))) * (gc + 1).
//   sg_swiglu_oai_f32        fused arguments as above, then (float alpha, float limit)
//   sg_swiglu_oai_split_f32  split arguments as above, then (float alpha, float limit)
//   (and sg_swiglu_oai_f16, sg_swiglu_oai_split_f16)
//
// All products and quotients are single f32 operations written the way ggml
// writes them; expf / tanhf / erff are CUDA's (within their documented ulp
// bounds of the C library's).

#include "common.cuh"

#define SG_GELU_COEF_A 0.044715f
#define SG_GELU_QUICK_COEF (-1.702f)
#define SG_SQRT_2_OVER_PI 0.79788456080286535587989211986876f
#define SG_SQRT_2_INV 0.70710678118654752440084436210484f

static __device__ __forceinline__ float sg_gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(SG_SQRT_2_OVER_PI * x * (1.0f + SG_GELU_COEF_A * x * x)));
}
static __device__ __forceinline__ float sg_gelu_quick(float x) {
    return x * (1.0f / (1.0f + expf(SG_GELU_QUICK_COEF * x)));
}

// Each functor maps (x, g) to the output value.
struct GSwiglu {
    __device__ __forceinline__ float operator()(float x, float g) const { return (x / (1.0f + expf(-x))) * g; }
};
struct GGeglu {
    __device__ __forceinline__ float operator()(float x, float g) const { return sg_gelu(x) * g; }
};
struct GReglu {
    __device__ __forceinline__ float operator()(float x, float g) const { return x > 0.0f ? x * g : 0.0f; }
};
struct GGegluErf {
    __device__ __forceinline__ float operator()(float x, float g) const {
        return 0.5f * x * (1.0f + erff(x * SG_SQRT_2_INV)) * g;
    }
};
struct GGegluQuick {
    __device__ __forceinline__ float operator()(float x, float g) const { return sg_gelu_quick(x) * g; }
};
struct GGegluLut {
    __device__ __forceinline__ float operator()(float x, float g) const {
        if (x <= -10.0f) return 0.0f;
        if (x >= 10.0f) return x * g;
        return sg_h2f(sg_f2h(sg_gelu(sg_h2f(sg_f2h(x))))) * g;
    }
};
struct GGegluQuickLut {
    __device__ __forceinline__ float operator()(float x, float g) const {
        return sg_h2f(sg_f2h(sg_gelu_quick(sg_h2f(sg_f2h(x))))) * g;
    }
};
struct GSwigluOai {
    float alpha, limit;
    __device__ __forceinline__ float operator()(float x, float g) const {
        const float xc = limit < x ? limit : x;                 // std::min(x, limit)
        const float gc = g < -limit ? -limit : (limit < g ? limit : g);   // std::clamp
        const float o = xc / (1.0f + expf(alpha * (-xc)));
        return o * (gc + 1.0f);
    }
};

// Element load/store of the two I/O types (the math is f32 in both).
struct IoF32 {
    static __device__ __forceinline__ float ld(const char *p) { return *(const float *) p; }
    static __device__ __forceinline__ void st(char *p, float v) { *(float *) p = v; }
};
struct IoF16 {
    static __device__ __forceinline__ float ld(const char *p) { return sg_h2f(*(const unsigned short *) p); }
    static __device__ __forceinline__ void st(char *p, float v) { *(unsigned short *) p = sg_f2h(v); }
};

// x at xp + i0*nbx, g at gp + i0*nbg (row bases already offset).
template <typename IO, typename OP>
static __device__ __forceinline__ void glu_rows(
        const char *xs, const char *gs, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nbx0, i64 nbx1, i64 nbx2, i64 nbx3,
        i64 nbg0, i64 nbg1, i64 nbg2, i64 nbg3,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3, const OP &op) {
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        const char *xr = xs + i1 * nbx1 + i2 * nbx2 + i3 * nbx3;
        const char *gr = gs + i1 * nbg1 + i2 * nbg2 + i3 * nbg3;
        char *d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 i0 = (i64) blockIdx.x * blockDim.x + threadIdx.x; i0 < ne0; i0 += (i64) gridDim.x * blockDim.x) {
            const float x = IO::ld(xr + i0 * nbx0);
            const float g = IO::ld(gr + i0 * nbg0);
            IO::st(d + i0 * nb0, op(x, g));
        }
    }
}

template <typename IO, typename OP>
static __device__ __forceinline__ void glu_fused(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3, int swapped, const OP &op) {
    const char *lo = src;
    const char *hi = src + ne0 * nb00;
    glu_rows<IO>(swapped ? hi : lo, swapped ? lo : hi, dst, ne0, ne1, ne2, ne3,
             nb00, nb01, nb02, nb03, nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3, op);
}

#define SG_GLU_T(OPNAME, SFX, IO, OP)                                                    \
    extern "C" __global__ void sg_##OPNAME##_##SFX(                                      \
            const char *src, char *dst,                                                  \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            int swapped) {                                                               \
        glu_fused<IO>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03,              \
                      nb0, nb1, nb2, nb3, swapped, OP());                                \
    }                                                                                    \
    extern "C" __global__ void sg_##OPNAME##_split_##SFX(                                \
            const char *a, const char *b, char *dst,                                     \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nba0, i64 nba1, i64 nba2, i64 nba3,                                      \
            i64 nbb0, i64 nbb1, i64 nbb2, i64 nbb3,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        glu_rows<IO>(a, b, dst, ne0, ne1, ne2, ne3, nba0, nba1, nba2, nba3,              \
                     nbb0, nbb1, nbb2, nbb3, nb0, nb1, nb2, nb3, OP());                  \
    }

#define SG_GLU(OPNAME, OP)                \
    SG_GLU_T(OPNAME, f32, IoF32, OP)      \
    SG_GLU_T(OPNAME, f16, IoF16, OP)

SG_GLU(swiglu, GSwiglu)
SG_GLU(geglu, GGeglu)
SG_GLU(reglu, GReglu)
SG_GLU(geglu_erf, GGegluErf)
SG_GLU(geglu_quick, GGegluQuick)
SG_GLU(geglu_lut, GGegluLut)
SG_GLU(geglu_quick_lut, GGegluQuickLut)

#define SG_SWIGLU_OAI(SFX, IO)                                                           \
    extern "C" __global__ void sg_swiglu_oai_##SFX(                                      \
            const char *src, char *dst,                                                  \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            int swapped, float alpha, float limit) {                                     \
        GSwigluOai op{alpha, limit};                                                     \
        glu_fused<IO>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03,              \
                      nb0, nb1, nb2, nb3, swapped, op);                                  \
    }                                                                                    \
    extern "C" __global__ void sg_swiglu_oai_split_##SFX(                                \
            const char *a, const char *b, char *dst,                                     \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nba0, i64 nba1, i64 nba2, i64 nba3,                                      \
            i64 nbb0, i64 nbb1, i64 nbb2, i64 nbb3,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            float alpha, float limit) {                                                  \
        GSwigluOai op{alpha, limit};                                                     \
        glu_rows<IO>(a, b, dst, ne0, ne1, ne2, ne3, nba0, nba1, nba2, nba3,              \
                     nbb0, nbb1, nbb2, nbb3, nb0, nb1, nb2, nb3, op);                    \
    }

SG_SWIGLU_OAI(f32, IoF32)
SG_SWIGLU_OAI(f16, IoF16)
