//! One graph tensor-parallel on N CPU devices: a SwiGLU FFN block with
//! llama.cpp's `--split-mode tensor` layout (gate/up split on rows, down on
//! its input axis) followed by a vocabulary-split output head whose logits go
//! into soft_max, argmax and top_k — the combination ggml's meta backend
//! aborts on or gets wrong. Prints the plan (states, collectives, bytes,
//! memory per device), runs it, and checks the result against one device.
//!
//! `cargo run --release --example tensor_parallel -- --devices 3 --tensor-split 3,2,1`

use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::split::{MetaExecutor, Planner, SplitPolicy, SplitSpec, SplitStore};
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorId, TensorStorage};

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

    // The graph: x → rms_norm → SwiGLU FFN → residual → output head → soft_max, argmax, top_k.
    let mut ctx = Context::new();
    let named = |ctx: &mut Context, ty, ne: &[i64], name: &str| -> shardgraph::Result<TensorId> {
        let id = ctx.new_tensor(ty, ne)?;
        ctx.set_name(id, name)?;
        Ok(id)
    };
    let x = named(&mut ctx, GgmlType::F32, &[e, t], "inp_embd")?;
    ctx.set_input(x)?;
    let wg = named(&mut ctx, GgmlType::Q8_0, &[e, f], "blk.0.ffn_gate.weight")?;
    let wu = named(&mut ctx, GgmlType::Q8_0, &[e, f], "blk.0.ffn_up.weight")?;
    let wd = named(&mut ctx, GgmlType::Q8_0, &[f, e], "blk.0.ffn_down.weight")?;
    let head = named(&mut ctx, GgmlType::Q8_0, &[e, vocab], "output.weight")?;
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

    // llama.cpp's tensor-split policy for these tensors.
    let rows = |granule| SplitSpec::Axis { axis: 1, granule, segments: vec![] };
    let policy = SplitPolicy::new(ratios)?
        .rule("blk.*.ffn_gate.weight", rows(32))
        .rule("blk.*.ffn_up.weight", rows(32))
        .rule("blk.*.ffn_down.weight", SplitSpec::Axis { axis: 0, granule: 32, segments: vec![] })
        .rule("output.weight", rows(1));
    let plan = Planner::default().plan(&ctx, &graph, &policy, &[])?;
    let lowered = MetaExecutor::new(n, 1)?.lower(&ctx, &graph, &plan)?;
    println!("{}", plan.describe(&ctx, &graph)?);
    println!(
        "lowered to {} steps, {} per-device subgraphs:\n{}",
        lowered.steps.len(),
        lowered.n_subgraphs(),
        lowered.describe(&ctx)
    );

    // Leaf data, on one device and on the N devices.
    let cpu = CpuBackend::with_threads(2)?;
    let mut one = TensorStorage::new();
    one.alloc_tensors(&cpu, &ctx, graph.leafs())?;
    let mut store = SplitStore::new(n);
    store.place_leafs(&ctx, &graph, &plan)?;
    for (k, &l) in graph.leafs().iter().enumerate() {
        let nel = ctx.tensor(l)?.nelements() as usize;
        one.set_f32(&ctx, l, &values(nel, k as u32 * 7919))?;
        let mut bytes = vec![0u8; ctx.tensor(l)?.nbytes()];
        one.get_bytes(&ctx, l, 0, &mut bytes)?;
        store.set_tensor(&ctx, l, 0, &bytes)?;
    }
    GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &ctx, &graph, &mut one)?;
    cpu.compute(&ctx, &graph, &one)?;

    let exec = MetaExecutor::new(n, 1)?;
    let start = std::time::Instant::now();
    let rep = exec.execute(&ctx, &graph, &plan, &mut store, &outputs)?;
    let secs = start.elapsed().as_secs_f64();

    let f32s = |b: &[u8]| b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>();
    let i32s = |b: &[u8]| b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>();
    let want_p = one.get_f32(&ctx, probs)?;
    let got_p = f32s(&rep.outputs[0]);
    let num: f64 = got_p.iter().zip(&want_p).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = want_p.iter().map(|b| (*b as f64).powi(2)).sum();
    let row_sums: Vec<f32> = got_p.chunks(vocab as usize).map(|r| r.iter().sum()).collect();
    let same_argmax = i32s(&rep.outputs[1]) == one.get_i32(&ctx, best)?;
    let same_top_k = i32s(&rep.outputs[2]) == one.get_i32(&ctx, top)?;
    println!("ran on {n} devices (tensor split {ratios:?}) in {:.1} ms", secs * 1e3);
    println!(
        "bytes moved: {} (plan: {}), soft_max rows sum to {row_sums:?}, NMSE vs one device {:.2e}",
        rep.bytes_moved,
        plan.total_bytes(),
        num / den
    );
    println!("argmax identical: {same_argmax}, top_k identical: {same_top_k}");
    let ok = same_argmax && same_top_k && num / den < 1e-6 && rep.bytes_moved == plan.total_bytes();
    println!("verify: {}", if ok { "identical" } else { "DIFFERENT" });
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
