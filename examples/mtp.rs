//! Speculative decoding with a `qwen35` target's own MTP (NextN) head
//! (llama.cpp's `--spec-type draft-mtp`), tensor-parallel on N CPU devices.
//!
//! `cargo run --release --example mtp -- --devices 3 --tensor-split 1,1,1 --verify`
//!
//! On first use it writes the example `qwen35` into the system temp folder
//! (8 layers: 6 Gated-DeltaNet + 2 gated attention, n_embd 1024, vocabulary
//! 8192, an MTP layer; Q8_0, ~175 MB; its greedy continuation follows a
//! vocabulary permutation, which the MTP head predicts). It decodes the same
//! prompt plain-greedy and then with MTP drafting on the same devices,
//! prints tokens/s, drafted and accepted counts and the speed-up, and with
//! `--verify` checks the output against plain greedy decoding on one device
//! (`verify: identical`).
//!
//! Options: `--devices N` (default 3), `--tensor-split r0,r1,..` (default
//! equal), `--split-mode none|tensor`, `--device CPU|CUDA<i>|EMU,..` (as in
//! the dflash2 example), `--spec-draft-n-max` (default 3),
//! `--spec-draft-n-min` (default 0), `--spec-draft-p-min` (default 0),
//! `--cache-type-k f16|q8_0|q4_0`, `--n-predict` (default 96), `--ctx-size`
//! and `--fit on|off` (as in the dflash2 example), `--threads`,
//! `--model PATH`, `--verify`.

use shardgraph_models::mtp::MtpDrafter;
use shardgraph_models::qwen35::Qwen35Session;
use shardgraph_models::speculative::SpecParams;

#[path = "common/spec.rs"]
mod spec;
use spec::{check_options, parsed};

const OPTIONS: &[&str] = &[
    "--devices",
    "--device",
    "--tensor-split",
    "--split-mode",
    "--spec-draft-n-max",
    "--spec-draft-n-min",
    "--spec-draft-p-min",
    "--cache-type-k",
    "--n-predict",
    "--ctx-size",
    "--fit",
    "--threads",
    "--model",
];

fn main() {
    env_logger::init();
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> shardgraph::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    check_options(&args, "mtp", OPTIONS);
    let (ratios, mode) = spec::devices(&args, 3);
    let n = ratios.len();
    let kv_type = spec::cache_type(&args);
    let n_gen: usize = parsed(&args, "--n-predict", 96);
    let threads: usize = parsed(&args, "--threads", 1);
    let p_min: f32 = parsed(&args, "--spec-draft-p-min", 0.0);
    let n_min: usize = parsed(&args, "--spec-draft-n-min", 0);
    let n_max: usize = parsed(&args, "--spec-draft-n-max", 3);
    spec::check_counts(n_gen, threads, n_max, n_min, p_min);
    let verify = args.iter().any(|a| a == "--verify");
    let target = match spec::given_file(&args, "--model") {
        Some(p) => p,
        None => {
            let p = std::env::temp_dir().join("shardgraph-example-qwen35-q8_0.gguf");
            spec::ensure_qwen35(&p)?;
            p
        }
    };
    let prompt: Vec<i32> = (0..16).map(|i| (i * 389 + 11) % 8000).collect();
    // Cache cells for the prompt, the generated tokens and one draft beyond them.
    // The model's metadata before anything is printed about it.
    let file = shardgraph::gguf::GgufFile::open(&target)?;
    let hp = shardgraph_models::qwen35::Qwen35Hparams::from_gguf(&file)?;
    let need = (prompt.len() + n_gen + n_max + 1) as i64;
    let kv_size = spec::ctx_size(&args, need, need, threads, || {
        use shardgraph_models::fit::{FitDraft, FitSpec, FitTarget};
        let types = shardgraph_models::qwen35::Qwen35Types::from_gguf(&file, &hp)?;
        Ok(FitSpec {
            target: FitTarget::Qwen35 { hp: hp.clone(), types },
            draft: FitDraft::Mtp { n_max },
            kv_type,
            ratios: ratios.clone(),
            n_batch: prompt.len() as i64,
            snapshot_slots: 0,
        })
    })?;
    drop(file);
    println!(
        "target {} (qwen35 with its MTP layer), KV cache {kv_type}",
        target.file_name().and_then(|f| f.to_str()).unwrap_or("?")
    );
    println!(
        "{n} device(s), --split-mode {mode}{}, tensor split {ratios:?}, {threads} thread(s) each; prompt {} tokens, {n_gen} generated",
        if mode == "none" { " (one device; --devices and --tensor-split ignored)" } else { "" },
        prompt.len()
    );
    let accelerated = spec::backends(&args, n)?.is_some();
    let b =
        spec::Bench { ratios, prompt, n_gen, params: SpecParams { n_max, n_min }, verify, label: "mtp", accelerated };
    spec::bench::<Qwen35Session>(
        &b,
        &|r| {
            let mut s = Qwen35Session::from_gguf(&target, r, threads, kv_type, kv_size)?;
            spec::use_devices(&args, &mut s.runner, r.len())?;
            Ok(s)
        },
        &|| Qwen35Session::from_gguf(&target, &[1.0], threads, kv_type, kv_size),
        &|s| Ok(Box::new(MtpDrafter::new(s, p_min)?)),
        &|s| s.runner.bytes_moved,
    )
}
