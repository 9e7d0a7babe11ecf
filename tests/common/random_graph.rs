//! Random graphs for the property tests: random leafs and random sequences
//! of op constructor calls over them (shared by `props` and `split_props`).

#![allow(dead_code)]

#[path = "fixtures.rs"]
mod fixtures;

use fixtures::OneCpu;
use proptest::prelude::*;
use shardgraph::{Context, GgmlType, GluOp, Graph, RopeMode, SortOrder, TensorId, TensorStorage, UnaryOp};

#[derive(Clone, Debug)]
pub struct Leaf {
    pub ty: u8,
    pub ne: Vec<i64>,
}

pub fn leaf_strategy() -> impl Strategy<Value = Leaf> {
    (0u8..8, prop::collection::vec(0i64..7, 1..=4)).prop_map(|(ty, ne)| Leaf { ty, ne })
}

pub fn leaf_type(code: u8) -> GgmlType {
    match code {
        0..=4 => GgmlType::F32,
        5 => GgmlType::F16,
        6 => GgmlType::I32,
        _ => GgmlType::BF16,
    }
}

pub type Step = (u8, u32, u32, u32);

pub const N_KINDS: u8 = 30;

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
            let ops = [
                UnaryOp::Abs,
                UnaryOp::Neg,
                UnaryOp::Tanh,
                UnaryOp::Relu,
                UnaryOp::Sigmoid,
                UnaryOp::Gelu,
                UnaryOp::GeluQuick,
                UnaryOp::Silu,
                UnaryOp::Exp,
                UnaryOp::Softplus,
            ];
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
        11 => ctx.argmax(a),
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
        19 => ctx.concat(a, b, (z % 4) as usize),
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
            let n_dims = (ne_a[0] - (y % 2) as i64 * 2).max(0) as i32;
            let mode = if z % 2 == 0 { RopeMode::Normal } else { RopeMode::Neox };
            ctx.rope(a, pos, n_dims, mode)
        }
        26 => ctx.cast(a, if y % 2 == 0 { GgmlType::F16 } else { GgmlType::F32 }),
        27 => ctx.dup(a),
        28 => ctx.fill(a, 1.5),
        _ => {
            let ne_b = ctx.tensor(b).ok()?.ne;
            let idx = ctx.new_tensor(GgmlType::I64, &[ne_b[1], ne_b[2], ne_b[3]]).ok()?;
            ctx.set_rows(a, b, idx)
        }
    };
    if let Ok(id) = r {
        pool.push(id);
    }
    Some(r)
}

/// Builds the random graph: leafs, then every step; returns the context and
/// the accepted nodes (`None` if no leaf could be made).
pub fn build(leafs: &[Leaf], steps: &[Step]) -> Option<(Context, Vec<TensorId>)> {
    let mut ctx = Context::new();
    let mut pool = Vec::new();
    for l in leafs {
        if let Ok(id) = ctx.new_tensor(leaf_type(l.ty), &l.ne) {
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

/// The proptest configuration: `PROPTEST_CASES` cases (default `default_cases`),
/// a fixed seed unless `PROPTEST_RNG_SEED=<n>` picks another, so CI is deterministic.
pub fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    let rng_seed = match std::env::var("PROPTEST_RNG_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(seed) => proptest::test_runner::RngSeed::Fixed(seed),
        None => proptest::test_runner::RngSeed::Fixed(0x5348_4152_4447),
    };
    ProptestConfig { cases, failure_persistence: None, rng_seed, ..ProptestConfig::default() }
}

/// What [`compute_one_device`] returns: the storage after compute, every
/// leaf's bytes as written before compute, and whether compute succeeded.
pub type OneDevice = (TensorStorage, std::collections::HashMap<TensorId, Vec<u8>>, bool);

/// Runs `graph` on one CPU device with deterministic leaf values (I32 `i % 3`,
/// I64 `i % 2`, floats `sin(0.37 i)`). Compute errors (an index out of
/// range) are allowed and reported; allocation failures fail the test.
pub fn compute_one_device(ctx: &Context, graph: &Graph) -> Result<OneDevice, TestCaseError> {
    let one = OneCpu::new(ctx, graph, 2, |storage, l| {
        let t = ctx.tensor(l).unwrap();
        let n = t.nelements() as usize;
        match t.ty {
            GgmlType::I32 => storage.set_i32(ctx, l, &(0..n as i32).map(|i| i % 3).collect::<Vec<_>>()).unwrap(),
            GgmlType::I64 => storage.set_i64(ctx, l, &(0..n as i64).map(|i| i % 2).collect::<Vec<_>>()).unwrap(),
            _ => storage.set_f32(ctx, l, &(0..n).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>()).unwrap(),
        }
    })
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let computed = one.compute(ctx, graph).is_ok();
    Ok((one.storage, one.leaf_bytes, computed))
}
