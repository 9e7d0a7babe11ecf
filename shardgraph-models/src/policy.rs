//! llama.cpp's `--split-mode tensor` policy (shardgraph-models/MODELS.md,
//! sections 7.2 and 7.4): which axis each weight and cache is split on, and the
//! granule each device's slice is a multiple of, so quant blocks and attention
//! heads stay whole.
//!
//! This module holds what the models' policies share and imports no model:
//! the granules (whole GQA groups and KV heads, quant blocks, FFN rows) and
//! the rules of a Qwen3-style layer's attention, FFN and KV caches. Each
//! model's policy lives beside the model: `qwen3::qwen3_policy`,
//! `qwen35::qwen35_policy`, and the DFlash drafter's added to either target's
//! (`dflash::qwen3_dflash_policy`, `dflash::qwen35_dflash_policy`); each
//! puts its rules together and mirrors everything else.

use super::hparams::HparamsCore;
use super::types::TensorTypes;
use shardgraph::error::{Error, Result};
use shardgraph::split::{split_extents, SplitPolicy, SplitSpec};
use shardgraph::tensor::GgmlType;

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The least common multiple of two positive numbers.
pub(crate) fn lcm(a: i64, b: i64) -> i64 {
    a / gcd(a, b) * b
}

/// Granules of an attention layer (shardgraph-models/MODELS.md, section 7.4):
/// `g_q` query rows per slice (whole GQA groups, a multiple of the output
/// projection's block, doubled up to 128 while each device still gets a group),
/// and `g_kv = g_q / G` (whole KV heads).
pub fn attention_granules(hp: &HparamsCore, wo_type: GgmlType, n_dev: usize) -> (i64, i64) {
    // (Head counts that do not validate get granules of one group, not a division by zero.)
    let g = (hp.n_head / hp.n_head_kv.max(1)).max(1);
    let n_embd_q = (g * hp.head_dim).max(1);
    let mut blck = wo_type.block_size() as i64;
    while blck < 128 && blck * (n_dev as i64) < n_embd_q {
        blck *= 2;
    }
    let g_q = lcm(n_embd_q, blck);
    (g_q, g_q / g)
}

/// FFN granule: `lcm(block, 128)` rows when it divides `n_ff`, else the block.
pub(crate) fn ffn_granule(n_ff: i64, down: GgmlType) -> i64 {
    let g = lcm(down.block_size() as i64, 128).min(n_ff);
    if n_ff % g == 0 {
        g
    } else {
        down.block_size() as i64
    }
}

/// The granules of one Qwen3-style layer, from its own weights' types (a
/// file may mix them per layer): attention `(g_q, g_kv)` from its
/// `attn_output`'s block, or `None` when they do not divide its query rows
/// (its attention weights and caches are then mirrored), and the FFN's
/// from its `ffn_down`'s block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LayerGranules {
    /// `(g_q, g_kv)`, or `None`: mirrored.
    pub attn: Option<(i64, i64)>,
    /// `g_ffn`, or `None`: mirrored.
    pub ffn: Option<i64>,
}

/// The granules of each of `n_layer` Qwen3-style layers (`hp`'s heads and
/// sizes) whose weights have the types `types` gives (GGUF names
/// `blk.{il}.*`), for `n_dev` devices.
pub(crate) fn qwen3_layer_granules(hp: &HparamsCore, types: &TensorTypes, n_dev: usize) -> Vec<(usize, LayerGranules)> {
    let qd = hp.n_head * hp.head_dim;
    (0..hp.n_layer)
        .map(|il| {
            let ty = |n: &str| types.get(&format!("blk.{il}.{n}")).unwrap_or(GgmlType::F32);
            let (g_q, g_kv) = attention_granules(hp, ty("attn_output.weight"), n_dev);
            let g_ffn = ffn_granule(hp.n_ff, ty("ffn_down.weight"));
            let attn = (g_q > 0 && qd % g_q == 0).then_some((g_q, g_kv));
            let ffn = (g_ffn > 0 && hp.n_ff % g_ffn == 0).then_some(g_ffn);
            (il, LayerGranules { attn, ffn })
        })
        .collect()
}

