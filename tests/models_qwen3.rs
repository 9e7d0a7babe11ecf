//! The `qwen3` target decoding on N CPU devices under llama.cpp's tensor
//! split policy equals one device: the same greedy tokens (exactly) and
//! logits (NMSE ≤ 1e-6 with F32 weights) over a prompt and a sequence of
//! decode steps, with the KV cache in F16 and Q4_0, ratios 1:1, 3:1, 1:1:1;
//! and a rollback followed by re-decoding gives the same tokens again.
//! Under llama.cpp's `--split-mode layer` (each layer whole on one device)
//! the same, and a decode step moves one hidden state per device boundary;
//! a device with a zero tensor-split share takes no part.

use shardgraph::split::{Collective, Planner, SplitState};
use shardgraph::{Context, GgmlType};
use shardgraph_models::qwen3::{qwen3_policy, Qwen3, Qwen3Hparams, Qwen3Session};
use shardgraph_models::types::TensorTypes;

#[path = "common/decode.rs"]
mod decode;
#[path = "common/devices.rs"]
mod devices;
use decode::{generate, nmse};

fn hp() -> Qwen3Hparams {
    decode::tiny_hp()
}

fn session(ratios: &[f32], types: &TensorTypes, kv: GgmlType) -> Qwen3Session {
    decode::seeded_session(hp(), ratios, types, kv, 32)
}

#[test]
fn tensor_parallel_decoding_equals_one_device() {
    let prompt = [3, 17, 42, 5, 88, 1];
    for (types, kv) in [
        (TensorTypes::uniform(GgmlType::F32), GgmlType::F16),
        (TensorTypes::uniform(GgmlType::Q8_0), GgmlType::Q4_0),
        (
            TensorTypes::uniform(GgmlType::Q8_0)
                .with("blk.*.attn_v.weight", GgmlType::Q8_0)
                .with("blk.*.ffn_down.weight", GgmlType::Q8_0)
                .with("output.weight", GgmlType::Q8_0),
            GgmlType::Q8_0,
        ),
    ] {
        let mut one = session(&[1.0], &types, kv);
        let (want, want_logits) = generate(&mut one, &prompt, 8);
        for ratios in [vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0]] {
            let mut s = session(&ratios, &types, kv);
            let (got, logits) = generate(&mut s, &prompt, 8);
            assert_eq!(got, want, "{ratios:?} {types:?} kv {kv}");
            for (a, b) in logits.iter().zip(&want_logits) {
                let e = nmse(a, b);
                assert!(e <= 1e-6, "{ratios:?} {types:?}: logits NMSE {e:.3e}");
            }
            // Prompt and decode plans are cached, not re-planned per step.
            assert_eq!(s.runner().planner().cached(), 2);
            // A decode step under the session's policy (the step graph built
            // in a context of its own): caches stay split by heads, the
            // vocabulary-split head is never gathered (argmax combines 8 bytes
            // per row), and a layer moves at most two all-reduces of the
            // hidden state (a 1:1 FFN of one 128-row granule lies whole on
            // one device, which runs it alone: a reduce-scatter to it and a
            // gather from it, half of that).
            let mut ctx = Context::new();
            let model = Qwen3::new(&mut ctx, hp(), &types, kv, 32).unwrap();
            let step = model.build(&mut ctx, 1, &[]).unwrap();
            let g = ctx.build_forward(&step.outputs()).unwrap();
            let plan = Planner::default().plan(&ctx, &g, s.runner().policy(), &[]).unwrap();
            let logits = *step.outputs().first().unwrap();
            assert!(plan.repartitions.iter().all(|r| r.tensor != logits), "{}", plan.report(&ctx));
            let n = ratios.len() as u64;
            let all_reduce = 2 * (hp().core.n_embd as u64 * 4) * (n - 1);
            let combines: u64 = plan
                .repartitions
                .iter()
                .filter(|r| r.traffic.kind == Collective::RowCombine)
                .map(|r| r.traffic.total_bytes)
                .sum();
            let layers = plan.total_bytes() - combines;
            assert!(layers <= 2 * hp().n_layer as u64 * all_reduce, "{}", plan.report(&ctx));
        }
    }
}

