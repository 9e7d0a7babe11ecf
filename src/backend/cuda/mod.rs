//! The GPU backend: NVIDIA GPUs through CUDA (cargo feature `cuda`) and
//! AMD GPUs through HIP (cargo feature `hip`), one Rust code base and one
//! kernel source for both. Kernel sources live in `kernels-cuda/`; CUDA
//! compiles them with NVRTC (`nvrtc`: CUBIN for the GPU's architecture,
//! once per process per architecture, source hash and NVRTC version, and
//! kept on disk), HIP with hipRTC behind the portability header
//! `kernels-hip/sg_hip.h` (`hip`), both at first use ([`sources`] embeds
//! them); each NVIDIA GPU's context and loaded kernels are the process's
//! (`device`). The
//! op dispatch (`ops/`) has one file per op family
//! ([`crate::ops::OpFamily`]); its module doc maps each family to the `.cu`
//! files its kernels live in. The vendor libraries (cudarc for CUDA; the
//! HIP runtime, hipRTC, hipBLAS and RCCL by `libloading`) are loaded at run
//! time, so the crate builds and its tests run on a machine with no GPU and
//! no toolkit: a missing library or GPU is an [`Error::Cuda`] or
//! [`Error::Hip`], never a panic.
//!
//! A [`CudaBackend`] drives one device through the internal `Gpu`
//! interface, implemented three times: a real NVIDIA GPU (`driver.rs`:
//! `CudaBackend::new`, one stream and memory pool per instance, so
//! `CudaBackend::virtual_devices` puts several devices on one GPU), a real
//! AMD GPU (`hip/`: `CudaBackend::hip`, `CudaBackend::hip_virtual_devices`,
//! named `HIP<i>`), or, with the `cuda-emu` feature, an emulated one
//! (`emu.rs`: `CudaBackend::emulated` for a CUDA device with 32-wide warps,
//! `CudaBackend::emulated_hip` for a CDNA device with 64-wide waves) that
//! runs the same kernel sources as host C++ — the same op dispatch, launch
//! shapes and arguments, testable anywhere. Everything above `Gpu` (buffers,
//! dispatch, device-to-device copies, the meta backend's collectives) is
//! the same code for every vendor.
//!
//! `compute` launches one kernel (or a few) per node ([`CudaBackend::supports_op`]
//! says which nodes have kernels); a node without a kernel for its types
//! runs on the host with the CPU backend's kernel (its operands copied
//! through host memory), counted in [`CudaStats`], so no graph fails for
//! lack of a kernel. Kernels are queued on the device's stream; `compute`
//! waits for them once at its end, then reads the graph's error flags
//! (indices out of range) in one copy.
//!
//! Status: the emulator runs every op through this code in the tests, as
//! CUDA and as HIP (CDNA) devices. The CUDA path (`driver.rs`: cudarc,
//! cuBLAS) has run on an NVIDIA H200 (`scripts/gpu-check.sh`, 2026-12-04:
//! every step ok, virtual devices of the one GPU; NCCL between GPUs needs
//! two and has not run); the HIP path (`hip/`: the HIP runtime, hipRTC,
//! hipBLAS) has been compiled but not yet run on an AMD GPU
//! (`SHARDGRAPH_GPU=hip scripts/gpu-check.sh`). The meta backend keeps activations on the devices and moves them
//! with stream-ordered device-to-device copies, or NCCL/RCCL across GPUs
//! (`split::NcclComm`, compiled but not yet run, which reaches the device
//! through [`CudaBackend`]'s `RawDevice`: the GPU's vendor, ordinal and
//! stream, and its buffers' addresses). Not written: CUDA/HIP graphs.

mod api;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod device;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda-emu")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda-emu")))]
pub mod emu;
#[cfg(feature = "hip")]
#[cfg_attr(docsrs, doc(cfg(feature = "hip")))]
pub mod hip;
#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod nvrtc;
mod ops;
pub mod sources;

use super::cpu::TView;
use super::{Backend, Buffer, BufferType, DeviceInfo, DeviceKind, TensorStorage};
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::{Tensor, TensorId};
pub(crate) use api::Vendor;
use api::{DevPtr, Gpu};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Alignment of tensor offsets in CUDA buffers, bytes (as ggml's CUDA buffer type).
pub const CUDA_ALIGNMENT: usize = 256;

/// What a backend instance has done since it was created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaStats {
    /// Kernel launches.
    pub launches: u64,
    /// Nodes computed by device kernels.
    pub device_nodes: u64,
    /// Nodes computed on the host because no kernel covers their types,
    /// per op name.
    pub host_nodes: BTreeMap<String, u64>,
}

