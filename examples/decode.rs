//! Greedy decoding speed of a `qwen3` or `qwen35` model on N devices (CPU
//! by default; tensor split): a real GGUF file (`--model PATH`, its architecture read
//! from `general.architecture`), or a generated `qwen3` written once into
//! the system temp folder; prints prompt and decode tokens/s.
//!
//! `cargo run --release --example decode -- --devices 2 --tensor-split 1,1 --ctx-size 65536`
//!
//! Options (llama.cpp's names): `--device LIST` (device names, as in the
//! speculative examples: `CPU`, `CUDA0`, `CUDA0,CUDA0` for two virtual
//! devices of one GPU, `HIP0`, `EMU`; default CPU devices), `--devices N`
//! (default 1, or as many as `--tensor-split` or `--device` gives), `--tensor-split r0,r1,..` (default equal),
//! `--split-mode none|layer|tensor|hybrid` (none: one device), `--threads N` (per device, default 1),
//! `--ctx-size N` (KV cells, default 4096), `--fit on|off` (on: the largest
//! context of 256-cell steps up to `--ctx-size` that fits every device,
//! sized from the plans before anything is allocated; default off),
//! `--cache-type-k TYPE` and `--cache-type-v TYPE` (each one of llama.cpp's
//! cache types: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl once
//! the core has it; default f16), `--n-prompt N` (prompt tokens,
//! default 16; processed in batches of `--ubatch-size`, default 512),
//! `--prompt-tokens 1,2,3` or `--prompt-tokens-file F` (the prompt as token
//! ids instead), `--n-predict N` (tokens decoded, default 32; `--tokens` is
//! the same), `--model PATH` (default: a generated `qwen3` with random
//! weights, so that every layer changes the logits), `--verify` (then the
//! run is repeated on the same devices reading the logits, and compared
//! with a run of the same file on one CPU device fed the same tokens: the
//! greedy tokens exactly, and the logits each was chosen from within an
//! NMSE bound (`spec::verify_tolerance`; on a GPU or several devices a token may differ where that step's logits agree): `verify: identical … logits NMSE at
//! most …`, or `verify: MISMATCH` naming the first token or step that
//! differs and exit status 1; the logits matter because a model whose
//! layers write little, such as the permutation models the speculative
//! examples generate, keeps its greedy tokens whatever its layers do). A
//! file of another architecture, or with a tensor of a type this build
//! cannot run, is refused naming it.
//! `--batch-cost 1,2,4,8,16` then times one step of each of those token
//! counts (1..=512; 1 is always timed) where the run ended (a speculative
//! verify batch: the greedy token of every position; median of 5, each
//! rolled back; the cache must hold the largest count too) and prints
//! `batch cost: 1 tokens X ms (1.00x), 2 tokens Y ms (…x), …`, the ratios
//! to one token.
//! The result line reads `… ctx-size N: prompt N tokens X tokens/s; decode N
//! tokens Y tokens/s; …`. `RUST_LOG=debug` logs every decode step: tokens,
//! position, bytes moved, time.

use shardgraph::split::Devices;
use shardgraph::GgmlType;
use shardgraph_models::fit::{fit_ctx_size, FitDraft, FitSpec, FitTarget, CTX_STEP};
use shardgraph_models::generate::{write_qwen3_gguf_progress, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session};
use shardgraph_models::qwen35::{Qwen35Hparams, Qwen35Session};
use shardgraph_models::step::{StepOutput, Target};
use shardgraph_models::types::{KvTypes, TensorTypes};
use std::time::Instant;

#[path = "common/spec.rs"]
mod spec;
use spec::{check_options, parsed};

/// The options this example takes (each followed by a value).
const OPTIONS: &[&str] = &[
    "--device",
    "--devices",
    "--tensor-split",
    "--split-mode",
    "--threads",
    "--ctx-size",
    "--fit",
    "--cache-type-k",
    "--cache-type-v",
    "--n-prompt",
    "--prompt-tokens",
    "--prompt-tokens-file",
    "--ubatch-size",
    "--n-predict",
    "--tokens",
    "--model",
    "--batch-cost",
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
    spec::finish();
}

