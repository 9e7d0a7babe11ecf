//! [`Devices`]: the one value a tensor-parallel run is configured by — the
//! backends (one per rank), the tensor-split ratios, the threads of CPU
//! devices and the communicator — from which the split policy, the store and
//! the executor take their device count, so they cannot disagree.

use super::{
    Comm, DeviceSet, LinkClass, LinkModel, Links, MetaExecutor, ProcessGroup, SplitMode, SplitPolicy, SplitStore,
};
use crate::backend::cpu::{CpuBackend, CpuConfig};
use crate::backend::Backend;
use crate::error::{Error, Result};
use std::sync::Arc;

/// The most devices one tensor split takes.
pub const MAX_DEVICES: usize = 64;

/// The most worker threads of all CPU devices together.
const MAX_CPU_THREADS: usize = 1024;

/// N devices with their tensor-split ratios (llama.cpp's `--device`,
/// `--tensor-split` and `--threads`): device `j` runs rank `j` of every plan
/// and holds the share `ratios[j] / Σ ratios` of each split tensor.
///
/// ```
/// use shardgraph::split::Devices;
/// let devices = Devices::cpu(3, 1)?.with_tensor_split(&[2.0, 1.0, 1.0])?;
/// let policy = devices.policy()?; // add the rules, then plan
/// let store = devices.store(); // weights and caches on the 3 devices
/// let exec = devices.executor()?; // runs plans on them
/// assert_eq!((policy.n_devices(), store.n_devices(), exec.n_devices()), (3, 3, 3));
/// # Ok::<(), shardgraph::Error>(())
/// ```
#[derive(Clone)]
pub struct Devices {
    backends: Vec<Arc<dyn Backend>>,
    ratios: Vec<f32>,
    threads: usize,
    comm: Option<Arc<dyn Comm>>,
    /// The processes the devices span (feature `mpi`); `None`: all are this
    /// process's.
    group: Option<Arc<dyn ProcessGroup>>,
    mode: SplitMode,
    /// Device groups the embedder set ([`Devices::with_groups`]).
    groups: Option<Vec<DeviceSet>>,
    /// Why GPUs across processes exchange over MPI rather than NCCL/RCCL.
    why_not_native: Option<String>,
}

impl std::fmt::Debug for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Devices")
            .field("names", &self.names())
            .field("ratios", &self.ratios)
            .field("threads", &self.threads)
            .field("comm", &self.comm.is_some())
            .field("processes", &self.group.as_ref().map_or(1, |g| g.n_processes()))
            .finish()
    }
}

impl Devices {
    /// `n` CPU devices with `threads` worker threads each, equal ratios.
    ///
    /// # Errors
    /// [`Error::Split`] for `n` outside `1..=64`, `threads` of 0, or more
    /// than 1024 threads in all; CPU backend errors.
    pub fn cpu(n: usize, threads: usize) -> Result<Self> {
        check_count(n)?;
        check_threads(n, threads)?;
        let backends = (0..n).map(|_| cpu_device(threads)).collect::<Result<Vec<_>>>()?;
        Ok(Devices {
            ratios: vec![1.0; n],
            threads,
            backends,
            comm: None,
            group: None,
            mode: SplitMode::Tensor,
            groups: None,
            why_not_native: None,
        })
    }

    /// The devices `names` lists, one per rank, equal ratios (llama.cpp's
    /// `--device`, case-insensitive): `CPU` (a CPU device with `threads`
    /// worker threads), `CUDA<i>` (NVIDIA GPU `i`, feature `cuda`), `HIP<i>`
    /// (AMD GPU `i`, feature `hip`), where a GPU named k times gives k
    /// virtual devices on it, each with its own stream and an equal share of
    /// its memory; `EMU` and `EMUHIP` (an emulated NVIDIA GPU, an emulated
    /// AMD CDNA GPU; feature `cuda-emu`, slow, for tests). `<i>` is 1 to 9
    /// decimal digits.
    ///
    /// # Errors
    /// [`Error::Split`] for no names, more than 64, a name that is none of
    /// these or that this build cannot open (saying which feature it needs),
    /// a bad thread count; opening a GPU ([`Error::Cuda`], [`Error::Hip`]:
    /// no driver, no such GPU).
    pub fn open(names: &[&str], threads: usize) -> Result<Self> {
        check_count(names.len())?;
        let kinds = names.iter().map(|n| DeviceName::parse(n)).collect::<Result<Vec<_>>>()?;
        let n_cpu = kinds.iter().filter(|k| **k == DeviceName::Cpu).count();
        if n_cpu > 0 {
            check_threads(n_cpu, threads)?;
        }
        let backends = open_backends(&kinds, threads)?;
        let n = backends.len();
        Ok(Devices {
            backends,
            ratios: vec![1.0; n],
            threads,
            comm: None,
            group: None,
            mode: SplitMode::Tensor,
            groups: None,
            why_not_native: None,
        })
    }

