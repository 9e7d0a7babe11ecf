//! The nodes the GPU backends (CUDA and HIP, real or emulated) may compute
//! on the host, because no kernel covers their types: `cuda_diff` and
//! `hip_diff` fail on any other node that falls back, and on any entry here
//! that no case needs any more (a kernel now covers it).
//!
//! To shrink it when a kernel lands (`kernels-cuda/`,
//! `src/backend/cuda/ops/`): run
//! `cargo test --release --features cuda-emu,hip --test ggml_diff -- --nocapture`;
//! it names each entry to delete (`delete ("mul_mat", F32, IQ4_NL)`), one
//! line each here.

use shardgraph::GgmlType;

use GgmlType::*;

/// (ggml op name, the node's type, its first source's type) of the nodes
/// that may run on the host: `cpy` F32 → T is (`"cpy"`, T, F32), `mul_mat`
/// of T weights (`"mul_mat"`, F32, T), `set_rows` into T (`"set_rows"`, T,
/// F32).
pub const ALLOWED: &[(&str, GgmlType, GgmlType)] = &[
    // Quantizing into these types has no GPU kernel (the KV-cache types
    // Q8_0, Q4_0, Q4_1, Q5_0 have one): F32 → Q5_1 and the k-quants.
    ("cpy", Q2_K, F32),
    ("cpy", Q3_K, F32),
    ("cpy", Q4_K, F32),
    ("cpy", Q5_1, F32),
    ("cpy", Q5_K, F32),
    ("cpy", Q6_K, F32),
    ("set_rows", Q4_K, F32),
    // The weight types ggml 0.25.3 has beyond the classic and k-quant
    // families: their GPU kernels dequantize (get_rows, mul_mat, cpy to
    // F32/F16) but quantize only into IQ4_NL.
    ("cpy", IQ4_XS, F32),
    ("cpy", MXFP4, F32),
    ("cpy", NVFP4, F32),
    ("cpy", Q1_0, F32),
    ("cpy", Q2_0, F32),
    ("cpy", TQ1_0, F32),
    ("cpy", TQ2_0, F32),
    ("set_rows", IQ4_XS, F32),
    ("set_rows", MXFP4, F32),
    ("set_rows", NVFP4, F32),
    ("set_rows", Q1_0, F32),
    ("set_rows", Q2_0, F32),
    ("set_rows", TQ1_0, F32),
    ("set_rows", TQ2_0, F32),
];

/// The index into [`ALLOWED`] of node `op` of type `ty` whose first source
/// has type `src0`, or `None`: it may not run on the host.
pub fn allowed(op: &str, ty: GgmlType, src0: GgmlType) -> Option<usize> {
    ALLOWED.iter().position(|&(o, t, s)| o == op && t == ty && s == src0)
}
