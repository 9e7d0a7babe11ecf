//! Token sampling (llama.cpp's sampler chain): greedy, or top-k, top-p,
//! min-p and temperature with a seeded generator.
//!
//! The chain follows llama.cpp's `common_sampler_init` (common/sampling.cpp)
//! with the default sampler order of `common_params_sampling::samplers`
//! (common/common.h): penalties, DRY, top-n-sigma, top-k, typical-p, top-p,
//! min-p, XTC, temperature, then `dist`. Penalties (`repeat_penalty` 1),
//! DRY (multiplier 0), top-n-sigma (-1), typical-p (1) and XTC (probability
//! 0) are off in llama.cpp's defaults and are not offered here, so the chain
//! is **top-k → top-p → min-p → temperature → dist**. Each step follows
//! src/llama-sampling.cpp:
//!
//! * top-k (`llama_sampler_top_k_impl`): `k == 0` is off; otherwise the `k`
//!   candidates with the highest logits are kept (all of them when fewer).
//! * top-p (`llama_sampler_top_p_apply`): `p >= 1` is off; otherwise the
//!   softmax of the remaining candidates' logits (before temperature: the
//!   temperature comes later in the chain), sorted by probability, keeps
//!   the shortest prefix whose cumulative probability reaches `p` (at least
//!   one token, llama.cpp's `min_keep`).
//! * min-p (`llama_sampler_min_p_apply`): `p <= 0` is off; otherwise keeps
//!   the candidates whose probability is at least `p` times the largest one,
//!   computed on logits: `logit >= max_logit + ln(p)`.
//! * temperature (`llama_sampler_temp_impl`): logits divided by `temp`.
//! * dist (`llama_sampler_dist_apply`): softmax of what remains, one draw.
//!
//! Ties between equal logits are broken towards the lower token id (llama.cpp
//! leaves their order to `std::partial_sort`). `temp <= 0` is greedy: the
//! argmax with the lowest index on ties, as ggml's `GGML_OP_ARGMAX`, and no
//! random draw. The generator is ChaCha8 (`rand_chacha`), seeded with the
//! 64-bit [`SamplerParams::seed`]; its stream for a seed is the same on
//! every platform, so a seeded run is reproducible (llama.cpp uses
//! `std::mt19937`, so the draws differ from llama.cpp's for the same seed).

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shardgraph::error::{Error, Result};
use std::cmp::Ordering;

/// llama.cpp's sampling options (`common_params_sampling`: `--temp`,
/// `--top-k`, `--top-p`, `--min-p`, `--seed`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerParams {
    /// `--temp`: logits are divided by it before the final softmax; `<= 0`
    /// samples greedily (argmax), the default here (llama.cpp's is 0.8).
    pub temp: f32,
    /// `--top-k`: keep the `k` most likely tokens; 0 is off (llama.cpp
    /// default 40).
    pub top_k: usize,
    /// `--top-p`: keep the most likely tokens up to this cumulative
    /// probability, in `(0, 1]`; 1 is off (llama.cpp default 0.95).
    pub top_p: f32,
    /// `--min-p`: keep tokens at least this fraction as likely as the most
    /// likely one, in `[0, 1]`; 0 is off (llama.cpp default 0.05).
    pub min_p: f32,
    /// `--seed` of the generator.
    pub seed: u64,
}

/// llama.cpp's `LLAMA_DEFAULT_SEED`. llama.cpp replaces it with a random
/// seed; here it is an ordinary seed, so default runs are reproducible.
const LLAMA_DEFAULT_SEED: u64 = 0xFFFF_FFFF;

impl Default for SamplerParams {
    /// Greedy (`temp` 0) with llama.cpp's other defaults: `top_k` 40,
    /// `top_p` 0.95, `min_p` 0.05, `seed` `0xFFFF_FFFF` (llama.cpp's
    /// `LLAMA_DEFAULT_SEED`, which llama.cpp swaps for a random seed; here
    /// it is used as given). The filters take effect once `temp > 0`.
    fn default() -> Self {
        Self { temp: 0.0, top_k: 40, top_p: 0.95, min_p: 0.05, seed: LLAMA_DEFAULT_SEED }
    }
}

