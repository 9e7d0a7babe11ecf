//! Graph fixtures shared by the integration tests: named leafs, one CPU
//! device holding a graph with its leafs filled (the single-device reference
//! the split tests compare against), and a graph run on one backend.
#![allow(dead_code)]

use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::{Backend, Context, CpuBackend, GgmlType, Graph, Result, TensorId, TensorStorage};
use std::collections::HashMap;

/// A leaf named `name`.
pub fn named(ctx: &mut Context, ty: GgmlType, ne: &[i64], name: &str) -> TensorId {
    let t = ctx.new_tensor(ty, ne).unwrap();
    ctx.set_name(t, name).unwrap();
    t
}

/// A named leaf flagged as a graph input.
pub fn input(ctx: &mut Context, ty: GgmlType, ne: &[i64], name: &str) -> TensorId {
    let t = named(ctx, ty, ne, name);
    ctx.set_input(t).unwrap();
    t
}

/// F32 values as the little-endian bytes a tensor holds.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One CPU device holding a graph, ready to compute: its leafs allocated
/// and filled, then the rest of the graph allocated.
pub struct OneCpu {
    pub cpu: CpuBackend,
    pub storage: TensorStorage,
    /// Every leaf's bytes as filled, read before anything computes (a graph
    /// may write into its leafs: caches, `cpy` destinations).
    pub leaf_bytes: HashMap<TensorId, Vec<u8>>,
}

impl OneCpu {
    /// A CPU backend with `threads` threads holding `graph`: allocates the
    /// leafs, calls `fill(storage, leaf)` once per leaf in `graph.leafs()`
    /// order (a leaf it leaves alone keeps the allocation's bytes), records
    /// the leafs' bytes, then allocates the other nodes. Errors are those of
    /// the backend and the allocators.
    pub fn new(
        ctx: &Context,
        graph: &Graph,
        threads: usize,
        mut fill: impl FnMut(&TensorStorage, TensorId),
    ) -> Result<Self> {
        let cpu = CpuBackend::with_threads(threads)?;
        let mut storage = TensorStorage::new();
        storage.alloc_tensors(&cpu, ctx, graph.leafs())?;
        for &l in graph.leafs() {
            fill(&storage, l);
        }
        let mut leaf_bytes = HashMap::new();
        for &l in graph.leafs() {
            let mut b = vec![0u8; ctx.tensor(l)?.nbytes()];
            storage.get_bytes(ctx, l, 0, &mut b)?;
            leaf_bytes.insert(l, b);
        }
        GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, ctx, graph, &mut storage)?;
        Ok(OneCpu { cpu, storage, leaf_bytes })
    }

    /// Computes `graph` (the one given to [`OneCpu::new`]).
    pub fn compute(&self, ctx: &Context, graph: &Graph) -> Result<()> {
        self.cpu.compute(ctx, graph, &self.storage)
    }
}

/// Runs the graph of `outs` on `backend` with the F32 leaf values `leafs`
/// (the other leafs keep the allocation's bytes) and returns each output
/// as F32 values. Panics on any error (a test helper).
pub fn run_graph(
    backend: &dyn Backend,
    ctx: &Context,
    leafs: &[(TensorId, Vec<f32>)],
    outs: &[TensorId],
) -> Vec<Vec<f32>> {
    let g = ctx.build_forward(outs).unwrap();
    let mut st = TensorStorage::new();
    st.alloc_tensors(backend, ctx, g.leafs()).unwrap();
    GraphAllocator::new(backend.buffer_type()).alloc_graph(backend, ctx, &g, &mut st).unwrap();
    for (id, vals) in leafs {
        st.set_f32(ctx, *id, vals).unwrap();
    }
    backend.compute(ctx, &g, &st).unwrap();
    outs.iter().map(|&o| st.get_f32(ctx, o).unwrap()).collect()
}

/// [`run_graph`] with the leafs filled from raw bytes in their own types
/// (`leafs`: e.g. random quant blocks, I32 indices), every other leaf
/// keeping the allocation's bytes. Panics on any error (a test helper).
pub fn run_graph_bytes(
    backend: &dyn Backend,
    ctx: &Context,
    leafs: &[(TensorId, Vec<u8>)],
    outs: &[TensorId],
) -> Vec<Vec<f32>> {
    let g = ctx.build_forward(outs).unwrap();
    let mut st = TensorStorage::new();
    st.alloc_tensors(backend, ctx, g.leafs()).unwrap();
    GraphAllocator::new(backend.buffer_type()).alloc_graph(backend, ctx, &g, &mut st).unwrap();
    for (id, bytes) in leafs {
        st.set_bytes(ctx, *id, 0, bytes).unwrap();
    }
    backend.compute(ctx, &g, &st).unwrap();
    outs.iter().map(|&o| st.get_f32(ctx, o).unwrap()).collect()
}
