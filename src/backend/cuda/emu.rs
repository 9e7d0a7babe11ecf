//! The emulated GPU (cargo feature `cuda-emu`): device memory is host
//! memory, and a launch runs the kernel compiled from the same
//! `kernels-cuda/*.cu` source as host C++ (`kernels-cuda/emu/`), block after
//! block, a block's threads as cooperative fibers so barriers and warp
//! shuffles keep CUDA's meaning. It tests the CUDA backend's host side and
//! kernels without a GPU; it is slow and never the default.
//!
//! Two kinds of device: CUDA ([`EmuKind::Cuda`], the files as NVRTC
//! compiles them, 32-wide warps) and HIP on a CDNA GPU ([`EmuKind::HipCdna`],
//! the files behind `kernels-hip/sg_hip.h` as hipRTC compiles them for
//! gfx9, 64-wide waves), so the HIP spelling of every kernel and its
//! wave-64 reductions run in the tests. Every
//! allocation has guard zones, checked after each launch, so a kernel that
//! writes out of bounds is an error here (on a GPU: an illegal address).

use super::api::{DevPtr, Gemm, Gpu, GpuInfo, KArg, Vendor};
use crate::error::{Error, Result};
use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::Mutex;

extern "C" {
    fn sg_emu_launch(
        variant: i32,
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        args: *mut *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> i32;
    fn sg_emu_kernel_count(variant: i32) -> usize;
}

/// What an emulated device is compiled as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmuKind {
    /// An NVIDIA GPU: the kernel files as CUDA compiles them, 32-wide warps.
    Cuda,
    /// An AMD CDNA GPU (gfx9: MI100/MI200/MI300): the kernel files behind
    /// the HIP portability header, 64-wide waves.
    HipCdna,
}

impl EmuKind {
    /// The emulator's table of this kind's kernels.
    fn variant(self) -> i32 {
        match self {
            EmuKind::Cuda => 0,
            EmuKind::HipCdna => 1,
        }
    }
    /// Threads per warp (CUDA) or wave (CDNA).
    pub fn warp_size(self) -> u32 {
        match self {
            EmuKind::Cuda => 32,
            EmuKind::HipCdna => 64,
        }
    }
    /// The vendor whose runtime the device stands for.
    pub(crate) fn vendor(self) -> Vendor {
        match self {
            EmuKind::Cuda => Vendor::Cuda,
            EmuKind::HipCdna => Vendor::Hip,
        }
    }
}

/// Guard zone around every allocation, bytes (keeps 256-byte alignment).
const GUARD: usize = 256;
/// The guard zones' pattern; a launch that changes it wrote out of bounds.
const GUARD_BYTE: u8 = 0xA5;

/// Number of kernels compiled into the emulator for devices of `kind`
/// (the same kernels for both kinds).
pub fn kernel_count(kind: EmuKind) -> usize {
    // SAFETY: reads a static table; no preconditions.
    unsafe { sg_emu_kernel_count(kind.variant()) }
}

/// An emulated GPU with a memory limit.
#[derive(Debug)]
pub(crate) struct EmuGpu {
    kind: EmuKind,
    memory: usize,
    multiprocessors: u32,
    /// Emulate cuBLAS's F32 GEMM (else the backend's own kernels run, as on
    /// a GPU machine without libcublas).
    blas: bool,
    /// Live allocations: device address → (host layout including the
    /// guard zones, bytes asked for).
    live: Mutex<HashMap<DevPtr, (Layout, usize)>>,
}

impl EmuGpu {
    /// A device of `kind` with `memory` bytes and `multiprocessors` SMs
    /// (which only size launch grids), with an emulated cuBLAS when `blas`.
    pub(crate) fn new(kind: EmuKind, memory: usize, multiprocessors: u32, blas: bool) -> Self {
        EmuGpu { kind, memory, multiprocessors: multiprocessors.max(1), blas, live: Mutex::new(HashMap::new()) }
    }

