//! Speculative decoding on the tiny `qwen3` target (permutation weights, so
//! the greedy continuation is known and drafts can be right or wrong on
//! purpose): the output equals plain greedy decoding token for token on 1,
//! 2 and 3 CPU devices, ratios 1:1 and 3:1, KV cache F16 and Q4_0, whether
//! every draft is accepted, none is, or some are (forced rejections roll the
//! KV cache back).

use shardgraph::GgmlType;
use shardgraph_models::generate::{permutation, write_qwen3_gguf_with, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session};
use shardgraph_models::speculative::{generate, SpecParams};
use shardgraph_models::step::Drafter;
use shardgraph_models::types::TensorTypes;

/// Drafts the permutation's continuation, wrong at every position `p` with
/// `p % every == 0` (never wrong when `every == 0`), or always wrong.
struct PermDrafter {
    perm: Vec<i64>,
    every: i64,
    all_wrong: bool,
}

impl Drafter<Qwen3Session> for PermDrafter {
    fn draft(&mut self, _: &mut Qwen3Session, last: i32, pos: i64, n_max: usize) -> shardgraph::Result<Vec<i32>> {
        let v = self.perm.len() as i64;
        let mut out = Vec::new();
        let mut t = last as i64;
        for i in 0..n_max as i64 {
            t = self.perm[t as usize];
            let wrong = self.all_wrong || (self.every > 0 && (pos + i + 1) % self.every == 0);
            out.push(if wrong { ((t + 1) % v) as i32 } else { t as i32 });
        }
        Ok(out)
    }
}

#[path = "common/devices.rs"]
mod devices;
#[path = "common/spec_models.rs"]
mod spec_models;
use spec_models::{dflash_hp, qwen3_hp as hp};

