//! The main job: speculative decoding with a DFlash2 drafter (block
//! diffusion, dynamic convolutions, candidate selector) and a `qwen3`
//! target, tensor-parallel on N CPU devices.
//!
//! `cargo run --release --example dflash2 -- --devices 2 --tensor-split 1,1 --verify`
//!
//! On first use it writes the example models into the system temp folder,
//! with a progress display: a ~190 MB `qwen3` target in a Q4_K_M-like mixed
//! layout whose greedy continuation follows a vocabulary permutation except
//! where its first layer's attention settles on an earlier token, and a
//! 66 MB Q8_0 DFlash2 drafter built to predict the permutation (so it is
//! right often, and wrong where the target's attention intervenes). It then decodes the same
//! prompt twice on the same devices — plain greedy, then speculative — and
//! prints tokens/s, drafted and accepted counts and the speed-up; with
//! `--verify` it checks the speculative output against plain greedy
//! decoding on one device and ends with `verify: identical`.
//!
//! Options (llama.cpp's names where it has one):
//! `--devices N` (default 2), `--tensor-split r0,r1,..` (default equal),
//! `--split-mode none|tensor` (default tensor; `none` runs on one device),
//! `--spec-draft-n-max` (default: the drafter's block size − 1),
//! `--spec-draft-n-min` (default 0), `--spec-draft-p-min` (default 0),
//! `--cache-type-k f16|q8_0|q4_0` (KV caches of both models, default f16),
//! `--n-predict` (tokens to generate, default 96), `--threads` (per device,
//! default 1), `--model PATH`, `--model-draft PATH`, `--verify`.
//! `RUST_LOG=debug` logs every speculative step.

use shardgraph::models::dflash::{DflashDrafter, DflashHparams};
use shardgraph::models::generate::{write_dflash_gguf_with, write_qwen3_gguf_progress, Weights};
use shardgraph::models::qwen3::{Qwen3Hparams, Qwen3Session, Qwen3Types};
use shardgraph::models::speculative::{generate, Drafter, SpecParams, SpecStats};
use shardgraph::GgmlType;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Proposes nothing: plain greedy decoding through the same loop.
struct NoDraft;

impl Drafter for NoDraft {
    fn draft(&mut self, _: &mut Qwen3Session, _: i32, _: i64, _: usize) -> shardgraph::Result<Vec<i32>> {
        Ok(Vec::new())
    }
}

/// The options this example takes (each followed by a value, except `--verify`).
const OPTIONS: &[&str] = &[
    "--devices",
    "--tensor-split",
    "--split-mode",
    "--spec-draft-n-max",
    "--spec-draft-n-min",
    "--spec-draft-p-min",
    "--cache-type-k",
    "--n-predict",
    "--threads",
    "--model",
    "--model-draft",
];

/// Exits with usage on `--help` or an unknown option.
fn check_options(args: &[String]) {
    let mut i = 1;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--help" || a == "-h" {
            println!(
                "usage: dflash2 [--verify] {}",
                OPTIONS.iter().map(|o| format!("[{o} V]")).collect::<Vec<_>>().join(" ")
            );
            println!("(see the doc comment of examples/dflash2.rs for what each does)");
            std::process::exit(0);
        }
        if a == "--verify" {
            i += 1;
        } else if OPTIONS.contains(&a) && i + 1 < args.len() {
            i += 2;
        } else {
            eprintln!("unknown option or missing value: {a} (try --help)");
            std::process::exit(2);
        }
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn parsed<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    match arg(args, name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("{name} {v}: not a valid value");
            std::process::exit(2)
        }),
    }
}

/// The example target: 24 layers, n_embd 1024, 16 heads / 8 KV heads of 64,
/// n_ff 2816, vocabulary 8192.
fn target_hp() -> Qwen3Hparams {
    Qwen3Hparams {
        n_layer: 24,
        n_embd: 1024,
        n_ff: 2816,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 64,
        n_vocab: 8192,
        rms_eps: 1e-6,
        rope_base: 1e6,
        n_ctx_train: 4096,
    }
}

/// The example drafter: DFlash2 with 2 layers, block 8, taps of target
/// layers 2, 12 and 24, conv k = 2 over groups of 16, selector rank 64 and
/// top 16; its FFN width equals the vocabulary (layer 0 is a lookup table).
fn drafter_hp(t: &Qwen3Hparams) -> DflashHparams {
    DflashHparams {
        n_layer: 2,
        n_embd: t.n_embd,
        n_ff: t.n_vocab,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 64,
        rms_eps: 1e-6,
        rope_base: 1e6,
        target_layers: vec![2, 12, 24],
        target_hidden: t.n_embd,
        block_size: 8,
        mask_token: (t.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((64, 16)),
    }
}

fn progress(what: &str) -> impl FnMut(u64, u64) + '_ {
    let mut shown = u64::MAX;
    move |done, total| {
        let pct = done * 100 / total.max(1);
        if shown == u64::MAX || pct >= shown + 5 || done == total {
            shown = pct;
            eprint!("\r{what}: {pct:3}% ({:.0}/{:.0} MB)", done as f64 / 1e6, total as f64 / 1e6);
            if done == total {
                eprintln!();
            }
        }
    }
}

