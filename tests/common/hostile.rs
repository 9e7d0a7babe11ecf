//! The hostile-input corpus: edited copies of the generated example models
//! (a `qwen3` target, a `qwen35` target with its MTP layer, a DFlash2
//! drafter), each edit something a corrupt or malicious file can contain,
//! and the loader every case goes through (the path the examples take:
//! parse, hyper-parameters, tensors against them, placement on 2 devices,
//! load, one decode step). `tests/hostile.rs` runs the corpus; the
//! `model_load` fuzz target starts from the same base models and loader.
#![allow(dead_code)]

use shardgraph::gguf::{GgufFile, GgufWriter, MetaValue, ValueType};
use shardgraph::split::Devices;
use shardgraph::GgmlType;
use shardgraph_models::dflash::{DflashDrafter, DflashHparams};
use shardgraph_models::generate::{write_dflash_gguf, write_qwen35_gguf, write_qwen3_gguf};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::mtp::MtpDrafter;
use shardgraph_models::qwen3::Qwen3Session;
use shardgraph_models::qwen35::{Qwen35Hparams, Qwen35Session};
use shardgraph_models::types::TensorTypes;

/// What a case must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Loading returns an `Err` with a message.
    Err,
    /// Either outcome is right (the edit may leave a valid file), but no
    /// panic, abort or hang.
    Any,
}

/// One edited file.
pub struct Case {
    /// The base model and the edit, e.g. `qwen3: qwen3.block_count = 0`.
    pub name: String,
    /// The file.
    pub bytes: Vec<u8>,
    /// What loading it must do.
    pub expect: Expect,
}

/// A generated model file.
pub struct Base {
    /// `qwen3`, `qwen35` or `dflash`.
    pub arch: &'static str,
    /// The file.
    pub bytes: Vec<u8>,
}

#[path = "decode.rs"]
mod decode;
/// The tiny target (2 layers, E 64, 6/3 heads of 32, vocabulary 96): the
/// model tests' [`decode::tiny_hp`].
pub use decode::tiny_hp as qwen3_hp;

/// The tiny hybrid target with an MTP layer (2 trunk layers: delta-net, attention).
pub fn qwen35_hp() -> Qwen35Hparams {
    Qwen35Hparams {
        core: HparamsCore {
            n_layer: 2,
            n_embd: 128,
            n_ff: 256,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            rms_eps: 1e-6,
            rope_base: 1e7,
        },
        n_vocab: 96,
        n_rot: 16,
        rope_sections: [3, 3, 2, 0],
        full_attention_interval: 2,
        d_conv: 4,
        d_state: 64,
        n_k_heads: 4,
        n_v_heads: 8,
        n_nextn: 1,
        n_ctx_train: 4096,
    }
}

/// A DFlash2 drafter for [`qwen3_hp`] (convolution and selector).
pub fn dflash_hp() -> DflashHparams {
    DflashHparams {
        core: HparamsCore::qwen3(2, 64, 128, 6, 3, 32),
        target_layers: vec![1, 2],
        target_hidden: 64,
        block_size: 4,
        mask_token: 95,
        conv: Some((2, 16)),
        selector: Some((32, 4)),
    }
}

