/* Graph shapes of llama.cpp's DFlash2 drafter, computed on SG through
   ggml's own allocator and backend API:
   - a chain of 30000 nodes (y1 = 2 * x after 29999 scales by 1);
   - ggml_cast, whose CPY names itself as its destination (src[1] = the
     node): y2 = f32(f16(x)); a recursive walk of the sources followed that
     self-reference until the stack overflowed;
   - an input with strides (ggml's scheduler copies a view input into a
     tensor of the view's strides): s is [2, 3] with rows 4 floats apart
     over 0..9, y3 = cont(s) = 0 1 4 5 8 9.
   x = 0.5, 1.5, 2.5, 3.5. Prints "status S" and the three results. */
#include <stdio.h>
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#define CHAIN 30000

int main(int argc, char ** argv) {
    if (argc < 2 || !ggml_backend_load(argv[1])) { printf("load failed\n"); return 1; }
    ggml_backend_dev_t dev = ggml_backend_dev_by_name("SG");
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
    struct ggml_init_params ip = { (size_t) (CHAIN + 64) * ggml_tensor_overhead() + ggml_graph_overhead_custom(CHAIN + 64, false), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4);
    ggml_set_input(x);
    struct ggml_tensor * y1 = x;
    for (int i = 1; i < CHAIN; i++) y1 = ggml_scale(ctx, y1, 1.0f);
    y1 = ggml_scale(ctx, y1, 2.0f);
    ggml_set_output(y1);
    struct ggml_tensor * y2 = ggml_cast(ctx, ggml_cast(ctx, x, GGML_TYPE_F16), GGML_TYPE_F32);
    ggml_set_output(y2);
    struct ggml_tensor * s = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2, 3);
    s->nb[1] = 4 * sizeof(float);
    s->nb[2] = s->nb[3] = 12 * sizeof(float);
    ggml_set_input(s);
    struct ggml_tensor * y3 = ggml_cont(ctx, s);
    ggml_set_output(y3);
    printf("supports_op %d %d\n", ggml_backend_dev_supports_op(dev, y2), ggml_backend_dev_supports_op(dev, y3));
    struct ggml_cgraph * gf = ggml_new_graph_custom(ctx, CHAIN + 64, false);
    ggml_build_forward_expand(gf, y1);
    ggml_build_forward_expand(gf, y2);
    ggml_build_forward_expand(gf, y3);
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
    if (!ggml_gallocr_alloc_graph(ga, gf)) { printf("alloc failed\n"); return 1; }
    float xs[4] = { 0.5f, 1.5f, 2.5f, 3.5f };
    ggml_backend_tensor_set(x, xs, 0, sizeof xs);
    float ss[10];
    for (int i = 0; i < 10; i++) ss[i] = (float) i;
    ggml_backend_tensor_set(s, ss, 0, sizeof ss);
    printf("status %d\n", (int) ggml_backend_graph_compute(be, gf));
    float r1[4], r2[4], r3[6];
    ggml_backend_tensor_get(y1, r1, 0, sizeof r1);
    ggml_backend_tensor_get(y2, r2, 0, sizeof r2);
    ggml_backend_tensor_get(y3, r3, 0, sizeof r3);
    printf("y1 = %g %g %g %g\n", r1[0], r1[1], r1[2], r1[3]);
    printf("y2 = %g %g %g %g\n", r2[0], r2[1], r2[2], r2[3]);
    printf("y3 = %g %g %g %g %g %g\n", r3[0], r3[1], r3[2], r3[3], r3[4], r3[5]);
    ggml_gallocr_free(ga);
    ggml_free(ctx);
    ggml_backend_free(be);
    return 0;
}
