//! Split planning (no execution yet): the planner's states and repartition
//! bytes for the DESIGN.md section 5 head-into-row-op cases, non-linear
//! consumers of partial sums, and the Megatron minimum of a Qwen3-style layer.

use shardgraph::split::{Collective, Planner, SplitPolicy, SplitSpec, SplitState};
use shardgraph::{Context, GgmlType, RopeMode, RopeParams, TensorId};

fn named(ctx: &mut Context, ty: GgmlType, ne: &[i64], name: &str) -> TensorId {
    let t = ctx.new_tensor(ty, ne).unwrap();
    ctx.set_name(t, name).unwrap();
    t
}

fn input(ctx: &mut Context, ty: GgmlType, ne: &[i64], name: &str) -> TensorId {
    let t = named(ctx, ty, ne, name);
    ctx.set_input(t).unwrap();
    t
}

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

/// A Qwen3-style block (MODELS.md section 2): RMSNorm, Q/K/V with per-head
/// q/k RMSNorm and NEOX rope, flash attention with GQA, output projection,
/// residual, RMSNorm, SwiGLU FFN, residual.
struct Dims {
    e: i64,
    h: i64,
    hkv: i64,
    d: i64,
    f: i64,
    t: i64,
}

fn qwen3_layers(ctx: &mut Context, dm: &Dims, n_layer: usize) -> TensorId {
    let (e, h, hkv, d, f, t) = (dm.e, dm.h, dm.hkv, dm.d, dm.f, dm.t);
    let mut x = input(ctx, GgmlType::F32, &[e, t], "inp_embd");
    let pos = input(ctx, GgmlType::I32, &[t], "inp_pos");
    let mask = input(ctx, GgmlType::F16, &[t, t], "kq_mask");
    let rope = RopeParams { n_dims: d as i32, mode: RopeMode::Neox, freq_base: 1e6, ..RopeParams::default() };
    for il in 0..n_layer {
        let w = |ctx: &mut Context, name: &str, ne: &[i64]| named(ctx, GgmlType::Q8_0, ne, &format!("blk.{il}.{name}"));
        let attn_norm = named(ctx, GgmlType::F32, &[e], &format!("blk.{il}.attn_norm.weight"));
        let ffn_norm = named(ctx, GgmlType::F32, &[e], &format!("blk.{il}.ffn_norm.weight"));
        let q_norm = named(ctx, GgmlType::F32, &[d], &format!("blk.{il}.attn_q_norm.weight"));
        let k_norm = named(ctx, GgmlType::F32, &[d], &format!("blk.{il}.attn_k_norm.weight"));
        let wq = w(ctx, "attn_q.weight", &[e, h * d]);
        let wk = w(ctx, "attn_k.weight", &[e, hkv * d]);
        let wv = w(ctx, "attn_v.weight", &[e, hkv * d]);
        let wo = w(ctx, "attn_output.weight", &[h * d, e]);
        let wg = w(ctx, "ffn_gate.weight", &[e, f]);
        let wu = w(ctx, "ffn_up.weight", &[e, f]);
        let wd = w(ctx, "ffn_down.weight", &[f, e]);

        let xn = ctx.rms_norm(x, 1e-6).unwrap();
        let xn = ctx.mul(xn, attn_norm).unwrap();
        let q = ctx.mul_mat(wq, xn).unwrap();
        let q = ctx.reshape_3d(q, d, h, t).unwrap();
        let q = ctx.rms_norm(q, 1e-6).unwrap();
        let q = ctx.mul(q, q_norm).unwrap();
        let q = ctx.rope_ext(q, pos, None, rope).unwrap();
        let k = ctx.mul_mat(wk, xn).unwrap();
        let k = ctx.reshape_3d(k, d, hkv, t).unwrap();
        let k = ctx.rms_norm(k, 1e-6).unwrap();
        let k = ctx.mul(k, k_norm).unwrap();
        let k = ctx.rope_ext(k, pos, None, rope).unwrap();
        let v = ctx.mul_mat(wv, xn).unwrap();
        let v = ctx.reshape_3d(v, d, hkv, t).unwrap();
        let q = ctx.permute(q, [0, 2, 1, 3]).unwrap();
        let k = ctx.permute(k, [0, 2, 1, 3]).unwrap();
        let v = ctx.permute(v, [0, 2, 1, 3]).unwrap();
        let k = ctx.cast(k, GgmlType::F16).unwrap();
        let v = ctx.cast(v, GgmlType::F16).unwrap();
        let a = ctx.flash_attn_ext(q, k, v, Some(mask), 1.0 / (d as f32).sqrt(), 0.0, 0.0).unwrap();
        let a = ctx.reshape_2d(a, h * d, t).unwrap();
        let a = ctx.mul_mat(wo, a).unwrap();
        let hres = ctx.add(a, x).unwrap();

        let hn = ctx.rms_norm(hres, 1e-6).unwrap();
        let hn = ctx.mul(hn, ffn_norm).unwrap();
        let gate = ctx.mul_mat(wg, hn).unwrap();
        let up = ctx.mul_mat(wu, hn).unwrap();
        let act = ctx.swiglu_split(gate, up).unwrap();
        let down = ctx.mul_mat(wd, act).unwrap();
        x = ctx.add(down, hres).unwrap();
    }
    let out_norm = named(ctx, GgmlType::F32, &[e], "output_norm.weight");
    let xn = ctx.rms_norm(x, 1e-6).unwrap();
    ctx.mul(xn, out_norm).unwrap()
}

