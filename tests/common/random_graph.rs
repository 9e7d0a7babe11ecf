//! Random graphs for the property tests: random leafs and random sequences
//! of op constructor calls over them (shared by `props` and `split_props`).
//!
//! Leafs are F32, F16, BF16, I32, I64 and the block-quantized weight types
//! the models use (Q8_0, Q4_0, Q4_K, Q6_K, rows of whole blocks); the steps
//! cover the element-wise, norm, reduce, selection, data-movement and view
//! ops, and the ops the models are made of: `mul_mat` on quantized
//! weights, `mul_mat_id`, `flash_attn_ext` (F32/F16/Q8_0 K and V, masks,
//! ALiBi, soft-capping, sinks), `rope_ext` (YaRN) and `rope_multi`
//! (MROPE/IMROPE), `ssm_conv` and `gated_delta_net`. Each arm builds its
//! operands so the constructor accepts them for most shapes (`props`'s
//! `every_generator_arm_builds_and_computes` checks that each one does).

#![allow(dead_code)]

#[path = "fixtures.rs"]
mod fixtures;
#[path = "partial.rs"]
pub mod partial;

use fixtures::OneCpu;
use proptest::prelude::*;
use shardgraph::{Context, GgmlType, GluOp, Graph, RopeMode, RopeParams, SortOrder, TensorId, TensorStorage, UnaryOp};

#[derive(Clone, Debug)]
pub struct Leaf {
    pub ty: u8,
    pub ne: Vec<i64>,
}

/// The number of leaf type codes [`leaf_type`] maps.
pub const N_LEAF_TYPES: u8 = 14;

pub fn leaf_strategy() -> impl Strategy<Value = Leaf> {
    (0u8..N_LEAF_TYPES, prop::collection::vec(0i64..7, 1..=4)).prop_map(|(ty, ne)| Leaf { ty, ne })
}

pub fn leaf_type(code: u8) -> GgmlType {
    match code {
        0..=5 => GgmlType::F32,
        6 => GgmlType::F16,
        7 => GgmlType::I32,
        8 => GgmlType::BF16,
        9 => GgmlType::I64,
        10 => GgmlType::Q8_0,
        11 => GgmlType::Q4_0,
        12 => GgmlType::Q4_K,
        _ => GgmlType::Q6_K,
    }
}

/// The shape of leaf `l`: its extents, with dim 0 counted in blocks (0, 1
/// or 2 whole blocks) for a block type.
pub fn leaf_ne(l: &Leaf) -> Vec<i64> {
    let ty = leaf_type(l.ty);
    let mut ne = l.ne.clone();
    if ty.block_size() > 1 {
        ne[0] = ne[0].min(2) * ty.block_size() as i64;
    }
    ne
}

pub type Step = (u8, u32, u32, u32);

pub const N_KINDS: u8 = 36;

