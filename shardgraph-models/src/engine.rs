//! The main job in one call: a target and its drafter loaded from GGUF onto
//! [`shardgraph::split::Devices`], caches sized from one context size, and
//! generation with a sampler (llama.cpp's `llama-speculative-simple` /
//! `llama-server` with `--model`, `--model-draft` or `--spec-type
//! draft-mtp`, `--ctx-size`, `--cache-type-k`, `--spec-draft-n-max`,
//! `--spec-draft-n-min`, `--spec-draft-p-min` and the sampling options).
//!
//! * The target is `qwen3` or `qwen35`, told by the GGUF's
//!   `general.architecture` ([`super::qwen3`], [`super::qwen35`]).
//! * The drafter ([`DraftModel`]) is a DFlash or DFlash2 GGUF (told apart by
//!   its metadata: DFlash2 has the convolution or selector keys;
//!   [`super::dflash`]), the `qwen35` target's own MTP (NextN) layer
//!   ([`super::mtp`]), or none (plain decoding through the same loop).
//! * Every cache is sized from one context size ([`EngineParams::ctx_size`]:
//!   the cells a caller wants usable, prompt and generated tokens) plus the
//!   drafter's block (DFlash: `block_size`; MTP: `n_max + 1`), so a draft
//!   near the end of the context is never cut short; a `qwen35` target with
//!   a drafter keeps per-token recurrent-state snapshots for the verified
//!   batch ([`Qwen35Session::enable_snapshots`]).
//! * [`Engine::generate`] runs [`super::speculative::generate_with`]: greedy
//!   output equals plain greedy decoding token for token; sampled output
//!   has the target's distribution (speculative sampling).
//!
//! Everything the files say is checked before anything is allocated, and a
//! generation that would not fit the context is refused before any
//! decoding.

use super::dflash::{qwen35_dflash_policy, qwen3_dflash_policy, Dflash, DflashDrafter, DflashHparams, TargetInfo};
use super::fit::{FitDraft, FitSpec, FitTarget, CTX_STEP};
use super::mtp::MtpDrafter;
use super::qwen3::{qwen3_policy, Qwen3, Qwen3Hparams, Qwen3Session};
use super::qwen35::{qwen35_policy, Qwen35, Qwen35Hparams, Qwen35Session};
use super::sampling::{Sampler, SamplerParams};
use super::speculative::{generate_hooked, generate_with, Hooks, NoDraft, SpecParams, SpecStats};
pub use super::speculative::{End, StepTrace};
use super::step::{check_p_min, MAX_DRAFT};
use super::types::{KvTypes, TensorTypes, LLAMA_CACHE_TYPES};
use shardgraph::error::{Error, Result};
use shardgraph::gguf::GgufFile;
use shardgraph::split::Devices;
use shardgraph::tensor::GgmlType;
use std::path::{Path, PathBuf};

/// The drafter of an [`Engine`] (llama.cpp's `--model-draft` /
/// `--spec-type`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DraftModel {
    /// No drafter: plain decoding (llama.cpp without `--model-draft`).
    #[default]
    None,
    /// A DFlash or DFlash2 drafter GGUF (`general.architecture` `dflash`;
    /// DFlash2 when it has `dflash.conv_*` or `dflash.selector_*` keys),
    /// built for the target: same hidden size and vocabulary, tapped layers
    /// within the target's.
    Gguf(PathBuf),
    /// The target's own MTP (NextN) layer (a `qwen35` GGUF with
    /// `qwen35.nextn_predict_layers` ≥ 1; llama.cpp's `--spec-type
    /// draft-mtp`).
    Mtp,
}

/// How an [`Engine`] is loaded (llama.cpp's names in brackets).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineParams {
    /// KV cells the caller wants usable (`--ctx-size`): the prompt and the
    /// generated tokens of all [`Engine::generate`] calls since the last
    /// [`Engine::reset`]. Every cache gets this many cells plus the
    /// drafter's block ([`Engine::kv_size`]). At least 1; see
    /// [`Engine::fit_ctx_size`] for the largest that fits the devices.
    pub ctx_size: i64,
    /// K cache type of the target and the drafter (`--cache-type-k`): one
    /// of llama.cpp's cache types the core has
    /// ([`crate::types::LLAMA_CACHE_TYPES`]: f32, f16, bf16, q8_0, q4_0,
    /// q4_1, q5_0, q5_1, iq4_nl).
    pub cache_type_k: GgmlType,
    /// V cache type (`--cache-type-v`), of the same list; it may differ
    /// from K's.
    pub cache_type_v: GgmlType,
    /// Draft limits (`--spec-draft-n-max`, `--spec-draft-n-min`). `n_max` 0
    /// takes the drafter's default: a DFlash block's `block_size − 1`, 3 for
    /// MTP; a DFlash `n_max` above `block_size − 1` is capped there. At most
    /// [`MAX_DRAFT`]; `n_min` at most the `n_max` used. Ignored without a
    /// drafter.
    pub spec: SpecParams,
    /// Drafts whose drafter probability is below this are cut
    /// (`--spec-draft-p-min`), a probability in `0..=1`; 0 keeps every
    /// draft (the examples' default; llama.cpp's is 0.75).
    pub p_min: f32,
}

