//! Speculative decoding on the `qwen35` hybrid target (Gated-DeltaNet
//! layers whose conv and recurrent states absorb every verified token):
//! the output equals single-device plain greedy decoding on 1, 2 and 3 CPU
//! devices, ratios 1:1 and 3:1, KV caches F16 and Q4_0, with drafts that
//! are all accepted, all rejected, or rejected at chosen positions — so
//! the recurrent rollback runs at every kind of boundary, both ways: from
//! device-side per-token snapshots, and by restoring a host checkpoint and
//! decoding the kept tokens again.

use shardgraph::GgmlType;
use shardgraph_models::generate::write_qwen35_gguf;
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen35::Qwen35Session;
use shardgraph_models::speculative::{generate, SpecParams};
use shardgraph_models::step::Drafter;
use shardgraph_models::types::TensorTypes;

#[path = "common/devices.rs"]
mod devices;
#[path = "common/qwen35_tiny.rs"]
mod qwen35_tiny;

/// Drafts from a known continuation (`reference[i]` is the token at
/// position `offset + i`), wrong at every position `p` with
/// `p % every == 0` (never when `every == 0`), or always wrong.
struct OracleDrafter {
    reference: Vec<i32>,
    offset: i64,
    every: i64,
    all_wrong: bool,
}

impl Drafter<Qwen35Session> for OracleDrafter {
    fn draft(&mut self, _: &mut Qwen35Session, _: i32, pos: i64, n_max: usize) -> shardgraph::Result<Vec<i32>> {
        let mut out = Vec::new();
        for i in 0..n_max as i64 {
            let p = pos + 1 + i;
            let Some(&t) = usize::try_from(p - self.offset).ok().and_then(|k| self.reference.get(k)) else { break };
            let wrong = self.all_wrong || (self.every > 0 && p % self.every == 0);
            out.push(if wrong { (t + 1) % 320 } else { t });
        }
        Ok(out)
    }
}

