//! The communication interface between devices and its generic
//! implementation.
//!
//! Every device runs its own thread and calls [`Comm::exchange`] in the same
//! order, like ranks of an NCCL communicator. An exchange moves slices of
//! device buffers: what this rank sends to each other rank, and where it
//! receives what each other rank sends it (both sides know the sizes from
//! the compiled program, so there is no handshake). The collectives
//! (all-reduce, reduce-scatter, all-gather, all-to-all, the all-gather of a
//! row combine's statistics) are compiled into exchanges and ordinary graph
//! nodes (packing copies, the sums of a reduction) by `split::compile`, so
//! every byte moved is a byte the planner charged:
//!
//! | collective | bytes received, all ranks together |
//! | --- | --- |
//! | all-reduce (reduce-scatter + all-gather over N element ranges) | `2 (N−1) B` |
//! | reduce-scatter | `(N−1) B` |
//! | all-gather, all-to-all, rebalance | what each rank lacks of its new part |
//!
//! [`HostComm`] is the implementation for any devices: the receiver copies
//! straight from the sender's buffer with [`Buffer::copy_from`] (a memcpy
//! between CPU buffers; a stream-ordered device-to-device or peer copy
//! between CUDA devices), between two barriers. NCCL (`NcclComm` in
//! `comm/nccl.rs`, feature `cuda`) implements the same call with grouped
//! send/receive.

#[cfg(feature = "mpi")]
mod mpi;
#[cfg(sg_gpu)]
mod nccl;
#[cfg(feature = "mpi")]
pub use mpi::{MpiComm, RemoteDevice, World};
#[cfg(sg_gpu)]
pub use nccl::NcclComm;

use crate::backend::Buffer;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// `len` bytes at byte `offset` of a device buffer: a message of an
/// exchange, or a tensor's local part kept on its device.
#[derive(Clone, Debug)]
pub struct BufSlice {
    /// The buffer (of any backend).
    pub buf: Arc<dyn Buffer>,
    /// Start, bytes.
    pub offset: usize,
    /// Length, bytes.
    pub len: usize,
}

impl BufSlice {
    /// The whole of `buf`.
    pub fn whole(buf: Arc<dyn Buffer>) -> Self {
        let len = buf.size();
        BufSlice { buf, offset: 0, len }
    }
}

const PEER_FAILED: &str = "another device failed during a collective";

/// The error a rank's exchange returns when another rank failed (the
/// communicator was aborted): what every [`Comm`] returns then, so that the
/// executor reports the first rank's own error instead.
pub fn peer_failed() -> Error {
    Error::Split { detail: PEER_FAILED.into() }
}

/// True for [`peer_failed`]'s error.
pub fn is_peer_failure(e: &Error) -> bool {
    matches!(e, Error::Split { detail } if detail == PEER_FAILED)
}

/// Exchanges among the `n_ranks()` devices of one executor. Each rank calls
/// every method with its own `rank`, in the same order on every rank.
pub trait Comm: Send + Sync {
    /// Number of ranks (devices).
    fn n_ranks(&self) -> usize;

    /// All-to-all of buffer slices: `send[i]` (a slice of this rank's
    /// device memory) goes to rank `i`, which receives it into its own
    /// `recv[rank]`; `recv[i]` is where this rank receives what rank `i`
    /// sends. Lengths agree by construction (a mismatch is an error on the
    /// receiving rank). The entries for `rank` itself are ignored. When it
    /// returns, this rank's receives are complete (on stream-ordered
    /// devices: queued before any later work of this device) and its send
    /// slices may be overwritten.
    ///
    /// # Errors
    /// [`Error::Split`] for lists of the wrong length, a length mismatch,
    /// or a failed rank (the exchange is abandoned); copy errors.
    fn exchange(&self, rank: usize, send: &[Option<BufSlice>], recv: &[Option<BufSlice>]) -> Result<()>;

    /// Marks the communicator failed: every rank waiting in an exchange, and
    /// every later call, returns an error instead of waiting for a rank that
    /// will not come.
    fn abort(&self);

