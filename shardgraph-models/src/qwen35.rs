//! The Qwen3.5-family hybrid target (llama.cpp's `LLM_ARCH_QWEN35`,
//! shardgraph-models/MODELS.md, section 3): every `full_attention_interval`-th
//! layer is a gated full-attention layer (Q and a sigmoid gate interleaved per
//! head, IMROPE over a partial rotary dimension), the others are Gated-DeltaNet
//! layers (fused qkv projection, depthwise causal conv over a conv-state cache,
//! L2-normed q/k, `gated_delta_net` over a recurrent state cache, a norm gated
//! by SiLU(z)). Norm weights are stored +1-shifted by llama.cpp's
//! converter, so the graph multiplies by them directly.
//!
//! One sequence: the recurrent caches hold one state each
//! (`cache_r_lN` `[(d_conv − 1)·conv_channels, 1]`, `cache_s_lN`
//! `[S_v·S_v·H_v, 1]`, F32), the attention layers' KV caches are
//! `[Hkv·D, kv_size]` as in [`super::qwen3`].

use super::hparams::{read_shared, ArchKeys, HparamsCore, Model, DIM};
use super::layers::{self, input, named, rms_norm_w, AttnShape, KvCache};
use super::qwen3::{f32s, StepOutput};
use super::{cell_bytes, f32_bytes, i32_bytes, imrope_positions, mask_bytes};
use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::ops::{RopeMode, RopeParams};
use shardgraph::split::Devices;
use shardgraph::tensor::{GgmlType, TensorId};

/// Hyper-parameters of a `qwen35` model (GGUF keys `qwen35.*`): the shared
/// core ([`HparamsCore`]; `hp.n_embd` reads through to it) and its own.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen35Hparams {
    /// Trunk layers L (`qwen35.block_count` minus the NextN layers), hidden
    /// size E, FFN size F, the attention layers' heads and head size D,
    /// RMSNorm ε (also the L2 norm's ε in the delta-net layers), rope base.
    pub core: HparamsCore,
    /// Vocabulary size V.
    pub n_vocab: i64,
    /// Rotated dims per head (`rope.dimension_count`, partial rotary: 64 of 256).
    pub n_rot: i64,
    /// IMROPE sections in pairs (`rope.dimension_sections`, `[11, 11, 10, 0]`).
    pub rope_sections: [i32; 4],
    /// Every `full_attention_interval`-th layer (1-based) is full attention.
    pub full_attention_interval: usize,
    /// Conv taps (`ssm.conv_kernel`, 4).
    pub d_conv: i64,
    /// Key head size S (`ssm.state_size`, 128; the value head size too).
    pub d_state: i64,
    /// Key heads H_k (`ssm.group_count`, 16).
    pub n_k_heads: i64,
    /// Value heads H_v (`ssm.time_step_rank`, 48).
    pub n_v_heads: i64,
    /// NextN (MTP) layers after the trunk (`nextn_predict_layers`, 0 or 1).
    pub n_nextn: usize,
    /// Training context (`context_length`).
    pub n_ctx_train: u32,
}

impl std::ops::Deref for Qwen35Hparams {
    type Target = HparamsCore;
    fn deref(&self) -> &HparamsCore {
        &self.core
    }
}

impl std::ops::DerefMut for Qwen35Hparams {
    fn deref_mut(&mut self) -> &mut HparamsCore {
        &mut self.core
    }
}

impl Qwen35Hparams {
    /// Value dimension `H_v·S` (`ssm.inner_size`).
    pub fn d_inner(&self) -> i64 {
        self.n_v_heads * self.d_state
    }

    /// Key dimension `H_k·S`.
    pub fn key_dim(&self) -> i64 {
        self.n_k_heads * self.d_state
    }

    /// Conv channels: q, k and v (`2·key_dim + d_inner`).
    pub fn conv_channels(&self) -> i64 {
        2 * self.key_dim() + self.d_inner()
    }

    /// Whether trunk layer `il` is a Gated-DeltaNet layer (llama.cpp:
    /// `(il + 1) % full_attention_interval != 0`).
    pub fn is_recurrent(&self, il: usize) -> bool {
        (il + 1) % self.full_attention_interval.max(1) != 0
    }

    /// Checks the hyper-parameters.
    ///
    /// # Errors
    /// [`Error::Model`] naming the inconsistent value.
    pub fn validate(&self) -> Result<()> {
        let bad = |d: String| Err(Error::Model { detail: format!("qwen35: {d}") });
        if self.n_layer == 0 || self.n_embd <= 0 || self.n_ff <= 0 || self.n_vocab <= 0 || self.n_ctx_train == 0 {
            return bad(
                "block_count, embedding_length, feed_forward_length, the vocabulary and context_length must be positive"
                    .into(),
            );
        }
        if !self.eps_and_base_positive() {
            return bad("layer_norm_rms_epsilon and rope.freq_base must be finite and positive".into());
        }
        if self.n_layer + self.n_nextn > super::MAX_LAYERS {
            return bad(format!("block_count {} is over {}", self.n_layer + self.n_nextn, super::MAX_LAYERS));
        }
        if self.n_head <= 0 || self.n_head_kv <= 0 || self.n_head % self.n_head_kv != 0 || self.head_dim <= 0 {
            return bad(format!(
                "head_count {} / head_count_kv {} / key_length {}",
                self.n_head, self.n_head_kv, self.head_dim
            ));
        }
        if self.n_rot <= 0 || self.n_rot > self.head_dim || self.n_rot % 2 != 0 {
            return bad(format!("rope.dimension_count {} must be even and ≤ key_length {}", self.n_rot, self.head_dim));
        }
        if self.rope_sections.iter().any(|&s| s < 0) || self.rope_sections[..3].iter().all(|&s| s == 0) {
            return bad(format!("rope.dimension_sections {:?}", self.rope_sections));
        }
        if self.full_attention_interval == 0 {
            return bad("full_attention_interval must be ≥ 1".into());
        }
        if self.d_conv < 2 || self.d_state <= 0 || self.n_k_heads <= 0 || self.n_v_heads % self.n_k_heads.max(1) != 0 {
            return bad(format!(
                "ssm.conv_kernel {} (≥ 2), state_size {}, group_count {} dividing time_step_rank {}",
                self.d_conv, self.d_state, self.n_k_heads, self.n_v_heads
            ));
        }
        if self.n_nextn > 1 {
            return bad(format!("nextn_predict_layers {} (0 or 1)", self.n_nextn));
        }
        // Sizes the graph multiplies out stay far from overflow (absurd metadata is an error).
        let limit = 1i64 << 40;
        let sizes = [
            self.n_v_heads.checked_mul(self.d_state),
            self.n_k_heads.checked_mul(self.d_state).and_then(|k| k.checked_mul(2)),
            self.d_state.checked_mul(self.d_state).and_then(|x| x.checked_mul(self.n_v_heads)),
            self.n_head.checked_mul(self.head_dim).and_then(|x| x.checked_mul(2)),
            self.n_embd.checked_mul(self.n_vocab),
            self.n_embd.checked_mul(self.n_ff),
        ];
        if sizes.iter().any(|x| x.is_none_or(|x| x > limit)) || self.d_conv > 1 << 20 {
            return bad("dimensions too large (products beyond 2^40 elements)".into());
        }
        Ok(())
    }

    /// The rope of the attention layers: IMROPE over `n_rot` dims.
    pub fn rope(&self) -> RopeParams {
        RopeParams {
            n_dims: self.n_rot as i32,
            mode: RopeMode::Imrope,
            n_ctx_orig: self.n_ctx_train as i32,
            freq_base: self.rope_base,
            sections: self.rope_sections,
            ..RopeParams::default()
        }
    }

    /// Reads a `qwen35` GGUF's metadata.
    ///
    /// # Errors
    /// [`Error::Model`] for another architecture or inconsistent values;
    /// [`Error::Gguf`] naming a missing or mistyped key.
    pub fn from_gguf(f: &shardgraph::gguf::GgufFile) -> Result<Self> {
        let k = ArchKeys::new(f, Model::Qwen35)?;
        let shared = read_shared(&k)?;
        let n_nextn = k.int_or("nextn_predict_layers", 0, 0..=1)? as usize;
        let key = "qwen35.rope.dimension_sections";
        let sections: Vec<i64> = match f.get_arr_i32(key) {
            Ok(v) => v.into_iter().map(i64::from).collect(),
            Err(_) => f.get_arr_u32(key)?.into_iter().map(i64::from).collect(),
        };
        if sections.is_empty() || sections.len() > 4 || sections.iter().any(|&s| !(0..=1 << 16).contains(&s)) {
            return Err(Error::Model { detail: format!("qwen35: {key} = {sections:?}: 1 to 4 values of 0..=65536") });
        }
        let mut rope_sections = [0i32; 4];
        for (d, s) in rope_sections.iter_mut().zip(&sections) {
            *d = *s as i32;
        }
        let blocks = shared.core.n_layer;
        let n_layer = blocks.checked_sub(n_nextn).filter(|&l| l > 0).ok_or_else(|| Error::Model {
            detail: format!("qwen35: block_count {blocks} leaves no trunk layer after {n_nextn} NextN layer(s)"),
        })?;
        let hp = Qwen35Hparams {
            n_vocab: 0,
            n_rot: shared.rope_dims.unwrap_or(shared.core.head_dim),
            rope_sections,
            full_attention_interval: k.int_or("full_attention_interval", 4, 1..=super::MAX_LAYERS as i64)? as usize,
            d_conv: k.int("ssm.conv_kernel", 2..=1 << 10)?,
            d_state: k.int("ssm.state_size", DIM)?,
            n_k_heads: k.int("ssm.group_count", DIM)?,
            n_v_heads: k.int("ssm.time_step_rank", DIM)?,
            n_nextn,
            n_ctx_train: shared.context_length.unwrap_or(4096) as u32,
            core: HparamsCore { n_layer, ..shared.core },
        };
        let n_vocab = f.tensor("token_embd.weight")?.info.ne[1];
        let hp = Qwen35Hparams { n_vocab, ..hp };
        if let Some(v) = shared.vocab_size {
            if v != n_vocab {
                return Err(Error::Model {
                    detail: format!("qwen35: vocab_size {v}, but token_embd.weight has {n_vocab} rows"),
                });
            }
        }
        hp.validate()?;
        let inner = k.int("ssm.inner_size", DIM)?;
        if inner != hp.d_inner() {
            return Err(Error::Model {
                detail: format!("qwen35: ssm.inner_size {inner} ≠ time_step_rank × state_size {}", hp.d_inner()),
            });
        }
        Ok(hp)
    }