    /// [`Devices::open`] over a comma-separated list (`"CUDA0,CUDA1"`), as
    /// llama.cpp's `--device` takes it.
    ///
    /// # Errors
    /// As [`Devices::open`].
    pub fn parse(list: &str, threads: usize) -> Result<Self> {
        let names: Vec<&str> = list.split(',').map(str::trim).collect();
        Self::open(&names, threads)
    }

    /// Devices you opened yourself, one per rank in plan order, equal ratios
    /// ([`Devices::threads`] reports 0: their threads are their own).
    ///
    /// # Errors
    /// [`Error::Split`] for no devices or more than 64.
    pub fn from_backends(backends: Vec<Arc<dyn Backend>>) -> Result<Self> {
        check_count(backends.len())?;
        let n = backends.len();
        Ok(Devices {
            backends,
            ratios: vec![1.0; n],
            threads: 0,
            comm: None,
            group: None,
            mode: SplitMode::Tensor,
            groups: None,
            why_not_native: None,
        })
    }

    /// The same devices with tensor-split ratios (llama.cpp's
    /// `--tensor-split`): any non-negative numbers, not all zero; device `j`
    /// gets the share `ratios[j] / Σ ratios` of every split tensor (a 0
    /// gives it none).
    ///
    /// # Errors
    /// [`Error::Split`] if there is not one ratio per device or a ratio is
    /// negative, not finite, or all are zero.
    pub fn with_tensor_split(mut self, ratios: &[f32]) -> Result<Self> {
        if ratios.len() != self.backends.len() {
            return Err(Error::Split {
                detail: format!("tensor split of {} ratio(s) for {} device(s)", ratios.len(), self.backends.len()),
            });
        }
        // The policy's own check, so the two cannot differ.
        SplitPolicy::new(ratios)?;
        self.ratios = ratios.to_vec();
        Ok(self)
    }

    /// The same devices exchanging through `comm` (one rank per device; e.g.
    /// an NCCL communicator made elsewhere). Without it, executors pick
    /// their own: NCCL/RCCL across GPUs when it loads, else copies between
    /// device buffers.
    ///
    /// # Errors
    /// [`Error::Split`] if `comm` has another number of ranks, or the
    /// devices span processes ([`Devices::across_processes`]).
    pub fn with_comm(mut self, comm: Arc<dyn Comm>) -> Result<Self> {
        if self.group.is_some() {
            return Err(Error::Split {
                detail: "devices across processes exchange over MPI, not another communicator".into(),
            });
        }
        if comm.n_ranks() != self.backends.len() {
            return Err(Error::Split {
                detail: format!("a communicator of {} ranks for {} devices", comm.n_ranks(), self.backends.len()),
            });
        }
        self.comm = Some(comm);
        Ok(self)
    }

