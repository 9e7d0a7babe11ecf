//! Writes real-format GGUF files with seeded weights (the models the tests
//! and examples run), streaming one tensor at a time so a large model never
//! needs a second copy in memory.

use super::qwen3::{Qwen3Hparams, Qwen3Types};
use crate::error::{Error, Result};
use crate::gguf::GgufWriter;
use crate::tensor::quant::quantize_chunk;
use crate::tensor::GgmlType;

/// A seeded stream of uniform values in `[-1, 1)` (xorshift64*), one per tensor name.
fn stream(seed: u64, name: &str) -> impl FnMut() -> f32 {
    let mut s =
        name.bytes().fold(seed ^ 0x9E37_79B9_7F4A_7C15, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01B3)) | 1;
    move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        let v = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((v >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// The tensors of a `qwen3` GGUF in llama.cpp's order: name, type, shape.
pub fn qwen3_tensors(hp: &Qwen3Hparams, types: &Qwen3Types) -> Vec<(String, GgmlType, Vec<i64>)> {
    let (e, f, v) = (hp.n_embd, hp.n_ff, hp.n_vocab);
    let (qd, kvd, d) = (hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.head_dim);
    let mut t = vec![
        ("token_embd.weight".to_string(), types.embd, vec![e, v]),
        ("output_norm.weight".to_string(), GgmlType::F32, vec![e]),
        ("output.weight".to_string(), types.output, vec![e, v]),
    ];
    for il in 0..hp.n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        t.extend([
            (b("attn_norm.weight"), GgmlType::F32, vec![e]),
            (b("attn_q.weight"), types.attn, vec![e, qd]),
            (b("attn_k.weight"), types.attn, vec![e, kvd]),
            (b("attn_v.weight"), types.attn_v, vec![e, kvd]),
            (b("attn_output.weight"), types.attn, vec![qd, e]),
            (b("attn_q_norm.weight"), GgmlType::F32, vec![d]),
            (b("attn_k_norm.weight"), GgmlType::F32, vec![d]),
            (b("ffn_norm.weight"), GgmlType::F32, vec![e]),
            (b("ffn_gate.weight"), types.ffn, vec![e, f]),
            (b("ffn_up.weight"), types.ffn, vec![e, f]),
            (b("ffn_down.weight"), types.ffn_down, vec![f, e]),
        ]);
    }
    t
}

/// What the generated weights do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// Uniform random matrices (unit variance of each output); greedy
    /// continuations run into near-ties after a few steps.
    Random,
    /// A model with a known greedy rule: token embeddings are random ±1
    /// vectors, the output head maps token `t`'s embedding to token
    /// [`permutation`]`(t)` with a wide margin, and the layers add small
    /// random updates (attention and FFN outputs scaled down), so the greedy
    /// continuation of `t` is `perm(t), perm(perm(t)), …` — something real
    /// for a drafter to predict.
    Permutation,
}

/// The vocabulary permutation of a [`Weights::Permutation`] model from `seed`.
pub fn permutation(n_vocab: i64, seed: u64) -> Vec<i64> {
    let mut next = stream(seed, "permutation");
    let mut p: Vec<i64> = (0..n_vocab).collect();
    for i in (1..p.len()).rev() {
        let j = (((next() + 1.0) / 2.0) * (i + 1) as f32) as usize;
        p.swap(i, j.min(i));
    }
    p
}

/// Writes a `qwen3` GGUF with random weights from `seed`: matrices uniform
/// in ±√(3/n_in) (unit variance of each output), norm weights 1 ± 0.1,
/// quantized to `types`. Returns the file size in bytes.
///
/// # Errors
/// [`Error::Model`] for inconsistent hyper-parameters or a type whose block
/// does not divide a row; GGUF write errors naming the path.
pub fn write_qwen3_gguf(
    path: impl AsRef<std::path::Path>,
    hp: &Qwen3Hparams,
    types: &Qwen3Types,
    seed: u64,
) -> Result<u64> {
    write_qwen3_gguf_with(path, hp, types, seed, Weights::Random)
}

