//! llama.cpp's `--split-mode tensor` policy for a `qwen35` model
//! (shardgraph-models/MODELS.md, sections 7.2-7.4), on the shared granules
//! of [`crate::policy`].

use super::hparams::{Qwen35Hparams, Qwen35Types};
use crate::policy::{ffn_granule, lcm};
use shardgraph::error::{Error, Result};
use shardgraph::split::{split_extents, SplitPolicy, SplitSpec};

/// The split policy llama.cpp assigns a `qwen35` model under
/// `--split-mode tensor` (shardgraph-models/MODELS.md, sections 7.2-7.4) with
/// tensor split `ratios`:
///
/// * attention layers: `attn_q` (query and gate rows interleaved per head)
///   on axis 1 in granules of whole GQA groups of both
///   (`lcm(2·G·D, block)`), `attn_k/v` and the KV caches by the matching
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
/// * FFN as `qwen3::qwen3_policy`, the output head on the vocabulary, everything
///   else (embedding, norms, `ssm_norm`) mirrored.
///
/// (llama.cpp also rotates uneven remainders per layer; here the last
/// device takes them.)
///
/// # Errors
/// [`Error::Model`] naming the layer kind if the ratios leave a device with
/// a non-zero ratio without a KV head or a key head; invalid ratios.
pub fn qwen35_policy(hp: &Qwen35Hparams, types: &Qwen35Types, ratios: &[f32]) -> Result<SplitPolicy> {
    Ok(qwen35_rules(hp, types, ratios)?.rule("*", SplitSpec::Mirrored))
}

/// The rules of [`qwen35_policy`] without the final "everything else mirrored"
/// (a DFlash drafter's are added to them).
pub(crate) fn qwen35_rules(hp: &Qwen35Hparams, types: &Qwen35Types, ratios: &[f32]) -> Result<SplitPolicy> {
    hp.validate()?;
    let n = ratios.len();
    if n == 1 {
        // One device holds everything (granules only matter between devices).
        return SplitPolicy::new(ratios);
    }
    let axis = |axis, granule, segments: Vec<i64>| SplitSpec::Axis { axis, granule, segments };
    let g = hp.n_head / hp.n_head_kv;
    let n_embd_q = g * hp.head_dim;
    let mut blck = types.attn.block_size() as i64;
    while blck < 128 && blck * (n as i64) < n_embd_q {
        blck *= 2;
    }
    // Query rows (with their gates) per granule, and the KV rows that go with them.
    let g_qg = lcm(2 * n_embd_q, blck);
    let g_q = g_qg / 2;
    let g_kv = g_q / g;
    let s = hp.d_state;
    let gr = lcm(lcm(types.attn.block_size() as i64, 128), s);
    let ratio = hp.n_v_heads / hp.n_k_heads;
    let key_dim = hp.key_dim();
    let check = |what: &str, len: i64, granule: i64| -> Result<()> {
        if n > 1 {
            let ext = split_extents(len, ratios, granule)
                .map_err(|e| Error::Model { detail: format!("tensor split {ratios:?} over {what}: {e}") })?;
            if let Some(j) = (0..n).find(|&j| ratios[j] > 0.0 && ext[j] == 0) {
                return Err(Error::Model {
                    detail: format!(
                        "tensor split {ratios:?} gives device {j} none of the {what} (granules of {granule} rows); use fewer devices or other ratios"
                    ),
                });
            }
        }
        Ok(())
    };
    check(&format!("{} KV heads", hp.n_head_kv), hp.n_head_kv * hp.head_dim, g_kv)?;
    check(&format!("{} delta-net key heads", hp.n_k_heads), key_dim, gr)?;
    let heads = s; // rows per key head in `key_dim`-sized segments
    let qkv_segs = vec![key_dim; (2 + ratio) as usize];
    let v_segs = vec![key_dim; ratio as usize];
    let head_segs = vec![hp.n_k_heads; ratio as usize];
    let policy = SplitPolicy::new(ratios)?
        .rule("blk.*.attn_q.weight", axis(1, g_qg, vec![]))
        .rule("blk.*.attn_k.weight", axis(1, g_kv, vec![]))
        .rule("blk.*.attn_v.weight", axis(1, g_kv, vec![]))
        .rule("blk.*.attn_output.weight", axis(0, g_q, vec![]))
        .rule("cache_k_l*", axis(0, g_kv, vec![]))
        .rule("cache_v_l*", axis(0, g_kv, vec![]))
        .rule("blk.*.attn_qkv.weight", axis(1, gr, qkv_segs.clone()))
        .rule("blk.*.ssm_conv1d.weight", axis(1, gr, qkv_segs))
        .rule("blk.*.attn_gate.weight", axis(1, gr, v_segs.clone()))
        .rule("blk.*.ssm_out.weight", axis(0, gr, v_segs))
        .rule("blk.*.ssm_alpha.weight", axis(1, gr / heads, head_segs.clone()))
        .rule("blk.*.ssm_beta.weight", axis(1, gr / heads, head_segs.clone()))
        .rule("blk.*.ssm_a", axis(0, gr / heads, head_segs.clone()))
        .rule("blk.*.ssm_dt.bias", axis(0, gr / heads, head_segs))
        .rule("cache_r_l*", axis(0, gr * (hp.d_conv - 1), vec![key_dim * (hp.d_conv - 1); (2 + ratio) as usize]))
        .rule("cache_s_l*", axis(0, gr * s, vec![hp.n_k_heads * s * s; ratio as usize]))
        .rule("blk.*.ffn_gate.weight", axis(1, ffn_granule(hp.n_ff, types.ffn), vec![]))
        .rule("blk.*.ffn_up.weight", axis(1, ffn_granule(hp.n_ff, types.ffn), vec![]))
        .rule("blk.*.ffn_down.weight", axis(0, ffn_granule(hp.n_ff, types.ffn), vec![]))
        .rule("output.weight", axis(1, 1, vec![]));
    Ok(policy)
}
