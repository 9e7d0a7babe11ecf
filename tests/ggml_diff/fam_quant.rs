//! The weight types through the op graph, per type: the types ggml 0.25.3
//! added after the classic and k-quant families (IQ1_S, IQ1_M, IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4,
//! NVFP4, Q1_0, Q2_0) in `mul_mat` (ggml's `vec_dot` against the
//! activations quantized to the type's dot type) and `get_rows`
//! (dequantization), and every type ggml's CPU can quantize into
//! (`from_float`) in a `cpy` F32 → type → F32 round trip and in
//! `set_rows` (the KV-cache write).
//!
//! Each case runs against every loaded release that has its types: 0.25.3
//! has them all, 0.15.3 all but Q2_0 (its `GGML_TYPE_COUNT` is 42).
//! `tests/quant_bytes.rs` checks the same formats byte by byte against
//! ggml's library functions; these cases check them where the backends use
//! them (our CPU and GPU ops against ggml's CPU ops).

use crate::fam_matmul::tol;
use crate::harness::{Built, Case, Compare, Init};
use shardgraph::GgmlType;

use GgmlType::*;

/// The weight types this family adds (ggml 0.25.3 ids 16..=23, 29, 34, 35, 39..=42).
pub const NEW_TYPES: [GgmlType; 15] =
    [IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0];

/// The block types ggml 0.25.3's CPU quantizes into (`from_float` in its
/// CPU type traits, no importance matrix): what `cpy` and `set_rows` may
/// write.
pub const WRITABLE: [GgmlType; 18] = [
    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0,
];

/// `n` elements: two blocks of the largest block size (256) or more.
fn row(ty: GgmlType, blocks: i64) -> i64 {
    blocks * ty.block_size().max(256) as i64
}

fn mul_mat_cases(v: &mut Vec<Case>) {
    for ty in NEW_TYPES {
        // One column (the matrix-vector path), a few, and many.
        for (k, m, n) in [(row(ty, 1), 7, 1), (row(ty, 2), 33, 3), (row(ty, 1), 9, 64)] {
            v.push(Case::new("mul_mat", format!("type_a={ty},k={k},m={m},n={n}"), tol(ty), move |ctx| {
                let a = ctx.new_tensor(ty, &[k, m])?;
                let b = ctx.new_tensor(F32, &[k, n])?;
                Ok(Built::out(&[ctx.mul_mat(a, b)?]))
            }));
        }
    }
}

fn get_rows_cases(v: &mut Vec<Case>) {
    let idx = [3i64, 0, 7, 3, 11, 1];
    for ty in NEW_TYPES {
        let ne0 = row(ty, 1);
        v.push(Case::new("get_rows", format!("type={ty},ne=[{ne0},12],idx={idx:?}"), Compare::Exact, move |ctx| {
            let a = ctx.new_tensor(ty, &[ne0, 12])?;
            let b = ctx.new_tensor(I32, &[idx.len() as i64])?;
            Ok(Built::out(&[ctx.get_rows(a, b)?]).init(b, Init::Ints(idx.to_vec())))
        }));
    }
}

fn cpy_cases(v: &mut Vec<Case>) {
    for ty in WRITABLE {
        let ne0 = row(ty, 1);
        // F32 → type → F32 in one graph: ggml's quantizer and dequantizer
        // against ours, the quantized bytes compared too.
        v.push(Case::new("cpy", format!("round_trip,f32->{ty}->f32,ne=[{ne0},3,2]"), Compare::Exact, move |ctx| {
            let a = ctx.new_tensor(F32, &[ne0, 3, 2])?;
            let q = ctx.new_tensor(ty, &[ne0, 3, 2])?;
            let back = ctx.new_tensor(F32, &[ne0, 3, 2])?;
            let qa = ctx.cpy(a, q)?;
            Ok(Built::out(&[qa, ctx.cpy(qa, back)?]))
        }));
    }
}

fn set_rows_cases(v: &mut Vec<Case>) {
    for ty in WRITABLE.into_iter().filter(|t| NEW_TYPES.contains(t)) {
        let ne0 = row(ty, 1);
        v.push(Case::new("set_rows", format!("dst={ty},idx=i64,ne=[{ne0},8],n=3"), Compare::Exact, move |ctx| {
            let dst = ctx.new_tensor(ty, &[ne0, 8])?;
            let b = ctx.new_tensor(F32, &[ne0, 3])?;
            let c = ctx.new_tensor(I64, &[3])?;
            Ok(Built::out(&[ctx.set_rows(dst, b, c)?]).init(c, Init::Ints(vec![6, 0, 3])))
        }));
    }
}

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    mul_mat_cases(&mut v);
    get_rows_cases(&mut v);
    cpy_cases(&mut v);
    set_rows_cases(&mut v);
    v
}