/// One CUDA device (or virtual device) as a [`Backend`].
pub struct CudaBackend {
    name: String,
    gpu: Arc<dyn Gpu>,
    stats: Mutex<CudaStats>,
    /// Error-flag buffers of queued computes, read at the next
    /// [`Backend::synchronize`]: (buffer, what each flag means).
    pending: Mutex<Vec<(DevPtr, Vec<String>)>>,
    /// Error-flag buffers for reuse (zeroed), so a compute allocates none.
    flag_pool: Mutex<Vec<DevPtr>>,
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let pending = std::mem::take(self.pending.get_mut().unwrap_or_else(|p| p.into_inner()));
        let pool = std::mem::take(self.flag_pool.get_mut().unwrap_or_else(|p| p.into_inner()));
        let _ = self.gpu.synchronize();
        for p in pending.into_iter().map(|x| x.0).chain(pool) {
            // SAFETY: allocated by this device's `alloc` for error flags, owned
            // by this backend alone, and its work has finished (synchronized).
            unsafe { self.gpu.free(p) };
        }
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("name", &self.name).field("gpu", &self.gpu).finish()
    }
}

impl CudaBackend {
    /// The GPU with CUDA ordinal `ordinal`, with its own stream and memory pool.
    ///
    /// # Errors
    /// [`Error::Cuda`] without a driver or NVRTC, for an ordinal the driver
    /// does not have, or when the context cannot be created.
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    pub fn new(ordinal: usize) -> Result<Self> {
        Ok(Self::virtual_devices(ordinal, 1)?.remove(0))
    }

    /// `n` (1..=64) devices on GPU `ordinal`, each with its own stream and
    /// memory pool, named `CUDA<ordinal>.<i>`: tensor parallelism on one
    /// physical GPU (the meta backend sees `n` devices).
    ///
    /// # Errors
    /// As [`CudaBackend::new`]; [`Error::Cuda`] for `n` outside 1..=64.
    #[cfg(feature = "cuda")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
    pub fn virtual_devices(ordinal: usize, n: usize) -> Result<Vec<Self>> {
        Self::open_virtual(Vendor::Cuda, ordinal, n, driver::DriverGpu::open)
    }

    /// The AMD GPU with HIP ordinal `ordinal`, with its own stream and
    /// memory pool, named `HIP<ordinal>`: the same op dispatch and kernels
    /// as CUDA (`kernels-cuda/` through `kernels-hip/sg_hip.h`, compiled
    /// by hipRTC for the GPU's `gfx` architecture at first use).
    ///
    /// # Errors
    /// [`Error::Hip`] without the HIP runtime (`libamdhip64`) or hipRTC,
    /// for an ordinal the runtime does not have, or when the device
    /// cannot be initialised.
    #[cfg(feature = "hip")]
    #[cfg_attr(docsrs, doc(cfg(feature = "hip")))]
    pub fn hip(ordinal: usize) -> Result<Self> {
        Ok(Self::hip_virtual_devices(ordinal, 1)?.remove(0))
    }

    /// `n` (1..=64) devices on AMD GPU `ordinal`, each with its own stream
    /// and memory pool, named `HIP<ordinal>.<i>` (as
    /// `CudaBackend::virtual_devices` for CUDA).
    ///
    /// # Errors
    /// As [`CudaBackend::hip`]; [`Error::Hip`] for `n` outside 1..=64.
    #[cfg(feature = "hip")]
    #[cfg_attr(docsrs, doc(cfg(feature = "hip")))]
    pub fn hip_virtual_devices(ordinal: usize, n: usize) -> Result<Vec<Self>> {
        Self::open_virtual(Vendor::Hip, ordinal, n, hip::HipGpu::open)
    }

