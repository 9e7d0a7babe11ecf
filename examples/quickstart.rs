//! The README's quick-start: a tiny graph (mul_mat then soft_max) on the
//! CPU backend, then the README's tensor-parallel example: the same kind of
//! graph with Q8_0 weights on 3 CPU devices with tensor split 2,1,1.
//!
//! `cargo run --release --example quickstart`

use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::split::{Devices, Planner, SplitSpec};
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorStorage};

fn main() -> shardgraph::Result<()> {
    one_device()?;
    tensor_parallel()
}

/// mul_mat then soft_max on one CPU device.
fn one_device() -> shardgraph::Result<()> {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_named(GgmlType::F32, &[4, 3], "w")?; // weights [K = 4, M = 3]
    let x = ctx.new_input(GgmlType::F32, &[4, 2], "x")?; // input   [K = 4, N = 2]
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

/// An FFN (Q8_0 weights, up split on rows, down on its input axis) into
/// soft_max on 3 CPU devices with tensor split 2,1,1, checked against one
/// device.
fn tensor_parallel() -> shardgraph::Result<()> {
    // Or Devices::parse("CUDA0,CUDA1", 1)? with --features cuda.
    let devices = Devices::cpu(3, 1)?.with_tensor_split(&[2.0, 1.0, 1.0])?;

    let mut ctx = Context::new();
    let x = ctx.new_input(GgmlType::F32, &[64, 2], "inp")?; // [n_embd, n_tokens]
    let up = ctx.new_tensor_named(GgmlType::Q8_0, &[64, 256], "ffn_up.weight")?;
    let down = ctx.new_tensor_named(GgmlType::Q8_0, &[256, 64], "ffn_down.weight")?;
    let h = ctx.mul_mat(up, x)?; // [256, 2]: split on rows
    let a = ctx.silu(h)?;
    let y = ctx.mul_mat(down, a)?; // [64, 2]: partial sums, all-reduced before the soft_max
    let probs = ctx.soft_max(y)?;
    let best = ctx.argmax(y)?;
    let graph = ctx.build_forward(&[probs, best])?;

    // Split rules match tensor names.
    let axis = |axis| SplitSpec::Axis { axis, granule: 32, segments: vec![] };
    let policy = devices.policy()?.rule("ffn_up.weight", axis(1)).rule("ffn_down.weight", axis(0));
    let plan = Planner::default().plan(&ctx, &graph, &policy, &[])?;
    println!("{}", plan.describe(&ctx, &graph)?);

    let values = |n: usize, s: f32| (0..n).map(|i| (i as f32 * s).sin() / 8.0).collect::<Vec<_>>();
    let leafs = [(up, values(64 * 256, 0.37)), (down, values(256 * 64, 0.91)), (x, values(64 * 2, 1.3))];
    let mut store = devices.store();
    store.place_leafs(&ctx, &graph, &plan)?;
    for (id, v) in &leafs {
        store.set_f32(&ctx, *id, v)?; // quantized to Q8_0 per device part
    }
    let report = devices.executor()?.execute(&ctx, &graph, &plan, &mut store, &[probs, best])?;
    let p = report.f32(0)?; // [64, 2]
    let argmax = report.i32(1)?; // [2]

    // The same graph on one device.
    let cpu = CpuBackend::with_threads(2)?;
    let mut one = TensorStorage::new();
    one.alloc_tensors(&cpu, &ctx, graph.leafs())?;
    for (id, v) in &leafs {
        one.set_f32(&ctx, *id, v)?;
    }
    GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &ctx, &graph, &mut one)?;
    cpu.compute(&ctx, &graph, &one)?;
    let want = one.get_f32(&ctx, probs)?;
    let max_diff = p.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let sums: Vec<f32> = p.chunks(64).map(|col| col.iter().sum()).collect();
    println!(
        "3 devices: soft_max columns sum to {sums:?}, argmax {argmax:?} (one device {:?}), max |diff| vs one device {max_diff:.1e}, {} bytes moved (plan {})",
        one.get_i32(&ctx, best)?,
        report.bytes_moved,
        plan.total_bytes()
    );
    Ok(())
}
