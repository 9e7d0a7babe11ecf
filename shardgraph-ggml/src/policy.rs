//! The split policy of SG's sub-devices for llama.cpp's graphs, by tensor
//! name: llama.cpp names its weights by their GGUF names
//! (`blk.N.attn_q.weight`) and its KV caches `cache_k_lN` / `cache_v_lN`
//! (`llama_kv_cache`'s constructor, `src/llama-kv-cache.cpp`).
//!
//! The layout is Megatron-LM's (Shoeybi et al. 2019, section 3), which
//! llama.cpp's `--split-mode tensor` also uses:
//! - feed-forward: `ffn_gate`/`ffn_up` by rows (axis 1), `ffn_down` by
//!   columns (axis 0), in granules of `ffn_down`'s block ([`ffn_rules`]);
//! - attention, per layer, by KV-head groups: `attn_q`, `attn_k`, `attn_v`
//!   by rows in granules of one group's rows, `attn_output` by columns in
//!   one group's columns, the caches on axis 0 by KV heads, so each device
//!   computes its heads end to end and one all-reduce follows `attn_output`;
//! - the output head (`output.weight`, or `token_embd.weight` when tied) by
//!   vocabulary rows.
//!
//! - qwen35's Gated-DeltaNet layers by key heads, as the crate's own
//!   qwen35 policy splits them ([`delta_rules`]; the layout is
//!   [`shardgraph_models::qwen35::delta_net_rules`]'s): the projections,
//!   the conv kernel, the per-head gates and both recurrent states, so each
//!   device runs its heads' recurrence and one all-reduce follows
//!   `ssm_out`.
//!
//! The head size is `blk.N.attn_k_norm.weight`'s length (Qwen3's and
//! Qwen3.5's per-head K norm); a layer without one, or whose shapes or
//! block types do not divide into KV-head groups, keeps its attention
//! mirrored. A delta-net layer's heads come from its shapes the same way
//! (`ssm_norm` is one head, `ssm_a` one value per value head). Everything
//! else is mirrored.
//!
//! With `SHARDGRAPH_SPLIT_MODE=layer` the policy is llama.cpp's
//! `--split-mode layer` instead ([`SplitPolicy::layer_split`]): each layer's
//! weights and caches whole on one sub-device, the ratios setting each
//! sub-device's share of the layers (the recurrent layers of a hybrid too).

use shardgraph::split::{layer_of, Devices, SplitMode, SplitPolicy, SplitSpec};
use shardgraph::Context;
use shardgraph_models::qwen35::{delta_net_rules, DeltaNetHeads};
use std::collections::HashMap;

/// A row split (axis 1) or column split (axis 0) in granules of `granule`.
fn axis(axis: usize, granule: i64) -> SplitSpec {
    SplitSpec::Axis { axis, granule, segments: vec![] }
}

/// The policy for `devices`, with attention rules for each layer whose
/// tensors `ctx` holds (translated graphs so far); under
/// [`SplitMode::Layer`], the layer split of the layers `ctx` names; under
/// [`SplitMode::Hybrid`], the hybrid split over the devices' groups.
///
/// # Errors
/// The devices' ratios are invalid ([`Devices::policy`]).
pub(crate) fn llama_policy(devices: &Devices, ctx: &Context) -> Result<SplitPolicy, String> {
    // The layers the graph has.
    let n_layer = || ctx.ids().filter_map(|id| layer_of(&ctx.tensor(id).ok()?.name)).max().map_or(0, |l| l + 1);
    let tensor = |r: &[f32]| tensor_policy(r, ctx);
    match devices.split_mode() {
        // llama.cpp's --split-mode layer.
        SplitMode::Layer => SplitPolicy::layer_split(devices.ratios(), n_layer()),
        SplitMode::Hybrid => SplitPolicy::hybrid(devices.ratios(), &devices.groups(), n_layer(), &tensor),
        SplitMode::Tensor => tensor(devices.ratios()),
    }
    .map_err(|e| e.to_string())
}

