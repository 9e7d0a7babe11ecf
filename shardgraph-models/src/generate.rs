//! Writes real-format GGUF files with seeded weights (the models the tests
//! and examples run), streaming one tensor at a time so a large model never
//! needs a second copy in memory.

use super::qwen3::Qwen3Hparams;
use super::types::TensorTypes;
use shardgraph::error::{Error, Result};
use shardgraph::gguf::GgufWriter;
use shardgraph::tensor::quant::quantize_chunk;
use shardgraph::tensor::GgmlType;

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

/// The tensors of a `qwen3` GGUF in llama.cpp's order: name, type (the one
/// `types` gives each weight matrix; norms F32) and shape; no
/// `output.weight` when `types` ties the head to the embedding.
///
/// # Errors
/// [`Error::Model`] naming a tensor whose type the kernels cannot multiply
/// or whose rows are not whole blocks.
pub fn qwen3_tensors(hp: &Qwen3Hparams, types: &TensorTypes) -> Result<Vec<(String, GgmlType, Vec<i64>)>> {
    let (e, f, v) = (hp.n_embd, hp.n_ff, hp.n_vocab);
    let (qd, kvd, d) = (hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim, hp.head_dim);
    let mut t = Vec::new();
    let m = |t: &mut Vec<_>, name: String, ne: Vec<i64>| -> Result<()> {
        t.push((name.clone(), types.matrix("qwen3", &name, &ne)?, ne));
        Ok(())
    };
    let norm = |t: &mut Vec<_>, name: String, ne: Vec<i64>| t.push((name, GgmlType::F32, ne));
    m(&mut t, "token_embd.weight".into(), vec![e, v])?;
    norm(&mut t, "output_norm.weight".into(), vec![e]);
    if !types.is_tied() {
        m(&mut t, "output.weight".into(), vec![e, v])?;
    }
    for il in 0..hp.n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        norm(&mut t, b("attn_norm.weight"), vec![e]);
        m(&mut t, b("attn_q.weight"), vec![e, qd])?;
        m(&mut t, b("attn_k.weight"), vec![e, kvd])?;
        m(&mut t, b("attn_v.weight"), vec![e, kvd])?;
        m(&mut t, b("attn_output.weight"), vec![qd, e])?;
        norm(&mut t, b("attn_q_norm.weight"), vec![d]);
        norm(&mut t, b("attn_k_norm.weight"), vec![d]);
        norm(&mut t, b("ffn_norm.weight"), vec![e]);
        m(&mut t, b("ffn_gate.weight"), vec![e, f])?;
        m(&mut t, b("ffn_up.weight"), vec![e, f])?;
        m(&mut t, b("ffn_down.weight"), vec![f, e])?;
    }
    Ok(t)
}

/// What the generated weights do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Weights {
    /// Uniform random matrices (unit variance of each output); greedy
    /// continuations run into near-ties after a few steps.
    Random,
    /// A model with a known greedy rule: token embeddings are random ±1
    /// vectors ([`permutation_embedding`]), the output head maps token `t`'s embedding to token
    /// [`permutation`]`(t)` with a wide margin, and the layers add small
    /// random updates (attention and FFN outputs scaled down), so the greedy
    /// continuation of `t` is `perm(t), perm(perm(t)), …` — something real
    /// for a drafter to predict. For a drafter
    /// ([`write_dflash_gguf_with`]): one built to predict the permutation
    /// target written with the same seed.
    Permutation,
    /// [`Weights::Permutation`] with attention that matters: layer 0's
    /// attention (random queries and keys) copies the embeddings of the
    /// tokens it attends to into the residual stream, `attention` strong, so
    /// at positions where it concentrates on an earlier token `x` the greedy
    /// token becomes `perm(x)` instead of the chain's — a drafter that
    /// follows the permutation is rejected there. For a drafter, the same as
    /// [`Weights::Permutation`].
    PermutationWithAttention {
        /// Strength of layer 0's copy of attended embeddings (the token's
        /// own embedding has strength 1).
        attention: f32,
    },
}

