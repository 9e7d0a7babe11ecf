//! The executor of plans on N devices: N backend instances (CPU instances,
//! CUDA or HIP devices, virtual devices on one GPU, or a mix), made by
//! [`super::Devices::executor`].
//!
//! A plan is compiled once ([`super::compile`]) into one local graph per
//! device with the collectives as exchanges between its stages; the
//! executor keeps the compiled program (by plan, graph and requested
//! outputs; the least recently used of at most 64 is dropped), gives each
//! device a compute arena the programs share (grown to the largest program,
//! never allocated per run), binds the program to the store's parts once
//! (stored tensors move into the devices' buffers on first use), and then
//! every run only computes: each device runs its stages on its own thread,
//! exchanges go through a [`Comm`] (NCCL across GPUs, [`HostComm`]
//! otherwise), caches are written where they live, and the host reads back
//! only the requested outputs. The bytes the communicator moves are
//! counted, so a run can be checked against its plan, and so are the bytes
//! the executor allocates, copies into stored tensors and reads to the host
//! ([`ExecCounters`]).

use super::comm::{BufSlice, Comm, HostComm, ProcessGroup};
use super::compile::{Program, Stage};
use super::layout::{assemble, slice_local};
use super::lower::{lower, Lowered};
use super::memory::DeviceMemory;
use super::planner::Plan;
use super::store::{Part, SplitStore, Stored};
use crate::backend::{Backend, Buffer, TensorStorage};
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::{GgmlType, TensorId};
use std::sync::{Arc, Mutex};

/// Programs kept per executor (least recently used dropped first).
const MAX_PROGRAMS: usize = 64;

/// Host memory a fit leaves free, bytes ([`MetaExecutor::check_fit`]): 1
/// GiB, llama.cpp's `--fit-target` default. Without it a context sized to
/// the byte against the host's available memory could be refused by the
/// load a moment later (found on a 24 GB host: the fit chose 457 208 cells,
/// the load then lacked 34 MB).
pub const FIT_HOST_HEADROOM: u64 = 1 << 30;

/// N devices that execute plans, made by [`super::Devices::executor`]
/// (the devices, their order and their communicator come from the
/// [`super::Devices`]).
pub struct MetaExecutor {
    devices: Vec<Arc<dyn Backend>>,
    /// The tensor-split ratios of the [`super::Devices`] it was made from
    /// (one per device).
    ratios: Vec<f32>,
    /// Per device: a process-unique id (stored parts in its buffers carry it).
    ids: Vec<u64>,
    /// The communicator every run uses (NCCL across GPUs); `None`: the
    /// executor's own [`HostComm`].
    comm: Mutex<Option<Arc<dyn Comm>>>,
    /// The processes the devices span ([`super::Devices::across_processes`]):
    /// every run ends with all of them; `None`: one process.
    group: Option<Arc<dyn ProcessGroup>>,
    /// Per device: true if it runs in this process (all, without a group).
    local: Vec<bool>,
    /// Programs, arenas and counters; runs are serialised on it.
    state: Mutex<State>,
}

/// What the executor allocates, copies and reads outside the graphs' own
/// work — deterministic counters for tests: after the first run of a
/// program, a decode step allocates nothing, copies nothing into stored
/// tensors, and reads only its requested outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecCounters {
    /// Device memory allocated: compute arenas grown, stored parts moved
    /// onto a device (bytes).
    pub bytes_allocated: u64,
    /// Bytes copied into stored tensors' parts other than by the graph's own
    /// writes: parts moved onto a device or into their planned state, and
    /// written caches copied back into their planned state.
    pub store_bytes_copied: u64,
    /// Bytes of stored parts that a device adopted where a file maps them
    /// (loaded weights on a CPU device, [`crate::Backend::map_buffer`]):
    /// neither allocated nor copied.
    pub bytes_mapped: u64,
    /// Device memory read to the host (the requested outputs), bytes.
    pub host_bytes_read: u64,
    /// Programs compiled.
    pub compiles: u64,
    /// Runs.
    pub runs: u64,
}

/// One output of a run: which tensor it is, its type and shape, and its
/// bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutput {
    /// The tensor read back (an id of the run's context).
    pub id: TensorId,
    /// Its name in reports ([`Context::display_name`]: its own name, or its
    /// op and nearest named source).
    pub name: String,
    /// Its type.
    pub ty: GgmlType,
    /// Its shape (ggml order, `ne[0]` innermost); `bytes` holds it
    /// contiguously.
    pub ne: [i64; 4],
    /// Its full contiguous bytes in logical element order, exactly what one
    /// device would hold; empty for a write into a stored tensor that the
    /// caller did not read back.
    pub bytes: Vec<u8>,
}

impl RunOutput {
    /// The values as f32 in ggml order (`ne[0]` fastest), converted from
    /// its type: F32, F16, BF16, F64, and block-quantized types dequantized
    /// as ggml's `dequantize_row_*` ([`crate::tensor::quant::dequantize_row`]).
    ///
    /// # Errors
    /// [`Error::UnsupportedType`] for an integer output (use
    /// [`RunOutput::i32`]); [`Error::DataMismatch`] if its bytes are not its
    /// shape's size (a write into a stored tensor not read back has none).
    pub fn f32(&self) -> Result<Vec<f32>> {
        crate::tensor::convert::read_contiguous(self.ty, self.ne, &self.bytes, &format!("run output {}", self.name))
    }

