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
//! Status: compiled, not yet run (the machines this was written on have no
//! GPU, no NCCL and no RCCL).

use super::{peer_failed, BufSlice, Comm};
use crate::backend::cuda::{CudaBackend, RawDevice, Vendor};
use crate::backend::Backend;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

type RawComm = *mut c_void;
/// `ncclUint8`: messages are bytes.
const NCCL_UINT8: c_int = 1;

/// The NCCL/RCCL entry points used, resolved once per process.
struct Lib {
    /// "NCCL" or "RCCL", for messages.
    name: &'static str,
    vendor: Vendor,
    init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> c_int,
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
/// (ranks in device order).
pub struct NcclComm {
    lib: &'static Lib,
    ranks: Vec<Mutex<Rank>>,
    devices: Vec<RawDevice>,
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
            if ordinals.contains(&ordinal) {
                return Err(v.error(format!(
                    "{}: NCCL/RCCL needs one rank per GPU (virtual devices share GPU {ordinal})",
                    d.name()
                )));
            }
            ordinals.push(ordinal);
        }
        let lib = lib(vendor.unwrap_or(Vendor::Cuda))?;
        let n = devices.len();
        let devlist: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        let mut raw: Vec<RawComm> = vec![std::ptr::null_mut(); n];
        // SAFETY: `raw` and `devlist` hold `n` entries each.
        check(lib, "ncclCommInitAll", unsafe { (lib.init_all)(raw.as_mut_ptr(), n as c_int, devlist.as_ptr()) })?;
        Ok(NcclComm {
            lib,
            ranks: raw.into_iter().map(|c| Mutex::new(Rank(c))).collect(),
            devices: devices.iter().map(|d| d.raw_device()).collect(),
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
        let cuda = devices
            .iter()
            .map(|d| {
                d.as_any()
                    .and_then(|a| a.downcast_ref::<CudaBackend>())
                    .ok_or_else(|| Error::Cuda { detail: format!("{}: NCCL/RCCL needs GPU devices", d.device().name) })
            })
            .collect::<Result<Vec<_>>>()?;
        Self::new(&cuda)
    }

    /// Rank `rank`'s device pointer for `s` (a buffer of that rank's device).
    fn ptr(&self, rank: usize, s: &BufSlice) -> Result<u64> {
        self.devices[rank].buffer_ptr(&*s.buf, s.offset, s.len)?.ok_or_else(|| Error::Split {
            detail: format!("rank {rank}: an NCCL/RCCL message must live in a buffer of {}", self.names[rank]),
        })
    }
}

impl Drop for NcclComm {
    /// `ncclCommDestroy` for each rank, or `ncclCommAbort` after a failed
    /// or aborted exchange (whose queued operations may never complete).
    fn drop(&mut self) {
        let aborted = self.is_aborted();
        for (r, d) in self.ranks.iter().zip(&self.devices) {
            let r = r.lock().unwrap_or_else(|p| p.into_inner());
            // The rank's GPU current, as NCCL expects for its teardown.
            let _ = d.bind_stream();
            let free = if aborted { self.lib.abort } else { self.lib.destroy };
            // SAFETY: created by ncclCommInitAll, freed once.
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
        let stream = self.devices[rank].bind_stream()?;
        let comm = self.ranks[rank].lock().map_err(|_| Error::Split { detail: "NCCL/RCCL rank poisoned".into() })?;
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