#[test]
fn speculative_output_equals_plain_greedy() {
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("target.gguf");
    write_qwen3_gguf_with(&path, &hp(), &TensorTypes::uniform(GgmlType::Q8_0), 11, Weights::Permutation).unwrap();
    let perm = permutation(hp().n_vocab, 11);
    let prompt = [5, 77, 123, 9];
    let n_gen = 20;
    let plain = {
        let mut s = Qwen3Session::load(&path, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
        let mut d = PermDrafter { perm: perm.clone(), every: 0, all_wrong: false };
        generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
    };
    for (ratios, kv) in [
        (vec![1.0], GgmlType::F16),
        (vec![1.0, 1.0], GgmlType::F16),
        (vec![3.0, 1.0], GgmlType::Q4_0),
        (vec![1.0, 1.0, 1.0], GgmlType::Q4_0),
    ] {
        for (every, all_wrong) in [(0, false), (3, false), (0, true)] {
            let mut s = Qwen3Session::load(&path, &devices::cpu(&ratios), kv, 64).unwrap();
            let mut d = PermDrafter { perm: perm.clone(), every, all_wrong };
            let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 4, n_min: 1 }).unwrap();
            assert_eq!(tokens, plain, "{ratios:?} kv {kv} every {every} all_wrong {all_wrong}: {st:?}");
            if all_wrong {
                assert_eq!(st.accepted, 0, "{st:?}");
            } else if every == 0 {
                assert_eq!(st.accepted, st.drafted, "{st:?}");
                assert!(st.target_steps * 4 <= n_gen + 4, "{st:?}");
            } else {
                assert!(st.accepted > 0 && st.accepted < st.drafted, "{st:?}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dflash_drafter_in_the_loop_keeps_the_output_greedy() {
    use shardgraph_models::dflash::{DflashDrafter, DflashHparams};
    use shardgraph_models::generate::write_dflash_gguf;
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-dflash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("target.gguf");
    write_qwen3_gguf_with(&path, &hp(), &TensorTypes::uniform(GgmlType::Q8_0), 13, Weights::Permutation).unwrap();
    let dhp = dflash_hp();
    let drafter = dir.join("drafter.gguf");
    write_dflash_gguf(&drafter, &dhp, &TensorTypes::uniform(GgmlType::Q8_0), hp().n_vocab, 17).unwrap();
    // DFlash2's convolutions in the drafter too.
    let drafter2 = dir.join("drafter2.gguf");
    write_dflash_gguf(
        &drafter2,
        &DflashHparams { conv: Some((2, 16)), ..dhp.clone() },
        &TensorTypes::uniform(GgmlType::Q8_0),
        hp().n_vocab,
        19,
    )
    .unwrap();
    let prompt = [3, 14, 15, 92, 65];
    let n_gen = 16;
    let mut plain = None;
    for (ratios, kv, file) in [
        (vec![1.0], GgmlType::F16, &drafter),
        (vec![1.0, 1.0], GgmlType::Q4_0, &drafter),
        (vec![1.0, 1.0, 1.0], GgmlType::F16, &drafter),
        (vec![1.0, 1.0], GgmlType::F16, &drafter2),
    ] {
        let mut s = Qwen3Session::load(&path, &devices::cpu(&ratios), kv, 64).unwrap();
        // A generated drafter GGUF (seeded random weights: drafts are mostly
        // rejected, which exercises the rollback of both caches every step).
        let mut d = DflashDrafter::attach_gguf(&mut s, file, kv, 0.0).unwrap();
        let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 4, n_min: 1 }).unwrap();
        assert!(st.drafted > 0, "{st:?}");
        let want = plain.get_or_insert_with(|| {
            let mut s = Qwen3Session::load(&path, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
            let mut none = PermDrafter { perm: vec![], every: 0, all_wrong: false };
            generate(&mut s, &mut none, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
        });
        assert_eq!(&tokens, want, "{ratios:?} kv {kv}: {st:?}");
    }
    // A drafter built for another target (vocabulary, hidden size) is refused.
    let other = dir.join("other.gguf");
    write_dflash_gguf(&other, &dhp, &TensorTypes::uniform(GgmlType::Q8_0), 1000, 17).unwrap();
    let mut s = Qwen3Session::load(&path, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
    let e = DflashDrafter::attach_gguf(&mut s, &other, GgmlType::F16, 0.0).unwrap_err();
    assert!(e.to_string().contains("vocab_size"), "{e}");
    let mut wide = dhp.clone();
    wide.n_embd = 256;
    write_dflash_gguf(&other, &wide, &TensorTypes::uniform(GgmlType::Q8_0), hp().n_vocab, 17).unwrap();
    let e = DflashDrafter::attach_gguf(&mut s, &other, GgmlType::F16, 0.0).unwrap_err();
    assert!(e.to_string().contains("embedding_length"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The seed configuration's shapes: a target whose rows fit K-quant blocks
/// (E = 256) and a DFlash2 drafter (convolutions and selector) built to
/// follow it.
fn seed_hp() -> (Qwen3Hparams, shardgraph_models::dflash::DflashHparams) {
    let t = Qwen3Hparams {
        core: HparamsCore { n_embd: 256, n_ff: 512, n_head: 8, n_head_kv: 4, head_dim: 64, ..hp().core },
        ..hp()
    };
    let d = shardgraph_models::dflash::DflashHparams {
        core: HparamsCore::qwen3(2, 256, 256, 8, 4, 64),
        target_layers: vec![1, 2],
        target_hidden: 256,
        block_size: 6,
        mask_token: 199,
        conv: Some((2, 16)),
        selector: Some((32, 8)),
    };
    (t, d)
}

/// DFlash2 drafting (its selector's best path, generated to follow the
/// permutation) against a target whose layer-0 attention overrides the
/// permutation at some positions: drafts are accepted and rejected, and the
/// output equals single-device plain greedy decoding on 1, 2 and 3 devices,
/// ratios 1:1 and 3:1, KV caches F16 and Q4_0 — among them the seed
/// configuration (target Q4_K-style weights, drafter Q8_0, KV cache q4_0,
/// flash attention, tensor split 1,1).
#[test]
fn dflash2_seed_configuration_accepts_drafts_and_stays_greedy() {
    use shardgraph_models::dflash::DflashDrafter;
    use shardgraph_models::generate::write_dflash_gguf_with;
    let dir = std::env::temp_dir().join(format!("shardgraph-spec-seed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (thp, dhp) = seed_hp();
    let kind = Weights::PermutationWithAttention { attention: 2.0 };
    let drafter = dir.join("dflash2-q8_0.gguf");
    write_dflash_gguf_with(
        &drafter,
        &dhp,
        &TensorTypes::uniform(GgmlType::Q8_0),
        thp.n_vocab,
        23,
        Weights::Permutation,
    )
    .unwrap();
    let prompt = [7, 31, 150, 2, 64, 90];
    let n_gen = 40;
    let (f16, q4_0) = (GgmlType::F16, GgmlType::Q4_0);
    for (name, types, runs) in [
        (
            "target-q4_k_m.gguf",
            TensorTypes::q4_k_m(),
            vec![(vec![1.0], f16), (vec![1.0, 1.0], q4_0), (vec![1.0, 1.0], f16)],
        ),
        // Q8_0 attention blocks let 3 devices and 3:1 each hold a KV head.
        (
            "target-q8_0.gguf",
            TensorTypes::uniform(GgmlType::Q8_0),
            vec![
                (vec![3.0, 1.0], f16),
                (vec![3.0, 1.0], q4_0),
                (vec![1.0, 1.0, 1.0], q4_0),
                (vec![1.0, 1.0, 1.0], f16),
            ],
        ),
    ] {
        let target = dir.join(name);
        write_qwen3_gguf_with(&target, &thp, &types, 23, kind).unwrap();
        // Plain greedy on one device with the same KV cache type.
        let plain = |kv| {
            let mut s = Qwen3Session::load(&target, &devices::cpu(&[1.0]), kv, 96).unwrap();
            let mut none = PermDrafter { perm: vec![], every: 0, all_wrong: false };
            generate(&mut s, &mut none, &prompt, n_gen, SpecParams { n_max: 0, n_min: 0 }).unwrap().0
        };
        let (plain_f16, plain_q4_0) = (plain(f16), plain(q4_0));
        for (ratios, kv) in runs {
            let plain = if kv == f16 { &plain_f16 } else { &plain_q4_0 };
            let mut s = Qwen3Session::load(&target, &devices::cpu(&ratios), kv, 96).unwrap();
            let mut d = DflashDrafter::attach_gguf(&mut s, &drafter, kv, 0.0).unwrap();
            let (tokens, st) = generate(&mut s, &mut d, &prompt, n_gen, SpecParams { n_max: 5, n_min: 1 }).unwrap();
            eprintln!("{name} {ratios:?} kv {kv}: {st:?}");
            assert_eq!(&tokens, plain, "{name} {ratios:?} kv {kv}: {st:?}");
            // The drafter predicts the target often, and is wrong where its attention intervenes.
            assert!(st.accepted * 5 >= st.drafted && st.accepted < st.drafted, "{name} {ratios:?} kv {kv}: {st:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
