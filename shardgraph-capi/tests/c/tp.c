/*
 * The C ABI from C (run by shardgraph-capi/tests/c_api.rs).
 *
 * `tp`: builds x -> rms_norm * norm weight -> SwiGLU FFN (Q8_0 gate/up
 * split on rows, down on its input axis) -> residual -> a
 * vocabulary-split Q8_0 output head -> soft_max, argmax, top_k; plans it on
 * 3 CPU devices with tensor split 2,1,1 and rules by name, prints the plan
 * report, runs it, runs the same graph on 1 device, and checks soft_max
 * NMSE < 1e-6 and identical argmax and top_k. Then the error paths: a bad
 * type id, NULL pointers, a shape mismatch in mul_mat, a tensor of another
 * context, bad enum values, a rule the planner cannot honour, wrong output
 * counts each return their code with a message from sg_last_error().
 * Prints the struct layouts for the Rust side to compare.
 *
 * `tp engine TARGET DRAFTER N_PREDICT TOKEN...`: loads the target with the
 * DFlash drafter on 2 CPU devices (names "CPU,CPU") and without a drafter on
 * 1 device, generates greedily on both and prints the tokens; a seeded
 * sampled generation repeats after sg_engine_reset; sg_engine_generate_ex
 * streams the tokens in the order returned, gives logits rows whose argmax
 * is each token, stops at a stop token and when its callback says so;
 * sg_engine_rollback then a generation equals a fresh run on the kept
 * tokens; K and V caches of different types load and generate.
 *
 * `tp devices NAMES`: the same graph and checks on the devices NAMES
 * lists (sg_devices_open, e.g. "EMU,EMU,EMU" or "CUDA0,CUDA0"; 3 devices
 * get the split 2,1,1) against the first of them alone; NAMES "auto" is
 * "EMU,CPU,EMUHIP" when sg_build_features() has cuda-emu, else
 * "CPU,cpu,CPU".
 *
 * Exit status 0 when every check passes, 1 otherwise.
 */
#include "shardgraph.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(call)                                                                          \
    do {                                                                                     \
        sg_status st_ = (call);                                                              \
        if (st_ != SG_OK) {                                                                  \
            fprintf(stderr, "%s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #call, (int)st_,    \
                    sg_last_error());                                                        \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* A call expected to fail with `want` and a message containing `needle`. */
#define EXPECT_ERR(want, needle, call) expect_err((want), (needle), (call), #call, __LINE__)

static void expect_err(sg_status want, const char *needle, sg_status got, const char *what, int line) {
    const char *msg = sg_last_error();
    if (got != want || msg == NULL || strstr(msg, needle) == NULL) {
        fprintf(stderr, "line %d: %s -> %d (want %d), message \"%s\" (want it to contain \"%s\")\n", line, what,
                (int)got, (int)want, msg ? msg : "(null)", needle);
        failures++;
        return;
    }
    printf("error ok: %d %s\n", (int)got, msg);
}

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "check failed: %s\n", what);
        failures++;
    }
}

/* Deterministic values in [-1, 1]. */
static float val(size_t i, unsigned seed) {
    return (float)((unsigned)((i * 2654435761u + seed) % 2001u)) / 1000.0f - 1.0f;
}

enum { E = 64, F = 128, V = 512, T = 4, K = 5 };

struct model {
    sg_context *ctx;
    sg_graph *graph;
    sg_tensor leafs[6];
    unsigned seeds[6];
    sg_tensor outputs[3]; /* probs, best, top */
};

static sg_tensor named(sg_context *ctx, int32_t type, int32_t n_dims, int64_t ne0, int64_t ne1, const char *name) {
    int64_t ne[2];
    sg_tensor t;
    ne[0] = ne0;
    ne[1] = ne1;
    CHECK(sg_new_tensor(ctx, type, n_dims, ne, name, &t));
    return t;
}

