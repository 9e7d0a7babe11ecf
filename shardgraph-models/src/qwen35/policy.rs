//! llama.cpp's `--split-mode tensor` policy for a `qwen35` model
//! (shardgraph-models/MODELS.md, sections 7.2-7.4), on the shared granules
//! of [`crate::policy`].

use super::hparams::Qwen35Hparams;
use crate::policy::{blk, by_layer, caches, device_without, ffn_granule, lcm};
use crate::types::{TensorTypes, OUTPUT};
use shardgraph::error::Result;
use shardgraph::split::{SplitPolicy, SplitSpec};
use shardgraph::tensor::GgmlType;

/// An attention layer's granules: query rows with their gates, query rows
/// alone, KV rows (`None`: the layer's attention is mirrored).
type AttnGranules = Option<(i64, i64, i64)>;

/// The split policy llama.cpp assigns a `qwen35` model under
/// `--split-mode tensor` (shardgraph-models/MODELS.md, sections 7.2-7.4) with
/// tensor split `ratios`:
///
/// * attention layers: `attn_q` (query and gate rows interleaved per head)
///   on axis 1 in granules of whole GQA groups of both
///   (`2·lcm(G·D, block)`), `attn_k/v` and the KV caches by the matching
///   KV heads, `attn_output` on axis 0 by the query rows;
/// * Gated-DeltaNet layers: every tensor indexed by heads is split by key
///   heads, as segments of `key_dim` (or `H_k`) repeated where value heads
///   tile the key heads (`head_ratio = H_v / H_k`): `attn_qkv` and
///   `ssm_conv1d` `(key_dim, ×(2 + head_ratio))`, `attn_gate`
///   `(key_dim, ×head_ratio)`, `ssm_out` the same on axis 0,
///   `ssm_alpha/beta` `(H_k, ×head_ratio)` on axis 1, `ssm_a`/`ssm_dt.bias`
///   on axis 0, the conv state `cache_r` `(key_dim·(d_conv−1),
///   ×(2 + head_ratio))` and the recurrent state `cache_s`
///   `(H_k·S·S, ×head_ratio)`; granule `lcm(lcm(block, 128), S)` rows;
/// * FFN as `qwen3::qwen3_policy`, the output head on the vocabulary (a
///   tied head: `token_embd.weight`, which the lookup then reads
///   vocabulary-parallel), everything else (embedding, norms, `ssm_norm`)
///   mirrored.
///
/// Each layer's granules follow its own weights' blocks (`types`; a file may
/// mix them per layer: attention from `attn_output`, delta net from
/// `ssm_out`, FFN from `ffn_down`); a group whose granule does not divide
/// its rows is mirrored, and so is one whose granule would leave a device
/// with a non-zero ratio none of its heads (more devices than KV or key
/// heads, or heads narrower than the output projection's blocks).
///
/// (llama.cpp also rotates uneven remainders per layer; here the last
/// device takes them.)
///
/// # Errors
/// [`shardgraph::Error::Model`] for invalid hyper-parameters or ratios.
pub fn qwen35_policy(hp: &Qwen35Hparams, types: &TensorTypes, ratios: &[f32]) -> Result<SplitPolicy> {
    Ok(qwen35_rules(hp, types, ratios)?.rule("*", SplitSpec::Mirrored))
}

