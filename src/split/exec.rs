//! The executor of lowered plans on N devices: N separate backend instances
//! (CPU instances by default; CUDA devices, or virtual devices on one GPU,
//! through [`MetaExecutor::with_backends`]). Every device runs on its own thread and walks the same
//! [`Step`] list: a `Compute` step builds and runs one local graph over the
//! device's parts (its subgraph), collectives go through a [`Comm`] (the
//! generic [`HostComm`] by default), and distributed per-row ops exchange a
//! few values per row. Bytes the communicator moves are counted, so a run
//! can be checked against its plan.
//!
//! Local data is kept contiguous in each tensor's logical order; views are
//! materialised where a subgraph hands them on. On GPUs (see
//! [`MetaExecutor::set_device_data`]) a device's parts stay in its buffers:
//! subgraph results, conversions (packed, moved and summed by
//! `devcomm`), and writes into stored tensors (a cache stays on the device
//! for the next run); host code reads a part only where it needs the values
//! (per-row combines, vocabulary-parallel `get_rows`, outputs).

use super::comm::{BufSlice, Comm, HostComm};
use super::layout::{assemble, local_ne, slice_local};
use super::lower::{covers_owner, lower, Lowered, Step};
use super::planner::Plan;
use super::state::SplitState;
pub(crate) use super::store::Part;
use super::store::{SplitStore, Stored};
use crate::backend::cpu::{CpuBackend, CpuConfig};
use crate::backend::{Backend, TensorStorage};
use crate::error::{Error, Result};
use crate::graph::alloc::GraphAllocator;
use crate::graph::{Context, Graph};
use crate::ops::Op;
use crate::tensor::{contiguous_strides, GgmlType, Tensor, TensorId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// N devices that execute plans.
pub struct MetaExecutor {
    devices: Vec<Arc<dyn Backend>>,
    /// Per device: leaf parts kept in device buffers between runs (weights),
    /// keyed by tensor and state, valid for one stored version.
    resident: Vec<std::sync::Mutex<Resident>>,
    /// Per device: the allocator of its local graphs' intermediates, kept
    /// between graphs and runs so its buffers (grown to the largest graph)
    /// are reused instead of allocated and zero-filled for every graph.
    allocators: Vec<std::sync::Mutex<GraphAllocator>>,
    /// Keep activations in device buffers between steps.
    device_data: bool,
    /// The communicator every run uses (NCCL across GPUs); `None`: a fresh
    /// [`HostComm`] per run. Locked for the length of a run.
    comm: std::sync::Mutex<Option<Arc<dyn Comm>>>,
    /// Per device: a process-unique id (device parts in a store are only
    /// used in place by the device that made them).
    ids: Vec<u64>,
}

/// Device-resident leaf parts: (tensor, state) → (stored version, buffer).
type Resident = HashMap<(TensorId, SplitState), (u64, Arc<dyn crate::backend::Buffer>)>;

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// The requested outputs' full contiguous bytes, in logical element
    /// order, exactly what one device would hold.
    pub outputs: Vec<Vec<u8>>,
    /// Bytes the communicator delivered, all devices together.
    pub bytes_moved: u64,
    /// Of those, bytes of conversions the plan did not contain (a NaN row
    /// in a distributed argmax, a write through a partial view, a store
    /// kept in another state than planned); 0 for plans of ordinary graphs.
    pub unplanned_bytes: u64,
    /// Number of per-device subgraphs run (per device).
    pub subgraphs: usize,
    /// Conversions (collectives) run between device buffers, without host
    /// copies (per device; see [`MetaExecutor::set_device_data`]).
    pub device_conversions: usize,
}

impl std::fmt::Debug for MetaExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.devices.iter().map(|d| d.device().name).collect();
        f.debug_struct("MetaExecutor").field("devices", &names).finish()
    }
}

impl MetaExecutor {
    /// `n` CPU devices with `threads` worker threads each.
    ///
    /// # Errors
    /// [`Error::Split`] for `n == 0` or `n > 64`; backend creation errors.
    pub fn new(n: usize, threads: usize) -> Result<Self> {
        if n == 0 || n > 64 {
            return Err(Error::Split { detail: format!("{n} devices: need 1..=64") });
        }
        if n.saturating_mul(threads.max(1)) > 1024 {
            return Err(Error::Split {
                detail: format!("{n} devices × {threads} threads: at most 1024 worker threads in all"),
            });
        }
        let devices = (0..n)
            .map(|_| {
                CpuBackend::new(CpuConfig { n_threads: threads, ..CpuConfig::default() })
                    .map(|b| Arc::new(b) as Arc<dyn Backend>)
            })
            .collect::<Result<_>>()?;
        Self::with_backends(devices)
    }

