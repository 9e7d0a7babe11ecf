//! Greedy decoding speed of a generated `qwen3` model on N CPU devices
//! (tensor split): writes the model once (`--model PATH`, default in the
//! system temp folder), then prints prompt and decode tokens/s.
//!
//! `cargo run --release --example decode -- --devices 2 --tensor-split 1,1 --ctx-size 65536`
//!
//! Options (llama.cpp's names): `--devices N` (default 1, or as many as
//! `--tensor-split` gives), `--tensor-split r0,r1,..` (default equal),
//! `--split-mode none|tensor` (none: one device), `--threads N` (per device, default 1),
//! `--ctx-size N` (KV cells, default 4096), `--fit on|off` (on: the largest
//! context of 256-cell steps up to `--ctx-size` that fits every device,
//! sized from the plans before anything is allocated; default off),
//! `--n-prompt N` (prompt tokens,
//! default 16; processed in batches of `--ubatch-size`, default 512),
//! `--n-predict N` (tokens decoded, default 32; `--tokens` is the same),
//! `--model PATH`, `--verify` (then the greedy tokens of the run are compared
//! with a run of the same file on one CPU device: `verify: identical`, or
//! `verify: MISMATCH` naming the first token that differs and exit status 1).
//! The result line reads `… ctx-size N: prompt N tokens X tokens/s; decode N
//! tokens Y tokens/s; …`. `RUST_LOG=debug` logs every decode step: tokens,
//! position, bytes moved, time.

use shardgraph::split::Devices;
use shardgraph::GgmlType;
use shardgraph_models::fit::{fit_ctx_size, FitDraft, FitSpec, FitTarget, CTX_STEP};
use shardgraph_models::generate::{write_qwen3_gguf_progress, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session, Qwen3Types};
use std::time::Instant;

#[path = "common/spec.rs"]
mod spec;
use spec::{check_options, parsed};

/// The options this example takes (each followed by a value).
const OPTIONS: &[&str] = &[
    "--devices",
    "--tensor-split",
    "--split-mode",
    "--threads",
    "--ctx-size",
    "--fit",
    "--n-prompt",
    "--ubatch-size",
    "--n-predict",
    "--tokens",
    "--model",
];

/// The example model: 8 layers, n_embd 1024, 16 heads / 8 KV heads of 64,
/// n_ff 2816, vocabulary 32000, Q8_0 (170 MB).
fn hparams() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(8, 1024, 2816, 16, 8, 64), n_vocab: 32000, n_ctx_train: 4096 }
}