#[test]
fn rollback_then_redecode_gives_the_same_tokens() {
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    let mut s = session(&[1.0, 1.0], &types, GgmlType::F16);
    let (first, _) = generate(&mut s, &[7, 8, 9], 5);
    // Back to just after the prompt, and decode again: identical continuation.
    s.rollback(3).unwrap();
    let mut again = vec![];
    let mut last = first[0];
    again.push(last);
    for _ in 1..5 {
        let o = s.decode(&[last], &[], false).unwrap();
        last = o.argmax[0];
        again.push(last);
    }
    assert_eq!(again, first);
    // Bad input: out-of-vocabulary token, a cache too small, rollback forward.
    assert!(s.decode(&[1000], &[], false).is_err());
    assert!(s.decode(&[1; 64], &[], false).is_err());
    assert!(s.rollback(s.n_past() + 1).is_err());
}

/// A tensor split finer than the KV heads (3 KV heads on 4 devices) keeps
/// the attention mirrored, as a granule that does not divide does, and
/// splits the rest: the plan never leaves a device without the heads it
/// needs, and decoding equals one device.
#[test]
fn more_devices_than_kv_heads_keep_the_attention_mirrored() {
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    let ratios = [1.0, 1.0, 1.0, 1.0];
    let mut ctx = Context::new();
    let model = Qwen3::new(&mut ctx, hp(), &types, GgmlType::F16, 8).unwrap();
    let policy = qwen3_policy(&model.hp, &types, &ratios).unwrap();
    let step = model.build(&mut ctx, 1, &[]).unwrap();
    let g = ctx.build_forward(&step.outputs()).unwrap();
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    let state = |name: &str| plan.state(ctx.find(name).unwrap()).cloned().unwrap();
    assert_eq!(state("blk.0.attn_k.weight"), SplitState::Mirrored);
    assert_eq!(state("blk.1.attn_output.weight"), SplitState::Mirrored);
    assert!(matches!(state("blk.0.ffn_up.weight"), SplitState::Split(_)), "{}", plan.report(&ctx));
    let prompt = [3, 1, 4, 1, 5];
    let (want, want_logits) = generate(&mut session(&[1.0], &types, GgmlType::F16), &prompt, 6);
    let (got, logits) = generate(&mut session(&ratios, &types, GgmlType::F16), &prompt, 6);
    assert_eq!(got, want);
    for (a, b) in logits.iter().zip(&want_logits) {
        assert!(nmse(a, b) <= 1e-6, "logits NMSE {:.3e}", nmse(a, b));
    }
}

