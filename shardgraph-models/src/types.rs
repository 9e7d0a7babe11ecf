//! Where a model's tensor types come from: its weights' ([`TensorTypes`],
//! one type per tensor, by GGUF name) and its KV caches' ([`KvTypes`], K
//! and V apart, llama.cpp's `--cache-type-k` / `--cache-type-v`).
//!
//! A weight's type is the file's when a model is loaded
//! ([`TensorTypes::from_file`]: llama.cpp's quantizer picks it per tensor,
//! e.g. Q6_K for `attn_v`/`ffn_down` in some layers of a Q4_K_M file and
//! Q4_K in the others), or a preset's for generated files and models built
//! by hand ([`TensorTypes::uniform`], [`TensorTypes::q4_k_m`],
//! [`TensorTypes::llama_q4_k_m`], with per-name rules on top). Which types a
//! model accepts is asked of the core, not listed here: a weight matrix
//! needs a dot-product kernel ([`shardgraph::tensor::quant::vec_dot_fn`])
//! and whole blocks per row; a cache type needs the core's `set_rows` and
//! `flash_attn_ext` to take it (and must be one llama.cpp offers for a
//! cache).
//!
//! Imports no model: the models ask it while creating their tensors
//! (`matrix`, `vector`), and their split policies read each layer's types
//! from it.

use shardgraph::error::{Error, Result};
use shardgraph::graph::Context;
use shardgraph::split::glob_match;
use shardgraph::tensor::GgmlType;
use std::collections::BTreeMap;

/// The types of a model's weights, one per tensor (GGUF names, e.g.
/// `blk.3.attn_v.weight`): the one place a model's weight types come from.
///
/// * From a file ([`TensorTypes::from_file`]): each tensor has the type the
///   file's tensor table gives it; a tensor the file lacks is missing (the
///   model's load reports it), and a file without `output.weight` has a
///   tied head ([`TensorTypes::is_tied`]).
/// * A preset ([`TensorTypes::uniform`], [`TensorTypes::q4_k_m`],
///   [`TensorTypes::llama_q4_k_m`]) for generated files and models built by
///   hand: every weight matrix has the preset's default type unless a rule
///   ([`TensorTypes::with`], a glob over the name; the last rule added
///   that matches wins) names another; vectors (norms, biases, convolution
///   kernels) are F32; [`TensorTypes::tied`] leaves `output.weight` out.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorTypes {
    /// The file's tensor table (name → type), when the types come from a file.
    file: Option<BTreeMap<String, GgmlType>>,
    /// Rules over the names of weight matrices: (glob, type); the last match wins.
    rules: Vec<(String, GgmlType)>,
    /// The type of a weight matrix no rule names (a preset).
    default: GgmlType,
    /// A preset without `output.weight` (the head reads `token_embd.weight`).
    tied: bool,
}

/// The GGUF name of a model's output head; a model whose type source has no
/// such tensor reads `token_embd.weight` instead (a tied head).
pub const OUTPUT: &str = "output.weight";

impl TensorTypes {
    /// Every weight matrix of type `ty` (norms and other vectors F32), the
    /// head untied.
    pub fn uniform(ty: GgmlType) -> Self {
        TensorTypes { file: None, rules: Vec::new(), default: ty, tied: false }
    }

    /// The types a GGUF file's tensor table gives (every tensor's own).
    pub fn from_file(f: &shardgraph::gguf::GgufFile) -> Self {
        let table = f.tensors().iter().map(|t| (t.name.clone(), t.ty)).collect();
        TensorTypes { file: Some(table), rules: Vec::new(), default: GgmlType::F32, tied: false }
    }

    /// This preset with weight matrices whose GGUF name matches `pattern` (a
    /// glob: `*` any run of characters) of type `ty`; rules added later win
    /// over earlier ones. Types from a file ([`TensorTypes::from_file`])
    /// ignore rules: the file's table decides.
    pub fn with(mut self, pattern: &str, ty: GgmlType) -> Self {
        self.rules.push((pattern.to_string(), ty));
        self
    }

    /// This preset without `output.weight`: the head is tied to
    /// `token_embd.weight` (as the real Qwen3-0.6B, 1.7B and 4B are).
    pub fn tied(mut self) -> Self {
        self.tied = true;
        self
    }

