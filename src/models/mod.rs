//! Model graphs built from the crate's ops, with llama.cpp's tensor names,
//! GGUF keys and `--split-mode tensor` policy (MODELS.md), and a runner that
//! decodes them on N devices.
//!
//! * [`qwen3`]: the `qwen3` dense target.
//! * [`qwen35`]: the `qwen35` hybrid target (gated attention + Gated DeltaNet).
//! * [`dflash`]: the DFlash block-diffusion drafter's graphs.
//! * [`mtp`]: the `qwen35` target's native MTP (NextN) drafter.
//! * [`generate`]: GGUF files with seeded weights for the tests and examples.
//! * [`policy`]: llama.cpp's split states for these tensors.
//! * [`runner`]: per-step graphs over long-lived weights and caches, planned
//!   (cached) and executed on N CPU devices.
//! * [`speculative`]: draft, verify in one target batch, accept, roll back.

use crate::tensor::TensorId;

pub mod dflash;
pub mod generate;
pub mod mtp;
pub mod policy;
pub mod qwen3;
pub mod qwen35;
pub mod runner;
pub mod speculative;

/// Checks a GGUF's `general.architecture` and returns a reader of its
/// unsigned `{arch}.{key}` values (llama.cpp's per-architecture keys).
///
/// # Errors
/// [`crate::Error::Model`] for another architecture; [`crate::Error::Gguf`]
/// if the key is missing.
pub(crate) fn arch_keys<'a>(
    f: &'a crate::gguf::GgufFile,
    arch: &'a str,
) -> crate::Result<impl Fn(&str) -> crate::Result<u64> + 'a> {
    let found = f.get_str("general.architecture")?;
    if found != arch {
        return Err(crate::Error::Model { detail: format!("general.architecture is {found:?}, not {arch:?}") });
    }
    Ok(move |k: &str| f.get_uint(&format!("{arch}.{k}")))
}

/// The most layers a model may have (llama.cpp's `LLAMA_MAX_LAYERS`): a
/// `block_count` read from a file is checked against it before any layer's
/// tensors are created, so a corrupt count cannot allocate without bound.
pub const MAX_LAYERS: usize = 512;

/// The KV cells a step attends over when `used` cells are in use (the
/// highest cell written so far plus one, this step's included): `used`
/// rounded up to a multiple of 256, at least 256, at most `kv_size`
/// (llama.cpp's `n_kv` with its padding of 256). A step's cost then follows
/// the cells in use, not the allocated context, and the padding keeps the
/// number of distinct step graphs (and compiled programs) small.
pub fn kv_window(kv_size: i64, used: i64) -> i64 {
    const PAD: i64 = 256;
    let padded = used.max(1).saturating_add(PAD - 1) / PAD * PAD;
    padded.max(PAD).min(kv_size).max(1)
}

/// Checks a step's KV window: `n_kv` within `1..=kv_size`.
///
/// # Errors
/// [`crate::Error::Model`] naming `model` otherwise.
pub(crate) fn check_window(model: &str, n_kv: i64, kv_size: i64) -> crate::Result<()> {
    if n_kv < 1 || n_kv > kv_size {
        return Err(crate::Error::Model {
            detail: format!("{model}: a window of {n_kv} cells in a cache of {kv_size}"),
        });
    }
    Ok(())
}

/// A step graph kept for later steps (llama.cpp's graph reuse): its key
/// (what shapes it: tokens per step, KV window, taps…), the step's tensors,
/// the outputs to read, and the graph.
#[derive(Debug)]
pub(crate) struct StepGraph<K, S> {
    key: K,
    /// The step's tensors.
    pub step: S,
    /// What the caller reads back, in its order.
    pub outputs: Vec<TensorId>,
    /// The graph.
    pub graph: crate::graph::Graph,
}

