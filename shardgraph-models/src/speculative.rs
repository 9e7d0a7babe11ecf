//! Speculative decoding (shardgraph-models/MODELS.md, section 6, llama.cpp's
//! `common_speculative` loop): a drafter proposes tokens after the last
//! accepted one, the target verifies them all in one batch, and the caches
//! are rolled back to what was accepted.
//!
//! Greedy ([`generate`], or [`generate_with`] and a greedy [`Sampler`]): the
//! longest prefix equal to the target's greedy choices is accepted plus the
//! target's own next token (the correction, or a bonus when every draft
//! matched). The output equals plain greedy decoding token for token.
//!
//! Sampling ([`generate_with`] and `temp > 0`): speculative sampling
//! (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
//! Decoding", algorithm 1; Chen et al. 2023, "Accelerating Large Language
//! Model Decoding with Speculative Sampling"): draft `x` drawn from the
//! drafter's `q` is accepted with probability `min(1, p(x) / q(x))` for the
//! sampler's distribution `p` of the target's logits; the first rejected
//! draft is replaced by a draw from `normalize(max(0, p - q))`, and when all
//! are accepted a bonus token is drawn from the last row's `p`. The tokens
//! are distributed exactly as plain sampling's, whatever the drafter.
//!
//! The loop drives any [`Target`] and [`Drafter`] (their traits, the step
//! output and [`MAX_DRAFT`] are in [`super::step`], below the models).

use super::sampling::{Sampler, SamplerParams};
use super::step::{Drafter, StepOutput, Target, MAX_DRAFT};
use shardgraph::error::{Error, Result};

/// Proposes nothing: plain decoding through the speculative loop (every
/// step verifies a batch of one token, the target's own choice).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoDraft;

impl<T> Drafter<T> for NoDraft {
    fn draft(&mut self, _: &mut T, _: i32, _: i64, _: usize) -> Result<Vec<i32>> {
        Ok(Vec::new())
    }
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
/// target verifying, greedily; returns them with the counts. The target's
/// session must be empty or hold exactly what the caller wants kept before
/// the prompt. The same loop as [`generate_with`] with a greedy sampler.
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
    let mut greedy = Sampler::new(SamplerParams::greedy())?;
    generate_with(target, drafter, prompt, n_gen, params, &mut greedy)
}

/// Generates `n_gen` tokens after `prompt` with `drafter` proposing, the
/// target verifying and `sampler` choosing; returns them with the counts.
/// The target's session must be empty or hold exactly what the caller wants
/// kept before the prompt. [`generate_hooked`] with no stop, no caller
/// told of the tokens and no logits read back.
///
/// A greedy `sampler` ([`SamplerParams::is_greedy`]) gives [`generate`]'s
/// tokens: the target's argmax, its logits never read back. Otherwise the
/// target's logits `[n_vocab, T]` are read back each step, the prompt is
/// decoded in two batches (all but its last token, then that token, whose
/// logits give the first token; the drafter's `accept` sees both), and
/// drafts are verified by speculative sampling (module docs) with
/// [`Drafter::draft_probs`] as `q`: the tokens are distributed as plain
/// sampling's (`n_max` 0) with the same sampler options, though not the
/// same draws for a seed.
///
/// # Errors
/// [`Error::Model`] for an empty prompt or an `n_max` over [`MAX_DRAFT`];
/// decode errors (a KV cache too small for the prompt and `n_gen` tokens
/// among them, before the step that would overflow it); when sampling,
/// [`Error::Model`] for a target whose logits are missing or not the same
/// `n_vocab` per batch token every step, a drafter whose `draft_probs` has fewer rows than
/// drafts, a row not `[n_vocab]`, a weight that is negative or not finite,
/// or `q(x) = 0` at its own draft `x`, a draft outside the vocabulary, and
/// the sampler's errors (NaN or all `-inf` logits).
pub fn generate_with<T: Target>(
    target: &mut T,
    drafter: &mut dyn Drafter<T>,
    prompt: &[i32],
    n_gen: usize,
    params: SpecParams,
    sampler: &mut Sampler,
) -> Result<(Vec<i32>, SpecStats)> {
    let g = generate_hooked(target, drafter, prompt, n_gen, params, sampler, &mut Hooks::default())?;
    Ok((g.tokens, g.stats))
}