static void build(struct model *m) {
    sg_tensor x, nw, wg, wu, wd, head, xn, gate, up, act, down, h, logits;
    int64_t ne[4];
    size_t n_nodes, n_leafs;
    int i;
    CHECK(sg_context_new(&m->ctx));
    x = named(m->ctx, SG_TYPE_F32, 2, E, T, "inp_embd");
    CHECK(sg_set_input(m->ctx, x));
    nw = named(m->ctx, SG_TYPE_F32, 1, E, 1, "blk.0.ffn_norm.weight");
    wg = named(m->ctx, SG_TYPE_Q8_0, 2, E, F, "blk.0.ffn_gate.weight");
    wu = named(m->ctx, SG_TYPE_Q8_0, 2, E, F, "blk.0.ffn_up.weight");
    wd = named(m->ctx, SG_TYPE_Q8_0, 2, F, E, "blk.0.ffn_down.weight");
    /* Unnamed at first: sg_set_name names it. */
    CHECK(sg_new_tensor(m->ctx, SG_TYPE_Q8_0, 2, (const int64_t[]){E, V}, NULL, &head));
    CHECK(sg_set_name(m->ctx, head, "output.weight"));

    CHECK(sg_rms_norm(m->ctx, x, 1e-6f, &xn));
    CHECK(sg_mul(m->ctx, xn, nw, &xn));
    CHECK(sg_mul_mat(m->ctx, wg, xn, &gate));
    CHECK(sg_mul_mat(m->ctx, wu, xn, &up));
    CHECK(sg_swiglu_split(m->ctx, gate, up, &act));
    CHECK(sg_mul_mat(m->ctx, wd, act, &down));
    CHECK(sg_add(m->ctx, down, x, &h));
    CHECK(sg_mul_mat(m->ctx, head, h, &logits)); /* [V, T], split on the vocabulary */
    CHECK(sg_soft_max(m->ctx, logits, &m->outputs[0]));
    CHECK(sg_argmax(m->ctx, logits, &m->outputs[1]));
    CHECK(sg_top_k(m->ctx, logits, K, &m->outputs[2]));
    for (i = 0; i < 3; i++) {
        CHECK(sg_set_output(m->ctx, m->outputs[i]));
    }
    CHECK(sg_tensor_ne(m->ctx, logits, ne));
    expect(ne[0] == V && ne[1] == T && ne[2] == 1 && ne[3] == 1, "logits are [V, T, 1, 1]");
    {
        int32_t ty = -1;
        CHECK(sg_tensor_type(m->ctx, m->outputs[1], &ty));
        expect(ty == SG_TYPE_I32, "argmax is I32");
    }
    CHECK(sg_graph_build(m->ctx, m->outputs, 3, &m->graph));
    CHECK(sg_graph_size(m->graph, &n_nodes, &n_leafs));
    printf("graph: %zu nodes, %zu leafs\n", n_nodes, n_leafs);
    expect(n_leafs == 6, "6 leafs");

    m->leafs[0] = x;
    m->leafs[1] = nw;
    m->leafs[2] = wg;
    m->leafs[3] = wu;
    m->leafs[4] = wd;
    m->leafs[5] = head;
    for (i = 0; i < 6; i++) {
        m->seeds[i] = 7919u * (unsigned)(i + 1);
    }
}

struct result {
    float probs[V * T];
    int32_t best[T];
    int32_t top[K * T];
    uint64_t moved, planned;
    size_t repartitions;
};

/* Opens the devices: `names` (sg_devices_open) or, when NULL, n CPU
 * devices; with 3 devices the tensor split is 2,1,1. */
static sg_devices *open_devices(const char *names, int n) {
    sg_devices *devs;
    size_t count;
    if (names != NULL) {
        CHECK(sg_devices_open(names, 1, &devs));
    } else {
        CHECK(sg_devices_cpu(n, 1, &devs));
    }
    CHECK(sg_devices_count(devs, &count));
    if (count == 3) {
        const float ratios[3] = {2.0f, 1.0f, 1.0f};
        CHECK(sg_devices_set_tensor_split(devs, ratios, 3));
    }
    return devs;
}

