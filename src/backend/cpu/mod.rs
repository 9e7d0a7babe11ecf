//! The CPU backend: the reference implementation of every op, multi-threaded
//! (one rayon pool per instance) with SIMD where it pays. Several instances
//! in one process are independent devices, each with its own buffers and
//! threads (the virtual devices of the meta backend).

mod access;
mod fuse;
pub(crate) mod kernels;

pub(crate) use access::TView;

use super::{Backend, Buffer, BufferType, DeviceInfo, DeviceKind, MappedBytes, TensorStorage};
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::TensorId;
use smallvec::SmallVec;
use std::alloc::Layout;
use std::any::Any;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Alignment of CPU buffers and of tensor offsets in them, in bytes
/// (ggml's `TENSOR_ALIGNMENT` is 32; 64 keeps AVX-512 loads in one line).
pub const CPU_ALIGNMENT: usize = 64;

/// Most worker threads one CPU backend instance accepts.
pub const MAX_THREADS: usize = 1024;

static NEXT_CPU: AtomicU32 = AtomicU32::new(0);

/// Host memory available for new allocations (Linux's `MemAvailable`), in
/// bytes; `None` where the system does not say.
pub fn host_memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Configuration of a CPU backend instance.
#[derive(Clone, Debug)]
pub struct CpuConfig {
    /// Worker threads (1..=[`MAX_THREADS`]). Default: the machine's available parallelism.
    pub n_threads: usize,
    /// Largest single buffer, in bytes (default `usize::MAX / 2`); lower it to
    /// make the graph allocator split across several buffers.
    pub max_buffer_size: usize,
}

impl Default for CpuConfig {
    fn default() -> Self {
        CpuConfig {
            n_threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            max_buffer_size: usize::MAX / 2,
        }
    }
}

/// What a CPU device's computes wrote into stored tensors (weights,
/// caches: leafs that are not scratch), summed over every compute since it
/// was made: deterministic counts for tests, read with [`CpuBackend::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStats {
    /// Bytes copied into stored tensors by the graphs' writes through a
    /// view (`cpy`, and `set_rows`' rows): KV cache rows, conv states,
    /// snapshots, a state update that did not run in place.
    pub stored_copy_bytes: u64,
    /// Bytes of recurrent state a `gated_delta_net` wrote straight into the
    /// caches that keep it, fused with the copies the graph makes of it
    /// (`cpu/fuse.rs`): its final state back in place, or a verify batch's
    /// snapshots into their caches; the op's own write, no copy.
    pub in_place_state_bytes: u64,
    /// The copies that fusion skipped.
    pub fused_copies: u64,
}

/// A CPU device with its own thread pool and buffers.
pub struct CpuBackend {
    name: String,
    config: CpuConfig,
    pool: rayon::ThreadPool,
    stats: Mutex<CpuStats>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend").field("name", &self.name).field("config", &self.config).finish()
    }
}

