//! The real GPU behind the `Gpu` interface, through the CUDA driver API
//! (cudarc's raw `result` layer). One `DriverGpu` per (virtual) device:
//! its own non-blocking stream on the GPU's primary context, its own memory
//! budget (a virtual device gets an equal share of the GPU's memory, so one
//! cannot starve the others), and the kernel modules compiled by NVRTC for
//! the GPU's compute capability and loaded once per context.
//!
//! Work is queued on the stream in order; `read` and `synchronize` wait for
//! it. cuBLAS (`libcublas.so.13`, probed first) does F32/F16 GEMM when
//! present; without it the backend uses its own kernels.
//!
//! This file has only been compiled, never run: the machines this crate was
//! written on have no GPU (`scripts/gpu-check.sh` runs it on one).

use super::api::{DevPtr, Gemm, Gpu, GpuInfo, KArg, Vendor};
use crate::error::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaContext, CudaModule, CudaStream};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Kernels of one context: name → function (modules kept alive with them).
#[derive(Default)]
struct Kernels {
    modules: Vec<Arc<CudaModule>>,
    functions: HashMap<String, cudarc::driver::CudaFunction>,
}

/// One (virtual) device on a GPU.
pub(crate) struct DriverGpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Arc<OnceLock<std::result::Result<Mutex<Kernels>, String>>>,
    budget: usize,
    used: AtomicUsize,
    sizes: Mutex<HashMap<DevPtr, usize>>,
    cublas: Mutex<Option<CublasHandle>>,
    name: String,
    multiprocessors: u32,
    bandwidth: f64,
}

/// A cuBLAS handle bound to one stream.
struct CublasHandle(cudarc::cublas::sys::cublasHandle_t);
// SAFETY: the handle is only used under the `cublas` mutex of its device.
unsafe impl Send for CublasHandle {}

impl std::fmt::Debug for DriverGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DriverGpu(GPU {}, {})", self.ordinal, self.name)
    }
}

fn cuda_err(what: impl std::fmt::Display, e: impl std::fmt::Debug) -> Error {
    Error::Cuda { detail: format!("{what}: {e:?}") }
}