    /// The values as i32 in ggml order (`ne[0]` fastest): argmax, top_k,
    /// argsort results.
    ///
    /// # Errors
    /// [`Error::UnsupportedType`] naming the type for an output that is not
    /// I32; [`Error::DataMismatch`] if its bytes are not its shape's size.
    pub fn i32(&self) -> Result<Vec<i32>> {
        let (ty, ne) = (self.ty, self.ne);
        if ty != GgmlType::I32 {
            return Err(Error::unsupported_type(
                ty,
                format!("run output {} is {ty}, not I32 (read it as f32)", self.name),
            ));
        }
        let n: i64 = ne.iter().map(|&x| x.max(0)).product();
        if self.bytes.len() as i64 != n * 4 {
            return Err(Error::DataMismatch {
                name: self.name.clone(),
                detail: format!("{} bytes for {ty} {ne:?}, which needs {}", self.bytes.len(), n * 4),
            });
        }
        Ok(self.bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

/// What one run did.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// The requested outputs, in the order they were requested.
    pub outputs: Vec<RunOutput>,
    /// Bytes the communicator delivered, all devices together.
    pub bytes_moved: u64,
    /// Of those, bytes of conversions the plan did not contain (a view read
    /// again after its owner was written, a written cache returning to its
    /// planned state); 0 for plans of ordinary graphs.
    pub unplanned_bytes: u64,
    /// Number of local graphs (compute stages) each device ran.
    pub subgraphs: usize,
    /// Number of exchanges each device took part in (all between device
    /// buffers).
    pub device_conversions: usize,
    /// This run's share of [`ExecCounters`] (allocations, copies into stored
    /// tensors, host reads; `compiles` is 1 if it compiled its program).
    pub counters: ExecCounters,
}

impl RunReport {
    /// Output `k` (in the order the outputs were requested) as f32 values
    /// ([`RunOutput::f32`]).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] if there is no output `k`; as
    /// [`RunOutput::f32`].
    pub fn f32(&self, k: usize) -> Result<Vec<f32>> {
        self.output(k)?.f32()
    }

    /// Output `k` (in the order the outputs were requested) as i32 values
    /// ([`RunOutput::i32`]).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] if there is no output `k`; as
    /// [`RunOutput::i32`].
    pub fn i32(&self, k: usize) -> Result<Vec<i32>> {
        self.output(k)?.i32()
    }

    /// Output `k`, in the order the outputs were requested.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] if the run has no output `k`.
    pub fn output(&self, k: usize) -> Result<&RunOutput> {
        self.outputs.get(k).ok_or_else(|| Error::OutOfBounds {
            detail: format!("run output {k}: the run has {} outputs", self.outputs.len()),
        })
    }

    /// The output that read tensor `id` (the first, if it was asked for
    /// twice), or `None` if the run did not read it.
    pub fn get(&self, id: TensorId) -> Option<&RunOutput> {
        self.outputs.iter().find(|o| o.id == id)
    }
}

/// What a compiled program does per run ([`MetaExecutor::prepare`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramSummary {
    /// Local graphs (compute stages) per device.
    pub subgraphs: usize,
    /// Exchanges per device.
    pub exchanges: usize,
    /// Per device: bytes of intermediates (its share of the compute arena).
    pub compute_bytes: Vec<u64>,
}

/// A device's compute arena: the buffers every program's intermediates live
/// in (a device runs one program at a time).
#[derive(Default)]
struct Arena {
    chunks: Vec<Arc<dyn Buffer>>,
    generation: u64,
}

/// A program bound to the store's parts and the arenas on one device.
struct Bound {
    storage: TensorStorage,
    /// Per exchange stage, in order.
    exchanges: Vec<BoundExchange>,
}

struct BoundExchange {
    send: Vec<Option<BufSlice>>,
    recv: Vec<Option<BufSlice>>,
    /// The node to zero-fill instead of exchanging, and zeros to write.
    zero: Option<(BufSlice, Vec<u8>)>,
    unplanned: bool,
}

/// What a program is compiled for. A context's generation is not part of
/// it: a step graph rebuilt after a truncation has the same structure
/// (hash) and tensor ids, so its program still fits (llama.cpp's graph reuse).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    plan: u64,
    graph_hash: u64,
    ctx: u32,
    outputs: Vec<TensorId>,
}

/// A program's per-device bindings and what they were made for: the
/// store's binding key and each device's arena generation (`None` for
/// another process's device).
type Bindings = ((u64, u64), Vec<u64>, Vec<Option<Bound>>);

struct Entry {
    key: Key,
    program: Arc<Program>,
    bound: Option<Bindings>,
    /// The plan's fingerprint ([`Plan::fingerprint`]): what processes
    /// compare before a run.
    fingerprint: u64,
}

#[derive(Default)]
struct State {
    programs: Vec<Entry>,
    arenas: Vec<Arena>,
    host_comm: Option<Arc<HostComm>>,
    counters: ExecCounters,
}

impl std::fmt::Debug for MetaExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.devices.iter().map(|d| d.device().name).collect();
        f.debug_struct("MetaExecutor").field("devices", &names).finish()
    }
}

/// What a device thread hands back.
struct DeviceOut {
    outputs: Vec<Vec<u8>>,
    unplanned: u64,
    read: u64,
}

