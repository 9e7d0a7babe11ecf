//! The Qwen3-style decoder layer the `qwen3` target and the DFlash drafters
//! share (shardgraph-models/MODELS.md, sections 2.3 and 4.5-4.6): its
//! tensors ([`Qwen3Layer`], made by `new_layer` under a name prefix: none
//! for the target, `dft.` for a drafter), the K/V rows it writes (per-head
//! RMSNorm and NEOX rope on K), the layer itself (RMSNorm, Q, attention
//! over the KV cache, output projection, SwiGLU FFN, residuals), and
//! DFlash2's dynamic convolutions around its two sublayers
//! ([`LayerConv`], [`dflash2_conv`]).
//!
//! Built from the crate's shared graph builders (`layers.rs`); `qwen35`'s
//! gated attention makes its Q, K and V otherwise and does not use this
//! layer.

use super::hparams::HparamsCore;
use super::layers::{self, named, rms_norm_w, AttnShape, KvCache};
use super::types::{KvTypes, TensorTypes};
use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::ops::RopeParams;
use shardgraph::tensor::TensorId;

/// The long-lived tensors of one Qwen3-style decoder layer (a `qwen3`
/// target's layer, or a DFlash drafter's under `dft.`).
#[derive(Clone, Debug)]
pub struct Qwen3Layer {
    /// `blk.N.attn_norm.weight` `[E]`.
    pub attn_norm: TensorId,
    /// `blk.N.attn_q.weight` `[E, H·D]`.
    pub wq: TensorId,
    /// `blk.N.attn_k.weight` `[E, Hkv·D]`.
    pub wk: TensorId,
    /// `blk.N.attn_v.weight` `[E, Hkv·D]`.
    pub wv: TensorId,
    /// `blk.N.attn_output.weight` `[H·D, E]`.
    pub wo: TensorId,
    /// `blk.N.attn_q_norm.weight` `[D]`.
    pub q_norm: TensorId,
    /// `blk.N.attn_k_norm.weight` `[D]`.
    pub k_norm: TensorId,
    /// `blk.N.ffn_norm.weight` `[E]`.
    pub ffn_norm: TensorId,
    /// `blk.N.ffn_gate.weight` `[E, F]`.
    pub ffn_gate: TensorId,
    /// `blk.N.ffn_up.weight` `[E, F]`.
    pub ffn_up: TensorId,
    /// `blk.N.ffn_down.weight` `[F, E]`.
    pub ffn_down: TensorId,
    /// `cache_k_lN` `[Hkv·D, kv_size]`.
    pub cache_k: TensorId,
    /// `cache_v_lN` `[Hkv·D, kv_size]`.
    pub cache_v: TensorId,
}

/// What a Qwen3-style decoder layer needs besides its weights (the target's
/// layers and the DFlash drafter's share it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerShape {
    /// Heads and the KV cache's type.
    pub attn: AttnShape,
    /// RMSNorm ε (the layer norms and the q/k head norms).
    pub rms_eps: f32,
    /// Rope of Q and K.
    pub rope: RopeParams,
    /// KV cache cells.
    pub kv_size: i64,
}

impl LayerShape {
    /// The layers of `hp` with rope `rope` and KV caches of `kv_size` cells of `kv_types`.
    pub(crate) fn new(hp: &HparamsCore, rope: RopeParams, kv_types: KvTypes, kv_size: i64) -> Self {
        let attn = AttnShape { head_dim: hp.head_dim, n_head: hp.n_head, n_head_kv: hp.n_head_kv, kv_types };
        LayerShape { attn, rms_eps: hp.rms_eps, rope, kv_size }
    }
}

impl Qwen3Layer {
    /// The layer's KV cache.
    pub(crate) fn cache(&self) -> KvCache {
        KvCache { k: self.cache_k, v: self.cache_v }
    }
}

