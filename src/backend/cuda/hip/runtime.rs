//! The HIP runtime (`libamdhip64`), loaded at run time with `libloading`,
//! so the crate builds without ROCm and a machine without it gets an
//! [`Error::Hip`]. Only the entry points the backend uses are bound; each
//! signature, enum value and struct offset below was checked against the
//! headers of ROCm 5.2.3 (Debian 12's `/usr/include/hip`), ROCm/HIP
//! `rocm-5.7.1`, `rocm-6.0.0`, `rocm-6.2.2` and `amd-staging`
//! (compiled, `sizeof`/`offsetof` printed), and ROCm 7's
//! `projects/hip/include/hip/hip_runtime_api.h` (ROCm/rocm-systems, read).
//!
//! The values used, the same in every one of those versions:
//!
//! | name | value |
//! | --- | --- |
//! | `hipDeviceAttributeMemoryBusWidth` | 59 |
//! | `hipDeviceAttributeMemoryClockRate` (kHz) | 60 |
//! | `hipDeviceAttributeMultiprocessorCount` | 63 |
//! | `hipDeviceAttributeWarpSize` | 87 |
//! | `hipStreamNonBlocking` | 1 |
//! | `hipEventDisableTiming` | 2 |
//! | `hipErrorOutOfMemory` | 2 |
//! | `hipErrorNoDevice` / `hipErrorInvalidDevice` | 100 / 101 |
//! | `hipErrorInsufficientDriver` | 35 |
//! | `hipErrorPeerAccessAlreadyEnabled` | 704 |
//!
//! What differs between versions: ROCm 5.x's `hipDeviceAttributeGcnArch`
//! (10003) and `hipDeviceAttributeGcnArchName` (10004) are renamed
//! `hipDeviceAttributeUnused4`/`Unused5` in ROCm 7 (and an `int`
//! attribute could not hold a name anyway), and `hipDeviceProp_t` changed
//! layout in ROCm 6.0 — see [`Runtime::arch_name`], the one reason this
//! module reads that struct.

use super::super::api::DevPtr;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Mutex, OnceLock};

/// A `hipError_t` (a C enum: `int`-sized).
pub(crate) type HipError = i32;

/// `hipSuccess`.
pub(crate) const SUCCESS: HipError = 0;
/// `hipErrorOutOfMemory`.
pub(crate) const ERROR_OUT_OF_MEMORY: HipError = 2;
const ERROR_INSUFFICIENT_DRIVER: HipError = 35;
const ERROR_NO_DEVICE: HipError = 100;
const ERROR_INVALID_DEVICE: HipError = 101;
/// `hipErrorPeerAccessAlreadyEnabled`.
const ERROR_PEER_ACCESS_ALREADY_ENABLED: HipError = 704;

/// `hipDeviceAttribute_t` values (see the module doc for their sources).
pub(crate) mod attr {
    /// Global memory bus width, bits.
    pub(crate) const MEMORY_BUS_WIDTH: i32 = 59;
    /// Peak memory clock, kHz.
    pub(crate) const MEMORY_CLOCK_RATE: i32 = 60;
    /// Compute units.
    pub(crate) const MULTIPROCESSOR_COUNT: i32 = 63;
    /// Threads per wave.
    pub(crate) const WARP_SIZE: i32 = 87;
}

const STREAM_NON_BLOCKING: u32 = 1;
const EVENT_DISABLE_TIMING: u32 = 2;

/// Where `gcnArchName` and `warpSize` lie in `hipDeviceProp_t`: ROCm 6.0
/// and later (`hipDeviceProp_tR0600`, filled by `hipGetDevicePropertiesR0600`)
/// and ROCm 5.x (filled by the unversioned `hipGetDeviceProperties`).
/// `sizeof` is 1472 and 792 bytes; the buffer given is larger than both.
const R0600_ARCH: usize = 1160;
const R0600_WARP: usize = 308;
const R0000_ARCH: usize = 396;
const R0000_WARP: usize = 276;
const PROPS_BUFFER: usize = 4096;

/// An opaque HIP handle (`hipStream_t`, `hipEvent_t`, `hipModule_t`,
/// `hipFunction_t`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handle(pub(crate) *mut c_void);

// SAFETY: HIP's handles are opaque pointers into the runtime, which
// accepts them from any thread (the runtime locks internally); this crate
// only passes them back to the runtime.
unsafe impl Send for Handle {}
// SAFETY: as above; a `Handle` is never dereferenced here.
unsafe impl Sync for Handle {}

