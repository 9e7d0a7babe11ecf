/*
 * shardgraph.h -- the C ABI of shardgraph (crate shardgraph-capi).
 *
 * shardgraph is a ggml-compatible compute graph (ggml's tensor model, type
 * ids, op semantics and names) with a tensor-parallel meta backend: one
 * graph planned and run over N devices (CPU, CUDA, HIP), each holding its
 * share of the split weights, with the collectives the plan needs. This
 * header lets a C or C++ engine (llama.cpp-like) build graphs, plan them
 * for its devices, run them, and load a model and generate tokens with
 * speculative decoding in one call.
 *
 * Build and link: `cargo build --release -p shardgraph-capi` gives
 * target/release/libshardgraph_capi.so;
 * `cc -I include app.c -L target/release -lshardgraph_capi`.
 * C99; usable from C++ (extern "C").
 *
 * CONVENTIONS
 *
 * Status. Every function returns an sg_status (SG_OK = 0), except
 * sg_last_error(), sg_version() and sg_build_features(), which return
 * strings. Results are
 * written through out-parameters, only on success. On failure,
 * sg_last_error() returns a message naming the function and what was wrong
 * (the op, operand and shapes; the tensor and split rule; the file and
 * key). Errors never abort the process and no panic crosses the boundary:
 * an internal panic is contained and returned as SG_ERR_PANIC. (A failed
 * host allocation aborts, as it does in Rust; device memory is checked
 * before allocating: SG_ERR_OUT_OF_MEMORY.)
 *
 * Arguments. A NULL pointer where one is needed, a bad count or length, an
 * enum value outside its range, a string that is not UTF-8, a tensor of
 * another context or handles that do not belong together return
 * SG_ERR_INVALID_ARGUMENT. Pointers to arrays may be NULL when their
 * length is 0. What the library cannot check is the caller's part: a
 * non-NULL pointer points to live memory of the documented type and
 * length; a handle comes from its sg_*_new / sg_*_load (or the function
 * documented to make it) and has not been freed; sg_tensor values are
 * passed as returned.
 *
 * Ownership. Every handle made by a function is owned by the caller and
 * freed by its own sg_*_free (sg_context_free, sg_graph_free,
 * sg_devices_free, sg_policy_free, sg_plan_free, sg_store_free,
 * sg_executor_free, sg_report_free, sg_engine_free), once. Free functions
 * accept NULL. Handles do not keep each other alive and may be freed in any
 * order, but a graph, plan or store is only meaningful with the context it
 * was made from: functions taking both check that they match. Strings and
 * arrays passed in are copied; the library keeps no pointer into caller
 * memory after a call returns. Strings returned (sg_last_error,
 * sg_version, sg_type_name) are owned by the library.
 *
 * Threads. Handles share no state with each other and may be used from
 * any thread. Calls that take a handle as `const` only read it and may run
 * concurrently on it; a call that takes a handle non-const must not run
 * concurrently with any other call on that handle. sg_execute takes the
 * executor `const`: runs on one executor are serialised inside it, so one
 * executor may serve several threads (each with its own store). The last
 * error message is per thread.
 *
 * Shapes and types. Tensors have 1 to 4 dimensions in ggml order: ne[0] is
 * the innermost (contiguous) extent, nb[i] byte strides. Type ids are
 * ggml's `enum ggml_type` numbers (SG_TYPE_* below); a block-quantized
 * type's ne[0] is a multiple of its block size (32 or 256). The ops have
 * ggml's semantics, checked against ggml 0.15.3: mul_mat(a, b) with weights
 * a = [K, M] and activations b = [K, N] is [M, N]; results of ops are F32
 * unless stated.
 *
 * Tensor handles. An sg_tensor is a 64-bit value naming a tensor of one
 * context (the context's id in the high 32 bits, the tensor's index in
 * creation order in the low 32 bits). SG_TENSOR_NONE (0) is "no tensor"
 * for optional operands (masks, frequency factors).
 *
 * OPS COVERED (one function each; the Rust constructor of the same name in
 * shardgraph::Context documents its shapes and errors):
 *   element-wise: add, sub, mul, div, add1, scale, scale_bias, clamp,
 *     sqr, sqrt, fill, abs, neg, tanh, relu, sigmoid, gelu, gelu_quick,
 *     silu, exp, softplus, unary (by SG_UNARY_* id), glu, glu_split,
 *     swiglu, swiglu_split, geglu, geglu_split;
 *   matrix: mul_mat, mul_mat_id, add_id;
 *   normalisation and softmax: rms_norm, norm, l2_norm, soft_max,
 *     soft_max_ext, soft_max_add_sinks;
 *   rope: rope_ext, rope_multi;
 *   attention: flash_attn_ext, flash_attn_ext_add_sinks;
 *   reductions: sum, sum_rows, mean, argmax, top_k, argsort;
 *   data: get_rows, set_rows, cpy, cast, dup, cont, cont_1d..cont_4d,
 *     reshape (like another tensor), reshape_1d..reshape_4d,
 *     view_1d..view_4d, permute, transpose, concat, repeat, repeat_4d, pad;
 *   recurrent: ssm_conv, gated_delta_net.
 * Not exposed: rope (use rope_ext), pad_ext.
 */
#ifndef SHARDGRAPH_H
#define SHARDGRAPH_H

#include <stddef.h>
#include <stdint.h>

/** The version this header describes; sg_version() returns the library's. */
#define SG_VERSION "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================= */
/* Status                                                                  */
/* ======================================================================= */

/**
 * Status of every call. The numbers are part of the ABI (new codes are only
 * appended). One code per family of shardgraph::Error, plus the C-side
 * failures.
 */
typedef enum sg_status {
    SG_OK = 0,                  /**< success */
    SG_ERR_INVALID_ARGUMENT = 1,/**< NULL pointer, bad count, bad enum value, non-UTF-8 string, mismatched handles */
    SG_ERR_INVALID_OPERAND = 2, /**< an op rejected its operands (names the op, operand and shapes) */
    SG_ERR_FOREIGN_TENSOR = 3,  /**< a tensor of another context, or an index the context does not have */
    SG_ERR_SHAPE = 4,           /**< a shape that is not valid for a tensor (n_dims, negative or oversized extents, partial blocks) */
    SG_ERR_UNSUPPORTED = 5,     /**< a ggml type or op this library does not implement */
    SG_ERR_OUT_OF_BOUNDS = 6,   /**< a view or byte range outside its storage */
    SG_ERR_NO_STORAGE = 7,      /**< data access to a tensor that has no storage */
    SG_ERR_DATA_MISMATCH = 8,   /**< data of the wrong length or type for a tensor */
    SG_ERR_ALLOC = 9,           /**< an allocation a backend cannot satisfy */
    SG_ERR_GRAPH = 10,          /**< a graph that cannot be built (no outputs, ...) */
    SG_ERR_SPLIT = 11,          /**< a split rule, ratio, plan or placement that cannot be honoured; a device name that cannot be opened */
    SG_ERR_GGUF = 12,           /**< a GGUF file that cannot be read (names the file and key or tensor) */
    SG_ERR_MODEL = 13,          /**< a model or generation that cannot be built or run as asked */
    SG_ERR_BACKEND = 14,        /**< the CUDA or HIP backend failed (library, device, kernel, launch) */
    SG_ERR_OUT_OF_MEMORY = 15,  /**< a device lacks the memory asked for (names the device and bytes) */
    SG_ERR_COMPUTE = 16,        /**< a backend failed during compute */
    SG_ERR_PANIC = 17           /**< an internal panic, contained; free the handles the call was given */
} sg_status;

