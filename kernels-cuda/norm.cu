// norm.cu — row normalisations of the CUDA backend (NVRTC, C++17).
//
// Semantics follow ggml-cpu ops.cpp (ggml_compute_forward_rms_norm_f32,
// ..._norm_f32, ..._l2_norm_f32): every row of ne0 elements is normalised on
// its own; sums are accumulated in f64 (ggml's `ggml_float`) from f32 terms,
// the statistics are then rounded to f32 exactly where ggml rounds them.
// Headers: common.cuh, block_reduce.cuh (the block sums).
//
// Launch (all kernels): one block per row, blockDim = (B, 1, 1) with B a
// multiple of 64 in [64, 1024] (256 recommended); gridDim = (gx, 1, 1) with
// gx = min(nrows, 2^31 - 1), nrows = ne1*ne2*ne3 (blocks loop over rows
// with a grid stride, so any gx >= 1 is correct). No dynamic shared memory.
// In-place (dst == src with the same strides) is allowed.
//
// Common arguments:
//   const char *src, char *dst,
//   i64 ne0, ne1, ne2, ne3,          // shape of src == shape of dst (F32)
//   i64 nb00, nb01, nb02, nb03,      // src strides in bytes
//   i64 nb0, nb1, nb2, nb3,          // dst strides in bytes
//   float eps                        // ggml's op_params[0], >= 0
//
// sg_rms_norm_f32 (ggml_rms_norm):
//   mean = (float)(sum_f64(x*x) / ne0); scale = 1/sqrtf(mean + eps); y = x*scale
// sg_norm_f32 (ggml_norm):
//   mean = (float)sum_f64(x) / ne0; v = x - mean;
//   var = (float)(sum_f64(v*v) / ne0); y = v * (1/sqrtf(var + eps))
// sg_l2_norm_f32 (ggml_l2_norm):
//   scale = 1/fmaxf(sqrtf((float)sum_f64(x*x)), eps); y = x*scale
// sg_rms_norm_mul_f32 (ggml_rms_norm followed by ggml_mul, fused as ggml's
//   CPU/CUDA backends do): y = (x*scale) * w[i0 % ne10, i1 % ne11, i2 % ne12,
//   i3 % ne13] with ggml's mul broadcast rule. Extra arguments after eps:
//   const char *w, i64 ne10, ne11, ne12, ne13, i64 nb10, nb11, nb12, nb13
//   (w is F32).

#include "common.cuh"

#include "block_reduce.cuh"

enum NormKind { NK_RMS = 0, NK_MEAN_VAR = 1, NK_L2 = 2 };

template <int KIND, bool MUL>
__device__ __forceinline__ void norm_rows(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3,
        float eps,
        const char *w, i64 ne10, i64 ne11, i64 ne12, i64 ne13,
        i64 nb10, i64 nb11, i64 nb12, i64 nb13) {
    __shared__ double sh[33];
    const i64 nrows = ne1 * ne2 * ne3;
    for (i64 r = blockIdx.x; r < nrows; r += gridDim.x) {
        const i64 i1 = r % ne1;
        const i64 i2 = (r / ne1) % ne2;
        const i64 i3 = r / (ne1 * ne2);
        const char *x = src + i1 * nb01 + i2 * nb02 + i3 * nb03;
        char *y = dst + i1 * nb1 + i2 * nb2 + i3 * nb3;

        float scale;
        float mean = 0.0f;
        if (KIND == NK_MEAN_VAR) {
            double s = 0.0;
            for (i64 i0 = threadIdx.x; i0 < ne0; i0 += blockDim.x) {
                s += (double) *(const float *) (x + i0 * nb00);
            }
            s = sg_block_sum(s, sh);
            mean = (float) s / (float) ne0;
            double q = 0.0;
            for (i64 i0 = threadIdx.x; i0 < ne0; i0 += blockDim.x) {
                const float v = *(const float *) (x + i0 * nb00) - mean;
                q += (double) (v * v);
            }
            q = sg_block_sum(q, sh);
            const float var = (float) (q / (double) ne0);
            scale = 1.0f / sqrtf(var + eps);
        } else {
            double q = 0.0;
            for (i64 i0 = threadIdx.x; i0 < ne0; i0 += blockDim.x) {
                const float v = *(const float *) (x + i0 * nb00);
                q += (double) (v * v);
            }
            q = sg_block_sum(q, sh);
            if (KIND == NK_RMS) {
                const float m = (float) (q / (double) ne0);
                scale = 1.0f / sqrtf(m + eps);
            } else {
                scale = 1.0f / fmaxf(sqrtf((float) q), eps);
            }
        }

        const char *wr = nullptr;
        if (MUL) {
            wr = w + (i1 % ne11) * nb11 + (i2 % ne12) * nb12 + (i3 % ne13) * nb13;
        }
        for (i64 i0 = threadIdx.x; i0 < ne0; i0 += blockDim.x) {
            float v = *(const float *) (x + i0 * nb00);
            if (KIND == NK_MEAN_VAR) v = v - mean;
            v = v * scale;
            if (MUL) v = v * *(const float *) (wr + (i0 % ne10) * nb10);
            *(float *) (y + i0 * nb0) = v;
        }
        // The next row's first reduction begins with a barrier, so the shared
        // scratch is never overwritten while still being read.
    }
}

extern "C" __global__ void sg_rms_norm_f32(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3, float eps) {
    norm_rows<NK_RMS, false>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3, eps,
                             nullptr, 1, 1, 1, 1, 0, 0, 0, 0);
}

extern "C" __global__ void sg_norm_f32(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3, float eps) {
    norm_rows<NK_MEAN_VAR, false>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3, eps,
                                  nullptr, 1, 1, 1, 1, 0, 0, 0, 0);
}

extern "C" __global__ void sg_l2_norm_f32(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3, float eps) {
    norm_rows<NK_L2, false>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3, eps,
                            nullptr, 1, 1, 1, 1, 0, 0, 0, 0);
}

extern "C" __global__ void sg_rms_norm_mul_f32(
        const char *src, char *dst,
        i64 ne0, i64 ne1, i64 ne2, i64 ne3,
        i64 nb00, i64 nb01, i64 nb02, i64 nb03,
        i64 nb0, i64 nb1, i64 nb2, i64 nb3, float eps,
        const char *w, i64 ne10, i64 ne11, i64 ne12, i64 ne13,
        i64 nb10, i64 nb11, i64 nb12, i64 nb13) {
    norm_rows<NK_RMS, true>(src, dst, ne0, ne1, ne2, ne3, nb00, nb01, nb02, nb03, nb0, nb1, nb2, nb3, eps,
                            w, ne10, ne11, ne12, ne13, nb10, nb11, nb12, nb13);
}