type FnInit = unsafe extern "C" fn(u32) -> HipError;
type FnIntOut = unsafe extern "C" fn(*mut i32) -> HipError;
type FnDevice = unsafe extern "C" fn(i32) -> HipError;
type FnDeviceGet = unsafe extern "C" fn(*mut i32, i32) -> HipError;
type FnDeviceName = unsafe extern "C" fn(*mut c_char, i32, i32) -> HipError;
type FnTotalMem = unsafe extern "C" fn(*mut usize, i32) -> HipError;
type FnAttribute = unsafe extern "C" fn(*mut i32, i32, i32) -> HipError;
type FnProps = unsafe extern "C" fn(*mut c_void, i32) -> HipError;
type FnCreateWithFlags = unsafe extern "C" fn(*mut Handle, u32) -> HipError;
type FnHandle = unsafe extern "C" fn(Handle) -> HipError;
type FnMalloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError;
type FnFree = unsafe extern "C" fn(*mut c_void) -> HipError;
type FnCopyAsync = unsafe extern "C" fn(*mut c_void, *const c_void, usize, Handle) -> HipError;
type FnPeerAsync = unsafe extern "C" fn(*mut c_void, i32, *const c_void, i32, usize, Handle) -> HipError;
type FnMemsetD8Async = unsafe extern "C" fn(*mut c_void, u8, usize, Handle) -> HipError;
type FnModuleLoadData = unsafe extern "C" fn(*mut Handle, *const c_void) -> HipError;
type FnModuleGetFunction = unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> HipError;
type FnLaunch = unsafe extern "C" fn(
    Handle,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> HipError;
type FnEventRecord = unsafe extern "C" fn(Handle, Handle) -> HipError;
type FnStreamWaitEvent = unsafe extern "C" fn(Handle, Handle, u32) -> HipError;
type FnErrorString = unsafe extern "C" fn(HipError) -> *const c_char;
type FnCanAccessPeer = unsafe extern "C" fn(*mut i32, i32, i32) -> HipError;
type FnEnablePeer = unsafe extern "C" fn(i32, u32) -> HipError;

/// The bound entry points of `libamdhip64`.
pub(crate) struct Runtime {
    /// Keeps the library loaded (the function pointers point into it).
    _lib: libloading::Library,
    /// The library that was loaded.
    pub(crate) soname: String,
    init: FnInit,
    runtime_get_version: FnIntOut,
    get_device_count: FnIntOut,
    set_device: FnDevice,
    device_get: FnDeviceGet,
    device_get_name: FnDeviceName,
    device_total_mem: FnTotalMem,
    device_get_attribute: FnAttribute,
    get_device_properties_r0600: Option<FnProps>,
    get_device_properties: Option<FnProps>,
    stream_create_with_flags: FnCreateWithFlags,
    stream_destroy: FnHandle,
    stream_synchronize: FnHandle,
    malloc: FnMalloc,
    free: FnFree,
    memcpy_htod_async: FnCopyAsync,
    memcpy_dtoh_async: FnCopyAsync,
    memcpy_dtod_async: FnCopyAsync,
    memcpy_peer_async: FnPeerAsync,
    memset_d8_async: FnMemsetD8Async,
    module_load_data: FnModuleLoadData,
    module_unload: FnHandle,
    module_get_function: FnModuleGetFunction,
    module_launch_kernel: FnLaunch,
    event_create_with_flags: FnCreateWithFlags,
    event_record: FnEventRecord,
    event_destroy: FnHandle,
    stream_wait_event: FnStreamWaitEvent,
    get_error_string: FnErrorString,
    get_error_name: Option<FnErrorString>,
    device_can_access_peer: Option<FnCanAccessPeer>,
    device_enable_peer_access: Option<FnEnablePeer>,
    /// `hipInit(0)`'s outcome, once per process.
    initialised: OnceLock<std::result::Result<(), String>>,
    /// Peer access from the first GPU to the second: known to be enabled
    /// (`true`) or impossible (`false`).
    peers: Mutex<HashMap<(usize, usize), bool>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Runtime({})", self.soname)
    }
}

