//! The main job: speculative decoding with a DFlash2 drafter (block
//! diffusion, dynamic convolutions, candidate selector) and a `qwen3`
//! target, tensor-parallel on N devices (CPU by default), through
//! `shardgraph_models::engine::Engine` on `shardgraph::split::Devices`.
//!
//! `cargo run --release --example dflash2 -- --devices 2 --tensor-split 1,1 --verify`
//!
//! On first use it writes the example models into the system temp folder,
//! with a progress display: a ~182 MB `qwen3` target in llama.cpp's Q4_K_M
//! layout (Q4_K, with Q6_K `attn_v` and `ffn_down` in the layers llama.cpp's
//! quantizer gives more bits, and a Q6_K head) whose greedy continuation
//! follows a vocabulary permutation except
//! where its first layer's attention settles on an earlier token, and a
//! 66 MB Q8_0 DFlash2 drafter built to predict the permutation (so it is
//! right often, and wrong where the target's attention intervenes). It then
//! decodes the same prompt twice on the same devices — plain, then
//! speculative, each after a short warm-up — and prints tokens/s, drafted
//! and accepted counts and the speed-up; greedy (the default) the two
//! outputs must be equal, and with `--verify` it checks the speculative
//! output against plain greedy decoding on one CPU device and ends with
//! `verify: identical`. With `--temp` above 0 both runs sample (the
//! speculative one by speculative sampling, so its tokens have the
//! target's distribution but are other draws), and `--verify` is refused.
//!
//! `--target qwen35` runs the same against the example `qwen35` hybrid
//! (Gated-DeltaNet and gated attention layers; ~175 MB, Q8_0, written on
//! first use with its own DFlash2 drafter), whose recurrent states are
//! rolled back after rejected drafts.
//!
//! Options (llama.cpp's names where it has one):
//! `--target qwen3|qwen35` (default qwen3), `--devices N` (default 2),
//! `--tensor-split r0,r1,..` (default equal), `--split-mode none|layer|tensor|hybrid`
//! (default tensor; `none` runs on one device),
//! `--device CPU|CUDA<i>|HIP<i>|EMU|EMUHIP,..` (one name per device, default
//! CPU; naming a GPU k times gives k virtual devices on it; needs
//! `--features cuda` / `hip`, EMU and EMUHIP `--features cuda-emu`;
//! `--verify` then compares with a one-device CPU run),
//! `--spec-draft-n-max` (default: the drafter's block size − 1),
//! `--spec-draft-n-min` (default 0), `--spec-draft-p-min` (default 0),
//! `--cache-type-k TYPE` and `--cache-type-v TYPE` (the K and V caches of
//! both models, each one of llama.cpp's cache types: f32, f16, bf16, q8_0,
//! q4_0, q4_1, q5_0, q5_1, iq4_nl once the core has it; default f16),
//! `--prompt-tokens 1,2,3` or `--prompt-tokens-file F` (the prompt as token
//! ids; default 16 ids of the example),
//! `--n-predict` (tokens to generate, default 96), `--ctx-size` (KV cells
//! for the prompt and the generated tokens, default what the run needs: 16
//! plus `--n-predict`; every cache gets the drafter's block on top),
//! `--fit on|off` (on: the largest context that fits every device, caches
//! in steps of 256 cells, at most `--ctx-size` or the training context,
//! sized from the plans before anything is allocated; default off),
//! `--threads` (per device, default 1, at most 1024), `--temp` (default 0:
//! greedy; above 0 samples with `--top-k` (default 40), `--top-p` (default
//! 0.95), `--min-p` (default 0.05) and `--seed` (default 4294967295), and
//! speculative sampling keeps the target's distribution), `--model PATH`,
//! `--model-draft PATH` (a DFlash or DFlash2 GGUF), `--verify` (greedy
//! only). Both files and their pairing are checked (tensors, types,
//! shapes, the drafter's target) before any decoding: a drafter built for
//! another target is refused at once, not after the plain baseline.
//! `RUST_LOG=debug` logs every speculative step.

