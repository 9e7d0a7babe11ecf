//! NVRTC: finds `libnvrtc.so.13` (a CUDA toolkit, or the `nvidia-cuda-nvrtc`
//! wheel that `scripts/setup.sh` installs into `./.venv`), loads that file
//! by its path and binds the entry points used here itself (cudarc's NVRTC
//! binding is not used: it tries the unversioned `libnvrtc.so` first, so
//! the library it loads need not be the one found), checks its version,
//! and compiles the embedded kernel sources for an `sm_XY` architecture:
//! one NVRTC run gives both the PTX and the CUBIN (NVRTC runs ptxas for a
//! real architecture).
//!
//! A device loads the CUBIN of its own architecture; the PTX is loaded
//! only on a GPU newer than this NVRTC knows (the driver's forward JIT),
//! see [`target_for`]. Compiles are kept:
//! - in the process: once per (architecture, source hash, NVRTC version);
//!   concurrent requests for one key wait for one compile;
//! - on disk: `$SHARDGRAPH_KERNEL_CACHE`, else `$XDG_CACHE_HOME/shardgraph/kernels`,
//!   else `~/.cache/shardgraph/kernels` (`SHARDGRAPH_KERNEL_CACHE=off`
//!   turns it off). An entry is checked (format, key, lengths, checksum)
//!   before use; a damaged one is compiled again and rewritten.
//!
//! [`stats`] counts NVRTC runs, disk hits and in-process hits;
//! `SHARDGRAPH_NVRTC_STATS=1` prints them to stderr when the process exits.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Every `kernels-cuda/*.cu` file: `(file stem, CUDA C source)`, in file-name order.
pub use super::sources::KERNEL_SOURCES;

/// The NVRTC major version this build loads (CUDA 13: `libnvrtc.so.13`).
pub const NVRTC_MAJOR: i32 = 13;

/// The options every kernel file is compiled with, besides the architecture.
const OPTIONS: &[&str] = &["--std=c++17"];

