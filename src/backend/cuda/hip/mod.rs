//! The HIP runtime behind the `Gpu` interface (AMD GPUs, cargo feature
//! `hip`): the same contract as the CUDA driver's device (`driver.rs`),
//! through libraries loaded at run time, so the crate builds without ROCm
//! and a machine without it (or without a GPU) gets an [`Error::Hip`].
//!
//! - `runtime.rs`: `libamdhip64` (ROCm 7, 6 or 5), the
//!   entry points, enum values and the one struct offset the backend uses,
//!   with where each was checked.
//! - [`hiprtc`]: compiles `kernels-cuda/*.cu` behind `kernels-hip/sg_hip.h`
//!   for the GPU's `gfx` architecture at first use, cached per process.
//! - [`code_object`]: the kernels (and their wave size) in a code object
//!   that hipRTC or `hipcc --genco` wrote.
//! - `hipblas.rs`: hipBLAS's F32 GEMM when the library is present.
//!
//! One `HipGpu` per (virtual) device: its own non-blocking stream on the
//! GPU, its own memory budget (an equal share of 95% of the GPU's memory),
//! and the kernel modules compiled for the GPU's architecture, loaded
//! once per `HipGpu::open` and shared by the devices it made. Work is
//! queued on the stream in order; `read`, `write` and `synchronize` wait
//! for it.
//!
//! The wave size: the kernels are compiled with `SG_WARP` = 64 on gfx8
//! and gfx9 (GCN, CDNA) and 32 on gfx10, gfx11 and gfx12 (RDNA, wave32 by
//! default), see `kernels-hip/sg_hip.h`; [`wave_size`] is the same rule.
//! Opening a device checks it against the runtime's warp-size attribute,
//! and loading the kernels checks every kernel descriptor's wave size
//! against it, so a mismatch is an `Err`, never a wrong reduction.
//!
//! This code has been compiled and its no-GPU paths run (ROCm 5.2 without
//! a GPU); the GPU paths have not been run on an AMD GPU.

pub mod code_object;
mod hipblas;
pub mod hiprtc;
mod runtime;

use super::api::{DevPtr, Gemm, Gpu, GpuInfo, KArg, Vendor};
use crate::error::{Error, Result};
use runtime::{Event, Handle, Module, Runtime, Stream};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The processor of a `gcnArchName` ("gfx90a" of "gfx90a:sramecc+:xnack-"),
/// when the name is well formed: `gfx` then 3 or 4 hex digits starting
/// with a decimal major version, then optional `:feature+`/`:feature-`
/// settings. `None` otherwise.
pub fn base_arch(name: &str) -> Option<&str> {
    let mut parts = name.split(':');
    let base = parts.next()?;
    let id = base.strip_prefix("gfx")?;
    let ok_id = (3..=4).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_digit())
        && id.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    let ok_features = parts.all(|f| {
        let flag = f.strip_suffix(['+', '-']).unwrap_or("");
        !flag.is_empty() && flag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    });
    (ok_id && ok_features).then_some(base)
}

/// The wave size the kernels are compiled for on `arch` (a `gfx` name,
/// with or without features), threads: 64 for gfx6 to gfx9 (GCN, CDNA),
/// 32 for gfx10, gfx11 and gfx12 (RDNA). `None` for a name that is not a
/// `gfx` architecture or another generation. Matches `SG_WARP` in
/// `kernels-hip/sg_hip.h`.
pub fn wave_size(arch: &str) -> Option<u32> {
    let id = base_arch(arch)?.strip_prefix("gfx")?;
    // The last two characters are the minor version and stepping; the rest
    // is the decimal major version.
    let major: u32 = id.get(..id.len() - 2)?.parse().ok()?;
    match major {
        6..=9 => Some(64),
        10..=12 => Some(32),
        _ => None,
    }
}

/// Number of AMD GPUs the HIP runtime sees.
///
/// # Errors
/// [`Error::Hip`] saying why there is none to count: the HIP runtime
/// (`libamdhip64`) is not installed, or it found no usable GPU (`hipInit`
/// failed: no `/dev/kfd`, no amdgpu driver, no device), with the
/// runtime's error.
pub fn device_count() -> Result<usize> {
    runtime::runtime()?.device_count()
}