    /// An executor over the given devices, one per rank, in plan order
    /// (device `j` runs rank `j`'s part): CUDA devices, virtual devices on
    /// one GPU, CPU instances, or a mix. Leaf parts stay resident in each
    /// device's buffers between runs; activations stay in device buffers
    /// when every device is a GPU (see [`MetaExecutor::set_device_data`]).
    ///
    /// # Errors
    /// [`Error::Split`] for no devices or more than 64.
    pub fn with_backends(devices: Vec<Arc<dyn Backend>>) -> Result<Self> {
        let n = devices.len();
        if n == 0 || n > 64 {
            return Err(Error::Split { detail: format!("{n} devices: need 1..=64") });
        }
        let resident = (0..n).map(|_| std::sync::Mutex::new(HashMap::new())).collect();
        let allocators = devices.iter().map(|d| std::sync::Mutex::new(GraphAllocator::new(d.buffer_type()))).collect();
        let device_data = devices.iter().all(|d| d.device().kind == crate::backend::DeviceKind::Gpu);
        let comm = std::sync::Mutex::new(Self::native_comm(&devices));
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let ids = (0..n).map(|_| NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)).collect();
        Ok(MetaExecutor { devices, resident, allocators, device_data, comm, ids })
    }

    /// NCCL for CUDA devices on distinct GPUs, when it loads; else `None`
    /// (the runs use [`HostComm`]: device-to-device copies).
    fn native_comm(devices: &[Arc<dyn Backend>]) -> Option<Arc<dyn Comm>> {
        #[cfg(feature = "cuda")]
        if devices.len() > 1 && devices.iter().all(|d| d.device().kind == crate::backend::DeviceKind::Gpu) {
            match crate::backend::cuda::nccl::NcclComm::for_backends(devices) {
                Ok(c) => return Some(Arc::new(c)),
                Err(e) => log::info!("meta backend: no NCCL, device-to-device copies instead: {e}"),
            }
        }
        let _ = devices;
        None
    }

    /// Makes every run use `comm` (one with [`MetaExecutor::n_devices`]
    /// ranks, e.g. an NCCL communicator), or, with `None`, a fresh
    /// [`HostComm`] per run. Runs are serialised on a set communicator.
    /// After a run fails in a collective, its communicator is dropped (an
    /// aborted communicator fails every later call) and later runs use
    /// [`HostComm`]s.
    ///
    /// # Errors
    /// [`Error::Split`] if `comm` has another number of ranks.
    pub fn set_comm(&mut self, comm: Option<Arc<dyn Comm>>) -> Result<()> {
        if let Some(c) = &comm {
            if c.n_ranks() != self.devices.len() {
                return Err(Error::Split {
                    detail: format!("a communicator of {} ranks for {} devices", c.n_ranks(), self.devices.len()),
                });
            }
        }
        *self.comm.get_mut().unwrap_or_else(|p| p.into_inner()) = comm;
        Ok(())
    }

    /// True if runs use a communicator set by [`MetaExecutor::set_comm`] or
    /// found at creation (NCCL).
    pub fn has_comm(&self) -> bool {
        self.comm.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Whether activations stay in device buffers between steps and
    /// conversions move them buffer to buffer ([`Comm::exchange_buffers`]:
    /// device-to-device copies, or NCCL) instead of through host memory.
    /// On by default when every device is a GPU; off for CPU devices, whose
    /// buffers are host memory anyway (turning it on there runs the same
    /// device-side code, which tests use). Per-row combines (distributed
    /// `rms_norm`, `soft_max`, `argmax`, …), vocabulary-parallel `get_rows`
    /// and writes into stored tensors still read their inputs to the host.
    pub fn set_device_data(&mut self, on: bool) {
        self.device_data = on;
    }

    /// See [`MetaExecutor::set_device_data`].
    pub fn device_data(&self) -> bool {
        self.device_data
    }

    /// The devices, in rank order.
    pub fn devices(&self) -> &[Arc<dyn Backend>] {
        &self.devices
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        self.devices.len()
    }

    /// Runs `plan` for `graph` with leaf data from `leaf_data(id)` (each
    /// leaf's full contiguous bytes in ggml layout; zeros where it gives
    /// `None`), and returns the full bytes of `outputs`. A convenience over
    /// [`MetaExecutor::execute`] with a fresh [`SplitStore`].
    ///
    /// # Errors
    /// As [`MetaExecutor::execute`]; [`Error::Split`] for leaf data of the wrong size.
    pub fn run(
        &self,
        ctx: &Context,
        graph: &Graph,
        plan: &Plan,
        leaf_data: &dyn Fn(TensorId) -> Option<Vec<u8>>,
        outputs: &[TensorId],
    ) -> Result<Vec<Vec<u8>>> {
        let mut store = SplitStore::new(self.devices.len());
        store.place_leafs(ctx, graph, plan)?;
        for &l in graph.leafs() {
            if let Some(b) = leaf_data(l) {
                store.set_tensor(ctx, l, 0, &b)?;
            }
        }
        Ok(self.execute(ctx, graph, plan, &mut store, outputs)?.outputs)
    }

    /// Runs `plan` for `graph`: leafs are read from `store` (leafs not
    /// placed there are placed zero-filled in their planned state), tensors
    /// written through views (`cpy`, `set_rows` into caches) are written back
    /// to it, and the full bytes of `outputs` are returned with the bytes
    /// moved.
    ///
    /// # Errors
    /// [`Error::Split`] if the plan is for another graph or device count, or
    /// a local computation or collective fails (naming the node; the other
    /// devices are released and the store keeps its previous contents).
    pub fn execute(
        &self,
        ctx: &Context,
        graph: &Graph,
        plan: &Plan,
        store: &mut SplitStore,
        outputs: &[TensorId],
    ) -> Result<RunReport> {
        let mut set = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(comm) = set.clone() {
            let r = self.execute_with(ctx, graph, plan, store, outputs, &*comm);
            if let (Err(e), true) = (&r, comm.is_aborted()) {
                log::warn!("meta backend: a run failed in a collective ({e}); later runs use a fresh HostComm each");
                *set = None;
            }
            return r;
        }
        drop(set);
        let comm = HostComm::new(self.devices.len());
        self.execute_with(ctx, graph, plan, store, outputs, &comm)
    }

    /// [`MetaExecutor::execute`] over a given communicator (one with
    /// `n_devices()` ranks; a fresh one per run for byte counts per run).
    ///
    /// # Errors
    /// As [`MetaExecutor::execute`].
    pub fn execute_with(
        &self,
        ctx: &Context,
        graph: &Graph,
        plan: &Plan,
        store: &mut SplitStore,
        outputs: &[TensorId],
        comm: &dyn Comm,
    ) -> Result<RunReport> {
        let n = self.devices.len();
        if plan.n_devices != n || store.n_devices() != n || comm.n_ranks() != n {
            return Err(Error::Split {
                detail: "plan, store, communicator and executor disagree on the device count".into(),
            });
        }
        for &o in outputs {
            ctx.tensor(o)?;
        }
        let lowered = lower(ctx, graph, plan)?;
        store.place_leafs(ctx, graph, plan)?;
        // Leafs in their planned state (converted on the host if stored otherwise).
        let mut leafs: Vec<(TensorId, Stored)> = Vec::new();
        for &l in graph.leafs() {
            let t = ctx.t(l);
            if t.view_src.is_some() {
                continue;
            }
            let s = store.get_stored(l).ok_or_else(|| Error::Split { detail: "store".into() })?;
            let want = plan.state(l).cloned().unwrap_or(SplitState::Mirrored);
            let s = if s.state == want {
                s.clone()
            } else {
                let parts: Vec<Vec<u8>> =
                    s.locals.iter().map(|x| x.bytes().map(|b| b.to_vec())).collect::<Result<_>>()?;
                let full = assemble(t.ty, t.ne, &parts, &s.state)?;
                let locals = (0..n)
                    .map(|j| slice_local(t.ty, t.ne, &full, &want, j).map(|b| Part::host(Arc::new(b))))
                    .collect::<Result<_>>()?;
                Stored { state: want, locals, layout: Some((t.ty, t.ne)), version: s.version }
            };
            leafs.push((l, s));
        }
        let exports = exports(ctx, &lowered, outputs);
        // Leafs the graph only reads may stay in device buffers between runs.
        let written: HashSet<usize> = graph
            .nodes()
            .iter()
            .filter(|&&id| matches!(ctx.t(id).op, Op::Cpy | Op::SetRows))
            .filter_map(|&id| ctx.t(id).view_src.map(|o| o.index()))
            .collect();
        let versions: HashMap<usize, u64> =
            leafs.iter().filter(|(l, _)| !written.contains(&l.index())).map(|(l, s)| (l.index(), s.version)).collect();
        let resident_data = self.device_data;
        let before = comm.bytes_received().iter().sum::<u64>();
        let results: Vec<Result<DeviceResult>> = std::thread::scope(|sc| {
            let handles: Vec<_> = (0..n)
                .map(|j| {
                    let (lowered, exports, leafs, versions) = (&lowered, &exports, &leafs, &versions);
                    let (dev, resident, id) = (&self.devices[j], &self.resident[j], self.ids[j]);
                    let allocator = &self.allocators[j];
                    sc.spawn(move || {
                        let mut d = Device {
                            j,
                            n,
                            ctx,
                            plan,
                            backend: &**dev,
                            comm,
                            data: HashMap::new(),
                            unplanned: 0,
                            fetching: false,
                            resident,
                            allocator,
                            versions,
                            resident_data,
                            device_conversions: 0,
                            id,
                        };
                        // A panic (a bug, or a foreign Comm) must not leave the
                        // other devices waiting in a collective: it aborts them.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                            for (l, s) in leafs {
                                // Parts another executor's devices keep are read through the host.
                                let p = &s.locals[j];
                                let p = match p.device_id() {
                                    Some(x) if x != id => Part::host(p.bytes()?),
                                    _ => p.clone(),
                                };
                                d.put(*l, s.state.clone(), p);
                            }
                            d.run(lowered, exports, outputs, graph)
                        }))
                        .unwrap_or_else(|p| {
                            let what = p
                                .downcast_ref::<&str>()
                                .map(|s| s.to_string())
                                .or_else(|| p.downcast_ref::<String>().cloned())
                                .unwrap_or_default();
                            Err(Error::Split { detail: format!("device {j} panicked: {what}") })
                        });
                        if r.is_err() {
                            comm.abort();
                        }
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Split { detail: "a device thread panicked".into() })))
                .collect()
        });
        // The first real error (not "another device failed").
        let mut devs = Vec::with_capacity(n);
        let mut errs = Vec::new();
        for r in results {
            match r {
                Ok(d) => devs.push(d),
                Err(e) => errs.push(e),
            }
        }
        if !errs.is_empty() {
            let pick = errs.iter().position(|e| !e.to_string().contains("another device failed")).unwrap_or(0);
            return Err(errs.swap_remove(pick));
        }
        let moved = comm.bytes_received().iter().sum::<u64>() - before;
        let mut report = RunReport {
            outputs: Vec::with_capacity(outputs.len()),
            bytes_moved: moved,
            unplanned_bytes: devs.iter().map(|d| d.unplanned).sum(),
            subgraphs: lowered.n_subgraphs(),
            device_conversions: devs[0].device_conversions,
        };
        for (k, &o) in outputs.iter().enumerate() {
            let t = ctx.t(o);
            let state = devs[0].outputs[k].0.clone();
            let parts: Vec<Vec<u8>> = devs.iter().map(|d| d.outputs[k].1.to_vec()).collect();
            report.outputs.push(assemble(t.ty, t.ne, &parts, &state)?);
        }
        // Written owners go back to the store.
        let written: Vec<TensorId> = devs[0].written.iter().map(|(id, _, _)| *id).collect();
        for (k, id) in written.iter().enumerate() {
            let state = devs[0].written[k].1.clone();
            let locals = devs.iter().map(|d| d.written[k].2.clone()).collect();
            let layout = Some((ctx.t(*id).ty, ctx.t(*id).ne));
            store.put_stored(*id, Stored { state, locals, layout, version: super::store::next_version() });
        }
        Ok(report)
    }

    /// Lowers `plan` (exposed for reports and tests).
    ///
    /// # Errors
    /// As [`lower`].
    pub fn lower(&self, ctx: &Context, graph: &Graph, plan: &Plan) -> Result<Lowered> {
        lower(ctx, graph, plan)
    }
}