/* Plans, loads and runs the model on `devs` (freed here). */
static void run(const struct model *m, sg_devices *devs, int print, struct result *r) {
    sg_policy *pol;
    sg_plan *plan;
    sg_store *store;
    sg_executor *exec;
    sg_report *rep;
    size_t count, needed, k, n_out;
    int i, n;

    CHECK(sg_devices_count(devs, &count));
    n = (int)count;

    /* llama.cpp's --split-mode tensor rules for these tensors. */
    CHECK(sg_policy_new(devs, &pol));
    CHECK(sg_policy_rule_axis(pol, "blk.*.ffn_gate.weight", 1, 32));
    CHECK(sg_policy_rule_axis(pol, "blk.*.ffn_up.weight", 1, 32));
    CHECK(sg_policy_rule_axis(pol, "blk.*.ffn_down.weight", 0, 32));
    CHECK(sg_policy_rule_axis(pol, "output.weight", 1, 1));
    CHECK(sg_policy_rule_mirrored(pol, "*norm*"));
    CHECK(sg_plan_new(m->ctx, m->graph, pol, &plan));
    CHECK(sg_plan_bytes_moved(plan, &r->planned));
    CHECK(sg_plan_n_repartitions(plan, &r->repartitions));

    /* The report, snprintf-style: ask for the length, then fetch. */
    CHECK(sg_plan_describe(plan, m->ctx, m->graph, NULL, 0, &needed));
    {
        char *text = (char *)malloc(needed);
        char small[10];
        size_t again = 0;
        expect(text != NULL, "malloc");
        CHECK(sg_plan_describe(plan, m->ctx, m->graph, text, needed, &again));
        expect(again == needed && strlen(text) + 1 == needed, "plan report length");
        expect(strstr(text, "blk.0.ffn_gate.weight") != NULL, "the report names the weights");
        if (print) {
            printf("--- plan on %d devices ---\n%s--- end of plan ---\n", n, text);
        }
        /* A short buffer gets a cut, NUL-terminated prefix. */
        CHECK(sg_plan_describe(plan, m->ctx, m->graph, small, sizeof small, &again));
        expect(strlen(small) == sizeof small - 1 && strncmp(small, text, sizeof small - 1) == 0,
               "a short buffer holds a prefix");
        free(text);
    }

    CHECK(sg_store_new(devs, &store));
    CHECK(sg_store_place_leafs(store, m->ctx, m->graph, plan));
    for (i = 0; i < 6; i++) {
        int64_t ne[4];
        size_t nel, j;
        float *v;
        float *back;
        double err = 0.0;
        CHECK(sg_tensor_ne(m->ctx, m->leafs[i], ne));
        nel = (size_t)(ne[0] * ne[1] * ne[2] * ne[3]);
        v = (float *)malloc(nel * sizeof *v);
        back = (float *)malloc(nel * sizeof *back);
        expect(v != NULL && back != NULL, "malloc");
        for (j = 0; j < nel; j++) {
            v[j] = val(j, m->seeds[i]);
            if (i == 1) {
                v[j] = 1.0f + 0.1f * v[j]; /* norm weight near 1 */
            }
        }
        CHECK(sg_store_set_f32(store, m->ctx, m->leafs[i], v, nel));
        /* Read back through the split store: F32 exact, Q8_0 within half a
         * quantization step plus the F16 rounding of the block scale d
         * (values in [-1, 1]: d <= 1/127, |x - q*d16| <= d/2 + 127*d*2^-11). */
        CHECK(sg_store_get_f32(store, m->ctx, m->leafs[i], back, nel));
        for (j = 0; j < nel; j++) {
            double d = fabs((double)back[j] - (double)v[j]);
            err = d > err ? d : err;
        }
        if (print) {
            printf("store read-back of leaf %d: max |error| %.3e\n", i, err);
        }
        if (i == 2) {
            /* The stored Q8_0 bytes are ggml's reference quantization
             * (sg_quantize), assembled from the 3 devices' row parts; writing
             * them back raw changes nothing. */
            size_t row = 0, nbytes = 0;
            unsigned char *q, *stored;
            CHECK(sg_row_size(SG_TYPE_Q8_0, ne[0], &row));
            CHECK(sg_tensor_nbytes(m->ctx, m->leafs[i], &nbytes));
            expect(row == (size_t)ne[0] / 32 * 34 && nbytes == row * (size_t)ne[1], "Q8_0 row size");
            q = (unsigned char *)malloc(nbytes);
            stored = (unsigned char *)malloc(nbytes);
            expect(q != NULL && stored != NULL, "malloc");
            CHECK(sg_quantize(SG_TYPE_Q8_0, v, ne[1], ne[0], q, nbytes));
            CHECK(sg_store_get_bytes(store, m->ctx, m->leafs[i], 0, stored, nbytes));
            expect(memcmp(q, stored, nbytes) == 0, "stored bytes are sg_quantize's");
            CHECK(sg_store_set_bytes(store, m->ctx, m->leafs[i], 0, q, nbytes));
            CHECK(sg_store_get_f32(store, m->ctx, m->leafs[i], v, nel));
            expect(memcmp(v, back, nel * sizeof *v) == 0, "raw bytes written back read the same");
            EXPECT_ERR(SG_ERR_DATA_MISMATCH, "quantize", sg_quantize(SG_TYPE_Q8_0, v, ne[1], ne[0], q, nbytes - 1));
            EXPECT_ERR(SG_ERR_UNSUPPORTED, "i32", sg_quantize(SG_TYPE_I32, v, 1, 4, q, 16));
            free(q);
            free(stored);
        }
        expect(i < 2 ? err == 0.0 : err <= 1.0 / 254.0 + 1.0 / 2048.0, "store read-back");
        free(v);
        free(back);
    }

    CHECK(sg_executor_new(devs, &exec));
    CHECK(sg_execute(exec, m->ctx, m->graph, plan, store, m->outputs, 3, &rep));
    CHECK(sg_report_n_outputs(rep, &n_out));
    expect(n_out == 3, "3 outputs");
    CHECK(sg_report_output_f32(rep, 0, r->probs, V * T));
    CHECK(sg_report_output_i32(rep, 1, r->best, T));
    CHECK(sg_report_output_i32(rep, 2, r->top, K * T));
    CHECK(sg_report_bytes_moved(rep, &r->moved));
    CHECK(sg_report_output_bytes(rep, 1, NULL, 0, &k));
    expect(k == T * sizeof(int32_t), "argmax bytes");
    /* Errors of the report: a wrong count, a wrong type, an index past the end. */
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "elements", sg_report_output_f32(rep, 0, r->probs, V));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "not f32", sg_report_output_f32(rep, 1, r->probs, T));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "output 3", sg_report_output_i32(rep, 3, r->best, T));
    CHECK(sg_report_free(rep));

    /* A second run reuses the compiled program and gives the same result. */
    {
        int32_t best2[T];
        CHECK(sg_execute(exec, m->ctx, m->graph, plan, store, &m->outputs[1], 1, &rep));
        CHECK(sg_report_output_i32(rep, 0, best2, T));
        expect(memcmp(best2, r->best, sizeof best2) == 0, "second run");
        CHECK(sg_report_free(rep));
    }

    CHECK(sg_executor_free(exec));
    CHECK(sg_store_free(store));
    CHECK(sg_plan_free(plan));
    CHECK(sg_policy_free(pol));
    CHECK(sg_devices_free(devs));
}

