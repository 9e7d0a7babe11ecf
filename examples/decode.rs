//! Greedy decoding speed of a generated `qwen3` model on N CPU devices
//! (tensor split): writes the model once (`--model PATH`, default in the
//! system temp folder), then prints prompt and decode tokens/s.
//!
//! `cargo run --release --example decode -- --devices 2 --tensor-split 1,1 --tokens 32`
//! (`RUST_LOG=debug` logs every decode step: tokens, position, bytes moved, time).

use shardgraph::models::generate::{write_qwen3_gguf_progress, Weights};
use shardgraph::models::qwen3::{Qwen3Hparams, Qwen3Session, Qwen3Types};
use shardgraph::GgmlType;
use std::time::Instant;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn main() -> shardgraph::Result<()> {
    env_logger::init();
    let args: Vec<String> = std::env::args().collect();
    let n: usize = arg(&args, "--devices").and_then(|v| v.parse().ok()).unwrap_or(1);
    let ratios: Vec<f32> = match arg(&args, "--tensor-split") {
        Some(s) => s.split(',').map(|x| x.trim().parse().unwrap_or(f32::NAN)).collect(),
        None => vec![1.0; n],
    };
    if ratios.len() != n || ratios.iter().any(|r| !r.is_finite() || *r < 0.0) {
        eprintln!("--tensor-split needs {n} non-negative numbers, got {ratios:?}");
        std::process::exit(2);
    }
    let n_tokens: usize = arg(&args, "--tokens").and_then(|v| v.parse().ok()).unwrap_or(32);
    let threads: usize = arg(&args, "--threads").and_then(|v| v.parse().ok()).unwrap_or(1);
    let hp = Qwen3Hparams {
        n_layer: 8,
        n_embd: 1024,
        n_ff: 2816,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 64,
        n_vocab: 32000,
        rms_eps: 1e-6,
        rope_base: 1e6,
        n_ctx_train: 4096,
    };
    let types = Qwen3Types::all(GgmlType::Q8_0);
    let path = arg(&args, "--model")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("shardgraph-decode-qwen3-q8_0.gguf"));
    if !path.exists() {
        let t = Instant::now();
        let mut shown = 0;
        let bytes = write_qwen3_gguf_progress(&path, &hp, &types, 1, Weights::Permutation, &mut |done, total| {
            let pct = done * 100 / total.max(1);
            if pct >= shown + 5 || done == total {
                shown = pct;
                eprint!(
                    "\rgenerating {}: {pct:3}% ({:.0}/{:.0} MB)",
                    path.display(),
                    done as f64 / 1e6,
                    total as f64 / 1e6
                );
            }
        })?;
        eprintln!();
        println!("wrote {} ({:.0} MB) in {:.1} s", path.display(), bytes as f64 / 1e6, t.elapsed().as_secs_f64());
    }
    let mut s = Qwen3Session::from_gguf(&path, &ratios, threads, GgmlType::F16, 512)?;
    let prompt: Vec<i32> = (0..16).map(|i| (i * 97 + 5) % 32000).collect();
    let t = Instant::now();
    let out = s.decode(&prompt, &[], false)?;
    let prompt_s = t.elapsed().as_secs_f64();
    let mut last = *out.argmax.last().unwrap_or(&0);
    let moved_before = s.runner.bytes_moved;
    let t = Instant::now();
    for _ in 0..n_tokens {
        last = s.decode(&[last], &[], false)?.argmax[0];
    }
    let dec = t.elapsed().as_secs_f64();
    println!(
        "{n} device(s) {ratios:?}, {threads} thread(s) each: prompt {} tokens {:.1} tokens/s; decode {n_tokens} tokens {:.1} tokens/s; {} bytes moved per decode step",
        prompt.len(),
        prompt.len() as f64 / prompt_s,
        n_tokens as f64 / dec,
        (s.runner.bytes_moved - moved_before) / n_tokens.max(1) as u64
    );
    Ok(())
}
