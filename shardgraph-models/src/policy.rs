//! llama.cpp's `--split-mode tensor` policy (shardgraph-models/MODELS.md,
//! sections 7.2 and 7.4): which axis each weight and cache is split on, and the
//! granule each device's slice is a multiple of, so quant blocks and attention
//! heads stay whole.
//!
//! Each model's rules are a function of their own: `qwen3_rules` (the
//! `qwen3` target), `qwen35_rules` (the hybrid target: gated attention and
//! Gated-DeltaNet layers) and `dflash_rules` (the DFlash drafter's layers,
//! added to either target's); the public `*_policy` functions put them
//! together and mirror everything else.

use super::dflash::DflashHparams;
use super::hparams::HparamsCore;
use super::qwen3::{Qwen3Hparams, Qwen3Types};
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

fn lcm(a: i64, b: i64) -> i64 {
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

/// The split policy llama.cpp assigns a `qwen3` model under
/// `--split-mode tensor` with tensor split `ratios`: Q/K/V and FFN gate/up
/// split on their output rows (axis 1) by whole GQA groups, heads and
/// `lcm(block, 128)` rows; the output projection and FFN down on their input
/// axis (0); KV caches on axis 0 by heads; the output head on the
/// vocabulary; everything else mirrored. (llama.cpp also rotates uneven
/// remainders per layer; this policy gives the remainder to the last device.)
///
/// # Errors
/// [`Error::Model`] if the ratios give a device with a non-zero ratio no
/// KV head (a tensor split finer than the heads), or invalid ratios.
pub fn qwen3_policy(hp: &Qwen3Hparams, types: &Qwen3Types, ratios: &[f32]) -> Result<SplitPolicy> {
    Ok(qwen3_rules(hp, types, ratios)?.rule("*", SplitSpec::Mirrored))
}

/// The rules of [`qwen3_policy`] without the final "everything else mirrored".
fn qwen3_rules(hp: &Qwen3Hparams, types: &Qwen3Types, ratios: &[f32]) -> Result<SplitPolicy> {
    hp.validate()?;
    let n = ratios.len();
    let (g_q, g_kv) = attention_granules(hp, types.attn, n);
    let kvd = hp.n_head_kv * hp.head_dim;
    if n > 1 {
        let ext = split_extents(kvd, ratios, g_kv).map_err(|e| Error::Model {
            detail: format!("tensor split {ratios:?} over {} KV heads: {e}", hp.n_head_kv),
        })?;
        if let Some(j) = (0..n).find(|&j| ratios[j] > 0.0 && ext[j] == 0) {
            return Err(Error::Model {
                detail: format!(
                    "tensor split {ratios:?} gives device {j} no KV head ({} heads in granules of {} rows); use fewer devices or other ratios",
                    hp.n_head_kv, g_kv
                ),
            });
        }
    }
    let policy = layer_rules(SplitPolicy::new(ratios)?, "", (g_q, g_kv), ffn_granule(hp.n_ff, types.ffn_down));
    Ok(policy.rule("output.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] }))
}

/// FFN granule: `lcm(block, 128)` rows when it divides `n_ff`, else the block.
fn ffn_granule(n_ff: i64, down: GgmlType) -> i64 {
    let g = lcm(down.block_size() as i64, 128).min(n_ff);
    if n_ff % g == 0 {
        g
    } else {
        down.block_size() as i64
    }
}

/// The attention, FFN and KV-cache rules of one model's layers, for tensor
/// names starting with `prefix`.
fn layer_rules(policy: SplitPolicy, prefix: &str, (g_q, g_kv): (i64, i64), ffn_g: i64) -> SplitPolicy {
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

/// [`qwen3_policy`] for a target with a DFlash drafter in the same context (its
/// tensors named `dft.` + the GGUF name): the drafter's layers and caches split
/// like the target's (shardgraph-models/MODELS.md, section 7.5), `fc` and the
/// norms mirrored.
///
/// # Errors
/// As [`qwen3_policy`], for either model's heads.
pub fn qwen3_dflash_policy(
    hp: &Qwen3Hparams,
    types: &Qwen3Types,
    drafter: &DflashHparams,
    drafter_type: GgmlType,
    ratios: &[f32],
) -> Result<SplitPolicy> {
    check_dflash_heads(drafter, drafter_type, hp.n_vocab, ratios)?;
    let policy = qwen3_rules(hp, types, ratios)?;
    Ok(dflash_rules(policy, drafter, drafter_type, ratios.len()).rule("*", SplitSpec::Mirrored))
}

/// Checks that a DFlash drafter's heads give every device with a non-zero
/// ratio a KV head too (as a `qwen3` target's must), before either model's
/// rules are made.
///
/// # Errors
/// As [`qwen3_policy`], the message naming the drafter's heads.
fn check_dflash_heads(drafter: &DflashHparams, drafter_type: GgmlType, n_vocab: i64, ratios: &[f32]) -> Result<()> {
    let dhp = drafter_as_qwen3(drafter, n_vocab);
    qwen3_policy(&dhp, &Qwen3Types::all(drafter_type), ratios).map(drop).map_err(|e| drafter_error(&dhp, e))
}

/// The DFlash drafter's rules on top of its target's `policy`
/// (shardgraph-models/MODELS.md, section 7.5): its tensors are named `dft.` +
/// the GGUF name, its layers and caches split like a `qwen3` target's, with
/// its own granules; `fc`, the norms and DFlash2's convolution and selector
/// tensors are left to the caller's final "everything else mirrored".
fn dflash_rules(policy: SplitPolicy, drafter: &DflashHparams, drafter_type: GgmlType, n_dev: usize) -> SplitPolicy {
    let g = attention_granules(&drafter.core, drafter_type, n_dev);
    layer_rules(policy, "dft.", g, ffn_granule(drafter.n_ff, drafter_type))
}

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
/// * FFN as [`qwen3_policy`], the output head on the vocabulary, everything
///   else (embedding, norms, `ssm_norm`) mirrored.
///
/// (llama.cpp also rotates uneven remainders per layer; here the last
/// device takes them.)
///
/// # Errors
/// [`Error::Model`] naming the layer kind if the ratios leave a device with
/// a non-zero ratio without a KV head or a key head; invalid ratios.
pub fn qwen35_policy(
    hp: &super::qwen35::Qwen35Hparams,
    types: &super::qwen35::Qwen35Types,
    ratios: &[f32],
) -> Result<SplitPolicy> {
    Ok(qwen35_rules(hp, types, ratios)?.rule("*", SplitSpec::Mirrored))
}

/// [`qwen35_policy`] for a target with a DFlash drafter in the same context
/// (`dft.` names): the drafter's layers and caches split like a `qwen3`
/// target's (shardgraph-models/MODELS.md, section 7.5), `fc`, norms,
/// convolution and selector tensors mirrored.
///
/// # Errors
/// As [`qwen35_policy`], and for the drafter's heads.
pub fn qwen35_dflash_policy(
    hp: &super::qwen35::Qwen35Hparams,
    types: &super::qwen35::Qwen35Types,
    drafter: &DflashHparams,
    drafter_type: GgmlType,
    ratios: &[f32],
) -> Result<SplitPolicy> {
    check_dflash_heads(drafter, drafter_type, hp.n_vocab, ratios)?;
    let policy = qwen35_rules(hp, types, ratios)?;
    // On one device qwen35_rules has no rules (nothing is split), nor does the drafter.
    let policy = if ratios.len() > 1 { dflash_rules(policy, drafter, drafter_type, ratios.len()) } else { policy };
    Ok(policy.rule("*", SplitSpec::Mirrored))
}

/// Says that a policy error is about the drafter's heads, not the target's.
fn drafter_error(dhp: &Qwen3Hparams, e: Error) -> Error {
    let inner = match e {
        Error::Model { detail } => detail,
        other => other.to_string(),
    };
    Error::Model {
        detail: format!(
            "dflash drafter ({} heads / {} KV heads of {}): {inner}",
            dhp.n_head, dhp.n_head_kv, dhp.head_dim
        ),
    }
}

/// A DFlash drafter's layer shapes as a `qwen3` model's (for the check of its heads).
fn drafter_as_qwen3(drafter: &DflashHparams, n_vocab: i64) -> Qwen3Hparams {
    Qwen3Hparams { core: drafter.core.clone(), n_vocab, n_ctx_train: 4096 }
}

/// The rules of [`qwen35_policy`] without the final "everything else mirrored".
fn qwen35_rules(
    hp: &super::qwen35::Qwen35Hparams,
    types: &super::qwen35::Qwen35Types,
    ratios: &[f32],
) -> Result<SplitPolicy> {
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