/// Folders searched for `libnvrtc.so.13` before the system's: the
/// `SHARDGRAPH_NVRTC_DIR` environment variable, then the pip wheel's folder
/// in `./.venv` (`nvidia/cu13/lib`), then the CUDA toolkit's.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("SHARDGRAPH_NVRTC_DIR") {
        dirs.push(PathBuf::from(d));
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv").join("lib");
    if let Ok(rd) = std::fs::read_dir(&venv) {
        for e in rd.flatten() {
            dirs.push(e.path().join("site-packages").join("nvidia").join("cu13").join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

/// An `nvrtcResult` (a C enum).
type RtcResult = c_int;
/// An `nvrtcProgram` (an opaque pointer).
type Program = *mut c_void;
type FnCreate = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> RtcResult;
type FnCompile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> RtcResult;
type FnSize = unsafe extern "C" fn(Program, *mut usize) -> RtcResult;
type FnBytes = unsafe extern "C" fn(Program, *mut c_char) -> RtcResult;
type FnDestroy = unsafe extern "C" fn(*mut Program) -> RtcResult;
type FnErrorString = unsafe extern "C" fn(RtcResult) -> *const c_char;
type FnVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> RtcResult;
type FnCount = unsafe extern "C" fn(*mut c_int) -> RtcResult;

/// The bound NVRTC entry points, the file they came from and its version.
struct Nvrtc {
    _lib: libloading::Library,
    /// The file loaded (a path, or the soname the system loader resolved).
    path: String,
    version: (i32, i32),
    /// The real architectures it compiles for (75, 80, 86, 90, ...).
    archs: Vec<u32>,
    create: FnCreate,
    compile: FnCompile,
    log_size: FnSize,
    log: FnBytes,
    ptx_size: FnSize,
    ptx: FnBytes,
    cubin_size: FnSize,
    cubin: FnBytes,
    destroy: FnDestroy,
    error_string: FnErrorString,
}

impl Nvrtc {
    /// Binds the entry points of `lib` (loaded from `path`) and checks its version.
    fn bind(lib: libloading::Library, path: String) -> std::result::Result<Nvrtc, String> {
        fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> std::result::Result<T, String> {
            // SAFETY: every `T` requested below is the C declaration of
            // `name` in nvrtc.h (CUDA 11.2 to 13): results are `int` enums,
            // programs opaque pointers.
            unsafe { lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|e| format!("{name}: {e}"))
        }
        let version: FnVersion = sym(&lib, "nvrtcVersion")?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        if unsafe { version(&mut major, &mut minor) } != 0 {
            return Err(format!("{path}: nvrtcVersion failed"));
        }
        if major != NVRTC_MAJOR {
            return Err(format!(
                "{path} is NVRTC {major}.{minor}; this build needs NVRTC {NVRTC_MAJOR} (CUDA {NVRTC_MAJOR}): \
                 set SHARDGRAPH_NVRTC_DIR to the folder of a libnvrtc.so.{NVRTC_MAJOR}"
            ));
        }
        let count: FnCount = sym(&lib, "nvrtcGetNumSupportedArchs")?;
        let list: FnCount = sym(&lib, "nvrtcGetSupportedArchs")?;
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        let mut archs = if unsafe { count(&mut n) } == 0 && (0..4096).contains(&n) {
            let mut v = vec![0 as c_int; n as usize];
            // SAFETY: `v` holds the `n` ints NVRTC reported.
            if unsafe { list(v.as_mut_ptr()) } == 0 {
                v.into_iter().filter(|&a| a > 0).map(|a| a as u32).collect()
            } else {
                Vec::new()
            }
        } else {
            Vec::new()
        };
        archs.sort_unstable();
        Ok(Nvrtc {
            create: sym(&lib, "nvrtcCreateProgram")?,
            compile: sym(&lib, "nvrtcCompileProgram")?,
            log_size: sym(&lib, "nvrtcGetProgramLogSize")?,
            log: sym(&lib, "nvrtcGetProgramLog")?,
            ptx_size: sym(&lib, "nvrtcGetPTXSize")?,
            ptx: sym(&lib, "nvrtcGetPTX")?,
            cubin_size: sym(&lib, "nvrtcGetCUBINSize")?,
            cubin: sym(&lib, "nvrtcGetCUBIN")?,
            destroy: sym(&lib, "nvrtcDestroyProgram")?,
            error_string: sym(&lib, "nvrtcGetErrorString")?,
            version: (major, minor),
            archs,
            path,
            _lib: lib,
        })
    }

    fn error(&self, rc: RtcResult) -> String {
        // SAFETY: accepts any value, returns a static string (or null).
        let p = unsafe { (self.error_string)(rc) };
        if p.is_null() {
            format!("nvrtcResult {rc}")
        } else {
            // SAFETY: a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }
}

/// Opens `path` (RTLD_NOW | RTLD_GLOBAL: libnvrtc opens its builtins by
/// soname, which then resolves to the copy already loaded).
fn open(path: &Path) -> std::result::Result<libloading::Library, String> {
    // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
    unsafe {
        libloading::os::unix::Library::open(
            Some(path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .map(libloading::Library::from)
    .map_err(|e| e.to_string())
}

/// NVRTC, loaded once per process: `libnvrtc.so.13` from the first
/// candidate folder that has it (with its builtins loaded first), else the
/// soname through the system loader.
fn nvrtc() -> Result<&'static Nvrtc> {
    static NVRTC: OnceLock<std::result::Result<Nvrtc, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| {
            let dirs = candidate_dirs();
            let soname = format!("libnvrtc.so.{NVRTC_MAJOR}");
            let mut tried = Vec::new();
            for d in &dirs {
                let lib = d.join(&soname);
                if !lib.is_file() {
                    continue;
                }
                let builtins = std::fs::read_dir(d).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("libnvrtc-builtins.so.{NVRTC_MAJOR}")))
                });
                for b in builtins {
                    // Kept loaded for the process (libnvrtc uses it).
                    if let Ok(l) = open(&b) {
                        std::mem::forget(l);
                    }
                }
                match open(&lib).and_then(|l| Nvrtc::bind(l, lib.display().to_string())) {
                    Ok(n) => return Ok(n),
                    Err(e) => tried.push(e),
                }
            }
            // SAFETY: as in `open`; by the soname, through the system loader's path.
            let by_name = unsafe { libloading::Library::new(&soname) }.map_err(|e| e.to_string());
            match by_name.and_then(|l| Nvrtc::bind(l, format!("{soname} (from the loader's path)"))) {
                Ok(n) => Ok(n),
                Err(e) => {
                    tried.push(e);
                    Err(format!(
                        "NVRTC ({soname}) not loaded: {}; looked in {dirs:?} and the system paths \
                         (install it with `.venv/bin/pip install nvidia-cuda-nvrtc`, or set SHARDGRAPH_NVRTC_DIR)",
                        tried.join("; ")
                    ))
                }
            }
        })
        .as_ref()
        .map_err(|detail| Error::Cuda { detail: detail.clone() })
}

/// Loads NVRTC once per process and checks its version (a missing NVRTC
/// is an error here, never a panic).
///
/// # Errors
/// [`Error::Cuda`] if no `libnvrtc.so.13` can be loaded (naming where it
/// looked), one lacks an entry point, or its version is not
/// [`NVRTC_MAJOR`].
pub fn load() -> Result<()> {
    nvrtc().map(|_| ())
}

/// The loaded NVRTC's version, `(major, minor)`.
///
/// # Errors
/// As [`load`].
pub fn version() -> Result<(i32, i32)> {
    Ok(nvrtc()?.version)
}

/// The loaded NVRTC: its file and version
/// (`"/usr/local/cuda/lib64/libnvrtc.so.13, NVRTC 13.0"`).
///
/// # Errors
/// As [`load`].
pub fn describe() -> Result<String> {
    let n = nvrtc()?;
    Ok(format!("{}, NVRTC {}.{}", n.path, n.version.0, n.version.1))
}

/// The real architectures the loaded NVRTC compiles for, as compute
/// capabilities × 10 (75, 80, 86, 89, 90, 100, ...), ascending.
///
/// # Errors
/// As [`load`].
pub fn supported_archs() -> Result<Vec<u32>> {
    Ok(nvrtc()?.archs.clone())
}

/// What a device of a given compute capability loads: the kernels compiled
/// for `arch`, as CUBIN (`cubin`) or as PTX for the driver to JIT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The NVRTC architecture (`"sm_90"`).
    pub arch: String,
    /// True: load the CUBIN (machine code for the device); false: the PTX
    /// (a GPU newer than any architecture NVRTC knows: forward JIT).
    pub cubin: bool,
}

/// The target for a device of compute capability `cc` (major × 10 + minor:
/// 90 for an H100/H200) given the architectures NVRTC supports: the
/// device's own when supported (CUBIN); else the newest supported one of
/// the same major version below it (CUBIN: machine code runs on later
/// minor versions); else the newest supported one below it, as PTX
/// (forward JIT on a GPU newer than this NVRTC). `None` when every
/// supported architecture is newer than the device.
pub fn choose_target(cc: u32, supported: &[u32]) -> Option<Target> {
    let best = supported.iter().copied().filter(|&a| a <= cc).max()?;
    Some(Target { arch: format!("sm_{best}"), cubin: best / 10 == cc / 10 })
}

/// [`choose_target`] with the loaded NVRTC's architectures, for a device
/// of compute capability `major.minor`.
///
/// # Errors
/// As [`load`]; [`Error::Cuda`] when the device is older than every
/// architecture the NVRTC compiles for.
pub fn target_for(major: i32, minor: i32) -> Result<Target> {
    let n = nvrtc()?;
    let cc = (major.max(0) * 10 + minor.clamp(0, 9)) as u32;
    // An NVRTC that does not list its architectures: CUDA 13's oldest.
    let archs = if n.archs.is_empty() { vec![75, 80, 86, 89, 90] } else { n.archs.clone() };
    choose_target(cc, &archs).ok_or_else(|| Error::Cuda {
        detail: format!(
            "compute capability {major}.{minor} is older than every architecture {} compiles for ({archs:?})",
            n.path
        ),
    })
}

/// One kernel file compiled for one architecture.
#[derive(Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The PTX text (loaded only for forward JIT; its entries name the kernels).
    pub ptx: String,
    /// The CUBIN (machine code for the architecture).
    pub cubin: Vec<u8>,
}

