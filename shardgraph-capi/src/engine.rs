//! The speculative-decoding engine over C (`sg_engine_*`): a `qwen3` or
//! `qwen35` target and its drafter loaded from GGUF onto devices, and
//! generation with llama.cpp's sampler options, over
//! [`shardgraph_models::engine::Engine`].

use crate::graph::ggml_type;
use crate::ptr::{self, TokenCallback};
use crate::split::SgDevices;
use crate::status::{arg, run, sg_status, R};
use shardgraph_models::engine::{DraftModel, End, Engine, EngineParams, GenerateOptions, Generation};
use shardgraph_models::sampling::SamplerParams;
use shardgraph_models::speculative::SpecParams;
use std::ffi::{c_char, c_void};
use std::path::PathBuf;

/// `SG_DRAFT_NONE`: no drafter (plain decoding).
pub const SG_DRAFT_NONE: i32 = 0;
/// `SG_DRAFT_GGUF`: a DFlash/DFlash2 drafter GGUF (`draft_path`).
pub const SG_DRAFT_GGUF: i32 = 1;
/// `SG_DRAFT_MTP`: the `qwen35` target's own MTP (NextN) layer.
pub const SG_DRAFT_MTP: i32 = 2;

/// `sg_engine_params` (C layout): [`EngineParams`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgEngineParams {
    /// KV cells usable for prompts and generated tokens (`--ctx-size`).
    pub ctx_size: i64,
    /// K cache type, a ggml type id (`--cache-type-k`: llama.cpp's cache
    /// types the core has: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
    /// IQ4_NL).
    pub cache_type_k: i32,
    /// V cache type, a ggml type id (`--cache-type-v`), of the same list.
    pub cache_type_v: i32,
    /// Most drafts per step (`--spec-draft-n-max`; 0: the drafter's default).
    pub n_max: i32,
    /// Shorter drafts are discarded (`--spec-draft-n-min`).
    pub n_min: i32,
    /// Drafts below this drafter probability are cut (`--spec-draft-p-min`).
    pub p_min: f32,
}

impl From<EngineParams> for SgEngineParams {
    fn from(p: EngineParams) -> Self {
        SgEngineParams {
            ctx_size: p.ctx_size,
            cache_type_k: p.cache_type_k.id() as i32,
            cache_type_v: p.cache_type_v.id() as i32,
            n_max: i32::try_from(p.spec.n_max).unwrap_or(i32::MAX),
            n_min: i32::try_from(p.spec.n_min).unwrap_or(i32::MAX),
            p_min: p.p_min,
        }
    }
}

impl SgEngineParams {
    /// The Rust parameters.
    ///
    /// # Errors
    /// `SG_ERR_INVALID_ARGUMENT` for a negative `n_max`/`n_min` or a bad
    /// type id; `SG_ERR_UNSUPPORTED` for a type this crate lacks.
    fn to_rust(self) -> R<EngineParams> {
        let nonneg = |v: i32, what: &str| usize::try_from(v).or_else(|_| arg(format!("{what} = {v} is negative")));
        Ok(EngineParams {
            ctx_size: self.ctx_size,
            cache_type_k: ggml_type(self.cache_type_k)?,
            cache_type_v: ggml_type(self.cache_type_v)?,
            spec: SpecParams { n_max: nonneg(self.n_max, "n_max")?, n_min: nonneg(self.n_min, "n_min")? },
            p_min: self.p_min,
        })
    }
}

/// `sg_sampler_params` (C layout): [`SamplerParams`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgSamplerParams {
    /// `--temp`; `<= 0` is greedy.
    pub temp: f32,
    /// `--top-k`; 0 is off.
    pub top_k: i32,
    /// `--top-p`, in `(0, 1]`; 1 is off.
    pub top_p: f32,
    /// `--min-p`, in `[0, 1]`; 0 is off.
    pub min_p: f32,
    /// `--seed`.
    pub seed: u64,
}

impl From<SamplerParams> for SgSamplerParams {
    fn from(p: SamplerParams) -> Self {
        SgSamplerParams {
            temp: p.temp,
            top_k: i32::try_from(p.top_k).unwrap_or(i32::MAX),
            top_p: p.top_p,
            min_p: p.min_p,
            seed: p.seed,
        }
    }
}

impl SgSamplerParams {
    /// The Rust parameters.
    ///
    /// # Errors
    /// `SG_ERR_INVALID_ARGUMENT` for a negative `top_k` (the other values
    /// are checked by [`SamplerParams::validate`]: `SG_ERR_MODEL`).
    fn to_rust(self) -> R<SamplerParams> {
        let top_k = usize::try_from(self.top_k).or_else(|_| arg(format!("top_k = {} is negative", self.top_k)))?;
        Ok(SamplerParams { temp: self.temp, top_k, top_p: self.top_p, min_p: self.min_p, seed: self.seed })
    }
}

