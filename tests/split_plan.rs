//! Split planning (no execution yet): the planner's states and repartition
//! bytes for the head-into-row-op cases of docs/split-design.md, section 5,
//! non-linear consumers of partial sums, plan caching and reports. (The
//! Megatron minimum of a Qwen3-style layer lives in split_regressions.rs.)

#[path = "common/qwen3.rs"]
mod qwen3;

use qwen3::{input, named, qwen3_layers, qwen3_policy, Dims};
use shardgraph::split::{Collective, Planner, SplitPolicy, SplitSpec, SplitState};
use shardgraph::{Context, GgmlType};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::types::TensorTypes;

#[test]
fn vocab_split_head_feeds_row_ops_without_gathering_logits() {
    for ratios in [vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0]] {
        let (e, v, t) = (64, 1000, 3);
        let mut ctx = Context::new();
        let w = named(&mut ctx, GgmlType::Q8_0, &[e, v], "output.weight");
        let x = input(&mut ctx, GgmlType::F32, &[e, t], "x");
        let logits = ctx.mul_mat(w, x).unwrap();
        let outs = [
            ctx.argmax(logits).unwrap(),
            ctx.top_k(logits, 4).unwrap(),
            ctx.soft_max(logits).unwrap(),
            ctx.rms_norm(logits, 1e-6).unwrap(),
            ctx.sum_rows(logits).unwrap(),
            ctx.mean(logits).unwrap(),
        ];
        let g = ctx.build_forward(&outs).unwrap();
        let policy = SplitPolicy::new(&ratios)
            .unwrap()
            .rule("output.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
        let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
        assert!(matches!(plan.state(logits), Some(SplitState::Split(s)) if s.axis == 0), "{}", plan.report(&ctx));
        assert_eq!(plan.count(Collective::AllGather), 0, "logits must not be gathered:\n{}", plan.report(&ctx));
        assert_eq!(plan.count(Collective::RowCombine), 6, "{}", plan.report(&ctx));
        assert_eq!(plan.state(outs[0]), Some(&SplitState::Mirrored));
        assert!(matches!(plan.state(outs[2]), Some(SplitState::Split(_))), "soft_max stays split");
        // The combines are tiny next to the logits.
        let logits_bytes = (v * t * 4) as u64;
        assert!(plan.total_bytes() < logits_bytes, "{}", plan.report(&ctx));
    }
}

#[test]
fn partial_sums_are_reduced_only_for_non_linear_consumers() {
    let mut ctx = Context::new();
    let w = named(&mut ctx, GgmlType::F32, &[32, 16], "w");
    let a = named(&mut ctx, GgmlType::F32, &[32, 4], "a");
    let y = ctx.mul_mat(w, a).unwrap(); // partial
    let lin = ctx.scale(y, 0.5).unwrap(); // stays partial
    let lin2 = ctx.add(lin, y).unwrap(); // partial + partial
    let nl = ctx.rms_norm(lin2, 1e-6).unwrap(); // needs the sum
    let s = ctx.silu(y).unwrap(); // needs the sum (y reduced once, reused)
    let g = ctx.build_forward(&[nl, s]).unwrap();
    let policy =
        SplitPolicy::new(&[1.0, 1.0]).unwrap().rule("*", SplitSpec::Axis { axis: 0, granule: 1, segments: vec![] });
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    assert_eq!(plan.state(y), Some(&SplitState::partial()));
    assert_eq!(plan.state(lin), Some(&SplitState::partial()));
    assert_eq!(plan.state(lin2), Some(&SplitState::partial()));
    assert_eq!(plan.count(Collective::AllReduce), 2, "{}", plan.report(&ctx));
    assert!(plan.states.iter().flatten().all(|s| *s != SplitState::Unknown));
    // C7(c): a product of two partial sums reduces one factor first.
    let mut ctx = Context::new();
    let w = named(&mut ctx, GgmlType::F32, &[32, 16], "w");
    let a = named(&mut ctx, GgmlType::F32, &[32, 16], "a");
    let p1 = ctx.mul_mat(w, a).unwrap(); // [16, 16] partial
    let p2 = ctx.mul_mat(a, w).unwrap(); // [16, 16] partial
    let pp = ctx.mul_mat(p1, p2).unwrap();
    let g = ctx.build_forward(&[pp]).unwrap();
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    assert_eq!(plan.state(pp), Some(&SplitState::partial()));
    assert_eq!(plan.count(Collective::AllReduce), 1, "{}", plan.report(&ctx));
}

