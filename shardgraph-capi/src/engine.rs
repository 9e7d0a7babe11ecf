//! The speculative-decoding engine over C (`sg_engine_*`): a `qwen3` or
//! `qwen35` target and its drafter loaded from GGUF onto devices, and
//! generation with llama.cpp's sampler options, over
//! [`shardgraph_models::engine::Engine`].

use crate::graph::ggml_type;
use crate::ptr;
use crate::split::SgDevices;
use crate::status::{arg, run, sg_status, R};
use shardgraph_models::engine::{DraftModel, Engine, EngineParams};
use shardgraph_models::sampling::SamplerParams;
use shardgraph_models::speculative::SpecParams;
use std::ffi::c_char;
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
    /// KV cache type, a ggml type id (`--cache-type-k`: F16, Q8_0, Q4_0, F32).
    pub cache_type_k: i32,
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
/// F16 caches, the drafter's default `n_max`, `n_min` 0, `p_min` 0).
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
        let prompt = ptr::slice(prompt, n_prompt, "prompt")?;
        if out_cap < n_predict {
            return arg(format!("out_cap {out_cap} is less than n_predict {n_predict}"));
        }
        let out = ptr::slice_mut(out_tokens, out_cap, "out_tokens")?;
        let n_out = ptr::slot(n_out, "n_out")?;
        let stats = if stats.is_null() { None } else { Some(ptr::slot(stats, "stats")?) };
        let sampler =
            if sampler.is_null() { SamplerParams::greedy() } else { ptr::obj(sampler, "sampler")?.to_rust()? };
        let g = e.engine.generate(prompt, n_predict, &sampler)?;
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
