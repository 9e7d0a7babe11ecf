//! CUDA backend throughput, printed as tables (run on a machine with a GPU;
//! `scripts/gpu-check.sh` runs it):
//!
//! 1. matrix-vector products (`mul_mat` with one column, the decode case)
//!    for each weight type (ggml 0.25.3's IQ, TQ, FP4 and Q1_0/Q2_0 types
//!    among them): achieved GB/s of weight reads against the GPU's
//!    peak memory bandwidth, and the CPU backend's GB/s on the same shape in
//!    the same run (the GPU/CPU ratio);
//! 2. decode tokens/s of a generated `qwen3` model on one CUDA device and
//!    on two virtual devices of the same GPU (tensor split 1:1), with the
//!    CPU backend's one-device figure beside them.
//!
//! The decode runs check what they print: the tokens of the CUDA runs must
//! equal the CPU run's, where the CPU's logits do not make it a near tie
//! (the first token that differs must have a logit within 5 % of the
//! logits' RMS of the CPU's choice: a rounding difference between the
//! backends, after which the runs are not compared); otherwise the bench
//! says `MISMATCH` and exits with status 1.
//!
//! `cargo bench --features cuda --bench cuda`. Without a GPU it says so and
//! exits (a failure when `SHARDGRAPH_REQUIRE_GPU` is set, as
//! `scripts/gpu-check.sh run` sets it); `SHARDGRAPH_BENCH_EMU=1` with `--features cuda-emu` runs it on the
//! emulated GPU at toy sizes (checks the bench itself; its numbers mean
//! nothing). `SHARDGRAPH_BENCH_K`/`_M` set the matrix shape (default 4096 ×
//! 4096), `SHARDGRAPH_BENCH_SECS` the time per measurement (default 1),
//! `SHARDGRAPH_BENCH_CPU=0` leaves out the CPU's matrix-vector timings,
//! `SHARDGRAPH_BENCH_MODEL=small` decodes the small `qwen3` of
//! [`small_target`] (4 layers, ~12 MB) instead of the 16-layer one (~1 GB
//! to write). `scripts/gpu-check.sh` uses all three.
//!
//! `SHARDGRAPH_BENCH_WRITE_MODELS=DIR` (no GPU needed) only writes the small
//! `qwen3` target and its DFlash2 drafter ([`small_drafter`]) to
//! `DIR/qwen3-small.gguf` and `DIR/dflash2-small.gguf` and exits: the
//! models `scripts/gpu-check.sh` runs the `dflash2` example on
//! (`--model`, `--model-draft`), seconds to write instead of the example's
//! own ~260 MB.

use shardgraph::backend::cuda::CudaBackend;
use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::split::Devices;
use shardgraph::tensor::quant;
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorStorage};
use shardgraph_models::dflash::DflashHparams;
use shardgraph_models::generate::{write_dflash_gguf_with, write_qwen3_gguf_with, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session};
use shardgraph_models::types::TensorTypes;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../tests/common/require.rs"]
mod require;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The small `qwen3` target: 4 layers, n_embd 512, n_ff 1536, 8 heads / 4
/// KV heads of 64, vocabulary 8192 (the `dflash2` example's prompt ids are
/// below 8000), in the example's Q4_K_M-like mix (~12 MB).
fn small_target() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(4, 512, 1536, 8, 4, 64), n_vocab: 8192, n_ctx_train: 4096 }
}

