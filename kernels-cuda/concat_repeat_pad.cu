// concat_repeat_pad.cu — concat, repeat and pad of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml (ggml.c ggml_concat / ggml_repeat / ggml_pad_ext /
// ggml_pad_ext_circular, ggml-cpu ops.cpp ggml_compute_forward_concat_*,
// ..._repeat_*, ..._pad_f32). These kernels only move values: the _f32
// variants copy 4-byte elements and the _f16 variants 2-byte elements bit for
// bit, so they serve every type of that size (F32/I32, F16/BF16/I16). Self-
// contained: no headers are included (no f16 arithmetic is needed here).
//
// Conventions shared by every kernel in this file
// -----------------------------------------------
// * Tensors are byte pointers plus ggml's shape (ne0 innermost) and byte
//   strides, all `long long` (int64). Any strides work (views, permutations).
// * Row launch over the DESTINATION: blockDim = (B, 1, 1), B a multiple of
//   32 up to 1024 (256 recommended); gridDim = (gx, gy, 1); x is a
//   grid-stride loop over the ne0 elements of a dst row, y over the
//   ne1*ne2*ne3 dst rows, so any grid is correct; good choice
//   gx = min(ceil(ne0 / B), 1024), gy = min(rows, 65535).
// * dst must not overlap the sources.
//
// concat (ggml_concat(a, b, dim)): dst has a's shape except along `dim`,
//   where ne[dim] = a.ne[dim] + b.ne[dim]; the other dims of a, b and dst are
//   equal. dst[i] = a[i] when i0 < ne00 && i1 < ne01 && i2 < ne02 && i3 < ne03,
//   else b[i - o] with o = a.ne[dim] along `dim` and 0 elsewhere.
//   sg_concat_f32, sg_concat_f16
//   (const char *src0, const char *src1, char *dst,
//    i64 ne0, ne1, ne2, ne3,          // dst shape
//    i64 ne00, ne01, ne02, ne03,      // src0 shape
//    i64 nb00, nb01, nb02, nb03,      // src0 strides (bytes)
//    i64 nb10, nb11, nb12, nb13,      // src1 strides (bytes)
//    i64 nb0, nb1, nb2, nb3,          // dst strides (bytes)
//    int dim)                         // 0..3
//
// repeat (ggml_repeat(a, b)): dst (b's shape) = a tiled, each dst ne_k a
//   multiple of ne0k: dst[i0, i1, i2, i3] = src[i0 % ne00, i1 % ne01,
//   i2 % ne02, i3 % ne03].
//   sg_repeat_f32, sg_repeat_f16
//   (const char *src, char *dst,
//    i64 ne0, ne1, ne2, ne3,          // dst shape
//    i64 ne00, ne01, ne02, ne03,      // src shape (each >= 1)
//    i64 nb00, nb01, nb02, nb03,      // src strides (bytes)
//    i64 nb0, nb1, nb2, nb3)          // dst strides (bytes)
//
// pad (ggml_pad, ggml_pad_ext, ggml_pad_ext_circular):
//   dst ne_k = ne0k + lp_k + rp_k. Zero padding (circular == 0):
//   dst[i] = src[i - lp] when lp_k <= i_k < ne_k - rp_k for every k, else 0.
//   Circular padding (circular != 0): dst[i] = src[(i_k - lp_k) mod ne0k]
//   per dim (a true modulo, equal to ggml's (i_k - lp_k + ne0k) % ne0k
//   wherever that is in range; ggml requires lp_k <= ne0k there).
//   Padding elements are all-zero bits (0.0 for F32/F16/BF16).
//   sg_pad_f32, sg_pad_f16
//   (const char *src, char *dst,
//    i64 ne0, ne1, ne2, ne3,          // dst shape
//    i64 ne00, ne01, ne02, ne03,      // src shape
//    i64 nb00, nb01, nb02, nb03,      // src strides (bytes)
//    i64 nb0, nb1, nb2, nb3,          // dst strides (bytes)
//    int lp0, int rp0, int lp1, int rp1, int lp2, int rp2, int lp3, int rp3,
//    int circular)
//   (ggml_pad(a, p0, p1, p2, p3) is lp = 0, rp_k = p_k.)

#include "common.cuh"

template <typename T>
static __device__ __forceinline__ void concat_impl(
        const char *src0, const char *src1, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb10, i64 nb11, i64 nb12, i64 nb13,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3, int dim) {
    const i64 o0 = dim == 0 ? ne00 : 0;
    const i64 o1 = dim == 1 ? ne01 : 0;
    const i64 o2 = dim == 2 ? ne02 : 0;
    const i64 o3 = dim == 3 ? ne03 : 0;
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        const bool row_in_a = i1 < ne01 && i2 < ne02 && i3 < ne03;
        const char *a = src0 + i1 * nb01 + i2 * nb02 + i3 * nb03;
        const char *b = src1 + (i1 - o1) * nb11 + (i2 - o2) * nb12 + (i3 - o3) * nb13;
        char *d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 i0 = (i64) blockIdx.x * blockDim.x + threadIdx.x; i0 < ne0; i0 += (i64) gridDim.x * blockDim.x) {
            const T v = (row_in_a && i0 < ne00) ? *(const T *) (a + i0 * nb00)
                                                : *(const T *) (b + (i0 - o0) * nb10);
            *(T *) (d + i0 * nb0) = v;
        }
    }
}

