/* A view of a view at non-zero offsets, computed on SG through ggml's own
   allocator and backend API: y = 2 * x[6..10] with x = 0..15, reached as
   view_1d(view_1d(x, 8, +4 floats), 4, +2 floats). ggml's view_offs of the
   inner view counts from x (6 floats); its op_params count from the outer
   view (2 floats). Prints "status S" and "y = a b c d". */
#include <stdio.h>
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

int main(int argc, char ** argv) {
    if (argc < 2 || !ggml_backend_load(argv[1])) { printf("load failed\n"); return 1; }
    ggml_backend_dev_t dev = ggml_backend_dev_by_name("SG");
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
    struct ggml_init_params ip = { 1 << 20, NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 16);
    ggml_set_input(x);
    struct ggml_tensor * v1 = ggml_view_1d(ctx, x, 8, 4 * sizeof(float));
    struct ggml_tensor * v2 = ggml_view_1d(ctx, v1, 4, 2 * sizeof(float));
    struct ggml_tensor * y = ggml_scale(ctx, v2, 2.0f);
    ggml_set_output(y);
    printf("supports_op %d\n", ggml_backend_dev_supports_op(dev, y));
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
    if (!ggml_gallocr_alloc_graph(ga, gf)) { printf("alloc failed\n"); return 1; }
    float xs[16];
    for (int i = 0; i < 16; i++) xs[i] = (float) i;
    ggml_backend_tensor_set(x, xs, 0, sizeof xs);
    printf("status %d\n", (int) ggml_backend_graph_compute(be, gf));
    float ys[4];
    ggml_backend_tensor_get(y, ys, 0, sizeof ys);
    printf("y = %g %g %g %g\n", ys[0], ys[1], ys[2], ys[3]);
    ggml_gallocr_free(ga);
    ggml_free(ctx);
    ggml_backend_free(be);
    return 0;
}
