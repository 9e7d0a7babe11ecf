//! Sizing a session before it exists: the per-device memory of a model's
//! weights, caches and worst step graphs, computed from plans and shapes
//! (nothing is allocated), and the largest context (KV cells, in steps of
//! 256) whose session fits every device — llama.cpp's `--fit`, which it
//! does not implement for `--split-mode tensor`.
//!
//! * [`session_memory`]: a session's memory per device from its long-lived
//!   tensors and the step graphs it runs.
//! * [`FitSpec::memory`]: the same for a target (`qwen3`, `qwen35`) with an
//!   optional drafter (DFlash, DFlash2, MTP) at a given context size, over
//!   its worst steps (every step attends over the whole context).
//! * [`fit_ctx_size`]: the largest context of 256-cell steps that fits the
//!   devices of a [`MetaExecutor`], or [`Error::OutOfMemory`] naming the
//!   device when even 256 cells do not.

use super::dflash::{qwen35_dflash_policy, qwen3_dflash_policy, Dflash, DflashHparams};
use super::qwen3::{qwen3_policy, Qwen3, Qwen3Hparams};
use super::qwen35::{qwen35_policy, Qwen35, Qwen35Hparams};
use super::step::MAX_DRAFT;
use super::types::{KvTypes, TensorTypes};
use shardgraph::error::{Error, Result};
use shardgraph::graph::{Context, Graph};
use shardgraph::split::{
    local_ne, DeviceMemory, DeviceSet, LeafInfo, LinkModel, MetaExecutor, Planner, SplitMode, SplitPolicy, SplitState,
};
use shardgraph::tensor::GgmlType;
use std::collections::HashSet;

/// The context sizes [`fit_ctx_size`] chooses from are multiples of this
/// many KV cells (llama.cpp's KV padding).
pub const CTX_STEP: i64 = 256;

/// Per-device memory of a model session, before anything is allocated.
///
/// `ctx` holds the session's long-lived tensors first (its first
/// `base_len` tensors: weights and caches, placed on the devices in the
/// states `policy` gives them, mirrored where no rule matches, as
/// [`super::runner::Runner::place`] does) and the step graphs `steps`
/// built on top of them. Per device: `weights` and `caches` are the
/// long-lived tensors' parts (a cache is one some step writes, the rest
/// are weights); `inputs` the inputs of every step (a session keeps each
/// step's inputs placed); `compute` the largest compute peak of the steps
/// ([`shardgraph::split::Plan::memory`]: the executor's compute arena is shared
/// by its programs and grown to the largest). The plans come from
/// `planner`: a fresh one for a session not made yet, or a session's own
/// (taken with `std::mem::take(runner.planner_mut())`), which holds the
/// plans its runs used.
///
/// # Errors
/// [`Error::Model`] for `base_len` beyond the context; policy errors naming
/// a tensor; planning and compile errors of a step.
pub fn session_memory(
    ctx: &Context,
    base_len: usize,
    policy: &SplitPolicy,
    planner: &mut Planner,
    steps: &[&Graph],
) -> Result<Vec<DeviceMemory>> {
    if base_len > ctx.len() {
        return Err(Error::Model {
            detail: format!("session memory: {base_len} long-lived tensors in a context of {}", ctx.len()),
        });
    }
    let n = policy.n_devices();
    let mut out = vec![DeviceMemory::default(); n];
    let mut written = HashSet::new();
    for g in steps {
        let plan = planner.plan_for(ctx, g, policy)?;
        for (o, m) in out.iter_mut().zip(plan.memory(ctx, g)?) {
            o.inputs += m.inputs;
            o.compute = o.compute.max(m.compute);
        }
        for &id in g.nodes() {
            let t = ctx.tensor(id)?;
            if t.op.writes_through_view() {
                written.extend(t.view_src);
            }
        }
    }
    for id in ctx.ids().take(base_len) {
        let t = ctx.tensor(id)?;
        if t.view_src.is_some() {
            continue;
        }
        let st = policy.state_for(&LeafInfo { name: &t.name, ne: t.ne, ty: t.ty })?.unwrap_or(SplitState::Mirrored);
        for (j, m) in out.iter_mut().enumerate() {
            let b = part_bytes(t.ty, local_ne(t.ne, &st, j))?;
            if written.contains(&id) {
                m.caches += b;
            } else {
                m.weights += b;
            }
        }
    }
    Ok(out)
}

