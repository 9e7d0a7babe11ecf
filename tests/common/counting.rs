//! A CPU device that counts the device memory allocated through it (live
//! bytes, their peak, every byte ever allocated) and the bytes that cross
//! its buffers' edges (written from the host, read to the host, copied in
//! from another buffer), and can report itself as a GPU with a given
//! amount of memory, optionally enforced (an allocation past it is
//! [`shardgraph::Error::OutOfMemory`]) — for memory-accounting, fit and
//! runtime tests that need deterministic numbers, counted outside the
//! executor, instead of the host's; and what its computes wrote into
//! stored tensors (the CPU backend's `CpuStats`).
#![allow(dead_code)]

use shardgraph::backend::cpu::{CpuBackend, CpuConfig};
use shardgraph::backend::{Backend, Buffer, BufferType, DeviceInfo, DeviceKind, TensorStorage};
use shardgraph::{Context, Graph, TensorId};
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What one device allocated and moved through its buffers.
#[derive(Debug, Default)]
pub struct Counter {
    live: AtomicU64,
    peak: AtomicU64,
    allocated: AtomicU64,
    allocations: AtomicU64,
    set: AtomicU64,
    got: AtomicU64,
    copied_in: AtomicU64,
    stored_copies: AtomicU64,
    in_place: AtomicU64,
    fused: AtomicU64,
}

impl Counter {
    /// Bytes allocated and not yet freed.
    pub fn live(&self) -> u64 {
        self.live.load(Ordering::SeqCst)
    }
    /// The most bytes live at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }
    /// Bytes of every buffer ever allocated (freed ones too).
    pub fn allocated(&self) -> u64 {
        self.allocated.load(Ordering::SeqCst)
    }
    /// Buffers ever allocated.
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::SeqCst)
    }
    /// Bytes written into the device's buffers from the host (`Buffer::set`).
    pub fn bytes_set(&self) -> u64 {
        self.set.load(Ordering::SeqCst)
    }
    /// Bytes read from the device's buffers to the host (`Buffer::get`).
    pub fn bytes_got(&self) -> u64 {
        self.got.load(Ordering::SeqCst)
    }
    /// Bytes copied into the device's buffers from another buffer
    /// (`Buffer::copy_from`: the exchanges between devices).
    pub fn bytes_copied_in(&self) -> u64 {
        self.copied_in.load(Ordering::SeqCst)
    }
    /// Bytes the device's computes copied into stored tensors (`cpy` and
    /// `set_rows` into weights or caches: `CpuStats::stored_copy_bytes`).
    pub fn stored_copy_bytes(&self) -> u64 {
        self.stored_copies.load(Ordering::SeqCst)
    }
    /// Bytes of recurrent state its computes updated in place
    /// (`CpuStats::in_place_state_bytes`).
    pub fn in_place_state_bytes(&self) -> u64 {
        self.in_place.load(Ordering::SeqCst)
    }
    /// State copies its computes fused away (`CpuStats::fused_copies`).
    pub fn fused_copies(&self) -> u64 {
        self.fused.load(Ordering::SeqCst)
    }
}

impl Counting {
    /// Runs `f` (a compute on the inner device) and adds what it wrote into
    /// stored tensors to the counter.
    fn counted(&self, f: impl FnOnce(&CpuBackend) -> shardgraph::Result<()>) -> shardgraph::Result<()> {
        let before = self.inner.stats();
        let r = f(&self.inner);
        let after = self.inner.stats();
        let c = &self.counter;
        c.stored_copies.fetch_add(after.stored_copy_bytes - before.stored_copy_bytes, Ordering::SeqCst);
        c.in_place.fetch_add(after.in_place_state_bytes - before.in_place_state_bytes, Ordering::SeqCst);
        c.fused.fetch_add(after.fused_copies - before.fused_copies, Ordering::SeqCst);
        r
    }
}

/// A CPU backend whose buffers are counted; with `memory`, it says it is a
/// GPU of that many bytes (so [`shardgraph::split::MetaExecutor::check_memory`]
/// checks against it instead of the host's memory), and with `enforce` an
/// allocation that would take the live bytes past `memory` fails.
pub struct Counting {
    inner: CpuBackend,
    name: String,
    memory: Option<usize>,
    enforce: bool,
    /// The device's counter.
    pub counter: Arc<Counter>,
}

#[derive(Debug)]
struct CountedBuffer {
    inner: Arc<dyn Buffer>,
    counter: Arc<Counter>,
}