/// Library names tried in order: the sonames of ROCm 7, 6 and 5, the
/// development link, then the same in `$ROCM_PATH/lib` and `/opt/rocm/lib`
/// (ROCm's own prefix, not always on the loader's path).
pub(crate) fn candidates(stem: &str, versions: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = versions.iter().map(|v| format!("{stem}.so.{v}")).collect();
    names.push(format!("{stem}.so"));
    let mut dirs = Vec::new();
    if let Some(r) = std::env::var_os("ROCM_PATH") {
        dirs.push(std::path::PathBuf::from(r).join("lib"));
    }
    dirs.push(std::path::PathBuf::from("/opt/rocm/lib"));
    let mut all = names.clone();
    for d in dirs {
        all.extend(names.iter().map(|n| d.join(n).to_string_lossy().into_owned()));
    }
    all
}

/// Loads the first of `names` that loads; `Err` lists what was tried and
/// the last loader error.
pub(crate) fn load_first(names: &[String]) -> std::result::Result<(libloading::Library, String), String> {
    let mut last = String::new();
    for n in names {
        // SAFETY: loading a ROCm library runs its initialisers, which have
        // no preconditions on the caller.
        match unsafe { libloading::Library::new(n) } {
            Ok(lib) => return Ok((lib, n.clone())),
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!("none of {} could be loaded (last: {last})", names.join(", ")))
}

/// The symbol `name` of `lib` as the function pointer type `T`.
///
/// # Safety
/// `T` is the C declaration of `name` (an `unsafe extern "C" fn` type).
unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> std::result::Result<T, String> {
    // SAFETY: the caller's guarantee that `T` matches the symbol.
    unsafe { lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|e| format!("{name}: {e}"))
}

/// The HIP runtime, loaded once per process (not yet initialised: see
/// [`Runtime::init`]).
///
/// # Errors
/// [`Error::Hip`] saying the runtime is not installed (no `libamdhip64`
/// could be loaded) or lacks an entry point the backend needs.
pub(crate) fn runtime() -> Result<&'static Runtime> {
    static RT: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();
    RT.get_or_init(load).as_ref().map_err(|e| Error::Hip { detail: e.clone() })
}

fn load() -> std::result::Result<Runtime, String> {
    let (lib, soname) = load_first(&candidates("libamdhip64", &["7", "6", "5"]))
        .map_err(|e| format!("no HIP runtime: the ROCm library libamdhip64 is not installed ({e})"))?;
    let bad = |e: String| format!("{soname} lacks an entry point the HIP backend needs: {e}");
    // SAFETY: for every `sym` below, the type is the entry point's C
    // declaration in hip_runtime_api.h (ROCm 5.2 to 7), `hipDeviceptr_t`,
    // `hipStream_t`, `hipEvent_t`, `hipModule_t` and `hipFunction_t` being
    // pointers, `hipDevice_t` and the enums `int`.
    unsafe {
        Ok(Runtime {
            init: sym(&lib, "hipInit").map_err(bad)?,
            runtime_get_version: sym(&lib, "hipRuntimeGetVersion").map_err(bad)?,
            get_device_count: sym(&lib, "hipGetDeviceCount").map_err(bad)?,
            set_device: sym(&lib, "hipSetDevice").map_err(bad)?,
            device_get: sym(&lib, "hipDeviceGet").map_err(bad)?,
            device_get_name: sym(&lib, "hipDeviceGetName").map_err(bad)?,
            device_total_mem: sym(&lib, "hipDeviceTotalMem").map_err(bad)?,
            device_get_attribute: sym(&lib, "hipDeviceGetAttribute").map_err(bad)?,
            get_device_properties_r0600: sym(&lib, "hipGetDevicePropertiesR0600").ok(),
            get_device_properties: sym(&lib, "hipGetDeviceProperties").ok(),
            stream_create_with_flags: sym(&lib, "hipStreamCreateWithFlags").map_err(bad)?,
            stream_destroy: sym(&lib, "hipStreamDestroy").map_err(bad)?,
            stream_synchronize: sym(&lib, "hipStreamSynchronize").map_err(bad)?,
            malloc: sym(&lib, "hipMalloc").map_err(bad)?,
            free: sym(&lib, "hipFree").map_err(bad)?,
            memcpy_htod_async: sym(&lib, "hipMemcpyHtoDAsync").map_err(bad)?,
            memcpy_dtoh_async: sym(&lib, "hipMemcpyDtoHAsync").map_err(bad)?,
            memcpy_dtod_async: sym(&lib, "hipMemcpyDtoDAsync").map_err(bad)?,
            memcpy_peer_async: sym(&lib, "hipMemcpyPeerAsync").map_err(bad)?,
            memset_d8_async: sym(&lib, "hipMemsetD8Async").map_err(bad)?,
            module_load_data: sym(&lib, "hipModuleLoadData").map_err(bad)?,
            module_unload: sym(&lib, "hipModuleUnload").map_err(bad)?,
            module_get_function: sym(&lib, "hipModuleGetFunction").map_err(bad)?,
            module_launch_kernel: sym(&lib, "hipModuleLaunchKernel").map_err(bad)?,
            event_create_with_flags: sym(&lib, "hipEventCreateWithFlags").map_err(bad)?,
            event_record: sym(&lib, "hipEventRecord").map_err(bad)?,
            event_destroy: sym(&lib, "hipEventDestroy").map_err(bad)?,
            stream_wait_event: sym(&lib, "hipStreamWaitEvent").map_err(bad)?,
            get_error_string: sym(&lib, "hipGetErrorString").map_err(bad)?,
            get_error_name: sym(&lib, "hipGetErrorName").ok(),
            device_can_access_peer: sym(&lib, "hipDeviceCanAccessPeer").ok(),
            device_enable_peer_access: sym(&lib, "hipDeviceEnablePeerAccess").ok(),
            soname,
            _lib: lib,
            initialised: OnceLock::new(),
            peers: Mutex::new(HashMap::new()),
        })
    }
}