/// llama.cpp's `--split-mode tensor` policy (MODELS.md section 5): Q on
/// whole GQA groups (`g` query heads per KV head), K/V on whole heads, the
/// output projection and FFN down on their input axis, FFN gate/up on rows.
fn qwen3_policy(ratios: &[f32], d: i64, g: i64) -> SplitPolicy {
    let heads = SplitSpec::Axis { axis: 1, granule: d, segments: vec![] };
    SplitPolicy::new(ratios)
        .unwrap()
        .rule("blk.*.attn_q.weight", SplitSpec::Axis { axis: 1, granule: g * d, segments: vec![] })
        .rule("blk.*.attn_k.weight", heads.clone())
        .rule("blk.*.attn_v.weight", heads)
        .rule("blk.*.attn_output.weight", SplitSpec::Axis { axis: 0, granule: g * d, segments: vec![] })
        .rule("blk.*.ffn_gate.weight", SplitSpec::Axis { axis: 1, granule: 32, segments: vec![] })
        .rule("blk.*.ffn_up.weight", SplitSpec::Axis { axis: 1, granule: 32, segments: vec![] })
        .rule("blk.*.ffn_down.weight", SplitSpec::Axis { axis: 0, granule: 32, segments: vec![] })
        .rule("*norm*", SplitSpec::Mirrored)
}

#[test]
fn qwen3_layers_move_exactly_the_megatron_minimum() {
    for (ratios, n_layer, h, hkv) in [
        (vec![1.0, 1.0], 2, 8, 2),
        (vec![1.0, 1.0, 1.0, 1.0], 3, 16, 4),
        (vec![3.0, 1.0], 1, 16, 4),
        (vec![1.0, 1.0, 1.0], 2, 12, 3),
    ] {
        let dm = Dims { e: 256, h, hkv, d: 32, f: 768, t: 5 };
        let mut ctx = Context::new();
        let out = qwen3_layers(&mut ctx, &dm, n_layer);
        let g = ctx.build_forward(&[out]).unwrap();
        let plan = Planner::default().plan(&ctx, &g, &qwen3_policy(&ratios, dm.d, h / hkv), &[]).unwrap();
        let n = ratios.len() as u64;
        let b = (dm.e * dm.t * 4) as u64;
        let all_reduce = 2 * b * (n - 1);
        assert_eq!(plan.count(Collective::AllGather), 0, "{}", plan.report(&ctx));
        assert_eq!(plan.count(Collective::AllReduce), 2 * n_layer, "{}", plan.report(&ctx));
        assert_eq!(plan.total_bytes(), 2 * n_layer as u64 * all_reduce, "{}", plan.report(&ctx));
    }
}
