//! The NextN (MTP) head's graphs of a `qwen35` model
//! (shardgraph-models/MODELS.md, sections 5.2-5.3): one step over rows of
//! (token, hidden state), and a chain of drafting steps in one graph.

use super::graph::Qwen35;
use crate::layers::{self, input, rms_norm_w};
use crate::step::MAX_DRAFT;
use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::tensor::{GgmlType, TensorId};

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

impl Qwen35 {
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
    /// `1..=`[`MAX_DRAFT`].
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
        if !(1..=MAX_DRAFT).contains(&n) {
            return Err(Error::Model {
                detail: format!("qwen35: an MTP chain of {n} steps (1 to MAX_DRAFT = {})", MAX_DRAFT),
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
}