    /// The world of every process's devices (one rank per process, started
    /// by `mpirun -np N`; feature `mpi`): this process's devices (`self`)
    /// and every other process's, in rank order ([`MpiComm::devices`]), with
    /// equal ratios (set the world's with [`Devices::with_tensor_split`])
    /// and the communicator between them. Every process runs the same plan;
    /// each computes only its own devices' part, and exchanges between
    /// processes go over MPI. A world of one process is `self` unchanged.
    ///
    /// # Errors
    /// [`Error::Split`] on every process for a world of more than
    /// [`MAX_DEVICES`] devices, or a communicator given already
    /// ([`Devices::with_comm`]).
    ///
    /// [`MpiComm::devices`]: super::MpiComm::devices
    #[cfg(feature = "mpi")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mpi")))]
    pub fn across_processes(self, world: &Arc<super::World>) -> Result<Self> {
        if world.size() == 1 {
            return Ok(self);
        }
        if self.comm.is_some() {
            return Err(Error::Split { detail: "devices with a communicator of their own across processes".into() });
        }
        same_links_everywhere(world)?;
        let (backends, mpi) = super::MpiComm::devices(world, &self.backends)?;
        let mpi = Arc::new(mpi);
        let n = backends.len();
        let (comm, why_not) = Self::gpu_comm_across(world, &backends, &*mpi);
        Ok(Devices {
            backends,
            ratios: vec![1.0; n],
            threads: self.threads,
            comm: Some(comm.unwrap_or_else(|| mpi.clone())),
            group: Some(mpi),
            mode: self.mode,
            // The world's groups follow its processes and machines.
            groups: None,
            why_not_native: why_not,
        })
    }

    /// NCCL/RCCL across processes when every device of the world is a GPU
    /// and every process can join one ([`super::NcclComm`]'s
    /// `across_processes`): every process gets the same answer, the
    /// communicator, or `None` and why not (exchanges then go over MPI,
    /// staged through host memory).
    #[cfg(feature = "mpi")]
    fn gpu_comm_across(
        world: &super::World,
        backends: &[Arc<dyn Backend>],
        group: &dyn ProcessGroup,
    ) -> (Option<Arc<dyn Comm>>, Option<String>) {
        if !backends.iter().all(|b| b.device().kind == crate::backend::DeviceKind::Gpu) {
            return (None, None);
        }
        #[cfg(sg_gpu)]
        {
            let owner: Vec<usize> = (0..backends.len()).map(|j| group.owner(j)).collect();
            match super::NcclComm::across_processes(world, backends, &owner) {
                Ok(c) => (Some(Arc::new(c)), None),
                Err(e) => {
                    log::info!("devices across processes: no NCCL/RCCL, MPI instead: {e}");
                    (None, Some(e.to_string()))
                }
            }
        }
        #[cfg(not(sg_gpu))]
        {
            let _ = (world, group);
            (None, Some("built without a GPU backend".into()))
        }
    }

    /// What exchanges between these devices go through, in words: the
    /// communicator's ([`Comm::describe`]), and for GPUs across processes
    /// without NCCL/RCCL, why not.
    pub fn exchanges(&self) -> String {
        let what = self.comm.as_ref().map_or_else(
            || "copies within this process (NCCL/RCCL between GPUs when it loads)".to_string(),
            |c| c.describe(),
        );
        match &self.why_not_native {
            Some(why) => format!("{what}; not NCCL/RCCL: {why}"),
            None => what,
        }
    }

    /// The processes these devices span ([`Devices::across_processes`]);
    /// `None` when every device is this process's.
    pub fn process_group(&self) -> Option<&Arc<dyn ProcessGroup>> {
        self.group.as_ref()
    }

    /// The link between devices `i` and `j`: the same process, another
    /// process on the same machine, or another machine.
    pub fn link_class(&self, i: usize, j: usize) -> LinkClass {
        match &self.group {
            Some(g) if g.owner(i) != g.owner(j) => {
                if g.node(g.owner(i)) == g.node(g.owner(j)) {
                    LinkClass::SameNode
                } else {
                    LinkClass::OtherNode
                }
            }
            _ => LinkClass::SameProcess,
        }
    }