impl MetaExecutor {
    /// An executor over the given devices, one per rank, in plan order
    /// (device `j` runs rank `j`'s part): CUDA devices, virtual devices on
    /// one GPU, CPU instances, or a mix. Stored parts and activations live
    /// in each device's buffers. What [`super::Devices::executor`] calls.
    ///
    /// # Errors
    /// [`Error::Split`] for no devices or more than
    /// [`super::MAX_DEVICES`].
    pub(crate) fn with_backends(devices: Vec<Arc<dyn Backend>>, ratios: Vec<f32>) -> Result<Self> {
        let n = devices.len();
        if n == 0 || n > super::MAX_DEVICES {
            return Err(Error::Split { detail: format!("{n} devices: need 1..={}", super::MAX_DEVICES) });
        }
        if ratios.len() != n {
            return Err(Error::Split { detail: format!("{} tensor-split ratios for {n} devices", ratios.len()) });
        }
        let comm = Mutex::new(Self::native_comm(&devices));
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let ids = (0..n).map(|_| NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)).collect();
        let state = State { arenas: (0..n).map(|_| Arena::default()).collect(), ..State::default() };
        let local = vec![true; n];
        Ok(MetaExecutor { devices, ratios, ids, comm, group: None, local, state: Mutex::new(state) })
    }

    /// NCCL for CUDA devices on distinct GPUs, when it loads; else `None`
    /// (the runs use [`HostComm`]: device-to-device copies).
    fn native_comm(devices: &[Arc<dyn Backend>]) -> Option<Arc<dyn Comm>> {
        #[cfg(sg_gpu)]
        if devices.len() > 1 && devices.iter().all(|d| d.device().kind == crate::backend::DeviceKind::Gpu) {
            match super::NcclComm::for_backends(devices) {
                Ok(c) => return Some(Arc::new(c)),
                Err(e) => log::info!("meta backend: no NCCL, device-to-device copies instead: {e}"),
            }
        }
        let _ = devices;
        None
    }

    /// Makes every run use `comm` (one with [`MetaExecutor::n_devices`]
    /// ranks, e.g. an NCCL communicator), or, with `None`, the executor's
    /// own [`HostComm`]. After a run fails in an exchange, its communicator
    /// is dropped (an aborted communicator fails every later call) and later
    /// runs use a fresh [`HostComm`].
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

    /// Makes the executor one of `group`'s processes: it runs only its own
    /// devices, and every run ends with all processes (outcome, bytes moved,
    /// outputs). Set by [`super::Devices::executor`].
    pub(crate) fn set_group(&mut self, group: Arc<dyn ProcessGroup>) {
        self.local = (0..self.devices.len()).map(|j| group.owner(j) == group.rank()).collect();
        self.group = Some(group);
    }

    /// True if runs use a communicator set by [`MetaExecutor::set_comm`] or
    /// found at creation (NCCL).
    pub fn has_comm(&self) -> bool {
        self.comm.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// True when every device is a GPU, so parts and activations live in
    /// device memory (CPU devices' buffers are host memory).
    pub fn device_data(&self) -> bool {
        self.devices.iter().all(|d| d.device().kind == crate::backend::DeviceKind::Gpu)
    }

    /// The devices, in rank order.
    pub fn devices(&self) -> &[Arc<dyn Backend>] {
        &self.devices
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        self.devices.len()
    }

    /// The tensor-split ratios of the [`super::Devices`] this executor was
    /// made from, one per device: what a split policy for these devices
    /// must use ([`super::Devices::check_ratios`]).
    pub fn ratios(&self) -> &[f32] {
        &self.ratios
    }

    /// Checks that `given` (`what` names what was made with it) are this
    /// executor's tensor-split ratios ([`super::Devices::check_ratios`]).
    ///
    /// # Errors
    /// [`Error::Split`] naming `what` and both lists when they differ.
    pub fn check_ratios(&self, given: &[f32], what: &str) -> Result<()> {
        super::devices::same_tensor_split(&self.ratios, given, what)
    }

    /// Checks that device `j` can hold `need[j]` more bytes (weights and
    /// caches about to be placed), before anything is allocated: a GPU
    /// against its memory (a virtual device's share), CPU devices together
    /// against the host's available memory — for devices across processes
    /// (one call on every process) the CPU devices of each machine against
    /// that machine's, as its processes report it, so every process gives
    /// the same answer. `what` says what needs it.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming the device, the bytes needed and the
    /// bytes available (on every process alike); [`Error::Split`] for a
    /// list of another length.
    pub fn check_memory(&self, need: &[u64], what: &str) -> Result<()> {
        self.check_memory_leaving(need, what, 0)
    }

    /// [`MetaExecutor::check_memory`] with `host_headroom` bytes of each
    /// machine's available host memory left free (counted as not
    /// available).
    fn check_memory_leaving(&self, need: &[u64], what: &str, host_headroom: u64) -> Result<()> {
        if need.len() != self.devices.len() {
            return Err(Error::Split { detail: format!("{} sizes for {} devices", need.len(), self.devices.len()) });
        }
        // Each machine's available host memory (the least its processes
        // report), and each device's machine.
        let here = crate::backend::cpu::host_memory_available().map(|b| b.saturating_sub(host_headroom));
        let (node_of, avail): (Vec<usize>, Vec<Option<u64>>) = match &self.group {
            None => (vec![0; need.len()], vec![here]),
            Some(g) => {
                let said = g.all_gather(here.map(|b| b.to_string()).unwrap_or_default().as_bytes());
                let mut avail: Vec<Option<u64>> = vec![None; g.n_processes()];
                for (p, b) in said.iter().enumerate() {
                    let Some(b) = std::str::from_utf8(b).ok().and_then(|t| t.parse::<u64>().ok()) else { continue };
                    let n = g.node(p).min(avail.len() - 1);
                    avail[n] = Some(avail[n].map_or(b, |a: u64| a.min(b)));
                }
                ((0..need.len()).map(|j| g.node(g.owner(j))).collect(), avail)
            }
        };
        let mut host: Vec<(u64, Vec<String>, Vec<String>)> = vec![(0, Vec::new(), Vec::new()); avail.len()];
        for (j, (d, &b)) in self.devices.iter().zip(need).enumerate() {
            let info = d.device();
            // Across processes, a device's name says whose it is (`CPU0@1`).
            let name = match &self.group {
                Some(g) => format!("{}@{}", info.name, g.owner(j)),
                None => info.name.clone(),
            };
            if info.kind == crate::backend::DeviceKind::Gpu && info.memory_total > 0 {
                if b > info.memory_total as u64 {
                    return Err(Error::OutOfMemory {
                        device: format!("device {j} ({name})"),
                        detail: what.to_string(),
                        needed: b,
                        available: info.memory_total as u64,
                    });
                }
            } else if info.kind == crate::backend::DeviceKind::Cpu {
                let Some(h) = host.get_mut(node_of[j]) else { continue };
                h.0 = h.0.saturating_add(b);
                h.1.push(j.to_string());
                h.2.push(name);
            }
        }
        for ((needed, ranks, names), avail) in host.into_iter().zip(avail) {
            let Some(available) = avail.filter(|&a| needed > a) else { continue };
            return Err(Error::OutOfMemory {
                device: format!(
                    "device{} {} ({}, host memory)",
                    if ranks.len() > 1 { "s" } else { "" },
                    ranks.join("+"),
                    names.join("+")
                ),
                detail: what.to_string(),
                needed,
                available,
            });
        }
        Ok(())
    }

    /// Checks, before anything is allocated, that every device can hold
    /// what `memory` says it needs ([`Plan::memory`], or a session's
    /// `fit::session_memory` in the crate `shardgraph-models`): each device's
    /// [`DeviceMemory::total`] as [`MetaExecutor::check_memory`] checks it
    /// (a GPU against its memory, CPU devices together against the host's
    /// available memory less [`FIT_HOST_HEADROOM`]: the host's available
    /// memory moves between a fit and the load it sizes, which checks
    /// again without it). `what` says what needs it.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming the device, the bytes needed and the
    /// bytes available (less the headroom); [`Error::Split`] for a list of
    /// another length.
    pub fn check_fit(&self, memory: &[DeviceMemory], what: &str) -> Result<()> {
        let need: Vec<u64> = memory.iter().map(DeviceMemory::total).collect();
        self.check_memory_leaving(&need, &format!("{what}, leaving 1 GiB of host memory free"), FIT_HOST_HEADROOM)
    }

    /// What the executor allocated, copied into stored tensors and read to
    /// the host so far (see [`ExecCounters`]).
    pub fn counters(&self) -> ExecCounters {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).counters
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
            // A scratch destination (`cast`) is written before it is read: not stored.
            if ctx.tensor(l)?.flags.scratch {
                continue;
            }
            if let Some(b) = leaf_data(l) {
                let want = ctx.tensor(l)?.nbytes();
                if b.len() != want {
                    return Err(Error::Split {
                        detail: format!("leaf #{} data is {} bytes, the tensor {want}", l.index(), b.len()),
                    });
                }
                store.set_tensor(ctx, l, 0, &b)?;
            }
        }
        Ok(self.execute(ctx, graph, plan, &mut store, outputs)?.outputs.into_iter().map(|o| o.bytes).collect())
    }

    /// Runs `plan` for `graph`: leafs are read from `store` (leafs not
    /// placed there are placed zero-filled in their planned state), tensors
    /// written through views (`cpy`, `set_rows` into caches) are written in
    /// the store's parts, and the full bytes of `outputs` are returned with
    /// the bytes moved. The first run of a plan compiles it; later runs of
    /// the same plan (same graph, same outputs) reuse the program.
    ///
    /// # Errors
    /// [`Error::Split`] if the plan is for another graph or device count, or
    /// a local computation or exchange fails (naming the device and the
    /// node; the other devices are released). A failed run may have written
    /// part of what it writes into the store.
    pub fn execute(
        &self,
        ctx: &Context,
        graph: &Graph,
        plan: &Plan,
        store: &mut SplitStore,
        outputs: &[TensorId],
    ) -> Result<RunReport> {
        let set = self.comm.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(comm) = set {
            let r = self.execute_with(ctx, graph, plan, store, outputs, &*comm);
            if let (Err(e), true, None) = (&r, comm.is_aborted(), &self.group) {
                log::warn!("meta backend: a run failed in an exchange ({e}); later runs use a HostComm");
                *self.comm.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
            return r;
        }
        let comm = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.host_comm.as_ref().is_none_or(|c| c.is_aborted()) {
                // More device threads than cores: waiting ranks give way at once.
                let threads: usize = self.devices.iter().map(|d| d.worker_threads()).sum();
                let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
                let n = self.devices.len();
                st.host_comm =
                    Some(Arc::new(if threads > cores { HostComm::oversubscribed(n) } else { HostComm::new(n) }));
            }
            st.host_comm.clone()
        };
        let comm = comm.ok_or_else(|| Error::Split { detail: "no communicator".into() })?;
        self.execute_with(ctx, graph, plan, store, outputs, &*comm)
    }

    /// [`MetaExecutor::execute`] over a given communicator (one with
    /// `n_devices()` ranks).
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
                detail: format!(
                    "plan ({}), store ({}), communicator ({}) and executor ({n}) disagree on the device count",
                    plan.n_devices,
                    store.n_devices(),
                    comm.n_ranks()
                ),
            });
        }
        plan.check_graph(ctx, graph)?;
        for &o in outputs {
            ctx.tensor(o)?;
        }
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *guard;
        let before = st.counters;
        st.counters.runs += 1;
        self.find_or_compile(st, ctx, graph, plan, outputs)?;
        if let (Some(g), Some(e)) = (&self.group, st.programs.last()) {
            // Processes that diverged stop here, before any exchange (and
            // without ending the run together: they would not meet).
            if let Err(e) = g.begin_run(e.fingerprint) {
                comm.abort();
                return Err(e);
            }
        }
        let local = self.run_local(st, ctx, graph, plan, store, comm);
        let (program, mut devs, moved) = match &self.group {
            None => local?,
            Some(g) => {
                if local.is_err() {
                    // Whatever failed, the other processes must not wait for this one.
                    comm.abort();
                }
                let text = |e: &Error| match e {
                    Error::Split { detail } => detail.clone(),
                    e => e.to_string(),
                };
                let total = g.finish_run(local.as_ref().map(|x| x.2).map_err(text))?;
                let (program, devs, _) = local?;
                (program, devs, total)
            }
        };
        let counters = &mut st.counters;
        counters.host_bytes_read += devs.iter().flatten().map(|d| d.read).sum::<u64>();
        counters.store_bytes_copied += program.devices.iter().map(|d| d.writeback_bytes).sum::<u64>();
        let mut report = RunReport {
            outputs: Vec::with_capacity(outputs.len()),
            bytes_moved: moved,
            unplanned_bytes: devs.iter().flatten().map(|d| d.unplanned).sum(),
            subgraphs: program.n_subgraphs,
            device_conversions: program.n_exchanges,
            counters: ExecCounters::default(),
        };
        for (k, o) in program.outputs.iter().enumerate() {
            let t = ctx.t(o.tensor);
            let parts = self.output_parts(&mut devs, k, &o.state)?;
            let bytes = assemble(t.ty, t.ne, &parts, &o.state)?;
            let name = ctx.display_name(o.tensor);
            report.outputs.push(RunOutput { id: o.tensor, name, ty: t.ty, ne: t.ne, bytes });
        }
        let c = *counters;
        report.counters = ExecCounters {
            bytes_allocated: c.bytes_allocated - before.bytes_allocated,
            store_bytes_copied: c.store_bytes_copied - before.store_bytes_copied,
            bytes_mapped: c.bytes_mapped - before.bytes_mapped,
            host_bytes_read: c.host_bytes_read - before.host_bytes_read,
            compiles: c.compiles - before.compiles,
            runs: 1,
        };
        Ok(report)
    }

    /// Every device's part of output `k` (taken out of `devs`): this
    /// process's from its devices, another process's broadcast from it. A
    /// mirrored output is read once, from this process's first device.
    fn output_parts(
        &self,
        devs: &mut [Option<DeviceOut>],
        k: usize,
        state: &super::SplitState,
    ) -> Result<Vec<Vec<u8>>> {
        let n = self.devices.len();
        let mut parts: Vec<Vec<u8>> = vec![Vec::new(); n];
        if *state == super::SplitState::Mirrored {
            let first = self.local.iter().position(|&l| l).unwrap_or(0);
            if let Some(d) = devs.get_mut(first).and_then(|d| d.as_mut()) {
                parts[0] = std::mem::take(&mut d.outputs[k]);
            }
            return Ok(parts);
        }
        for (j, part) in parts.iter_mut().enumerate() {
            if let Some(d) = devs.get_mut(j).and_then(|d| d.as_mut()) {
                *part = std::mem::take(&mut d.outputs[k]);
            }
            if let Some(g) = &self.group {
                g.broadcast(g.owner(j), part)?;
            }
        }
        Ok(parts)
    }

    /// This process's side of a run of the program last found or compiled
    /// (the same on every process): the store and arenas made ready, and
    /// this process's devices run (a thread each); per device, its part of
    /// the outputs (`None` for another process's), and the bytes its
    /// devices received.
    fn run_local(
        &self,
        st: &mut State,
        ctx: &Context,
        graph: &Graph,
        plan: &Plan,
        store: &mut SplitStore,
        comm: &dyn Comm,
    ) -> Result<(Arc<Program>, Vec<Option<DeviceOut>>, u64)> {
        let n = self.devices.len();
        let State { programs, arenas, counters, .. } = st;
        let Some(program) = programs.last().map(|e| e.program.clone()) else {
            return Err(Error::Split { detail: "program cache".into() });
        };
        if self.arenas_short(&program, arenas) {
            // Bindings hold the arenas' buffers: let go of them before a
            // chunk grows, so the grown chunk replaces the old one instead
            // of adding to it (programs are bound again at their next run).
            for e in programs.iter_mut() {
                e.bound = None;
            }
        }
        let Some(entry) = programs.last_mut() else { return Err(Error::Split { detail: "program cache".into() }) };
        // A program bound to the store as it is has every leaf placed and on
        // the devices: nothing to check per step.
        if entry.bound.as_ref().is_none_or(|b| b.0 != store.binding_key()) {
            store.place_leafs(ctx, graph, plan)?;
            self.prepare_store(ctx, &program, store, counters)?;
        }
        self.grow_arenas(&program, arenas, counters)?;
        let store_key = store.binding_key();
        let same_arenas = |gens: &[u64]| gens.iter().copied().eq(arenas.iter().map(|a| a.generation));
        if entry.bound.as_ref().is_none_or(|b| b.0 != store_key || !same_arenas(&b.1)) {
            let bound = (0..n)
                .map(|j| if self.local[j] { self.bind(&program, j, store, &arenas[j]).map(Some) } else { Ok(None) })
                .collect::<Result<Vec<_>>>()?;
            entry.bound = Some((store_key, arenas.iter().map(|a| a.generation).collect(), bound));
        }
        let Some((_, _, bound)) = entry.bound.as_ref() else { return Err(Error::Split { detail: "binding".into() }) };
        let received = |c: &dyn Comm| -> u64 {
            c.bytes_received().iter().enumerate().filter(|(j, _)| self.local[*j]).map(|(_, b)| b).sum()
        };
        let moved_before = received(comm);
        // This process's first device runs on the calling thread, the others
        // on threads of their own.
        let mine: Vec<usize> = (0..n).filter(|&j| self.local[j]).collect();
        let run = |j: usize| match &bound[j] {
            Some(b) => self.run_device(&program, j, b, comm),
            None => Err(Error::Split { detail: format!("device {j} is not bound") }),
        };
        let Some((&head, rest)) = mine.split_first() else {
            return Err(Error::Split { detail: "no device of this process".into() });
        };
        let results: Vec<(usize, Result<DeviceOut>)> = std::thread::scope(|sc| {
            let handles: Vec<_> = rest.iter().map(|&j| (j, sc.spawn(move || run(j)))).collect();
            let first = (head, run(head));
            std::iter::once(first)
                .chain(handles.into_iter().map(|(j, h)| {
                    (j, h.join().unwrap_or_else(|_| Err(Error::Split { detail: "a device thread panicked".into() })))
                }))
                .collect()
        });
        store.device_wrote(&program.written);
        let mut devs: Vec<Option<DeviceOut>> = (0..n).map(|_| None).collect();
        let mut errs = Vec::new();
        for (j, r) in results {
            match r {
                Ok(d) => devs[j] = Some(d),
                Err(e) => errs.push(e),
            }
        }
        if !errs.is_empty() {
            // The first real error (not another device's failure).
            let pick = errs.iter().position(|e| !super::comm::is_peer_failure(e)).unwrap_or(0);
            return Err(errs.swap_remove(pick));
        }
        Ok((program, devs, received(comm) - moved_before))
    }

    /// Compiles `plan` for `graph` with `outputs` requested (or finds the
    /// program compiled before, as [`MetaExecutor::execute`] does first) and
    /// describes it, without touching any data: what a run of it will do.
    ///
    /// # Errors
    /// As [`MetaExecutor::execute`]'s planning and compiling.
    pub fn prepare(&self, ctx: &Context, graph: &Graph, plan: &Plan, outputs: &[TensorId]) -> Result<ProgramSummary> {
        if plan.n_devices != self.devices.len() {
            return Err(Error::Split { detail: format!("a plan for {} devices", plan.n_devices) });
        }
        plan.check_graph(ctx, graph)?;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.find_or_compile(&mut st, ctx, graph, plan, outputs)?;
        let Some(program) = st.programs.last().map(|e| e.program.clone()) else {
            return Err(Error::Split { detail: "program cache".into() });
        };
        Ok(ProgramSummary {
            subgraphs: program.n_subgraphs,
            exchanges: program.n_exchanges,
            compute_bytes: program.compute_bytes(),
        })
    }

    /// Moves the program for (`plan`, `graph`, `outputs`) to the end of the
    /// cache (most recently used last), compiling it first if it is not
    /// there; the least recently used program leaves a full cache.
    fn find_or_compile(
        &self,
        st: &mut State,
        ctx: &Context,
        graph: &Graph,
        plan: &Plan,
        outputs: &[TensorId],
    ) -> Result<()> {
        let found = st.programs.iter().position(|e| {
            let k = &e.key;
            k.plan == plan.id && k.graph_hash == graph.hash() && k.ctx == ctx.id() && k.outputs == outputs
        });
        if let Some(i) = found {
            if i + 1 != st.programs.len() {
                let entry = st.programs.remove(i);
                st.programs.push(entry);
            }
            return Ok(());
        }
        let key = Key { plan: plan.id, graph_hash: graph.hash(), ctx: ctx.id(), outputs: outputs.to_vec() };
        let bts: Vec<_> = self.devices.iter().map(|d| d.buffer_type()).collect();
        let program = Program::compile(ctx, graph, plan, outputs, &bts)?;
        let fingerprint = plan.fingerprint(&self.ratios);
        if let Some(g) = &self.group {
            // Every process must run the same program: compared before any
            // part is moved onto a device.
            g.same_everywhere(fingerprint, "plan")?;
        }
        if log::log_enabled!(log::Level::Trace) {
            for (j, d) in program.devices.iter().enumerate() {
                for id in d.graph.nodes() {
                    let t = d.ctx.t(*id);
                    let srcs: Vec<String> = t.src.iter().map(|s| format!("#{}", s.index())).collect();
                    log::trace!("device {j}: #{} {} {} <- {}", id.index(), t.op.name(), t.describe(), srcs.join(" "));
                }
            }
        }
        st.counters.compiles += 1;
        if st.programs.len() >= MAX_PROGRAMS {
            st.programs.remove(0);
        }
        st.programs.push(Entry { key, program: Arc::new(program), bound: None, fingerprint });
        Ok(())
    }

    /// A buffer of `len` bytes on device `j`, counted.
    fn alloc(&self, j: usize, len: usize, counters: &mut ExecCounters) -> Result<Arc<dyn Buffer>> {
        let b = self.devices[j].alloc_buffer(len.max(1))?;
        counters.bytes_allocated += len.max(1) as u64;
        Ok(b)
    }

    /// Puts every stored tensor `program` binds into its planned state (on
    /// the host, once, if the store holds it otherwise) and into each
    /// device's buffers (moved there once; zeros are allocated, not copied).
    fn prepare_store(
        &self,
        ctx: &Context,
        program: &Program,
        store: &mut SplitStore,
        counters: &mut ExecCounters,
    ) -> Result<()> {
        let n = self.devices.len();
        for b in &program.bindings {
            let t = ctx.t(b.tensor);
            let s = store.get_stored(b.tensor).ok_or_else(|| store.not_placed(ctx, b.tensor))?;
            if s.state != b.state {
                // Kept in another state than planned: laid out anew (host memory, once).
                let parts: Vec<Vec<u8>> =
                    s.locals.iter().map(|x| x.bytes().map(|b| b.to_vec())).collect::<Result<_>>()?;
                let full = assemble(t.ty, t.ne, &parts, &s.state)?;
                let locals = (0..n)
                    .map(|j| slice_local(t.ty, t.ne, &full, &b.state, j).map(|v| Part::host(Arc::new(v))))
                    .collect::<Result<Vec<_>>>()?;
                store.put_stored(b.tensor, Stored { state: b.state.clone(), locals, layout: Some((t.ty, t.ne)) });
            }
            for j in (0..n).filter(|&j| self.local[j]) {
                self.move_part(store, b.tensor, j, counters)?;
            }
        }
        Ok(())
    }

    /// Moves every part `store` holds onto its device now (as the first run
    /// would): weights are copied once, zero-filled caches only allocated,
    /// so a model's first step does not pay for loading it.
    ///
    /// # Errors
    /// [`Error::Split`] for a store of another device count; allocation and
    /// copy errors.
    pub fn upload(&self, store: &mut SplitStore) -> Result<()> {
        if store.n_devices() != self.devices.len() {
            return Err(Error::Split { detail: format!("a store for {} devices", store.n_devices()) });
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for id in store.ids() {
            for j in (0..self.devices.len()).filter(|&j| self.local[j]) {
                self.move_part(store, id, j, &mut st.counters)?;
            }
        }
        Ok(())
    }

    /// Moves device `j`'s part of stored tensor `id` into that device's
    /// memory unless it is there (counted; zeros are allocated, not copied).
    fn move_part(&self, store: &mut SplitStore, id: TensorId, j: usize, counters: &mut ExecCounters) -> Result<()> {
        let Some(part) = store.get_stored(id).map(|s| s.locals[j].clone()) else { return Ok(()) };
        if part.slice_on(self.ids[j]).is_some() {
            return Ok(());
        }
        let len = part.len();
        // Loaded weights in a mapped file: adopted where they are mapped by
        // a device that computes on host memory.
        if let Some(buf) = part.mapped_bytes().and_then(|m| self.devices[j].map_buffer(m)) {
            let buf = buf?;
            counters.bytes_mapped += len as u64;
            store.put_part(id, j, Part::device(self.ids[j], BufSlice { buf, offset: 0, len }));
            return Ok(());
        }
        let buf = self.alloc(j, len, counters)?;
        if !part.is_lazy_zeros() {
            buf.set(0, part.host_slice()?)?;
            counters.store_bytes_copied += len as u64;
        }
        store.put_part(id, j, Part::device(self.ids[j], BufSlice { buf, offset: 0, len }));
        Ok(())
    }

    /// True if some device's arena is too small for `program`.
    fn arenas_short(&self, program: &Program, arenas: &[Arena]) -> bool {
        program.devices.iter().zip(arenas).zip(&self.local).filter(|(_, &l)| l).any(|((d, a), _)| {
            d.chunk_sizes.iter().enumerate().any(|(c, &need)| a.chunks.get(c).map_or(0, |b| b.size()) < need.max(1))
        })
    }

    /// Makes each device's arena hold `program`'s intermediates. A chunk
    /// that grows is freed before its replacement is allocated (with the
    /// chunks after it, which are allocated again at least as large), so a
    /// device never holds two generations of its arena.
    fn grow_arenas(&self, program: &Program, arenas: &mut [Arena], counters: &mut ExecCounters) -> Result<()> {
        for (j, (d, a)) in program.devices.iter().zip(arenas.iter_mut()).enumerate() {
            if !self.local[j] {
                continue;
            }
            let old: Vec<usize> = a.chunks.iter().map(|b| b.size()).collect();
            for (c, &need) in d.chunk_sizes.iter().enumerate() {
                let have = a.chunks.get(c).map_or(0, |b| b.size());
                if have < need.max(1) {
                    a.chunks.truncate(c);
                    let size = need.max(old.get(c).copied().unwrap_or(0));
                    let buf = self.alloc(j, size, counters)?;
                    a.chunks.push(buf);
                    a.generation += 1;
                }
            }
        }
        Ok(())
    }

    /// Device `j`'s storage for `program`: stored tensors in the store's
    /// parts, intermediates in the arena, and the exchanges' slices.
    fn bind(&self, program: &Program, j: usize, store: &SplitStore, arena: &Arena) -> Result<Bound> {
        let d = &program.devices[j];
        let l = &d.ctx;
        let mut storage = TensorStorage::new();
        storage.bind_ctx(l)?;
        for b in &program.bindings {
            let part = store.get_stored(b.tensor).map(|s| s.locals[j].clone());
            let s = part
                .as_ref()
                .and_then(|p| p.slice_on(self.ids[j]))
                .ok_or_else(|| Error::Split { detail: format!("tensor #{} is not on device {j}", b.tensor.index()) })?;
            if s.len < l.t(b.local[j]).nbytes() {
                return Err(Error::Split { detail: format!("device {j}: a stored part smaller than its tensor") });
            }
            let k = storage.add_buffer(s.buf.clone());
            storage.place(b.local[j], k, s.offset);
        }
        let chunks: Vec<usize> = arena.chunks.iter().map(|c| storage.add_buffer(c.clone())).collect();
        for &(lid, c, off) in &d.placements {
            let k = *chunks.get(c).ok_or_else(|| Error::Split { detail: "arena chunk".into() })?;
            storage.place(lid, k, off);
        }
        let slice = |id: TensorId, off: usize, len: usize| -> Result<BufSlice> {
            let (buf, o) = storage.locate(l, id)?;
            Ok(BufSlice { buf: buf.clone(), offset: o + off, len })
        };
        let mut exchanges = Vec::new();
        for stage in &d.stages {
            let Stage::Exchange(x) = stage else { continue };
            let node = x.node;
            let send = x
                .send
                .iter()
                .map(|m| m.map(|(id, off, len)| slice(id, off, len)).transpose())
                .collect::<Result<_>>()?;
            let recv =
                x.recv.iter().map(|r| r.map(|(off, len)| slice(node, off, len)).transpose()).collect::<Result<_>>()?;
            let zero = if x.zero {
                let len = l.t(node).nbytes();
                Some((slice(node, 0, len)?, vec![0u8; len]))
            } else {
                None
            };
            exchanges.push(BoundExchange { send, recv, zero, unplanned: x.unplanned });
        }
        Ok(Bound { storage, exchanges })
    }

    /// Device `j`'s side of a run: its stages, then its parts of the outputs.
    fn run_device(&self, program: &Program, j: usize, bound: &Bound, comm: &dyn Comm) -> Result<DeviceOut> {
        let d = &program.devices[j];
        let backend = &*self.devices[j];
        let mut unplanned = 0u64;
        let mut steps = || -> Result<()> {
            let mut k = 0;
            for stage in &d.stages {
                match stage {
                    Stage::Compute(g) => backend.compute_async(&d.ctx, g, &bound.storage).map_err(|e| {
                        let first = g.nodes().first().map(|&id| d.ctx.t(id));
                        let what = first.map(|t| format!("{} {}", t.op.name(), t.describe())).unwrap_or_default();
                        Error::Split { detail: format!("device {j}: local graph from {what}: {e}") }
                    })?,
                    Stage::Exchange(_) => {
                        let x = &bound.exchanges[k];
                        k += 1;
                        if let Some((s, zeros)) = &x.zero {
                            s.buf.set(s.offset, zeros)?;
                            continue;
                        }
                        let before = if x.unplanned { comm.bytes_received().get(j).copied().unwrap_or(0) } else { 0 };
                        comm.exchange(j, &x.send, &x.recv)?;
                        if x.unplanned {
                            unplanned += comm.bytes_received().get(j).copied().unwrap_or(0).saturating_sub(before);
                        }
                    }
                }
            }
            // One wait per run: the device's queued work and its error flags.
            backend.synchronize().map_err(|e| Error::Split { detail: format!("device {j}: {e}") })
        };
        // A panic (a bug, or a foreign Comm) must not leave the other devices
        // waiting in an exchange: it aborts them.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| backend.run_on_device(&mut steps)))
            .unwrap_or_else(|p| {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                Err(Error::Split { detail: format!("device {j} panicked: {what}") })
            });
        if let Err(e) = r {
            comm.abort();
            // Queued work of a failed run is waited for (its errors are moot).
            let _ = backend.synchronize();
            return Err(e);
        }
        let mut outputs = Vec::with_capacity(program.outputs.len());
        let mut read = 0u64;
        for o in &program.outputs {
            // A mirrored output is read from this process's first device
            // only (the others hold copies).
            // One on a group: from its first member.
            let not_first = matches!(o.state, super::state::SplitState::MirroredOn(_))
                && o.state.holders(self.devices.len()).iter().next() != Some(j);
            if not_first
                || o.state == super::state::SplitState::Mirrored && self.local.iter().position(|&l| l) != Some(j)
            {
                outputs.push(Vec::new());
                continue;
            }
            let lid = o.local[j];
            let mut v = vec![0u8; d.ctx.t(lid).nbytes()];
            bound.storage.get_bytes(&d.ctx, lid, 0, &mut v)?;
            read += v.len() as u64;
            outputs.push(v);
        }
        Ok(DeviceOut { outputs, unplanned, read })
    }

    /// Lowers `plan` (exposed for reports and tests).
    ///
    /// # Errors
    /// As [`lower`].
    pub fn lower(&self, ctx: &Context, graph: &Graph, plan: &Plan) -> Result<Lowered> {
        lower(ctx, graph, plan)
    }
}
