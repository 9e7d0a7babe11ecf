// elementwise.cu — element-wise op family of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml (ggml-cpu binary-ops.cpp, unary-ops.cpp, vec.h,
// ops.cpp): arithmetic in f32 on converted inputs, one rounding to the
// destination type. Self-contained: no CUDA headers are included; f16 <-> f32
// conversions use the PTX `cvt` instructions (round-to-nearest-even).
//
// Conventions shared by every kernel in this file
// -----------------------------------------------
// * Tensors are raw byte pointers (`const char *` / `char *`) plus ggml's
//   shape `ne[4]` (ne0 innermost) and byte strides `nb[4]`, all `long long`
//   (int64). Any strides work (views, permutations, transposes).
// * "Row launch": blockDim = (B, 1, 1) with B any multiple of 64 up to 1024
//   (256 recommended); gridDim = (gx, gy, 1) with gx >= 1 and gy >= 1. Both
//   dimensions are grid-stride loops (x over i0 in [0, ne0), y over the
//   nrows = ne1*ne2*ne3 rows), so any grid is correct; a good choice is
//   gx = min(ceil(ne0 / B), 1024), gy = min(nrows, 65535).
// * "Flat launch" (cpy only): blockDim = (B, 1, 1), gridDim = (gx, 1, 1),
//   a grid-stride loop over all elements; gx = min(ceil(n / B), 65535).
// * In-place (dst == src0, same strides) is allowed for every kernel here
//   except the cpy kernels.
//
// Binary ops (ggml_add / ggml_sub / ggml_mul / ggml_div):
//   sg_add_f32, sg_sub_f32, sg_mul_f32, sg_div_f32            (all F32)
//   sg_<op>_<a>_<b> for (a, b) in (f16, f16), (f16, f32), (bf16, bf16),
//   (bf16, f32): src0 of type a, src1 of type b, dst of type a; computed in
//   f32 on the converted inputs, one rounding to dst (ggml's CPU rule).
//   sg_add_q8_0_f32, sg_add_q4_0_f32: add (and add1, as a [1,1,1,1] src1)
//   of a Q8_0 / Q4_0 src0 and dst with an F32 src1; see the contract above
//   the kernels at the end of this file.
//   (const char *src0, const char *src1, char *dst,
//    i64 ne0, ne1, ne2, ne3,          // shape of src0 == shape of dst
//    i64 nb00, nb01, nb02, nb03,      // src0 strides (bytes)
//    i64 ne10, ne11, ne12, ne13,      // src1 shape, ne_k % ne1k == 0 per dim
//    i64 nb10, nb11, nb12, nb13,      // src1 strides (bytes)
//    i64 nb0, nb1, nb2, nb3)          // dst strides (bytes)
//   dst[i] = src0[i] OP src1[i0 % ne10, i1 % ne11, i2 % ne12, i3 % ne13]
//   (ggml's broadcast rule: src1 repeats along every dim). Row launch.
//
// Unary ops, F32 -> F32 (`_f32`), F16 -> F16 (`_f16`, computed in f32) and,
// for neg, abs, sqr, sqrt, exp, relu, sigmoid, tanh, softplus only,
// BF16 -> BF16 (`_bf16`, computed in f32):
//   sg_<op>_f32 / sg_<op>_f16
//   (const char *src, char *dst,
//    i64 ne0, ne1, ne2, ne3,          // shape (src == dst)
//    i64 nb00, nb01, nb02, nb03,      // src strides
//    i64 nb0, nb1, nb2, nb3)          // dst strides
//   Row launch. <op> and the ggml formula (GGML_UNARY_OP_* / ggml_sqr / ggml_sqrt):
//     neg        -x
//     abs        fabsf(x)
//     sqr        x*x
//     sqrt       sqrtf(x)
//     exp        expf(x)
//     silu       x / (1 + expf(-x))
//     gelu       0.5*x*(1 + tanhf(sqrt(2/pi)*x*(1 + 0.044715*x*x)))   (ggml_gelu_f32)
//     gelu_quick x * (1 / (1 + expf(-1.702*x)))                        (ggml_gelu_quick_f32)
//     relu       x > 0 ? x : 0
//     sigmoid    1 / (1 + expf(-x))
//     tanh       tanhf(x)
//     softplus   x > 20 ? x : logf(1 + expf(x))
//   ggml's CPU evaluates gelu / gelu_quick on F32 through its F16 lookup
//   tables; these two kernels reproduce that path exactly (input rounded to
//   f16, formula in f32, result rounded to f16; gelu also returns 0 for
//   x <= -10 and x for x >= 10 as ggml_vec_gelu_f32 does):
//     sg_gelu_lut_f32, sg_gelu_quick_lut_f32   (same arguments as sg_gelu_f32)
//   The F16 variants (sg_gelu_f16, sg_gelu_quick_f16) already equal ggml's
//   table lookup (f16 in, formula in f32, f16 out). (gelu, gelu_quick and
//   silu have no BF16 kernels: ggml, and shardgraph's graph constructors
//   after it, take them on F32 / F16 only.)
//
// sg_scale_f32 (ggml_scale / ggml_scale_bias): dst = src*s + b, computed as
//   two separately rounded operations (no fused multiply-add), as ggml's CPU.
//   (const char *src, char *dst, i64 ne0..ne3, i64 nb00..nb03, i64 nb0..nb3,
//    float s, float b). Row launch.
//
// sg_clamp_f32 / sg_clamp_f16 (ggml_clamp): dst = MAX(MIN(x, max), min) with
//   C-macro semantics (`a < b ? a : b`), so NaN maps to `max` as in ggml.
//   (const char *src, char *dst, i64 ne0..ne3, i64 nb00..nb03, i64 nb0..nb3,
//    float min, float max). Row launch.
//
// add1 (ggml_add1): dst = src0 + b[0], b a one-element tensor.
//   sg_add1_<a>_<b> for (a, b) in (f32, f32), (f16, f16), (f16, f32),
//   (bf16, bf16), (bf16, f32); dst has src0's type (computed in f32).
//   (const char *src, const char *b, char *dst, i64 ne0..ne3,
//    i64 nb00..nb03, i64 nb0..nb3). Row launch.
//
// sg_fill_f32 / sg_fill_f16 (ggml_fill): every element of dst = c (rounded to
//   f16 for the F16 variant).
//   (char *dst, i64 ne0..ne3, i64 nb0..nb3, float c). Row launch.
//
// Copies / conversions (ggml_cpy, ggml_dup, ggml_cont):
//   sg_cpy_f32_f32, sg_cpy_f32_f16, sg_cpy_f16_f32, sg_cpy_f16_f16,
//   sg_cpy_f32_bf16, sg_cpy_bf16_f32, sg_cpy_f16_bf16, sg_cpy_bf16_f16,
//   sg_cpy_bf16_bf16, sg_cpy_i32_i32, sg_cpy_i32_f32, sg_cpy_f32_i32
//   (const char *src, char *dst,
//    i64 ne00, ne01, ne02, ne03, i64 nb00, nb01, nb02, nb03,   // src
//    i64 ne0,  ne1,  ne2,  ne3,  i64 nb0,  nb1,  nb2,  nb3)    // dst
//   src and dst need the same number of elements but may differ in shape:
//   element k of src in row-major logical order (i0 fastest) goes to element k
//   of dst in its own logical order, as ggml_cpy does. F32 -> F16 and
//   -> BF16 round to nearest even (BF16 as GGML_FP32_TO_BF16); F32 -> I32
//   truncates toward zero; same-type copies copy the bits. Flat launch over
//   n = ne00*ne01*ne02*ne03 elements.
//
// Copies into / out of block types (same arguments as the float copies):
//   sg_cpy_<f32|f16|bf16>_<q8_0|q4_0|q4_1|q5_0>   quantize: dst contiguous;
//     element k of src (logical order, any strides) -> element k of dst;
//     blocks encoded as ggml's quantize_row_*_ref (bit for bit on finite
//     inputs; NaN/out-of-range conversions saturate on the device where x86
//     gives INT_MIN).
//   Launch: blockDim = (B, 1, 1), gridDim = (gx, 1, 1), a grid-stride loop
//   over the n/32 blocks (one block per thread), gx = min(ceil(n/32 / B), 65535).
//   sg_cpy_<q>_<f32|f16> for q in q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K,
//     q4_K, q5_K, q6_K   dequantize: src rows of packed blocks (ne00 a
//     multiple of the block size; nb00 unused, nb01..nb03 any); element k of
//     src -> element k of dst (logical order, any strides); values as ggml's
//     dequantize_row_* (dequant.cuh), rounded once to f16 for the F16
//     destination (ggml's CPU, and so the graph, dequantizes only to F32).
//     Flat launch over the n elements.
// sg_cpy_units (same-type copy of any block type, e.g. cont of a permuted
//   Q8_0 tensor): (const char *src, char *dst, i64 esize,
//   i64 ne0..ne3 (ne0 in units of esize bytes, e.g. blocks per row),
//   i64 nb00..nb03, i64 nb0..nb3); src and dst have this same shape; unit k
//   is copied byte by byte. Flat launch over the units.