/// [`write_qwen3_gguf`] with the weights of `kind`.
///
/// # Errors
/// As [`write_qwen3_gguf`].
pub fn write_qwen3_gguf_with(
    path: impl AsRef<std::path::Path>,
    hp: &Qwen3Hparams,
    types: &Qwen3Types,
    seed: u64,
    kind: Weights,
) -> Result<u64> {
    write_qwen3_gguf_progress(path, hp, types, seed, kind, &mut |_, _| {})
}

/// [`write_qwen3_gguf_with`], calling `progress(bytes_written, total_bytes)`
/// after every tensor (for a progress display of large models).
///
/// # Errors
/// As [`write_qwen3_gguf`].
pub fn write_qwen3_gguf_progress(
    path: impl AsRef<std::path::Path>,
    hp: &Qwen3Hparams,
    types: &Qwen3Types,
    seed: u64,
    kind: Weights,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    let perm = permutation(hp.n_vocab, seed);
    let mut inverse = vec![0i64; perm.len()];
    for (t, &p) in perm.iter().enumerate() {
        inverse[p as usize] = t as i64;
    }
    hp.validate()?;
    let mut w = GgufWriter::new();
    hp.add_to_gguf(&mut w, "shardgraph tiny qwen3")?;
    let structured = kind == Weights::Permutation;
    // Structured models: the layers' writes into the residual stream are small.
    let damp = |name: &str| {
        if structured && (name.ends_with("attn_output.weight") || name.ends_with("ffn_down.weight")) {
            0.05
        } else {
            1.0
        }
    };
    // ±1 embedding of token t (its own seeded stream), for the structured head.
    let embedding = |t: i64, out: &mut [f32]| {
        let mut e = stream(seed, &format!("embedding {t}"));
        for x in out.iter_mut() {
            *x = if e() >= 0.0 { 1.0 } else { -1.0 };
        }
    };
    let special = |name: &str, r: usize, row: &mut [f32]| -> bool {
        if structured && name == "token_embd.weight" {
            embedding(r as i64, row);
        } else if structured && name == "output.weight" {
            // Row v scores the embedding of the token whose successor is v.
            embedding(inverse.get(r).copied().unwrap_or(0), row);
            let k = 16.0 / row.len().max(1) as f32;
            row.iter_mut().for_each(|x| *x *= k);
        } else {
            return false;
        }
        true
    };
    write_tensors(path, w, &qwen3_tensors(hp, types), seed, &damp, &special, progress)
}

/// Rows of one tensor, given by a caller (`true`) or left to the seeded default.
type RowFill<'a> = dyn Fn(&str, usize, &mut [f32]) -> bool + 'a;

/// Streams `tensors` into a GGUF with `w`'s metadata: each row from
/// `special`, or seeded uniform values in ±√(3/n_in)·`damp(name)` (norm
/// weights 1 ± 0.1), quantized to the tensor's type.
fn write_tensors(
    path: impl AsRef<std::path::Path>,
    mut w: GgufWriter,
    tensors: &[(String, GgmlType, Vec<i64>)],
    seed: u64,
    damp: &dyn Fn(&str) -> f32,
    special: &RowFill<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    for (name, ty, ne) in tensors {
        if ne[0] % ty.block_size() as i64 != 0 {
            return Err(Error::Model { detail: format!("{name}: rows of {} do not fit {ty} blocks", ne[0]) });
        }
        w.add_tensor(name, *ty, ne)?;
    }
    let total = w.file_len();
    let mut done = w.data_offset();
    w.write_file(path, |info, sink| {
        let (name, ty, ne) = tensors
            .iter()
            .find(|t| t.0 == info.name)
            .ok_or_else(|| Error::Model { detail: format!("unknown tensor {}", info.name) })?;
        let n_in = ne[0] as usize;
        let rows: usize = ne[1..].iter().product::<i64>().max(1) as usize;
        let mut next = stream(seed, name);
        let norm = name.ends_with("norm.weight");
        let scale = (3.0 / n_in.max(1) as f32).sqrt() * damp(name);
        let mut row = vec![0f32; n_in];
        let mut bytes = vec![0u8; ty.row_size(ne[0])?];
        for r in 0..rows {
            if !special(name, r, &mut row) {
                for x in row.iter_mut() {
                    *x = if norm { 1.0 + 0.1 * next() } else { scale * next() };
                }
            }
            quantize_chunk(*ty, &row, &mut bytes, 1, n_in)?;
            sink.put(&bytes)?;
        }
        done += info.nbytes as u64;
        progress(done.min(total), total);
        Ok(())
    })
}

