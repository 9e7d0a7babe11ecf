//! The CUDA driver: whether it is there, and how many GPUs it sees.

use crate::error::{Error, Result};

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

/// Compiles every kernel family for device `ordinal`'s compute capability,
/// loads each module onto the device and resolves every entry point: the
/// GPU-side half of the kernel check (the PTX is JIT-compiled by the
/// driver). Returns the number of kernels resolved.
///
/// # Errors
/// [`Error::Cuda`] naming the device and the kernel file or entry that
/// failed; no driver or device.
pub fn load_all_kernels(ordinal: usize) -> Result<usize> {
    use cudarc::driver::{sys::CUdevice_attribute as A, CudaContext};
    driver()?;
    let bad = |what: String| Error::Cuda { detail: format!("device {ordinal}: {what}") };
    let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|_| bad("the CUDA driver could not be bound".into()))?
        .map_err(|e| bad(format!("cannot create a context: {e:?}")))?;
    let major = ctx
        .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(|e| bad(format!("compute capability: {e:?}")))?;
    let minor = ctx
        .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .map_err(|e| bad(format!("compute capability: {e:?}")))?;
    let arch = arch_name(major, minor);
    let mut n = 0;
    for &(name, src) in super::nvrtc::KERNEL_SOURCES {
        let ptx = super::nvrtc::compile(name, src, arch)?;
        let entries = super::nvrtc::entries(&ptx);
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(|e| bad(format!("loading kernels-cuda/{name}.cu ({arch}): {e:?}")))?;
        for f in entries {
            module.load_function(&f).map_err(|e| bad(format!("{name}.cu: kernel {f}: {e:?}")))?;
            n += 1;
        }
    }
    Ok(n)
}

/// The NVRTC architecture kernels are compiled for on a device of compute
/// capability `major.minor` (newer devices run sm_90 PTX by JIT).
pub(crate) fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (9, _) => "sm_90",
        (8, 9) => "sm_89",
        (8, 6) => "sm_86",
        (8, _) => "sm_80",
        (m, _) if m >= 10 => "sm_90",
        _ => "sm_75",
    }
}
