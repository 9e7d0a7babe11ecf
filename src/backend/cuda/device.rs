//! The CUDA driver: whether it is there, its version, how many GPUs it
//! sees, and, per GPU, what the process keeps for its whole life: the
//! primary context (retained once, so it is not torn down and rebuilt
//! whenever the last device of an executor drops) with its stream-ordered
//! memory pool set to keep freed memory for reuse, and the kernel modules
//! ([`KERNEL_SOURCES`](super::nvrtc::KERNEL_SOURCES) compiled by NVRTC for
//! the GPU, see [`super::nvrtc`]) loaded once.

use super::nvrtc;
use crate::error::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaContext, CudaModule};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Probes `libcuda.so.1` (the driver) once per process, so a machine
/// without a GPU gets an error here instead of cudarc's panic.
///
/// # Errors
/// [`Error::Cuda`] when the driver library cannot be loaded.
pub fn driver() -> Result<()> {
    static PROBE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| {
            // SAFETY: loading the driver library runs its initialisers, which
            // have no preconditions; the handle is leaked so it stays loaded
            // for cudarc, which binds symbols from it by name.
            match unsafe { libloading::Library::new("libcuda.so.1") } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    Ok(())
                }
                Err(e) => Err(format!("no CUDA driver (libcuda.so.1: {e}); this machine has no usable NVIDIA GPU")),
            }
        })
        .clone()
        .map_err(|detail| Error::Cuda { detail })
}

/// The CUDA version the driver supports, `(major, minor)` (`(13, 0)` for
/// a CUDA 13.0 driver such as 580).
///
/// # Errors
/// [`Error::Cuda`] without a driver, or when it cannot be asked.
pub fn driver_version() -> Result<(i32, i32)> {
    driver()?;
    let mut v = 0;
    // SAFETY: writes one int; the driver library is loaded (probed above).
    let r = std::panic::catch_unwind(move || unsafe { sys::cuDriverGetVersion(&mut v) }.result().map(|_| v));
    match r {
        Ok(Ok(v)) => Ok((v / 1000, v % 1000 / 10)),
        Ok(Err(e)) => Err(Error::Cuda { detail: format!("cuDriverGetVersion: {e:?}") }),
        Err(_) => Err(Error::Cuda { detail: "the CUDA driver could not be bound (cudarc panicked)".into() }),
    }
}

/// Number of CUDA devices the driver reports.
///
/// # Errors
/// [`Error::Cuda`] without a driver, or when the driver fails to
/// initialise (its error named).
pub fn device_count() -> Result<usize> {
    driver()?;
    match std::panic::catch_unwind(cudarc::driver::CudaContext::device_count) {
        Ok(Ok(n)) => Ok(n.max(0) as usize),
        Ok(Err(e)) => Err(Error::Cuda { detail: format!("cuInit/cuDeviceGetCount: {e:?}") }),
        Err(_) => Err(Error::Cuda { detail: "the CUDA driver could not be bound (cudarc panicked)".into() }),
    }
}

/// GPU `ordinal`'s primary context, retained once and kept for the
/// process (every device on the GPU shares it). The first time, the
/// GPU's default memory pool (the one `cuMemAllocAsync` draws from) is set
/// to keep freed memory for reuse (release threshold `u64::MAX`) instead
/// of returning it to the driver at every synchronisation.
///
/// # Errors
/// [`Error::Cuda`] without a driver, for an ordinal the driver does not
/// have, or when the context cannot be created.
pub(crate) fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    static KEPT: Mutex<Vec<(usize, Arc<CudaContext>)>> = Mutex::new(Vec::new());
    driver()?;
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = kept.iter().find(|(o, _)| *o == ordinal) {
        return Ok(c.clone());
    }
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::Cuda { detail: format!("GPU {ordinal} requested; the driver sees {count}") });
    }
    let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|_| Error::Cuda { detail: format!("GPU {ordinal}: the CUDA driver could not be bound") })?
        .map_err(|e| Error::Cuda { detail: format!("GPU {ordinal}: creating a context: {e:?}") })?;
    if let Err(e) = keep_freed_memory(&ctx) {
        log::warn!("GPU {ordinal}: the memory pool's release threshold was not set: {e:?}");
    }
    kept.push((ordinal, ctx.clone()));
    Ok(ctx)
}

