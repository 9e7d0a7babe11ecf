//! `shardgraph_models::engine::Engine` on tiny generated models: a `qwen3`
//! target with DFlash (random weights: drafts mostly rejected), DFlash2
//! (built to follow the target: drafts mostly accepted) or no drafter, and a
//! `qwen35` target with its MTP layer, DFlash2 or no drafter, each on 1 and 2
//! CPU devices. Greedy tokens equal a plain one-token-at-a-time decode loop
//! on one device; a context sized exactly for the prompt and the generated
//! tokens suffices (the drafter's block is added to every cache); a prompt
//! and `n_predict` over the context, bad files and bad parameters are typed
//! errors before any decoding; a seeded sampled generation repeats after a
//! reset and on a new engine.

use shardgraph::split::Devices;
use shardgraph::GgmlType;
use shardgraph_models::dflash::DflashHparams;
use shardgraph_models::engine::{DraftModel, Engine, EngineParams};
use shardgraph_models::generate::{write_dflash_gguf, write_dflash_gguf_with, write_qwen35_gguf_with, Weights};
use shardgraph_models::generate::{write_qwen35_gguf, write_qwen3_gguf_with};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::Qwen3Session;
use shardgraph_models::qwen35::{Qwen35Hparams, Qwen35Session};
use shardgraph_models::sampling::SamplerParams;
use shardgraph_models::speculative::SpecParams;
use shardgraph_models::types::TensorTypes;
use std::path::{Path, PathBuf};

#[path = "common/devices.rs"]
mod devices;
#[path = "common/qwen35_tiny.rs"]
mod qwen35_tiny;

#[path = "common/spec_models.rs"]
mod spec_models;
use spec_models::{dflash_hp, qwen3_hp};