fn run() -> shardgraph::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    check_options(&args, "decode", OPTIONS);
    let verify = args.iter().any(|a| a == "--verify");
    let (ratios, mode) = spec::devices(&args, 1);
    let n = ratios.len();
    let n_tokens: usize = parsed(&args, "--n-predict", parsed(&args, "--tokens", 32usize));
    let threads: usize = parsed(&args, "--threads", 1);
    let n_prompt: usize = parsed(&args, "--n-prompt", 16);
    let ubatch: usize = parsed(&args, "--ubatch-size", 512);
    let kv = spec::cache_types(&args);
    let bad = |m: String| -> ! {
        eprintln!("{m}");
        std::process::exit(2)
    };
    if threads == 0 || threads > spec::MAX_THREADS {
        bad(format!("--threads {threads}: must be within 1..={}", spec::MAX_THREADS));
    }
    for (name, v) in [("--n-prompt", n_prompt), ("--ubatch-size", ubatch), ("--n-predict", n_tokens)] {
        if v == 0 {
            bad(format!("{name} {v}: must be at least 1"));
        }
    }
    // The prompt's ids (or a synthetic one of --n-prompt ids, made once the vocabulary is known).
    let given: Option<Vec<i32>> = Some(spec::prompt_tokens(&args, Vec::new)).filter(|p| !p.is_empty());
    let n_prompt = given.as_ref().map_or(n_prompt, Vec::len);
    // `--batch-cost` counts, checked before anything runs (1 always among them).
    let batch_counts = spec::arg(&args, "--batch-cost").map(|list| batch_counts(&list));
    let largest_batch = batch_counts.as_ref().and_then(|c| c.iter().max().copied()).unwrap_or(0);
    let Some(needed) =
        n_prompt.checked_add(n_tokens).and_then(|v| v.checked_add(largest_batch)).and_then(|v| i64::try_from(v).ok())
    else {
        bad(format!("no context can hold {n_prompt} prompt and {n_tokens} generated tokens"))
    };
    spec::ctx_request(&args, 4096, needed);
    let devices = spec::open_devices(&args, &ratios, threads)?;
    let path = match spec::given_file(&args, "--model") {
        Some(p) => p,
        None => {
            let (hp, types) = (hparams(), TensorTypes::uniform(GgmlType::Q8_0));
            // Random weights: every layer moves the logits, so `--verify`
            // sees a layer computed wrongly on one device.
            let p = std::env::temp_dir().join("shardgraph-decode-qwen3-q8_0-random.gguf");
            let what = format!("generating {}", p.display());
            let current = |f: &shardgraph::gguf::GgufFile| Qwen3Hparams::from_gguf(f).is_ok_and(|h| h == hp);
            spec::ensure(&p, current, |tmp| {
                write_qwen3_gguf_progress(tmp, &hp, &types, 1, Weights::Random, &mut spec::progress(&what))
            })?;
            p
        }
    };
    // The model's architecture, dimensions and tensor types come from the file.
    let file = shardgraph::gguf::GgufFile::open(&path)?;
    let model = Model::read(&file)?;
    let prompt =
        given.unwrap_or_else(|| (0..n_prompt).map(|i| ((i * 97 + 5) % model.n_vocab() as usize) as i32).collect());
    let ctx_size = spec::ctx_size(&args, 4096, needed, |max| {
        let spec = FitSpec {
            target: model.fit_target(),
            draft: FitDraft::None,
            cache_types: kv,
            ratios: ratios.clone(),
            mode: devices.split_mode(),
            groups: devices.groups(),
            n_batch: n_prompt.min(ubatch) as i64,
            snapshot_slots: 0,
            link: devices.link_model()?,
        };
        let max = if max > 0 { max } else { spec.max_ctx() }.max(CTX_STEP);
        fit_ctx_size(&spec, max, &devices.executor()?)
    })?;
    let mut s = Session::load(&file, &devices, kv, ctx_size)?;
    drop(file);
    // Warm-up, as llama.cpp's context creation: the weights move onto the
    // devices and the first programs compile; then the cache is forgotten.
    let first = s.target().decode_last(&prompt[..prompt.len().min(ubatch)], &[], false)?;
    s.decode(&first.argmax, &[], false)?;
    s.restart()?;
    let run = greedy(&mut s, &prompt, ubatch, n_tokens, false, None)?;
    let batch_cost = match &batch_counts {
        Some(c) => Some(batch_cost(&mut s, c, *run.tokens.last().unwrap_or(&0))?),
        None => None,
    };
    println!(
        "{} {n} device(s) {ratios:?} (--split-mode {mode}), {threads} thread(s) each, ctx-size {ctx_size}, KV cache {kv}: prompt {} tokens {:.1} tokens/s; decode {n_tokens} tokens {:.1} tokens/s; {} bytes moved per decode step",
        s.arch(),
        prompt.len(),
        prompt.len() as f64 / run.prompt_s,
        n_tokens as f64 / run.decode_s,
        run.bytes_moved / n_tokens.max(1) as u64
    );
    if let Some(line) = batch_cost {
        println!("{line}");
    }
    if n > 1 {
        println!("plans by the slowest link each collective crosses (whole run): {}", s.by_link());
    }
    // The check: the same run again on these devices, reading the logits
    // (the timed run reads only the tokens).
    let checked = if verify {
        s.restart()?;
        Some(greedy(&mut s, &prompt, ubatch, n_tokens, true, None)?)
    } else {
        None
    };
    drop(s);
    if let Some(checked) = checked {
        if checked.tokens != run.tokens {
            println!(
                "verify: MISMATCH between two runs on the same devices: {:?} then {:?}",
                run.tokens, checked.tokens
            );
            std::process::exit(1);
        }
        let (ref_tokens, ref_logits) = if devices.n_devices() == 1 && devices.all_cpu() {
            (checked.tokens.clone(), checked.logits.clone())
        } else {
            let one = Devices::cpu(1, threads)?;
            let file = shardgraph::gguf::GgufFile::open(&path)?;
            // Fed the tokens of the run it checks (its own greedy choices
            // kept apart), so its logits are those of the same history.
            let mut one = Session::load(&file, &one, kv, ctx_size)?;
            let r = greedy(&mut one, &prompt, ubatch, n_tokens, true, Some(&checked.tokens))?;
            (r.tokens, r.logits)
        };
        let what = "greedy tokens equal those of one CPU device";
        if !spec::verify_line(
            what,
            &checked.tokens,
            &checked.logits,
            &checked.tokens,
            &ref_tokens,
            &ref_logits,
            spec::verify_tolerance(&devices),
        ) {
            std::process::exit(1);
        }
    }
    Ok(())
}