fn ensure_models(target: &Path, drafter: &Path) -> shardgraph::Result<()> {
    let hp = target_hp();
    if !target.exists() {
        let t = Instant::now();
        let tmp = target.with_extension("partial");
        let bytes = write_qwen3_gguf_progress(
            &tmp,
            &hp,
            &Qwen3Types::q4_k_m(),
            1,
            Weights::PermutationWithAttention { attention: 6.0 },
            &mut progress(&format!("generating {}", target.display())),
        )?;
        std::fs::rename(&tmp, target).map_err(|e| shardgraph::Error::Model {
            detail: format!("renaming {} to {}: {e}", tmp.display(), target.display()),
        })?;
        println!("wrote {} ({:.0} MB) in {:.1} s", target.display(), bytes as f64 / 1e6, t.elapsed().as_secs_f64());
    }
    if !drafter.exists() {
        let t = Instant::now();
        eprintln!("generating {} ...", drafter.display());
        let tmp = drafter.with_extension("partial");
        let bytes =
            write_dflash_gguf_with(&tmp, &drafter_hp(&hp), GgmlType::Q8_0, hp.n_vocab, 1, Weights::Permutation)?;
        std::fs::rename(&tmp, drafter).map_err(|e| shardgraph::Error::Model {
            detail: format!("renaming {} to {}: {e}", tmp.display(), drafter.display()),
        })?;
        println!("wrote {} ({:.0} MB) in {:.1} s", drafter.display(), bytes as f64 / 1e6, t.elapsed().as_secs_f64());
    }
    Ok(())
}

fn main() {
    env_logger::init();
    if let Err(e) = run() {
        eprintln!("error: {e}");
        eprintln!(
            "(the generated example models are cached as {}/shardgraph-example-*.gguf; delete them to regenerate)",
            std::env::temp_dir().display()
        );
        std::process::exit(1);
    }
}