/// The step graphs built on top of a session's long-lived tensors, kept
/// while the context holds them: a step whose key was seen (a decode step
/// in the same KV window, a drafter's block, a verification batch of the
/// same length) reuses its graph — and so its plan and compiled program —
/// and only writes its inputs. Graphs are appended to the context; when it
/// has grown by [`GraphCache::MAX_TENSORS`] tensors or holds
/// [`GraphCache::MAX_GRAPHS`] graphs, it is cut back to the long-lived
/// tensors and the cache starts afresh, so their number stays bounded.
#[derive(Debug, Default)]
pub(crate) struct GraphCache {
    /// (context id, generation, base length) the entries were built in.
    built_in: Option<(u32, u64, usize)>,
    entries: Vec<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

impl GraphCache {
    /// Most graphs kept.
    pub const MAX_GRAPHS: usize = 32;
    /// Most tensors the kept graphs may add to the context.
    pub const MAX_TENSORS: usize = 1 << 18;

    /// The kept graph of `key`, or the one `build` makes (appended to the
    /// context, above its first `base_len` tensors).
    ///
    /// # Errors
    /// `build`'s errors; [`crate::Error::Graph`] for no outputs.
    pub(crate) fn get_or_build<K, S>(
        &mut self,
        ctx: &mut crate::graph::Context,
        base_len: usize,
        key: K,
        build: impl FnOnce(&mut crate::graph::Context) -> crate::Result<(S, Vec<TensorId>)>,
    ) -> crate::Result<std::sync::Arc<StepGraph<K, S>>>
    where
        K: PartialEq + Send + Sync + 'static,
        S: Send + Sync + 'static,
    {
        let here = (ctx.id(), ctx.generation(), base_len);
        if self.built_in != Some(here) || ctx.len() < base_len {
            self.entries.clear();
        }
        for e in &self.entries {
            let hit = e.downcast_ref::<StepGraph<K, S>>().is_some_and(|sg| sg.key == key && sg.graph.built_from(ctx));
            if hit {
                if let Ok(sg) = e.clone().downcast::<StepGraph<K, S>>() {
                    return Ok(sg);
                }
            }
        }
        if self.entries.len() >= Self::MAX_GRAPHS || ctx.len().saturating_sub(base_len) > Self::MAX_TENSORS {
            self.entries.clear();
        }
        if self.entries.is_empty() {
            ctx.truncate(base_len);
        }
        let (step, outputs) = build(ctx)?;
        let graph = ctx.build_forward(&outputs)?;
        let sg = std::sync::Arc::new(StepGraph { key, step, outputs, graph });
        self.entries.push(sg.clone());
        self.built_in = Some((ctx.id(), ctx.generation(), base_len));
        Ok(sg)
    }
}

/// A decode step's result from its run: `read` lists the outputs read back
/// (`rep.outputs` in that order); the greedy tokens of `argmax`, the hidden
/// states of `taps`, and the logits if `logits` was read.
pub(crate) fn step_output(
    read: &[TensorId],
    rep: &crate::split::RunReport,
    argmax: TensorId,
    taps: &[(usize, TensorId)],
    logits: Option<TensorId>,
) -> qwen3::StepOutput {
    let at = |id: TensorId| read.iter().position(|&o| o == id).and_then(|k| rep.outputs.get(k));
    let argmax = at(argmax)
        .map(|b| b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        .unwrap_or_default();
    let taps = taps.iter().map(|&(l, id)| (l, at(id).map(|b| qwen3::f32s(b)).unwrap_or_default())).collect();
    let logits = logits.and_then(|id| at(id).map(|b| qwen3::f32s(b)));
    qwen3::StepOutput { argmax, logits, taps }
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

/// IMROPE's four position streams for text tokens (MODELS.md 1.1): the
/// position in the first three, zero in the fourth, stream-major.
pub(crate) fn imrope_positions(positions: &[i32]) -> Vec<i32> {
    let mut out = Vec::with_capacity(4 * positions.len());
    for stream in 0..4 {
        out.extend(positions.iter().map(|&p| if stream < 3 { p } else { 0 }));
    }
    out
}
