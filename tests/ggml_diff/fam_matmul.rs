//! Differential cases of the matrix-product family: `mul_mat` (every weight
//! type, odd shapes, N = 1 decode and batches, broadcast over dims 2/3,
//! non-contiguous activations and permuted weights as in attention),
//! `mul_mat_id` (repeated experts, broadcast activations) and `add_id`.
//!
//! Bounds per backend ([`tol`]): our CPU rounds the activations to the
//! weights' dot type (F16, BF16, Q8_0, Q8_K) and sums the same blocks as
//! ggml's CPU, so it is held to 1e-9; the GPU keeps the activations in F32
//! where ggml's CPU rounds them, which its bound allows.

use crate::harness::{row_bytes, Builder, Built, Case, Compare, Init, Tol, FLOAT};
use shardgraph::{GgmlType, Result, TensorId};

use GgmlType::*;

/// The bounds of a product with weights of type `ty` (measured over every
/// case of this file and of `fam_quant`, both releases).
/// - CPU: the activations rounded to the weights' dot type and the same
///   block sums as ggml's `vec_dot` (≤ 4.7e-13 measured): 1e-9. A product
///   on unrounded activations measures 1e-8 (F16) to 1e-5 (block types)
///   and fails.
/// - Emulated GPU: it keeps the activations in F32 (F16/BF16 ones converted
///   exactly) where ggml's CPU rounds them, so it differs from ggml by that
///   rounding: F32 weights ≤ 9.3e-14 (1e-9), F16 ≤ 9.3e-8 (1e-6), BF16
///   ≤ 5.1e-6 (2e-5; one product per output at k = 1 the largest), block
///   types ≤ 6.9e-5 (2e-4; Q3_K the largest). The weight types with no GPU
///   kernel yet run on the host (`host_fallbacks`) and measure as the CPU.
/// - A real GPU: ggml's `test-backend-ops` bounds (1e-7 for F32, 5e-4).
pub fn tol(ty: GgmlType) -> Compare {
    Compare::Nmse(match ty {
        F32 => FLOAT,
        F16 => Tol::new(1e-9, 1e-6, 5e-4),
        BF16 => Tol::new(1e-9, 2e-5, 5e-4),
        _ => Tol::new(1e-9, 2e-4, 5e-4),
    })
}

fn leaf(ctx: &mut Builder, ty: GgmlType, ne: &[i64]) -> Result<TensorId> {
    ctx.new_tensor(ty, ne)
}

const BLOCK32: [GgmlType; 5] = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0];
const KQUANTS: [GgmlType; 5] = [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K];

/// Plain [K, M] × [K, N] products.
fn plain(v: &mut Vec<Case>, ty: GgmlType, k: i64, m: i64, n: i64) {
    v.push(Case::new("mul_mat", format!("type_a={ty},k={k},m={m},n={n}"), tol(ty), move |ctx| {
        let a = leaf(ctx, ty, &[k, m])?;
        let b = leaf(ctx, F32, &[k, n])?;
        Ok(Built::out(&[ctx.mul_mat(a, b)?]))
    }));
}

/// [K, M] × [K, N] with F16 / BF16 weights and activations of the same type
/// (ggml's CPU takes a 16-bit src1 only as the weights' dot type), plain,
/// broadcast over dims 2/3, or permuted (`perm`: b a permute of [K, B2, N, B3]).
fn act16(v: &mut Vec<Case>, ty: GgmlType, (k, m, n): (i64, i64, i64), a23: [i64; 2], b23: [i64; 2], perm: bool) {
    v.push(Case::new(
        "mul_mat",
        format!("type_a={ty},type_b={ty},k={k},m={m},n={n},bcast_a={a23:?},b={b23:?},permuted_b={perm}"),
        tol(ty),
        move |ctx| {
            let a = leaf(ctx, ty, &[k, m, a23[0], a23[1]])?;
            let b = if perm {
                let x = leaf(ctx, ty, &[k, b23[0], n, b23[1]])?;
                ctx.permute(x, [0, 2, 1, 3])?
            } else {
                leaf(ctx, ty, &[k, n, b23[0], b23[1]])?
            };
            Ok(Built::out(&[ctx.mul_mat(a, b)?]))
        },
    ));
}

/// Broadcast of a over b's dims 2 and 3.
fn broadcast(v: &mut Vec<Case>, ty: GgmlType, k: i64, m: i64, n: i64, a23: [i64; 2], b23: [i64; 2]) {
    v.push(Case::new(
        "mul_mat",
        format!("type_a={ty},k={k},m={m},n={n},bcast_a={a23:?},b={b23:?}"),
        tol(ty),
        move |ctx| {
            let a = leaf(ctx, ty, &[k, m, a23[0], a23[1]])?;
            let b = leaf(ctx, F32, &[k, n, b23[0], b23[1]])?;
            Ok(Built::out(&[ctx.mul_mat(a, b)?]))
        },
    ));
}