#include "common.cuh"

// ---------------------------------------------------------------------------
// f16 helpers (bit patterns held in unsigned short)
// ---------------------------------------------------------------------------

// Loads / stores of one element of a given storage type as f32.
struct TF32 {
    __device__ static __forceinline__ float load(const char *p) { return *(const float *) p; }
    __device__ static __forceinline__ void store(char *p, float v) { *(float *) p = v; }
};
struct TF16 {
    __device__ static __forceinline__ float load(const char *p) { return sg_h2f(*(const unsigned short *) p); }
    __device__ static __forceinline__ void store(char *p, float v) { *(unsigned short *) p = sg_f2h(v); }
};
struct TBF16 {
    __device__ static __forceinline__ float load(const char *p) {
        return __uint_as_float(((unsigned) *(const unsigned short *) p) << 16);
    }
    __device__ static __forceinline__ void store(char *p, float v) { *(unsigned short *) p = sg_f2bf(v); }
};
// I32 as a value: i32 -> f32 rounds to nearest, f32 -> i32 truncates toward
// zero (saturating on the device; ggml's `(int32_t) x`).
struct TI32 {
    __device__ static __forceinline__ float load(const char *p) { return (float) *(const int *) p; }
    __device__ static __forceinline__ void store(char *p, float v) { *(int *) p = __float2int_rz(v); }
};
// Raw 32-bit copy (F32 -> F32 and I32 -> I32 keep every bit pattern).
struct TU32 {
    __device__ static __forceinline__ unsigned load(const char *p) { return *(const unsigned *) p; }
    __device__ static __forceinline__ void store(char *p, unsigned v) { *(unsigned *) p = v; }
};
// Raw 16-bit copy (F16 -> F16 keeps every bit pattern, NaN payloads included).
struct TU16 {
    __device__ static __forceinline__ unsigned short load(const char *p) { return *(const unsigned short *) p; }
    __device__ static __forceinline__ void store(char *p, unsigned short v) { *(unsigned short *) p = v; }
};