/**
 * The message of the last failed call on this thread ("" before the first
 * failure), e.g. "sg_mul_mat: mul_mat: invalid src1: ...". Never NULL.
 * Owned by the library; valid until the next failing call on this thread.
 */
const char *sg_last_error(void);

/** The library version ("0.1.0"), a static string. */
const char *sg_version(void);

/**
 * The cargo features the library was built with, a static comma-separated
 * list of "cuda", "hip" and "cuda-emu" ("" for CPU devices only): which
 * device names sg_devices_open can open (CUDA<i>; HIP<i>; EMU and EMUHIP).
 */
const char *sg_build_features(void);

/* ======================================================================= */
/* Handles and enums                                                       */
/* ======================================================================= */

typedef struct sg_context sg_context;   /**< tensors and op nodes (a ggml_context, no_alloc) */
typedef struct sg_graph sg_graph;       /**< a built graph of one context */
typedef struct sg_devices sg_devices;   /**< N devices with tensor-split ratios */
typedef struct sg_policy sg_policy;     /**< split rules for leaf tensors, by name */
typedef struct sg_plan sg_plan;         /**< a graph planned for N devices */
typedef struct sg_store sg_store;       /**< split weights, caches and inputs on the devices */
typedef struct sg_executor sg_executor; /**< runs plans on the devices */
typedef struct sg_report sg_report;     /**< the outputs and counters of one run */
typedef struct sg_engine sg_engine;     /**< a loaded target model and drafter */

/** A tensor of a context (see "Tensor handles" above). */
typedef uint64_t sg_tensor;
/** No tensor, for optional operands. */
#define SG_TENSOR_NONE ((sg_tensor)0)

/** ggml's `enum ggml_type` ids this library implements. */
enum sg_type {
    SG_TYPE_F32 = 0,
    SG_TYPE_F16 = 1,
    SG_TYPE_Q4_0 = 2,
    SG_TYPE_Q4_1 = 3,
    SG_TYPE_Q5_0 = 6,
    SG_TYPE_Q5_1 = 7,
    SG_TYPE_Q8_0 = 8,
    SG_TYPE_Q8_1 = 9,
    SG_TYPE_Q2_K = 10,
    SG_TYPE_Q3_K = 11,
    SG_TYPE_Q4_K = 12,
    SG_TYPE_Q5_K = 13,
    SG_TYPE_Q6_K = 14,
    SG_TYPE_Q8_K = 15,
    SG_TYPE_IQ2_XXS = 16,
    SG_TYPE_IQ2_XS = 17,
    SG_TYPE_IQ3_XXS = 18,
    SG_TYPE_IQ1_S = 19,
    SG_TYPE_IQ4_NL = 20,
    SG_TYPE_IQ3_S = 21,
    SG_TYPE_IQ2_S = 22,
    SG_TYPE_IQ4_XS = 23,
    SG_TYPE_I8 = 24,
    SG_TYPE_I16 = 25,
    SG_TYPE_I32 = 26,
    SG_TYPE_I64 = 27,
    SG_TYPE_F64 = 28,
    SG_TYPE_IQ1_M = 29,
    SG_TYPE_BF16 = 30,
    SG_TYPE_TQ1_0 = 34,
    SG_TYPE_TQ2_0 = 35,
    SG_TYPE_MXFP4 = 39,
    SG_TYPE_NVFP4 = 40,
    SG_TYPE_Q1_0 = 41,
    SG_TYPE_Q2_0 = 42,
    /** ggml 0.25.3's GGML_TYPE_COUNT: ids outside 0..SG_TYPE_COUNT-1 are
     *  SG_ERR_INVALID_ARGUMENT; ggml ids not listed above SG_ERR_UNSUPPORTED. */
    SG_TYPE_COUNT = 43
};

/** ggml's `enum ggml_unary_op` ids accepted by sg_unary. */
enum sg_unary_op {
    SG_UNARY_ABS = 0,
    SG_UNARY_NEG = 2,
    SG_UNARY_TANH = 4,
    SG_UNARY_RELU = 6,
    SG_UNARY_SIGMOID = 7,
    SG_UNARY_GELU = 8,       /**< tanh approximation */
    SG_UNARY_GELU_QUICK = 9,
    SG_UNARY_SILU = 10,
    SG_UNARY_EXP = 13,
    SG_UNARY_SOFTPLUS = 15
};

/** ggml's `enum ggml_glu_op` ids accepted by sg_glu / sg_glu_split. */
enum sg_glu_op {
    SG_GLU_GEGLU = 1,  /**< gelu(gate) * up */
    SG_GLU_SWIGLU = 2  /**< silu(gate) * up */
};

/** ggml's `enum ggml_sort_order` (sg_argsort). */
enum sg_sort_order {
    SG_SORT_ASC = 0,
    SG_SORT_DESC = 1
};

/** ggml's rope modes (sg_rope_params.mode). */
enum sg_rope_mode {
    SG_ROPE_NORMAL = 0, /**< adjacent pairs */
    SG_ROPE_NEOX = 2,   /**< halves */
    SG_ROPE_MROPE = 8,  /**< multi-section (sg_rope_multi) */
    SG_ROPE_IMROPE = 40 /**< interleaved multi-section (sg_rope_multi) */
};

/* ======================================================================= */
/* Types                                                                   */
/* ======================================================================= */

/** ggml's name of type `type` ("q8_0") in *name (a static string).
 *  Errors: SG_ERR_INVALID_ARGUMENT, SG_ERR_UNSUPPORTED (bad type id). */
sg_status sg_type_name(int32_t type, const char **name);

/** Bytes of a row of ne0 elements of `type` (ggml_row_size) in *bytes.
 *  Errors: type id errors; SG_ERR_SHAPE if ne0 is negative or not whole blocks. */
sg_status sg_row_size(int32_t type, int64_t ne0, size_t *bytes);