    /// The slowest link between two of these devices
    /// ([`LinkClass::SameProcess`] for one device).
    pub fn slowest_link(&self) -> LinkClass {
        let n = self.backends.len();
        (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .map(|(i, j)| self.link_class(i, j))
            .max()
            .unwrap_or(LinkClass::SameProcess)
    }

    /// The link model plans for these devices are priced with: that of
    /// their slowest link class ([`LinkClass::model`]: its defaults, or its
    /// environment variable), since a collective over all devices waits
    /// for its slowest link.
    ///
    /// # Errors
    /// [`Error::Split`] for a link variable that does not parse.
    pub fn link_model(&self) -> Result<LinkModel> {
        self.slowest_link().model()
    }

    /// Every pair of devices' link class ([`Devices::link_class`]) with
    /// each class's model ([`LinkClass::model`]): what a planner prices
    /// each collective by ([`super::Planner::with_links`]).
    ///
    /// # Errors
    /// [`Error::Split`] for a link variable that does not parse.
    pub fn links(&self) -> Result<Links> {
        let [a, b, c] = LinkClass::ALL;
        let models = [a.model()?, b.model()?, c.model()?];
        Links::new(self.backends.len(), |i, j| self.link_class(i, j), models)
    }

    /// True if device `j` runs in this process.
    pub fn is_local(&self, j: usize) -> bool {
        self.group.as_ref().is_none_or(|g| g.owner(j) == g.rank())
    }

    /// Number of devices (1 to 64).
    pub fn n_devices(&self) -> usize {
        self.backends.len()
    }

    /// The tensor-split ratios, one per device.
    pub fn ratios(&self) -> &[f32] {
        &self.ratios
    }

    /// Checks that `given` (the ratios a split policy or a memory estimate
    /// was made with; `what` names it) are these devices' ratios, value for
    /// value: the devices are the one source of the tensor split, and what
    /// is planned for them must use theirs ([`Devices::policy`] does).
    ///
    /// # Errors
    /// [`Error::Split`] naming `what` and both lists when they differ.
    pub fn check_ratios(&self, given: &[f32], what: &str) -> Result<()> {
        same_tensor_split(&self.ratios, given, what)
    }

    /// Worker threads per CPU device (0 for devices given by
    /// [`Devices::from_backends`]).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The backends, one per rank.
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    /// The devices' names, one per rank: the backends' own names, unique in
    /// the process (`CPU5` is the sixth CPU backend made, `CUDA0.1` the
    /// second virtual device on GPU 0; across processes, `@<rank>` follows
    /// the name its process gave it), for messages and logs; not the names
    /// [`Devices::open`] takes.
    pub fn names(&self) -> Vec<String> {
        match &self.group {
            // Each process names its own: `CPU0@1` is process 1's CPU0.
            Some(g) => {
                self.backends.iter().enumerate().map(|(j, b)| format!("{}@{}", b.device().name, g.owner(j))).collect()
            }
            None => self.backends.iter().map(|b| b.device().name).collect(),
        }
    }

    /// True when every device is a CPU backend.
    pub fn all_cpu(&self) -> bool {
        self.backends.iter().all(|b| b.device().kind == crate::backend::DeviceKind::Cpu)
    }

    /// The same devices with a model spread over them by `mode`
    /// (llama.cpp's `--split-mode tensor|layer`; tensor by default), which
    /// [`Devices::model_policy`] follows.
    pub fn with_split_mode(mut self, mode: SplitMode) -> Self {
        self.mode = mode;
        self
    }

    /// How a model is spread over these devices.
    pub fn split_mode(&self) -> SplitMode {
        self.mode
    }

    /// The same devices in the groups `groups` (a partition of the device
    /// indices) for [`SplitMode::Hybrid`]: tensor split inside a group,
    /// layers across groups. Set them where the topology is known better
    /// than the process layout tells (two NVLink islands of one machine,
    /// say); by default [`Devices::groups`] derives them.
    ///
    /// # Errors
    /// [`Error::Split`] for groups that are not a partition of the devices
    /// into non-empty sets.
    pub fn with_groups(mut self, groups: Vec<DeviceSet>) -> Result<Self> {
        super::policy::check_partition(&groups, self.backends.len())?;
        self.groups = Some(groups);
        Ok(self)
    }

    /// The device groups of [`SplitMode::Hybrid`]: those set by
    /// [`Devices::with_groups`], else the devices that share the fastest
    /// link class short of the slowest one present: one group per machine
    /// when the devices span machines, one per process when they span the
    /// processes of one machine, and one group of all when they are all
    /// this process's (the hybrid split is then the tensor split). In
    /// device order.
    pub fn groups(&self) -> Vec<DeviceSet> {
        if let Some(g) = &self.groups {
            return g.clone();
        }
        let n = self.backends.len();
        let slowest = self.slowest_link();
        if slowest == LinkClass::SameProcess {
            return vec![DeviceSet::all(n)];
        }
        let mut groups: Vec<DeviceSet> = Vec::new();
        for j in 0..n {
            match groups.iter_mut().find(|g| g.iter().next().is_some_and(|i| self.link_class(i, j) < slowest)) {
                Some(g) => g.0 |= 1 << j,
                None => groups.push(DeviceSet::of([j])),
            }
        }
        groups
    }

    /// The policy for a model of `n_layer` repeating layers with
    /// llama.cpp's tensor names over these devices: under
    /// [`SplitMode::Layer`], [`SplitPolicy::layer_split`] at their ratios;
    /// under [`SplitMode::Tensor`], `tensor(ratios)` (the model's own
    /// tensor-split policy); under [`SplitMode::Hybrid`],
    /// [`SplitPolicy::hybrid`] over [`Devices::groups`] with `tensor`.
    ///
    /// # Errors
    /// What `tensor` returns; [`Error::Split`] for ratios the policy refuses.
    pub fn model_policy(&self, n_layer: usize, tensor: impl Fn(&[f32]) -> Result<SplitPolicy>) -> Result<SplitPolicy> {
        match self.mode {
            SplitMode::Layer => SplitPolicy::layer_split(&self.ratios, n_layer),
            SplitMode::Tensor => tensor(&self.ratios),
            SplitMode::Hybrid => SplitPolicy::hybrid(&self.ratios, &self.groups(), n_layer, &tensor),
        }
    }

    /// A split policy over these devices with their ratios and no rules yet
    /// (add them with [`SplitPolicy::rule`]).
    ///
    /// # Errors
    /// None in practice (the ratios were checked); kept a `Result` as
    /// [`SplitPolicy::new`].
    pub fn policy(&self) -> Result<SplitPolicy> {
        SplitPolicy::new(&self.ratios)
    }

    /// An empty store for these devices' weights and caches.
    pub fn store(&self) -> SplitStore {
        SplitStore::new(self.backends.len())
    }

    /// An executor over these devices (with their communicator if one was
    /// given): the one way to make a [`MetaExecutor`]. Executors made from
    /// one `Devices` share its backends.
    ///
    /// # Errors
    /// [`Error::Split`] for no devices or more than [`MAX_DEVICES`] (which
    /// every constructor of `Devices` refuses already).
    pub fn executor(&self) -> Result<MetaExecutor> {
        let mut exec = MetaExecutor::with_backends(self.backends.clone(), self.ratios.clone())?;
        if let Some(c) = &self.comm {
            exec.set_comm(Some(c.clone()))?;
        }
        if let Some(g) = &self.group {
            exec.set_group(g.clone());
        }
        Ok(exec)
    }
}

/// Checks that `given` (`what` names what was made with it) equals the
/// devices' tensor split `devices`, value for value.
///
/// # Errors
/// [`Error::Split`] naming `what` and both lists when they differ.
pub(crate) fn same_tensor_split(devices: &[f32], given: &[f32], what: &str) -> Result<()> {
    if devices == given {
        return Ok(());
    }
    Err(Error::Split {
        detail: format!(
            "{what} was made for tensor split {given:?}, the devices have {devices:?} (make it from the devices: Devices::policy, Devices::ratios)"
        ),
    })
}

fn check_count(n: usize) -> Result<()> {
    if n == 0 || n > MAX_DEVICES {
        return Err(Error::Split { detail: format!("{n} devices: need 1..={MAX_DEVICES}") });
    }
    Ok(())
}

fn check_threads(n: usize, threads: usize) -> Result<()> {
    if threads == 0 || n.saturating_mul(threads) > MAX_CPU_THREADS {
        return Err(Error::Split {
            detail: format!(
                "{n} CPU device(s) × {threads} thread(s): need at least 1 and at most {MAX_CPU_THREADS} in all"
            ),
        });
    }
    Ok(())
}

fn cpu_device(threads: usize) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(CpuBackend::new(CpuConfig { n_threads: threads, ..CpuConfig::default() })?))
}