impl Compiled {
    /// The kernel entry points (`.visible .entry` names in the PTX).
    pub fn entries(&self) -> Vec<String> {
        entries(&self.ptx)
    }
}

/// The kernel entry points a PTX text defines (`.visible .entry` names).
pub fn entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|r| r.split(['(', ' ']).next().unwrap_or("").to_string())
        .collect()
}

/// FNV-1a 64 of some bytes.
fn fnv(bytes: impl IntoIterator<Item = u8>, seed: u64) -> u64 {
    bytes.into_iter().fold(seed, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}
const FNV_SEED: u64 = 0xcbf2_9ce4_8422_2325;

/// The cache key's source hash: the options and the source.
fn source_hash(source: &str) -> u64 {
    let opts = OPTIONS.join("\0");
    fnv(opts.bytes().chain([0u8]).chain(source.bytes()), FNV_SEED)
}

/// A compile's identity: architecture, source hash, NVRTC version.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    arch: String,
    hash: u64,
    nvrtc: (i32, i32),
}

impl Key {
    /// The key as one number (stored in a disk entry and checked on read).
    fn digest(&self) -> u64 {
        let s = format!("{}:{:016x}:{}.{}", self.arch, self.hash, self.nvrtc.0, self.nvrtc.1);
        fnv(s.bytes(), FNV_SEED)
    }