/// b = permute of a 3-d tensor [K, B, N] → [K, N, B] (rows stay packed, as
/// ggml's CPU kernel requires; transposed b is covered by the unit tests).
fn permuted_b(v: &mut Vec<Case>, ty: GgmlType, k: i64, m: i64, n: i64, nb: i64) {
    v.push(Case::new("mul_mat", format!("type_a={ty},k={k},m={m},n={n},b=permuted[{nb}]"), tol(ty), move |ctx| {
        let a = leaf(ctx, ty, &[k, m, nb])?;
        let x = leaf(ctx, F32, &[k, nb, n])?;
        let b = ctx.permute(x, [0, 2, 1, 3])?;
        Ok(Built::out(&[ctx.mul_mat(a, b)?]))
    }));
}

/// Attention scores with a cache: k = view of a [D·H_kv, n_kv] cache as
/// [D, n_kv, H_kv] (dims 1/2 permuted in memory), q = permute of
/// [D, H, n_q] → [D, n_q, H] with H = gqa·H_kv.
fn attention(v: &mut Vec<Case>, ty: GgmlType, d: i64, n_kv: i64, h_kv: i64, gqa: i64, n_q: i64) {
    v.push(Case::new(
        "mul_mat",
        format!("attn_kq,type_k={ty},d={d},n_kv={n_kv},h_kv={h_kv},gqa={gqa},n_q={n_q}"),
        tol(ty),
        move |ctx| {
            let cache = leaf(ctx, ty, &[d * h_kv, n_kv])?;
            let nb1 = ctx.nb(cache)[1];
            let row = row_bytes(ty, d);
            let k = ctx.view_3d(cache, d, n_kv, h_kv, nb1, row, 0)?;
            let qx = leaf(ctx, F32, &[d, h_kv * gqa, n_q])?;
            let q = ctx.permute(qx, [0, 2, 1, 3])?;
            Ok(Built::out(&[ctx.mul_mat(k, q)?]))
        },
    ));
    // The other common layout: k stored [D, H_kv, n_kv], permuted to [D, n_kv, H_kv].
    v.push(Case::new(
        "mul_mat",
        format!("attn_kq_permuted,type_k={ty},d={d},n_kv={n_kv},h_kv={h_kv},gqa={gqa},n_q={n_q}"),
        tol(ty),
        move |ctx| {
            let kx = leaf(ctx, ty, &[d, h_kv, n_kv])?;
            let k = ctx.permute(kx, [0, 2, 1, 3])?;
            let qx = leaf(ctx, F32, &[d, h_kv * gqa, n_q])?;
            let q = ctx.permute(qx, [0, 2, 1, 3])?;
            Ok(Built::out(&[ctx.mul_mat(k, q)?]))
        },
    ));
}

fn mul_mat_cases(v: &mut Vec<Case>) {
    // Dense weights, K not a multiple of anything.
    for ty in [F32, F16, BF16] {
        for (k, m, n) in [(33, 7, 1), (33, 33, 7), (256, 33, 1), (256, 7, 64), (64, 33, 2), (1, 3, 5)] {
            plain(v, ty, k, m, n);
        }
    }
    // 32-element blocks.
    for ty in BLOCK32 {
        for (k, m, n) in [(32, 7, 1), (64, 33, 2), (96, 7, 7), (256, 33, 1), (256, 33, 64), (256, 7, 7)] {
            plain(v, ty, k, m, n);
        }
    }
    // k-quants.
    for ty in KQUANTS {
        for (k, m, n) in [(256, 7, 1), (256, 33, 2), (512, 33, 7), (256, 7, 64)] {
            plain(v, ty, k, m, n);
        }
    }
    // One long row per family of types.
    for ty in [F32, F16, Q4_0, Q8_0, Q4_K, Q6_K] {
        plain(v, ty, 4096, 7, 2);
    }
    // Broadcast over dims 2 and 3.
    for ty in [F32, F16, Q4_0, Q8_0, Q4_K] {
        let k = if ty.block_size() == 256 { 256 } else { 64 };
        broadcast(v, ty, k, 7, 3, [2, 1], [6, 1]);
        broadcast(v, ty, k, 5, 2, [1, 2], [1, 4]);
        broadcast(v, ty, k, 9, 1, [2, 3], [4, 6]);
    }
    // Non-contiguous activations.
    for ty in [F32, F16, Q8_0, Q4_K] {
        let k = if ty.block_size() == 256 { 256 } else { 64 };
        permuted_b(v, ty, k, 7, 5, 3);
    }
    // F16 / BF16 activations: few columns (matrix-vector), many (GEMM),
    // broadcast and permuted.
    for ty in [F16, BF16] {
        for kmn in [(33, 7, 1), (256, 33, 7), (256, 7, 64), (64, 33, 2)] {
            act16(v, ty, kmn, [1, 1], [1, 1], false);
        }
        act16(v, ty, (64, 7, 3), [2, 1], [6, 1], false);
        act16(v, ty, (64, 9, 33), [2, 3], [4, 6], false);
        act16(v, ty, (64, 7, 5), [3, 1], [3, 1], true);
    }
    // Attention: permuted weights with GQA broadcast.
    for ty in [F32, F16, Q8_0, Q4_0] {
        attention(v, ty, 64, 33, 2, 2, 5);
        attention(v, ty, 128, 7, 1, 4, 1);
    }
}