impl Default for EngineParams {
    /// `ctx_size` 4096 (llama.cpp's `--ctx-size` default), F16 caches, the
    /// drafter's default `n_max`, `n_min` 0, `p_min` 0.
    fn default() -> Self {
        EngineParams {
            ctx_size: 4096,
            cache_type_k: GgmlType::F16,
            cache_type_v: GgmlType::F16,
            spec: SpecParams { n_max: 0, n_min: 0 },
            p_min: 0.0,
        }
    }
}

impl EngineParams {
    /// The K and V cache types.
    pub fn cache_types(&self) -> KvTypes {
        KvTypes::new(self.cache_type_k, self.cache_type_v)
    }
}

/// What one [`Engine::generate`] call returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Generation {
    /// The generated tokens: `n_predict` of them, or fewer when the
    /// generation stopped early ([`Generation::end`]; the token it stopped
    /// at is the last).
    pub tokens: Vec<i32>,
    /// Drafted and accepted counts and target steps.
    pub stats: SpecStats,
    /// With [`GenerateOptions::logits`]: per generated token, the target's
    /// logits `[n_vocab]` of the step it was chosen from; empty otherwise.
    pub logits: Vec<Vec<f32>>,
    /// Why the generation ended: `n_predict` reached, an end-of-generation
    /// or stop token, or the caller's callback.
    pub end: End,
}

/// How one [`Engine::generate_with`] call runs besides its sampler
/// (llama.cpp's stop conditions and streaming, for token ids).
#[derive(Default)]
pub struct GenerateOptions<'a> {
    /// More tokens that end the generation (it ends after the first one it
    /// generates, which is returned as the last token), besides the file's
    /// end-of-generation tokens ([`Engine::eog_tokens`]).
    pub stop: &'a [i32],
    /// Do not stop at the file's end-of-generation tokens (llama.cpp's
    /// `--ignore-eos`).
    pub ignore_eos: bool,
    /// Called with each generated token as it is accepted, in order (a
    /// verified batch's tokens one by one, before the next step runs);
    /// returning false ends the generation after that token.
    pub on_token: Option<&'a mut dyn FnMut(i32) -> bool>,
    /// Read back the target's logits of every generated token's step
    /// ([`Generation::logits`]; llama.cpp's `llama_get_logits_ith`). Costs
    /// `n_vocab` floats per token read from the devices.
    pub logits: bool,
    /// Called once per verified step with its drafts, accepted count and
    /// next token ([`StepTrace`]), before that step's tokens reach
    /// `on_token`.
    pub on_step: Option<&'a mut dyn FnMut(&StepTrace<'_>)>,
}

/// The loaded target.
#[derive(Debug)]
enum Target {
    Qwen3(Box<Qwen3Session>),
    Qwen35(Box<Qwen35Session>),
}

/// The loaded drafter.
#[derive(Debug)]
enum Draft {
    None,
    Dflash(Box<DflashDrafter>),
    Mtp(Box<MtpDrafter>),
}

/// A target and its drafter loaded on devices, decoding one sequence
/// (llama.cpp's context with a speculative decoder attached).
#[derive(Debug)]
pub struct Engine {
    target: Target,
    draft: Draft,
    kind: &'static str,
    ctx_size: i64,
    kv_size: i64,
    spec: SpecParams,
    p_min: f32,
    /// The file's end-of-generation tokens (`tokenizer.ggml.eos_token_id`,
    /// `tokenizer.ggml.eot_token_id`).
    eog: Vec<i32>,
    /// The sequence so far: prompts and generated tokens since the last
    /// reset (what a rollback keeps a prefix of).
    seq: Vec<i32>,
    /// The last generated token when the target has not decoded it yet
    /// (the next [`Engine::generate`] decodes it before its prompt).
    pending: Option<i32>,
}

/// The target's architecture, hyper-parameters and weight types, from its GGUF.
enum Arch {
    Qwen3 { hp: Qwen3Hparams, types: TensorTypes },
    Qwen35 { hp: Qwen35Hparams, types: TensorTypes },
}

impl Arch {
    fn n_vocab(&self) -> i64 {
        match self {
            Arch::Qwen3 { hp, .. } => hp.n_vocab,
            Arch::Qwen35 { hp, .. } => hp.n_vocab,
        }
    }

    fn n_embd(&self) -> i64 {
        match self {
            Arch::Qwen3 { hp, .. } => hp.n_embd,
            Arch::Qwen35 { hp, .. } => hp.n_embd,
        }
    }

    fn n_layer(&self) -> usize {
        match self {
            Arch::Qwen3 { hp, .. } => hp.n_layer,
            Arch::Qwen35 { hp, .. } => hp.n_layer,
        }
    }
}

/// The drafter as its file (or the target) describes it.
enum Planned {
    None,
    Dflash(Box<DraftFile>),
    Mtp,
}

/// A DFlash drafter's file, hyper-parameters and weight types.
struct DraftFile {
    file: GgufFile,
    hp: DflashHparams,
    types: TensorTypes,
}

/// Everything [`Engine::load`] and [`Engine::fit_ctx_size`] learn from the
/// files and parameters before anything is allocated.
struct Plan {
    file: GgufFile,
    arch: Arch,
    draft: Planned,
    kind: &'static str,
    /// The draft limits used (`n_max` resolved).
    spec: SpecParams,
    /// Cells beyond `ctx_size` in every cache: the drafter's block.
    extra: i64,
    /// The target file's end-of-generation tokens.
    eog: Vec<i32>,
}