/// One `--device` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum DeviceName {
    Cpu,
    Cuda(usize),
    Hip(usize),
    Emu,
    EmuHip,
}

impl DeviceName {
    fn parse(name: &str) -> Result<Self> {
        let up = name.trim().to_uppercase();
        let ordinal = |prefix: &str| {
            let digits = up.strip_prefix(prefix)?;
            (1..=9).contains(&digits.len()).then_some(())?;
            digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse::<usize>().ok())?
        };
        let (d, built, feature) = match up.as_str() {
            "CPU" => (DeviceName::Cpu, true, ""),
            "EMU" => (DeviceName::Emu, cfg!(feature = "cuda-emu"), "cuda-emu"),
            "EMUHIP" => (DeviceName::EmuHip, cfg!(feature = "cuda-emu"), "cuda-emu"),
            _ => match (ordinal("CUDA"), ordinal("HIP")) {
                (Some(i), _) => (DeviceName::Cuda(i), cfg!(feature = "cuda"), "cuda"),
                (_, Some(i)) => (DeviceName::Hip(i), cfg!(feature = "hip"), "hip"),
                _ => {
                    return Err(Error::Split {
                        detail: format!(
                            "device {name:?}: use CPU, CUDA<i>, HIP<i> (i: 1 to 9 decimal digits), EMU or EMUHIP"
                        ),
                    })
                }
            },
        };
        if !built {
            return Err(Error::Split {
                detail: format!("device {name:?}: this build cannot open it (build with the feature `{feature}`)"),
            });
        }
        Ok(d)
    }
}

