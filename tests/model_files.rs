//! Model files as real ones are, loaded from GGUF and decoded on N CPU
//! devices against one device:
//! * a `qwen3` whose tensors have the types llama.cpp's quantizer picks per
//!   layer (its Q4_K_M: Q6_K `attn_v`/`ffn_down` in some layers, Q4_K in the
//!   others, a Q6_K head) with Q8_0 and Q5_0 tensors mixed in (other block
//!   sizes, so other split granules in those layers), on 1 device and on 3
//!   at 3:2:1;
//! * a split whose granule cannot keep a layer's blocks (mirrored, not an
//!   error);
//! * tied heads (`qwen3` and `qwen35` files without `output.weight`): one
//!   tensor, split by vocabulary, read by the lookup and the head; the plan
//!   holds one copy of it;
//! * K and V caches of different types;
//! * a file with a tensor of a type no kernel runs, refused naming it.

use shardgraph::gguf::GgufFile;
use shardgraph::split::{LeafInfo, SplitMode, SplitState};
use shardgraph::GgmlType;
use shardgraph_models::fit::{FitDraft, FitSpec, FitTarget};
use shardgraph_models::generate::{write_qwen35_gguf_with, write_qwen3_gguf_with, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session};
use shardgraph_models::qwen35::{Qwen35Hparams, Qwen35Session};
use shardgraph_models::types::{KvTypes, TensorTypes};
use std::path::{Path, PathBuf};

#[path = "common/devices.rs"]
mod devices;
#[path = "common/gguf_edit.rs"]
mod gguf_edit;
#[path = "common/nmse.rs"]
mod nmse;
#[path = "common/qwen35_tiny.rs"]
mod qwen35_tiny;
use nmse::nmse;

/// A fresh folder for a test's files, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("shardgraph-files-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn join(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `qwen3` with enough heads for K-quant granules on 3 devices at 3:2:1:
/// 4 layers, n_embd 256, n_ff 768, 24 heads / 12 KV heads of 64, vocabulary 320.
fn hp() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(4, 256, 768, 24, 12, 64), n_vocab: 320, n_ctx_train: 4096 }
}

/// A prompt's logits and a greedy continuation of `n` tokens (logits of
/// every step), on a `qwen3` or `qwen35` session.
fn greedy<T: shardgraph_models::step::Target>(s: &mut T, prompt: &[i32], n: usize) -> (Vec<i32>, Vec<Vec<f32>>) {
    let out = s.decode(prompt, &[], true).unwrap();
    let (mut tokens, mut logits) = (vec![*out.argmax.last().unwrap()], vec![out.logits.unwrap()]);
    while tokens.len() < n {
        let o = s.decode(&[*tokens.last().unwrap()], &[], true).unwrap();
        tokens.push(o.argmax[0]);
        logits.push(o.logits.unwrap());
    }
    (tokens, logits)
}

fn worst(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter().zip(b).map(|(x, y)| nmse(x, y)).fold(0.0, f64::max)
}

/// Checks a split run's tokens and logits against one device's: the same
/// greedy tokens, and every step's logits within NMSE 5e-4, ggml's
/// `test-backend-ops` bound for quantized products. (The partial sums of a
/// split add in another order; where a sum lands on the other side of a
/// Q8 activation's rounding boundary, that step and the later ones differ
/// by the quantum: measured 0 with even splits here, up to 1.5e-4 at
/// 3:2:1, from the prompt on with a Q8_0 K cache.)
fn check_split(what: &str, (got, logits): (Vec<i32>, Vec<Vec<f32>>), (want, want_logits): &(Vec<i32>, Vec<Vec<f32>>)) {
    let (first, all) = (nmse(&logits[0], &want_logits[0]), worst(&logits, want_logits));
    println!("{what}: logits NMSE prompt {first:.2e}, worst step {all:.2e}, tokens {got:?}");
    assert_eq!(&got, want, "{what}");
    assert!(all <= 5e-4, "{what}: logits NMSE {all:.3e}");
}