    /// The disk entry's file name for kernel file `stem`.
    fn file_name(&self, stem: &str) -> String {
        let clean = |s: &str| -> String {
            s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
        };
        format!("{}-{}-nvrtc{}.{}-{:016x}.sgk", clean(stem), clean(&self.arch), self.nvrtc.0, self.nvrtc.1, self.hash)
    }
}

/// The on-disk entry format: magic, format version, key digest, PTX length,
/// CUBIN length, FNV-1a of PTX then CUBIN (all little-endian u64 after the
/// 4-byte magic and u32 version), then the PTX and CUBIN bytes.
mod disk {
    use super::{fnv, Compiled, FNV_SEED};

    const MAGIC: &[u8; 4] = b"SGKC";
    const VERSION: u32 = 1;
    pub(super) const HEADER: usize = 4 + 4 + 8 * 4;

    pub(super) fn encode(digest: u64, c: &Compiled) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER + c.ptx.len() + c.cubin.len());
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&VERSION.to_le_bytes());
        v.extend_from_slice(&digest.to_le_bytes());
        v.extend_from_slice(&(c.ptx.len() as u64).to_le_bytes());
        v.extend_from_slice(&(c.cubin.len() as u64).to_le_bytes());
        let sum = fnv(c.ptx.bytes().chain(c.cubin.iter().copied()), FNV_SEED);
        v.extend_from_slice(&sum.to_le_bytes());
        v.extend_from_slice(c.ptx.as_bytes());
        v.extend_from_slice(&c.cubin);
        v
    }

    /// The entry in `b`, checked against `digest`; why not otherwise.
    pub(super) fn decode(b: &[u8], digest: u64) -> Result<Compiled, String> {
        if b.len() < HEADER {
            return Err(format!("{} bytes, shorter than the header", b.len()));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        if &b[..4] != MAGIC || b[4..8] != VERSION.to_le_bytes() {
            return Err("not a kernel cache entry of this format".into());
        }
        if u64_at(8) != digest {
            return Err("an entry of another key".into());
        }
        let (np, nc, sum) = (u64_at(16), u64_at(24), u64_at(32));
        let want = (HEADER as u64).checked_add(np).and_then(|x| x.checked_add(nc));
        if want != Some(b.len() as u64) {
            return Err(format!("{} bytes, the header says {want:?}", b.len()));
        }
        let (ptx, cubin) = b[HEADER..].split_at(np as usize);
        if fnv(ptx.iter().chain(cubin).copied(), FNV_SEED) != sum {
            return Err("checksum mismatch".into());
        }
        let ptx = String::from_utf8(ptx.to_vec()).map_err(|_| "PTX is not UTF-8".to_string())?;
        if cubin.is_empty() || super::entries(&ptx).is_empty() {
            return Err("no CUBIN or no kernel in the PTX".into());
        }
        Ok(Compiled { ptx, cubin: cubin.to_vec() })
    }
}

/// One key's compile: run at most once; waiters block on the cell.
#[derive(Default)]
struct Entry {
    cell: OnceLock<std::result::Result<Arc<Compiled>, String>>,
    /// NVRTC runs for this key (0 or 1).
    runs: AtomicU32,
}

/// Compiles by key, once per process, with an optional disk cache.
struct KernelCache {
    dir: Option<PathBuf>,
    entries: Mutex<HashMap<Key, Arc<Entry>>>,
    compiles: AtomicU64,
    disk_hits: AtomicU64,
    memory_hits: AtomicU64,
}