/// The runtime, initialised, and GPU `ordinal` checked to exist.
fn device(ordinal: usize) -> Result<&'static Runtime> {
    let rt = runtime::runtime()?;
    let count = rt.device_count()?;
    if count == 0 {
        return Err(Error::Hip { detail: "no usable AMD GPU: the HIP runtime sees no device".into() });
    }
    if ordinal >= count {
        return Err(Error::Hip { detail: format!("GPU {ordinal} requested; the HIP runtime sees {count}") });
    }
    Ok(rt)
}

/// GPU `ordinal`'s architecture as the kernels are compiled for it (the
/// `gfx` name without target features: code for the default, "any",
/// xnack/sramecc setting runs in either mode) and its wave size, checked
/// against the runtime's warp-size attribute.
fn arch_and_wave(rt: &Runtime, ordinal: usize) -> Result<(String, u32)> {
    let (full, runtime_warp) = rt.arch_name(ordinal)?;
    let arch = base_arch(&full).unwrap_or_default().to_string();
    let wave = wave_size(&arch).ok_or_else(|| Error::Hip {
        detail: format!("GPU {ordinal}: {full}: an architecture whose wave size this backend does not know"),
    })?;
    if runtime_warp != wave as i32 {
        return Err(Error::Hip {
            detail: format!(
                "GPU {ordinal}: {full}: the runtime reports waves of {runtime_warp} threads, the kernels are \
                 compiled for {wave} (SG_WARP in kernels-hip/sg_hip.h)"
            ),
        });
    }
    Ok((arch, wave))
}

/// The kernel modules of one GPU: every kernel file compiled by hipRTC
/// and loaded, which module holds each kernel (from its code object), and
/// the functions looked up so far.
struct Kernels {
    modules: Vec<Module>,
    index: HashMap<String, usize>,
    functions: Mutex<HashMap<String, Handle>>,
}

impl Kernels {
    /// Compiles (hipRTC, one file at a time, cached per process) and loads
    /// every kernel file for `arch` on GPU `ordinal`, checking each
    /// kernel's wave size.
    fn load(rt: &'static Runtime, ordinal: usize, arch: &str, wave: u32) -> Result<Kernels> {
        let sources = super::sources::KERNEL_SOURCES;
        let codes = sources.iter().map(|&(name, src)| hiprtc::compile_kernel_file(name, src, arch));
        let mut ks = Kernels { modules: Vec::new(), index: HashMap::new(), functions: Mutex::new(HashMap::new()) };
        for (&(name, _), code) in sources.iter().zip(codes) {
            let code = code?;
            let file = format!("kernels-cuda/{name}.cu ({arch})");
            let objects =
                code_object::parse(&code).map_err(|e| Error::Hip { detail: format!("GPU {ordinal}: {file}: {e}") })?;
            for k in objects.iter().flat_map(|o| &o.kernels) {
                if k.wave_size != wave {
                    return Err(Error::Hip {
                        detail: format!(
                            "GPU {ordinal}: {file}: kernel {} is compiled for waves of {}, the device runs {wave}",
                            k.name, k.wave_size
                        ),
                    });
                }
                if let Some(other) = ks.index.insert(k.name.clone(), ks.modules.len()) {
                    let first = sources.get(other).map_or("?", |s| s.0);
                    return Err(Error::Hip {
                        detail: format!("GPU {ordinal}: kernel {} is defined in {first}.cu and {name}.cu", k.name),
                    });
                }
            }
            ks.modules.push(Module::load(rt, ordinal, code, &file)?);
        }
        Ok(ks)
    }

    /// The function `kernel`, looked up once (in the module its code object
    /// names, else in every module) and cached.
    fn function(&self, ordinal: usize, kernel: &str) -> Result<Handle> {
        let mut fs = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&f) = fs.get(kernel) {
            return Ok(f);
        }
        let f = match self.index.get(kernel).and_then(|&i| self.modules.get(i)) {
            Some(m) => m.function(kernel)?,
            None => self.modules.iter().find_map(|m| m.function(kernel).ok()).ok_or_else(|| Error::Hip {
                detail: format!("GPU {ordinal}: no kernel named {kernel} in kernels-cuda"),
            })?,
        };
        fs.insert(kernel.to_string(), f);
        Ok(f)
    }
}

