//! The split policy of SG's sub-devices for llama.cpp's graphs, by tensor
//! name: llama.cpp names its weights by their GGUF names
//! (`blk.N.attn_q.weight`) and its KV caches `cache_k_lN` / `cache_v_lN`
//! (`llama_kv_cache`'s constructor, `src/llama-kv-cache.cpp`).
//!
//! The layout is Megatron-LM's (Shoeybi et al. 2019, section 3), which
//! llama.cpp's `--split-mode tensor` also uses:
//! - feed-forward: `ffn_gate`/`ffn_up` by rows (axis 1), `ffn_down` by
//!   columns (axis 0) in 256-element granules (whole blocks of every type);
//! - attention, per layer, by KV-head groups: `attn_q`, `attn_k`, `attn_v`
//!   by rows in granules of one group's rows, `attn_output` by columns in
//!   one group's columns, the caches on axis 0 by KV heads, so each device
//!   computes its heads end to end and one all-reduce follows `attn_output`.
//!
//! The head size is `blk.N.attn_k_norm.weight`'s length (Qwen3's and
//! Qwen3.5's per-head K norm); a layer without one, or whose shapes or
//! block types do not divide into KV-head groups, keeps its attention
//! mirrored. Everything else is mirrored.

use shardgraph::split::{Devices, SplitPolicy, SplitSpec};
use shardgraph::Context;
use std::collections::HashMap;

/// A row split (axis 1) or column split (axis 0) in granules of `granule`.
fn axis(axis: usize, granule: i64) -> SplitSpec {
    SplitSpec::Axis { axis, granule, segments: vec![] }
}

/// The policy for `devices`, with attention rules for each layer whose
/// tensors `ctx` holds (translated graphs so far).
///
/// # Errors
/// The devices' ratios are invalid ([`Devices::policy`]).
pub(crate) fn llama_policy(devices: &Devices, ctx: &Context) -> Result<SplitPolicy, String> {
    let mut policy = devices.policy().map_err(|e| e.to_string())?;
    for (pattern, spec) in attention_rules(ctx) {
        policy = policy.rule(&pattern, spec);
    }
    Ok(policy
        .rule("blk.*.ffn_gate.weight", axis(1, 1))
        .rule("blk.*.ffn_up.weight", axis(1, 1))
        .rule("blk.*.ffn_down.weight", axis(0, 256))
        .rule("*", SplitSpec::Mirrored))
}

/// The attention rules (exact names) of every layer that divides into
/// KV-head groups, in layer order.
pub(crate) fn attention_rules(ctx: &Context) -> Vec<(String, SplitSpec)> {
    // Shape and block size by name, of the tensors that matter here.
    let mut by_name: HashMap<&str, ([i64; 4], i64)> = HashMap::new();
    for id in ctx.ids() {
        let Ok(t) = ctx.tensor(id) else { continue };
        if t.name.starts_with("blk.") || t.name.starts_with("cache_") {
            by_name.insert(t.name.as_str(), (t.ne, t.ty.block_size() as i64));
        }
    }
    let mut layers: Vec<u32> = by_name
        .keys()
        .filter_map(|n| n.strip_prefix("blk.")?.strip_suffix(".attn_k_norm.weight")?.parse().ok())
        .collect();
    layers.sort_unstable();
    let mut rules = Vec::new();
    for l in layers {
        rules.extend(layer_rules(l, &|n: &str| by_name.get(n).copied()));
    }
    rules
}