impl KernelCache {
    fn new(dir: Option<PathBuf>) -> Self {
        KernelCache {
            dir,
            entries: Mutex::new(HashMap::new()),
            compiles: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
        }
    }

    fn entry(&self, key: &Key) -> Arc<Entry> {
        let mut m = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(key.clone()).or_default().clone()
    }

    fn contains(&self, key: &Key) -> bool {
        let m = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        m.get(key).is_some_and(|e| matches!(e.cell.get(), Some(Ok(_))))
    }

    /// The compile of `key` (kernel file `stem`): from this process, else
    /// from the disk entry when it checks out, else by `compile` (written
    /// to disk). Concurrent calls for one key run `compile` once.
    fn get(
        &self,
        key: &Key,
        stem: &str,
        compile: impl FnOnce() -> std::result::Result<Compiled, String>,
    ) -> std::result::Result<Arc<Compiled>, String> {
        let entry = self.entry(key);
        let mut ran = false;
        let r = entry.cell.get_or_init(|| {
            ran = true;
            let path = self.dir.as_ref().map(|d| d.join(key.file_name(stem)));
            if let Some(p) = &path {
                match std::fs::read(p) {
                    Ok(b) => match disk::decode(&b, key.digest()) {
                        Ok(c) => {
                            self.disk_hits.fetch_add(1, Ordering::Relaxed);
                            return Ok(Arc::new(c));
                        }
                        Err(why) => log::warn!("kernel cache {}: {why}; compiling again", p.display()),
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => log::warn!("kernel cache {}: {e}; compiling again", p.display()),
                }
            }
            entry.runs.fetch_add(1, Ordering::Relaxed);
            self.compiles.fetch_add(1, Ordering::Relaxed);
            let c = compile()?;
            if let Some(p) = &path {
                if let Err(e) = write_atomically(p, &disk::encode(key.digest(), &c)) {
                    log::debug!("kernel cache {}: not written: {e}", p.display());
                }
            }
            Ok(Arc::new(c))
        });
        if !ran {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
        }
        r.clone()
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder,
/// renamed over it, so a reader never sees a partial entry.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static N: AtomicU64 = AtomicU64::new(0);
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension(format!("tmp{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The disk cache's folder: `SHARDGRAPH_KERNEL_CACHE` (`off`, `0` or empty:
/// none), else `$XDG_CACHE_HOME/shardgraph/kernels`, else
/// `$HOME/.cache/shardgraph/kernels`; `None` when off or neither variable is set.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("SHARDGRAPH_KERNEL_CACHE") {
        Some(v) if v.is_empty() || v == "off" || v == "0" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("shardgraph").join("kernels")),
    }
}

/// The process's kernel cache ([`cache_dir`] read once).
fn cache() -> &'static KernelCache {
    static CACHE: OnceLock<KernelCache> = OnceLock::new();
    CACHE.get_or_init(|| {
        if std::env::var_os("SHARDGRAPH_NVRTC_STATS").is_some_and(|v| !v.is_empty() && v != "0") {
            extern "C" {
                fn atexit(f: extern "C" fn()) -> c_int;
            }
            extern "C" fn print_stats() {
                eprintln!("{}", stats());
            }
            // SAFETY: registers a plain function (no captured state) with the
            // C library, called once at exit; it only reads atomics and
            // writes to stderr.
            unsafe { atexit(print_stats) };
        }
        KernelCache::new(cache_dir())
    })
}

/// What the process's kernel compiles did: [`stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    /// NVRTC runs (compiles of a key found neither in the process nor on disk).
    pub compiles: u64,
    /// Keys read from the disk cache instead.
    pub disk_hits: u64,
    /// Requests answered by an earlier (or concurrent) compile in this process.
    pub memory_hits: u64,
    /// Distinct (architecture, source hash, NVRTC version) keys requested.
    pub keys: usize,
    /// The largest number of NVRTC runs for one key (1 when each ran once).
    pub max_runs_per_key: u32,
    /// The disk cache's folder, if any.
    pub dir: Option<PathBuf>,
}