/// Applies one random step; returns the constructor's result (if the step
/// made a call).
pub fn apply(ctx: &mut Context, pool: &mut Vec<TensorId>, step: Step) -> Option<shardgraph::Result<TensorId>> {
    let (kind, x, y, z) = step;
    let pick = |r: u32, pool: &Vec<TensorId>| pool[r as usize % pool.len()];
    let a = pick(x, pool);
    let b = pick(y, pool);
    let ne_a = ctx.tensor(a).ok()?.ne;
    // A tensor broadcastable to `a` (some dims set to 1), or an unrelated one.
    let bcast = |ctx: &mut Context| -> TensorId {
        if z % 3 == 0 {
            return b;
        }
        let mut ne = ne_a;
        for (i, n) in ne.iter_mut().enumerate() {
            if (z >> i) & 1 == 1 {
                *n = 1;
            }
        }
        ctx.new_tensor(GgmlType::F32, &ne).unwrap_or(b)
    };
    let r = match kind % N_KINDS {
        0 => {
            let b = bcast(ctx);
            ctx.add(a, b)
        }
        1 => {
            let b = bcast(ctx);
            ctx.sub(a, b)
        }
        2 => {
            let b = bcast(ctx);
            ctx.mul(a, b)
        }
        3 => {
            let b = bcast(ctx);
            ctx.div(a, b)
        }
        4 => {
            let ops = UnaryOp::ALL;
            ctx.unary(a, ops[y as usize % ops.len()])
        }
        5 => ctx.scale_bias(a, (y % 7) as f32 - 3.0, (z % 3) as f32),
        6 => ctx.clamp(a, -((y % 4) as f32), (z % 4) as f32),
        7 => {
            if y % 2 == 0 {
                ctx.sqr(a)
            } else {
                ctx.sqrt(a)
            }
        }
        8 => match y % 3 {
            0 => ctx.rms_norm(a, 1e-6),
            1 => ctx.norm(a, 1e-5),
            _ => ctx.l2_norm(a, 1e-12),
        },
        9 => {
            if y % 2 == 0 {
                ctx.soft_max(a)
            } else {
                let mask =
                    ctx.new_tensor(if z % 2 == 0 { GgmlType::F16 } else { GgmlType::F32 }, &[ne_a[0], ne_a[1]]).ok()?;
                ctx.soft_max_ext(a, Some(mask), 0.5, if z % 3 == 0 { 8.0 } else { 0.0 })
            }
        }
        10 => match y % 3 {
            0 => ctx.sum(a),
            1 => ctx.sum_rows(a),
            _ => ctx.mean(a),
        },
        11 => {
            // argmax takes matrices: rows of `a` flattened to one matrix.
            let rows = ne_a[1] * ne_a[2] * ne_a[3];
            if (ne_a[2], ne_a[3]) == (1, 1) || !ctx.tensor(a).ok()?.is_contiguous() {
                ctx.argmax(a)
            } else {
                let m = ctx.reshape_2d(a, ne_a[0], rows).ok()?;
                ctx.argmax(m)
            }
        }
        12 => ctx.top_k(a, (y % 5) as i32),
        13 => ctx.argsort(a, if y % 2 == 0 { SortOrder::Asc } else { SortOrder::Desc }),
        14 => ctx.cont(a),
        15 => ctx.transpose(a),
        16 => {
            let perms =
                [[0, 1, 2, 3], [1, 0, 2, 3], [0, 2, 1, 3], [2, 0, 1, 3], [3, 2, 1, 0], [0, 1, 3, 2], [1, 1, 2, 3]];
            ctx.permute(a, perms[y as usize % perms.len()])
        }
        17 => {
            let n: i64 = ne_a.iter().product();
            let d = 1 + (y as i64 % 4);
            if n % d == 0 {
                ctx.reshape_2d(a, d, n / d)
            } else {
                ctx.reshape_2d(a, d, n / d.max(1))
            }
        }
        18 => {
            if y % 2 == 0 {
                ctx.view_1d(a, (z % 8) as i64, (y % 16) as usize)
            } else {
                let nb1 = ctx.tensor(a).ok()?.nb[1];
                ctx.view_2d(a, ne_a[0].min((z % 5) as i64), 1 + (y % 3) as i64, nb1, 0)
            }
        }
        19 => {
            // With `b`, or with a fresh tensor of `a`'s type and shape but for
            // the extent along the joined dim.
            let dim = (z % 4) as usize;
            if (z >> 2) % 2 == 0 {
                ctx.concat(a, b, dim)
            } else {
                let mut ne = ne_a;
                ne[dim] = 1 + (y % 3) as i64;
                let ty = ctx.tensor(a).ok()?.ty;
                let c = ctx.new_tensor(ty, &ne).ok()?;
                ctx.concat(a, c, dim)
            }
        }
        20 => ctx.repeat_4d(a, ne_a[0] * (1 + (y % 2) as i64), ne_a[1] * (1 + (z % 2) as i64), ne_a[2], ne_a[3]),
        21 => ctx.pad(a, (y % 3) as i32, (z % 2) as i32, 0, (y % 2) as i32),
        22 => {
            let ne_b = ctx.tensor(b).ok()?.ne;
            if z % 2 == 0 {
                let c = ctx.new_tensor(GgmlType::F32, &[ne_a[0], 1 + (y % 3) as i64, ne_a[2], ne_a[3]]).ok()?;
                ctx.mul_mat(a, c)
            } else {
                let _ = ne_b;
                ctx.mul_mat(a, b)
            }
        }
        23 => {
            let idx = ctx.new_tensor(GgmlType::I32, &[1 + (y % 4) as i64]).ok()?;
            ctx.get_rows(a, idx)
        }
        24 => {
            if y % 2 == 0 {
                ctx.glu(a, if z % 2 == 0 { GluOp::Swiglu } else { GluOp::Geglu }, z % 3 == 0)
            } else {
                let b = bcast(ctx);
                ctx.glu_split(a, b, GluOp::Swiglu)
            }
        }
        25 => {
            let pos = ctx.new_tensor(GgmlType::I32, &[ne_a[2]]).ok()?;
            let n_dims = ((ne_a[0] & !1) - (y % 2) as i64 * 2).max(0) as i32;
            let mode = if z % 2 == 0 { RopeMode::Normal } else { RopeMode::Neox };
            if (z >> 1) % 2 == 0 {
                ctx.rope(a, pos, n_dims, mode)
            } else {
                // YaRN as the models set it (a scaled context, θ base 1e6).
                let p = RopeParams {
                    n_dims,
                    mode,
                    n_ctx_orig: 8,
                    freq_base: 1e6,
                    freq_scale: 0.25,
                    ext_factor: 1.0,
                    attn_factor: 1.0,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                    sections: [0; 4],
                };
                ctx.rope_ext(a, pos, None, p)
            }
        }
        26 => ctx.cast(a, if y % 2 == 0 { GgmlType::F16 } else { GgmlType::F32 }),
        27 => ctx.dup(a),
        28 => ctx.fill(a, 1.5),
        29 => {
            // One or two fresh F32 rows into `a` at distinct indices (the I64
            // leaf holds `i % 2`; duplicates would make the winner depend on
            // the order of the writes), broadcast over dims 2, 3 or not.
            let r = 1 + (y % 2) as i64;
            let rows = ctx.new_tensor(GgmlType::F32, &[ne_a[0], r, ne_a[2], ne_a[3]]).ok()?;
            let (c2, c3) = if z % 2 == 0 { (ne_a[2], ne_a[3]) } else { (1, 1) };
            let idx =
                ctx.new_tensor(if (z >> 1) % 2 == 0 { GgmlType::I64 } else { GgmlType::I32 }, &[r, c2, c3]).ok()?;
            ctx.set_rows(a, rows, idx)
        }
        30 => weight_product(ctx, ne_a, y, z),
        31 => expert_product(ctx, ne_a, y, z),
        32 => attention(ctx, a, y, z),
        33 => {
            // Multi-section rope on `a` (F32/F16 [head_dim, heads, tokens, ne3]).
            let pos = ctx.new_tensor(GgmlType::I32, &[4 * ne_a[2]]).ok()?;
            let mode = if z % 2 == 0 { RopeMode::Mrope } else { RopeMode::Imrope };
            let sections = [1 + (y % 2) as i32, ((y >> 1) % 2) as i32, ((y >> 2) % 2) as i32, 0];
            let n_dims = ((ne_a[0] & !1) - ((z >> 1) % 2) as i64 * 2).max(0) as i32;
            let p = RopeParams { n_dims, mode, sections, freq_base: 1e6, ..RopeParams::default() };
            ctx.rope_multi(a, pos, None, p)
        }
        34 => conv(ctx, a, y, z),
        _ => delta_net(ctx, a, y, z),
    };
    if let Ok(id) = r {
        pool.push(id);
    }
    Some(r)
}

