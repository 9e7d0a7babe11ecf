//! Graph builders the models share: named tensors and inputs, RMSNorm with
//! a weight, projections into heads, the SwiGLU FFN, attention over a KV
//! cache (K/V rows written with `set_rows`, the step's window viewed per KV
//! head, `flash_attn_ext`), and the greedy token's probability.
//!
//! Users: `qwen3`'s layers and the DFlash drafter's (one decoder layer,
//! [`super::qwen3`]), `qwen35`'s full-attention layers and its NextN (MTP)
//! block. What differs between them stays with each model, because it is
//! not the same graph:
//!
//! * how Q and K are made: `qwen3`/DFlash project each, norm and NEOX-rope
//!   it at once, and reshape V before the cache write; `qwen35` splits Q
//!   from a per-head sigmoid gate interleaved with it (views of one
//!   projection), ropes Q and K with IMROPE after V is projected, writes V
//!   as projected, and gates the attention output;
//! * `qwen35`'s Gated-DeltaNet states: one-row conv and recurrent states
//!   (another cache layout), written with `cpy`, and their snapshots;
//! * DFlash2's convolutions around a layer's sublayers ([`super::dflash`]).
//!
//! DFlash's block attention is non-causal only through its mask (every row
//! sees the whole block), so it is this attention.

use super::types::KvTypes;
use shardgraph::error::Result;
use shardgraph::graph::Context;
use shardgraph::tensor::{GgmlType, TensorId};

/// A new tensor of `ty` and shape `ne` named `name`.
///
/// # Errors
/// Constructor errors.
pub(crate) fn named(ctx: &mut Context, ty: GgmlType, ne: &[i64], name: &str) -> Result<TensorId> {
    let id = ctx.new_tensor(ty, ne)?;
    ctx.set_name(id, name)?;
    Ok(id)
}

/// A new graph input of `ty` and shape `ne` named `name`.
///
/// # Errors
/// Constructor errors.
pub(crate) fn input(ctx: &mut Context, ty: GgmlType, ne: &[i64], name: &str) -> Result<TensorId> {
    let id = named(ctx, ty, ne, name)?;
    ctx.set_input(id)?;
    Ok(id)
}

/// `rms_norm(x, eps) · w`: RMSNorm over rows, scaled by the weight `w`
/// (broadcast over rows; per head for a `[D]` head norm of `[D, H, T]`).
///
/// # Errors
/// Constructor errors.
pub(crate) fn rms_norm_w(ctx: &mut Context, x: TensorId, w: TensorId, eps: f32) -> Result<TensorId> {
    let n = ctx.rms_norm(x, eps)?;
    ctx.mul(n, w)
}

/// `w · x` viewed as `n` heads of `d`: `[d, n, t]`.
///
/// # Errors
/// Constructor errors.
pub(crate) fn heads(ctx: &mut Context, w: TensorId, x: TensorId, (d, n, t): (i64, i64, i64)) -> Result<TensorId> {
    let p = ctx.mul_mat(w, x)?;
    ctx.reshape_3d(p, d, n, t)
}

/// The SwiGLU FFN of `x` `[E, T]`: `down · (silu(gate · x) ⊙ (up · x))`,
/// `[E, T]`.
///
/// # Errors
/// Constructor errors.
pub(crate) fn swiglu_ffn(
    ctx: &mut Context,
    x: TensorId,
    gate: TensorId,
    up: TensorId,
    down: TensorId,
) -> Result<TensorId> {
    let u = ctx.mul_mat(up, x)?;
    let g = ctx.mul_mat(gate, x)?;
    let act = ctx.swiglu_split(g, u)?;
    ctx.mul_mat(down, act)
}

/// A layer's KV cache: `k` and `v`, `[Hkv·D, kv_size]` each (cell =
/// position).
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvCache {
    /// `cache_k_lN`.
    pub k: TensorId,
    /// `cache_v_lN`.
    pub v: TensorId,
}

/// The heads of attention over a KV cache and the cache's types.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnShape {
    /// Head size D.
    pub head_dim: i64,
    /// Query heads H.
    pub n_head: i64,
    /// KV heads Hkv.
    pub n_head_kv: i64,
    /// The K and V caches' types.
    pub kv_types: KvTypes,
}

