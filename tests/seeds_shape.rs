//! The seeds' shape (docs/testing.md): a `qwen35` target at the real
//! Qwen3.x-27B widths (shardgraph-models/MODELS.md §3.7: E 5120, F 17408,
//! 24/4 attention heads of 256, 16/48 delta-net heads of 128, vocabulary
//! 248320) with 4 layers (3 Gated-DeltaNet + 1 attention), llama.cpp's
//! Q4_K_M types per tensor, and a 5-layer DFlash2 drafter in Q8_0 tapping
//! target layers below `n_layer` (as llama.cpp requires). The target's
//! weights follow the generator's permutation (wide greedy margins, so its
//! tokens do not hinge on rounding: random weights at a 248320-token
//! vocabulary put the top two logits within the split's rounding of each
//! other at the first token, and 2 devices sum `ffn_down`'s halves in
//! another order than one device); `--verify` still checks the layers on a
//! random-weights model of this shape (NMSE against one device). The
//! drafter has random weights (a permutation drafter needs an FFN as wide
//! as the vocabulary), so it accepts nothing: this checks that the seeds'
//! command runs and decodes the same tokens, not its speed-up. The `dflash2`
//! example on 2 devices at 1:1 with the seeds' options (`--ctx-size 65536
//! --cache-type-k q4_0 --cache-type-v q4_0 --spec-draft-n-max 6 --verify`)
//! prints `verify: identical`. Ignored by default: it writes about 4.5 GB
//! of GGUF under the temp folder once (kept for reruns; delete
//! `shardgraph-seeds-*` there by hand) and runs minutes:
//! `cargo test --release --test seeds_shape -- --ignored --nocapture`.

use shardgraph::GgmlType;
use shardgraph_models::dflash::DflashHparams;
use shardgraph_models::generate::{write_dflash_gguf_with, write_qwen35_gguf_with, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen35::Qwen35Hparams;
use shardgraph_models::types::TensorTypes;
use std::path::PathBuf;
use std::process::Command;

/// The built example `name` (`target/<profile>/examples/<name>`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().and_then(|d| d.parent()).unwrap().join("examples").join(name);
    assert!(p.is_file(), "{} is not built: run `cargo build --release --examples`", p.display());
    p
}

#[test]
#[ignore = "writes ~4.5 GB and runs minutes: cargo test --release --test seeds_shape -- --ignored --nocapture"]
fn qwen35_27b_widths_q4_k_m_with_a_dflash2_q8_0_drafter_verifies_on_two_devices() {
    let n_layer = 4;
    let hp = Qwen35Hparams {
        core: HparamsCore { rope_base: 1e7, ..HparamsCore::qwen3(n_layer, 5120, 17408, 24, 4, 256) },
        n_vocab: 248320,
        n_rot: 64,
        rope_sections: [11, 11, 10, 0],
        full_attention_interval: 4,
        d_conv: 4,
        d_state: 128,
        n_k_heads: 16,
        n_v_heads: 48,
        n_nextn: 0,
        n_ctx_train: 262144,
    };
    let dhp = DflashHparams {
        core: HparamsCore { rope_base: 1e7, ..HparamsCore::qwen3(5, 5120, 17408, 32, 8, 128) },
        target_layers: vec![1, 2, 3],
        target_hidden: 5120,
        block_size: 8,
        mask_token: 248319,
        conv: Some((2, 16)),
        selector: Some((256, 16)),
    };
    // Written once per generator version and kept (about 4.5 GB under the
    // temp folder: delete `shardgraph-seeds-*` by hand), so a rerun only runs.
    let version = shardgraph_models::generate::GENERATOR_VERSION.replace(' ', "-");
    let dir = std::env::temp_dir().join(format!("shardgraph-seeds-{version}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (target, drafter) = (dir.join("target-permutation-q4_k_m.gguf"), dir.join("dflash2-q8_0.gguf"));
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if !target.is_file() {
        let t = std::time::Instant::now();
        let types = TensorTypes::llama_q4_k_m(n_layer);
        let tmp = dir.join("target.tmp");
        let tb = write_qwen35_gguf_with(&tmp, &hp, &types, 1, Weights::Permutation).unwrap();
        std::fs::rename(&tmp, &target).unwrap();
        println!("seeds_shape: wrote the target, {:.2} GiB, in {:.0} s", gib(tb), t.elapsed().as_secs_f64());
    }
    if !drafter.is_file() {
        let t = std::time::Instant::now();
        let q8 = TensorTypes::uniform(GgmlType::Q8_0);
        let tmp = dir.join("drafter.tmp");
        let db = write_dflash_gguf_with(&tmp, &dhp, &q8, hp.n_vocab, 2, Weights::Random).unwrap();
        std::fs::rename(&tmp, &drafter).unwrap();
        println!("seeds_shape: wrote the drafter, {:.2} GiB, in {:.0} s", gib(db), t.elapsed().as_secs_f64());
    }
    let args = [
        "--model",
        target.to_str().unwrap(),
        "--model-draft",
        drafter.to_str().unwrap(),
        "--ctx-size",
        "65536",
        "--cache-type-k",
        "q4_0",
        "--cache-type-v",
        "q4_0",
        "--devices",
        "2",
        "--tensor-split",
        "1,1",
        "--spec-draft-n-max",
        "6",
        "--n-predict",
        "24",
        "--threads",
        "1",
        "--verify",
    ];
    let out = Command::new(example("dflash2")).args(args).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{stdout}");
    assert!(out.status.success(), "dflash2 failed: {stderr}");
    assert!(stdout.contains("verify: identical"), "no `verify: identical` in:\n{stdout}\n{stderr}");
}