// ---------------------------------------------------------------------------
// Binary ops with broadcasting of src1
// ---------------------------------------------------------------------------

struct OpAdd { __device__ static __forceinline__ float f(float a, float b) { return a + b; } };
struct OpSub { __device__ static __forceinline__ float f(float a, float b) { return a - b; } };
struct OpMul { __device__ static __forceinline__ float f(float a, float b) { return a * b; } };
struct OpDiv { __device__ static __forceinline__ float f(float a, float b) { return a / b; } };

template <typename TA, typename TB, typename TD, typename OP>
__device__ __forceinline__ void binary_t(
        const char *src0, const char *src1, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 ne10, i64 ne11, i64 ne12, i64 ne13,
        i64 nb10, i64 nb11, i64 nb12, i64 nb13,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        const char *a = src0 + i1 * nb01 + i2 * nb02 + i3 * nb03;
        const char *b = src1 + (i1 % ne11) * nb11 + (i2 % ne12) * nb12 + (i3 % ne13) * nb13;
        char *d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 i0 = (i64) blockIdx.x * blockDim.x + threadIdx.x; i0 < ne0; i0 += (i64) gridDim.x * blockDim.x) {
            const i64 i10 = (ne10 == ne0) ? i0 : i0 % ne10;
            const float x = TA::load(a + i0 * nb00);
            const float y = TB::load(b + i10 * nb10);
            TD::store(d + i0 * nb0, OP::f(x, y));
        }
    }
}