/// Tensors a subgraph must hand on: read by a later step, requested, or written into.
pub(crate) fn exports(ctx: &Context, lowered: &Lowered, outputs: &[TensorId]) -> HashSet<usize> {
    let mut seg_of: HashMap<usize, usize> = HashMap::new();
    for (k, s) in lowered.steps.iter().enumerate() {
        if let Step::Compute(v) = s {
            for id in v {
                seg_of.insert(id.index(), k);
            }
        }
    }
    let mut out: HashSet<usize> = outputs.iter().map(|o| o.index()).collect();
    for (k, s) in lowered.steps.iter().enumerate() {
        let readers: Vec<TensorId> = match s {
            Step::Compute(v) => v.clone(),
            Step::RowCombine(n) | Step::VocabGetRows(n) | Step::Write(n) => vec![*n],
            Step::Convert { tensor, .. } => {
                out.insert(tensor.index());
                vec![]
            }
        };
        for r in readers {
            let rt = ctx.t(r);
            if matches!(rt.op, Op::View) {
                if let Some(o) = rt.view_src {
                    out.insert(o.index());
                }
            }
            for src in &rt.src {
                if seg_of.get(&src.index()).is_some_and(|&sk| sk != k) {
                    out.insert(src.index());
                }
            }
        }
    }
    out
}

/// What a device thread hands back.
struct DeviceResult {
    outputs: Vec<(SplitState, Arc<Vec<u8>>)>,
    written: Vec<(TensorId, SplitState, Arc<Part>)>,
    unplanned: u64,
    device_conversions: usize,
}

/// A tensor's local part in one state.
type Held = (SplitState, Arc<Part>);

/// One device's thread: its data and its side of every step.
pub(crate) struct Device<'a> {
    pub(crate) j: usize,
    pub(crate) n: usize,
    ctx: &'a Context,
    plan: &'a Plan,
    pub(crate) backend: &'a dyn Backend,
    pub(crate) comm: &'a dyn Comm,
    /// Per tensor: the states it is available in, the first being current.
    data: HashMap<usize, Vec<Held>>,
    unplanned: u64,
    /// Inside an unplanned fetch (its bytes are counted once, by the outermost).
    fetching: bool,
    /// This device's resident leaf buffers.
    resident: &'a std::sync::Mutex<Resident>,
    /// This device's allocator for local graphs (locked while one runs).
    allocator: &'a std::sync::Mutex<GraphAllocator>,
    /// Stored versions of the leafs the graph only reads.
    versions: &'a HashMap<usize, u64>,
    /// Keep activations in device buffers between steps (GPU devices).
    resident_data: bool,
    /// Conversions run between device buffers so far.
    device_conversions: usize,
    /// This device's process-unique id (tags the parts in its buffers).
    pub(crate) id: u64,
}

/// What [`Device::run_local_parts`] returns of a local graph's results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Results {
    /// Read to host memory.
    Host,
    /// Left in device buffers of their own (device-resident activations).
    Device,
    /// Nothing: the graph wrote into its input buffers (`cpy` into views).
    None,
}

/// A local graph's leaf input: bytes to copy in, or data already in a
/// buffer of the device (a resident leaf, a device-resident activation).
pub(crate) enum Input {
    Bytes(Arc<Vec<u8>>),
    Buffer(BufSlice),
}