    /// Writes llama.cpp's `qwen35` metadata for these hyper-parameters.
    /// (Not through [`HparamsCore::add_to_gguf`]: here the keys come in
    /// another order — the NextN count after `block_count`, ε before the
    /// rope base — and `rope.dimension_count` is the partial rotary `n_rot`;
    /// kept so that generated files stay the same byte for byte.)
    ///
    /// # Errors
    /// [`Error::Gguf`] from the writer.
    pub fn add_to_gguf(&self, w: &mut shardgraph::gguf::GgufWriter, name: &str) -> Result<()> {
        w.add_kv("general.architecture", "qwen35")?;
        w.add_kv("general.name", name)?;
        w.add_kv("qwen35.block_count", (self.n_layer + self.n_nextn) as u32)?;
        w.add_kv("qwen35.nextn_predict_layers", self.n_nextn as u32)?;
        w.add_kv("qwen35.context_length", self.n_ctx_train)?;
        w.add_kv("qwen35.embedding_length", self.n_embd as u32)?;
        w.add_kv("qwen35.feed_forward_length", self.n_ff as u32)?;
        w.add_kv("qwen35.attention.head_count", self.n_head as u32)?;
        w.add_kv("qwen35.attention.head_count_kv", self.n_head_kv as u32)?;
        w.add_kv("qwen35.attention.key_length", self.head_dim as u32)?;
        w.add_kv("qwen35.attention.value_length", self.head_dim as u32)?;
        w.add_kv("qwen35.attention.layer_norm_rms_epsilon", self.rms_eps)?;
        w.add_kv("qwen35.rope.freq_base", self.rope_base)?;
        w.add_kv("qwen35.rope.dimension_count", self.n_rot as u32)?;
        w.add_kv("qwen35.rope.dimension_sections", self.rope_sections.to_vec())?;
        w.add_kv("qwen35.full_attention_interval", self.full_attention_interval as u32)?;
        w.add_kv("qwen35.ssm.conv_kernel", self.d_conv as u32)?;
        w.add_kv("qwen35.ssm.state_size", self.d_state as u32)?;
        w.add_kv("qwen35.ssm.group_count", self.n_k_heads as u32)?;
        w.add_kv("qwen35.ssm.time_step_rank", self.n_v_heads as u32)?;
        w.add_kv("qwen35.ssm.inner_size", self.d_inner() as u32)?;
        w.add_kv("qwen35.vocab_size", self.n_vocab as u32)?;
        w.add_kv("tokenizer.ggml.model", "no_vocab")?;
        Ok(())
    }
}

/// Weight types of a `qwen35` model, per role (norms, conv kernels, `ssm_a`
/// and `ssm_dt` are always F32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qwen35Types {
    /// `token_embd.weight`.
    pub embd: GgmlType,
    /// Attention and delta-net projections (`attn_q/k/v/output`, `attn_qkv`,
    /// `attn_gate`, `ssm_alpha/beta`, `ssm_out`).
    pub attn: GgmlType,
    /// FFN gate/up/down.
    pub ffn: GgmlType,
    /// `output.weight`.
    pub output: GgmlType,
}

impl Qwen35Types {
    /// The types of a `qwen35` GGUF's tensors with hyper-parameters `hp`
    /// (the first attention layer's `attn_q` for the projections, layer 0
    /// for the FFN).
    ///
    /// # Errors
    /// [`Error::Gguf`] naming a missing tensor.
    pub fn from_gguf(f: &shardgraph::gguf::GgufFile, hp: &Qwen35Hparams) -> Result<Self> {
        let ty = |n: &str| f.tensor(n).map(|t| t.info.ty);
        let attn = match (0..hp.n_layer).find(|&il| !hp.is_recurrent(il)) {
            Some(il) => ty(&format!("blk.{il}.attn_q.weight"))?,
            None => ty("blk.0.attn_qkv.weight")?,
        };
        Ok(Qwen35Types {
            embd: ty("token_embd.weight")?,
            attn,
            ffn: ty("blk.0.ffn_gate.weight")?,
            output: ty("output.weight")?,
        })
    }
}

impl Qwen35Types {
    /// Every matrix of type `ty`.
    pub fn all(ty: GgmlType) -> Self {
        Qwen35Types { embd: ty, attn: ty, ffn: ty, output: ty }
    }
}

/// The mixer of one trunk layer.
#[derive(Clone, Debug)]
pub enum Qwen35Mixer {
    /// Gated full attention.
    Attention {
        /// `attn_q.weight` `[E, 2·H·D]` (per head: D query then D gate rows).
        wq: TensorId,
        /// `attn_k.weight` `[E, Hkv·D]`.
        wk: TensorId,
        /// `attn_v.weight` `[E, Hkv·D]`.
        wv: TensorId,
        /// `attn_output.weight` `[H·D, E]`.
        wo: TensorId,
        /// `attn_q_norm.weight` `[D]`.
        q_norm: TensorId,
        /// `attn_k_norm.weight` `[D]`.
        k_norm: TensorId,
        /// `cache_k_lN` `[Hkv·D, kv_size]`.
        cache_k: TensorId,
        /// `cache_v_lN` `[Hkv·D, kv_size]`.
        cache_v: TensorId,
    },
    /// Gated DeltaNet.
    DeltaNet {
        /// `attn_qkv.weight` `[E, conv_channels]`.
        wqkv: TensorId,
        /// `attn_gate.weight` `[E, d_inner]` (z).
        wgate: TensorId,
        /// `ssm_beta.weight` `[E, H_v]`.
        beta: TensorId,
        /// `ssm_alpha.weight` `[E, H_v]`.
        alpha: TensorId,
        /// `ssm_dt.bias` `[H_v]`.
        dt_bias: TensorId,
        /// `ssm_a` `[H_v]` (−exp(A_log)).
        a: TensorId,
        /// `ssm_conv1d.weight` `[d_conv, conv_channels]`.
        conv1d: TensorId,
        /// `ssm_norm.weight` `[S]`.
        norm: TensorId,
        /// `ssm_out.weight` `[d_inner, E]`.
        out: TensorId,
        /// `cache_r_lN` `[(d_conv − 1)·conv_channels, 1]`: the last inputs.
        cache_r: TensorId,
        /// `cache_s_lN` `[S·S·H_v, 1]`: the recurrent state.
        cache_s: TensorId,
    },
}

/// One trunk layer's tensors.
#[derive(Clone, Debug)]
pub struct Qwen35Layer {
    /// `attn_norm.weight` `[E]`.
    pub attn_norm: TensorId,
    /// `post_attention_norm.weight` `[E]`.
    pub post_norm: TensorId,
    /// The mixer.
    pub mixer: Qwen35Mixer,
    /// `ffn_gate.weight` `[E, F]`.
    pub ffn_gate: TensorId,
    /// `ffn_up.weight` `[E, F]`.
    pub ffn_up: TensorId,
    /// `ffn_down.weight` `[F, E]`.
    pub ffn_down: TensorId,
}

/// The NextN (MTP) block (shardgraph-models/MODELS.md, section 5.1): `blk.L.*`
/// after the trunk.
#[derive(Clone, Debug)]
pub struct Qwen35Nextn {
    /// Its gated-attention layer (mixer [`Qwen35Mixer::Attention`], own KV cache `cache_k_lL`).
    pub layer: Qwen35Layer,
    /// `nextn.eh_proj.weight` `[2E, E]`: `[normed embedding; normed hidden]` → E.
    pub eh_proj: TensorId,
    /// `nextn.enorm.weight` `[E]`.
    pub enorm: TensorId,
    /// `nextn.hnorm.weight` `[E]`.
    pub hnorm: TensorId,
    /// `nextn.shared_head_norm.weight` `[E]`.
    pub head_norm: TensorId,
}