/// The tensor-split policy at `ratios` for the layers `ctx` holds.
fn tensor_policy(ratios: &[f32], ctx: &Context) -> shardgraph::Result<SplitPolicy> {
    let mut policy = SplitPolicy::new(ratios)?;
    for (pattern, spec) in attention_rules(ctx).into_iter().chain(delta_rules(ctx)).chain(ffn_rules(ctx)) {
        policy = policy.rule(&pattern, spec);
    }
    Ok(policy
        // The output head by vocabulary rows (a tied head reads
        // token_embd): each device scores its share of the vocabulary.
        .rule("output.weight", axis(1, 1))
        .rule("token_embd.weight", axis(1, 1))
        .rule("*", SplitSpec::Mirrored))
}

/// Shape and block size by name, of the layer tensors and caches `ctx`
/// holds.
fn shapes_by_name(ctx: &Context) -> HashMap<&str, ([i64; 4], i64)> {
    let mut by_name = HashMap::new();
    for id in ctx.ids() {
        let Ok(t) = ctx.tensor(id) else { continue };
        if t.name.starts_with("blk.") || t.name.starts_with("cache_") {
            by_name.insert(t.name.as_str(), (t.ne, t.ty.block_size() as i64));
        }
    }
    by_name
}

/// The rules `layer` gives each layer (in layer order) that has a tensor
/// named `blk.N.{marker}`.
fn rules_per_layer(
    ctx: &Context,
    marker: &str,
    layer: fn(u32, Lookup) -> Vec<(String, SplitSpec)>,
) -> Vec<(String, SplitSpec)> {
    let by_name = shapes_by_name(ctx);
    let mut layers: Vec<u32> = by_name
        .keys()
        .filter_map(|n| n.strip_prefix("blk.")?.strip_suffix(marker)?.strip_suffix('.')?.parse().ok())
        .collect();
    layers.sort_unstable();
    layers.into_iter().flat_map(|l| layer(l, &|n: &str| by_name.get(n).copied())).collect()
}

/// The attention rules (exact names) of every layer that divides into
/// KV-head groups, in layer order.
pub(crate) fn attention_rules(ctx: &Context) -> Vec<(String, SplitSpec)> {
    rules_per_layer(ctx, "attn_k_norm.weight", layer_rules)
}

/// The Gated-DeltaNet rules (exact names) of every delta-net layer (one
/// with `ssm_out`) whose key heads divide into at least two granules, in
/// layer order.
pub(crate) fn delta_rules(ctx: &Context) -> Vec<(String, SplitSpec)> {
    rules_per_layer(ctx, "ssm_out.weight", delta_layer_rules)
}