impl Device<'_> {
    /// Adds `part` as `id`'s data in `state` (keeping its other states).
    fn put(&mut self, id: TensorId, state: SplitState, part: Arc<Part>) {
        let list = self.data.entry(id.index()).or_default();
        list.retain(|(s, _)| *s != state);
        list.push((state, part));
    }

    /// A local graph's input for `part`: its buffer if it lives on this
    /// device, else its bytes.
    fn input_of(&self, part: &Part) -> Result<Input> {
        Ok(match part.slice_on(self.id) {
            Some(s) => Input::Buffer(s.clone()),
            None => Input::Bytes(part.bytes()?),
        })
    }

    /// Where local graphs leave their results: device buffers when this
    /// device keeps activations, else host memory.
    fn results(&self) -> Results {
        if self.resident_data {
            Results::Device
        } else {
            Results::Host
        }
    }

    /// A part in a buffer of this device.
    pub(crate) fn dev_part(&self, s: BufSlice) -> Arc<Part> {
        Part::device(self.id, s)
    }

    /// Makes `part` `id`'s only data (a new value).
    fn set(&mut self, id: TensorId, state: SplitState, part: Arc<Part>) {
        self.data.insert(id.index(), vec![(state, part)]);
    }

    fn get(&self, id: TensorId, state: &SplitState) -> Option<Arc<Part>> {
        self.data.get(&id.index())?.iter().find(|(s, _)| s == state).map(|(_, b)| b.clone())
    }

    fn current(&self, id: TensorId) -> Result<(SplitState, Arc<Part>)> {
        self.data.get(&id.index()).and_then(|v| v.first().cloned()).ok_or_else(|| Error::Split {
            detail: format!("tensor #{} is not computed on device {}", id.index(), self.j),
        })
    }

    /// Bytes this device's communicator rank received so far.
    fn received(&self) -> u64 {
        self.comm.bytes_received().get(self.j).copied().unwrap_or(0)
    }

    /// `id` in `state`, converting now (counted as unplanned) if no step did.
    /// A view whose owner was written since it was computed is read again
    /// from the owner, as one device reads its memory.
    fn fetch(&mut self, id: TensorId, state: &SplitState) -> Result<Arc<Vec<u8>>> {
        self.fetch_part(id, state)?.bytes()
    }

    /// [`Device::fetch`] without reading a device part to the host.
    fn fetch_part(&mut self, id: TensorId, state: &SplitState) -> Result<Arc<Part>> {
        if let Some(b) = self.get(id, state) {
            return Ok(b);
        }
        // Only the outermost fetch counts (a re-read view fetches its owner).
        let outer = !self.fetching;
        self.fetching = true;
        let before = self.received();
        let r = self.fetch_inner(id, state);
        if outer {
            self.fetching = false;
            self.unplanned += self.received().saturating_sub(before);
        }
        r
    }

    fn fetch_inner(&mut self, id: TensorId, state: &SplitState) -> Result<Arc<Part>> {
        if !self.data.contains_key(&id.index()) {
            if let Some(owner) = self.ctx.t(id).view_src {
                self.reread_view(id, owner)?;
            }
        }
        if let Some(b) = self.get(id, state) {
            return Ok(b);
        }
        let (from, _) = self.current(id)?;
        self.convert(id, &from, state)?;
        self.get(id, state).ok_or_else(|| Error::Split { detail: "conversion".into() })
    }

    /// View `id` of `owner` read again from the owner's current data (mirrored).
    fn reread_view(&mut self, id: TensorId, owner: TensorId) -> Result<()> {
        let ctx = self.ctx;
        let (t, ot) = (ctx.t(id), ctx.t(owner));
        let ob = self.fetch_part(owner, &SplitState::Mirrored)?;
        let mut l = Context::new();
        let o = l.new_tensor(ot.ty, &ot.ne)?;
        let v = l.push_view(o, t.ty, t.ne, t.nb, t.view_offs, Op::View, &[o])?;
        let c = l.push_op(t.ty, t.ne, Op::Cont, &[v])?;
        let part = self.run_local_parts(&l, &[c], &[(o, self.input_of(&ob)?)], self.results())?.remove(0);
        self.put(id, SplitState::Mirrored, part);
        Ok(())
    }

    /// Drops what this device holds of views of `owner` (other than the
    /// writer `writer`): one device would read them from the owner's memory,
    /// which `writer` just changed.
    fn invalidate_views_of(&mut self, owner: TensorId, writer: TensorId) {
        let ctx = self.ctx;
        let stale: Vec<usize> = self
            .data
            .keys()
            .copied()
            .filter(|&i| {
                let id = TensorId { ctx: ctx.id(), idx: i as u32 };
                i != writer.index() && i != owner.index() && ctx.t(id).view_src == Some(owner)
            })
            .collect();
        for i in stale {
            self.data.remove(&i);
        }
    }

    /// Converts `id` from `from` to `to` through the communicator: between
    /// device buffers when the devices keep activations resident and the
    /// communicator moves buffers, else through host memory.
    fn convert(&mut self, id: TensorId, from: &SplitState, to: &SplitState) -> Result<()> {
        let t = self.ctx.t(id);
        let (ty, ne, j) = (t.ty, t.ne, self.j);
        let part = match self.get(id, from) {
            Some(b) => b,
            None => self.fetch_part(id, from)?,
        };
        if self.resident_data && self.comm.moves_buffers() && super::devcomm::movable(ty, from) {
            let out = self.convert_on_device(ty, ne, from, to, &part)?;
            self.device_conversions += 1;
            self.put(id, to.clone(), out);
            return Ok(());
        }
        let src = part.bytes()?;
        let out = match (from, to) {
            (SplitState::Partial(_), SplitState::Mirrored) => self.comm.all_reduce(j, ty, ne, &src)?,
            (SplitState::Partial(_), SplitState::Split(_)) => self.comm.reduce_scatter(j, ty, ne, to, &src)?,
            (SplitState::Mirrored, SplitState::Partial(_)) => {
                if j == 0 {
                    src.to_vec()
                } else {
                    vec![0; src.len()]
                }
            }
            (SplitState::Split(_), SplitState::Partial(_)) => {
                // Gathered, then held by device 0 (the cost model's all-gather).
                let full = self.comm.redistribute(j, ty, ne, from, &SplitState::Mirrored, &src)?;
                if j == 0 {
                    full
                } else {
                    vec![0; full.len()]
                }
            }
            (a, b) if a == b => src.to_vec(),
            _ => self.comm.redistribute(j, ty, ne, from, to, &src)?,
        };
        self.put(id, to.clone(), Part::host(Arc::new(out)));
        Ok(())
    }

    fn state_of(&self, id: TensorId) -> SplitState {
        self.plan.state(id).cloned().unwrap_or(SplitState::Mirrored)
    }

    fn needs(&self, node: TensorId) -> Vec<SplitState> {
        self.plan.inputs_of(node).map(|v| v.to_vec()).unwrap_or_default()
    }

    fn run(
        mut self,
        lowered: &Lowered,
        exports: &HashSet<usize>,
        outputs: &[TensorId],
        graph: &Graph,
    ) -> Result<DeviceResult> {
        let mut written: Vec<TensorId> = Vec::new();
        for step in &lowered.steps {
            match step {
                Step::Compute(nodes) => self.compute(nodes, exports)?,
                Step::Convert { tensor, from, to, .. } => self.convert(*tensor, from, to)?,
                Step::RowCombine(node) => self.row_combine(*node)?,
                Step::VocabGetRows(node) => self.vocab_get_rows(*node)?,
                Step::Write(node) => {
                    if let Some(o) = self.write(*node)? {
                        if !written.contains(&o) {
                            written.push(o);
                        }
                    }
                }
            }
        }
        let mut outs = Vec::with_capacity(outputs.len());
        for &o in outputs {
            if !self.data.contains_key(&o.index()) {
                // A view whose owner was written after it: read it again.
                let st = self.state_of(o);
                self.fetch(o, &st)?;
            }
            let (st, part) = self.current(o)?;
            outs.push((st, part.bytes()?));
        }
        // Written leafs return to the store in their planned state.
        let mut w = Vec::new();
        for o in written {
            if graph.leafs().contains(&o) {
                let st = self.state_of(o);
                let b = self.fetch_part(o, &st)?;
                w.push((o, st, b));
            }
        }
        Ok(DeviceResult {
            outputs: outs,
            written: w,
            unplanned: self.unplanned,
            device_conversions: self.device_conversions,
        })
    }

    /// Runs `nodes` as one local graph over this device's parts.
    fn compute(&mut self, nodes: &[TensorId], exports: &HashSet<usize>) -> Result<()> {
        let ctx = self.ctx;
        let sg = build_subgraph(ctx, self.plan, nodes, exports, self.j)?;
        if sg.outs.is_empty() {
            return Ok(());
        }
        let mut inputs = Vec::with_capacity(sg.inputs.len());
        for (g, st, lid) in &sg.inputs {
            let part = self.fetch_part(*g, st)?;
            let input = match part.slice_on(self.id) {
                Some(s) => Input::Buffer(s.clone()),
                None => {
                    let bytes = part.bytes()?;
                    match self.resident_buffer(*g, st, &bytes)? {
                        Some(buf) => Input::Buffer(BufSlice::whole(buf)),
                        None => Input::Bytes(bytes),
                    }
                }
            };
            inputs.push((*lid, input));
        }
        let out_ids: Vec<TensorId> = sg.outs.iter().map(|o| o.1).collect();
        let results = self.run_local_parts(&sg.l, &out_ids, &inputs, self.results()).map_err(|e| {
            let t = ctx.t(nodes[0]);
            Error::Split { detail: format!("device {}: subgraph from {} {}: {e}", self.j, t.op.name(), t.describe()) }
        })?;
        for ((node, _, state), part) in sg.outs.into_iter().zip(results) {
            self.set(node, state, part);
        }
        Ok(())
    }

    /// A device buffer holding `bytes` of leaf `g` in its planned state `st`,
    /// kept between runs while the stored data keeps its version (weights
    /// are copied to the device once, not every step); `None` for anything
    /// else (intermediates, converted parts, leafs this graph writes).
    fn resident_buffer(
        &self,
        g: TensorId,
        st: &SplitState,
        bytes: &Arc<Vec<u8>>,
    ) -> Result<Option<Arc<dyn crate::backend::Buffer>>> {
        let Some(&version) = self.versions.get(&g.index()) else { return Ok(None) };
        if self.plan.state(g) != Some(st) || bytes.is_empty() {
            return Ok(None);
        }
        let mut map = self.resident.lock().map_err(|_| Error::Split { detail: "resident buffers poisoned".into() })?;
        let key = (g, st.clone());
        if let Some((v, buf)) = map.get(&key) {
            if *v == version && buf.size() == bytes.len() {
                return Ok(Some(buf.clone()));
            }
        }
        let buf = self.backend.alloc_buffer(bytes.len())?;
        buf.set(0, bytes)?;
        map.insert(key, (version, buf.clone()));
        Ok(Some(buf))
    }

    /// Runs local graph `l` on this device with leaf `inputs` set and
    /// returns the bytes of `outs` (each contiguous).
    fn run_local(&self, l: &Context, outs: &[TensorId], inputs: &[(TensorId, Arc<Vec<u8>>)]) -> Result<Vec<Vec<u8>>> {
        let inputs: Vec<(TensorId, Input)> = inputs.iter().map(|(id, b)| (*id, Input::Bytes(b.clone()))).collect();
        self.run_local_parts(l, outs, &inputs, Results::Host)?.iter().map(|p| p.bytes().map(|b| b.to_vec())).collect()
    }

    /// Runs local graph `l` and returns `outs` as parts, as `results` says.
    /// Unless `results` is [`Results::None`], a buffer input that a `cpy` or
    /// `set_rows` of the graph writes into (a write into a cache) is copied
    /// first, so parts never change in place; a result that is that whole
    /// copy (the write's view of its destination) is the copy itself.
    pub(crate) fn run_local_parts(
        &self,
        l: &Context,
        outs: &[TensorId],
        inputs: &[(TensorId, Input)],
        results: Results,
    ) -> Result<Vec<Arc<Part>>> {
        let keep = matches!(results, Results::Device);
        let g = l.build_forward(outs)?;
        let mut st = TensorStorage::new();
        let copied: Vec<TensorId> = inputs.iter().filter(|(_, i)| matches!(i, Input::Bytes(_))).map(|i| i.0).collect();
        st.alloc_tensors(self.backend, l, &copied)?;
        st.bind_ctx(l)?;
        let targets: HashSet<usize> = if matches!(results, Results::None) {
            HashSet::new()
        } else {
            (0..l.len())
                .map(|i| l.t(TensorId { ctx: l.id(), idx: i as u32 }))
                .filter(|t| matches!(t.op, Op::Cpy | Op::SetRows))
                .filter_map(|t| t.view_src.map(|o| o.index()))
                .collect()
        };
        let mut private: HashMap<usize, BufSlice> = HashMap::new();
        for (lid, input) in inputs {
            match input {
                Input::Bytes(b) => st.set_bytes(l, *lid, 0, b)?,
                Input::Buffer(s) => {
                    if s.len < l.t(*lid).nbytes() || s.offset.checked_add(s.len).is_none_or(|e| e > s.buf.size()) {
                        return Err(Error::Split { detail: "device buffer smaller than its tensor".into() });
                    }
                    let s = if targets.contains(&lid.index()) {
                        let c = BufSlice { buf: self.backend.alloc_buffer(s.len.max(1))?, offset: 0, len: s.len };
                        c.buf.copy_from(0, &*s.buf, s.offset, s.len)?;
                        private.insert(lid.index(), c.clone());
                        c
                    } else {
                        s.clone()
                    };
                    let k = st.add_buffer(s.buf.clone());
                    st.place(*lid, k, s.offset);
                }
            }
        }
        // Kept results get a buffer of their own (the allocator's memory is
        // reused by the next graph); results that are views of other
        // tensors are copied into it afterwards.
        let mut kept: Vec<Option<BufSlice>> = vec![None; outs.len()];
        let mut copied = Vec::new();
        if keep {
            let align = self.backend.buffer_type().alignment.max(1);
            let mut spans = Vec::new();
            let mut total = 0usize;
            for (k, &o) in outs.iter().enumerate() {
                let t = l.t(o);
                let n = t.nbytes();
                let whole = t.view_src.and_then(|v| private.get(&v.index())).filter(|p| t.view_offs == 0 && p.len == n);
                if let Some(p) = whole {
                    kept[k] = Some(p.clone());
                    continue;
                }
                if let Some(first) = outs[..k].iter().position(|&p| p == o) {
                    spans.push((k, first, n, usize::MAX));
                    continue;
                }
                let own = l.t(o).view_src.is_none() && !st.has_storage(l, o);
                spans.push((k, k, n, total));
                total = total
                    .checked_add(n.div_ceil(align) * align)
                    .ok_or_else(|| Error::Alloc { detail: "results too large".into() })?;
                if !own {
                    copied.push(k);
                }
            }
            let buf = self.backend.alloc_buffer(total.max(1))?;
            let bi = st.add_buffer(buf.clone());
            for &(k, first, n, off) in &spans {
                if first == k {
                    if !copied.contains(&k) {
                        st.place(outs[k], bi, off);
                    }
                    kept[k] = Some(BufSlice { buf: buf.clone(), offset: off, len: n });
                } else {
                    kept[k] = kept[first].clone();
                }
            }
        }
        // Held until the results are copied out: the next graph reuses the buffers.
        let mut alloc = self.allocator.lock().unwrap_or_else(|p| {
            // A panic mid-graph left it in an unknown state: start afresh.
            let mut a = p.into_inner();
            *a = GraphAllocator::new(self.backend.buffer_type());
            a
        });
        alloc.alloc_graph(self.backend, l, &g, &mut st)?;
        self.backend.compute(l, &g, &st)?;
        if matches!(results, Results::None) {
            return Ok(Vec::new());
        }
        for &k in &copied {
            if let Some(s) = &kept[k] {
                let (b, off) = st.locate(l, outs[k])?;
                s.buf.copy_from(s.offset, &**b, off, s.len)?;
            }
        }
        outs.iter()
            .zip(kept)
            .map(|(&o, kept)| match kept {
                Some(s) => Ok(self.dev_part(s)),
                None => {
                    let mut bytes = vec![0u8; l.t(o).nbytes()];
                    st.get_bytes(l, o, 0, &mut bytes)?;
                    Ok(Part::host(Arc::new(bytes)))
                }
            })
            .collect()
    }

    /// Node `node` computed whole on this device from gathered inputs (the
    /// exact single-device semantics, for rows a distributed op cannot
    /// combine exactly: NaN or infinite values), laid out in its planned state.
    fn full_node(&mut self, node: TensorId) -> Result<Arc<Vec<u8>>> {
        let ctx = self.ctx;
        let t = ctx.t(node);
        let mut l = Context::new();
        let (mut srcs, mut inputs) = (Vec::new(), Vec::new());
        for &s in &t.src {
            let bytes = self.fetch(s, &SplitState::Mirrored)?;
            let st = ctx.t(s);
            let lid = l.new_tensor(st.ty, &st.ne)?;
            inputs.push((lid, bytes));
            srcs.push(lid);
        }
        let m = SplitState::Mirrored;
        let ms = vec![SplitState::Mirrored; t.src.len()];
        let out = local_op(&mut l, ctx, t, &srcs, &ms, &m, self.j).map_err(|e| node_err(t, &m, e))?;
        let full = self.run_local(&l, &[out], &inputs).map_err(|e| node_err(t, &m, e))?.remove(0);
        let state = self.state_of(node);
        Ok(Arc::new(slice_local(t.ty, t.ne, &full, &state, self.j)?))
    }

    /// Computes row op `node` whole from gathered inputs (counted as unplanned).
    fn fallback(&mut self, node: TensorId) -> Result<()> {
        let r = self.full_node(node)?;
        let st = self.state_of(node);
        self.set(node, st, Part::host(r));
        Ok(())
    }

    /// A write (`cpy`/`set_rows`) on every device; the owner takes the result.
    fn write(&mut self, node: TensorId) -> Result<Option<TensorId>> {
        let ctx = self.ctx;
        let t = ctx.t(node);
        let out_state = self.state_of(node);
        let needs = self.needs(node);
        let mut l = Context::new();
        let mut srcs = Vec::new();
        let mut inputs = Vec::new();
        // The kernel writes into a copy of the destination's part
        // (`run_local_parts`), which on the device is the result: a cache
        // stays in device memory between runs.
        for (k, &s) in t.src.iter().enumerate() {
            let need = needs.get(k).cloned().unwrap_or(SplitState::Mirrored);
            let part = self.fetch_part(s, &need)?;
            let st = ctx.t(s);
            let lid = l.new_tensor(st.ty, &local_ne(st.ne, &need, self.j))?;
            inputs.push((lid, self.input_of(&part)?));
            srcs.push(lid);
        }
        let out =
            local_op(&mut l, ctx, t, &srcs, &needs, &out_state, self.j).map_err(|e| node_err(t, &out_state, e))?;
        let res = self
            .run_local_parts(&l, &[out], &inputs, self.results())
            .map_err(|e| node_err(t, &out_state, e))?
            .remove(0);
        self.set(node, out_state.clone(), res.clone());
        let Some(owner) = t.view_src else { return Ok(None) };
        self.invalidate_views_of(owner, node);
        let after = super::lower::owner_state_after_write(ctx, t, &out_state);
        if covers_owner(ctx, t)
            && (after == out_state
                || ctx.t(owner).ne == t.ne
                || after == SplitState::Mirrored && out_state == SplitState::Mirrored)
        {
            // The same bytes in the owner's shape.
            self.set(owner, after, res);
        } else {
            // A write into part of the owner: both mirrored, then scattered.
            let full_res = self.fetch(node, &SplitState::Mirrored)?;
            let mut full = self.fetch(owner, &SplitState::Mirrored)?.to_vec();
            scatter(&mut full, &full_res, t).map_err(|e| node_err(t, &out_state, e))?;
            self.set(owner, SplitState::Mirrored, Part::host(Arc::new(full)));
        }
        Ok(Some(owner))
    }

    /// Vocabulary-parallel `get_rows` (Megatron's embedding): the table is
    /// split on its rows (axis 1), indices are mirrored; this device looks up
    /// the rows it owns and gives zeros for the others. Batched tables
    /// (`[ne0, rows, ne2, ne3]`, indices `[n, ne2, ne3]`, as DFlash2's
    /// selector reads each block row's candidate logits) look up plane by plane.
    fn vocab_get_rows(&mut self, node: TensorId) -> Result<()> {
        let ctx = self.ctx;
        let t = ctx.t(node);
        let needs = self.needs(node);
        let (table, idx_t) = (ctx.t(t.src[0]), ctx.t(t.src[1]));
        let Some(SplitState::Split(s)) = needs.first() else {
            return Err(Error::Split { detail: "vocab get_rows without a split table".into() });
        };
        let tab = self.fetch(t.src[0], &needs[0])?;
        let idx = self.fetch(t.src[1], &SplitState::Mirrored)?;
        let ids: Vec<i64> = match idx_t.ty {
            GgmlType::I32 => idx.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
            _ => idx.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
        };
        // Out-of-range ids are an error on every device, as on one (which
        // looks nothing up for an empty result).
        let bad = ids.iter().enumerate().find(|(_, &id)| id < 0 || id >= table.ne[1]);
        if let (Some((k, &id)), true) = (bad, t.nelements() > 0) {
            return Err(Error::Split {
                detail: format!("get_rows: index {id} at position {k} is outside the table's {} rows", table.ne[1]),
            });
        }
        let ne0 = table.ne[0] as usize;
        let rb = table.ty.row_size(table.ne[0])?;
        let ranges = s.ranges(self.j);
        // Batched tables [ne0, rows, ne2, ne3] with indices [n, ne2, ne3]:
        // index k looks up plane (k / n) of this device's [ne0, local rows] slices.
        let local_rows: i64 = ranges.iter().map(|&(a, b)| b - a).sum();
        let n_idx = idx_t.ne[0].max(1) as usize;
        let mut v = vec![0f32; ne0 * ids.len()];
        for (k, &id) in ids.iter().enumerate() {
            let plane = (k / n_idx) as i64;
            let mut base = 0i64;
            for &(a, b) in &ranges {
                if id >= a && id < b {
                    let off = ((plane * local_rows) + base + id - a) as usize * rb;
                    let row = tab
                        .get(off..off + rb)
                        .ok_or_else(|| Error::Split { detail: "get_rows: local row out of range".into() })?;
                    crate::tensor::quant::dequantize_row(table.ty, row, &mut v[k * ne0..(k + 1) * ne0])?;
                }
                base += b - a;
            }
        }
        let out = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.set(node, self.state_of(node), Part::host(Arc::new(out)));
        Ok(())
    }

    /// A distributed per-row op over rows split on axis 0 (`sum` over any
    /// split): this device reduces its part of every row, the devices
    /// all-gather a few values per row (8 bytes; 8·k for top_k; 4 for sum),
    /// and each finishes its part.
    fn row_combine(&mut self, node: TensorId) -> Result<()> {
        let ctx = self.ctx;
        let t = ctx.t(node);
        let out_state = self.state_of(node);
        let needs = self.needs(node);
        let j = self.j;
        let Some(SplitState::Split(s)) = needs.first().cloned() else {
            return Err(Error::Split { detail: format!("{}: row combine of an unsplit input", t.op.name()) });
        };
        let src_ty = ctx.t(t.src[0]).ty;
        let xb = self.fetch(t.src[0], &needs[0])?;
        let x = floats(&xb, src_ty);
        if matches!(t.op, Op::Sum) {
            let local: f32 = x.iter().sum();
            let all = self.comm.all_gather_bytes(j, &local.to_le_bytes())?;
            let total: f64 = all.iter().map(|b| f32s(b).first().copied().unwrap_or(0.0) as f64).sum();
            let bytes = match t.ty {
                GgmlType::F16 => half::f16::from_f32(total as f32).to_le_bytes().to_vec(),
                GgmlType::BF16 => half::bf16::from_f32(total as f32).to_le_bytes().to_vec(),
                _ => (total as f32).to_le_bytes().to_vec(),
            };
            self.set(node, out_state.clone(), Part::host(Arc::new(bytes)));
            return Ok(());
        }
        let nrows = ctx.t(t.src[0]).nrows().max(0) as usize;
        let len = s.local_len(j).max(0) as usize;
        if x.len() != nrows * len {
            return Err(Error::Split {
                detail: format!("{}: local part of {} values for {nrows} rows of {len}", t.op.name(), x.len()),
            });
        }
        let n_global = s.axis_len() as usize;
        let lens: Vec<i64> = (0..self.n).map(|d| s.local_len(d)).collect();
        let ranges = s.ranges(j);
        let global = |i: usize| -> i32 {
            let mut i = i as i64;
            for &(a, b) in &ranges {
                if i < b - a {
                    return (a + i) as i32;
                }
                i -= b - a;
            }
            -1
        };
        let row = |r: usize| &x[r * len..(r + 1) * len];
        let pairs = |v: Vec<(f32, f32)>| -> Vec<u8> {
            v.iter().flat_map(|(a, b)| a.to_le_bytes().into_iter().chain(b.to_le_bytes())).collect()
        };
        let to_bytes = |v: Vec<f32>| -> Arc<Vec<u8>> { Arc::new(v.iter().flat_map(|x| x.to_le_bytes()).collect()) };
        match &t.op {
            Op::RmsNorm { eps } | Op::L2Norm { eps } => {
                let mut mine: Vec<u8> = (0..nrows)
                    .flat_map(|r| row(r).iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().to_le_bytes())
                    .collect();
                flag(&mut mine, &x, 8);
                let all = self.comm.all_gather_bytes(j, &mine)?;
                if flagged(&all, 8) {
                    return self.fallback(node);
                }
                let l2 = matches!(t.op, Op::L2Norm { .. });
                let mut out = Vec::with_capacity(len * nrows);
                for r in 0..nrows {
                    let ss: f64 = all.iter().map(|b| f64_at(b, r)).sum();
                    let scale = if l2 {
                        1.0 / (ss.sqrt() as f32).max(*eps)
                    } else {
                        1.0 / ((ss / n_global.max(1) as f64) as f32 + eps).sqrt()
                    };
                    out.extend(row(r).iter().map(|&v| v * scale));
                }
                self.set(node, out_state.clone(), Part::host(to_bytes(out)));
            }
            Op::Norm { eps } => {
                // Chan's parallel variance: per device (sum, M2 about its own mean).
                let mut mine = pairs(
                    (0..nrows)
                        .map(|r| {
                            let sum: f64 = row(r).iter().map(|&v| v as f64).sum();
                            let mean = if len > 0 { sum / len as f64 } else { 0.0 };
                            let m2: f64 = row(r).iter().map(|&v| (v as f64 - mean).powi(2)).sum();
                            (sum as f32, m2 as f32)
                        })
                        .collect(),
                );
                flag(&mut mine, &x, 4);
                let all = self.comm.all_gather_bytes(j, &mine)?;
                if flagged(&all, 4) {
                    return self.fallback(node);
                }
                let mut out = Vec::with_capacity(len * nrows);
                for r in 0..nrows {
                    let total: f64 = all.iter().map(|b| pair_at(b, r).0 as f64).sum();
                    let mean = total / n_global.max(1) as f64;
                    let mut m2 = 0.0f64;
                    for (d, b) in all.iter().enumerate() {
                        let (sum_d, m2_d) = pair_at(b, r);
                        let nd = lens[d] as f64;
                        if nd > 0.0 {
                            m2 += m2_d as f64 + nd * (sum_d as f64 / nd - mean).powi(2);
                        }
                    }
                    let scale = 1.0 / ((m2 / n_global.max(1) as f64) as f32 + eps).sqrt();
                    let mean = mean as f32;
                    out.extend(row(r).iter().map(|&v| (v - mean) * scale));
                }
                self.set(node, out_state.clone(), Part::host(to_bytes(out)));
            }
            Op::SoftMax { scale, max_bias } => {
                if *max_bias > 0.0 || t.src.len() > 2 {
                    return Err(Error::Split {
                        detail: "distributed soft_max supports a 2-D mask without ALiBi or sinks".into(),
                    });
                }
                let mask = match t.src.get(1) {
                    Some(&m) => {
                        let mb = self.fetch(m, &needs[1])?;
                        Some(floats(&mb, ctx.t(m).ty))
                    }
                    None => None,
                };
                let ne1 = t.ne[1].max(1) as usize;
                let vals: Vec<Vec<f32>> = (0..nrows)
                    .map(|r| {
                        row(r)
                            .iter()
                            .enumerate()
                            .map(|(i, &v)| v * scale + mask.as_ref().map_or(0.0, |m| m[(r % ne1) * len + i]))
                            .collect()
                    })
                    .collect();
                // Per device and row: the local max and the sum of exp(v − local max).
                let mut mine = pairs(
                    vals.iter()
                        .map(|v| {
                            let m = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                            let s: f64 = if m == f32::NEG_INFINITY {
                                0.0
                            } else {
                                v.iter().map(|&x| ((x - m).exp()) as f64).sum()
                            };
                            (m, s as f32)
                        })
                        .collect(),
                );
                // Masked −inf is ordinary; anything else non-finite is combined exactly by the fallback.
                let odd = mask.as_ref().is_some_and(|m| m.iter().any(|v| v.is_nan() || *v == f32::INFINITY));
                flag(&mut mine, if odd { &[f32::NAN] } else { &x }, 4);
                let all = self.comm.all_gather_bytes(j, &mine)?;
                if flagged(&all, 4) {
                    return self.fallback(node);
                }
                let mut out = Vec::with_capacity(len * nrows);
                for (r, v) in vals.iter().enumerate() {
                    let gmax = all.iter().map(|b| pair_at(b, r).0).fold(f32::NEG_INFINITY, f32::max);
                    let sum: f64 = all
                        .iter()
                        .map(|b| {
                            let (m, s) = pair_at(b, r);
                            if m == f32::NEG_INFINITY {
                                0.0
                            } else {
                                s as f64 * ((m - gmax) as f64).exp()
                            }
                        })
                        .sum();
                    let inv = (1.0 / sum) as f32;
                    out.extend(v.iter().map(|&x| (x - gmax).exp() * inv));
                }
                self.set(node, out_state.clone(), Part::host(to_bytes(out)));
            }
            Op::Argmax => {
                // Per device and row: the local maximum and its global index
                // (the last of equal maxima, as ggml's scan keeps); NaN flags a row.
                let mine: Vec<u8> = (0..nrows)
                    .flat_map(|r| {
                        let mut best = (f32::NEG_INFINITY, -1i32);
                        let mut nan = false;
                        for (i, &v) in row(r).iter().enumerate() {
                            nan |= v.is_nan();
                            let gi = global(i);
                            if v > best.0 || (v == best.0 && gi > best.1) {
                                best = (v, gi);
                            }
                        }
                        let v = if nan { f32::NAN } else { best.0 };
                        v.to_le_bytes().into_iter().chain(best.1.to_le_bytes())
                    })
                    .collect();
                let all = self.comm.all_gather_bytes(j, &mine)?;
                // ggml's scan restarts after a NaN: such rows are redone whole.
                if (0..nrows).any(|r| all.iter().any(|b| pair_at(b, r).0.is_nan())) {
                    return self.fallback(node);
                }
                let mut res = Vec::with_capacity(nrows * 4);
                for r in 0..nrows {
                    let mut best = (f32::NEG_INFINITY, -1i32);
                    for b in &all {
                        let (v, gi) = (pair_at(b, r).0, i32_at(b, 2 * r + 1));
                        if gi >= 0 && (v > best.0 || (v == best.0 && gi > best.1)) {
                            best = (v, gi);
                        }
                    }
                    // An empty row gives index 0, as on one device.
                    res.extend(best.1.max(0).to_le_bytes());
                }
                self.set(node, out_state.clone(), Part::host(Arc::new(res)));
            }
            Op::TopK { k } => {
                let k = (*k).max(0) as usize;
                // Per device and row: its k best (value, global index), padded with index −1.
                let mine: Vec<u8> = (0..nrows)
                    .flat_map(|r| {
                        let mut c: Vec<(f32, i32)> = row(r).iter().enumerate().map(|(i, &v)| (v, global(i))).collect();
                        c.sort_by_key(|&(v, i)| crate::backend::cpu::kernels::reduce::desc_key(v, i as usize));
                        c.resize(k, (f32::NEG_INFINITY, -1));
                        c.into_iter()
                            .flat_map(|(v, i)| v.to_le_bytes().into_iter().chain(i.to_le_bytes()))
                            .collect::<Vec<u8>>()
                    })
                    .collect();
                let all = self.comm.all_gather_bytes(j, &mine)?;
                let mut res = Vec::with_capacity(nrows * k * 4);
                for r in 0..nrows {
                    let mut c: Vec<(f32, i32)> = Vec::with_capacity(k * self.n);
                    for b in &all {
                        for q in 0..k {
                            let e = r * k + q;
                            let (v, i) = (pair_at(b, e).0, i32_at(b, 2 * e + 1));
                            if i >= 0 {
                                c.push((v, i));
                            }
                        }
                    }
                    c.sort_by_key(|&(v, i)| crate::backend::cpu::kernels::reduce::desc_key(v, i as usize));
                    res.extend(c.iter().take(k).flat_map(|c| c.1.to_le_bytes()));
                }
                self.set(node, out_state.clone(), Part::host(Arc::new(res)));
            }
            Op::SumRows | Op::Mean => {
                let mut mine: Vec<u8> =
                    (0..nrows).flat_map(|r| row(r).iter().map(|&v| v as f64).sum::<f64>().to_le_bytes()).collect();
                flag(&mut mine, &x, 8);
                let all = self.comm.all_gather_bytes(j, &mine)?;
                if flagged(&all, 8) {
                    return self.fallback(node);
                }
                let mut res = Vec::with_capacity(nrows * 4);
                for r in 0..nrows {
                    let sum: f64 = all.iter().map(|b| f64_at(b, r)).sum();
                    let v = if matches!(t.op, Op::Mean) { sum / n_global as f64 } else { sum };
                    res.extend((v as f32).to_le_bytes());
                }
                self.set(node, out_state.clone(), Part::host(Arc::new(res)));
            }
            op => return Err(Error::Split { detail: format!("{} has no distributed row combine", op.name()) }),
        }
        if matches!(t.op, Op::Argmax | Op::TopK { .. } | Op::SumRows | Op::Mean) && out_state != SplitState::Mirrored {
            return Err(Error::Split { detail: format!("{} combine must give a mirrored result", t.op.name()) });
        }
        Ok(())
    }
}