use shardgraph::GgmlType;
use shardgraph_models::dflash::DflashHparams;
use shardgraph_models::engine::{DraftModel, Engine, EngineParams};
use shardgraph_models::generate::{write_dflash_gguf_with, write_qwen3_gguf_progress, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::Qwen3Hparams;
use shardgraph_models::speculative::SpecParams;
use shardgraph_models::types::TensorTypes;
use std::path::Path;

#[path = "common/spec.rs"]
mod spec;
use spec::{arg, check_options, parsed, progress, Bench};

/// The options this example takes (each followed by a value, except `--verify`).
const OPTIONS: &[&str] = &[
    "--target",
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
    "--model-draft",
];

/// The example target: 24 layers, n_embd 1024, 16 heads / 8 KV heads of 64,
/// n_ff 2816, vocabulary 8192.
fn target_hp() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(24, 1024, 2816, 16, 8, 64), n_vocab: 8192, n_ctx_train: 4096 }
}

/// The example drafter: DFlash2 with 2 layers, block 8, taps of the
/// inputs of target layers 2, 12 and 23 (below `n_layer`, as real drafters
/// tap and llama.cpp records), conv k = 2 over groups of 16, selector rank 64 and
/// top 16; its FFN width equals the vocabulary (layer 0 is a lookup table).
fn drafter_hp(t: &Qwen3Hparams) -> DflashHparams {
    DflashHparams {
        core: HparamsCore::qwen3(2, t.n_embd, t.n_vocab, 16, 8, 64),
        target_layers: vec![2, 12, 23],
        target_hidden: t.n_embd,
        block_size: 8,
        mask_token: (t.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((64, 16)),
    }
}

/// Writes the example target unless it is cached.
fn ensure_target(path: &Path) -> shardgraph::Result<()> {
    let hp = target_hp();
    let what = format!("generating {}", path.display());
    let current = |f: &shardgraph::gguf::GgufFile| Qwen3Hparams::from_gguf(f).is_ok_and(|h| h == target_hp());
    spec::ensure(path, current, |tmp| {
        let kind = Weights::PermutationWithAttention { attention: 6.0 };
        let types = TensorTypes::llama_q4_k_m(hp.n_layer);
        write_qwen3_gguf_progress(tmp, &hp, &types, 1, kind, &mut progress(&what))
    })
}

/// Writes the example drafter unless it is cached.
fn ensure_drafter(path: &Path) -> shardgraph::Result<()> {
    let hp = target_hp();
    let current = |f: &shardgraph::gguf::GgufFile| DflashHparams::from_gguf(f).is_ok_and(|h| h == drafter_hp(&hp));
    spec::ensure(path, current, |tmp| {
        write_dflash_gguf_with(
            tmp,
            &drafter_hp(&hp),
            &TensorTypes::uniform(GgmlType::Q8_0),
            hp.n_vocab,
            1,
            Weights::Permutation,
        )
    })
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
    check_options(&args, "dflash2", OPTIONS);
    let (ratios, mode) = spec::devices(&args, 2);
    let n = ratios.len();
    let kv_types = spec::cache_types(&args);
    let n_gen: usize = parsed(&args, "--n-predict", 96);
    let threads: usize = parsed(&args, "--threads", 1);
    let p_min: f32 = parsed(&args, "--spec-draft-p-min", 0.0);
    let n_min: usize = parsed(&args, "--spec-draft-n-min", 0);
    // --spec-draft-n-max's range now, before any model is written (the
    // drafter's block caps it later).
    let asked_n_max: usize = parsed(&args, "--spec-draft-n-max", n_min.max(1));
    spec::check_counts(n_gen, threads, asked_n_max, n_min.min(asked_n_max), p_min);
    let sampler = spec::sampler(&args);
    let verify = args.iter().any(|a| a == "--verify");
    spec::check_verify(verify, &sampler);
    let target_kind = arg(&args, "--target").unwrap_or_else(|| "qwen3".into());
    if target_kind != "qwen3" && target_kind != "qwen35" {
        eprintln!("--target {target_kind}: use qwen3 or qwen35");
        std::process::exit(2);
    }
    let prompt = spec::prompt_tokens(&args, || (0..16).map(|i| (i * 389 + 11) % 8000).collect());
    // Cells for the prompt and the generated tokens (the engine adds the drafter's block).
    let need = (prompt.len() + n_gen) as i64;
    // --ctx-size and --device before any output or work.
    spec::ctx_request(&args, need, need);
    let devices = spec::open_devices(&args, &ratios, threads)?;
    // The example models are generated when absent; paths given by the user must exist.
    let dir = std::env::temp_dir();
    let given = |name: &str| spec::given_file(&args, name);
    let (target, draft_path) = if target_kind == "qwen3" {
        let target = match given("--model") {
            Some(p) => p,
            None => {
                let p = dir.join("shardgraph-example-qwen3-q4_k_m.gguf");
                ensure_target(&p)?;
                p
            }
        };
        let draft = match given("--model-draft") {
            Some(p) => p,
            None => {
                let p = dir.join("shardgraph-example-dflash2-q8_0.gguf");
                ensure_drafter(&p)?;
                p
            }
        };
        (target, draft)
    } else {
        let target = match given("--model") {
            Some(p) => p,
            None => {
                let p = dir.join("shardgraph-example-qwen35-q8_0.gguf");
                spec::ensure_qwen35(&p)?;
                p
            }
        };
        let draft = match given("--model-draft") {
            Some(p) => p,
            None => {
                let p = dir.join("shardgraph-example-dflash2-qwen35-q8_0.gguf");
                spec::ensure_qwen35_drafter(&p)?;
                p
            }
        };
        (target, draft)
    };
    // The drafter's block before spending time on the baseline (the engine checks the rest).
    let dhp =
        shardgraph::gguf::GgufFile::open(&draft_path).and_then(|f| DflashHparams::from_gguf(&f)).unwrap_or_else(|e| {
            eprintln!("--model-draft {}: {e}", draft_path.display());
            std::process::exit(2)
        });
    if dhp.block_size < 2 {
        eprintln!("{}: block_size {} leaves nothing to draft", draft_path.display(), dhp.block_size);
        std::process::exit(2);
    }
    let asked: usize = parsed(&args, "--spec-draft-n-max", dhp.block_size - 1);
    let n_max = asked.min(dhp.block_size - 1);
    if asked > n_max {
        eprintln!("--spec-draft-n-max {asked} capped at {n_max} (the drafter's block size {} − 1)", dhp.block_size);
    }
    spec::check_counts(n_gen, threads, n_max, n_min, p_min);
    let draft = DraftModel::Gguf(draft_path.clone());
    let params = EngineParams {
        ctx_size: need,
        cache_type_k: kv_types.k,
        cache_type_v: kv_types.v,
        spec: SpecParams { n_max, n_min },
        p_min,
    };
    let ctx_size = spec::ctx_size(&args, need, need, |max| {
        Engine::fit_ctx_size(&devices, &target, &draft, &EngineParams { ctx_size: max, ..params }, prompt.len() as i64)
    })?;
    println!(
        "target {}, drafter {} ({}), KV cache {kv_types}, ctx-size {ctx_size} (+ the block of {} in every cache)",
        name(&target),
        name(&draft_path),
        if dhp.conv.is_some() || dhp.selector.is_some() { "DFlash2" } else { "DFlash" },
        dhp.block_size
    );
    println!(
        "{n} device(s) {:?}, --split-mode {mode}{}, tensor split {ratios:?}, {threads} thread(s) each; prompt {} tokens, {n_gen} generated, {}",
        devices.names(),
        if mode == "none" { " (one device; --devices and --tensor-split ignored)" } else { "" },
        prompt.len(),
        spec::describe_sampler(&sampler)
    );
    spec::bench(&Bench {
        devices: &devices,
        model: &target,
        draft,
        params: EngineParams { ctx_size, ..params },
        prompt,
        n_gen,
        sampler,
        verify,
        threads,
    })
}

/// A path's file name, for the report.
fn name(p: &Path) -> &str {
    p.file_name().and_then(|f| f.to_str()).unwrap_or("?")
}