    /// `n` (1..=64) devices on GPU `ordinal` of `vendor`, opened by `open`,
    /// named `<CUDA|HIP><ordinal>` (one) or `<CUDA|HIP><ordinal>.<i>`.
    fn open_virtual<G: Gpu + 'static>(
        vendor: Vendor,
        ordinal: usize,
        n: usize,
        open: fn(usize, usize) -> Result<Vec<G>>,
    ) -> Result<Vec<Self>> {
        if n == 0 || n > 64 {
            return Err(vendor.error(format!("{n} virtual devices: need 1..=64")));
        }
        let prefix = vendor.name();
        Ok(open(ordinal, n)?
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                let name = if n == 1 { format!("{prefix}{ordinal}") } else { format!("{prefix}{ordinal}.{i}") };
                Self::from_gpu(name, Arc::new(g))
            })
            .collect())
    }

    /// An emulated GPU with `memory` bytes: the backend's kernels run as
    /// host C++ (see `kernels-cuda/emu/`), and cuBLAS's F32 GEMM by a
    /// reference loop with cuBLAS's argument semantics. Each call is a
    /// separate device, named `EMU<i>`. For tests on machines without a
    /// GPU; slow.
    #[cfg(feature = "cuda-emu")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda-emu")))]
    pub fn emulated(memory: usize) -> Self {
        Self::emulated_with(memory, true)
    }

    /// [`CudaBackend::emulated`], with (`blas`) or without an emulated
    /// cuBLAS: without it the backend's own GEMM kernels run, as on a GPU
    /// machine that has no `libcublas`.
    #[cfg(feature = "cuda-emu")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda-emu")))]
    pub fn emulated_with(memory: usize, blas: bool) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        Self::from_gpu(format!("EMU{i}"), Arc::new(emu::EmuGpu::new(emu::EmuKind::Cuda, memory, 2, blas)))
    }

    /// An emulated AMD CDNA GPU with `memory` bytes, as the HIP backend
    /// drives one: the kernel files behind `kernels-hip/sg_hip.h` with
    /// 64-wide waves, run as host C++, and its errors are [`Error::Hip`].
    /// Each call is a separate device, named `EMUHIP<i>`. No hipBLAS (the
    /// backend's own GEMM kernels run). For tests on machines without a
    /// GPU; slow.
    #[cfg(feature = "cuda-emu")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cuda-emu")))]
    pub fn emulated_hip(memory: usize) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        Self::from_gpu(format!("EMUHIP{i}"), Arc::new(emu::EmuGpu::new(emu::EmuKind::HipCdna, memory, 2, false)))
    }

    fn from_gpu(name: String, gpu: Arc<dyn Gpu>) -> Self {
        CudaBackend {
            name,
            gpu,
            stats: Mutex::new(CudaStats::default()),
            pending: Mutex::new(Vec::new()),
            flag_pool: Mutex::new(Vec::new()),
        }
    }

    /// The GPU's peak memory bandwidth in bytes/s (memory clock × bus width
    /// × 2, as `deviceQuery`), shared by virtual devices; 0 when unknown
    /// (the emulator). Benches report achieved bandwidth against it.
    pub fn memory_bandwidth(&self) -> f64 {
        self.gpu.info().memory_bandwidth
    }

    /// True for an emulated GPU (kernels run as host C++).
    pub fn is_emulated(&self) -> bool {
        self.name.starts_with("EMU")
    }

    /// Counters since creation (launches, nodes on the device, nodes on the host).
    pub fn stats(&self) -> CudaStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The device address of tensor `id` and a check that its whole span lies in its buffer.
    fn operand<'a>(&self, ctx: &'a Context, storage: &TensorStorage, id: TensorId) -> Result<ops::T<'a>> {
        let t = ctx.tensor(id)?;
        let (buf, offs) = storage.locate(ctx, id)?;
        let cb = buf.as_any().downcast_ref::<CudaBuffer>().ok_or_else(|| Error::Compute {
            detail: format!("tensor {:?} lives in a buffer of another device than {}", t.name, self.name),
        })?;
        if !Arc::ptr_eq(&cb.gpu, &self.gpu) {
            return Err(Error::Compute {
                detail: format!("tensor {:?} lives in another device's buffer than {}", t.name, self.name),
            });
        }
        let n = t.nbytes();
        if offs.checked_add(n).is_none_or(|e| e > cb.size) {
            return Err(Error::OutOfBounds {
                detail: format!("tensor {:?} at {offs}+{n} exceeds its buffer of {}", t.name, cb.size),
            });
        }
        Ok(ops::T { t, p: cb.ptr + offs as DevPtr })
    }

    /// Node `t` on the host: operands copied to host memory, the CPU
    /// backend's kernel, the destination span copied back.
    fn host_node(&self, t: &Tensor, dst: &ops::T, src: &[ops::T]) -> Result<()> {
        // u128 words: host copies aligned for any element type.
        fn stage(gpu: &dyn Gpu, x: &ops::T) -> Result<Vec<u128>> {
            let n = x.t.nbytes();
            let mut v = vec![0u128; n.div_ceil(16)];
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
            // SAFETY: `operand` checked [p, p + nbytes) inside the tensor's buffer.
            unsafe { gpu.read(x.p, &mut bytes[..n])? };
            Ok(v)
        }
        let gpu = &*self.gpu;
        let mut srcs: Vec<Vec<u128>> = src.iter().map(|s| stage(gpu, s)).collect::<Result<_>>()?;
        let mut out = stage(gpu, dst)?;
        // SAFETY: each staging vector holds at least its tensor's nbytes and
        // lives until the kernel returns.
        let views: Vec<TView> =
            srcs.iter_mut().zip(src).map(|(v, s)| unsafe { TView::new(v.as_mut_ptr() as *mut u8, s.t) }).collect();
        // SAFETY: as above.
        let dview = unsafe { TView::new(out.as_mut_ptr() as *mut u8, dst.t) };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| super::cpu::kernels::compute(&t.op, &dview, &views)))
            .map_err(|_| Error::Compute { detail: format!("host kernel for {} panicked", t.op.name()) })??;
        let bytes: &[u8] = bytemuck::cast_slice(&out);
        // SAFETY: as in `stage`.
        unsafe { gpu.write(dst.p, &bytes[..dst.t.nbytes()]) }
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn device(&self) -> DeviceInfo {
        let info = self.gpu.info();
        DeviceInfo {
            name: self.name.clone(),
            description: info.name,
            kind: DeviceKind::Gpu,
            memory_total: info.memory_total,
        }
    }

    fn buffer_type(&self) -> BufferType {
        BufferType { name: self.gpu.info().vendor.name().into(), alignment: CUDA_ALIGNMENT, max_size: usize::MAX / 2 }
    }

    fn alloc_buffer(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        let max = self.buffer_type().max_size;
        if size > max {
            return Err(Error::Alloc {
                detail: format!(
                    "{}: {size} bytes exceeds the {} buffer maximum {max}",
                    self.name,
                    self.buffer_type().name
                ),
            });
        }
        let ptr = self.gpu.alloc(size.max(1)).map_err(|e| match e {
            Error::Alloc { detail } => Error::Alloc { detail: format!("{}: {detail}", self.name) },
            other => other,
        })?;
        Ok(Arc::new(CudaBuffer { gpu: self.gpu.clone(), ptr, size, device: self.name.clone() }))
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        let Ok(t) = ctx.tensor(id) else { return false };
        if t.op.is_leaf() || t.op.is_shape_only() {
            return true;
        }
        let dst = ops::T { t, p: 0 };
        let Ok(src) = t.src.iter().map(|&s| ctx.tensor(s).map(|st| ops::T { t: st, p: 0 })).collect::<Result<Vec<_>>>()
        else {
            return false;
        };
        let cx = ops::Cx::dry(&*self.gpu);
        matches!(dispatch(&cx, t, &dst, &src), Ok(true))
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }

    fn compute(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> Result<()> {
        self.compute_async(ctx, graph, storage)?;
        Backend::synchronize(self)
    }

    /// Queues the graph's kernels on the device's stream and returns; their
    /// error flags (indices out of range) are read by the next
    /// [`Backend::synchronize`], which the meta backend calls once per run.
    /// A node without a kernel (computed on the host) waits for the device.
    fn compute_async(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> Result<()> {
        graph.check_context(ctx)?;
        let cx = ops::Cx::pooled(&*self.gpu, &self.flag_pool);
        let mut host: Vec<&'static str> = Vec::new();
        let mut device_nodes = 0u64;
        let r = (|| {
            for &id in &graph.nodes {
                let t = ctx.t(id);
                if t.op.is_shape_only() || t.nelements() == 0 {
                    continue;
                }
                let dst = self.operand(ctx, storage, id)?;
                let src: Vec<ops::T> = t.src.iter().map(|&s| self.operand(ctx, storage, s)).collect::<Result<_>>()?;
                let on_device = dispatch(&cx, t, &dst, &src).map_err(|e| node_error(&self.name, t, e))?;
                if on_device {
                    device_nodes += 1;
                } else {
                    self.host_node(t, &dst, &src).map_err(|e| node_error(&self.name, t, e))?;
                    host.push(t.op.name());
                }
            }
            Ok(())
        })();
        if let Some(f) = cx.take_flags() {
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).push(f);
        }
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.launches += cx.launches();
        s.device_nodes += device_nodes;
        for op in host {
            *s.host_nodes.entry(op.to_string()).or_default() += 1;
        }
        r
    }

    /// Waits for the queued work and reads the queued computes' error flags
    /// (one read each), failing with the first set one's message.
    fn synchronize(&self) -> Result<()> {
        self.gpu.synchronize().map_err(|e| within(&self.name, e))?;
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let mut first = Ok(());
        for (p, what) in pending {
            let mut b = vec![0u8; 4 * what.len()];
            // SAFETY: the first 4·len bytes of a live flag buffer (len ≤ its slots).
            let read = unsafe { self.gpu.read(p, &mut b) };
            let set = b.chunks_exact(4).position(|c| c != [0; 4]);
            if first.is_ok() {
                first = match (read, set) {
                    (Err(e), _) => Err(e),
                    (Ok(()), Some(i)) => Err(Error::Compute { detail: format!("{}: {}", self.name, what[i]) }),
                    (Ok(()), None) => Ok(()),
                };
            }
            // SAFETY: the whole flag buffer; reused only after this clears it.
            match unsafe { self.gpu.memset(p, 0, 4 * ops::FLAG_SLOTS) } {
                Ok(()) => self.flag_pool.lock().unwrap_or_else(|p| p.into_inner()).push(p),
                // SAFETY: our allocation, no longer referenced.
                Err(_) => unsafe { self.gpu.free(p) },
            }
        }
        first
    }
}