#define SG_BINARY(NAME, TA, TB, TD, OP)                                                  \
    extern "C" __global__ void NAME(                                                     \
            const char *src0, const char *src1, char *dst,                               \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne10, i64 ne11, i64 ne12, i64 ne13,                                      \
            i64 nb10, i64 nb11, i64 nb12, i64 nb13,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        binary_t<TA, TB, TD, OP>(src0, src1, dst, ne0, ne1, ne2, ne3,                    \
                                 nb00, nb01, nb02, nb03, ne10, ne11, ne12, ne13,         \
                                 nb10, nb11, nb12, nb13, nb0, nb1, nb2, nb3);            \
    }

// F32 kernels keep their short names; the others are named by src0 and src1
// type (dst has src0's type).
#define SG_BINARY_ALL(OPNAME, OP)                                                        \
    SG_BINARY(sg_##OPNAME##_f32, TF32, TF32, TF32, OP)                                   \
    SG_BINARY(sg_##OPNAME##_f16_f16, TF16, TF16, TF16, OP)                               \
    SG_BINARY(sg_##OPNAME##_f16_f32, TF16, TF32, TF16, OP)                               \
    SG_BINARY(sg_##OPNAME##_bf16_bf16, TBF16, TBF16, TBF16, OP)                          \
    SG_BINARY(sg_##OPNAME##_bf16_f32, TBF16, TF32, TBF16, OP)

SG_BINARY_ALL(add, OpAdd)
SG_BINARY_ALL(sub, OpSub)
SG_BINARY_ALL(mul, OpMul)
SG_BINARY_ALL(div, OpDiv)

// ---------------------------------------------------------------------------
// Unary ops
// ---------------------------------------------------------------------------

#define SG_GELU_COEF_A 0.044715f
#define SG_GELU_QUICK_COEF (-1.702f)
#define SG_SQRT_2_OVER_PI 0.79788456080286535587989211986876f

__device__ __forceinline__ float sg_gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(SG_SQRT_2_OVER_PI * x * (1.0f + SG_GELU_COEF_A * x * x)));
}
__device__ __forceinline__ float sg_gelu_quick(float x) {
    return x * (1.0f / (1.0f + expf(SG_GELU_QUICK_COEF * x)));
}

struct UNeg      { __device__ static __forceinline__ float f(float x) { return -x; } };
struct UAbs      { __device__ static __forceinline__ float f(float x) { return fabsf(x); } };
struct USqr      { __device__ static __forceinline__ float f(float x) { return x * x; } };
struct USqrt     { __device__ static __forceinline__ float f(float x) { return sqrtf(x); } };
struct UExp      { __device__ static __forceinline__ float f(float x) { return expf(x); } };
struct USilu     { __device__ static __forceinline__ float f(float x) { return x / (1.0f + expf(-x)); } };
struct UGelu     { __device__ static __forceinline__ float f(float x) { return sg_gelu(x); } };
struct UGeluQuick{ __device__ static __forceinline__ float f(float x) { return sg_gelu_quick(x); } };
struct URelu     { __device__ static __forceinline__ float f(float x) { return x > 0.0f ? x : 0.0f; } };
struct USigmoid  { __device__ static __forceinline__ float f(float x) { return 1.0f / (1.0f + expf(-x)); } };
struct UTanh     { __device__ static __forceinline__ float f(float x) { return tanhf(x); } };
struct USoftplus { __device__ static __forceinline__ float f(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); } };
// ggml-cpu's F32 gelu through the F16 table (ggml_vec_gelu_f32 with GGML_GELU_FP16).
struct UGeluLut {
    __device__ static __forceinline__ float f(float x) {
        if (x <= -10.0f) return 0.0f;
        if (x >= 10.0f) return x;
        return sg_h2f(sg_f2h(sg_gelu(sg_h2f(sg_f2h(x)))));
    }
};
// ggml-cpu's F32 gelu_quick through the F16 table (no range clamp).
struct UGeluQuickLut {
    __device__ static __forceinline__ float f(float x) {
        return sg_h2f(sg_f2h(sg_gelu_quick(sg_h2f(sg_f2h(x)))));
    }
};

// Generic row-launched map: dst = OP(src) with storage types TS -> TD.
template <typename TS, typename TD, typename OP>
__device__ __forceinline__ void unary_map(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3, const OP &op) {
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        const char *a = src + i1 * nb01 + i2 * nb02 + i3 * nb03;
        char *d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 i0 = (i64) blockIdx.x * blockDim.x + threadIdx.x; i0 < ne0; i0 += (i64) gridDim.x * blockDim.x) {
            TD::store(d + i0 * nb0, op(TS::load(a + i0 * nb00)));
        }
    }
}

