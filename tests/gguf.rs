//! GGUF reading, writing and loading (`shardgraph::gguf`).
//!
//! * Round trips ours → ours for every metadata type (scalars, strings,
//!   arrays of each type including strings, empty and nested arrays) and
//!   tensors of F32, F16, BF16, I32, Q8_0, Q4_K and Q6_K, in versions 3 and
//!   2, at alignments 32 and 64, written through each writer path (callback,
//!   chunked stream, file) and read from memory and from a memory map;
//!   hand-crafted v2 and v3 bytes.
//! * Cross-checks with the reference implementations: the PyPI package
//!   `gguf==0.19.0` (installed into `./.venv` by `scripts/setup.sh`) writes
//!   a file that our reader must read identically to its own reader, and
//!   reads a file of our writer, printing keys, types, values (floats as
//!   bits), tensor infos and a hash of each tensor's bytes as JSON lines that
//!   must equal ours; ggml's own `gguf.cpp` (from the ggml oracle in the same
//!   venv) must accept our file with the same layout. Without the venv or
//!   the package these print `SKIPPED: <reason>` and pass, unless
//!   `SHARDGRAPH_REQUIRE_GGML` is set (as `.ci/run` does).
//! * Bad input: every truncation of a valid file, wrong magic, versions 1,
//!   99 and byte-swapped, data past the end, unknown type ids, absurd
//!   lengths, too many dims, duplicates, misaligned offsets, …: each an
//!   `Err` naming what is wrong, never a panic.
//! * A property test mutating valid files (flips, truncations, insertions,
//!   deletions, overwritten counts): no panic (`PROPTEST_CASES` sets the
//!   case count, 64 by default).
//! * Loading into one CPU device and into a `SplitStore` placed for a plan
//!   on 3 devices: the graph computes the same as with the original weights.

#[path = "common/fixtures.rs"]
mod fixtures;
#[path = "common/nmse.rs"]
mod nmse;
#[path = "common/rng.rs"]
mod rng;
use fixtures::{f32_bytes, named, OneCpu};
use nmse::nmse;
use proptest::prelude::*;
use rng::Rng;
use shardgraph::gguf::{
    load_into_split_store, load_into_storage, load_tensor_into_split_store, GgufFile, GgufWriter, MetaArray, MetaValue,
    Value, ValueType, ALL_VALUE_TYPES,
};
use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::split::{Devices, Planner, SplitPolicy, SplitSpec, SplitState, SplitStore};
use shardgraph::{Backend, Context, Error, GgmlType, TensorId, TensorStorage};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

// ---------------------------------------------------------------- helpers

/// FNV-1a 64 of `b` as 16 hex digits (the Python script computes the same).
fn fnv(b: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A fresh scratch folder under the system temp dir.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardgraph-gguf-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The message of a `Gguf` error, checking it names file `file`.
fn gguf_detail<T: std::fmt::Debug>(r: shardgraph::Result<T>, file: &str) -> String {
    match r {
        Err(Error::Gguf { file: f, detail }) => {
            assert_eq!(f, file, "error names the file");
            detail
        }
        other => panic!("expected a Gguf error, got {other:?}"),
    }
}

/// Expects `GgufFile::from_bytes` to fail with a message containing every
/// one of `needles`.
fn expect_bad(bytes: Vec<u8>, needles: &[&str]) {
    let d = gguf_detail(GgufFile::from_bytes(bytes, "bad.gguf"), "bad.gguf");
    for n in needles {
        assert!(d.contains(n), "error {d:?} should mention {n:?}");
    }
}

// ------------------------------------------------------ the sample content

/// What a sample file holds: metadata in order and tensors with their bytes.
struct Sample {
    kvs: Vec<(String, MetaValue)>,
    tensors: Vec<(String, GgmlType, Vec<i64>, Vec<u8>)>,
}

/// Every metadata type, arrays of each (empty ones too), a 1000-token
/// vocabulary, nested arrays (if `nested`), and tensors of seven types.
fn sample(nested: bool) -> Sample {
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut kvs: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), "testarch".into()),
        ("t.u8".into(), 200u8.into()),
        ("t.i8".into(), (-100i8).into()),
        ("t.u16".into(), 60000u16.into()),
        ("t.i16".into(), (-30000i16).into()),
        ("t.u32".into(), 4_000_000_000u32.into()),
        ("t.i32".into(), (-2_000_000_000i32).into()),
        ("t.f32".into(), (-1.25e-3f32).into()),
        ("t.f32.negzero".into(), (-0.0f32).into()),
        ("t.f32.nan".into(), f32::from_bits(0x7fc0_0001).into()),
        ("t.bool.true".into(), true.into()),
        ("t.bool.false".into(), false.into()),
        ("t.str".into(), "héllo wörld ✓ 🎉 \"q\" \\ \n\t\u{7f}".into()),
        ("t.str.empty".into(), "".into()),
        ("t.u64".into(), u64::MAX.into()),
        ("t.i64".into(), i64::MIN.into()),
        ("t.f64".into(), std::f64::consts::PI.into()),
        ("t.f64.neginf".into(), f64::NEG_INFINITY.into()),
        ("t.arr.u8".into(), vec![0u8, 1, 255].into()),
        ("t.arr.i8".into(), vec![-128i8, 0, 127].into()),
        ("t.arr.u16".into(), vec![0u16, 65535].into()),
        ("t.arr.i16".into(), vec![-32768i16, 5, 32767].into()),
        ("t.arr.u32".into(), vec![7u32, u32::MAX].into()),
        ("t.arr.i32".into(), vec![i32::MIN, -1, 0, i32::MAX].into()),
        ("t.arr.f32".into(), vec![1.5f32, -0.0, f32::INFINITY, 1e-40].into()),
        ("t.arr.bool".into(), vec![true, false, true].into()),
        ("t.arr.str".into(), MetaValue::Array(MetaArray::String(s(&["a", "", "ünï", "x y\"z"])))),
        ("t.arr.u64".into(), vec![0u64, u64::MAX].into()),
        ("t.arr.i64".into(), vec![i64::MIN, 42].into()),
        ("t.arr.f64".into(), vec![-2.5f64, 1e300].into()),
        ("t.arr.empty_u32".into(), MetaValue::Array(MetaArray::U32(vec![]))),
        ("t.arr.empty_str".into(), MetaValue::Array(MetaArray::String(vec![]))),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(MetaArray::String((0..1000).map(|i| format!("tok{i}")).collect())),
        ),
        ("general.alignment".into(), 64u32.into()),
    ];
    if nested {
        kvs.push(("t.arr.nested".into(), vec![MetaArray::I32(vec![1, 2, 3]), MetaArray::I32(vec![4])].into()));
        kvs.push((
            "t.arr.nested_str".into(),
            vec![MetaArray::String(s(&["a", "b"])), MetaArray::String(s(&["c"]))].into(),
        ));
        kvs.push((
            "t.arr.nested_mixed".into(),
            vec![MetaArray::U8(vec![1]), MetaArray::String(s(&["x"])), MetaArray::F64(vec![2.5])].into(),
        ));
        kvs.push((
            "t.arr.nested3".into(),
            vec![MetaArray::Array(vec![MetaArray::I32(vec![1]), MetaArray::I32(vec![2, 3])]), MetaArray::Array(vec![])]
                .into(),
        ));
    }
    let mut rng = Rng::new(7);
    let mut tensors = Vec::new();
    let f: Vec<f32> = (0..64 * 3).map(|_| rng.unit()).collect();
    tensors.push(("token_embd.weight".to_string(), GgmlType::F32, vec![64, 3], f32_bytes(&f)));
    let h: Vec<u8> = (0..32 * 2 * 2).flat_map(|_| half::f16::from_f32(rng.unit()).to_le_bytes()).collect();
    tensors.push(("blk.0.f16".to_string(), GgmlType::F16, vec![32, 2, 2], h));
    for (name, ty, ne) in [
        ("blk.0.q8_0", GgmlType::Q8_0, vec![64i64, 4]),
        ("blk.0.q4_k", GgmlType::Q4_K, vec![256, 2]),
        ("blk.0.q6_k", GgmlType::Q6_K, vec![512, 3]),
        ("blk.0.i32", GgmlType::I32, vec![5]),
        ("blk.0.bf16_4d", GgmlType::BF16, vec![8, 4, 3, 2]),
    ] {
        let n = ty.row_size(ne[0]).unwrap() * ne[1..].iter().product::<i64>() as usize;
        tensors.push((name.to_string(), ty, ne, rng.bytes(n)));
    }
    Sample { kvs, tensors }
}