/// The three base files, generated into the temp folder and read back.
pub fn bases() -> Vec<Base> {
    // One folder per call: tests run in parallel.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("shardgraph-hostile-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let q3 = dir.join("qwen3.gguf");
    write_qwen3_gguf(&q3, &qwen3_hp(), &TensorTypes::uniform(GgmlType::F32), 1).unwrap();
    let q35 = dir.join("qwen35.gguf");
    let t35 = TensorTypes::uniform(GgmlType::F32);
    write_qwen35_gguf(&q35, &qwen35_hp(), &t35, 2).unwrap();
    let df = dir.join("dflash.gguf");
    write_dflash_gguf(&df, &dflash_hp(), &TensorTypes::uniform(GgmlType::F32), qwen3_hp().n_vocab, 3).unwrap();
    let out = vec![
        Base { arch: "qwen3", bytes: std::fs::read(&q3).unwrap() },
        Base { arch: "qwen35", bytes: std::fs::read(&q35).unwrap() },
        Base { arch: "dflash", bytes: std::fs::read(&df).unwrap() },
    ];
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Loads `bytes` as the examples would on 2 CPU devices (ratios 1,1, a
/// 256-cell F16 KV cache), a drafter onto a session of `target` (the
/// `qwen3` base), and decodes one token. Returns the error, if any.
pub fn load(bytes: &[u8], target: &[u8]) -> shardgraph::Result<()> {
    load_with(bytes, target, true)
}

/// [`load`], with the decode step only if `decode` (the fuzz target loads
/// without it).
pub fn load_with(bytes: &[u8], target: &[u8], decode: bool) -> shardgraph::Result<()> {
    let f = GgufFile::from_bytes(bytes.to_vec(), "case.gguf")?;
    // Two CPU devices, equal ratios (made once the architecture is known).
    let devices = || Devices::cpu(2, 1);
    let step = |r: shardgraph::Result<shardgraph_models::step::StepOutput>| r.map(drop);
    match f.get_str("general.architecture")? {
        "qwen35" => {
            let mut s = Qwen35Session::load_file(&f, &devices()?, GgmlType::F16, 256)?;
            if s.model().nextn.is_some() {
                MtpDrafter::new(&s, 0.0)?;
            }
            if decode {
                step(s.decode(&[1], &[], false))?;
            }
        }
        "dflash" => {
            let t = GgufFile::from_bytes(target.to_vec(), "target.gguf")?;
            let mut s = Qwen3Session::load_file(&t, &devices()?, GgmlType::F16, 256)?;
            DflashDrafter::attach_file(&mut s, &f, GgmlType::F16, 0.0)?;
            if decode {
                step(s.decode(&[1], &[], false))?;
            }
        }
        // Anything else goes through the qwen3 loader (which names the architecture).
        _ => {
            let mut s = Qwen3Session::load_file(&f, &devices()?, GgmlType::F16, 256)?;
            if decode {
                step(s.decode(&[1], &[], false))?;
            }
        }
    }
    Ok(())
}

/// A file rebuilt from `f` with metadata `kvs` and tensors `keep` (names of
/// `f`'s tensors, data copied), through the crate's writer.
fn rebuild(f: &GgufFile, kvs: &[(String, MetaValue)], keep: &[(String, String)]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.add_kv(k, v.clone()).unwrap();
    }
    for (name, from) in keep {
        let i = f.tensor_info(from).unwrap();
        w.add_tensor(name, i.ty, &i.ne[..i.n_dims.max(1) as usize]).unwrap();
    }
    let names: Vec<String> = keep.iter().map(|k| k.1.clone()).collect();
    let mut k = 0;
    w.write_to(Vec::new(), |_info, sink| {
        let data = f.tensor(&names[k]).unwrap().data;
        k += 1;
        sink.put(data)
    })
    .unwrap()
}

/// The byte where tensor `name`'s info starts after its name (`n_dims`).
fn info_at(bytes: &[u8], name: &str) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend(name.as_bytes());
    let p = bytes.windows(pat.len()).position(|w| w == pat).unwrap();
    p + pat.len()
}

/// The integer values every integer key is tried with.
const INTS: [(u64, &str); 6] =
    [(0, "0"), (1, "1"), ((1 << 31) - 1, "2^31-1"), ((1 << 32) - 1, "2^32-1"), (1 << 40, "2^40"), (u64::MAX, "2^64-1")];

/// Keys whose every in-range value leaves a file the loader may accept
/// (the training context, the data alignment, the MTP layer switch that
/// the tensors then decide, the vocabulary size the embedding decides).
fn free_key(key: &str) -> bool {
    key.ends_with(".context_length") || key == "general.alignment" || key == "tokenizer.ggml.mask_token_id"
}