/// Writes a step's K and V rows (`[Hkv·D, T]` each) into `cache` at the
/// cells `kv_idxs` (I64 `[T]`, `set_rows`); returns the two writes (graph
/// outputs, and what attention reads the cache through).
///
/// # Errors
/// Constructor errors.
pub(crate) fn write_kv(
    ctx: &mut Context,
    cache: KvCache,
    (k_rows, v_rows): (TensorId, TensorId),
    kv_idxs: TensorId,
) -> Result<(TensorId, TensorId)> {
    Ok((ctx.set_rows(cache.k, k_rows, kv_idxs)?, ctx.set_rows(cache.v, v_rows, kv_idxs)?))
}

/// Attention of `q` `[D, H, T]` (normed and roped) over the first `n_kv`
/// cells of the caches as written by `wk` and `wv` ([`write_kv`]), `n_kv`
/// being the columns of `mask` (F16 `[n_kv, T]`, 0 or −inf: causal for a
/// target, the whole block for the DFlash drafter). The cells are viewed
/// `[D, n_kv, Hkv]` (heads on axis 2, as `flash_attn_ext` takes K/V; GQA
/// groups share a KV head), the scale is `1/√D`. Returns `[H·D, T]`.
///
/// # Errors
/// Constructor errors.
pub(crate) fn attend(
    ctx: &mut Context,
    q: TensorId,
    (wk, wv): (TensorId, TensorId),
    mask: TensorId,
    s: &AttnShape,
) -> Result<TensorId> {
    let (d, h, hkv) = (s.head_dim, s.n_head, s.n_head_kv);
    let t = ctx.tensor(q)?.ne[2];
    let n_kv = ctx.tensor(mask)?.ne[0];
    let view = |ctx: &mut Context, w: TensorId, ty: GgmlType| -> Result<TensorId> {
        let v = ctx.view_3d(w, d, hkv, n_kv, ty.row_size(d)?, ty.row_size(hkv * d)?, 0)?;
        ctx.permute(v, [0, 2, 1, 3])
    };
    let kc = view(ctx, wk, s.kv_types.k)?;
    let vc = view(ctx, wv, s.kv_types.v)?;
    let q = ctx.permute(q, [0, 2, 1, 3])?; // [D, T, H]
    let a = ctx.flash_attn_ext(q, kc, vc, Some(mask), 1.0 / (d as f32).sqrt(), 0.0, 0.0)?; // [D, H, T]
    ctx.reshape_2d(a, h * d, t)
}

/// Attention with a KV cache: the step's K and V rows written into `cache`
/// at `kv_idxs` ([`write_kv`]), then `q` attending over the cache's window
/// ([`attend`]). Returns `([H·D, T], K write, V write)`.
///
/// # Errors
/// Constructor errors.
pub(crate) fn attention(
    ctx: &mut Context,
    q: TensorId,
    kv_rows: (TensorId, TensorId),
    cache: KvCache,
    kv_idxs: TensorId,
    mask: TensorId,
    s: &AttnShape,
) -> Result<(TensorId, TensorId, TensorId)> {
    let (wk, wv) = write_kv(ctx, cache, kv_rows, kv_idxs)?;
    let a = attend(ctx, q, (wk, wv), mask, s)?;
    Ok((a, wk, wv))
}

/// The probability of each row's greedy token: `soft_max` of `logits`
/// `[V, T]` read at `argmax` (I32 `[T]`) with `get_rows`, F32 `[1, 1, T]`
/// (computed where a vocabulary-split head's slices live, so only `T`
/// floats leave the devices).
///
/// # Errors
/// Constructor errors.
pub(crate) fn top_prob(ctx: &mut Context, logits: TensorId, argmax: TensorId) -> Result<TensorId> {
    let [v, t, ..] = ctx.tensor(logits)?.ne;
    let probs = ctx.soft_max(logits)?;
    let probs = ctx.reshape_3d(probs, 1, v, t)?;
    let at = ctx.reshape_2d(argmax, 1, t)?;
    ctx.get_rows(probs, at)
}
