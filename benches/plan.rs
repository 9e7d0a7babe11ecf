//! Planning time for a real-dimension graph: Qwen3-32B (64 layers, n_embd
//! 5120, 64 heads and 8 KV heads of 128, n_ff 25600) on 2 and 4 devices,
//! first plan and cached re-plan; and the host's whole per-step overhead
//! of a Qwen3-32B decode step (position 4000 of a 65536-cell cache) on 2
//! devices: building its graph, finding its plan and compiled program, and
//! writing its inputs. No weights are allocated: planning and compiling
//! need only shapes.

#[path = "../tests/common/qwen3.rs"]
mod qwen3;

use criterion::{criterion_group, criterion_main, Criterion};
use qwen3::{qwen3_layers, qwen3_policy, Dims};
use shardgraph::split::{Devices, Planner, SplitState, SplitStore};
use shardgraph::{Context, GgmlType};
use shardgraph_models::qwen3::{Qwen3, Qwen3Hparams};
use shardgraph_models::types::TensorTypes;
use std::time::Instant;

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
        group.bench_function(format!("plan_for_known_step_{n}_devices"), |b| {
            b.iter(|| cached.plan_for(&ctx, &graph, &policy).expect("plan").total_bytes())
        });
    }
    group.finish();
}

/// Mean wall time of `f` over `iters` runs, µs.
fn mean_us(iters: u32, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// The host's per-step work of a Qwen3-32B decode step on 2 CPU devices,
/// as `Qwen3Session::decode` does it: the step graph (rebuilt, or kept from
/// the last step of the same shape), its plan (`Planner::plan_for`), its
/// program (`MetaExecutor::prepare`, the executor's lookup), its inputs
/// (`SplitStore::set_tensor`). Printed, not asserted (a timing).
fn step_overhead_qwen3_32b(_: &mut Criterion) {
    let hp = Qwen3Hparams::qwen3_32b();
    let types = TensorTypes::q4_k_m();
    let mut ctx = Context::new();
    let model = Qwen3::new(&mut ctx, hp.clone(), &types, GgmlType::F16, 65536).expect("model");
    let base = ctx.len();
    let ratios = [1.0, 1.0];
    let policy = shardgraph_models::qwen3::qwen3_policy(&hp, &types, &ratios).expect("policy");
    let exec = Devices::cpu(2, 1).and_then(|d| d.executor()).expect("executor");
    let mut planner = Planner::default();
    let (pos, n_kv) = (4000i32, shardgraph_models::kv_window(65536, 4001));
    let build = |ctx: &mut Context| {
        ctx.truncate(base);
        let step = model.build_window(ctx, 1, n_kv, &[]).expect("step");
        let mut outputs = step.outputs();
        outputs.retain(|&o| o != step.logits);
        let g = ctx.build_forward(&outputs).expect("graph");
        (step, outputs, g)
    };
    let (step, outputs, graph) = build(&mut ctx);
    let wanted = vec![step.argmax];
    let plan = planner.plan_for(&ctx, &graph, &policy).expect("plan").clone();
    let t = Instant::now();
    let summary = exec.prepare(&ctx, &graph, &plan, &wanted).expect("program");
    let compile_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut store = SplitStore::new(2);
    for id in [step.tokens, step.pos, step.mask, step.kv_idxs] {
        store.place(&ctx, id, &SplitState::Mirrored).expect("input");
    }
    let mask: Vec<u8> = (0..n_kv).flat_map(|c| if c <= pos as i64 { [0u8, 0] } else { [0x00, 0xfc] }).collect();
    let inputs = [
        (step.tokens, 7i32.to_le_bytes().to_vec()),
        (step.pos, pos.to_le_bytes().to_vec()),
        (step.mask, mask),
        (step.kv_idxs, (pos as i64).to_le_bytes().to_vec()),
    ];
    let t_plan = mean_us(2000, || {
        planner.plan_for(&ctx, &graph, &policy).expect("plan");
    });
    let t_program = mean_us(2000, || {
        exec.prepare(&ctx, &graph, &plan, &wanted).expect("program");
    });
    let t_inputs = mean_us(2000, || {
        for (id, b) in &inputs {
            store.set_tensor(&ctx, *id, 0, b).expect("input");
        }
    });
    let t_build = mean_us(50, || {
        let _ = build(&mut ctx);
    });
    let kept = t_plan + t_program + t_inputs;
    println!(
        "qwen3-32b decode step at position {pos} of 65536 cells (window {n_kv}), 2 devices: {} nodes; program: {} local graphs and {} exchanges per device, compiled once in {compile_ms:.0} ms",
        graph.n_nodes(),
        summary.subgraphs,
        summary.exchanges
    );
    println!(
        "per-step host overhead: plan lookup {t_plan:.1} µs + program lookup {t_program:.1} µs + inputs {t_inputs:.1} µs = {kept:.1} µs with the step graph kept (the decode loop); rebuilding the graph adds {t_build:.0} µs (once per 256 positions)"
    );
    let _ = outputs;
}

criterion_group!(benches, step_overhead_qwen3_32b, plan_qwen3_32b);
criterion_main!(benches);