/// `mul_mat` of a weight `[K, M]` (Q8_0, Q4_0, Q4_K, Q6_K, F16 or BF16; K
/// one or two blocks) over fresh activations `[K, ne_a1, ne_a2, ne_a3]`
/// with `M = ne_a0`, so the product has `a`'s shape.
fn weight_product(ctx: &mut Context, ne_a: [i64; 4], y: u32, z: u32) -> shardgraph::Result<TensorId> {
    use GgmlType::*;
    let ty = [Q8_0, Q4_0, Q4_K, Q6_K, F16, BF16][y as usize % 6];
    let k = (ty.block_size() as i64).max(8) * (1 + (z % 2) as i64);
    let w = ctx.new_tensor(ty, &[k, ne_a[0].max(1)])?;
    let x = ctx.new_tensor(F32, &[k, ne_a[1], ne_a[2], ne_a[3]])?;
    ctx.mul_mat(w, x)
}

/// `mul_mat_id` over 3 experts `[K, M, 3]` (F32, F16, Q8_0 or Q4_0) with
/// `n_used` experts per token out of ids `i % 3`, `b` one row per used
/// expert or broadcast.
fn expert_product(ctx: &mut Context, ne_a: [i64; 4], y: u32, z: u32) -> shardgraph::Result<TensorId> {
    use GgmlType::*;
    let ty = [F32, F16, Q8_0, Q4_0][y as usize % 4];
    let k = (ty.block_size() as i64).max(4);
    let n_used = 1 + (z % 3) as i64;
    let n_b = if (z >> 2) % 2 == 0 { n_used } else { 1 };
    let t = 1 + ((y >> 2) % 3) as i64;
    let experts = ctx.new_tensor(ty, &[k, ne_a[0].max(1), 3])?;
    let b = ctx.new_tensor(F32, &[k, n_b, t])?;
    let ids = ctx.new_tensor(I32, &[n_used, t])?;
    ctx.mul_mat_id(experts, b, ids)
}