fn run() -> shardgraph::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    check_options(&args);
    let mut n: usize = parsed(&args, "--devices", 2);
    if n == 0 {
        eprintln!("--devices must be at least 1");
        std::process::exit(2);
    }
    let mode = arg(&args, "--split-mode").unwrap_or_else(|| "tensor".into());
    let mut ratios: Vec<f32> = match arg(&args, "--tensor-split") {
        Some(s) => s.split(',').map(|x| x.trim().parse().unwrap_or(f32::NAN)).collect(),
        None => vec![1.0; n],
    };
    if n == 0 || ratios.len() != n || ratios.iter().any(|r| !r.is_finite() || *r < 0.0) {
        eprintln!("--tensor-split needs {n} non-negative numbers (one per device), got {ratios:?}");
        std::process::exit(2);
    }
    match mode.as_str() {
        "tensor" => {}
        "none" => {
            // llama.cpp's --split-mode none: the whole model on the main device.
            n = 1;
            ratios = vec![1.0];
        }
        other => {
            eprintln!("--split-mode {other}: use none or tensor");
            std::process::exit(2);
        }
    }
    let kv_type = match arg(&args, "--cache-type-k").as_deref() {
        None | Some("f16") => GgmlType::F16,
        Some("q8_0") => GgmlType::Q8_0,
        Some("q4_0") => GgmlType::Q4_0,
        Some(other) => {
            eprintln!("--cache-type-k {other}: use f16, q8_0 or q4_0");
            std::process::exit(2);
        }
    };
    let n_gen: usize = parsed(&args, "--n-predict", 96);
    let threads: usize = parsed(&args, "--threads", 1);
    let p_min: f32 = parsed(&args, "--spec-draft-p-min", 0.0);
    let n_min: usize = parsed(&args, "--spec-draft-n-min", 0);
    if n_gen == 0 || threads == 0 || !(0.0..=1.0).contains(&p_min) {
        eprintln!("--n-predict and --threads must be at least 1, --spec-draft-p-min within 0..=1");
        std::process::exit(2);
    }
    let verify = args.iter().any(|a| a == "--verify");
    // The example models are generated when absent; paths given by the user must exist.
    let dir = std::env::temp_dir();
    let given = |name: &str| -> Option<PathBuf> {
        let p = PathBuf::from(arg(&args, name)?);
        if !p.is_file() {
            eprintln!("{name} {}: no such file", p.display());
            std::process::exit(2);
        }
        Some(p)
    };
    let target = given("--model").unwrap_or_else(|| dir.join("shardgraph-example-qwen3-q4_k_m.gguf"));
    let draft_path = given("--model-draft").unwrap_or_else(|| dir.join("shardgraph-example-dflash2-q8_0.gguf"));
    ensure_models(&target, &draft_path)?;
    // Check the drafter's metadata before spending time on the baseline.
    let dhp = DflashHparams::from_gguf(&shardgraph::gguf::GgufFile::open(&draft_path)?)?;
    if dhp.block_size < 2 {
        eprintln!("{}: block_size {} leaves nothing to draft", draft_path.display(), dhp.block_size);
        std::process::exit(2);
    }

    let kv_size = 1024;
    let prompt: Vec<i32> = (0..16).map(|i| (i * 389 + 11) % 8000).collect();
    let open = |ratios: &[f32]| Qwen3Session::from_gguf(&target, ratios, threads, kv_type, kv_size);

    // Plain greedy on these devices (the baseline), after a short warm-up
    // run so that neither measurement pays for first-touch page faults.
    let mut s = open(&ratios)?;
    generate(&mut s, &mut NoDraft, &prompt, n_gen.min(8), SpecParams { n_max: 0, n_min: 0 })?;
    drop(s);
    let mut s = open(&ratios)?;
    let t = Instant::now();
    let (plain, _) = generate(&mut s, &mut NoDraft, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 })?;
    let plain_s = t.elapsed().as_secs_f64();
    drop(s);

    // Speculative, DFlash2 drafting.
    let mut s = open(&ratios)?;
    let mut d = DflashDrafter::attach_gguf(&mut s, &draft_path, kv_type, p_min)?;
    let block = d.model.hp.block_size.max(2);
    let n_max: usize = parsed(&args, "--spec-draft-n-max", block - 1).min(block - 1);
    let moved = s.runner.bytes_moved;
    let t = Instant::now();
    let (tokens, st): (Vec<i32>, SpecStats) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max, n_min })?;
    let spec_s = t.elapsed().as_secs_f64();

    let hp = &s.model.hp;
    println!(
        "target {} ({} layers, n_embd {}, vocab {}, {:?}), drafter {} (DFlash2, {} layers, block {block}, selector top {}), KV cache {kv_type}",
        target.file_name().and_then(|f| f.to_str()).unwrap_or("?"),
        hp.n_layer,
        hp.n_embd,
        hp.n_vocab,
        s.model_types().attn,
        draft_path.file_name().and_then(|f| f.to_str()).unwrap_or("?"),
        d.model.hp.n_layer,
        d.model.hp.selector.map_or(0, |x| x.1),
    );
    println!(
        "{n} device(s), --split-mode {mode}{}, tensor split {ratios:?}, {threads} thread(s) each; prompt {} tokens, {n_gen} generated",
        if mode == "none" { " (one device; --devices and --tensor-split ignored)" } else { "" },
        prompt.len()
    );
    let plain_tps = n_gen as f64 / plain_s;
    let spec_tps = n_gen as f64 / spec_s;
    println!("plain greedy: {plain_tps:.1} tokens/s");
    println!(
        "dflash2:      {spec_tps:.1} tokens/s; drafted {}, accepted {} ({:.0}%), {} target steps ({:.2} tokens per step), n_max {n_max}, p_min {p_min}",
        st.drafted,
        st.accepted,
        100.0 * st.accepted as f64 / st.drafted.max(1) as f64,
        st.target_steps,
        n_gen.saturating_sub(1) as f64 / st.target_steps.max(1) as f64
    );
    println!(
        "speed-up over plain greedy: {:.2}x; {} bytes moved between devices ({:.0} per token)",
        spec_tps / plain_tps,
        s.runner.bytes_moved - moved,
        (s.runner.bytes_moved - moved) as f64 / n_gen as f64
    );
    if plain != tokens {
        let i = plain.iter().zip(&tokens).position(|(a, b)| a != b).unwrap_or(0);
        println!("verify: MISMATCH between plain greedy and speculative on the same devices at token {i}");
        std::process::exit(1);
    }
    if verify {
        let reference = if n == 1 {
            plain
        } else {
            let mut one = open(&[1.0])?;
            generate(&mut one, &mut NoDraft, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 })?.0
        };
        match reference.iter().zip(&tokens).position(|(a, b)| a != b) {
            None if reference.len() == tokens.len() => println!(
                "verify: identical — {} tokens equal plain greedy decoding on one device (first: {:?})",
                tokens.len(),
                &tokens[..tokens.len().min(8)]
            ),
            i => {
                println!("verify: MISMATCH with one-device greedy decoding at token {}", i.unwrap_or(reference.len()));
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