/// ids for `n_used` × `n_tok` with experts repeated inside a token and across tokens.
fn ids(n_expert: i64, n_used: i64, n_tok: i64) -> Init {
    Init::Ints(
        (0..n_used * n_tok).map(|i| (i * 7 + i / n_used) % n_expert).map(|e| if e == 1 { 0 } else { e }).collect(),
    )
}

fn mul_mat_id_cases(v: &mut Vec<Case>) {
    for ty in [F32, F16, Q4_0, Q8_0, Q5_1, Q4_K, Q6_K] {
        let k = if ty.block_size() == 256 { 256 } else { 64 };
        for (n_expert, n_used, n_b, n_tok, m) in [(4, 2, 2, 5, 7), (8, 4, 1, 3, 33), (3, 3, 3, 1, 9), (4, 4, 2, 9, 5)] {
            v.push(Case::new(
                "mul_mat_id",
                format!("type_a={ty},k={k},m={m},n_expert={n_expert},n_used={n_used},n_b={n_b},n_tok={n_tok}"),
                tol(ty),
                move |ctx| {
                    let a = leaf(ctx, ty, &[k, m, n_expert])?;
                    let b = leaf(ctx, F32, &[k, n_b, n_tok])?;
                    let i = leaf(ctx, I32, &[n_used, n_tok])?;
                    let out = ctx.mul_mat_id(a, b, i)?;
                    Ok(Built::out(&[out]).init(i, ids(n_expert, n_used, n_tok)))
                },
            ));
        }
    }
    // F16 / BF16 activations with weights of the same type.
    for ty in [F16, BF16] {
        let (k, m, n_expert, n_used, n_b, n_tok) = (64, 9, 4, 2, 2, 5);
        v.push(Case::new(
            "mul_mat_id",
            format!("type_a={ty},type_b={ty},k={k},m={m},n_expert={n_expert},n_used={n_used},n_b={n_b},n_tok={n_tok}"),
            tol(ty),
            move |ctx| {
                let a = leaf(ctx, ty, &[k, m, n_expert])?;
                let b = leaf(ctx, ty, &[k, n_b, n_tok])?;
                let i = leaf(ctx, I32, &[n_used, n_tok])?;
                let out = ctx.mul_mat_id(a, b, i)?;
                Ok(Built::out(&[out]).init(i, ids(n_expert, n_used, n_tok)))
            },
        ));
    }
}

/// Many tokens per expert (the packed multi-column kernels with scattered columns).
fn mul_mat_id_many_tokens(v: &mut Vec<Case>) {
    for ty in [F32, F16, Q4_0, Q8_0, Q4_K] {
        let k = if ty.block_size() == 256 { 256 } else { 128 };
        let (n_expert, n_used, n_tok, m) = (8, 2, 40, 33);
        v.push(Case::new(
            "mul_mat_id",
            format!("type_a={ty},k={k},m={m},n_expert={n_expert},n_used={n_used},n_b=1,n_tok={n_tok}"),
            tol(ty),
            move |ctx| {
                let a = leaf(ctx, ty, &[k, m, n_expert])?;
                let b = leaf(ctx, F32, &[k, 1, n_tok])?;
                let i = leaf(ctx, I32, &[n_used, n_tok])?;
                let out = ctx.mul_mat_id(a, b, i)?;
                Ok(Built::out(&[out]).init(i, ids(n_expert, n_used, n_tok)))
            },
        ));
    }
}

fn add_id_cases(v: &mut Vec<Case>) {
    for (ne0, n_used, n_tok, n_expert) in [(16, 2, 5, 4), (33, 4, 3, 8), (7, 1, 1, 2)] {
        v.push(Case::new(
            "add_id",
            format!("ne0={ne0},n_used={n_used},n_tok={n_tok},n_expert={n_expert}"),
            Compare::Nmse(FLOAT),
            move |ctx| {
                let a = leaf(ctx, F32, &[ne0, n_used, n_tok])?;
                let b = leaf(ctx, F32, &[ne0, n_expert])?;
                let i = leaf(ctx, I32, &[n_used, n_tok])?;
                let out = ctx.add_id(a, b, i)?;
                Ok(Built::out(&[out]).init(i, ids(n_expert, n_used, n_tok)))
            },
        ));
    }
    // add_id after mul_mat_id (the MoE bias pattern).
    v.push(Case::new("add_id", "after_mul_mat_id,type_a=q8_0", tol(Q8_0), |ctx| {
        let a = leaf(ctx, Q8_0, &[64, 9, 4])?;
        let b = leaf(ctx, F32, &[64, 1, 3])?;
        let i = leaf(ctx, I32, &[2, 3])?;
        let bias = leaf(ctx, F32, &[9, 4])?;
        let mm = ctx.mul_mat_id(a, b, i)?;
        let out = ctx.add_id(mm, bias, i)?;
        Ok(Built::out(&[out]).init(i, ids(4, 2, 3)))
    }));
}

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    mul_mat_cases(&mut v);
    mul_mat_id_cases(&mut v);
    mul_mat_id_many_tokens(&mut v);
    add_id_cases(&mut v);
    v
}
