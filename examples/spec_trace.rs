//! One line per speculative step, in the form of llama.cpp's
//! `llama-speculative-simple` with `scripts/llama-spec-simple.patch`
//! applied, so `scripts/llama-spec-compare.py` can compare the two engines'
//! drafts and accepted counts on the same files, greedily:
//!
//! ```text
//! cargo run --release --example spec_trace -- --model T.gguf --model-draft D.gguf \
//!     --prompt-tokens 11,400,789 --n-predict 64 --spec-draft-n-max 7
//! cargo run --release --example spec_trace -- --model qwen35.gguf --prompt-tokens 11,400,789
//! ```
//!
//! With `--model-draft` the drafter is that DFlash/DFlash2 file, without it
//! the target's MTP layer (llama.cpp's `--spec-type draft-dflash -md D` and
//! `--spec-type draft-mtp`). It prints `prompt <ids>`, then per step
//! `step <i> pos <p> last <t> draft <ids> accepted <k> tokens <ids>` (the
//! step verifies `[t, drafts…]` with `t` at position `p`; `tokens` are the
//! accepted drafts and the target's next token), then `generated <ids>`.
//! Our loop decodes the whole prompt before its first step, llama.cpp's all
//! but its last token: llama.cpp's steps for the prompt followed by our
//! first generated token are ours.

use shardgraph_models::engine::{DraftModel, Engine, EngineParams, GenerateOptions, StepTrace};
use shardgraph_models::sampling::SamplerParams;
use shardgraph_models::speculative::SpecParams;

#[path = "common/spec.rs"]
mod spec;
use spec::{check_options, parsed};

const OPTIONS: &[&str] = &[
    "--model",
    "--model-draft",
    "--prompt-tokens",
    "--prompt-tokens-file",
    "--n-predict",
    "--spec-draft-n-max",
    "--spec-draft-n-min",
    "--spec-draft-p-min",
    "--cache-type-k",
    "--cache-type-v",
    "--threads",
    "--devices",
    "--device",
    "--tensor-split",
    "--split-mode",
];

/// Token ids joined by commas (the patched llama.cpp tool's form).
fn ids(v: &[i32]) -> String {
    v.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
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
    check_options(&args, "spec_trace", OPTIONS);
    let Some(model) = spec::given_file(&args, "--model") else {
        eprintln!("--model: give the target file");
        std::process::exit(2);
    };
    let draft = spec::given_file(&args, "--model-draft").map_or(DraftModel::Mtp, DraftModel::Gguf);
    let (ratios, _) = spec::devices(&args, 1);
    let kv_types = spec::cache_types(&args);
    let n_gen: usize = parsed(&args, "--n-predict", 64);
    let threads: usize = parsed(&args, "--threads", 1);
    let n_max: usize = parsed(&args, "--spec-draft-n-max", 0);
    let n_min: usize = parsed(&args, "--spec-draft-n-min", 0);
    let p_min: f32 = parsed(&args, "--spec-draft-p-min", 0.0);
    let prompt = spec::prompt_tokens(&args, || {
        eprintln!("--prompt-tokens or --prompt-tokens-file: give the prompt's token ids");
        std::process::exit(2)
    });
    let devices = spec::open_devices(&args, &ratios, threads)?;
    let params = EngineParams {
        ctx_size: (prompt.len() + n_gen) as i64,
        cache_type_k: kv_types.k,
        cache_type_v: kv_types.v,
        spec: SpecParams { n_max, n_min },
        p_min,
    };
    let mut engine = Engine::load(&devices, &model, draft, &params)?;
    println!("prompt {}", ids(&prompt));
    let mut n_step = 0;
    let mut print = |s: &StepTrace<'_>| {
        let tokens: Vec<i32> = s.drafts[..s.accepted].iter().copied().chain([s.next]).collect();
        println!(
            "step {n_step} pos {} last {} draft {} accepted {} tokens {}",
            s.pos,
            s.last,
            ids(s.drafts),
            s.accepted,
            ids(&tokens)
        );
        n_step += 1;
    };
    let opts = GenerateOptions { ignore_eos: true, on_step: Some(&mut print), ..GenerateOptions::default() };
    let g = engine.generate_with(&prompt, n_gen, &SamplerParams::greedy(), opts)?;
    println!("generated {}", ids(&g.tokens));
    Ok(())
}
