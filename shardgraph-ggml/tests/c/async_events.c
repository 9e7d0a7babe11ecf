/* SG's asynchronous copies and events, through ggml's own API:
   - the device's caps (llama.cpp enables pipeline parallelism only over
     devices that report both);
   - ggml_backend_tensor_set_async / get_async / synchronize on an SG
     tensor, and an event made, recorded, waited for, synchronized and
     freed;
   - ggml's scheduler in parallel mode (4 copies of every input, events
     between the splits) over SG and the CPU backend: y = 0.5 * (2x + x),
     the add on the CPU backend, computed 6 times with new inputs.
   Prints "caps async A events E", "roundtrip = ...", "events ok",
   "copies C splits S" and "run K: y = ..." for each run. */
#include <stdio.h>
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

int main(int argc, char ** argv) {
    if (argc < 2 || !ggml_backend_load(argv[1])) { printf("load failed\n"); return 1; }
    ggml_backend_dev_t dev = ggml_backend_dev_by_name("SG");
    struct ggml_backend_dev_props props;
    ggml_backend_dev_get_props(dev, &props);
    printf("caps async %d events %d\n", (int) props.caps.async, (int) props.caps.events);
    ggml_backend_t sg = ggml_backend_dev_init(dev, NULL);
    ggml_backend_t cpu = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    if (!sg || !cpu) { printf("backends failed\n"); return 1; }

    /* set/get async on a tensor of an SG buffer */
    struct ggml_init_params ip0 = { 1 << 16, NULL, true };
    struct ggml_context * c0 = ggml_init(ip0);
    struct ggml_tensor * t = ggml_new_tensor_1d(c0, GGML_TYPE_F32, 4);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(c0, sg);
    float in[4] = { 1, 2, 3, 4 }, out[4] = { 0 };
    ggml_backend_tensor_set_async(sg, t, in, 0, sizeof in);
    ggml_backend_tensor_get_async(sg, t, out + 1, sizeof(float), 3 * sizeof(float));
    ggml_backend_synchronize(sg);
    printf("roundtrip = %g %g %g %g\n", out[0], out[1], out[2], out[3]);
    ggml_backend_event_t ev = ggml_backend_event_new(dev);
    if (!ev) { printf("no event\n"); return 1; }
    ggml_backend_event_record(ev, sg);
    ggml_backend_event_wait(sg, ev);
    ggml_backend_event_synchronize(ev);
    ggml_backend_event_free(ev);
    printf("events ok\n");
    ggml_backend_buffer_free(buf);
    ggml_free(c0);

    /* the scheduler in parallel mode */
    ggml_backend_t backends[2] = { sg, cpu };
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, NULL, 2, GGML_DEFAULT_GRAPH_SIZE, true, false);
    for (int k = 0; k < 6; k++) {
        /* A graph built anew each step, as llama.cpp does. */
        struct ggml_init_params ip = { 1 << 20, NULL, true };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 8);
        ggml_set_input(x);
        struct ggml_tensor * a = ggml_scale(ctx, x, 2.0f);
        struct ggml_tensor * b = ggml_add(ctx, a, x);
        struct ggml_tensor * y = ggml_scale(ctx, b, 0.5f);
        ggml_set_output(y);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, y);
        ggml_backend_sched_reset(sched);
        ggml_backend_sched_set_tensor_backend(sched, x, sg);
        ggml_backend_sched_set_tensor_backend(sched, a, sg);
        ggml_backend_sched_set_tensor_backend(sched, b, cpu);
        ggml_backend_sched_set_tensor_backend(sched, y, sg);
        if (!ggml_backend_sched_alloc_graph(sched, gf)) { printf("alloc failed\n"); return 1; }
        float xs[8], ys[8];
        for (int i = 0; i < 8; i++) xs[i] = (float) (i + 10 * k);
        ggml_backend_tensor_set(x, xs, 0, sizeof xs);
        if (ggml_backend_sched_graph_compute_async(sched, gf) != GGML_STATUS_SUCCESS) { printf("compute failed\n"); return 1; }
        ggml_backend_sched_synchronize(sched);
        if (k == 0) {
            printf("copies %d splits %d\n", ggml_backend_sched_get_n_copies(sched), ggml_backend_sched_get_n_splits(sched));
        }
        ggml_backend_tensor_get(y, ys, 0, sizeof ys);
        printf("run %d: y =", k);
        for (int i = 0; i < 8; i++) printf(" %g", ys[i]);
        printf("\n");
        ggml_free(ctx);
    }
    ggml_backend_sched_free(sched);
    ggml_backend_free(cpu);
    ggml_backend_free(sg);
    return 0;
}