impl CudaBackend {
    /// The GPU behind this backend, for the meta backend's NCCL
    /// communicator (`split::comm::nccl`), which queues its transfers on
    /// the device's stream itself.
    pub(crate) fn raw_device(&self) -> RawDevice {
        RawDevice { gpu: self.gpu.clone() }
    }
}

/// Device plumbing for a library outside the backend that queues work on a
/// [`CudaBackend`]'s stream (NCCL, in `split::comm::nccl`): the minimum it
/// needs of the device — the GPU's ordinal, the raw stream, and device
/// addresses of this device's buffers.
#[derive(Clone, Debug)]
pub(crate) struct RawDevice {
    gpu: Arc<dyn Gpu>,
}

impl RawDevice {
    /// The vendor and ordinal of the physical GPU (shared by virtual
    /// devices); `None` for an emulated device.
    pub(crate) fn physical(&self) -> Option<(Vendor, usize)> {
        self.gpu.physical()
    }

    /// Makes the GPU current on the calling thread and returns the
    /// device's stream (`CUstream` / `hipStream_t`): work queued on it is
    /// ordered with the backend's kernels.
    ///
    /// # Errors
    /// [`Error::Cuda`] for an emulated device; the runtime's error if the
    /// device cannot be made current.
    pub(crate) fn bind_stream(&self) -> Result<*mut std::ffi::c_void> {
        self.gpu.bind_stream()
    }