impl DriverGpu {
    /// `n` devices on GPU `ordinal`, each with its own stream and an equal
    /// share of the GPU's memory.
    pub(crate) fn open(ordinal: usize, n: usize) -> Result<Vec<DriverGpu>> {
        super::device::driver()?;
        super::nvrtc::load()?;
        let count = super::device::device_count()?;
        if ordinal >= count {
            return Err(Error::Cuda { detail: format!("GPU {ordinal} requested; the driver sees {count}") });
        }
        let gpu = |what: &str| format!("GPU {ordinal}: {what}");
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
            .map_err(|_| Error::Cuda { detail: gpu("the CUDA driver could not be bound") })?
            .map_err(|e| cuda_err(gpu("creating a context"), e))?;
        let total = ctx.total_mem().map_err(|e| cuda_err(gpu("memory size"), e))?;
        let name = ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into());
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| cuda_err(gpu("multiprocessor count"), e))?;
        let clock = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).unwrap_or(0);
        let bus = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).unwrap_or(0);
        let bandwidth = super::api::peak_bandwidth(clock, bus);
        let kernels = Arc::new(OnceLock::new());
        (0..n)
            .map(|_| {
                let stream = ctx.new_stream().map_err(|e| cuda_err(gpu("creating a stream"), e))?;
                Ok(DriverGpu {
                    ordinal,
                    ctx: ctx.clone(),
                    stream,
                    kernels: kernels.clone(),
                    budget: super::api::device_budget(total, n),
                    used: AtomicUsize::new(0),
                    sizes: Mutex::new(HashMap::new()),
                    cublas: Mutex::new(None),
                    name: name.clone(),
                    multiprocessors: sms.max(1) as u32,
                    bandwidth,
                })
            })
            .collect()
    }

    /// Makes the GPU's context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| cuda_err(format!("GPU {}: binding the context", self.ordinal), e))
    }

    fn arch(&self) -> Result<&'static str> {
        use sys::CUdevice_attribute as A;
        let major = self
            .ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(|e| cuda_err("compute capability", e))?;
        let minor = self
            .ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .map_err(|e| cuda_err("compute capability", e))?;
        Ok(super::device::arch_name(major, minor))
    }

    /// The function for `kernel`, compiling and loading every family on first use.
    fn function(&self, kernel: &str) -> Result<sys::CUfunction> {
        let k = self.kernels.get_or_init(|| {
            let load = || -> Result<Kernels> {
                let arch = self.arch()?;
                let mut ks = Kernels::default();
                // NVRTC compiles the files in parallel (one thread each); loading is serial.
                let ptxs: Vec<Result<String>> = std::thread::scope(|sc| {
                    let hs: Vec<_> = super::nvrtc::KERNEL_SOURCES
                        .iter()
                        .map(|&(fam, src)| sc.spawn(move || super::nvrtc::compile(fam, src, arch)))
                        .collect();
                    hs.into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| Err(Error::Cuda { detail: "NVRTC thread panicked".into() }))
                        })
                        .collect()
                });
                for (&(fam, _), ptx) in super::nvrtc::KERNEL_SOURCES.iter().zip(ptxs) {
                    let ptx = ptx?;
                    let names = super::nvrtc::entries(&ptx);
                    let module = self
                        .ctx
                        .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                        .map_err(|e| cuda_err(format!("loading kernels-cuda/{fam}.cu ({arch})"), e))?;
                    for n in names {
                        let f = module.load_function(&n).map_err(|e| cuda_err(format!("{fam}.cu: {n}"), e))?;
                        ks.functions.insert(n, f);
                    }
                    ks.modules.push(module);
                }
                Ok(ks)
            };
            load().map(Mutex::new).map_err(|e| e.to_string())
        });
        let k = k.as_ref().map_err(|e| Error::Cuda { detail: format!("GPU {}: {e}", self.ordinal) })?;
        let k = k.lock().unwrap_or_else(|p| p.into_inner());
        k.functions
            .get(kernel)
            .map(|f| f.cu_function())
            .ok_or_else(|| Error::Cuda { detail: format!("no kernel named {kernel} in kernels-cuda") })
    }

    fn cublas(&self) -> Option<std::sync::MutexGuard<'_, Option<CublasHandle>>> {
        static PROBE: OnceLock<bool> = OnceLock::new();
        let present = *PROBE.get_or_init(|| {
            // SAFETY: loading cuBLAS runs its initialisers (no preconditions);
            // leaked so cudarc's later load by the same name finds it.
            ["libcublasLt.so.13", "libcublas.so.13"].iter().all(|l| match unsafe { libloading::Library::new(l) } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    true
                }
                Err(_) => false,
            })
        });
        if !present {
            return None;
        }
        let mut g = self.cublas.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            let h = std::panic::catch_unwind(cudarc::cublas::result::create_handle).ok()?.ok()?;
            // SAFETY: a fresh handle and this device's live stream.
            unsafe { cudarc::cublas::result::set_stream(h, self.stream.cu_stream() as _) }.ok()?;
            *g = Some(CublasHandle(h));
        }
        Some(g)
    }
}

impl Drop for DriverGpu {
    fn drop(&mut self) {
        if let Some(h) = self.cublas.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // SAFETY: the handle was created by this device and is not used again.
            let _ = unsafe { cudarc::cublas::result::destroy_handle(h.0) };
        }
    }
}

impl Gpu for DriverGpu {
    fn info(&self) -> GpuInfo {
        GpuInfo {
            name: self.name.clone(),
            memory_total: self.budget,
            multiprocessors: self.multiprocessors,
            memory_bandwidth: self.bandwidth,
            warp_size: 32,
            vendor: Vendor::Cuda,
        }
    }

    fn physical(&self) -> Option<(Vendor, usize)> {
        Some((Vendor::Cuda, self.ordinal))
    }

