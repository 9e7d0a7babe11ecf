//! One decode step as the speculative loop sees it, below every model: what
//! a step returns ([`StepOutput`]), the two roles of speculative decoding
//! ([`Target`], [`Drafter`]) and the bound on a draft ([`MAX_DRAFT`]), and
//! the byte layouts of a step's inputs and outputs (little-endian values,
//! KV cells, attention masks, IMROPE positions) that every model writes and
//! reads.
//!
//! The models implement these traits beside their sessions (`qwen3`,
//! `qwen35`) and drafters (`dflash`, `mtp`); the loop that drives them is
//! `speculative`.

use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::tensor::TensorId;

/// What one decode step returns.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// The greedy token after each input token.
    pub argmax: Vec<i32>,
    /// Logits `[V, T]` (column per token), if asked for.
    pub logits: Option<Vec<f32>>,
    /// Hidden states entering the tapped layers, `[E, T]` each.
    pub taps: Vec<(usize, Vec<f32>)>,
}

/// The tokens of a step the head runs for (the final vocabulary product,
/// its `argmax` and logits): llama.cpp's per-token `logits` flags of a
/// batch, reduced to the two cases a decoder uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Outputs {
    /// Every token: the greedy token after each (a verify batch).
    #[default]
    All,
    /// The last token only (a prompt, or a chunk of one): `argmax` has one
    /// element and the logits are `[V, 1]`. The head costs `V·E` per token
    /// (a quarter of a Qwen3-0.6B step's products), so a prompt of `T`
    /// tokens saves `T − 1` of them.
    Last,
}

/// The columns of `x` (`[E, T]`, contiguous) the head runs on: all of them,
/// or a view of the last one (`[E, 1]`).
///
/// # Errors
/// Constructor errors (`x` not in `ctx`).
pub(crate) fn head_rows(ctx: &mut Context, x: TensorId, outputs: Outputs) -> Result<TensorId> {
    let t = ctx.tensor(x)?;
    let (e, n, nb1) = (t.ne[0], t.ne[1], t.nb[1]);
    match outputs {
        Outputs::All => Ok(x),
        Outputs::Last => ctx.view_2d(x, e, 1, nb1, (n.max(1) as usize - 1) * nb1),
    }
}

/// A target model decoding one sequence: what the speculative loop needs
/// of it. Implemented by the `qwen3` and `qwen35` sessions.
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

    /// [`Target::decode`] with the head run for the last token only
    /// ([`Outputs::Last`]): `argmax` holds that token's greedy successor,
    /// the logits (if `want_logits`) are `[V, 1]`; every tap still holds
    /// all `T` rows. For prompts. The default decodes every row and keeps
    /// the last; the sessions build a graph whose head reads one row.
    ///
    /// # Errors
    /// As [`Target::decode`].
    fn decode_last(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        let mut out = self.decode(tokens, taps, want_logits)?;
        let t = out.argmax.len();
        if t > 1 {
            out.argmax.drain(..t - 1);
            if let Some(l) = out.logits.as_mut() {
                let v = l.len() / t;
                l.drain(..l.len() - v);
            }
        }
        Ok(out)
    }

    /// Forgets every position from `n_past` on.
    ///
    /// # Errors
    /// The target's rollback errors.
    fn rollback(&mut self, n_past: i64) -> Result<()>;
}

/// Proposes draft tokens for a target of type `T` (`DflashDrafter` for any
/// session it can live in, `MtpDrafter` for a `qwen35` session,
/// `speculative::NoDraft` for any).
pub trait Drafter<T> {
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

    /// The distributions the last [`Drafter::draft`] call drew its tokens
    /// from: one row of probabilities `[n_vocab]` per drafted token, in
    /// order (the `q` of speculative sampling). `None` (the default): the
    /// drafter is deterministic, each draft's `q` is one-hot at the token.
    /// The speculative loop (`speculative::generate_with`) reads it right
    /// after `draft` when it samples (`temp > 0`), never when greedy.
    fn draft_probs(&self) -> Option<Vec<Vec<f32>>> {
        None
    }
}

/// The most tokens one speculative step may draft (`SpecParams::n_max`):
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

/// A decode step's result from its run: `read` lists the outputs read back
/// (`rep.outputs` in that order); the greedy tokens of `argmax`, the hidden
/// states of `taps`, and the logits if `logits` was read.
pub(crate) fn step_output(
    read: &[TensorId],
    rep: &shardgraph::split::RunReport,
    argmax: TensorId,
    taps: &[(usize, TensorId)],
    logits: Option<TensorId>,
) -> StepOutput {
    let at = |id: TensorId| read.iter().position(|&o| o == id).and_then(|k| rep.outputs.get(k)).map(|o| &o.bytes);
    let argmax = at(argmax).map(|b| i32s(b)).unwrap_or_default();
    let taps = taps.iter().map(|&(l, id)| (l, at(id).map(|b| f32s(b)).unwrap_or_default())).collect();
    let logits = logits.and_then(|id| at(id).map(|b| f32s(b)));
    StepOutput { argmax, logits, taps }
}

/// Little-endian F32 bytes as values (a graph output).
pub(crate) fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Little-endian I32 bytes as values (a graph output).
pub(crate) fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Little-endian bytes of I32 values (a graph input).
pub(crate) fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes of F32 values (a graph input).
pub(crate) fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The KV cells written at `positions` (cell = position), as the I64
/// `k_idxs` input of `set_rows`.
pub(crate) fn cell_bytes(positions: &[i32]) -> Vec<u8> {
    positions.iter().flat_map(|&p| (p as i64).to_le_bytes()).collect()
}

/// An F16 attention mask `[n_kv, rows]`: row `r` sees the cells
/// `0..=last[r]` (0) and not the others (−inf).
pub(crate) fn mask_bytes(n_kv: i64, last: impl IntoIterator<Item = i64>) -> Vec<u8> {
    let mut mask = Vec::new();
    for l in last {
        for c in 0..n_kv {
            let v = if c <= l { half::f16::ZERO } else { half::f16::NEG_INFINITY };
            mask.extend(v.to_le_bytes());
        }
    }
    mask
}

/// IMROPE's four position streams for text tokens (shardgraph-models/MODELS.md,
/// section 1.1): the position in the first three, zero in the fourth,
/// stream-major.
pub(crate) fn imrope_positions(positions: &[i32]) -> Vec<i32> {
    let mut out = Vec::with_capacity(4 * positions.len());
    for stream in 0..4 {
        out.extend(positions.iter().map(|&p| if stream < 3 { p } else { 0 }));
    }
    out
}