impl Plan {
    /// Reads and checks the target's and drafter's files and `params`.
    fn new(model: &Path, draft: &DraftModel, params: &EngineParams) -> Result<Plan> {
        for (what, ty) in [("cache_type_k", params.cache_type_k), ("cache_type_v", params.cache_type_v)] {
            if !LLAMA_CACHE_TYPES.contains(&ty.name()) {
                return Err(Error::Model {
                    detail: format!("engine: {what} {ty} (llama.cpp's cache types: {})", LLAMA_CACHE_TYPES.join(", ")),
                });
            }
        }
        check_p_min("engine", params.p_min)?;
        let SpecParams { n_max, n_min } = params.spec;
        if n_max > MAX_DRAFT {
            return Err(Error::Model { detail: format!("engine: n_max {n_max} is over {MAX_DRAFT} drafts per step") });
        }
        let file = GgufFile::open(model)?;
        let arch_name = file.get_str("general.architecture")?;
        let types = TensorTypes::from_file(&file);
        let arch = match arch_name {
            "qwen3" => Arch::Qwen3 { hp: Qwen3Hparams::from_gguf(&file)?, types },
            "qwen35" => Arch::Qwen35 { hp: Qwen35Hparams::from_gguf(&file)?, types },
            other => {
                return Err(Error::Model {
                    detail: format!(
                        "engine: {}: general.architecture {other:?} (the engine loads qwen3 or qwen35)",
                        model.display()
                    ),
                })
            }
        };
        let (planned, kind, n_max, extra) = match draft {
            DraftModel::None => (Planned::None, "none", 0, 0),
            DraftModel::Gguf(path) => {
                let f = GgufFile::open(path)?;
                let a = f.get_str("general.architecture")?;
                if a != "dflash" {
                    return Err(Error::Model {
                        detail: format!(
                            "engine: drafter {}: general.architecture {a:?} (a DFlash or DFlash2 GGUF: \"dflash\")",
                            path.display()
                        ),
                    });
                }
                let (hp, vocab) = DflashHparams::read(&f)?;
                check_dflash(path, &hp, vocab, &arch)?;
                let types = TensorTypes::from_file(&f);
                let kind = if hp.conv.is_some() || hp.selector.is_some() { "dflash2" } else { "dflash" };
                let most = hp.block_size - 1;
                let n = if n_max == 0 { most } else { n_max.min(most) };
                let extra = hp.block_size as i64;
                (Planned::Dflash(Box::new(DraftFile { file: f, hp, types })), kind, n, extra)
            }
            DraftModel::Mtp => {
                match &arch {
                    Arch::Qwen35 { hp, .. } if hp.n_nextn > 0 => {}
                    Arch::Qwen35 { .. } => {
                        return Err(Error::Model {
                            detail: format!(
                                "engine: MTP drafting needs a NextN (MTP) layer, and {} has none \
                                 (qwen35.nextn_predict_layers = 0)",
                                model.display()
                            ),
                        })
                    }
                    Arch::Qwen3 { .. } => {
                        return Err(Error::Model {
                            detail: format!(
                                "engine: MTP drafting needs a qwen35 target with a NextN layer; {} is qwen3",
                                model.display()
                            ),
                        })
                    }
                }
                let n = if n_max == 0 { DEFAULT_MTP_N_MAX } else { n_max };
                (Planned::Mtp, "mtp", n, n as i64 + 1)
            }
        };
        let spec = match planned {
            Planned::None => SpecParams { n_max: 0, n_min: 0 },
            _ if n_min > n_max => {
                return Err(Error::Model {
                    detail: format!("engine: n_min {n_min} exceeds n_max {n_max}: nothing would be drafted"),
                })
            }
            _ => SpecParams { n_max, n_min },
        };
        let eog = eog_tokens(&file, arch.n_vocab())?;
        Ok(Plan { file, arch, draft: planned, kind, spec, extra, eog })
    }

    /// Recurrent-state snapshot slots: a verification batch of a `qwen35`
    /// target with a drafter (0 otherwise).
    fn snapshot_slots(&self) -> usize {
        match (&self.arch, &self.draft) {
            (Arch::Qwen35 { .. }, Planned::Dflash(_) | Planned::Mtp) if self.spec.n_max > 0 => self.spec.n_max + 1,
            _ => 0,
        }
    }

    /// Checks `ctx_size` and returns the cells of every cache.
    fn kv_size(&self, ctx_size: i64) -> Result<i64> {
        let most = super::MAX_CTX - self.extra;
        if !(1..=most).contains(&ctx_size) {
            return Err(Error::Model {
                detail: format!(
                    "engine: ctx_size {ctx_size} (1 to {most}: the caches hold it plus the drafter's block of {} \
                     cells, at most {} in all)",
                    self.extra,
                    super::MAX_CTX
                ),
            });
        }
        Ok(ctx_size + self.extra)
    }
}

/// MTP's default drafts per step (`n_max` 0): the examples' default.
pub const DEFAULT_MTP_N_MAX: usize = 3;

/// The GGUF keys of a model's end-of-generation tokens (llama.cpp's
/// `llama_vocab_is_eog` set, as far as a file without a tokenizer has it).
pub const EOG_KEYS: [&str; 2] = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"];

