//! Copies of a GGUF with edits, for tests of what real files carry and
//! generated ones do not: metadata keys added (a tokenizer's special ids),
//! and a tensor given another type of the same byte size (a type the
//! kernels cannot run), its bytes unchanged.
#![allow(dead_code)]

use shardgraph::gguf::{GgufFile, GgufWriter, MetaValue};
use shardgraph::GgmlType;
use std::path::Path;

/// Copies `src` to `dst` with the keys `extra` added (replacing a key of
/// the same name) and the tensors named in `retype` declared of the given
/// type (the same bytes: the type must have the same row size); every
/// other key and tensor as in `src`.
///
/// # Panics
/// On a read or write error, or a retyped tensor whose bytes do not fit
/// its new type (a test set-up error).
pub fn copy_with(src: &Path, dst: &Path, extra: &[(&str, MetaValue)], retype: &[(&str, GgmlType)]) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.kvs() {
        if !extra.iter().any(|(e, _)| *e == k) {
            w.add_kv(k, v.to_owned_value()).unwrap();
        }
    }
    for (k, v) in extra {
        w.add_kv(k, v.clone()).unwrap();
    }
    for t in f.tensors() {
        let ty = retype.iter().find(|(n, _)| *n == t.name).map_or(t.ty, |r| r.1);
        let ne: Vec<i64> = t.ne[..t.n_dims.max(1) as usize].to_vec();
        w.add_tensor(&t.name, ty, &ne).unwrap();
    }
    w.write_file(dst, |info, sink| sink.put(f.tensor(&info.name)?.data)).unwrap();
}

/// Copies `src` to `dst` with every tensor stored as F32: its values
/// decoded (`quant::dequantize_row`, bit for bit ggml's `to_float`), so a
/// model of the copy computes with exactly the quantized file's weights but
/// without rounding its activations for quantized products. Every key as
/// in `src`.
///
/// # Panics
/// On a read or write error (a test set-up error).
pub fn dequantized(src: &Path, dst: &Path) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.kvs() {
        w.add_kv(k, v.to_owned_value()).unwrap();
    }
    for t in f.tensors() {
        let ne: Vec<i64> = t.ne[..t.n_dims.max(1) as usize].to_vec();
        w.add_tensor(&t.name, GgmlType::F32, &ne).unwrap();
    }
    w.write_file(dst, |info, sink| {
        let t = f.tensor(&info.name)?;
        let n: i64 = t.info.ne.iter().product();
        let mut v = vec![0f32; n as usize];
        shardgraph::tensor::quant::dequantize_row(t.info.ty, t.data, &mut v)?;
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        sink.put(&bytes)
    })
    .unwrap();
}