/// `sg_spec_stats` (C layout): [`shardgraph_models::speculative::SpecStats`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SgSpecStats {
    /// Tokens the drafter proposed.
    pub drafted: u64,
    /// Drafts the target accepted.
    pub accepted: u64,
    /// Target decode calls after the prompt.
    pub target_steps: u64,
}

/// `sg_engine`: an [`Engine`].
#[derive(Debug)]
pub struct SgEngine {
    engine: Engine,
}

/// `sg_engine_params_default`: [`EngineParams::default`] (ctx_size 4096,
/// F16 K and V caches, the drafter's default `n_max`, `n_min` 0, `p_min` 0).
#[no_mangle]
pub extern "C" fn sg_engine_params_default(out: *mut SgEngineParams) -> sg_status {
    run("sg_engine_params_default", || {
        ptr::slot(out, "p")?.write(EngineParams::default().into());
        Ok(())
    })
}

/// `sg_sampler_params_default`: [`SamplerParams::default`] (greedy, top_k
/// 40, top_p 0.95, min_p 0.05, seed 0xFFFFFFFF).
#[no_mangle]
pub extern "C" fn sg_sampler_params_default(out: *mut SgSamplerParams) -> sg_status {
    run("sg_sampler_params_default", || {
        ptr::slot(out, "p")?.write(SamplerParams::default().into());
        Ok(())
    })
}

/// `sg_engine_load`: loads `model_path` and the drafter (`draft_kind`:
/// `SG_DRAFT_NONE`, `SG_DRAFT_GGUF` with `draft_path`, `SG_DRAFT_MTP`) onto
/// the devices ([`Engine::load`]); `params` NULL takes the defaults.
#[no_mangle]
pub extern "C" fn sg_engine_load(
    devs: *const SgDevices,
    model_path: *const c_char,
    draft_kind: i32,
    draft_path: *const c_char,
    params: *const SgEngineParams,
    out: *mut *mut SgEngine,
) -> sg_status {
    run("sg_engine_load", || {
        let d = ptr::obj(devs, "devs")?;
        let out = ptr::slot(out, "engine")?;
        let model = PathBuf::from(ptr::string(model_path, "model_path")?);
        let draft_path = ptr::opt_string(draft_path, "draft_path")?;
        let draft = match (draft_kind, draft_path) {
            (SG_DRAFT_NONE, None) => DraftModel::None,
            (SG_DRAFT_MTP, None) => DraftModel::Mtp,
            (SG_DRAFT_GGUF, Some(p)) => DraftModel::Gguf(PathBuf::from(p)),
            (SG_DRAFT_GGUF, None) => return arg("SG_DRAFT_GGUF needs draft_path"),
            (SG_DRAFT_NONE | SG_DRAFT_MTP, Some(p)) => {
                return arg(format!(
                    "draft_path {p:?} given with draft kind {draft_kind} (only SG_DRAFT_GGUF takes one)"
                ))
            }
            (k, _) => return arg(format!("draft kind {k} (SG_DRAFT_NONE 0, SG_DRAFT_GGUF 1, SG_DRAFT_MTP 2)")),
        };
        let params = if params.is_null() { EngineParams::default() } else { ptr::obj(params, "params")?.to_rust()? };
        let engine = Engine::load(&d.devices, &model, draft, &params)?;
        out.write(ptr::into_handle(SgEngine { engine }));
        Ok(())
    })
}

/// `sg_engine_generate`: `n_predict` tokens after `prompt` into
/// `out_tokens` ([`Engine::generate`]); `sampler` NULL is greedy, `stats`
/// may be NULL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_engine_generate(
    engine: *mut SgEngine,
    prompt: *const i32,
    n_prompt: usize,
    n_predict: usize,
    sampler: *const SgSamplerParams,
    out_tokens: *mut i32,
    out_cap: usize,
    n_out: *mut usize,
    stats: *mut SgSpecStats,
) -> sg_status {
    run("sg_engine_generate", || {
        let e = ptr::obj_mut(engine, "engine")?;
        let opts = GenerateOptions::default();
        generate_into(e, prompt, n_prompt, n_predict, sampler, opts, (out_tokens, out_cap, n_out), stats).map(drop)
    })
}

