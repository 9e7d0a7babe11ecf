//! NCCL (NVIDIA) or RCCL (AMD, the same C API) as the meta backend's
//! communicator for GPU devices of one vendor on distinct GPUs: an exchange ([`Comm::exchange`]) is one group of
//! `ncclSend`/`ncclRecv` on each device's stream, so a collective is queued
//! behind the kernels that produced its input and before the ones that
//! read its output, with no host synchronisation. The collectives
//! themselves (all-reduce, reduce-scatter, all-gather, all-to-all, the
//! statistics of distributed row ops) are compiled into exchanges and
//! device graph nodes by the meta backend, so the bytes a run moves stay
//! the bytes its plan charges.
//!
//! The library (`libnccl.so.2` for CUDA devices, `librccl.so.1` for HIP
//! devices) is loaded at run time through the handful of entry points used
//! here; without it, for devices of two vendors, or for virtual devices on
//! one GPU (NCCL and RCCL refuse two ranks on one GPU), [`NcclComm::new`]
//! is an error and the meta backend keeps [`HostComm`](super::HostComm)'s
//! stream-ordered device-to-device copies, which work for any device count
//! on either vendor.
//!
//! The device side (the GPU's vendor and ordinal, its stream bound to the
//! calling thread, addresses of its buffers) comes from the GPU backend's
//! `RawDevice`; everything NCCL/RCCL itself is here.
//!
//! Across processes (feature `mpi`, [`NcclComm::across_processes`]) one
//! communicator spans every process's GPUs, as NCCL's multi-process
//! set-up: process 0's `ncclGetUniqueId` broadcast over MPI, then one
//! `ncclCommInitRank` per local device; each process holds only its own
//! ranks. Every process first says whether it can join, so all take the
//! same road (NCCL/RCCL, or MPI staged through host memory when one cannot).
//!
//! Status: compiled, not yet run (the machines this was written on have no
//! GPU, no NCCL and no RCCL); the agreement across processes runs in the
//! tests (emulated GPUs: every process learns process 0 cannot, and all
//! exchange over MPI). Two processes on one GPU are refused by NCCL itself
//! (one rank per GPU), so a check of the NCCL path across processes needs
//! a machine with two GPUs.

use super::{peer_failed, BufSlice, Comm};
use crate::backend::cuda::{CudaBackend, RawDevice, Vendor};
use crate::backend::Backend;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

type RawComm = *mut c_void;

/// `ncclUniqueId`: `NCCL_UNIQUE_ID_BYTES` (128) opaque bytes, passed by
/// value to `ncclCommInitRank` (RCCL keeps the layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [u8; UNIQUE_ID_BYTES],
}

/// `NCCL_UNIQUE_ID_BYTES` (nccl.h).
const UNIQUE_ID_BYTES: usize = 128;
/// `ncclUint8`: messages are bytes.
const NCCL_UINT8: c_int = 1;

/// The NCCL/RCCL entry points used, resolved once per process.
struct Lib {
    /// "NCCL" or "RCCL", for messages.
    name: &'static str,
    vendor: Vendor,
    init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> c_int,
    /// `ncclGetUniqueId`: the id rank 0 of a communicator across processes
    /// creates and every process is given.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    /// `ncclCommInitRank(comm, nranks, id, rank)`: one rank of a
    /// communicator across processes (the id passed by value).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    init_rank: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> c_int,
    destroy: unsafe extern "C" fn(RawComm) -> c_int,
    /// `ncclCommAbort`: frees a communicator whose operations may never
    /// complete (a failed or aborted exchange), where `ncclCommDestroy`
    /// would wait for them.
    abort: unsafe extern "C" fn(RawComm) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, RawComm, *mut c_void) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    _lib: libloading::Library,
}