#[test]
fn generated_gguf_loads_and_decodes_the_same_on_one_and_two_devices() {
    use shardgraph_models::generate::write_qwen3_gguf;
    let dir = std::env::temp_dir().join(format!("shardgraph-qwen3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    write_qwen3_gguf(&path, &hp(), &types, 3).unwrap();
    let run = |ratios: &[f32]| {
        let mut s = Qwen3Session::load(&path, &devices::cpu(ratios), GgmlType::Q8_0, 32).unwrap();
        generate(&mut s, &[1, 2, 3, 4], 6).0
    };
    let one = run(&[1.0]);
    assert_eq!(run(&[1.0, 1.0]), one);
    assert_eq!(run(&[1.0, 1.0, 1.0]), one);
    // Bad input: a truncated file, a file of another architecture.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert!(Qwen3Session::load(&cut, &devices::cpu(&[1.0]), GgmlType::F16, 8).is_err());
    let mut w = shardgraph::gguf::GgufWriter::new();
    w.add_kv("general.architecture", "llama").unwrap();
    let other = dir.join("llama.gguf");
    w.write_file(&other, |_, _| Ok(())).unwrap();
    let e = Qwen3Session::load(&other, &devices::cpu(&[1.0]), GgmlType::F16, 8).unwrap_err();
    assert!(e.to_string().contains("llama"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn structured_weights_continue_along_the_permutation() {
    use shardgraph_models::generate::{permutation, write_qwen3_gguf_with, Weights};
    let dir = std::env::temp_dir().join(format!("shardgraph-perm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("perm.gguf");
    let mut h = hp();
    h.n_embd = 128;
    write_qwen3_gguf_with(&path, &h, &TensorTypes::uniform(GgmlType::Q8_0), 5, Weights::Permutation).unwrap();
    let perm = permutation(h.n_vocab, 5);
    for ratios in [vec![1.0], vec![1.0, 1.0, 1.0]] {
        let mut s = Qwen3Session::load(&path, &devices::cpu(&ratios), GgmlType::F16, 40).unwrap();
        let (tokens, _) = generate(&mut s, &[9, 30, 2], 12);
        // The greedy rule of the generated model: each token is followed by its image.
        let mut want = vec![perm[2] as i32];
        while want.len() < 12 {
            want.push(perm[*want.last().unwrap() as usize] as i32);
        }
        assert_eq!(tokens, want, "{ratios:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A prompt decoded with the head on its last token only
/// (`Target::decode_last`, as llama.cpp's prompt batches) gives exactly
/// that token's logits and greedy token of a whole-batch step (every
/// product is batch-invariant), reads back one logits row, and leaves the
/// same cache: the continuation is identical. On 1 and 2 devices (the head
/// split by vocabulary on 2).
#[test]
fn a_prompt_with_the_head_on_its_last_token_equals_the_last_row_of_a_full_step() {
    use shardgraph_models::step::Target;
    let prompt = [3, 17, 42, 5, 88, 1, 9];
    let v = hp().n_vocab as usize;
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        let types = TensorTypes::uniform(GgmlType::Q8_0);
        let mut full = session(&ratios, &types, GgmlType::F16);
        let mut last = session(&ratios, &types, GgmlType::F16);
        let want = full.decode(&prompt, &[], true).unwrap();
        let got = Target::decode_last(&mut last, &prompt, &[], true).unwrap();
        let want_logits = want.logits.unwrap();
        assert_eq!(want.argmax.len(), prompt.len());
        assert_eq!(got.argmax, want.argmax[prompt.len() - 1..], "{ratios:?}");
        assert_eq!(got.logits.unwrap(), want_logits[(prompt.len() - 1) * v..], "{ratios:?}");
        assert_eq!(last.n_past(), full.n_past());
        let mut tok = got.argmax[0];
        for _ in 0..4 {
            let (a, b) = (full.decode(&[tok], &[], true).unwrap(), last.decode(&[tok], &[], true).unwrap());
            assert_eq!(a.logits, b.logits, "{ratios:?}: the caches differ");
            tok = a.argmax[0];
        }
    }
}

/// `--split-mode layer` (each layer's weights and caches whole on one
/// device, llama.cpp's assignment of 4 layers and the output layer by the
/// ratios): the same tokens and logits as one device, and a decode step's
/// plan moves the hidden state (n_embd F32 values) once per device
/// boundary, nothing else; the runner moves what its plans say.
#[test]
fn layer_split_decoding_equals_one_device_and_moves_one_hidden_state_per_boundary() {
    use shardgraph::split::{layer_device, Devices, SplitMode};
    let hp = Qwen3Hparams { core: shardgraph_models::hparams::HparamsCore::qwen3(4, 64, 128, 6, 3, 32), ..hp() };
    let prompt = [3, 17, 42, 5, 88, 1];
    let (types, kv) = (TensorTypes::uniform(GgmlType::Q8_0), GgmlType::Q4_0);
    let one = Devices::cpu(1, 1).unwrap();
    let mut s1 = decode::seeded_session_on(hp.clone(), &one, &types, kv, 32);
    let (want, want_logits) = generate(&mut s1, &prompt, 6);
    for ratios in [vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0], vec![1.0, 0.0, 1.0]] {
        let devices = Devices::cpu(ratios.len(), 1).unwrap().with_tensor_split(&ratios).unwrap();
        let devices = devices.with_split_mode(SplitMode::Layer);
        let mut s = decode::seeded_session_on(hp.clone(), &devices, &types, kv, 32);
        assert_eq!(s.runner().policy().layer_split_of(), Some(4));
        let (got, logits) = generate(&mut s, &prompt, 6);
        assert_eq!(got, want, "layer split {ratios:?}");
        for (a, b) in logits.iter().zip(&want_logits) {
            // Each op runs on one device as on the one device: the same sums.
            assert_eq!(nmse(a, b), 0.0, "layer split {ratios:?}");
        }
        assert_eq!(s.runner().bytes_moved(), s.runner().bytes_planned(), "{ratios:?}");
        // Boundaries: layer to layer, and the last layer to the output's device.
        let on: Vec<usize> = (0..=4).map(|il| layer_device(il, 4, &ratios)).collect();
        let boundaries = on.windows(2).filter(|w| w[0] != w[1]).count() as u64;
        assert!(boundaries >= 1, "{ratios:?}: {on:?}");
        let mut ctx = Context::new();
        let model = Qwen3::new(&mut ctx, hp.clone(), &types, kv, 32).unwrap();
        let step = model.build(&mut ctx, 1, &[]).unwrap();
        let g = ctx.build_forward(&step.outputs()).unwrap();
        let plan = Planner::default().plan(&ctx, &g, s.runner().policy(), &[]).unwrap();
        assert_eq!(plan.total_bytes(), boundaries * 64 * 4, "{ratios:?} on {on:?}\n{}", plan.report(&ctx));
        // Device 1 of 1:0:1 holds nothing and receives nothing.
        if ratios[1] == 0.0 {
            assert!(plan.repartitions.iter().all(|r| r.to.sole_holder() != Some(1)), "{}", plan.report(&ctx));
        }
    }
}

/// `--tensor-split 1,0` under the tensor policy: every split tensor lies
/// whole on device 0, which runs the model alone: the same tokens as one
/// device and nothing moves (it moved what 1:1 moves before).
#[test]
fn a_zero_tensor_split_share_takes_no_part() {
    let prompt = [3, 17, 42, 5, 88, 1];
    let (types, kv) = (TensorTypes::uniform(GgmlType::Q8_0), GgmlType::Q4_0);
    let mut one = session(&[1.0], &types, kv);
    let (want, _) = generate(&mut one, &prompt, 6);
    let mut s = session(&[1.0, 0.0], &types, kv);
    let (got, _) = generate(&mut s, &prompt, 6);
    assert_eq!(got, want);
    assert_eq!(s.runner().bytes_moved(), 0);
}

/// 3 KV heads over 4 devices: no split of the heads fits, so attention and
/// the KV caches are mirrored; every device writes its copy of the caches
/// (a plan that wrote one device's copy made each run mirror the whole
/// caches again afterwards: 258 336 bytes moved against 9 504 planned).
/// The runner moves what its plans say, and the tokens are one device's.
#[test]
fn mirrored_caches_are_written_on_every_device() {
    use shardgraph::split::Devices;
    let hp = Qwen3Hparams { core: shardgraph_models::hparams::HparamsCore::qwen3(4, 64, 128, 6, 3, 32), ..hp() };
    let prompt = [3, 17, 42, 5, 88, 1];
    let (types, kv) = (TensorTypes::uniform(GgmlType::Q8_0), GgmlType::Q4_0);
    let mut one = decode::seeded_session_on(hp.clone(), &Devices::cpu(1, 1).unwrap(), &types, kv, 32);
    let (want, _) = generate(&mut one, &prompt, 6);
    let devices = Devices::cpu(4, 1).unwrap();
    let mut s = decode::seeded_session_on(hp, &devices, &types, kv, 32);
    let (got, _) = generate(&mut s, &prompt, 6);
    assert_eq!(got, want);
    let (moved, planned) = (s.runner().bytes_moved(), s.runner().bytes_planned());
    assert_eq!(moved, planned);
    assert!(moved < 258_336 / 2, "{moved}");
}

/// `--tensor-split 1,1,0,0` (and 1,0,1,0, 0,1,0,1) over 4 devices: the two
/// devices with a zero share hold no part of any split weight, so every
/// tensor lives on the group of the other two (mirrored and partial sums
/// on that group only, its all-reduces and row combines among its two
/// devices): the logits are 2 devices' at 1,1 bit for bit (the same
/// one-shot all-reduces, in the same order), the run moves what its plans
/// say, and no repartition leaves anything on a device with a zero share.
/// (Without device groups each all-reduce crossed all four devices:
/// 1,1,0,0 moved what 1,1,1,1 moves.)
#[test]
fn zero_shares_in_a_tensor_split_keep_those_devices_out_of_every_collective() {
    use shardgraph::split::Devices;
    let hp = Qwen3Hparams { core: shardgraph_models::hparams::HparamsCore::qwen3(4, 64, 128, 6, 2, 32), ..hp() };
    let prompt = [3, 17, 42, 5, 88, 1];
    let (types, kv) = (TensorTypes::uniform(GgmlType::Q8_0), GgmlType::Q4_0);
    let two = Devices::cpu(2, 1).unwrap();
    let mut s2 = decode::seeded_session_on(hp.clone(), &two, &types, kv, 32);
    let (want, want_logits) = generate(&mut s2, &prompt, 6);
    for ratios in [vec![1.0, 1.0, 0.0, 0.0], vec![1.0, 0.0, 1.0, 0.0], vec![0.0, 1.0, 0.0, 1.0]] {
        let devices = Devices::cpu(4, 1).unwrap().with_tensor_split(&ratios).unwrap();
        let mut s = decode::seeded_session_on(hp.clone(), &devices, &types, kv, 32);
        let (got, logits) = generate(&mut s, &prompt, 6);
        assert_eq!(got, want, "{ratios:?}");
        for (a, b) in logits.iter().zip(&want_logits) {
            assert_eq!(nmse(a, b), 0.0, "{ratios:?}");
        }
        assert_eq!(s.runner().bytes_moved(), s.runner().bytes_planned(), "{ratios:?}");
        let mut ctx = Context::new();
        let model = Qwen3::new(&mut ctx, hp.clone(), &types, kv, 32).unwrap();
        let step = model.build(&mut ctx, 1, &[]).unwrap();
        let g = ctx.build_forward(&step.outputs()).unwrap();
        let plan = Planner::default().plan(&ctx, &g, s.runner().policy(), &[]).unwrap();
        // What a repartition leaves on a device with a zero share: nothing.
        for r in &plan.repartitions {
            for j in (0..4).filter(|&j| ratios[j] == 0.0) {
                let part = shardgraph::split::local_ne(g_ne(&ctx, r.tensor), &r.to, j);
                assert_eq!(part.iter().product::<i64>(), 0, "{ratios:?}: device {j}\n{}", plan.report(&ctx));
            }
        }
    }
}

fn g_ne(ctx: &Context, id: shardgraph::TensorId) -> [i64; 4] {
    ctx.tensor(id).unwrap().ne
}

/// The hybrid split (`--split-mode hybrid`) over 4 devices in two groups,
/// {0, 1} and {2, 3} (two machines of two GPUs): each layer tensor-split
/// inside its group, the layers shared between the groups. The tokens are
/// one device's and the logits within the tensor split's rounding; every
/// run moves what its plans say; and, priced with the links of two
/// machines, the only collective between the groups is the hidden state
/// at the group boundary (one copy to each device of the next group),
/// every all-reduce staying inside a group.
#[test]
fn hybrid_split_keeps_the_all_reduces_inside_each_group() {
    use shardgraph::split::{DeviceSet, Devices, LinkClass, Links, SplitMode};
    let hp = Qwen3Hparams { core: shardgraph_models::hparams::HparamsCore::qwen3(4, 64, 128, 6, 2, 32), ..hp() };
    let prompt = [3, 17, 42, 5, 88, 1];
    let (types, kv) = (TensorTypes::uniform(GgmlType::Q8_0), GgmlType::Q4_0);
    let one = Devices::cpu(1, 1).unwrap();
    let mut s1 = decode::seeded_session_on(hp.clone(), &one, &types, kv, 32);
    let (want, want_logits) = generate(&mut s1, &prompt, 6);
    let groups = vec![DeviceSet::of([0, 1]), DeviceSet::of([2, 3])];
    let devices = Devices::cpu(4, 1).unwrap().with_groups(groups.clone()).unwrap().with_split_mode(SplitMode::Hybrid);
    let mut s = decode::seeded_session_on(hp.clone(), &devices, &types, kv, 32);
    assert_eq!(s.runner().policy().hybrid_groups(), Some(groups.clone()));
    let (got, logits) = generate(&mut s, &prompt, 6);
    assert_eq!(got, want);
    for (a, b) in logits.iter().zip(&want_logits) {
        assert!(nmse(a, b) < 1e-4, "{}", nmse(a, b));
    }
    assert_eq!(s.runner().bytes_moved(), s.runner().bytes_planned());
    let mut ctx = Context::new();
    let model = Qwen3::new(&mut ctx, hp.clone(), &types, kv, 32).unwrap();
    let step = model.build(&mut ctx, 1, &[]).unwrap();
    let g = ctx.build_forward(&step.outputs()).unwrap();
    let same = |i: usize, j: usize| groups.iter().any(|g| g.contains(i) && g.contains(j));
    let class = |i: usize, j: usize| if same(i, j) { LinkClass::SameNode } else { LinkClass::OtherNode };
    let models = LinkClass::ALL.map(|c| c.default_model());
    let links = Links::new(4, class, models).unwrap();
    let plan = Planner::default().with_links(links).plan(&ctx, &g, s.runner().policy(), &[]).unwrap();
    let [_, inside, across] = plan.by_link();
    // One hidden state of 64 F32 to each of the 2 devices of the next group
    // (the output head's argmax combines its statistics inside its group).
    assert_eq!(across, (1, 2 * 64 * 4), "{}", plan.report(&ctx));
    // Inside the groups: each layer's two all-reduces (attention and FFN).
    assert!(inside.0 >= 2 * 4, "{}", plan.report(&ctx));
}
