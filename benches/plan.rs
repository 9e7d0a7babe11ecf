//! Planning time for a real-dimension graph: Qwen3-32B (64 layers, n_embd
//! 5120, 64 heads and 8 KV heads of 128, n_ff 25600) on 2 and 4 devices,
//! first plan and cached re-plan. No weights are allocated: planning needs
//! only shapes.

#[path = "../tests/common/qwen3.rs"]
mod qwen3;

use criterion::{criterion_group, criterion_main, Criterion};
use qwen3::{qwen3_layers, qwen3_policy, Dims};
use shardgraph::split::Planner;
use shardgraph::Context;

fn plan_qwen3_32b(c: &mut Criterion) {
    let dims = Dims { e: 5120, h: 64, hkv: 8, d: 128, f: 25600, t: 1 };
    let mut ctx = Context::new();
    let out = qwen3_layers(&mut ctx, &dims, 64);
    let graph = ctx.build_forward(&[out]).expect("graph");
    println!("qwen3-32b decode graph: {} nodes, {} leafs", graph.n_nodes(), graph.leafs().len());
    let mut group = c.benchmark_group("plan_qwen3_32b");
    group.sample_size(10);
    for n in [2usize, 4] {
        let policy = qwen3_policy(&vec![1.0; n], dims.d, dims.h / dims.hkv);
        let plan = Planner::default().plan(&ctx, &graph, &policy, &[]).expect("plan");
        let mem = plan.memory(&ctx, &graph).expect("memory");
        println!(
            "  {n} devices: {} repartitions, {} bytes per decode step",
            plan.repartitions.len(),
            plan.total_bytes()
        );
        for (j, m) in mem.iter().enumerate() {
            println!("    device {j}: weights {} B, compute peak {} B", m.weights, m.compute);
        }
        group.bench_function(format!("plan_{n}_devices"), |b| {
            b.iter(|| Planner::default().plan(&ctx, &graph, &policy, &[]).expect("plan").total_bytes())
        });
        let mut cached = Planner::default();
        cached.plan_cached(&ctx, &graph, &policy, &[]).expect("plan");
        group.bench_function(format!("replan_cached_{n}_devices"), |b| {
            b.iter(|| cached.plan_cached(&ctx, &graph, &policy, &[]).expect("plan").total_bytes())
        });
    }
    group.finish();
}

criterion_group!(benches, plan_qwen3_32b);
criterion_main!(benches);