/// Opens `names` in order: each GPU once, with as many virtual devices as
/// it is named.
#[cfg(sg_gpu)]
fn open_backends(names: &[DeviceName], threads: usize) -> Result<Vec<Arc<dyn Backend>>> {
    use crate::backend::cuda::CudaBackend;
    use std::collections::HashMap;
    let mut virtuals: HashMap<DeviceName, Vec<CudaBackend>> = HashMap::new();
    for &d in names {
        if virtuals.contains_key(&d) {
            continue;
        }
        let k = names.iter().filter(|x| **x == d).count();
        let opened = match d {
            #[cfg(feature = "cuda")]
            DeviceName::Cuda(i) => CudaBackend::virtual_devices(i, k)?,
            #[cfg(feature = "hip")]
            DeviceName::Hip(i) => CudaBackend::hip_virtual_devices(i, k)?,
            _ => continue,
        };
        virtuals.insert(d, opened.into_iter().rev().collect());
    }
    let mut out: Vec<Arc<dyn Backend>> = Vec::with_capacity(names.len());
    for &d in names {
        let b: Arc<dyn Backend> = match d {
            DeviceName::Cpu => cpu_device(threads)?,
            #[cfg(feature = "cuda-emu")]
            DeviceName::Emu => Arc::new(CudaBackend::emulated(8 << 30)),
            #[cfg(feature = "cuda-emu")]
            DeviceName::EmuHip => Arc::new(CudaBackend::emulated_hip(8 << 30)),
            gpu => match virtuals.get_mut(&gpu).and_then(|v| v.pop()) {
                Some(b) => Arc::new(b),
                None => return Err(Error::Split { detail: format!("device {gpu:?}: this build cannot open it") }),
            },
        };
        out.push(b);
    }
    Ok(out)
}

/// Without a GPU backend [`DeviceName::parse`] accepts only `CPU`.
#[cfg(not(sg_gpu))]
fn open_backends(names: &[DeviceName], threads: usize) -> Result<Vec<Arc<dyn Backend>>> {
    names
        .iter()
        .map(|d| match d {
            DeviceName::Cpu => cpu_device(threads),
            other => Err(Error::Split { detail: format!("device {other:?}: this build cannot open it") }),
        })
        .collect()
}