impl std::fmt::Display for CompileStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nvrtc: {} compiles, {} disk-cache hits, {} in-process hits, {} keys, at most {} compile(s) per key, disk cache {}",
            self.compiles,
            self.disk_hits,
            self.memory_hits,
            self.keys,
            self.max_runs_per_key,
            self.dir.as_ref().map_or("off".to_string(), |d| d.display().to_string())
        )
    }
}

/// The process's compile counters so far.
pub fn stats() -> CompileStats {
    let c = cache();
    let m = c.entries.lock().unwrap_or_else(|p| p.into_inner());
    CompileStats {
        compiles: c.compiles.load(Ordering::Relaxed),
        disk_hits: c.disk_hits.load(Ordering::Relaxed),
        memory_hits: c.memory_hits.load(Ordering::Relaxed),
        keys: m.len(),
        max_runs_per_key: m.values().map(|e| e.runs.load(Ordering::Relaxed)).max().unwrap_or(0),
        dir: c.dir.clone(),
    }
}

/// The key of `source` for `arch` with the loaded NVRTC, if it is loaded.
fn key(source: &str, arch: &str) -> Result<Key> {
    Ok(Key { arch: arch.to_string(), hash: source_hash(source), nvrtc: version()? })
}

/// Whether [`compile`] holds `source` compiled for `arch` in this process
/// (a later compile of it is a lookup, not an NVRTC run).
pub fn is_cached(source: &str, arch: &str) -> bool {
    key(source, arch).is_ok_and(|k| cache().contains(&k))
}

/// Compiles one kernel family's `source` (`kernels-cuda/<name>.cu`) for
/// `arch` (`"sm_86"`, `"sm_90"`, …: a real architecture, so the result
/// holds CUBIN and PTX), once per process and NVRTC version: from the
/// process's cache, else the disk cache, else NVRTC. Concurrent calls for
/// one key wait for one compile.
///
/// # Errors
/// [`Error::Cuda`] naming the file and architecture with NVRTC's error and
/// log (the same error for every later request of that key); an `arch`
/// that is not `sm_` and digits; NVRTC missing ([`load`]).
pub fn compile(name: &str, source: &str, arch: &str) -> Result<Arc<Compiled>> {
    let what = format!("kernels-cuda/{name}.cu for {arch}");
    let valid = arch.strip_prefix("sm_").is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
    if !valid {
        return Err(Error::Cuda { detail: format!("{what}: {arch:?} is not an architecture like sm_90") });
    }
    let n = nvrtc()?;
    let key = key(source, arch)?;
    cache()
        .get(&key, name, || run_nvrtc(n, name, source, arch).map_err(|why| format!("{what}: {why}")))
        .map_err(|detail| Error::Cuda { detail })
}