/// Bytes of a contiguous `ty` tensor of shape `ne`.
fn part_bytes(ty: GgmlType, ne: [i64; 4]) -> Result<u64> {
    let rows = (ne[1].max(0) as u64).saturating_mul(ne[2].max(0) as u64).saturating_mul(ne[3].max(0) as u64);
    // The executor allocates at least one byte for a part, an empty one (a
    // layer on another device) too (`Plan::memory` counts the same).
    Ok((ty.row_size(ne[0].max(0))? as u64).saturating_mul(rows).max(1))
}

/// The target model of a session to size.
#[derive(Clone, Debug)]
pub enum FitTarget {
    /// A `qwen3` dense target.
    Qwen3 {
        /// Hyper-parameters.
        hp: Qwen3Hparams,
        /// Weight types, per tensor (a file's: [`TensorTypes::from_file`]).
        types: TensorTypes,
    },
    /// A `qwen35` hybrid target (its NextN layer included when
    /// `hp.n_nextn > 0`).
    Qwen35 {
        /// Hyper-parameters.
        hp: Qwen35Hparams,
        /// Weight types, per tensor.
        types: TensorTypes,
    },
}

/// The drafter of a session to size.
// (Made once per sizing: the DFlash variant's size does not matter.)
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FitDraft {
    /// No drafter (plain decoding).
    None,
    /// A DFlash drafter (DFlash2 when `hp.conv`/`hp.selector` are set)
    /// with weights of the types `types` gives, attached to the target as
    /// [`super::dflash::DflashDrafter::attach`] does.
    Dflash {
        /// The drafter's hyper-parameters.
        hp: DflashHparams,
        /// Its weights' types, per tensor.
        types: TensorTypes,
    },
    /// The `qwen35` target's own MTP (NextN) head, drafting chains of up to
    /// `n_max` tokens ([`super::mtp::MtpDrafter`]).
    Mtp {
        /// Most tokens drafted per chain (`--spec-draft-n-max`).
        n_max: usize,
    },
}

/// A session to size for a context length: target, drafter, KV type,
/// devices and the largest batch its steps take.
#[derive(Clone, Debug)]
pub struct FitSpec {
    /// The target.
    pub target: FitTarget,
    /// The drafter.
    pub draft: FitDraft,
    /// KV cache types (K and V), the drafter's too.
    pub cache_types: KvTypes,
    /// Tensor split ratios, one per device (llama.cpp's `--tensor-split`).
    pub ratios: Vec<f32>,
    /// How the model is spread over the devices (llama.cpp's `--split-mode`;
    /// [`SplitMode::Layer`] sizes [`SplitPolicy::layer_split`]'s layout).
    pub mode: SplitMode,
    /// The device groups of [`SplitMode::Hybrid`]
    /// ([`shardgraph::split::Devices::groups`]); empty: one group of all.
    pub groups: Vec<DeviceSet>,
    /// The most tokens one target step takes (the prompt batch,
    /// `--ubatch-size`), at least 1; a verification batch of a drafter's
    /// block or chain counts too where it is larger.
    pub n_batch: i64,
    /// `qwen35` recurrent-state snapshot slots
    /// ([`super::qwen35::Qwen35Session::enable_snapshots`]); 0 for none.
    pub snapshot_slots: usize,
    /// The link model the runs' plans are priced with
    /// ([`shardgraph::split::Devices::link_model`]; the default within one
    /// process), so the fit sizes the plans the runs make.
    pub link: LinkModel,
}