/// Compiles every kernel file for GPU `ordinal`'s architecture with
/// hipRTC, loads each module onto the device and resolves every kernel
/// its code object names (with `hipModuleGetFunction`): the GPU-side half
/// of the kernel check. Returns the number of kernels resolved.
///
/// # Errors
/// [`Error::Hip`]: no runtime or GPU (as [`device_count`]), no hipRTC, or
/// naming the device and the kernel file or kernel that failed to
/// compile, load or resolve.
pub fn load_all_kernels(ordinal: usize) -> Result<usize> {
    let rt = device(ordinal)?;
    hiprtc::load()?;
    rt.set_device(ordinal)?;
    let (arch, wave) = arch_and_wave(rt, ordinal)?;
    let ks = Kernels::load(rt, ordinal, &arch, wave)?;
    let names: Vec<String> = ks.index.keys().cloned().collect();
    for n in &names {
        ks.function(ordinal, n)?;
    }
    Ok(names.len())
}

/// A hipBLAS handle bound to one device's stream.
struct BlasHandle(Handle);

/// One (virtual) device on an AMD GPU.
pub(crate) struct HipGpu {
    rt: &'static Runtime,
    ordinal: usize,
    stream: Stream,
    kernels: Arc<OnceLock<std::result::Result<Kernels, String>>>,
    arch: String,
    wave: u32,
    budget: usize,
    used: AtomicUsize,
    sizes: Mutex<HashMap<DevPtr, usize>>,
    blas: Mutex<Option<BlasHandle>>,
    name: String,
    multiprocessors: u32,
    bandwidth: f64,
}

impl std::fmt::Debug for HipGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipGpu(GPU {}, {})", self.ordinal, self.name)
    }
}

impl HipGpu {
    /// `n` (1..=64) devices on GPU `ordinal`, each with its own
    /// non-blocking stream and an equal share of 95% of the GPU's memory.
    ///
    /// # Errors
    /// [`Error::Hip`]: no HIP runtime or hipRTC, no usable GPU, an ordinal
    /// the runtime does not have, an architecture whose wave size is
    /// unknown or disagrees with the runtime, or a failed runtime call
    /// (named, with the runtime's error).
    pub(crate) fn open(ordinal: usize, n: usize) -> Result<Vec<HipGpu>> {
        if n == 0 || n > 64 {
            return Err(Error::Hip { detail: format!("{n} virtual devices: need 1..=64") });
        }
        let rt = device(ordinal)?;
        hiprtc::load()?;
        rt.set_device(ordinal)?;
        let (arch, wave) = arch_and_wave(rt, ordinal)?;
        let total = rt.total_mem(ordinal)?;
        let name = rt.device_name(ordinal).unwrap_or_default();
        let name = if name.is_empty() { format!("AMD GPU ({arch})") } else { format!("{name} ({arch})") };
        let cus = rt.attribute(ordinal, runtime::attr::MULTIPROCESSOR_COUNT, "multiprocessor count")?;
        let clock = rt.attribute(ordinal, runtime::attr::MEMORY_CLOCK_RATE, "memory clock").unwrap_or(0);
        let bus = rt.attribute(ordinal, runtime::attr::MEMORY_BUS_WIDTH, "memory bus width").unwrap_or(0);
        let bandwidth = super::api::peak_bandwidth(clock, bus);
        let kernels = Arc::new(OnceLock::new());
        (0..n)
            .map(|_| {
                Ok(HipGpu {
                    rt,
                    ordinal,
                    stream: Stream::new(rt, ordinal)?,
                    kernels: kernels.clone(),
                    arch: arch.clone(),
                    wave,
                    budget: super::api::device_budget(total, n),
                    used: AtomicUsize::new(0),
                    sizes: Mutex::new(HashMap::new()),
                    blas: Mutex::new(None),
                    name: name.clone(),
                    multiprocessors: cus.max(1) as u32,
                    bandwidth,
                })
            })
            .collect()
    }

    fn who(&self) -> String {
        runtime::gpu(self.ordinal)
    }

    /// Makes the GPU current on this thread.
    fn bind(&self) -> Result<()> {
        self.rt.set_device(self.ordinal)
    }

    fn check(&self, rc: runtime::HipError, call: &str) -> Result<()> {
        self.rt.check(rc, &self.who(), call)
    }

    /// The function for `kernel`, compiling and loading every kernel file on first use.
    fn function(&self, kernel: &str) -> Result<Handle> {
        let k = self.kernels.get_or_init(|| {
            Kernels::load(self.rt, self.ordinal, &self.arch, self.wave).map_err(|e| match e {
                Error::Hip { detail } => detail,
                other => other.to_string(),
            })
        });
        let k = k.as_ref().map_err(|e| Error::Hip { detail: e.clone() })?;
        k.function(self.ordinal, kernel)
    }