#define SG_CONCAT(NAME, T)                                                               \
    extern "C" __global__ void NAME(                                                     \
            const char *src0, const char *src1, char *dst,                               \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 nb10, i64 nb11, i64 nb12, i64 nb13,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3, int dim) {                               \
        concat_impl<T>(src0, src1, dst, ne0, ne1, ne2, ne3, ne00, ne01, ne02, ne03,      \
                       nb00, nb01, nb02, nb03, nb10, nb11, nb12, nb13,                   \
                       nb0, nb1, nb2, nb3, dim);                                         \
    }

SG_CONCAT(sg_concat_f32, unsigned int)
SG_CONCAT(sg_concat_f16, unsigned short)

template <typename T>
static __device__ __forceinline__ void repeat_impl(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3) {
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        const char *s = src + (i1 % ne01) * nb01 + (i2 % ne02) * nb02 + (i3 % ne03) * nb03;
        char *d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 i0 = (i64) blockIdx.x * blockDim.x + threadIdx.x; i0 < ne0; i0 += (i64) gridDim.x * blockDim.x) {
            const i64 k0 = ne00 == ne0 ? i0 : i0 % ne00;
            *(T *) (d + i0 * nb0) = *(const T *) (s + k0 * nb00);
        }
    }
}

#define SG_REPEAT(NAME, T)                                                               \
    extern "C" __global__ void NAME(                                                     \
            const char *src, char *dst,                                                  \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3) {                                        \
        repeat_impl<T>(src, dst, ne0, ne1, ne2, ne3, ne00, ne01, ne02, ne03,             \
                       nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3);                      \
    }

SG_REPEAT(sg_repeat_f32, unsigned int)
SG_REPEAT(sg_repeat_f16, unsigned short)

// Source coordinate of dst coordinate i along one dim, or -1 for padding.
static __device__ __forceinline__ i64 pad_src(i64 i, i64 n, i64 ns, int lp, int rp, int circular) {
    if (circular) {
        i64 c = (i - lp) % ns;
        return c < 0 ? c + ns : c;
    }
    return (i >= lp && i < n - rp) ? i - lp : -1;
}

template <typename T>
static __device__ __forceinline__ void pad_impl(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 ne00, i64 ne01, i64 ne02, i64 ne03,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        int lp0, int rp0, int lp1, int rp1, int lp2, int rp2, int lp3, int rp3,
        int circular) {
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.y; r < nrows; r += gridDim.y) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        const i64 s1 = pad_src(i1, ne1, ne01, lp1, rp1, circular);
        const i64 s2 = pad_src(i2, ne2, ne02, lp2, rp2, circular);
        const i64 s3 = pad_src(i3, ne3, ne03, lp3, rp3, circular);
        const bool row_ok = s1 >= 0 && s2 >= 0 && s3 >= 0;
        const char *s = src + s1 * nb01 + s2 * nb02 + s3 * nb03;
        char *d = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;
        for (i64 i0 = (i64) blockIdx.x * blockDim.x + threadIdx.x; i0 < ne0; i0 += (i64) gridDim.x * blockDim.x) {
            const i64 s0 = pad_src(i0, ne0, ne00, lp0, rp0, circular);
            T v = 0;   // all-zero bits: 0.0 for F32/F16/BF16, 0 for integers
            if (row_ok && s0 >= 0) v = *(const T *) (s + s0 * nb00);
            *(T *) (d + i0 * nb0) = v;
        }
    }
}

#define SG_PAD(NAME, T)                                                                  \
    extern "C" __global__ void NAME(                                                     \
            const char *src, char *dst,                                                  \
            i64 ne0, i64 ne1, i64 ne2, i64 ne3,                                          \
            i64 ne00, i64 ne01, i64 ne02, i64 ne03,                                      \
            i64 nb00, i64 nb01, i64 nb02, i64 nb03,                                      \
            i64 nb0, i64 nb1, i64 nb2, i64 nb3,                                          \
            int lp0, int rp0, int lp1, int rp1, int lp2, int rp2, int lp3, int rp3,      \
            int circular) {                                                              \
        pad_impl<T>(src, dst, ne0, ne1, ne2, ne3, ne00, ne01, ne02, ne03,                \
                    nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3,                          \
                    lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular);                   \
    }

SG_PAD(sg_pad_f32, unsigned int)
SG_PAD(sg_pad_f16, unsigned short)