impl FitSpec {
    /// The policy for this spec's target and drafter.
    fn policy(&self, model: &Built) -> Result<SplitPolicy> {
        let r = &self.ratios;
        match self.mode {
            SplitMode::Layer => SplitPolicy::layer_split(r, self.n_layer()),
            SplitMode::Hybrid => {
                let all = [DeviceSet::all(r.len())];
                let groups = if self.groups.is_empty() { &all[..] } else { &self.groups[..] };
                SplitPolicy::hybrid(r, groups, self.n_layer(), &|r| self.tensor_policy(model, r))
            }
            SplitMode::Tensor => self.tensor_policy(model, r),
        }
    }

    /// The tensor-split policy for this spec's target and drafter at `r`.
    fn tensor_policy(&self, model: &Built, r: &[f32]) -> Result<SplitPolicy> {
        match (&self.target, &self.draft, &model.dflash) {
            (FitTarget::Qwen3 { hp, types }, FitDraft::Dflash { types: dt, .. }, Some(d)) => {
                qwen3_dflash_policy(hp, types, &d.hp, dt, r)
            }
            (FitTarget::Qwen35 { hp, types }, FitDraft::Dflash { types: dt, .. }, Some(d)) => {
                qwen35_dflash_policy(hp, types, &d.hp, dt, r)
            }
            (FitTarget::Qwen3 { hp, types }, _, _) => qwen3_policy(hp, types, r),
            (FitTarget::Qwen35 { hp, types }, _, _) => qwen35_policy(hp, types, r),
        }
    }

    /// The most cells this spec may have: the target's training context.
    pub fn max_ctx(&self) -> i64 {
        match &self.target {
            FitTarget::Qwen3 { hp, .. } => hp.n_ctx_train,
            FitTarget::Qwen35 { hp, .. } => i64::from(hp.n_ctx_train),
        }
    }

    /// Per-device memory of this session with a KV cache of `kv_size`
    /// cells (the drafter's caches as many), from shapes and plans only:
    /// the target's and drafter's weights and caches, and the worst steps
    /// as [`session_memory`] counts them — each attending over all
    /// `kv_size` cells: a target step of `max(n_batch, verification
    /// batch)` tokens with the drafter's taps; for DFlash a block step and
    /// an injection of `n_batch` rows; for MTP a step of `n_batch` rows and
    /// a chain of `n_max`.
    ///
    /// # Errors
    /// [`Error::Model`] for a `kv_size` outside `1..=`[`super::MAX_CTX`], an
    /// `n_batch` outside `1..=kv_size`, an MTP `n_max` outside
    /// `1..=`[`MAX_DRAFT`], more than `MAX_DRAFT + 1` snapshot slots, MTP on a target
    /// without a NextN layer or on `qwen3`, or snapshots on `qwen3`; the
    /// models' and policies' errors; planning errors.
    pub fn memory(&self, kv_size: i64) -> Result<Vec<DeviceMemory>> {
        super::check_kv_size("fit", kv_size)?;
        if !(1..=kv_size).contains(&self.n_batch) {
            return Err(Error::Model {
                detail: format!("fit: batches of {} tokens in a context of {kv_size} cells", self.n_batch),
            });
        }
        match self.draft {
            FitDraft::Mtp { n_max } if !(1..=MAX_DRAFT).contains(&n_max) => {
                return Err(Error::Model { detail: format!("fit: MTP chains of {n_max} drafts (1 to {MAX_DRAFT})") });
            }
            _ => {}
        }
        if self.snapshot_slots > MAX_DRAFT + 1 {
            return Err(Error::Model {
                detail: format!("fit: {} snapshot slots (at most {})", self.snapshot_slots, MAX_DRAFT + 1),
            });
        }
        let mut ctx = Context::new();
        let model = self.build(&mut ctx, kv_size)?;
        let policy = self.policy(&model)?;
        let base_len = ctx.len();
        let graphs = self.worst_steps(&mut ctx, &model, kv_size)?;
        let refs: Vec<&Graph> = graphs.iter().collect();
        session_memory(&ctx, base_len, &policy, &mut Planner::new(self.link), &refs)
    }