#[test]
fn speculative_on_qwen35_equals_plain_greedy_with_recurrent_rollback() {
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-hybrid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen35-q8_0.gguf");
    write_qwen35_gguf(&path, &qwen35_tiny::tiny(), &TensorTypes::uniform(GgmlType::Q8_0), 5).unwrap();
    let prompt = [3, 14, 15, 92, 65, 35];
    let n_gen = 24;
    for kv in [GgmlType::F16, GgmlType::Q4_0] {
        let plain = {
            let mut s = Qwen35Session::load(&path, &devices::cpu(&[1.0]), kv, 64).unwrap();
            let mut none = OracleDrafter { reference: vec![], offset: 0, every: 0, all_wrong: false };
            generate(&mut s, &mut none, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
        };
        // The first generated token sits at position prompt.len().
        let offset = prompt.len() as i64;
        for ratios in [vec![1.0], vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0]] {
            for (every, all_wrong, snapshots) in
                [(0, false, false), (3, false, false), (5, false, true), (3, false, true), (0, true, true)]
            {
                let mut s = Qwen35Session::load(&path, &devices::cpu(&ratios), kv, 64).unwrap();
                if snapshots {
                    // Rollback copies a device-side snapshot back instead of re-decoding.
                    s.enable_snapshots(5).unwrap();
                }
                let mut d = OracleDrafter { reference: plain.clone(), offset, every, all_wrong };
                let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 4, n_min: 1 }).unwrap();
                assert_eq!(
                    tokens, plain,
                    "{ratios:?} kv {kv} every {every} all_wrong {all_wrong} snapshots {snapshots}: {st:?}"
                );
                if all_wrong {
                    assert_eq!(st.accepted, 0, "{st:?}");
                } else if every == 0 {
                    assert_eq!(st.accepted, st.drafted, "{st:?}");
                } else {
                    assert!(st.accepted > 0 && st.accepted < st.drafted, "{st:?}");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MTP (NextN) drafter of a generated `qwen35` whose MTP block predicts
/// the target's permutation: on 1, 2 and 3 devices, 1:1 and 3:1, KV F16 and
/// Q4_0, its drafts are mostly accepted and the output equals single-device
/// plain greedy decoding. A GGUF without an MTP layer is refused.
#[test]
fn mtp_drafting_on_qwen35_equals_plain_greedy() {
    use shardgraph_models::generate::{write_qwen35_gguf_with, Weights};
    use shardgraph_models::mtp::MtpDrafter;
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen35-mtp-q8_0.gguf");
    let hp = shardgraph_models::qwen35::Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    write_qwen35_gguf_with(&path, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 7, Weights::Permutation).unwrap();
    let prompt = [3, 14, 15, 92, 65, 35];
    let n_gen = 24;
    for kv in [GgmlType::F16, GgmlType::Q4_0] {
        let plain = {
            let mut s = Qwen35Session::load(&path, &devices::cpu(&[1.0]), kv, 64).unwrap();
            let mut none = OracleDrafter { reference: vec![], offset: 0, every: 0, all_wrong: false };
            generate(&mut s, &mut none, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
        };
        for ratios in [vec![1.0], vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0]] {
            let mut s = Qwen35Session::load(&path, &devices::cpu(&ratios), kv, 64).unwrap();
            s.enable_snapshots(4).unwrap();
            let mut d = MtpDrafter::new(&s, 0.0).unwrap();
            let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 3, n_min: 1 }).unwrap();
            eprintln!("mtp {ratios:?} kv {kv}: {st:?}");
            assert_eq!(tokens, plain, "{ratios:?} kv {kv}: {st:?}");
            assert!(st.accepted * 2 >= st.drafted && st.drafted > 0, "{ratios:?} kv {kv}: {st:?}");
        }
    }
    // No MTP layer: a clear error.
    let plain_path = dir.join("qwen35-no-mtp.gguf");
    write_qwen35_gguf(&plain_path, &qwen35_tiny::tiny(), &TensorTypes::uniform(GgmlType::Q8_0), 7).unwrap();
    let s = Qwen35Session::load(&plain_path, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
    let e = MtpDrafter::new(&s, 0.0).unwrap_err();
    assert!(e.to_string().contains("MTP"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mtp_update` (the drafter's update for accepted tokens: the MTP
/// step's graph cut to its K/V writes) leaves the MTP cache `mtp_step`
/// leaves: a chain of drafts after it gives the same tokens and
/// probabilities bit for bit, on 1 and 2 devices, with random weights (so
/// the tokens differ from row to row) and F16 and Q4_0 caches.
#[test]
fn an_mtp_update_writes_the_cache_an_mtp_step_writes() {
    use shardgraph_models::generate::{write_qwen35_gguf_with, Weights};
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-mtp-update-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen35-mtp-random.gguf");
    let hp = shardgraph_models::qwen35::Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    write_qwen35_gguf_with(&path, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 21, Weights::Random).unwrap();
    let e = hp.core.n_embd as usize;
    let h: Vec<f32> = (0..4 * e).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
    let rows = [17, 230, 5, 98];
    for kv in [GgmlType::F16, GgmlType::Q4_0] {
        for ratios in [vec![1.0], vec![1.0, 1.0]] {
            let chains: Vec<_> = [true, false]
                .iter()
                .map(|&step| {
                    let mut s = Qwen35Session::load(&path, &devices::cpu(&ratios), kv, 64).unwrap();
                    if step {
                        let out = s.mtp_step(&rows, &h, 0).unwrap();
                        assert_eq!(out.argmax.len(), rows.len());
                    } else {
                        s.mtp_update(&rows, &h, 0).unwrap();
                    }
                    s.mtp_chain(7, &h[..e], rows.len() as i64, 3).unwrap()
                })
                .collect();
            let (toks, probs) = &chains[0];
            assert_eq!(toks, &chains[1].0, "{ratios:?} kv {kv}: drafted tokens");
            let bits = |p: &[f32]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(probs), bits(&chains[1].1), "{ratios:?} kv {kv}: probabilities");
            assert!(probs.iter().all(|p| p.is_finite() && *p > 0.0), "{probs:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// DFlash2 against the `qwen35` target (taps of a layer input and of the
/// post-final-norm state, `dflash.target_layers` = [1, n_layer]): the
/// seed's matrix — one device (`--split-mode none`), and tensor split on 2
/// and 3 devices, 1:1 and 3:1 — all give single-device plain greedy
/// decoding's tokens, with the drafter (built to follow the target's
/// permutation) mostly accepted. A drafter built for another target is
/// refused.
#[test]
fn dflash2_drafting_on_qwen35_equals_plain_greedy() {
    use shardgraph_models::dflash::{DflashDrafter, DflashHparams};
    use shardgraph_models::generate::{write_dflash_gguf_with, write_qwen35_gguf_with, Weights};
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-dflash-hybrid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("qwen35-q8_0.gguf");
    let hp = shardgraph_models::qwen35::Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    write_qwen35_gguf_with(&target, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 13, Weights::Permutation).unwrap();
    let dhp = DflashHparams {
        core: HparamsCore::qwen3(2, 256, 384, 6, 3, 32),
        target_layers: vec![1, hp.n_layer],
        target_hidden: 256,
        block_size: 5,
        mask_token: (hp.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((32, 8)),
    };
    let drafter = dir.join("dflash2-q8_0.gguf");
    write_dflash_gguf_with(&drafter, &dhp, &TensorTypes::uniform(GgmlType::Q8_0), hp.n_vocab, 13, Weights::Permutation)
        .unwrap();
    let prompt = [3, 14, 15, 92, 65, 35];
    let n_gen = 24;
    let kv = GgmlType::Q4_0;
    let plain = {
        let mut s = Qwen35Session::load(&target, &devices::cpu(&[1.0]), kv, 64).unwrap();
        let mut none = OracleDrafter { reference: vec![], offset: 0, every: 0, all_wrong: false };
        generate(&mut s, &mut none, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
    };
    for ratios in [vec![1.0], vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0]] {
        let mut s = Qwen35Session::load(&target, &devices::cpu(&ratios), kv, 64).unwrap();
        let mut d = DflashDrafter::attach_gguf(&mut s, &drafter, kv, 0.0).unwrap();
        let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 4, n_min: 1 }).unwrap();
        eprintln!("dflash2 on qwen35 {ratios:?}: {st:?}");
        assert_eq!(tokens, plain, "{ratios:?}: {st:?}");
        assert!(st.accepted * 2 >= st.drafted && st.drafted > 0, "{ratios:?}: {st:?}");
    }
    // A drafter for a target with another vocabulary.
    let other = dir.join("other.gguf");
    let wrong = DflashHparams { mask_token: 999, ..dhp.clone() };
    write_dflash_gguf_with(&other, &wrong, &TensorTypes::uniform(GgmlType::Q8_0), 1000, 13, Weights::Random).unwrap();
    let mut s = Qwen35Session::load(&target, &devices::cpu(&[1.0]), kv, 64).unwrap();
    let e = DflashDrafter::attach_gguf(&mut s, &other, kv, 0.0).unwrap_err();
    assert!(e.to_string().contains("vocab_size"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