fn writer_for(s: &Sample) -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in &s.kvs {
        w.add_kv(k, v.clone()).unwrap();
    }
    for (name, ty, ne, _) in &s.tensors {
        w.add_tensor(name, *ty, ne).unwrap();
    }
    w
}

fn data_map(s: &Sample) -> HashMap<String, Vec<u8>> {
    s.tensors.iter().map(|(n, _, _, d)| (n.clone(), d.clone())).collect()
}

/// Writes `w` to memory, each tensor's bytes through the callback.
fn write_mem(w: GgufWriter, data: &HashMap<String, Vec<u8>>) -> Vec<u8> {
    w.write_to(Vec::new(), |info, sink| sink.put(&data[&info.name])).unwrap()
}

/// Everything `f` holds must be `s`.
fn check_sample(f: &GgufFile, s: &Sample, alignment: usize) {
    assert_eq!(f.alignment(), alignment);
    assert_eq!(f.n_kv(), s.kvs.len());
    let got: Vec<(String, MetaValue)> = f.kvs().map(|(k, v)| (k.to_string(), v.to_owned_value())).collect();
    assert_eq!(got.len(), s.kvs.len());
    for ((gk, gv), (k, v)) in got.iter().zip(&s.kvs) {
        assert_eq!(gk, k);
        assert_eq!(gv, v, "value of {k}");
        assert_eq!(f.value_type(k), Some(v.value_type()));
    }
    assert_eq!(f.data_offset() % alignment, 0);
    assert_eq!(f.tensors().len(), s.tensors.len());
    for (i, (name, ty, ne, data)) in s.tensors.iter().enumerate() {
        let t = f.tensor(name).unwrap();
        assert_eq!(t.info.ty, *ty);
        assert_eq!(t.info.n_dims as usize, ne.len());
        assert_eq!(&t.info.ne[..ne.len()], &ne[..]);
        assert!(t.info.ne[ne.len()..].iter().all(|&d| d == 1));
        assert_eq!(t.info.nbytes, data.len());
        assert_eq!(t.data, &data[..], "bytes of {name}");
        assert_eq!(t.info.offset % alignment as u64, 0);
        assert_eq!(t.file_offset, f.data_offset() + t.info.offset as usize);
        assert_eq!(f.tensor_at(i).unwrap().info.name, *name);
        // Zero-copy: the slice lies inside the file's bytes.
        let base = f.bytes().as_ptr() as usize;
        let p = t.data.as_ptr() as usize;
        assert!(p >= base && p + t.data.len() <= base + f.len());
    }
}

// ------------------------------------------------------------ round trips