/// Delta-net layer `l`'s rules, or none: the heads from the shapes
/// (`ssm_norm` `[S]`, `ssm_a` `[H_v]`, `attn_gate` `[E, H_v·S]`,
/// `attn_qkv` `[E, 2·H_k·S + H_v·S]`, `ssm_conv1d` `[d_conv, channels]`),
/// every one of them and the caches (`cache_r_lN` `[(d_conv−1)·channels]`,
/// `cache_s_lN` `[S·S·H_v]` per sequence, F32) consistent with them; the
/// granule from `ssm_out`'s block ([`DeltaNetHeads::granule`]).
fn delta_layer_rules(l: u32, get: Lookup) -> Vec<(String, SplitSpec)> {
    let w = |s: &str| get(&format!("blk.{l}.{s}"));
    let (Some(norm), Some(a), Some(gate), Some(qkv), Some(conv), Some(out), Some(dt), Some(alpha), Some(beta)) = (
        w("ssm_norm.weight"),
        w("ssm_a"),
        w("attn_gate.weight"),
        w("attn_qkv.weight"),
        w("ssm_conv1d.weight"),
        w("ssm_out.weight"),
        w("ssm_dt.bias"),
        w("ssm_alpha.weight"),
        w("ssm_beta.weight"),
    ) else {
        return vec![];
    };
    let (s, h_v, d_conv, channels) = (norm.0[0], a.0[0], conv.0[0], qkv.0[1]);
    let value_dim = gate.0[1];
    if s < 1
        || h_v < 1
        || d_conv < 2
        || value_dim != h_v * s
        || channels <= value_dim
        || (channels - value_dim) % (2 * s) != 0
    {
        return vec![];
    }
    let heads = DeltaNetHeads { n_k_heads: (channels - value_dim) / (2 * s), n_v_heads: h_v, d_state: s, d_conv };
    let fits = conv.0[1] == channels
        && out.0[0] == value_dim
        && [dt.0[0], alpha.0[1], beta.0[1]].iter().all(|&n| n == h_v)
        && [(format!("cache_r_l{l}"), (d_conv - 1) * channels), (format!("cache_s_l{l}"), s * s * h_v)]
            .iter()
            .all(|(c, len)| get(c).is_none_or(|(ne, block)| ne[0] == *len && block == 1));
    let Some(granule) = heads.granule(out.1).filter(|_| fits) else { return vec![] };
    delta_net_rules("", Some(l as usize), &heads, Some(granule))
}

/// The feed-forward rules of every layer whose `ffn_down` is in `ctx`:
/// `ffn_gate`/`ffn_up` by rows and `ffn_down` by columns, all three in
/// granules of `ffn_down`'s block (so each device's rows of the first two
/// are its columns of the third: no reshuffle between them); a layer whose
/// width is not at least two whole blocks stays mirrored.
pub(crate) fn ffn_rules(ctx: &Context) -> Vec<(String, SplitSpec)> {
    let mut rules = Vec::new();
    for id in ctx.ids() {
        let Ok(t) = ctx.tensor(id) else { continue };
        let Some(layer) = t.name.strip_prefix("blk.").and_then(|n| n.strip_suffix(".ffn_down.weight")) else {
            continue;
        };
        let (n_ff, block) = (t.ne[0], t.ty.block_size() as i64);
        if block < 1 || n_ff % block != 0 || n_ff / block < 2 {
            continue;
        }
        for (name, ax) in [("ffn_gate", 1), ("ffn_up", 1), ("ffn_down", 0)] {
            rules.push((format!("blk.{layer}.{name}.weight"), axis(ax, block)));
        }
    }
    rules
}

/// A tensor's `ne` and its type's block size, by name.
type Lookup<'a> = &'a dyn Fn(&str) -> Option<([i64; 4], i64)>;

