//! # shardgraph-models
//!
//! Example models on [`shardgraph`]: model graphs built from its ops, with
//! llama.cpp's tensor names, GGUF keys and `--split-mode tensor` policy
//! (shardgraph-models/MODELS.md), and a runner that decodes them on N devices.
//! Each model owns its split policy (beside the model; the granules they
//! share are in [`policy`]); the generic machinery
//! ([`shardgraph::split::SplitPolicy`]) is the core's.
//!
//! The main job in one call is [`engine::Engine`] (its
//! [`load`](engine::Engine::load) shows it on a generated pair); a model alone
//! is a session ([`qwen3::Qwen3Session::load`], [`qwen35::Qwen35Session`]);
//! [`generate::write_example_pair`] writes a small target and drafter to try
//! them on.
//!
//! The modules, bottom up (each imports only modules listed before it):
//!
//! * [`step`]: what a decode step returns ([`step::StepOutput`]), what the
//!   speculative loop asks of a target and a drafter ([`step::Target`],
//!   [`step::Drafter`]) and [`step::MAX_DRAFT`].
//! * layers (crate-private): the graph builders the models share (RMSNorm,
//!   SwiGLU FFN, the K/V cache write, attention over a KV cache).
//! * [`runner`]: per-step graphs over long-lived weights and caches, planned
//!   (cached) and executed on N devices (CPU instances or GPUs).
//! * [`sampling`]: llama.cpp's sampler (greedy; top-k, top-p, min-p,
//!   temperature with a seed).
//! * [`types`]: where a model's tensor types come from — its weights'
//!   ([`types::TensorTypes`]: one type per tensor, the file's when loading,
//!   a preset's for generated and hand-built models) and its KV caches'
//!   ([`types::KvTypes`], K and V apart).
//! * [`hparams`]: the hyper-parameters every model shares and the one table
//!   of the GGUF keys they are read from.
//! * [`policy`]: the granules and layer rules of llama.cpp's split states
//!   that the models' policies share.
//! * [`decoder`]: the Qwen3-style decoder layer of the `qwen3` target and the
//!   DFlash drafters, with DFlash2's convolutions.
//! * [`qwen3`]: the `qwen3` dense target.
//! * [`qwen35`]: the `qwen35` hybrid target (gated attention + Gated DeltaNet)
//!   and its NextN (MTP) head's graphs.
//! * [`dflash`]: the DFlash and DFlash2 block-diffusion drafters.
//! * [`mtp`]: the `qwen35` target's native MTP (NextN) drafter.
//! * [`speculative`]: draft, verify in one target batch, accept (greedy, or
//!   sampled with the rejection rule that keeps the target's distribution),
//!   roll back.
//! * [`generate`]: GGUF files with seeded weights for the tests and examples.
//! * [`fit`]: a session's memory per device from plans and shapes, and the
//!   largest context that fits the devices (before anything is allocated).
//! * [`engine`]: the main job in one call — a target and its drafter (DFlash,
//!   DFlash2, MTP or none) loaded from GGUF onto
//!   [`shardgraph::split::Devices`], caches sized from one context size,
//!   and `generate` with a sampler.

#![deny(missing_docs)]

use shardgraph::tensor::TensorId;

pub mod decoder;
pub mod dflash;
pub mod engine;
pub mod fit;
pub mod generate;
pub mod hparams;
pub(crate) mod layers;
pub mod mtp;
pub mod policy;
pub mod qwen3;
pub mod qwen35;
pub mod runner;
pub mod sampling;
pub mod speculative;
pub mod step;
pub mod types;

/// Loads a session's long-lived tensors — the first `base_len` of `ctx`:
/// weights and caches — from `file` onto `runner`'s devices: checks the
/// weights against the file ([`check_file_tensors`]) and every device's
/// memory ([`runner::Runner::place_all`]; `what` names them in the error)
/// before anything is allocated, places them, copies each weight from the
/// mapped file into its parts, and uploads.
///
/// # Errors
/// As [`check_file_tensors`] (naming `model`) and
/// [`runner::Runner::place_all`]; load and upload errors.
pub(crate) fn place_and_load(
    file: &shardgraph::gguf::GgufFile,
    ctx: &shardgraph::graph::Context,
    base_len: usize,
    runner: &mut runner::Runner,
    model: &str,
    what: &str,
) -> shardgraph::Result<()> {
    let ids: Vec<TensorId> = ctx.ids().take(base_len).collect();
    check_file_tensors(file, ctx, &ids, "", model)?;
    runner.place_all(ctx, &ids, what)?;
    let start = std::time::Instant::now();
    let report = shardgraph::gguf::load_into_split_store(file, ctx, runner.store_mut())?;
    log::info!(
        "{model}: loaded {} tensors ({:.1} MB) onto {} device(s) in {:.2} s",
        report.loaded.len(),
        report.bytes as f64 / 1e6,
        runner.n_devices(),
        start.elapsed().as_secs_f64()
    );
    runner.upload()
}