/// The DFlash2 drafter for [`small_target`], shaped as the `dflash2`
/// example's for its target: 2 layers, block 8, taps of target layers 2
/// and 3 (below `n_layer`), conv k = 2 over groups of 16, selector rank 64 and top 16 (~27 MB, Q8_0).
fn small_drafter() -> DflashHparams {
    let t = small_target();
    DflashHparams {
        core: HparamsCore::qwen3(2, t.n_embd, t.n_vocab, 8, 4, 64),
        target_layers: vec![2, t.n_layer - 1],
        target_hidden: t.n_embd,
        block_size: 8,
        mask_token: (t.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((64, 16)),
    }
}

/// Writes [`small_target`] and [`small_drafter`] into `dir` as the
/// `dflash2` example builds its own (weights following a vocabulary
/// permutation, the target's first layer attending).
fn write_small_models(dir: &std::path::Path) -> shardgraph::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| shardgraph::Error::Model { detail: format!("creating {}: {e}", dir.display()) })?;
    let t = small_target();
    let target = dir.join("qwen3-small.gguf");
    let kind = Weights::PermutationWithAttention { attention: 6.0 };
    let a = write_qwen3_gguf_with(&target, &t, &TensorTypes::llama_q4_k_m(t.n_layer), 1, kind)?;
    let drafter = dir.join("dflash2-small.gguf");
    let b = write_dflash_gguf_with(
        &drafter,
        &small_drafter(),
        &TensorTypes::uniform(GgmlType::Q8_0),
        t.n_vocab,
        1,
        Weights::Permutation,
    )?;
    println!("wrote {} ({a} bytes) and {} ({b} bytes)", target.display(), drafter.display());
    Ok(())
}

/// Fastest of repeated runs of `f` for about `budget` (at least 3), seconds.
fn fastest(f: &mut dyn FnMut(), budget: Duration) -> f64 {
    f();
    let (start, mut best, mut n) = (Instant::now(), f64::INFINITY, 0);
    while n < 3 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        n += 1;
    }
    best
}

/// Seconds per `mul_mat` of a `[k, m]` weight of type `ty` by one column on `backend`.
fn matvec_seconds(backend: &dyn Backend, ty: GgmlType, k: i64, m: i64, budget: Duration) -> shardgraph::Result<f64> {
    let mut ctx = Context::new();
    let w = ctx.new_tensor_2d(ty, k, m)?;
    let x = ctx.new_tensor_2d(GgmlType::F32, k, 1)?;
    let y = ctx.mul_mat(w, x)?;
    let g = ctx.build_forward(&[y])?;
    let mut st = TensorStorage::new();
    st.alloc_tensors(backend, &ctx, g.leafs())?;
    GraphAllocator::new(backend.buffer_type()).alloc_graph(backend, &ctx, &g, &mut st)?;
    let vals: Vec<f32> = (0..k as usize).map(|i| ((i * 7919) % 1999) as f32 / 1999.0 - 0.5).collect();
    // One quantized row repeated (the time does not depend on the values;
    // the codebook quantizers are slow on a whole matrix); the types ggml
    // quantizes only with an importance matrix get a byte pattern.
    let mut row = vec![0u8; ty.row_size(k)?];
    if quant::quantize_requires_imatrix(ty) {
        row.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 37 % 251) as u8);
    } else {
        quant::quantize_chunk(ty, &vals, &mut row, 1, k as usize)?;
    }
    st.set_bytes(&ctx, w, 0, &row.repeat(m as usize))?;
    st.set_f32(&ctx, x, &vals)?;
    let mut err = None;
    let s = fastest(
        &mut || {
            if let Err(e) = backend.compute(&ctx, &g, &st) {
                err = Some(e);
            }
        },
        budget,
    );
    match err {
        Some(e) => Err(e),
        None => Ok(s),
    }
}

/// `n` virtual devices on GPU 0, or `n` emulated GPUs when `emu`.
fn devices(n: usize, emu: bool) -> shardgraph::Result<Vec<Arc<dyn Backend>>> {
    #[cfg(feature = "cuda-emu")]
    if emu {
        return Ok((0..n).map(|_| Arc::new(CudaBackend::emulated(4 << 30)) as Arc<dyn Backend>).collect());
    }
    let _ = emu;
    Ok(CudaBackend::virtual_devices(0, n)?.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect())
}

