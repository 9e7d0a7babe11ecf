//! The backend interface: devices, buffer types, buffers, tensor storage,
//! `compute(graph)` and `supports_op`. CPU is always present and is the
//! reference; CUDA and HIP sit behind cargo features.

pub mod cpu;
#[cfg(sg_gpu)]
#[cfg_attr(docsrs, doc(cfg(any(feature = "cuda", feature = "hip"))))]
pub mod cuda;
mod mapped;
mod storage;

pub use mapped::MappedBytes;
pub use storage::TensorStorage;

use crate::error::Result;
use crate::graph::{Context, Graph};
use crate::tensor::TensorId;
use std::any::Any;
use std::sync::Arc;

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// Host CPU (one instance per virtual device).
    Cpu,
    /// A GPU.
    Gpu,
}

/// A device's description.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Short name, unique in the process ("CPU0", "CUDA1", …).
    pub name: String,
    /// Human description.
    pub description: String,
    /// Kind.
    pub kind: DeviceKind,
    /// Memory the device reports, in bytes (0 if unknown).
    pub memory_total: usize,
}

/// A buffer type: where and how a backend allocates.
#[derive(Clone, Debug)]
pub struct BufferType {
    /// Name.
    pub name: String,
    /// Required alignment of tensor offsets, in bytes (power of two).
    pub alignment: usize,
    /// Largest single buffer, in bytes; the allocator splits above it.
    pub max_size: usize,
}

/// Memory owned by a backend. Reads and writes take byte offsets; out-of-range
/// access is an error, not a panic. Interior mutability: a buffer is shared
/// (`Arc`) between the storage map and running kernels.
pub trait Buffer: Send + Sync + std::fmt::Debug {
    /// Size in bytes.
    fn size(&self) -> usize;
    /// Writes `data` at byte `offset`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`] if `offset + data.len()` exceeds the size.
    fn set(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Reads `out.len()` bytes from byte `offset`.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`] if the range exceeds the size.
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Fills the whole buffer with `value`.
    fn clear(&self, value: u8);
    /// Copies `n` bytes at byte `src_offset` of `src` (a buffer of any
    /// backend) to byte `dst_offset` of this one. Buffers of devices that can
    /// copy directly (two CUDA devices of one process: a device-to-device or
    /// peer copy, ordered after the work the source's device has queued and
    /// before later work on either device) do so; any other pair goes through
    /// host memory, which this provided method does.
    ///
    /// # Errors
    /// [`crate::Error::OutOfBounds`] if either range exceeds its buffer; the
    /// devices' copy errors.
    fn copy_from(&self, dst_offset: usize, src: &dyn Buffer, src_offset: usize, n: usize) -> Result<()> {
        let in_range = |off: usize, size: usize| off.checked_add(n).is_some_and(|e| e <= size);
        if !in_range(src_offset, src.size()) || !in_range(dst_offset, self.size()) {
            return Err(crate::Error::OutOfBounds {
                detail: format!(
                    "copy of {n} bytes from {src_offset} of a {}-byte buffer to {dst_offset} of a {}-byte buffer",
                    src.size(),
                    self.size()
                ),
            });
        }
        let mut tmp = vec![0u8; n];
        src.get(src_offset, &mut tmp)?;
        self.set(dst_offset, &tmp)
    }
    /// For downcasting to the backend's concrete type.
    fn as_any(&self) -> &dyn Any;
}

/// A compute backend instance (one device).
pub trait Backend: Send + Sync {
    /// Backend name ("CPU", "CUDA", …).
    fn name(&self) -> &str;
    /// The device this instance drives.
    fn device(&self) -> DeviceInfo;
    /// Its default buffer type.
    fn buffer_type(&self) -> BufferType;
    /// Allocates a zero-filled buffer of `size` bytes.
    ///
    /// # Errors
    /// [`crate::Error::Alloc`] if `size` exceeds the buffer type's maximum or memory runs out.
    fn alloc_buffer(&self, size: usize) -> Result<Arc<dyn Buffer>>;
    /// Adopts bytes of a memory-mapped file as a buffer of `bytes.len()`
    /// bytes holding them, without copying, where the device computes on
    /// host memory (the CPU backend: a private copy-on-write mapping of the
    /// same file pages, so the weights cost their file size once); `None`
    /// where the device copies instead (the default: GPUs, whose memory is
    /// their own). Writes to the buffer never reach the file.
    ///
    /// # Errors
    /// `Some(Err(`[`crate::Error::Alloc`]`))` if the range cannot be mapped.
    fn map_buffer(&self, bytes: &MappedBytes) -> Option<Result<Arc<dyn Buffer>>> {
        let _ = bytes;
        None
    }
    /// True if this backend can compute node `id` of `ctx` (op, types, layout).
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool;
    /// Computes every node of `graph`, reading and writing tensors through
    /// `storage`. Every node and leaf of the graph must have storage.
    ///
    /// # Errors
    /// [`crate::Error::NoStorage`], [`crate::Error::UnsupportedOp`],
    /// [`crate::Error::Compute`].
    fn compute(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> Result<()>;
    /// Computes `graph` like [`Backend::compute`], but may return before the
    /// device has finished (its work queued in order behind earlier work);
    /// errors found by the device are reported by the next
    /// [`Backend::synchronize`]. By default the same as `compute`.
    ///
    /// # Errors
    /// As [`Backend::compute`].
    fn compute_async(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> Result<()> {
        self.compute(ctx, graph, storage)
    }
    /// Waits for the work [`Backend::compute_async`] queued and reports its
    /// errors; by default nothing to wait for.
    ///
    /// # Errors
    /// The first error of the queued work.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// Host threads this device keeps busy while it computes (the CPU
    /// backend's workers; one for a GPU's driving thread). The meta backend
    /// compares their sum with the machine's cores.
    fn worker_threads(&self) -> usize {
        1
    }
    /// Runs `f` on this device's own worker, so that the computes `f`
    /// issues start without a hand-over between threads (the CPU backend
    /// runs it inside its thread pool); by default on the calling thread.
    ///
    /// # Errors
    /// `f`'s error.
    fn run_on_device(&self, f: &mut (dyn FnMut() -> Result<()> + Send)) -> Result<()> {
        f()
    }
    /// The concrete backend, for backend-specific extensions (the meta
    /// backend finds CUDA devices for NCCL through it); `None` by default.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}

/// Copies tensor `id`'s bytes from one storage (any backend) to another
/// (`ggml_backend_tensor_copy`), through host memory.
///
/// # Errors
/// [`crate::Error::NoStorage`] if either side has no storage for `id`.
pub fn copy_tensor(ctx: &Context, id: TensorId, from: &TensorStorage, to: &TensorStorage) -> Result<()> {
    let t = ctx.tensor(id)?;
    let mut tmp = vec![0u8; t.nbytes()];
    from.get_bytes(ctx, id, 0, &mut tmp)?;
    to.set_bytes(ctx, id, 0, &tmp)
}