/// Applies `rules` to `policy` for the layers `layers` (index, granules):
/// once for all of them (`None`: patterns over every layer, `blk.*.` and
/// `cache_*_l*`) when every layer has the same granules, as in a file of one
/// type per role, else once per layer (`Some(il)`), so each layer is split
/// by its own types' blocks.
pub(crate) fn by_layer<G: PartialEq + Copy>(
    mut policy: SplitPolicy,
    layers: &[(usize, G)],
    rules: impl Fn(SplitPolicy, Option<usize>, G) -> SplitPolicy,
) -> SplitPolicy {
    match layers.first() {
        None => policy,
        Some(&(_, g0)) if layers.iter().all(|&(_, g)| g == g0) => rules(policy, None, g0),
        _ => {
            for &(il, g) in layers {
                policy = rules(policy, Some(il), g);
            }
            policy
        }
    }
}

/// The pattern of layer tensor `name` under `prefix`: every layer's
/// (`blk.*.name`) or layer `il`'s.
pub(crate) fn blk(prefix: &str, layer: Option<usize>, name: &str) -> String {
    match layer {
        None => format!("{prefix}blk.*.{name}"),
        Some(il) => format!("{prefix}blk.{il}.{name}"),
    }
}

/// The patterns of a layer cache `cache` (`cache_k`, `cache_r`, …) under
/// `prefix`: every layer's (`cache_k_l*`), or layer `il`'s and its
/// snapshots' (`cache_r_l3`, `cache_r_l3_*`).
pub(crate) fn caches(prefix: &str, layer: Option<usize>, cache: &str) -> Vec<String> {
    match layer {
        None => vec![format!("{prefix}{cache}_l*")],
        Some(il) => vec![format!("{prefix}{cache}_l{il}"), format!("{prefix}{cache}_l{il}_*")],
    }
}

/// The first device with a non-zero ratio that the tensor split `ratios`
/// gives no part of `len` rows in granules of `granule` (`None`: each gets
/// one, or there is one device).
///
/// # Errors
/// [`Error::Model`] naming `what` ("8 KV heads") if `len` cannot be split so.
pub(crate) fn device_without(ratios: &[f32], what: &str, len: i64, granule: i64) -> Result<Option<usize>> {
    if ratios.len() < 2 {
        return Ok(None);
    }
    let ext = split_extents(len, ratios, granule)
        .map_err(|e| Error::Model { detail: format!("tensor split {ratios:?} over {what}: {e}") })?;
    Ok((0..ratios.len()).find(|&j| ratios[j] > 0.0 && ext[j] == 0))
}

/// The attention, FFN and KV-cache rules of one model's layers, for tensor
/// names starting with `prefix`, each layer split by its own granules
/// ([`by_layer`]); a group whose granule does not divide it is mirrored.
pub(crate) fn layer_rules(policy: SplitPolicy, prefix: &str, layers: &[(usize, LayerGranules)]) -> SplitPolicy {
    let axis = |axis, granule| SplitSpec::Axis { axis, granule, segments: vec![] };
    let attn: Vec<(usize, Option<(i64, i64)>)> = layers.iter().map(|&(il, g)| (il, g.attn)).collect();
    let ffn: Vec<(usize, Option<i64>)> = layers.iter().map(|&(il, g)| (il, g.ffn)).collect();
    let policy = by_layer(policy, &attn, |p, l, g| {
        let spec = |a, pick: fn((i64, i64)) -> i64| g.map_or(SplitSpec::Mirrored, |g| axis(a, pick(g)));
        let p = p
            .rule(&blk(prefix, l, "attn_q.weight"), spec(1, |g| g.0))
            .rule(&blk(prefix, l, "attn_k.weight"), spec(1, |g| g.1))
            .rule(&blk(prefix, l, "attn_v.weight"), spec(1, |g| g.1))
            .rule(&blk(prefix, l, "attn_output.weight"), spec(0, |g| g.0));
        ["cache_k", "cache_v"].iter().flat_map(|c| caches(prefix, l, c)).fold(p, |p, c| p.rule(&c, spec(0, |g| g.1)))
    });
    by_layer(policy, &ffn, |p, l, g| {
        let spec = |a| g.map_or(SplitSpec::Mirrored, |g| axis(a, g));
        p.rule(&blk(prefix, l, "ffn_gate.weight"), spec(1))
            .rule(&blk(prefix, l, "ffn_up.weight"), spec(1))
            .rule(&blk(prefix, l, "ffn_down.weight"), spec(0))
    })
}