    /// The device address of bytes `offset..offset + len` of `buf`, when
    /// `buf` is a [`CudaBuffer`] of this device; `None` otherwise.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] if the range leaves the buffer.
    pub(crate) fn buffer_ptr(&self, buf: &dyn Buffer, offset: usize, len: usize) -> Result<Option<DevPtr>> {
        let Some(b) = buf.as_any().downcast_ref::<CudaBuffer>().filter(|b| Arc::ptr_eq(&b.gpu, &self.gpu)) else {
            return Ok(None);
        };
        b.check(offset, len)?;
        Ok(Some(b.ptr + offset as DevPtr))
    }
}

/// [`ops::run`] with a dispatcher panic (a bug, never expected: the op
/// constructors guarantee each op's sources) contained as an error, as the
/// CPU backend contains its kernels'.
///
/// A node with an operand off its type's natural alignment ([`aligned`])
/// is not the kernels' (`Ok(false)`: the host computes it, as ggml's CPU
/// reads any view): a GPU faults on a misaligned load
/// (`CUDA_ERROR_MISALIGNED_ADDRESS`, sticky for the whole context), where
/// ggml lets a view start at any byte (`ggml_view_1d(a, n, 10)` of an F32
/// tensor; seen in `tests/split_props.rs` on an H200).
fn dispatch(cx: &ops::Cx, t: &Tensor, dst: &ops::T, src: &[ops::T]) -> Result<bool> {
    if !aligned(dst) || !src.iter().all(aligned) {
        return Ok(false);
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ops::run(cx, &t.op, dst, src))).map_err(|_| {
        let family = t.op.family();
        Error::Compute {
            detail: format!(
                "CUDA dispatch for {} on {} panicked (ops/{}.rs, kernels in {})",
                t.op.name(),
                t.describe(),
                family.name(),
                ops::kernel_files(family).join(", ")
            ),
        }
    })?
}