/// The end-of-generation tokens `file` names ([`EOG_KEYS`]); an id outside
/// the vocabulary of `n_vocab` is left out with a warning, as llama.cpp
/// does.
///
/// # Errors
/// [`Error::Gguf`] for a key that is not an unsigned integer.
fn eog_tokens(file: &GgufFile, n_vocab: i64) -> Result<Vec<i32>> {
    let mut out = Vec::new();
    for key in EOG_KEYS {
        if !file.contains_key(key) {
            continue;
        }
        let id = file.get_uint(key)?;
        match i32::try_from(id).ok().filter(|&t| i64::from(t) < n_vocab) {
            Some(t) if !out.contains(&t) => out.push(t),
            Some(_) => {}
            None => log::warn!("engine: {key} = {id} is outside the vocabulary of {n_vocab}; ignored"),
        }
    }
    Ok(out)
}

/// Checks a DFlash drafter's metadata against the target's before either is
/// loaded (the attach checks it again, with the tensors).
fn check_dflash(path: &Path, hp: &DflashHparams, vocab: Option<i64>, arch: &Arch) -> Result<()> {
    let bad = |d: String| Err(Error::Model { detail: format!("engine: drafter {}: {d}", path.display()) });
    if let Some(v) = vocab.filter(|&v| v != arch.n_vocab()) {
        return bad(format!("vocab_size {v} differs from the target's {}: built for another target", arch.n_vocab()));
    }
    if hp.n_embd != arch.n_embd() || hp.target_hidden != arch.n_embd() {
        return bad(format!(
            "embedding_length {} / target_hidden_size {} differ from the target's embedding_length {}: built for \
             another target",
            hp.n_embd,
            hp.target_hidden,
            arch.n_embd()
        ));
    }
    if let Some(l) = hp.target_layers.iter().find(|&&l| l > arch.n_layer()) {
        return bad(format!(
            "target_layers taps layer {l}, beyond the target's {} layers: built for another target",
            arch.n_layer()
        ));
    }
    if hp.block_size < 2 {
        return bad(format!("block_size {} leaves nothing to draft (at least 2)", hp.block_size));
    }
    Ok(())
}

/// [`super::check_file_tensors`] over the tensors of `ctx` from `start` on
/// (a model's, up to the end of the context).
fn check_tensors(
    file: &GgufFile,
    ctx: &shardgraph::graph::Context,
    start: usize,
    prefix: &str,
    model: &str,
) -> Result<()> {
    let ids: Vec<shardgraph::tensor::TensorId> = ctx.ids().skip(start).collect();
    super::check_file_tensors(file, ctx, &ids, prefix, model)
}

impl Engine {
    /// Loads the target `model` (`qwen3` or `qwen35`, by its
    /// `general.architecture`) and the drafter `draft` onto `devices` (split
    /// with llama.cpp's `--split-mode tensor` policy at their ratios), every
    /// cache of `params.ctx_size` cells plus the drafter's block of
    /// `cache_type_k` ([`Engine::kv_size`]). Every file, hyper-parameter and
    /// tensor is checked, and each device's memory, before anything is
    /// allocated.
    ///
    /// # Example
    /// A generated `qwen3` target and its DFlash2 drafter
    /// ([`crate::generate::write_example_pair`]) on two CPU devices: greedy
    /// speculative decoding gives plain greedy decoding's tokens.
    /// ```
    /// use shardgraph::split::Devices;
    /// use shardgraph_models::engine::{DraftModel, Engine, EngineParams};
    /// use shardgraph_models::generate::write_example_pair;
    /// use shardgraph_models::sampling::SamplerParams;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = std::env::temp_dir().join(format!("sg-doc-engine-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let (model, draft) = write_example_pair(&dir)?;
    /// let devices = Devices::cpu(2, 1)?;
    /// let params = EngineParams { ctx_size: 256, ..EngineParams::default() };
    /// let greedy = SamplerParams::greedy();
    ///
    /// let mut engine = Engine::load(&devices, &model, DraftModel::Gguf(draft), &params)?;
    /// assert_eq!((engine.arch(), engine.draft_kind()), ("qwen3", "dflash2"));
    /// let out = engine.generate(&[1, 2, 3], 16, &greedy)?;
    /// assert!(out.stats.accepted > 0, "{:?}", out.stats);
    ///
    /// let mut plain = Engine::load(&devices, &model, DraftModel::None, &params)?;
    /// assert_eq!(plain.generate(&[1, 2, 3], 16, &greedy)?.tokens, out.tokens);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Gguf`] naming a file that is missing or malformed, or a
    /// missing or mistyped key; [`Error::Model`] for a target architecture
    /// other than `qwen3`/`qwen35`, a drafter that is not a `dflash` GGUF or
    /// was built for another target (vocabulary, hidden size, tapped
    /// layers), MTP asked of a target without a NextN layer, a
    /// `cache_type_k` or `cache_type_v` that is not one of llama.cpp's cache
    /// types the core has, or does not fit the heads, a `p_min` outside
    /// `0..=1`, an `n_max` over [`MAX_DRAFT`] or an `n_min` above the
    /// `n_max` used, a `ctx_size` below 1 or whose caches would exceed
    /// [`super::MAX_CTX`] cells, and the models' own checks (values out of
    /// range, tensors missing, mismatched or unused, of a type the kernels
    /// cannot run, a split that leaves a device without a head);
    /// [`Error::Split`] for ratios the policy refuses;
    /// [`Error::OutOfMemory`] naming the device and the bytes.
    pub fn load(devices: &Devices, model: &Path, draft: DraftModel, params: &EngineParams) -> Result<Engine> {
        let plan = Plan::new(model, &draft, params)?;
        let kv_size = plan.kv_size(params.ctx_size)?;
        let kv = params.cache_types();
        let slots = plan.snapshot_slots();
        let (target, draft) = match (&plan.arch, &plan.draft) {
            (Arch::Qwen3 { .. }, d) => {
                let mut s = Qwen3Session::load_file(&plan.file, devices, kv, kv_size)?;
                let draft = match d {
                    Planned::Dflash(d) => {
                        Draft::Dflash(Box::new(DflashDrafter::attach_file(&mut s, &d.file, kv, params.p_min)?))
                    }
                    // Plan::new refused MTP on qwen3.
                    _ => Draft::None,
                };
                (Target::Qwen3(Box::new(s)), draft)
            }
            (Arch::Qwen35 { .. }, d) => {
                let mut s = Qwen35Session::load_file(&plan.file, devices, kv, kv_size)?;
                let draft = match d {
                    Planned::Dflash(d) => {
                        Draft::Dflash(Box::new(DflashDrafter::attach_file(&mut s, &d.file, kv, params.p_min)?))
                    }
                    Planned::Mtp => Draft::Mtp(Box::new(MtpDrafter::new(&s, params.p_min)?)),
                    Planned::None => Draft::None,
                };
                // After the drafter: its policy is the one the snapshots are placed under.
                if slots > 0 {
                    s.enable_snapshots(slots)?;
                }
                (Target::Qwen35(Box::new(s)), draft)
            }
        };
        log::info!(
            "engine: {} with drafter {} on {} device(s), ctx_size {} (caches of {kv_size} cells, {kv}), n_max {}",
            match target {
                Target::Qwen3(_) => "qwen3",
                Target::Qwen35(_) => "qwen35",
            },
            plan.kind,
            devices.n_devices(),
            params.ctx_size,
            plan.spec.n_max
        );
        Ok(Engine {
            target,
            draft,
            kind: plan.kind,
            ctx_size: params.ctx_size,
            kv_size,
            spec: plan.spec,
            p_min: params.p_min,
            eog: plan.eog,
            seq: Vec::new(),
            pending: None,
        })
    }

