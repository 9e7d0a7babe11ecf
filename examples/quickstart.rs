//! The README's quick-start: a tiny graph (mul_mat then soft_max) on the CPU backend.

use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorStorage};

fn main() -> shardgraph::Result<()> {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(GgmlType::F32, 4, 3)?; // weights [K = 4, M = 3]
    let x = ctx.new_tensor_2d(GgmlType::F32, 4, 2)?; // input   [K = 4, N = 2]
    let y = ctx.mul_mat(w, x)?; // [M = 3, N = 2]
    let p = ctx.soft_max(y)?;
    let graph = ctx.build_forward(&[p])?;

    let cpu = CpuBackend::with_threads(2)?;
    let mut storage = TensorStorage::new();
    storage.alloc_tensors(&cpu, &ctx, graph.leafs())?;
    storage.set_f32(&ctx, w, &[1., 0., 0., 0., 0., 1., 0., 0., 0., 0., 1., 0.])?;
    storage.set_f32(&ctx, x, &[1., 2., 3., 4., 0., 0., 0., 0.])?;
    let mut galloc = GraphAllocator::new(cpu.buffer_type());
    let stats = galloc.alloc_graph(&cpu, &ctx, &graph, &mut storage)?;
    cpu.compute(&ctx, &graph, &storage)?;

    let probs = storage.get_f32(&ctx, p)?;
    println!(
        "graph: {} nodes, {} leafs, compute peak {} bytes",
        graph.n_nodes(),
        graph.leafs().len(),
        stats.peak_bytes
    );
    for (col, c) in probs.chunks(3).enumerate() {
        println!("soft_max(W·x[:, {col}]) = {c:?}");
    }
    Ok(())
}