/// Sets the release threshold of the GPU's default memory pool to `u64::MAX`.
fn keep_freed_memory(ctx: &CudaContext) -> std::result::Result<(), cu::DriverError> {
    use sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED as POOLS;
    if ctx.attribute(POOLS)? == 0 {
        return Ok(());
    }
    // SAFETY: the context's own device handle.
    let pool = unsafe { cu::device::get_default_mem_pool(ctx.cu_device()) }?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the device's default pool; the release threshold is a u64
    // (cuuint64_t), read during the call.
    unsafe {
        cu::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut std::ffi::c_void,
        )
    }
}

/// Returns the unused memory of GPU `ordinal`'s default pool to the
/// driver (after an allocation failed: freed memory kept for reuse by
/// one stream may be what another needs).
pub(crate) fn trim_pool(ctx: &CudaContext) {
    // SAFETY: the context's own device handle.
    if let Ok(pool) = unsafe { cu::device::get_default_mem_pool(ctx.cu_device()) } {
        // SAFETY: the device's default pool.
        let _ = unsafe { cu::mem_pool::trim_to(pool, 0) };
    }
}

/// Every kernel of one GPU, loaded into its primary context.
pub(crate) struct Kernels {
    /// What was loaded: the architecture and CUBIN or PTX.
    pub(crate) target: nvrtc::Target,
    /// Kernel name → function (each holds its module alive).
    pub(crate) functions: HashMap<String, cudarc::driver::CudaFunction>,
    /// Seconds the compiles (or cache reads) and loads took.
    pub(crate) seconds: f64,
}