    /// True once [`Comm::abort`] was called (every later exchange fails).
    fn is_aborted(&self) -> bool {
        false
    }

    /// Bytes received by each rank so far (for checking runs against plans).
    fn bytes_received(&self) -> Vec<u64>;

    /// What carries the messages, in words (for reports and logs), e.g.
    /// "NCCL (device memory, 4 devices, 2 in this process)".
    fn describe(&self) -> String {
        format!("a communicator of {} devices", self.n_ranks())
    }
}

/// The processes a world of devices spans (one rank per process, as
/// torch.distributed's process group or an MPI communicator): device `j` of
/// the world belongs to process [`ProcessGroup::owner`]`(j)`, and each
/// process runs only its own devices. Every method is called by every
/// process in the same order (from one thread per process, between runs),
/// like MPI's collectives. [`MpiComm`] (feature `mpi`) is the
/// implementation; within one process there is no group.
pub trait ProcessGroup: Send + Sync {
    /// This process's rank (0-based).
    fn rank(&self) -> usize;

    /// Number of processes.
    fn n_processes(&self) -> usize;

    /// The process that runs world device `device`.
    fn owner(&self, device: usize) -> usize;

    /// The machine process `process` runs on, as an index (processes on one
    /// machine have the same).
    fn node(&self, process: usize) -> usize;

    /// Checks that every process passes the same `value` (a hash of what
    /// it is about to run; `what` names it in the error).
    ///
    /// # Errors
    /// [`Error::Split`] on every process when the values differ, naming the
    /// processes that disagree with rank 0.
    fn same_everywhere(&self, value: u64, what: &str) -> Result<()>;

    /// Starts a run: tells every process this process's run number (runs
    /// through this group so far) and the fingerprint of the program it is
    /// about to run, and checks theirs, before any exchange. Processes that
    /// diverged — another step (another prompt length, sampling, step
    /// count) or one that has ended (`World::finalize`, feature `mpi`) — get an
    /// error here instead of exchanging mismatched messages.
    ///
    /// # Errors
    /// [`Error::Split`] naming the process that differs, its run and
    /// program, or that it has ended.
    fn begin_run(&self, program: u64) -> Result<()>;

    /// Ends a run on every process: each passes its own outcome (`Err`
    /// with its error's text, or the bytes its devices received) and gets
    /// the world's: the bytes all devices received together, or an error.
    ///
    /// # Errors
    /// [`Error::Split`] naming the first process that failed and its
    /// error, on every process (a process's own error is its own).
    fn finish_run(&self, outcome: std::result::Result<u64, String>) -> Result<u64>;

    /// Sends `bytes` from process `root` to every process (`bytes` is
    /// replaced on the others; its length need not be known there).
    ///
    /// # Errors
    /// [`Error::Split`] for a `root` out of range.
    fn broadcast(&self, root: usize, bytes: &mut Vec<u8>) -> Result<()>;

    /// Every process's `mine`, in rank order (lengths may differ, empty
    /// included).
    fn all_gather(&self, mine: &[u8]) -> Vec<Vec<u8>>;
}

/// How long a barrier waiter spins and then yields before it sleeps, as
/// `SHARDGRAPH_SPIN=spins,yields` overrides it (for tuning); `None` if unset.
fn spin_override() -> Option<(u32, u32)> {
    static B: std::sync::OnceLock<Option<(u32, u32)>> = std::sync::OnceLock::new();
    *B.get_or_init(|| {
        let v = std::env::var("SHARDGRAPH_SPIN").ok()?;
        let (a, b) = v.split_once(',')?;
        Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
    })
}