/// Checks, before anything is placed, that `file` holds exactly the weights
/// of the context tensors `ids` (caches, named `{prefix}cache_*`, excepted),
/// each with the same type and shape (ggml order), and no other tensor
/// (llama.cpp's loader refuses a file with tensors the model does not use:
/// a `block_count` below the file's `blk.N` count). The context's names
/// carry `prefix` (a drafter's `dft.`), the file's do not. So every
/// hyper-parameter that shapes a weight (layer count, vocabulary, heads,
/// head and block sizes) is checked against the file before a byte is
/// allocated.
///
/// # Errors
/// [`shardgraph::Error::Model`] naming `model`, the first missing, mismatched
/// or unused tensors and their counts.
pub(crate) fn check_file_tensors(
    file: &shardgraph::gguf::GgufFile,
    ctx: &shardgraph::graph::Context,
    ids: &[TensorId],
    prefix: &str,
    model: &str,
) -> shardgraph::Result<()> {
    let list = |v: &[String]| {
        let more = if v.len() > 3 { format!(", … ({} in all)", v.len()) } else { String::new() };
        format!("{}{more}", v.iter().take(3).cloned().collect::<Vec<_>>().join(", "))
    };
    let mut wanted = std::collections::HashSet::new();
    let (mut missing, mut wrong) = (Vec::new(), Vec::new());
    for &id in ids {
        let t = ctx.tensor(id)?;
        let Some(name) = t.name.strip_prefix(prefix) else { continue };
        if name.starts_with("cache_") || t.view_src.is_some() {
            continue;
        }
        wanted.insert(name);
        match file.tensor_info(name) {
            None => missing.push(name.to_string()),
            Some(i) if i.ty != t.ty || i.ne != t.ne => {
                wrong.push(format!("{name} is {} in the file, the model needs {}", i.describe(), t.describe()))
            }
            Some(_) => {}
        }
    }
    let unused: Vec<String> =
        file.tensors().iter().filter(|i| !wanted.contains(i.name.as_str())).map(|i| i.name.clone()).collect();
    let err = |d: String| Err(shardgraph::Error::Model { detail: format!("{model} ({}): {d}", file.name()) });
    if !wrong.is_empty() {
        return err(format!("{} tensor(s) of the wrong type or shape: {}", wrong.len(), list(&wrong)));
    }
    if !missing.is_empty() {
        return err(format!("the file lacks {} tensor(s): {}", missing.len(), list(&missing)));
    }
    if !unused.is_empty() {
        return err(format!(
            "the file has {} tensor(s) the model does not use (does block_count match the file?): {}",
            unused.len(),
            list(&unused)
        ));
    }
    Ok(())
}

/// The most layers a model may have (llama.cpp's `LLAMA_MAX_LAYERS`): a
/// `block_count` read from a file is checked against it before any layer's
/// tensors are created, so a corrupt count cannot allocate without bound.
pub const MAX_LAYERS: usize = 512;

/// The most KV cells a cache may have (`--ctx-size`): positions, and so
/// cells, are 32-bit as in llama.cpp (`llama_pos`).
pub const MAX_CTX: i64 = i32::MAX as i64;

/// Checks a cache size: `kv_size` within `1..=MAX_CTX`.
///
/// # Errors
/// [`shardgraph::Error::Model`] naming `model` otherwise.
pub(crate) fn check_kv_size(model: &str, kv_size: i64) -> shardgraph::Result<()> {
    if !(1..=MAX_CTX).contains(&kv_size) {
        return Err(shardgraph::Error::Model {
            detail: format!("{model}: a KV cache of {kv_size} cells (--ctx-size 1 to {MAX_CTX}: positions are 32-bit)"),
        });
    }
    Ok(())
}

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
/// [`shardgraph::Error::Model`] naming `model` otherwise.
pub(crate) fn check_window(model: &str, n_kv: i64, kv_size: i64) -> shardgraph::Result<()> {
    if n_kv < 1 || n_kv > kv_size {
        return Err(shardgraph::Error::Model {
            detail: format!("{model}: a window of {n_kv} cells in a cache of {kv_size}"),
        });
    }
    Ok(())
}