template <typename U>
struct Stateless {
    __device__ __forceinline__ float operator()(float x) const { return U::f(x); }
};

#define SG_UNARY_T(NAME, TYPE, U)                                                        \
    extern "C" __global__ void NAME(                                                     \
            const char *src, char *dst,                                                  \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        unary_map<TYPE, TYPE>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03,      \
                              nb0, nb1, nb2, nb3, Stateless<U>());                       \
    }

#define SG_UNARY(OPNAME, U)                  \
    SG_UNARY_T(sg_##OPNAME##_f32, TF32, U)   \
    SG_UNARY_T(sg_##OPNAME##_f16, TF16, U)

SG_UNARY(neg, UNeg)
SG_UNARY(abs, UAbs)
SG_UNARY(sqr, USqr)
SG_UNARY(sqrt, USqrt)
SG_UNARY(exp, UExp)
SG_UNARY(silu, USilu)
SG_UNARY(gelu, UGelu)
SG_UNARY(gelu_quick, UGeluQuick)
SG_UNARY(relu, URelu)
SG_UNARY(sigmoid, USigmoid)
SG_UNARY(tanh, UTanh)
SG_UNARY(softplus, USoftplus)
// BF16 -> BF16 (computed in f32) for the ops whose ggml CPU path is the
// plain formula.
SG_UNARY_T(sg_neg_bf16, TBF16, UNeg)
SG_UNARY_T(sg_abs_bf16, TBF16, UAbs)
SG_UNARY_T(sg_sqr_bf16, TBF16, USqr)
SG_UNARY_T(sg_sqrt_bf16, TBF16, USqrt)
SG_UNARY_T(sg_exp_bf16, TBF16, UExp)
SG_UNARY_T(sg_relu_bf16, TBF16, URelu)
SG_UNARY_T(sg_sigmoid_bf16, TBF16, USigmoid)
SG_UNARY_T(sg_tanh_bf16, TBF16, UTanh)
SG_UNARY_T(sg_softplus_bf16, TBF16, USoftplus)
SG_UNARY_T(sg_gelu_lut_f32, TF32, UGeluLut)
SG_UNARY_T(sg_gelu_quick_lut_f32, TF32, UGeluQuickLut)

// ---------------------------------------------------------------------------
// scale, clamp, fill
// ---------------------------------------------------------------------------

struct ScaleOp {
    float s, b;
    __device__ __forceinline__ float operator()(float x) const { return __fadd_rn(__fmul_rn(x, s), b); }
};

extern "C" __global__ void sg_scale_f32(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        float s, float b) {
    ScaleOp op{s, b};
    unary_map<TF32, TF32>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3, op);
}

struct ClampOp {
    float lo, hi;
    __device__ __forceinline__ float operator()(float x) const {
        const float t = x < hi ? x : hi;   // MIN(x, max)
        return t > lo ? t : lo;            // MAX(t, min)
    }
};

extern "C" __global__ void sg_clamp_f32(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        float min, float max) {
    ClampOp op{min, max};
    unary_map<TF32, TF32>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3, op);
}

extern "C" __global__ void sg_clamp_f16(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        float min, float max) {
    ClampOp op{min, max};
    unary_map<TF16, TF16>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3, op);
}

// add1: dst = src0 + src1[0] (src1 a scalar of type TB), dst of src0's type.
template <typename TB>
struct Add1Op {
    const char *b;
    __device__ __forceinline__ float operator()(float x) const { return x + TB::load(b); }
};