/// Creates one layer's weights (`{prefix}blk.{il}.*`, each of the type
/// `types` gives its GGUF name `blk.{il}.*`, checked for `model`) and caches
/// (`{prefix}cache_k_l{il}`, `{prefix}cache_v_l{il}`, `[Hkv·D, kv_size]` of
/// the K and V types).
///
/// # Errors
/// As [`TensorTypes`]' checks (a type the kernels cannot multiply, rows not
/// whole blocks, a vector that is not F32: naming the tensor and type);
/// constructor errors.
pub(crate) fn new_layer(
    ctx: &mut Context,
    (prefix, model): (&str, &str),
    il: usize,
    (e, f): (i64, i64),
    s: &LayerShape,
    types: &TensorTypes,
) -> Result<Qwen3Layer> {
    let a = &s.attn;
    let (d, qd, kvd) = (a.head_dim, a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
    let m = |ctx: &mut Context, n: &str, ne: &[i64]| -> Result<TensorId> {
        let name = format!("blk.{il}.{n}");
        let ty = types.matrix(model, &name, ne)?;
        named(ctx, ty, ne, &format!("{prefix}{name}"))
    };
    let v = |ctx: &mut Context, n: &str, ne: &[i64]| -> Result<TensorId> {
        let name = format!("blk.{il}.{n}");
        named(ctx, types.vector(model, &name)?, ne, &format!("{prefix}{name}"))
    };
    Ok(Qwen3Layer {
        attn_norm: v(ctx, "attn_norm.weight", &[e])?,
        wq: m(ctx, "attn_q.weight", &[e, qd])?,
        wk: m(ctx, "attn_k.weight", &[e, kvd])?,
        wv: m(ctx, "attn_v.weight", &[e, kvd])?,
        wo: m(ctx, "attn_output.weight", &[qd, e])?,
        q_norm: v(ctx, "attn_q_norm.weight", &[d])?,
        k_norm: v(ctx, "attn_k_norm.weight", &[d])?,
        ffn_norm: v(ctx, "ffn_norm.weight", &[e])?,
        ffn_gate: m(ctx, "ffn_gate.weight", &[e, f])?,
        ffn_up: m(ctx, "ffn_up.weight", &[e, f])?,
        ffn_down: m(ctx, "ffn_down.weight", &[f, e])?,
        cache_k: named(ctx, a.kv_types.k, &[kvd, s.kv_size], &format!("{prefix}cache_k_l{il}"))?,
        cache_v: named(ctx, a.kv_types.v, &[kvd, s.kv_size], &format!("{prefix}cache_v_l{il}"))?,
    })
}

/// `n` heads of `x` `[E, T]` projected by `w`, each RMS-normed with `norm`
/// and NEOX-roped at `pos`: `[D, n, T]` (Q and K alike).
fn normed_heads(
    ctx: &mut Context,
    (w, norm): (TensorId, TensorId),
    x: TensorId,
    pos: TensorId,
    (n, t): (i64, i64),
    s: &LayerShape,
) -> Result<TensorId> {
    let h = layers::heads(ctx, w, x, (s.attn.head_dim, n, t))?;
    let h = rms_norm_w(ctx, h, norm, s.rms_eps)?;
    ctx.rope_ext(h, pos, None, s.rope)
}

/// The K (per-head RMSNorm, rope) and V rows `[Hkv·D, T]` of hidden states
/// `h` `[E, T]` at `pos`, as the caches store them, for
/// [`layers::write_kv`] (the drafter's context injection) or
/// [`layers::attention`] (V goes through a `reshape_2d` to its own shape:
/// `qwen35`'s layers write V without it, so this stays here rather than in
/// [`super::layers`], and both graphs keep their nodes).
pub(crate) fn kv_rows(
    ctx: &mut Context,
    w: &Qwen3Layer,
    h: TensorId,
    pos: TensorId,
    t: i64,
    s: &LayerShape,
) -> Result<(TensorId, TensorId)> {
    let kvd = s.attn.n_head_kv * s.attn.head_dim;
    let k = normed_heads(ctx, (w.wk, w.k_norm), h, pos, (s.attn.n_head_kv, t), s)?;
    let v = ctx.mul_mat(w.wv, h)?;
    Ok((ctx.reshape_2d(k, kvd, t)?, ctx.reshape_2d(v, kvd, t)?))
}

/// DFlash2's convolutions around a layer's two sublayers
/// (shardgraph-models/MODELS.md, section 4.6).
#[derive(Clone, Copy, Debug)]
pub struct LayerConv {
    /// `blk.N.attn_conv_base` `[E, k, 2]`.
    pub attn_base: TensorId,
    /// `blk.N.attn_conv_proj.weight` `[E, 2·k·E/group]`.
    pub attn_proj: TensorId,
    /// `blk.N.ffn_conv_base` `[E, k, 2]`.
    pub ffn_base: TensorId,
    /// `blk.N.ffn_conv_proj.weight` `[E, 2·k·E/group]`.
    pub ffn_proj: TensorId,
    /// Channels per group (16).
    pub group: i64,
    /// Blocks in the batch (rows are split evenly among them).
    pub n_blocks: i64,
}

/// One Qwen3-style decoder layer over `x` `[E, T]`: RMSNorm, Q (per-head
/// norm, rope) and K/V written to the caches, flash attention over the
/// cache's window under `mask` (causal for the target, the whole block for
/// the DFlash drafter), output projection, residual; RMSNorm, SwiGLU FFN,
/// residual. With `conv` (DFlash2) each sublayer's input and output go
/// through the dynamic convolution. Returns the layer's output and its two
/// cache writes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decoder_layer(
    ctx: &mut Context,
    w: &Qwen3Layer,
    x: TensorId,
    pos: TensorId,
    mask: TensorId,
    kv_idxs: TensorId,
    t: i64,
    s: &LayerShape,
    conv: Option<&LayerConv>,
) -> Result<(TensorId, TensorId, TensorId)> {
    let xn = rms_norm_w(ctx, x, w.attn_norm, s.rms_eps)?;
    let (a, writes) = with_conv(ctx, conv.map(|c| (c, c.attn_proj, c.attn_base)), xn, |ctx, xn| {
        let q = normed_heads(ctx, (w.wq, w.q_norm), xn, pos, (s.attn.n_head, t), s)?;
        let rows = kv_rows(ctx, w, xn, pos, t, s)?;
        let (a, wk, wv) = layers::attention(ctx, q, rows, w.cache(), kv_idxs, mask, &s.attn)?;
        Ok((ctx.mul_mat(w.wo, a)?, (wk, wv)))
    })?;
    let hres = ctx.add(a, x)?;
    let hn = rms_norm_w(ctx, hres, w.ffn_norm, s.rms_eps)?;
    let (down, ()) = with_conv(ctx, conv.map(|c| (c, c.ffn_proj, c.ffn_base)), hn, |ctx, hn| {
        Ok((layers::swiglu_ffn(ctx, hn, w.ffn_gate, w.ffn_up, w.ffn_down)?, ()))
    })?;
    Ok((ctx.add(down, hres)?, writes.0, writes.1))
}