    /// The error of this device's vendor (`Error::Cuda` or `Error::Hip`).
    fn error(&self, detail: String) -> Error {
        self.kind.vendor().error(detail)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<DevPtr, (Layout, usize)>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After a launch: every allocation's guard zones still hold the
    /// pattern, else `what` wrote outside an allocation (an error naming
    /// the allocation's size and how far out; the guards are restored).
    fn check_guards(&self, what: &str) -> Result<()> {
        let live = self.live();
        for (&p, &(_, bytes)) in live.iter() {
            // SAFETY: each live allocation has GUARD bytes before `p` and
            // GUARD bytes after `p + bytes` (allocated in `alloc`).
            let (before, after) = unsafe {
                (
                    std::slice::from_raw_parts_mut((p as usize - GUARD) as *mut u8, GUARD),
                    std::slice::from_raw_parts_mut((p as usize + bytes) as *mut u8, GUARD),
                )
            };
            let bad_before =
                before.iter().rposition(|&b| b != GUARD_BYTE).map(|i| format!("{} bytes before its start", GUARD - i));
            let bad_after =
                after.iter().position(|&b| b != GUARD_BYTE).map(|i| format!("{} bytes past its end", i + 1));
            if let Some(at) = bad_before.or(bad_after) {
                before.fill(GUARD_BYTE);
                after.fill(GUARD_BYTE);
                return Err(self.error(format!(
                    "{what} wrote outside an allocation of {bytes} bytes ({at}): an out-of-bounds access"
                )));
            }
        }
        Ok(())
    }
}

impl Drop for EmuGpu {
    fn drop(&mut self) {
        for (p, (layout, _)) in self.live().drain() {
            // SAFETY: every entry was allocated in `alloc` with this layout, GUARD bytes before `p`.
            unsafe { std::alloc::dealloc((p as usize - GUARD) as *mut u8, layout) }
        }
    }
}

impl Gpu for EmuGpu {
    fn info(&self) -> GpuInfo {
        let name = match self.kind {
            EmuKind::Cuda => "emulated GPU (CUDA kernels as host C++, 32-wide warps)",
            EmuKind::HipCdna => "emulated GPU (HIP kernels as host C++, CDNA: 64-wide waves)",
        };
        GpuInfo {
            name: name.into(),
            memory_total: self.memory,
            multiprocessors: self.multiprocessors,
            memory_bandwidth: 0.0,
            warp_size: self.kind.warp_size(),
            vendor: self.kind.vendor(),
        }
    }

    fn alloc(&self, bytes: usize) -> Result<DevPtr> {
        let mut live = self.live();
        let used: usize = live.values().map(|l| l.1).sum();
        if bytes > self.memory.saturating_sub(used) {
            return Err(Error::Alloc {
                detail: format!("out of device memory: {bytes} bytes requested, {} of {} in use", used, self.memory),
            });
        }
        let total = bytes
            .max(1)
            .checked_add(2 * GUARD)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or_else(|| Error::Alloc { detail: format!("out of device memory: {bytes} bytes requested") })?;
        let layout =
            Layout::from_size_align(total, 256).map_err(|e| Error::Alloc { detail: format!("{bytes} bytes: {e}") })?;
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(Error::Alloc { detail: format!("out of host memory for {bytes} emulated device bytes") });
        }
        // SAFETY: the guard zones lie inside the allocation just made.
        unsafe {
            std::ptr::write_bytes(base, GUARD_BYTE, GUARD);
            std::ptr::write_bytes(base.add(GUARD + bytes), GUARD_BYTE, GUARD);
        }
        let p = base as usize + GUARD;
        live.insert(p as DevPtr, (layout, bytes));
        Ok(p as DevPtr)
    }

    unsafe fn free(&self, ptr: DevPtr) {
        if let Some((layout, _)) = self.live().remove(&ptr) {
            // SAFETY: allocated in `alloc` with this layout, GUARD bytes
            // before `ptr` (the caller does not use it again).
            unsafe { std::alloc::dealloc((ptr as usize - GUARD) as *mut u8, layout) }
        }
    }