/// `flash_attn_ext` with `q` = `a` (F32 `[D, n_q, H, B]`) or fresh; K and V
/// F32, F16 or Q8_0 (D = 32 then) with all heads or one shared; an F16 mask
/// (with ALiBi sometimes), soft-capping and sinks sometimes.
fn attention(ctx: &mut Context, a: TensorId, y: u32, z: u32) -> shardgraph::Result<TensorId> {
    use GgmlType::*;
    let kv = [F32, F16, Q8_0][y as usize % 3];
    let (aty, ane) = ctx.tensor(a).map(|t| (t.ty, t.ne))?;
    let (q, [d, n_q, h, b]) = if kv != Q8_0 && aty == F32 && (z >> 3) % 2 == 0 {
        (a, ane)
    } else {
        let d = if kv == Q8_0 { 32 } else { 1 + (z % 8) as i64 };
        let ne = [d, 1 + ((y >> 2) % 4) as i64, 1 + ((z >> 4) % 4) as i64, 1 + ((y >> 4) % 2) as i64];
        (ctx.new_tensor(F32, &ne)?, ne)
    };
    let h_kv = if (z >> 6) % 2 == 0 { h } else { 1 };
    let n_kv = 1 + ((y >> 6) % 6) as i64;
    let d_v = if kv == Q8_0 || (z >> 7) % 2 == 0 { d } else { 1 + ((y >> 8) % 5) as i64 };
    let k = ctx.new_tensor(kv, &[d, n_kv, h_kv, b])?;
    let v = ctx.new_tensor(kv, &[d_v, n_kv, h_kv, b])?;
    let mask = if (z >> 9) % 3 == 0 { None } else { Some(ctx.new_tensor(F16, &[n_kv, n_q, 1, 1])?) };
    let max_bias = if mask.is_some() && (y >> 11) % 3 == 0 { 8.0 } else { 0.0 };
    let softcap = if (y >> 13) % 4 == 0 { 5.0 } else { 0.0 };
    let scale = 1.0 / (d.max(1) as f32).sqrt();
    let fa = ctx.flash_attn_ext(q, k, v, mask, scale, max_bias, softcap)?;
    if mask.is_some() && (z >> 11) % 2 == 0 {
        let sinks = ctx.new_tensor(F32, &[h])?;
        return ctx.flash_attn_ext_add_sinks(fa, sinks);
    }
    Ok(fa)
}

/// `ssm_conv` over `sx` = `a` (F32 `[d_conv − 1 + n_t, d_inner, n_s]`) or
/// a fresh one, with fresh weights `[d_conv, d_inner]`.
fn conv(ctx: &mut Context, a: TensorId, y: u32, z: u32) -> shardgraph::Result<TensorId> {
    let d_conv = 1 + (y % 4) as i64;
    let (aty, ane) = ctx.tensor(a).map(|t| (t.ty, t.ne))?;
    let sx = if aty == GgmlType::F32 && ane[3] == 1 && ane[0] >= d_conv - 1 && z % 2 == 0 {
        a
    } else {
        let ne = [d_conv - 1 + 1 + ((y >> 2) % 3) as i64, 1 + ((z >> 1) % 5) as i64, 1 + ((z >> 4) % 2) as i64];
        ctx.new_tensor(GgmlType::F32, &ne)?
    };
    let d_inner = ctx.tensor(sx)?.ne[1];
    let c = ctx.new_tensor(GgmlType::F32, &[d_conv, d_inner])?;
    ctx.ssm_conv(sx, c)
}

/// `gated_delta_net` with `q = k = v = a` (F32 `[S, H, T, B]`) or fresh
/// operands (q/k with all heads or one shared), per-head or per-channel
/// decays, one or two state snapshots (two only with two tokens or more).
fn delta_net(ctx: &mut Context, a: TensorId, y: u32, z: u32) -> shardgraph::Result<TensorId> {
    use GgmlType::F32;
    let (aty, ane) = ctx.tensor(a).map(|t| (t.ty, t.ne))?;
    // The state is S·S·H·B values: `a` serves only while that stays small.
    let small = ane[0] <= 16 && ane[0] * ane[0] * ane[1] * ane[3] <= 4096;
    let (q, k, v, [s, h, t, b]) = if aty == F32 && small && z % 2 == 0 {
        (a, a, a, ane)
    } else {
        let ne = [1 + (y % 4) as i64, 1 + ((z >> 1) % 3) as i64, 1 + ((y >> 2) % 3) as i64, 1 + ((z >> 3) % 2) as i64];
        let h_qk = if (y >> 4) % 2 == 0 { ne[1] } else { 1 };
        let q = ctx.new_tensor(F32, &[ne[0], h_qk, ne[2], ne[3]])?;
        let k = ctx.new_tensor(F32, &[ne[0], h_qk, ne[2], ne[3]])?;
        (q, k, ctx.new_tensor(F32, &ne)?, ne)
    };
    let g0 = if (z >> 5) % 2 == 0 { 1 } else { s };
    let g = ctx.new_tensor(F32, &[g0, h, t, b])?;
    let beta = ctx.new_tensor(F32, &[1, h, t, b])?;
    let state = ctx.new_tensor(F32, &[s, s, h, b])?;
    // With fewer tokens than snapshot slots the op leaves slots unwritten
    // (as ggml does): their bytes are whatever the buffer held.
    let snapshots = if t >= 2 { 1 + ((y >> 5) % 2) as i64 } else { 1 };
    ctx.gated_delta_net(q, k, v, g, beta, state, snapshots)
}