/// Layer `l`'s rules, or none.
///
/// The unit of the split is `m` KV-head groups, the fewest (a divisor of
/// the KV-head count) whose columns of `attn_output` and cache elements
/// are whole blocks of their types (heads of 64 with Q4_K's 256-element
/// blocks: two groups of two query heads), so every tensor of the layer
/// has the same number of units and each device gets the same heads in all
/// of them. With fewer than two units the layer stays mirrored.
fn layer_rules(l: u32, get: Lookup) -> Vec<(String, SplitSpec)> {
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
    let caches: Vec<(String, ([i64; 4], i64))> =
        ["k", "v"].iter().filter_map(|c| Some((format!("cache_{c}_l{l}"), get(&format!("cache_{c}_l{l}"))?))).collect();
    // (length along the split axis, block size along it) of each tensor.
    let mut lens = vec![(q.0[1], 1), (k.0[1], 1), (v.0[1], 1), (o.0[0], o.1)];
    lens.extend(caches.iter().map(|(_, (ne, block))| (ne[0], *block)));
    let fits =
        |m: i64| n_kv % m == 0 && lens.iter().all(|&(len, block)| len % n_kv == 0 && (len / n_kv * m) % block == 0);
    let Some(m) = (1..=n_kv / 2).find(|&m| fits(m)) else { return vec![] };
    let unit = |len: i64| len / n_kv * m;
    let mut rules = vec![
        (w("attn_q"), axis(1, unit(q.0[1]))),
        (w("attn_k"), axis(1, unit(k.0[1]))),
        (w("attn_v"), axis(1, unit(v.0[1]))),
        (w("attn_output"), axis(0, unit(o.0[0]))),
    ];
    rules.extend(caches.into_iter().map(|(name, (ne, _))| (name, axis(0, unit(ne[0])))));
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes<'a>(entries: &'a [(&'a str, [i64; 4], i64)]) -> impl Fn(&str) -> Option<([i64; 4], i64)> + 'a {
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
    fn block_types_make_the_unit_several_groups_or_keep_the_layer_mirrored() {
        let base = [
            ("blk.0.attn_k_norm.weight", [64, 1, 1, 1], 1),
            ("blk.0.attn_q.weight", [1024, 1024, 1, 1], 256),
            ("blk.0.attn_k.weight", [1024, 512, 1, 1], 256),
            ("blk.0.attn_v.weight", [1024, 512, 1, 1], 256),
            ("blk.0.attn_output.weight", [1024, 1024, 1, 1], 256),
        ];
        // 8 KV heads of 64, 2 query heads each: a group's 128 columns of
        // attn_output cut its Q4_K blocks, two groups are one block.
        let r = layer_rules(0, &shapes(&base));
        assert_eq!(r[0], ("blk.0.attn_q.weight".to_string(), axis(1, 256)));
        assert_eq!(r[1], ("blk.0.attn_k.weight".to_string(), axis(1, 128)));
        assert_eq!(r[3], ("blk.0.attn_output.weight".to_string(), axis(0, 256)));
        // No K norm: no head size.
        assert!(layer_rules(0, &shapes(&base[1..])).is_empty());
        // A cache whose unit must be 4 groups (heads of 64 in 256-blocks).
        let mut t = base.to_vec();
        t.push(("cache_k_l0", [512, 4096, 1, 1], 256));
        let r = layer_rules(0, &shapes(&t));
        assert_eq!(r[3], ("blk.0.attn_output.weight".to_string(), axis(0, 512)));
        assert_eq!(r[4], ("cache_k_l0".to_string(), axis(0, 256)));
        // A block as wide as all the heads: one unit, mirrored.
        t[5] = ("cache_k_l0", [512, 4096, 1, 1], 512);
        assert!(layer_rules(0, &shapes(&t)).is_empty());
    }

    #[test]
    fn ffn_layers_split_in_ffn_downs_blocks_or_stay_mirrored() {
        use shardgraph::GgmlType;
        let mut ctx = Context::new();
        // 11 Q6_K blocks (llama.cpp's Q4_K_M puts ffn_down in Q6_K); an F16
        // layer of 2848 (not a multiple of 256); one block only.
        for (l, ty, n_ff) in [(0, GgmlType::Q6_K, 2816), (1, GgmlType::F16, 2848), (2, GgmlType::Q4_K, 256)] {
            let t = ctx.new_tensor(ty, &[n_ff, 1024]).unwrap();
            ctx.set_name(t, &format!("blk.{l}.ffn_down.weight")).unwrap();
        }
        let mut r = ffn_rules(&ctx);
        r.sort_by(|a, b| a.0.cmp(&b.0));
        let want = [
            ("blk.0.ffn_down.weight", axis(0, 256)),
            ("blk.0.ffn_gate.weight", axis(1, 256)),
            ("blk.0.ffn_up.weight", axis(1, 256)),
            ("blk.1.ffn_down.weight", axis(0, 1)),
            ("blk.1.ffn_gate.weight", axis(1, 1)),
            ("blk.1.ffn_up.weight", axis(1, 1)),
        ];
        assert_eq!(r, want.map(|(n, s)| (n.to_string(), s)).to_vec());
    }

    /// The qwen35 example's delta-net layer (8 key and 16 value heads of
    /// 128, `d_conv` 4, Q4_K `ssm_out`): split by key heads in granules of
    /// 256 rows of `key_dim` (2 heads), the tensors over q, k, v or the
    /// value heads as repeated segments; a shape that disagrees with the
    /// heads keeps the layer mirrored.
    #[test]
    fn a_delta_net_layer_splits_by_key_heads_from_its_shapes() {
        let t = [
            ("blk.0.ssm_norm.weight", [128, 1, 1, 1], 1),
            ("blk.0.ssm_a", [16, 1, 1, 1], 1),
            ("blk.0.ssm_dt.bias", [16, 1, 1, 1], 1),
            ("blk.0.ssm_alpha.weight", [1024, 16, 1, 1], 256),
            ("blk.0.ssm_beta.weight", [1024, 16, 1, 1], 256),
            ("blk.0.attn_gate.weight", [1024, 2048, 1, 1], 256),
            ("blk.0.attn_qkv.weight", [1024, 4096, 1, 1], 256),
            ("blk.0.ssm_conv1d.weight", [4, 4096, 1, 1], 1),
            ("blk.0.ssm_out.weight", [2048, 1024, 1, 1], 256),
            ("cache_r_l0", [12288, 1, 1, 1], 1),
            ("cache_s_l0", [262144, 1, 1, 1], 1),
        ];
        let seg = |axis, granule, len: i64, n| SplitSpec::Axis { axis, granule, segments: vec![len; n] };
        let want = [
            ("blk.0.attn_qkv.weight", seg(1, 256, 1024, 4)),
            ("blk.0.ssm_conv1d.weight", seg(1, 256, 1024, 4)),
            ("blk.0.attn_gate.weight", seg(1, 256, 1024, 2)),
            ("blk.0.ssm_out.weight", seg(0, 256, 1024, 2)),
            ("blk.0.ssm_alpha.weight", seg(1, 2, 8, 2)),
            ("blk.0.ssm_beta.weight", seg(1, 2, 8, 2)),
            ("blk.0.ssm_a", seg(0, 2, 8, 2)),
            ("blk.0.ssm_dt.bias", seg(0, 2, 8, 2)),
            ("cache_r_l0", seg(0, 768, 3072, 4)),
            ("cache_r_l0_*", seg(0, 768, 3072, 4)),
            ("cache_s_l0", seg(0, 32768, 131072, 2)),
            ("cache_s_l0_*", seg(0, 32768, 131072, 2)),
        ];
        assert_eq!(delta_layer_rules(0, &shapes(&t)), want.map(|(n, s)| (n.to_string(), s)).to_vec());
        // A recurrent state of another size, an F16 conv state, gates of
        // another head count, a missing tensor: mirrored.
        for (i, bad) in [(10, ([262144 / 2, 1, 1, 1], 1)), (9, ([12288, 1, 1, 1], 2)), (4, ([1024, 8, 1, 1], 256))] {
            let mut u = t.to_vec();
            u[i].1 = bad.0;
            u[i].2 = bad.1;
            assert!(delta_layer_rules(0, &shapes(&u)).is_empty(), "{:?}", u[i]);
        }
        assert!(delta_layer_rules(0, &shapes(&t[1..])).is_empty());
        // One granule of key heads (a Q4_K block as wide as key_dim): mirrored.
        let mut u = t.to_vec();
        u[1] = ("blk.0.ssm_a", [4, 1, 1, 1], 1);
        for i in [2, 3, 4] {
            u[i].1[if i == 2 { 0 } else { 1 }] = 4;
        }
        u[5].1[1] = 512;
        u[6].1[1] = 768;
        u[7].1[1] = 768;
        u[8].1[0] = 512;
        u[9].1[0] = 3 * 768;
        u[10].1[0] = 128 * 128 * 4;
        assert!(delta_layer_rules(0, &shapes(&u)).is_empty());
    }
}