/// A reusable barrier for the ranks of one communicator: waiters spin
/// briefly (an exchange on idle devices completes in microseconds), then
/// sleep; [`Barrier::abort`] releases everyone with an error.
#[derive(Debug)]
struct Barrier {
    n: usize,
    /// Spins, then yields, before sleeping.
    spin: (u32, u32),
    arrived: AtomicUsize,
    generation: AtomicU64,
    aborted: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Barrier {
    fn new(n: usize, spin: (u32, u32)) -> Self {
        Barrier {
            n,
            spin: spin_override().unwrap_or(spin),
            arrived: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    fn wait(&self) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(peer_failed());
        }
        let gen = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.cv.notify_all();
            return Ok(());
        }
        let released = || self.generation.load(Ordering::Acquire) != gen;
        let (spins, yields) = self.spin;
        for i in 0..spins + yields {
            if released() {
                return Ok(());
            }
            if self.aborted.load(Ordering::Acquire) {
                return Err(peer_failed());
            }
            if i < spins {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while !released() && !self.aborted.load(Ordering::Acquire) {
            g = self.cv.wait_timeout(g, std::time::Duration::from_millis(10)).unwrap_or_else(|p| p.into_inner()).0;
        }
        if released() {
            Ok(())
        } else {
            Err(peer_failed())
        }
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}

/// The generic communicator, for any devices: each rank posts its send
/// slices, and after a barrier every receiver copies its messages straight
/// from the senders' buffers ([`Buffer::copy_from`]: a memcpy between CPU
/// buffers, a stream-ordered device-to-device or peer copy between CUDA
/// devices); a second barrier frees the send slices. The fallback where
/// NCCL is missing, and the only choice for virtual devices on one GPU
/// (NCCL refuses two ranks on one GPU).
#[derive(Debug)]
pub struct HostComm {
    n: usize,
    barrier: Barrier,
    /// Per sender: its posted send slices (indexed by receiver).
    posted: Vec<Mutex<Vec<Option<BufSlice>>>>,
    received: Vec<AtomicU64>,
}

impl HostComm {
    /// A communicator for `n` ranks (`n ≥ 1`) whose threads each have a core:
    /// a rank waiting for the others spins a few microseconds before it
    /// sleeps (an exchange between busy devices completes in microseconds).
    pub fn new(n: usize) -> Self {
        Self::with_spin(n, (4000, 100))
    }

    /// A communicator for `n` ranks whose threads share cores with others
    /// (more device threads than cores): a waiting rank sleeps almost at
    /// once, so the rank it waits for gets the core.
    pub fn oversubscribed(n: usize) -> Self {
        Self::with_spin(n, (50, 20))
    }

    fn with_spin(n: usize, spin: (u32, u32)) -> Self {
        let n = n.max(1);
        HostComm {
            n,
            barrier: Barrier::new(n, spin),
            posted: (0..n).map(|_| Mutex::new(Vec::with_capacity(n))).collect(),
            received: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Comm for HostComm {
    fn n_ranks(&self) -> usize {
        self.n
    }

    fn exchange(&self, rank: usize, send: &[Option<BufSlice>], recv: &[Option<BufSlice>]) -> Result<()> {
        let poisoned = || Error::Split { detail: "communicator poisoned".into() };
        if send.len() != self.n || recv.len() != self.n || rank >= self.n {
            self.abort();
            return Err(Error::Split {
                detail: format!("exchange from rank {rank} with {} sends and {} receives", send.len(), recv.len()),
            });
        }
        {
            let mut p = self.posted[rank].lock().map_err(|_| poisoned())?;
            p.clear();
            p.extend(send.iter().cloned());
        }
        self.barrier.wait()?;
        let mut bytes = 0u64;
        let mut result = Ok(());
        for (src, r) in recv.iter().enumerate() {
            let Some(r) = r.as_ref().filter(|_| src != rank) else { continue };
            let m = self.posted[src].lock().map_err(|_| poisoned())?.get(rank).cloned().flatten();
            let copied = match m {
                Some(m) if m.len == r.len => r.buf.copy_from(r.offset, &*m.buf, m.offset, m.len),
                m => Err(Error::Split {
                    detail: format!(
                        "rank {rank} expects {} bytes from rank {src}, which sends {}",
                        r.len,
                        m.map_or(0, |m| m.len)
                    ),
                }),
            };
            if let Err(e) = copied {
                result = Err(e);
                break;
            }
            bytes += r.len as u64;
        }
        if let Err(e) = result {
            self.abort();
            return Err(e);
        }
        self.received[rank].fetch_add(bytes, Ordering::Relaxed);
        // The senders' slices stay untouched until every copy is done (or queued).
        self.barrier.wait()?;
        // Every rank has read them: drop this rank's posted slices, so the
        // communicator does not keep a buffer alive after its owner (an
        // arena replaced by a larger one) lets it go.
        self.posted[rank].lock().map_err(|_| poisoned())?.clear();
        Ok(())
    }

    fn abort(&self) {
        self.barrier.abort();
    }

    fn is_aborted(&self) -> bool {
        self.barrier.is_aborted()
    }

    fn bytes_received(&self) -> Vec<u64> {
        self.received.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }

    fn describe(&self) -> String {
        format!("copies within this process ({} devices)", self.n_ranks())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::CpuBackend;

    /// Runs `f(rank)` on every rank concurrently.
    fn spmd<T: Send>(n: usize, f: impl Fn(usize) -> Result<T> + Sync) -> Vec<Result<T>> {
        std::thread::scope(|s| {
            let f = &f;
            let hs: Vec<_> = (0..n).map(|r| s.spawn(move || f(r))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn an_exchange_moves_every_message_once_and_counts_it() {
        for n in 1..=4usize {
            let cpu = CpuBackend::with_threads(1).unwrap();
            // Rank r's buffer: 8 bytes per peer to send (value 16·r + peer), 8 per peer to receive.
            let bufs: Vec<Arc<dyn Buffer>> = (0..n).map(|_| cpu.alloc_buffer(16 * n).unwrap()).collect();
            for (r, b) in bufs.iter().enumerate() {
                let data: Vec<u8> = (0..n).flat_map(|p| [(16 * r + p) as u8; 8]).collect();
                b.set(0, &data).unwrap();
            }
            let c = HostComm::new(n);
            let res = spmd(n, |r| {
                let slice = |o: usize| Some(BufSlice { buf: bufs[r].clone(), offset: o, len: 8 });
                let send: Vec<_> = (0..n).map(|p| slice(8 * p)).collect();
                let recv: Vec<_> = (0..n).map(|p| slice(8 * n + 8 * p)).collect();
                c.exchange(r, &send, &recv)
            });
            assert!(res.iter().all(|r| r.is_ok()));
            for (r, b) in bufs.iter().enumerate() {
                let mut got = vec![0u8; 8 * n];
                b.get(8 * n, &mut got).unwrap();
                for p in (0..n).filter(|&p| p != r) {
                    assert_eq!(got[8 * p..8 * p + 8], [(16 * p + r) as u8; 8], "rank {r} from {p}");
                }
            }
            assert_eq!(c.bytes_received().iter().sum::<u64>(), (8 * n * (n - 1)) as u64);
        }
    }

    #[test]
    fn a_failed_rank_or_a_size_mismatch_releases_the_others() {
        let c = HostComm::new(3);
        let r = spmd(3, |r| {
            if r == 2 {
                c.abort();
                return Ok(());
            }
            c.exchange(r, &[None, None, None], &[None, None, None])
        });
        assert!(r[0].is_err() && r[1].is_err());
        let cpu = CpuBackend::with_threads(1).unwrap();
        let b = cpu.alloc_buffer(16).unwrap();
        let c = HostComm::new(2);
        let r = spmd(2, |r| {
            let s = |len| Some(BufSlice { buf: b.clone(), offset: 0, len });
            if r == 0 {
                c.exchange(0, &[None, s(4)], &[None, None])
            } else {
                c.exchange(1, &[None, None], &[s(8), None])
            }
        });
        assert!(r[1].as_ref().unwrap_err().to_string().contains("expects 8 bytes from rank 0, which sends 4"));
        assert!(c.is_aborted());
    }
}