fn main() {
    env_logger::init();
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> shardgraph::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    check_options(&args, "decode", OPTIONS);
    let verify = args.iter().any(|a| a == "--verify");
    let (ratios, _) = spec::devices(&args, 1);
    let n = ratios.len();
    let n_tokens: usize = parsed(&args, "--n-predict", parsed(&args, "--tokens", 32usize));
    let threads: usize = parsed(&args, "--threads", 1);
    let n_prompt: usize = parsed(&args, "--n-prompt", 16);
    let ubatch: usize = parsed(&args, "--ubatch-size", 512);
    let bad = |m: String| -> ! {
        eprintln!("{m}");
        std::process::exit(2)
    };
    if threads == 0 || threads > spec::MAX_THREADS || n_prompt == 0 || ubatch == 0 {
        bad(format!(
            "--threads {threads} (1..={}), --n-prompt {n_prompt} and --ubatch-size {ubatch} (at least 1)",
            spec::MAX_THREADS
        ));
    }
    let Some(needed) = n_prompt.checked_add(n_tokens).and_then(|v| i64::try_from(v).ok()) else {
        bad(format!("no context can hold {n_prompt} prompt and {n_tokens} generated tokens"))
    };
    spec::ctx_request(&args, 4096, needed);
    let devices = spec::open_devices(&args, &ratios, threads)?;
    let path = match spec::given_file(&args, "--model") {
        Some(p) => p,
        None => {
            let (hp, types) = (hparams(), Qwen3Types::all(GgmlType::Q8_0));
            let p = std::env::temp_dir().join("shardgraph-decode-qwen3-q8_0.gguf");
            let what = format!("generating {}", p.display());
            let current = |f: &shardgraph::gguf::GgufFile| Qwen3Hparams::from_gguf(f).is_ok_and(|h| h == hp);
            spec::ensure(&p, current, |tmp| {
                write_qwen3_gguf_progress(tmp, &hp, &types, 1, Weights::Permutation, &mut spec::progress(&what))
            })?;
            p
        }
    };
    // The model's dimensions come from the file (the generated one or --model).
    let file = shardgraph::gguf::GgufFile::open(&path)?;
    let (hp, types) = (Qwen3Hparams::from_gguf(&file)?, Qwen3Types::from_gguf(&file)?);
    let ctx_size = spec::ctx_size(&args, 4096, needed, |max| {
        let spec = FitSpec {
            target: FitTarget::Qwen3 { hp: hp.clone(), types },
            draft: FitDraft::None,
            kv_type: GgmlType::F16,
            ratios: ratios.clone(),
            n_batch: n_prompt.min(ubatch) as i64,
            snapshot_slots: 0,
        };
        let max = if max > 0 { max } else { spec.max_ctx() }.max(CTX_STEP);
        fit_ctx_size(&spec, max, &devices.executor()?)
    })?;
    let mut s = Qwen3Session::load_file(&file, &devices, GgmlType::F16, ctx_size)?;
    drop(file);
    let prompt: Vec<i32> = (0..n_prompt).map(|i| ((i * 97 + 5) % hp.n_vocab as usize) as i32).collect();
    // Warm-up, as llama.cpp's context creation: the weights move onto the
    // devices and the first programs compile; then the cache is forgotten.
    let first = s.decode(&prompt[..prompt.len().min(ubatch)], &[], false)?;
    s.decode(&first.argmax[first.argmax.len() - 1..], &[], false)?;
    s.rollback(0)?;
    let run = greedy(&mut s, &prompt, ubatch, n_tokens)?;
    println!(
        "{n} device(s) {ratios:?}, {threads} thread(s) each, ctx-size {ctx_size}: prompt {} tokens {:.1} tokens/s; decode {n_tokens} tokens {:.1} tokens/s; {} bytes moved per decode step",
        prompt.len(),
        prompt.len() as f64 / run.prompt_s,
        n_tokens as f64 / run.decode_s,
        run.bytes_moved / n_tokens.max(1) as u64
    );
    drop(s);
    if verify {
        let reference = if devices.n_devices() == 1 && devices.all_cpu() {
            run.tokens.clone()
        } else {
            let one = Devices::cpu(1, threads)?;
            greedy(&mut Qwen3Session::load(&path, &one, GgmlType::F16, ctx_size)?, &prompt, ubatch, n_tokens)?.tokens
        };
        match reference.iter().zip(&run.tokens).position(|(a, b)| a != b) {
            None if reference.len() == run.tokens.len() => println!(
                "verify: identical — {} greedy tokens equal those of one CPU device (first: {:?})",
                run.tokens.len(),
                &run.tokens[..run.tokens.len().min(8)]
            ),
            i => {
                let i = i.unwrap_or(reference.len().min(run.tokens.len()));
                println!(
                    "verify: MISMATCH with one-CPU-device greedy decoding at token {i}: {:?} here, {:?} on one device",
                    run.tokens.get(i),
                    reference.get(i)
                );
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

/// A timed greedy run: its tokens, the seconds of the prompt and of the
/// decode steps, and the bytes the decode steps moved between devices.
struct Run {
    /// The greedy token after the prompt, then after each decoded token.
    tokens: Vec<i32>,
    prompt_s: f64,
    decode_s: f64,
    bytes_moved: u64,
}

/// Decodes `prompt` in batches of `ubatch`, then `n` tokens one at a time,
/// each the greedy token after the previous one.
fn greedy(s: &mut Qwen3Session, prompt: &[i32], ubatch: usize, n: usize) -> shardgraph::Result<Run> {
    let t = Instant::now();
    let mut last = 0;
    for chunk in prompt.chunks(ubatch) {
        last = *s.decode(chunk, &[], false)?.argmax.last().unwrap_or(&0);
    }
    let prompt_s = t.elapsed().as_secs_f64();
    let mut tokens = vec![last];
    let moved_before = s.runner().bytes_moved();
    let t = Instant::now();
    for _ in 0..n {
        last = s.decode(&[last], &[], false)?.argmax[0];
        tokens.push(last);
    }
    let decode_s = t.elapsed().as_secs_f64();
    Ok(Run { tokens, prompt_s, decode_s, bytes_moved: s.runner().bytes_moved() - moved_before })
}
