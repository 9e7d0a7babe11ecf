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
use shardgraph::split::{SplitPolicy, SplitSpec};
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

/// The attention, FFN and KV-cache rules of one model's layers, for tensor
/// names starting with `prefix`.
pub(crate) fn layer_rules(policy: SplitPolicy, prefix: &str, (g_q, g_kv): (i64, i64), ffn_g: i64) -> SplitPolicy {
    let axis = |axis, granule| SplitSpec::Axis { axis, granule, segments: vec![] };
    let p = |n: &str| format!("{prefix}{n}");
    policy
        .rule(&p("blk.*.attn_q.weight"), axis(1, g_q))
        .rule(&p("blk.*.attn_k.weight"), axis(1, g_kv))
        .rule(&p("blk.*.attn_v.weight"), axis(1, g_kv))
        .rule(&p("blk.*.attn_output.weight"), axis(0, g_q))
        .rule(&p("blk.*.ffn_gate.weight"), axis(1, ffn_g))
        .rule(&p("blk.*.ffn_up.weight"), axis(1, ffn_g))
        .rule(&p("blk.*.ffn_down.weight"), axis(0, ffn_g))
        .rule(&p("cache_k_l*"), axis(0, g_kv))
        .rule(&p("cache_v_l*"), axis(0, g_kv))
}