/// One MTP step's graph tensors.
#[derive(Clone, Debug)]
pub struct MtpStep {
    /// `mtp_tokens` I32 `[T]`.
    pub tokens: TensorId,
    /// `mtp_h` F32 `[E, T]`: the hidden state paired with each token.
    pub h: TensorId,
    /// `mtp_pos` I32 `[4·T]`.
    pub pos: TensorId,
    /// `mtp_mask` F16 `[n_kv, T]`.
    pub mask: TensorId,
    /// `mtp_idxs` I64 `[T]`.
    pub kv_idxs: TensorId,
    /// The MTP layer's K/V writes.
    pub writes: Vec<TensorId>,
    /// `hN` `[E, T]`, fed back as the next row's hidden state.
    pub h_out: TensorId,
    /// Greedy token per row, I32 `[T]`.
    pub argmax: TensorId,
    /// The greedy token's probability per row, F32 `[1, 1, T]` (computed where the vocabulary slices live).
    pub top_prob: TensorId,
}

/// One step of an MTP chain ([`Qwen35::build_mtp_chain`]).
#[derive(Clone, Debug)]
pub struct MtpChainStep {
    /// `mtp_pos_i` I32 `[4]`.
    pub pos: TensorId,
    /// `mtp_mask_i` F16 `[n_kv, 1]`.
    pub mask: TensorId,
    /// `mtp_idx_i` I64 `[1]`.
    pub kv_idxs: TensorId,
    /// The drafted token, I32 `[1]`.
    pub argmax: TensorId,
    /// Its probability, F32 `[1, 1, 1]`.
    pub top_prob: TensorId,
}

/// `n` chained MTP steps in one graph.
#[derive(Clone, Debug)]
pub struct MtpChain {
    /// `mtp_token` I32 `[1]`: the last accepted token.
    pub token: TensorId,
    /// `mtp_h` F32 `[E, 1]`: the hidden state paired with it.
    pub h: TensorId,
    /// The steps.
    pub steps: Vec<MtpChainStep>,
    /// The MTP layer's K/V writes of every step.
    pub writes: Vec<TensorId>,
}

/// A `qwen35` model's long-lived tensors in a [`Context`].
#[derive(Clone, Debug)]
pub struct Qwen35 {
    /// Hyper-parameters.
    pub hp: Qwen35Hparams,
    /// Weight types.
    pub types: Qwen35Types,
    /// `token_embd.weight` `[E, V]`.
    pub tok_embd: TensorId,
    /// `output_norm.weight` `[E]`.
    pub output_norm: TensorId,
    /// `output.weight` `[E, V]`.
    pub output: TensorId,
    /// Trunk layers.
    pub layers: Vec<Qwen35Layer>,
    /// The NextN (MTP) block, when the file has one.
    pub nextn: Option<Qwen35Nextn>,
    /// Per Gated-DeltaNet layer (in layer order), the rollback snapshots:
    /// for every slot `j`, the conv state `cache_r_lN_snapJ`
    /// `[(d_conv−1)·channels, 1]` and the recurrent state
    /// `cache_s_lN_snapJ` `[S·S·H_v, 1]` after token `j` of a batch
    /// (one tensor per slot, so a step's writes never share an owner);
    /// made by [`Qwen35::add_snapshots`].
    pub snapshots: Vec<Vec<(TensorId, TensorId)>>,
    /// Columns of each snapshot buffer: the longest batch whose every
    /// token's state is kept (0: none).
    pub snapshot_slots: usize,
    /// KV cache cells of the attention layers.
    pub kv_size: i64,
    /// KV cache type.
    pub kv_type: GgmlType,
    /// Context length after the model's tensors.
    pub base_len: usize,
}

/// One step's graph tensors.
#[derive(Clone, Debug)]
pub struct Qwen35Step {
    /// `tokens` I32 `[T]`.
    pub tokens: TensorId,
    /// `inp_pos` I32 `[4·T]`: IMROPE's four position streams (text: p, p, p, 0).
    pub pos: TensorId,
    /// `kq_mask` F16 `[n_kv, T]`.
    pub mask: TensorId,
    /// `k_idxs` I64 `[T]`.
    pub kv_idxs: TensorId,
    /// `snap_row` I64 `[1]` (= 0) when the step writes rollback snapshots.
    pub snap_row: Option<TensorId>,
    /// Cache and state writes.
    pub writes: Vec<TensorId>,
    /// Exported hidden states: `(layer, [E, T])`, the input of `layer`, or
    /// for `layer = n_layer` the post-final-norm state.
    pub taps: Vec<(usize, TensorId)>,
    /// The post-final-norm hidden state `[E, T]` (`t_h_nextn`, the MTP head's input).
    pub h_nextn: TensorId,
    /// Logits `[V, T]`.
    pub logits: TensorId,
    /// Greedy token per row, I32 `[T]`.
    pub argmax: TensorId,
}

/// The tensors of a `qwen35` GGUF in llama.cpp's names: name, type, shape.
pub fn qwen35_tensors(hp: &Qwen35Hparams, types: &Qwen35Types) -> Vec<(String, GgmlType, Vec<i64>)> {
    let (e, f, v) = (hp.n_embd, hp.n_ff, hp.n_vocab);
    let (d, qd, kvd) = (hp.head_dim, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
    let f32t = GgmlType::F32;
    let mut t = vec![
        ("token_embd.weight".to_string(), types.embd, vec![e, v]),
        ("output_norm.weight".to_string(), f32t, vec![e]),
        ("output.weight".to_string(), types.output, vec![e, v]),
    ];
    for il in 0..hp.n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        t.push((b("attn_norm.weight"), f32t, vec![e]));
        t.push((b("post_attention_norm.weight"), f32t, vec![e]));
        if hp.is_recurrent(il) {
            let a = types.attn;
            t.extend([
                (b("attn_qkv.weight"), a, vec![e, hp.conv_channels()]),
                (b("attn_gate.weight"), a, vec![e, hp.d_inner()]),
                (b("ssm_beta.weight"), a, vec![e, hp.n_v_heads]),
                (b("ssm_alpha.weight"), a, vec![e, hp.n_v_heads]),
                (b("ssm_dt.bias"), f32t, vec![hp.n_v_heads]),
                (b("ssm_a"), f32t, vec![hp.n_v_heads]),
                (b("ssm_conv1d.weight"), f32t, vec![hp.d_conv, hp.conv_channels()]),
                (b("ssm_norm.weight"), f32t, vec![hp.d_state]),
                (b("ssm_out.weight"), a, vec![hp.d_inner(), e]),
            ]);
        } else {
            let a = types.attn;
            t.extend([
                (b("attn_q.weight"), a, vec![e, 2 * qd]),
                (b("attn_k.weight"), a, vec![e, kvd]),
                (b("attn_v.weight"), a, vec![e, kvd]),
                (b("attn_output.weight"), a, vec![qd, e]),
                (b("attn_q_norm.weight"), f32t, vec![d]),
                (b("attn_k_norm.weight"), f32t, vec![d]),
            ]);
        }
        t.extend([
            (b("ffn_gate.weight"), types.ffn, vec![e, f]),
            (b("ffn_up.weight"), types.ffn, vec![e, f]),
            (b("ffn_down.weight"), types.ffn, vec![f, e]),
        ]);
    }
    if hp.n_nextn == 1 {
        // The NextN (MTP) block after the trunk: a gated-attention layer and
        // its projection of [normed embedding; normed hidden state].
        let il = hp.n_layer;
        let b = |n: &str| format!("blk.{il}.{n}");
        let a = types.attn;
        t.extend([
            (b("attn_norm.weight"), f32t, vec![e]),
            (b("post_attention_norm.weight"), f32t, vec![e]),
            (b("attn_q.weight"), a, vec![e, 2 * qd]),
            (b("attn_k.weight"), a, vec![e, kvd]),
            (b("attn_v.weight"), a, vec![e, kvd]),
            (b("attn_output.weight"), a, vec![qd, e]),
            (b("attn_q_norm.weight"), f32t, vec![d]),
            (b("attn_k_norm.weight"), f32t, vec![d]),
            (b("ffn_gate.weight"), types.ffn, vec![e, f]),
            (b("ffn_up.weight"), types.ffn, vec![e, f]),
            (b("ffn_down.weight"), types.ffn, vec![f, e]),
            (b("nextn.eh_proj.weight"), a, vec![2 * e, e]),
            (b("nextn.enorm.weight"), f32t, vec![e]),
            (b("nextn.hnorm.weight"), f32t, vec![e]),
            (b("nextn.shared_head_norm.weight"), f32t, vec![e]),
        ]);
    }
    t
}

/// A model's weights by GGUF name.
type Weights = std::collections::HashMap<String, TensorId>;

/// Block `il`'s layer around `mixer`: its norms and FFN from `ids`.
fn layer(ids: &Weights, il: usize, mixer: Qwen35Mixer) -> Qwen35Layer {
    let b = |n: &str| ids[&format!("blk.{il}.{n}")];
    Qwen35Layer {
        attn_norm: b("attn_norm.weight"),
        post_norm: b("post_attention_norm.weight"),
        mixer,
        ffn_gate: b("ffn_gate.weight"),
        ffn_up: b("ffn_up.weight"),
        ffn_down: b("ffn_down.weight"),
    }
}