impl CpuBackend {
    /// A CPU device with `config.n_threads` worker threads.
    ///
    /// # Errors
    /// [`Error::Compute`] if `n_threads` is 0 or the pool cannot start.
    pub fn new(config: CpuConfig) -> Result<Self> {
        if config.n_threads == 0 || config.n_threads > MAX_THREADS {
            return Err(Error::Compute {
                detail: format!("CpuConfig::n_threads is {}; it must be 1..={MAX_THREADS}", config.n_threads),
            });
        }
        let n = NEXT_CPU.fetch_add(1, Ordering::Relaxed);
        let name = format!("CPU{n}");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.n_threads)
            .thread_name(move |i| format!("shardgraph-cpu{n}-{i}"))
            .build()
            .map_err(|e| Error::Compute { detail: format!("thread pool: {e}") })?;
        Ok(CpuBackend { name, config, pool, stats: Mutex::new(CpuStats::default()) })
    }

    /// A CPU device with `n_threads` threads and default limits.
    ///
    /// # Errors
    /// As [`CpuBackend::new`].
    pub fn with_threads(n_threads: usize) -> Result<Self> {
        Self::new(CpuConfig { n_threads, ..CpuConfig::default() })
    }

    /// Worker thread count.
    pub fn n_threads(&self) -> usize {
        self.config.n_threads
    }

    /// What this device's computes have written into stored tensors so far.
    pub fn stats(&self) -> CpuStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes node `t` copies into a stored tensor (a `cpy` or
    /// `set_rows` into a leaf that is not scratch), else 0.
    fn stored_copy_bytes(ctx: &Context, t: &crate::tensor::Tensor) -> u64 {
        let Some(owner) = t.view_src.filter(|_| t.op.writes_through_view()) else { return 0 };
        let o = ctx.t(owner);
        if !o.op.is_leaf() || o.flags.scratch {
            return 0;
        }
        match t.op {
            // One row per row of the source (the indices' element count;
            // their own row count is 1 for a batch's one-dimensional list).
            crate::ops::Op::SetRows => {
                t.src.first().map_or(0, |&r| ctx.t(r).nrows().max(0) as u64 * t.row_bytes() as u64)
            }
            _ => t.data_bytes() as u64,
        }
    }

    fn view(&self, ctx: &Context, storage: &TensorStorage, id: TensorId) -> Result<TView> {
        let t = ctx.t(id);
        let (buf, offs) = storage.locate(ctx, id)?;
        let cpu = buf
            .as_any()
            .downcast_ref::<CpuBuffer>()
            .ok_or_else(|| Error::Compute { detail: format!("tensor {:?} lives in a non-CPU buffer", t.name) })?;
        let n = t.nbytes();
        if offs.checked_add(n).is_none_or(|e| e > cpu.size) {
            return Err(Error::OutOfBounds {
                detail: format!("tensor {:?} at {offs}+{n} exceeds its buffer of {}", t.name, cpu.size),
            });
        }
        // SAFETY: [offs, offs+n) was just checked to lie inside `cpu`, which the
        // storage's Arc keeps alive for the whole compute call.
        Ok(unsafe { TView::new(cpu.ptr.add(offs), t) })
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn device(&self) -> DeviceInfo {
        DeviceInfo {
            name: self.name.clone(),
            description: format!("CPU, {} threads", self.config.n_threads),
            kind: DeviceKind::Cpu,
            memory_total: 0,
        }
    }

    fn buffer_type(&self) -> BufferType {
        BufferType { name: "CPU".into(), alignment: CPU_ALIGNMENT, max_size: self.config.max_buffer_size }
    }

    fn alloc_buffer(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        if size > self.config.max_buffer_size {
            return Err(Error::Alloc {
                detail: format!("{size} bytes exceeds the CPU buffer maximum {}", self.config.max_buffer_size),
            });
        }
        Ok(Arc::new(CpuBuffer::new(size)?))
    }

    fn map_buffer(&self, bytes: &MappedBytes) -> Option<Result<Arc<dyn Buffer>>> {
        // Every CPU kernel reads weights in their file layout (ggml's
        // blocks), so any range can be computed on where it is mapped; an
        // empty one is allocated (a map cannot be empty).
        if bytes.is_empty() {
            return None;
        }
        Some(CpuBuffer::mapped(bytes).map(|b| Arc::new(b) as Arc<dyn Buffer>))
    }

    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        ctx.tensor(id).map(|t| kernels::supports(ctx, t)).unwrap_or(false)
    }

    fn run_on_device(&self, f: &mut (dyn FnMut() -> Result<()> + Send)) -> Result<()> {
        self.pool.install(f)
    }

    fn worker_threads(&self) -> usize {
        self.config.n_threads
    }

    fn compute(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> Result<()> {
        graph.check_context(ctx)?;
        // Hold every CPU buffer the graph touches for the whole run (in
        // address order, so concurrent runs over shared buffers cannot
        // deadlock): another thread's compute or set/get on the same memory
        // waits. (A storage may hold many more buffers than one graph uses:
        // every stored part of a model.)
        let mut used = vec![false; storage.buffers().len()];
        for &id in &graph.nodes {
            for &x in ctx.t(id).src.iter().chain(std::iter::once(&id)) {
                let owner = ctx.t(x).view_src.unwrap_or(x);
                if let Some((b, _)) = storage.slots.get(owner.index()).copied().flatten() {
                    if let Some(u) = used.get_mut(b) {
                        *u = true;
                    }
                }
            }
        }
        let mut cpu_bufs: Vec<&CpuBuffer> = storage
            .buffers()
            .iter()
            .zip(&used)
            .filter(|(_, &u)| u)
            .filter_map(|(b, _)| b.as_any().downcast_ref::<CpuBuffer>())
            .collect();
        cpu_bufs.sort_by_key(|b| b.ptr as usize);
        cpu_bufs.dedup_by_key(|b| b.ptr as usize);
        let _guards: Vec<_> = cpu_bufs.iter().map(|b| b.lock()).collect();
        let fused = fuse::plan(ctx, graph, |id| self.view(ctx, storage, id))?;
        let mut stats = CpuStats::default();
        let run = self.pool.install(|| {
            for &id in &graph.nodes {
                let t = ctx.t(id);
                if t.op.is_shape_only() || t.nelements() == 0 {
                    continue;
                }
                if !fused.skipped.is_empty() && fused.skipped.contains(&id.index()) {
                    stats.fused_copies += 1;
                    continue;
                }
                let dst = self.view(ctx, storage, id)?;
                let src: SmallVec<[TView; 6]> =
                    t.src.iter().map(|&s| self.view(ctx, storage, s)).collect::<Result<_>>()?;
                let in_place = !fused.in_place.is_empty() && fused.in_place.contains(&id.index());
                if in_place {
                    stats.in_place_state_bytes += t.src.get(5).map_or(0, |&s| ctx.t(s).nbytes() as u64);
                }
                let direct = match fused.direct.get(&id.index()) {
                    Some(slots) => Some(
                        slots
                            .iter()
                            .map(|s| s.iter().map(|&c| self.view(ctx, storage, c)).collect::<Result<Vec<_>>>())
                            .collect::<Result<Vec<_>>>()?,
                    ),
                    None => None,
                };
                if let Some(slots) = fused.direct.get(&id.index()) {
                    stats.in_place_state_bytes +=
                        slots.iter().flatten().map(|&c| ctx.t(c).nbytes() as u64).sum::<u64>();
                }
                stats.stored_copy_bytes += Self::stored_copy_bytes(ctx, t);
                // Contain a kernel panic (a bug, never expected) as an error.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if let Some(dests) = &direct {
                        kernels::ssm::gated_delta_net_direct(&t.op, &dst, &src, dests)
                    } else if in_place {
                        kernels::ssm::gated_delta_net_in_place(&t.op, &dst, &src)
                    } else {
                        kernels::compute(&t.op, &dst, &src)
                    }
                }))
                .map_err(|_| Error::Compute {
                    detail: format!("kernel for {} on {} panicked", t.op.name(), t.describe()),
                })??;
            }
            Ok(())
        });
        let mut total = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        total.stored_copy_bytes += stats.stored_copy_bytes;
        total.in_place_state_bytes += stats.in_place_state_bytes;
        total.fused_copies += stats.fused_copies;
        run
    }
}

