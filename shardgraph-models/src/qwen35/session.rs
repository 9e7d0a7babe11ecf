//! A `qwen35` session: one sequence decoded on N devices, with rollback of
//! the recurrent states (host checkpoints or device-side snapshots), the
//! NextN (MTP) head's step and chain, and the speculative loop's
//! [`Target`].

use super::graph::{Qwen35, Qwen35Mixer};
use super::hparams::Qwen35Hparams;
use super::policy::qwen35_policy;
use crate::runner::Runner;
use crate::step::{
    cell_bytes, f32_bytes, f32s, i32_bytes, i32s, imrope_positions, mask_bytes, step_output, Outputs, StepOutput,
    Target,
};
use crate::types::{KvTypes, TensorTypes};
use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::split::Devices;
use shardgraph::tensor::{GgmlType, TensorId};

/// A `qwen35` model decoding one sequence on N devices.
///
/// Rollback (a speculative step's rejected rows): attention layers just
/// forget their KV cells, but the conv and recurrent states have absorbed
/// every token of the batch. A multi-token [`Qwen35Session::decode`] first
/// checkpoints those states (host copies, single-device bytes); rolling
/// back into that batch restores them and decodes the kept tokens again, so
/// the states are exactly those greedy decoding leaves.
///
/// Made by [`Qwen35Session::load`] (a GGUF path) or
/// [`Qwen35Session::load_file`] (a parsed GGUF) onto [`Devices`]. Read it
/// through [`Qwen35Session::model`], [`Qwen35Session::ctx`],
/// [`Qwen35Session::runner`] and [`Qwen35Session::n_past`].
#[derive(Debug)]
pub struct Qwen35Session {
    /// The model.
    pub(crate) model: Qwen35,
    /// The context holding the model's tensors.
    pub(crate) ctx: Context,
    /// Devices, plans and storage.
    pub(crate) runner: Runner,
    /// Positions decoded.
    pub(crate) n_past: i64,
    /// Context length with only long-lived tensors (the target's, its
    /// snapshots' and a drafter's once added).
    pub(crate) base_len: usize,
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

/// The graph cache's key of a rollback into a snapshot batch: the tokens kept.
#[derive(Clone, Copy, PartialEq, Eq)]
struct RollbackKey(i64);

impl Qwen35Session {
    /// Opens a `qwen35` GGUF and loads it onto `devices` as
    /// [`Qwen35Session::load_file`] does.
    ///
    /// # Errors
    /// GGUF errors naming the file; as [`Qwen35Session::load_file`].
    pub fn load(
        path: impl AsRef<std::path::Path>,
        devices: &Devices,
        kv_types: impl Into<KvTypes>,
        kv_size: i64,
    ) -> Result<Self> {
        Self::load_file(&shardgraph::gguf::GgufFile::open(path)?, devices, kv_types, kv_size)
    }