/// Every edit of `base` (see the module doc), named after the base, handed
/// to `sink` one at a time (the corpus is a few hundred copies of the file).
pub fn cases(base: &Base, sink: &mut dyn FnMut(Case)) {
    let f = GgufFile::from_bytes(base.bytes.clone(), base.arch).unwrap();
    let kvs: Vec<(String, MetaValue)> = f.kvs().map(|(k, v)| (k.to_string(), v.to_owned_value())).collect();
    let all: Vec<(String, String)> = f.tensors().iter().map(|t| (t.name.clone(), t.name.clone())).collect();
    let mut push = |name: String, bytes: Vec<u8>, expect: Expect| {
        sink(Case { name: format!("{}: {name}", base.arch), bytes, expect });
    };
    // Metadata: every integer at 0 / 1 / 2^31−1 / 2^32−1 / 2^40 / 2^64−1 and
    // −1, every float at ±inf / nan / −1 / 0 / 1e30, every key removed, every
    // array emptied or with a huge element.
    for (i, (key, value)) in kvs.iter().enumerate() {
        let with = |v: MetaValue| {
            let mut k = kvs.clone();
            k[i].1 = v;
            rebuild(&f, &k, &all)
        };
        let original = f.get(key).unwrap();
        match original.value_type() {
            ValueType::U8
            | ValueType::I8
            | ValueType::U16
            | ValueType::I16
            | ValueType::U32
            | ValueType::I32
            | ValueType::U64
            | ValueType::I64 => {
                let was = original.as_uint();
                for (v, label) in INTS {
                    if Some(v) == was {
                        continue;
                    }
                    let mv = match u32::try_from(v) {
                        Ok(x) => MetaValue::from(x),
                        Err(_) => MetaValue::from(v),
                    };
                    let benign = free_key(key)
                        || (key.ends_with(".nextn_predict_layers") && v <= 1)
                        || (key.ends_with(".selector_top_k") && v == 1);
                    push(format!("{key} = {label}"), with(mv), if benign { Expect::Any } else { Expect::Err });
                }
                push(format!("{key} = -1 (i32)"), with(MetaValue::from(-1i32)), Expect::Err);
            }
            ValueType::F32 | ValueType::F64 => {
                for (v, label) in
                    [(f32::INFINITY, "inf"), (f32::NEG_INFINITY, "-inf"), (f32::NAN, "nan"), (-1.0, "-1"), (0.0, "0")]
                {
                    push(format!("{key} = {label}"), with(MetaValue::from(v)), Expect::Err);
                }
                push(format!("{key} = 1e30"), with(MetaValue::from(1e30f32)), Expect::Any);
            }
            ValueType::String => {
                let e = if key == "general.architecture" { Expect::Err } else { Expect::Any };
                push(format!("{key} = \"qwen2\""), with(MetaValue::from("qwen2")), e);
                push(format!("{key} = 7 (u32)"), with(MetaValue::from(7u32)), e);
            }
            ValueType::Array => {
                push(format!("{key} = []"), with(MetaValue::from(Vec::<u32>::new())), Expect::Err);
                let n = match value {
                    MetaValue::Array(a) => a.len(),
                    _ => 1,
                };
                let mut huge = vec![1u32; n.max(1)];
                huge[0] = u32::MAX;
                push(format!("{key}[0] = 2^32-1"), with(MetaValue::from(huge)), Expect::Err);
                push(format!("{key} = 600 elements"), with(MetaValue::from(vec![1u32; 600])), Expect::Err);
            }
            _ => {}
        }
        let mut k = kvs.clone();
        k.remove(i);
        // Optional keys: names, the generator's version, and what the
        // loaders default as llama.cpp does.
        let required = !key.starts_with("general.name")
            && key != shardgraph_models::generate::GENERATOR_KEY
            && !key.starts_with("tokenizer.ggml.model")
            && !key.ends_with(".vocab_size")
            && !key.ends_with(".rope.freq_base")
            && !key.ends_with(".context_length")
            && !key.ends_with("value_length")
            && !key.ends_with(".rope.dimension_count")
            && !key.ends_with(".key_length")
            && !key.ends_with(".nextn_predict_layers")
            && !key.ends_with(".block_size")
            && !key.ends_with(".target_hidden_size")
            && !key.ends_with(".full_attention_interval");
        push(format!("{key} removed"), rebuild(&f, &k, &all), if required { Expect::Err } else { Expect::Any });
    }
    // Tensors: each removed, one duplicated under a new name, every info
    // field edited in place (data left where it is).
    for (i, t) in f.tensors().iter().enumerate() {
        let mut keep = all.clone();
        keep.remove(i);
        // A target without `output.weight` has a tied head (it reads
        // `token_embd.weight`, as llama.cpp does): a valid file.
        let tied = t.name == "output.weight" && base.arch != "dflash";
        let e = if tied { Expect::Any } else { Expect::Err };
        push(format!("tensor {} removed", t.name), rebuild(&f, &kvs, &keep), e);
        let at = info_at(&base.bytes, &t.name);
        let nd = t.n_dims as usize;
        let patch = |pos: usize, b: &[u8]| {
            let mut v = base.bytes.clone();
            v[pos..pos + b.len()].copy_from_slice(b);
            v
        };
        let ty_at = at + 4 + 8 * nd;
        for (ty, label) in [(GgmlType::F16, "f16"), (GgmlType::Q8_0, "q8_0"), (GgmlType::Q4_K, "q4_k")] {
            if ty != t.ty {
                // Retyped to fewer bytes, the file is valid (other weights);
                // to more, the data overlaps the next tensor or runs past the end.
                let rows: i64 = t.ne[1..].iter().product();
                let fits = ty.row_size(t.ne[0]).is_ok_and(|r| r as i64 * rows <= t.nbytes as i64);
                let e = if fits { Expect::Any } else { Expect::Err };
                push(format!("tensor {} retyped {label}", t.name), patch(ty_at, &(ty as u32).to_le_bytes()), e);
            }
        }
        push(format!("tensor {} type 1000", t.name), patch(ty_at, &1000u32.to_le_bytes()), Expect::Err);
        for (v, label) in [(t.ne[0] * 2, "ne0 doubled"), (1 << 31, "ne0 2^31"), (i64::MAX, "ne0 2^63-1")] {
            push(format!("tensor {} {label}", t.name), patch(at + 4, &v.to_le_bytes()), Expect::Err);
        }
        if nd >= 2 {
            push(format!("tensor {} ne1 = 1", t.name), patch(at + 12, &1i64.to_le_bytes()), Expect::Err);
            push(format!("tensor {} ne1 = -1", t.name), patch(at + 12, &(-1i64).to_le_bytes()), Expect::Err);
        }
        push(format!("tensor {} n_dims 5", t.name), patch(at, &5u32.to_le_bytes()), Expect::Err);
        if nd >= 2 {
            // One fewer dim: the shape differs, the data stays.
            push(
                format!("tensor {} n_dims {}", t.name, nd - 1),
                patch(at, &(nd as u32 - 1).to_le_bytes()),
                Expect::Err,
            );
        }
        let off_at = ty_at + 4;
        let off = t.offset;
        for (v, label) in [(off + 32, "offset +32"), (1u64 << 62, "offset 2^62"), (u64::MAX - 31, "offset 2^64-32")] {
            push(format!("tensor {} {label}", t.name), patch(off_at, &v.to_le_bytes()), Expect::Err);
        }
        if i > 0 {
            let prev = f.tensors()[i - 1].offset;
            push(
                format!("tensor {} at the previous tensor's offset", t.name),
                patch(off_at, &prev.to_le_bytes()),
                Expect::Err,
            );
            // Renamed to its neighbour's name when as long (a duplicate), else an unknown name.
            let prev = &f.tensors()[i - 1].name;
            let mut v = base.bytes.clone();
            let name_at = at - t.name.len();
            if prev.len() == t.name.len() {
                v[name_at..at].copy_from_slice(prev.as_bytes());
                push(format!("tensor {} renamed {prev}", t.name), v, Expect::Err);
            } else {
                v[at - 1] = b'X';
                push(format!("tensor {} renamed …X", t.name), v, Expect::Err);
            }
        }
    }
    let mut extra = all.clone();
    extra.push(("blk.99.extra.weight".into(), all[0].1.clone()));
    push("an unused tensor added".into(), rebuild(&f, &kvs, &extra), Expect::Err);
    let mut twice = all.clone();
    twice.push(all[0].clone());
    // The writer refuses a duplicate name; patch the copy's name afterwards.
    twice.last_mut().unwrap().0 = format!("{}#", &all[0].0[..all[0].0.len() - 1]);
    let mut dup = rebuild(&f, &kvs, &twice);
    let p = info_at(&dup, &twice.last().unwrap().0);
    dup[p - 1] = *all[0].0.as_bytes().last().unwrap();
    push("a tensor listed twice".into(), dup, Expect::Err);
    // Header: version, counts, truncations, byte flips.
    let b = &base.bytes;
    for (v, e) in [(1u32, Expect::Err), (2, Expect::Any), (4, Expect::Err), (u32::MAX, Expect::Err)] {
        let mut c = b.clone();
        c[4..8].copy_from_slice(&v.to_le_bytes());
        push(format!("version {v}"), c, e);
    }
    for (at, what) in [(8, "n_tensors"), (16, "n_kv")] {
        let n = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        for v in [0, n - 1, n + 1, 1 << 32, 1 << 62, u64::MAX] {
            let mut c = b.clone();
            c[at..at + 8].copy_from_slice(&v.to_le_bytes());
            push(format!("{what} = {v}"), c, Expect::Err);
        }
    }
    let data = f.data_offset();
    let mut cuts: Vec<usize> = (1..16).map(|k| b.len() * k / 16).collect();
    cuts.extend([0, 3, 8, 23, data - 1, data, data + 1, b.len() - 1]);
    for cut in cuts {
        push(format!("truncated to {cut} of {} bytes", b.len()), b[..cut].to_vec(), Expect::Err);
    }
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ b.len() as u64;
    for _ in 0..200 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let pos = (s % data as u64) as usize;
        let mut c = b.clone();
        c[pos] ^= (s >> 56) as u8 | 1;
        push(format!("header byte {pos} flipped"), c, Expect::Any);
    }
}