/// One NVRTC run: `source` as `<name>.cu` for `arch`, PTX and CUBIN out.
fn run_nvrtc(n: &Nvrtc, name: &str, source: &str, arch: &str) -> std::result::Result<Compiled, String> {
    let src = CString::new(source).map_err(|_| "the source contains NUL".to_string())?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| "the name contains NUL".to_string())?;
    let opts: Vec<CString> = std::iter::once(format!("--gpu-architecture={arch}"))
        .chain(OPTIONS.iter().map(|s| s.to_string()))
        .filter_map(|o| CString::new(o).ok())
        .collect();
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: NUL-terminated source and name that outlive the call; no headers.
    let rc = unsafe { (n.create)(&mut prog, src.as_ptr(), file.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
    if rc != 0 {
        return Err(format!("nvrtcCreateProgram ({}): {}", n.path, n.error(rc)));
    }
    let result = (|| {
        // SAFETY: a live program; `opt_ptrs` holds `len` NUL-terminated options.
        let rc = unsafe { (n.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        if rc != 0 {
            // SAFETY: a live program (its log exists after a compile).
            let log = unsafe { program_bytes(prog, n.log_size, n.log) }.map(|b| text(&b)).unwrap_or_default();
            return Err(format!("{}; log:\n{}", n.error(rc), log.trim_end()));
        }
        // SAFETY: a live, compiled program.
        let ptx =
            unsafe { program_bytes(prog, n.ptx_size, n.ptx) }.map_err(|rc| format!("nvrtcGetPTX: {}", n.error(rc)))?;
        // SAFETY: as above.
        let cubin = unsafe { program_bytes(prog, n.cubin_size, n.cubin) }
            .map_err(|rc| format!("nvrtcGetCUBIN: {}", n.error(rc)))?;
        if cubin.is_empty() {
            return Err("NVRTC returned no CUBIN".into());
        }
        Ok(Compiled { ptx: text(&ptx), cubin })
    })();
    // SAFETY: the program is live and not used after this.
    let _ = unsafe { (n.destroy)(&mut prog) };
    result
}

/// Bytes up to the first NUL, as text.
fn text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The bytes a program reports through a size and a copy function.
///
/// # Safety
/// `prog` is a live program; `size`/`copy` are a matching NVRTC pair.
unsafe fn program_bytes(prog: Program, size: FnSize, copy: FnBytes) -> std::result::Result<Vec<u8>, RtcResult> {
    let mut len = 0usize;
    // SAFETY: the caller's guarantee; writes one size_t.
    let rc = unsafe { size(prog, &mut len) };
    if rc != 0 {
        return Err(rc);
    }
    let mut buf = vec![0u8; len + 1];
    if len > 0 {
        // SAFETY: `buf` holds the `len` bytes the program reported (plus one).
        let rc = unsafe { copy(prog, buf.as_mut_ptr() as *mut c_char) };
        if rc != 0 {
            return Err(rc);
        }
    }
    buf.truncate(len);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn temp_dir(tag: &str) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "shardgraph-kcache-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn fake(tag: &str) -> Compiled {
        Compiled {
            ptx: format!(".version 9.0\n.target sm_90\n.visible .entry sg_{tag}(\n)\n{{ ret; }}\n"),
            cubin: (0..4096u32).map(|i| (i * 31 + tag.len() as u32) as u8).collect(),
        }
    }

    fn key_of(tag: &str) -> Key {
        Key { arch: "sm_90".into(), hash: source_hash(tag), nvrtc: (13, 0) }
    }

    /// A miss compiles and writes the entry; a new process (a new cache
    /// over the same folder) reads it back without compiling; another
    /// NVRTC version or architecture is another key (a miss).
    #[test]
    fn disk_cache_hit_and_miss() {
        let dir = temp_dir("hit");
        let runs = AtomicUsize::new(0);
        let compile = |tag: &'static str| {
            let runs = &runs;
            move || {
                runs.fetch_add(1, Ordering::Relaxed);
                Ok(fake(tag))
            }
        };
        let k = key_of("a");
        let first = KernelCache::new(Some(dir.clone()));
        let a = first.get(&k, "elementwise", compile("a")).unwrap();
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert!(dir.join(k.file_name("elementwise")).is_file());
        // The same process: no compile, no disk read.
        assert!(Arc::ptr_eq(&a, &first.get(&k, "elementwise", compile("a")).unwrap()));
        assert_eq!((first.compiles.load(Ordering::Relaxed), first.memory_hits.load(Ordering::Relaxed)), (1, 1));
        // A new process: from disk.
        let second = KernelCache::new(Some(dir.clone()));
        let b = second.get(&k, "elementwise", compile("a")).unwrap();
        assert_eq!(runs.load(Ordering::Relaxed), 1, "a disk hit compiles nothing");
        assert_eq!(*b, fake("a"));
        assert_eq!((second.compiles.load(Ordering::Relaxed), second.disk_hits.load(Ordering::Relaxed)), (0, 1));
        // Another NVRTC version and another architecture miss.
        let newer = Key { nvrtc: (13, 1), ..k.clone() };
        let sm86 = Key { arch: "sm_86".into(), ..k.clone() };
        second.get(&newer, "elementwise", compile("a")).unwrap();
        second.get(&sm86, "elementwise", compile("a")).unwrap();
        assert_eq!(runs.load(Ordering::Relaxed), 3);
        assert_eq!(second.compiles.load(Ordering::Relaxed), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A damaged entry (truncated, a flipped byte, another key's entry, a
    /// foreign file) is never used: it is compiled again and rewritten,
    /// and the rewritten entry is a hit.
    #[test]
    fn a_corrupt_disk_entry_is_compiled_again() {
        let dir = temp_dir("corrupt");
        let k = key_of("b");
        let path = dir.join(k.file_name("norm"));
        KernelCache::new(Some(dir.clone())).get(&k, "norm", || Ok(fake("b"))).unwrap();
        let good = std::fs::read(&path).unwrap();
        let other = disk::encode(key_of("c").digest(), &fake("b"));
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        let mut in_ptx = good.clone();
        in_ptx[disk::HEADER + 3] ^= 1;
        let damaged: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", good[..good.len() - 100].to_vec()),
            ("header only", good[..disk::HEADER - 1].to_vec()),
            ("a CUBIN byte flipped", flipped),
            ("a PTX byte flipped", in_ptx),
            ("another key's entry", other),
            ("a foreign file", b"not a cache entry at all, just some text here, long enough".to_vec()),
            ("empty", Vec::new()),
        ];
        for (what, bytes) in damaged {
            assert!(disk::decode(&bytes, k.digest()).is_err(), "{what} decodes");
            std::fs::write(&path, &bytes).unwrap();
            let runs = AtomicUsize::new(0);
            let c = KernelCache::new(Some(dir.clone()));
            let got = c
                .get(&k, "norm", || {
                    runs.fetch_add(1, Ordering::Relaxed);
                    Ok(fake("b"))
                })
                .unwrap();
            assert_eq!(runs.load(Ordering::Relaxed), 1, "{what}: compiled again");
            assert_eq!(*got, fake("b"));
            assert_eq!(std::fs::read(&path).unwrap(), good, "{what}: the entry is rewritten");
            let again = KernelCache::new(Some(dir.clone()));
            again.get(&k, "norm", || panic!("{what}: the rewritten entry is a hit")).unwrap();
            assert_eq!(again.disk_hits.load(Ordering::Relaxed), 1);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// 16 threads asking for one key at once run one compile and share
    /// its result; a compile error is the answer for every request of the
    /// key without compiling again.
    #[test]
    fn concurrent_requests_for_one_key_compile_once() {
        let c = KernelCache::new(None);
        let k = key_of("d");
        let runs = AtomicUsize::new(0);
        let go = std::sync::Barrier::new(16);
        let got: Vec<Arc<Compiled>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..16)
                .map(|_| {
                    s.spawn(|| {
                        go.wait();
                        c.get(&k, "softmax", || {
                            runs.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(std::time::Duration::from_millis(100));
                            Ok(fake("d"))
                        })
                        .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert!(got.iter().all(|g| Arc::ptr_eq(g, &got[0])));
        assert_eq!(c.compiles.load(Ordering::Relaxed), 1);
        assert_eq!(c.memory_hits.load(Ordering::Relaxed), 15);
        assert_eq!(c.entry(&k).runs.load(Ordering::Relaxed), 1);
        let bad = key_of("e");
        let e1 = c.get(&bad, "broken", || Err("syntax error".into())).unwrap_err();
        let e2 = c.get(&bad, "broken", || panic!("a failed key is not compiled again")).unwrap_err();
        assert_eq!((e1.as_str(), e2.as_str()), ("syntax error", "syntax error"));
    }

    /// The device's own architecture as CUBIN when NVRTC has it; the same
    /// major's older one as CUBIN; a newer major's GPU gets PTX (forward
    /// JIT); a GPU older than every supported architecture gets none.
    #[test]
    fn targets_by_compute_capability() {
        let cuda13 = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];
        let t = |cc| choose_target(cc, &cuda13);
        assert_eq!(t(90), Some(Target { arch: "sm_90".into(), cubin: true }));
        assert_eq!(t(86), Some(Target { arch: "sm_86".into(), cubin: true }));
        assert_eq!(t(91), Some(Target { arch: "sm_90".into(), cubin: true }));
        assert_eq!(t(130), Some(Target { arch: "sm_121".into(), cubin: false }));
        assert_eq!(t(70), None);
        let old = [75, 80, 86, 89, 90];
        assert_eq!(choose_target(100, &old), Some(Target { arch: "sm_90".into(), cubin: false }));
    }

    /// The cache folder follows SHARDGRAPH_KERNEL_CACHE, XDG_CACHE_HOME and
    /// HOME in that order (read here without changing the environment).
    #[test]
    fn cache_dir_default_is_under_the_user_cache() {
        if std::env::var_os("SHARDGRAPH_KERNEL_CACHE").is_none() && std::env::var_os("XDG_CACHE_HOME").is_none() {
            if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
                assert_eq!(cache_dir(), Some(PathBuf::from(h).join(".cache/shardgraph/kernels")));
            }
        }
    }
}