/// GPU `ordinal`'s compute capability, `(major, minor)`.
fn compute_capability(ctx: &CudaContext) -> std::result::Result<(i32, i32), cu::DriverError> {
    use sys::CUdevice_attribute as A;
    Ok((
        ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// GPU `ordinal`'s kernels, compiled (NVRTC, once per process and key,
/// the files in parallel; see [`super::nvrtc::compile`]) and loaded once
/// per process: the CUBIN for the GPU's architecture, or the PTX on a GPU
/// newer than NVRTC knows ([`super::nvrtc::target_for`]). A failure is
/// kept too (the same error for every later request).
///
/// # Errors
/// [`Error::Cuda`] naming the GPU and the kernel file or entry that failed
/// to compile, load or resolve; no driver, NVRTC or device.
pub(crate) fn kernels(ordinal: usize) -> Result<Arc<Kernels>> {
    type Slot = Arc<OnceLock<std::result::Result<Arc<Kernels>, String>>>;
    static KEPT: Mutex<Vec<(usize, Slot)>> = Mutex::new(Vec::new());
    let slot = {
        let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        match kept.iter().find(|(o, _)| *o == ordinal) {
            Some((_, s)) => s.clone(),
            None => {
                let s = Slot::default();
                kept.push((ordinal, s.clone()));
                s
            }
        }
    };
    slot.get_or_init(|| {
        load_kernels(ordinal).map(Arc::new).map_err(|e| match e {
            Error::Cuda { detail } => detail,
            other => other.to_string(),
        })
    })
    .clone()
    .map_err(|detail| Error::Cuda { detail })
}

fn load_kernels(ordinal: usize) -> Result<Kernels> {
    let t0 = std::time::Instant::now();
    let ctx = context(ordinal)?;
    let bad = |what: String| Error::Cuda { detail: format!("GPU {ordinal}: {what}") };
    let (major, minor) = compute_capability(&ctx).map_err(|e| bad(format!("compute capability: {e:?}")))?;
    let target = nvrtc::target_for(major, minor)?;
    let arch = target.arch.as_str();
    // NVRTC compiles the files in parallel (one thread each); loading is serial.
    let compiled: Vec<Result<Arc<nvrtc::Compiled>>> = std::thread::scope(|sc| {
        let hs: Vec<_> = nvrtc::KERNEL_SOURCES
            .iter()
            .map(|&(name, src)| sc.spawn(move || nvrtc::compile(name, src, arch)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Cuda { detail: "NVRTC thread panicked".into() })))
            .collect()
    });
    let mut functions = HashMap::new();
    for (&(name, _), c) in nvrtc::KERNEL_SOURCES.iter().zip(compiled) {
        let c = c?;
        let image = if target.cubin {
            cudarc::nvrtc::Ptx::from_binary(c.cubin.clone())
        } else {
            cudarc::nvrtc::Ptx::from_src(c.ptx.clone())
        };
        let module: Arc<CudaModule> = ctx.load_module(image).map_err(|e| {
            let how = if target.cubin { "CUBIN" } else { "PTX (driver JIT)" };
            let hint = if e.0 == sys::cudaError_enum::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                let drv = driver_version().map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|_| "?".into());
                format!(
                    " (the driver supports CUDA {drv}, older than this NVRTC: use an NVRTC no newer than the driver)"
                )
            } else {
                String::new()
            };
            bad(format!("loading kernels-cuda/{name}.cu ({arch}, {how}): {e:?}{hint}"))
        })?;
        for f in c.entries() {
            let func = module.load_function(&f).map_err(|e| bad(format!("{name}.cu: kernel {f}: {e:?}")))?;
            if functions.insert(f.clone(), func).is_some() {
                return Err(bad(format!("kernel {f} is defined twice (again in {name}.cu)")));
            }
        }
    }
    Ok(Kernels { target, functions, seconds: t0.elapsed().as_secs_f64() })
}

/// Compiles every kernel family for device `ordinal`'s architecture (or
/// reads them from the caches), loads each module onto the device — CUBIN
/// for the device's architecture, PTX only on a GPU newer than NVRTC
/// knows — and resolves every entry point: the GPU-side half of the
/// kernel check. Returns the number of kernels resolved.
///
/// # Errors
/// [`Error::Cuda`] naming the device and the kernel file or entry that
/// failed; no driver or device.
pub fn load_all_kernels(ordinal: usize) -> Result<usize> {
    Ok(kernels(ordinal)?.functions.len())
}

/// One line about GPU `ordinal` and what the process loaded for it: its
/// name, compute capability, memory, the driver's CUDA version, and the
/// kernels (architecture, CUBIN or PTX, count, seconds to compile or read
/// and load) — loading them if not yet done.
///
/// # Errors
/// As [`load_all_kernels`].
pub fn describe_device(ordinal: usize) -> Result<String> {
    let ctx = context(ordinal)?;
    let bad = |e: cu::DriverError| Error::Cuda { detail: format!("GPU {ordinal}: {e:?}") };
    let (major, minor) = compute_capability(&ctx).map_err(bad)?;
    let total = ctx.total_mem().map_err(bad)?;
    let (dmaj, dmin) = driver_version()?;
    let k = kernels(ordinal)?;
    Ok(format!(
        "GPU {ordinal}: {}, compute capability {major}.{minor}, {:.1} GiB; driver CUDA {dmaj}.{dmin}; \
         {} kernels loaded as {} for {} in {:.2} s",
        ctx.name().unwrap_or_else(|_| "?".into()),
        total as f64 / (1u64 << 30) as f64,
        k.functions.len(),
        if k.target.cubin { "CUBIN" } else { "PTX (driver JIT)" },
        k.target.arch,
        k.seconds
    ))
}
