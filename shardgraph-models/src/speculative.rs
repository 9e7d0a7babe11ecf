//! Speculative decoding (shardgraph-models/MODELS.md, section 6, llama.cpp's
//! `common_speculative` loop): a drafter proposes tokens after the last
//! accepted one, the target verifies them all in one batch, the longest prefix
//! equal to the target's greedy choices is accepted plus the target's own next
//! token (the correction, or a bonus when every draft matched), and the caches
//! are rolled back to what was accepted. The output equals plain greedy
//! decoding token for token.

use super::qwen3::{Qwen3Session, StepOutput};
use shardgraph::error::{Error, Result};

/// A target model decoding one sequence: what the speculative loop needs
/// of it. Implemented by [`Qwen3Session`] and
/// [`super::qwen35::Qwen35Session`].
pub trait Target {
    /// Positions already decoded (the next token's position).
    fn n_past(&self) -> i64;

    /// Decodes `tokens` at the next positions: the greedy token after each,
    /// the logits if `want_logits`, and the hidden states `taps` asks for
    /// (layer `l`'s input; `l = n_layer`: the last layer's output, before
    /// the final norm for `qwen3` and after it for `qwen35`, whose NextN
    /// head reads the normed state).
    ///
    /// # Errors
    /// The target's decode errors.
    fn decode(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput>;

    /// Forgets every position from `n_past` on.
    ///
    /// # Errors
    /// The target's rollback errors.
    fn rollback(&mut self, n_past: i64) -> Result<()>;
}

impl Target for Qwen3Session {
    fn n_past(&self) -> i64 {
        self.n_past
    }

    fn decode(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        Qwen3Session::decode(self, tokens, taps, want_logits)
    }

    fn rollback(&mut self, n_past: i64) -> Result<()> {
        Qwen3Session::rollback(self, n_past)
    }
}

/// Proposes draft tokens for a target of type `T`.
pub trait Drafter<T = Qwen3Session> {
    /// Up to `n_max` tokens to follow `last` (the target's latest token, at
    /// position `pos`, not yet in the target's cache). A drafter whose model
    /// lives in the target's context runs it through `target`'s runner.
    ///
    /// # Errors
    /// Whatever the drafter's own model returns.
    fn draft(&mut self, target: &mut T, last: i32, pos: i64, n_max: usize) -> Result<Vec<i32>>;

    /// Called after each verification with the target's step output for the
    /// verified batch (hidden-state taps included) and how many of its rows
    /// were kept (`1 + accepted`), so a drafter can inject context and roll
    /// its own caches back.
    ///
    /// # Errors
    /// Whatever the drafter's own model returns.
    fn accept(&mut self, target: &mut T, batch: &[i32], start: i64, out: &StepOutput, kept: usize) -> Result<()> {
        let _ = (target, batch, start, out, kept);
        Ok(())
    }

    /// Target layers whose input hidden states the drafter needs (DFlash taps).
    fn taps(&self) -> Vec<usize> {
        Vec::new()
    }
}

/// The most tokens one speculative step may draft ([`SpecParams::n_max`]):
/// a draft is verified in one target batch, so this bounds the batch (and
/// an MTP chain's graph) whatever a caller asks for.
pub const MAX_DRAFT: usize = 256;

/// Checks a drafter's `--spec-draft-p-min`: a probability, `0..=1`.
///
/// # Errors
/// [`Error::Model`] naming `drafter` and the value otherwise (NaN included).
pub(crate) fn check_p_min(drafter: &str, p_min: f32) -> Result<()> {
    if !(0.0..=1.0).contains(&p_min) {
        return Err(Error::Model { detail: format!("{drafter}: p_min {p_min} is not a probability (0 to 1)") });
    }
    Ok(())
}

/// llama.cpp's `--spec-draft-n-max`, `--spec-draft-n-min` (and the drafter
/// applies `--spec-draft-p-min` itself).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecParams {
    /// Most drafts per step (0 drafts nothing: plain decoding), at most
    /// [`MAX_DRAFT`].
    pub n_max: usize,
    /// Drafts shorter than this are discarded (plain decoding that step).
    pub n_min: usize,
}

/// Counts of one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens the drafter proposed (after `n_min`).
    pub drafted: usize,
    /// Drafts the target accepted.
    pub accepted: usize,
    /// Target decode calls after the prompt.
    pub target_steps: usize,
}

/// Generates `n_gen` tokens after `prompt` with `drafter` proposing and the
/// target verifying; returns them with the counts. The target's session
/// must be empty or hold exactly what the caller wants kept before the prompt.
///
/// # Errors
/// [`Error::Model`] for an empty prompt or an `n_max` over [`MAX_DRAFT`];
/// decode errors (a KV cache too small for the prompt and `n_gen` tokens
/// among them, before the step that would overflow it).
pub fn generate<T: Target>(
    target: &mut T,
    drafter: &mut dyn Drafter<T>,
    prompt: &[i32],
    n_gen: usize,
    params: SpecParams,
) -> Result<(Vec<i32>, SpecStats)> {
    if prompt.is_empty() {
        return Err(Error::Model { detail: "speculative decoding needs a prompt".into() });
    }
    if params.n_max > MAX_DRAFT {
        return Err(Error::Model { detail: format!("n_max {} is over {MAX_DRAFT} drafts per step", params.n_max) });
    }
    let taps = drafter.taps();
    let start = target.n_past();
    let out = target.decode(prompt, &taps, false)?;
    drafter.accept(target, prompt, start, &out, prompt.len())?;
    let mut last = *out.argmax.last().ok_or_else(|| Error::Model { detail: "empty step".into() })?;
    let mut tokens = vec![last];
    let mut stats = SpecStats::default();
    while tokens.len() < n_gen {
        let pos = target.n_past();
        let mut drafts = if params.n_max > 0 { drafter.draft(target, last, pos, params.n_max)? } else { Vec::new() };
        drafts.truncate(params.n_max.min(n_gen - tokens.len()));
        if drafts.len() < params.n_min {
            drafts.clear();
        }
        stats.drafted += drafts.len();
        let mut batch = vec![last];
        batch.extend(&drafts);
        let out = target.decode(&batch, &taps, false)?;
        if out.argmax.len() != batch.len() {
            return Err(Error::Model {
                detail: format!(
                    "the target returned {} greedy tokens for a batch of {}",
                    out.argmax.len(),
                    batch.len()
                ),
            });
        }
        stats.target_steps += 1;
        // Accept the longest prefix the target agrees with, then its own token.
        let mut k = 0;
        while k < drafts.len() && out.argmax[k] == drafts[k] {
            k += 1;
        }
        stats.accepted += k;
        tokens.extend(&drafts[..k]);
        let next = out.argmax[k];
        log::debug!("speculative step at {pos}: drafted {}, accepted {k}, next token {next}", drafts.len());
        tokens.push(next);
        // The cache keeps `last` and the accepted drafts; `next` is not in it yet.
        target.rollback(pos + 1 + k as i64)?;
        drafter.accept(target, &batch, pos, &out, 1 + k)?;
        last = next;
    }
    tokens.truncate(n_gen);
    Ok((tokens, stats))
}
