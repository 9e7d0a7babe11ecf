//! A CPU device that counts the device memory allocated through it (live
//! bytes and their peak), and can report itself as a GPU with a given
//! amount of memory — for memory-accounting and fit tests that need
//! deterministic numbers instead of the host's.
#![allow(dead_code)]

use shardgraph::backend::cpu::{CpuBackend, CpuConfig};
use shardgraph::backend::{Backend, Buffer, BufferType, DeviceInfo, DeviceKind, TensorStorage};
use shardgraph::{Context, Graph, TensorId};
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Live and peak bytes of one device.
#[derive(Debug, Default)]
pub struct Counter {
    live: AtomicU64,
    peak: AtomicU64,
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
}

/// A CPU backend whose buffers are counted; with `memory`, it says it is a
/// GPU of that many bytes (so [`shardgraph::split::MetaExecutor::check_memory`]
/// checks against it instead of the host's memory).
pub struct Counting {
    inner: CpuBackend,
    name: String,
    memory: Option<usize>,
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
        self.inner.set(offset, data)
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> shardgraph::Result<()> {
        self.inner.get(offset, out)
    }
    fn clear(&self, value: u8) {
        self.inner.clear(value)
    }
    fn copy_from(&self, dst_offset: usize, src: &dyn Buffer, src_offset: usize, n: usize) -> shardgraph::Result<()> {
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
        let inner = self.inner.alloc_buffer(size)?;
        let live = self.counter.live.fetch_add(inner.size() as u64, Ordering::SeqCst) + inner.size() as u64;
        self.counter.peak.fetch_max(live, Ordering::SeqCst);
        Ok(Arc::new(CountedBuffer { inner, counter: self.counter.clone() }))
    }
    fn supports_op(&self, ctx: &Context, id: TensorId) -> bool {
        self.inner.supports_op(ctx, id)
    }
    fn compute(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> shardgraph::Result<()> {
        self.inner.compute(ctx, graph, storage)
    }
    fn compute_async(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> shardgraph::Result<()> {
        self.inner.compute_async(ctx, graph, storage)
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
/// with `memory`, each reports itself as a GPU of `memory[j]` bytes.
pub fn devices(n: usize, memory: Option<&[usize]>) -> (Vec<Arc<dyn Backend>>, Vec<Arc<Counter>>) {
    let mut devs: Vec<Arc<dyn Backend>> = Vec::new();
    let mut counters = Vec::new();
    for j in 0..n {
        let counter = Arc::new(Counter::default());
        let inner = CpuBackend::new(CpuConfig { n_threads: 1, ..CpuConfig::default() }).expect("CPU device");
        let memory = memory.map(|m| m[j]);
        devs.push(Arc::new(Counting { inner, name: format!("COUNT{j}"), memory, counter: counter.clone() }));
        counters.push(counter);
    }
    (devs, counters)
}
