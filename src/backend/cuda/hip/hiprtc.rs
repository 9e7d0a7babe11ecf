//! hipRTC: compiles the kernel files for an AMD GPU at run time, to a code
//! object (an AMDGPU ELF) for one `gfx` architecture, with a process-wide
//! cache keyed by architecture and source hash (as `nvrtc.rs` for CUDA).
//!
//! hipRTC is its own library from ROCm 5.3 on (`libhiprtc.so.7`, `.6`,
//! `.5`); in ROCm 5.2 its entry points are in `libamdhip64.so.5`, tried
//! last. Options: `--offload-arch=<gfx>` (hipRTC also accepts
//! `--gpu-architecture=`; both were checked with ROCm 5.2, which rejects
//! `-arch=` and, without an architecture, asks the GPU for one),
//! `-std=c++17` and `-O3`. The architecture is always given, so compiling
//! needs no GPU: ROCm 5.2's hipRTC compiles on a machine without one
//! (through `libamd_comgr`), which the tests use.
//!
//! Compiles run one at a time (a process-wide lock): hipRTC serialises
//! them internally anyway (ROCm/hip#3826), and comgr's thread safety has
//! had bugs (ROCm/ROCm-CompilerSupport#27), so threads would only add risk.
//! Compiling all the kernel files takes about a minute on first use.
//!
//! An architecture must be one this ROCm's compiler knows: ROCm 5.2's
//! hipRTC aborts the process (a heap error inside comgr) for an unknown
//! one such as gfx942 or gfx1100, or for a target feature the processor
//! lacks (`gfx1030:xnack+`). So [`compile`] takes a bare processor name
//! (no target features: code for the default setting runs in either
//! mode) and, when comgr (`libamd_comgr`, which hipRTC itself uses) can
//! be loaded, only one in its list of ISAs ([`known_processors`]);
//! anything else is an `Err` before hipRTC sees it. A device's own name
//! is one its ROCm supports.

use super::runtime::{candidates, load_first};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// A `hiprtcResult` (a C enum).
type RtcResult = i32;
/// A `hiprtcProgram` (an opaque pointer).
type Program = *mut c_void;

type FnCreate = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    i32,
    *const *const c_char,
    *const *const c_char,
) -> RtcResult;
type FnCompile = unsafe extern "C" fn(Program, i32, *const *const c_char) -> RtcResult;
type FnSize = unsafe extern "C" fn(Program, *mut usize) -> RtcResult;
type FnBytes = unsafe extern "C" fn(Program, *mut c_char) -> RtcResult;
type FnDestroy = unsafe extern "C" fn(*mut Program) -> RtcResult;
type FnErrorString = unsafe extern "C" fn(RtcResult) -> *const c_char;
type FnVersion = unsafe extern "C" fn(*mut i32, *mut i32) -> RtcResult;

/// The bound hipRTC entry points.
struct Rtc {
    _lib: libloading::Library,
    soname: String,
    create: FnCreate,
    compile: FnCompile,
    log_size: FnSize,
    log: FnBytes,
    code_size: FnSize,
    code: FnBytes,
    destroy: FnDestroy,
    error_string: FnErrorString,
    version: FnVersion,
}

fn bind(lib: libloading::Library, soname: String) -> std::result::Result<Rtc, String> {
    fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> std::result::Result<T, String> {
        // SAFETY: every `T` requested below is the C declaration of `name`
        // in hiprtc.h (ROCm 5.2 to 7): results are `int` enums, programs
        // opaque pointers.
        unsafe { lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|e| format!("{name}: {e}"))
    }
    Ok(Rtc {
        create: sym(&lib, "hiprtcCreateProgram")?,
        compile: sym(&lib, "hiprtcCompileProgram")?,
        log_size: sym(&lib, "hiprtcGetProgramLogSize")?,
        log: sym(&lib, "hiprtcGetProgramLog")?,
        code_size: sym(&lib, "hiprtcGetCodeSize")?,
        code: sym(&lib, "hiprtcGetCode")?,
        destroy: sym(&lib, "hiprtcDestroyProgram")?,
        error_string: sym(&lib, "hiprtcGetErrorString")?,
        version: sym(&lib, "hiprtcVersion")?,
        soname,
        _lib: lib,
    })
}

fn rtc() -> Result<&'static Rtc> {
    static RTC: OnceLock<std::result::Result<Rtc, String>> = OnceLock::new();
    RTC.get_or_init(|| {
        let own = load_first(&candidates("libhiprtc", &["7", "6", "5"]));
        let (lib, soname) = match own {
            Ok(x) => x,
            // ROCm 5.2: hipRTC inside the runtime library.
            Err(e1) => load_first(&candidates("libamdhip64", &["5"]))
                .map_err(|e2| format!("hipRTC is not installed: {e1}; and no ROCm 5.2 runtime holding it: {e2}"))?,
        };
        bind(lib, soname.clone()).map_err(|e| format!("{soname} lacks a hipRTC entry point: {e}"))
    })
    .as_ref()
    .map_err(|e| Error::Hip { detail: e.clone() })
}