/// Block `il`'s gated-attention mixer: its weights from `ids` and new KV
/// caches `cache_k_l{il}`, `cache_v_l{il}` (`[Hkv·D, kv_size]` of `kv_type`).
fn attention_mixer(
    ctx: &mut Context,
    ids: &Weights,
    il: usize,
    hp: &Qwen35Hparams,
    (kv_type, kv_size): (GgmlType, i64),
) -> Result<Qwen35Mixer> {
    let b = |n: &str| ids[&format!("blk.{il}.{n}")];
    let kvd = hp.n_head_kv * hp.head_dim;
    Ok(Qwen35Mixer::Attention {
        wq: b("attn_q.weight"),
        wk: b("attn_k.weight"),
        wv: b("attn_v.weight"),
        wo: b("attn_output.weight"),
        q_norm: b("attn_q_norm.weight"),
        k_norm: b("attn_k_norm.weight"),
        cache_k: named(ctx, kv_type, &[kvd, kv_size], &format!("cache_k_l{il}"))?,
        cache_v: named(ctx, kv_type, &[kvd, kv_size], &format!("cache_v_l{il}"))?,
    })
}

/// Block `il`'s Gated-DeltaNet mixer: its weights from `ids` and new state
/// caches `cache_r_l{il}`, `cache_s_l{il}` ([`new_states`]).
fn delta_net_mixer(ctx: &mut Context, ids: &Weights, il: usize, hp: &Qwen35Hparams) -> Result<Qwen35Mixer> {
    let b = |n: &str| ids[&format!("blk.{il}.{n}")];
    let (cache_r, cache_s) = new_states(ctx, hp, &format!("l{il}"))?;
    Ok(Qwen35Mixer::DeltaNet {
        wqkv: b("attn_qkv.weight"),
        wgate: b("attn_gate.weight"),
        beta: b("ssm_beta.weight"),
        alpha: b("ssm_alpha.weight"),
        dt_bias: b("ssm_dt.bias"),
        a: b("ssm_a"),
        conv1d: b("ssm_conv1d.weight"),
        norm: b("ssm_norm.weight"),
        out: b("ssm_out.weight"),
        cache_r,
        cache_s,
    })
}

/// A delta-net layer's F32 states, `cache_r_{tag}` (the conv state,
/// `[(d_conv − 1)·conv_channels, 1]`) and `cache_s_{tag}` (the recurrent
/// state, `[S·S·H_v, 1]`).
fn new_states(ctx: &mut Context, hp: &Qwen35Hparams, tag: &str) -> Result<(TensorId, TensorId)> {
    let r = named(ctx, GgmlType::F32, &[(hp.d_conv - 1) * hp.conv_channels(), 1], &format!("cache_r_{tag}"))?;
    let s = named(ctx, GgmlType::F32, &[hp.d_state * hp.d_state * hp.n_v_heads, 1], &format!("cache_s_{tag}"))?;
    Ok((r, s))
}

