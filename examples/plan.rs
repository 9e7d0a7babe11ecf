//! Plans real-dimension models for N devices without allocating their
//! weights: the collectives of one decode step with their bytes, bytes per
//! token, and per-device memory for weights, KV cache and compute.
//!
//! `cargo run --release --example plan -- --model qwen3-32b --devices 2 --tensor-split 1,1`
//!
//! `cargo run --release --example plan -- --model qwen35-27b --draft dflash2 --devices 2 --tensor-split 1,1`
//! plans the Qwen3.x-27B hybrid (48 Gated-DeltaNet + 16 gated attention
//! layers, its NextN layer, the 5-layer DFlash2 drafter) at 65536 cells of
//! a q4_0 KV cache by default, with per-device recurrent caches; `--draft
//! mtp|none` leaves the DFlash2 drafter out (the MTP head is always planned).
//!
//! Options: `--model qwen3-8b|qwen3-32b|qwen35-27b` (default qwen3-8b),
//! `--draft dflash|dflash2|none` (default: dflash for qwen3-8b, the z-lab
//! 5-layer block-16 drafter; dflash2 for qwen3-32b, a 5-layer block-8 DFlash2
//! drafter with the z-lab Qwen3.8-27B-DFlash2 dimensions
//! (shardgraph-models/MODELS.md, section 4.8) and its candidate selector; both
//! Q8_0, their block and injection steps planned too), `--devices N`,
//! `--tensor-split r0,r1,..`, `--split-mode none|layer|tensor|hybrid` (default tensor; none
//! plans one device), `--ctx-size` (KV cells, default 4096),
//! `--cache-type-k TYPE` and `--cache-type-v TYPE` (llama.cpp's cache types,
//! default f16; q4_0 for qwen35-27b), `--tokens T` (batch, default 1).

use shardgraph::split::{Collective, Planner, SplitState};
use shardgraph::{Context, GgmlType};
use shardgraph_models::dflash::{qwen35_dflash_policy, qwen3_dflash_policy, Dflash, DflashHparams};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{qwen3_policy, Qwen3, Qwen3Hparams};
use shardgraph_models::qwen35::{qwen35_policy, Qwen35, Qwen35Hparams};
use shardgraph_models::types::{KvTypes, TensorTypes};

#[path = "common/spec.rs"]
mod spec;
use spec::{arg, check_options, parsed};

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

