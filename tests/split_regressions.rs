//! Split execution equals single-device execution: the field cases of
//! CASES.md and the DESIGN.md section 5 rows, planned by the planner and run
//! by the reference executor on N CPU devices, against one CPU device with
//! the same bytes (exact for integer outputs, NMSE ≤ 1e-6 for F32 values).

#[path = "common/qwen3.rs"]
mod qwen3;

use qwen3::{input, named, qwen3_layers, qwen3_policy, Dims};
use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::split::{Collective, MetaExecutor, Planner, SplitPolicy, SplitSpec, SplitState};
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorId, TensorStorage};

/// Deterministic leaf values.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    if den == 0.0 {
        num
    } else {
        num / den
    }
}

/// Runs `outputs` on one device and on `ratios.len()` devices under `policy`
/// (plus explicit states) and asserts equal results. `ints` fills I32/I64 leafs.
fn check(
    ctx: &Context,
    outputs: &[TensorId],
    policy: &SplitPolicy,
    explicit: &[(TensorId, SplitState)],
    ints: &dyn Fn(TensorId, usize) -> Vec<i64>,
) -> shardgraph::split::Plan {
    let g = ctx.build_forward(outputs).unwrap();
    let cpu = CpuBackend::with_threads(2).unwrap();
    let mut st = TensorStorage::new();
    st.alloc_tensors(&cpu, ctx, g.leafs()).unwrap();
    for &l in g.leafs() {
        let t = ctx.tensor(l).unwrap();
        let n = t.nelements() as usize;
        match t.ty {
            GgmlType::I32 => st.set_i32(ctx, l, &ints(l, n).iter().map(|&v| v as i32).collect::<Vec<_>>()).unwrap(),
            GgmlType::I64 => st.set_i64(ctx, l, &ints(l, n)).unwrap(),
            _ => st.set_f32(ctx, l, &values(n, l.index() as u64 + 7)).unwrap(),
        }
    }
    let mut leaf_bytes = std::collections::HashMap::new();
    for &l in g.leafs() {
        let mut b = vec![0u8; ctx.tensor(l).unwrap().nbytes()];
        st.get_bytes(ctx, l, 0, &mut b).unwrap();
        leaf_bytes.insert(l, b);
    }
    GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, ctx, &g, &mut st).unwrap();
    cpu.compute(ctx, &g, &st).unwrap();

    let plan = Planner::default().plan(ctx, &g, policy, explicit).unwrap();
    let exec = MetaExecutor::new(policy.n_devices(), 1).unwrap();
    let got = exec.run(ctx, &g, &plan, &|l| leaf_bytes.get(&l).cloned(), outputs).unwrap();
    for (k, &o) in outputs.iter().enumerate() {
        let t = ctx.tensor(o).unwrap();
        let what = format!(
            "output {k} ({} {}) on {} devices {:?}\n{}",
            t.op.name(),
            t.describe(),
            policy.n_devices(),
            policy.ratios(),
            plan.report(ctx)
        );
        match t.ty {
            GgmlType::I32 => {
                let want = st.get_i32(ctx, o).unwrap();
                let have: Vec<i32> =
                    got[k].chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
                assert_eq!(have, want, "{what}");
            }
            _ => {
                let want = st.get_f32(ctx, o).unwrap();
                let have: Vec<f32> =
                    got[k].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                assert_eq!(have.len(), want.len(), "{what}");
                let e = nmse(&have, &want);
                assert!(e <= 1e-6, "nmse {e:.3e}: {what}");
            }
        }
    }
    plan
}

const RATIOS: [&[f32]; 6] =
    [&[1.0], &[1.0, 1.0], &[3.0, 1.0], &[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0, 1.0], &[1.0, 0.0, 2.0]];

fn no_ints(_: TensorId, n: usize) -> Vec<i64> {
    (0..n as i64).collect()
}

#[test]
fn c1_vocab_split_head_into_row_ops() {
    for ratios in RATIOS {
        let (e, v, t) = (64, 200, 3);
        let mut ctx = Context::new();
        let w = named(&mut ctx, GgmlType::Q8_0, &[e, v], "output.weight");
        let x = input(&mut ctx, GgmlType::F32, &[e, t], "x");
        let mask = input(&mut ctx, GgmlType::F32, &[v, t], "mask");
        let logits = ctx.mul_mat(w, x).unwrap();
        let outs = [
            ctx.argmax(logits).unwrap(),
            ctx.top_k(logits, 4).unwrap(),
            ctx.soft_max(logits).unwrap(),
            ctx.soft_max_ext(logits, Some(mask), 0.7, 0.0).unwrap(),
            ctx.rms_norm(logits, 1e-6).unwrap(),
            ctx.sum_rows(logits).unwrap(),
            ctx.mean(logits).unwrap(),
            ctx.norm(logits, 1e-5).unwrap(),
            ctx.l2_norm(logits, 1e-12).unwrap(),
        ];
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("output.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
        let plan = check(&ctx, &outs, &policy, &[], &no_ints);
        if ratios.len() > 1 {
            assert_eq!(plan.count(Collective::AllGather), 0, "{}", plan.report(&ctx));
        }
    }
}

#[test]
fn c1_ties_break_as_on_one_device() {
    // Equal maxima on different devices: argmax must pick ggml's (last) index.
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let x = named(&mut ctx, GgmlType::F32, &[8, 2], "logits");
        let am = ctx.argmax(x).unwrap();
        let tk = ctx.top_k(x, 3).unwrap();
        let policy =
            SplitPolicy::new(ratios).unwrap().rule("logits", SplitSpec::Axis { axis: 0, granule: 1, segments: vec![] });
        let g = ctx.build_forward(&[am, tk]).unwrap();
        let cpu = CpuBackend::with_threads(1).unwrap();
        let mut st = TensorStorage::new();
        st.alloc_tensors(&cpu, &ctx, g.leafs()).unwrap();
        let vals = [1.0f32, 5.0, 2.0, 5.0, 0.0, 5.0, -1.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0];
        st.set_f32(&ctx, x, &vals).unwrap();
        GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &ctx, &g, &mut st).unwrap();
        cpu.compute(&ctx, &g, &st).unwrap();
        let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = MetaExecutor::new(ratios.len(), 1)
            .unwrap()
            .run(&ctx, &g, &plan, &|_| Some(bytes.clone()), &[am, tk])
            .unwrap();
        let i32s = |b: &[u8]| b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        assert_eq!(i32s(&got[0]), st.get_i32(&ctx, am).unwrap(), "{ratios:?}");
        assert_eq!(i32s(&got[1]), st.get_i32(&ctx, tk).unwrap(), "{ratios:?}");
    }
}