#[test]
fn uncovered_leaf_is_an_error_naming_it() {
    let mut ctx = Context::new();
    let w = named(&mut ctx, GgmlType::F32, &[8, 8], "blk.0.mystery.weight");
    let x = input(&mut ctx, GgmlType::F32, &[8, 2], "x");
    let y = ctx.mul_mat(w, x).unwrap();
    let g = ctx.build_forward(&[y]).unwrap();
    let e = Planner::default().plan(&ctx, &g, &SplitPolicy::new(&[1.0, 1.0]).unwrap(), &[]).unwrap_err();
    assert!(e.to_string().contains("blk.0.mystery.weight"), "{e}");
    // A policy that splits a Q4_0 row off its blocks names tensor and rule.
    let mut ctx = Context::new();
    let w = named(&mut ctx, GgmlType::Q4_0, &[64, 8], "w");
    let x = input(&mut ctx, GgmlType::F32, &[64, 2], "x");
    let y = ctx.mul_mat(w, x).unwrap();
    let g = ctx.build_forward(&[y]).unwrap();
    let pol =
        SplitPolicy::new(&[1.0, 1.0]).unwrap().rule("w", SplitSpec::Axis { axis: 0, granule: 16, segments: vec![] });
    let e = Planner::default().plan(&ctx, &g, &pol, &[]).unwrap_err();
    assert!(e.to_string().contains("\"w\"") && e.to_string().contains("block"), "{e}");
}

#[test]
fn plans_are_cached_reported_and_sized_before_allocation() {
    let dm = Dims { e: 256, h: 8, hkv: 2, d: 32, f: 768, t: 1 };
    let mut ctx = Context::new();
    let out = qwen3_layers(&mut ctx, &dm, 2);
    let g = ctx.build_forward(&[out]).unwrap();
    let policy = qwen3_policy(&[1.0, 1.0], dm.d, dm.h / dm.hkv);
    let mut planner = Planner::default();
    let first = planner.plan_cached(&ctx, &g, &policy, &[]).unwrap().total_bytes();
    let again = planner.plan_cached(&ctx, &g, &policy, &[]).unwrap().total_bytes();
    assert_eq!((first, again, planner.cached()), (first, first, 1));
    // Another tensor split is another plan.
    planner.plan_cached(&ctx, &g, &qwen3_policy(&[3.0, 1.0], dm.d, 4), &[]).unwrap();
    assert_eq!(planner.cached(), 2);

    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    let dot = plan.to_dot(&ctx, &g).unwrap();
    assert!(dot.starts_with("digraph plan") && dot.contains("all-reduce") && dot.contains("lightblue"));
    // Weights: each device holds half of every split matrix and all of the norms.
    let per_dev = plan.leaf_bytes_per_device(&ctx, &g).unwrap();
    let (mut split, mut mirrored) = (0u64, 0u64);
    for &l in g.leafs() {
        let t = ctx.tensor(l).unwrap();
        match plan.state(l).unwrap() {
            SplitState::Split(_) => split += t.nbytes() as u64,
            _ => mirrored += t.nbytes() as u64,
        }
    }
    assert_eq!(per_dev, vec![split / 2 + mirrored, split / 2 + mirrored]);
    assert!(plan.report(&ctx).contains("total:"));
}

#[test]
fn plan_memory_per_device_is_known_before_allocation() {
    // Weights, inputs and compute of Qwen3-style layers on 1 and 2 devices.
    let dm = Dims { e: 256, h: 8, hkv: 2, d: 32, f: 768, t: 4 };
    let mut ctx = Context::new();
    let out = qwen3_layers(&mut ctx, &dm, 2);
    let g = ctx.build_forward(&[out]).unwrap();
    let one = Planner::default().plan(&ctx, &g, &qwen3_policy(&[1.0], dm.d, 4), &[]).unwrap();
    let two = Planner::default().plan(&ctx, &g, &qwen3_policy(&[1.0, 1.0], dm.d, 4), &[]).unwrap();
    let m1 = one.memory(&ctx, &g).unwrap();
    let m2 = two.memory(&ctx, &g).unwrap();
    let (mut split, mut mirrored, mut inputs) = (0u64, 0u64, 0u64);
    for &l in g.leafs() {
        let t = ctx.tensor(l).unwrap();
        if t.flags.input {
            inputs += t.nbytes() as u64;
        } else if t.name.is_empty() {
            // `cast` destinations: scratch, counted with compute.
        } else if matches!(two.state(l).unwrap(), SplitState::Split(_)) {
            split += t.nbytes() as u64;
        } else {
            mirrored += t.nbytes() as u64;
        }
    }
    assert_eq!(m1[0].weights, split + mirrored);
    for m in &m2 {
        assert_eq!((m.weights, m.inputs, m.caches), (split / 2 + mirrored, inputs, 0));
    }
    // Each device's largest subgraph is smaller than the one-device graph.
    assert!(m1[0].compute > 0 && m2[0].compute > 0 && m2[0].compute < m1[0].compute, "{m1:?} {m2:?}");

    // A K cache written by set_rows and split by heads: half on each device.
    let mut ctx = Context::new();
    let cache = named(&mut ctx, GgmlType::F16, &[64, 16], "cache_k_l0");
    let rows = ctx.new_tensor(GgmlType::F32, &[64, 3]).unwrap();
    ctx.set_input(rows).unwrap();
    let idx = ctx.new_tensor(GgmlType::I64, &[3]).unwrap();
    ctx.set_input(idx).unwrap();
    let w = ctx.set_rows(cache, rows, idx).unwrap();
    let g = ctx.build_forward(&[w]).unwrap();
    let policy = SplitPolicy::new(&[1.0, 1.0]).unwrap();
    let plan = Planner::default().plan(&ctx, &g, &policy, &[(cache, SplitState::split(0, vec![32, 32]))]).unwrap();
    let m = plan.memory(&ctx, &g).unwrap();
    assert_eq!(m[0].caches, 64 * 16 * 2 / 2);
    assert_eq!(m[1].caches, 64 * 16 * 2 / 2);
    assert_eq!(m[0].inputs, 64 * 3 * 4 + 3 * 8);
    assert_eq!(plan.total_bytes(), 0, "{}", plan.report(&ctx));
    let text = plan.describe(&ctx, &g).unwrap();
    assert!(
        text.contains("cache_k_l0") && text.contains("per device [32, 32]") && text.contains("device 1: 0 1024"),
        "{text}"
    );
}