/// `GPU <ordinal>`, as every message names a device.
pub(crate) fn gpu(ordinal: usize) -> String {
    format!("GPU {ordinal}")
}

/// An ordinal as HIP's `int` device id.
fn dev(ordinal: usize) -> Result<i32> {
    i32::try_from(ordinal).map_err(|_| Error::Hip { detail: format!("GPU {ordinal}: ordinal out of range") })
}

fn c_text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the runtime returns NUL-terminated static strings.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

impl Runtime {
    /// The runtime's name and description of `rc` ("hipErrorOutOfMemory",
    /// or "hipErrorX: text" where the runtime has a text).
    pub(crate) fn error_text(&self, rc: HipError) -> String {
        // SAFETY: both functions accept any value and return static strings.
        let text = c_text(unsafe { (self.get_error_string)(rc) });
        // SAFETY: as above.
        let name = self.get_error_name.and_then(|f| c_text(unsafe { f(rc) }));
        match (name, text) {
            (Some(n), Some(t)) if n != t => format!("{n}: {t}"),
            (Some(n), _) => n,
            (None, Some(t)) => t,
            (None, None) => format!("hipError_t {rc}"),
        }
    }

    /// `Ok` for `hipSuccess`, else [`Error::Hip`]: `who` (the device),
    /// the call, and the runtime's error.
    pub(crate) fn check(&self, rc: HipError, who: &str, call: &str) -> Result<()> {
        if rc == SUCCESS {
            Ok(())
        } else {
            Err(self.error(rc, who, call))
        }
    }

    /// The [`Error::Hip`] of a failed call: `who`, the call, the runtime's error.
    pub(crate) fn error(&self, rc: HipError, who: &str, call: &str) -> Error {
        Error::Hip { detail: format!("{who}: {call} failed: {} ({rc})", self.error_text(rc)) }
    }

    /// `hipInit(0)`, once per process.
    ///
    /// # Errors
    /// [`Error::Hip`] saying there is no usable AMD GPU (the runtime found
    /// no device or no kernel driver) with the runtime's error.
    pub(crate) fn init(&self) -> Result<()> {
        self.initialised
            .get_or_init(|| {
                // SAFETY: hipInit takes flags (0 is the only defined value).
                let rc = unsafe { (self.init)(0) };
                if rc == SUCCESS {
                    return Ok(());
                }
                let why = match rc {
                    ERROR_NO_DEVICE | ERROR_INVALID_DEVICE => {
                        "no usable AMD GPU: the HIP runtime found no device (is /dev/kfd present and may this \
                         user open it?)"
                    }
                    ERROR_INSUFFICIENT_DRIVER => "no usable AMD GPU: the amdgpu kernel driver is missing or too old",
                    _ => "no usable AMD GPU: the HIP runtime failed to initialise",
                };
                Err(format!("{why}; hipInit(0) with {} failed: {} ({rc})", self.soname, self.error_text(rc)))
            })
            .clone()
            .map_err(|detail| Error::Hip { detail })
    }