#[test]
fn round_trip_every_type_v3_and_v2() {
    let s = sample(true);
    let data = data_map(&s);
    for version in [3u32, 2] {
        let mut w = writer_for(&s);
        w.set_version(version).unwrap();
        let expect_len = w.file_len();
        let bytes = write_mem(w.clone(), &data);
        assert_eq!(bytes.len() as u64, expect_len);
        assert_eq!(&bytes[..4], b"GGUF");
        assert_eq!(u32::from_le_bytes(bytes[4..8].try_into().unwrap()), version);
        let f = GgufFile::from_bytes(bytes.clone(), "rt.gguf").unwrap();
        assert_eq!(f.version(), version);
        assert!(!f.is_mapped());
        check_sample(&f, &s, 64);

        // The same bytes through the chunked stream and through a file.
        let mut st = w.clone().begin(Vec::new()).unwrap();
        assert_eq!(st.data_offset() as usize, f.data_offset());
        while let Some(t) = st.next_tensor() {
            let d = data[&t.name].clone();
            for c in d.chunks(7) {
                st.write_data(c).unwrap();
            }
        }
        assert_eq!(st.finish().unwrap(), bytes);
        let dir = scratch(&format!("rt{version}"));
        let path = dir.join("rt.gguf");
        let n = w
            .write_file(&path, |info, sink| {
                sink.write_all(&data[&info.name]).unwrap();
                Ok(())
            })
            .unwrap();
        assert_eq!(n, bytes.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let fm = GgufFile::open(&path).unwrap();
        assert!(fm.is_mapped());
        assert_eq!(fm.name(), path.display().to_string());
        check_sample(&fm, &s, 64);
        drop(fm);
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn typed_accessors_and_their_errors() {
    let s = sample(true);
    let f = GgufFile::from_bytes(write_mem(writer_for(&s), &data_map(&s)), "acc.gguf").unwrap();
    assert_eq!(f.get_u8("t.u8").unwrap(), 200);
    assert_eq!(f.get_i8("t.i8").unwrap(), -100);
    assert_eq!(f.get_u16("t.u16").unwrap(), 60000);
    assert_eq!(f.get_i16("t.i16").unwrap(), -30000);
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i32("t.i32").unwrap(), -2_000_000_000);
    assert_eq!(f.get_f32("t.f32").unwrap(), -1.25e-3);
    assert_eq!(f.get_f32("t.f32.nan").unwrap().to_bits(), 0x7fc0_0001);
    assert!(f.get_bool("t.bool.true").unwrap());
    assert!(!f.get_bool("t.bool.false").unwrap());
    assert_eq!(f.get_str("t.str").unwrap(), "héllo wörld ✓ 🎉 \"q\" \\ \n\t\u{7f}");
    assert_eq!(f.get_str("t.str.empty").unwrap(), "");
    assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_i64("t.i64").unwrap(), i64::MIN);
    assert_eq!(f.get_f64("t.f64").unwrap(), std::f64::consts::PI);
    assert_eq!(f.get_arr_u8("t.arr.u8").unwrap(), vec![0, 1, 255]);
    assert_eq!(f.get_arr_i8("t.arr.i8").unwrap(), vec![-128, 0, 127]);
    assert_eq!(f.get_arr_u16("t.arr.u16").unwrap(), vec![0, 65535]);
    assert_eq!(f.get_arr_i16("t.arr.i16").unwrap(), vec![-32768, 5, 32767]);
    assert_eq!(f.get_arr_u32("t.arr.u32").unwrap(), vec![7, u32::MAX]);
    assert_eq!(f.get_arr_i32("t.arr.i32").unwrap(), vec![i32::MIN, -1, 0, i32::MAX]);
    assert_eq!(f.get_arr_f32("t.arr.f32").unwrap()[2], f32::INFINITY);
    assert_eq!(f.get_arr_bool("t.arr.bool").unwrap(), vec![true, false, true]);
    assert_eq!(f.get_arr_str("t.arr.str").unwrap(), vec!["a", "", "ünï", "x y\"z"]);
    assert_eq!(f.get_arr_u64("t.arr.u64").unwrap(), vec![0, u64::MAX]);
    assert_eq!(f.get_arr_i64("t.arr.i64").unwrap(), vec![i64::MIN, 42]);
    assert_eq!(f.get_arr_f64("t.arr.f64").unwrap(), vec![-2.5, 1e300]);
    assert!(f.get_arr_u32("t.arr.empty_u32").unwrap().is_empty());
    let toks = f.get_arr_str("tokenizer.ggml.tokens").unwrap();
    assert_eq!((toks.len(), toks[999]), (1000, "tok999"));
    assert_eq!(f.get_arr_of::<&str>("tokenizer.ggml.tokens").unwrap()[5], "tok5");
    assert_eq!(f.get_uint("t.u8").unwrap(), 200);
    assert_eq!(f.get_uint("t.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_uint("general.alignment").unwrap(), 64);

    // Nested arrays.
    let n = f.get_arr("t.arr.nested3").unwrap();
    assert_eq!((n.elem_type(), n.len()), (ValueType::Array, 2));
    let inner = n.get(0).unwrap().as_array().unwrap();
    assert_eq!(inner.get(1).unwrap().as_array().unwrap().to_vec::<i32>().unwrap(), vec![2, 3]);
    assert!(n.get(1).unwrap().as_array().unwrap().is_empty());
    assert!(n.get(2).is_none());
    let m = f.get_arr("t.arr.nested_mixed").unwrap();
    let types: Vec<ValueType> = m.iter().map(|v| v.as_array().unwrap().elem_type()).collect();
    assert_eq!(types, vec![ValueType::U8, ValueType::String, ValueType::F64]);
    assert!(matches!(m.get(1).unwrap().as_array().unwrap().get(0), Some(Value::String("x"))));

    // Errors name the key and the type found.
    let d = gguf_detail(f.get_u32("t.u8"), "acc.gguf");
    assert!(d.contains("\"t.u8\"") && d.contains("is u8") && d.contains("not u32"), "{d}");
    let d = gguf_detail(f.get_str("t.arr.str"), "acc.gguf");
    assert!(d.contains("\"t.arr.str\"") && d.contains("arr[str]"), "{d}");
    let d = gguf_detail(f.get_arr_u32("t.arr.i32"), "acc.gguf");
    assert!(d.contains("arr[i32]") && d.contains("not arr[u32]"), "{d}");
    let d = gguf_detail(f.get_arr("t.f64"), "acc.gguf");
    assert!(d.contains("\"t.f64\"") && d.contains("is f64"), "{d}");
    let d = gguf_detail(f.get_f32("no.such.key"), "acc.gguf");
    assert!(d.contains("\"no.such.key\"") && d.contains("not found"), "{d}");
    let d = gguf_detail(f.get_uint("t.i64"), "acc.gguf");
    assert!(d.contains("\"t.i64\"") && d.contains("non-negative"), "{d}");
    let d = gguf_detail(f.get_uint("t.str"), "acc.gguf");
    assert!(d.contains("is str"), "{d}");
    let d = gguf_detail(f.tensor("no.such.tensor"), "acc.gguf");
    assert!(d.contains("\"no.such.tensor\"") && d.contains("not found"), "{d}");
    assert!(f.get("no.such.key").is_none() && !f.contains_key("no.such.key") && f.contains_key("t.u8"));
    assert_eq!(f.keys().count(), f.n_kv());
    assert_eq!(f.iter_tensors().count(), 7);
    assert_eq!(ValueType::from_id(13), None);
    assert_eq!(ALL_VALUE_TYPES.iter().map(|t| t.id()).collect::<Vec<_>>(), (0..13).collect::<Vec<_>>());
}

#[test]
fn default_alignment_zero_size_tensors_and_no_tensors() {
    // No general.alignment: 32. A 0-byte tensor and a 0-dim (scalar) tensor.
    let mut w = GgufWriter::new();
    w.add_kv("a", 1u32).unwrap();
    w.add_tensor("empty", GgmlType::F32, &[0, 5]).unwrap();
    w.add_tensor("scalar", GgmlType::F32, &[]).unwrap();
    w.add_tensor("v", GgmlType::F16, &[3]).unwrap();
    assert_eq!(w.tensors()[1].offset, 0);
    assert_eq!(w.tensors()[2].offset, 32);
    let mut st = w.clone().begin(Vec::new()).unwrap();
    assert_eq!(st.next_tensor().unwrap().name, "scalar");
    st.write_tensor("empty", &[]).unwrap();
    st.write_tensor("scalar", &1.0f32.to_le_bytes()).unwrap();
    st.write_tensor("v", &[1, 2, 3, 4, 5, 6]).unwrap();
    let bytes = st.finish().unwrap();
    assert_eq!(bytes.len() % 32, 0);
    let f = GgufFile::from_bytes(bytes, "z.gguf").unwrap();
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.tensor("empty").unwrap().data.len(), 0);
    assert_eq!(f.tensor("scalar").unwrap().info.n_dims, 0);
    assert_eq!(f.tensor("scalar").unwrap().info.ne, [1, 1, 1, 1]);
    assert_eq!(f.tensor("v").unwrap().data, &[1, 2, 3, 4, 5, 6]);

    // Metadata only.
    let mut w = GgufWriter::new();
    w.add_kv("general.name", "m").unwrap();
    let bytes = w.write_to(Vec::new(), |_, _| Ok(())).unwrap();
    let f = GgufFile::from_bytes(bytes.clone(), "m.gguf").unwrap();
    assert_eq!((f.tensors().len(), f.get_str("general.name").unwrap()), (0, "m"));
    // Without the trailing padding too (ggml accepts it: nothing to read there).
    let end = 24 + 8 + 12 + 4 + 8 + 1;
    assert_eq!(bytes.len(), 64);
    assert!(GgufFile::from_bytes(bytes[..end].to_vec(), "m.gguf").is_ok());
}

#[test]
fn writer_rejects_bad_requests() {
    let w0 = GgufWriter::new();
    let mut w = w0.clone();
    w.add_kv("k", 1u8).unwrap();
    assert!(gguf_detail(w.add_kv("k", 2u8), "<writer>").contains("duplicate metadata key \"k\""));
    assert!(gguf_detail(w.add_kv("", 2u8), "<writer>").contains("empty"));
    assert!(gguf_detail(w.add_kv("general.alignment", 64u64), "<writer>").contains("must be u32"));
    assert!(gguf_detail(w.add_kv("general.alignment", 48u32), "<writer>").contains("power of two"));
    assert!(gguf_detail(w.set_alignment(0), "<writer>").contains("power of two"));
    assert!(gguf_detail(w.set_version(1), "<writer>").contains("version 1"));
    let mut deep = MetaArray::U8(vec![1]);
    for _ in 0..16 {
        deep = MetaArray::Array(vec![deep]);
    }
    assert!(gguf_detail(w.add_kv("deep", deep), "<writer>").contains("nested 17 deep"));
    w.add_tensor("t", GgmlType::Q8_0, &[32]).unwrap();
    assert!(gguf_detail(w.add_tensor("t", GgmlType::F32, &[1]), "<writer>").contains("duplicate tensor name"));
    assert!(gguf_detail(w.add_tensor("q", GgmlType::Q8_0, &[33]), "<writer>").contains("block size 32"));
    assert!(gguf_detail(w.add_tensor("q", GgmlType::F32, &[1, 1, 1, 1, 1]), "<writer>").contains("5 dims"));
    assert!(gguf_detail(w.add_tensor("q", GgmlType::F32, &[-1]), "<writer>").contains("negative"));
    assert!(gguf_detail(w.add_tensor(&"n".repeat(65), GgmlType::F32, &[1]), "<writer>").contains("65 bytes"));
    assert!(gguf_detail(w.add_tensor("big", GgmlType::F32, &[i64::MAX, 2]), "<writer>").contains("overflow"));
    w.add_tensor("u", GgmlType::F32, &[2]).unwrap();

    // Too many bytes, wrong order, too few.
    let mut st = w.clone().begin(Vec::new()).unwrap();
    assert!(gguf_detail(st.write_data(&[0; 35]), "<writer>").contains("\"t\""));
    assert!(gguf_detail(st.write_tensor("u", &[0; 8]), "<writer>").contains("\"t\" is expected next"));
    st.write_data(&[0; 30]).unwrap();
    assert_eq!(st.remaining_in_tensor(), 4);
    assert!(gguf_detail(st.finish(), "<writer>").contains("30 of 34 bytes"));
    let r = w.clone().write_to(Vec::new(), |_, sink| sink.put(&[1, 2]));
    assert!(gguf_detail(r, "<writer>").contains("wrote 2 of 34 bytes"));
    let r = w.clone().write_to(Vec::new(), |_, sink| {
        // The io error is kept and returned as the writer's error.
        let _ = sink.write_all(&[0; 40]);
        Ok(())
    });
    assert!(gguf_detail(r, "<writer>").contains("40 bytes written with 34 left"));
    let mut st = w.begin(Vec::new()).unwrap();
    st.write_tensor("t", &[0; 34]).unwrap();
    st.write_tensor("u", &[0; 8]).unwrap();
    assert!(gguf_detail(st.write_data(&[0]), "<writer>").contains("after the last tensor"));
    let _ = w0;
}

// ------------------------------------------------------- hand-made bytes

/// A GGUF encoder written independently of the crate's writer, for
/// hand-crafted (and deliberately broken) files.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.0.extend_from_slice(b"GGUF");
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).raw(s.as_bytes())
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.str(k).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad(&mut self, a: usize) -> &mut Self {
        while self.0.len() % a != 0 {
            self.0.push(0);
        }
        self
    }
}

/// A small valid v3 file: 2 entries, 2 F32 tensors ([4], [3, 2]) whose data
/// ends exactly at the end of the file (no trailing padding).
fn small_file(version: u32) -> Vec<u8> {
    let mut r = Raw::header(version, 2, 2);
    r.kv_u32("k.u32", 7).str("k.s").u32(8).str("ab");
    r.tensor("a", &[4], 0, 0).tensor("b", &[3, 2], 0, 32);
    r.pad(32);
    r.raw(&f32_bytes(&[1., 2., 3., 4.])).pad(32).raw(&f32_bytes(&[5., 6., 7., 8., 9., 10.]));
    r.0
}

#[test]
fn hand_crafted_v2_and_v3_files_read() {
    for v in [2, 3] {
        let b = small_file(v);
        let f = GgufFile::from_bytes(b.clone(), "h.gguf").unwrap();
        assert_eq!(f.version(), v);
        assert_eq!(f.get_u32("k.u32").unwrap(), 7);
        assert_eq!(f.get_str("k.s").unwrap(), "ab");
        assert_eq!(f.tensor("a").unwrap().data, &f32_bytes(&[1., 2., 3., 4.])[..]);
        assert_eq!(f.tensor("b").unwrap().info.ne, [3, 2, 1, 1]);
        assert_eq!(f.tensor("b").unwrap().data, &f32_bytes(&[5., 6., 7., 8., 9., 10.])[..]);
        assert_eq!(f.tensor("b").unwrap().file_offset, b.len() - 24);
    }
}