const OPTIONS: &[&str] = &[
    "--model",
    "--draft",
    "--devices",
    "--tensor-split",
    "--split-mode",
    "--ctx-size",
    "--cache-type-k",
    "--cache-type-v",
    "--tokens",
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    check_options(&args, "plan", OPTIONS);
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &[String]) -> shardgraph::Result<()> {
    let model = arg(args, "--model").unwrap_or_else(|| "qwen3-8b".into());
    let (ratios, mode) = spec::devices(args, 2);
    let layer = mode == "layer";
    if mode == "hybrid" {
        // One process's devices are one group: the hybrid split is the
        // tensor split here, as in decode.
        println!("--split-mode hybrid: the devices of one process are one group: planned as --split-mode tensor");
    }
    let n = ratios.len();
    let qwen35 = model == "qwen35-27b";
    let kv_size: i64 = parsed(args, "--ctx-size", if qwen35 { 65536 } else { 4096 });
    let tokens: i64 = parsed(args, "--tokens", 1);
    if kv_size < 1 || tokens < 1 {
        eprintln!("--ctx-size and --tokens must be at least 1");
        std::process::exit(2);
    }
    // The 27B plan defaults to a q4_0 cache, as the field runs it.
    let given = arg(args, "--cache-type-k").is_some() || arg(args, "--cache-type-v").is_some();
    let kv_type = if qwen35 && !given { KvTypes::from(GgmlType::Q4_0) } else { spec::cache_types(args) };
    if qwen35 {
        let draft = arg(args, "--draft").unwrap_or_else(|| "dflash2".into());
        return plan_qwen35(&ratios, kv_size, kv_type, tokens, &draft, layer);
    }
    // shardgraph-models/MODELS.md, section 2.4; a Q4_K_M-like file keeps attn_v
    // and ffn_down at Q6_K.
    let hp = match model.as_str() {
        "qwen3-8b" => Qwen3Hparams::qwen3_8b(),
        "qwen3-32b" => Qwen3Hparams::qwen3_32b(),
        other => {
            eprintln!("--model {other}: use qwen3-8b, qwen3-32b or qwen35-27b");
            std::process::exit(2);
        }
    };
    let types = TensorTypes::q4_k_m().with("output.weight", GgmlType::Q6_K);
    let draft =
        arg(args, "--draft").unwrap_or_else(|| if model == "qwen3-8b" { "dflash".into() } else { "dflash2".into() });
    // The z-lab Qwen3-8B-DFlash-b16 drafter (shardgraph-models/MODELS.md,
    // section 4.8).
    let v1 = DflashHparams {
        core: HparamsCore::qwen3(5, hp.n_embd, hp.n_ff, 32, 8, 128),
        target_layers: vec![2, 10, 18, 26, 34].into_iter().filter(|&l| l <= hp.n_layer).collect(),
        target_hidden: hp.n_embd,
        block_size: 16,
        mask_token: 151669,
        conv: None,
        selector: None,
    };
    // A DFlash2 drafter with the z-lab Qwen3.8-27B-DFlash2 dimensions
    // (shardgraph-models/MODELS.md, section 4.8).
    let v2 = DflashHparams {
        core: HparamsCore { rope_base: 1e7, ..HparamsCore::qwen3(5, hp.n_embd, 17408, 32, 8, 128) },
        target_layers: vec![6, 20, 34, 48, 62].into_iter().filter(|&l| l <= hp.n_layer).collect(),
        target_hidden: hp.n_embd,
        block_size: 8,
        mask_token: 151669,
        conv: Some((2, 16)),
        selector: Some((256, 16)),
    };
    let mut ctx = Context::new();
    let m = Qwen3::new(&mut ctx, hp.clone(), &types, kv_type, kv_size)?;
    let drafter = match draft.as_str() {
        "dflash" => Some(Dflash::new(&mut ctx, &m, v1, &TensorTypes::uniform(GgmlType::Q8_0), kv_type, kv_size)?),
        "dflash2" => Some(Dflash::new(&mut ctx, &m, v2, &TensorTypes::uniform(GgmlType::Q8_0), kv_type, kv_size)?),
        "none" => None,
        other => {
            eprintln!("--draft {other}: use dflash, dflash2 or none");
            std::process::exit(2);
        }
    };
    let base = ctx.len();
    let taps = drafter.as_ref().map(|d| d.hp.target_layers.clone()).unwrap_or_default();
    let step = m.build(&mut ctx, tokens, &taps)?;
    let graph = ctx.build_forward(&step.outputs())?;
    let policy = match &drafter {
        _ if layer => shardgraph::split::SplitPolicy::layer_split(&ratios, hp.core.n_layer)?,
        Some(d) => qwen3_dflash_policy(&hp, &types, &d.hp, &TensorTypes::uniform(GgmlType::Q8_0), &ratios)?,
        None => qwen3_policy(&hp, &types, &ratios)?,
    };
    let start = std::time::Instant::now();
    let plan = Planner::default().plan(&ctx, &graph, &policy, &[])?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{model}: {} layers, n_embd {}, {} heads / {} KV heads of {}, n_ff {}, vocab {}; weights Q4_K_M-like, KV cache {kv_type} × {kv_size} cells; {tokens} token(s) per step",
        hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff, hp.n_vocab
    );
    println!(
        "graph: {} nodes, {} leafs; planned for {n} device(s) ({} split, ratios {ratios:?}) in {:.1} ms",
        graph.n_nodes(),
        graph.leafs().len(),
        if layer { "layer" } else { "tensor" },
        secs * 1e3
    );
    println!("{}", plan.report(&ctx).trim_end());
    println!("bytes per token: {:.0}", plan.total_bytes() as f64 / tokens as f64);
    if drafter.is_some() {
        println!("target memory per device (the drafter's weights and KV cache are listed below):");
    } else {
        println!("memory per device:");
    }
    for (j, mem) in plan.memory(&ctx, &graph)?.iter().enumerate() {
        println!(
            "  device {j}: weights {}, KV cache {}, inputs {:.1} KiB, compute {:.1} MiB, total {}",
            gib(mem.weights),
            gib(mem.caches),
            mem.inputs as f64 / 1024.0,
            mem.compute as f64 / (1 << 20) as f64,
            gib(mem.total())
        );
    }
    if let Some(d) = &drafter {
        plan_drafter(&mut ctx, base, d, &policy, n, hp.n_vocab)?;
    }
    Ok(())
}

/// Bytes of `ids` each device holds under `plan` (split tensors by their parts).
fn bytes_per_device(ctx: &Context, plan: &shardgraph::split::Plan, ids: &[shardgraph::TensorId], n: usize) -> Vec<u64> {
    let mut out = vec![0u64; n];
    for &id in ids {
        let Ok(t) = ctx.tensor(id) else { continue };
        let bytes = t.nbytes() as u64;
        for (j, o) in out.iter_mut().enumerate() {
            *o += match plan.state(id) {
                Some(SplitState::Split(s)) if s.axis_len() > 0 => {
                    (bytes as u128 * s.local_len(j).max(0) as u128 / s.axis_len() as u128) as u64
                }
                Some(SplitState::Split(_)) => 0,
                _ => bytes,
            };
        }
    }
    out
}

