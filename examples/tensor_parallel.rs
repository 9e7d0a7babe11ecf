//! One graph tensor-parallel on N CPU devices: a SwiGLU FFN block with
//! llama.cpp's `--split-mode tensor` layout (gate/up split on rows, down on
//! its input axis) followed by a vocabulary-split output head whose logits go
//! into soft_max, argmax and top_k — the combination ggml's meta backend
//! aborts on or gets wrong. Prints the plan (states, collectives, bytes,
//! memory per device), runs it, and checks the result against one device:
//! argmax and top_k exactly, soft_max within NMSE 1e-6 (sums in another
//! order), and the bytes moved equal to the plan's; it ends with `verify:
//! identical — …` saying so, or `verify: DIFFERENT — …` naming what
//! differs, with exit status 1.
//!
//! `cargo run --release --example tensor_parallel -- --devices 3 --tensor-split 3,2,1`

use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::split::{Devices, Planner, SplitSpec};
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorStorage};

#[path = "common/spec.rs"]
mod spec;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    spec::check_options(&args, "tensor_parallel", &["--devices", "--tensor-split", "--split-mode"]);
    let (ratios, _) = spec::devices(&args, 2);
    if let Err(e) = run(&ratios) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Plans, runs and checks the example graph on `ratios.len()` CPU devices.
fn run(ratios: &[f32]) -> shardgraph::Result<()> {
    let n = ratios.len();
    let (e, f, vocab, t) = (256i64, 1024i64, 4096i64, 4i64);
    // N CPU devices (2 worker threads each) holding the shares `ratios` of
    // every split tensor: the policy, store and executor all come from it.
    let devices = Devices::cpu(n, 2)?.with_tensor_split(ratios)?;

    // The graph: x → rms_norm → SwiGLU FFN → residual → output head → soft_max, argmax, top_k.
    let mut ctx = Context::new();
    let x = ctx.new_input(GgmlType::F32, &[e, t], "inp_embd")?;
    let wg = ctx.new_tensor_named(GgmlType::Q8_0, &[e, f], "blk.0.ffn_gate.weight")?;
    let wu = ctx.new_tensor_named(GgmlType::Q8_0, &[e, f], "blk.0.ffn_up.weight")?;
    let wd = ctx.new_tensor_named(GgmlType::Q8_0, &[f, e], "blk.0.ffn_down.weight")?;
    let head = ctx.new_tensor_named(GgmlType::Q8_0, &[e, vocab], "output.weight")?;
    let xn = ctx.rms_norm(x, 1e-6)?;
    let gate = ctx.mul_mat(wg, xn)?;
    let up = ctx.mul_mat(wu, xn)?;
    let act = ctx.swiglu_split(gate, up)?;
    let down = ctx.mul_mat(wd, act)?;
    let h = ctx.add(down, x)?;
    let logits = ctx.mul_mat(head, h)?; // [vocab, t], split on the vocabulary
    let probs = ctx.soft_max(logits)?;
    let best = ctx.argmax(logits)?;
    let top = ctx.top_k(logits, 5)?;
    let outputs = [probs, best, top];
    let graph = ctx.build_forward(&outputs)?;

    // llama.cpp's tensor-split policy for these tensors (rules match names).
    let rows = |granule| SplitSpec::Axis { axis: 1, granule, segments: vec![] };
    let policy = devices
        .policy()?
        .rule("blk.*.ffn_gate.weight", rows(32))
        .rule("blk.*.ffn_up.weight", rows(32))
        .rule("blk.*.ffn_down.weight", SplitSpec::Axis { axis: 0, granule: 32, segments: vec![] })
        .rule("output.weight", rows(1));
    let plan = Planner::default().plan(&ctx, &graph, &policy, &[])?;
    let exec = devices.executor()?;
    let lowered = exec.lower(&ctx, &graph, &plan)?;
    println!("{}", plan.describe(&ctx, &graph)?);
    println!(
        "lowered to {} steps, {} per-device subgraphs:\n{}",
        lowered.steps.len(),
        lowered.n_subgraphs(),
        lowered.describe(&ctx)
    );

    // Leaf values, on one device and on the N devices: the store quantizes
    // each device's share of a weight as it goes in.
    let cpu = CpuBackend::with_threads(2)?;
    let mut one = TensorStorage::new();
    one.alloc_tensors(&cpu, &ctx, graph.leafs())?;
    let mut store = devices.store();
    store.place_leafs(&ctx, &graph, &plan)?;
    for (k, &l) in graph.leafs().iter().enumerate() {
        let v = values(ctx.tensor(l)?.nelements() as usize, k as u32 * 7919);
        one.set_f32(&ctx, l, &v)?;
        store.set_f32(&ctx, l, &v)?;
    }
    GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &ctx, &graph, &mut one)?;
    cpu.compute(&ctx, &graph, &one)?;

    let start = std::time::Instant::now();
    let rep = exec.execute(&ctx, &graph, &plan, &mut store, &outputs)?;
    let secs = start.elapsed().as_secs_f64();

    let want_p = one.get_f32(&ctx, probs)?;
    let got_p = rep.f32(0)?;
    let e = spec::nmse(&got_p, &want_p);
    let row_sums: Vec<f32> = got_p.chunks(vocab as usize).map(|r| r.iter().sum()).collect();
    let same_argmax = rep.i32(1)? == one.get_i32(&ctx, best)?;
    let same_top_k = rep.i32(2)? == one.get_i32(&ctx, top)?;
    println!("ran on {n} devices (tensor split {ratios:?}) in {:.1} ms", secs * 1e3);
    println!(
        "bytes moved: {} (plan: {}), soft_max rows sum to {row_sums:?}, NMSE vs one device {e:.2e}",
        rep.bytes_moved,
        plan.total_bytes(),
    );
    println!("argmax identical: {same_argmax}, top_k identical: {same_top_k}");
    // What is checked, each against one device: the integer outputs exactly,
    // the probabilities within a bound (the split sums in another order).
    const BOUND: f64 = 1e-6;
    let mut wrong = Vec::new();
    if !same_argmax {
        wrong.push("argmax differs".to_string());
    }
    if !same_top_k {
        wrong.push("top_k differs".to_string());
    }
    if e.is_nan() || e > BOUND {
        wrong.push(format!("soft_max NMSE {e:.3e} above {BOUND:e}"));
    }
    if rep.bytes_moved != plan.total_bytes() {
        wrong.push(format!("{} bytes moved, the plan says {}", rep.bytes_moved, plan.total_bytes()));
    }
    if wrong.is_empty() {
        println!(
            "verify: identical — argmax and top_k equal one device's exactly, soft_max within NMSE {BOUND:e} \
             ({e:.2e}), bytes moved as planned"
        );
        Ok(())
    } else {
        println!("verify: DIFFERENT — {}", wrong.join("; "));
        std::process::exit(1);
    }
}