/// The target model a file holds (by `general.architecture`).
enum Model {
    Qwen3(Qwen3Hparams, TensorTypes),
    Qwen35(Qwen35Hparams, TensorTypes),
}

impl Model {
    /// Reads the architecture, hyper-parameters and tensor types of `file`.
    ///
    /// # Errors
    /// [`shardgraph::Error::Model`] naming another architecture; the
    /// models' metadata errors.
    fn read(file: &shardgraph::gguf::GgufFile) -> shardgraph::Result<Self> {
        let types = TensorTypes::from_file(file);
        match file.get_str("general.architecture")? {
            "qwen3" => Ok(Model::Qwen3(Qwen3Hparams::from_gguf(file)?, types)),
            "qwen35" => Ok(Model::Qwen35(Qwen35Hparams::from_gguf(file)?, types)),
            other => Err(shardgraph::Error::Model {
                detail: format!(
                    "{}: general.architecture {other:?} (this example decodes qwen3 or qwen35)",
                    file.name()
                ),
            }),
        }
    }

    fn n_vocab(&self) -> i64 {
        match self {
            Model::Qwen3(hp, _) => hp.n_vocab,
            Model::Qwen35(hp, _) => hp.n_vocab,
        }
    }

    fn fit_target(&self) -> FitTarget {
        match self {
            Model::Qwen3(hp, types) => FitTarget::Qwen3 { hp: hp.clone(), types: types.clone() },
            Model::Qwen35(hp, types) => FitTarget::Qwen35 { hp: hp.clone(), types: types.clone() },
        }
    }
}

/// A loaded `qwen3` or `qwen35` session.
enum Session {
    Qwen3(Box<Qwen3Session>),
    Qwen35(Box<Qwen35Session>),
}

impl Session {
    /// Loads `file` onto `devices` with KV caches of `kv` × `ctx_size` cells.
    fn load(
        file: &shardgraph::gguf::GgufFile,
        devices: &Devices,
        kv: KvTypes,
        ctx_size: i64,
    ) -> shardgraph::Result<Self> {
        Ok(match file.get_str("general.architecture")? {
            "qwen35" => Session::Qwen35(Box::new(Qwen35Session::load_file(file, devices, kv, ctx_size)?)),
            _ => Session::Qwen3(Box::new(Qwen3Session::load_file(file, devices, kv, ctx_size)?)),
        })
    }

    fn target(&mut self) -> &mut dyn Target {
        match self {
            Session::Qwen3(s) => s.as_mut(),
            Session::Qwen35(s) => s.as_mut(),
        }
    }

    fn decode(&mut self, tokens: &[i32], taps: &[usize], logits: bool) -> shardgraph::Result<StepOutput> {
        self.target().decode(tokens, taps, logits)
    }

    /// Forgets the sequence (a `qwen35`'s recurrent states are zeroed).
    fn restart(&mut self) -> shardgraph::Result<()> {
        match self {
            Session::Qwen3(s) => s.rollback(0),
            Session::Qwen35(s) => s.reset(),
        }
    }

    fn bytes_moved(&self) -> u64 {
        match self {
            Session::Qwen3(s) => s.runner().bytes_moved(),
            Session::Qwen35(s) => s.runner().bytes_moved(),
        }
    }

    /// "same process: 96 collective(s), 22704 B; same node: …" over all
    /// runs so far (empty when nothing crossed a link).
    fn by_link(&self) -> String {
        let r = match self {
            Session::Qwen3(s) => s.runner(),
            Session::Qwen35(s) => s.runner(),
        };
        let classes = shardgraph::split::LinkClass::ALL.iter().zip(r.planned_by_link());
        let parts: Vec<String> = classes
            .filter(|(_, (k, _))| *k > 0)
            .map(|(c, (k, b))| format!("{}: {k} collective(s), {b} B", c.name()))
            .collect();
        if parts.is_empty() {
            return "none".into();
        }
        parts.join("; ")
    }