    /// This device's hipBLAS handle (created on first use), or `None`
    /// without hipBLAS.
    fn blas(&self) -> Option<(&'static hipblas::Blas, std::sync::MutexGuard<'_, Option<BlasHandle>>)> {
        let lib = hipblas::blas()?;
        let mut g = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            self.bind().ok()?;
            *g = Some(BlasHandle(lib.create(self.stream.raw())?));
        }
        Some((lib, g))
    }
}

impl Drop for HipGpu {
    fn drop(&mut self) {
        if let Some(h) = self.blas.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            if let (Some(lib), Ok(())) = (hipblas::blas(), self.bind()) {
                // SAFETY: the handle was created by this device and is not used again.
                unsafe { lib.destroy(h.0) };
            }
        }
        // The stream is destroyed by its own drop, after this.
    }
}

impl Gpu for HipGpu {
    fn info(&self) -> GpuInfo {
        GpuInfo {
            name: self.name.clone(),
            memory_total: self.budget,
            multiprocessors: self.multiprocessors,
            memory_bandwidth: self.bandwidth,
            warp_size: self.wave,
            vendor: Vendor::Hip,
        }
    }

    fn physical(&self) -> Option<(Vendor, usize)> {
        Some((Vendor::Hip, self.ordinal))
    }

    fn bind_stream(&self) -> Result<*mut c_void> {
        self.bind()?;
        Ok(self.stream.raw().0)
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        let bytes = bytes.max(1);
        let used = self.used.fetch_add(bytes, Ordering::Relaxed);
        let oom = |why: String| {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            Error::Alloc { detail: format!("GPU {}: out of device memory: {bytes} bytes ({why})", self.ordinal) }
        };
        if used.checked_add(bytes).is_none_or(|end| end > self.budget) {
            return Err(oom(format!("{used} of this device's {} in use", self.budget)));
        }
        if let Err(e) = self.bind() {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return Err(e);
        }
        let p = match self.rt.malloc(bytes) {
            Ok(p) => p,
            Err(runtime::ERROR_OUT_OF_MEMORY) => return Err(oom("the runtime's".into())),
            Err(rc) => {
                self.used.fetch_sub(bytes, Ordering::Relaxed);
                return Err(self.rt.error(rc, &self.who(), &format!("hipMalloc({bytes})")));
            }
        };
        let release = |e: Error| {
            // SAFETY: the allocation just made, not handed out.
            let _ = unsafe { self.rt.free(p) };
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            e
        };
        if p % 256 != 0 {
            return Err(release(Error::Hip {
                detail: format!("GPU {}: hipMalloc returned {p:#x}, not 256-byte aligned", self.ordinal),
            }));
        }
        // SAFETY: the allocation just made, on this device's stream (later
        // work on the stream, and other devices' copies through events,
        // are ordered after the zero fill).
        let rc = unsafe { self.rt.memset_async(p, 0, bytes, &self.stream) };
        self.check(rc, "zero-filling a new buffer (hipMemsetD8Async)").map_err(release)?;
        self.sizes.lock().unwrap_or_else(|p| p.into_inner()).insert(p, bytes);
        Ok(p)
    }

    unsafe fn free(&self, ptr: DevPtr) {
        if let Some(n) = self.sizes.lock().unwrap_or_else(|p| p.into_inner()).remove(&ptr) {
            self.used.fetch_sub(n, Ordering::Relaxed);
            if self.bind().is_ok() {
                // SAFETY: allocated by `alloc`; the caller does not use it
                // again, and hipFree waits for the device's queued work.
                let _ = unsafe { self.rt.free(ptr) };
            }
        }
    }

    unsafe fn write(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // On this device's stream, so the copy is ordered with its kernels
        // (a synchronous copy would go to the null stream, which a
        // non-blocking stream does not wait for); the stream is synchronised
        // before returning, so `src` is no longer read afterwards.
        // SAFETY: the caller's range guarantee; `src` outlives the synchronisation.
        let rc = unsafe { self.rt.htod_async(dst, src, &self.stream) };
        self.check(rc, &format!("copy to device (hipMemcpyHtoDAsync, {} bytes)", src.len()))?;
        self.stream.synchronize("copy to device")
    }