#[test]
fn c7_mul_mat_combinations_and_c8_partial_into_non_linear_ops() {
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let a = named(&mut ctx, GgmlType::F32, &[16, 6], "a"); // [K, N] mirrored
        let b = named(&mut ctx, GgmlType::F32, &[16, 5], "b"); // [K, M] split on K
        let p = ctx.mul_mat(a, b).unwrap(); // C7(a): partial
        let a3 = named(&mut ctx, GgmlType::F32, &[8, 4, 6], "a3"); // split on heads
        let b3 = named(&mut ctx, GgmlType::F32, &[8, 3, 6], "b3");
        let h = ctx.mul_mat(a3, b3).unwrap(); // C7(b): heads stay split
        let pp = ctx.mul_mat(p, p).unwrap(); // C7(c): product of partial sums
        let outs = [
            ctx.rms_norm(p, 1e-6).unwrap(),
            ctx.soft_max(p).unwrap(),
            ctx.silu(p).unwrap(),
            ctx.sqr(p).unwrap(),
            ctx.scale(p, 3.0).unwrap(),
            h,
            pp,
        ];
        let n = ratios.len();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("b", SplitSpec::Axis { axis: 0, granule: 1, segments: vec![] })
            .rule("a3", SplitSpec::Axis { axis: 2, granule: 1, segments: vec![] })
            .rule("b3", SplitSpec::Axis { axis: 2, granule: 1, segments: vec![] })
            .rule("a", SplitSpec::Mirrored);
        let plan = check(&ctx, &outs, &policy, &[], &no_ints);
        if n > 1 {
            assert_eq!(plan.state(p), Some(&SplitState::partial()));
            assert!(matches!(plan.state(h), Some(SplitState::Split(s)) if s.axis == 2));
        }
    }
}

#[test]
fn c9_mean_over_uneven_slices_with_an_empty_one() {
    for (ne, ext) in [([4i64, 3], vec![2i64, 1]), ([4, 1], vec![1, 0])] {
        let mut ctx = Context::new();
        let x = named(&mut ctx, GgmlType::F32, &ne, "x");
        let m = ctx.mean(x).unwrap();
        let s = ctx.sum_rows(x).unwrap();
        let ms = ctx.mean(s).unwrap();
        let policy = SplitPolicy::new(&[1.0, 1.0]).unwrap();
        check(&ctx, &[m, s, ms], &policy, &[(x, SplitState::split(1, ext.clone()))], &no_ints);
        // Split on the reduced axis too: the combine sums values and counts.
        check(&ctx, &[m, s, ms], &policy, &[(x, SplitState::split(0, vec![3, 1]))], &no_ints);
    }
}

#[test]
fn vocab_parallel_embedding_lookup() {
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let emb = named(&mut ctx, GgmlType::Q8_0, &[64, 50], "token_embd.weight");
        let ids = input(&mut ctx, GgmlType::I32, &[7], "tokens");
        let e = ctx.get_rows(emb, ids).unwrap();
        let y = ctx.rms_norm(e, 1e-6).unwrap();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("token_embd.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
        let plan = check(&ctx, &[y, e], &policy, &[], &|_, n| (0..n as i64).map(|i| (i * 17 + 3) % 50).collect());
        if ratios.len() > 1 {
            assert_eq!(plan.state(e), Some(&SplitState::partial()));
        }
    }
}

#[test]
fn qwen3_layers_equal_one_device() {
    for (ratios, h, hkv) in
        [(vec![1.0, 1.0], 8, 2), (vec![3.0, 1.0], 16, 4), (vec![1.0, 1.0, 1.0], 12, 3), (vec![1.0; 4], 16, 4)]
    {
        let dm = Dims { e: 128, h, hkv, d: 16, f: 384, t: 4 };
        let mut ctx = Context::new();
        let out = qwen3_layers(&mut ctx, &dm, 2);
        let policy = qwen3_policy(&ratios, dm.d, h / hkv);
        let plan = check(&ctx, &[out], &policy, &[], &|_, n| (0..n as i64).collect());
        assert_eq!(plan.count(Collective::AllGather), 0, "{}", plan.report(&ctx));
    }
}