/// Loads hipRTC once per process.
///
/// # Errors
/// [`Error::Hip`] when no hipRTC library can be loaded (naming what was
/// tried) or one lacks an entry point.
pub fn load() -> Result<()> {
    rtc().map(|_| ())
}

/// The loaded hipRTC: its library and `hiprtcVersion` ("libhiprtc.so.6,
/// hipRTC 6.2").
///
/// # Errors
/// As [`load`].
pub fn describe() -> Result<String> {
    let r = rtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    let rc = unsafe { (r.version)(&mut major, &mut minor) };
    Ok(if rc == 0 { format!("{}, hipRTC {major}.{minor}", r.soname) } else { r.soname.clone() })
}

/// The processors (`gfx90a`, `gfx1030`, …) the installed compiler
/// targets, from comgr's ISA list (`amd_comgr_get_isa_count` /
/// `amd_comgr_get_isa_name`, names `amdgcn-amd-amdhsa--<processor>`);
/// `None` when comgr cannot be loaded or answer (then [`compile`] checks
/// only the name's form).
pub fn known_processors() -> Option<&'static [String]> {
    type FnCount = unsafe extern "C" fn(*mut usize) -> i32;
    type FnName = unsafe extern "C" fn(usize, *mut *const c_char) -> i32;
    static LIST: OnceLock<Option<Vec<String>>> = OnceLock::new();
    LIST.get_or_init(|| {
        let (lib, _) = load_first(&candidates("libamd_comgr", &["3", "2"])).ok()?;
        // SAFETY: the two entry points with comgr's C signatures
        // (amd_comgr.h, comgr 2.x and 3.x); `lib` outlives their use here.
        let (count, name) = unsafe {
            let count: libloading::Symbol<FnCount> = lib.get(b"amd_comgr_get_isa_count\0").ok()?;
            let name: libloading::Symbol<FnName> = lib.get(b"amd_comgr_get_isa_name\0").ok()?;
            (*count, *name)
        };
        let mut n = 0usize;
        // SAFETY: writes one size_t.
        if unsafe { count(&mut n) } != 0 || n > 4096 {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut p: *const c_char = std::ptr::null();
            // SAFETY: `i` < the count just read; comgr stores a pointer to a
            // static NUL-terminated string.
            if unsafe { name(i, &mut p) } != 0 || p.is_null() {
                return None;
            }
            // SAFETY: as above.
            let isa = unsafe { CStr::from_ptr(p) }.to_string_lossy();
            if let Some(proc) = isa.rsplit("--").next().and_then(|t| t.split(':').next()) {
                out.push(proc.to_string());
            }
        }
        // comgr stays loaded (hipRTC holds it too); its strings are static.
        std::mem::forget(lib);
        Some(out)
    })
    .as_deref()
}

/// The options every kernel file is compiled with for `arch`.
pub fn options(arch: &str) -> Vec<String> {
    vec![format!("--offload-arch={arch}"), "-std=c++17".into(), "-O3".into()]
}

/// FNV-1a of a source, the cache key with the architecture.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

type Cache = Mutex<HashMap<(String, u64), Arc<Vec<u8>>>>;

/// The code objects compiled so far, by architecture and source hash.
fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether [`compile`] holds the code object of HIP source `source` for
/// `arch` (a later compile of it is a lookup, not a hipRTC run).
pub fn is_cached(source: &str, arch: &str) -> bool {
    cache().lock().is_ok_and(|c| c.contains_key(&(arch.to_string(), hash(source))))
}

/// Compiles kernel file `name` of [`crate::backend::cuda::sources::KERNEL_SOURCES`]
/// (its CUDA text `cuda_source`) for `arch`: the file behind the HIP
/// portability header ([`crate::backend::cuda::sources::hip_source`]).
///
/// # Errors
/// As [`compile`].
pub fn compile_kernel_file(name: &str, cuda_source: &str, arch: &str) -> Result<Arc<Vec<u8>>> {
    compile(name, &crate::backend::cuda::sources::hip_source(name, cuda_source), arch)
}

