//! Devices in several processes over MPI (feature `mpi`): one rank per
//! process, launched by `mpirun -np N` (MPICH or Open MPI).
//!
//! * [`World`] initializes MPI once per process (thread level
//!   `MPI_THREAD_MULTIPLE`: every local device thread exchanges on its own).
//! * [`MpiComm`] is the [`Comm`] whose ranks are the world's devices: a
//!   message between two devices is an MPI message between their processes
//!   (tag: sender and receiver device), staged through host memory, so it
//!   works for any backend; and the [`ProcessGroup`] the executor ends every
//!   run with (the outcome of every process, the bytes moved, the outputs
//!   broadcast from the processes that hold them).
//! * [`RemoteDevice`] stands for another process's device in this process's
//!   device list: it has the real device's description and buffer type (so
//!   every process plans and compiles the same program) and refuses to
//!   allocate or compute.
//!
//! A process that fails tells the others (a small message with a tag of its
//! own, which every waiting exchange probes for), so their exchanges end
//! with an error instead of waiting; a process that dies is ended by the
//! launcher (`mpirun` ends the job when a process exits abnormally).

use super::{peer_failed, BufSlice, Comm, ProcessGroup};
use crate::backend::{Backend, Buffer, BufferType, DeviceInfo, DeviceKind, TensorStorage};
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::TensorId;
use mpi::datatype::PartitionMut;
use mpi::request::StaticScope;
use mpi::topology::{Rank, SimpleCommunicator};
use mpi::traits::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The tag of a failure notice (above every exchange tag, which is
/// `sender · MAX_DEVICES + receiver`; MPI guarantees tags up to 32767).
const ABORT_TAG: i32 = 32000;

/// The tag of a run header ([`ProcessGroup::begin_run`]): run number,
/// program fingerprint, and [`RUN`] or [`ENDED`].
const HEADER_TAG: i32 = 32001;
/// A header's kind: a run starts.
const RUN: u64 = 0;
/// A header's kind: the process has ended ([`World::finalize`]).
const ENDED: u64 = 1;

fn world_comm() -> SimpleCommunicator {
    SimpleCommunicator::world()
}

fn mpi_rank(r: usize) -> Rank {
    // Ranks and device indices are below MAX_DEVICES (64) or the process count.
    Rank::try_from(r).unwrap_or(Rank::MAX)
}

/// This process's place among the processes `mpirun` started: MPI,
/// initialized once per process; [`World::finalize`] ends it at the end of
/// the program (MPI cannot be initialized again after that).
#[derive(Debug)]
pub struct World {
    rank: usize,
    size: usize,
}

static WORLD: OnceLock<std::result::Result<Arc<World>, String>> = OnceLock::new();

/// MPI's environment while this crate initialized it: dropping it finalizes MPI.
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

impl World {
    /// Initializes MPI (thread level `MPI_THREAD_MULTIPLE`) the first time,
    /// and returns this process's rank and the process count. A process not
    /// started by `mpirun` is a world of one. If the embedding program
    /// initialized MPI already, its world is used.
    ///
    /// # Errors
    /// [`Error::Split`] if MPI gives less than `MPI_THREAD_MULTIPLE` (every
    /// device thread exchanges on its own) or more processes than
    /// [`super::super::MAX_DEVICES`].
    pub fn init() -> Result<Arc<World>> {
        let w = WORLD.get_or_init(|| {
            let level = if mpi::environment::is_initialized() {
                mpi::environment::threading_support()
            } else {
                match mpi::initialize_with_threading(mpi::Threading::Multiple) {
                    Some((universe, level)) => {
                        *UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()) = Some(universe);
                        level
                    }
                    None => return Err("MPI was initialized and finalized before".to_string()),
                }
            };
            if level != mpi::Threading::Multiple {
                return Err(format!("MPI gives thread level {level:?}; the devices' threads need Multiple"));
            }
            let c = world_comm();
            let (rank, size) = (usize::try_from(c.rank()).unwrap_or(0), usize::try_from(c.size()).unwrap_or(1));
            if size > super::super::MAX_DEVICES {
                return Err(format!("{size} processes: at most {}", super::super::MAX_DEVICES));
            }
            Ok(Arc::new(World { rank, size }))
        });
        w.clone().map_err(|detail| Error::Split { detail: format!("MPI: {detail}") })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// True on rank 0 (the process that samples and prints).
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// Every process's `mine`, in rank order (lengths may differ, 0
    /// included).
    pub fn all_gather(&self, mine: &[u8]) -> Vec<Vec<u8>> {
        // One byte first: MPI refuses the empty buffers of an all-empty gather.
        let framed: Vec<u8> = std::iter::once(0u8).chain(mine.iter().copied()).collect();
        self.all_gather_framed(&framed).into_iter().map(|mut v| v.split_off(1.min(v.len()))).collect()
    }

    fn all_gather_framed(&self, mine: &[u8]) -> Vec<Vec<u8>> {
        let c = world_comm();
        let len = i32::try_from(mine.len()).unwrap_or(i32::MAX);
        let mut lens = vec![0i32; self.size];
        c.all_gather_into(&len, &mut lens[..]);
        let displs: Vec<i32> = lens.iter().scan(0i32, |acc, &l| Some(std::mem::replace(acc, *acc + l))).collect();
        let total: usize = lens.iter().map(|&l| usize::try_from(l).unwrap_or(0)).sum();
        let mut all = vec![0u8; total];
        {
            let mut part = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
            c.all_gather_varcount_into(&mine[..mine.len().min(len as usize)], &mut part);
        }
        let mut out = Vec::with_capacity(self.size);
        let mut at = 0;
        for &l in &lens {
            let l = usize::try_from(l).unwrap_or(0);
            out.push(all.get(at..at + l).map(<[u8]>::to_vec).unwrap_or_default());
            at += l;
        }
        out
    }

    /// `bytes` from process `root` on every process.
    ///
    /// # Errors
    /// [`Error::Split`] for a `root` out of range.
    pub fn broadcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        if root >= self.size {
            return Err(Error::Split { detail: format!("broadcast from rank {root} of {}", self.size) });
        }
        let c = world_comm();
        let p = c.process_at_rank(mpi_rank(root));
        let mut len = bytes.len() as u64;
        p.broadcast_into(&mut len);
        if self.rank != root {
            *bytes = vec![0u8; usize::try_from(len).unwrap_or(0)];
        }
        if len > 0 {
            p.broadcast_into(&mut bytes[..]);
        }
        Ok(())
    }

    /// Waits until every process calls it.
    pub fn barrier(&self) {
        world_comm().barrier();
    }

    /// Ends MPI in this process (`MPI_Finalize`, which waits for every
    /// process): call it once, at the end of the program, after every run
    /// on devices across processes. A process that exits without it (an
    /// error, a panic) ends the whole job (`mpirun` stops the others). If
    /// the embedding program initialized MPI, it finalizes it instead and
    /// this only waits for every process.
    pub fn finalize(&self) {
        let c = world_comm();
        // A process still starting runs learns that this one has ended.
        let ended = [u64::MAX, 0, ENDED];
        for r in (0..self.size).filter(|&r| r != self.rank) {
            c.process_at_rank(mpi_rank(r)).send_with_tag(&ended[..], HEADER_TAG);
        }
        self.barrier();
        // Notices and headers nobody read (a run that failed everywhere, the
        // others' ends).
        for tag in [ABORT_TAG, HEADER_TAG] {
            while let Some(status) = c.any_process().immediate_probe_with_tag(tag) {
                let _ = c.process_at_rank(status.source_rank()).receive_vec_with_tag::<u64>(tag);
            }
        }
        drop(UNIVERSE.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// One device as every process sees it: what [`MpiComm::devices`] gathers.
#[derive(Clone, Debug)]
struct Described {
    info: DeviceInfo,
    bt: BufferType,
    threads: usize,
}

impl Described {
    fn of(b: &dyn Backend) -> Self {
        Described { info: b.device(), bt: b.buffer_type(), threads: b.worker_threads() }
    }

    /// One line: fields separated by tabs (names and descriptions have none).
    fn encode(&self) -> String {
        let clean = |s: &str| s.replace(['\t', '\n'], " ");
        let kind = if self.info.kind == DeviceKind::Gpu { "gpu" } else { "cpu" };
        format!(
            "{}\t{}\t{kind}\t{}\t{}\t{}\t{}\t{}\n",
            clean(&self.info.name),
            clean(&self.info.description),
            self.info.memory_total,
            clean(&self.bt.name),
            self.bt.alignment,
            self.bt.max_size,
            self.threads
        )
    }

    fn decode(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split('\t').collect();
        let [name, description, kind, memory, bt, align, max, threads] = f[..] else { return None };
        let kind = match kind {
            "gpu" => DeviceKind::Gpu,
            "cpu" => DeviceKind::Cpu,
            _ => return None,
        };
        Some(Described {
            info: DeviceInfo {
                name: name.into(),
                description: description.into(),
                kind,
                memory_total: memory.parse().ok()?,
            },
            bt: BufferType { name: bt.into(), alignment: align.parse().ok()?, max_size: max.parse().ok()? },
            threads: threads.parse().ok()?,
        })
    }
}

/// Another process's device in this process's device list: its
/// description and buffer type as that process reported them (so every
/// process plans and compiles the same program for the world). Nothing
/// runs or is stored on it here.
#[derive(Debug)]
pub struct RemoteDevice {
    rank: usize,
    d: Described,
}

impl RemoteDevice {
    /// The process that runs this device.
    pub fn rank(&self) -> usize {
        self.rank
    }

    fn refused(&self, what: &str) -> Error {
        Error::Split { detail: format!("{what} on {}, a device of process {}", self.d.info.name, self.rank) }
    }
}

impl Backend for RemoteDevice {
    fn name(&self) -> &str {
        "REMOTE"
    }
    fn device(&self) -> DeviceInfo {
        self.d.info.clone()
    }
    fn buffer_type(&self) -> BufferType {
        self.d.bt.clone()
    }
    fn alloc_buffer(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Err(self.refused(&format!("an allocation of {size} bytes")))
    }
    fn supports_op(&self, _ctx: &Context, _id: TensorId) -> bool {
        // Its own process decides; the plan is the same everywhere.
        true
    }
    fn compute(&self, _ctx: &Context, _graph: &Graph, _storage: &TensorStorage) -> Result<()> {
        Err(self.refused("a computation"))
    }
    fn worker_threads(&self) -> usize {
        self.d.threads
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// The communicator of a world of devices in several processes: device `j`
/// runs in process `owner[j]`; an exchange's message between two devices is
/// an MPI message between their processes (two devices of one process send
/// to themselves through MPI as well), staged through host memory.
#[derive(Debug)]
pub struct MpiComm {
    world: Arc<World>,
    owner: Vec<usize>,
    /// Per process: its machine (processes with one host name share one).
    nodes: Vec<usize>,
    received: Vec<AtomicU64>,
    aborted: AtomicBool,
    /// Runs begun through this communicator ([`ProcessGroup::begin_run`]).
    runs: AtomicU64,
}

impl MpiComm {
    /// Gathers every process's `local` devices (its `--device` list, in
    /// order) into the world's device list, in rank order: `local` itself
    /// for this process, a [`RemoteDevice`] for each other process's
    /// device; and the communicator over them.
    ///
    /// # Errors
    /// [`Error::Split`] on every process when a process has no devices, the
    /// world has more than [`super::super::MAX_DEVICES`], or a description
    /// does not parse.
    pub fn devices(world: &Arc<World>, local: &[Arc<dyn Backend>]) -> Result<(Vec<Arc<dyn Backend>>, MpiComm)> {
        let mine: String = local.iter().map(|b| Described::of(&**b).encode()).collect();
        let all = world.all_gather(mine.as_bytes());
        let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
        let mut owner = Vec::new();
        for (r, bytes) in all.iter().enumerate() {
            let text = String::from_utf8_lossy(bytes);
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                return Err(Error::Split { detail: format!("process {r} has no devices") });
            }
            for (k, line) in lines.iter().enumerate() {
                if r == world.rank {
                    let b = local.get(k).ok_or_else(|| Error::Split { detail: "device list".into() })?;
                    backends.push(b.clone());
                } else {
                    let d = Described::decode(line).ok_or_else(|| Error::Split {
                        detail: format!("process {r} described device {k} as {line:?}"),
                    })?;
                    backends.push(Arc::new(RemoteDevice { rank: r, d }));
                }
                owner.push(r);
            }
        }
        if backends.len() > super::super::MAX_DEVICES {
            return Err(Error::Split {
                detail: format!(
                    "{} devices in {} processes: at most {}",
                    backends.len(),
                    world.size,
                    super::super::MAX_DEVICES
                ),
            });
        }
        // Each process's machine, by host name.
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_default();
        let hosts = world.all_gather(host.as_bytes());
        let nodes = hosts.iter().map(|h| hosts.iter().position(|x| x == h).unwrap_or(0)).collect();
        let n = backends.len();
        let comm = MpiComm {
            world: world.clone(),
            owner,
            nodes,
            received: (0..n).map(|_| AtomicU64::new(0)).collect(),
            aborted: AtomicBool::new(false),
            runs: AtomicU64::new(0),
        };
        Ok((backends, comm))
    }

    /// The MPI tag of a message from device `from` to device `to`.
    fn tag(from: usize, to: usize) -> i32 {
        i32::try_from(from * super::super::MAX_DEVICES + to).unwrap_or(0)
    }

    /// Reads a failure notice if one arrived: true if the communicator is
    /// (now) aborted.
    fn check_notice(&self) -> bool {
        if self.aborted.load(Ordering::Acquire) {
            return true;
        }
        let c = world_comm();
        if let Some(status) = c.any_process().immediate_probe_with_tag(ABORT_TAG) {
            // Consumed; which process failed is told by the run's end (`finish_run`).
            let _ = c.process_at_rank(status.source_rank()).receive_with_tag::<u64>(ABORT_TAG);
            self.aborted.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// Waits for `reqs` (sends and receives of one exchange) while watching
    /// for failure notices. On a notice the requests are abandoned: their
    /// staging buffers stay leaked (MPI may still use them), and the
    /// communicator stays aborted.
    fn wait_all(&self, reqs: Vec<mpi::request::Request<'static, [u8], StaticScope>>) -> Result<()> {
        let mut pending: Vec<_> = reqs.into_iter().map(Some).collect();
        let mut spins = 0u32;
        loop {
            let mut left = 0;
            for slot in pending.iter_mut() {
                if let Some(r) = slot.take() {
                    match r.test() {
                        Ok(_) => {}
                        Err(r) => {
                            *slot = Some(r);
                            left += 1;
                        }
                    }
                }
            }
            if left == 0 {
                return Ok(());
            }
            if self.check_notice() {
                for r in pending.into_iter().flatten() {
                    r.cancel();
                    std::mem::forget(r);
                }
                return Err(peer_failed());
            }
            spins += 1;
            if spins < 200 {
                std::hint::spin_loop();
            } else if spins < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }
}

/// A staging buffer handed to MPI for the duration of a request.
fn leak(v: Vec<u8>) -> &'static mut [u8] {
    Box::leak(v.into_boxed_slice())
}

/// Frees a staging buffer made by [`leak`].
///
/// # Safety
/// `b` came from [`leak`], and the request that used it has completed (no
/// other reference to it exists).
unsafe fn unleak(b: *mut [u8]) {
    // SAFETY: the caller's contract: `b` is a leaked `Box<[u8]>` nobody uses.
    drop(unsafe { Box::from_raw(b) });
}

impl Comm for MpiComm {
    fn n_ranks(&self) -> usize {
        self.owner.len()
    }

    fn exchange(&self, rank: usize, send: &[Option<BufSlice>], recv: &[Option<BufSlice>]) -> Result<()> {
        let n = self.owner.len();
        if send.len() != n || recv.len() != n || rank >= n {
            self.abort();
            return Err(Error::Split {
                detail: format!("exchange from rank {rank} with {} sends and {} receives", send.len(), recv.len()),
            });
        }
        if self.check_notice() {
            return Err(peer_failed());
        }
        let c = world_comm();
        // Every send staged before any request is posted: a failed read
        // leaves no request behind (MPI would keep using its buffer).
        let mut outgoing = Vec::new();
        for (i, s) in send.iter().enumerate() {
            let Some(s) = s.as_ref().filter(|_| i != rank) else { continue };
            let mut v = vec![0u8; s.len];
            if let Err(e) = s.buf.get(s.offset, &mut v) {
                self.abort();
                return Err(e);
            }
            outgoing.push((i, v));
        }
        let mut staged: Vec<*mut [u8]> = Vec::new();
        let mut reqs = Vec::new();
        let mut incoming: Vec<(usize, *mut [u8])> = Vec::new();
        for (i, r) in recv.iter().enumerate() {
            let Some(r) = r.as_ref().filter(|_| i != rank) else { continue };
            let b = leak(vec![0u8; r.len]);
            let ptr: *mut [u8] = b;
            incoming.push((i, ptr));
            // SAFETY: `ptr` is the leaked buffer just made; the request is its only user until it completes.
            let b: &'static mut [u8] = unsafe { &mut *ptr };
            let p = c.process_at_rank(mpi_rank(self.owner[i]));
            reqs.push(p.immediate_receive_into_with_tag(StaticScope, b, Self::tag(i, rank)));
        }
        for (i, v) in outgoing {
            let b = leak(v);
            let ptr: *mut [u8] = b;
            staged.push(ptr);
            // SAFETY: as above: only the request reads it until it completes.
            let b: &'static [u8] = unsafe { &*ptr };
            let p = c.process_at_rank(mpi_rank(self.owner[i]));
            reqs.push(p.immediate_send_with_tag(StaticScope, b, Self::tag(rank, i)));
        }
        self.wait_all(reqs)?;
        let mut bytes = 0u64;
        let mut result = Ok(());
        for (i, ptr) in incoming {
            if let (Some(r), Ok(())) = (&recv[i], &result) {
                // SAFETY: its receive completed; the slice is read once, then freed below.
                let data: &[u8] = unsafe { &*ptr };
                result = r.buf.set(r.offset, data);
                bytes += r.len as u64;
            }
            // SAFETY: made by `leak`, its request completed, read above only.
            unsafe { unleak(ptr) };
        }
        for ptr in staged {
            // SAFETY: made by `leak`; its send completed.
            unsafe { unleak(ptr) };
        }
        if result.is_err() {
            self.abort();
        }
        self.received[rank].fetch_add(bytes, Ordering::Relaxed);
        result
    }

    fn abort(&self) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        // Tell the others once: each probes for it while it waits.
        let c = world_comm();
        let me = self.world.rank as u64;
        for r in (0..self.world.size).filter(|&r| r != self.world.rank) {
            c.process_at_rank(mpi_rank(r)).send_with_tag(&me, ABORT_TAG);
        }
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    fn bytes_received(&self) -> Vec<u64> {
        self.received.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }

    fn describe(&self) -> String {
        format!("MPI between {} processes, staged through host memory ({} devices)", self.world.size, self.n_ranks())
    }
}

impl ProcessGroup for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank
    }

    fn n_processes(&self) -> usize {
        self.world.size
    }

    fn owner(&self, device: usize) -> usize {
        self.owner.get(device).copied().unwrap_or(usize::MAX)
    }

    fn node(&self, process: usize) -> usize {
        self.nodes.get(process).copied().unwrap_or(usize::MAX)
    }

    fn same_everywhere(&self, value: u64, what: &str) -> Result<()> {
        let all = self.world.all_gather(&value.to_le_bytes());
        let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
        if differ.is_empty() {
            return Ok(());
        }
        Err(Error::Split {
            detail: format!(
                "the {what} of process(es) {differ:?} differs from process 0's (another model file, tensor split or \
                 option?): every process must run the same"
            ),
        })
    }

    fn begin_run(&self, program: u64) -> Result<()> {
        let seq = self.runs.fetch_add(1, Ordering::Relaxed);
        let c = world_comm();
        let me = [seq, program, RUN];
        let others: Vec<usize> = (0..self.world.size).filter(|&r| r != self.world.rank).collect();
        for &r in &others {
            // 24 bytes: sent eagerly, never waits for the receiver.
            c.process_at_rank(mpi_rank(r)).send_with_tag(&me[..], HEADER_TAG);
        }
        let mut spins = 0u32;
        for &r in &others {
            let p = c.process_at_rank(mpi_rank(r));
            loop {
                if p.immediate_probe_with_tag(HEADER_TAG).is_some() {
                    break;
                }
                if self.check_notice() {
                    return Err(peer_failed());
                }
                spins = spins.saturating_add(1);
                if spins < 2000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
            let (h, _) = p.receive_vec_with_tag::<u64>(HEADER_TAG);
            let diverged = |what: String| {
                self.aborted.store(true, Ordering::Release);
                Err(Error::Split {
                    detail: format!(
                        "process {r} {what}, this process {} starts run {seq} of program {program:016x}: the \
                         processes diverged (every process must be given the same inputs: prompt, sampling, steps)",
                        self.world.rank
                    ),
                })
            };
            match h[..] {
                [_, _, ENDED] => return diverged("has ended".into()),
                [s, f, RUN] if s == seq && f == program => {}
                [s, f, RUN] => return diverged(format!("starts run {s} of program {f:016x}")),
                _ => return diverged(format!("sent the header {h:?}")),
            }
        }
        Ok(())
    }

    fn finish_run(&self, outcome: std::result::Result<u64, String>) -> Result<u64> {
        let mine = match &outcome {
            Ok(b) => format!("ok {b}"),
            Err(e) => format!("err {e}"),
        };
        let all = self.world.all_gather(mine.as_bytes());
        let mut total = 0u64;
        let mut failures = Vec::new();
        for (r, bytes) in all.iter().enumerate() {
            let text = String::from_utf8_lossy(bytes);
            match text.strip_prefix("ok ").and_then(|b| b.parse::<u64>().ok()) {
                Some(b) => total += b,
                None => failures.push((r, text.strip_prefix("err ").unwrap_or(&text).to_string())),
            }
        }
        // The failure that started it: the first that is not another's.
        let own = |e: &String| !super::is_peer_failure(&Error::Split { detail: e.clone() });
        match failures.iter().find(|(_, e)| own(e)).or(failures.first()) {
            None => Ok(total),
            Some((r, e)) if *r == self.world.rank => Err(Error::Split { detail: format!("process {r}: {e}") }),
            Some((r, e)) => Err(Error::Split { detail: format!("process {r} failed: {e}") }),
        }
    }

    fn broadcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()> {
        self.world.broadcast(root, bytes)
    }

    fn all_gather(&self, mine: &[u8]) -> Vec<Vec<u8>> {
        self.world.all_gather(mine)
    }
}