impl Qwen35 {
    /// Creates the weights (GGUF names) and caches in `ctx`: KV caches of
    /// `kv_size` cells of `kv_type` for the attention layers, F32 conv and
    /// recurrent states for the delta-net layers.
    ///
    /// # Errors
    /// [`Error::Model`] for inconsistent hyper-parameters, a `kv_size` outside
    /// `1..=`[`super::MAX_CTX`], or
    /// a type whose block does not divide the rows it stores.
    pub fn new(
        ctx: &mut Context,
        hp: Qwen35Hparams,
        types: Qwen35Types,
        kv_type: GgmlType,
        kv_size: i64,
    ) -> Result<Self> {
        hp.validate()?;
        super::check_kv_size("qwen35", kv_size)?;
        if !matches!(kv_type, GgmlType::F16 | GgmlType::F32 | GgmlType::Q8_0 | GgmlType::Q4_0)
            || hp.head_dim % kv_type.block_size() as i64 != 0
        {
            return Err(Error::Model {
                detail: format!("qwen35: KV cache type {kv_type} for head size {} (F32, F16, Q8_0, Q4_0)", hp.head_dim),
            });
        }
        let tensors = qwen35_tensors(&hp, &types);
        for (name, ty, ne) in &tensors {
            if ne[0] % ty.block_size() as i64 != 0 {
                return Err(Error::Model {
                    detail: format!("qwen35: {name} rows of {} do not fit {ty} blocks", ne[0]),
                });
            }
        }
        let mut ids = Weights::new();
        for (name, ty, ne) in &tensors {
            ids.insert(name.clone(), named(ctx, *ty, ne, name)?);
        }
        let get = |n: &str| ids[n];
        let kv = (kv_type, kv_size);
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let mixer = if hp.is_recurrent(il) {
                delta_net_mixer(ctx, &ids, il, &hp)?
            } else {
                attention_mixer(ctx, &ids, il, &hp, kv)?
            };
            layers.push(layer(&ids, il, mixer));
        }
        let nextn = if hp.n_nextn == 1 {
            let il = hp.n_layer;
            let b = |n: &str| get(&format!("blk.{il}.{n}"));
            Some(Qwen35Nextn {
                layer: layer(&ids, il, attention_mixer(ctx, &ids, il, &hp, kv)?),
                eh_proj: b("nextn.eh_proj.weight"),
                enorm: b("nextn.enorm.weight"),
                hnorm: b("nextn.hnorm.weight"),
                head_norm: b("nextn.shared_head_norm.weight"),
            })
        } else {
            None
        };
        Ok(Qwen35 {
            snapshots: Vec::new(),
            snapshot_slots: 0,
            nextn,
            tok_embd: get("token_embd.weight"),
            output_norm: get("output_norm.weight"),
            output: get("output.weight"),
            hp,
            types,
            layers,
            kv_size,
            kv_type,
            base_len: ctx.len(),
        })
    }

    /// Builds one step's graph for `n_tokens` tokens
    /// (shardgraph-models/MODELS.md, section 3.3): every layer's mixer
    /// (attention writing K/V at `k_idxs`; delta-net reading and writing its
    /// conv and recurrent states), post-attention norm and SwiGLU FFN with
    /// residuals; the final norm (`h_nextn`) and logits.
    ///
    /// `taps` lists the layers whose input is exported (`n_layer`: the
    /// post-final-norm state, as DFlash's "after the last layer" and the MTP
    /// head read it).
    ///
    /// # Errors
    /// [`Error::Model`] for `n_tokens < 1` or a tap beyond `n_layer`;
    /// constructor errors.
    pub fn build(&self, ctx: &mut Context, n_tokens: i64, taps: &[usize]) -> Result<Qwen35Step> {
        self.build_window(ctx, n_tokens, self.kv_size, taps)
    }

    /// [`Qwen35::build`] with attention over the first `n_kv` cells (the
    /// used window, [`super::kv_window`]) under a mask `[n_kv, T]`.
    ///
    /// # Errors
    /// As [`Qwen35::build`]; [`Error::Model`] for `n_kv` outside `1..=kv_size`.
    pub fn build_window(&self, ctx: &mut Context, n_tokens: i64, n_kv: i64, taps: &[usize]) -> Result<Qwen35Step> {
        let hp = &self.hp;
        if n_tokens < 1 {
            return Err(Error::Model { detail: format!("qwen35: a step needs ≥ 1 token, got {n_tokens}") });
        }
        self.check_window(n_kv)?;
        if let Some(&l) = taps.iter().find(|&&l| l > hp.n_layer) {
            return Err(Error::Model { detail: format!("qwen35: tap of layer {l} beyond {} layers", hp.n_layer) });
        }
        let t = n_tokens;
        let tokens = input(ctx, GgmlType::I32, &[t], "tokens")?;
        let pos = input(ctx, GgmlType::I32, &[4 * t], "inp_pos")?;
        let mask = input(ctx, GgmlType::F16, &[n_kv, t], "kq_mask")?;
        let kv_idxs = input(ctx, GgmlType::I64, &[t], "k_idxs")?;
        let mut x = ctx.get_rows(self.tok_embd, tokens)?;
        let mut writes = Vec::new();
        let mut tap_ids = Vec::new();
        let mut snaps = self.snapshots.iter();
        let snap_row = if t > 1 && t as usize <= self.snapshot_slots {
            Some(input(ctx, GgmlType::I64, &[1], "snap_row")?)
        } else {
            None
        };
        for (il, w) in self.layers.iter().enumerate() {
            if taps.contains(&il) {
                tap_ids.push((il, x));
            }
            x = self.block(ctx, w, x, |ctx, xn| match &w.mixer {
                Qwen35Mixer::Attention { .. } => self.attention(ctx, &w.mixer, xn, pos, mask, kv_idxs, t, &mut writes),
                Qwen35Mixer::DeltaNet { .. } => {
                    let snap = snaps.next().zip(snap_row).map(|(v, r)| (&v[..], r));
                    self.delta_net(ctx, &w.mixer, xn, t, snap, &mut writes)
                }
            })?;
        }
        let h_nextn = rms_norm_w(ctx, x, self.output_norm, hp.rms_eps)?;
        if taps.contains(&hp.n_layer) {
            tap_ids.push((hp.n_layer, h_nextn));
        }
        let logits = ctx.mul_mat(self.output, h_nextn)?;
        let argmax = ctx.argmax(logits)?;
        Ok(Qwen35Step { tokens, pos, mask, kv_idxs, snap_row, writes, taps: tap_ids, h_nextn, logits, argmax })
    }

    /// One layer over `x` `[E, T]` (trunk or NextN): RMSNorm·`attn_norm`,
    /// the mixer `mix`, residual; RMSNorm·`post_attention_norm`, SwiGLU
    /// FFN, residual.
    fn block(
        &self,
        ctx: &mut Context,
        w: &Qwen35Layer,
        x: TensorId,
        mix: impl FnOnce(&mut Context, TensorId) -> Result<TensorId>,
    ) -> Result<TensorId> {
        let eps = self.hp.rms_eps;
        let xn = rms_norm_w(ctx, x, w.attn_norm, eps)?;
        let mixed = mix(ctx, xn)?;
        let h = ctx.add(mixed, x)?;
        let hn = rms_norm_w(ctx, h, w.post_norm, eps)?;
        let down = layers::swiglu_ffn(ctx, hn, w.ffn_gate, w.ffn_up, w.ffn_down)?;
        ctx.add(down, h)
    }

    fn check_window(&self, n_kv: i64) -> Result<()> {
        super::check_window("qwen35", n_kv, self.kv_size)
    }

    /// Creates the rollback snapshot buffers (F32, `slots` columns per
    /// Gated-DeltaNet layer; named after the caches, so a split policy
    /// splits them alike): a batch of up to `slots` tokens then keeps the
    /// conv and recurrent state after every token, and a rollback inside it
    /// copies one column back instead of decoding again.
    ///
    /// # Errors
    /// [`Error::Model`] if snapshots exist already or `slots` is outside
    /// `2..=MAX_DRAFT + 1` ([`super::speculative::MAX_DRAFT`]).
    pub fn add_snapshots(&mut self, ctx: &mut Context, slots: usize) -> Result<()> {
        let most = super::speculative::MAX_DRAFT + 1;
        if self.snapshot_slots > 0 || !(2..=most).contains(&slots) {
            return Err(Error::Model {
                detail: format!(
                    "qwen35: snapshots of {slots} slots (2 to {most}: a verification batch of at most \
                     MAX_DRAFT drafts and its anchor; and only once)"
                ),
            });
        }
        let hp = &self.hp;
        for (il, l) in self.layers.iter().enumerate() {
            if let Qwen35Mixer::DeltaNet { .. } = l.mixer {
                let mut layer = Vec::with_capacity(slots);
                for j in 0..slots {
                    layer.push(new_states(ctx, hp, &format!("l{il}_snap{j}"))?);
                }
                self.snapshots.push(layer);
            }
        }
        self.snapshot_slots = slots;
        self.base_len = ctx.len();
        Ok(())
    }

    /// The MTP (NextN) head's graph for `n_tokens` rows
    /// (shardgraph-models/MODELS.md, section 5.2):
    /// `x = eh_proj·[RMSNorm(embd(token))·enorm; RMSNorm(h)·hnorm]`, one
    /// gated-attention block over its own KV cache (causal), the SwiGLU FFN,
    /// `hN = RMSNorm(y)·shared_head_norm`, logits from the shared head.
    ///
    /// # Errors
    /// [`Error::Model`] if the model has no NextN block or `n_tokens < 1`.
    pub fn build_mtp(&self, ctx: &mut Context, n_tokens: i64) -> Result<MtpStep> {
        self.build_mtp_window(ctx, n_tokens, self.kv_size)
    }

    /// [`Qwen35::build_mtp`] with attention over the first `n_kv` cells of
    /// the MTP cache under a mask `[n_kv, T]`.
    ///
    /// # Errors
    /// As [`Qwen35::build_mtp`]; [`Error::Model`] for `n_kv` outside `1..=kv_size`.
    pub fn build_mtp_window(&self, ctx: &mut Context, n_tokens: i64, n_kv: i64) -> Result<MtpStep> {
        self.check_window(n_kv)?;
        let hp = &self.hp;
        if self.nextn.is_none() {
            return Err(Error::Model { detail: "qwen35: the model has no NextN (MTP) block".into() });
        }
        if n_tokens < 1 {
            return Err(Error::Model { detail: "qwen35: an MTP step needs ≥ 1 row".into() });
        }
        let t = n_tokens;
        let tokens = input(ctx, GgmlType::I32, &[t], "mtp_tokens")?;
        let h = input(ctx, GgmlType::F32, &[hp.n_embd, t], "mtp_h")?;
        let pos = input(ctx, GgmlType::I32, &[4 * t], "mtp_pos")?;
        let mask = input(ctx, GgmlType::F16, &[n_kv, t], "mtp_mask")?;
        let kv_idxs = input(ctx, GgmlType::I64, &[t], "mtp_idxs")?;
        let mut writes = Vec::new();
        let (h_out, argmax, top_prob) = self.mtp_rows(ctx, tokens, h, pos, mask, kv_idxs, t, &mut writes)?;
        Ok(MtpStep { tokens, h, pos, mask, kv_idxs, writes, h_out, argmax, top_prob })
    }

    /// The MTP block over `t` rows: `(hN, greedy token, its probability)`.
    #[allow(clippy::too_many_arguments)]
    fn mtp_rows(
        &self,
        ctx: &mut Context,
        tokens: TensorId,
        h: TensorId,
        pos: TensorId,
        mask: TensorId,
        kv_idxs: TensorId,
        t: i64,
        writes: &mut Vec<TensorId>,
    ) -> Result<(TensorId, TensorId, TensorId)> {
        let hp = &self.hp;
        let Some(nx) = &self.nextn else {
            return Err(Error::Model { detail: "qwen35: the model has no NextN (MTP) block".into() });
        };
        let e = ctx.get_rows(self.tok_embd, tokens)?;
        let en = rms_norm_w(ctx, e, nx.enorm, hp.rms_eps)?;
        let hn = rms_norm_w(ctx, h, nx.hnorm, hp.rms_eps)?;
        let eh = ctx.concat(en, hn, 0)?;
        let x = ctx.mul_mat(nx.eh_proj, eh)?;
        let w = &nx.layer;
        let y = self.block(ctx, w, x, |ctx, xn| self.attention(ctx, &w.mixer, xn, pos, mask, kv_idxs, t, writes))?;
        let h_out = rms_norm_w(ctx, y, nx.head_norm, hp.rms_eps)?;
        let logits = ctx.mul_mat(self.output, h_out)?;
        let argmax = ctx.argmax(logits)?;
        let top_prob = layers::top_prob(ctx, logits, argmax)?;
        Ok((h_out, argmax, top_prob))
    }

    /// `n` chained MTP draft steps in one graph (llama.cpp's chain
    /// variant): step 0 reads the input token and hidden state, step `i`
    /// the greedy token and `hN` of step `i − 1`; each writes its K/V at
    /// its own cell, which the later steps attend to.
    ///
    /// # Errors
    /// [`Error::Model`] without a NextN block or for `n` outside
    /// `1..=`[`super::speculative::MAX_DRAFT`].
    pub fn build_mtp_chain(&self, ctx: &mut Context, n: usize) -> Result<MtpChain> {
        self.build_mtp_chain_window(ctx, n, self.kv_size)
    }

    /// [`Qwen35::build_mtp_chain`] with attention over the first `n_kv`
    /// cells of the MTP cache (masks `[n_kv, 1]`).
    ///
    /// # Errors
    /// As [`Qwen35::build_mtp_chain`]; [`Error::Model`] for `n_kv` outside `1..=kv_size`.
    pub fn build_mtp_chain_window(&self, ctx: &mut Context, n: usize, n_kv: i64) -> Result<MtpChain> {
        self.check_window(n_kv)?;
        if self.nextn.is_none() {
            return Err(Error::Model { detail: "qwen35: the model has no NextN (MTP) block".into() });
        }
        if !(1..=super::speculative::MAX_DRAFT).contains(&n) {
            return Err(Error::Model {
                detail: format!(
                    "qwen35: an MTP chain of {n} steps (1 to MAX_DRAFT = {})",
                    super::speculative::MAX_DRAFT
                ),
            });
        }
        let token = input(ctx, GgmlType::I32, &[1], "mtp_token")?;
        let h0 = input(ctx, GgmlType::F32, &[self.hp.n_embd, 1], "mtp_h")?;
        let (mut tok, mut h) = (token, h0);
        let mut steps = Vec::with_capacity(n);
        let mut writes = Vec::new();
        for i in 0..n {
            let pos = input(ctx, GgmlType::I32, &[4], &format!("mtp_pos_{i}"))?;
            let mask = input(ctx, GgmlType::F16, &[n_kv, 1], &format!("mtp_mask_{i}"))?;
            let idx = input(ctx, GgmlType::I64, &[1], &format!("mtp_idx_{i}"))?;
            let (h_out, argmax, top_prob) = self.mtp_rows(ctx, tok, h, pos, mask, idx, 1, &mut writes)?;
            steps.push(MtpChainStep { pos, mask, kv_idxs: idx, argmax, top_prob });
            tok = argmax;
            h = h_out;
        }
        Ok(MtpChain { token, h: h0, steps, writes })
    }

    /// Gated full attention over `xn` `[E, T]`; returns `[E, T]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        ctx: &mut Context,
        m: &Qwen35Mixer,
        xn: TensorId,
        pos: TensorId,
        mask: TensorId,
        kv_idxs: TensorId,
        t: i64,
        writes: &mut Vec<TensorId>,
    ) -> Result<TensorId> {
        let Qwen35Mixer::Attention { wq, wk, wv, wo, q_norm, k_norm, cache_k, cache_v } = *m else {
            return Err(Error::Model { detail: "qwen35: not an attention layer".into() });
        };
        let hp = &self.hp;
        let (d, h, hkv) = (hp.head_dim, hp.n_head, hp.n_head_kv);
        let f = 4usize;
        let qg = ctx.mul_mat(wq, xn)?; // [2·H·D, T]: per head D query then D gate values
        let (nb1, nb2) = (2 * d as usize * f, 2 * (d * h) as usize * f);
        let q = ctx.view_3d(qg, d, h, t, nb1, nb2, 0)?;
        let q = rms_norm_w(ctx, q, q_norm, hp.rms_eps)?;
        let gate = ctx.view_3d(qg, d, h, t, nb1, nb2, d as usize * f)?;
        let gate = ctx.cont_2d(gate, d * h, t)?;
        let k = layers::heads(ctx, wk, xn, (d, hkv, t))?;
        let k = rms_norm_w(ctx, k, k_norm, hp.rms_eps)?;
        let v = ctx.mul_mat(wv, xn)?;
        let rope = hp.rope();
        let q = ctx.rope_multi(q, pos, None, rope)?;
        let k = ctx.rope_multi(k, pos, None, rope)?;
        let k2 = ctx.reshape_2d(k, hkv * d, t)?;
        // V is written as projected (`[Hkv·D, T]`).
        let cache = KvCache { k: cache_k, v: cache_v };
        let shape = AttnShape { head_dim: d, n_head: h, n_head_kv: hkv, kv_type: self.kv_type };
        let (a, wk_, wv_) = layers::attention(ctx, q, (k2, v), cache, kv_idxs, mask, &shape)?;
        writes.push(wk_);
        writes.push(wv_);
        let g = ctx.sigmoid(gate)?;
        let a = ctx.mul(a, g)?;
        ctx.mul_mat(wo, a)
    }

    /// A Gated-DeltaNet mixer over `xn` `[E, T]`; returns `[E, T]` and
    /// records the conv- and recurrent-state writes.
    fn delta_net(
        &self,
        ctx: &mut Context,
        m: &Qwen35Mixer,
        xn: TensorId,
        t: i64,
        snap: Option<(&[(TensorId, TensorId)], TensorId)>,
        writes: &mut Vec<TensorId>,
    ) -> Result<TensorId> {
        let Qwen35Mixer::DeltaNet { wqkv, wgate, beta, alpha, dt_bias, a, conv1d, norm, out, cache_r, cache_s } = *m
        else {
            return Err(Error::Model { detail: "qwen35: not a delta-net layer".into() });
        };
        let hp = &self.hp;
        let (s, hk, hv, dc) = (hp.d_state, hp.n_k_heads, hp.n_v_heads, hp.d_conv);
        let ch = hp.conv_channels();
        let f = 4usize;
        let qkv = ctx.mul_mat(wqkv, xn)?; // [ch, T]
        let z = ctx.mul_mat(wgate, xn)?; // [d_inner, T]
        let b = ctx.mul_mat(beta, xn)?;
        let b = ctx.reshape_4d(b, 1, hv, t, 1)?;
        let b = ctx.sigmoid(b)?;
        let al = ctx.mul_mat(alpha, xn)?; // [H_v, T]
        let al = ctx.add(al, dt_bias)?;
        let al = ctx.softplus(al)?;
        let g = ctx.mul(al, a)?;
        let g = ctx.reshape_4d(g, 1, hv, t, 1)?;
        // Conv: the last d_conv − 1 inputs, then this step's, per channel.
        let state = ctx.reshape_3d(cache_r, dc - 1, ch, 1)?;
        let qkv_t = ctx.transpose(qkv)?; // [T, ch] (a strided view, as llama.cpp concatenates it)
        let conv_in = ctx.concat(state, qkv_t, 0)?; // [dc − 1 + T, ch, 1]
        let cin = ctx.tensor(conv_in)?.clone();
        let last = ctx.view_3d(conv_in, dc - 1, ch, 1, cin.nb[1], cin.nb[2], t as usize * f)?;
        let last = ctx.cont(last)?;
        let last = ctx.reshape_2d(last, (dc - 1) * ch, 1)?;
        writes.push(ctx.cpy(last, cache_r)?);
        // Snapshots: the conv state after token j (j = 0..T) is columns j+1 .. j+d_conv−1 of conv_in.
        // (set_rows into row 0: a write to the stored snapshot even though nothing reads it here.)
        if let Some((slots, row0)) = snap {
            let row = (dc - 1) * ch;
            for (j, &(snap_r, _)) in slots.iter().enumerate().take(t as usize) {
                let st = ctx.view_3d(conv_in, dc - 1, ch, 1, cin.nb[1], cin.nb[2], (j + 1) * f)?;
                let st = ctx.cont(st)?;
                let st = ctx.reshape_2d(st, row, 1)?;
                writes.push(ctx.set_rows(snap_r, st, row0)?);
            }
        }
        let conv = ctx.ssm_conv(conv_in, conv1d)?; // [ch, T, 1]
        let conv = ctx.silu(conv)?;
        let nb1 = ch as usize * f;
        let row = |n: i64| n as usize * f;
        let q = ctx.view_4d(conv, s, hk, t, 1, row(s), nb1, nb1 * t as usize, 0)?;
        let k = ctx.view_4d(conv, s, hk, t, 1, row(s), nb1, nb1 * t as usize, row(s * hk))?;
        let v = ctx.view_4d(conv, s, hv, t, 1, row(s), nb1, nb1 * t as usize, row(2 * s * hk))?;
        let q = ctx.l2_norm(q, hp.rms_eps)?;
        let k = ctx.l2_norm(k, hp.rms_eps)?;
        let st = ctx.reshape_4d(cache_s, s, s, hv, 1)?;
        // With snapshots, a slot per token: slot i holds the state after token T − 1 − i.
        let slots = if snap.is_some() { t } else { 1 };
        let r = ctx.gated_delta_net(q, k, v, g, b, st, slots)?; // [S·H_v, T + slots·S·H_v]
        let o = ctx.view_4d(r, s, hv, t, 1, row(s), row(s * hv), row(s * hv * t), 0)?;
        let new_state = ctx.view_2d(r, s * s * hv, 1, row(s * s * hv), row(s * hv * t))?;
        writes.push(ctx.cpy(new_state, cache_s)?);
        if let Some((slots, row0)) = snap {
            for i in 0..t {
                let st = ctx.view_2d(r, s * s * hv, 1, row(s * s * hv), row(s * hv * t + i * s * s * hv))?;
                // Slot i is the state after token T − 1 − i.
                let (_, snap_s) = slots[(t - 1 - i) as usize];
                writes.push(ctx.set_rows(snap_s, st, row0)?);
            }
        }
        let o = rms_norm_w(ctx, o, norm, hp.rms_eps)?;
        let z = ctx.reshape_4d(z, s, hv, t, 1)?;
        let z = ctx.silu(z)?;
        let o = ctx.mul(o, z)?;
        let o = ctx.reshape_2d(o, s * hv, t)?;
        ctx.mul_mat(out, o)
    }
}