    fn arch(&self) -> &str {
        match self {
            Session::Qwen3(_) => "qwen3",
            Session::Qwen35(_) => "qwen35",
        }
    }
}

/// The token counts of `--batch-cost LIST` (comma-separated, each in
/// 1..=512), with 1 first if the list lacks it (the ratios are to one
/// token); exits with a message on a bad list.
fn batch_counts(list: &str) -> Vec<usize> {
    let mut counts: Vec<usize> = list
        .split(',')
        .map(|v| v.trim().parse().ok().filter(|&n: &usize| (1..=512).contains(&n)))
        .collect::<Option<_>>()
        .unwrap_or_else(|| {
            eprintln!("--batch-cost {list}: token counts of 1..=512, comma-separated");
            std::process::exit(2)
        });
    if !counts.contains(&1) {
        counts.insert(0, 1);
    }
    counts
}

/// `--batch-cost`: the median time of one step of each token count in
/// `counts` where the run ended, 5 timed steps each after one untimed one
/// (its program compiles); the line to print. A step of several tokens is
/// rolled back (a verify batch whose drafts are all rejected); a step of
/// one is kept (a `qwen35` keeps no checkpoint to roll a single token back
/// into), so later counts start a few positions on.
fn batch_cost(s: &mut Session, counts: &[usize], token: i32) -> shardgraph::Result<String> {
    let mut out = Vec::new();
    for &n in counts {
        let batch = vec![token; n];
        let mut times = Vec::new();
        for rep in 0..6 {
            let at = s.target().n_past();
            let t = Instant::now();
            s.decode(&batch, &[], false)?;
            if rep > 0 {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            if n > 1 {
                s.target().rollback(at)?;
            }
        }
        times.sort_by(f64::total_cmp);
        out.push((n, times[times.len() / 2]));
    }
    let one = out.iter().find(|o| o.0 == 1).map_or(1.0, |o| o.1);
    let cells: Vec<String> = out.iter().map(|(n, ms)| format!("{n} tokens {ms:.1} ms ({:.2}x)", ms / one)).collect();
    Ok(format!("batch cost: {}", cells.join(", ")))
}

/// A timed greedy run: its tokens, the seconds of the prompt and of the
/// decode steps, and the bytes the decode steps moved between devices.
struct Run {
    /// The greedy token after the prompt, then after each decoded token.
    tokens: Vec<i32>,
    /// When asked for: the logits `[n_vocab]` each token was chosen from.
    logits: Vec<Vec<f32>>,
    prompt_s: f64,
    decode_s: f64,
    bytes_moved: u64,
}

/// Decodes `prompt` in batches of `ubatch`, then `n` tokens one at a time,
/// each the greedy token after the previous one (with `forced`, the token
/// `forced[i]` is fed at step `i` instead, while `tokens` keeps the greedy
/// choices); with `want_logits` keeps the logits each token was chosen from.
fn greedy(
    s: &mut Session,
    prompt: &[i32],
    ubatch: usize,
    n: usize,
    want_logits: bool,
    forced: Option<&[i32]>,
) -> shardgraph::Result<Run> {
    let mut logits = Vec::new();
    // The logits of the last position of a step ([V, T], a column per token).
    let mut keep = |out: &StepOutput| {
        if let Some(l) = &out.logits {
            let v = l.len() / out.argmax.len().max(1);
            logits.push(l[l.len() - v..].to_vec());
        }
    };
    let t = Instant::now();
    let mut last = 0;
    let mut prompt_out = None;
    for chunk in prompt.chunks(ubatch) {
        // The head runs for each chunk's last token only (llama.cpp's
        // batches of a prompt output their last token).
        let out = s.target().decode_last(chunk, &[], want_logits)?;
        last = *out.argmax.last().unwrap_or(&0);
        prompt_out = Some(out);
    }
    let prompt_s = t.elapsed().as_secs_f64();
    if let Some(out) = &prompt_out {
        keep(out);
    }
    let mut tokens = vec![last];
    let moved_before = s.bytes_moved();
    let t = Instant::now();
    for i in 0..n {
        let fed = forced.and_then(|f| f.get(i).copied()).unwrap_or(last);
        let out = s.decode(&[fed], &[], want_logits)?;
        last = out.argmax[0];
        tokens.push(last);
        keep(&out);
    }
    let decode_s = t.elapsed().as_secs_f64();
    Ok(Run { tokens, logits, prompt_s, decode_s, bytes_moved: s.bytes_moved() - moved_before })
}