/// Whether operand `x`'s address, view offset and byte strides are all
/// multiples of its type's natural alignment: the element size (F32 4, F16
/// 2, I64 8, …) or, for a block type, the largest power of two dividing the
/// block's size, at most 16 (Q8_0's 34 bytes: 2; Q4_K's 144: 16) — what an
/// operand laid out by whole elements or blocks from an aligned buffer has.
fn aligned(x: &ops::T) -> bool {
    let size = x.t.ty.type_size().max(1);
    let align = (1usize << size.trailing_zeros()).min(16);
    let offs = if x.t.view_src.is_some() { x.t.view_offs } else { 0 };
    // (`%`, not `is_multiple_of`: the crate's MSRV is 1.82.)
    (x.p as usize) % align == 0 && offs % align == 0 && x.t.nb.iter().all(|b| b % align == 0)
}

/// The error of node `t` on device `dev`: the device, the op and the cause.
fn node_error(dev: &str, t: &Tensor, e: Error) -> Error {
    match e {
        Error::Cuda { .. } | Error::Hip { .. } => {
            within(&format!("{dev}: {} {:?} ({})", t.op.name(), t.name, t.describe()), e)
        }
        other => Error::Compute { detail: format!("{dev}: {} {:?}: {other}", t.op.name(), t.name) },
    }
}

/// A runtime error (CUDA or HIP, the variant kept) with `context` (the
/// device, the node) in front of its detail; other errors unchanged.
fn within(context: &str, e: Error) -> Error {
    match e {
        Error::Cuda { detail } => Error::Cuda { detail: format!("{context}: {detail}") },
        Error::Hip { detail } => Error::Hip { detail: format!("{context}: {detail}") },
        other => other,
    }
}

/// Device memory of a [`CudaBackend`], freed when the last reference goes.
pub struct CudaBuffer {
    gpu: Arc<dyn Gpu>,
    ptr: DevPtr,
    size: usize,
    device: String,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({} bytes on {})", self.size, self.device)
    }
}

impl CudaBuffer {
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(Error::OutOfBounds {
                detail: format!("bytes {offset}..+{len} of a {}-byte buffer on {}", self.size, self.device),
            });
        }
        Ok(())
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from this device's `alloc`; the buffer is its only owner.
        unsafe { self.gpu.free(self.ptr) }
    }
}

impl Buffer for CudaBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: the range was just checked against this live allocation.
        unsafe { self.gpu.write(self.ptr + offset as DevPtr, data) }
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: as in `set`.
        unsafe { self.gpu.read(self.ptr + offset as DevPtr, out) }
    }
    /// Between two CUDA buffers a direct, stream-ordered copy (the `Gpu`
    /// interface's `copy_from`); else through host memory.
    fn copy_from(&self, dst_offset: usize, src: &dyn Buffer, src_offset: usize, n: usize) -> Result<()> {
        if let Some(s) = src.as_any().downcast_ref::<CudaBuffer>() {
            self.check(dst_offset, n)?;
            s.check(src_offset, n)?;
            let (d, p) = (self.ptr + dst_offset as DevPtr, s.ptr + src_offset as DevPtr);
            // SAFETY: both ranges were just checked against live allocations
            // (each buffer keeps its allocation alive while borrowed here).
            if unsafe { self.gpu.copy_from(d, &*s.gpu, p, n) }
                .map_err(|e| within(&format!("{} <- {}", self.device, s.device), e))?
            {
                return Ok(());
            }
        }
        let mut tmp = vec![0u8; n];
        src.get(src_offset, &mut tmp)?;
        self.set(dst_offset, &tmp)
    }
    fn clear(&self, value: u8) {
        // SAFETY: the whole allocation.
        if let Err(e) = unsafe { self.gpu.memset(self.ptr, value, self.size) } {
            log::error!("clearing {self:?}: {e}");
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