static void error_paths(const struct model *m) {
    sg_context *ctx, *other;
    sg_tensor a, b, c, t;
    sg_devices *devs;
    sg_policy *pol;
    sg_plan *plan = NULL;
    const int64_t ne_a[2] = {64, 8};
    const int64_t ne_b[2] = {32, 4};
    const int64_t ne_partial[2] = {33, 4};
    const char *name;

    CHECK(sg_context_new(&ctx));
    CHECK(sg_context_new(&other));
    CHECK(sg_new_tensor(ctx, SG_TYPE_F32, 2, ne_a, "a", &a));
    CHECK(sg_new_tensor(ctx, SG_TYPE_F32, 2, ne_b, "b", &b));
    CHECK(sg_new_tensor(other, SG_TYPE_F32, 2, ne_a, "c", &c));

    /* Bad type ids: outside ggml's enum, and one ggml had but this library does not implement. */
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "type id 1000", sg_new_tensor(ctx, 1000, 2, ne_a, NULL, &t));
    EXPECT_ERR(SG_ERR_UNSUPPORTED, "id 4", sg_new_tensor(ctx, 4, 2, ne_a, NULL, &t));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "type id -1", sg_type_name(-1, &name));
    CHECK(sg_type_name(SG_TYPE_Q4_K, &name));
    expect(strcmp(name, "q4_K") == 0, "type name");
    /* NULL pointers. */
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "ne is NULL", sg_new_tensor(ctx, SG_TYPE_F32, 2, NULL, NULL, &t));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "ctx is NULL", sg_mul_mat(NULL, a, b, &t));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "out is NULL", sg_mul_mat(ctx, a, b, NULL));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "ctx is NULL", sg_context_new(NULL));
    /* Bad shapes. */
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "n_dims = 5", sg_new_tensor(ctx, SG_TYPE_F32, 5, ne_a, NULL, &t));
    EXPECT_ERR(SG_ERR_SHAPE, "block size", sg_new_tensor(ctx, SG_TYPE_Q8_0, 2, ne_partial, NULL, &t));
    /* A shape mismatch in mul_mat: K = 64 against K = 32. */
    EXPECT_ERR(SG_ERR_INVALID_OPERAND, "mul_mat", sg_mul_mat(ctx, a, b, &t));
    /* A tensor of another context; no tensor where one is needed. */
    EXPECT_ERR(SG_ERR_FOREIGN_TENSOR, "context", sg_add(ctx, a, c, &t));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "SG_TENSOR_NONE", sg_add(ctx, a, SG_TENSOR_NONE, &t));
    /* Bad enum values and strings. */
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "unary op 99", sg_unary(ctx, a, 99, &t));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "sort order", sg_argsort(ctx, a, 7, &t));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "not UTF-8", sg_set_name(ctx, a, "\xff\xfe"));
    {
        sg_rope_params p;
        CHECK(sg_rope_params_default(&p));
        p.mode = 3;
        EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "rope mode 3", sg_rope_ext(ctx, a, b, SG_TENSOR_NONE, &p, &t));
    }
    /* The ops that succeed still work after failures, and the message stays until the next failure. */
    CHECK(sg_unary(ctx, a, SG_UNARY_SILU, &t));
    expect(strstr(sg_last_error(), "sg_rope_ext") != NULL, "the last error stays after a success");

    /* Devices and policies. */
    EXPECT_ERR(SG_ERR_SPLIT, "GPU7", sg_devices_open("CPU,GPU7", 1, &devs));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "threads = 0", sg_devices_cpu(2, 0, &devs));
    CHECK(sg_devices_open("cpu, CPU", 1, &devs));
    {
        char dev_name[16];
        size_t need = 0;
        CHECK(sg_devices_name(devs, 1, dev_name, sizeof dev_name, &need));
        printf("device 1: %s\n", dev_name);
        expect(strncmp(dev_name, "CPU", 3) == 0 && need == strlen(dev_name) + 1, "device name");
    }
    EXPECT_ERR(SG_ERR_SPLIT, "ratio", sg_devices_set_tensor_split(devs, (const float[]){1.0f}, 1));
    CHECK(sg_policy_new(devs, &pol));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "axis 4", sg_policy_rule_axis(pol, "x", 4, 1));
    /* A Q8_0 row split on single elements: not on 32-element block boundaries. */
    CHECK(sg_policy_rule_axis(pol, "blk.0.ffn_down.weight", 0, 1));
    CHECK(sg_policy_rule_mirrored(pol, "*"));
    EXPECT_ERR(SG_ERR_SPLIT, "blk.0.ffn_down.weight", sg_plan_new(m->ctx, m->graph, pol, &plan));
    expect(plan == NULL, "no plan on failure");
    /* A graph with another context. */
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "another context", sg_plan_new(ctx, m->graph, pol, &plan));
    CHECK(sg_policy_free(pol));
    CHECK(sg_devices_free(devs));

    /* Free functions take NULL. */
    CHECK(sg_graph_free(NULL));
    CHECK(sg_context_free(other));
    CHECK(sg_context_free(ctx));
}

/* A fused up|gate weight split by segments (sg_policy_rule_segments) on 2
 * devices, I32 row indices (sg_store_set_i32/get_i32): mul_mat against
 * plain loops in C, get_rows against the weight's rows. */