#define SG_ADD1(NAME, TA, TB)                                                            \
    extern "C" __global__ void NAME(                                                     \
            const char *src, const char *b, char *dst,                                   \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        Add1Op<TB> op{b};                                                                \
        unary_map<TA, TA>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03,          \
                          nb0, nb1, nb2, nb3, op);                                       \
    }

SG_ADD1(sg_add1_f32_f32, TF32, TF32)
SG_ADD1(sg_add1_f16_f16, TF16, TF16)
SG_ADD1(sg_add1_f16_f32, TF16, TF32)
SG_ADD1(sg_add1_bf16_bf16, TBF16, TBF16)
SG_ADD1(sg_add1_bf16_f32, TBF16, TF32)

template <typename TD>
__device__ __forceinline__ void fill_rows(char *dst, i64 ne0, i64 ne1, i64 ne2, i64 ne3,
                                          i64 nb0, i64 nb1, i64 nb2, i64 nb3, float c) {
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        char *d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 i0 = (i64) blockIdx.x * blockDim.x + threadIdx.x; i0 < ne0; i0 += (i64) gridDim.x * blockDim.x) {
            TD::store(d + i0 * nb0, c);
        }
    }
}

extern "C" __global__ void sg_fill_f32(char *dst, i64 ne0, i64 ne1, i64 ne2, i64 ne3,
                                       i64 nb0, i64 nb1, i64 nb2, i64 nb3, float c) {
    fill_rows<TF32>(dst, ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3, c);
}

extern "C" __global__ void sg_fill_f16(char *dst, i64 ne0, i64 ne1, i64 ne2, i64 ne3,
                                       i64 nb0, i64 nb1, i64 nb2, i64 nb3, float c) {
    fill_rows<TF16>(dst, ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3, c);
}

// ---------------------------------------------------------------------------
// cpy / convert (shapes may differ; element order is the logical order)
// ---------------------------------------------------------------------------

template <typename TS, typename TD>
__device__ __forceinline__ void cpy_flat(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03, i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3, i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    const i64 n = ne00 * ne01 * ne02 * ne03;
    const bool same_shape = ne00 == ne0 && ne01 == ne1 && ne02 == ne2;
    for (i64 k = (i64) blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (i64) gridDim.x * blockDim.x) {
        i64 t = k;
        const i64 a0 = t % ne00; t /= ne00;
        const i64 a1 = t % ne01; t /= ne01;
        const i64 a2 = t % ne02;
        const i64 a3 = t / ne02;
        i64 d0, d1, d2, d3;
        if (same_shape) {
            d0 = a0; d1 = a1; d2 = a2; d3 = a3;
        } else {
            t = k;
            d0 = t % ne0; t /= ne0;
            d1 = t % ne1; t /= ne1;
            d2 = t % ne2;
            d3 = t / ne2;
        }
        const auto v = TS::load(src + a0 * nb00 + a1 * nb01 + a2 * nb02 + a3 * nb03);
        TD::store(dst + d0 * nb0 + d1 * nb1 + d2 * nb2 + d3 * nb3, v);
    }
}

#define SG_CPY(NAME, TS, TD)                                                             \
    extern "C" __global__ void NAME(                                                     \
            const char *src, char *dst,                                                  \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        cpy_flat<TS, TD>(src, dst, ne00, ne01, ne02, ne03, nb00, nb01, nb02, nb03,       \
                         ne0, ne1, ne2, ne3, nb0, nb1, nb2, nb3);                        \
    }

SG_CPY(sg_cpy_f32_f32, TF32, TF32)
SG_CPY(sg_cpy_f32_f16, TF32, TF16)
SG_CPY(sg_cpy_f16_f32, TF16, TF32)
SG_CPY(sg_cpy_f16_f16, TU16, TU16)
SG_CPY(sg_cpy_f32_bf16, TF32, TBF16)
SG_CPY(sg_cpy_bf16_f32, TBF16, TF32)
SG_CPY(sg_cpy_f16_bf16, TF16, TBF16)
SG_CPY(sg_cpy_bf16_f16, TBF16, TF16)
SG_CPY(sg_cpy_bf16_bf16, TU16, TU16)
SG_CPY(sg_cpy_i32_i32, TU32, TU32)
SG_CPY(sg_cpy_i32_f32, TI32, TF32)
SG_CPY(sg_cpy_f32_i32, TF32, TI32)