/// What a generation does besides drafting and verifying
/// ([`generate_hooked`]): where it stops early, whom it tells of each
/// token as it is accepted, and whether it reads the target's logits back.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Ends the generation after a token for which it returns true (the
    /// model's end-of-generation tokens, a caller's stop tokens); the token
    /// is the last one returned. `None`: no such token.
    pub stop: Option<&'a dyn Fn(i32) -> bool>,
    /// Called with each token as it is accepted, in the order returned (a
    /// verified batch's tokens one by one); returning false ends the
    /// generation after that token.
    pub on_token: Option<&'a mut dyn FnMut(i32) -> bool>,
    /// Read back the target's logits row each token was chosen from
    /// ([`Generated::logits`]).
    pub logits: bool,
    /// Called once per verified step, after the target's verdict and
    /// before its tokens are handed to [`Hooks::on_token`] (llama.cpp's
    /// `speculative-simple` logs the same per step).
    pub on_step: Option<&'a mut dyn FnMut(&StepTrace<'_>)>,
}

/// One verified step of a generation ([`Hooks::on_step`]): the drafter
/// proposed `drafts` after `last`, the target verified `[last, drafts…]`
/// in one batch and accepted the first `accepted` drafts, then chose
/// `next` (the correction, or the bonus when every draft matched).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepTrace<'a> {
    /// The position of `last` in the sequence (its KV cell).
    pub pos: i64,
    /// The token the step starts from (chosen but not yet decoded).
    pub last: i32,
    /// The drafts the target verified (after `n_min` and the length cap).
    pub drafts: &'a [i32],
    /// How many of `drafts` the target accepted (a prefix).
    pub accepted: usize,
    /// The target's own token after the accepted drafts.
    pub next: i32,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum End {
    /// It gave the tokens asked for.
    #[default]
    Length,
    /// Its last token is one [`Hooks::stop`] stops at.
    Stop,
    /// [`Hooks::on_token`] returned false for its last token.
    Caller,
}

/// What [`generate_hooked`] returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Generated {
    /// The tokens, in order (at most `n_gen`; fewer when it ended early).
    pub tokens: Vec<i32>,
    /// Drafted and accepted counts and target steps.
    pub stats: SpecStats,
    /// With [`Hooks::logits`]: per token, the target's logits `[n_vocab]`
    /// of the row it was chosen from (the row after the token before it);
    /// empty otherwise.
    pub logits: Vec<Vec<f32>>,
    /// Why it ended.
    pub end: End,
}