static void segments_and_i32(void) {
    enum { KK = 8, M = 12, N = 2 };
    sg_context *ctx;
    sg_graph *graph;
    sg_devices *devs;
    sg_policy *pol;
    sg_plan *plan;
    sg_store *store;
    sg_executor *exec;
    sg_report *rep;
    sg_tensor w, x, ids, out[2];
    const int64_t segments[2] = {6, 6};
    float wv[KK * M], xv[KK * N], y[M * N], rows[KK * N];
    int32_t idv[N] = {11, 2}, idback[N] = {0, 0};
    double err = 0.0;
    int i, j, k;

    CHECK(sg_context_new(&ctx));
    CHECK(sg_new_tensor(ctx, SG_TYPE_F32, 2, (const int64_t[]){KK, M}, "blk.0.ffn_up_gate.weight", &w));
    CHECK(sg_new_tensor(ctx, SG_TYPE_F32, 2, (const int64_t[]){KK, N}, "x", &x));
    CHECK(sg_new_tensor(ctx, SG_TYPE_I32, 1, (const int64_t[]){N}, "rows", &ids));
    CHECK(sg_set_input(ctx, x));
    CHECK(sg_set_input(ctx, ids));
    CHECK(sg_mul_mat(ctx, w, x, &out[0]));
    CHECK(sg_get_rows(ctx, w, ids, &out[1]));
    CHECK(sg_graph_build(ctx, out, 2, &graph));

    CHECK(sg_devices_cpu(2, 1, &devs));
    CHECK(sg_policy_new(devs, &pol));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "no segments", sg_policy_rule_segments(pol, "x", 1, 1, segments, 0));
    CHECK(sg_policy_rule_segments(pol, "blk.*.ffn_up_gate.weight", 1, 1, segments, 2));
    /* Memory first: the fused weight is read where it lies (the results below are unchanged). */
    CHECK(sg_policy_keep_weights_split(pol, 1));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "pol", sg_policy_keep_weights_split(NULL, 1));
    CHECK(sg_plan_new(ctx, graph, pol, &plan));
    CHECK(sg_store_new(devs, &store));
    CHECK(sg_store_place_leafs(store, ctx, graph, plan));
    for (i = 0; i < KK * M; i++) {
        wv[i] = val((size_t)i, 11u);
    }
    for (i = 0; i < KK * N; i++) {
        xv[i] = val((size_t)i, 13u);
    }
    CHECK(sg_store_set_f32(store, ctx, w, wv, KK * M));
    CHECK(sg_store_set_f32(store, ctx, x, xv, KK * N));
    EXPECT_ERR(SG_ERR_UNSUPPORTED, "set_i32", sg_store_set_i32(store, ctx, x, idv, KK * N));
    CHECK(sg_store_set_i32(store, ctx, ids, idv, N));
    CHECK(sg_store_get_i32(store, ctx, ids, idback, N));
    expect(idback[0] == 11 && idback[1] == 2, "I32 read-back");
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "values for tensor", sg_store_set_i32(store, ctx, ids, idv, 1));
    {
        /* The store was placed from ctx: a tensor of another context is foreign, not "not placed". */
        sg_context *ctx2 = NULL;
        sg_tensor w2;
        CHECK(sg_context_new(&ctx2));
        CHECK(sg_new_tensor(ctx2, SG_TYPE_F32, 2, (const int64_t[]){KK, M}, "blk.0.ffn_up_gate.weight", &w2));
        EXPECT_ERR(SG_ERR_FOREIGN_TENSOR, "context", sg_store_set_f32(store, ctx2, w2, wv, KK * M));
        EXPECT_ERR(SG_ERR_FOREIGN_TENSOR, "context", sg_store_get_f32(store, ctx2, w2, wv, KK * M));
        CHECK(sg_context_free(ctx2));
    }

    CHECK(sg_executor_new(devs, &exec));
    CHECK(sg_execute(exec, ctx, graph, plan, store, out, 2, &rep));
    CHECK(sg_report_output_f32(rep, 0, y, M * N));
    CHECK(sg_report_output_f32(rep, 1, rows, KK * N));
    for (j = 0; j < N; j++) {
        for (i = 0; i < M; i++) {
            double want = 0.0;
            for (k = 0; k < KK; k++) {
                want += (double)wv[i * KK + k] * (double)xv[j * KK + k];
            }
            err = fabs(want - (double)y[j * M + i]) > err ? fabs(want - (double)y[j * M + i]) : err;
        }
        expect(memcmp(&rows[j * KK], &wv[idv[j] * KK], KK * sizeof(float)) == 0, "get_rows rows");
    }
    printf("segments: mul_mat on 2 devices vs C loops, max |error| %.3e\n", err);
    expect(err < 1e-5, "fused up|gate mul_mat");

    CHECK(sg_report_free(rep));
    CHECK(sg_executor_free(exec));
    CHECK(sg_store_free(store));
    CHECK(sg_plan_free(plan));
    CHECK(sg_policy_free(pol));
    CHECK(sg_devices_free(devs));
    CHECK(sg_graph_free(graph));
    CHECK(sg_context_free(ctx));
}

static double nmse(const float *got, const float *want, size_t n) {
    double num = 0.0, den = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * (double)want[i];
    }
    return num / den;
}

/* The split run on `names` (NULL: 3 CPU devices) against the first of
 * those devices alone (NULL: 1 CPU device). */