/// The tensors of a `dflash` GGUF (GGUF names): `fc`, the norms, and per
/// layer the Qwen3-style attention and FFN (no embedding or head: the
/// drafter borrows the target's).
pub fn dflash_tensors(hp: &super::dflash::DflashHparams, ty: GgmlType) -> Vec<(String, GgmlType, Vec<i64>)> {
    let (e, f, d) = (hp.n_embd, hp.n_ff, hp.head_dim);
    let (qd, kvd) = (hp.n_head * d, hp.n_head_kv * d);
    let x = hp.target_layers.len() as i64 * hp.target_hidden;
    let mut t = vec![
        ("fc.weight".to_string(), ty, vec![x, e]),
        ("enc.output_norm.weight".to_string(), GgmlType::F32, vec![e]),
        ("output_norm.weight".to_string(), GgmlType::F32, vec![e]),
    ];
    for il in 0..hp.n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        t.extend([
            (b("attn_norm.weight"), GgmlType::F32, vec![e]),
            (b("attn_q.weight"), ty, vec![e, qd]),
            (b("attn_k.weight"), ty, vec![e, kvd]),
            (b("attn_v.weight"), ty, vec![e, kvd]),
            (b("attn_output.weight"), ty, vec![qd, e]),
            (b("attn_q_norm.weight"), GgmlType::F32, vec![d]),
            (b("attn_k_norm.weight"), GgmlType::F32, vec![d]),
            (b("ffn_norm.weight"), GgmlType::F32, vec![e]),
            (b("ffn_gate.weight"), ty, vec![e, f]),
            (b("ffn_up.weight"), ty, vec![e, f]),
            (b("ffn_down.weight"), ty, vec![f, e]),
        ]);
        if let Some((k, g)) = hp.conv {
            let width = 2 * k * (e / g.max(1));
            t.extend([
                (b("attn_conv_base"), GgmlType::F32, vec![e, k, 2]),
                (b("attn_conv_proj.weight"), ty, vec![e, width]),
                (b("ffn_conv_base"), GgmlType::F32, vec![e, k, 2]),
                (b("ffn_conv_proj.weight"), ty, vec![e, width]),
            ]);
        }
    }
    t
}

/// Writes a `dflash` drafter GGUF with random weights from `seed` (as
/// [`write_qwen3_gguf`]) for a target of `n_vocab` tokens. Returns the file
/// size in bytes.
///
/// # Errors
/// [`Error::Model`] for a type whose block does not divide a row; GGUF
/// write errors naming the path.
pub fn write_dflash_gguf(
    path: impl AsRef<std::path::Path>,
    hp: &super::dflash::DflashHparams,
    ty: GgmlType,
    n_vocab: i64,
    seed: u64,
) -> Result<u64> {
    let mut w = GgufWriter::new();
    hp.add_to_gguf(&mut w, "shardgraph tiny dflash", n_vocab)?;
    write_tensors(path, w, &dflash_tensors(hp, ty), seed, &|_| 1.0, &|_, _, _| false, &mut |_, _| {})
}