    unsafe fn read(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return self.synchronize();
        }
        self.bind()?;
        let n = dst.len();
        // SAFETY: the caller's range guarantee; queued after this stream's
        // earlier work, and `dst` is written before the synchronisation returns.
        let rc = unsafe { self.rt.dtoh_async(dst, src, &self.stream) };
        self.check(rc, &format!("copy to host (hipMemcpyDtoHAsync, {n} bytes)"))?;
        self.stream.synchronize("a kernel or copy failed")
    }

    unsafe fn memset(&self, dst: DevPtr, value: u8, n: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's range guarantee; stream-ordered.
        let rc = unsafe { self.rt.memset_async(dst, value, n, &self.stream) };
        self.check(rc, &format!("hipMemsetD8Async({n} bytes)"))
    }

    unsafe fn launch(&self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        let f = self.function(kernel)?;
        self.bind()?;
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot()).collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        // SAFETY: `f` is a function of a module loaded on this GPU; each
        // parameter points to an 8-byte slot whose first bytes hold the
        // value (little-endian), alive until hipModuleLaunchKernel has
        // copied them (before it returns); the memory the kernel touches is
        // the caller's guarantee.
        let rc = unsafe { self.rt.launch(f, grid, block, &self.stream, &mut params) };
        self.check(rc, &format!("launching {kernel} grid {grid:?} block {block:?} (hipModuleLaunchKernel)"))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize("a kernel failed")
    }

    /// Stream-ordered on both sides with two events: this stream waits for
    /// what `from` has queued (`ready`), copies (device-to-device on one
    /// GPU, a peer copy between GPUs that can reach each other), and
    /// `from`'s stream waits for the copy (`done`) before its later work —
    /// a kernel overwriting the source, or its free. Neither stream blocks
    /// the host. `Ok(false)` when `from` is not a HIP device or the GPUs
    /// have no peer access (the caller copies through host memory).
    unsafe fn copy_from(&self, dst: DevPtr, from: &dyn Gpu, src: DevPtr, n: usize) -> Result<bool> {
        let Some(f) = from.as_any().downcast_ref::<HipGpu>() else { return Ok(false) };
        if n == 0 {
            return Ok(true);
        }
        let same = f.ordinal == self.ordinal;
        if !same && !self.rt.enable_peer(self.ordinal, f.ordinal)? {
            return Ok(false);
        }
        let what = |e: Error| match e {
            Error::Hip { detail } => {
                Error::Hip { detail: format!("GPU {} <- GPU {} ({n} bytes): {detail}", self.ordinal, f.ordinal) }
            }
            other => other,
        };
        // `ready` belongs to the source's GPU (recorded on its stream),
        // `done` to this one.
        let ready = Event::new(self.rt, f.ordinal).map_err(what)?;
        ready.record(&f.stream).map_err(what)?;
        self.bind().map_err(what)?;
        self.stream.wait(&ready).map_err(what)?;
        let rc = if same {
            // SAFETY: one GPU; the caller guarantees both ranges are live
            // allocations of at least `n` bytes; queued after the wait.
            unsafe { self.rt.dtod_async(dst, src, n, &self.stream) }
        } else {
            // SAFETY: `dst` is memory of this GPU and `src` of the source's,
            // both live for `n` bytes (the caller's guarantee); peer access
            // was enabled above; queued after the wait.
            unsafe { self.rt.peer_async(dst, self.ordinal, src, f.ordinal, n, &self.stream) }.map_err(what)?
        };
        let call = if same { "hipMemcpyDtoDAsync" } else { "hipMemcpyPeerAsync" };
        self.check(rc, call).map_err(what)?;
        let done = Event::new(self.rt, self.ordinal).map_err(what)?;
        done.record(&self.stream).map_err(what)?;
        f.bind().map_err(what)?;
        f.stream.wait(&done).map_err(what)?;
        Ok(true)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    unsafe fn gemm(&self, g: &Gemm) -> Result<bool> {
        if g.a_f16 {
            // hipBLAS's F32 GEMM only; the backend's kernels take F16 weights.
            return Ok(false);
        }
        let Some((lib, h)) = self.blas() else { return Ok(false) };
        let Some(h) = h.as_ref() else { return Ok(false) };
        self.bind()?;
        // SAFETY: the caller guarantees the matrices; the handle is bound to
        // this device's stream, so the GEMM is ordered with its kernels.
        let status = unsafe {
            lib.sgemm(h.0, (hipblas::OP_T, hipblas::OP_N), (g.m, g.n, g.k), (g.a, g.lda), (g.b, g.ldb), (g.c, g.ldc))
        };
        if status != 0 {
            return Err(Error::Hip {
                detail: format!(
                    "GPU {}: hipblasSgemm (m {}, n {}, k {}) failed: hipblasStatus_t {status} ({})",
                    self.ordinal, g.m, g.n, g.k, lib.soname
                ),
            });
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names_and_wave_sizes() {
        assert_eq!(base_arch("gfx90a:sramecc+:xnack-"), Some("gfx90a"));
        assert_eq!(base_arch("gfx1030"), Some("gfx1030"));
        for bad in
            ["", "gfx", "gfx9", "gfx90g", "gfxa00", "sm_90", "gfx90a:", "gfx90a:xnack", "gfx12345", "gfx90a:x y+"]
        {
            assert_eq!(base_arch(bad), None, "{bad}");
        }
        for (arch, w) in [
            ("gfx803", 64),
            ("gfx906", 64),
            ("gfx908", 64),
            ("gfx90a:xnack-", 64),
            ("gfx942", 64),
            ("gfx1010", 32),
            ("gfx1030", 32),
            ("gfx1100", 32),
            ("gfx1201", 32),
        ] {
            assert_eq!(wave_size(arch), Some(w), "{arch}");
        }
        assert_eq!(wave_size("gfx1300"), None);
        assert_eq!(wave_size("gfx500"), None);
        assert_eq!(hiprtc::options("gfx90a"), ["--offload-arch=gfx90a", "-std=c++17", "-O3"]);
    }

    /// Without a GPU (or without ROCm) every entry point is an `Err` that
    /// says why, never a panic.
    #[test]
    fn no_gpu_is_an_error() {
        match device_count() {
            Ok(n) => println!("hip: {n} AMD GPU(s)"),
            Err(e) => {
                let s = e.to_string();
                assert!(s.contains("no usable AMD GPU") || s.contains("no HIP runtime"), "{s}");
                assert!(HipGpu::open(0, 1).is_err());
                assert!(load_all_kernels(0).is_err());
            }
        }
        assert!(HipGpu::open(0, 0).is_err());
        assert!(HipGpu::open(0, 65).is_err());
    }

    /// hipRTC's errors name the file and architecture with its log; a
    /// malformed architecture never reaches hipRTC.
    #[test]
    fn hiprtc_errors_name_file_arch_and_log() {
        for bad in ["sm_90", "gfx90a:xnack+", "gfx1030:xnack+", "gfx90a:foo+", "gfx000", "gfx90a:", ""] {
            let e = hiprtc::compile("x", "", bad).unwrap_err().to_string();
            assert!(e.contains("x.cu") && e.contains("not a gfx processor"), "{bad}: {e}");
        }
        // Well-formed but unknown to this ROCm's compiler (ROCm 5.2's hipRTC
        // aborts the process on these): refused before hipRTC runs.
        if let Some(known) = hiprtc::known_processors() {
            assert!(known.iter().any(|k| k == "gfx90a"), "{known:?}");
            for unknown in ["gfx9ff", "gfx942", "gfx1100"].into_iter().filter(|a| !known.iter().any(|k| k == a)) {
                let e = hiprtc::compile("x", "", unknown).unwrap_err().to_string();
                assert!(e.contains("does not target"), "{unknown}: {e}");
            }
        }
        if let Err(e) = hiprtc::load() {
            // A failure where hipRTC is required (`.ci/run`; the tests'
            // `common/require.rs` reads the same variable).
            let var = "SHARDGRAPH_REQUIRE_HIPRTC";
            assert!(std::env::var_os(var).is_none(), "{var} is set but hipRTC is missing: {e}");
            println!("hip: hipRTC test SKIPPED: hipRTC is missing: {e} (set {var} to make this a failure)");
            return;
        }
        let src = "extern \"C\" __global__ void k(float *x) { x[0] = undefined_name; }";
        let e = hiprtc::compile("broken", src, "gfx90a").unwrap_err().to_string();
        assert!(e.contains("broken.cu") && e.contains("gfx90a") && e.contains("undefined_name"), "{e}");
        let ok = "extern \"C\" __global__ void sg_twice(float *x) { x[threadIdx.x] *= 2.0f; }";
        let code = hiprtc::compile("ok", ok, "gfx1030").unwrap();
        let k = code_object::elf_kernels(&code).unwrap();
        assert_eq!(k.len(), 1);
        assert_eq!((k[0].name.as_str(), k[0].wave_size), ("sg_twice", 32));
        assert!(hiprtc::is_cached(ok, "gfx1030") && !hiprtc::is_cached(ok, "gfx90a"));
    }
}