/**
 * Converts nrows rows of n_per_row F32 values (src, nrows*n_per_row floats)
 * to `type` into dst (dst_size bytes, exactly nrows * sg_row_size(type,
 * n_per_row)), as ggml_quantize_chunk does with ggml's reference
 * quantizers (F16, BF16 and F32 too).
 * Errors: type id errors; SG_ERR_UNSUPPORTED for integer types;
 * SG_ERR_DATA_MISMATCH for a wrong dst_size or partial blocks.
 */
sg_status sg_quantize(int32_t type, const float *src, int64_t nrows, int64_t n_per_row, void *dst, size_t dst_size);

/* ======================================================================= */
/* Contexts and tensors                                                    */
/* ======================================================================= */

/** A new empty context in *ctx; free with sg_context_free. */
sg_status sg_context_new(sg_context **ctx);

/** Frees a context (NULL: nothing). */
sg_status sg_context_free(sg_context *ctx);

/** The number of tensors created in ctx, in *n. */
sg_status sg_context_n_tensors(const sg_context *ctx, size_t *n);

/**
 * A new leaf tensor (weight, cache or input; ggml_new_tensor) of ggml type
 * `type` with n_dims (1..4) extents ne[0..n_dims-1] (ggml order; missing
 * dims are 1), named `name` (NULL: unnamed; names are what split rules
 * match), in *t. Strides are contiguous.
 * Errors: SG_ERR_INVALID_ARGUMENT (n_dims outside 1..4, NULL ne, type id
 * outside 0..SG_TYPE_COUNT-1, non-UTF-8 name); SG_ERR_UNSUPPORTED (a ggml
 * type not implemented); SG_ERR_SHAPE (negative extents, over 2^48
 * elements, ne[0] not whole blocks).
 */
sg_status sg_new_tensor(sg_context *ctx, int32_t type, int32_t n_dims, const int64_t *ne, const char *name, sg_tensor *t);

/** Sets t's name (ggml_set_name). Errors: argument errors, SG_ERR_FOREIGN_TENSOR. */
sg_status sg_set_name(sg_context *ctx, sg_tensor t, const char *name);

/** Marks t as a graph input, written before each run (ggml_set_input).
 *  An input no split rule covers is mirrored on every device. */
sg_status sg_set_input(sg_context *ctx, sg_tensor t);

/** Marks t as a graph output (ggml_set_output). */
sg_status sg_set_output(sg_context *ctx, sg_tensor t);

/** t's extents into ne[4] (ggml order). */
sg_status sg_tensor_ne(const sg_context *ctx, sg_tensor t, int64_t ne[4]);

/** t's byte strides into nb[4] (ggml's nb; nb[1] is the row stride views need). */
sg_status sg_tensor_nb(const sg_context *ctx, sg_tensor t, size_t nb[4]);

/** t's ggml type id into *type. */
sg_status sg_tensor_type(const sg_context *ctx, sg_tensor t, int32_t *type);

/** Bytes t spans in its storage (ggml_nbytes) into *bytes. */
sg_status sg_tensor_nbytes(const sg_context *ctx, sg_tensor t, size_t *bytes);

/**
 * t's name into buf, snprintf-like: at most buf_len-1 bytes and a NUL
 * (nothing when buf_len is 0; buf may then be NULL); *needed (if not NULL)
 * gets the bytes the whole name needs, NUL included.
 */
sg_status sg_tensor_name(const sg_context *ctx, sg_tensor t, char *buf, size_t buf_len, size_t *needed);

/** The first tensor named `name` in *t. Errors: SG_ERR_INVALID_ARGUMENT if none is. */
sg_status sg_find_tensor(sg_context *ctx, const char *name, sg_tensor *t);

/* ======================================================================= */
/* Ops                                                                     */
/*                                                                         */
/* Each adds one node to ctx and writes its handle to *out. Errors, unless */
/* stated: SG_ERR_INVALID_ARGUMENT (NULL ctx/out, SG_TENSOR_NONE where a   */
/* tensor is needed, bad enum values), SG_ERR_FOREIGN_TENSOR (a tensor of  */
/* another context), SG_ERR_INVALID_OPERAND (shapes or types the op does   */
/* not take: the message names the op, the operand and the shapes),       */
/* SG_ERR_OUT_OF_BOUNDS (views outside their source).                      */
/* ======================================================================= */

/* --- element-wise ------------------------------------------------------ */

