//! A Qwen3-style graph with real tensor names and llama.cpp's tensor-split
//! policy, shared by the split tests and the planning bench.
#![allow(dead_code)]

use shardgraph::split::{SplitPolicy, SplitSpec};
use shardgraph::{Context, GgmlType, RopeMode, RopeParams, TensorId};

// The shared fixtures come with this file (the planning bench includes it
// alone; a test including both would load `fixtures.rs` twice).
#[path = "fixtures.rs"]
pub mod fixtures;
pub use fixtures::{input, named};

/// A Qwen3-style block (shardgraph-models/MODELS.md, section 2.3): RMSNorm,
/// Q/K/V with per-head q/k RMSNorm and NEOX rope, flash attention with GQA,
/// output projection, residual, RMSNorm, SwiGLU FFN, residual.
pub struct Dims {
    /// n_embd.
    pub e: i64,
    /// Query heads.
    pub h: i64,
    /// KV heads.
    pub hkv: i64,
    /// Head size.
    pub d: i64,
    /// n_ff.
    pub f: i64,
    /// Tokens.
    pub t: i64,
}

pub fn qwen3_layers(ctx: &mut Context, dm: &Dims, n_layer: usize) -> TensorId {
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

/// llama.cpp's `--split-mode tensor` policy (shardgraph-models/MODELS.md,
/// section 7): Q on whole GQA groups (`g` query heads per KV head), K/V on
/// whole heads, the output projection and FFN down on their input axis, FFN
/// gate/up on rows.
pub fn qwen3_policy(ratios: &[f32], d: i64, g: i64) -> SplitPolicy {
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