    /// A layout like llama.cpp's Q4_K_M with one type per role, the same in
    /// every layer: Q4_K for the embedding, the Q/K/output projections and
    /// FFN gate/up, Q6_K for every `attn_v` and `ffn_down`, Q8_0 for the
    /// output head. Rows must be multiples of 256 (the K-quant super-block).
    pub fn q4_k_m() -> Self {
        Self::uniform(GgmlType::Q4_K)
            .with("blk.*.attn_v.weight", GgmlType::Q6_K)
            .with("blk.*.ffn_down.weight", GgmlType::Q6_K)
            .with(OUTPUT, GgmlType::Q8_0)
    }

    /// llama.cpp's Q4_K_M choice per layer for a `qwen3`-style model of
    /// `n_layer` layers (its quantizer's `llama_tensor_get_type`): Q4_K
    /// everywhere, but Q6_K for `attn_v` and `ffn_down` in the layers
    /// [`use_more_bits`] picks (the first and last eighth and every third
    /// layer between) and for the output head.
    pub fn llama_q4_k_m(n_layer: usize) -> Self {
        let mut t = Self::uniform(GgmlType::Q4_K).with(OUTPUT, GgmlType::Q6_K);
        for il in (0..n_layer).filter(|&il| use_more_bits(il, n_layer)) {
            t = t.with(&format!("blk.{il}.attn_v.weight"), GgmlType::Q6_K);
            t = t.with(&format!("blk.{il}.ffn_down.weight"), GgmlType::Q6_K);
        }
        t
    }

    /// Whether the types come from a file's tensor table.
    pub fn is_from_file(&self) -> bool {
        self.file.is_some()
    }

    /// Whether the model's head is tied to its embedding: no `output.weight`
    /// (in the file, or a preset made with [`TensorTypes::tied`]).
    pub fn is_tied(&self) -> bool {
        match &self.file {
            Some(t) => !t.contains_key(OUTPUT),
            None => self.tied,
        }
    }

    /// The type of the weight matrix `name` (GGUF name): the file's, or the
    /// preset's rule or default; `None` if the file has no such tensor or
    /// the name is a tied preset's `output.weight`.
    pub fn get(&self, name: &str) -> Option<GgmlType> {
        match &self.file {
            Some(t) => t.get(name).copied(),
            None if self.tied && name == OUTPUT => None,
            None => Some(self.rules.iter().rev().find(|(p, _)| glob_match(p, name)).map_or(self.default, |r| r.1)),
        }
    }

    /// The block size of weight `name`'s type (1 for a tensor the source
    /// lacks): what a split of its rows must respect.
    pub fn block(&self, name: &str) -> i64 {
        self.get(name).map_or(1, |t| t.block_size() as i64)
    }

    /// The type of weight matrix `name` of shape `ne` in `model`, checked:
    /// the core has a dot-product kernel for it (every matrix is read by
    /// `mul_mat` or `get_rows`) and each row is whole blocks. A tensor the
    /// file lacks gets F32 here (the file check then reports it missing).
    ///
    /// # Errors
    /// [`Error::Model`] naming `model`, the tensor and its type.
    pub(crate) fn matrix(&self, model: &str, name: &str, ne: &[i64]) -> Result<GgmlType> {
        let Some(ty) = self.get(name) else { return Ok(GgmlType::F32) };
        if shardgraph::tensor::quant::vec_dot_fn(ty).is_none() {
            return Err(Error::Model {
                detail: format!(
                    "{model}: {name} is {ty}, a type this build has no matrix kernel for (no dot product in \
                     shardgraph::tensor::quant)"
                ),
            });
        }
        let ne0 = ne.first().copied().unwrap_or(1);
        if ne0 % ty.block_size() as i64 != 0 {
            return Err(Error::Model {
                detail: format!(
                    "{model}: {name} is {ty}{ne:?}: rows of {ne0} are not whole {ty} blocks of {}",
                    ty.block_size()
                ),
            });
        }
        Ok(ty)
    }

