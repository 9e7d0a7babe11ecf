//! The `qwen35` hyper-parameters (GGUF keys `qwen35.*`, range-checked;
//! shardgraph-models/MODELS.md, section 3.1). The weights' types come from
//! [`crate::types::TensorTypes`].

use crate::hparams::{read_shared, ArchKeys, HparamsCore, Model, DIM};
use shardgraph::error::{Error, Result};
use shardgraph::ops::{RopeMode, RopeParams};

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
        if self.n_layer + self.n_nextn > crate::MAX_LAYERS {
            return bad(format!("block_count {} is over {}", self.n_layer + self.n_nextn, crate::MAX_LAYERS));
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
            full_attention_interval: k.int_or("full_attention_interval", 4, 1..=crate::MAX_LAYERS as i64)? as usize,
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

    /// Writes llama.cpp's `qwen35` metadata for these hyper-parameters and
    /// a minimal vocabulary of `n_vocab` tokens
    /// ([`crate::hparams::add_vocabulary`]).
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
        crate::hparams::add_vocabulary(w, self.n_vocab)?;
        Ok(())
    }
}