/// The sublayer `f` of `x`; with DFlash2's convolution (`conv`, its
/// sublayer's projection and base) its input and output go through
/// [`dflash2_conv`] with the δ projected from its input.
/// Returns `f`'s output and what else it returns.
fn with_conv<R>(
    ctx: &mut Context,
    conv: Option<(&LayerConv, TensorId, TensorId)>,
    x: TensorId,
    f: impl FnOnce(&mut Context, TensorId) -> Result<(TensorId, R)>,
) -> Result<(TensorId, R)> {
    let Some((c, proj, base)) = conv else { return f(ctx, x) };
    let delta = ctx.mul_mat(proj, x)?;
    let x = dflash2_conv(ctx, x, delta, base, 0, c.n_blocks, c.group)?;
    let (y, r) = f(ctx, x)?;
    Ok((dflash2_conv(ctx, y, delta, base, 1, c.n_blocks, c.group)?, r))
}

/// DFlash2's grouped dynamic two-tap depthwise convolution
/// (shardgraph-models/MODELS.md, section 4.6, `CONV(hidden, δ, base, side)`):
/// for every block of `t / n_blocks` rows,
/// `out[i, c] = Σ_τ (base[c, τ, side] + δ[g(c), τ, side, i]) · x[i − τ, c]`
/// with `g(c) = c / group` and taps that do not reach across the block start.
///
/// Shapes: `hidden` F32 `[E, T]`, `delta` F32 `[2·k·E/group, T]`
/// (layout `[E/group, k, 2]` per row), `base` F32 `[E, k, 2]`; `side` 0 is
/// the convolution before a sublayer, 1 the one after. Returns `[E, T]`.
///
/// # Errors
/// [`Error::Model`] if `group` does not divide E, `n_blocks` does not divide
/// T, or the shapes disagree; constructor errors.
pub fn dflash2_conv(
    ctx: &mut Context,
    hidden: TensorId,
    delta: TensorId,
    base: TensorId,
    side: usize,
    n_blocks: i64,
    group: i64,
) -> Result<TensorId> {
    let (x, dt, bt) = (ctx.tensor(hidden)?.clone(), ctx.tensor(delta)?.clone(), ctx.tensor(base)?.clone());
    let (e, t) = (x.ne[0], x.ne[1]);
    let k = bt.ne[1];
    let bad = |d: String| Error::Model { detail: format!("dflash2 conv: {d}") };
    if group < 1 || e % group != 0 || n_blocks < 1 || t % n_blocks != 0 || side > 1 || k < 1 {
        return Err(bad(format!("E {e}, group {group}, T {t}, blocks {n_blocks}, side {side}, taps {k}")));
    }
    let gc = e / group;
    if dt.ne[0] != 2 * k * gc || dt.ne[1] != t || bt.ne[0] != e || bt.ne[2] != 2 {
        return Err(bad(format!("δ {:?} and base {:?} do not fit hidden {:?}", dt.ne, bt.ne, x.ne)));
    }
    let bl = t / n_blocks;
    let f = 4usize; // F32
                    // Per-row kernel W[gs, Gc, k, T] = δ (this side, repeated over each group) + base (this side).
    let d4 = ctx.reshape_4d(delta, gc, k, 2, t)?;
    let nb3 = ctx.tensor(d4)?.nb[3];
    let c = ctx.view_3d(d4, gc, k, t, gc as usize * f, nb3, side * (gc * k) as usize * f)?;
    let c = ctx.cont(c)?;
    let c = ctx.reshape_4d(c, 1, gc, k, t)?;
    let c = ctx.repeat_4d(c, group, gc, k, t)?;
    let b = ctx.view_1d(base, e * k, side * (e * k) as usize * f)?;
    let b = ctx.reshape_4d(b, group, gc, k, 1)?;
    let w = ctx.add(c, b)?;
    let blocks = ctx.reshape_3d(hidden, e, bl, n_blocks)?;
    let wt = ctx.tensor(w)?.clone();
    let bnb = ctx.tensor(blocks)?.nb;
    let mut out: Option<TensorId> = None;
    for tap in 0..k.min(bl) {
        // The tap's kernel as [E, T].
        let wtap = ctx.view_3d(w, group, gc, t, wt.nb[1], wt.nb[3], tap as usize * wt.nb[2])?;
        let wtap = ctx.cont(wtap)?;
        let wtap = ctx.reshape_2d(wtap, e, t)?;
        // x shifted down by `tap` rows inside each block, zeros first.
        let shifted = if tap == 0 {
            ctx.reshape_2d(blocks, e, t)?
        } else {
            let head = ctx.view_3d(blocks, e, tap, n_blocks, bnb[1], bnb[2], 0)?;
            let head = ctx.cont(head)?;
            let zeros = ctx.fill(head, 0.0)?;
            let body = ctx.view_3d(blocks, e, bl - tap, n_blocks, bnb[1], bnb[2], 0)?;
            let s = ctx.concat(zeros, body, 1)?;
            ctx.reshape_2d(s, e, t)?
        };
        let term = ctx.mul(wtap, shifted)?;
        out = Some(match out {
            None => term,
            Some(acc) => ctx.add(acc, term)?,
        });
    }
    out.ok_or_else(|| bad("no taps".into()))
}