static int graph_main(const char *names) {
    struct model m;
    static struct result split, one;
    char first[64];
    size_t n_split;
    sg_devices *devs;
    double e;
    int t;

    printf("shardgraph %s (header %s)\n", sg_version(), SG_VERSION);
    expect(strcmp(sg_version(), SG_VERSION) == 0, "library and header versions");
    printf("layout: sg_rope_params %zu sg_engine_params %zu sg_sampler_params %zu sg_sampler_params.seed %zu "
           "sg_spec_stats %zu sg_status %zu sg_generate_options %zu sg_generate_options.on_token %zu\n",
           sizeof(sg_rope_params), sizeof(sg_engine_params), sizeof(sg_sampler_params),
           offsetof(sg_sampler_params, seed), sizeof(sg_spec_stats), sizeof(sg_status), sizeof(sg_generate_options),
           offsetof(sg_generate_options, on_token));

    build(&m);
    devs = open_devices(names, 3);
    CHECK(sg_devices_count(devs, &n_split));
    run(&m, devs, 1, &split);
    if (names != NULL) {
        size_t len = strcspn(names, ",");
        expect(len < sizeof first, "a short first device name");
        memcpy(first, names, len < sizeof first ? len : sizeof first - 1);
        first[len < sizeof first ? len : sizeof first - 1] = 0;
    }
    run(&m, open_devices(names != NULL ? first : NULL, 1), 0, &one);

    e = nmse(split.probs, one.probs, V * T);
    printf("%zu devices (%s): %zu repartitions, %llu bytes moved (plan: %llu); 1 device: %llu bytes moved\n",
           n_split, names != NULL ? names : "CPU x3, split 2,1,1", split.repartitions, (unsigned long long)split.moved, (unsigned long long)split.planned,
           (unsigned long long)one.moved);
    printf("soft_max NMSE vs 1 device: %.3e\n", e);
    printf("argmax:");
    for (t = 0; t < T; t++) {
        printf(" %d/%d", (int)split.best[t], (int)one.best[t]);
    }
    printf("\n");
    expect(e < 1e-6, "soft_max NMSE < 1e-6");
    expect(memcmp(split.best, one.best, sizeof split.best) == 0, "identical argmax");
    expect(memcmp(split.top, one.top, sizeof split.top) == 0, "identical top_k");
    expect(split.moved == split.planned && split.moved > 0, "bytes moved as planned");
    expect(one.moved == 0 && one.repartitions == 0, "one device moves nothing");
    {
        double sum = 0.0;
        int i;
        for (i = 0; i < V; i++) {
            sum += split.probs[i];
        }
        expect(fabs(sum - 1.0) < 1e-4, "a soft_max row sums to 1");
    }
    printf("argmax identical: %s\n", memcmp(split.best, one.best, sizeof split.best) == 0 ? "yes" : "no");

    error_paths(&m);
    segments_and_i32();

    CHECK(sg_graph_free(m.graph));
    CHECK(sg_context_free(m.ctx));
    return failures == 0 ? 0 : 1;
}

static void print_tokens(const char *label, const int32_t *tokens, size_t n) {
    size_t i;
    printf("%s:", label);
    for (i = 0; i < n; i++) {
        printf(" %d", (int)tokens[i]);
    }
    printf("\n");
}

/* What the token callback saw: the tokens in order, and after how many it ends (0: never). */
struct seen {
    int32_t tokens[256];
    size_t n;
    size_t limit;
};

static int32_t record_token(int32_t token, void *user_data) {
    struct seen *s = (struct seen *)user_data;
    if (s->n < 256) {
        s->tokens[s->n] = token;
    }
    s->n++;
    return s->limit == 0 || s->n < s->limit;
}

/* sg_engine_generate_ex on `e` (ctx_size n_prompt + n_predict, greedy
 * tokens `want` from sg_engine_generate): streaming in the order returned,
 * logits rows whose argmax is each token, a stop token, a callback that
 * ends it, and a rollback that continues as a fresh run on the kept tokens. */