impl Drop for CountedBuffer {
    fn drop(&mut self) {
        self.counter.live.fetch_sub(self.inner.size() as u64, Ordering::SeqCst);
    }
}

impl Buffer for CountedBuffer {
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn set(&self, offset: usize, data: &[u8]) -> shardgraph::Result<()> {
        self.counter.set.fetch_add(data.len() as u64, Ordering::SeqCst);
        self.inner.set(offset, data)
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> shardgraph::Result<()> {
        self.counter.got.fetch_add(out.len() as u64, Ordering::SeqCst);
        self.inner.get(offset, out)
    }
    fn clear(&self, value: u8) {
        self.inner.clear(value)
    }
    fn copy_from(&self, dst_offset: usize, src: &dyn Buffer, src_offset: usize, n: usize) -> shardgraph::Result<()> {
        self.counter.copied_in.fetch_add(n as u64, Ordering::SeqCst);
        self.inner.copy_from(dst_offset, src, src_offset, n)
    }
    fn as_any(&self) -> &dyn Any {
        // The CPU kernels reach the memory through the CPU buffer.
        self.inner.as_any()
    }
}

impl Backend for Counting {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn device(&self) -> DeviceInfo {
        let mut d = self.inner.device();
        d.name = self.name.clone();
        if let Some(m) = self.memory {
            d.kind = DeviceKind::Gpu;
            d.memory_total = m;
        }
        d
    }
    fn buffer_type(&self) -> BufferType {
        self.inner.buffer_type()
    }
    fn alloc_buffer(&self, size: usize) -> shardgraph::Result<Arc<dyn Buffer>> {
        if let (true, Some(m)) = (self.enforce, self.memory) {
            let live = self.counter.live();
            if live.saturating_add(size as u64) > m as u64 {
                return Err(shardgraph::Error::OutOfMemory {
                    device: self.name.clone(),
                    detail: format!("a counted buffer of {size} bytes with {live} live"),
                    needed: live.saturating_add(size as u64),
                    available: m as u64,
                });
            }
        }
        let inner = self.inner.alloc_buffer(size)?;
        let live = self.counter.live.fetch_add(inner.size() as u64, Ordering::SeqCst) + inner.size() as u64;
        self.counter.peak.fetch_max(live, Ordering::SeqCst);
        self.counter.allocated.fetch_add(inner.size() as u64, Ordering::SeqCst);
        self.counter.allocations.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(CountedBuffer { inner, counter: self.counter.clone() }))
    }
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        self.inner.supports_op(ctx, id)
    }
    fn compute(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> shardgraph::Result<()> {
        self.counted(|b| b.compute(ctx, graph, storage))
    }
    fn compute_async(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> shardgraph::Result<()> {
        self.counted(|b| b.compute_async(ctx, graph, storage))
    }
    fn synchronize(&self) -> shardgraph::Result<()> {
        self.inner.synchronize()
    }
    fn worker_threads(&self) -> usize {
        self.inner.worker_threads()
    }
    fn run_on_device(&self, f: &mut (dyn FnMut() -> shardgraph::Result<()> + Send)) -> shardgraph::Result<()> {
        self.inner.run_on_device(f)
    }
}

/// `n` counted CPU devices (one thread each), named `COUNT0`, `COUNT1`, …;
/// with `memory`, each reports itself as a GPU of `memory[j]` bytes (and
/// allocates past it all the same).
pub fn devices(n: usize, memory: Option<&[usize]>) -> (Vec<Arc<dyn Backend>>, Vec<Arc<Counter>>) {
    make(n, memory, false)
}

/// [`devices`] that hold at most `memory[j]` bytes: an allocation past it is
/// [`shardgraph::Error::OutOfMemory`] naming the device.
pub fn limited(memory: &[usize]) -> (Vec<Arc<dyn Backend>>, Vec<Arc<Counter>>) {
    make(memory.len(), Some(memory), true)
}

fn make(n: usize, memory: Option<&[usize]>, enforce: bool) -> (Vec<Arc<dyn Backend>>, Vec<Arc<Counter>>) {
    let mut devs: Vec<Arc<dyn Backend>> = Vec::new();
    let mut counters = Vec::new();
    for j in 0..n {
        let counter = Arc::new(Counter::default());
        let inner = CpuBackend::new(CpuConfig { n_threads: 1, ..CpuConfig::default() }).expect("CPU device");
        let memory = memory.map(|m| m[j]);
        devs.push(Arc::new(Counting { inner, name: format!("COUNT{j}"), memory, enforce, counter: counter.clone() }));
        counters.push(counter);
    }
    (devs, counters)
}
