//! The `qwen35` graph (shardgraph-models/MODELS.md, sections 3.2-3.6): the
//! model's tensors (trunk layers with their gated-attention or
//! Gated-DeltaNet mixer, the NextN block's, the caches and the rollback
//! snapshots) and one step's graph over them. The NextN (MTP) head's graphs
//! are in `mtp.rs`.

use super::hparams::Qwen35Hparams;
use crate::layers::{self, input, named, rms_norm_w, AttnShape, KvCache};
use crate::step::{head_rows, Outputs, MAX_DRAFT};
use crate::types::{KvTypes, TensorTypes, OUTPUT};
use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::tensor::{GgmlType, TensorId};

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

/// A `qwen35` model's long-lived tensors in a [`Context`].
#[derive(Clone, Debug)]
pub struct Qwen35 {
    /// Hyper-parameters.
    pub hp: Qwen35Hparams,
    /// Where the weights' types came from (the file's tensor table, or a
    /// preset).
    pub types: TensorTypes,
    /// `token_embd.weight` `[E, V]`.
    pub tok_embd: TensorId,
    /// `output_norm.weight` `[E]`.
    pub output_norm: TensorId,
    /// `output.weight` `[E, V]`, or `token_embd.weight` when the head is
    /// tied to the embedding (a file without `output.weight`): one tensor
    /// read by `get_rows` and by the head (the MTP head's too).
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
    /// The K and V caches' types.
    pub kv_types: KvTypes,
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

/// The tensors of a `qwen35` GGUF in llama.cpp's names and order: name,
/// type (the one `types` gives each weight matrix; vectors F32) and shape;
/// no `output.weight` when `types` ties the head to `token_embd.weight`.
///
/// # Errors
/// [`Error::Model`] naming a tensor whose type the kernels cannot multiply
/// or whose rows are not whole blocks, or a vector a file gives another
/// type than F32.
pub fn qwen35_tensors(hp: &Qwen35Hparams, types: &TensorTypes) -> Result<Vec<(String, GgmlType, Vec<i64>)>> {
    let (e, f, v) = (hp.n_embd, hp.n_ff, hp.n_vocab);
    let (d, qd, kvd) = (hp.head_dim, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim);
    let mut t = Vec::new();
    let m = |t: &mut Vec<_>, name: String, ne: Vec<i64>| -> Result<()> {
        let ty = types.matrix("qwen35", &name, &ne)?;
        t.push((name, ty, ne));
        Ok(())
    };
    let vector = |t: &mut Vec<_>, name: String, ne: Vec<i64>| -> Result<()> {
        let ty = types.vector("qwen35", &name)?;
        t.push((name, ty, ne));
        Ok(())
    };
    m(&mut t, "token_embd.weight".into(), vec![e, v])?;
    vector(&mut t, "output_norm.weight".into(), vec![e])?;
    if !types.is_tied() {
        m(&mut t, OUTPUT.into(), vec![e, v])?;
    }
    // The trunk's layers, then the NextN (MTP) block after them: a
    // gated-attention layer and its projection of [normed embedding; normed
    // hidden state].
    for il in 0..hp.n_layer + hp.n_nextn {
        let b = |n: &str| format!("blk.{il}.{n}");
        vector(&mut t, b("attn_norm.weight"), vec![e])?;
        vector(&mut t, b("post_attention_norm.weight"), vec![e])?;
        if il < hp.n_layer && hp.is_recurrent(il) {
            m(&mut t, b("attn_qkv.weight"), vec![e, hp.conv_channels()])?;
            m(&mut t, b("attn_gate.weight"), vec![e, hp.d_inner()])?;
            m(&mut t, b("ssm_beta.weight"), vec![e, hp.n_v_heads])?;
            m(&mut t, b("ssm_alpha.weight"), vec![e, hp.n_v_heads])?;
            vector(&mut t, b("ssm_dt.bias"), vec![hp.n_v_heads])?;
            vector(&mut t, b("ssm_a"), vec![hp.n_v_heads])?;
            vector(&mut t, b("ssm_conv1d.weight"), vec![hp.d_conv, hp.conv_channels()])?;
            vector(&mut t, b("ssm_norm.weight"), vec![hp.d_state])?;
            m(&mut t, b("ssm_out.weight"), vec![hp.d_inner(), e])?;
        } else {
            m(&mut t, b("attn_q.weight"), vec![e, 2 * qd])?;
            m(&mut t, b("attn_k.weight"), vec![e, kvd])?;
            m(&mut t, b("attn_v.weight"), vec![e, kvd])?;
            m(&mut t, b("attn_output.weight"), vec![qd, e])?;
            vector(&mut t, b("attn_q_norm.weight"), vec![d])?;
            vector(&mut t, b("attn_k_norm.weight"), vec![d])?;
        }
        m(&mut t, b("ffn_gate.weight"), vec![e, f])?;
        m(&mut t, b("ffn_up.weight"), vec![e, f])?;
        m(&mut t, b("ffn_down.weight"), vec![f, e])?;
        if il == hp.n_layer {
            m(&mut t, b("nextn.eh_proj.weight"), vec![2 * e, e])?;
            vector(&mut t, b("nextn.enorm.weight"), vec![e])?;
            vector(&mut t, b("nextn.hnorm.weight"), vec![e])?;
            vector(&mut t, b("nextn.shared_head_norm.weight"), vec![e])?;
        }
    }
    Ok(t)
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
/// caches `cache_k_l{il}`, `cache_v_l{il}` (`[Hkv·D, kv_size]` of the K and
/// V types).
fn attention_mixer(
    ctx: &mut Context,
    ids: &Weights,
    il: usize,
    hp: &Qwen35Hparams,
    (kv_types, kv_size): (KvTypes, i64),
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
        cache_k: named(ctx, kv_types.k, &[kvd, kv_size], &format!("cache_k_l{il}"))?,
        cache_v: named(ctx, kv_types.v, &[kvd, kv_size], &format!("cache_v_l{il}"))?,
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
    /// Creates the weights (GGUF names, each of the type `types` gives it;
    /// no `output.weight` when the head is tied: it then reads
    /// `token_embd.weight`) and caches in `ctx`: KV caches of `kv_size`
    /// cells of the K and V types for the attention layers, F32 conv and
    /// recurrent states for the delta-net layers.
    ///
    /// # Errors
    /// [`Error::Model`] for inconsistent hyper-parameters, a `kv_size` outside
    /// `1..=`[`crate::MAX_CTX`], a cache type not offered for the head size
    /// ([`KvTypes::check`]), or a weight of a type the kernels cannot
    /// multiply or whose rows are not whole blocks (naming the tensor and
    /// type).
    pub fn new(
        ctx: &mut Context,
        hp: Qwen35Hparams,
        types: &TensorTypes,
        kv_types: impl Into<KvTypes>,
        kv_size: i64,
    ) -> Result<Self> {
        let kv_types = kv_types.into();
        hp.validate()?;
        crate::check_kv_size("qwen35", kv_size)?;
        kv_types.check("qwen35", hp.head_dim)?;
        let tensors = qwen35_tensors(&hp, types)?;
        let mut ids = Weights::new();
        for (name, ty, ne) in &tensors {
            ids.insert(name.clone(), named(ctx, *ty, ne, name)?);
        }
        let get = |n: &str| ids[n];
        let kv = (kv_types, kv_size);
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
            output: ids.get(OUTPUT).copied().unwrap_or_else(|| get("token_embd.weight")),
            hp,
            types: types.clone(),
            layers,
            kv_size,
            kv_types,
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
    /// used window, [`crate::kv_window`]) under a mask `[n_kv, T]`.
    ///
    /// # Errors
    /// As [`Qwen35::build`]; [`Error::Model`] for `n_kv` outside `1..=kv_size`.
    pub fn build_window(&self, ctx: &mut Context, n_tokens: i64, n_kv: i64, taps: &[usize]) -> Result<Qwen35Step> {
        self.build_step(ctx, n_tokens, n_kv, taps, Outputs::All)
    }

    /// [`Qwen35::build_window`] with the head (`logits` `[V, R]`, `argmax`
    /// `[R]`) on the rows `outputs` names: `R = T`, or `R = 1` for
    /// [`Outputs::Last`]; `h_nextn` and the taps keep all `T` rows.
    ///
    /// # Errors
    /// As [`Qwen35::build_window`].
    pub fn build_step(
        &self,
        ctx: &mut Context,
        n_tokens: i64,
        n_kv: i64,
        taps: &[usize],
        outputs: Outputs,
    ) -> Result<Qwen35Step> {
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
        let head = head_rows(ctx, h_nextn, outputs)?;
        let logits = ctx.mul_mat(self.output, head)?;
        let argmax = ctx.argmax(logits)?;
        Ok(Qwen35Step { tokens, pos, mask, kv_idxs, snap_row, writes, taps: tap_ids, h_nextn, logits, argmax })
    }

    /// One layer over `x` `[E, T]` (trunk or NextN): RMSNorm·`attn_norm`,
    /// the mixer `mix`, residual; RMSNorm·`post_attention_norm`, SwiGLU
    /// FFN, residual.
    pub(super) fn block(
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

    pub(super) fn check_window(&self, n_kv: i64) -> Result<()> {
        crate::check_window("qwen35", n_kv, self.kv_size)
    }

    /// Creates the rollback snapshot buffers (F32, `slots` columns per
    /// Gated-DeltaNet layer; named after the caches, so a split policy
    /// splits them alike): a batch of up to `slots` tokens then keeps the
    /// conv and recurrent state after every token, and a rollback inside it
    /// copies one column back instead of decoding again.
    ///
    /// # Errors
    /// [`Error::Model`] if snapshots exist already or `slots` is outside
    /// `2..=MAX_DRAFT + 1` ([`MAX_DRAFT`]).
    pub fn add_snapshots(&mut self, ctx: &mut Context, slots: usize) -> Result<()> {
        let most = MAX_DRAFT + 1;
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

    /// Gated full attention over `xn` `[E, T]`; returns `[E, T]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
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
        let shape = AttnShape { head_dim: d, n_head: h, n_head_kv: hkv, kv_types: self.kv_types };
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