/// The rules of [`qwen35_policy`] without the final "everything else mirrored"
/// (a DFlash drafter's are added to them).
pub(crate) fn qwen35_rules(hp: &Qwen35Hparams, types: &TensorTypes, ratios: &[f32]) -> Result<SplitPolicy> {
    hp.validate()?;
    let n = ratios.len();
    if n == 1 {
        // One device holds everything (granules only matter between devices).
        return SplitPolicy::new(ratios);
    }
    let axis = |axis, granule, segments: Vec<i64>| SplitSpec::Axis { axis, granule, segments };
    let g = hp.n_head / hp.n_head_kv;
    let (n_embd_q, qd) = (g * hp.head_dim, hp.n_head * hp.head_dim);
    let s = hp.d_state;
    let key_dim = hp.key_dim();
    let block = |il: usize, name: &str| types.block(&format!("blk.{il}.{name}"));
    let layers = 0..hp.n_layer + hp.n_nextn;
    let is_delta = |il: usize| il < hp.n_layer && hp.is_recurrent(il);
    // Per attention layer (the NextN block's included), from its output
    // projection's block: query rows with their gates per granule, the query
    // rows alone, and the KV rows that go with them.
    let attn: Vec<(usize, AttnGranules)> = layers
        .clone()
        .filter(|&il| !is_delta(il))
        .map(|il| {
            let mut blck = block(il, "attn_output.weight");
            while blck < 128 && blck * (n as i64) < n_embd_q {
                blck *= 2;
            }
            // `attn_output`'s rows are split in whole blocks: the query
            // granule is a multiple of the block, the gated one twice it.
            let g_q = lcm(n_embd_q, blck);
            let (g_qg, g_kv) = (2 * g_q, g_q / g);
            (il, ((2 * qd) % g_qg == 0 && qd % g_q == 0).then_some((g_qg, g_q, g_kv)))
        })
        .collect();
    // Per delta-net layer, from its output projection's block (split on its rows).
    let heads = DeltaNetHeads { n_k_heads: hp.n_k_heads, n_v_heads: hp.n_v_heads, d_state: s, d_conv: hp.d_conv };
    let delta: Vec<(usize, Option<i64>)> =
        layers.clone().filter(|&il| is_delta(il)).map(|il| (il, heads.granule(block(il, "ssm_out.weight")))).collect();
    let ffn: Vec<(usize, Option<i64>)> = layers
        .map(|il| {
            let g = ffn_granule(hp.n_ff, types.get(&format!("blk.{il}.ffn_down.weight")).unwrap_or(GgmlType::F32));
            (il, (hp.n_ff % g == 0).then_some(g))
        })
        .collect();
    // A layer whose granule would leave a device with a non-zero ratio none
    // of its KV heads or delta-net key heads (more devices than heads, or
    // heads narrower than the output projection's blocks) keeps that part
    // mirrored, as a granule that does not divide its rows does.
    let starves = |what: &str, len: i64, granule: i64| -> Result<bool> {
        Ok(device_without(ratios, what, len, granule)?.is_some())
    };
    let kv_what = format!("{} KV heads", hp.n_head_kv);
    let mut attn = attn;
    for (_, g) in attn.iter_mut() {
        if let Some((_, _, g_kv)) = *g {
            if starves(&kv_what, hp.n_head_kv * hp.head_dim, g_kv)? {
                *g = None;
            }
        }
    }
    let delta_what = format!("{} delta-net key heads", hp.n_k_heads);
    let mut delta = delta;
    for (_, g) in delta.iter_mut() {
        if let Some(gr) = *g {
            if starves(&delta_what, key_dim, gr)? {
                *g = None;
            }
        }
    }
    let or_mirrored = |g: Option<i64>, spec: &dyn Fn(i64) -> SplitSpec| g.map_or(SplitSpec::Mirrored, spec);
    let policy = by_layer(SplitPolicy::new(ratios)?, &attn, |p, l, g| {
        let (qg, q, kvg) = (g.map(|g| g.0), g.map(|g| g.1), g.map(|g| g.2));
        let p = p
            .rule(&blk("", l, "attn_q.weight"), or_mirrored(qg, &|g| axis(1, g, vec![])))
            .rule(&blk("", l, "attn_k.weight"), or_mirrored(kvg, &|g| axis(1, g, vec![])))
            .rule(&blk("", l, "attn_v.weight"), or_mirrored(kvg, &|g| axis(1, g, vec![])))
            .rule(&blk("", l, "attn_output.weight"), or_mirrored(q, &|g| axis(0, g, vec![])));
        ["cache_k", "cache_v"]
            .iter()
            .flat_map(|c| caches("", l, c))
            .fold(p, |p, c| p.rule(&c, or_mirrored(kvg, &|g| axis(0, g, vec![]))))
    });
    let policy = by_layer(policy, &delta, |p, l, gr| {
        delta_net_rules("", l, &heads, gr).into_iter().fold(p, |p, (pattern, spec)| p.rule(&pattern, spec))
    });
    let policy = by_layer(policy, &ffn, |p, l, g| {
        p.rule(&blk("", l, "ffn_gate.weight"), or_mirrored(g, &|g| axis(1, g, vec![])))
            .rule(&blk("", l, "ffn_up.weight"), or_mirrored(g, &|g| axis(1, g, vec![])))
            .rule(&blk("", l, "ffn_down.weight"), or_mirrored(g, &|g| axis(0, g, vec![])))
    });
    let head = if types.is_tied() { "token_embd.weight" } else { OUTPUT };
    Ok(policy.rule(head, axis(1, 1, vec![])))
}