/// A tensor split that gives one device everything (`--tensor-split 0,1`)
/// plans like one device: no weight is re-laid out each step (a conversion
/// that moves nothing between devices still rewrites the tensor locally, and
/// the planner charges it), and the busy device's compute peak stays that of
/// a one-device plan. Found by trying the dflash2 example with `0,1`: 702
/// zero-byte all-to-alls of whole weights made decoding 2.5× slower than one
/// device.
#[test]
fn a_zero_ratio_device_does_not_make_the_others_relayout_weights() {
    use shardgraph_models::qwen3::qwen3_policy;
    use shardgraph_models::qwen3::{Qwen3, Qwen3Hparams};
    let hp = Qwen3Hparams { core: HparamsCore::qwen3(4, 1024, 2816, 16, 8, 64), n_vocab: 8192, n_ctx_train: 4096 };
    let types = TensorTypes::q4_k_m();
    let plan_for = |ratios: &[f32]| {
        let mut ctx = Context::new();
        let m = Qwen3::new(&mut ctx, hp.clone(), &types, GgmlType::F16, 256).unwrap();
        let step = m.build(&mut ctx, 1, &[]).unwrap();
        let g = ctx.build_forward(&step.outputs()).unwrap();
        let policy = qwen3_policy(&hp, &types, ratios).unwrap();
        let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
        let mem = plan.memory(&ctx, &g).unwrap();
        (plan, mem, ctx)
    };
    let (_, one, _) = plan_for(&[1.0]);
    for ratios in [[0.0, 1.0], [1.0, 0.0]] {
        let (plan, mem, ctx) = plan_for(&ratios);
        let busy = if ratios[0] == 0.0 { 1 } else { 0 };
        for r in &plan.repartitions {
            let t = ctx.tensor(r.tensor).unwrap();
            assert!(
                !(t.name.ends_with(".weight") && t.ne[1] > 1),
                "{ratios:?}: weight {} re-laid out ({:?} -> {:?})",
                t.name,
                r.from,
                r.to
            );
        }
        assert!(
            mem[busy].compute <= one[0].compute,
            "{ratios:?}: compute {} vs one device {}",
            mem[busy].compute,
            one[0].compute
        );
    }
}