/// Every process's link variables ([`LinkClass::env_var`]) as it sees them
/// are compared (an all-gather): plans are priced by them, so processes
/// given different values would plan differently and fail later with plans
/// that differ; this names the variable instead. Values that price alike
/// are alike (`40,1` and `40.0,1.0`; unset and the default written out); a
/// value that does not parse is compared as written (each process then
/// reports its own parse error).
///
/// # Errors
/// [`Error::Split`] on every process, naming the first variable whose value
/// differs from process 0's and the processes that differ.
#[cfg(feature = "mpi")]
fn same_links_everywhere(world: &super::World) -> Result<()> {
    // Length-prefixed (a value may hold any byte); u32::MAX: unset.
    let mut mine = Vec::new();
    for c in LinkClass::ALL {
        match std::env::var(c.env_var()) {
            Ok(v) => {
                mine.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX - 1).to_le_bytes());
                mine.extend_from_slice(v.as_bytes());
            }
            Err(_) => mine.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
    }
    let decode = |b: &[u8]| -> Vec<Option<String>> {
        let mut out = Vec::new();
        let mut at = 0usize;
        while let Some(len) = b.get(at..at + 4).and_then(|x| <[u8; 4]>::try_from(x).ok()).map(u32::from_le_bytes) {
            at += 4;
            if len == u32::MAX {
                out.push(None);
                continue;
            }
            let end = at.saturating_add(len as usize).min(b.len());
            out.push(Some(String::from_utf8_lossy(&b[at..end]).into_owned()));
            at = end;
        }
        out
    };
    let seen: Vec<Vec<Option<String>>> = world.all_gather(&mine).iter().map(|b| decode(b)).collect();
    for (k, &class) in LinkClass::ALL.iter().enumerate() {
        let value = |p: usize| seen.get(p).and_then(|v| v.get(k)).cloned().flatten();
        let key = |v: &Option<String>| class.model_for(v.as_deref()).map(|m| m.key_bits()).map_err(|_| v.clone());
        let show = |v: Option<String>| v.map_or_else(|| "unset".to_string(), |s| format!("{s:?}"));
        let first = key(&value(0));
        let differ: Vec<usize> = (1..seen.len()).filter(|&p| key(&value(p)) != first).collect();
        if let Some(&p) = differ.first() {
            return Err(Error::Split {
                detail: format!(
                    "{} is {} in process 0 but {} in process(es) {differ:?} (first: {p}): every process must price \
                     its links alike, or their plans differ",
                    class.env_var(),
                    show(value(0)),
                    show(value(p))
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_count_for_policy_store_executor() {
        let d = Devices::cpu(3, 1).unwrap().with_tensor_split(&[2.0, 1.0, 0.0]).unwrap();
        assert_eq!(d.n_devices(), 3);
        assert_eq!(d.policy().unwrap().ratios(), &[2.0, 1.0, 0.0]);
        assert_eq!(d.store().n_devices(), 3);
        assert_eq!(d.executor().unwrap().n_devices(), 3);
        assert_eq!(d.names().len(), 3);
        assert!(d.all_cpu());
    }

    #[test]
    fn one_process_is_one_group_unless_told() {
        let d = Devices::cpu(4, 1).unwrap();
        assert_eq!(d.groups(), vec![DeviceSet::all(4)]);
        let two = vec![DeviceSet::of([0, 1]), DeviceSet::of([2, 3])];
        assert_eq!(d.clone().with_groups(two.clone()).unwrap().groups(), two);
        assert!(d.clone().with_groups(vec![DeviceSet::of([0, 1])]).is_err());
        assert!(d.with_groups(vec![DeviceSet::of([0, 1, 2, 3, 4])]).is_err());
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(Devices::cpu(0, 1).is_err());
        assert!(Devices::cpu(65, 1).is_err());
        assert!(Devices::cpu(2, 0).is_err());
        assert!(Devices::cpu(64, 17).is_err());
        let d = Devices::cpu(2, 1).unwrap();
        for bad in [&[1.0][..], &[1.0, -1.0], &[0.0, 0.0], &[f32::NAN, 1.0], &[1.0, 1.0, 1.0]] {
            let e = d.clone().with_tensor_split(bad).unwrap_err().to_string();
            assert!(e.contains("split"), "{e}");
        }
        for bad in ["GPU0", "CUDA", "CUDA+0", "HIP0123456789", ""] {
            let e = Devices::open(&[bad], 1).unwrap_err().to_string();
            assert!(e.contains("device") || e.contains("build"), "{bad}: {e}");
        }
        assert!(Devices::open(&[], 1).is_err());
    }

    #[test]
    fn names_open_cpu_devices() {
        let d = Devices::parse("cpu, CPU", 2).unwrap();
        assert_eq!(d.n_devices(), 2);
        assert_eq!(d.threads(), 2);
        assert!(d.all_cpu());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn gpu_names_need_their_feature() {
        let e = Devices::open(&["CUDA0"], 1).unwrap_err().to_string();
        assert!(e.contains("feature `cuda`"), "{e}");
    }
}
