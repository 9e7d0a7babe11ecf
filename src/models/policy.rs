//! llama.cpp's `--split-mode tensor` policy (MODELS.md sections 5.2 and 5.4):
//! which axis each weight and cache is split on, and the granule each
//! device's slice is a multiple of, so quant blocks and attention heads stay
//! whole.

use super::qwen3::{Qwen3Hparams, Qwen3Types};
use crate::error::{Error, Result};
use crate::split::{split_extents, SplitPolicy, SplitSpec};
use crate::tensor::GgmlType;

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

/// Granules of an attention layer (MODELS.md 5.4): `g_q` query rows per
/// slice (whole GQA groups, a multiple of the output projection's block,
/// doubled up to 128 while each device still gets a group), and
/// `g_kv = g_q / G` (whole KV heads).
pub fn attention_granules(hp: &Qwen3Hparams, wo_type: GgmlType, n_dev: usize) -> (i64, i64) {
    let g = hp.n_head / hp.n_head_kv;
    let n_embd_q = g * hp.head_dim;
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

/// [`qwen3_policy`] for a target with a DFlash drafter in the same context
/// (its tensors named `dft.` + the GGUF name): the drafter's layers and caches
/// split like the target's (MODELS.md 5.5), `fc` and the norms mirrored.
///
/// # Errors
/// As [`qwen3_policy`], for either model's heads.
pub fn qwen3_dflash_policy(
    hp: &Qwen3Hparams,
    types: &Qwen3Types,
    drafter: &super::dflash::DflashHparams,
    drafter_type: GgmlType,
    ratios: &[f32],
) -> Result<SplitPolicy> {
    let dhp = Qwen3Hparams {
        n_layer: drafter.n_layer,
        n_embd: drafter.n_embd,
        n_ff: drafter.n_ff,
        n_head: drafter.n_head,
        n_head_kv: drafter.n_head_kv,
        head_dim: drafter.head_dim,
        n_vocab: hp.n_vocab,
        rms_eps: drafter.rms_eps,
        rope_base: drafter.rope_base,
        n_ctx_train: hp.n_ctx_train,
    };
    // The drafter's heads must give every device a KV head too.
    qwen3_policy(&dhp, &Qwen3Types::all(drafter_type), ratios)?;
    let g = attention_granules(&dhp, drafter_type, ratios.len());
    let policy = qwen3_rules(hp, types, ratios)?;
    Ok(layer_rules(policy, "dft.", g, ffn_granule(drafter.n_ff, drafter_type)).rule("*", SplitSpec::Mirrored))
}