    /// The type of vector weight `name` (a norm, a bias, a convolution
    /// kernel, `ssm_a`: read by element-wise ops) in `model`: F32, as
    /// llama.cpp's converter and quantizer keep them.
    ///
    /// # Errors
    /// [`Error::Model`] naming `model`, the tensor and its type if a file
    /// gives another type.
    pub(crate) fn vector(&self, model: &str, name: &str) -> Result<GgmlType> {
        match self.file.as_ref().and_then(|t| t.get(name)) {
            Some(&ty) if ty != GgmlType::F32 => Err(Error::Model {
                detail: format!("{model}: {name} is {ty}; element-wise weights (norms, biases, kernels) must be f32"),
            }),
            _ => Ok(GgmlType::F32),
        }
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)` (its quantizer gives
/// these layers' `attn_v` and `ffn_down` more bits in the `_M` mixes): the
/// first and last eighth of the layers, and every third layer between.
pub fn use_more_bits(i_layer: usize, n_layers: usize) -> bool {
    let eighth = n_layers / 8;
    // (`i_layer − eighth` is evaluated only when the first test fails.)
    i_layer < eighth || i_layer >= 7 * n_layers / 8 || (i_layer - eighth) % 3 == 2
}

/// The types of a model's KV caches (llama.cpp's `--cache-type-k` and
/// `--cache-type-v`): K and V may differ. `KvTypes::from(ty)` is both of
/// one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvTypes {
    /// The K cache's type.
    pub k: GgmlType,
    /// The V cache's type.
    pub v: GgmlType,
}

impl From<GgmlType> for KvTypes {
    fn from(ty: GgmlType) -> Self {
        KvTypes { k: ty, v: ty }
    }
}

impl std::fmt::Display for KvTypes {
    /// `f16`, or `K q8_0, V f16` when they differ.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "K {}, V {}", self.k, self.v)
        }
    }
}

/// The cache types llama.cpp offers (`--cache-type-k`, `--cache-type-v`;
/// all of them need flash attention for V, which the models always use),
/// by ggml name. A type is accepted when it is one of these and the core
/// has it ([`KvTypes::check`]).
pub const LLAMA_CACHE_TYPES: [&str; 9] = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"];

/// The ggml type named `name` (`ggml_type_name`: `f16`, `q8_0`, `q4_K`, …)
/// among the types the core has.
pub fn ggml_type_by_name(name: &str) -> Option<GgmlType> {
    shardgraph::tensor::ALL_TYPES.iter().copied().find(|t| t.name() == name)
}

/// A cache type from its llama.cpp name (`--cache-type-k q8_0`).
///
/// # Errors
/// [`Error::Model`] naming `option` and the value: not one of
/// [`LLAMA_CACHE_TYPES`], or one this build's core lacks.
pub fn cache_type_by_name(option: &str, name: &str) -> Result<GgmlType> {
    let list = LLAMA_CACHE_TYPES.join(", ");
    if !LLAMA_CACHE_TYPES.contains(&name) {
        return Err(Error::Model { detail: format!("{option} {name}: llama.cpp's cache types are {list}") });
    }
    ggml_type_by_name(name).ok_or_else(|| Error::Model {
        detail: format!("{option} {name}: this build's core has no {name} type (llama.cpp's cache types: {list})"),
    })
}

impl KvTypes {
    /// K of type `k`, V of type `v`.
    pub fn new(k: GgmlType, v: GgmlType) -> Self {
        KvTypes { k, v }
    }

    /// Checks both types for `model`'s caches of heads of `head_dim`: each
    /// is one of llama.cpp's cache types ([`LLAMA_CACHE_TYPES`]), the core
    /// writes it (`set_rows` into a cache of that type) and attends over it
    /// (`flash_attn_ext` with K or V of that type: the core's constructors
    /// are asked), and `head_dim` is whole blocks of it.
    ///
    /// # Errors
    /// [`Error::Model`] naming `model`, K or V and the type.
    pub fn check(self, model: &str, head_dim: i64) -> Result<()> {
        for (which, ty) in [("K", self.k), ("V", self.v)] {
            let bad = |why: String| Error::Model { detail: format!("{model}: {which} cache type {ty}: {why}") };
            if !LLAMA_CACHE_TYPES.contains(&ty.name()) {
                return Err(bad(format!("not one of llama.cpp's cache types ({})", LLAMA_CACHE_TYPES.join(", "))));
            }
            if head_dim < 1 || head_dim % ty.block_size() as i64 != 0 {
                return Err(bad(format!("a head of {head_dim} is not whole blocks of {}", ty.block_size())));
            }
            let (k, v) = if which == "K" { (ty, GgmlType::F16) } else { (GgmlType::F16, ty) };
            probe(head_dim, k, v).map_err(|e| bad(format!("the core cannot use it ({e})")))?;
        }
        Ok(())
    }
}

/// Asks the core's constructors whether a cache of K type `k` and V type `v`
/// with heads of `d` can be written (`set_rows`) and attended over
/// (`flash_attn_ext`), in a scratch context.
fn probe(d: i64, k: GgmlType, v: GgmlType) -> Result<()> {
    let mut ctx = Context::new();
    let idx = ctx.new_tensor(GgmlType::I64, &[1])?;
    let rows = ctx.new_tensor(GgmlType::F32, &[d, 1])?;
    let mut views = Vec::new();
    for ty in [k, v] {
        let cache = ctx.new_tensor(ty, &[d, 2])?;
        let w = ctx.set_rows(cache, rows, idx)?;
        let row = ty.row_size(d)?;
        let view = ctx.view_3d(w, d, 2, 1, row, 2 * row, 0)?;
        views.push(view);
    }
    let q = ctx.new_tensor(GgmlType::F32, &[d, 1, 1])?;
    ctx.flash_attn_ext(q, views[0], views[1], None, 1.0, 0.0, 0.0)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_rules_and_tied_heads() {
        let t = TensorTypes::q4_k_m();
        assert_eq!(t.get("blk.3.attn_v.weight"), Some(GgmlType::Q6_K));
        assert_eq!(t.get("blk.3.attn_q.weight"), Some(GgmlType::Q4_K));
        assert_eq!(t.get(OUTPUT), Some(GgmlType::Q8_0));
        assert!(!t.is_tied());
        let t = t.tied().with("blk.0.*", GgmlType::Q8_0);
        assert!(t.is_tied());
        assert_eq!(t.get(OUTPUT), None);
        assert_eq!(t.get("blk.0.attn_v.weight"), Some(GgmlType::Q8_0));
        // llama.cpp's layers with more bits for 8 layers: 0, 3, 6, 7.
        let l = TensorTypes::llama_q4_k_m(8);
        let v: Vec<usize> =
            (0..8).filter(|il| l.get(&format!("blk.{il}.ffn_down.weight")) == Some(GgmlType::Q6_K)).collect();
        assert_eq!(v, vec![0, 3, 6, 7]);
        assert_eq!(l.get(OUTPUT), Some(GgmlType::Q6_K));
    }

    #[test]
    fn matrix_and_cache_types_are_asked_of_the_core() {
        let t = TensorTypes::uniform(GgmlType::Q8_K);
        let e = t.matrix("m", "blk.0.attn_q.weight", &[256, 4]).unwrap_err().to_string();
        assert!(e.contains("blk.0.attn_q.weight") && e.contains("q8_K"), "{e}");
        let e = TensorTypes::uniform(GgmlType::Q4_K).matrix("m", "x.weight", &[64, 4]).unwrap_err().to_string();
        assert!(e.contains("x.weight") && e.contains("q4_K") && e.contains("whole"), "{e}");
        assert_eq!(TensorTypes::uniform(GgmlType::Q8_0).matrix("m", "x", &[64, 4]).unwrap(), GgmlType::Q8_0);
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0] {
            KvTypes::new(ty, GgmlType::F16).check("m", 64).unwrap();
            KvTypes::new(GgmlType::F16, ty).check("m", 64).unwrap();
        }
        let e = KvTypes::new(GgmlType::F16, GgmlType::Q4_K).check("m", 256).unwrap_err().to_string();
        assert!(e.contains("V cache type q4_K"), "{e}");
        let e = KvTypes::from(GgmlType::Q8_0).check("m", 48).unwrap_err().to_string();
        assert!(e.contains("K cache type q8_0") && e.contains("48"), "{e}");
        assert_eq!(cache_type_by_name("--cache-type-v", "q5_1").unwrap(), GgmlType::Q5_1);
        assert!(cache_type_by_name("--cache-type-k", "q4_K").unwrap_err().to_string().contains("--cache-type-k q4_K"));
        assert_eq!(KvTypes::new(GgmlType::Q8_0, GgmlType::F16).to_string(), "K q8_0, V f16");
    }
}