fn main() -> shardgraph::Result<()> {
    if let Some(dir) = std::env::var_os("SHARDGRAPH_BENCH_WRITE_MODELS") {
        return write_small_models(std::path::Path::new(&dir));
    }
    let emu = std::env::var("SHARDGRAPH_BENCH_EMU").is_ok();
    let with_cpu = std::env::var("SHARDGRAPH_BENCH_CPU").map_or(true, |v| v != "0");
    let small = std::env::var("SHARDGRAPH_BENCH_MODEL").is_ok_and(|v| v == "small");
    let gpu = match CudaBackend::new(0) {
        Ok(b) => b,
        #[cfg(feature = "cuda-emu")]
        Err(_) if emu => CudaBackend::emulated(4 << 30),
        Err(e) => {
            require::missing(require::Tool::Gpu, "cuda bench", &e);
            return Ok(());
        }
    };
    let budget = Duration::from_secs_f64(
        std::env::var("SHARDGRAPH_BENCH_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(1.0),
    );
    let (k, m) = if emu {
        (256, 64)
    } else {
        (env_usize("SHARDGRAPH_BENCH_K", 4096) as i64, env_usize("SHARDGRAPH_BENCH_M", 4096) as i64)
    };
    let cpu = CpuBackend::with_threads(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))?;
    let peak = gpu.memory_bandwidth();
    println!(
        "device: {} ({}), peak memory bandwidth {:.0} GB/s; CPU backend with {} threads",
        gpu.device().name,
        gpu.device().description,
        peak / 1e9,
        cpu.n_threads()
    );
    println!("\nmul_mat [{k}, {m}] x [{k}, 1] (weight bytes read per product / time)");
    println!("| type | weight MB | CUDA us | CUDA GB/s | of peak | CPU GB/s | CUDA/CPU |");
    println!("|---|---|---|---|---|---|---|");
    use GgmlType::*;
    let types = [
        F32, F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S,
        TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0,
    ];
    for ty in types {
        let bytes = (ty.row_size(k)? * m as usize) as f64;
        let g = matvec_seconds(&gpu, ty, k, m, budget)?;
        let c = if with_cpu { Some(matvec_seconds(&cpu, ty, k, m, budget)?) } else { None };
        println!(
            "| {ty} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            bytes / 1e6,
            g * 1e6,
            bytes / g / 1e9,
            if peak > 0.0 { format!("{:.0}%", 100.0 * bytes / g / peak) } else { "n/a".into() },
            c.map_or("n/a".into(), |c| format!("{:.1}", bytes / c / 1e9)),
            c.map_or("n/a".into(), |c| format!("{:.2}", c / g))
        );
    }

    // Decode tokens/s of a generated qwen3 (Q8_0).
    let hp = if emu {
        Qwen3Hparams { core: HparamsCore::qwen3(2, 256, 256, 2, 2, 128), n_vocab: 96, n_ctx_train: 4096 }
    } else if small {
        small_target()
    } else {
        Qwen3Hparams { core: HparamsCore::qwen3(16, 2048, 6144, 16, 8, 128), n_vocab: 32000, n_ctx_train: 4096 }
    };
    let path = std::env::temp_dir().join(format!("shardgraph-bench-cuda-{}-{}.gguf", hp.n_embd, hp.n_layer));
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    if !path.exists() {
        shardgraph_models::generate::write_qwen3_gguf(&path, &hp, &types, 1)?;
    }
    let n_tok = if emu { 4 } else { 64 };
    let prompt: Vec<i32> = (0..8).map(|i| (i * 31 + 7) % hp.n_vocab as i32).collect();
    println!(
        "\ndecode, qwen3 {} layers, n_embd {}, Q8_0 ({:.0} MB): {n_tok} tokens after an 8-token prompt",
        hp.n_layer,
        hp.n_embd,
        std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) as f64 / 1e6
    );
    println!("| devices | tokens/s | tokens |");
    println!("|---|---|---|");
    // (With `logits`, the logits each token was chosen from too: the CPU run's.)
    type Tokens = (Vec<i32>, Vec<Vec<f32>>);
    let run = |label: &str, ratios: &[f32], devs: Option<Vec<Arc<dyn Backend>>>| -> shardgraph::Result<Tokens> {
        let logits = devs.is_none();
        let devices = match devs {
            Some(d) => Devices::from_backends(d)?,
            None => Devices::cpu(ratios.len(), cpu.n_threads() / ratios.len().max(1))?,
        };
        let devices = devices.with_tensor_split(ratios)?;
        let mut s = Qwen3Session::load(&path, &devices, GgmlType::F16, (prompt.len() + n_tok + 1) as i64)?;
        let mut rows = Vec::new();
        let mut keep = |o: &shardgraph_models::step::StepOutput| {
            if let Some(l) = &o.logits {
                rows.push(l[l.len() - hp.n_vocab as usize..].to_vec());
            }
        };
        let first = s.decode(&prompt, &[], logits)?;
        keep(&first);
        let mut tok = *first.argmax.last().unwrap_or(&0);
        let mut out = vec![tok];
        let t = Instant::now();
        for _ in 1..n_tok {
            let o = s.decode(&[tok], &[], logits)?;
            keep(&o);
            tok = o.argmax[0];
            out.push(tok);
        }
        println!(
            "| {label} | {:.1} | {:?}.. |",
            (n_tok - 1) as f64 / t.elapsed().as_secs_f64(),
            &out[..out.len().min(4)]
        );
        Ok((out, rows))
    };
    let (cpu_tokens, cpu_logits) = run("CPU x1", &[1.0], None)?;
    let (t1, _) = run("CUDA x1", &[1.0], Some(devices(1, emu)?))?;
    let (t2, _) = run("CUDA x2 (virtual, 1:1)", &[1.0, 1.0], Some(devices(2, emu)?))?;
    println!("\ntokens equal the CPU run: 1 device {}, 2 virtual devices {}", t1 == cpu_tokens, t2 == cpu_tokens);
    let ok1 = same_tokens("1 device", &t1, &cpu_tokens, &cpu_logits);
    let ok2 = same_tokens("2 virtual devices", &t2, &cpu_tokens, &cpu_logits);
    if !(ok1 && ok2) {
        std::process::exit(1);
    }
    Ok(())
}