    /// Checks everything [`Engine::load`] would with these arguments but
    /// the devices' memory, allocating nothing on them: both files'
    /// metadata and their pairing (a drafter built for another target), the
    /// parameters, every tensor of the target and the drafter (presence,
    /// shape, a type the kernels can run, nothing unused) and the split
    /// policy at the devices' ratios. A program that runs a baseline before
    /// loading its drafter calls it first, so a wrong file is refused before
    /// any decoding.
    ///
    /// # Errors
    /// As [`Engine::load`], but for [`Error::OutOfMemory`].
    pub fn check(devices: &Devices, model: &Path, draft: &DraftModel, params: &EngineParams) -> Result<()> {
        let plan = Plan::new(model, draft, params)?;
        let kv_size = plan.kv_size(params.ctx_size)?;
        let kv = params.cache_types();
        let mut ctx = shardgraph::graph::Context::new();
        let ratios = devices.ratios();
        let info: TargetInfo = match &plan.arch {
            Arch::Qwen3 { hp, types } => {
                let m = Qwen3::new(&mut ctx, hp.clone(), types, kv, kv_size)?;
                check_tensors(&plan.file, &ctx, 0, "", "qwen3")?;
                (&m).into()
            }
            Arch::Qwen35 { hp, types } => {
                let m = Qwen35::new(&mut ctx, hp.clone(), types, kv, kv_size)?;
                check_tensors(&plan.file, &ctx, 0, "", "qwen35")?;
                (&m).into()
            }
        };
        if let Planned::Dflash(d) = &plan.draft {
            let start = ctx.len();
            Dflash::new(&mut ctx, info, d.hp.clone(), &d.types, kv, kv_size)?;
            check_tensors(&d.file, &ctx, start, "dft.", "dflash drafter")?;
        }
        match (&plan.arch, &plan.draft) {
            (Arch::Qwen3 { hp, types }, Planned::Dflash(d)) => {
                qwen3_dflash_policy(hp, types, &d.hp, &d.types, ratios).map(drop)
            }
            (Arch::Qwen35 { hp, types }, Planned::Dflash(d)) => {
                qwen35_dflash_policy(hp, types, &d.hp, &d.types, ratios).map(drop)
            }
            (Arch::Qwen3 { hp, types }, _) => qwen3_policy(hp, types, ratios).map(drop),
            (Arch::Qwen35 { hp, types }, _) => qwen35_policy(hp, types, ratios).map(drop),
        }
    }