/// [`generate_with`] with `hooks`: it stops after a token `hooks.stop`
/// names or `hooks.on_token` refuses, tells `hooks.on_token` of every token
/// as it is accepted, and with `hooks.logits` returns each token's logits
/// row (a greedy run then reads the target's logits back too, and decodes
/// the prompt as a sampled one does: all but its last token, then that
/// token). A generation that ends inside a verified batch keeps the target
/// (and the drafter) at its last token, as if the batch had ended there:
/// the target holds every returned token but the last, exactly as after a
/// generation that ends at `n_gen` after a correction.
///
/// # Errors
/// As [`generate_with`].
pub fn generate_hooked<T: Target>(
    target: &mut T,
    drafter: &mut dyn Drafter<T>,
    prompt: &[i32],
    n_gen: usize,
    params: SpecParams,
    sampler: &mut Sampler,
    hooks: &mut Hooks<'_>,
) -> Result<Generated> {
    if prompt.is_empty() {
        return Err(Error::Model { detail: "speculative decoding needs a prompt".into() });
    }
    if params.n_max > MAX_DRAFT {
        return Err(Error::Model { detail: format!("n_max {} is over {MAX_DRAFT} drafts per step", params.n_max) });
    }
    let greedy = sampler.params().is_greedy();
    let read_logits = !greedy || hooks.logits;
    let taps = drafter.taps();
    let mut g = Generated::default();
    // The logits per token, from the first logits read back (sampling).
    let mut n_vocab = None;
    let (mut last, first_row) = decode_prompt(target, drafter, prompt, sampler, read_logits, &mut n_vocab)?;
    if n_gen == 0 {
        return Ok(g);
    }
    g.logits.extend(first_row.filter(|_| hooks.logits));
    if let Some(end) = hooks.take(last) {
        g.tokens.push(last);
        g.end = end;
        return Ok(g);
    }
    g.tokens.push(last);
    while g.tokens.len() < n_gen {
        let pos = target.n_past();
        let mut drafts = if params.n_max > 0 { drafter.draft(target, last, pos, params.n_max)? } else { Vec::new() };
        drafts.truncate(params.n_max.min(n_gen - g.tokens.len()));
        if drafts.len() < params.n_min {
            drafts.clear();
        }
        // The drafter's q rows, read right after its draft (sampling only).
        let q = if greedy || drafts.is_empty() { None } else { drafter.draft_probs() };
        g.stats.drafted += drafts.len();
        let mut batch = vec![last];
        batch.extend(&drafts);
        let out = target.decode(&batch, &taps, read_logits)?;
        if out.argmax.len() != batch.len() {
            return Err(Error::Model {
                detail: format!(
                    "the target returned {} greedy tokens for a batch of {}",
                    out.argmax.len(),
                    batch.len()
                ),
            });
        }
        g.stats.target_steps += 1;
        let rows = if read_logits { logit_rows(&out, batch.len(), &mut n_vocab)? } else { Vec::new() };
        let (k, next) = if greedy {
            // Accept the longest prefix the target agrees with, then its own token.
            let mut k = 0;
            while k < drafts.len() && out.argmax[k] == drafts[k] {
                k += 1;
            }
            (k, out.argmax[k])
        } else {
            verify_sampled(sampler, &rows, &drafts, q.as_deref())?
        };
        log::debug!("speculative step at {pos}: drafted {}, accepted {k}, next token {next}", drafts.len());
        if let Some(f) = hooks.on_step.as_mut() {
            f(&StepTrace { pos, last, drafts: &drafts, accepted: k, next });
        }
        // The new tokens, one by one: the accepted drafts, then `next`; the
        // generation may end at any of them.
        let new: Vec<i32> = drafts[..k].iter().copied().chain([next]).collect();
        let mut returned = new.len();
        for (i, &t) in new.iter().enumerate() {
            if g.tokens.len() == n_gen {
                // Only `next` can lie beyond `n_gen` (the drafts were cut to
                // fit): it is not returned, and the cache is as if it were.
                break;
            }
            g.tokens.push(t);
            if hooks.logits {
                g.logits.push(rows[i].to_vec());
            }
            if let Some(end) = hooks.take(t) {
                (returned, g.end) = (i + 1, end);
                break;
            }
        }
        g.stats.accepted += returned.min(k);
        // The cache keeps `last` and the new tokens returned but the last
        // one (`next`, unless the generation ended before it), which is not
        // in it yet.
        target.rollback(pos + returned as i64)?;
        drafter.accept(target, &batch, pos, &out, returned)?;
        last = next;
        if g.end != End::Length {
            return Ok(g);
        }
    }
    g.tokens.truncate(n_gen);
    g.logits.truncate(n_gen);
    Ok(g)
}

/// Decodes the prompt (the drafter's `accept` sees it) and chooses the
/// first token: the greedy one, or the sampler's draw. With `read_logits`
/// the prompt goes in two batches — all but its last token, then that
/// token alone, whose logits row (returned) is read back rather than
/// `[n_vocab, prompt.len()]` of them.
fn decode_prompt<T: Target>(
    target: &mut T,
    drafter: &mut dyn Drafter<T>,
    prompt: &[i32],
    sampler: &mut Sampler,
    read_logits: bool,
    n_vocab: &mut Option<usize>,
) -> Result<(i32, Option<Vec<f32>>)> {
    let (taps, start) = (drafter.taps(), target.n_past());
    if !read_logits {
        let out = target.decode_last(prompt, &taps, false)?;
        drafter.accept(target, prompt, start, &out, prompt.len())?;
        return Ok((*out.argmax.last().ok_or_else(|| Error::Model { detail: "empty step".into() })?, None));
    }
    let (head, tail) = prompt.split_at(prompt.len() - 1);
    if !head.is_empty() {
        let out = target.decode_last(head, &taps, false)?;
        drafter.accept(target, head, start, &out, head.len())?;
    }
    let out = target.decode(tail, &taps, true)?;
    drafter.accept(target, tail, start + head.len() as i64, &out, 1)?;
    let row = logit_rows(&out, 1, n_vocab)?[0];
    let t = if sampler.params().is_greedy() { *out.argmax.last().unwrap_or(&0) } else { sampler.sample(row)? };
    Ok((t, Some(row.to_vec())))
}

impl Hooks<'_> {
    /// Tells the caller of token `t` and says whether the generation ends
    /// after it (and why).
    fn take(&mut self, t: i32) -> Option<End> {
        let go_on = self.on_token.as_mut().is_none_or(|f| f(t));
        if self.stop.is_some_and(|s| s(t)) {
            Some(End::Stop)
        } else if !go_on {
            Some(End::Caller)
        } else {
            None
        }
    }
}