/// The head layout of one Gated-DeltaNet layer (qwen35's linear attention),
/// which its head-indexed tensors are split by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetHeads {
    /// Key heads `H_k` (`qwen35.ssm.group_count`).
    pub n_k_heads: i64,
    /// Value heads `H_v` (`qwen35.ssm.time_step_rank`), a multiple of `H_k`:
    /// value head `j` reads key head `j mod H_k` (the value heads tile the
    /// key heads, as ggml's `gated_delta_net` broadcasts them).
    pub n_v_heads: i64,
    /// Head size `S` of keys and values (`qwen35.ssm.state_size`).
    pub d_state: i64,
    /// Conv kernel width (`qwen35.ssm.conv_kernel`).
    pub d_conv: i64,
}

impl DeltaNetHeads {
    /// `key_dim = H_k·S`.
    pub fn key_dim(&self) -> i64 {
        self.n_k_heads * self.d_state
    }

    /// The split granule in rows of `key_dim`: whole key heads, a multiple
    /// of 128 and of `ssm_out_block` (the output projection's block,
    /// `ssm_out` being split on its columns); `None` when that does not
    /// divide `key_dim` into at least two parts or the heads do not tile
    /// (the layer is then mirrored).
    pub fn granule(&self, ssm_out_block: i64) -> Option<i64> {
        let (k, s) = (self.key_dim(), self.d_state);
        if s < 1 || self.n_k_heads < 1 || self.n_v_heads % self.n_k_heads != 0 || ssm_out_block < 1 {
            return None;
        }
        let g = lcm(lcm(ssm_out_block, 128), s);
        (k % g == 0 && k / g >= 2).then_some(g)
    }
}

