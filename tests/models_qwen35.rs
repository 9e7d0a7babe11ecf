//! The tiny `qwen35` hybrid target on N CPU devices under llama.cpp's
//! `--split-mode tensor` policy (delta-net tensors split by key heads as
//! repeated segments, recurrent caches by heads, attention by GQA groups)
//! equals one device: logits of a prompt (NMSE ≤ 1e-6) and a greedy
//! continuation decoded one token at a time (which carries the conv and
//! recurrent states and the KV cache), on 2 and 3 devices, ratios 1:1 and
//! 3:1, KV caches F16 and Q4_0. Bad input: a tensor split that leaves a
//! device without a key head is an error naming it.

use shardgraph::GgmlType;
use shardgraph_models::generate::write_qwen35_gguf;
use shardgraph_models::qwen35::Qwen35Session;
use shardgraph_models::types::TensorTypes;

#[path = "common/devices.rs"]
mod devices;
#[path = "common/nmse.rs"]
mod nmse;
#[path = "common/qwen35_tiny.rs"]
mod qwen35_tiny;
use nmse::nmse;
use qwen35_tiny::tiny;

/// The tiny `qwen35` written with every weight in `ty` (seed `seed`) into a
/// fresh folder named by `tag`: (the folder, the file).
fn tiny_file(tag: &str, ty: GgmlType, seed: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("shardgraph-qwen35-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("qwen35-{ty}.gguf"));
    write_qwen35_gguf(&path, &tiny(), &TensorTypes::uniform(ty), seed).unwrap();
    (dir, path)
}

fn run(path: &std::path::Path, ratios: &[f32], kv: GgmlType) -> (Vec<f32>, Vec<i32>) {
    run_on(path, &devices::cpu(ratios), kv)
}

fn run_on(path: &std::path::Path, devices: &shardgraph::split::Devices, kv: GgmlType) -> (Vec<f32>, Vec<i32>) {
    let mut s = Qwen35Session::load(path, devices, kv, 64).unwrap();
    let prompt = [11, 205, 3, 99, 42, 310, 7, 64, 128, 5];
    let out = s.decode(&prompt, &[], true).unwrap();
    let mut gen = vec![*out.argmax.last().unwrap()];
    while gen.len() < 12 {
        let o = s.decode(&[*gen.last().unwrap()], &[], false).unwrap();
        gen.push(o.argmax[0]);
    }
    (out.logits.unwrap(), gen)
}

#[test]
fn qwen35_on_n_devices_equals_one_device() {
    let (dir, path) = tiny_file("tp", GgmlType::Q8_0, 3);
    for kv in [GgmlType::F16, GgmlType::Q4_0] {
        let (want, want_gen) = run(&path, &[1.0], kv);
        // Four devices cannot each hold a key head (6 heads of 64 in
        // granules of 128 rows): those parts stay mirrored, the rest split.
        for ratios in [vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0], vec![1.0; 4]] {
            let (got, gen) = run(&path, &ratios, kv);
            let e = nmse(&got, &want);
            eprintln!("{ratios:?} kv {kv}: logits NMSE {e:.2e}");
            assert!(e <= 1e-6, "{ratios:?} kv {kv}: NMSE {e:.3e}");
            assert_eq!(gen, want_gen, "{ratios:?} kv {kv}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Device groups: the hybrid split over two groups of two devices (each
/// layer, gated attention or Gated DeltaNet, tensor-split inside its
/// group), and a tensor split whose zero share keeps a device out of every
/// layer (1,0,1,1): the same logits and tokens as one device.
#[test]
fn qwen35_on_device_groups_equals_one_device() {
    use shardgraph::split::{DeviceSet, SplitMode};
    let (dir, path) = tiny_file("groups", GgmlType::Q8_0, 5);
    let (want, want_gen) = run(&path, &[1.0], GgmlType::F16);
    let hybrid = devices::cpu(&[1.0; 4])
        .with_groups(vec![DeviceSet::of([0, 1]), DeviceSet::of([2, 3])])
        .unwrap()
        .with_split_mode(SplitMode::Hybrid);
    for (what, d) in [("hybrid", hybrid), ("1,0,1,1", devices::cpu(&[1.0, 0.0, 1.0, 1.0]))] {
        let (got, gen) = run_on(&path, &d, GgmlType::F16);
        let e = nmse(&got, &want);
        eprintln!("{what}: logits NMSE {e:.2e}");
        assert!(e <= 1e-6, "{what}: NMSE {e:.3e}");
        assert_eq!(gen, want_gen, "{what}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A decode step's plan on 2 and 3 devices is Megatron's minimum: two
/// all-reduces per layer (after the mixer's output projection and after
/// the FFN), whether the mixer is gated attention or a Gated DeltaNet
/// split by heads; nothing is gathered, and the recurrent state never
/// leaves its device.
#[test]
fn qwen35_decode_plan_moves_two_all_reduces_per_layer() {
    use shardgraph::split::{Collective, Planner};
    use shardgraph::Context;
    use shardgraph_models::qwen35::qwen35_policy;
    use shardgraph_models::qwen35::Qwen35;
    let hp = tiny();
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    for ratios in [vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0]] {
        let mut ctx = Context::new();
        let model = Qwen35::new(&mut ctx, hp.clone(), &types, GgmlType::F16, 64).unwrap();
        let st = model.build(&mut ctx, 1, &[]).unwrap();
        let mut outs = st.writes.clone();
        outs.push(st.argmax);
        let g = ctx.build_forward(&outs).unwrap();
        let policy = qwen35_policy(&hp, &types, &ratios).unwrap();
        let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
        let report = plan.report(&ctx);
        assert_eq!(plan.count(Collective::AllReduce), 2 * hp.n_layer, "{ratios:?}\n{report}");
        assert_eq!(plan.count(Collective::AllGather), 0, "{ratios:?}\n{report}");
        assert_eq!(plan.count(Collective::AllToAll), 0, "{ratios:?}\n{report}");
        let n = ratios.len() as u64;
        let e = hp.n_embd as u64 * 4;
        let reduce = 2 * e * (n - 1); // ring all-reduce of [E, 1] F32, all devices together
        let combine = 8 * n * (n - 1); // the greedy token's row combine: 8 bytes from every other device
        let moved: u64 = plan.repartitions.iter().map(|r| r.traffic.total_bytes).sum();
        assert_eq!(moved, 2 * hp.n_layer as u64 * reduce + combine, "{ratios:?}\n{report}");
    }
}

/// A GGUF whose metadata claims an MTP layer that its tensors lack is an
/// error naming the missing block; so is a truncated file.
#[test]
fn a_claimed_but_missing_mtp_layer_is_an_error() {
    use shardgraph::gguf::{GgufFile, GgufWriter};
    let dir = std::env::temp_dir().join(format!("shardgraph-qwen35-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = dir.join("no-mtp.gguf");
    write_qwen35_gguf(&plain, &tiny(), &TensorTypes::uniform(GgmlType::Q8_0), 3).unwrap();
    // The same tensors under metadata that says there is a NextN layer.
    let file = GgufFile::open(&plain).unwrap();
    let mut w = GgufWriter::new();
    let claims = shardgraph_models::qwen35::Qwen35Hparams { n_nextn: 1, ..tiny() };
    claims.add_to_gguf(&mut w, "claims an MTP layer").unwrap();
    let infos: Vec<_> = file.tensors().to_vec();
    for i in &infos {
        w.add_tensor(&i.name, i.ty, &i.ne[..i.n_dims.max(1) as usize]).unwrap();
    }
    let bad = dir.join("claims-mtp.gguf");
    w.write_file(&bad, |info, sink| sink.put(file.tensor(&info.name)?.data)).unwrap();
    let e = Qwen35Session::load(&bad, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("blk.4.") && msg.contains("NextN"), "{msg}");
    // Truncated: a GGUF error naming the file.
    let bytes = std::fs::read(&plain).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = Qwen35Session::load(&cut, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap_err();
    assert!(e.to_string().contains("cut.gguf"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rolling back into a batch through the device-side snapshots leaves the
/// conv and recurrent states byte-identical to decoding only the kept
/// tokens, on 1 and 2 devices (the snapshot buffers split by heads like the
/// caches).
#[test]
fn snapshot_rollback_equals_decoding_the_kept_tokens() {
    use shardgraph_models::qwen35::Qwen35Mixer;
    let (dir, path) = tiny_file("snap", GgmlType::F32, 5);
    let states = |s: &Qwen35Session| -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        for l in &s.model().layers {
            if let Qwen35Mixer::DeltaNet { cache_r, cache_s, .. } = l.mixer {
                for id in [cache_r, cache_s] {
                    let mut b = vec![0u8; s.ctx().tensor(id).unwrap().nbytes()];
                    s.runner().store().get_tensor(s.ctx(), id, 0, &mut b).unwrap();
                    v.push(b);
                }
            }
        }
        v
    };
    let toks = [3, 14, 15, 92, 65, 35, 8, 9, 10, 11];
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        for keep in 1..4usize {
            let mut want = Qwen35Session::load(&path, &devices::cpu(&ratios), GgmlType::F16, 64).unwrap();
            want.decode(&toks[..6], &[], false).unwrap();
            want.decode(&toks[6..6 + keep], &[], false).unwrap();
            let mut got = Qwen35Session::load(&path, &devices::cpu(&ratios), GgmlType::F16, 64).unwrap();
            got.enable_snapshots(5).unwrap();
            got.decode(&toks[..6], &[], false).unwrap();
            got.decode(&toks[6..10], &[], false).unwrap();
            got.rollback(6 + keep as i64).unwrap();
            assert_eq!(states(&got), states(&want), "{ratios:?}: keep {keep}");
            assert_eq!(got.n_past(), 6 + keep as i64);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A prompt decoded with the head on its last token only
/// (`Target::decode_last`) gives exactly that token's logits and greedy
/// token of a whole-batch step, keeps every row of the taps (the NextN
/// input, which an MTP drafter reads for the whole prompt), and leaves the
/// same caches and recurrent states: the continuation is identical. On 1
/// and 2 devices.
#[test]
fn a_prompt_with_the_head_on_its_last_token_equals_the_last_row_of_a_full_step() {
    use shardgraph_models::step::Target;
    let (dir, path) = tiny_file("last", GgmlType::Q8_0, 3);
    let prompt = [11, 205, 3, 99, 42, 310, 7];
    let n_layer = tiny().core.n_layer;
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        let mut full = Qwen35Session::load(&path, &devices::cpu(&ratios), GgmlType::F16, 64).unwrap();
        let mut last = Qwen35Session::load(&path, &devices::cpu(&ratios), GgmlType::F16, 64).unwrap();
        let want = full.decode(&prompt, &[n_layer], true).unwrap();
        let got = Target::decode_last(&mut last, &prompt, &[n_layer], true).unwrap();
        let (want_logits, got_logits) = (want.logits.unwrap(), got.logits.unwrap());
        let v = want_logits.len() / prompt.len();
        assert_eq!(got.argmax, want.argmax[prompt.len() - 1..], "{ratios:?}");
        assert_eq!(got_logits, want_logits[(prompt.len() - 1) * v..], "{ratios:?}");
        assert_eq!(got.taps, want.taps, "{ratios:?}: taps keep every row");
        let mut tok = got.argmax[0];
        for _ in 0..4 {
            let (a, b) = (full.decode(&[tok], &[], true).unwrap(), last.decode(&[tok], &[], true).unwrap());
            assert_eq!(a.logits, b.logits, "{ratios:?}: the states differ");
            tok = a.argmax[0];
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