    /// The runtime's version (`HIP_VERSION`: major·10⁷ + minor·10⁵ + patch).
    pub(crate) fn version(&self) -> Option<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        (unsafe { (self.runtime_get_version)(&mut v) } == SUCCESS).then_some(v)
    }

    /// Number of devices (after [`Runtime::init`]).
    pub(crate) fn device_count(&self) -> Result<usize> {
        self.init()?;
        let mut n = 0;
        // SAFETY: writes one int.
        let rc = unsafe { (self.get_device_count)(&mut n) };
        if rc == ERROR_NO_DEVICE {
            return Err(Error::Hip {
                detail: format!("no usable AMD GPU: hipGetDeviceCount failed: {} ({rc})", self.error_text(rc)),
            });
        }
        self.check(rc, "HIP runtime", "hipGetDeviceCount")?;
        Ok(n.max(0) as usize)
    }

    /// Makes GPU `ordinal` current on the calling thread.
    pub(crate) fn set_device(&self, ordinal: usize) -> Result<()> {
        // SAFETY: takes a device id; a bad one is an error return.
        let rc = unsafe { (self.set_device)(dev(ordinal)?) };
        self.check(rc, &gpu(ordinal), "hipSetDevice")
    }

    /// The device handle of GPU `ordinal` (`hipDevice_t`).
    fn device(&self, ordinal: usize) -> Result<i32> {
        let mut d = 0;
        // SAFETY: writes one int.
        let rc = unsafe { (self.device_get)(&mut d, dev(ordinal)?) };
        self.check(rc, &gpu(ordinal), "hipDeviceGet")?;
        Ok(d)
    }

    /// The device's marketing name ("AMD Instinct MI210").
    pub(crate) fn device_name(&self, ordinal: usize) -> Result<String> {
        let d = self.device(ordinal)?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: writes at most `len` bytes, NUL-terminated, into `buf`.
        let rc = unsafe { (self.device_get_name)(buf.as_mut_ptr(), buf.len() as i32 - 1, d) };
        self.check(rc, &gpu(ordinal), "hipDeviceGetName")?;
        Ok(c_text(buf.as_ptr()).unwrap_or_default())
    }

    /// The device's memory, bytes.
    pub(crate) fn total_mem(&self, ordinal: usize) -> Result<usize> {
        let d = self.device(ordinal)?;
        let mut n = 0usize;
        // SAFETY: writes one size_t.
        let rc = unsafe { (self.device_total_mem)(&mut n, d) };
        self.check(rc, &gpu(ordinal), "hipDeviceTotalMem")?;
        Ok(n)
    }

    /// Attribute `a` (an [`attr`] value) of GPU `ordinal`; `what` names it in errors.
    pub(crate) fn attribute(&self, ordinal: usize, a: i32, what: &str) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int; an unknown attribute is an error return.
        let rc = unsafe { (self.device_get_attribute)(&mut v, a, dev(ordinal)?) };
        self.check(rc, &gpu(ordinal), &format!("hipDeviceGetAttribute({what})"))?;
        Ok(v)
    }

    /// The device's `gcnArchName` ("gfx90a:sramecc+:xnack-") and the
    /// `warpSize` of the same properties struct.
    ///
    /// The name is only in `hipDeviceProp_t` (no attribute returns a
    /// string), whose layout changed in ROCm 6.0. Robust across 5.x, 6.x
    /// and 7.x: a runtime that exports `hipGetDevicePropertiesR0600` (6.0
    /// and later; 7.x keeps that name and layout) fills the R0600 layout
    /// through it — its versioned name fixes the layout, whereas the
    /// unversioned `hipGetDeviceProperties` that 6.x still exports fills
    /// the old one (a C caller's `hipGetDeviceProperties` is a macro for
    /// the R0600 name, so looking up the plain name by `dlsym` on 6.x gets
    /// the legacy layout). Without it (5.x), `hipGetDeviceProperties` fills
    /// the 5.x layout. The struct is written into a 4 KiB zeroed buffer,
    /// larger than either layout, and the result is checked twice: the
    /// name must read `gfx<hex digits>` and the `warpSize` read at its
    /// offset in the same layout must equal the warp-size attribute, so a
    /// layout this code does not know is an error, never a wrong
    /// architecture.
    pub(crate) fn arch_name(&self, ordinal: usize) -> Result<(String, i32)> {
        let who = gpu(ordinal);
        let (call, f, arch_at, warp_at) = match (self.get_device_properties_r0600, self.get_device_properties) {
            (Some(f), _) => ("hipGetDevicePropertiesR0600", f, R0600_ARCH, R0600_WARP),
            (None, Some(f)) => ("hipGetDeviceProperties", f, R0000_ARCH, R0000_WARP),
            (None, None) => {
                return Err(Error::Hip {
                    detail: format!("{who}: {} has no hipGetDeviceProperties(R0600)", self.soname),
                })
            }
        };
        // u64 words: the struct's 8-byte alignment.
        let mut buf = vec![0u64; PROPS_BUFFER / 8];
        // SAFETY: the runtime writes one properties struct (at most 1472
        // bytes in every known layout) into the 4096-byte buffer.
        let rc = unsafe { f(buf.as_mut_ptr() as *mut c_void, dev(ordinal)?) };
        self.check(rc, &who, call)?;
        let bytes: &[u8] = bytemuck::cast_slice(&buf);
        let field = bytes.get(arch_at..arch_at + 256).unwrap_or_default();
        let name = field.split(|&b| b == 0).next().unwrap_or_default();
        let name = String::from_utf8_lossy(name).into_owned();
        let warp = bytes.get(warp_at..warp_at + 4).map_or(0, |w| i32::from_le_bytes([w[0], w[1], w[2], w[3]]));
        let version = self.version().map_or("unknown".into(), |v| v.to_string());
        let layout = |why: String| Error::Hip {
            detail: format!(
                "{who}: {call} ({}, HIP version {version}): {why}; this hipDeviceProp_t layout is not one \
                 this backend knows",
                self.soname
            ),
        };
        if super::base_arch(&name).is_none() {
            return Err(layout(format!("gcnArchName reads {name:?}, not gfx<id>")));
        }
        let attr_warp = self.attribute(ordinal, attr::WARP_SIZE, "warp size")?;
        if warp != attr_warp {
            return Err(layout(format!("warpSize reads {warp}, the warp-size attribute says {attr_warp}")));
        }
        Ok((name, warp))
    }

    /// Whether GPU `ordinal` can read GPU `peer`'s memory directly; if so,
    /// enables it (once per pair and process; "already enabled" is success).
    pub(crate) fn enable_peer(&self, ordinal: usize, peer: usize) -> Result<bool> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&known) = peers.get(&(ordinal, peer)) {
            return Ok(known);
        }
        let (Some(can), Some(enable)) = (self.device_can_access_peer, self.device_enable_peer_access) else {
            peers.insert((ordinal, peer), false);
            return Ok(false);
        };
        let mut ok = 0;
        // SAFETY: writes one int; device ids are checked by the runtime.
        let rc = unsafe { can(&mut ok, dev(ordinal)?, dev(peer)?) };
        self.check(rc, &gpu(ordinal), &format!("hipDeviceCanAccessPeer(GPU {peer})"))?;
        if ok == 0 {
            peers.insert((ordinal, peer), false);
            return Ok(false);
        }
        self.set_device(ordinal)?;
        // SAFETY: enables access from the current device (`ordinal`) to `peer`.
        let rc = unsafe { enable(dev(peer)?, 0) };
        if rc != ERROR_PEER_ACCESS_ALREADY_ENABLED {
            self.check(rc, &gpu(ordinal), &format!("hipDeviceEnablePeerAccess(GPU {peer})"))?;
        }
        peers.insert((ordinal, peer), true);
        Ok(true)
    }

    /// `hipMalloc` on the current device: the address, or the raw error
    /// (the caller tells out-of-memory from other failures).
    pub(crate) fn malloc(&self, bytes: usize) -> std::result::Result<DevPtr, HipError> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        let rc = unsafe { (self.malloc)(&mut p, bytes) };
        if rc == SUCCESS {
            Ok(p as DevPtr)
        } else {
            Err(rc)
        }
    }

    /// `hipFree`.
    ///
    /// # Safety
    /// `p` came from [`Runtime::malloc`] and is not used afterwards (HIP's
    /// free waits for the device's queued work first).
    pub(crate) unsafe fn free(&self, p: DevPtr) -> HipError {
        // SAFETY: the caller's guarantee.
        unsafe { (self.free)(p as *mut c_void) }
    }

    /// Queues a host-to-device copy on `stream`.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` is device memory of the stream's device;
    /// `src` stays alive until the stream has been synchronised.
    pub(crate) unsafe fn htod_async(&self, dst: DevPtr, src: &[u8], stream: &Stream) -> HipError {
        // SAFETY: the caller's guarantee.
        unsafe { (self.memcpy_htod_async)(dst as *mut c_void, src.as_ptr() as *const c_void, src.len(), stream.h) }
    }

    /// Queues a device-to-host copy on `stream`.
    ///
    /// # Safety
    /// `[src, src + dst.len())` is device memory; `dst` is not otherwise
    /// accessed until the stream has been synchronised.
    pub(crate) unsafe fn dtoh_async(&self, dst: &mut [u8], src: DevPtr, stream: &Stream) -> HipError {
        // SAFETY: the caller's guarantee.
        unsafe { (self.memcpy_dtoh_async)(dst.as_mut_ptr() as *mut c_void, src as *const c_void, dst.len(), stream.h) }
    }

    /// Queues a device-to-device copy within one GPU on `stream`.
    ///
    /// # Safety
    /// Both ranges of `n` bytes are device memory of the stream's GPU.
    pub(crate) unsafe fn dtod_async(&self, dst: DevPtr, src: DevPtr, n: usize, stream: &Stream) -> HipError {
        // SAFETY: the caller's guarantee.
        unsafe { (self.memcpy_dtod_async)(dst as *mut c_void, src as *const c_void, n, stream.h) }
    }

    /// Queues a copy from GPU `src_dev` to GPU `dst_dev` on `stream`.
    ///
    /// # Safety
    /// `[dst, dst + n)` is memory of `dst_dev`, `[src, src + n)` of `src_dev`.
    pub(crate) unsafe fn peer_async(
        &self,
        dst: DevPtr,
        dst_dev: usize,
        src: DevPtr,
        src_dev: usize,
        n: usize,
        stream: &Stream,
    ) -> Result<HipError> {
        let (d, s) = (dev(dst_dev)?, dev(src_dev)?);
        // SAFETY: the caller's guarantee.
        Ok(unsafe { (self.memcpy_peer_async)(dst as *mut c_void, d, src as *const c_void, s, n, stream.h) })
    }

    /// Queues setting `n` bytes to `value` on `stream`.
    ///
    /// # Safety
    /// `[dst, dst + n)` is device memory of the stream's GPU.
    pub(crate) unsafe fn memset_async(&self, dst: DevPtr, value: u8, n: usize, stream: &Stream) -> HipError {
        // SAFETY: the caller's guarantee.
        unsafe { (self.memset_d8_async)(dst as *mut c_void, value, n, stream.h) }
    }

    /// Queues `f` on `stream` with `grid` blocks of `block` threads and the
    /// kernel parameters `params` (one pointer per parameter, to its value).
    ///
    /// # Safety
    /// `f` is a function of a module loaded on the stream's GPU, `params`
    /// holds one valid pointer per kernel parameter (the runtime copies the
    /// values before returning), and the memory the kernel touches is live.
    pub(crate) unsafe fn launch(
        &self,
        f: Handle,
        grid: [u32; 3],
        block: [u32; 3],
        stream: &Stream,
        params: &mut [*mut c_void],
    ) -> HipError {
        // SAFETY: the caller's guarantee; no dynamic shared memory, no `extra`.
        unsafe {
            (self.module_launch_kernel)(
                f,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                0,
                stream.h,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
    }
}

/// A non-blocking stream of one GPU, destroyed on drop.
#[derive(Debug)]
pub(crate) struct Stream {
    rt: &'static Runtime,
    ordinal: usize,
    h: Handle,
}

impl Stream {
    /// A new stream on GPU `ordinal` that does not synchronise with the
    /// legacy default stream (`hipStreamNonBlocking`).
    pub(crate) fn new(rt: &'static Runtime, ordinal: usize) -> Result<Stream> {
        rt.set_device(ordinal)?;
        let mut h = Handle(std::ptr::null_mut());
        // SAFETY: writes one handle.
        let rc = unsafe { (rt.stream_create_with_flags)(&mut h, STREAM_NON_BLOCKING) };
        rt.check(rc, &gpu(ordinal), "hipStreamCreateWithFlags(hipStreamNonBlocking)")?;
        Ok(Stream { rt, ordinal, h })
    }

    /// The raw `hipStream_t`.
    pub(crate) fn raw(&self) -> Handle {
        self.h
    }

    /// Waits for everything queued on the stream; `what` says what failed.
    pub(crate) fn synchronize(&self, what: &str) -> Result<()> {
        self.rt.set_device(self.ordinal)?;
        // SAFETY: a live stream of this runtime.
        let rc = unsafe { (self.rt.stream_synchronize)(self.h) };
        self.rt.check(rc, &gpu(self.ordinal), &format!("hipStreamSynchronize ({what})"))
    }

    /// Makes the stream's later work wait for `event`.
    pub(crate) fn wait(&self, event: &Event) -> Result<()> {
        // SAFETY: a live stream and a live event.
        let rc = unsafe { (self.rt.stream_wait_event)(self.h, event.h, 0) };
        self.rt.check(rc, &gpu(self.ordinal), "hipStreamWaitEvent")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.rt.set_device(self.ordinal).is_ok() {
            // SAFETY: the stream is live and not used after this.
            let _ = unsafe { (self.rt.stream_destroy)(self.h) };
        }
    }
}

/// A timing-free event of one GPU, destroyed on drop (HIP releases a
/// recorded event once it completes).
#[derive(Debug)]
pub(crate) struct Event {
    rt: &'static Runtime,
    ordinal: usize,
    h: Handle,
}

impl Event {
    /// A new event of GPU `ordinal` (made current).
    pub(crate) fn new(rt: &'static Runtime, ordinal: usize) -> Result<Event> {
        rt.set_device(ordinal)?;
        let mut h = Handle(std::ptr::null_mut());
        // SAFETY: writes one handle.
        let rc = unsafe { (rt.event_create_with_flags)(&mut h, EVENT_DISABLE_TIMING) };
        rt.check(rc, &gpu(ordinal), "hipEventCreateWithFlags(hipEventDisableTiming)")?;
        Ok(Event { rt, ordinal, h })
    }

    /// Records the event on `stream` (a stream of the event's GPU).
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: a live event and a live stream.
        let rc = unsafe { (self.rt.event_record)(self.h, stream.h) };
        self.rt.check(rc, &gpu(self.ordinal), "hipEventRecord")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is live and not used after this.
        let _ = unsafe { (self.rt.event_destroy)(self.h) };
    }
}