/// The rules (name pattern, spec) of one delta-net layer's head-indexed
/// tensors, named as llama.cpp names them under `prefix` (`layer` `None`:
/// every layer's, `blk.*`), split by key heads in granules of `granule`
/// rows of `key_dim` (`None`: all mirrored). Tensors whose rows run over
/// q, k and v, or over the value heads, are split as segments of `key_dim`
/// (or `H_k`), repeated `2 + H_v/H_k` or `H_v/H_k` times, so each device
/// holds the same key heads in every segment:
/// `attn_qkv` and `ssm_conv1d` on axis 1 `(key_dim, ×(2 + H_v/H_k))`,
/// `attn_gate` on axis 1 and `ssm_out` on axis 0 `(key_dim, ×H_v/H_k)`,
/// `ssm_alpha`/`ssm_beta` on axis 1 and `ssm_a`/`ssm_dt.bias` on axis 0
/// `(H_k, ×H_v/H_k)`, the conv state `cache_r_lN` (`[(d_conv−1)·channels]`
/// per sequence) on axis 0 `(key_dim·(d_conv−1), ×(2 + H_v/H_k))` and the
/// recurrent state `cache_s_lN` (`[S·S·H_v]`) on axis 0 `(H_k·S·S, ×H_v/H_k)`.
/// (shardgraph-models/MODELS.md, section 7.4.)
pub fn delta_net_rules(
    prefix: &str,
    layer: Option<usize>,
    heads: &DeltaNetHeads,
    granule: Option<i64>,
) -> Vec<(String, SplitSpec)> {
    let (s, key_dim, dc) = (heads.d_state, heads.key_dim(), heads.d_conv);
    let ratio = if heads.n_k_heads > 0 { (heads.n_v_heads / heads.n_k_heads).max(1) as usize } else { 1 };
    let spec = |axis, per: &dyn Fn(i64) -> i64, seg: i64, n: usize| {
        granule.map_or(SplitSpec::Mirrored, |g| SplitSpec::Axis { axis, granule: per(g), segments: vec![seg; n] })
    };
    let rows = |g: i64| g;
    let head_rows = |g: i64| g / s.max(1);
    let mut rules = vec![
        (blk(prefix, layer, "attn_qkv.weight"), spec(1, &rows, key_dim, 2 + ratio)),
        (blk(prefix, layer, "ssm_conv1d.weight"), spec(1, &rows, key_dim, 2 + ratio)),
        (blk(prefix, layer, "attn_gate.weight"), spec(1, &rows, key_dim, ratio)),
        (blk(prefix, layer, "ssm_out.weight"), spec(0, &rows, key_dim, ratio)),
        (blk(prefix, layer, "ssm_alpha.weight"), spec(1, &head_rows, heads.n_k_heads, ratio)),
        (blk(prefix, layer, "ssm_beta.weight"), spec(1, &head_rows, heads.n_k_heads, ratio)),
        (blk(prefix, layer, "ssm_a"), spec(0, &head_rows, heads.n_k_heads, ratio)),
        (blk(prefix, layer, "ssm_dt.bias"), spec(0, &head_rows, heads.n_k_heads, ratio)),
    ];
    let conv = spec(0, &|g| g * (dc - 1), key_dim * (dc - 1), 2 + ratio);
    let state = spec(0, &|g| g * s, heads.n_k_heads * s * s, ratio);
    rules.extend(caches(prefix, layer, "cache_r").into_iter().map(|c| (c, conv.clone())));
    rules.extend(caches(prefix, layer, "cache_s").into_iter().map(|c| (c, state.clone())));
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hparams::HparamsCore;
    use shardgraph::split::{LeafInfo, SplitState};

    /// Query groups of 128 rows (2 heads of 64 per KV head) with a K-quant
    /// `attn_output` (blocks of 256): its rows split on whole blocks, the
    /// gated query rows and KV heads to match (found by the matrix against
    /// llama.cpp: the granule was 128, and loading a Q3_K_M file on 3
    /// devices failed).
    #[test]
    fn attention_granules_keep_the_output_projections_blocks_whole() {
        let hp = Qwen35Hparams {
            core: HparamsCore {
                n_layer: 2,
                n_embd: 256,
                n_ff: 768,
                n_head: 12,
                n_head_kv: 6,
                head_dim: 64,
                rms_eps: 1e-6,
                rope_base: 1e7,
            },
            n_vocab: 1024,
            n_rot: 16,
            rope_sections: [3, 3, 2, 0],
            full_attention_interval: 2,
            d_conv: 4,
            d_state: 64,
            n_k_heads: 6,
            n_v_heads: 12,
            n_nextn: 0,
            n_ctx_train: 4096,
        };
        let types = TensorTypes::uniform(GgmlType::Q4_K);
        let pol = qwen35_policy(&hp, &types, &[3.0, 2.0, 1.0]).unwrap();
        let state = |name: &str, ty: GgmlType, ne: [i64; 4]| pol.state_for(&LeafInfo { name, ne, ty }).unwrap();
        // Layer 1 is full attention: 768 query rows, 3 granules of 256.
        let split = |axis, ext: Vec<i64>| Some(SplitState::split(axis, ext));
        assert_eq!(state("blk.1.attn_output.weight", GgmlType::Q4_K, [768, 256, 1, 1]), split(0, vec![256, 256, 256]));
        assert_eq!(state("blk.1.attn_q.weight", GgmlType::Q4_K, [256, 1536, 1, 1]), split(1, vec![512, 512, 512]));
        assert_eq!(state("blk.1.attn_k.weight", GgmlType::Q4_K, [256, 384, 1, 1]), split(1, vec![128, 128, 128]));
    }
}