/// One device's subgraph of a `Compute` step, built without data.
pub(crate) struct Subgraph {
    /// The local context.
    pub l: Context,
    /// External inputs: (global tensor, state it is read in, local leaf), in fetch order.
    pub inputs: Vec<(TensorId, SplitState, TensorId)>,
    /// Handed-on results: (global node, local contiguous tensor, state).
    pub outs: Vec<(TensorId, TensorId, SplitState)>,
}

/// Builds device `j`'s local graph for `nodes` (one `Compute` step of a
/// lowered `plan`): every node over local shapes, inputs from outside the
/// step as leafs, and the `exports` made contiguous.
pub(crate) fn build_subgraph(
    ctx: &Context,
    plan: &Plan,
    nodes: &[TensorId],
    exports: &HashSet<usize>,
    j: usize,
) -> Result<Subgraph> {
    let mut l = Context::new();
    let mut local: HashMap<usize, (TensorId, SplitState)> = HashMap::new();
    let mut ext: HashMap<(usize, SplitState), TensorId> = HashMap::new();
    let mut inputs = Vec::new();
    let mut folded: HashMap<(usize, SplitState), TensorId> = HashMap::new();
    let mut input = |l: &mut Context, g: TensorId, st: &SplitState, ne: [i64; 4]| -> Result<TensorId> {
        let key = (g.index(), st.clone());
        if let Some(&lid) = ext.get(&key) {
            return Ok(lid);
        }
        let lid = l.new_tensor(ctx.t(g).ty, &ne)?;
        ext.insert(key, lid);
        inputs.push((g, st.clone(), lid));
        Ok(lid)
    };
    for &node in nodes {
        let t = ctx.t(node);
        let out_state = plan.state(node).cloned().unwrap_or(SplitState::Mirrored);
        let needs: Vec<SplitState> = plan.inputs_of(node).map(|v| v.to_vec()).unwrap_or_default();
        let mut srcs = Vec::with_capacity(t.src.len());
        for (k, &s) in t.src.iter().enumerate() {
            let need = needs.get(k).cloned().unwrap_or(SplitState::Mirrored);
            match local.get(&s.index()).cloned() {
                Some((lid, st)) if st == need => srcs.push(lid),
                Some((lid, st)) if super::lower::folds(&st, &need, ctx.t(s).ty) => {
                    let key = (s.index(), need.clone());
                    let c = match folded.get(&key) {
                        Some(&c) => c,
                        None => {
                            let c = local_convert(&mut l, lid, &need, j)?;
                            folded.insert(key, c);
                            c
                        }
                    };
                    srcs.push(c);
                }
                _ => srcs.push(input(&mut l, s, &need, local_ne(ctx.t(s).ne, &need, j))?),
            }
        }
        let lid = if let Some(owner) = view_owner(&l, ctx, t, &srcs, &out_state) {
            // A view the parent's local copy cannot express: view the owner's memory.
            let olid = match local.get(&owner.index()) {
                Some((lid, st)) if *st == out_state => *lid,
                _ => input(&mut l, owner, &out_state, ctx.t(owner).ne)?,
            };
            l.push_view(olid, t.ty, t.ne, t.nb, t.view_offs, Op::View, &[olid])
                .map_err(|e| node_err(t, &out_state, e))?
        } else {
            local_op(&mut l, ctx, t, &srcs, &needs, &out_state, j).map_err(|e| node_err(t, &out_state, e))?
        };
        // A view of a parent held in another layout (a contiguous copy of a
        // transposed tensor, transposed back) may come out strided where one
        // device's is packed; kernels that need packed rows get packed rows.
        let lt = l.t(lid).clone();
        let lid =
            if t.is_contiguous() && !lt.is_contiguous() { l.push_op(lt.ty, lt.ne, Op::Cont, &[lid])? } else { lid };
        local.insert(node.index(), (lid, out_state));
    }
    let mut outs = Vec::new();
    for &node in nodes {
        if exports.contains(&node.index()) {
            let (lid, st) = local[&node.index()].clone();
            let t = l.t(lid).clone();
            let c = if t.is_contiguous() { lid } else { l.push_op(t.ty, t.ne, Op::Cont, &[lid])? };
            outs.push((node, c, st));
        }
    }
    Ok(Subgraph { l, inputs, outs })
}