/// Token `t`'s embedding row in a [`Weights::Permutation`] model from
/// `seed` (`out` is one row of `n_embd` values): channel 0 is a marker, +1
/// for every token but the last id of the vocabulary (`n_vocab − 1`,
/// reserved as a drafter's mask token), which gets −1; the other channels
/// are seeded random ±1.
pub fn permutation_embedding(seed: u64, t: i64, n_vocab: i64, out: &mut [f32]) {
    let mut e = stream(seed, &format!("embedding {t}"));
    for x in out.iter_mut() {
        *x = if e() >= 0.0 { 1.0 } else { -1.0 };
    }
    if let Some(m) = out.first_mut() {
        *m = if t == n_vocab - 1 { -1.0 } else { 1.0 };
    }
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
/// each quantized to the type `types` gives it (per tensor: a preset such
/// as [`TensorTypes::llama_q4_k_m`] mixes them by layer; a tied preset
/// writes no `output.weight`). Returns the file size in bytes.
///
/// # Errors
/// [`Error::Model`] for inconsistent hyper-parameters or a type whose block
/// does not divide a row; GGUF write errors naming the path.
pub fn write_qwen3_gguf(
    path: impl AsRef<std::path::Path>,
    hp: &Qwen3Hparams,
    types: &TensorTypes,
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
    types: &TensorTypes,
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
    types: &TensorTypes,
    seed: u64,
    kind: Weights,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    hp.validate()?;
    let perm = permutation(hp.n_vocab, seed);
    let mut inverse = vec![0i64; perm.len()];
    for (t, &p) in perm.iter().enumerate() {
        inverse[p as usize] = t as i64;
    }
    let mut w = GgufWriter::new();
    hp.add_to_gguf(&mut w, "shardgraph tiny qwen3")?;
    let structured = kind != Weights::Random;
    let copy = match kind {
        Weights::PermutationWithAttention { attention } => Some(attention),
        _ => None,
    };
    // Structured models: the layers' writes into the residual stream are small.
    let damp = |name: &str| {
        if structured && (name.ends_with("attn_output.weight") || name.ends_with("ffn_down.weight")) {
            0.05
        } else {
            1.0
        }
    };
    let (d, group) = (hp.head_dim as usize, (hp.n_head / hp.n_head_kv.max(1)) as usize);
    let s_len = ((hp.n_head_kv * hp.head_dim) as usize).min(hp.n_embd.max(1) as usize - 1);
    let embedding = |t: i64, out: &mut [f32]| permutation_embedding(seed, t, hp.n_vocab, out);
    let special = |name: &str, r: usize, row: &mut [f32]| -> bool {
        if structured && name == "token_embd.weight" {
            embedding(r as i64, row);
        } else if structured && name == "output.weight" {
            // Row v scores the embedding of the token whose successor is v.
            embedding(inverse.get(r).copied().unwrap_or(0), row);
            let k = 16.0 / row.len().max(1) as f32;
            row.iter_mut().for_each(|x| *x *= k);
        } else if let (Some(_), "blk.0.attn_v.weight") = (copy, name) {
            // Layer 0's values copy the attended tokens' embeddings (channels 1..=S) ...
            row.iter_mut().for_each(|x| *x = 0.0);
            if r < s_len {
                row[1 + r] = 1.0;
            }
        } else if copy.is_some() && (name == "blk.0.attn_q_norm.weight" || name == "blk.0.attn_k_norm.weight") {
            // Sharper scores (q·k up to 16× a unit norm's), so the attention often settles on one token.
            row.iter_mut().for_each(|x| *x = 4.0);
        } else if let (Some(c), "blk.0.attn_output.weight") = (copy, name) {
            // ... into the residual stream, `c` strong (first head of each KV group).
            row.iter_mut().for_each(|x| *x = 0.0);
            if (1..=s_len).contains(&r) {
                let (j, i) = ((r - 1) / d, (r - 1) % d);
                row[j * group * d + i] = c;
            }
        } else {
            return false;
        }
        true
    };
    write_tensors(path, w, &qwen3_tensors(hp, types)?, seed, &damp, &special, progress)
}

/// Rows of one tensor, given by a caller (`true`) or left to the seeded default.
type RowFill<'a> = dyn Fn(&str, usize, &mut [f32]) -> bool + 'a;

/// Streams `tensors` into a GGUF with `w`'s metadata: each row from
/// `special`, or seeded uniform values in ±√(3/n_in)·`damp(name)` (norm
/// weights 1 ± 0.1), quantized to the tensor's type.
/// The metadata key every generated file carries [`GENERATOR_VERSION`]
/// under (a key of this crate's own; llama.cpp ignores it).
pub const GENERATOR_KEY: &str = "shardgraph.generator";

/// The generators' version, changed whenever what they write changes
/// (weights, keys, layouts), so a copy cached by another build can be told
/// apart and written again (the examples' models in the temp folder).
pub const GENERATOR_VERSION: &str = "shardgraph-models generate 4";

fn write_tensors(
    path: impl AsRef<std::path::Path>,
    mut w: GgufWriter,
    tensors: &[(String, GgmlType, Vec<i64>)],
    seed: u64,
    damp: &dyn Fn(&str) -> f32,
    special: &RowFill<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    w.add_kv(GENERATOR_KEY, GENERATOR_VERSION)?;
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
/// drafter borrows the target's of `n_vocab` tokens), DFlash2's
/// convolution and selector tensors when `hp` has them; each weight matrix
/// of the type `types` gives it, vectors F32.
///
/// # Errors
/// [`Error::Model`] naming a tensor whose type the kernels cannot multiply
/// or whose rows are not whole blocks.
pub fn dflash_tensors(
    hp: &super::dflash::DflashHparams,
    types: &TensorTypes,
    n_vocab: i64,
) -> Result<Vec<(String, GgmlType, Vec<i64>)>> {
    let (e, f, d) = (hp.n_embd, hp.n_ff, hp.head_dim);
    let (qd, kvd) = (hp.n_head * d, hp.n_head_kv * d);
    let x = hp.target_layers.len() as i64 * hp.target_hidden;
    let mut t = Vec::new();
    let m = |t: &mut Vec<_>, name: String, ne: Vec<i64>| -> Result<()> {
        t.push((name.clone(), types.matrix("dflash drafter", &name, &ne)?, ne));
        Ok(())
    };
    let vector = |t: &mut Vec<_>, name: String, ne: Vec<i64>| t.push((name, GgmlType::F32, ne));
    m(&mut t, "fc.weight".into(), vec![x, e])?;
    vector(&mut t, "enc.output_norm.weight".into(), vec![e]);
    vector(&mut t, "output_norm.weight".into(), vec![e]);
    for il in 0..hp.n_layer {
        let b = |n: &str| format!("blk.{il}.{n}");
        vector(&mut t, b("attn_norm.weight"), vec![e]);
        m(&mut t, b("attn_q.weight"), vec![e, qd])?;
        m(&mut t, b("attn_k.weight"), vec![e, kvd])?;
        m(&mut t, b("attn_v.weight"), vec![e, kvd])?;
        m(&mut t, b("attn_output.weight"), vec![qd, e])?;
        vector(&mut t, b("attn_q_norm.weight"), vec![d]);
        vector(&mut t, b("attn_k_norm.weight"), vec![d]);
        vector(&mut t, b("ffn_norm.weight"), vec![e]);
        m(&mut t, b("ffn_gate.weight"), vec![e, f])?;
        m(&mut t, b("ffn_up.weight"), vec![e, f])?;
        m(&mut t, b("ffn_down.weight"), vec![f, e])?;
        if let Some((k, g)) = hp.conv {
            let width = 2 * k * (e / g.max(1));
            vector(&mut t, b("attn_conv_base"), vec![e, k, 2]);
            m(&mut t, b("attn_conv_proj.weight"), vec![e, width])?;
            vector(&mut t, b("ffn_conv_base"), vec![e, k, 2]);
            m(&mut t, b("ffn_conv_proj.weight"), vec![e, width])?;
        }
    }
    if let Some((r, _)) = hp.selector {
        m(&mut t, "selector_hidden.weight".into(), vec![e, r])?;
        m(&mut t, "selector_predecessor.weight".into(), vec![r, n_vocab])?;
        m(&mut t, "selector_successor.weight".into(), vec![r, n_vocab])?;
    }
    Ok(t)
}

/// Writes a `dflash` drafter GGUF with random weights from `seed` (as
/// [`write_qwen3_gguf`]; each matrix of the type `types` gives it) for a
/// target of `n_vocab` tokens. Returns the file size in bytes.
///
/// # Errors
/// [`Error::Model`] for a type whose block does not divide a row; GGUF
/// write errors naming the path.
pub fn write_dflash_gguf(
    path: impl AsRef<std::path::Path>,
    hp: &super::dflash::DflashHparams,
    types: &TensorTypes,
    n_vocab: i64,
    seed: u64,
) -> Result<u64> {
    write_dflash_gguf_with(path, hp, types, n_vocab, seed, Weights::Random)
}

/// [`write_dflash_gguf`] with the weights of `kind`. [`Weights::Permutation`]
/// builds a DFlash2 drafter that predicts the [`Weights::Permutation`]
/// target written with the same `seed` (its mask token must be the
/// target's last id, whose embedding's marker channel is −1):
///
/// * layer 0's attention sends every mask row to the anchor: queries and
///   keys read only the marker channel (in the lowest-frequency rope pair,
///   so positions barely rotate them; the context's keys are zero because
///   `enc.output_norm` zeroes the marker), and the values copy the anchor's
///   embedding into the mask rows;
/// * layer 0's FFN is a lookup table (one unit per token, so
///   `feed_forward_length ≥ n_vocab`): the unit of token `a` writes the
///   embeddings of `a, perm(a), …, perm^{B−2}(a)`, so the borrowed head puts
///   the whole chain `perm(a) … perm^{B−1}(a)` among every row's top
///   candidates;
/// * the selector's codebooks score the edge `p → perm(p)` high (the
///   successor code of `c` is the predecessor code of `perm⁻¹(c)`), with a
///   gate read from the marker channel, so the best path from the anchor is
///   the chain in order;
/// * the later layers and the convolutions add nothing (zero output
///   projections, identity convolution kernels).
///
/// # Errors
/// [`Error::Model`] if `hp` has no selector, `n_ff < n_vocab`, the mask
/// token is not `n_vocab − 1`, or `E < 2`; as [`write_dflash_gguf`].
pub fn write_dflash_gguf_with(
    path: impl AsRef<std::path::Path>,
    hp: &super::dflash::DflashHparams,
    types: &TensorTypes,
    n_vocab: i64,
    seed: u64,
    kind: Weights,
) -> Result<u64> {
    if !(1..=i32::MAX as i64).contains(&n_vocab) {
        return Err(Error::Model { detail: format!("dflash generator: a vocabulary of {n_vocab}") });
    }
    let mut w = GgufWriter::new();
    hp.add_to_gguf(&mut w, "shardgraph tiny dflash", n_vocab)?;
    let tensors = dflash_tensors(hp, types, n_vocab)?;
    if kind == Weights::Random {
        return write_tensors(path, w, &tensors, seed, &|_| 1.0, &|_, _, _| false, &mut |_, _| {});
    }
    let bad = |d: &str| Err(Error::Model { detail: format!("structured dflash drafter: {d}") });
    let Some((rank, _)) = hp.selector else { return bad("needs DFlash2's selector (selector_top_k > 0)") };
    if hp.n_head_kv < 1 || hp.head_dim < 1 || n_vocab < 1 {
        return bad(&format!(
            "head_count_kv {}, key_length {} and the vocabulary {n_vocab} must be positive",
            hp.n_head_kv, hp.head_dim
        ));
    }
    if hp.n_ff < n_vocab || hp.mask_token as i64 != n_vocab - 1 || hp.n_embd < 2 || hp.n_head % hp.n_head_kv != 0 {
        return bad(&format!(
            "needs feed_forward_length ({}) ≥ n_vocab ({n_vocab}), mask token n_vocab − 1 (got {}), and whole GQA groups",
            hp.n_ff, hp.mask_token
        ));
    }
    let (e, d, v) = (hp.n_embd as usize, hp.head_dim as usize, n_vocab as usize);
    let group = (hp.n_head / hp.n_head_kv) as usize;
    let chain = hp.block_size.max(2) - 1; // drafts per block
                                          // The value channels: KV head j, dim i carries channel 1 + j·D + i.
    let s_len = (hp.n_head_kv as usize * d).min(e - 1);
    let perm = permutation(n_vocab, seed);
    let mut inverse = vec![0usize; v];
    for (t, &p) in perm.iter().enumerate() {
        inverse[p as usize] = t;
    }
    let mut emb = vec![0f32; v * e];
    for (t, row) in emb.chunks_exact_mut(e).enumerate() {
        permutation_embedding(seed, t as i64, n_vocab, row);
    }
    // Scales: copy strength γ; lookup sharpness κ; a matched unit's output
    // silu(κ·s)·s with s ≈ √(E/|S|) the normed copy's amplitude; δ makes each
    // chain embedding as strong as the copy; the selector's edge margin ~30.
    let (gamma, kappa) = (8.0f32, 6.0f32);
    let amp = (e as f32 / s_len as f32).sqrt();
    let silu = |x: f32| x / (1.0 + (-x).exp());
    let delta = gamma / (silu(kappa * amp) * amp);
    let qk = (20.0 / (d as f32).sqrt()).sqrt();
    let gate_scale = 30.0 * gamma * ((chain + 1) as f32).sqrt() / rank as f32;
    let code = |t: usize, out: &mut [f32]| {
        let mut c = stream(seed, &format!("selector code {t}"));
        out.iter_mut().for_each(|x| *x = if c() >= 0.0 { 1.0 } else { -1.0 });
    };
    let special = |name: &str, r: usize, row: &mut [f32]| -> bool {
        let layer0 = name.starts_with("blk.0.");
        let role = name.rsplit_once("blk.").map_or(name, |(_, rest)| rest.split_once('.').map_or(rest, |x| x.1));
        row.iter_mut().for_each(|x| *x = 0.0);
        match role {
            "attn_norm.weight" | "ffn_norm.weight" | "output_norm.weight" => row.iter_mut().for_each(|x| *x = 1.0),
            "enc.output_norm.weight" => row.iter_mut().skip(1).for_each(|x| *x = 1.0),
            "attn_q_norm.weight" | "attn_k_norm.weight" => row.iter_mut().for_each(|x| *x = qk),
            // Queries −marker, keys +marker, in each head's last dim.
            "attn_q.weight" if layer0 => row[0] = if r % d == d - 1 { -1.0 } else { 0.0 },
            "attn_k.weight" if layer0 => row[0] = if r % d == d - 1 { 1.0 } else { 0.0 },
            "attn_v.weight" if layer0 => {
                if r < s_len {
                    row[1 + r] = 1.0;
                }
            }
            "attn_output.weight" if layer0 => {
                // Output channel r ≥ 1 takes the first head of its KV group.
                if (1..=s_len).contains(&r) {
                    let (j, i) = ((r - 1) / d, (r - 1) % d);
                    row[j * group * d + i] = gamma;
                }
            }
            "ffn_gate.weight" | "ffn_up.weight" if layer0 => {
                if r < v {
                    let k = if role == "ffn_gate.weight" { kappa } else { 1.0 } / s_len as f32;
                    for c in 1..=s_len {
                        row[c] = k * emb[r * e + c];
                    }
                }
            }
            "ffn_down.weight" if layer0 => {
                if r >= 1 {
                    for (j, x) in row.iter_mut().enumerate().take(v) {
                        let mut t = j;
                        let mut sum = 0.0;
                        for _ in 0..chain {
                            sum += emb[t * e + r];
                            t = perm[t] as usize;
                        }
                        *x = delta * sum;
                    }
                }
            }
            "attn_output.weight" | "ffn_down.weight" | "attn_conv_proj.weight" | "ffn_conv_proj.weight" => {}
            // Identity convolutions: tap 0 of either side is 1.
            "attn_conv_base" | "ffn_conv_base" => {
                let k = hp.conv.map_or(1, |c| c.0.max(1)) as usize;
                if r % k == 0 {
                    row.iter_mut().for_each(|x| *x = 1.0);
                }
            }
            "selector_hidden.weight" => row[0] = -gate_scale,
            "selector_predecessor.weight" => code(r, row),
            "selector_successor.weight" => code(inverse[r], row),
            _ => return false,
        }
        true
    };
    write_tensors(path, w, &tensors, seed, &|_| 1.0, &special, &mut |_, _| {})
}

/// Writes a `qwen35` GGUF (llama.cpp's names and keys) with random weights
/// from `seed`: matrices uniform in ±√(3/n_in), norm weights 1 ± 0.1 (as
/// the converter stores them, already +1-shifted), `ssm_a` in
/// `[−1.5, −0.5]` (−exp(A_log)), conv kernels and `ssm_dt.bias` uniform;
/// the NextN (MTP) block when `hp.n_nextn == 1`. Returns the file size in
/// bytes.
///
/// # Errors
/// [`Error::Model`] for inconsistent hyper-parameters or a type whose block
/// does not divide a row; GGUF write errors naming the path.
pub fn write_qwen35_gguf(
    path: impl AsRef<std::path::Path>,
    hp: &super::qwen35::Qwen35Hparams,
    types: &TensorTypes,
    seed: u64,
) -> Result<u64> {
    write_qwen35_gguf_with(path, hp, types, seed, Weights::Random)
}

/// [`write_qwen35_gguf`] with the weights of `kind`. With
/// [`Weights::Permutation`] the trunk follows the permutation as the
/// `qwen3` generator's does (±1 embeddings, a head mapping token `t`'s
/// embedding to `perm(t)`, small mixer and FFN outputs), and the MTP block
/// predicts the target: `eh_proj` passes the normed embedding through
/// (`[I | 0]`) and its attention and FFN outputs are small, so from
/// `(token t, any hidden state)` it predicts `perm(t)`, and chained on its
/// own output `perm(perm(t))`, ….
///
/// # Errors
/// As [`write_qwen35_gguf`].
pub fn write_qwen35_gguf_with(
    path: impl AsRef<std::path::Path>,
    hp: &super::qwen35::Qwen35Hparams,
    types: &TensorTypes,
    seed: u64,
    kind: Weights,
) -> Result<u64> {
    hp.validate()?;
    let mut w = GgufWriter::new();
    hp.add_to_gguf(&mut w, "shardgraph tiny qwen35")?;
    let tensors = super::qwen35::qwen35_tensors(hp, types)?;
    let structured = kind != Weights::Random;
    let perm = permutation(hp.n_vocab, seed);
    let mut inverse = vec![0i64; perm.len()];
    for (t, &p) in perm.iter().enumerate() {
        inverse[p as usize] = t as i64;
    }
    let damp = |name: &str| {
        let out = ["attn_output.weight", "ssm_out.weight", "ffn_down.weight"];
        if structured && out.iter().any(|o| name.ends_with(o)) {
            0.05
        } else {
            1.0
        }
    };
    let special = |name: &str, r: usize, row: &mut [f32]| -> bool {
        if name.ends_with(".ssm_a") {
            let mut next = stream(seed, name);
            row.iter_mut().for_each(|x| *x = -(1.0 + 0.5 * next()));
        } else if structured && name == "token_embd.weight" {
            permutation_embedding(seed, r as i64, hp.n_vocab, row);
        } else if structured && name == "output.weight" {
            permutation_embedding(seed, inverse.get(r).copied().unwrap_or(0), hp.n_vocab, row);
            let k = 16.0 / row.len().max(1) as f32;
            row.iter_mut().for_each(|x| *x *= k);
        } else if structured && name.ends_with("nextn.eh_proj.weight") {
            row.iter_mut().enumerate().for_each(|(c, x)| *x = if c == r { 1.0 } else { 0.0 });
        } else if structured && name.contains(".nextn.") && name.ends_with("norm.weight") {
            row.iter_mut().for_each(|x| *x = 1.0);
        } else {
            return false;
        }
        true
    };
    write_tensors(path, w, &tensors, seed, &damp, &special, &mut |_, _| {})
}

/// Writes a small example pair into `dir` and returns their paths (target,
/// drafter): `shardgraph-tiny-qwen3.gguf`, a 4-layer `qwen3` (n_embd 256,
/// 8 heads / 4 KV heads of 32, n_ff 512, vocabulary 2048, Q8_0, about
/// 4 MB) whose greedy continuation follows a vocabulary permutation, and
/// `shardgraph-tiny-dflash2.gguf`, a 2-layer DFlash2 drafter for it (block
/// 8, taps of the inputs of target layers 1 and 3, below `n_layer` as
/// llama.cpp needs; convolutions and candidate selector,
/// Q8_0) built to predict that permutation, so most of its drafts are
/// accepted. For quick starts and tests of the main job without real model
/// files; deterministic (seed 1), written in well under a second.
///
/// # Example
/// ```
/// use shardgraph::gguf::GgufFile;
/// use shardgraph_models::dflash::DflashHparams;
/// use shardgraph_models::generate::write_example_pair;
/// use shardgraph_models::qwen3::Qwen3Hparams;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = std::env::temp_dir().join(format!("sg-doc-pair-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let (target, drafter) = write_example_pair(&dir)?;
/// let t = Qwen3Hparams::from_gguf(&GgufFile::open(&target)?)?;
/// let d = DflashHparams::from_gguf(&GgufFile::open(&drafter)?)?;
/// assert_eq!((t.n_layer, t.n_embd, t.n_vocab), (4, 256, 2048));
/// assert_eq!((d.block_size, d.target_layers.clone(), d.n_embd), (8, vec![1, 3], t.n_embd));
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// GGUF write errors naming the path.
pub fn write_example_pair(dir: &std::path::Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    use super::dflash::DflashHparams;
    use super::hparams::HparamsCore;
    let t = Qwen3Hparams { core: HparamsCore::qwen3(4, 256, 512, 8, 4, 32), n_vocab: 2048, n_ctx_train: 4096 };
    let d = DflashHparams {
        core: HparamsCore::qwen3(2, t.n_embd, t.n_vocab, 8, 4, 32),
        target_layers: vec![1, t.n_layer - 1],
        target_hidden: t.n_embd,
        block_size: 8,
        mask_token: (t.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((32, 8)),
    };
    let target = dir.join("shardgraph-tiny-qwen3.gguf");
    let drafter = dir.join("shardgraph-tiny-dflash2.gguf");
    let q8 = TensorTypes::uniform(GgmlType::Q8_0);
    write_qwen3_gguf_with(&target, &t, &q8, 1, Weights::Permutation)?;
    write_dflash_gguf_with(&drafter, &d, &q8, t.n_vocab, 1, Weights::Permutation)?;
    Ok((target, drafter))
}
