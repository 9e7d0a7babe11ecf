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
    // families: no GPU kernels yet (dequantize, quantize, dot).
    ("cpy", F32, IQ4_NL),
    ("cpy", F32, IQ4_XS),
    ("cpy", F32, MXFP4),
    ("cpy", F32, NVFP4),
    ("cpy", F32, Q1_0),
    ("cpy", F32, Q2_0),
    ("cpy", F32, TQ1_0),
    ("cpy", F32, TQ2_0),
    ("cpy", IQ4_NL, F32),
    ("cpy", IQ4_XS, F32),
    ("cpy", MXFP4, F32),
    ("cpy", NVFP4, F32),
    ("cpy", Q1_0, F32),
    ("cpy", Q2_0, F32),
    ("cpy", TQ1_0, F32),
    ("cpy", TQ2_0, F32),
    ("get_rows", F32, IQ1_M),
    ("get_rows", F32, IQ1_S),
    ("get_rows", F32, IQ2_S),
    ("get_rows", F32, IQ2_XS),
    ("get_rows", F32, IQ2_XXS),
    ("get_rows", F32, IQ3_S),
    ("get_rows", F32, IQ3_XXS),
    ("get_rows", F32, IQ4_NL),
    ("get_rows", F32, IQ4_XS),
    ("get_rows", F32, MXFP4),
    ("get_rows", F32, NVFP4),
    ("get_rows", F32, Q1_0),
    ("get_rows", F32, Q2_0),
    ("get_rows", F32, TQ1_0),
    ("get_rows", F32, TQ2_0),
    ("mul_mat", F32, IQ1_M),
    ("mul_mat", F32, IQ1_S),
    ("mul_mat", F32, IQ2_S),
    ("mul_mat", F32, IQ2_XS),
    ("mul_mat", F32, IQ2_XXS),
    ("mul_mat", F32, IQ3_S),
    ("mul_mat", F32, IQ3_XXS),
    ("mul_mat", F32, IQ4_NL),
    ("mul_mat", F32, IQ4_XS),
    ("mul_mat", F32, MXFP4),
    ("mul_mat", F32, NVFP4),
    ("mul_mat", F32, Q1_0),
    ("mul_mat", F32, Q2_0),
    ("mul_mat", F32, TQ1_0),
    ("mul_mat", F32, TQ2_0),
    ("set_rows", IQ4_NL, F32),
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