/// A window of the first `n_kv` cells of a head-split KV cache (a view
/// `[D, H_kv, n_kv]` of `[D·H_kv, kv]`, as the models read it) stays split
/// whatever the cache size: a cache of 4104 cells (4096 + a drafter's block
/// of 8) or 300 plans the same bytes as one of 4096 and gathers nothing.
/// (The view's geometry used to take the cache's shape from the window's
/// own outer stride, which fits only caches of a multiple of the window:
/// every step all-gathered the whole cache.)
#[test]
fn kv_window_of_any_cache_size_stays_split() {
    let plan_bytes = |kv: i64, n_kv: i64| {
        let mut ctx = Context::new();
        let cache = named(&mut ctx, GgmlType::F16, &[256, kv], "cache_k_l0"); // 2 KV heads of 128
        let row = ctx.tensor(cache).unwrap().nb[1];
        let win = ctx.view_3d(cache, 128, 2, n_kv, 128 * 2, row, 0).unwrap(); // [D, H_kv, n_kv]
        let q = input(&mut ctx, GgmlType::F32, &[128, 1, 4], "q"); // [D, T, H]
        let k = ctx.permute(win, [0, 2, 1, 3]).unwrap(); // [D, n_kv, H_kv]
        let kq = ctx.mul_mat(k, q).unwrap();
        let g = ctx.build_forward(&[kq]).unwrap();
        let policy = SplitPolicy::new(&[1.0, 1.0])
            .unwrap()
            .rule("cache_k_l*", SplitSpec::Axis { axis: 0, granule: 128, segments: vec![] });
        let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
        // The window is read where it lies (the mirrored q's heads make
        // the product gather the window's scores, not the cache).
        assert!(matches!(plan.state(win), Some(SplitState::Split(_))), "kv {kv}:\n{}", plan.report(&ctx));
        assert!(!plan.report(&ctx).contains("cache_k_l0 split"), "kv {kv}: the cache moves:\n{}", plan.report(&ctx));
        plan.total_bytes()
    };
    for n_kv in [1, 256, 512] {
        let want = plan_bytes(4096, n_kv);
        for kv in [4104, 4097, 4352, 65544, 600] {
            assert_eq!(plan_bytes(kv, n_kv), want, "kv {kv}, window {n_kv}");
        }
    }
    plan_bytes(300, 300);
}

/// A weight split along K for memory, with an output much larger than the
/// weight: the cost model alone all-gathers the weight (fewer bytes than
/// reducing the partial sums), putting all of it in every device's compute
/// memory. With `keep_weights_split` the planner reads it where it lies
/// (partial sums, then their reduction), and the run still equals one
/// device with the plan's bytes moved.
#[test]
fn keep_weights_split_never_gathers_a_split_weight() {
    use shardgraph::split::Devices;
    let (k, m, t) = (256i64, 1024i64, 64i64);
    let mut ctx = Context::new();
    let w = named(&mut ctx, GgmlType::Q8_0, &[k, m], "w");
    let x = input(&mut ctx, GgmlType::F32, &[k, t], "x");
    let y = ctx.mul_mat(w, x).unwrap();
    let out = ctx.sum_rows(y).unwrap();
    let g = ctx.build_forward(&[out]).unwrap();
    let devices = Devices::cpu(3, 1).unwrap();
    let rule = |p: SplitPolicy| p.rule("w", SplitSpec::Axis { axis: 0, granule: 32, segments: vec![] });
    let gathers_w = |plan: &shardgraph::split::Plan| plan.repartitions.iter().filter(|r| r.tensor == w).count();
    let free = rule(devices.policy().unwrap());
    let plan_free = Planner::default().plan(&ctx, &g, &free, &[]).unwrap();
    assert_eq!(gathers_w(&plan_free), 1, "the cost model gathers w here:\n{}", plan_free.report(&ctx));
    let kept = rule(devices.policy().unwrap()).keep_weights_split(true);
    assert!(kept.keeps_weights_split());
    let plan = Planner::default().plan(&ctx, &g, &kept, &[]).unwrap();
    assert_eq!(gathers_w(&plan), 0, "w is converted:\n{}", plan.report(&ctx));
    assert!(matches!(plan.state(y), Some(SplitState::Partial(_))), "{}", plan.report(&ctx));
    // Executed: equal to one device, bytes as planned.
    let values = |n: i64, s: f32| (0..n).map(|i| ((i as f32) * s).sin() / 4.0).collect::<Vec<f32>>();
    let run = |devices: &Devices, plan: &shardgraph::split::Plan| {
        let mut store = devices.store();
        store.place_leafs(&ctx, &g, plan).unwrap();
        store.set_f32(&ctx, w, &values(k * m, 0.37)).unwrap();
        store.set_f32(&ctx, x, &values(k * t, 1.3)).unwrap();
        let rep = devices.executor().unwrap().execute(&ctx, &g, plan, &mut store, &[out]).unwrap();
        assert_eq!(rep.bytes_moved, plan.total_bytes());
        rep.f32(0).unwrap()
    };
    let one = Devices::cpu(1, 1).unwrap();
    let plan_one =
        Planner::default().plan(&ctx, &g, &one.policy().unwrap().rule("w", SplitSpec::Mirrored), &[]).unwrap();
    let (want, got) = (run(&one, &plan_one), run(&devices, &plan));
    let err = want.iter().zip(&got).map(|(a, b)| (a - b).abs() / a.abs().max(1.0)).fold(0f32, f32::max);
    assert!(err < 1e-4, "max relative error {err}");
}
