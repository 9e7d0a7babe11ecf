//! The real GPU behind the `Gpu` interface, through the CUDA driver API
//! (cudarc's raw `result` layer). One `DriverGpu` per (virtual) device:
//! its own non-blocking stream on the GPU's primary context, its own memory
//! budget (a virtual device gets an equal share of the GPU's memory, so one
//! cannot starve the others). The context and the kernel modules (CUBIN
//! for the GPU's architecture) are the process's, kept per GPU by
//! [`super::device`]: every device of every executor on a GPU shares them.
//!
//! Work is queued on the stream in order; `read` and `synchronize` wait for
//! it. cuBLAS (`libcublas.so.13`, probed first) does F32 GEMM when present
//! and not switched off (`SHARDGRAPH_CUBLAS=0`: the backend's own GEMM
//! kernels run, as on a GPU without cuBLAS); its handle is created with
//! the device's context current and bound to the device's stream.
//!
//! A kernel fault surfaces at the next synchronisation; its error names
//! the last kernel queued on the stream. `SHARDGRAPH_GPU_SYNC_EACH_OP=1`
//! synchronises after every launch, so the failing kernel (and, through
//! the backend, its graph node) is named exactly (slow; for debugging).
//!
//! Run on a GPU for the first time on 2026-12-04 (an H200, driver 580,
//! CUDA 13.0, NVRTC 13.0: `scripts/gpu-check.sh`, 12 of 12 steps ok after
//! two fixes, see BENCHMARKS.md); the machines this crate is written on have
//! no GPU, so the emulator covers it between such checks.

use super::api::{DevPtr, Gemm, Gpu, GpuInfo, KArg, Vendor};
use super::device::Kernels;
use crate::error::{Error, Result};
use cudarc::driver::{result as cu, sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// One (virtual) device on a GPU.
pub(crate) struct DriverGpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The GPU's kernels (the process's, per GPU), fetched on first launch.
    kernels: OnceLock<Arc<Kernels>>,
    budget: usize,
    used: AtomicUsize,
    sizes: Mutex<HashMap<DevPtr, usize>>,
    cublas: Mutex<Option<CublasHandle>>,
    /// cuBLAS may be used (not switched off by `SHARDGRAPH_CUBLAS`).
    use_cublas: bool,
    /// Synchronise after every launch (`SHARDGRAPH_GPU_SYNC_EACH_OP`).
    sync_each_op: bool,
    /// The last kernel queued on the stream, for fault messages.
    last_kernel: Mutex<String>,
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

/// Environment variable `name` as a switch: `None` when unset or empty,
/// else on unless `0`, `off`, `false` or `no`.
fn env_on(name: &str) -> Option<bool> {
    let v = std::env::var(name).ok()?.trim().to_ascii_lowercase();
    (!v.is_empty()).then_some(!matches!(v.as_str(), "0" | "off" | "false" | "no"))
}