    /// The long-lived tensors of target and drafter in `ctx`.
    fn build(&self, ctx: &mut Context, kv_size: i64) -> Result<Built> {
        let kv = self.cache_types;
        let (target, info) = match &self.target {
            FitTarget::Qwen3 { hp, types } => {
                if self.snapshot_slots > 0 {
                    return Err(Error::Model { detail: "fit: recurrent-state snapshots need a qwen35 target".into() });
                }
                let m = Qwen3::new(ctx, hp.clone(), types, kv, kv_size)?;
                let info = super::dflash::TargetInfo::from(&m);
                (Target::Qwen3(m), info)
            }
            FitTarget::Qwen35 { hp, types } => {
                let mut m = Qwen35::new(ctx, hp.clone(), types, kv, kv_size)?;
                if self.snapshot_slots > 0 {
                    m.add_snapshots(ctx, self.snapshot_slots)?;
                }
                let info = super::dflash::TargetInfo::from(&m);
                (Target::Qwen35(Box::new(m)), info)
            }
        };
        let dflash = match &self.draft {
            FitDraft::Dflash { hp, types } => Some(Dflash::new(ctx, info, hp.clone(), types, kv, kv_size)?),
            FitDraft::Mtp { .. } => match &target {
                Target::Qwen35(m) if m.nextn.is_some() => None,
                _ => {
                    return Err(Error::Model {
                        detail: "fit: an MTP drafter needs a qwen35 target with a NextN layer".into(),
                    })
                }
            },
            FitDraft::None => None,
        };
        Ok(Built { target, dflash })
    }

    /// The worst step graphs (see [`FitSpec::memory`]), built on top of the
    /// long-lived tensors.
    fn worst_steps(&self, ctx: &mut Context, model: &Built, n_kv: i64) -> Result<Vec<Graph>> {
        let (verify, taps) = match (&self.draft, &model.dflash) {
            (FitDraft::Dflash { .. }, Some(d)) => (d.hp.block_size as i64, d.hp.target_layers.clone()),
            (FitDraft::Mtp { n_max }, _) => (*n_max as i64 + 1, vec![self.n_layer()]),
            _ => (1, Vec::new()),
        };
        let t = self.n_batch.max(verify);
        let mut graphs = Vec::new();
        match &model.target {
            Target::Qwen3(m) => {
                let s = m.build_window(ctx, t, n_kv, &taps)?;
                let mut outs = s.writes.clone();
                outs.extend(s.taps.iter().map(|x| x.1));
                outs.extend([s.logits, s.argmax]);
                graphs.push(ctx.build_forward(&outs)?);
            }
            Target::Qwen35(m) => {
                let s = m.build_window(ctx, t, n_kv, &taps)?;
                let mut outs = s.writes.clone();
                outs.extend(s.taps.iter().map(|x| x.1));
                outs.extend([s.logits, s.argmax]);
                graphs.push(ctx.build_forward(&outs)?);
                if let FitDraft::Mtp { n_max } = self.draft {
                    let st = m.build_mtp_window(ctx, self.n_batch, n_kv)?;
                    let mut outs = st.writes.clone();
                    outs.extend([st.h_out, st.argmax, st.top_prob]);
                    graphs.push(ctx.build_forward(&outs)?);
                    if n_max > 0 {
                        let c = m.build_mtp_chain_window(ctx, n_max, n_kv)?;
                        let mut outs = c.writes.clone();
                        outs.extend(c.steps.iter().flat_map(|s| [s.argmax, s.top_prob]));
                        graphs.push(ctx.build_forward(&outs)?);
                    }
                }
            }
        }
        if let Some(d) = &model.dflash {
            let b = d.build_block_window(ctx, d.hp.block_size as i64, n_kv)?;
            let mut outs = b.writes.clone();
            outs.push(b.lattice.unwrap_or(b.argmax));
            if b.lattice.is_none() {
                outs.push(b.top_prob);
            }
            graphs.push(ctx.build_forward(&outs)?);
            let inj = d.build_inject(ctx, self.n_batch)?;
            graphs.push(ctx.build_forward(&inj.writes)?);
        }
        Ok(graphs)
    }