/// A loaded code object on one GPU (with the bytes it was loaded from),
/// unloaded on drop.
#[derive(Debug)]
pub(crate) struct Module {
    rt: &'static Runtime,
    ordinal: usize,
    h: Handle,
    /// The image, kept alive as long as the module.
    _image: std::sync::Arc<Vec<u8>>,
}

impl Module {
    /// Loads `image` (an AMDGPU ELF or offload bundle) on GPU `ordinal`
    /// (made current); `what` names it in errors.
    pub(crate) fn load(
        rt: &'static Runtime,
        ordinal: usize,
        image: std::sync::Arc<Vec<u8>>,
        what: &str,
    ) -> Result<Module> {
        rt.set_device(ordinal)?;
        let mut h = Handle(std::ptr::null_mut());
        // SAFETY: `image` is a whole code object (the runtime parses it and
        // checks it fits the device) and outlives the module.
        let rc = unsafe { (rt.module_load_data)(&mut h, image.as_ptr() as *const c_void) };
        rt.check(rc, &gpu(ordinal), &format!("hipModuleLoadData({what})"))?;
        Ok(Module { rt, ordinal, h, _image: image })
    }

    /// The function `name` of this module.
    pub(crate) fn function(&self, name: &str) -> Result<Handle> {
        let c = std::ffi::CString::new(name)
            .map_err(|_| Error::Hip { detail: format!("kernel name {name:?} contains NUL") })?;
        let mut f = Handle(std::ptr::null_mut());
        // SAFETY: a live module and a NUL-terminated name; writes one handle.
        let rc = unsafe { (self.rt.module_get_function)(&mut f, self.h, c.as_ptr()) };
        self.rt.check(rc, &gpu(self.ordinal), &format!("hipModuleGetFunction({name})"))?;
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.rt.set_device(self.ordinal).is_ok() {
            // SAFETY: the module is live; its functions are not used after
            // this (they are owned with it).
            let _ = unsafe { (self.rt.module_unload)(self.h) };
        }
    }
}