/// Device `j`'s part in state `to` of local mirrored tensor `lid`, by local
/// ops (see `lower::folds`): views of its ranges (concatenated, made
/// contiguous), or for a partial sum the tensor on device 0 and zeros elsewhere.
fn local_convert(l: &mut Context, lid: TensorId, to: &SplitState, j: usize) -> Result<TensorId> {
    let t = l.t(lid).clone();
    match to {
        SplitState::Partial(_) if j == 0 => Ok(lid),
        SplitState::Partial(_) => l.push_op(t.ty, t.ne, Op::Fill { c: 0.0 }, &[lid]),
        SplitState::Split(s) => {
            let a = s.axis;
            let bs = if a == 0 { t.ty.block_size() as i64 } else { 1 };
            let mut parts = Vec::new();
            for (x, y) in s.ranges(j) {
                let mut ne = t.ne;
                ne[a] = y - x;
                // An empty tensor has no bytes to offset into.
                let offs = if t.ne.contains(&0) { 0 } else { (x / bs) as usize * t.nb[a] };
                let v = l.push_view(lid, t.ty, ne, t.nb, offs, Op::View, &[lid])?;
                parts.push(l.push_op(t.ty, ne, Op::Cont, &[v])?);
            }
            let Some(mut acc) = parts.first().copied() else {
                let mut ne = t.ne;
                ne[a] = 0;
                return l.push_view(lid, t.ty, ne, crate::tensor::contiguous_strides(t.ty, &ne), 0, Op::View, &[lid]);
            };
            for &p in &parts[1..] {
                let mut ne = l.t(acc).ne;
                ne[a] += l.t(p).ne[a];
                acc = l.push_op(t.ty, ne, Op::Concat { dim: a }, &[acc, p])?;
            }
            Ok(acc)
        }
        _ => Err(Error::Split { detail: format!("no local conversion to {}", to.label()) }),
    }
}