/** a + b, b broadcast over a (ggml_add): b's dims divide a's; result a's shape and type. */
sg_status sg_add(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** a - b, broadcast as sg_add (ggml_sub). */
sg_status sg_sub(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** a * b element-wise, broadcast as sg_add (ggml_mul). */
sg_status sg_mul(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** a / b element-wise, broadcast as sg_add (ggml_div). */
sg_status sg_div(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** a + b[0] with b a one-element tensor (ggml_add1). */
sg_status sg_add1(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** a * s (ggml_scale). */
sg_status sg_scale(sg_context *ctx, sg_tensor a, float s, sg_tensor *out);
/** a * s + b (ggml_scale_bias). */
sg_status sg_scale_bias(sg_context *ctx, sg_tensor a, float s, float b, sg_tensor *out);
/** min(max(a, min), max) (ggml_clamp). */
sg_status sg_clamp(sg_context *ctx, sg_tensor a, float min, float max, sg_tensor *out);
/** A tensor of a's type and shape filled with c (ggml_fill; a F32/F16, contiguous, not read). */
sg_status sg_fill(sg_context *ctx, sg_tensor a, float c, sg_tensor *out);
/** a^2 (ggml_sqr). */
sg_status sg_sqr(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** sqrt(a) (ggml_sqrt). */
sg_status sg_sqrt(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** |a| (ggml_abs). */
sg_status sg_abs(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** -a (ggml_neg). */
sg_status sg_neg(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** tanh(a) (ggml_tanh). */
sg_status sg_tanh(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** max(a, 0) (ggml_relu). */
sg_status sg_relu(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** 1 / (1 + e^-a) (ggml_sigmoid). */
sg_status sg_sigmoid(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** GELU, tanh approximation (ggml_gelu). */
sg_status sg_gelu(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** a * sigmoid(1.702 a) (ggml_gelu_quick). */
sg_status sg_gelu_quick(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** a * sigmoid(a) (ggml_silu). */
sg_status sg_silu(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** e^a (ggml_exp). */
sg_status sg_exp(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** log(1 + e^a) (ggml_softplus). */
sg_status sg_softplus(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** The unary op `unary` (an SG_UNARY_* id; ggml_unary). */
sg_status sg_unary(sg_context *ctx, sg_tensor a, int32_t unary, sg_tensor *out);
/**
 * Gated linear unit over a's halves (ggml_glu): a = [2n, ...] gives
 * [n, ...] = f(a[0:n]) * a[n:2n] (swapped != 0: f of the second half).
 * glu: SG_GLU_SWIGLU or SG_GLU_GEGLU.
 */
sg_status sg_glu(sg_context *ctx, sg_tensor a, int32_t glu, int32_t swapped, sg_tensor *out);
/** f(a) * b with a (gate) and b (up) of one shape (ggml_glu_split). */
sg_status sg_glu_split(sg_context *ctx, sg_tensor a, sg_tensor b, int32_t glu, sg_tensor *out);
/** sg_glu(a, SG_GLU_SWIGLU, 0) (ggml_swiglu). */
sg_status sg_swiglu(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** silu(a) * b (ggml_swiglu_split): the SwiGLU of an FFN's gate a and up b. */
sg_status sg_swiglu_split(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** sg_glu(a, SG_GLU_GEGLU, 0) (ggml_geglu). */
sg_status sg_geglu(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** gelu(a) * b (ggml_geglu_split). */
sg_status sg_geglu_split(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);

/* --- matrix products --------------------------------------------------- */

/**
 * a . b (ggml_mul_mat): weights a = [K, M, ne02, ne03] (F32, F16, BF16,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K), activations b = [K, N, ne12,
 * ne13] (F32); result F32 [M, N, ne12, ne13], a broadcast over dims 2, 3.
 * Errors: SG_ERR_INVALID_OPERAND for a.ne[0] != b.ne[0], dims that do not
 * broadcast, unsupported types.
 */
sg_status sg_mul_mat(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** Expert matrix product (ggml_mul_mat_id): as = [K, M, n_expert], b = [K, n_b, T],
 *  ids I32 [n_used, T] select experts; result [M, n_used, T]. */
sg_status sg_mul_mat_id(sg_context *ctx, sg_tensor experts, sg_tensor b, sg_tensor ids, sg_tensor *out);
/** a + b[:, ids] per expert (ggml_add_id): a = [ne0, n_used, T], b = [ne0, n_expert], ids I32 [n_used, T]. */
sg_status sg_add_id(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor ids, sg_tensor *out);

/* --- normalisation and softmax ----------------------------------------- */

/** x / sqrt(mean(x^2) + eps) over each row (ggml_rms_norm); a F32, eps >= 0. */
sg_status sg_rms_norm(sg_context *ctx, sg_tensor a, float eps, sg_tensor *out);
/** (x - mean) / sqrt(var + eps) over each row, no affine parameters (ggml_norm); a F32. */
sg_status sg_norm(sg_context *ctx, sg_tensor a, float eps, sg_tensor *out);
/** x / max(||x||_2, eps) over each row (ggml_l2_norm); a F32. */
sg_status sg_l2_norm(sg_context *ctx, sg_tensor a, float eps, sg_tensor *out);
/** Softmax of each row (ggml_soft_max). */
sg_status sg_soft_max(sg_context *ctx, sg_tensor a, sg_tensor *out);
/**
 * softmax(a * scale + slope * mask) per row (ggml_soft_max_ext): mask
 * (SG_TENSOR_NONE: none) F16 or F32 [ne0, >= ne1, ...]; max_bias > 0
 * enables ALiBi slopes.
 */
sg_status sg_soft_max_ext(sg_context *ctx, sg_tensor a, sg_tensor mask, float scale, float max_bias, sg_tensor *out);
/** Attention sinks on a soft_max_ext node a (ggml_soft_max_add_sinks): sinks F32 [n_head]. */
sg_status sg_soft_max_add_sinks(sg_context *ctx, sg_tensor a, sg_tensor sinks, sg_tensor *out);

/* --- rope -------------------------------------------------------------- */

/** Parameters of sg_rope_ext / sg_rope_multi (ggml's rope op_params). */
typedef struct sg_rope_params {
    int32_t n_dims;      /**< rotated dims from the start of each row (even, <= head size) */
    int32_t mode;        /**< SG_ROPE_NORMAL / SG_ROPE_NEOX (rope_ext), SG_ROPE_MROPE / SG_ROPE_IMROPE (rope_multi) */
    int32_t n_ctx_orig;  /**< original training context (YaRN) */
    float freq_base;     /**< theta base (10000) */
    float freq_scale;    /**< position scale (1) */
    float ext_factor;    /**< YaRN extrapolation mix (0: off) */
    float attn_factor;   /**< magnitude scale (1) */
    float beta_fast;     /**< YaRN beta_fast (32) */
    float beta_slow;     /**< YaRN beta_slow (1) */
    int32_t sections[4]; /**< multi-section sizes (rope_multi only) */
} sg_rope_params;

/** ggml's defaults into *p (mode SG_ROPE_NORMAL, n_dims 0: set it). */
sg_status sg_rope_params_default(sg_rope_params *p);
/**
 * Rotary embedding (ggml_rope_ext): a F32/F16 [head_dim, n_head, n_tokens,
 * ne3], pos I32 [n_tokens], freq_factors F32 [>= n_dims/2] or
 * SG_TENSOR_NONE; mode NORMAL or NEOX. Result a's shape and type.
 */
sg_status sg_rope_ext(sg_context *ctx, sg_tensor a, sg_tensor pos, sg_tensor freq_factors, const sg_rope_params *params, sg_tensor *out);
/** Multi-section rope (ggml_rope_multi): pos I32 [4 * n_tokens]; mode MROPE or IMROPE. */
sg_status sg_rope_multi(sg_context *ctx, sg_tensor a, sg_tensor pos, sg_tensor freq_factors, const sg_rope_params *params, sg_tensor *out);

/* --- attention --------------------------------------------------------- */

/**
 * Fused attention (ggml_flash_attn_ext): q F32 [D, n_q, H, B], k [D, n_kv,
 * H_kv, B], v [D_v, n_kv, H_v, B] (F32, F16, BF16 or block types; H_kv and
 * H_v divide H), mask F16 [>= n_kv, >= n_q, ...] or SG_TENSOR_NONE;
 * result F32 [D_v, H, n_q, B] (ggml's permuted layout).
 */
sg_status sg_flash_attn_ext(sg_context *ctx, sg_tensor q, sg_tensor k, sg_tensor v, sg_tensor mask, float scale, float max_bias, float logit_softcap, sg_tensor *out);
/** A flash_attn_ext node a with per-head sink logits sinks F32 [H] (ggml_flash_attn_ext_add_sinks);
 *  a must have a mask. Returns a new node to use instead of a. */
sg_status sg_flash_attn_ext_add_sinks(sg_context *ctx, sg_tensor a, sg_tensor sinks, sg_tensor *out);

/* --- reductions -------------------------------------------------------- */

/** The sum of all elements, [1, 1, 1, 1] of a's type (ggml_sum; F32, F16, BF16). */
sg_status sg_sum(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** The sum of each row, [1, ne1, ne2, ne3] (ggml_sum_rows; a F32). */
sg_status sg_sum_rows(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** The mean of each row, [1, ne1, ne2, ne3] (ggml_mean; a F32). */
sg_status sg_mean(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** The index of each row's maximum (the last one on ties, as ggml), I32 [ne1] (ggml_argmax; a F32 [ne0, ne1]). */
sg_status sg_argmax(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** The indices of each row's k largest values, I32 [k, ne1, ne2, ne3], descending by value (ggml_top_k; a F32, 0 <= k <= ne0). */
sg_status sg_top_k(sg_context *ctx, sg_tensor a, int32_t k, sg_tensor *out);
/** The indices that sort each row (stable), I32 of a's shape (ggml_argsort; a F32); order SG_SORT_ASC or SG_SORT_DESC. */
sg_status sg_argsort(sg_context *ctx, sg_tensor a, int32_t order, sg_tensor *out);

/* --- data movement and views ------------------------------------------- */

/** Rows b (I32 [n, ne2, ne3]) of a [ne0, n_rows, ne2, ne3] (ggml_get_rows); result F32 (I32 for an I32 a). */
sg_status sg_get_rows(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** a[:, c[i]] = b[:, i] (ggml_set_rows): writes rows of F32 b into a at I64/I32 indices c; result a view of a. */
sg_status sg_set_rows(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor c, sg_tensor *out);
/** a copied (and converted) into b's storage (ggml_cpy); result a view of b. */
sg_status sg_cpy(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** a converted to `type` (ggml_cast). */
sg_status sg_cast(sg_context *ctx, sg_tensor a, int32_t type, sg_tensor *out);
/** A contiguous copy of a (ggml_dup). */
sg_status sg_dup(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** A contiguous copy of a (ggml_cont). */
sg_status sg_cont(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** ggml_cont_1d. */
sg_status sg_cont_1d(sg_context *ctx, sg_tensor a, int64_t ne0, sg_tensor *out);
/** ggml_cont_2d. */
sg_status sg_cont_2d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, sg_tensor *out);
/** ggml_cont_3d. */
sg_status sg_cont_3d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, int64_t ne2, sg_tensor *out);
/** ggml_cont_4d. */
sg_status sg_cont_4d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, sg_tensor *out);
/** Contiguous a reshaped to like's shape (ggml_reshape); a view. */
sg_status sg_reshape(sg_context *ctx, sg_tensor a, sg_tensor like, sg_tensor *out);
/** ggml_reshape_1d: contiguous a, same element count; a view. */
sg_status sg_reshape_1d(sg_context *ctx, sg_tensor a, int64_t ne0, sg_tensor *out);
/** ggml_reshape_2d. */
sg_status sg_reshape_2d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, sg_tensor *out);
/** ggml_reshape_3d. */
sg_status sg_reshape_3d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, int64_t ne2, sg_tensor *out);
/** ggml_reshape_4d. */
sg_status sg_reshape_4d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, sg_tensor *out);
/** ne0 elements of a from byte `offset` (ggml_view_1d). */
sg_status sg_view_1d(sg_context *ctx, sg_tensor a, int64_t ne0, size_t offset, sg_tensor *out);
/** [ne0, ne1] with row stride nb1 bytes from byte `offset` (ggml_view_2d). */
sg_status sg_view_2d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, size_t nb1, size_t offset, sg_tensor *out);
/** ggml_view_3d. */
sg_status sg_view_3d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2, size_t offset, sg_tensor *out);
/** ggml_view_4d. */
sg_status sg_view_4d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset, sg_tensor *out);
/** Source dim i goes to position axis_i (ggml_permute); a view. */
sg_status sg_permute(sg_context *ctx, sg_tensor a, int32_t axis0, int32_t axis1, int32_t axis2, int32_t axis3, sg_tensor *out);
/** Dims 0 and 1 swapped (ggml_transpose); a view. */
sg_status sg_transpose(sg_context *ctx, sg_tensor a, sg_tensor *out);
/** a and b joined along dim 0..3 (ggml_concat). */
sg_status sg_concat(sg_context *ctx, sg_tensor a, sg_tensor b, int32_t dim, sg_tensor *out);
/** a tiled to b's shape (ggml_repeat). */
sg_status sg_repeat(sg_context *ctx, sg_tensor a, sg_tensor b, sg_tensor *out);
/** a tiled to [ne0, ne1, ne2, ne3] (ggml_repeat_4d). */
sg_status sg_repeat_4d(sg_context *ctx, sg_tensor a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, sg_tensor *out);
/** p_i zeros appended along dim i (ggml_pad). */
sg_status sg_pad(sg_context *ctx, sg_tensor a, int32_t p0, int32_t p1, int32_t p2, int32_t p3, sg_tensor *out);

/* --- recurrent --------------------------------------------------------- */

/** Depthwise causal convolution (ggml_ssm_conv): sx F32 [d_conv-1+n_t, d_inner, n_s], c F32 [d_conv, d_inner]. */
sg_status sg_ssm_conv(sg_context *ctx, sg_tensor sx, sg_tensor c, sg_tensor *out);
/** Gated DeltaNet (ggml_gated_delta_net): q, k [S, H_qk, T, B], v [S, H, T, B], g, beta [1, H, T, B],
 *  state [S, S, H, B]; result F32 [S*H, T*B + k_snapshots*S*B]. */
sg_status sg_gated_delta_net(sg_context *ctx, sg_tensor q, sg_tensor k, sg_tensor v, sg_tensor g, sg_tensor beta, sg_tensor state, int64_t k_snapshots, sg_tensor *out);

/* ======================================================================= */
/* Graphs                                                                  */
/* ======================================================================= */

/**
 * The graph computing outputs[0..n_outputs-1] (ggml_build_forward_expand)
 * in *graph; free with sg_graph_free. Adding tensors to ctx later does not
 * change the graph.
 * Errors: SG_ERR_GRAPH for no outputs; tensor handle errors.
 */
sg_status sg_graph_build(const sg_context *ctx, const sg_tensor *outputs, size_t n_outputs, sg_graph **graph);

/** Frees a graph (NULL: nothing). */
sg_status sg_graph_free(sg_graph *graph);

/** The graph's op nodes and leafs (weights, caches, inputs) counts. */
sg_status sg_graph_size(const sg_graph *graph, size_t *n_nodes, size_t *n_leafs);

/* ======================================================================= */
/* Devices                                                                 */
/* ======================================================================= */

/**
 * n CPU devices (1..64) with `threads` worker threads each, equal ratios,
 * in *devs; free with sg_devices_free.
 * Errors: SG_ERR_INVALID_ARGUMENT (n or threads < 1), SG_ERR_SPLIT (over
 * 64 devices or 1024 threads in all).
 */
sg_status sg_devices_cpu(int32_t n, int32_t threads, sg_devices **devs);

/**
 * The devices a comma-separated list names, one per rank (llama.cpp's
 * --device, case-insensitive): "CPU" (threads worker threads), "CUDA<i>"
 * (NVIDIA GPU i; a GPU named k times gives k virtual devices on it),
 * "HIP<i>" (AMD GPU i), "EMU"/"EMUHIP" (emulated GPUs, for tests), e.g.
 * "CUDA0,CUDA1". Equal ratios.
 * Errors: SG_ERR_SPLIT for an unknown name or one this build cannot open
 * (the message names the cargo feature: cuda, hip, cuda-emu);
 * SG_ERR_BACKEND when a GPU or its driver is missing.
 */
sg_status sg_devices_open(const char *names, int32_t threads, sg_devices **devs);

/**
 * Tensor-split ratios, one per device (llama.cpp's --tensor-split): device
 * j holds ratios[j] / sum(ratios) of every split tensor. Non-negative, not
 * all zero. Policies, stores and executors made afterwards use them.
 * Errors: SG_ERR_SPLIT for n != device count or bad values.
 */
sg_status sg_devices_set_tensor_split(sg_devices *devs, const float *ratios, size_t n);

/** The number of devices in *n. */
sg_status sg_devices_count(const sg_devices *devs, size_t *n);

/** Device `index`'s name ("CPU0", "CUDA0.1", ...) into buf, snprintf-like (see sg_tensor_name). */
sg_status sg_devices_name(const sg_devices *devs, size_t index, char *buf, size_t buf_len, size_t *needed);

/** Frees the devices (NULL: nothing); executors, stores and engines made from them keep what they need. */
sg_status sg_devices_free(sg_devices *devs);

/* ======================================================================= */
/* Split policy (llama.cpp's --split-mode tensor rules)                    */
/* ======================================================================= */

/** A policy over devs with their ratios and no rules, in *pol; free with sg_policy_free. */
sg_status sg_policy_new(const sg_devices *devs, sg_policy **pol);

/**
 * Leafs whose name matches `pattern` (`*` matches any run of characters,
 * dots included, e.g. "blk.*.ffn_up.weight") are split along `axis`
 * (0..3, ggml order: axis 1 splits the rows of a weight [K, M], i.e. its
 * outputs; axis 0 its inputs) with boundaries on multiples of `granule`
 * elements (a head's size for attention weights; a multiple of the block
 * size on axis 0 of a quantized tensor). Rules are tried in the order
 * added. A rule that cannot be honoured for a tensor fails sg_plan_new with
 * SG_ERR_SPLIT naming the tensor and the rule.
 * Errors: SG_ERR_INVALID_ARGUMENT (axis outside 0..3, granule < 1).
 */
sg_status sg_policy_rule_axis(sg_policy *pol, const char *pattern, int32_t axis, int64_t granule);

/**
 * As sg_policy_rule_axis for a fused tensor whose axis is n_segments parts
 * of the given lengths (gate|up, Q|K|V), each split on its own by the
 * ratios. The lengths must sum to the axis length (checked at sg_plan_new).
 */
sg_status sg_policy_rule_segments(sg_policy *pol, const char *pattern, int32_t axis, int64_t granule, const int64_t *segments, size_t n_segments);

/** Leafs whose name matches `pattern` are whole on every device (norm weights, small tensors). */
sg_status sg_policy_rule_mirrored(sg_policy *pol, const char *pattern);

/**
 * Memory first (keep non-zero): a weight the policy splits (a leaf it gives
 * a split state that is not a graph input) stays split; the planner picks
 * the strategies that read it where it lies (partial sums) even where the
 * cost model prices a gather cheaper, and converts it only for an op with no
 * such strategy. Off by default (the cost model decides).
 */
sg_status sg_policy_keep_weights_split(sg_policy *pol, int32_t keep);

/** Frees a policy (NULL: nothing). */
sg_status sg_policy_free(sg_policy *pol);

/* ======================================================================= */
/* Plans                                                                   */
/* ======================================================================= */

/**
 * Plans graph (of ctx) for pol's devices in *plan: a split state for every
 * tensor (leafs from the rules; inputs no rule covers mirrored) and the
 * cheapest repartitions (all-gather, all-reduce, reduce-scatter, ...)
 * where states disagree. Free with sg_plan_free.
 * Errors: SG_ERR_INVALID_ARGUMENT (graph of another context);
 * SG_ERR_SPLIT (a leaf that is not an input and no rule covers; a rule
 * that does not fit its tensor; the message names both).
 */
sg_status sg_plan_new(const sg_context *ctx, const sg_graph *graph, const sg_policy *pol, sg_plan **plan);

/**
 * The plan's text report (every tensor with its state and per-device
 * extents, every repartition with its bytes, memory per device, bytes per
 * run) into buf, snprintf-like: at most buf_len-1 bytes and a NUL;
 * *needed (if not NULL) always gets the length the whole report needs,
 * NUL included (call with buf_len 0 and buf NULL to ask).
 */
sg_status sg_plan_describe(const sg_plan *plan, const sg_context *ctx, const sg_graph *graph, char *buf, size_t buf_len, size_t *needed);

/** Bytes all devices together receive per run of the plan, in *bytes. */
sg_status sg_plan_bytes_moved(const sg_plan *plan, uint64_t *bytes);

/** The number of repartitions (collectives and row combines) in the plan. */
sg_status sg_plan_n_repartitions(const sg_plan *plan, size_t *n);

/** Frees a plan (NULL: nothing). */
sg_status sg_plan_free(sg_plan *plan);

/* ======================================================================= */
/* Store: split tensors on the devices                                     */
/*                                                                         */
/* Values are read and written in single-device (ggml) layout: the store   */
/* splits and assembles. Errors of the data calls: SG_ERR_SPLIT if the     */
/* tensor is not placed; SG_ERR_INVALID_ARGUMENT for a count other than    */
/* the tensor's element count; SG_ERR_UNSUPPORTED for the wrong typed call */
/* (f32 on an I32 tensor, i32 on a non-I32 one).                           */
/* ======================================================================= */

/** An empty store for devs in *store; free with sg_store_free. */
sg_status sg_store_new(const sg_devices *devs, sg_store **store);

/** Places every leaf of graph in its planned state, zero-filled (memory as the plan sizes it). */
sg_status sg_store_place_leafs(sg_store *store, const sg_context *ctx, const sg_graph *graph, const sg_plan *plan);

/**
 * Writes all n elements of t from F32 values in ggml order (ne[0]
 * fastest), converted to t's type: F16/BF16 rounded, block types quantized
 * with ggml's reference quantizers, exactly as one device would hold them.
 * Errors: SG_ERR_FOREIGN_TENSOR when the store was placed from another
 * context (as for every sg_store_* call taking a tensor).
 */
sg_status sg_store_set_f32(sg_store *store, const sg_context *ctx, sg_tensor t, const float *values, size_t n);

/** Reads all n elements of t as F32 (assembled from the devices, dequantized). */
sg_status sg_store_get_f32(const sg_store *store, const sg_context *ctx, sg_tensor t, float *out, size_t n);

/** Writes all n elements of I32 tensor t (token ids, positions, row indices). */
sg_status sg_store_set_i32(sg_store *store, const sg_context *ctx, sg_tensor t, const int32_t *values, size_t n);

/** Reads all n elements of I32 tensor t. */
sg_status sg_store_get_i32(const sg_store *store, const sg_context *ctx, sg_tensor t, int32_t *out, size_t n);

/** Writes `size` raw bytes at byte `offset` of t's single-device memory (ggml_backend_tensor_set).
 *  Errors: SG_ERR_SPLIT for a range outside the tensor. */
sg_status sg_store_set_bytes(sg_store *store, const sg_context *ctx, sg_tensor t, size_t offset, const void *data, size_t size);

/** Reads `size` raw bytes at byte `offset` of t's single-device memory (ggml_backend_tensor_get). */
sg_status sg_store_get_bytes(const sg_store *store, const sg_context *ctx, sg_tensor t, size_t offset, void *out, size_t size);

/** Frees a store and the device memory it holds (NULL: nothing). */
sg_status sg_store_free(sg_store *store);

/* ======================================================================= */
/* Execution                                                               */
/* ======================================================================= */

/** An executor over devs in *exec; free with sg_executor_free. */
sg_status sg_executor_new(const sg_devices *devs, sg_executor **exec);

/** Frees an executor (NULL: nothing). */
sg_status sg_executor_free(sg_executor *exec);

/**
 * Runs plan for graph on the executor's devices, reading leafs from store
 * (leafs not placed are placed zero-filled) and writing what the graph
 * writes (caches through set_rows/cpy) in place, and returns the full
 * values of outputs[0..n_outputs-1] in *report (free with
 * sg_report_free). The first run of a plan compiles it; later runs reuse
 * the program. The result equals one device's run of the graph.
 * Errors: SG_ERR_SPLIT (plan, store and executor disagree on the device
 * count; a plan of another graph; a device's computation or exchange
 * failed, naming the device and node), SG_ERR_COMPUTE, SG_ERR_BACKEND,
 * SG_ERR_OUT_OF_MEMORY.
 */
sg_status sg_execute(const sg_executor *exec, const sg_context *ctx, const sg_graph *graph, const sg_plan *plan, sg_store *store, const sg_tensor *outputs, size_t n_outputs, sg_report **report);

/** The number of outputs in the report. */
sg_status sg_report_n_outputs(const sg_report *report, size_t *n);

/** Output k (an F32 tensor of exactly n elements) into out, ggml order.
 *  Errors: SG_ERR_INVALID_ARGUMENT for k out of range, another type or count. */
sg_status sg_report_output_f32(const sg_report *report, size_t k, float *out, size_t n);

/** Output k (an I32 tensor of exactly n elements) into out. */
sg_status sg_report_output_i32(const sg_report *report, size_t k, int32_t *out, size_t n);

/** Output k's contiguous bytes (any type) into out (size must equal its
 *  byte size); *needed (if not NULL) gets it. out NULL with size 0 only asks. */
sg_status sg_report_output_bytes(const sg_report *report, size_t k, void *out, size_t size, size_t *needed);

/** Bytes the devices received during the run (equals sg_plan_bytes_moved for ordinary graphs). */
sg_status sg_report_bytes_moved(const sg_report *report, uint64_t *bytes);

/** Frees a report (NULL: nothing). */
sg_status sg_report_free(sg_report *report);

/* ======================================================================= */
/* The speculative-decoding engine                                         */
/* ======================================================================= */

/** Drafter kinds of sg_engine_load. */
enum sg_draft_kind {
    SG_DRAFT_NONE = 0, /**< plain decoding (draft_path NULL) */
    SG_DRAFT_GGUF = 1, /**< a DFlash/DFlash2 drafter GGUF at draft_path (llama.cpp's --model-draft) */
    SG_DRAFT_MTP = 2   /**< a qwen35 target's own MTP (NextN) layer (--spec-type draft-mtp; draft_path NULL) */
};

/** How an engine is loaded (llama.cpp's options in brackets). */
typedef struct sg_engine_params {
    int64_t ctx_size;     /**< KV cells usable for prompts and generated tokens (--ctx-size; 4096) */
    int32_t cache_type_k; /**< K cache type id (--cache-type-k): llama.cpp's cache types the core has: SG_TYPE_F16 (default), F32, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (IQ4_NL once the core has it) */
    int32_t cache_type_v; /**< V cache type id (--cache-type-v), of the same list; may differ from K's (SG_TYPE_F16) */
    int32_t n_max;        /**< most drafts per step (--spec-draft-n-max); 0: the drafter's default */
    int32_t n_min;        /**< shorter drafts are discarded (--spec-draft-n-min; 0) */
    float p_min;          /**< drafts below this drafter probability are cut (--spec-draft-p-min; 0..1, 0) */
} sg_engine_params;

/** Sampling options (llama.cpp's --temp, --top-k, --top-p, --min-p, --seed). */
typedef struct sg_sampler_params {
    float temp;    /**< <= 0: greedy (default 0) */
    int32_t top_k; /**< 0: off (40) */
    float top_p;   /**< (0, 1]; 1: off (0.95) */
    float min_p;   /**< [0, 1]; 0: off (0.05) */
    uint64_t seed; /**< the generator's seed (0xFFFFFFFF) */
} sg_sampler_params;

/** Counts of one generation. */
typedef struct sg_spec_stats {
    uint64_t drafted;      /**< tokens the drafter proposed */
    uint64_t accepted;     /**< drafts the target accepted */
    uint64_t target_steps; /**< target decode calls after the prompt */
} sg_spec_stats;

/** The defaults into *p. */
sg_status sg_engine_params_default(sg_engine_params *p);

/** The defaults (greedy) into *p. */
sg_status sg_sampler_params_default(sg_sampler_params *p);

/**
 * Loads the target GGUF model_path (qwen3 or qwen35, by its
 * general.architecture) and its drafter onto devs, split by llama.cpp's
 * --split-mode tensor policy at the devices' ratios, every cache of
 * params->ctx_size cells plus the drafter's block (params NULL: defaults),
 * in *engine; free with sg_engine_free. Files, hyper-parameters, tensors
 * and each device's memory are checked before anything is allocated.
 * CPU devices compute on the files' mapped pages (not copied), so the
 * files must not be truncated or rewritten in place while the engine lives
 * (as with llama.cpp's mmap: a truncated file faults, SIGBUS); replacing
 * one by a rename is safe.
 * Errors: SG_ERR_INVALID_ARGUMENT (a bad draft_kind, draft_path missing
 * for SG_DRAFT_GGUF or given for another kind); SG_ERR_GGUF (a file
 * missing or malformed); SG_ERR_MODEL (an architecture other than
 * qwen3/qwen35, a drafter for another target, bad parameters);
 * SG_ERR_SPLIT; SG_ERR_OUT_OF_MEMORY.
 */
sg_status sg_engine_load(const sg_devices *devs, const char *model_path, int32_t draft_kind, const char *draft_path, const sg_engine_params *params, sg_engine **engine);

/**
 * Generates n_predict tokens after prompt[0..n_prompt-1] into out_tokens
 * (out_cap >= n_predict entries), *n_out the count written, *stats (if
 * not NULL) the draft counts; sampler NULL is greedy. Greedy output equals
 * plain greedy decoding token for token; sampled output has the target's
 * distribution. The sequence continues across calls until
 * sg_engine_reset: each prompt follows the tokens the previous call
 * generated (the engine feeds the last generated token to the model
 * itself; do not pass it again). It ends early after one of the file's
 * end-of-generation tokens (the last token written; *n_out < n_predict);
 * sg_engine_generate_ex takes stop tokens, a callback and logits.
 * Errors: SG_ERR_INVALID_ARGUMENT (out_cap < n_predict, negative top_k);
 * SG_ERR_MODEL (an empty prompt, a token outside the vocabulary, a prompt
 * and n_predict over the context, bad sampler values), device errors.
 */
sg_status sg_engine_generate(sg_engine *engine, const int32_t *prompt, size_t n_prompt, size_t n_predict, const sg_sampler_params *sampler, int32_t *out_tokens, size_t out_cap, size_t *n_out, sg_spec_stats *stats);

/**
 * Called with each generated token as it is accepted (the tokens of a
 * verified batch one by one, in the order returned, from the thread that
 * called sg_engine_generate_ex) and the options' user_data: return non-zero
 * to go on, 0 to end the generation after this token.
 */
typedef int32_t (*sg_token_callback)(int32_t token, void *user_data);

/** Options of sg_engine_generate_ex; all zero (NULL) is the default. */
typedef struct sg_generate_options {
    const int32_t *stop;          /**< tokens that end the generation, returned as its last token (NULL with n_stop 0: none) */
    size_t n_stop;                /**< entries at stop */
    int32_t ignore_eos;           /**< non-zero: do not stop at the file's end-of-generation tokens (--ignore-eos) */
    sg_token_callback on_token;   /**< NULL: none */
    void *user_data;              /**< passed to on_token as it is */
    float *out_logits;            /**< NULL, or logits_cap floats: each generated token's logits row [n_vocab], token after token */
    size_t logits_cap;            /**< floats at out_logits: at least n_predict * n_vocab when out_logits is given */
} sg_generate_options;

/** Why a generation ended (*end of sg_engine_generate_ex). */
enum sg_end {
    SG_END_LENGTH = 0, /**< n_predict tokens */
    SG_END_STOP = 1,   /**< at an end-of-generation token of the file or a stop token (the last token) */
    SG_END_CALLER = 2  /**< on_token returned 0 for the last token */
};

/**
 * sg_engine_generate with options: it also ends after a token of
 * opts->stop or of the file's end-of-generation tokens
 * (sg_engine_eog_tokens; unless opts->ignore_eos), calls opts->on_token
 * with every token as it is accepted, and writes each generated token's
 * logits row to opts->out_logits; *n_out is the tokens written (fewer than
 * n_predict when it ended early), *end (if not NULL) why it ended
 * (enum sg_end). opts NULL: the defaults (it still stops at the file's
 * end-of-generation tokens, as sg_engine_generate does). A generation
 * that ends early leaves the sequence at its last token.
 * Errors: as sg_engine_generate; SG_ERR_INVALID_ARGUMENT for logits_cap
 * below n_predict * n_vocab; SG_ERR_MODEL for a stop token outside the
 * vocabulary.
 */
sg_status sg_engine_generate_ex(sg_engine *engine, const int32_t *prompt, size_t n_prompt, size_t n_predict, const sg_sampler_params *sampler, const sg_generate_options *opts, int32_t *out_tokens, size_t out_cap, size_t *n_out, sg_spec_stats *stats, int32_t *end);

/**
 * Keeps the first n_past tokens of the sequence (llama_memory_seq_rm from
 * n_past on): the next sg_engine_generate continues after token n_past - 1.
 * A qwen3 target forgets its later cells; a qwen35 target's recurrent
 * states cannot be taken back to an arbitrary position, so it is started
 * afresh and the kept tokens are decoded again (a prefill), which gives
 * the states of a fresh run. n_past 0 is sg_engine_reset.
 * Errors: SG_ERR_MODEL for n_past outside 0..sg_engine_n_past; device errors.
 */
sg_status sg_engine_rollback(sg_engine *engine, int64_t n_past);

/**
 * The file's end-of-generation tokens (tokenizer.ggml.eos_token_id,
 * tokenizer.ggml.eot_token_id): up to cap of them into out (NULL with cap
 * 0: none), their count in *n.
 */
sg_status sg_engine_eog_tokens(const sg_engine *engine, int32_t *out, size_t cap, size_t *n);

/** Forgets the sequence (llama_memory_clear). */
sg_status sg_engine_reset(sg_engine *engine);

/** The target's vocabulary size in *n. */
sg_status sg_engine_n_vocab(const sg_engine *engine, int64_t *n);

/** Positions in use since the last reset, in *n. */
sg_status sg_engine_n_past(const sg_engine *engine, int64_t *n);

/** Cells usable for prompts and generated tokens (ctx_size), in *n. */
sg_status sg_engine_n_ctx(const sg_engine *engine, int64_t *n);

/** Bytes moved between devices by every run so far, in *bytes. */
sg_status sg_engine_bytes_moved(const sg_engine *engine, uint64_t *bytes);

/** Frees an engine and its device memory (NULL: nothing). */
sg_status sg_engine_free(sg_engine *engine);

#ifdef __cplusplus
}
#endif

#endif /* SHARDGRAPH_H */