/// Whether `got` equals the CPU's `want` up to the end or to a near tie:
/// at the first token that differs, the CPU's logits (`logits[i]`, the
/// step that chose `want[i]`) of the two tokens within 5 % of the logits'
/// RMS (a rounding difference between backends: later tokens follow
/// another history and are not compared). Prints what it found.
fn same_tokens(label: &str, got: &[i32], want: &[i32], logits: &[Vec<f32>]) -> bool {
    let Some(i) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) else {
        return true;
    };
    let (Some(&g), Some(&w), Some(l)) = (got.get(i), want.get(i), logits.get(i)) else {
        println!("cuda bench: MISMATCH ({label}): {} tokens, the CPU run has {}", got.len(), want.len());
        return false;
    };
    let rms = (l.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / l.len().max(1) as f64).sqrt();
    let margin = f64::from(l[w as usize]) - f64::from(l[g as usize]);
    if margin <= 0.05 * rms {
        println!(
            "tokens equal the CPU run ({label}) up to token {i}, a near tie on the CPU ({w}: {}, {g}: {}; RMS \
             {rms:.3}): later tokens not compared",
            l[w as usize], l[g as usize]
        );
        true
    } else {
        println!(
            "cuda bench: MISMATCH ({label}) at token {i}: {g} here, {w} on the CPU, whose logits put {w} {margin:.3} \
             above {g} (RMS {rms:.3}): not a near tie"
        );
        false
    }
}