/// A `qwen35` model decoding one sequence on N devices.
///
/// Rollback (a speculative step's rejected rows): attention layers just
/// forget their KV cells, but the conv and recurrent states have absorbed
/// every token of the batch. A multi-token [`Qwen35Session::decode`] first
/// checkpoints those states (host copies, single-device bytes); rolling
/// back into that batch restores them and decodes the kept tokens again, so
/// the states are exactly those greedy decoding leaves.
#[derive(Debug)]
pub struct Qwen35Session {
    /// The model.
    pub model: Qwen35,
    /// The context holding the model's tensors.
    pub ctx: Context,
    /// Devices, plans and storage.
    pub runner: super::runner::Runner,
    /// Positions decoded.
    pub n_past: i64,
    /// Context length with only long-lived tensors.
    pub base_len: usize,
    /// The last multi-token batch: its start position, its tokens, and the
    /// recurrent caches before it (host copies; used without snapshots).
    checkpoint: Option<Checkpoint>,
    /// The last multi-token batch whose per-token states are in the
    /// snapshot buffers: `(start, tokens)`.
    snap_batch: Option<(i64, i64)>,
}

/// The recurrent states before a multi-token batch: `(start position,
/// the batch's tokens, (cache, single-device bytes) per recurrent cache)`.
type Checkpoint = (i64, Vec<i32>, Vec<(TensorId, Vec<u8>)>);

impl Qwen35Session {
    /// Opens a `qwen35` GGUF and loads it as [`Qwen35Session::from_file`] does.
    ///
    /// # Errors
    /// GGUF errors naming the file; as [`Qwen35Session::from_file`].
    pub fn from_gguf(
        path: impl AsRef<std::path::Path>,
        ratios: &[f32],
        threads: usize,
        kv_type: GgmlType,
        kv_size: i64,
    ) -> Result<Self> {
        Self::from_file(&shardgraph::gguf::GgufFile::open(path)?, ratios, threads, kv_type, kv_size)
    }