/// Builds the random graph: leafs, then every step; returns the context and
/// the accepted nodes (`None` if no leaf could be made).
pub fn build(leafs: &[Leaf], steps: &[Step]) -> Option<(Context, Vec<TensorId>)> {
    let mut ctx = Context::new();
    let mut pool = Vec::new();
    for l in leafs {
        if let Ok(id) = ctx.new_tensor(leaf_type(l.ty), &leaf_ne(l)) {
            pool.push(id);
        }
    }
    if pool.is_empty() {
        return None;
    }
    let mut accepted = Vec::new();
    for &s in steps {
        if let Some(Ok(id)) = apply(&mut ctx, &mut pool, s) {
            accepted.push(id);
        }
    }
    Some((ctx, accepted))
}

/// The proptest configuration of test `name`: `PROPTEST_CASES` cases
/// (default `default_cases`) from the seed `PROPTEST_RNG_SEED=<n>`, or a
/// seed drawn for this run. The seed is printed (shown with the failure
/// when a case fails), so a failing run reproduces with
/// `PROPTEST_RNG_SEED=<seed>`.
pub fn config(name: &str, default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    let seed = match std::env::var("PROPTEST_RNG_SEED") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("PROPTEST_RNG_SEED={v:?} is not a u64")),
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
            );
            h.finish()
        }
    };
    eprintln!("{name}: {cases} cases from seed {seed} (rerun them with PROPTEST_RNG_SEED={seed})");
    ProptestConfig {
        cases,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

/// What [`compute_one_device`] returns: the storage after compute, every
/// leaf's bytes as written before compute, and whether compute succeeded.
pub type OneDevice = (TensorStorage, std::collections::HashMap<TensorId, Vec<u8>>, bool);

/// Runs `graph` on one CPU device with deterministic leaf values (I32 `i % 3`,
/// I64 `i % 2`, floats `sin(0.37 i)`, on the grid of [`partial::on_grid`] for
/// F32 and F16 so a partial leaf splits into exact addends). Compute errors
/// (an index out of range) are allowed and reported; allocation failures
/// fail the test.
pub fn compute_one_device(ctx: &Context, graph: &Graph) -> Result<OneDevice, TestCaseError> {
    compute_perturbed(ctx, graph, 0.0, false)
}

/// [`compute_one_device`] with every float leaf value `v` replaced by
/// `v · (1 + rel)`, or by `v · (1 + rel · r)` with `r` drawn per element
/// in [-1, 1] when `mixed`: how far each node moves tells how much it
/// amplifies small errors of what it is computed from.
pub fn compute_perturbed(ctx: &Context, graph: &Graph, rel: f32, mixed: bool) -> Result<OneDevice, TestCaseError> {
    let one = OneCpu::new(ctx, graph, 2, |storage, l| {
        let t = ctx.tensor(l).unwrap();
        let n = t.nelements() as usize;
        let sign = |i: usize| {
            let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            if mixed {
                h as f32 / (1u64 << 23) as f32 - 1.0
            } else {
                1.0
            }
        };
        match t.ty {
            GgmlType::I32 => storage.set_i32(ctx, l, &(0..n as i32).map(|i| i % 3).collect::<Vec<_>>()).unwrap(),
            GgmlType::I64 => storage.set_i64(ctx, l, &(0..n as i64).map(|i| i % 2).collect::<Vec<_>>()).unwrap(),
            ty => {
                let v = (0..n).map(|i| partial::on_grid(ty, (i as f32 * 0.37).sin()) * (1.0 + rel * sign(i)));
                storage.set_f32(ctx, l, &v.collect::<Vec<_>>()).unwrap()
            }
        }
    })
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let computed = one.compute(ctx, graph).is_ok();
    Ok((one.storage, one.leaf_bytes, computed))
}