/// Compiles HIP source `source` (named `<name>.cu` in messages) for `arch`
/// (a processor name without target features: `"gfx90a"`, `"gfx1030"`),
/// from the cache when the same source was compiled for the same
/// architecture before. Returns the code object (an AMDGPU ELF).
///
/// # Errors
/// [`Error::Hip`] naming the file and architecture with hipRTC's error
/// and log; an architecture that is not a bare `gfx` processor name, or
/// that the installed compiler does not list ([`known_processors`]: ROCm
/// 5.2's hipRTC would abort the process); hipRTC missing ([`load`]).
pub fn compile(name: &str, source: &str, arch: &str) -> Result<Arc<Vec<u8>>> {
    let what = format!("kernels-cuda/{name}.cu for {arch}");
    let fail = |why: String| Error::Hip { detail: format!("{what}: {why}") };
    if super::base_arch(arch) != Some(arch) || super::wave_size(arch).is_none() {
        return Err(fail(format!("{arch:?} is not a gfx processor name (without target features)")));
    }
    if let Some(known) = known_processors() {
        if !known.iter().any(|k| k == arch) {
            return Err(fail(format!(
                "this ROCm's compiler does not target {arch} (it knows {}); a newer ROCm is needed",
                known.join(", ")
            )));
        }
    }
    let key = (arch.to_string(), hash(source));
    if let Some(code) = cache().lock().map_err(|_| fail("hipRTC cache poisoned".into()))?.get(&key) {
        return Ok(code.clone());
    }
    let r = rtc()?;
    // One compile at a time; a thread that waited here may find its code
    // compiled by the one before.
    static COMPILING: Mutex<()> = Mutex::new(());
    let _one = COMPILING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(code) = cache().lock().map_err(|_| fail("hipRTC cache poisoned".into()))?.get(&key) {
        return Ok(code.clone());
    }
    let src = CString::new(source).map_err(|_| fail("source contains NUL".into()))?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| fail("name contains NUL".into()))?;
    let opts: Vec<CString> = options(arch).into_iter().filter_map(|o| CString::new(o).ok()).collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let err = |rc: RtcResult| {
        // SAFETY: accepts any value, returns a static string (or null).
        let p = unsafe { (r.error_string)(rc) };
        if p.is_null() {
            format!("hiprtcResult {rc}")
        } else {
            // SAFETY: a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: NUL-terminated source and name that outlive the call; no headers.
    let rc = unsafe { (r.create)(&mut prog, src.as_ptr(), file.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
    if rc != 0 {
        return Err(fail(format!("hiprtcCreateProgram ({}): {}", r.soname, err(rc))));
    }
    let result = (|| {
        // SAFETY: a live program; `opt_ptrs` holds `len` NUL-terminated options.
        let rc = unsafe { (r.compile)(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
        if rc != 0 {
            // SAFETY: a live program (its log exists after a compile).
            let log = unsafe { program_text(prog, r.log_size, r.log) }.unwrap_or_default();
            return Err(fail(format!("hipRTC ({}): {}; log:\n{}", r.soname, err(rc), log.trim_end())));
        }
        // SAFETY: a live, compiled program.
        let code = unsafe { program_bytes(prog, r.code_size, r.code) }
            .map_err(|rc| fail(format!("hiprtcGetCode: {}", err(rc))))?;
        if code.is_empty() {
            return Err(fail("hipRTC returned an empty code object".into()));
        }
        Ok(Arc::new(code))
    })();
    // SAFETY: the program is live and not used after this.
    let _ = unsafe { (r.destroy)(&mut prog) };
    let code = result?;
    cache().lock().map_err(|_| fail("hipRTC cache poisoned".into()))?.insert(key, code.clone());
    Ok(code)
}

/// The bytes a program reports through a size and a copy function.
///
/// # Safety
/// `prog` is a live program; `size`/`copy` are a matching hipRTC pair.
unsafe fn program_bytes(prog: Program, size: FnSize, copy: FnBytes) -> std::result::Result<Vec<u8>, RtcResult> {
    let mut n = 0usize;
    // SAFETY: the caller's guarantee; writes one size_t.
    let rc = unsafe { size(prog, &mut n) };
    if rc != 0 {
        return Err(rc);
    }
    // One spare byte: some versions count the log's NUL, some do not.
    let mut buf = vec![0u8; n + 1];
    if n > 0 {
        // SAFETY: `buf` holds the `n` bytes the program reported (plus one).
        let rc = unsafe { copy(prog, buf.as_mut_ptr() as *mut c_char) };
        if rc != 0 {
            return Err(rc);
        }
    }
    buf.truncate(n);
    Ok(buf)
}

/// A program's log as text.
///
/// # Safety
/// As [`program_bytes`].
unsafe fn program_text(prog: Program, size: FnSize, copy: FnBytes) -> Option<String> {
    // SAFETY: the caller's guarantee.
    let b = unsafe { program_bytes(prog, size, copy) }.ok()?;
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    Some(String::from_utf8_lossy(&b[..end]).into_owned())
}