/// The target's logits `[n_vocab, n_rows]` as `n_rows` rows `[n_vocab]`;
/// `n_vocab` is set by the first call and checked by the others.
///
/// # Errors
/// [`Error::Model`] for missing logits, or a length that is not a positive
/// multiple of `n_rows` or not `n_vocab` per row.
fn logit_rows<'a>(out: &'a StepOutput, n_rows: usize, n_vocab: &mut Option<usize>) -> Result<Vec<&'a [f32]>> {
    let logits = out
        .logits
        .as_deref()
        .ok_or_else(|| Error::Model { detail: "sampling: the target returned no logits".into() })?;
    let per_row = logits.len().checked_div(n_rows).unwrap_or(0);
    let want = n_vocab.get_or_insert(per_row);
    if per_row == 0 || per_row * n_rows != logits.len() || per_row != *want {
        return Err(Error::Model {
            detail: format!(
                "sampling: the target returned {} logits for a batch of {n_rows} (n_vocab {})",
                logits.len(),
                *want
            ),
        });
    }
    Ok(logits.chunks_exact(per_row).collect())
}

/// Speculative sampling of one verified batch: `rows` are the target's
/// logits after `last` and each draft (`drafts.len() + 1` rows), `q` the
/// drafter's distributions (`None`: one-hot at each draft). Returns how
/// many drafts were accepted and the token that follows them (the draw
/// from the residual at the first rejection, or the bonus token).
///
/// # Errors
/// [`Error::Model`] for fewer `q` rows than drafts, a `q` row not
/// `[n_vocab]` or with a weight that is negative or not finite (rows are
/// normalised: they need not sum to 1), `q(x) = 0`
/// at a draft `x`, a draft outside the vocabulary; the sampler's errors.
fn verify_sampled(
    sampler: &mut Sampler,
    rows: &[&[f32]],
    drafts: &[i32],
    q: Option<&[Vec<f32>]>,
) -> Result<(usize, i32)> {
    let n_vocab = rows.first().map_or(0, |r| r.len());
    if let Some(q) = q {
        if q.len() < drafts.len() {
            return Err(Error::Model {
                detail: format!("sampling: the drafter gave {} q rows for {} drafts", q.len(), drafts.len()),
            });
        }
    }
    for (i, &x) in drafts.iter().enumerate() {
        let xi = usize::try_from(x).ok().filter(|&t| t < n_vocab).ok_or_else(|| Error::Model {
            detail: format!("sampling: draft {i} is token {x}, outside the vocabulary of {n_vocab}"),
        })?;
        let mut p = sampler.probs(rows[i])?;
        let px = p[xi] as f64;
        let accepted = match q {
            Some(q) => {
                let qi = &q[i];
                if qi.len() != n_vocab {
                    return Err(Error::Model {
                        detail: format!("sampling: the drafter's q row {i} has {} entries, not {n_vocab}", qi.len()),
                    });
                }
                if let Some((t, w)) = qi.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w >= 0.0)) {
                    return Err(Error::Model {
                        detail: format!("sampling: the drafter's q row {i} gives token {t} the weight {w}"),
                    });
                }
                // q as a distribution: a drafter's row need not sum to 1 exactly.
                let q_sum: f64 = qi.iter().map(|&w| w as f64).sum();
                let qx = if q_sum > 0.0 { qi[xi] as f64 / q_sum } else { 0.0 };
                if qx <= 0.0 {
                    return Err(Error::Model {
                        detail: format!("sampling: the drafter's q row {i} gives its own draft {x} probability 0"),
                    });
                }
                // Accept with probability min(1, p(x) / q(x)).
                let accepted = sampler.uniform() * qx < px;
                if !accepted {
                    // Residual distribution max(0, p - q) (normalised by the draw).
                    for (pt, &qt) in p.iter_mut().zip(qi) {
                        *pt = (*pt as f64 - qt as f64 / q_sum).max(0.0) as f32;
                    }
                }
                accepted
            }
            None => {
                // q one-hot at x: accept with probability p(x); the residual
                // is p without x.
                let accepted = sampler.uniform() < px;
                if !accepted {
                    p[xi] = 0.0;
                }
                accepted
            }
        };
        if !accepted {
            let next = if p.iter().any(|&w| w > 0.0) {
                sampler.sample_from(&p)?
            } else {
                // p = q up to rounding: the residual vanished; p itself.
                let p = sampler.probs(rows[i])?;
                sampler.sample_from(&p)?
            };
            return Ok((i, next));
        }
    }
    let p = sampler.probs(rows[drafts.len()])?;
    Ok((drafts.len(), sampler.sample_from(&p)?))
}