/// `sg_generate_options` (C layout): [`GenerateOptions`] and where the
/// logits go. All zero is the default (no stop tokens, stop at the file's
/// end-of-generation tokens, no callback, no logits).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SgGenerateOptions {
    /// Tokens that end the generation (returned as its last token); NULL
    /// with `n_stop` 0 for none.
    pub stop: *const i32,
    /// Entries at `stop`.
    pub n_stop: usize,
    /// Non-zero: do not stop at the file's end-of-generation tokens.
    pub ignore_eos: i32,
    /// Called with each token as it is accepted (NULL: none); returning 0
    /// ends the generation after that token.
    pub on_token: Option<TokenCallback>,
    /// Passed to `on_token` as it is.
    pub user_data: *mut c_void,
    /// NULL, or room for `logits_cap` floats: the logits row `[n_vocab]` of
    /// each generated token, token after token.
    pub out_logits: *mut f32,
    /// Floats at `out_logits` (at least `n_predict · n_vocab` when given).
    pub logits_cap: usize,
}

/// `SG_END_LENGTH`: the generation gave the tokens asked for.
pub const SG_END_LENGTH: i32 = 0;
/// `SG_END_STOP`: it ended at an end-of-generation or stop token.
pub const SG_END_STOP: i32 = 1;
/// `SG_END_CALLER`: the callback returned 0.
pub const SG_END_CALLER: i32 = 2;

/// `sg_engine_generate_ex`: [`Engine::generate_with`] — as
/// `sg_engine_generate`, with stop tokens, a callback for each token and
/// the logits (`opts` NULL: none); `*end` (if not NULL) says why it ended.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_engine_generate_ex(
    engine: *mut SgEngine,
    prompt: *const i32,
    n_prompt: usize,
    n_predict: usize,
    sampler: *const SgSamplerParams,
    opts: *const SgGenerateOptions,
    out_tokens: *mut i32,
    out_cap: usize,
    n_out: *mut usize,
    stats: *mut SgSpecStats,
    end: *mut i32,
) -> sg_status {
    run("sg_engine_generate_ex", || {
        let e = ptr::obj_mut(engine, "engine")?;
        let opts = if opts.is_null() { None } else { Some(*ptr::obj(opts, "opts")?) };
        let stop = match &opts {
            Some(o) => ptr::slice(o.stop, o.n_stop, "opts->stop")?,
            None => &[],
        };
        let n_vocab = usize::try_from(e.engine.n_vocab()).unwrap_or(usize::MAX);
        let logits = match &opts {
            Some(o) if !o.out_logits.is_null() => {
                let need = n_predict.saturating_mul(n_vocab);
                if o.logits_cap < need {
                    return arg(format!(
                        "opts->logits_cap {} is less than n_predict {n_predict} × n_vocab {n_vocab}",
                        o.logits_cap
                    ));
                }
                Some(ptr::slice_mut(o.out_logits, o.logits_cap, "opts->out_logits")?)
            }
            _ => None,
        };
        let end = if end.is_null() { None } else { Some(ptr::slot(end, "end")?) };
        let mut tell = |t: i32| match opts.and_then(|o| o.on_token.map(|f| (f, o.user_data))) {
            Some((f, user)) => ptr::call_token_callback(f, t, user),
            None => true,
        };
        let go = GenerateOptions {
            stop,
            ignore_eos: opts.is_some_and(|o| o.ignore_eos != 0),
            on_token: Some(&mut tell),
            logits: logits.is_some(),
            on_step: None,
        };
        let g = generate_into(e, prompt, n_prompt, n_predict, sampler, go, (out_tokens, out_cap, n_out), stats)?;
        if let Some(dst) = logits {
            for (row, out) in g.logits.iter().zip(dst.chunks_mut(n_vocab.max(1))) {
                out[..row.len()].copy_from_slice(row);
            }
        }
        if let Some(end) = end {
            end.write(match g.end {
                End::Length => SG_END_LENGTH,
                End::Stop => SG_END_STOP,
                End::Caller => SG_END_CALLER,
            });
        }
        Ok(())
    })
}

/// The body of `sg_engine_generate` and `sg_engine_generate_ex`: checks the
/// pointers, generates, writes the tokens and counts.
#[allow(clippy::too_many_arguments)]
fn generate_into(
    e: &mut SgEngine,
    prompt: *const i32,
    n_prompt: usize,
    n_predict: usize,
    sampler: *const SgSamplerParams,
    opts: GenerateOptions<'_>,
    (out_tokens, out_cap, n_out): (*mut i32, usize, *mut usize),
    stats: *mut SgSpecStats,
) -> R<Generation> {
    let prompt = ptr::slice(prompt, n_prompt, "prompt")?;
    if out_cap < n_predict {
        return arg(format!("out_cap {out_cap} is less than n_predict {n_predict}"));
    }
    let out = ptr::slice_mut(out_tokens, out_cap, "out_tokens")?;
    let n_out = ptr::slot(n_out, "n_out")?;
    let stats = if stats.is_null() { None } else { Some(ptr::slot(stats, "stats")?) };
    let sampler = if sampler.is_null() { SamplerParams::greedy() } else { ptr::obj(sampler, "sampler")?.to_rust()? };
    let g = e.engine.generate_with(prompt, n_predict, &sampler, opts)?;
    let Some(dst) = out.get_mut(..g.tokens.len()) else {
        return arg(format!("{} tokens generated for out_cap {out_cap}", g.tokens.len()));
    };
    dst.copy_from_slice(&g.tokens);
    n_out.write(g.tokens.len());
    if let Some(s) = stats {
        s.write(SgSpecStats {
            drafted: g.stats.drafted as u64,
            accepted: g.stats.accepted as u64,
            target_steps: g.stats.target_steps as u64,
        });
    }
    Ok(g)
}