static void generate_ex_checks(sg_engine *e, const int32_t *prompt, size_t n_prompt, size_t n_predict,
                               const int32_t *want, int64_t n_vocab) {
    sg_generate_options go;
    struct seen seen;
    int32_t end = -1, got[256], again[256], longer[128], next = 7;
    float *logits = (float *)calloc(n_predict * (size_t)n_vocab, sizeof(float));
    size_t i, k, n = 0, n2 = 0, stop_at = 3, n_eog = 99;
    int64_t n_past = 0;

    expect(logits != NULL && n_predict <= 64 && n_prompt + n_predict <= 128, "generate_ex sizes");
    memset(&go, 0, sizeof go);
    memset(&seen, 0, sizeof seen);
    go.on_token = record_token;
    go.user_data = &seen;
    go.out_logits = logits;
    go.logits_cap = n_predict * (size_t)n_vocab;
    CHECK(sg_engine_reset(e));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "logits_cap",
               sg_engine_generate_ex(e, prompt, n_prompt, n_predict + 1, NULL, &go, got, 256, &n, NULL, &end));
    CHECK(sg_engine_generate_ex(e, prompt, n_prompt, n_predict, NULL, &go, got, n_predict, &n, NULL, &end));
    expect(n == n_predict && end == SG_END_LENGTH && memcmp(got, want, n * sizeof(int32_t)) == 0,
           "generate_ex gives generate's greedy tokens");
    expect(seen.n == n && memcmp(seen.tokens, got, n * sizeof(int32_t)) == 0, "tokens streamed in the order returned");
    for (k = 0; k < n; k++) {
        const float *row = logits + k * (size_t)n_vocab;
        size_t best = 0;
        for (i = 1; i < (size_t)n_vocab; i++) {
            if (row[i] > row[best]) {
                best = i;
            }
        }
        expect((int32_t)best == got[k], "each logits row's argmax is its token");
    }
    printf("engine generate_ex: %zu tokens streamed, logits rows of %lld\n", seen.n, (long long)n_vocab);

    /* A stop token: the first at index >= 3 not generated before it. */
    for (;; stop_at++) {
        int earlier = 0;
        for (i = 0; i < stop_at; i++) {
            earlier |= want[i] == want[stop_at];
        }
        if (!earlier || stop_at + 1 >= n_predict) {
            break;
        }
    }
    memset(&go, 0, sizeof go);
    go.stop = &want[stop_at];
    go.n_stop = 1;
    CHECK(sg_engine_reset(e));
    CHECK(sg_engine_generate_ex(e, prompt, n_prompt, n_predict, NULL, &go, got, n_predict, &n, NULL, &end));
    expect(n == stop_at + 1 && end == SG_END_STOP && memcmp(got, want, n * sizeof(int32_t)) == 0,
           "a stop token ends the generation after it");
    CHECK(sg_engine_n_past(e, &n_past));
    expect(n_past == (int64_t)(n_prompt + n), "the sequence ends at the stop token");

    /* The callback ends it after 5 tokens. */
    memset(&go, 0, sizeof go);
    memset(&seen, 0, sizeof seen);
    seen.limit = 5;
    go.on_token = record_token;
    go.user_data = &seen;
    CHECK(sg_engine_reset(e));
    CHECK(sg_engine_generate_ex(e, prompt, n_prompt, n_predict, NULL, &go, got, n_predict, &n, NULL, &end));
    expect(n == 5 && end == SG_END_CALLER && seen.n == 5, "the callback ends the generation");

    /* Rollback to the prompt and 4 generated tokens, then one more token:
     * as a fresh run on those. */
    CHECK(sg_engine_reset(e));
    CHECK(sg_engine_generate(e, prompt, n_prompt, n_predict, NULL, got, n_predict, &n, NULL));
    EXPECT_ERR(SG_ERR_MODEL, "roll back", sg_engine_rollback(e, (int64_t)(n_prompt + n_predict + 1)));
    CHECK(sg_engine_rollback(e, (int64_t)(n_prompt + 4)));
    CHECK(sg_engine_n_past(e, &n_past));
    expect(n_past == (int64_t)(n_prompt + 4), "n_past after the rollback");
    CHECK(sg_engine_generate(e, &next, 1, n_predict - 5, NULL, got, n_predict, &n, NULL));
    memcpy(longer, prompt, n_prompt * sizeof(int32_t));
    memcpy(longer + n_prompt, want, 4 * sizeof(int32_t));
    longer[n_prompt + 4] = next;
    CHECK(sg_engine_reset(e));
    CHECK(sg_engine_generate(e, longer, n_prompt + 5, n_predict - 5, NULL, again, n_predict, &n2, NULL));
    expect(n == n2 && memcmp(got, again, n * sizeof(int32_t)) == 0, "rollback then generate = a fresh run");
    print_tokens("engine after rollback", got, n);

    CHECK(sg_engine_eog_tokens(e, NULL, 0, &n_eog));
    expect(n_eog == 0, "no end-of-generation token in a file without a tokenizer");
    CHECK(sg_engine_reset(e));
    free(logits);
}

