//! The native MTP (NextN) drafter of a `qwen35` target
//! (shardgraph-models/MODELS.md, section 5.4, llama.cpp's
//! `--spec-type draft-mtp`): after every target decode the kept rows are fed to
//! the MTP head — token at position `p` paired with the target's
//! post-final-norm hidden state of position `p − 1` — filling its KV cache; a
//! draft starts from `(last token, the last kept row's hidden state)` and
//! chains autoregressively on the head's own `hN`: all `n_max` steps in one
//! graph (llama.cpp's chain variant), cut on the host at the first step whose
//! probability is below `p_min`.

use super::qwen35::Qwen35Session;
use super::step::{check_p_min, Drafter, StepOutput};
use shardgraph::error::{Error, Result};

/// The MTP drafter; its weights and KV cache are the target's NextN block.
#[derive(Clone, Debug)]
pub struct MtpDrafter {
    /// llama.cpp's `--spec-draft-p-min`.
    pub p_min: f32,
    /// The hidden state of the last position the target has decoded (zeros
    /// before the first).
    pending_h: Vec<f32>,
    /// The target's layer count (its post-final-norm state is tap `n_layer`).
    n_layer: usize,
}

impl MtpDrafter {
    /// A drafter for `target`'s NextN block.
    ///
    /// # Errors
    /// [`Error::Model`] if the target's GGUF has no NextN (MTP) layer or
    /// `p_min` is outside `0..=1`.
    pub fn new(target: &Qwen35Session, p_min: f32) -> Result<Self> {
        check_p_min("mtp", p_min)?;
        if target.model().nextn.is_none() {
            return Err(Error::Model {
                detail: "qwen35: the model has no NextN (MTP) layer (qwen35.nextn_predict_layers = 0)".into(),
            });
        }
        Ok(MtpDrafter {
            p_min,
            pending_h: vec![0.0; target.model().hp.n_embd as usize],
            n_layer: target.model().hp.n_layer,
        })
    }
}

impl Drafter<Qwen35Session> for MtpDrafter {
    fn taps(&self) -> Vec<usize> {
        vec![self.n_layer]
    }

    fn draft(&mut self, target: &mut Qwen35Session, last: i32, pos: i64, n_max: usize) -> Result<Vec<i32>> {
        // All steps in one graph run; p_min cuts the chain on the host.
        let n = n_max.min((target.model().kv_size - pos).max(0) as usize);
        if n == 0 {
            return Ok(Vec::new());
        }
        let (toks, probs) = target.mtp_chain(last, &self.pending_h, pos, n)?;
        let mut drafts = Vec::with_capacity(n);
        for (t, p) in toks.into_iter().zip(probs) {
            if self.p_min > 0.0 && (p.is_nan() || p < self.p_min) {
                break;
            }
            drafts.push(t);
        }
        Ok(drafts)
    }

    fn accept(
        &mut self,
        target: &mut Qwen35Session,
        batch: &[i32],
        start: i64,
        out: &StepOutput,
        kept: usize,
    ) -> Result<()> {
        let n_layer = target.model().hp.n_layer;
        let e = target.model().hp.n_embd as usize;
        let hs = &out
            .taps
            .iter()
            .find(|t| t.0 == n_layer)
            .ok_or_else(|| Error::Model { detail: "mtp: the target did not export its final hidden state".into() })?
            .1;
        if kept == 0 || hs.len() < kept * e || batch.len() < kept {
            return Err(Error::Model { detail: format!("mtp: {kept} kept rows but {} hidden values", hs.len()) });
        }
        // Row i pairs the token at start + i with the hidden state of start + i − 1.
        let mut h = Vec::with_capacity(kept * e);
        h.extend_from_slice(&self.pending_h);
        h.extend_from_slice(&hs[..(kept - 1) * e]);
        target.mtp_update(&batch[..kept], &h, start)?;
        self.pending_h = hs[(kept - 1) * e..kept * e].to_vec();
        Ok(())
    }
}