/// A zero-initialised, [`CPU_ALIGNMENT`]-aligned host allocation. Large
/// ones ([`CpuBuffer::MAPPED_FROM`] bytes and up: weights, KV caches) are
/// anonymous memory maps, zero-filled by the kernel page by page when first
/// touched, so a 65536-cell cache costs nothing until cells are written.
/// Weights of a mapped model file are computed on where the file is mapped
/// ([`Backend::map_buffer`]: a private map, aligned as the file aligns them).
pub struct CpuBuffer {
    ptr: *mut u8,
    size: usize,
    mem: Mem,
    /// Held by a running compute and by each `set`/`get`, so no two threads
    /// touch the memory at once.
    busy: Mutex<()>,
}

/// Where a [`CpuBuffer`]'s memory comes from.
enum Mem {
    /// The global allocator, with this layout.
    Heap(Layout),
    /// An anonymous map, or a private (copy-on-write) map of a file's bytes
    /// ([`CpuBuffer::mapped`]); kept alive here, unmapped on drop.
    Map(#[allow(dead_code)] memmap2::MmapMut),
}

// SAFETY: the buffer is plain memory; concurrent access follows the kernel
// invariants in `access.rs` (disjoint writers) and the `set`/`get` copies.
unsafe impl Send for CpuBuffer {}
// SAFETY: as above.
unsafe impl Sync for CpuBuffer {}

impl std::fmt::Debug for CpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuBuffer({} bytes)", self.size)
    }
}