static int engine_main(int argc, char **argv) {
    const char *target = argv[2];
    const char *drafter = argv[3];
    size_t n_predict = (size_t)atoi(argv[4]);
    size_t n_prompt = (size_t)(argc - 5);
    int32_t prompt[64];
    int32_t *spec_tokens, *plain_tokens, *sampled, *sampled2;
    size_t i, n_out = 0, n_plain = 0, n_s = 0;
    sg_devices *two, *one;
    sg_engine *spec, *plain;
    sg_engine_params params;
    sg_sampler_params sp;
    sg_spec_stats stats;
    int64_t n_past = 0, n_vocab = 0;
    uint64_t moved = 0;

    if (n_prompt == 0 || n_prompt > 64) {
        fprintf(stderr, "1 to 64 prompt tokens\n");
        return 1;
    }
    for (i = 0; i < n_prompt; i++) {
        prompt[i] = (int32_t)atoi(argv[5 + i]);
    }
    spec_tokens = (int32_t *)calloc(n_predict + 1, sizeof(int32_t));
    plain_tokens = (int32_t *)calloc(n_predict + 1, sizeof(int32_t));
    sampled = (int32_t *)calloc(n_predict + 1, sizeof(int32_t));
    sampled2 = (int32_t *)calloc(n_predict + 1, sizeof(int32_t));
    expect(spec_tokens && plain_tokens && sampled && sampled2, "calloc");

    CHECK(sg_engine_params_default(&params));
    params.ctx_size = (int64_t)(n_prompt + n_predict);

    /* The drafter on 2 devices (by name), split 1:1. */
    CHECK(sg_devices_open("CPU,CPU", 1, &two));
    CHECK(sg_devices_set_tensor_split(two, (const float[]){1.0f, 1.0f}, 2));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "needs draft_path",
               sg_engine_load(two, target, SG_DRAFT_GGUF, NULL, &params, &spec));
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "draft kind 9", sg_engine_load(two, target, 9, NULL, &params, &spec));
    EXPECT_ERR(SG_ERR_GGUF, "no-such-file.gguf",
               sg_engine_load(two, "no-such-file.gguf", SG_DRAFT_NONE, NULL, &params, &spec));
    CHECK(sg_engine_load(two, target, SG_DRAFT_GGUF, drafter, &params, &spec));
    CHECK(sg_engine_n_vocab(spec, &n_vocab));
    {
        int64_t n_ctx = 0;
        CHECK(sg_engine_n_ctx(spec, &n_ctx));
        expect(n_ctx == params.ctx_size, "n_ctx is ctx_size");
    }
    EXPECT_ERR(SG_ERR_INVALID_ARGUMENT, "out_cap",
               sg_engine_generate(spec, prompt, n_prompt, n_predict, NULL, spec_tokens, n_predict - 1, &n_out, NULL));
    CHECK(sg_engine_generate(spec, prompt, n_prompt, n_predict, NULL, spec_tokens, n_predict + 1, &n_out, &stats));
    CHECK(sg_engine_n_past(spec, &n_past));
    CHECK(sg_engine_bytes_moved(spec, &moved));
    print_tokens("engine dflash 2 devices", spec_tokens, n_out);
    printf("stats: drafted %llu accepted %llu target_steps %llu, n_past %lld, n_vocab %lld, bytes moved %llu\n",
           (unsigned long long)stats.drafted, (unsigned long long)stats.accepted,
           (unsigned long long)stats.target_steps, (long long)n_past, (long long)n_vocab, (unsigned long long)moved);
    expect(n_out == n_predict, "n_predict tokens");
    expect(stats.drafted > 0 && moved > 0, "drafts on 2 devices");
    /* The context is full now: one more token is refused before decoding. */
    EXPECT_ERR(SG_ERR_MODEL, "ctx_size", sg_engine_generate(spec, prompt, 1, 1, NULL, spec_tokens, 1, &n_out, NULL));
    generate_ex_checks(spec, prompt, n_prompt, n_predict, spec_tokens, n_vocab);

    /* A seeded sampled generation repeats after a reset. */
    CHECK(sg_sampler_params_default(&sp));
    sp.temp = 0.8f;
    sp.seed = 1234;
    CHECK(sg_engine_reset(spec));
    CHECK(sg_engine_generate(spec, prompt, n_prompt, n_predict, &sp, sampled, n_predict, &n_s, NULL));
    CHECK(sg_engine_reset(spec));
    CHECK(sg_engine_generate(spec, prompt, n_prompt, n_predict, &sp, sampled2, n_predict, &n_s, NULL));
    print_tokens("engine sampled", sampled, n_s);
    expect(memcmp(sampled, sampled2, n_predict * sizeof(int32_t)) == 0, "a seeded generation repeats");
    sp.top_p = 2.0f;
    EXPECT_ERR(SG_ERR_MODEL, "top_p", sg_engine_generate(spec, prompt, n_prompt, 1, &sp, sampled, 1, &n_s, NULL));
    CHECK(sg_engine_free(spec));
    CHECK(sg_devices_free(two));

    /* No drafter on 1 device. */
    CHECK(sg_devices_cpu(1, 1, &one));
    {
        /* K and V caches of different types (--cache-type-k q8_0 --cache-type-v f16). */
        sg_engine_params mixed = params;
        sg_engine *kv;
        mixed.cache_type_k = SG_TYPE_Q8_0;
        mixed.cache_type_v = SG_TYPE_Q4_K;
        EXPECT_ERR(SG_ERR_MODEL, "cache_type_v", sg_engine_load(one, target, SG_DRAFT_NONE, NULL, &mixed, &kv));
        mixed.cache_type_v = SG_TYPE_F16;
        CHECK(sg_engine_load(one, target, SG_DRAFT_NONE, NULL, &mixed, &kv));
        CHECK(sg_engine_generate(kv, prompt, n_prompt, n_predict, NULL, sampled, n_predict, &n_s, NULL));
        print_tokens("engine kv q8_0/f16 1 device", sampled, n_s);
        CHECK(sg_engine_free(kv));
    }
    CHECK(sg_engine_load(one, target, SG_DRAFT_NONE, NULL, NULL, &plain));
    CHECK(sg_engine_generate(plain, prompt, n_prompt, n_predict, NULL, plain_tokens, n_predict, &n_plain, NULL));
    print_tokens("engine plain 1 device", plain_tokens, n_plain);
    expect(n_plain == n_out && memcmp(plain_tokens, spec_tokens, n_out * sizeof(int32_t)) == 0,
           "speculative greedy equals plain greedy");
    CHECK(sg_engine_free(plain));
    CHECK(sg_devices_free(one));

    free(spec_tokens);
    free(plain_tokens);
    free(sampled);
    free(sampled2);
    return failures == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    int rc;
    if (argc >= 6 && strcmp(argv[1], "engine") == 0) {
        rc = engine_main(argc, argv);
    } else if (argc == 1) {
        rc = graph_main(NULL);
    } else if (argc == 3 && strcmp(argv[1], "devices") == 0) {
        const char *names = argv[2];
        printf("features: \"%s\"\n", sg_build_features());
        if (strcmp(names, "auto") == 0) {
            names = strstr(sg_build_features(), "cuda-emu") != NULL ? "EMU,CPU,EMUHIP" : "CPU,cpu,CPU";
        }
        rc = graph_main(names);
    } else {
        fprintf(stderr, "usage: %s | %s devices NAMES|auto | %s engine TARGET DRAFTER N_PREDICT TOKEN...\n", argv[0], argv[0], argv[0]);
        return 2;
    }
    printf("%s (%d failed checks)\n", rc == 0 ? "ALL OK" : "FAILED", failures);
    return rc;
}