    fn n_layer(&self) -> usize {
        match &self.target {
            FitTarget::Qwen3 { hp, .. } => hp.n_layer,
            FitTarget::Qwen35 { hp, .. } => hp.n_layer,
        }
    }
}

/// A spec's models in a context.
enum Target {
    Qwen3(Qwen3),
    Qwen35(Box<Qwen35>),
}

struct Built {
    target: Target,
    dflash: Option<Dflash>,
}

/// The largest context size — a multiple of [`CTX_STEP`] (256) cells, at
/// least one step and enough for a batch of `spec.n_batch` tokens, and at
/// most `max_ctx` (the requested `--ctx-size`, or
/// [`FitSpec::max_ctx`], the training context; never above
/// [`super::MAX_CTX`]) — whose session
/// ([`FitSpec::memory`]) fits every device of `exec`, as
/// [`MetaExecutor::check_fit`] checks it (a GPU against its memory, CPU
/// devices together against the host's available memory). Nothing is
/// allocated: each candidate is sized from shapes and plans, by bisection
/// (memory grows with the context).
///
/// # Errors
/// [`Error::OutOfMemory`] naming the device, the bytes needed and
/// available, if even the smallest context does not fit; [`Error::Model`]
/// for a `max_ctx` below 256 or below what one batch needs, or a spec for
/// another number of devices than `exec` has; [`Error::Split`] for a spec
/// whose ratios are not `exec`'s ([`MetaExecutor::check_ratios`]); as
/// [`FitSpec::memory`].
pub fn fit_ctx_size(spec: &FitSpec, max_ctx: i64, exec: &MetaExecutor) -> Result<i64> {
    if spec.ratios.len() != exec.n_devices() {
        return Err(Error::Model {
            detail: format!("fit: tensor split over {} devices for {} devices", spec.ratios.len(), exec.n_devices()),
        });
    }
    exec.check_ratios(&spec.ratios, "the fit spec")?;
    if max_ctx < CTX_STEP {
        return Err(Error::Model {
            detail: format!("fit: a largest context of {max_ctx} cells (at least {CTX_STEP})"),
        });
    }
    let check = |k: i64| -> Result<()> {
        let cells = k * CTX_STEP;
        exec.check_fit(&spec.memory(cells)?, &format!("weights, caches and compute of a context of {cells} cells"))
    };
    // No cache is larger than MAX_CTX cells (32-bit positions).
    let max_ctx = max_ctx.min(super::MAX_CTX);
    // The smallest context holds one batch of `n_batch` tokens (a prompt of
    // 300 tokens needs 512 cells).
    let first = spec.n_batch.max(1).saturating_add(CTX_STEP - 1) / CTX_STEP;
    if first * CTX_STEP > max_ctx {
        return Err(Error::Model {
            detail: format!(
                "fit: a batch of {} tokens needs a context of {} cells, more than the largest allowed, {max_ctx}",
                spec.n_batch,
                first * CTX_STEP
            ),
        });
    }
    // k·256 cells fit for k ≤ lo; the smallest must fit or its error is the answer.
    check(first)?;
    let (mut lo, mut hi) = (first, max_ctx / CTX_STEP + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match check(mid) {
            Ok(()) => lo = mid,
            Err(Error::OutOfMemory { .. }) => hi = mid,
            Err(e) => return Err(e),
        }
    }
    Ok(lo * CTX_STEP)
}