    /// [`Qwen35Session::load_file`] on `ratios.len()` CPU devices with
    /// `threads` worker threads each and tensor-split `ratios`
    /// ([`Devices::cpu`] with [`Devices::with_tensor_split`]).
    ///
    /// # Errors
    /// [`Error::Split`] for no ratios, more than 64, bad ratios or thread
    /// counts (as [`Devices::cpu`]); as [`Qwen35Session::load_file`].
    pub fn from_file(
        file: &shardgraph::gguf::GgufFile,
        ratios: &[f32],
        threads: usize,
        kv_type: GgmlType,
        kv_size: i64,
    ) -> Result<Self> {
        let devices = Devices::cpu(ratios.len(), threads)?.with_tensor_split(ratios)?;
        Self::load_file(file, &devices, kv_type, kv_size)
    }

    /// Opens a `qwen35` GGUF and loads it onto `devices` as
    /// [`Qwen35Session::load_file`] does.
    ///
    /// # Errors
    /// GGUF errors naming the file; as [`Qwen35Session::load_file`].
    pub fn load(path: impl AsRef<std::path::Path>, devices: &Devices, kv_type: GgmlType, kv_size: i64) -> Result<Self> {
        Self::load_file(&shardgraph::gguf::GgufFile::open(path)?, devices, kv_type, kv_size)
    }

    /// Builds the model of a parsed `qwen35` GGUF (KV cache of `kv_size`
    /// cells of `kv_type`), splits it over `devices` with llama.cpp's
    /// policy ([`super::policy::qwen35_policy`]) at their tensor-split
    /// ratios, and loads every weight from the file. As for `qwen3`
    /// ([`super::qwen3::Qwen3Session::load_file`]), the hyper-parameters'
    /// ranges, every weight against them, unused tensors and each device's
    /// memory are checked before anything is allocated.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming a missing or mistyped key; [`Error::Model`]
    /// for another architecture, a value out of range, a tensor missing,
    /// mismatched or unused (a NextN count that does not match the file
    /// among them), or a tensor split that leaves a device without a KV
    /// head or a delta-net key head; [`Error::OutOfMemory`].
    pub fn load_file(
        file: &shardgraph::gguf::GgufFile,
        devices: &Devices,
        kv_type: GgmlType,
        kv_size: i64,
    ) -> Result<Self> {
        let hp = Qwen35Hparams::from_gguf(file)?;
        let types = Qwen35Types::from_gguf(file, &hp)?;
        let mut ctx = Context::new();
        let model = Qwen35::new(&mut ctx, hp, types, kv_type, kv_size)?;
        let policy = super::policy::qwen35_policy(&model.hp, &types, devices.ratios())?;
        let mut runner = super::runner::Runner::with_devices(policy, devices)?;
        let what = format!("qwen35 weights and caches (KV caches of {} cells)", model.kv_size);
        super::place_and_load(file, &ctx, model.base_len, &mut runner, "qwen35", &what).map_err(|e| match e {
            Error::Model { detail }
                if model.hp.n_nextn > 0 && detail.contains(&format!("blk.{}.", model.hp.n_layer)) =>
            {
                Error::Model {
                    detail: format!(
                        "{detail} (qwen35.nextn_predict_layers = {} puts a NextN (MTP) layer at block {})",
                        model.hp.n_nextn, model.hp.n_layer
                    ),
                }
            }
            e => e,
        })?;
        let base_len = model.base_len;
        Ok(Qwen35Session { model, ctx, runner, n_past: 0, base_len, checkpoint: None, snap_batch: None })
    }

    /// The recurrent caches (conv and delta-net states) of every layer.
    fn recurrent_caches(&self) -> Vec<TensorId> {
        let mut v = Vec::new();
        for l in &self.model.layers {
            if let Qwen35Mixer::DeltaNet { cache_r, cache_s, .. } = l.mixer {
                v.push(cache_r);
                v.push(cache_s);
            }
        }
        v
    }

    /// Decodes `tokens` at the next positions: the greedy token after each,
    /// the logits if `want_logits`, and the hidden states `taps` asks for
    /// (see [`Qwen35::build`]). A batch of more than one token checkpoints
    /// the recurrent states first (see [`Qwen35Session::rollback`]).
    ///
    /// # Errors
    /// [`Error::Model`] for an empty batch, a token outside the vocabulary
    /// or a full KV cache; execution errors.
    pub fn decode(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        let t = tokens.len() as i64;
        if t == 0 {
            return Err(Error::Model { detail: "qwen35: empty batch".into() });
        }
        self.check_tokens(tokens)?;
        if self.n_past + t > self.model.kv_size {
            return Err(Error::Model {
                detail: format!(
                    "qwen35: KV cache of {} cells is too small for {} positions",
                    self.model.kv_size,
                    self.n_past + t
                ),
            });
        }
        self.snap_batch = None;
        self.checkpoint = None;
        if t > 1 && t as usize <= self.model.snapshot_slots {
            // Every token's state lands in the snapshot buffers (see `rollback`).
            self.snap_batch = Some((self.n_past, t));
        } else if t > 1 {
            let mut saved = Vec::new();
            for id in self.recurrent_caches() {
                let mut b = vec![0u8; self.ctx.tensor(id)?.nbytes()];
                self.runner.store.get_tensor(&self.ctx, id, 0, &mut b)?;
                saved.push((id, b));
            }
            self.checkpoint = Some((self.n_past, tokens.to_vec(), saved));
        }
        let n_kv = super::kv_window(self.model.kv_size, self.n_past + t);
        let key = (t, n_kv, taps.to_vec(), want_logits);
        let (model, base) = (&self.model, self.base_len);
        let sg = self.runner.graphs.get_or_build(&mut self.ctx, base, key, |ctx| {
            let step = model.build_window(ctx, t, n_kv, taps)?;
            let mut outputs = step.writes.clone();
            outputs.extend(step.taps.iter().map(|x| x.1));
            if want_logits {
                outputs.push(step.logits);
            }
            outputs.push(step.argmax);
            Ok((step, outputs))
        })?;
        let (step, outputs, graph) = (&sg.step, &sg.outputs, &sg.graph);
        let pos: Vec<i32> = (0..t).map(|i| (self.n_past + i) as i32).collect();
        let mut inputs = vec![
            (step.tokens, i32_bytes(tokens)),
            (step.pos, i32_bytes(&imrope_positions(&pos))),
            (step.mask, mask_bytes(n_kv, pos.iter().map(|&p| p as i64))),
            (step.kv_idxs, cell_bytes(&pos)),
        ];
        if let Some(r) = step.snap_row {
            inputs.push((r, 0i64.to_le_bytes().to_vec()));
        }
        let start = std::time::Instant::now();
        let rep = self.runner.run(&self.ctx, graph, &inputs, outputs)?;
        log::debug!(
            "qwen35 step: {t} token(s) at position {}, {} bytes moved, {:.2} ms",
            self.n_past,
            rep.bytes_moved,
            start.elapsed().as_secs_f64() * 1e3
        );
        self.n_past += t;
        Ok(super::step_output(outputs, &rep, step.argmax, &step.taps, want_logits.then_some(step.logits)))
    }

    /// Checks that every token is in the vocabulary (`0..n_vocab`).
    ///
    /// # Errors
    /// [`Error::Model`] naming the first token outside it.
    fn check_tokens(&self, tokens: &[i32]) -> Result<()> {
        let n_vocab = self.model.hp.n_vocab;
        if let Some(bad) = tokens.iter().find(|&&x| x < 0 || i64::from(x) >= n_vocab) {
            return Err(Error::Model { detail: format!("qwen35: token {bad} outside the vocabulary of {n_vocab}") });
        }
        Ok(())
    }

    /// Forgets the whole sequence: `n_past` 0, the conv and recurrent
    /// states zero again (as a new session's), no checkpoint or snapshot
    /// batch to roll back into. The attention layers' KV cells are simply
    /// overwritten by later steps (the mask hides them until then), as after
    /// [`Qwen35Session::rollback`]; a rollback to 0 cannot do this, since
    /// the recurrent states of position 0 are only known before the first
    /// batch.
    ///
    /// # Errors
    /// Copy errors writing the states on the devices.
    pub fn reset(&mut self) -> Result<()> {
        for id in self.recurrent_caches() {
            let zeros = vec![0u8; self.ctx.tensor(id)?.nbytes()];
            self.runner.store.set_tensor(&self.ctx, id, 0, &zeros)?;
        }
        self.n_past = 0;
        self.checkpoint = None;
        self.snap_batch = None;
        Ok(())
    }

    /// Keeps the conv and recurrent state after every token of batches of
    /// up to `slots` tokens in device-side snapshot buffers
    /// ([`Qwen35::add_snapshots`]), so that [`Qwen35Session::rollback`] into
    /// such a batch copies one snapshot back instead of saving the states to
    /// the host before the batch and decoding the kept tokens again.
    /// Speculative decoding verifies `n_max + 1` tokens per batch.
    ///
    /// # Errors
    /// As [`Qwen35::add_snapshots`]; placement errors.
    pub fn enable_snapshots(&mut self, slots: usize) -> Result<()> {
        self.ctx.truncate(self.base_len);
        let start = self.ctx.len();
        self.model.add_snapshots(&mut self.ctx, slots)?;
        let ids: Vec<TensorId> = self.ctx.ids().skip(start).collect();
        self.runner.place_all(&self.ctx, &ids, &format!("qwen35 recurrent-state snapshots of {slots} slots"))?;
        self.base_len = self.ctx.len();
        Ok(())
    }