impl CpuBuffer {
    /// Size from which buffers are anonymous maps (1 MiB).
    pub const MAPPED_FROM: usize = 1 << 20;

    fn new(size: usize) -> Result<Self> {
        if size >= Self::MAPPED_FROM {
            let mut map = memmap2::MmapMut::map_anon(size)
                .map_err(|e| Error::Alloc { detail: format!("out of memory mapping {size} bytes: {e}") })?;
            let ptr = map.as_mut_ptr();
            // A map is page-aligned, which is at least CPU_ALIGNMENT.
            return Ok(CpuBuffer { ptr, size, mem: Mem::Map(map), busy: Mutex::new(()) });
        }
        let layout = Layout::from_size_align(size.max(1), CPU_ALIGNMENT)
            .map_err(|e| Error::Alloc { detail: format!("{size} bytes: {e}") })?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Alloc { detail: format!("out of memory allocating {size} bytes") });
        }
        Ok(CpuBuffer { ptr, size, mem: Mem::Heap(layout), busy: Mutex::new(()) })
    }

    /// A buffer over a file's bytes, mapped privately ([`MappedBytes::map_private`]):
    /// no copy, no anonymous memory until a write copies a page. Its start
    /// is where the range lies in its page (GGUF aligns tensor data to 32
    /// bytes; the kernels read with unaligned loads).
    fn mapped(bytes: &MappedBytes) -> Result<Self> {
        let mut map = bytes
            .map_private()
            .map_err(|e| Error::Alloc { detail: format!("mapping {} bytes of a file: {e}", bytes.len()) })?;
        let (ptr, size) = (map.as_mut_ptr(), map.len());
        Ok(CpuBuffer { ptr, size, mem: Mem::Map(map), busy: Mutex::new(()) })
    }

    /// The address of the first byte. Host memory, valid while the buffer
    /// lives; an embedding engine that shares it (shardgraph's ggml backend
    /// library gives it to ggml as the buffer's base) must not touch it
    /// while a compute runs on the buffer.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Exclusive access to the memory (poisoning is ignored: the memory is plain bytes).
    fn lock(&self) -> MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(Error::OutOfBounds {
                detail: format!("bytes {offset}..+{len} of a {}-byte buffer", self.size),
            });
        }
        Ok(())
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        if let Mem::Heap(layout) = self.mem {
            // SAFETY: allocated in `new` with this layout (a map unmaps itself).
            unsafe { std::alloc::dealloc(self.ptr, layout) }
        }
    }
}

impl Buffer for CpuBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        let _g = self.lock();
        // SAFETY: range checked; `data` is a caller slice, never buffer memory handed out as a reference.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) };
        Ok(())
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        let _g = self.lock();
        // SAFETY: range checked; `out` is caller-owned.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
    fn clear(&self, value: u8) {
        let _g = self.lock();
        // SAFETY: the whole allocation.
        unsafe { std::ptr::write_bytes(self.ptr, value, self.size) };
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