/// The mixed layout: llama.cpp's Q4_K_M by layer (Q6_K `attn_v` and
/// `ffn_down` in layers 2 and 3 of 4, Q6_K head), layer 1's output
/// projections Q8_0 (32-element blocks), its gate Q5_0, and layer 0's
/// K projection Q5_K.
fn mixed() -> TensorTypes {
    TensorTypes::llama_q4_k_m(4)
        .with("blk.1.attn_output.weight", GgmlType::Q8_0)
        .with("blk.1.ffn_down.weight", GgmlType::Q8_0)
        .with("blk.1.ffn_gate.weight", GgmlType::Q5_0)
        .with("blk.0.attn_k.weight", GgmlType::Q5_K)
}

#[test]
fn per_layer_mixed_types_load_and_decode_on_three_devices_as_on_one() {
    let dir = Dir::new("mixed");
    let path = dir.join("qwen3-mixed.gguf");
    write_qwen3_gguf_with(&path, &hp(), &mixed(), 7, Weights::Random).unwrap();
    // The file has the types of the preset, tensor by tensor.
    let file = TensorTypes::from_file(&GgufFile::open(&path).unwrap());
    let ty = |n: &str| file.get(n).unwrap();
    for (name, want) in [
        ("blk.0.attn_v.weight", GgmlType::Q4_K),
        ("blk.2.attn_v.weight", GgmlType::Q6_K),
        ("blk.3.ffn_down.weight", GgmlType::Q6_K),
        ("blk.0.ffn_down.weight", GgmlType::Q4_K),
        ("blk.1.attn_output.weight", GgmlType::Q8_0),
        ("blk.1.ffn_gate.weight", GgmlType::Q5_0),
        ("blk.0.attn_k.weight", GgmlType::Q5_K),
        ("output.weight", GgmlType::Q6_K),
        ("token_embd.weight", GgmlType::Q4_K),
    ] {
        assert_eq!(ty(name), want, "{name}");
    }
    let prompt = [11, 205, 3, 99, 42, 310, 7, 64];
    let mut one = Qwen3Session::load(&path, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
    let want = greedy(&mut one, &prompt, 8);
    for ratios in [vec![1.0], vec![3.0, 2.0, 1.0]] {
        let mut s = Qwen3Session::load(&path, &devices::cpu(&ratios), GgmlType::F16, 64).unwrap();
        let what = format!("qwen3 llama.cpp Q4_K_M by layer + Q8_0/Q5_0/Q5_K on {ratios:?}");
        check_split(&what, greedy(&mut s, &prompt, 8), &want);
        if ratios.len() == 3 {
            // Each layer's FFN rows are split by its own ffn_down's blocks:
            // 256 columns for Q4_K (3 granules: 1,1,1), 128 for Q8_0 (6: 3,2,1).
            let policy = s.runner().policy();
            let state = |name: &str| {
                let t = s.ctx().tensor(s.ctx().find(name).unwrap()).unwrap();
                policy.state_for(&LeafInfo { name, ne: t.ne, ty: t.ty }).unwrap().unwrap()
            };
            let extents = |name: &str| match state(name) {
                SplitState::Split(a) => a.segments[0].clone(),
                other => panic!("{name}: {other:?}"),
            };
            assert_eq!(extents("blk.0.ffn_down.weight"), vec![256, 256, 256]);
            assert_eq!(extents("blk.1.ffn_down.weight"), vec![384, 256, 128]);
            assert_eq!(extents("blk.1.ffn_gate.weight"), vec![384, 256, 128]);
            // Attention: Q4_K's granule is two GQA groups (256 query rows),
            // Q8_0's one (128): 6 granules 3,2,1 and 12 granules 6,4,2.
            assert_eq!(extents("blk.0.attn_output.weight"), vec![768, 512, 256]);
            assert_eq!(extents("blk.1.attn_output.weight"), vec![768, 512, 256]);
            assert_eq!(extents("cache_k_l1"), vec![384, 256, 128]);
        }
    }
}

/// A layer whose attention granule does not divide its query rows (3
/// heads of 32 in one KV group, Q8_0: a granule of 192 rows for 96) keeps
/// its attention mirrored instead of refusing the split; decoding still
/// equals one device.
#[test]
fn a_granule_that_does_not_fit_mirrors_the_layer_part() {
    let dir = Dir::new("fallback");
    let path = dir.join("qwen3-odd.gguf");
    let hp = Qwen3Hparams { core: HparamsCore::qwen3(2, 64, 128, 3, 1, 32), n_vocab: 96, n_ctx_train: 4096 };
    write_qwen3_gguf_with(&path, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 5, Weights::Random).unwrap();
    let prompt = [3, 17, 42, 5];
    let want = greedy(&mut Qwen3Session::load(&path, &devices::cpu(&[1.0]), GgmlType::F16, 32).unwrap(), &prompt, 6);
    let mut s = Qwen3Session::load(&path, &devices::cpu(&[1.0, 1.0]), GgmlType::F16, 32).unwrap();
    let t = s.ctx().tensor(s.ctx().find("blk.0.attn_q.weight").unwrap()).unwrap().clone();
    let st = s.runner().policy().state_for(&LeafInfo { name: &t.name, ne: t.ne, ty: t.ty }).unwrap();
    assert_eq!(st, Some(SplitState::Mirrored));
    check_split("qwen3 with mirrored attention on [1.0, 1.0]", greedy(&mut s, &prompt, 6), &want);
}

/// Tied heads: a `qwen3` and a `qwen35` (with its MTP layer) written
/// without `output.weight` load; the head is `token_embd.weight` itself
/// (one tensor, split by vocabulary, so the lookup is vocabulary-parallel),
/// and 2 and 3 devices decode as one.
#[test]
fn tied_heads_load_and_split_runs_equal_one_device() {
    let dir = Dir::new("tied");
    let q3 = dir.join("qwen3-tied.gguf");
    let tied = TensorTypes::uniform(GgmlType::Q8_0).tied();
    write_qwen3_gguf_with(&q3, &hp(), &tied, 9, Weights::Random).unwrap();
    assert!(GgufFile::open(&q3).unwrap().tensor_info("output.weight").is_none());
    let prompt = [11, 205, 3, 99, 42, 310, 7, 64];
    let mut one = Qwen3Session::load(&q3, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
    assert_eq!(one.model().output, one.model().tok_embd);
    let want = greedy(&mut one, &prompt, 8);
    for ratios in [vec![1.0, 1.0], vec![3.0, 2.0, 1.0]] {
        let mut s = Qwen3Session::load(&q3, &devices::cpu(&ratios), GgmlType::F16, 64).unwrap();
        check_split(&format!("qwen3 tied on {ratios:?}"), greedy(&mut s, &prompt, 8), &want);
        let t = s.ctx().tensor(s.model().tok_embd).unwrap().clone();
        let st = s.runner().policy().state_for(&LeafInfo { name: &t.name, ne: t.ne, ty: t.ty }).unwrap();
        assert!(matches!(st, Some(SplitState::Split(ref a)) if a.axis == 1), "{st:?}");
    }
    let h35 = Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    let q35 = dir.join("qwen35-tied.gguf");
    write_qwen35_gguf_with(&q35, &h35, &tied, 9, Weights::Random).unwrap();
    let mut one = Qwen35Session::load(&q35, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
    assert_eq!(one.model().output, one.model().tok_embd);
    let want = greedy(&mut one, &prompt, 8);
    let h = vec![0.5f32; h35.n_embd as usize * 2];
    let want_mtp = one.mtp_step(&[5, 6], &h, 0).unwrap();
    for ratios in [vec![1.0, 1.0], vec![1.0, 1.0, 1.0]] {
        let mut s = Qwen35Session::load(&q35, &devices::cpu(&ratios), GgmlType::F16, 64).unwrap();
        check_split(&format!("qwen35 tied on {ratios:?}"), greedy(&mut s, &prompt, 8), &want);
        // The MTP head reads the tied head too.
        let mtp = s.mtp_step(&[5, 6], &h, 0).unwrap();
        assert_eq!(mtp.argmax, want_mtp.argmax, "{ratios:?}");
    }
}

/// The plan holds one copy of a tied head: on one device its weights are
/// the untied model's minus `output.weight`; on N devices the untied
/// model's mirrored embedding is gone and the head's vocabulary slices are
/// the one table (each device: untied − the whole embedding).
#[test]
fn a_tied_plan_holds_one_copy_of_the_head() {
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    let table = GgmlType::Q8_0.row_size(hp().n_embd).unwrap() as u64 * hp().n_vocab as u64;
    for n in 1..=3 {
        let memory = |types: &TensorTypes| {
            let spec = FitSpec {
                target: FitTarget::Qwen3 { hp: hp(), types: types.clone() },
                draft: FitDraft::None,
                cache_types: GgmlType::F16.into(),
                ratios: vec![1.0; n],
                mode: SplitMode::Tensor,
                groups: Vec::new(),
                n_batch: 1,
                snapshot_slots: 0,
                link: shardgraph::split::LinkModel::default(),
            };
            spec.memory(256).unwrap()
        };
        let (untied, tied) = (memory(&types), memory(&types.clone().tied()));
        let total = |m: &[shardgraph::split::DeviceMemory]| m.iter().map(|d| d.weights).sum::<u64>();
        println!(
            "{n} device(s): weights untied {:?}, tied {:?}",
            untied.iter().map(|d| d.weights).collect::<Vec<_>>(),
            tied.iter().map(|d| d.weights).collect::<Vec<_>>()
        );
        for (u, t) in untied.iter().zip(&tied) {
            assert_eq!(t.weights + table, u.weights, "{n} device(s)");
        }
        // In all: the untied model's weights less one table per device
        // (its mirrored embedding) — the head's slices now serve both.
        assert_eq!(total(&tied), total(&untied) - n as u64 * table);
        if n == 1 {
            assert_eq!(tied[0].weights, untied[0].weights - table, "one device: untied minus the head");
        }
    }
}

/// K and V caches of different types (llama.cpp's `--cache-type-k` and
/// `--cache-type-v`) on 2 and 3 devices decode as one device with the
/// same types, `qwen3` and `qwen35`.
#[test]
fn separate_k_and_v_cache_types_decode_on_n_devices_as_on_one() {
    let dir = Dir::new("kv");
    let q3 = dir.join("qwen3.gguf");
    write_qwen3_gguf_with(&q3, &hp(), &TensorTypes::uniform(GgmlType::Q8_0), 3, Weights::Random).unwrap();
    let q35 = dir.join("qwen35.gguf");
    write_qwen35_gguf_with(&q35, &qwen35_tiny::tiny(), &TensorTypes::uniform(GgmlType::Q8_0), 3, Weights::Random)
        .unwrap();
    let prompt = [11, 205, 3, 99, 42, 310, 7, 64];
    let pairs = [
        KvTypes::new(GgmlType::Q8_0, GgmlType::F16),
        KvTypes::new(GgmlType::Q4_0, GgmlType::Q4_0),
        KvTypes::new(GgmlType::F16, GgmlType::Q5_1),
    ];
    for kv in pairs {
        let want = greedy(&mut Qwen3Session::load(&q3, &devices::cpu(&[1.0]), kv, 64).unwrap(), &prompt, 8);
        let want35 = greedy(&mut Qwen35Session::load(&q35, &devices::cpu(&[1.0]), kv, 64).unwrap(), &prompt, 8);
        for ratios in [vec![1.0, 1.0], vec![3.0, 2.0, 1.0]] {
            let mut s = Qwen3Session::load(&q3, &devices::cpu(&ratios), kv, 64).unwrap();
            assert_eq!(s.model().kv_types, kv);
            check_split(&format!("qwen3 caches {kv} on {ratios:?}"), greedy(&mut s, &prompt, 8), &want);
            let mut s = Qwen35Session::load(&q35, &devices::cpu(&ratios), kv, 64).unwrap();
            check_split(&format!("qwen35 caches {kv} on {ratios:?}"), greedy(&mut s, &prompt, 8), &want35);
        }
    }
    // A cache type llama.cpp does not offer, or one the head's blocks do not fit.
    let e = Qwen3Session::load(&q3, &devices::cpu(&[1.0]), KvTypes::new(GgmlType::F16, GgmlType::Q4_K), 64);
    let e = e.unwrap_err().to_string();
    assert!(e.contains("V cache type q4_K"), "{e}");
}

/// A tensor of a type no kernel of this build multiplies (an F32 file with
/// one matrix declared I32, the same bytes), or a norm that is not F32, is
/// refused at load naming the tensor and the type.
#[test]
fn a_tensor_of_a_type_no_kernel_runs_is_refused_naming_it() {
    let dir = Dir::new("types");
    let src = dir.join("qwen3-f32.gguf");
    let small = Qwen3Hparams { core: HparamsCore::qwen3(2, 64, 128, 6, 3, 32), n_vocab: 96, n_ctx_train: 4096 };
    write_qwen3_gguf_with(&src, &small, &TensorTypes::uniform(GgmlType::F32), 1, Weights::Random).unwrap();
    let check = |retype: (&str, GgmlType), want: &[&str]| {
        let bad: PathBuf = dir.join(&format!("{}.gguf", retype.0));
        gguf_edit::copy_with(&src, &bad, &[], &[retype]);
        let e = Qwen3Session::load(&bad, &devices::cpu(&[1.0, 1.0]), GgmlType::F16, 32).unwrap_err().to_string();
        for w in want {
            assert!(e.contains(w), "{e}");
        }
        e
    };
    check(("blk.1.attn_q.weight", GgmlType::I32), &["blk.1.attn_q.weight", "i32", "kernel"]);
    check(("token_embd.weight", GgmlType::I32), &["token_embd.weight", "i32"]);
    check(("blk.0.ffn_norm.weight", GgmlType::I32), &["blk.0.ffn_norm.weight", "i32", "f32"]);
    let _ = Path::new(&dir.0);
}

/// Generated files carry the minimal vocabulary llama.cpp needs to read a
/// DFlash drafter's mask token (`tokenizer.ggml.model = "llama"` and one
/// token text per id; with `"no_vocab"` llama.cpp reads no special token
/// and drafts with token −1), and the example drafter taps only layers
/// below the target's count (llama.cpp records no other). Files written
/// before (`"no_vocab"`, no token list) still load; a token list of another
/// length than the vocabulary, or a named tokenizer without one, is refused
/// naming the key.
#[test]
fn generated_files_carry_a_vocabulary_and_no_vocab_files_still_load() {
    use shardgraph::gguf::{GgufWriter, MetaValue};
    use shardgraph_models::dflash::DflashHparams;
    let dir = Dir::new("vocab");
    let src = dir.join("qwen3.gguf");
    let small = Qwen3Hparams { core: HparamsCore::qwen3(2, 64, 128, 6, 3, 32), n_vocab: 96, n_ctx_train: 4096 };
    write_qwen3_gguf_with(&src, &small, &TensorTypes::uniform(GgmlType::F32), 1, Weights::Random).unwrap();
    let f = GgufFile::open(&src).unwrap();
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "llama");
    let tokens = f.get_arr_str("tokenizer.ggml.tokens").unwrap();
    assert_eq!((tokens.len(), tokens[0], tokens[95]), (96, "tok0", "tok95"));
    // A copy with `keys` replaced and `drop` removed, tensors as they are.
    let edit = |name: &str, keys: &[(&str, MetaValue)], drop: &[&str]| -> PathBuf {
        let dst = dir.join(name);
        let mut w = GgufWriter::new();
        for (k, v) in f.kvs() {
            if !drop.contains(&k) && !keys.iter().any(|(e, _)| *e == k) {
                w.add_kv(k, v.to_owned_value()).unwrap();
            }
        }
        for (k, v) in keys {
            w.add_kv(k, v.clone()).unwrap();
        }
        for t in f.tensors() {
            w.add_tensor(&t.name, t.ty, &t.ne[..t.n_dims.max(1) as usize]).unwrap();
        }
        w.write_file(&dst, |info, sink| sink.put(f.tensor(&info.name)?.data)).unwrap();
        dst
    };
    let load = |p: &Path| Qwen3Session::load(p, &devices::cpu(&[1.0]), GgmlType::F16, 32).map(|_| ());
    load(&src).unwrap();
    let old =
        edit("no-vocab.gguf", &[("tokenizer.ggml.model", MetaValue::from("no_vocab"))], &["tokenizer.ggml.tokens"]);
    load(&old).unwrap();
    let short: Vec<String> = (0..95).map(|i| format!("tok{i}")).collect();
    let e = load(&edit("short.gguf", &[("tokenizer.ggml.tokens", MetaValue::from(short))], &[])).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.tokens has 95 tokens"), "{e}");
    let e = load(&edit("no-tokens.gguf", &[], &["tokenizer.ggml.tokens"])).unwrap_err();
    assert!(e.to_string().contains("no tokenizer.ggml.tokens"), "{e}");
    let e = load(&edit("ints.gguf", &[("tokenizer.ggml.tokens", MetaValue::from(vec![1u32; 96]))], &[])).unwrap_err();
    assert!(e.to_string().contains("not an array of strings"), "{e}");
    // The example pair: a vocabulary in both, the mask token inside it, taps below n_layer.
    let (target, drafter) = shardgraph_models::generate::write_example_pair(&dir.0).unwrap();
    let t = Qwen3Hparams::from_gguf(&GgufFile::open(&target).unwrap()).unwrap();
    let df = GgufFile::open(&drafter).unwrap();
    let d = DflashHparams::from_gguf(&df).unwrap();
    assert_eq!(df.get_str("tokenizer.ggml.model").unwrap(), "llama");
    assert_eq!(df.get_arr_str("tokenizer.ggml.tokens").unwrap().len() as i64, t.n_vocab);
    assert!((d.mask_token as i64) < t.n_vocab);
    assert!(d.target_layers.iter().all(|&l| l < t.n_layer), "{:?} on {} layers", d.target_layers, t.n_layer);
}

/// A model file is computed on where it is mapped: loading a `qwen3`
/// (llama.cpp's Q4_K_M types with Q8_0/Q5_0/Q5_K mixed in) onto one CPU
/// device adopts every weight byte of the file (`bytes_mapped`) and copies
/// none (the caches are allocated zeros); on 3 devices the mirrored parts
/// and row splits are adopted too. The tokens and logits are those of the
/// same file parsed from memory, whose weights are all copied.
#[test]
fn a_model_file_is_computed_where_it_is_mapped() {
    let dir = Dir::new("mapped");
    let path = dir.join("qwen3-mixed.gguf");
    write_qwen3_gguf_with(&path, &hp(), &mixed(), 7, Weights::Random).unwrap();
    let weight_bytes: u64 = GgufFile::open(&path).unwrap().iter_tensors().map(|t| t.data.len() as u64).sum();
    let prompt = [11, 205, 3, 99, 42, 310, 7, 64];
    let from_memory = GgufFile::from_bytes(std::fs::read(&path).unwrap(), "qwen3-mixed.gguf").unwrap();
    let mut copied = Qwen3Session::load_file(&from_memory, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
    let c = copied.runner().exec().counters();
    assert_eq!((c.bytes_mapped, c.store_bytes_copied), (0, weight_bytes), "parsed from memory: copied");
    let want = greedy(&mut copied, &prompt, 6);
    let mut one = Qwen3Session::load(&path, &devices::cpu(&[1.0]), GgmlType::F16, 64).unwrap();
    let c = one.runner().exec().counters();
    assert_eq!((c.bytes_mapped, c.store_bytes_copied), (weight_bytes, 0), "one device: mapped, copied");
    assert_eq!(greedy(&mut one, &prompt, 6), want, "tokens and logits of the mapped file");
    let mut three = Qwen3Session::load(&path, &devices::cpu(&[3.0, 2.0, 1.0]), GgmlType::F16, 64).unwrap();
    let c = three.runner().exec().counters();
    println!("3 devices: {} bytes mapped, {} copied (file: {weight_bytes})", c.bytes_mapped, c.store_bytes_copied);
    // Copied: the projections split along their rows (K), each device's
    // part gathered from every row; everything else is mapped.
    let by_k: u64 = GgufFile::open(&path)
        .unwrap()
        .iter_tensors()
        .filter(|t| t.info.name.ends_with("attn_output.weight") || t.info.name.ends_with("ffn_down.weight"))
        .map(|t| t.data.len() as u64)
        .sum();
    assert_eq!(c.store_bytes_copied, by_k, "3 devices: bytes copied");
    assert!(c.bytes_mapped >= weight_bytes - by_k, "3 devices: {} bytes mapped", c.bytes_mapped);
    check_split("mapped on 3 devices", greedy(&mut three, &prompt, 6), &want);
}
