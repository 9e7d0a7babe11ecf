//! CUDA backend throughput, printed as tables (run on a machine with a GPU;
//! `scripts/gpu-check.sh` runs it):
//!
//! 1. matrix-vector products (`mul_mat` with one column, the decode case)
//!    for each weight type: achieved GB/s of weight reads against the GPU's
//!    peak memory bandwidth, and the CPU backend's GB/s on the same shape in
//!    the same run (the GPU/CPU ratio);
//! 2. decode tokens/s of a generated `qwen3` model on one CUDA device and
//!    on two virtual devices of the same GPU (tensor split 1:1), with the
//!    CPU backend's one-device figure beside them.
//!
//! `cargo bench --features cuda --bench cuda`. Without a GPU it says so and
//! exits; `SHARDGRAPH_BENCH_EMU=1` with `--features cuda-emu` runs it on the
//! emulated GPU at toy sizes (checks the bench itself; its numbers mean
//! nothing). `SHARDGRAPH_BENCH_K`/`_M` set the matrix shape (default 4096 ×
//! 4096), `SHARDGRAPH_BENCH_SECS` the time per measurement (default 1).

use shardgraph::backend::cuda::CudaBackend;
use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::split::Devices;
use shardgraph::tensor::quant;
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorStorage};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session};
use shardgraph_models::types::TensorTypes;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
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
    let vals: Vec<f32> = (0..(k * m) as usize).map(|i| ((i * 7919) % 1999) as f32 / 1999.0 - 0.5).collect();
    let mut bytes = vec![0u8; ty.row_size(k)? * m as usize];
    quant::quantize_chunk(ty, &vals, &mut bytes, m as usize, k as usize)?;
    st.set_bytes(&ctx, w, 0, &bytes)?;
    st.set_f32(&ctx, x, &vals[..k as usize])?;
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
    let emu = std::env::var("SHARDGRAPH_BENCH_EMU").is_ok();
    let gpu = match CudaBackend::new(0) {
        Ok(b) => b,
        #[cfg(feature = "cuda-emu")]
        Err(_) if emu => CudaBackend::emulated(4 << 30),
        Err(e) => {
            println!("cuda bench: skipped: no GPU ({e})");
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
    for ty in [F32, F16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K] {
        let bytes = (ty.row_size(k)? * m as usize) as f64;
        let g = matvec_seconds(&gpu, ty, k, m, budget)?;
        let c = matvec_seconds(&cpu, ty, k, m, budget)?;
        println!(
            "| {ty} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {:.2} |",
            bytes / 1e6,
            g * 1e6,
            bytes / g / 1e9,
            if peak > 0.0 { format!("{:.0}%", 100.0 * bytes / g / peak) } else { "n/a".into() },
            bytes / c / 1e9,
            c / g
        );
    }

    // Decode tokens/s of a generated qwen3 (Q8_0).
    let hp = if emu {
        Qwen3Hparams { core: HparamsCore::qwen3(2, 256, 256, 2, 2, 128), n_vocab: 96, n_ctx_train: 4096 }
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
    let run = |label: &str, ratios: &[f32], devs: Option<Vec<Arc<dyn Backend>>>| -> shardgraph::Result<Vec<i32>> {
        let devices = match devs {
            Some(d) => Devices::from_backends(d)?,
            None => Devices::cpu(ratios.len(), cpu.n_threads() / ratios.len().max(1))?,
        };
        let devices = devices.with_tensor_split(ratios)?;
        let mut s = Qwen3Session::load(&path, &devices, GgmlType::F16, (prompt.len() + n_tok + 1) as i64)?;
        let mut tok = *s.decode(&prompt, &[], false)?.argmax.last().unwrap_or(&0);
        let mut out = vec![tok];
        let t = Instant::now();
        for _ in 1..n_tok {
            tok = s.decode(&[tok], &[], false)?.argmax[0];
            out.push(tok);
        }
        println!(
            "| {label} | {:.1} | {:?}.. |",
            (n_tok - 1) as f64 / t.elapsed().as_secs_f64(),
            &out[..out.len().min(4)]
        );
        Ok(out)
    };
    let cpu_tokens = run("CPU x1", &[1.0], None)?;
    let t1 = run("CUDA x1", &[1.0], Some(devices(1, emu)?))?;
    let t2 = run("CUDA x2 (virtual, 1:1)", &[1.0, 1.0], Some(devices(2, emu)?))?;
    println!("\ntokens equal the CPU run: 1 device {}, 2 virtual devices {}", t1 == cpu_tokens, t2 == cpu_tokens);
    Ok(())
}