#[test]
fn every_truncation_is_an_error() {
    let b = small_file(3);
    for len in 0..b.len() {
        let r = GgufFile::from_bytes(b[..len].to_vec(), "trunc.gguf");
        let d = gguf_detail(r, "trunc.gguf");
        assert!(d.contains("unexpected end") || d.contains("past the end") || d.contains("left"), "length {len}: {d}");
    }
    // A file from our writer: every prefix shorter than the last tensor's end fails.
    let s = sample(true);
    let full = write_mem(writer_for(&s), &data_map(&s));
    let f = GgufFile::from_bytes(full.clone(), "x").unwrap();
    let end = f.iter_tensors().map(|t| t.file_offset + t.data.len()).max().unwrap();
    for len in (0..full.len()).step_by(13).chain(end - 3..end) {
        let r = GgufFile::from_bytes(full[..len].to_vec(), "x");
        assert_eq!(r.is_ok(), len >= end, "length {len}");
    }
}

#[test]
fn malformed_headers() {
    let mut b = small_file(3);
    b[3] = b'G';
    expect_bad(b, &["bad magic", "GGUG"]);
    expect_bad(small_file(1), &["version 1 is not supported"]);
    expect_bad(small_file(99), &["version 99 is not supported"]);
    expect_bad(small_file(0), &["version 0"]);
    expect_bad(small_file(0x0300_0000), &["big-endian"]);
    // Counts beyond what the file can hold, including u64::MAX.
    expect_bad(Raw::header(3, 0, u64::MAX).0, &["metadata count 18446744073709551615"]);
    expect_bad(Raw::header(3, u64::MAX, 0).0, &["tensor count 18446744073709551615"]);
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).raw(b"key").raw(&[0; 32]);
    expect_bad(r.0, &["the key of metadata entry 0", "length 18446744073709551615"]);
    let mut r = Raw::header(3, 0, 1);
    r.str("").u32(0).raw(&[1]);
    expect_bad(r.0, &["empty key"]);
    let mut r = Raw::header(3, 0, 1);
    r.u64(2).raw(&[0xff, 0xfe]).u32(0).raw(&[1]);
    expect_bad(r.0, &["not UTF-8"]);
}

#[test]
fn malformed_metadata() {
    let one = |f: &dyn Fn(&mut Raw) -> &mut Raw| {
        let mut r = Raw::header(3, 0, 1);
        f(&mut r);
        r.0
    };
    // String and array lengths of u64::MAX.
    expect_bad(one(&|r| r.str("k").u32(8).u64(u64::MAX).raw(b"abc")), &["\"k\"", "length 18446744073709551615"]);
    expect_bad(one(&|r| r.str("k").u32(9).u32(4).u64(u64::MAX).raw(&[0; 16])), &["\"k\"", "18446744073709551615"]);
    expect_bad(one(&|r| r.str("k").u32(9).u32(8).u64(u64::MAX).raw(&[0; 16])), &["\"k\"", "18446744073709551615"]);
    expect_bad(one(&|r| r.str("k").u32(9).u32(9).u64(u64::MAX).raw(&[0; 16])), &["\"k\"", "18446744073709551615"]);
    // A string element with an absurd length inside an array.
    expect_bad(one(&|r| r.str("k").u32(9).u32(8).u64(2).str("ok").u64(u64::MAX / 2)), &["string element 1"]);
    // Unknown value types, at top level and as array element type.
    expect_bad(one(&|r| r.str("k").u32(13).u32(0)), &["\"k\"", "unknown value type id 13"]);
    expect_bad(one(&|r| r.str("k").u32(9).u32(77).u64(0)), &["\"k\"", "unknown element type id 77"]);
    // Bools other than 0/1.
    expect_bad(one(&|r| r.str("k").u32(7).raw(&[2])), &["\"k\"", "bool", "is 2"]);
    expect_bad(one(&|r| r.str("k").u32(9).u32(7).u64(3).raw(&[1, 0, 5])), &["\"k\"", "element 2", "is 5"]);
    // Nesting deeper than allowed.
    expect_bad(
        one(&|r| {
            r.str("k").u32(9);
            for _ in 0..40 {
                r.u32(9).u64(1);
            }
            r.u32(0).u64(0)
        }),
        &["\"k\"", "nested more than 16"],
    );
    // Duplicate keys.
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("k", 1).kv_u32("k", 2);
    expect_bad(r.0, &["duplicate key \"k\""]);
    // general.alignment: wrong type, not a power of two.
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(10).u64(64);
    expect_bad(r.0, &["\"general.alignment\" is u64, must be u32"]);
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 48);
    expect_bad(r.0, &["alignment 48 is not a power of two"]);
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 0);
    expect_bad(r.0, &["alignment 0 is not a power of two"]);
}

#[test]
fn malformed_tensor_infos() {
    let file = |f: &dyn Fn(&mut Raw) -> &mut Raw, n: u64| {
        let mut r = Raw::header(3, n, 0);
        f(&mut r);
        r.pad(32).raw(&[0; 256]);
        r.0
    };
    expect_bad(file(&|r| r.tensor("t", &[4], 0, 1 << 20), 1), &["\"t\"", "past the end"]);
    expect_bad(file(&|r| r.tensor("t", &[4], 0, u64::MAX - 31), 1), &["\"t\"", "past the end"]);
    expect_bad(file(&|r| r.tensor("t", &[u64::MAX / 2, 4], 0, 0), 1), &["\"t\"", "overflows"]);
    expect_bad(file(&|r| r.tensor("t", &[1 << 31, 1 << 30], 28, 0), 1), &["\"t\"", "more bytes than fit"]);
    expect_bad(file(&|r| r.tensor("t", &[u64::MAX], 0, 0), 1), &["\"t\"", "exceeds i64::MAX"]);
    expect_bad(file(&|r| r.tensor("t", &[4], 77, 0), 1), &["\"t\"", "unknown ggml type id 77"]);
    expect_bad(
        file(&|r| r.tensor("t", &[256], 31, 0), 1),
        &["\"t\"", "31 (q4_0_4_4 (removed from GGUF))", "not supported"],
    );
    expect_bad(file(&|r| r.tensor("t", &[33], 8, 0), 1), &["\"t\"", "not a multiple", "block size 32"]);
    expect_bad(file(&|r| r.tensor("t", &[1, 1, 1, 1, 1], 0, 0), 1), &["\"t\"", "5 dimensions (at most 4)"]);
    expect_bad(file(&|r| r.str("t").u32(u32::MAX), 1), &["\"t\"", "4294967295 dimensions"]);
    expect_bad(file(&|r| r.tensor("t", &[4], 0, 8), 1), &["\"t\"", "offset 8 is not a multiple of the alignment 32"]);
    expect_bad(
        file(&|r| r.tensor("t", &[4], 0, 0).tensor("t", &[4], 0, 32), 2),
        &["duplicate tensor name \"t\" (tensors 0 and 1)"],
    );
    expect_bad(file(&|r| r.tensor(&"x".repeat(65), &[4], 0, 0), 1), &["65 bytes long"]);
    expect_bad(file(&|r| r.u64(u64::MAX), 1), &["the name of tensor 0", "18446744073709551615"]);
    // A 64-byte name is fine.
    assert!(GgufFile::from_bytes(file(&|r| r.tensor(&"x".repeat(64), &[4], 0, 0), 1), "ok").is_ok());
    // Every type of ggml 0.25.3 reads, with its block size and row bytes.
    for ty in shardgraph::tensor::ALL_TYPES {
        let n = 2 * ty.block_size() as u64;
        let mut r = Raw::header(3, 1, 0);
        r.tensor("t", &[n], ty.id(), 0).pad(32).raw(&[0; 1024]);
        let f = GgufFile::from_bytes(r.0, "types.gguf").unwrap();
        let t = f.tensor("t").unwrap();
        assert_eq!((t.info.ty, t.info.ne[0], t.data.len()), (ty, n as i64, 2 * ty.type_size()), "{ty}");
    }
    // Data section start past the end of the file.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[0], 0, 0);
    expect_bad(r.0, &["data section starts at byte 64", "past the end"]);
    // With a custom alignment: offsets must be multiples of it.
    let mut r = Raw::header(3, 1, 1);
    r.kv_u32("general.alignment", 64).tensor("t", &[4], 0, 32).pad(64).raw(&[0; 128]);
    expect_bad(r.0, &["offset 32 is not a multiple of the alignment 64"]);
    // Missing files name the path.
    let d = gguf_detail(GgufFile::open("/nonexistent/x.gguf"), "/nonexistent/x.gguf");
    assert!(d.contains("cannot open"), "{d}");
}