    /// Builds the model of a parsed `qwen35` GGUF (KV caches of `kv_size`
    /// cells of `kv_types`: `--cache-type-k` and `--cache-type-v`; every
    /// weight of the type the file gives it, [`TensorTypes::from_file`]; a
    /// file without `output.weight` ties the head, the MTP head's too, to
    /// `token_embd.weight`), splits it over `devices` with llama.cpp's
    /// policy ([`qwen35_policy`](super::qwen35_policy)) at their tensor-split
    /// ratios, and loads every weight from the file. As for `qwen3`
    /// (`Qwen3Session::load_file`), the hyper-parameters'
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
        kv_types: impl Into<KvTypes>,
        kv_size: i64,
    ) -> Result<Self> {
        let hp = Qwen35Hparams::from_gguf(file)?;
        let types = TensorTypes::from_file(file);
        let mut ctx = Context::new();
        let model = Qwen35::new(&mut ctx, hp, &types, kv_types, kv_size)?;
        let n_layer = model.hp.core.n_layer;
        let policy = devices.model_policy(n_layer, |r| qwen35_policy(&model.hp, &types, r))?;
        let mut runner = Runner::new(policy, devices)?;
        let what = format!("qwen35 weights and caches (KV caches of {} cells)", model.kv_size);
        crate::place_and_load(file, &ctx, model.base_len, &mut runner, "qwen35", &what).map_err(|e| match e {
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

    /// The model: hyper-parameters, weights, caches and snapshots (their ids
    /// in [`Qwen35Session::ctx`]), cache size and type.
    pub fn model(&self) -> &Qwen35 {
        &self.model
    }

    /// The context holding the model's tensors (a drafter's after them, once
    /// attached) and the step graphs built on top.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The devices, split policy, plans and device-resident storage.
    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// Positions decoded (the next token's position; cache cell = position).
    pub fn n_past(&self) -> i64 {
        self.n_past
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
        self.decode_outputs(tokens, taps, want_logits, Outputs::All)
    }

    /// [`Qwen35Session::decode`] with the head on the rows `outputs` names
    /// ([`Target::decode_last`]).
    ///
    /// # Errors
    /// As [`Qwen35Session::decode`].
    pub fn decode_outputs(
        &mut self,
        tokens: &[i32],
        taps: &[usize],
        want_logits: bool,
        outputs: Outputs,
    ) -> Result<StepOutput> {
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
                self.runner.store().get_tensor(&self.ctx, id, 0, &mut b)?;
                saved.push((id, b));
            }
            self.checkpoint = Some((self.n_past, tokens.to_vec(), saved));
        }
        let n_kv = crate::kv_window(self.model.kv_size, self.n_past + t);
        let key = (t, n_kv, taps.to_vec(), want_logits, outputs);
        let (model, base) = (&self.model, self.base_len);
        let sg = self.runner.graphs.get_or_build(&mut self.ctx, base, key, |ctx| {
            let step = model.build_step(ctx, t, n_kv, taps, outputs)?;
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
        Ok(step_output(outputs, &rep, step.argmax, &step.taps, want_logits.then_some(step.logits)))
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
            self.runner.store_mut().set_tensor(&self.ctx, id, 0, &zeros)?;
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
            // Copy the states after token kept − 1 back into the caches, on
            // every device: one graph per kept count, kept with the step
            // graphs (its tensors, the row-index input among them, keep
            // their ids and placements, so a rollback allocates nothing).
            let (model, base) = (&self.model, self.base_len);
            let sg = self.runner.graphs.get_or_build(&mut self.ctx, base, RollbackKey(kept), |ctx| {
                let mut writes = Vec::new();
                // Row 0 of each one-row cache (set_rows: a write to the stored
                // cache even though nothing in this graph reads it afterwards).
                let row0 = ctx.new_tensor(GgmlType::I64, &[1])?;
                ctx.set_input(row0)?;
                let mut snaps = model.snapshots.clone().into_iter();
                for l in &model.layers {
                    if let Qwen35Mixer::DeltaNet { cache_r, cache_s, .. } = l.mixer {
                        let (snap_r, snap_s) = snaps
                            .next()
                            .and_then(|v| v.get(kept as usize - 1).copied())
                            .ok_or_else(|| Error::Model { detail: "qwen35: a snapshot is missing".into() })?;
                        writes.push(ctx.set_rows(cache_r, snap_r, row0)?);
                        writes.push(ctx.set_rows(cache_s, snap_s, row0)?);
                    }
                }
                Ok((row0, writes))
            })?;
            let (row0, writes, graph) = (sg.step, &sg.outputs, &sg.graph);
            self.runner.run(&self.ctx, graph, &[(row0, 0i64.to_le_bytes().to_vec())], writes)?;
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
            self.runner.store_mut().set_tensor(&self.ctx, *id, 0, b)?;
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
        let rep = self.mtp_rows(tokens, h, start, true)?;
        let n = rep.len();
        Ok(MtpOutput { h: f32s(&rep[n - 3]), argmax: i32s(&rep[n - 2]), top_prob: f32s(&rep[n - 1]) })
    }

    /// Writes the MTP head's KV cache for rows `(tokens[i], h[i])` at
    /// positions `start + i`, and computes nothing else: the graph of
    /// [`Qwen35Session::mtp_step`] cut to the K and V rows it stores (no
    /// queries, attention, FFN or head, whose `[V, E]` product is most of an
    /// MTP step for a real vocabulary). What a drafter needs for the tokens
    /// the target accepted; the cache is bit for bit the one `mtp_step`
    /// writes.
    ///
    /// # Errors
    /// As [`Qwen35Session::mtp_step`].
    pub fn mtp_update(&mut self, tokens: &[i32], h: &[f32], start: i64) -> Result<()> {
        self.mtp_rows(tokens, h, start, false).map(|_| ())
    }

    /// The MTP step's graph over `tokens`, run; with `head`, the bytes of
    /// `hN`, the greedy tokens and their probabilities (last three
    /// entries), else only the cache writes.
    fn mtp_rows(&mut self, tokens: &[i32], h: &[f32], start: i64, head: bool) -> Result<Vec<Vec<u8>>> {
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
        let n_kv = crate::kv_window(self.model.kv_size, start + t);
        let (model, base) = (&self.model, self.base_len);
        let key = if head { "mtp step" } else { "mtp update" };
        let sg = self.runner.graphs.get_or_build(&mut self.ctx, base, (key, t, n_kv), |ctx| {
            let step = model.build_mtp_window(ctx, t, n_kv)?;
            let mut outputs = step.writes.clone();
            if head {
                outputs.extend([step.h_out, step.argmax, step.top_prob]);
            }
            Ok((step, outputs))
        })?;
        let (step, outputs, graph) = (&sg.step, &sg.outputs, &sg.graph);
        let pos: Vec<i32> = (0..t).map(|i| (start + i) as i32).collect();
        let mut inputs = vec![
            (step.tokens, i32_bytes(tokens)),
            (step.h, f32_bytes(h)),
            (step.pos, i32_bytes(&imrope_positions(&pos))),
            (step.kv_idxs, cell_bytes(&pos)),
        ];
        if head {
            // Only the attention reads the mask (not in the writes' graph).
            inputs.push((step.mask, mask_bytes(n_kv, pos.iter().map(|&p| p as i64))));
        }
        let rep = self.runner.run(&self.ctx, graph, &inputs, outputs)?;
        Ok(rep.outputs.into_iter().map(|o| o.bytes).collect())
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
        let n_kv = crate::kv_window(self.model.kv_size, start + n as i64);
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
            let a = &rep.outputs[k + 2 * i].bytes;
            toks.push(i32::from_le_bytes([a[0], a[1], a[2], a[3]]));
            probs.push(f32s(&rep.outputs[k + 2 * i + 1].bytes).first().copied().unwrap_or(f32::NAN));
        }
        Ok((toks, probs))
    }
}

impl Target for Qwen35Session {
    fn n_past(&self) -> i64 {
        self.n_past
    }

    fn decode(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        Qwen35Session::decode(self, tokens, taps, want_logits)
    }

    fn decode_last(&mut self, tokens: &[i32], taps: &[usize], want_logits: bool) -> Result<StepOutput> {
        self.decode_outputs(tokens, taps, want_logits, Outputs::Last)
    }

    fn rollback(&mut self, n_past: i64) -> Result<()> {
        Qwen35Session::rollback(self, n_past)
    }
}