    unsafe fn write(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        // SAFETY: the caller guarantees the range is inside a live allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn read(&self, src: DevPtr, dst: &mut [u8]) -> Result<()> {
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn memset(&self, dst: DevPtr, value: u8, n: usize) -> Result<()> {
        // SAFETY: as in `write`.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
        Ok(())
    }

    unsafe fn launch(&self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        let name = CString::new(kernel).map_err(|_| self.error(format!("bad kernel name {kernel:?}")))?;
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot()).collect();
        let mut ptrs: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        let mut err = [0 as c_char; 512];
        // SAFETY: `name` is NUL-terminated; grid/block are 3 values each; each
        // `ptrs[i]` points at an 8-byte slot that outlives the call; the
        // kernel's memory accesses are the caller's guarantee.
        let rc = unsafe {
            sg_emu_launch(
                self.kind.variant(),
                name.as_ptr(),
                grid.as_ptr(),
                block.as_ptr(),
                ptrs.as_mut_ptr(),
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if rc != 0 {
            // SAFETY: the runtime NUL-terminates the message within `err`.
            let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
            return Err(self.error(format!("launch of {kernel}: {msg}")));
        }
        self.check_guards(kernel)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Every emulated device's memory is host memory of this process, and
    /// work is done when queued, so a direct copy between any two is a
    /// `memmove`.
    unsafe fn copy_from(&self, dst: DevPtr, from: &dyn Gpu, src: DevPtr, n: usize) -> Result<bool> {
        if from.as_any().downcast_ref::<EmuGpu>().is_none_or(|f| f.kind != self.kind) {
            return Ok(false);
        }
        // SAFETY: the caller guarantees both ranges lie in live allocations
        // (host memory); `copy` allows them to overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
        Ok(true)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// cublasGemmEx(CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, 1, A, lda, B, ldb, 0,
    /// C, ldc) in F32, column-major, as cuBLAS defines it:
    /// `C[i + j·ldc] = Σ_p A[p + i·lda] · B[p + j·ldb]`, so the backend's
    /// mapping of `mul_mat` onto cuBLAS is checked by the emulator's tests.
    /// Rejects what cuBLAS rejects (leading dimensions too small).
    unsafe fn gemm(&self, g: &Gemm) -> Result<bool> {
        if !self.blas || g.a_f16 {
            return Ok(false);
        }
        let (m, n, k) = (g.m.max(0) as usize, g.n.max(0) as usize, g.k.max(0) as usize);
        if (g.lda as usize) < k.max(1) || (g.ldb as usize) < k.max(1) || (g.ldc as usize) < m.max(1) {
            return Err(self.error(format!("cublasGemmEx: invalid leading dimensions in {g:?}")));
        }
        let (lda, ldb, ldc) = (g.lda as usize, g.ldb as usize, g.ldc as usize);
        let (a, b, c) = (g.a as *const f32, g.b as *const f32, g.c as *mut f32);
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0f32;
                for p in 0..k {
                    // SAFETY: the caller guarantees the matrices, i.e. these
                    // column-major extents, lie in live allocations.
                    acc += unsafe { a.add(p + i * lda).read_unaligned() * b.add(p + j * ldb).read_unaligned() };
                }
                // SAFETY: as above.
                unsafe { c.add(i + j * ldc).write_unaligned(acc) };
            }
        }
        self.check_guards("cublasGemmEx").map(|_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel told to fill more than its allocation is caught by the
    /// guard zones (on a GPU: an illegal address); the device stays usable.
    #[test]
    fn an_out_of_bounds_write_is_an_error() {
        let gpu = EmuGpu::new(EmuKind::Cuda, 1 << 20, 1, false);
        let p = gpu.alloc(64).unwrap();
        let fill = |n: i64| {
            let mut args = vec![KArg::Ptr(p), KArg::I64(n), KArg::I64(1), KArg::I64(1), KArg::I64(1)];
            args.extend([4, 4 * n, 4 * n, 4 * n].map(KArg::I64));
            args.push(KArg::F32(2.0));
            // SAFETY: deliberately wrong for n > 16; the guard zone (256
            // bytes) absorbs the 32 bytes written past the end.
            unsafe { gpu.launch("sg_fill_f32", [1, 1, 1], [32, 1, 1], &args) }
        };
        let e = fill(24).unwrap_err().to_string();
        assert!(e.contains("sg_fill_f32") && e.contains("past its end"), "{e}");
        fill(16).unwrap();
        let mut back = [0u8; 64];
        // SAFETY: the 64 bytes allocated above.
        unsafe { gpu.read(p, &mut back).unwrap() };
        assert!(back.chunks(4).all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 2.0));
        // SAFETY: allocated above, not used again.
        unsafe { gpu.free(p) };
    }

    /// A block that is not whole waves on a 64-wide (CDNA) device: the
    /// block sum's 64-lane shuffle finds half its lanes missing, which is
    /// an error (on a GPU: undefined values). The same kernel with whole
    /// waves, or on a 32-wide device, computes the row.
    #[test]
    fn a_shuffle_over_a_partial_wave_is_an_error() {
        let n = 64i64;
        for (kind, block, ok) in
            [(EmuKind::HipCdna, 32, false), (EmuKind::HipCdna, 64, true), (EmuKind::Cuda, 32, true)]
        {
            let gpu = EmuGpu::new(kind, 1 << 20, 1, false);
            let (x, y) = (gpu.alloc(4 * n as usize).unwrap(), gpu.alloc(4 * n as usize).unwrap());
            let twos: Vec<u8> = (0..n).flat_map(|_| 2f32.to_le_bytes()).collect();
            // SAFETY: the 4n bytes allocated above.
            unsafe { gpu.write(x, &twos).unwrap() };
            let mut args = vec![KArg::Ptr(x), KArg::Ptr(y)];
            args.extend([n, 1, 1, 1, 4, 4 * n, 4 * n, 4 * n, 4, 4 * n, 4 * n, 4 * n].map(KArg::I64));
            args.push(KArg::F32(0.0));
            // SAFETY: one row of n F32 values in x and y, as sg_rms_norm_f32 reads and writes.
            let r = unsafe { gpu.launch("sg_rms_norm_f32", [1, 1, 1], [block, 1, 1], &args) };
            if ok {
                r.unwrap();
                let mut back = vec![0u8; 4 * n as usize];
                // SAFETY: the 4n bytes of y.
                unsafe { gpu.read(y, &mut back).unwrap() };
                // rms of a row of twos is 2: every value normalises to 1.
                assert!(back.chunks(4).all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 1.0), "{kind:?}");
            } else {
                let e = r.unwrap_err().to_string();
                assert!(e.contains("sg_rms_norm_f32") && e.contains("not in the block"), "{e}");
                assert!(e.starts_with("hip: "), "{e}");
            }
        }
    }
}