    fn bind_stream(&self) -> Result<*mut c_void> {
        self.bind()?;
        Ok(self.stream.cu_stream() as *mut c_void)
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
        self.bind()?;
        // SAFETY: this device's live stream; the memory is only used on it
        // (reads synchronise it).
        let p = match unsafe { cu::malloc_async(self.stream.cu_stream(), bytes) } {
            Ok(p) => p,
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => return Err(oom("the driver's".into())),
            Err(e) => {
                self.used.fetch_sub(bytes, Ordering::Relaxed);
                return Err(cuda_err(format!("GPU {}: cuMemAllocAsync({bytes})", self.ordinal), e));
            }
        };
        // SAFETY: the allocation just made, on the same stream.
        unsafe { cu::memset_d8_async(p, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| cuda_err("zero-filling a new buffer", e))?;
        self.sizes.lock().unwrap_or_else(|p| p.into_inner()).insert(p, bytes);
        Ok(p)
    }

    unsafe fn free(&self, ptr: DevPtr) {
        if let Some(n) = self.sizes.lock().unwrap_or_else(|p| p.into_inner()).remove(&ptr) {
            self.used.fetch_sub(n, Ordering::Relaxed);
            if self.bind().is_ok() {
                // SAFETY: allocated on this stream by `alloc`; the caller does not use it again.
                let _ = unsafe { cu::free_async(ptr, self.stream.cu_stream()) };
            }
        }
    }

    unsafe fn write(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.bind()?;
        let s = self.stream.cu_stream();
        // On this device's stream, so the copy is ordered with its kernels
        // (a synchronous copy would go to the legacy stream, which a
        // non-blocking stream does not wait for); the stream is synchronised
        // before returning, so `src` is no longer read afterwards.
        // SAFETY: the caller's range guarantee; `src` outlives the synchronisation.
        unsafe { cu::memcpy_htod_async(dst, src, s) }
            .map_err(|e| cuda_err(format!("GPU {}: copy to device", self.ordinal), e))?;
        // SAFETY: this device's live stream.
        unsafe { cu::stream::synchronize(s) }.map_err(|e| cuda_err(format!("GPU {}: copy to device", self.ordinal), e))
    }

    unsafe fn read(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        let s = self.stream.cu_stream();
        // SAFETY: the caller's range guarantee; queued after this stream's
        // earlier work, and `dst` is written before the synchronisation returns.
        unsafe { cu::memcpy_dtoh_async(dst, src, s) }
            .map_err(|e| cuda_err(format!("GPU {}: copy to host", self.ordinal), e))?;
        // SAFETY: this device's live stream.
        unsafe { cu::stream::synchronize(s) }
            .map_err(|e| cuda_err(format!("GPU {}: a kernel or copy failed", self.ordinal), e))
    }

    unsafe fn memset(&self, dst: DevPtr, value: u8, n: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's range guarantee; stream-ordered.
        unsafe { cu::memset_d8_async(dst, value, n, self.stream.cu_stream()) }.map_err(|e| cuda_err("memset", e))
    }

    unsafe fn launch(&self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        let f = self.function(kernel)?;
        self.bind()?;
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot()).collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        // SAFETY: `f` is a loaded function of this context; the parameter
        // slots live until cuLaunchKernel has copied them (it does so before
        // returning); the memory the kernel touches is the caller's guarantee.
        unsafe {
            cu::launch_kernel(
                f,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| cuda_err(format!("GPU {}: launching {kernel} grid {grid:?} block {block:?}", self.ordinal), e))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: this device's live stream.
        unsafe { cu::stream::synchronize(self.stream.cu_stream()) }
            .map_err(|e| cuda_err(format!("GPU {}: a kernel failed", self.ordinal), e))
    }

    /// Stream-ordered on both sides with two events: this stream waits for
    /// what `from` has queued (`ready`), copies (device-to-device within one
    /// context, a peer copy between GPUs), and `from`'s stream waits for the
    /// copy (`done`) before its later work — a kernel overwriting the source
    /// or the source's `free_async`. Neither stream blocks the host.
    unsafe fn copy_from(&self, dst: DevPtr, from: &dyn Gpu, src: DevPtr, n: usize) -> Result<bool> {
        let Some(f) = from.as_any().downcast_ref::<DriverGpu>() else { return Ok(false) };
        if n == 0 {
            return Ok(true);
        }
        let what = |step: &str| format!("GPU {} <- GPU {}: {step} ({n} bytes)", self.ordinal, f.ordinal);
        let (mine, theirs) = (self.stream.cu_stream(), f.stream.cu_stream());
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let wait = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // `ready` belongs to the source's context (an event is recorded on a
        // stream of its own context), `done` to this one.
        f.bind()?;
        let ready = cu::event::create(flags).map_err(|e| cuda_err(what("creating an event"), e))?;
        // SAFETY: a fresh event and the source device's live stream.
        let r = unsafe { cu::event::record(ready, theirs) }.map_err(|e| cuda_err(what("recording"), e));
        let r = r.and_then(|_| {
            self.bind()?;
            // SAFETY: this device's live stream and the event just recorded.
            unsafe { cu::stream::wait_event(mine, ready, wait) }.map_err(|e| cuda_err(what("waiting"), e))?;
            // Both copies are queued on this device's stream, after the wait
            // on `ready` above.
            if Arc::ptr_eq(&self.ctx, &f.ctx) {
                // SAFETY: one shared context; the caller guarantees `src` and
                // `dst` are live allocations of at least `n` bytes each.
                unsafe { cu::memcpy_dtod_async(dst, src, n, mine) }
            } else {
                // SAFETY: `dst` is in this device's context and `src` in the
                // source's, both live for at least `n` bytes (the caller's range
                // guarantees); `mine` is this device's live stream.
                unsafe { cu::memcpy_peer_async(self.ctx.cu_ctx(), dst, f.ctx.cu_ctx(), src, n, mine) }
            }
            .map_err(|e| cuda_err(what("copying"), e))?;
            let done = cu::event::create(flags).map_err(|e| cuda_err(what("creating an event"), e))?;
            // SAFETY: a fresh event of this context; both live streams.
            let r = unsafe { cu::event::record(done, mine) }
                .and_then(|_| unsafe { cu::stream::wait_event(theirs, done, wait) })
                .map_err(|e| cuda_err(what("ordering the source after the copy"), e));
            // SAFETY: destroying a recorded event releases it once it completes.
            let _ = unsafe { cu::event::destroy(done) };
            r
        });
        // SAFETY: as above.
        let _ = unsafe { cu::event::destroy(ready) };
        r.map(|_| true)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    unsafe fn gemm(&self, g: &Gemm) -> Result<bool> {
        use cudarc::cublas::sys as b;
        if g.a_f16 {
            // cuBLAS needs both operands in F16; the backend converts activations itself.
            return Ok(false);
        }
        let Some(h) = self.cublas() else { return Ok(false) };
        let Some(h) = h.as_ref() else { return Ok(false) };
        self.bind()?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller guarantees the matrices; alpha/beta are host scalars
        // read during the call; the handle is bound to this device's stream.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                h.0,
                b::cublasOperation_t::CUBLAS_OP_T,
                b::cublasOperation_t::CUBLAS_OP_N,
                g.m,
                g.n,
                g.k,
                &alpha as *const f32 as *const c_void,
                g.a as *const c_void,
                b::cudaDataType::CUDA_R_32F,
                g.lda,
                g.b as *const c_void,
                b::cudaDataType::CUDA_R_32F,
                g.ldb,
                &beta as *const f32 as *const c_void,
                g.c as *mut c_void,
                b::cudaDataType::CUDA_R_32F,
                g.ldc,
                b::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                b::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| cuda_err(format!("GPU {}: cublasGemmEx", self.ordinal), e))?;
        Ok(true)
    }
}