// ------------------------------------------------------ allocation bound

/// Counts this thread's live heap bytes and their peak, so a test can check
/// what parsing allocates (other test threads do not disturb the count).
struct Counting;

thread_local! {
    static LIVE: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
    static PEAK: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}

fn track(delta: isize) {
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

// SAFETY: forwards to the system allocator; only adds bookkeeping.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: our caller meets `GlobalAlloc::alloc`'s contract (`l` has a non-zero size),
        // which is all `System.alloc` needs.
        let p = unsafe { std::alloc::System.alloc(l) };
        if !p.is_null() {
            track(l.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        // SAFETY: our caller meets `GlobalAlloc::alloc_zeroed`'s contract (`l` has a non-zero
        // size), which is all `System.alloc_zeroed` needs.
        let p = unsafe { std::alloc::System.alloc_zeroed(l) };
        if !p.is_null() {
            track(l.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
        // SAFETY: `p` was allocated with layout `l` by this allocator, i.e. by `System`
        // (every method forwards to it), as `GlobalAlloc::dealloc` requires of our caller.
        unsafe { std::alloc::System.dealloc(p, l) };
        track(-(l.size() as isize));
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        // SAFETY: `p` came from `System` with layout `l` (every method forwards to it) and
        // `new` is a valid non-zero size for `l`'s alignment, as `GlobalAlloc::realloc`
        // requires of our caller.
        let q = unsafe { std::alloc::System.realloc(p, l, new) };
        if !q.is_null() {
            track(new as isize - l.size() as isize);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak bytes allocated (beyond what was live before) while parsing `bytes`,
/// and whether it parsed.
fn parse_peak(bytes: Vec<u8>) -> (usize, bool) {
    let base = LIVE.with(|l| l.get());
    PEAK.with(|p| p.set(base));
    let r = GgufFile::from_bytes(bytes, "alloc.gguf");
    let ok = r.is_ok();
    let peak = PEAK.with(|p| p.get()) - base;
    drop(r);
    (peak.max(0) as usize, ok)
}

#[test]
fn parsing_allocates_a_bounded_multiple_of_the_file_size() {
    let mut cases: Vec<(&str, Vec<u8>, bool)> = Vec::new();
    // 100k tiny entries.
    let n = 100_000u64;
    let mut r = Raw::header(3, 0, n);
    for i in 0..n {
        r.str(&format!("{i:x}")).u32(0).raw(&[1]);
    }
    cases.push(("tiny entries", r.0, true));
    // One array of 200k empty arrays, one of 200k empty strings, one of 200k bools.
    let mut r = Raw::header(3, 0, 3);
    r.str("nested").u32(9).u32(9).u64(200_000);
    for _ in 0..200_000 {
        r.u32(0).u64(0);
    }
    r.str("strs").u32(9).u32(8).u64(200_000);
    for _ in 0..200_000 {
        r.u64(0);
    }
    r.str("bools").u32(9).u32(7).u64(200_000).raw(&vec![1; 200_000]);
    cases.push(("big arrays", r.0, true));
    // 50k empty tensors with short names.
    let n = 50_000u64;
    let mut r = Raw::header(3, n, 0);
    for i in 0..n {
        r.tensor(&format!("{i:x}"), &[0], 0, 0);
    }
    r.pad(32);
    cases.push(("tiny tensors", r.0, true));
    // Counts that claim as much as the file could hold, then garbage.
    let mut r = Raw::header(3, 0, 1_000_000 / 13);
    r.raw(&vec![0xff; 1_000_000]);
    cases.push(("lying kv count", r.0, false));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(9).u64(1_000_000 / 12).raw(&vec![0xff; 1_000_000]);
    cases.push(("lying nested count", r.0, false));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(8).u64(1_000_000 / 8).raw(&vec![0xff; 1_000_000]);
    cases.push(("lying string count", r.0, false));
    let mut r = Raw::header(3, 1_000_000 / 24, 0);
    r.raw(&vec![0xff; 1_000_000]);
    cases.push(("lying tensor count", r.0, false));
    for (what, bytes, parses) in cases {
        let len = bytes.len();
        let (peak, ok) = parse_peak(bytes);
        assert_eq!(ok, parses, "{what}");
        println!("gguf alloc: {what}: file {len} bytes, peak {peak} bytes ({:.2}x)", peak as f64 / len as f64);
        assert!(peak <= 4 * len + 4096, "{what}: {peak} bytes allocated for a {len}-byte file");
    }
}

// ------------------------------------------------------- property testing

/// Reads everything a parsed file offers (all values, every typed getter on
/// every key, all tensors' bytes); must not panic.
fn exercise(f: &GgufFile) -> usize {
    fn walk(v: Value<'_>, n: &mut usize) {
        *n += 1;
        if let Value::Array(a) = v {
            for x in a.iter() {
                walk(x, n);
            }
            let _ = a.to_owned_array();
        }
    }
    let mut n = 0;
    let keys: Vec<String> = f.keys().map(str::to_string).collect();
    for (_, v) in f.kvs() {
        walk(v, &mut n);
        let _ = v.to_owned_value();
    }
    for k in &keys {
        n += f.get_u8(k).is_ok() as usize + f.get_u32(k).is_ok() as usize + f.get_str(k).is_ok() as usize;
        n += f.get_f64(k).is_ok() as usize + f.get_uint(k).is_ok() as usize + f.get_arr_str(k).is_ok() as usize;
        n += f.get_arr_u32(k).is_ok() as usize + f.get_arr_bool(k).is_ok() as usize;
    }
    for t in f.iter_tensors() {
        n += t.data.iter().map(|&b| b as usize).sum::<usize>() % 2;
        assert_eq!(t.data.len(), t.info.nbytes);
    }
    n
}

fn prop_config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let rng_seed = match std::env::var("PROPTEST_RNG_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(seed) => proptest::test_runner::RngSeed::Fixed(seed),
        None => proptest::test_runner::RngSeed::Fixed(0x4747_5546),
    };
    ProptestConfig { cases, failure_persistence: None, rng_seed, ..ProptestConfig::default() }
}

/// A small valid file with every kind of structure the parser handles.
fn base_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_kv("a.u32", 5u32).unwrap();
    w.add_kv("a.str", "hello").unwrap();
    w.add_kv("a.strs", vec!["x", "yy", ""]).unwrap();
    w.add_kv("a.f32s", vec![1.0f32, 2.0]).unwrap();
    w.add_kv("a.bools", vec![true, false]).unwrap();
    w.add_kv("a.nested", vec![MetaArray::U16(vec![1, 2]), MetaArray::String(vec!["q".into()])]).unwrap();
    w.add_kv("a.i64", -5i64).unwrap();
    w.set_alignment(16).unwrap();
    w.add_tensor("t0", GgmlType::F32, &[3, 2]).unwrap();
    w.add_tensor("t1", GgmlType::Q8_0, &[32]).unwrap();
    w.write_to(Vec::new(), |i, s| s.put(&vec![0x3c; i.nbytes])).unwrap()
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    /// Overwrites 8 bytes at a position with an interesting count/length.
    Word(usize, u64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let interesting = prop_oneof![
        Just(0u64),
        Just(1),
        Just(4),
        Just(9),
        Just(13),
        Just(64),
        Just(u32::MAX as u64),
        Just(u64::MAX),
        Just(u64::MAX / 8),
        Just(1 << 62),
        any::<u64>()
    ];
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(p, x)| Mutation::Flip(p, x)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..12)).prop_map(|(p, b)| Mutation::Insert(p, b)),
        (any::<usize>(), 1usize..16).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (any::<usize>(), interesting).prop_map(|(p, v)| Mutation::Word(p, v)),
    ]
}

fn apply(b: &mut Vec<u8>, m: &Mutation) {
    let n = b.len().max(1);
    match m {
        Mutation::Flip(p, x) => {
            if !b.is_empty() {
                b[p % n] ^= x;
            }
        }
        Mutation::Truncate(p) => b.truncate(p % n),
        Mutation::Insert(p, bytes) => {
            let at = p % (b.len() + 1);
            b.splice(at..at, bytes.iter().copied());
        }
        Mutation::Delete(p, k) => {
            let at = p % n;
            let end = (at + k).min(b.len());
            if at < end {
                b.drain(at..end);
            }
        }
        Mutation::Word(p, v) => {
            if b.len() >= 8 {
                let at = p % (b.len() - 7);
                b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

proptest! {
    #![proptest_config(prop_config())]

    #[test]
    fn mutated_files_never_panic(muts in proptest::collection::vec(mutation(), 1..6)) {
        let mut b = base_file();
        for m in &muts {
            apply(&mut b, m);
        }
        if let Ok(f) = GgufFile::from_bytes(b, "mut.gguf") {
            exercise(&f);
        }
    }
}

#[test]
fn base_file_is_valid_and_exercised() {
    let f = GgufFile::from_bytes(base_file(), "base.gguf").unwrap();
    assert!(exercise(&f) > 10);
    assert_eq!(f.alignment(), 16);
}

// ------------------------------------------------------ reference checks

/// Prints every value, tensor info and tensor hash of a GGUF file as JSON
/// lines, read with the reference readers: `dump` with the `gguf` package's
/// `GGUFReader`, `ggml_dump` with ggml's `gguf_init_from_file` (ctypes on
/// the oracle's libggml-base.so). `write` writes a file with the `gguf`
/// package's `GGUFWriter`.
const SCRIPT: &str = r#"
import json, struct, sys

NAMES = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"]
FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<I", 7: "<B", 10: "<Q", 11: "<q", 12: "<Q"}

def fnv(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h

def line(obj):
    print(json.dumps(obj, separators=(",", ":"), ensure_ascii=True))

def scalar(t, raw):
    v = struct.unpack(FMT[t], raw)[0]
    if t == 6:
        return "0x%08x" % v
    if t == 12:
        return "0x%016x" % v
    if t == 7:
        return v != 0
    return v

def size_of(t):
    return struct.calcsize(FMT[t])

def py_value(parts, i, t):
    # Rebuilds a value from GGUFReader's field parts (nested arrays included).
    if t == 8:
        return parts[i + 1].tobytes().decode("utf-8"), i + 2
    if t == 9:
        et = int(parts[i][0]); n = int(parts[i + 1][0]); i += 2
        items = []
        for _ in range(n):
            v, i = py_value(parts, i, et)
            items.append(v)
        return {"e": NAMES[et], "v": items}, i
    return scalar(t, parts[i].tobytes()), i + 1

def dump(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    fields = [f for f in r.fields.values() if not f.name.startswith("GGUF.")]
    version = int(r.fields["GGUF.version"].parts[0][0])
    line({"version": version, "n_tensors": len(r.tensors), "n_kv": len(fields),
          "alignment": int(r.alignment), "data_offset": int(r.data_offset)})
    for f in fields:
        t = int(f.types[0])
        v, _ = py_value(f.parts, 3, t)
        line({"key": f.name, "t": NAMES[t], "v": v})
    for t in r.tensors:
        line({"tensor": t.name, "type": int(t.tensor_type), "ne": [int(x) for x in t.shape],
              "offset": int(t.data_offset) - int(r.data_offset), "nbytes": int(t.n_bytes),
              "hash": fnv(t.data.tobytes())})

def ggml_dump(path):
    import ctypes as C, os, ggml
    lib = C.CDLL(os.path.join(os.path.dirname(ggml.__file__), "lib", "libggml-base.so"))
    class Params(C.Structure):
        _fields_ = [("no_alloc", C.c_bool), ("ctx", C.POINTER(C.c_void_p))]
    f = lib.gguf_init_from_file
    f.restype = C.c_void_p; f.argtypes = [C.c_char_p, Params]
    gctx = C.c_void_p()
    ctx = f(path.encode(), Params(True, C.pointer(gctx)))
    if not ctx:
        line({"error": "ggml rejected the file"}); return
    def fn(name, res, *args):
        g = getattr(lib, name); g.restype = res; g.argtypes = [C.c_void_p] + list(args); return g
    n_kv = fn("gguf_get_n_kv", C.c_int64)(ctx)
    n_t = fn("gguf_get_n_tensors", C.c_int64)(ctx)
    line({"version": fn("gguf_get_version", C.c_uint32)(ctx), "n_tensors": n_t, "n_kv": n_kv,
          "alignment": fn("gguf_get_alignment", C.c_size_t)(ctx),
          "data_offset": fn("gguf_get_data_offset", C.c_size_t)(ctx)})
    key = fn("gguf_get_key", C.c_char_p, C.c_int64)
    kv_type = fn("gguf_get_kv_type", C.c_int, C.c_int64)
    arr_type = fn("gguf_get_arr_type", C.c_int, C.c_int64)
    arr_n = fn("gguf_get_arr_n", C.c_size_t, C.c_int64)
    arr_data = fn("gguf_get_arr_data", C.c_void_p, C.c_int64)
    arr_str = fn("gguf_get_arr_str", C.c_char_p, C.c_int64, C.c_size_t)
    val_str = fn("gguf_get_val_str", C.c_char_p, C.c_int64)
    val_data = fn("gguf_get_val_data", C.c_void_p, C.c_int64)
    for i in range(n_kv):
        t = kv_type(ctx, i)
        if t == 9:
            et = arr_type(ctx, i); n = arr_n(ctx, i)
            if et == 8:
                items = [arr_str(ctx, i, j).decode("utf-8") for j in range(n)]
            else:
                sz = size_of(et)
                raw = C.string_at(arr_data(ctx, i), n * sz) if n else b""
                items = [scalar(et, raw[j * sz:(j + 1) * sz]) for j in range(n)]
            v = {"e": NAMES[et], "v": items}
        elif t == 8:
            v = val_str(ctx, i).decode("utf-8")
        else:
            v = scalar(t, C.string_at(val_data(ctx, i), size_of(t)))
        line({"key": key(ctx, i).decode("utf-8"), "t": NAMES[t], "v": v})
    get_tensor = lib.ggml_get_tensor; get_tensor.restype = C.c_void_p; get_tensor.argtypes = [C.c_void_p, C.c_char_p]
    data = open(path, "rb").read()
    base = fn("gguf_get_data_offset", C.c_size_t)(ctx)
    for i in range(n_t):
        name = fn("gguf_get_tensor_name", C.c_char_p, C.c_int64)(ctx, i)
        off = fn("gguf_get_tensor_offset", C.c_size_t, C.c_int64)(ctx, i)
        size = fn("gguf_get_tensor_size", C.c_size_t, C.c_int64)(ctx, i)
        ty = fn("gguf_get_tensor_type", C.c_int, C.c_int64)(ctx, i)
        t = get_tensor(gctx, name)
        ne = list((C.c_int64 * 4).from_address(t + 16))
        line({"tensor": name.decode("utf-8"), "type": ty, "ne": ne, "offset": off, "nbytes": size,
              "hash": fnv(data[base + off:base + off + size])})

def write(path):
    import numpy as np
    from gguf import GGUFWriter, GGUFValueType as VT, GGMLQuantizationType as QT
    w = GGUFWriter(path, "pyarch")
    w.add_uint8("p.u8", 250); w.add_int8("p.i8", -7); w.add_uint16("p.u16", 65535)
    w.add_int16("p.i16", -32768); w.add_uint32("p.u32", 4294967295); w.add_int32("p.i32", -5)
    w.add_float32("p.f32", 0.1); w.add_bool("p.bool", True); w.add_string("p.str", "gguf ✓ \"py\"")
    w.add_key_value("p.str.empty", "", VT.STRING)
    w.add_uint64("p.u64", 2**64 - 1); w.add_int64("p.i64", -2**63); w.add_float64("p.f64", -1e-300)
    for t, vals in [(VT.UINT8, [1, 2, 255]), (VT.INT8, [-1, 1]), (VT.UINT16, [9, 65535]), (VT.INT16, [-9]),
                    (VT.UINT32, [1, 2, 3]), (VT.INT32, [-1, 2]), (VT.FLOAT32, [0.5, -0.0, 3.25]),
                    (VT.BOOL, [True, False]), (VT.STRING, ["a", "", "βγ"]), (VT.UINT64, [2**63]),
                    (VT.INT64, [-3, 3]), (VT.FLOAT64, [1.5, -2.0])]:
        w.add_key_value("p.arr." + NAMES[int(t)], vals, VT.ARRAY, sub_type=t)
    w.add_array("p.tokens", ["t%d" % i for i in range(300)])
    w.add_key_value("p.nested", [[1, 2, 3], [4]], VT.ARRAY)
    w.add_key_value("p.nested_str", [["x", "y"], ["z"]], VT.ARRAY)
    w.add_key_value("p.nested_mixed", [[1, 2], ["s"], [True]], VT.ARRAY)
    w.add_key_value("p.nested3", [[[1], [2, 3]], [[4]]], VT.ARRAY)
    rng = np.random.default_rng(1234)
    w.add_tensor("f32", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 2, 32)).astype(np.float16))
    w.add_tensor("i32", np.arange(7, dtype=np.int32))
    w.add_tensor("q8_0", rng.integers(0, 256, (4, 2 * 34), dtype=np.uint8), raw_dtype=QT.Q8_0)
    w.add_tensor("q4_k", rng.integers(0, 256, (2, 144), dtype=np.uint8), raw_dtype=QT.Q4_K)
    w.add_tensor("q6_k", rng.integers(0, 256, (3, 2 * 210), dtype=np.uint8), raw_dtype=QT.Q6_K)
    w.add_tensor("f32_4d", rng.standard_normal((2, 3, 4, 8)).astype(np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

if __name__ == "__main__":
    {"dump": dump, "ggml_dump": ggml_dump, "write": write}[sys.argv[1]](sys.argv[2])
"#;

/// A JSON string as Python's `json.dumps(ensure_ascii=True)` writes it.
fn jstr(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            '\u{8}' => o.push_str("\\b"),
            '\u{c}' => o.push_str("\\f"),
            ' '..='~' => o.push(c),
            _ => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    o.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    o.push('"');
    o
}

/// A value as the script prints it (floats as their bits).
fn jval(v: Value<'_>) -> String {
    match v {
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => format!("\"0x{:08x}\"", x.to_bits()),
        Value::F64(x) => format!("\"0x{:016x}\"", x.to_bits()),
        Value::Bool(b) => b.to_string(),
        Value::String(s) => jstr(s),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(jval).collect();
            format!("{{\"e\":\"{}\",\"v\":[{}]}}", a.elem_type(), items.join(","))
        }
    }
}

/// Our reader's view of a file in the script's format. `full_ne` prints all
/// four `ne` (ggml's reader does not keep `n_dims`), else `n_dims` of them.
fn our_dump(f: &GgufFile, full_ne: bool) -> Vec<String> {
    let mut out = vec![format!(
        "{{\"version\":{},\"n_tensors\":{},\"n_kv\":{},\"alignment\":{},\"data_offset\":{}}}",
        f.version(),
        f.tensors().len(),
        f.n_kv(),
        f.alignment(),
        f.data_offset()
    )];
    for (k, v) in f.kvs() {
        out.push(format!("{{\"key\":{},\"t\":\"{}\",\"v\":{}}}", jstr(k), v.value_type(), jval(v)));
    }
    for t in f.iter_tensors() {
        let ne = if full_ne { &t.info.ne[..] } else { &t.info.ne[..t.info.n_dims as usize] };
        let ne: Vec<String> = ne.iter().map(|d| d.to_string()).collect();
        out.push(format!(
            "{{\"tensor\":{},\"type\":{},\"ne\":[{}],\"offset\":{},\"nbytes\":{},\"hash\":\"{}\"}}",
            jstr(&t.info.name),
            t.info.ty.id(),
            ne.join(","),
            t.info.offset,
            t.info.nbytes,
            fnv(t.data)
        ));
    }
    out
}

/// `.venv/bin/python` with `gguf==0.19.0` importable, or why not.
fn reference_python() -> Result<PathBuf, String> {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv").join("bin").join("python");
    if !py.exists() {
        return Err(format!("{} not found (run ./scripts/setup.sh)", py.display()));
    }
    let out = Command::new(&py)
        .args(["-c", "import importlib.metadata as m, gguf; print(m.version('gguf'))"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", py.display()))?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        return Err(format!(
            "the gguf package is not installed in .venv (run ./scripts/setup.sh): {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        ));
    }
    if v != "0.19.0" {
        return Err(format!("gguf {v} is installed in .venv, the check needs 0.19.0 (run ./scripts/setup.sh)"));
    }
    Ok(py)
}

/// The reference python, or `None` after printing `SKIPPED` (a failure if
/// `SHARDGRAPH_REQUIRE_GGML` is set).
fn python_or_skip(test: &str) -> Option<PathBuf> {
    match reference_python() {
        Ok(p) => Some(p),
        Err(why) => {
            println!("{test}: SKIPPED: {why}");
            assert!(std::env::var("SHARDGRAPH_REQUIRE_GGML").is_err(), "SHARDGRAPH_REQUIRE_GGML is set: {why}");
            None
        }
    }
}

/// Runs the script with `mode` on `file`; its stdout lines.
fn run_script(py: &Path, dir: &Path, mode: &str, file: &Path) -> Vec<String> {
    let script = dir.join("gguf_check.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let out = Command::new(py).arg(&script).arg(mode).arg(file).output().expect("run python");
    assert!(
        out.status.success(),
        "python {mode} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

fn assert_same_lines(ours: &[String], theirs: &[String], what: &str) {
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert_eq!(a, b, "{what}: line {i} differs (ours, then the reference)");
    }
    assert_eq!(ours.len(), theirs.len(), "{what}: line counts differ");
}

#[test]
fn reference_writes_we_read() {
    let Some(py) = python_or_skip("gguf reference_writes_we_read") else { return };
    let dir = scratch("py-writes");
    let path = dir.join("py.gguf");
    run_script(&py, &dir, "write", &path);
    let theirs = run_script(&py, &dir, "dump", &path);
    let f = GgufFile::open(&path).unwrap();
    let ours = our_dump(&f, false);
    assert_same_lines(&ours, &theirs, "file written by gguf-py");
    // And what the script wrote, independently of the reference reader.
    assert_eq!(f.version(), 3);
    assert_eq!(f.get_str("general.architecture").unwrap(), "pyarch");
    assert_eq!(f.get_u32("p.u32").unwrap(), u32::MAX);
    assert_eq!(f.get_u64("p.u64").unwrap(), u64::MAX);
    assert_eq!(f.get_i64("p.i64").unwrap(), i64::MIN);
    assert_eq!(f.get_f32("p.f32").unwrap(), 0.1);
    assert_eq!(f.get_str("p.str").unwrap(), "gguf ✓ \"py\"");
    assert_eq!(f.get_arr_str("p.arr.str").unwrap(), vec!["a", "", "βγ"]);
    assert_eq!(f.get_arr_str("p.tokens").unwrap()[299], "t299");
    assert_eq!(f.get_arr_f32("p.arr.f32").unwrap(), vec![0.5, -0.0, 3.25]);
    let nested = f.get_arr("p.nested3").unwrap();
    let inner = nested.get(0).unwrap().as_array().unwrap().get(1).unwrap().as_array().unwrap();
    assert_eq!(inner.to_vec::<i32>().unwrap(), vec![2, 3]);
    assert_eq!(f.get_arr_i32("p.arr.i32").unwrap(), vec![-1, 2]);
    let q = f.tensor("q6_k").unwrap();
    assert_eq!((q.info.ty, q.info.ne, q.data.len()), (GgmlType::Q6_K, [512, 3, 1, 1], 3 * 420));
    let t = f.tensor("f32_4d").unwrap();
    assert_eq!(t.info.ne, [8, 4, 3, 2]);
    assert_eq!(f.tensor("i32").unwrap().data, &(0..7i32).flat_map(|i| i.to_le_bytes()).collect::<Vec<_>>()[..]);
    println!(
        "gguf reference_writes_we_read: {} lines identical ({} keys, {} tensors)",
        ours.len(),
        f.n_kv(),
        f.tensors().len()
    );
    drop(f);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn we_write_reference_reads() {
    let Some(py) = python_or_skip("gguf we_write_reference_reads") else { return };
    let dir = scratch("we-write");
    let s = sample(true);
    let data = data_map(&s);
    for version in [3u32, 2] {
        let path = dir.join(format!("ours{version}.gguf"));
        let mut w = writer_for(&s);
        w.set_version(version).unwrap();
        w.write_file(&path, |info, sink| sink.put(&data[&info.name])).unwrap();
        let f = GgufFile::open(&path).unwrap();
        check_sample(&f, &s, 64);
        let theirs = run_script(&py, &dir, "dump", &path);
        let ours = our_dump(&f, false);
        assert_same_lines(&ours, &theirs, &format!("our v{version} file read by gguf-py"));
        println!("gguf we_write_reference_reads: v{version}: {} lines identical", ours.len());
    }

    // ggml's own reader (strict: exact tensor offsets, no nested arrays).
    let ggml_ok = {
        let probe = Command::new(&py).args(["-c", "import ggml"]).output();
        probe.map(|o| o.status.success()).unwrap_or(false)
    };
    if !ggml_ok {
        println!("gguf we_write_reference_reads: ggml check SKIPPED: the ggml oracle is not installed in .venv");
        assert!(
            std::env::var("SHARDGRAPH_REQUIRE_GGML").is_err(),
            "SHARDGRAPH_REQUIRE_GGML is set but ggml is missing"
        );
    } else {
        let s = sample(false);
        let data = data_map(&s);
        let path = dir.join("ours_flat.gguf");
        writer_for(&s).write_file(&path, |info, sink| sink.put(&data[&info.name])).unwrap();
        let f = GgufFile::open(&path).unwrap();
        let theirs = run_script(&py, &dir, "ggml_dump", &path);
        let ours = our_dump(&f, true);
        assert_same_lines(&ours, &theirs, "our file read by ggml's gguf.cpp");
        println!("gguf we_write_reference_reads: ggml gguf.cpp: {} lines identical", ours.len());
    }
    let _ = std::fs::remove_dir_all(dir);
}

// ----------------------------------------------------------------- loading

struct Model {
    ctx: Context,
    graph: shardgraph::Graph,
    x: TensorId,
    y: TensorId,
    weights: Vec<TensorId>,
}

/// y = norm_w ⊙ (w_down · silu(w_up · x)), weights Q8_0/F16/F32.
fn model() -> Model {
    let (e, f, t) = (64i64, 96i64, 3i64);
    let mut ctx = Context::new();
    let x = named(&mut ctx, GgmlType::F32, &[e, t], "inp");
    let up = named(&mut ctx, GgmlType::Q8_0, &[e, f], "blk.0.ffn_up.weight");
    let down = named(&mut ctx, GgmlType::F16, &[f, e], "blk.0.ffn_down.weight");
    let norm = named(&mut ctx, GgmlType::F32, &[e], "blk.0.norm.weight");
    ctx.set_input(x).unwrap();
    let h = ctx.mul_mat(up, x).unwrap();
    let a = ctx.silu(h).unwrap();
    let d = ctx.mul_mat(down, a).unwrap();
    let y = ctx.mul(d, norm).unwrap();
    let graph = ctx.build_forward(&[y]).unwrap();
    Model { ctx, graph, x, y, weights: vec![up, down, norm] }
}

#[test]
fn load_into_one_device_and_split_devices() {
    let m = model();
    let ctx = &m.ctx;
    let mut rng = Rng::new(99);

    // Reference: weights set directly.
    let reference = OneCpu::new(ctx, &m.graph, 2, |st, id| {
        let n = ctx.tensor(id).unwrap().nelements() as usize;
        let v: Vec<f32> = (0..n).map(|_| rng.unit()).collect();
        st.set_f32(ctx, id, &v).unwrap();
    })
    .unwrap();
    reference.compute(ctx, &m.graph).unwrap();
    let OneCpu { cpu, storage: one, leaf_bytes } = reference;
    let bytes_of = |st: &TensorStorage, id| {
        let mut b = vec![0u8; ctx.tensor(id).unwrap().nbytes()];
        st.get_bytes(ctx, id, 0, &mut b).unwrap();
        b
    };
    let x_bytes = leaf_bytes[&m.x].clone();
    let want = one.get_f32(ctx, m.y).unwrap();

    // The weights (and one tensor the model does not use) in a GGUF file.
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", "test").unwrap();
    let mut data = HashMap::new();
    for &id in &m.weights {
        let t = ctx.tensor(id).unwrap();
        w.add_tensor(&t.name, t.ty, &t.ne).unwrap();
        data.insert(t.name.clone(), bytes_of(&one, id));
    }
    w.add_tensor("unused.weight", GgmlType::F32, &[4]).unwrap();
    data.insert("unused.weight".into(), vec![0; 16]);
    let dir = scratch("load");
    let path = dir.join("model.gguf");
    w.write_file(&path, |info, sink| sink.put(&data[&info.name])).unwrap();
    let file = GgufFile::open(&path).unwrap();

    // One device.
    let mut st = TensorStorage::new();
    st.alloc_tensors(&cpu, ctx, m.graph.leafs()).unwrap();
    let rep = load_into_storage(&file, ctx, &st).unwrap();
    assert_eq!(rep.loaded.len(), 3);
    assert_eq!(rep.unused, vec!["unused.weight".to_string()]);
    assert_eq!(rep.bytes, m.weights.iter().map(|&id| ctx.tensor(id).unwrap().nbytes() as u64).sum::<u64>());
    for &id in &m.weights {
        assert_eq!(bytes_of(&st, id), data[&ctx.tensor(id).unwrap().name]);
    }
    st.set_bytes(ctx, m.x, 0, &x_bytes).unwrap();
    GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, ctx, &m.graph, &mut st).unwrap();
    cpu.compute(ctx, &m.graph, &st).unwrap();
    assert_eq!(st.get_f32(ctx, m.y).unwrap(), want, "one device from GGUF");

    // Three devices, weights split as llama.cpp's tensor split would.
    let n = 3;
    let policy = SplitPolicy::new(&[3.0, 2.0, 1.0])
        .unwrap()
        .rule("blk.*.ffn_up.weight", SplitSpec::Axis { axis: 1, granule: 32, segments: vec![] })
        .rule("blk.*.ffn_down.weight", SplitSpec::Axis { axis: 0, granule: 32, segments: vec![] })
        .rule("blk.*.norm.weight", SplitSpec::Mirrored);
    let plan = Planner::default().plan(ctx, &m.graph, &policy, &[]).unwrap();
    let mut store = SplitStore::new(n);
    store.place_leafs(ctx, &m.graph, &plan).unwrap();
    assert!(matches!(store.locals(m.weights[0]).unwrap().0, SplitState::Split(_)));
    let rep = load_into_split_store(&file, ctx, &mut store).unwrap();
    assert_eq!(
        rep.loaded.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "blk.0.norm.weight"]
    );
    for &id in &m.weights {
        let mut b = vec![0u8; ctx.tensor(id).unwrap().nbytes()];
        store.get_tensor(ctx, id, 0, &mut b).unwrap();
        assert_eq!(b, data[&ctx.tensor(id).unwrap().name]);
    }
    store.set_tensor(ctx, m.x, 0, &x_bytes).unwrap();
    let out = Devices::cpu(n, 1)
        .and_then(|d| d.executor())
        .unwrap()
        .execute(ctx, &m.graph, &plan, &mut store, &[m.y])
        .unwrap();
    let got: Vec<f32> =
        out.outputs[0].bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let e = nmse(&got, &want);
    assert!(e < 1e-10, "3 devices from GGUF: NMSE {e}");

    // Not placed: a split error naming the tensor, before anything is copied.
    let mut store2 = SplitStore::new(n);
    match load_into_split_store(&file, ctx, &mut store2) {
        Err(Error::Split { detail }) => {
            assert!(detail.contains("\"blk.0.ffn_up.weight\"") && detail.contains("not placed"), "{detail}")
        }
        other => panic!("expected a split error, got {other:?}"),
    }
    // One tensor at a time.
    store2.place(ctx, m.weights[2], &SplitState::Mirrored).unwrap();
    let nb = load_tensor_into_split_store(&file, "blk.0.norm.weight", ctx, m.weights[2], &mut store2).unwrap();
    assert_eq!(nb, 64 * 4);
    let (_, parts) = store2.locals(m.weights[2]).unwrap();
    assert!(parts.iter().all(|p| *p == &data["blk.0.norm.weight"][..]));
    let fname = path.display().to_string();
    let d = gguf_detail(load_tensor_into_split_store(&file, "nope", ctx, m.weights[2], &mut store2), &fname);
    assert!(d.contains("\"nope\" not found"), "{d}");

    // A context whose tensor of that name has another type: named, nothing copied.
    let mut c2 = Context::new();
    let id = named(&mut c2, GgmlType::F32, &[64, 96], "blk.0.ffn_up.weight");
    let mut st2 = TensorStorage::new();
    st2.alloc_tensors(&cpu, &c2, &[id]).unwrap();
    let d = gguf_detail(load_into_storage(&file, &c2, &st2), &fname);
    assert!(
        d.contains("\"blk.0.ffn_up.weight\"") && d.contains("q8_0[64, 96, 1, 1]") && d.contains("f32[64, 96, 1, 1]"),
        "{d}"
    );
    // Same type and shape but no storage.
    let mut c3 = Context::new();
    named(&mut c3, GgmlType::F32, &[64], "blk.0.norm.weight");
    assert!(matches!(load_into_storage(&file, &c3, &TensorStorage::new()), Err(Error::NoStorage { .. })));
    // Two context tensors with the name: ambiguous.
    named(&mut c3, GgmlType::F32, &[64], "blk.0.norm.weight");
    let d = gguf_detail(load_into_storage(&file, &c3, &TensorStorage::new()), &fname);
    assert!(d.contains("2 tensors of the context have that name"), "{d}");
    drop(file);
    let _ = std::fs::remove_dir_all(dir);
}
