//! Speculative decoding with a `qwen35` target's own MTP (NextN) head
//! (llama.cpp's `--spec-type draft-mtp`), tensor-parallel on N devices (CPU
//! by default), through `shardgraph_models::engine::Engine` on
//! `shardgraph::split::Devices`.
//!
//! `cargo run --release --example mtp -- --devices 3 --tensor-split 1,1,1 --verify`
//!
//! On first use it writes the example `qwen35` into the system temp folder
//! (8 layers: 6 Gated-DeltaNet + 2 gated attention, n_embd 1024, vocabulary
//! 8192, an MTP layer; Q8_0, ~175 MB; its greedy continuation follows a
//! vocabulary permutation, which the MTP head predicts). It decodes the same
//! prompt plain and then with MTP drafting on the same devices (each after
//! a short warm-up), prints tokens/s, drafted and accepted counts and the
//! speed-up, and greedy (the default) checks that the two outputs are equal
//! and with `--verify` that they equal plain greedy decoding on one CPU
//! device (`verify: identical`). With `--temp` above 0 both runs sample
//! (speculative sampling keeps the target's distribution, with other
//! draws), and `--verify` is refused.
//!
//! Options: `--devices N` (default 3), `--tensor-split r0,r1,..` (default
//! equal), `--split-mode none|layer|tensor|hybrid`, `--device CPU|CUDA<i>|HIP<i>|EMU|EMUHIP,..`
//! (as in the dflash2 example), `--spec-draft-n-max` (default 3),
//! `--spec-draft-n-min` (default 0), `--spec-draft-p-min` (default 0),
//! `--cache-type-k TYPE`, `--cache-type-v TYPE` (as in the dflash2
//! example), `--prompt-tokens 1,2,3` or `--prompt-tokens-file F` (the
//! prompt as token ids), `--n-predict` (default 96), `--ctx-size`
//! (cells for the prompt and the generated tokens, default 16 +
//! `--n-predict`; the caches get `n_max + 1` more) and `--fit on|off` (as in
//! the dflash2 example), `--threads`, `--temp` (default 0: greedy),
//! `--top-k` (default 40), `--top-p` (default 0.95), `--min-p` (default
//! 0.05), `--seed` (default 4294967295), `--model PATH` (a `qwen35` GGUF
//! with an MTP layer; checked, with its MTP layer, before any decoding),
//! `--verify` (greedy only).

use shardgraph_models::engine::{DraftModel, Engine, EngineParams};
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
    "--cache-type-v",
    "--prompt-tokens",
    "--prompt-tokens-file",
    "--n-predict",
    "--ctx-size",
    "--fit",
    "--threads",
    "--temp",
    "--top-k",
    "--top-p",
    "--min-p",
    "--seed",
    "--model",
];

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
    check_options(&args, "mtp", OPTIONS);
    let (ratios, mode) = spec::devices(&args, 3);
    let n = ratios.len();
    let kv_types = spec::cache_types(&args);
    let n_gen: usize = parsed(&args, "--n-predict", 96);
    let threads: usize = parsed(&args, "--threads", 1);
    let p_min: f32 = parsed(&args, "--spec-draft-p-min", 0.0);
    let n_min: usize = parsed(&args, "--spec-draft-n-min", 0);
    let n_max: usize = parsed(&args, "--spec-draft-n-max", 3);
    spec::check_counts(n_gen, threads, n_max, n_min, p_min);
    let sampler = spec::sampler(&args);
    let verify = args.iter().any(|a| a == "--verify");
    spec::check_verify(verify, &sampler);
    let prompt = spec::prompt_tokens(&args, || (0..16).map(|i| (i * 389 + 11) % 8000).collect());
    // Cells for the prompt and the generated tokens (the engine adds a draft's).
    let need = (prompt.len() + n_gen) as i64;
    // --ctx-size and --device before any output or work.
    spec::ctx_request(&args, need, need);
    let devices = spec::open_devices(&args, &ratios, threads)?;
    let target = match spec::given_file(&args, "--model") {
        Some(p) => p,
        None => {
            let p = std::env::temp_dir().join("shardgraph-example-qwen35-q8_0.gguf");
            spec::ensure_qwen35(&p)?;
            p
        }
    };
    let params = EngineParams {
        ctx_size: need,
        cache_type_k: kv_types.k,
        cache_type_v: kv_types.v,
        spec: SpecParams { n_max, n_min },
        p_min,
    };
    let ctx_size = spec::ctx_size(&args, need, need, |max| {
        let fit = EngineParams { ctx_size: max, ..params };
        Engine::fit_ctx_size(&devices, &target, &DraftModel::Mtp, &fit, prompt.len() as i64)
    })?;
    println!(
        "target {} (qwen35 with its MTP layer), KV cache {kv_types}, ctx-size {ctx_size} (+ {} cells for a draft)",
        target.file_name().and_then(|f| f.to_str()).unwrap_or("?"),
        n_max + 1
    );
    println!(
        "{n} device(s) {:?}, --split-mode {mode}{}, tensor split {ratios:?}, {threads} thread(s) each; prompt {} tokens, {n_gen} generated, {}",
        devices.names(),
        if mode == "none" { " (one device; --devices and --tensor-split ignored)" } else { "" },
        prompt.len(),
        spec::describe_sampler(&sampler)
    );
    spec::bench(&spec::Bench {
        devices: &devices,
        model: &target,
        draft: DraftModel::Mtp,
        params: EngineParams { ctx_size, ..params },
        prompt,
        n_gen,
        sampler,
        verify,
        threads,
    })
}