/// `sg_engine_rollback`: keeps the first `n_past` tokens of the sequence
/// ([`Engine::rollback`]).
#[no_mangle]
pub extern "C" fn sg_engine_rollback(engine: *mut SgEngine, n_past: i64) -> sg_status {
    run("sg_engine_rollback", || Ok(ptr::obj_mut(engine, "engine")?.engine.rollback(n_past)?))
}

/// `sg_engine_eog_tokens`: the file's end-of-generation tokens
/// ([`Engine::eog_tokens`]): up to `cap` into `out`, their count in `*n`.
#[no_mangle]
pub extern "C" fn sg_engine_eog_tokens(engine: *const SgEngine, out: *mut i32, cap: usize, n: *mut usize) -> sg_status {
    run("sg_engine_eog_tokens", || {
        let e = ptr::obj(engine, "engine")?;
        let eog = e.engine.eog_tokens();
        let dst = ptr::slice_mut(out, cap, "out")?;
        let k = eog.len().min(cap);
        dst[..k].copy_from_slice(&eog[..k]);
        ptr::slot(n, "n")?.write(eog.len());
        Ok(())
    })
}

/// `sg_engine_reset`: forgets the sequence ([`Engine::reset`]).
#[no_mangle]
pub extern "C" fn sg_engine_reset(engine: *mut SgEngine) -> sg_status {
    run("sg_engine_reset", || Ok(ptr::obj_mut(engine, "engine")?.engine.reset()?))
}

/// `sg_engine_n_vocab`: the target's vocabulary size.
#[no_mangle]
pub extern "C" fn sg_engine_n_vocab(engine: *const SgEngine, out: *mut i64) -> sg_status {
    run("sg_engine_n_vocab", || {
        let e = ptr::obj(engine, "engine")?;
        ptr::slot(out, "n")?.write(e.engine.n_vocab());
        Ok(())
    })
}

/// `sg_engine_n_past`: positions in use since the last reset.
#[no_mangle]
pub extern "C" fn sg_engine_n_past(engine: *const SgEngine, out: *mut i64) -> sg_status {
    run("sg_engine_n_past", || {
        let e = ptr::obj(engine, "engine")?;
        ptr::slot(out, "n")?.write(e.engine.n_past());
        Ok(())
    })
}

/// `sg_engine_n_ctx`: cells usable for prompts and generated tokens.
#[no_mangle]
pub extern "C" fn sg_engine_n_ctx(engine: *const SgEngine, out: *mut i64) -> sg_status {
    run("sg_engine_n_ctx", || {
        let e = ptr::obj(engine, "engine")?;
        ptr::slot(out, "n")?.write(e.engine.n_ctx());
        Ok(())
    })
}

/// `sg_engine_bytes_moved`: bytes moved between devices by every run so far.
#[no_mangle]
pub extern "C" fn sg_engine_bytes_moved(engine: *const SgEngine, out: *mut u64) -> sg_status {
    run("sg_engine_bytes_moved", || {
        let e = ptr::obj(engine, "engine")?;
        ptr::slot(out, "bytes")?.write(e.engine.bytes_moved());
        Ok(())
    })
}

/// `sg_engine_free`: frees an engine and its device memory (NULL: nothing).
#[no_mangle]
pub extern "C" fn sg_engine_free(engine: *mut SgEngine) -> sg_status {
    run("sg_engine_free", || {
        ptr::free(engine);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip() {
        let d = EngineParams::default();
        assert_eq!(SgEngineParams::from(d).to_rust().unwrap(), d);
        let s = SamplerParams { temp: 0.7, top_k: 5, top_p: 0.9, min_p: 0.1, seed: 42 };
        assert_eq!(SgSamplerParams::from(s).to_rust().unwrap(), s);
        assert!(SgSamplerParams { top_k: -1, ..s.into() }.to_rust().is_err());
        assert!(SgEngineParams { n_max: -2, ..d.into() }.to_rust().is_err());
        assert!(SgEngineParams { cache_type_k: 99, ..d.into() }.to_rust().is_err());
    }
}
