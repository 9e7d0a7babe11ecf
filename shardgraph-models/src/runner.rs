//! Running per-step graphs on N devices: weights and caches stay placed in a
//! [`SplitStore`]; each step's graph is built once and kept (the
//! crate's graph cache), planned (cached by structure, so a repeated decode
//! step does not re-plan), its inputs written, and executed. Below every
//! model: it knows graphs, policies and devices, not models.

use shardgraph::error::Result;
use shardgraph::graph::{Context, Graph};
use shardgraph::split::{Devices, LeafInfo, MetaExecutor, Planner, RunReport, SplitPolicy, SplitState, SplitStore};
use shardgraph::tensor::TensorId;

/// N devices with a split policy, a plan cache and device-resident storage:
/// what a model session runs its steps on.
///
/// Made by [`Runner::new`] over [`Devices`] (CPU instances, GPUs, virtual
/// devices on one GPU). Its parts are read through [`Runner::policy`],
/// [`Runner::planner`], [`Runner::store`], [`Runner::exec`] and
/// [`Runner::bytes_moved`] (with [`Runner::bytes_planned`], what the plans
/// of the same runs say they move); [`Runner::store_mut`] writes tensors and
/// [`Runner::planner_mut`] replaces or takes the planner.
#[derive(Debug)]
pub struct Runner {
    /// The executor (one backend per device).
    exec: MetaExecutor,
    /// Plans, cached by graph structure and leaf states.
    planner: Planner,
    /// Leaf split states.
    policy: SplitPolicy,
    /// Weights, caches and inputs on the devices.
    store: SplitStore,
    /// Bytes moved by all runs so far.
    bytes_moved: u64,
    /// The plans' bytes (`Plan::total_bytes`) of all runs so far.
    bytes_planned: u64,
    /// The plans' collectives and bytes per link class (`Plan::by_link`).
    planned_by_link: [(u64, u64); 3],
    /// The last graph run and the store it ran on (its leafs are placed).
    placed: Option<(u64, u32, u64, (u64, u64))>,
    /// Step graphs kept for reuse (the models' decode, draft and verify steps).
    pub(crate) graphs: GraphCache,
}

impl Runner {
    /// A runner over `devices` (their backends, communicator and threads;
    /// the executor is [`Devices::executor`]) with `policy` for the leaf
    /// states, e.g. `devices.policy()?` with the model's rules added, or a
    /// model's policy at `devices.ratios()`.
    ///
    /// # Errors
    /// [`shardgraph::Error::Split`] if `policy.n_devices()` is not
    /// `devices.n_devices()`, or its ratios are not the devices' (the
    /// devices are the one source of the tensor split:
    /// [`Devices::check_ratios`]); as [`Devices::executor`].
    pub fn new(policy: SplitPolicy, devices: &Devices) -> Result<Self> {
        if policy.n_devices() != devices.n_devices() {
            return Err(shardgraph::Error::Split {
                detail: format!(
                    "a split policy over {} devices for {} devices ({})",
                    policy.n_devices(),
                    devices.n_devices(),
                    devices.names().join(", ")
                ),
            });
        }
        devices.check_ratios(policy.ratios(), "the split policy")?;
        let n = devices.n_devices();
        Ok(Runner {
            exec: devices.executor()?,
            planner: Planner::new(devices.link_model()?).with_links(devices.links()?),
            policy,
            store: SplitStore::new(n),
            bytes_moved: 0,
            bytes_planned: 0,
            planned_by_link: [(0, 0); 3],
            placed: None,
            graphs: GraphCache::default(),
        })
    }

    /// The split policy: the leaf states of weights, caches and inputs.
    pub fn policy(&self) -> &SplitPolicy {
        &self.policy
    }

    /// Replaces the policy (a drafter's rules added to its target's), before
    /// the new tensors it covers are placed; the tensors placed already keep
    /// their states.
    pub(crate) fn set_policy(&mut self, policy: SplitPolicy) {
        self.policy = policy;
    }

    /// The planner and its cached plans (one per step graph and policy).
    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    /// The planner, to replace it (another link model) before the first
    /// step is planned, or to take it with its plans
    /// (`fit::session_memory` sizes them).
    pub fn planner_mut(&mut self) -> &mut Planner {
        &mut self.planner
    }

    /// The device-resident storage of weights, caches and inputs (read a
    /// tensor's single-device bytes with `store().get_tensor`).
    pub fn store(&self) -> &SplitStore {
        &self.store
    }

    /// The storage, to write a tensor's single-device bytes (`set_tensor`).
    pub fn store_mut(&mut self) -> &mut SplitStore {
        &mut self.store
    }

    /// The executor (its devices, and counters of what it allocated and
    /// copied: `exec().counters()`).
    pub fn exec(&self) -> &MetaExecutor {
        &self.exec
    }

    /// Bytes moved between devices by all runs so far (what the
    /// communicator delivered).
    pub fn bytes_moved(&self) -> u64 {
        self.bytes_moved
    }

    /// Bytes the plans of all runs so far say they move (the sum of each
    /// run's `Plan::total_bytes`): equal to [`Runner::bytes_moved`] when
    /// every run moved exactly its plan's bytes (no conversion the plan
    /// lacked).
    pub fn bytes_planned(&self) -> u64 {
        self.bytes_planned
    }

    /// The collectives and bytes of all runs' plans so far by the slowest
    /// link each crosses ([`shardgraph::split::LinkClass::ALL`] order: same process, same
    /// node, other node; `Plan::by_link`): where a run's bytes travel when
    /// its devices span processes or machines.
    pub fn planned_by_link(&self) -> [(u64, u64); 3] {
        self.planned_by_link
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        self.exec.n_devices()
    }

