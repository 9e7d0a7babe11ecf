//! Running per-step graphs on N devices: weights and caches stay placed in a
//! [`SplitStore`]; each step's graph is planned (cached by structure, so a
//! repeated decode step does not re-plan), its inputs written, and executed.

use shardgraph::error::Result;
use shardgraph::graph::{Context, Graph};
use shardgraph::split::{
    Devices, LeafInfo, LinkModel, MetaExecutor, Planner, RunReport, SplitPolicy, SplitState, SplitStore,
};
use shardgraph::tensor::TensorId;

/// N devices (CPU instances unless [`Runner::set_backends`] says otherwise)
/// with a split policy, a plan cache and device-resident storage.
#[derive(Debug)]
pub struct Runner {
    /// The executor (one backend per device).
    pub exec: MetaExecutor,
    /// Plans, cached by graph structure and leaf states.
    pub planner: Planner,
    /// Leaf split states.
    pub policy: SplitPolicy,
    /// Weights, caches and inputs on the devices.
    pub store: SplitStore,
    /// Bytes moved by all runs so far.
    pub bytes_moved: u64,
    /// Graph runs so far.
    pub runs: u64,
    /// The last graph run and the store it ran on (its leafs are placed).
    placed: Option<(u64, u32, u64, (u64, u64))>,
    /// Step graphs kept for reuse (the models' decode, draft and verify steps).
    pub(crate) graphs: super::GraphCache,
}

impl Runner {
    /// A runner over `policy.n_devices()` CPU devices with `threads` worker
    /// threads each.
    ///
    /// # Errors
    /// As [`Devices::cpu`] (a device count outside 1..=64, a thread count
    /// of 0 or over 1024 in all).
    pub fn new(policy: SplitPolicy, threads: usize) -> Result<Self> {
        let devices = Devices::cpu(policy.n_devices(), threads)?;
        Self::with_devices(policy, &devices)
    }

    /// A runner over `devices` (their backends, communicator and threads;
    /// the executor is [`Devices::executor`]) with `policy` for the leaf
    /// states, e.g. `devices.policy()?` with the model's rules added.
    ///
    /// # Errors
    /// [`shardgraph::Error::Split`] if `policy.n_devices()` is not
    /// `devices.n_devices()`; as [`Devices::executor`].
    pub fn with_devices(policy: SplitPolicy, devices: &Devices) -> Result<Self> {
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
        let n = devices.n_devices();
        Ok(Runner {
            exec: devices.executor()?,
            planner: Planner::new(LinkModel::default()),
            policy,
            store: SplitStore::new(n),
            bytes_moved: 0,
            runs: 0,
            placed: None,
            graphs: super::GraphCache::default(),
        })
    }

    /// Runs on `devices` from now on (CUDA devices, virtual devices on one
    /// GPU, CPU instances), one per rank of the policy. Weights and caches
    /// already placed are copied onto the new devices now.
    ///
    /// # Errors
    /// [`shardgraph::Error::Split`] if the number of devices is not the policy's.
    pub fn set_backends(&mut self, devices: Vec<std::sync::Arc<dyn shardgraph::backend::Backend>>) -> Result<()> {
        if devices.len() != self.policy.n_devices() {
            return Err(shardgraph::Error::Split {
                detail: format!("{} devices for a policy over {}", devices.len(), self.policy.n_devices()),
            });
        }
        self.exec = Devices::from_backends(devices).and_then(|d| d.executor())?;
        // What the store held on the old devices moves now, not at the first step.
        self.upload()
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
    /// `store.get_tensor`).
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
        let Runner { exec, planner, policy, store, placed, .. } = self;
        let plan = planner.plan_for(ctx, graph, policy)?;
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
        *placed = Some((graph.hash(), ctx.id(), ctx.generation(), store.binding_key()));
        // Aligned with `outputs`: a write into a stored tensor has no bytes,
        // and its own type and shape.
        let mut got = std::mem::take(&mut rep.outputs)
            .into_iter()
            .zip(std::mem::take(&mut rep.output_types))
            .zip(std::mem::take(&mut rep.output_ne));
        for &o in outputs {
            let t = ctx.tensor(o)?;
            let ((bytes, ty), ne) = if is_write(&o) {
                ((Vec::new(), t.ty), t.ne)
            } else {
                got.next().unwrap_or(((Vec::new(), t.ty), t.ne))
            };
            rep.outputs.push(bytes);
            rep.output_types.push(ty);
            rep.output_ne.push(ne);
        }
        self.bytes_moved += rep.bytes_moved;
        self.runs += 1;
        Ok(rep)
    }
}