/// NCCL (for CUDA devices) or RCCL (for HIP devices), loaded on first use.
fn lib(vendor: Vendor) -> Result<&'static Lib> {
    static NCCL: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();
    static RCCL: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();
    let (cell, name, sonames) = match vendor {
        Vendor::Cuda => (&NCCL, "NCCL", vec!["libnccl.so.2".to_string(), "libnccl.so".into()]),
        Vendor::Hip => {
            // The loader's path, then ROCm's own folders (as for the HIP runtime).
            let mut dirs: Vec<String> =
                std::env::var("ROCM_PATH").map(|r| vec![format!("{r}/lib/")]).unwrap_or_default();
            dirs.push("/opt/rocm/lib/".into());
            dirs.insert(0, String::new());
            let names = dirs.iter().flat_map(|d| [format!("{d}librccl.so.1"), format!("{d}librccl.so")]).collect();
            (&RCCL, "RCCL", names)
        }
    };
    cell.get_or_init(|| {
        let mut last = String::new();
        for so in &sonames {
            // SAFETY: loading the library runs its initialisers (no preconditions).
            match unsafe { libloading::Library::new(so.as_str()) } {
                Ok(lib) => {
                    // SAFETY: each symbol is declared with NCCL's C signature
                    // (nccl.h, NCCL 2.x; RCCL keeps the same API); the library
                    // stays loaded in `_lib`.
                    return unsafe {
                        Ok(Lib {
                            name,
                            vendor,
                            init_all: *lib.get(b"ncclCommInitAll\0").map_err(|e| e.to_string())?,
                            unique_id: *lib.get(b"ncclGetUniqueId\0").map_err(|e| e.to_string())?,
                            init_rank: *lib.get(b"ncclCommInitRank\0").map_err(|e| e.to_string())?,
                            destroy: *lib.get(b"ncclCommDestroy\0").map_err(|e| e.to_string())?,
                            abort: *lib.get(b"ncclCommAbort\0").map_err(|e| e.to_string())?,
                            group_start: *lib.get(b"ncclGroupStart\0").map_err(|e| e.to_string())?,
                            group_end: *lib.get(b"ncclGroupEnd\0").map_err(|e| e.to_string())?,
                            send: *lib.get(b"ncclSend\0").map_err(|e| e.to_string())?,
                            recv: *lib.get(b"ncclRecv\0").map_err(|e| e.to_string())?,
                            error_string: *lib.get(b"ncclGetErrorString\0").map_err(|e| e.to_string())?,
                            _lib: lib,
                        })
                    };
                }
                Err(e) => last = format!("{so}: {e}"),
            }
        }
        Err(format!("{name} is not installed ({last})"))
    })
    .as_ref()
    .map_err(|e| vendor.error(e.clone()))
}

/// An NCCL/RCCL result as our error.
fn check(lib: &Lib, what: &str, rc: c_int) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: NCCL and RCCL return a static NUL-terminated string for any code.
    let msg = unsafe { std::ffi::CStr::from_ptr((lib.error_string)(rc)) }.to_string_lossy().into_owned();
    Err(lib.vendor.error(format!("{what}: {} error {rc} ({msg})", lib.name)))
}

/// An NCCL communicator handle, used by one rank's thread at a time.
struct Rank(RawComm);
// SAFETY: NCCL communicators may be used from any thread, one at a time;
// each rank's handle is only used by that rank's calls.
unsafe impl Send for Rank {}

/// One NCCL (CUDA devices) or RCCL (HIP devices) communicator per device
/// (ranks in device order). Within one process every rank is this
/// process's ([`NcclComm::new`]); across processes
/// ([`NcclComm::across_processes`], feature `mpi`) each process holds the
/// ranks of its own devices and the others are peers reached through NCCL.
pub struct NcclComm {
    lib: &'static Lib,
    /// Per rank: its communicator handle when the device is this process's.
    ranks: Vec<Option<Mutex<Rank>>>,
    /// Per rank: the GPU when the device is this process's.
    devices: Vec<Option<RawDevice>>,
    names: Vec<String>,
    /// Set by a failed exchange (every later one fails).
    aborted: AtomicBool,
    received: Vec<AtomicU64>,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm").field("devices", &self.names).finish()
    }
}

/// The vendor and GPU ordinals of `devices`, checked for one communicator:
/// every device a real GPU, one vendor, one device per GPU.
fn physical_gpus(devices: &[&CudaBackend]) -> Result<(Vendor, Vec<c_int>)> {
    let mut ordinals = Vec::with_capacity(devices.len());
    let mut vendor = None;
    for d in devices {
        let (v, ordinal) = d.raw_device().physical().ok_or_else(|| Error::Cuda {
            detail: format!("{}: NCCL/RCCL needs a real GPU, not an emulated one", d.name()),
        })?;
        if vendor.is_some_and(|first| first != v) {
            return Err(Error::Cuda {
                detail: format!("{}: one communicator needs devices of one vendor (CUDA or HIP)", d.name()),
            });
        }
        vendor = Some(v);
        let ordinal = c_int::try_from(ordinal).map_err(|_| v.error(format!("{}: GPU {ordinal}", d.name())))?;
        if ordinals.contains(&ordinal) {
            return Err(v.error(format!(
                "{}: NCCL/RCCL needs one rank per GPU (virtual devices share GPU {ordinal})",
                d.name()
            )));
        }
        ordinals.push(ordinal);
    }
    Ok((vendor.unwrap_or(Vendor::Cuda), ordinals))
}