    /// Places long-lived tensor `id` (a weight or cache) on the devices in
    /// the state the policy gives it (mirrored if no rule matches), zero-filled.
    ///
    /// # Errors
    /// Policy errors naming the tensor and rule; placement errors.
    pub fn place(&mut self, ctx: &Context, id: TensorId) -> Result<()> {
        let t = ctx.tensor(id)?;
        let st =
            self.policy.state_for(&LeafInfo { name: &t.name, ne: t.ne, ty: t.ty })?.unwrap_or(SplitState::Mirrored);
        self.store.place(ctx, id, &st)
    }

    /// Moves everything the store holds onto the devices now (weights
    /// copied once, caches allocated zero-filled), as a model load does, so
    /// the first step does not pay for it.
    ///
    /// # Errors
    /// Allocation and copy errors.
    pub fn upload(&mut self) -> Result<()> {
        self.exec.upload(&mut self.store)
    }

    /// Places the long-lived tensors `ids` (weights and caches) as
    /// [`Runner::place`] does, after checking that every device can hold
    /// them with what it holds already — before anything is allocated.
    /// `what` names them in the error ("qwen3 weights and KV caches of 65536
    /// cells").
    ///
    /// # Errors
    /// [`shardgraph::Error::OutOfMemory`] naming the device and the bytes needed
    /// and available; policy and placement errors as [`Runner::place`].
    pub fn place_all(&mut self, ctx: &Context, ids: &[TensorId], what: &str) -> Result<()> {
        let n = self.n_devices();
        let mut need = self.store.bytes_per_device();
        let mut states = Vec::with_capacity(ids.len());
        for &id in ids {
            let t = ctx.tensor(id)?;
            let st =
                self.policy.state_for(&LeafInfo { name: &t.name, ne: t.ne, ty: t.ty })?.unwrap_or(SplitState::Mirrored);
            for (j, b) in need.iter_mut().enumerate().take(n) {
                let ne = shardgraph::split::local_ne(t.ne, &st, j);
                let rows = (ne[1] * ne[2] * ne[3]).max(0) as u64;
                *b = b.saturating_add((t.ty.row_size(ne[0])? as u64).saturating_mul(rows));
            }
            states.push(st);
        }
        self.exec.check_memory(&need, what)?;
        for (&id, st) in ids.iter().zip(&states) {
            self.store.place(ctx, id, st)?;
        }
        Ok(())
    }

    /// Plans (or reuses the plan of) `graph`, places leafs that are not
    /// placed yet, writes `inputs` (full single-device bytes per tensor) and
    /// runs it; returns the outputs' single-device bytes, types and shapes
    /// (aligned with `outputs`; read them with `rep.f32(k)`, `rep.i32(k)`). Outputs that are
    /// writes into stored tensors (`cpy`/`set_rows` into a cache, listed so
    /// the graph orders them) are not read back: their entries are empty,
    /// and the caches stay where the devices keep them (read them with
    /// `store().get_tensor`).
    ///
    /// # Errors
    /// Planning, placement and execution errors.
    pub fn run(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        inputs: &[(TensorId, Vec<u8>)],
        outputs: &[TensorId],
    ) -> Result<RunReport> {
        // Disjoint borrows: the cached plan is used in place, not copied per step.
        let Runner { exec, planner, policy, store, placed, bytes_planned, planned_by_link, .. } = self;
        let plan = planner.plan_for(ctx, graph, policy)?;
        let (planned, by_link) = (plan.total_bytes(), plan.by_link());
        // New leafs (a step's inputs) are placed before they are written;
        // a graph placed before in an unchanged store needs no check.
        let now = (graph.hash(), ctx.id(), ctx.generation(), store.binding_key());
        if *placed != Some(now) {
            store.place_leafs(ctx, graph, plan)?;
        }
        for (id, bytes) in inputs {
            store.set_tensor(ctx, *id, 0, bytes)?;
        }
        let is_write = |o: &TensorId| {
            ctx.tensor(*o).is_ok_and(|t| {
                t.op.writes_through_view() && t.view_src.is_some_and(|v| ctx.tensor(v).is_ok_and(|s| s.op.is_leaf()))
            })
        };
        let wanted: Vec<TensorId> = outputs.iter().filter(|o| !is_write(o)).copied().collect();
        let mut rep = exec.execute(ctx, graph, plan, store, &wanted)?;
        *bytes_planned += planned;
        for (sum, (k, b)) in planned_by_link.iter_mut().zip(by_link) {
            *sum = (sum.0 + k, sum.1 + b);
        }
        *placed = Some((graph.hash(), ctx.id(), ctx.generation(), store.binding_key()));
        // Aligned with `outputs`: a write into a stored tensor has no bytes,
        // and its own type and shape.
        let mut got = std::mem::take(&mut rep.outputs).into_iter();
        for &o in outputs {
            let t = ctx.tensor(o)?;
            let unread = || shardgraph::split::RunOutput {
                id: o,
                name: ctx.display_name(o),
                ty: t.ty,
                ne: t.ne,
                bytes: Vec::new(),
            };
            let out = if is_write(&o) { unread() } else { got.next().unwrap_or_else(unread) };
            rep.outputs.push(out);
        }
        self.bytes_moved += rep.bytes_moved;
        Ok(rep)
    }
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
    pub graph: Graph,
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
    /// `build`'s errors; [`shardgraph::Error::Graph`] for no outputs.
    pub(crate) fn get_or_build<K, S>(
        &mut self,
        ctx: &mut Context,
        base_len: usize,
        key: K,
        build: impl FnOnce(&mut Context) -> Result<(S, Vec<TensorId>)>,
    ) -> Result<std::sync::Arc<StepGraph<K, S>>>
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