/// A DFlash2 drafter for a target of hidden size `e`, vocabulary `v` and
/// last layer `last` (the generator's permutation-following weights need
/// `n_ff ≥ v` and the mask token `v − 1`).
fn dflash2_hp(e: i64, v: i64, last: usize) -> DflashHparams {
    DflashHparams {
        core: HparamsCore::qwen3(2, e, v.max(256), 4, 2, 32),
        target_layers: vec![1, last],
        target_hidden: e,
        block_size: 6,
        mask_token: (v - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((32, 8)),
    }
}

/// The test files in a fresh folder.
struct Files {
    dir: PathBuf,
    qwen3: PathBuf,
    dflash: PathBuf,
    dflash2: PathBuf,
    qwen35: PathBuf,
    qwen35_dflash2: PathBuf,
    qwen35_no_mtp: PathBuf,
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn files(name: &str) -> Files {
    let dir = std::env::temp_dir().join(format!("shardgraph-engine-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = Files {
        qwen3: dir.join("qwen3.gguf"),
        dflash: dir.join("dflash.gguf"),
        dflash2: dir.join("dflash2.gguf"),
        qwen35: dir.join("qwen35-mtp.gguf"),
        qwen35_dflash2: dir.join("qwen35-dflash2.gguf"),
        qwen35_no_mtp: dir.join("qwen35.gguf"),
        dir,
    };
    let q8 = GgmlType::Q8_0;
    let hp = qwen3_hp();
    let kind = Weights::PermutationWithAttention { attention: 2.0 };
    write_qwen3_gguf_with(&f.qwen3, &hp, &TensorTypes::uniform(q8), 23, kind).unwrap();
    write_dflash_gguf(&f.dflash, &dflash_hp(), &TensorTypes::uniform(q8), hp.n_vocab, 17).unwrap();
    let d2 = dflash2_hp(hp.n_embd, hp.n_vocab, hp.n_layer);
    write_dflash_gguf_with(&f.dflash2, &d2, &TensorTypes::uniform(q8), hp.n_vocab, 23, Weights::Permutation).unwrap();
    let h35 = Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    write_qwen35_gguf_with(&f.qwen35, &h35, &TensorTypes::uniform(q8), 7, Weights::Permutation).unwrap();
    let d35 = dflash2_hp(h35.n_embd, h35.n_vocab, h35.n_layer);
    write_dflash_gguf_with(&f.qwen35_dflash2, &d35, &TensorTypes::uniform(q8), h35.n_vocab, 7, Weights::Permutation)
        .unwrap();
    write_qwen35_gguf(&f.qwen35_no_mtp, &qwen35_tiny::tiny(), &TensorTypes::uniform(q8), 7).unwrap();
    f
}

/// Plain greedy decoding on one CPU device, one token per step after the
/// prompt (no speculative loop).
fn plain_greedy(model: &Path, prompt: &[i32], n: usize) -> Vec<i32> {
    let f = shardgraph::gguf::GgufFile::open(model).unwrap();
    let arch = f.get_str("general.architecture").unwrap().to_string();
    let kv = (prompt.len() + n) as i64;
    if arch == "qwen3" {
        spec_models::plain_greedy(
            &mut Qwen3Session::load_file(&f, &devices::cpu(&[1.0]), GgmlType::F16, kv).unwrap(),
            prompt,
            n,
        )
    } else {
        spec_models::plain_greedy(
            &mut Qwen35Session::load_file(&f, &devices::cpu(&[1.0]), GgmlType::F16, kv).unwrap(),
            prompt,
            n,
        )
    }
}

#[test]
fn greedy_engine_equals_plain_decoding_with_every_drafter() {
    let f = files("greedy");
    let prompt = [5, 77, 123, 9, 64];
    let n = 24;
    let ctx = (prompt.len() + n) as i64;
    let greedy = SamplerParams::greedy();
    let cases: Vec<(&PathBuf, DraftModel, &str)> = vec![
        (&f.qwen3, DraftModel::None, "none"),
        (&f.qwen3, DraftModel::Gguf(f.dflash.clone()), "dflash"),
        (&f.qwen3, DraftModel::Gguf(f.dflash2.clone()), "dflash2"),
        (&f.qwen35, DraftModel::None, "none"),
        (&f.qwen35, DraftModel::Mtp, "mtp"),
        (&f.qwen35, DraftModel::Gguf(f.qwen35_dflash2.clone()), "dflash2"),
    ];
    for (model, draft, kind) in cases {
        let want = plain_greedy(model, &prompt, n);
        for n_dev in [1, 2] {
            let devices = Devices::cpu(n_dev, 1).unwrap();
            // A context of exactly the prompt and the generated tokens: the
            // drafter's block is the engine's to add.
            let params = EngineParams { ctx_size: ctx, ..EngineParams::default() };
            let mut e = Engine::load(&devices, model, draft.clone(), &params).unwrap();
            assert_eq!(e.draft_kind(), kind);
            assert_eq!(e.n_ctx(), ctx);
            let block = match kind {
                "dflash" => 5,
                "dflash2" => 6,
                "mtp" => 4,
                _ => 0,
            };
            assert_eq!(e.kv_size(), ctx + block, "{kind}");
            let g = e.generate(&prompt, n, &greedy).unwrap();
            let what = format!("{} {kind} on {n_dev} device(s): {:?}", e.arch(), g.stats);
            eprintln!("{what}");
            assert_eq!(g.tokens, want, "{what}");
            if kind != "none" {
                assert!(g.stats.drafted > 0, "{what}");
            } else {
                assert_eq!(g.stats.drafted, 0, "{what}");
                assert_eq!(g.stats.target_steps, n - 1, "{what}");
            }
            if kind == "dflash2" || kind == "mtp" {
                // Drafters built to follow the target: most drafts land.
                assert!(g.stats.accepted * 2 >= g.stats.drafted, "{what}");
                assert!(g.stats.target_steps < n - 1, "{what}");
            }
            if n_dev == 2 {
                assert!(e.bytes_moved() > 0, "{what}");
            }
            // The context is full: one more token is refused before decoding.
            assert_eq!(e.n_past(), ctx, "{what}");
            let err = e.generate(&[1], 0, &greedy).unwrap_err().to_string();
            assert!(err.contains("ctx_size") && err.contains("in use already"), "{what}: {err}");
            assert_eq!(e.n_past(), ctx, "{what}");
            // Reset: the same tokens again, as from a new engine.
            e.reset().unwrap();
            assert_eq!(e.n_past(), 0);
            let again = e.generate(&prompt, n, &greedy).unwrap();
            assert_eq!(again.tokens, want, "{what} after reset");
            assert_eq!(again.stats, g.stats, "{what} after reset");
        }
    }
}

/// Two calls continue one sequence: the second prompt follows the first
/// call's tokens, and its output equals plain greedy decoding of
/// everything so far.
#[test]
fn generate_continues_the_sequence_until_reset() {
    let f = files("continue");
    let (p1, p2) = ([5, 77, 123], [9, 64]);
    let (n1, n2) = (10, 12);
    for (model, draft) in [
        (&f.qwen3, DraftModel::Gguf(f.dflash2.clone())),
        (&f.qwen3, DraftModel::Gguf(f.dflash.clone())),
        (&f.qwen35, DraftModel::Mtp),
        (&f.qwen35, DraftModel::Gguf(f.qwen35_dflash2.clone())),
    ] {
        let first = plain_greedy(model, &p1, n1);
        let mut all: Vec<i32> = p1.to_vec();
        all.extend(&first);
        all.extend(p2);
        let second = plain_greedy(model, &all, n2);
        let devices = Devices::cpu(2, 1).unwrap();
        let params = EngineParams { ctx_size: 64, ..EngineParams::default() };
        let mut e = Engine::load(&devices, model, draft, &params).unwrap();
        let what = format!("{} {}", e.arch(), e.draft_kind());
        assert_eq!(e.generate(&p1, n1, &SamplerParams::greedy()).unwrap().tokens, first, "{what}");
        assert_eq!(e.n_past(), (p1.len() + n1) as i64, "{what}");
        assert_eq!(e.generate(&p2, n2, &SamplerParams::greedy()).unwrap().tokens, second, "{what}");
        assert_eq!(e.n_past(), (p1.len() + n1 + p2.len() + n2) as i64, "{what}");
    }
}

#[test]
fn a_generation_over_the_context_is_refused_before_decoding() {
    let f = files("ctx");
    let prompt = [3, 14, 15, 92];
    let devices = Devices::cpu(2, 1).unwrap();
    let greedy = SamplerParams::greedy();
    for (model, draft) in
        [(&f.qwen3, DraftModel::Gguf(f.dflash2.clone())), (&f.qwen35, DraftModel::Mtp), (&f.qwen3, DraftModel::None)]
    {
        let params = EngineParams { ctx_size: 20, ..EngineParams::default() };
        let mut e = Engine::load(&devices, model, draft, &params).unwrap();
        let moved = e.bytes_moved();
        let err = e.generate(&prompt, 17, &greedy).unwrap_err();
        assert!(matches!(err, shardgraph::Error::Model { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("need 21 cells") && msg.contains("context of 20"), "{msg}");
        assert_eq!((e.n_past(), e.bytes_moved()), (0, moved), "decoded before refusing");
        // Bad prompts are refused before decoding too.
        let msg = e.generate(&[], 4, &greedy).unwrap_err().to_string();
        assert!(msg.contains("empty prompt"), "{msg}");
        let msg = e.generate(&[1, 100_000], 4, &greedy).unwrap_err().to_string();
        assert!(msg.contains("100000") && msg.contains("vocabulary"), "{msg}");
        let bad = SamplerParams { temp: 0.8, top_p: 1.5, ..SamplerParams::default() };
        let msg = e.generate(&prompt, 4, &bad).unwrap_err().to_string();
        assert!(msg.contains("top_p 1.5"), "{msg}");
        assert_eq!((e.n_past(), e.bytes_moved()), (0, moved), "decoded before refusing");
        // Exactly the context works.
        assert_eq!(e.generate(&prompt, 16, &greedy).unwrap().tokens.len(), 16);
    }
}

#[test]
fn bad_files_and_parameters_are_typed_errors() {
    let f = files("bad");
    let devices = Devices::cpu(2, 1).unwrap();
    let p = EngineParams::default();
    let load = |model: &Path, draft: DraftModel, params: &EngineParams| {
        Engine::load(&devices, model, draft, params).map(|_| ()).unwrap_err()
    };
    // A drafter built for another target: vocabulary, then hidden size.
    let other = f.dir.join("other.gguf");
    write_dflash_gguf(&other, &dflash_hp(), &TensorTypes::uniform(GgmlType::Q8_0), 1000, 17).unwrap();
    let e = load(&f.qwen3, DraftModel::Gguf(other.clone()), &p);
    assert!(matches!(e, shardgraph::Error::Model { .. }) && e.to_string().contains("vocab_size 1000"), "{e}");
    let msg = load(&f.qwen35, DraftModel::Gguf(f.dflash2.clone()), &p).to_string();
    assert!(msg.contains("another target"), "{msg}");
    // Taps beyond the target's layers.
    let deep = f.dir.join("deep.gguf");
    write_dflash_gguf(
        &deep,
        &DflashHparams { target_layers: vec![1, 7], ..dflash_hp() },
        &TensorTypes::uniform(GgmlType::Q8_0),
        200,
        3,
    )
    .unwrap();
    let msg = load(&f.qwen3, DraftModel::Gguf(deep), &p).to_string();
    assert!(msg.contains("layer 7"), "{msg}");
    // A drafter file that is not a DFlash GGUF, and one that is missing.
    let msg = load(&f.qwen3, DraftModel::Gguf(f.qwen35.clone()), &p).to_string();
    assert!(msg.contains("\"qwen35\"") && msg.contains("DFlash"), "{msg}");
    let nope = f.dir.join("nope.gguf");
    let msg = load(&f.qwen3, DraftModel::Gguf(nope), &p).to_string();
    assert!(msg.contains("nope.gguf"), "{msg}");
    // A target of another architecture (a drafter given as the model).
    let msg = load(&f.dflash, DraftModel::None, &p).to_string();
    assert!(msg.contains("\"dflash\"") && msg.contains("qwen3 or qwen35"), "{msg}");
    // MTP of a qwen3 target, and of a qwen35 without a NextN layer.
    let msg = load(&f.qwen3, DraftModel::Mtp, &p).to_string();
    assert!(msg.contains("MTP") && msg.contains("qwen3"), "{msg}");
    let msg = load(&f.qwen35_no_mtp, DraftModel::Mtp, &p).to_string();
    assert!(msg.contains("nextn_predict_layers = 0"), "{msg}");
    // A damaged drafter: its tensors cut off.
    let cut = f.dir.join("cut.gguf");
    let bytes = std::fs::read(&f.dflash).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = load(&f.qwen3, DraftModel::Gguf(cut), &p);
    assert!(!e.to_string().is_empty());
    // Parameters.
    for (params, want) in [
        (EngineParams { ctx_size: 0, ..p }, "ctx_size 0"),
        (EngineParams { ctx_size: -3, ..p }, "ctx_size -3"),
        (EngineParams { ctx_size: i32::MAX as i64, ..p }, "ctx_size 2147483647"),
        (EngineParams { cache_type_k: GgmlType::Q4_K, ..p }, "cache_type_k"),
        (EngineParams { p_min: 1.5, ..p }, "p_min 1.5"),
        (EngineParams { p_min: f32::NAN, ..p }, "p_min NaN"),
        (EngineParams { spec: SpecParams { n_max: 257, n_min: 0 }, ..p }, "n_max 257"),
        (EngineParams { spec: SpecParams { n_max: 2, n_min: 3 }, ..p }, "n_min 3 exceeds n_max 2"),
    ] {
        let e = load(&f.qwen3, DraftModel::Gguf(f.dflash.clone()), &params);
        assert!(matches!(e, shardgraph::Error::Model { .. }), "{params:?}: {e}");
        assert!(e.to_string().contains(want), "{params:?}: {e}");
    }
    // A DFlash n_max above the block is capped at block − 1; 0 is the drafter's default.
    let capped = EngineParams { spec: SpecParams { n_max: 100, n_min: 0 }, ..p };
    let e = Engine::load(&devices, &f.qwen3, DraftModel::Gguf(f.dflash.clone()), &capped).unwrap();
    assert_eq!(e.spec_params().n_max, 4);
    let e = Engine::load(&devices, &f.qwen35, DraftModel::Mtp, &p).unwrap();
    assert_eq!(e.spec_params().n_max, shardgraph_models::engine::DEFAULT_MTP_N_MAX);
}

#[test]
fn seeded_sampling_repeats_and_stays_in_the_vocabulary() {
    let f = files("sample");
    let prompt = [7, 31, 150, 2];
    let n = 20;
    let params = EngineParams { ctx_size: 64, ..EngineParams::default() };
    let sampler = |seed| SamplerParams { temp: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed };
    // Random weights spread the target's distribution (the permutation
    // models are nearly one-hot, so any seed draws the same tokens there).
    let random = f.dir.join("qwen3-random.gguf");
    shardgraph_models::generate::write_qwen3_gguf(&random, &qwen3_hp(), &TensorTypes::uniform(GgmlType::Q8_0), 5)
        .unwrap();
    for (model, draft, spread) in [
        (&f.qwen3, DraftModel::Gguf(f.dflash2.clone()), false),
        (&f.qwen35, DraftModel::Mtp, false),
        (&random, DraftModel::Gguf(f.dflash.clone()), true),
        (&f.qwen35_no_mtp, DraftModel::None, true),
    ] {
        for n_dev in [1, 2] {
            let devices = Devices::cpu(n_dev, 1).unwrap();
            let mut e = Engine::load(&devices, model, draft.clone(), &params).unwrap();
            let a = e.generate(&prompt, n, &sampler(1)).unwrap();
            let what = format!("{} {} on {n_dev}: {:?}", e.arch(), e.draft_kind(), a.stats);
            assert_eq!(a.tokens.len(), n, "{what}");
            assert!(a.tokens.iter().all(|&t| (0..e.n_vocab()).contains(&i64::from(t))), "{what}");
            e.reset().unwrap();
            let b = e.generate(&prompt, n, &sampler(1)).unwrap();
            assert_eq!((&b.tokens, b.stats), (&a.tokens, a.stats), "{what}: same seed after reset");
            let mut fresh = Engine::load(&devices, model, draft.clone(), &params).unwrap();
            let c = fresh.generate(&prompt, n, &sampler(1)).unwrap();
            assert_eq!(c.tokens, a.tokens, "{what}: same seed on a new engine");
            if !spread {
                continue;
            }
            // Other seeds draw other tokens (at least one of three differs).
            let differs = (2..5).any(|seed| {
                let mut e = Engine::load(&devices, model, draft.clone(), &params).unwrap();
                e.generate(&prompt, n, &sampler(seed)).unwrap().tokens != a.tokens
            });
            assert!(differs, "{what}: seeds 2..5 all gave seed 1's tokens");
        }
    }
}

#[test]
fn fit_gives_a_context_that_loads() {
    let f = files("fit");
    let devices = Devices::cpu(2, 1).unwrap();
    for (draft, extra) in [(DraftModel::Gguf(f.dflash2.clone()), 6), (DraftModel::None, 0)] {
        let params = EngineParams { ctx_size: 1000, ..EngineParams::default() };
        let ctx = Engine::fit_ctx_size(&devices, &f.qwen3, &draft, &params, 8).unwrap();
        // The caches hold the largest multiple of 256 up to 1000 + the block.
        let kv = (1000 + extra) / 256 * 256;
        assert_eq!(ctx, (kv - extra).min(1000), "{draft:?}");
        let e = Engine::load(&devices, &f.qwen3, draft, &EngineParams { ctx_size: ctx, ..params }).unwrap();
        assert_eq!(e.kv_size(), kv);
    }
    // 0: up to the training context (4096 cells on these devices).
    let params = EngineParams { ctx_size: 0, ..EngineParams::default() };
    let ctx = Engine::fit_ctx_size(&devices, &f.qwen35, &DraftModel::Mtp, &params, 8).unwrap();
    assert_eq!(ctx, 4096 - 4);
}

#[path = "common/gguf_edit.rs"]
mod gguf_edit;
#[path = "common/nmse.rs"]
mod nmse;

/// Plain greedy decoding on one device with the logits of every step: the
/// tokens and, per token, the logits row it was chosen from.
fn plain_greedy_logits(model: &Path, prompt: &[i32], n: usize) -> (Vec<i32>, Vec<Vec<f32>>) {
    let f = shardgraph::gguf::GgufFile::open(model).unwrap();
    let kv = (prompt.len() + n) as i64;
    let devices = devices::cpu(&[1.0]);
    let mut s: Box<dyn shardgraph_models::step::Target> = if f.get_str("general.architecture").unwrap() == "qwen3" {
        Box::new(Qwen3Session::load_file(&f, &devices, GgmlType::F16, kv).unwrap())
    } else {
        Box::new(Qwen35Session::load_file(&f, &devices, GgmlType::F16, kv).unwrap())
    };
    let out = s.decode(prompt, &[], true).unwrap();
    let v = out.logits.as_ref().unwrap().len() / prompt.len();
    let mut logits = vec![out.logits.unwrap()[(prompt.len() - 1) * v..].to_vec()];
    let mut tokens = vec![*out.argmax.last().unwrap()];
    while tokens.len() < n {
        let o = s.decode(&[*tokens.last().unwrap()], &[], true).unwrap();
        tokens.push(o.argmax[0]);
        logits.push(o.logits.unwrap());
    }
    (tokens, logits)
}

/// The options of a real embedding: tokens streamed as accepted (in the
/// order returned), the logits of every step on request (equal to a plain
/// decode's), a caller's stop token and a callback that ends the
/// generation — each with every drafter, on 1 and 2 devices.
#[test]
fn streaming_logits_and_stop_tokens() {
    use shardgraph_models::engine::{End, GenerateOptions};
    let f = files("stream");
    let prompt = [5, 77, 123, 9, 64];
    let n = 16;
    let greedy = SamplerParams::greedy();
    for (model, draft) in [
        (&f.qwen3, DraftModel::None),
        (&f.qwen3, DraftModel::Gguf(f.dflash2.clone())),
        (&f.qwen35, DraftModel::Mtp),
        (&f.qwen35, DraftModel::Gguf(f.qwen35_dflash2.clone())),
    ] {
        let (want, want_logits) = plain_greedy_logits(model, &prompt, n);
        for n_dev in [1, 2] {
            let devices = Devices::cpu(n_dev, 1).unwrap();
            let params = EngineParams { ctx_size: 64, ..EngineParams::default() };
            let mut e = Engine::load(&devices, model, draft.clone(), &params).unwrap();
            let what = format!("{} {} on {n_dev}", e.arch(), e.draft_kind());
            let mut seen = Vec::new();
            let mut record = |t: i32| {
                seen.push(t);
                true
            };
            let opts = GenerateOptions { on_token: Some(&mut record), logits: true, ..GenerateOptions::default() };
            let g = e.generate_with(&prompt, n, &greedy, opts).unwrap();
            assert_eq!(g.tokens, want, "{what}");
            assert_eq!(seen, g.tokens, "{what}: streamed in the order returned");
            assert_eq!((g.end, g.logits.len()), (End::Length, n), "{what}");
            let worst = g.logits.iter().zip(&want_logits).map(|(a, b)| nmse::nmse(a, b)).fold(0.0, f64::max);
            // A verified batch's rows against single-token steps: the same
            // products in other batch shapes (measured 0 to 3e-6 with Q8_0
            // weights); ggml's bound for quantized products.
            println!("{what}: logits NMSE against a plain decode {worst:.2e}");
            assert!(worst <= 5e-4, "{what}: logits NMSE {worst:.3e}");
            // A stop token (the first at index ≥ 4 not generated before it).
            let i = (4..n).find(|&i| !want[..i].contains(&want[i])).unwrap();
            e.reset().unwrap();
            let opts = GenerateOptions { stop: &[want[i]], ..GenerateOptions::default() };
            let g = e.generate_with(&prompt, n, &greedy, opts).unwrap();
            assert_eq!((&g.tokens[..], g.end), (&want[..=i], End::Stop), "{what}");
            assert_eq!(e.n_past(), (prompt.len() + i + 1) as i64, "{what}");
            // The sequence goes on from the stop token as from any other.
            let more = e.generate(&[want[0]], 3, &greedy).unwrap().tokens;
            let mut all = prompt.to_vec();
            all.extend(&want[..=i]);
            all.push(want[0]);
            assert_eq!(more, plain_greedy(model, &all, 3), "{what}: after the stop");
            // A callback that ends it after 3 tokens.
            e.reset().unwrap();
            let mut count = 0;
            let mut three = |_t: i32| {
                count += 1;
                count < 3
            };
            let opts = GenerateOptions { on_token: Some(&mut three), ..GenerateOptions::default() };
            let g = e.generate_with(&prompt, n, &greedy, opts).unwrap();
            assert_eq!((&g.tokens[..], g.end), (&want[..3], End::Caller), "{what}");
        }
    }
}

/// `on_step` reports each verified step as llama.cpp's speculative loop
/// logs it (`scripts/llama-spec-compare.py` compares the two): the
/// position and token it starts from, the drafts, how many were accepted
/// and the target's next token. The steps account for every generated
/// token after the first and for the drafted, accepted and step counts,
/// and each starts where the one before ended — with every drafter.
#[test]
fn on_step_reports_each_verified_step() {
    use shardgraph_models::engine::{GenerateOptions, StepTrace};
    let f = files("steps");
    let prompt = [5, 77, 123, 9, 64];
    let n = 20;
    for (model, draft) in
        [(&f.qwen3, DraftModel::None), (&f.qwen3, DraftModel::Gguf(f.dflash2.clone())), (&f.qwen35, DraftModel::Mtp)]
    {
        let devices = Devices::cpu(1, 1).unwrap();
        let params = EngineParams { ctx_size: 64, ..EngineParams::default() };
        let mut e = Engine::load(&devices, model, draft.clone(), &params).unwrap();
        let what = format!("{} {}", e.arch(), e.draft_kind());
        let mut steps: Vec<(i64, i32, Vec<i32>, usize, i32)> = Vec::new();
        let mut record = |s: &StepTrace<'_>| steps.push((s.pos, s.last, s.drafts.to_vec(), s.accepted, s.next));
        let opts = GenerateOptions { on_step: Some(&mut record), ..GenerateOptions::default() };
        let g = e.generate_with(&prompt, n, &SamplerParams::greedy(), opts).unwrap();
        let mut tokens = vec![g.tokens[0]];
        let (mut pos, mut last) = (prompt.len() as i64, g.tokens[0]);
        for (p, l, d, k, next) in &steps {
            assert_eq!((*p, *l), (pos, last), "{what}: a step starts where the last one ended");
            tokens.extend(&d[..*k]);
            tokens.push(*next);
            (pos, last) = (pos + *k as i64 + 1, *next);
        }
        assert_eq!(&tokens[..n], &g.tokens[..], "{what}");
        let drafted: usize = steps.iter().map(|s| s.2.len()).sum();
        let accepted: usize = steps.iter().map(|s| s.3).sum();
        assert_eq!(
            (drafted, accepted, steps.len()),
            (g.stats.drafted, g.stats.accepted, g.stats.target_steps),
            "{what}"
        );
        if draft != DraftModel::None {
            assert!(accepted > 0, "{what}: the generated drafters follow their targets");
        }
    }
}

/// The file's end-of-generation tokens (`tokenizer.ggml.eos_token_id`,
/// `tokenizer.ggml.eot_token_id`) end a generation after the first one
/// generated, unless `ignore_eos`; an id outside the vocabulary is ignored.
#[test]
fn end_of_generation_tokens_of_the_file_stop_it() {
    use shardgraph::gguf::MetaValue;
    use shardgraph_models::engine::{End, GenerateOptions};
    let f = files("eog");
    let prompt = [5, 77, 123, 9, 64];
    let n = 12;
    let want = plain_greedy(&f.qwen3, &prompt, n);
    let i = (3..n).find(|&i| !want[..i].contains(&want[i])).unwrap();
    let eos = f.dir.join("qwen3-eos.gguf");
    let extra = [
        ("tokenizer.ggml.eos_token_id", MetaValue::from(want[i] as u32)),
        ("tokenizer.ggml.eot_token_id", MetaValue::from(100_000u32)),
    ];
    gguf_edit::copy_with(&f.qwen3, &eos, &extra, &[]);
    let devices = Devices::cpu(2, 1).unwrap();
    let params = EngineParams { ctx_size: 64, ..EngineParams::default() };
    for draft in [DraftModel::None, DraftModel::Gguf(f.dflash2.clone())] {
        let mut e = Engine::load(&devices, &eos, draft, &params).unwrap();
        assert_eq!(e.eog_tokens(), &[want[i]]);
        let g = e.generate(&prompt, n, &SamplerParams::greedy()).unwrap();
        assert_eq!((&g.tokens[..], g.end), (&want[..=i], End::Stop), "{}", e.draft_kind());
        e.reset().unwrap();
        let opts = GenerateOptions { ignore_eos: true, ..GenerateOptions::default() };
        let g = e.generate_with(&prompt, n, &SamplerParams::greedy(), opts).unwrap();
        assert_eq!((&g.tokens[..], g.end), (&want[..], End::Length), "{}", e.draft_kind());
    }
}

/// Rolling the sequence back (llama.cpp's `llama_memory_seq_rm`) and going
/// on gives a fresh engine's tokens for the kept tokens and the new
/// prompt (greedy), with every drafter: a `qwen3` target forgets its later
/// cells, a `qwen35` target decodes the kept tokens again.
#[test]
fn rollback_then_continue_equals_a_fresh_run_on_the_kept_tokens() {
    let f = files("rollback");
    let prompt = [5, 77, 123, 9, 64];
    let greedy = SamplerParams::greedy();
    for (model, draft) in [
        (&f.qwen3, DraftModel::None),
        (&f.qwen3, DraftModel::Gguf(f.dflash2.clone())),
        (&f.qwen35, DraftModel::None),
        (&f.qwen35, DraftModel::Mtp),
        (&f.qwen35, DraftModel::Gguf(f.qwen35_dflash2.clone())),
    ] {
        let devices = Devices::cpu(2, 1).unwrap();
        let params = EngineParams { ctx_size: 64, ..EngineParams::default() };
        let mut e = Engine::load(&devices, model, draft.clone(), &params).unwrap();
        let what = format!("{} {}", e.arch(), e.draft_kind());
        let first = e.generate(&prompt, 12, &greedy).unwrap().tokens;
        assert_eq!(e.tokens().len() as i64, e.n_past());
        for keep in [prompt.len() + 7, prompt.len() + 2, 3] {
            e.rollback(keep as i64).unwrap();
            assert_eq!(e.n_past(), keep as i64, "{what}");
            let kept: Vec<i32> = prompt.iter().chain(&first).copied().take(keep).collect();
            assert_eq!(e.tokens(), &kept[..], "{what}");
            let next = [42, 7];
            let got = e.generate(&next, 8, &greedy).unwrap().tokens;
            let mut fresh = Engine::load(&devices, model, draft.clone(), &params).unwrap();
            let all: Vec<i32> = kept.iter().chain(&next).copied().collect();
            let want = fresh.generate(&all, 8, &greedy).unwrap().tokens;
            assert_eq!(got, want, "{what}: rollback to {keep}");
            assert_eq!(got, plain_greedy(model, &all, 8), "{what}: rollback to {keep}");
            // Back to the first generation's sequence for the next case.
            e.reset().unwrap();
            assert_eq!(e.generate(&prompt, 12, &greedy).unwrap().tokens, first, "{what}");
        }
        assert!(e.rollback(e.n_past() + 1).is_err());
        e.rollback(0).unwrap();
        assert_eq!(e.n_past(), 0);
    }
}

/// `Engine::fit_ctx_size` with a prompt batch over 256 tokens (the
/// smallest context then holds one batch), and `Engine::check` refusing a
/// wrong drafter and a file with a tensor no kernel runs before anything
/// is loaded; K and V caches of different types load.
#[test]
fn fit_with_long_batches_check_before_loading_and_mixed_caches() {
    let f = files("check");
    let devices = Devices::cpu(2, 1).unwrap();
    let params = EngineParams { ctx_size: 2000, ..EngineParams::default() };
    for n_batch in [300, 600] {
        let ctx = Engine::fit_ctx_size(&devices, &f.qwen3, &DraftModel::None, &params, n_batch).unwrap();
        assert_eq!(ctx, 1792, "n_batch {n_batch}");
        let e =
            Engine::fit_ctx_size(&devices, &f.qwen3, &DraftModel::None, &EngineParams { ctx_size: 400, ..params }, 600);
        assert!(e.unwrap_err().to_string().contains("batch of 600"));
    }
    let ok = |m: &Path, d: &DraftModel| Engine::check(&devices, m, d, &params);
    ok(&f.qwen3, &DraftModel::Gguf(f.dflash2.clone())).unwrap();
    ok(&f.qwen35, &DraftModel::Mtp).unwrap();
    let msg = ok(&f.qwen35, &DraftModel::Gguf(f.dflash2.clone())).unwrap_err().to_string();
    assert!(msg.contains("another target"), "{msg}");
    let msg = ok(&f.qwen35_no_mtp, &DraftModel::Mtp).unwrap_err().to_string();
    assert!(msg.contains("nextn_predict_layers = 0"), "{msg}");
    // A drafter with a tensor of a type no kernel runs (an F32 matrix declared I32, the same bytes).
    let dflash_f32 = f.dir.join("dflash-f32.gguf");
    write_dflash_gguf(&dflash_f32, &dflash_hp(), &TensorTypes::uniform(GgmlType::F32), 200, 17).unwrap();
    let bad = f.dir.join("dflash-i32.gguf");
    gguf_edit::copy_with(&dflash_f32, &bad, &[], &[("blk.1.ffn_up.weight", GgmlType::I32)]);
    let msg = ok(&f.qwen3, &DraftModel::Gguf(bad)).unwrap_err().to_string();
    assert!(msg.contains("blk.1.ffn_up.weight") && msg.contains("i32"), "{msg}");
    // A drafter with a tensor of the wrong shape (one built for 3 layers of another width).
    let wide = f.dir.join("dflash-wide.gguf");
    let mut hp = dflash_hp();
    hp.n_ff = 512;
    write_dflash_gguf(&wide, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 200, 17).unwrap();
    let cut = f.dir.join("dflash-mismatch.gguf");
    gguf_edit::copy_with(
        &wide,
        &cut,
        &[("dflash.feed_forward_length", shardgraph::gguf::MetaValue::from(256u32))],
        &[],
    );
    let msg = ok(&f.qwen3, &DraftModel::Gguf(cut)).unwrap_err().to_string();
    assert!(msg.contains("wrong type or shape") && msg.contains("ffn"), "{msg}");
    // K q8_0 and V f16 caches.
    let mixed = EngineParams { cache_type_k: GgmlType::Q8_0, cache_type_v: GgmlType::F16, ctx_size: 64, ..params };
    let mut e = Engine::load(&devices, &f.qwen3, DraftModel::Gguf(f.dflash2.clone()), &mixed).unwrap();
    let prompt = [5, 77, 123, 9, 64];
    assert_eq!(e.generate(&prompt, 10, &SamplerParams::greedy()).unwrap().tokens, plain_greedy(&f.qwen3, &prompt, 10));
    let bad = EngineParams { cache_type_v: GgmlType::Q4_K, ..mixed };
    let msg = Engine::load(&devices, &f.qwen3, DraftModel::None, &bad).unwrap_err().to_string();
    assert!(msg.contains("cache_type_v q4_K"), "{msg}");
}
