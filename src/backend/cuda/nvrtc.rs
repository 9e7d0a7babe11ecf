//! NVRTC: finds `libnvrtc` (a CUDA toolkit, or the `nvidia-cuda-nvrtc`
//! wheel that `scripts/setup.sh` installs into `./.venv`), and compiles the
//! embedded kernel sources to PTX for a compute capability, with a
//! process-wide cache keyed by architecture and source hash.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// Every `kernels-cuda/*.cu` file: `(file stem, CUDA C source)`, in file-name order.
pub use super::sources::KERNEL_SOURCES;

/// Folders searched for `libnvrtc.so.13` before the system's: the
/// `SHARDGRAPH_NVRTC_DIR` environment variable, then the pip wheel's folder
/// in `./.venv` (`nvidia/cu13/lib`).
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

/// Loads NVRTC once per process. Libraries found in a candidate folder are
/// loaded by path first (globally, so that cudarc's later load by soname
/// finds them); then the soname is probed, so a missing NVRTC is an error
/// here and never reaches cudarc (which panics on it).
///
/// # Errors
/// [`Error::Cuda`] if no `libnvrtc` can be loaded, naming where it looked.
pub fn load() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let dirs = candidate_dirs();
            for d in &dirs {
                let Ok(rd) = std::fs::read_dir(d) else { continue };
                let mut libs: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc")))
                    .collect();
                // The builtins first: libnvrtc opens them by name.
                libs.sort_by_key(|p| !p.to_string_lossy().contains("builtins"));
                for p in libs {
                    // SAFETY: loading NVRTC runs its initialisers, which have no
                    // preconditions; the handle is leaked so the library stays
                    // loaded for the process (cudarc holds raw symbols into it).
                    if let Ok(lib) = unsafe {
                        libloading::os::unix::Library::open(
                            Some(&p),
                            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                        )
                    } {
                        std::mem::forget(lib);
                    }
                }
            }
            // SAFETY: as above; probing by the soname cudarc asks for.
            match unsafe { libloading::Library::new("libnvrtc.so.13") } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    Ok(())
                }
                Err(e) => Err(format!(
                    "NVRTC (libnvrtc.so.13) not found ({e}); looked in {dirs:?} and the system paths \
                     (install it with `.venv/bin/pip install nvidia-cuda-nvrtc`, or set SHARDGRAPH_NVRTC_DIR)"
                )),
            }
        })
        .clone()
        .map_err(|detail| Error::Cuda { detail })
}

/// FNV-1a of a source, the cache key with the architecture.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// The PTX compiled so far, by architecture and source hash.
fn ptx_cache() -> &'static Mutex<HashMap<(&'static str, u64), String>> {
    static CACHE: OnceLock<Mutex<HashMap<(&'static str, u64), String>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether [`compile`] holds the PTX of `source` for `arch` (a later
/// compile of it is a lookup, not an NVRTC run).
pub fn is_cached(source: &str, arch: &'static str) -> bool {
    ptx_cache().lock().is_ok_and(|c| c.contains_key(&(arch, hash(source))))
}

/// Compiles one kernel family's `source` to PTX for `arch` (`"sm_86"`,
/// `"sm_90"`, …), from the cache when the same source was compiled for the
/// same architecture before. Returns the PTX text.
///
/// # Errors
/// [`Error::Cuda`] naming the family and architecture with NVRTC's log, or
/// NVRTC missing ([`load`]).
pub fn compile(name: &str, source: &str, arch: &'static str) -> Result<String> {
    let key = (arch, hash(source));
    let cache = ptx_cache();
    if let Some(ptx) = cache.lock().map_err(|_| Error::Cuda { detail: "NVRTC cache poisoned".into() })?.get(&key) {
        return Ok(ptx.clone());
    }
    load()?;
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".into()],
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    // cudarc panics if it cannot bind a symbol; contain it at this boundary.
    let src = source.to_string();
    let r = std::panic::catch_unwind(move || cudarc::nvrtc::compile_ptx_with_opts(src, opts));
    let ptx = match r {
        Ok(Ok(ptx)) => ptx.to_src(),
        Ok(Err(e)) => return Err(Error::Cuda { detail: format!("kernels-cuda/{name}.cu for {arch}: {e:?}") }),
        Err(_) => return Err(Error::Cuda { detail: format!("kernels-cuda/{name}.cu for {arch}: NVRTC panicked") }),
    };
    cache.lock().map_err(|_| Error::Cuda { detail: "NVRTC cache poisoned".into() })?.insert(key, ptx.clone());
    Ok(ptx)
}

/// The kernel entry points a PTX text defines (`.visible .entry` names).
pub fn entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|r| r.split(['(', ' ']).next().unwrap_or("").to_string())
        .collect()
}