impl DriverGpu {
    /// `n` devices on GPU `ordinal`, each with its own stream and an equal
    /// share of the GPU's memory.
    pub(crate) fn open(ordinal: usize, n: usize) -> Result<Vec<DriverGpu>> {
        super::device::driver()?;
        super::nvrtc::load()?;
        let ctx = super::device::context(ordinal)?;
        let gpu = |what: &str| format!("GPU {ordinal}: {what}");
        let total = ctx.total_mem().map_err(|e| cuda_err(gpu("memory size"), e))?;
        let name = ctx.name().unwrap_or_else(|_| "NVIDIA GPU".into());
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| cuda_err(gpu("multiprocessor count"), e))?;
        let clock = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).unwrap_or(0);
        let bus = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH).unwrap_or(0);
        let bandwidth = super::api::peak_bandwidth(clock, bus);
        let use_cublas = env_on("SHARDGRAPH_CUBLAS").unwrap_or(true);
        let sync_each_op = env_on("SHARDGRAPH_GPU_SYNC_EACH_OP").unwrap_or(false);
        (0..n)
            .map(|_| {
                let stream = ctx.new_stream().map_err(|e| cuda_err(gpu("creating a stream"), e))?;
                Ok(DriverGpu {
                    ordinal,
                    ctx: ctx.clone(),
                    stream,
                    kernels: OnceLock::new(),
                    budget: super::api::device_budget(total, n),
                    used: AtomicUsize::new(0),
                    sizes: Mutex::new(HashMap::new()),
                    cublas: Mutex::new(None),
                    use_cublas,
                    sync_each_op,
                    last_kernel: Mutex::new(String::new()),
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

    /// The function for `kernel` (the GPU's kernels compiled and loaded on
    /// first use, once per process).
    fn function(&self, kernel: &str) -> Result<sys::CUfunction> {
        let k = match self.kernels.get() {
            Some(k) => k,
            None => {
                let k = super::device::kernels(self.ordinal)?;
                self.kernels.get_or_init(|| k)
            }
        };
        k.functions
            .get(kernel)
            .map(|f| f.cu_function())
            .ok_or_else(|| Error::Cuda { detail: format!("no kernel named {kernel} in kernels-cuda") })
    }

    /// Records `what` (a kernel's name, a library call) as the last work
    /// queued on this stream, for [`Self::fault`].
    fn queued(&self, what: &str) {
        let mut last = self.last_kernel.lock().unwrap_or_else(|p| p.into_inner());
        last.clear();
        last.push_str(what);
    }

    /// With `SHARDGRAPH_GPU_SYNC_EACH_OP`, waits for the stream and names
    /// `what` (the work just queued) when it failed.
    /// (`what` is formatted only then: launches are the hot path.)
    fn sync_if_asked(&self, what: impl FnOnce() -> String) -> Result<()> {
        if self.sync_each_op {
            // SAFETY: this device's live stream.
            unsafe { cu::stream::synchronize(self.stream.cu_stream()) }
                .map_err(|e| cuda_err(format!("GPU {}: {} failed", self.ordinal, what()), e))?;
        }
        Ok(())
    }

    /// The error of a failed synchronisation or copy `what`, naming the
    /// last kernel queued on this stream (a kernel fault shows up here; a
    /// fault is sticky for the whole context, so it can also be another
    /// stream's, e.g. another virtual device's).
    fn fault(&self, what: &str, e: impl std::fmt::Debug) -> Error {
        let last = self.last_kernel.lock().unwrap_or_else(|p| p.into_inner());
        let hint = if last.is_empty() {
            String::new()
        } else if self.sync_each_op {
            format!(" (the last kernel queued on this stream: {last})")
        } else {
            format!(
                " (the last kernel queued on this stream: {last}; SHARDGRAPH_GPU_SYNC_EACH_OP=1 names the failing one)"
            )
        };
        Error::Cuda { detail: format!("GPU {}: {what}: {e:?}{hint}", self.ordinal) }
    }

    /// This device's cuBLAS handle (created on first use, with the
    /// context current, bound to this device's stream), or `None` without
    /// cuBLAS or with it switched off.
    fn cublas(&self) -> Option<std::sync::MutexGuard<'_, Option<CublasHandle>>> {
        static PROBE: OnceLock<bool> = OnceLock::new();
        if !self.use_cublas {
            return None;
        }
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
            // cublasCreate attaches the handle to the current context's device.
            self.bind().ok()?;
            let h = std::panic::catch_unwind(cudarc::cublas::result::create_handle).ok()?.ok()?;
            // SAFETY: a fresh handle and this device's live stream.
            if unsafe { cudarc::cublas::result::set_stream(h, self.stream.cu_stream() as _) }.is_err() {
                // SAFETY: the handle just made, not used again.
                let _ = unsafe { cudarc::cublas::result::destroy_handle(h) };
                return None;
            }
            *g = Some(CublasHandle(h));
        }
        Some(g)
    }
}

impl Drop for DriverGpu {
    fn drop(&mut self) {
        if let Some(h) = self.cublas.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            // cuBLAS destroys a handle in the context it was made in.
            if self.bind().is_ok() {
                // SAFETY: the handle was created by this device and is not used again.
                let _ = unsafe { cudarc::cublas::result::destroy_handle(h.0) };
            }
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
        if let Err(e) = self.bind() {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return Err(e);
        }
        let s = self.stream.cu_stream();
        // SAFETY: this device's live stream; the memory is only used on it
        // (reads synchronise it).
        let mut r = unsafe { cu::malloc_async(s, bytes) };
        if r.as_ref().is_err_and(|e| e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY) {
            // Memory the pool keeps for reuse (freed on other streams) back
            // to the driver, then once more.
            super::device::trim_pool(&self.ctx);
            // SAFETY: as above.
            r = unsafe { cu::malloc_async(s, bytes) };
        }
        let p = match r {
            Ok(p) => p,
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => return Err(oom("the driver's".into())),
            Err(e) => {
                self.used.fetch_sub(bytes, Ordering::Relaxed);
                return Err(cuda_err(format!("GPU {}: cuMemAllocAsync({bytes})", self.ordinal), e));
            }
        };
        // SAFETY: the allocation just made, on the same stream.
        if let Err(e) = unsafe { cu::memset_d8_async(p, 0, bytes, s) } {
            // SAFETY: the allocation just made, not handed out; stream-ordered.
            let _ = unsafe { cu::free_async(p, s) };
            self.used.fetch_sub(bytes, Ordering::Relaxed);
            return Err(cuda_err(format!("GPU {}: zero-filling a new buffer of {bytes} bytes", self.ordinal), e));
        }
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
        unsafe { cu::memcpy_htod_async(dst, src, s) }.map_err(|e| self.fault("copy to device", e))?;
        // SAFETY: this device's live stream.
        unsafe { cu::stream::synchronize(s) }.map_err(|e| self.fault("copy to device", e))
    }

    unsafe fn read(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        let s = self.stream.cu_stream();
        // SAFETY: the caller's range guarantee; queued after this stream's
        // earlier work, and `dst` is written before the synchronisation returns.
        unsafe { cu::memcpy_dtoh_async(dst, src, s) }.map_err(|e| self.fault("copy to host", e))?;
        // SAFETY: this device's live stream.
        unsafe { cu::stream::synchronize(s) }.map_err(|e| self.fault("a kernel or copy failed", e))
    }

    unsafe fn memset(&self, dst: DevPtr, value: u8, n: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's range guarantee; stream-ordered.
        unsafe { cu::memset_d8_async(dst, value, n, self.stream.cu_stream()) }.map_err(|e| cuda_err("memset", e))
    }

    /// With `SHARDGRAPH_GPU_SYNC_EACH_OP`, waits for the kernel and names it
    /// (launch shape too) when it faults.
    unsafe fn launch(&self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        let f = self.function(kernel)?;
        self.bind()?;
        self.queued(kernel);
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
        .map_err(|e| cuda_err(format!("GPU {}: launching {kernel} grid {grid:?} block {block:?}", self.ordinal), e))?;
        self.sync_if_asked(|| format!("kernel {kernel} grid {grid:?} block {block:?}"))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: this device's live stream.
        unsafe { cu::stream::synchronize(self.stream.cu_stream()) }.map_err(|e| self.fault("a kernel failed", e))
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
        // (Addresses modulo 16: cuBLAS picks vectorized kernels by them.)
        let what = || {
            format!(
                "cublasGemmEx m {} n {} k {} lda {} ldb {} ldc {} (a, b, c mod 16: {}, {}, {})",
                g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                g.ldc,
                g.a % 16,
                g.b % 16,
                g.c % 16
            )
        };
        // The call's shape is formatted only for an error (cuBLAS calls are
        // on the hot path); the fault message names the call.
        self.queued("cublasGemmEx");
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
        .map_err(|e| cuda_err(format!("GPU {}: {}", self.ordinal, what()), e))?;
        self.sync_if_asked(what)?;
        Ok(true)
    }
}