/// Layer `l`'s rules, or none: `get` gives a tensor's `ne` and block size.
fn layer_rules(l: u32, get: &dyn Fn(&str) -> Option<([i64; 4], i64)>) -> Vec<(String, SplitSpec)> {
    let w = |s: &str| format!("blk.{l}.{s}.weight");
    let (Some(norm), Some(q), Some(k), Some(v), Some(o)) =
        (get(&w("attn_k_norm")), get(&w("attn_q")), get(&w("attn_k")), get(&w("attn_v")), get(&w("attn_output")))
    else {
        return vec![];
    };
    let hd = norm.0[0];
    if hd <= 0 || k.0[1] % hd != 0 {
        return vec![];
    }
    let n_kv = k.0[1] / hd;
    // One KV-head group's share of a length, if it divides evenly (and, on
    // axis 0 of a block type, into whole blocks).
    let group = |len: i64, block: i64| (n_kv > 0 && len % n_kv == 0 && (len / n_kv) % block == 0).then(|| len / n_kv);
    let (Some(gq), Some(gk), Some(gv), Some(go)) = (group(q.0[1], 1), group(k.0[1], 1), group(v.0[1], 1), group(o.0[0], o.1))
    else {
        return vec![];
    };
    let mut rules = vec![
        (w("attn_q"), axis(1, gq)),
        (w("attn_k"), axis(1, gk)),
        (w("attn_v"), axis(1, gv)),
        (w("attn_output"), axis(0, go)),
    ];
    for c in ["k", "v"] {
        let name = format!("cache_{c}_l{l}");
        let Some((ne, block)) = get(&name) else { continue };
        match group(ne[0], block) {
            Some(g) => rules.push((name, axis(0, g))),
            // A cache that cannot follow the heads: the layer stays mirrored.
            None => return vec![],
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(entries: &[(&str, [i64; 4], i64)]) -> impl Fn(&str) -> Option<([i64; 4], i64)> + '_ {
        move |n| entries.iter().find(|e| e.0 == n).map(|e| (e.1, e.2))
    }

    #[test]
    fn a_gqa_layer_splits_by_kv_head_groups() {
        // 8 query heads of 64 over 4 KV heads; Q8_0 caches and output.
        let t = [
            ("blk.3.attn_k_norm.weight", [64, 1, 1, 1], 1),
            ("blk.3.attn_q.weight", [256, 512, 1, 1], 32),
            ("blk.3.attn_k.weight", [256, 256, 1, 1], 32),
            ("blk.3.attn_v.weight", [256, 256, 1, 1], 32),
            ("blk.3.attn_output.weight", [512, 256, 1, 1], 32),
            ("cache_k_l3", [256, 4096, 1, 1], 32),
            ("cache_v_l3", [256, 4096, 1, 1], 32),
        ];
        let r = layer_rules(3, &shapes(&t));
        let want = [
            ("blk.3.attn_q.weight", axis(1, 128)),
            ("blk.3.attn_k.weight", axis(1, 64)),
            ("blk.3.attn_v.weight", axis(1, 64)),
            ("blk.3.attn_output.weight", axis(0, 128)),
            ("cache_k_l3", axis(0, 64)),
            ("cache_v_l3", axis(0, 64)),
        ];
        assert_eq!(r, want.map(|(n, s)| (n.to_string(), s)).to_vec());
    }

    #[test]
    fn a_layer_that_does_not_divide_stays_mirrored() {
        let base = [
            ("blk.0.attn_k_norm.weight", [64, 1, 1, 1], 1),
            ("blk.0.attn_q.weight", [256, 512, 1, 1], 1),
            ("blk.0.attn_k.weight", [256, 256, 1, 1], 1),
            ("blk.0.attn_v.weight", [256, 256, 1, 1], 1),
            ("blk.0.attn_output.weight", [512, 256, 1, 1], 256),
        ];
        // attn_output's group of 128 columns cuts its 256-element blocks.
        assert!(layer_rules(0, &shapes(&base)).is_empty());
        // No K norm: no head size.
        assert!(layer_rules(0, &shapes(&base[1..])).is_empty());
        // A cache whose heads cut its blocks (4 heads of 64 in Q4_K's 256).
        let mut t = base.to_vec();
        t[4].2 = 32;
        t.push(("cache_k_l0", [256, 4096, 1, 1], 256));
        assert!(layer_rules(0, &shapes(&t)).is_empty());
        t.pop();
        assert_eq!(layer_rules(0, &shapes(&t)).len(), 4);
    }
}