/// Plans the real Qwen3.x-27B (`qwen35`, shardgraph-models/MODELS.md, section
/// 3.7): 64 layers (48 Gated-DeltaNet + 16 gated attention), its NextN (MTP)
/// layer, and its 5-layer DFlash2 drafter (shardgraph-models/MODELS.md, section
/// 4.8), without allocating weights.
fn plan_qwen35(
    ratios: &[f32],
    kv_size: i64,
    kv_type: KvTypes,
    tokens: i64,
    draft: &str,
    layer: bool,
) -> shardgraph::Result<()> {
    let n = ratios.len();
    let hp = Qwen35Hparams {
        core: HparamsCore { rope_base: 1e7, ..HparamsCore::qwen3(64, 5120, 17408, 24, 4, 256) },
        n_vocab: 248320,
        n_rot: 64,
        rope_sections: [11, 11, 10, 0],
        full_attention_interval: 4,
        d_conv: 4,
        d_state: 128,
        n_k_heads: 16,
        n_v_heads: 48,
        n_nextn: 1,
        n_ctx_train: 262144,
    };
    let types = TensorTypes::uniform(GgmlType::Q4_K).with("output.weight", GgmlType::Q6_K);
    let dhp = DflashHparams {
        core: HparamsCore { rope_base: 1e7, ..HparamsCore::qwen3(5, 5120, 17408, 32, 8, 128) },
        target_layers: vec![6, 20, 34, 48, 62],
        target_hidden: 5120,
        block_size: 8,
        mask_token: 248070,
        conv: Some((2, 16)),
        selector: Some((256, 16)),
    };
    let mut ctx = Context::new();
    let m = Qwen35::new(&mut ctx, hp.clone(), &types, kv_type, kv_size)?;
    let drafter = match draft {
        "dflash2" => {
            Some(Dflash::new(&mut ctx, &m, dhp.clone(), &TensorTypes::uniform(GgmlType::Q8_0), kv_type, kv_size)?)
        }
        "mtp" | "none" => None,
        other => {
            eprintln!("--draft {other}: use dflash2, mtp or none for qwen35-27b");
            std::process::exit(2);
        }
    };
    let policy = match &drafter {
        _ if layer => shardgraph::split::SplitPolicy::layer_split(ratios, hp.core.n_layer)?,
        Some(d) => qwen35_dflash_policy(&hp, &types, &d.hp, &TensorTypes::uniform(GgmlType::Q8_0), ratios)?,
        None => qwen35_policy(&hp, &types, ratios)?,
    };
    let base = ctx.len();
    let taps = drafter.as_ref().map(|d| d.hp.target_layers.clone()).unwrap_or_default();
    let step = m.build(&mut ctx, tokens, &taps)?;
    let mut outs = step.writes.clone();
    outs.extend(step.taps.iter().map(|t| t.1));
    outs.push(step.argmax);
    let graph = ctx.build_forward(&outs)?;
    let start = std::time::Instant::now();
    let plan = Planner::default().plan(&ctx, &graph, &policy, &[])?;
    println!(
        "qwen35-27b: 64 layers (48 gated delta-net + 16 gated attention) + 1 NextN, n_embd 5120, n_ff 17408, 24 heads / 4 KV heads of 256 (IMROPE, 64 rotated), delta-net 16 key / 48 value heads of 128, vocab 248320; weights Q4_K (head Q6_K), KV cache {kv_type} × {kv_size} cells; {tokens} token(s) per step"
    );
    println!(
        "graph: {} nodes; planned for {n} device(s) ({} split, ratios {ratios:?}) in {:.1} ms",
        graph.n_nodes(),
        if layer { "layer" } else { "tensor" },
        start.elapsed().as_secs_f64() * 1e3
    );
    println!("{}", plan.report(&ctx).trim_end());
    println!("bytes per token: {:.0}", plan.total_bytes() as f64 / tokens as f64);
    let named = |prefix: &str| -> Vec<shardgraph::TensorId> {
        ctx.ids().take(base).filter(|&id| ctx.tensor(id).map(|t| t.name.starts_with(prefix)).unwrap_or(false)).collect()
    };
    let kv: Vec<_> = [named("cache_k_l"), named("cache_v_l")].concat();
    let rec: Vec<_> = [named("cache_r_l"), named("cache_s_l")].concat();
    let (kv_b, rec_b) = (bytes_per_device(&ctx, &plan, &kv, n), bytes_per_device(&ctx, &plan, &rec, n));
    println!("target memory per device (weights include the NextN layer; the drafter's are listed below):");
    for (j, mem) in plan.memory(&ctx, &graph)?.iter().enumerate() {
        println!(
            "  device {j}: weights {}, KV cache {}, recurrent caches {:.1} MiB, compute {:.1} MiB, total {}",
            gib(mem.weights),
            gib(kv_b[j]),
            rec_b[j] as f64 / (1 << 20) as f64,
            mem.compute as f64 / (1 << 20) as f64,
            gib(mem.total())
        );
    }
    // The MTP head: one draft row.
    ctx.truncate(base);
    let mtp = m.build_mtp(&mut ctx, 1)?;
    let mut outs = mtp.writes.clone();
    outs.extend([mtp.h_out, mtp.argmax]);
    let g = ctx.build_forward(&outs)?;
    let mplan = Planner::default().plan(&ctx, &g, &policy, &[])?;
    println!(
        "\nMTP (NextN) head, one draft row: {} repartitions, {} bytes",
        mplan.repartitions.len(),
        mplan.total_bytes()
    );
    if let Some(d) = &drafter {
        plan_drafter(&mut ctx, base, d, &policy, n, hp.n_vocab)?;
    }
    Ok(())
}