    /// The largest `ctx_size` whose engine ([`Engine::load`] with these
    /// arguments) fits every device of `devices` (llama.cpp's `--fit on`,
    /// which it does not implement for `--split-mode tensor`): the caches'
    /// cells are the largest multiple of 256 whose weights, caches and worst
    /// steps — sized from shapes and plans, nothing allocated
    /// ([`super::fit::fit_ctx_size`]) — fit, with target steps of up to
    /// `n_batch` tokens (the longest prompt to decode at once; the smallest
    /// context tried holds one such batch, so a 300-token batch starts at
    /// 512 cells); the result is that minus the drafter's block, at most
    /// `params.ctx_size` (0: the target's training context).
    ///
    /// # Errors
    /// As [`Engine::load`] for the files and parameters;
    /// [`Error::OutOfMemory`] naming the device if even the smallest
    /// context does not fit; [`Error::Model`] for an `n_batch` below 1 or
    /// more than the largest context allowed holds, or no cell left after
    /// the drafter's block.
    pub fn fit_ctx_size(
        devices: &Devices,
        model: &Path,
        draft: &DraftModel,
        params: &EngineParams,
        n_batch: i64,
    ) -> Result<i64> {
        let plan = Plan::new(model, draft, params)?;
        let target = match &plan.arch {
            Arch::Qwen3 { hp, types } => FitTarget::Qwen3 { hp: hp.clone(), types: types.clone() },
            Arch::Qwen35 { hp, types } => FitTarget::Qwen35 { hp: hp.clone(), types: types.clone() },
        };
        let fit_draft = match &plan.draft {
            Planned::None => FitDraft::None,
            Planned::Dflash(d) => FitDraft::Dflash { hp: d.hp.clone(), types: d.types.clone() },
            Planned::Mtp => FitDraft::Mtp { n_max: plan.spec.n_max },
        };
        let spec = FitSpec {
            target,
            draft: fit_draft,
            cache_types: params.cache_types(),
            ratios: devices.ratios().to_vec(),
            mode: devices.split_mode(),
            groups: devices.groups(),
            n_batch,
            snapshot_slots: plan.snapshot_slots(),
            link: devices.link_model()?,
        };
        let bound = if params.ctx_size > 0 { params.ctx_size } else { spec.max_ctx() };
        let max_kv = bound.saturating_add(plan.extra).clamp(CTX_STEP, super::MAX_CTX);
        let kv = super::fit::fit_ctx_size(&spec, max_kv, &devices.executor()?)?;
        let ctx = (kv - plan.extra).min(bound);
        if ctx < 1 {
            return Err(Error::Model {
                detail: format!(
                    "engine: caches of {kv} cells leave no cell beyond the drafter's block of {}",
                    plan.extra
                ),
            });
        }
        Ok(ctx)
    }

    /// Generates `n_predict` tokens after `prompt` (token ids `[T]`) with
    /// the loaded drafter proposing and `sampler` choosing
    /// ([`super::speculative::generate_hooked`]): greedy (`temp` ≤ 0) output
    /// equals plain greedy decoding token for token; sampled output has
    /// plain sampling's distribution, and the same seed on the same devices
    /// draws the same tokens. The sequence continues from the earlier calls
    /// since the last [`Engine::reset`]: `prompt` follows the tokens the
    /// last call generated (a chat's next turn), and the result equals one
    /// generation over everything so far. `n_predict` 0 decodes the prompt
    /// and returns no token. The generation stops early after one of the
    /// file's end-of-generation tokens ([`Engine::eog_tokens`]), returned as
    /// its last token; [`Engine::generate_with`] takes stop tokens, a
    /// callback for every token as it is accepted, and logits.
    ///
    /// # Errors
    /// Before any decoding: [`Error::Model`] for an empty prompt, a token
    /// outside the vocabulary, or a prompt and `n_predict` that do not fit
    /// the context after the sequence so far ([`Engine::n_ctx`],
    /// [`Engine::n_past`]); the sampler's errors
    /// ([`SamplerParams::validate`]). Then decode and device errors (after
    /// which [`Engine::reset`] starts afresh).
    pub fn generate(&mut self, prompt: &[i32], n_predict: usize, sampler: &SamplerParams) -> Result<Generation> {
        self.generate_with(prompt, n_predict, sampler, GenerateOptions::default())
    }