// ---------------------------------------------------------------------------
// cpy into / out of the 32-element block types (ggml-quants.c reference
// quantizers, bit for bit on finite inputs), and same-type block copies
// ---------------------------------------------------------------------------

// Element k (logical row-major order of shape ne) of a strided tensor.
__device__ __forceinline__ const char *sg_elem(const char *p, i64 k, i64 ne0, i64 ne1, i64 ne2,
                                               i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    const i64 a0 = k % ne0; k /= ne0;
    const i64 a1 = k % ne1; k /= ne1;
    const i64 a2 = k % ne2;
    const i64 a3 = k / ne2;
    return p + a0 * nb0 + a1 * nb1 + a2 * nb2 + a3 * nb3;
}

#include "dequant.cuh"
#include "quant.cuh"

// Quantize: element k of src (logical order) goes to element k of the
// contiguous block-type dst. One thread per 32-element block.
template <typename TS, typename Q>
__device__ __forceinline__ void cpy_quant(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03, i64 nb00, i64 nb01, i64 nb02, i64 nb03) {
    const i64 nblk = ne00 * ne01 * ne02 * ne03 / 32;
    for (i64 kb = (i64) blockIdx.x * blockDim.x + threadIdx.x; kb < nblk; kb += (i64) gridDim.x * blockDim.x) {
        float x[32];
        for (int j = 0; j < 32; ++j) {
            x[j] = TS::load(sg_elem(src, kb * 32 + j, ne00, ne01, ne02, nb00, nb01, nb02, nb03));
        }
        Q::quant(x, (unsigned char *) dst + kb * Q::BYTES);
    }
}

// Dequantize: element k of the block-type src (logical order; rows of blocks
// packed, rows themselves at any strides) goes to element k (logical order)
// of dst, through dequant.cuh's per-value dequantiser DQ. One thread per
// element.
template <typename DQ, typename TD>
__device__ __forceinline__ void cpy_dequant(
        const char *src, char *dst,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03, i64 nb01, i64 nb02, i64 nb03,
        i64 ne0, i64 ne1, i64 ne2, i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    const i64 n = ne00 * ne01 * ne02 * ne03;
    for (i64 k = (i64) blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (i64) gridDim.x * blockDim.x) {
        i64 t = k;
        const i64 j = t % ne00; t /= ne00;
        const i64 a1 = t % ne01; t /= ne01;
        const i64 a2 = t % ne02;
        const i64 a3 = t / ne02;
        const float v = DQ::at(src + a1 * nb01 + a2 * nb02 + a3 * nb03, j, 0);
        TD::store((char *) sg_elem(dst, k, ne0, ne1, ne2, nb0, nb1, nb2, nb3), v);
    }
}

#define SG_CPY_Q(NAME, TS, Q)                                                            \
    extern "C" __global__ void NAME(                                                     \
            const char *src, char *dst,                                                  \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        cpy_quant<TS, Q>(src, dst, ne00, ne01, ne02, ne03, nb00, nb01, nb02, nb03);      \
    }
#define SG_CPY_DQ(NAME, DQ, TD)                                                          \
    extern "C" __global__ void NAME(                                                     \
            const char *src, char *dst,                                                  \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        cpy_dequant<DQ, TD>(src, dst, ne00, ne01, ne02, ne03, nb01, nb02, nb03,          \
                            ne0, ne1, ne2, nb0, nb1, nb2, nb3);                          \
    }