/// `d` as a GPU backend.
fn as_gpu(d: &Arc<dyn Backend>) -> Result<&CudaBackend> {
    d.as_any()
        .and_then(|a| a.downcast_ref::<CudaBackend>())
        .ok_or_else(|| Error::Cuda { detail: format!("{}: NCCL/RCCL needs GPU devices", d.device().name) })
}

impl NcclComm {
    /// A communicator over `devices` (rank `i` is `devices[i]`), each on its
    /// own physical GPU, all CUDA (NCCL) or all HIP (RCCL).
    ///
    /// # Errors
    /// [`Error::Cuda`] if a device is emulated or the devices mix vendors;
    /// [`Error::Cuda`] (CUDA devices) or [`Error::Hip`] (HIP devices) if two
    /// devices share a GPU (virtual devices), the library is not installed,
    /// or `ncclCommInitAll` fails.
    pub fn new(devices: &[&CudaBackend]) -> Result<Self> {
        let (vendor, devlist) = physical_gpus(devices)?;
        let lib = lib(vendor)?;
        let n = devices.len();
        let mut raw: Vec<RawComm> = vec![std::ptr::null_mut(); n];
        // SAFETY: `raw` and `devlist` hold `n` entries each.
        check(lib, "ncclCommInitAll", unsafe { (lib.init_all)(raw.as_mut_ptr(), n as c_int, devlist.as_ptr()) })?;
        Ok(NcclComm {
            lib,
            ranks: raw.into_iter().map(|c| Some(Mutex::new(Rank(c)))).collect(),
            devices: devices.iter().map(|d| Some(d.raw_device())).collect(),
            names: devices.iter().map(|d| d.name().to_string()).collect(),
            aborted: AtomicBool::new(false),
            received: (0..n).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// [`NcclComm::new`] over the meta backend's devices.
    ///
    /// # Errors
    /// As [`NcclComm::new`]; [`Error::Cuda`] if a device is not a GPU
    /// ([`CudaBackend`], CUDA or HIP).
    pub fn for_backends(devices: &[Arc<dyn Backend>]) -> Result<Self> {
        let cuda = devices.iter().map(as_gpu).collect::<Result<Vec<_>>>()?;
        Self::new(&cuda)
    }

    /// One communicator over a world of GPUs in several processes
    /// (`devices`, rank order; device `j` runs in process `owner[j]`, this
    /// process's are GPU backends, the others' stand-ins): as NCCL's
    /// multi-process set-up, process 0 creates the id
    /// (`ncclGetUniqueId`), MPI broadcasts it, and each process joins one
    /// rank per device of its own (`ncclCommInitRank`, grouped). Every
    /// process calls it; each first says whether it can (its devices real
    /// GPUs of one vendor, one per GPU, the library loaded, each GPU made
    /// current), so every process gets the same answer: the communicator,
    /// or the same error (then exchanges stay on MPI).
    ///
    /// # Errors
    /// On every process: [`Error::Split`] naming the first process that
    /// cannot (its reason), or processes of two vendors; the vendor's
    /// error ([`Error::Cuda`], [`Error::Hip`]) if process 0 cannot create
    /// the id or a process's `ncclCommInitRank` fails (the ranks made are
    /// freed).
    #[cfg(feature = "mpi")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mpi")))]
    pub fn across_processes(world: &super::World, devices: &[Arc<dyn Backend>], owner: &[usize]) -> Result<Self> {
        let n = devices.len();
        let me = world.rank();
        let local: Vec<usize> = (0..n).filter(|&j| owner.get(j) == Some(&me)).collect();
        let mine = (|| {
            let gpus = local.iter().map(|&j| as_gpu(&devices[j])).collect::<Result<Vec<_>>>()?;
            let (vendor, _) = physical_gpus(&gpus)?;
            let lib = lib(vendor)?;
            for g in &gpus {
                g.raw_device().bind_stream()?;
            }
            Ok((lib, gpus))
        })();
        let said = match &mine {
            Ok((lib, _)) => format!("+{}", lib.name),
            Err(e) => format!("-{e}"),
        };
        agree(world, &world.all_gather(said.as_bytes()))?;
        let (lib, gpus) = mine?;
        // Process 0's id, or nothing when it could not make one.
        let mut id = Vec::new();
        let mut made = Ok(());
        if me == 0 {
            let mut uid = UniqueId { internal: [0; UNIQUE_ID_BYTES] };
            // SAFETY: `uid` is a writable ncclUniqueId.
            made = check(lib, "ncclGetUniqueId", unsafe { (lib.unique_id)(&mut uid) });
            if made.is_ok() {
                id = uid.internal.to_vec();
            }
        }
        world.broadcast(0, &mut id)?;
        made?;
        let internal: [u8; UNIQUE_ID_BYTES] = id.as_slice().try_into().map_err(|_| {
            lib.vendor
                .error(format!("process 0 could not create the {} id of a communicator across processes", lib.name))
        })?;
        let uid = UniqueId { internal };
        let mut raw: Vec<RawComm> = vec![std::ptr::null_mut(); local.len()];
        // SAFETY: no arguments.
        let mut joined = check(lib, "ncclGroupStart", unsafe { (lib.group_start)() });
        if joined.is_ok() {
            for ((slot, &j), g) in raw.iter_mut().zip(&local).zip(&gpus) {
                // The rank's GPU current for its communicator (checked above).
                let rc = g.raw_device().bind_stream().and_then(|_| {
                    // SAFETY: `slot` is writable; `n` ranks, this one `j < n`.
                    check(lib, "ncclCommInitRank", unsafe { (lib.init_rank)(slot, n as c_int, uid, j as c_int) })
                });
                if rc.is_err() {
                    joined = rc;
                    break;
                }
            }
            // SAFETY: closes the group opened above.
            joined = joined.and(check(lib, "ncclGroupEnd", unsafe { (lib.group_end)() }));
        }
        let said = match &joined {
            Ok(()) => "+".to_string(),
            Err(e) => format!("-{e}"),
        };
        if let Err(e) = agree(world, &world.all_gather(said.as_bytes())).and(joined) {
            for c in raw.into_iter().filter(|c| !c.is_null()) {
                // SAFETY: made by ncclCommInitRank above, freed once; abort,
                // since the other ranks may never complete their part.
                let _ = unsafe { (lib.abort)(c) };
            }
            return Err(e);
        }
        let mut ranks: Vec<Option<Mutex<Rank>>> = (0..n).map(|_| None).collect();
        let mut raws: Vec<Option<RawDevice>> = vec![None; n];
        for ((&j, c), g) in local.iter().zip(raw).zip(&gpus) {
            ranks[j] = Some(Mutex::new(Rank(c)));
            raws[j] = Some(g.raw_device());
        }
        Ok(NcclComm {
            lib,
            ranks,
            devices: raws,
            names: devices.iter().map(|d| d.device().name).collect(),
            aborted: AtomicBool::new(false),
            received: (0..n).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// This process's handle and GPU of rank `rank`.
    fn local(&self, rank: usize) -> Result<(&Mutex<Rank>, &RawDevice)> {
        match (self.ranks.get(rank), self.devices.get(rank)) {
            (Some(Some(r)), Some(Some(d))) => Ok((r, d)),
            _ => Err(Error::Split {
                detail: format!("rank {rank} of an NCCL/RCCL communicator is not a device of this process"),
            }),
        }
    }

    /// Rank `rank`'s device pointer for `s` (a buffer of that rank's device).
    fn ptr(&self, rank: usize, s: &BufSlice) -> Result<u64> {
        self.local(rank)?.1.buffer_ptr(&*s.buf, s.offset, s.len)?.ok_or_else(|| Error::Split {
            detail: format!("rank {rank}: an NCCL/RCCL message must live in a buffer of {}", self.names[rank]),
        })
    }
}

/// Every process's answer (`+` and the library's name, or `-` and why
/// not) as one verdict, the same on every process.
#[cfg(feature = "mpi")]
fn agree(world: &super::World, said: &[Vec<u8>]) -> Result<()> {
    let mut lib: Option<&[u8]> = None;
    for (r, s) in said.iter().enumerate() {
        match s.split_first() {
            Some((b'+', name)) => {
                if lib.is_some_and(|l| l != name) {
                    return Err(Error::Split {
                        detail: "the processes' GPUs are of two vendors (NCCL and RCCL do not talk)".into(),
                    });
                }
                lib = Some(name);
            }
            Some((_, why)) => {
                return Err(Error::Split {
                    detail: format!("process {r} of {}: {}", world.size(), String::from_utf8_lossy(why)),
                })
            }
            None => return Err(Error::Split { detail: format!("process {r} said nothing") }),
        }
    }
    Ok(())
}

impl Drop for NcclComm {
    /// `ncclCommDestroy` for each of this process's ranks, or
    /// `ncclCommAbort` after a failed or aborted exchange (whose queued
    /// operations may never complete).
    fn drop(&mut self) {
        let aborted = self.is_aborted();
        for (r, d) in self.ranks.iter().zip(&self.devices) {
            let (Some(r), Some(d)) = (r, d) else { continue };
            let r = r.lock().unwrap_or_else(|p| p.into_inner());
            // The rank's GPU current, as NCCL expects for its teardown.
            let _ = d.bind_stream();
            let free = if aborted { self.lib.abort } else { self.lib.destroy };
            // SAFETY: created by ncclCommInitAll or ncclCommInitRank, freed once.
            let _ = unsafe { free(r.0) };
        }
    }
}

impl NcclComm {
    /// One NCCL group of `posts` (send?, peer, device pointer, bytes) on
    /// `stream`. Once `ncclGroupStart` succeeded, `ncclGroupEnd` is always
    /// called (a group left open would swallow the process's later NCCL
    /// calls); the first error is returned after it.
    ///
    /// # Safety
    /// Every pointer lies in a live buffer of the rank's device for `len`
    /// bytes until the queued operations complete; `comm` is this rank's
    /// communicator and `stream` its device's stream.
    unsafe fn group(
        &self,
        what: &str,
        comm: RawComm,
        stream: *mut c_void,
        posts: &[(bool, usize, u64, usize)],
    ) -> Result<()> {
        let lib = self.lib;
        // SAFETY: no arguments.
        check(lib, what, unsafe { (lib.group_start)() })?;
        let mut first = Ok(());
        for &(is_send, peer, p, len) in posts {
            // SAFETY: the caller's guarantees.
            let rc = unsafe {
                if is_send {
                    (lib.send)(p as *const c_void, len, NCCL_UINT8, peer as c_int, comm, stream)
                } else {
                    (lib.recv)(p as *mut c_void, len, NCCL_UINT8, peer as c_int, comm, stream)
                }
            };
            first = check(lib, what, rc);
            if first.is_err() {
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let end = check(lib, what, unsafe { (lib.group_end)() });
        first.and(end)
    }
}

impl Comm for NcclComm {
    fn n_ranks(&self) -> usize {
        self.ranks.len()
    }

    fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    fn bytes_received(&self) -> Vec<u64> {
        self.received.iter().map(|d| d.load(Ordering::Relaxed)).collect()
    }

    fn describe(&self) -> String {
        let here = self.ranks.iter().filter(|r| r.is_some()).count();
        format!("{} (device memory, {} devices, {here} in this process)", self.lib.name, self.n_ranks())
    }

    /// One NCCL group of every send and receive of this rank, queued on
    /// its device's stream (sizes are known on both sides: no handshake).
    fn exchange(&self, rank: usize, send: &[Option<BufSlice>], recv: &[Option<BufSlice>]) -> Result<()> {
        let n = self.n_ranks();
        if send.len() != n || recv.len() != n || rank >= n {
            self.abort();
            return Err(Error::Split { detail: format!("exchange from rank {rank} with {} messages", send.len()) });
        }
        if self.is_aborted() {
            return Err(peer_failed());
        }
        let mut posts = Vec::new();
        for (peer, (s, r)) in send.iter().zip(recv).enumerate() {
            if peer == rank {
                continue;
            }
            if let Some(r) = r.as_ref().filter(|r| r.len > 0) {
                posts.push((false, peer, self.ptr(rank, r)?, r.len));
            }
            if let Some(s) = s.as_ref().filter(|s| s.len > 0) {
                posts.push((true, peer, self.ptr(rank, s)?, s.len));
            }
        }
        let (comm, device) = self.local(rank)?;
        let stream = device.bind_stream()?;
        let comm = comm.lock().map_err(|_| Error::Split { detail: "NCCL/RCCL rank poisoned".into() })?;
        let what = format!("{}: {} send/recv", self.names[rank], self.lib.name);
        // SAFETY: a group of point-to-point calls; every pointer lies in a
        // live buffer of this rank's device (checked by `ptr`), kept alive by
        // the compiled program that owns the slices until its run ends.
        let r = unsafe { self.group(&what, comm.0, stream, &posts) };
        if r.is_err() {
            self.abort();
        }
        r?;
        let got: u64 = recv
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != rank)
            .filter_map(|(_, s)| s.as_ref())
            .map(|s| s.len as u64)
            .sum();
        self.received[rank].fetch_add(got, Ordering::Relaxed);
        Ok(())
    }
}
