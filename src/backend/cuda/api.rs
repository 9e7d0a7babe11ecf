//! The device interface the CUDA backend drives: memory, copies, kernel
//! launches by name, and GEMM. Two implementations: the real GPU through the
//! CUDA driver ([`super::driver`]) and, with the `cuda-emu` feature, the
//! emulator ([`super::emu`]) that runs the same kernel sources as host C++.
//! Everything above this trait (buffers, op dispatch, launch shapes) is the
//! same code on both, which is how the backend is tested without a GPU.

use crate::error::Result;

/// A device address: a `CUdeviceptr` on a GPU, a host address in the emulator.
pub(crate) type DevPtr = u64;

/// One kernel argument, passed by value as the kernel's parameter type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum KArg {
    /// A device pointer (`const char *` / `char *` parameters).
    Ptr(DevPtr),
    /// A `long long` (i64) parameter: shapes, strides in bytes, counts.
    I64(i64),
    /// An `int` parameter.
    I32(i32),
    /// A `float` parameter.
    F32(f32),
}

impl KArg {
    /// The argument's bytes, little-endian, in an 8-byte slot (cuLaunchKernel
    /// reads `sizeof(parameter)` bytes from the slot's start).
    pub(crate) fn slot(self) -> u64 {
        match self {
            KArg::Ptr(p) => p,
            KArg::I64(v) => v as u64,
            KArg::I32(v) => v as u32 as u64,
            KArg::F32(v) => v.to_bits() as u64,
        }
    }
}

/// Who made the GPU behind a device: which runtime and which collective
/// library (NCCL or RCCL, the same C API) drive it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Vendor {
    /// NVIDIA: the CUDA driver, NVRTC, cuBLAS, NCCL.
    Cuda,
    /// AMD: the HIP runtime, hipRTC, hipBLAS, RCCL.
    #[cfg_attr(not(any(feature = "hip", feature = "cuda-emu")), allow(dead_code))]
    Hip,
}

impl Vendor {
    /// "CUDA" or "HIP": device names (`CUDA0`, `HIP1.0`) and buffer types.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Vendor::Cuda => "CUDA",
            Vendor::Hip => "HIP",
        }
    }

    /// A failure of this vendor's runtime, compiler or library:
    /// [`crate::Error::Cuda`] or [`crate::Error::Hip`].
    pub(crate) fn error(self, detail: String) -> crate::Error {
        match self {
            Vendor::Cuda => crate::Error::Cuda { detail },
            Vendor::Hip => crate::Error::Hip { detail },
        }
    }
}

/// What a device says about itself.
#[derive(Clone, Debug)]
pub(crate) struct GpuInfo {
    /// Human name ("NVIDIA H200", "emulated GPU").
    pub name: String,
    /// Total memory, bytes.
    pub memory_total: usize,
    /// Streaming multiprocessors: launch grids are sized from it.
    pub multiprocessors: u32,
    /// Peak memory bandwidth, bytes/s (memory clock × bus width × 2, as
    /// `deviceQuery` reports it); 0 when unknown (the emulator).
    pub memory_bandwidth: f64,
    /// Threads per warp (NVIDIA: 32) or wave (AMD: 64 on CDNA, 32 on RDNA),
    /// the `SG_WARP` the kernels were compiled with: every launch's block
    /// is a whole number of them.
    pub warp_size: u32,
    /// Whose runtime drives it (named in buffer types and messages).
    pub vendor: Vendor,
}

/// Peak memory bandwidth in bytes/s from the memory clock (kHz) and bus
/// width (bits): clock × width / 8 × 2 (DDR), as `deviceQuery` reports it;
/// 0 when either is unknown (negative or 0).
pub(crate) fn peak_bandwidth(clock_khz: i32, bus_bits: i32) -> f64 {
    clock_khz.max(0) as f64 * 1e3 * (bus_bits.max(0) as f64 / 8.0) * 2.0
}

/// The memory budget of each of `n` virtual devices on a GPU of `total`
/// bytes: an equal share of 95% (the runtime's context, BLAS workspaces and
/// the kernel modules need the rest).
pub(crate) fn device_budget(total: usize, n: usize) -> usize {
    total / 20 * 19 / n.max(1)
}