#define SG_CPY_DQ_TO(QN, DQ)                                                             \
    SG_CPY_DQ(sg_cpy_##QN##_f32, DQ, TF32)                                               \
    SG_CPY_DQ(sg_cpy_##QN##_f16, DQ, TF16)

#define SG_CPY_Q_FROM(QN, Q)                                                             \
    SG_CPY_Q(sg_cpy_f32_##QN, TF32, Q)                                                   \
    SG_CPY_Q(sg_cpy_f16_##QN, TF16, Q)                                                   \
    SG_CPY_Q(sg_cpy_bf16_##QN, TBF16, Q)

SG_CPY_Q_FROM(q8_0, QQ8_0)
SG_CPY_Q_FROM(q4_0, QQ4_0)
SG_CPY_Q_FROM(q4_1, QQ4_1)
SG_CPY_Q_FROM(q5_0, QQ5_0)
SG_CPY_Q_FROM(iq4_nl, QIQ4_NL)
SG_CPY_DQ_TO(q8_0, DqQ8_0)
SG_CPY_DQ_TO(q4_0, DqQ4_0)
SG_CPY_DQ_TO(q4_1, DqQ4_1)
SG_CPY_DQ_TO(q5_0, DqQ5_0)
SG_CPY_DQ_TO(q5_1, DqQ5_1)
SG_CPY_DQ_TO(q2_K, DqQ2_K)
SG_CPY_DQ_TO(q3_K, DqQ3_K)
SG_CPY_DQ_TO(q4_K, DqQ4_K)
SG_CPY_DQ_TO(q5_K, DqQ5_K)
SG_CPY_DQ_TO(q6_K, DqQ6_K)
SG_CHUNK_TYPES(SG_CPY_DQ_TO)

// Same-type copy of whole blocks (or elements) of `esize` bytes: src and dst
// have the same shape counted in units (ne0 = units per row) and strides in
// bytes; unit k of src goes to unit k of dst. Flat launch over the units.
extern "C" __global__ void sg_cpy_units(
        const char *src, char *dst, i64 esize,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    const i64 n = ne0 * ne1 * ne2 * ne3;
    for (i64 k = (i64) blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (i64) gridDim.x * blockDim.x) {
        const char *s = sg_elem(src, k, ne0, ne1, ne2, nb00, nb01, nb02, nb03);
        char *d = (char *) sg_elem(dst, k, ne0, ne1, ne2, nb0, nb1, nb2, nb3);
        for (i64 b = 0; b < esize; ++b) d[b] = s[b];
    }
}

// add with a Q8_0 / Q4_0 src0 and dst (ggml_add / ggml_add1 of a quantized
// tensor and F32): each 32-element block of a src0 row is dequantized, src1
// (F32, broadcast as the binary ops) added in f32, and the block quantized
// into dst as ggml_quantize_row_*_ref.
//   sg_add_q8_0_f32, sg_add_q4_0_f32: the binary ops' arguments; src0 and dst
//   rows packed (nb00 = nb0 = block bytes), ne0 % 32 == 0. Row launch with x
//   striding over the ne0/32 blocks of a row (one block per thread).
//   In place (dst == src0) is allowed.
template <typename Q>
__device__ __forceinline__ void add_q(
        const char *src0, const char *src1, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 ne10, i64 ne11, i64 ne12, i64 ne13,
        i64 nb10, i64 nb11, i64 nb12, i64 nb13,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    const i64 nrows = ne1 * ne2 * ne3;
    const i64 nblk = ne0 / 32;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        const char *a = src0 + i1 * nb01 + i2 * nb02 + i3 * nb03;
        const char *b = src1 + (i1 % ne11) * nb11 + (i2 % ne12) * nb12 + (i3 % ne13) * nb13;
        char *d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 kb = (i64) blockIdx.x * blockDim.x + threadIdx.x; kb < nblk; kb += (i64) gridDim.x * blockDim.x) {
            float x[32];
            Q::dequant((const unsigned char *) a + kb * nb00, x);
            for (int j = 0; j < 32; ++j) x[j] = x[j] + TF32::load(b + ((kb * 32 + j) % ne10) * nb10);
            Q::quant(x, (unsigned char *) d + kb * nb0);
        }
    }
}

#define SG_ADD_Q(NAME, Q)                                                                \
    extern "C" __global__ void NAME(                                                     \
            const char *src0, const char *src1, char *dst,                               \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 ne10, i64 ne11, i64 ne12, i64 ne13,                                      \
            i64 nb10, i64 nb11, i64 nb12, i64 nb13,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        add_q<Q>(src0, src1, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03,            \
                 ne10, ne11, ne12, ne13, nb10, nb11, nb12, nb13, nb0, nb1, nb2, nb3);    \
    }

SG_ADD_Q(sg_add_q8_0_f32, QQ8_0)
SG_ADD_Q(sg_add_q4_0_f32, QQ4_0)