impl SamplerParams {
    /// Greedy decoding: [`SamplerParams::default`] (`temp` 0).
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Whether sampling is greedy (`temp <= 0`: the argmax, no random draw).
    pub fn is_greedy(&self) -> bool {
        self.temp <= 0.0
    }

    /// Checks the options.
    ///
    /// # Errors
    /// [`Error::Model`] naming the option and its value: `temp` not finite,
    /// `top_p` outside `(0, 1]`, `min_p` outside `[0, 1]` (NaN refused
    /// everywhere).
    pub fn validate(&self) -> Result<()> {
        if !self.temp.is_finite() {
            return Err(Error::Model { detail: format!("sampler: temp {} is not a finite number", self.temp) });
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Model { detail: format!("sampler: top_p {} is outside (0, 1]", self.top_p) });
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(Error::Model { detail: format!("sampler: min_p {} is outside [0, 1]", self.min_p) });
        }
        Ok(())
    }
}

/// A sampler: the options and a seeded generator (llama.cpp's
/// `common_sampler` with the default chain, see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplerParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    /// A sampler for `params`, its generator seeded with `params.seed`.
    ///
    /// # Errors
    /// [`SamplerParams::validate`]'s errors.
    pub fn new(params: SamplerParams) -> Result<Self> {
        params.validate()?;
        Ok(Self { params, rng: ChaCha8Rng::seed_from_u64(params.seed) })
    }

    /// The options.
    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// The distribution the sampler draws from for one row of logits
    /// `[n_vocab]`: probabilities `[n_vocab]` (0 for every filtered token)
    /// summing to 1. Greedy: one-hot at the argmax. Otherwise the chain
    /// top-k → top-p → min-p → temperature → softmax (module docs). Uses
    /// no random draw.
    ///
    /// # Errors
    /// [`Error::Model`] for an empty row, a NaN logit, a row whose logits
    /// are all `-inf`, or (when not greedy) a `+inf` logit — each naming
    /// the token.
    pub fn probs(&self, logits: &[f32]) -> Result<Vec<f32>> {
        check_logits(logits)?;
        let mut probs = vec![0.0f32; logits.len()];
        if self.params.is_greedy() {
            probs[argmax(logits)] = 1.0;
            return Ok(probs);
        }
        if let Some(i) = logits.iter().position(|&l| l == f32::INFINITY) {
            return Err(Error::Model { detail: format!("sampler: logit of token {i} is +inf") });
        }
        let kept = self.filter(logits);
        // Temperature and the final softmax (llama.cpp's temp and dist);
        // (l - max) / temp is l / temp shifted, which cannot overflow.
        let temp = self.params.temp as f64;
        let max = kept.iter().map(|&i| logits[i] as f64).fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = kept.iter().map(|&i| ((logits[i] as f64 - max) / temp).exp()).collect();
        let sum: f64 = e.iter().sum();
        for (&i, &w) in kept.iter().zip(&e) {
            probs[i] = (w / sum) as f32;
        }
        Ok(probs)
    }

    /// The candidates top-k, top-p and min-p keep (token ids, most likely
    /// first), from a row already checked: no NaN, no `+inf`, one finite
    /// logit at least. `-inf` tokens (probability 0) are never candidates.
    fn filter(&self, logits: &[f32]) -> Vec<usize> {
        let desc = |&a: &usize, &b: &usize| -> Ordering { logits[b].total_cmp(&logits[a]).then(a.cmp(&b)) };
        let max_of = |c: &[usize]| c.iter().map(|&i| logits[i]).fold(f32::NEG_INFINITY, f32::max);
        let mut cand: Vec<usize> = (0..logits.len()).filter(|&i| logits[i] > f32::NEG_INFINITY).collect();
        let mut sorted = false;
        // top-k: the k best, sorted.
        let k = self.params.top_k;
        if k > 0 && k < cand.len() {
            cand.select_nth_unstable_by(k - 1, desc);
            cand.truncate(k);
            cand.sort_unstable_by(desc);
            sorted = true;
        }
        // top-p: f32 softmax of the candidates and a running sum over them
        // most likely first, as llama.cpp's.
        let top_p = self.params.top_p;
        if top_p < 1.0 {
            let max = max_of(&cand);
            let sum: f32 = cand.iter().map(|&i| (logits[i] - max).exp()).sum();
            // How many of `sorted_head` reach `top_p`, if they do.
            let cut = |sorted_head: &[usize]| {
                let mut cum = 0.0f32;
                sorted_head.iter().position(|&i| {
                    cum += (logits[i] - max).exp() / sum;
                    cum >= top_p
                })
            };
            // As llama.cpp: a large unsorted row sorts its 256 best first,
            // and all of it only when those do not reach top_p.
            const HEAD: usize = 256;
            let mut n = None;
            if !sorted && cand.len() > 4 * HEAD {
                cand.select_nth_unstable_by(HEAD - 1, desc);
                cand[..HEAD].sort_unstable_by(desc);
                n = cut(&cand[..HEAD]);
            }
            if n.is_none() {
                if !sorted {
                    cand.sort_unstable_by(desc);
                }
                n = cut(&cand);
            }
            // At least one token (llama.cpp's min_keep); all when rounding
            // keeps the sum under top_p.
            cand.truncate(n.map_or(cand.len(), |j| j + 1));
        }
        // min-p on logits: p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p)
        // (the maximum always stays).
        if self.params.min_p > 0.0 {
            let min_logit = max_of(&cand) + self.params.min_p.ln();
            cand.retain(|&i| logits[i] >= min_logit);
        }
        cand
    }

    /// Samples one token from a row of logits `[n_vocab]`: greedy, the
    /// argmax (lowest index on ties, as ggml's argmax; no random draw);
    /// otherwise one draw from [`Sampler::probs`].
    ///
    /// # Errors
    /// [`Sampler::probs`]'s errors.
    pub fn sample(&mut self, logits: &[f32]) -> Result<i32> {
        if self.params.is_greedy() {
            check_logits(logits)?;
            return token_id(argmax(logits));
        }
        let probs = self.probs(logits)?;
        self.sample_from(&probs)
    }

    /// The next number of the generator, uniform in `[0, 1)` (53 random
    /// bits, as `rand`'s `f64` standard distribution).
    pub fn uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// One draw from `probs` `[n_vocab]` (weights, normalised here; they
    /// need not sum to 1): the first token whose running sum exceeds
    /// `u * sum` for `u` = [`Sampler::uniform`], as llama.cpp's `dist`
    /// (a token of weight 0 is never drawn).
    ///
    /// # Errors
    /// [`Error::Model`] for an empty row, a weight that is negative, NaN or
    /// infinite (naming the token), or weights summing to 0.
    pub fn sample_from(&mut self, probs: &[f32]) -> Result<i32> {
        if probs.is_empty() {
            return Err(Error::Model { detail: "sampler: an empty distribution".into() });
        }
        if let Some((i, p)) = probs.iter().enumerate().find(|(_, p)| !(p.is_finite() && **p >= 0.0)) {
            return Err(Error::Model { detail: format!("sampler: probability {p} of token {i} is not a weight") });
        }
        let sum: f64 = probs.iter().map(|&p| p as f64).sum();
        if sum <= 0.0 {
            return Err(Error::Model { detail: "sampler: the probabilities sum to 0".into() });
        }
        let target = self.uniform() * sum;
        let mut cum = 0.0f64;
        let mut last = 0;
        for (i, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                cum += p as f64;
                last = i;
                if cum > target {
                    return token_id(i);
                }
            }
        }
        // Rounding left the running sum at or below the target: the last
        // token of nonzero weight.
        token_id(last)
    }
}

/// Checks a row of logits: not empty, no NaN, one logit above `-inf`.
fn check_logits(logits: &[f32]) -> Result<()> {
    if logits.is_empty() {
        return Err(Error::Model { detail: "sampler: a row of 0 logits (n_vocab 0)".into() });
    }
    if let Some(i) = logits.iter().position(|l| l.is_nan()) {
        return Err(Error::Model { detail: format!("sampler: logit of token {i} is NaN") });
    }
    if logits.iter().all(|&l| l == f32::NEG_INFINITY) {
        return Err(Error::Model { detail: format!("sampler: all {} logits are -inf", logits.len()) });
    }
    Ok(())
}

/// The first index of the largest value (ggml's `ggml_vec_argmax_f32`):
/// a row already checked (no NaN, not empty).
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best
}

/// A vocabulary index as a token id.
fn token_id(i: usize) -> Result<i32> {
    i32::try_from(i).map_err(|_| Error::Model { detail: format!("sampler: token index {i} does not fit a token id") })
}