/// For a mirrored/partial `view` whose parent is held here in another
/// layout than one device's (a contiguous copy of a strided parent), or that
/// reaches outside its parent's bytes: the owner to view instead.
fn view_owner(l: &Context, ctx: &Context, t: &Tensor, srcs: &[TensorId], out: &SplitState) -> Option<TensorId> {
    if !matches!(t.op, Op::View) || matches!(out, SplitState::Split(_)) {
        return None;
    }
    let parent = ctx.t(t.src[0]);
    let lp = l.t(srcs[0]);
    let same = lp.ne == parent.ne && lp.nb == parent.nb;
    let inside = parent.view_src.is_none() || {
        let span = crate::tensor::checked_nbytes(t.ty, &t.ne, &t.nb).unwrap_or(usize::MAX);
        t.view_offs >= parent.view_offs && t.view_offs.saturating_add(span) <= parent.view_offs + parent.nbytes()
    };
    if (parent.is_contiguous() || same) && inside {
        return None;
    }
    t.view_src
}

fn node_err(t: &Tensor, st: &SplitState, e: Error) -> Error {
    Error::Split { detail: format!("{} {} ({}): {e}", t.op.name(), t.describe(), st.label()) }
}

/// Builds node `t` in local context `l` over local sources `srcs`, with the
/// output shape device `j` holds in `out_state`.
#[allow(clippy::too_many_arguments)]
fn local_op(
    l: &mut Context,
    ctx: &Context,
    t: &Tensor,
    srcs: &[TensorId],
    in_states: &[SplitState],
    out_state: &SplitState,
    j: usize,
) -> Result<TensorId> {
    let ne = local_ne(t.ne, out_state, j);
    // A local view chain may hold a contiguous parent in a strided layout.
    let contiguous = |l: &mut Context, id: TensorId| -> Result<TensorId> {
        let s = l.t(id).clone();
        if s.is_contiguous() {
            Ok(id)
        } else {
            l.push_op(s.ty, s.ne, Op::Cont, &[id])
        }
    };
    match &t.op {
        Op::Reshape => {
            let base = contiguous(l, srcs[0])?;
            l.push_view(base, t.ty, ne, contiguous_strides(t.ty, &ne), 0, Op::Reshape, &[base])
        }
        Op::Permute { axes } => {
            let s = l.t(srcs[0]).clone();
            let (mut pne, mut pnb) = (s.ne, s.nb);
            for i in 0..4 {
                pne[axes[i]] = s.ne[i];
                pnb[axes[i]] = s.nb[i];
            }
            l.push_view(srcs[0], t.ty, pne, pnb, 0, t.op.clone(), srcs)
        }
        Op::Transpose => {
            let s = l.t(srcs[0]).clone();
            let (mut pne, mut pnb) = (s.ne, s.nb);
            pne.swap(0, 1);
            pnb.swap(0, 1);
            l.push_view(srcs[0], t.ty, pne, pnb, 0, Op::Transpose, srcs)
        }
        Op::Cpy => l.push_view(srcs[1], t.ty, ne, contiguous_strides(t.ty, &ne), 0, Op::Cpy, srcs),
        Op::SetRows => l.push_view(srcs[2], t.ty, ne, contiguous_strides(t.ty, &ne), 0, Op::SetRows, srcs),
        Op::View if matches!(out_state, SplitState::Split(_)) => {
            let parent = ctx.t(t.src[0]);
            // A view of a head-split Gated-DeltaNet result: this device's packing.
            if let Some(SplitState::Split(is)) = in_states.first() {
                if let Some(g) = super::rules::gdn_view(ctx, parent, t, is) {
                    let s = ctx.t(parent.src[2]).ne[0].max(1);
                    let (lne, lnb, offs) = g.local(is.local_len(j) / s);
                    return l.push_view(srcs[0], t.ty, lne, lnb, offs, Op::View, srcs);
                }
            }
            // A box of a split parent: the same box of this device's part.
            let geometry = match in_states.first() {
                Some(SplitState::Split(is)) => super::rules::view_geometry(parent, t, is),
                _ => None,
            };
            let Some((q, is, starts)) = geometry else {
                return Err(Error::Split { detail: "split view that is not a box of a split parent".into() });
            };
            // The parent's part in the shape the view reads it in.
            let mut base = srcs[0];
            if q.ne != parent.ne {
                base = contiguous(l, base)?;
                let qne = local_ne(q.ne, &SplitState::Split(is.clone()), j);
                base = l.push_view(base, t.ty, qne, contiguous_strides(t.ty, &qne), 0, Op::Reshape, &[base])?;
            }
            let srcs = &[base];
            let lp = l.t(base).clone();
            let a = is.axis;
            let mut ls = starts;
            ls[a] = is.ranges(j).iter().map(|&(x, y)| (y.min(starts[a]) - x).max(0)).sum();
            let bs = t.ty.block_size() as i64;
            let offs: i64 = if ne.contains(&0) {
                0
            } else {
                (0..4).map(|k| ls[k] / if k == 0 { bs } else { 1 } * lp.nb[k] as i64).sum()
            };
            l.push_view(srcs[0], t.ty, ne, lp.nb, offs as usize, Op::View, srcs)
        }
        Op::View => {
            // Relative to the parent as this device holds it: the parent's own
            // layout, or (for a contiguous parent) a contiguous copy.
            let parent = ctx.t(t.src[0]);
            let p_offs = if parent.view_src.is_some() { parent.view_offs } else { 0 };
            let offs = t
                .view_offs
                .checked_sub(p_offs)
                .ok_or_else(|| Error::Split { detail: "view before its parent".into() })?;
            let nb = t.nb;
            let lp = l.t(srcs[0]).clone();
            let base = if lp.ne == parent.ne && lp.nb == parent.nb { srcs[0] } else { contiguous(l, srcs[0])? };
            l.push_view(base, t.ty, t.ne, nb, offs, Op::View, &[base])
        }
        op => l.push_op(t.ty, ne, op.clone(), srcs),
    }
}