/// Plans one DFlash block step and one injection of a block's rows for the
/// drafter `d` (tensors in `ctx` up to `base`), and prints their
/// collectives, the bytes that touch the vocabulary-split logits, and the
/// drafter's memory per device.
fn plan_drafter(
    ctx: &mut Context,
    base: usize,
    d: &Dflash,
    policy: &shardgraph::split::SplitPolicy,
    n: usize,
    n_vocab: i64,
) -> shardgraph::Result<()> {
    // One draft: a block of B rows; then the injection of the verified rows.
    ctx.truncate(base);
    let b = d.build_block(ctx, d.hp.block_size as i64)?;
    let mut outs = b.writes.clone();
    // v1 reads each row's greedy token; DFlash2 its selector's lattice.
    outs.push(b.lattice.unwrap_or(b.argmax));
    let g = ctx.build_forward(&outs)?;
    let bplan = Planner::default().plan(ctx, &g, policy, &[])?;
    let kind = if d.hp.selector.is_some() { "dflash2" } else { "dflash" };
    println!("\n{kind} drafter ({} layers, block {}): one block step", d.hp.n_layer, d.hp.block_size);
    println!("{}", bplan.report(ctx).trim_end());
    // The logits [V, B] stay split by vocabulary: only per-row combines touch them.
    let logits = ctx.tensor(b.logits)?.nelements();
    let on_logits: u64 = bplan
        .repartitions
        .iter()
        .filter(|r| ctx.tensor(r.tensor).map(|t| t.nelements() >= logits).unwrap_or(false))
        .map(|r| r.traffic.total_bytes)
        .sum();
    let combines: u64 = bplan
        .repartitions
        .iter()
        .filter(|r| r.traffic.kind == Collective::RowCombine)
        .map(|r| r.traffic.total_bytes)
        .sum();
    let where_logits = match bplan.state(b.logits) {
        Some(st) if st.sole_holder().is_some() => format!("lie whole on device {}", st.sole_holder().unwrap_or(0)),
        Some(shardgraph::split::SplitState::Split(_)) => "stay split by vocabulary".to_string(),
        Some(st) => format!("are {}", st.label()),
        None => "are not in the plan".to_string(),
    };
    if n > 1 {
        println!(
            "logits [{}, {}] ({} bytes F32) {where_logits}: {on_logits} bytes of collectives move them; per-row combines (argmax/top_k) move {combines} bytes",
            n_vocab,
            d.hp.block_size,
            logits * 4
        );
    }
    let bmem = bplan.memory(ctx, &g)?;
    ctx.truncate(base);
    let inj = d.build_inject(ctx, d.hp.block_size as i64)?;
    let g = ctx.build_forward(&inj.writes)?;
    let iplan = Planner::default().plan(ctx, &g, policy, &[])?;
    println!("injection of {} verified rows: {} bytes", d.hp.block_size, iplan.total_bytes());
    println!("drafter memory per device:");
    for (j, mem) in bmem.iter().enumerate() {
        println!(
            "  device {j}: weights {} (incl. the borrowed embedding/head counted with the target), KV cache {}, compute {:.1} MiB",
            gib(mem.weights),
            gib(mem.caches),
            mem.compute as f64 / (1 << 20) as f64
        );
    }
    Ok(())
}