    /// [`Engine::generate`] with `opts`: it also stops after a token of
    /// `opts.stop` (returned as its last token) — or not at the file's
    /// end-of-generation tokens with `opts.ignore_eos` —, calls
    /// `opts.on_token` with each token as it is accepted (the tokens of a
    /// verified batch one by one, in the order returned; false ends the
    /// generation after that token), and with `opts.logits` returns the
    /// target's logits of each token's step ([`Generation::logits`]). A
    /// generation that ends early leaves the sequence at its last token: the
    /// next call continues from there, as after a full one.
    ///
    /// # Errors
    /// As [`Engine::generate`]; [`Error::Model`] for a stop token outside the
    /// vocabulary.
    pub fn generate_with(
        &mut self,
        prompt: &[i32],
        n_predict: usize,
        sampler: &SamplerParams,
        opts: GenerateOptions<'_>,
    ) -> Result<Generation> {
        let mut sampler = Sampler::new(*sampler)?;
        if prompt.is_empty() {
            return Err(Error::Model {
                detail: "engine: an empty prompt (generation needs at least one token)".into(),
            });
        }
        let n_vocab = self.n_vocab();
        let outside =
            |v: &[i32]| v.iter().enumerate().find(|(_, &x)| x < 0 || i64::from(x) >= n_vocab).map(|(i, &x)| (i, x));
        if let Some((i, bad)) = outside(prompt) {
            return Err(Error::Model {
                detail: format!("engine: prompt token {i} is {bad}, outside the vocabulary of {n_vocab}"),
            });
        }
        if let Some((i, bad)) = outside(opts.stop) {
            return Err(Error::Model {
                detail: format!("engine: stop token {i} is {bad}, outside the vocabulary of {n_vocab}"),
            });
        }
        let n_past = self.n_past();
        let need = (n_past as u128) + prompt.len() as u128 + n_predict as u128;
        if need > self.ctx_size as u128 {
            let held = if n_past > 0 { format!(" ({n_past} in use already)") } else { String::new() };
            return Err(Error::Model {
                detail: format!(
                    "engine: a prompt of {} tokens and {n_predict} to generate need {need} cells in all{held}, more \
                     than the context of {} (ctx_size; reset the engine or load it with a larger one)",
                    prompt.len(),
                    self.ctx_size
                ),
            });
        }
        // The last call's final token goes in first: the target never decoded it.
        let full: Vec<i32> = self.pending.iter().copied().chain(prompt.iter().copied()).collect();
        let start = self.decoded();
        let eog: &[i32] = if opts.ignore_eos { &[] } else { &self.eog };
        let stop_at = |t: i32| eog.contains(&t) || opts.stop.contains(&t);
        let mut caller = opts.on_token;
        let mut tell = |t: i32| caller.as_mut().is_none_or(|f| f(t));
        let mut step_to = opts.on_step;
        let mut trace = |t: &StepTrace<'_>| {
            if let Some(f) = step_to.as_mut() {
                f(t)
            }
        };
        let mut hooks =
            Hooks { stop: Some(&stop_at), on_token: Some(&mut tell), logits: opts.logits, on_step: Some(&mut trace) };
        let (spec, s, h) = (self.spec, &mut sampler, &mut hooks);
        let g = match (&mut self.target, &mut self.draft) {
            (Target::Qwen3(t), Draft::None) => generate_hooked(t.as_mut(), &mut NoDraft, &full, n_predict, spec, s, h),
            (Target::Qwen3(t), Draft::Dflash(d)) => {
                generate_hooked(t.as_mut(), d.as_mut(), &full, n_predict, spec, s, h)
            }
            (Target::Qwen35(t), Draft::None) => generate_hooked(t.as_mut(), &mut NoDraft, &full, n_predict, spec, s, h),
            (Target::Qwen35(t), Draft::Dflash(d)) => {
                generate_hooked(t.as_mut(), d.as_mut(), &full, n_predict, spec, s, h)
            }
            (Target::Qwen35(t), Draft::Mtp(d)) => generate_hooked(t.as_mut(), d.as_mut(), &full, n_predict, spec, s, h),
            (Target::Qwen3(_), Draft::Mtp(_)) => {
                return Err(Error::Model { detail: "engine: an MTP drafter on a qwen3 target".into() })
            }
        }?;
        let tokens = g.tokens;
        // The target holds the prompt and every token generated but the last,
        // or the last too when a verified batch ended with it.
        let cached = self.decoded() - start - full.len() as i64;
        self.pending = match tokens.last() {
            Some(&last) if cached + 1 == tokens.len() as i64 => Some(last),
            _ if cached == tokens.len() as i64 => None,
            _ => {
                return Err(Error::Model {
                    detail: format!(
                        "engine: the target holds {cached} of the {} generated tokens after the prompt",
                        tokens.len()
                    ),
                })
            }
        };
        self.seq.extend(prompt);
        self.seq.extend(&tokens);
        Ok(Generation { tokens, stats: g.stats, logits: g.logits, end: g.end })
    }

    /// Rolls the sequence back to its first `n_past` tokens (llama.cpp's
    /// `llama_memory_seq_rm(mem, seq, n_past, -1)`), keeping them: the next
    /// [`Engine::generate`] continues after token `n_past − 1` as if
    /// nothing had come after it (greedy, it gives the tokens a fresh engine
    /// gives for the kept tokens followed by the new prompt). `n_past` 0 is
    /// [`Engine::reset`]; the current length does nothing.
    ///
    /// How: a `qwen3` target forgets its later cells (the mask hides them
    /// until later steps overwrite them), and so do a DFlash drafter's
    /// caches. A `qwen35` target's conv and recurrent states have absorbed
    /// every token and cannot be taken back to an arbitrary position (only
    /// into the last batch, which the speculative loop uses), so the engine
    /// starts it afresh and decodes the kept tokens again (a prefill of
    /// `n_past − 1` tokens, the drafter's `accept` seeing them as a prompt):
    /// the states then equal a fresh run's.
    ///
    /// # Errors
    /// [`Error::Model`] for `n_past` outside `0..=`[`Engine::n_past`];
    /// decode and device errors of the prefill.
    pub fn rollback(&mut self, n_past: i64) -> Result<()> {
        let now = self.n_past();
        if !(0..=now).contains(&n_past) {
            return Err(Error::Model { detail: format!("engine: cannot roll back to {n_past} of {now} positions") });
        }
        if n_past == now {
            return Ok(());
        }
        if n_past == 0 {
            return self.reset();
        }
        let mut seq = std::mem::take(&mut self.seq);
        seq.truncate(n_past as usize);
        let (keep, last) = (&seq[..seq.len() - 1], seq[seq.len() - 1]);
        match &mut self.target {
            // The target never decodes the last kept token before the next call.
            Target::Qwen3(s) => s.rollback(keep.len() as i64)?,
            Target::Qwen35(_) => {
                self.reset()?;
                if !keep.is_empty() {
                    self.prefill(keep)?;
                }
            }
        }
        self.seq = seq;
        self.pending = Some(last);
        Ok(())
    }

    /// Decodes `tokens` as a prompt from position 0 (target and drafter),
    /// the greedy token after it discarded.
    fn prefill(&mut self, tokens: &[i32]) -> Result<()> {
        let mut greedy = Sampler::new(SamplerParams::greedy())?;
        let (spec, s) = (self.spec, &mut greedy);
        match (&mut self.target, &mut self.draft) {
            (Target::Qwen3(t), Draft::None) => generate_with(t.as_mut(), &mut NoDraft, tokens, 0, spec, s),
            (Target::Qwen3(t), Draft::Dflash(d)) => generate_with(t.as_mut(), d.as_mut(), tokens, 0, spec, s),
            (Target::Qwen35(t), Draft::None) => generate_with(t.as_mut(), &mut NoDraft, tokens, 0, spec, s),
            (Target::Qwen35(t), Draft::Dflash(d)) => generate_with(t.as_mut(), d.as_mut(), tokens, 0, spec, s),
            (Target::Qwen35(t), Draft::Mtp(d)) => generate_with(t.as_mut(), d.as_mut(), tokens, 0, spec, s),
            (Target::Qwen3(_), Draft::Mtp(_)) => {
                return Err(Error::Model { detail: "engine: an MTP drafter on a qwen3 target".into() })
            }
        }?;
        Ok(())
    }

    /// The file's end-of-generation tokens (`tokenizer.ggml.eos_token_id`
    /// and `tokenizer.ggml.eot_token_id`, those inside the vocabulary): a
    /// generation stops after the first one it generates.
    pub fn eog_tokens(&self) -> &[i32] {
        &self.eog
    }

    /// The sequence so far: the prompts and generated tokens since the last
    /// [`Engine::reset`] (as [`Engine::rollback`] left them);
    /// [`Engine::n_past`] tokens.
    pub fn tokens(&self) -> &[i32] {
        &self.seq
    }

    /// Positions the target has decoded.
    fn decoded(&self) -> i64 {
        match &self.target {
            Target::Qwen3(s) => s.n_past(),
            Target::Qwen35(s) => s.n_past(),
        }
    }

    /// Forgets the sequence, as a new engine starts: no position in use,
    /// a `qwen35` target's recurrent states zero, the MTP drafter's pending
    /// hidden state zero (llama.cpp's `llama_memory_clear`). Caches are not
    /// cleared: later steps overwrite the cells and the masks hide them
    /// until then.
    ///
    /// # Errors
    /// Device errors writing the recurrent states.
    pub fn reset(&mut self) -> Result<()> {
        self.pending = None;
        self.seq.clear();
        match &mut self.target {
            Target::Qwen3(s) => s.rollback(0)?,
            Target::Qwen35(s) => {
                s.reset()?;
                if let Draft::Mtp(d) = &mut self.draft {
                    **d = MtpDrafter::new(s, self.p_min)?;
                }
            }
        }
        Ok(())
    }

    /// KV cells usable for prompts and generated tokens (`ctx_size`).
    pub fn n_ctx(&self) -> i64 {
        self.ctx_size
    }

    /// Cells of every cache: [`Engine::n_ctx`] plus the drafter's block
    /// (DFlash: `block_size`; MTP: `n_max + 1`; none: 0).
    pub fn kv_size(&self) -> i64 {
        self.kv_size
    }

    /// Cells of the context in use: the prompts and generated tokens since
    /// the last [`Engine::reset`] (the last generated token included,
    /// though the target decodes it with the next prompt).
    pub fn n_past(&self) -> i64 {
        self.decoded() + i64::from(self.pending.is_some())
    }

    /// The target's vocabulary size V (token ids are `0..V`).
    pub fn n_vocab(&self) -> i64 {
        match &self.target {
            Target::Qwen3(s) => s.model().hp.n_vocab,
            Target::Qwen35(s) => s.model().hp.n_vocab,
        }
    }

    /// The target's training context (`{arch}.context_length`).
    pub fn n_ctx_train(&self) -> i64 {
        match &self.target {
            Target::Qwen3(s) => s.model().hp.n_ctx_train,
            Target::Qwen35(s) => i64::from(s.model().hp.n_ctx_train),
        }
    }

    /// Bytes moved between devices by every run so far (target and
    /// drafter share one runner).
    pub fn bytes_moved(&self) -> u64 {
        match &self.target {
            Target::Qwen3(s) => s.runner().bytes_moved(),
            Target::Qwen35(s) => s.runner().bytes_moved(),
        }
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        match &self.target {
            Target::Qwen3(s) => s.runner().n_devices(),
            Target::Qwen35(s) => s.runner().n_devices(),
        }
    }

    /// The target's architecture: `"qwen3"` or `"qwen35"`.
    pub fn arch(&self) -> &str {
        match &self.target {
            Target::Qwen3(_) => "qwen3",
            Target::Qwen35(_) => "qwen35",
        }
    }

    /// The drafter: `"dflash2"`, `"dflash"`, `"mtp"` or `"none"`.
    pub fn draft_kind(&self) -> &str {
        self.kind
    }

    /// The draft limits in use (`n_max` resolved from the drafter's
    /// default and capped at a DFlash block; 0 and 0 without a drafter).
    pub fn spec_params(&self) -> SpecParams {
        self.spec
    }
}