/// A column-major GEMM `C[m, n] = Aᵀ[m, k] · B[k, n]` over F32 or F16 data,
/// batched with element strides, as ggml's CUDA backend calls cuBLAS for
/// `mul_mat` (A is the weight `[k, m]`, B the activations `[k, n]`, both
/// with `ne[0] = k` contiguous).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    /// Rows of the result (`ne01` of the weight).
    pub m: i32,
    /// Columns of the result (`ne11`).
    pub n: i32,
    /// Shared dimension (`ne00 = ne10`).
    pub k: i32,
    /// Weight, `lda` elements between its rows, F16 when `a_f16`.
    pub a: DevPtr,
    /// Leading dimension of A, elements.
    pub lda: i32,
    /// Weight is F16 (else F32).
    pub a_f16: bool,
    /// Activations (F32), `ldb` elements between columns.
    pub b: DevPtr,
    /// Leading dimension of B, elements.
    pub ldb: i32,
    /// Result (F32), `ldc` elements between columns.
    pub c: DevPtr,
    /// Leading dimension of C, elements.
    pub ldc: i32,
}

/// One device (or one virtual device: its own stream and memory pool).
///
/// Every method that takes device addresses is `unsafe`: the caller
/// guarantees that each range it names lies inside a live allocation of
/// this device (the backend checks every tensor against its buffer first).
pub(crate) trait Gpu: Send + Sync + std::fmt::Debug {
    /// The device's description.
    fn info(&self) -> GpuInfo;
    /// Allocates `bytes` (at least 1) of zero-filled device memory, aligned to 256 bytes.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] when the device is out of memory (named in the message).
    fn alloc(&self, bytes: usize) -> Result<DevPtr>;
    /// Frees an allocation.
    ///
    /// # Safety
    /// `ptr` came from this device's `alloc` and is not used afterwards.
    unsafe fn free(&self, ptr: DevPtr);
    /// Copies host bytes to the device.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` lies in a live allocation.
    unsafe fn write(&self, dst: DevPtr, src: &[u8]) -> Result<()>;
    /// Copies device bytes to the host, after all earlier work on the device.
    ///
    /// # Safety
    /// `[src, src + dst.len())` lies in a live allocation.
    unsafe fn read(&self, src: DevPtr, dst: &mut [u8]) -> Result<()>;
    /// Sets `n` bytes to `value`.
    ///
    /// # Safety
    /// `[dst, dst + n)` lies in a live allocation.
    unsafe fn memset(&self, dst: DevPtr, value: u8, n: usize) -> Result<()>;
    /// Launches `kernel` (a `kernels-cuda` entry point) on `grid` blocks of
    /// `block` threads with `args` in the kernel's parameter order.
    ///
    /// # Safety
    /// Every pointer argument, with the extent the kernel reads or writes for
    /// the other arguments (its contract in the `.cu` file), lies in a live
    /// allocation of this device.
    unsafe fn launch(&self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()>;
    /// Waits for all work queued on this device.
    fn synchronize(&self) -> Result<()>;
    /// Copies `n` bytes from `src`, an allocation of device `from` (this
    /// device or another of the process), to `dst` on this device: ordered
    /// after the work queued on `from` so far and before this device's later
    /// work, and `from`'s later work (a kernel overwriting the source, its
    /// free) waits for the copy, so neither side blocks the host. `Ok(false)`
    /// when the two devices cannot copy directly (the caller goes through
    /// host memory).
    ///
    /// # Safety
    /// `[dst, dst + n)` lies in a live allocation of this device and
    /// `[src, src + n)` in a live allocation of `from`.
    unsafe fn copy_from(&self, dst: DevPtr, from: &dyn Gpu, src: DevPtr, n: usize) -> Result<bool> {
        let _ = (dst, from, src, n);
        Ok(false)
    }
    /// The vendor and ordinal of the physical GPU behind this device, for a
    /// collective library (NCCL, RCCL) that queues work on its stream;
    /// `None` for an emulated device.
    fn physical(&self) -> Option<(Vendor, usize)> {
        None
    }
    /// Makes this device's GPU current on the calling thread and returns
    /// its stream (`CUstream` / `hipStream_t`): work queued on it is
    /// ordered with the backend's kernels.
    ///
    /// # Errors
    /// [`crate::Error::Cuda`] for an emulated device; the runtime's error
    /// if the device cannot be made current.
    fn bind_stream(&self) -> Result<*mut std::ffi::c_void> {
        Err(crate::Error::Cuda { detail: "an emulated device has no stream".into() })
    }
    /// For [`Gpu::copy_from`]: the concrete device behind `from`.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Runs a GEMM with a vendor library; `Ok(false)` when there is none (the
    /// backend then uses its own kernels).
    ///
    /// # Safety
    /// The matrices described by `g` lie in live allocations.
    unsafe fn gemm(&self, g: &Gemm) -> Result<bool> {
        let _ = g;
        Ok(false)
    }
}