/// Writes the contiguous elements `res` of view `t` into its owner's bytes
/// `owner` at the view's layout (`view_offs`, `nb`).
fn scatter(owner: &mut [u8], res: &[u8], t: &Tensor) -> Result<()> {
    if t.nelements() == 0 {
        return Ok(());
    }
    let ts = t.ty.type_size();
    let rb = t.ty.row_size(t.ne[0])?;
    let oob = || Error::Split { detail: format!("write through a view of {} outside its owner", t.describe()) };
    let mut pos = 0;
    for i3 in 0..t.ne[3].max(0) as usize {
        for i2 in 0..t.ne[2].max(0) as usize {
            for i1 in 0..t.ne[1].max(0) as usize {
                let base = t.view_offs + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
                if t.ty.is_quantized() || t.nb[0] == ts {
                    let src = res.get(pos..pos + rb).ok_or_else(oob)?;
                    owner.get_mut(base..base + rb).ok_or_else(oob)?.copy_from_slice(src);
                    pos += rb;
                } else {
                    for i0 in 0..t.ne[0].max(0) as usize {
                        let o = base + i0 * t.nb[0];
                        let src = res.get(pos..pos + ts).ok_or_else(oob)?;
                        owner.get_mut(o..o + ts).ok_or_else(oob)?.copy_from_slice(src);
                        pos += ts;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Marks a row-combine message when this device's values include NaN or
/// infinity: the first value (f32 or f64, per `width` bytes) becomes NaN.
fn flag(msg: &mut [u8], x: &[f32], width: usize) {
    if msg.len() >= width && x.iter().any(|v| !v.is_finite()) {
        match width {
            8 => msg[..8].copy_from_slice(&f64::NAN.to_le_bytes()),
            _ => msg[..4].copy_from_slice(&f32::NAN.to_le_bytes()),
        }
    }
}

/// True if any device marked its message (see [`flag`]).
fn flagged(all: &[Vec<u8>], width: usize) -> bool {
    all.iter().any(|b| match width {
        8 => f64_at(b, 0).is_nan(),
        _ => pair_at(b, 0).0.is_nan(),
    })
}

fn floats(b: &[u8], ty: GgmlType) -> Vec<f32> {
    match ty {
        GgmlType::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        GgmlType::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        _ => f32s(b),
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn f64_at(b: &[u8], i: usize) -> f64 {
    b.get(i * 8..i * 8 + 8).map_or(0.0, |c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
}

fn pair_at(b: &[u8], i: usize) -> (f32, f32) {
    let f = |o: usize| b.get(o..o + 4).map_or(0.0, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    (f(i * 8), f(i * 8 + 4))
}

fn i32_at(b: &[u8], i: usize) -> i32 {
    b.get(i * 4..i * 4 + 4).map_or(-1, |c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}