    /// Forgets every position from `n_past` on. Attention layers just
    /// forget their KV cells; the recurrent states are set back to those
    /// after position `n_past − 1`: from the snapshot buffers when the last
    /// batch kept them ([`Qwen35Session::enable_snapshots`]), else by
    /// restoring the states checkpointed before the last multi-token batch
    /// and decoding its kept tokens again. At the current length it does
    /// nothing.
    ///
    /// # Errors
    /// [`Error::Model`] if `n_past` is beyond the current length, or not
    /// inside the last batch (the recurrent states of earlier positions
    /// are gone); execution errors.
    pub fn rollback(&mut self, n_past: i64) -> Result<()> {
        if n_past == self.n_past {
            return Ok(());
        }
        if n_past < 0 || n_past > self.n_past {
            return Err(Error::Model { detail: format!("qwen35: cannot roll back to {n_past} of {}", self.n_past) });
        }
        if let Some((start, t)) = self.snap_batch.take() {
            let kept = n_past - start;
            if start + t != self.n_past || kept < 1 {
                return Err(Error::Model {
                    detail: format!(
                        "qwen35: position {n_past} is not after a token of the last batch ({start}..{}); the recurrent states before it are gone",
                        start + t
                    ),
                });
            }
            // Copy the states after token kept − 1 back into the caches, on every device.
            self.ctx.truncate(self.base_len);
            let mut writes = Vec::new();
            // Row 0 of each one-row cache (set_rows: a write to the stored cache
            // even though nothing in this graph reads it afterwards).
            let row0 = self.ctx.new_tensor(GgmlType::I64, &[1])?;
            self.ctx.set_input(row0)?;
            let mut snaps = self.model.snapshots.clone().into_iter();
            for l in &self.model.layers {
                if let Qwen35Mixer::DeltaNet { cache_r, cache_s, .. } = l.mixer {
                    let (snap_r, snap_s) = snaps
                        .next()
                        .and_then(|v| v.get(kept as usize - 1).copied())
                        .ok_or_else(|| Error::Model { detail: "qwen35: a snapshot is missing".into() })?;
                    writes.push(self.ctx.set_rows(cache_r, snap_r, row0)?);
                    writes.push(self.ctx.set_rows(cache_s, snap_s, row0)?);
                }
            }
            let graph = self.ctx.build_forward(&writes)?;
            self.runner.run(&self.ctx, &graph, &[(row0, 0i64.to_le_bytes().to_vec())], &writes)?;
            self.n_past = n_past;
            return Ok(());
        }
        let Some((start, tokens, saved)) = self.checkpoint.take() else {
            return Err(Error::Model {
                detail: format!("qwen35: no recurrent-state checkpoint to roll back to position {n_past}"),
            });
        };
        if n_past < start || start + tokens.len() as i64 != self.n_past {
            return Err(Error::Model {
                detail: format!(
                    "qwen35: position {n_past} is outside the last batch ({start}..{}); the recurrent states before it are gone",
                    start + tokens.len() as i64
                ),
            });
        }
        for (id, b) in &saved {
            self.runner.store.set_tensor(&self.ctx, *id, 0, b)?;
        }
        self.n_past = start;
        let keep = (n_past - start) as usize;
        if keep > 0 {
            self.decode(&tokens[..keep], &[], false)?;
        }
        Ok(())
    }
}

/// What one MTP step returns, per row.
#[derive(Clone, Debug, Default)]
pub struct MtpOutput {
    /// Greedy token.
    pub argmax: Vec<i32>,
    /// The greedy token's probability.
    pub top_prob: Vec<f32>,
    /// `hN` `[E]` per row (the next row's hidden state when chaining).
    pub h: Vec<f32>,
}

impl Qwen35Session {
    /// Runs the MTP head on rows `(tokens[i], h[i])` at positions `start + i`
    /// (writing its KV cache there): shardgraph-models/MODELS.md, section 5.2.
    ///
    /// # Errors
    /// [`Error::Model`] without a NextN block, for mismatched lengths, a
    /// token outside the vocabulary or a full KV cache; execution errors.
    pub fn mtp_step(&mut self, tokens: &[i32], h: &[f32], start: i64) -> Result<MtpOutput> {
        let t = tokens.len() as i64;
        let e = self.model.hp.n_embd as usize;
        if t == 0 || h.len() != tokens.len() * e {
            return Err(Error::Model {
                detail: format!("qwen35 MTP: {} tokens need {} hidden values, got {}", t, t as usize * e, h.len()),
            });
        }
        self.check_tokens(tokens)?;
        if start < 0 || start + t > self.model.kv_size {
            return Err(Error::Model {
                detail: format!(
                    "qwen35 MTP: positions {start}..{} outside the {}-cell cache",
                    start + t,
                    self.model.kv_size
                ),
            });
        }
        let n_kv = super::kv_window(self.model.kv_size, start + t);
        let (model, base) = (&self.model, self.base_len);
        let sg = self.runner.graphs.get_or_build(&mut self.ctx, base, ("mtp step", t, n_kv), |ctx| {
            let step = model.build_mtp_window(ctx, t, n_kv)?;
            let mut outputs = step.writes.clone();
            outputs.extend([step.h_out, step.argmax, step.top_prob]);
            Ok((step, outputs))
        })?;
        let (step, outputs, graph) = (&sg.step, &sg.outputs, &sg.graph);
        let pos: Vec<i32> = (0..t).map(|i| (start + i) as i32).collect();
        let inputs = vec![
            (step.tokens, i32_bytes(tokens)),
            (step.h, f32_bytes(h)),
            (step.pos, i32_bytes(&imrope_positions(&pos))),
            (step.mask, mask_bytes(n_kv, pos.iter().map(|&p| p as i64))),
            (step.kv_idxs, cell_bytes(&pos)),
        ];
        let rep = self.runner.run(&self.ctx, graph, &inputs, outputs)?;
        let n = outputs.len();
        Ok(MtpOutput {
            h: f32s(&rep.outputs[n - 3]),
            argmax: rep.outputs[n - 2].chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            top_prob: f32s(&rep.outputs[n - 1]),
        })
    }
}

impl Qwen35Session {
    /// Drafts `n` tokens after `last` (at position `start`, paired with
    /// hidden state `h` `[E]`) with the MTP head, all `n` chained steps in
    /// one graph run ([`Qwen35::build_mtp_chain`]): the drafted tokens and
    /// each one's probability.
    ///
    /// # Errors
    /// [`Error::Model`] without a NextN block, for a wrong `h` length, a
    /// `last` outside the vocabulary or positions beyond the cache;
    /// execution errors.
    pub fn mtp_chain(&mut self, last: i32, h: &[f32], start: i64, n: usize) -> Result<(Vec<i32>, Vec<f32>)> {
        let e = self.model.hp.n_embd as usize;
        if h.len() != e || n == 0 {
            return Err(Error::Model { detail: format!("qwen35 MTP chain: {n} steps from {} hidden values", h.len()) });
        }
        self.check_tokens(&[last])?;
        if start < 0 || start + n as i64 > self.model.kv_size {
            return Err(Error::Model {
                detail: format!(
                    "qwen35 MTP: positions {start}..{} outside the {}-cell cache",
                    start + n as i64,
                    self.model.kv_size
                ),
            });
        }
        let n_kv = super::kv_window(self.model.kv_size, start + n as i64);
        let (model, base) = (&self.model, self.base_len);
        let sg = self.runner.graphs.get_or_build(&mut self.ctx, base, ("mtp chain", n, n_kv), |ctx| {
            let chain = model.build_mtp_chain_window(ctx, n, n_kv)?;
            let mut outputs = chain.writes.clone();
            for st in &chain.steps {
                outputs.push(st.argmax);
                outputs.push(st.top_prob);
            }
            Ok((chain, outputs))
        })?;
        let (chain, outputs, graph) = (&sg.step, &sg.outputs, &sg.graph);
        let mut inputs = vec![(chain.token, i32_bytes(&[last])), (chain.h, f32_bytes(h))];
        for (i, st) in chain.steps.iter().enumerate() {
            let p = [(start + i as i64) as i32];
            inputs.push((st.pos, i32_bytes(&imrope_positions(&p))));
            inputs.push((st.mask, mask_bytes(n_kv, [p[0] as i64])));
            inputs.push((st.kv_idxs, cell_bytes(&p)));
        }
        let rep = self.runner.run(&self.ctx, graph, &inputs, outputs)?;
        let k = chain.writes.len();
        let mut toks = Vec::with_capacity(n);
        let mut probs = Vec::with_capacity(n);
        for i in 0..n {
            let a = &rep.outputs[k + 2 * i];
            toks.push(i32::from_le_bytes([a[0], a[1], a[2], a[3]]));
            probs.push(f32s(&rep.outputs[k + 2 * i + 1]).first().copied().unwrap_or(f32::NAN));
        }
        Ok((toks, probs))
    }
}

impl super::speculative::Target for Qwen35Session {
    fn n_past(&self) -> i64 {
        self.n_past
    }

    fn decode(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        Qwen35Session::decode(self, tokens, taps, want_logits)
    }

    fn rollback(&mut self, n_past: i64) -> Result<()> {
        Qwen35Session::rollback(self, n_past)
    }
}
