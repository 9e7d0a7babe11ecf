//! The hyper-parameters every model shares ([`HparamsCore`]) and the one
//! table of the GGUF keys they come from (`KEYS`: each key's name after
//! `{arch}.`, its range, and per model whether it is required, optional or
//! defaulted), read once through the crate's range-checking key reader
//! (`ArchKeys`). Each model's hyper-parameters embed the core (`hp.core`,
//! and deref to it: `hp.n_embd`) and read only their own extra keys.

use shardgraph::error::{Error, Result};
use shardgraph::ops::{RopeMode, RopeParams};
use std::ops::RangeInclusive;

/// Dimensions and counts a model file may give (llama.cpp reads them as
/// `uint32_t`/`int32_t`): 1 to 2³¹ − 1.
pub(crate) const DIM: RangeInclusive<i64> = 1..=i32::MAX as i64;

/// The hyper-parameters every model has (GGUF keys `{arch}.*` in brackets).
#[derive(Clone, Debug, PartialEq)]
pub struct HparamsCore {
    /// Layers L (`block_count`; a `qwen35` target's trunk: its NextN layers
    /// not counted).
    pub n_layer: usize,
    /// Hidden size E (`embedding_length`).
    pub n_embd: i64,
    /// FFN size F (`feed_forward_length`).
    pub n_ff: i64,
    /// Query heads H (`attention.head_count`).
    pub n_head: i64,
    /// KV heads Hkv (`attention.head_count_kv`).
    pub n_head_kv: i64,
    /// Head size D (`attention.key_length` = `value_length`).
    pub head_dim: i64,
    /// RMSNorm ε (`attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Rope θ base (`rope.freq_base`).
    pub rope_base: f32,
}

impl HparamsCore {
    /// The core of a Qwen3-style model: `n_layer` layers, hidden size
    /// `n_embd`, FFN size `n_ff`, `n_head` query and `n_head_kv` KV heads of
    /// `head_dim`, with Qwen3's RMSNorm ε 1e-6 and rope θ base 1e6. Values
    /// are not checked here (a model's `validate` does).
    pub fn qwen3(n_layer: usize, n_embd: i64, n_ff: i64, n_head: i64, n_head_kv: i64, head_dim: i64) -> Self {
        HparamsCore { n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, rms_eps: 1e-6, rope_base: 1e6 }
    }

    /// Whether both head counts are positive and the KV heads divide the
    /// query heads (GQA groups).
    pub fn heads_divide(&self) -> bool {
        self.n_head > 0 && self.n_head_kv > 0 && self.n_head % self.n_head_kv == 0
    }

    /// Whether the RMSNorm ε and the rope base are finite and positive.
    pub fn eps_and_base_positive(&self) -> bool {
        self.rms_eps.is_finite() && self.rms_eps > 0.0 && self.rope_base.is_finite() && self.rope_base > 0.0
    }

    /// NEOX rope over whole heads with this base (`qwen3` and the DFlash
    /// drafter; `n_ctx_orig` is the training context, 0 for none).
    pub fn neox_rope(&self, n_ctx_orig: i32) -> RopeParams {
        RopeParams {
            n_dims: self.head_dim as i32,
            mode: RopeMode::Neox,
            n_ctx_orig,
            freq_base: self.rope_base,
            ..RopeParams::default()
        }
    }

    /// Writes the shared keys `{arch}.block_count` to
    /// `{arch}.attention.layer_norm_rms_epsilon` in the order they are read,
    /// as a model with whole-head rope has them (`value_length` and
    /// `rope.dimension_count` = the head size), with `context_length` =
    /// `n_ctx_train`.
    ///
    /// # Errors
    /// [`Error::Gguf`] from the writer.
    pub fn add_to_gguf(&self, w: &mut shardgraph::gguf::GgufWriter, arch: &str, n_ctx_train: u32) -> Result<()> {
        let key = |k: &str| format!("{arch}.{k}");
        w.add_kv(&key("block_count"), self.n_layer as u32)?;
        w.add_kv(&key("context_length"), n_ctx_train)?;
        w.add_kv(&key("embedding_length"), self.n_embd as u32)?;
        w.add_kv(&key("feed_forward_length"), self.n_ff as u32)?;
        w.add_kv(&key("attention.head_count"), self.n_head as u32)?;
        w.add_kv(&key("attention.head_count_kv"), self.n_head_kv as u32)?;
        w.add_kv(&key("attention.key_length"), self.head_dim as u32)?;
        w.add_kv(&key("attention.value_length"), self.head_dim as u32)?;
        w.add_kv(&key("rope.freq_base"), self.rope_base)?;
        w.add_kv(&key("rope.dimension_count"), self.head_dim as u32)?;
        w.add_kv(&key("attention.layer_norm_rms_epsilon"), self.rms_eps)?;
        Ok(())
    }
}

/// The tokenizer the generated files name (`tokenizer.ggml.model`):
/// llama.cpp's SentencePiece vocabulary, the one its loader
/// (`llama_vocab::impl::load`) accepts with the fewest keys — the model and
/// `tokenizer.ggml.tokens` (no scores, token types or merges). A file needs
/// a vocabulary for llama.cpp to read its special tokens: with
/// `"no_vocab"` it returns before reading any, so a DFlash drafter's
/// `tokenizer.ggml.mask_token_id` is lost (llama.cpp then drafts with
/// token −1). Its default special tokens for this type (BOS 1, EOS 2,
/// UNK 0) are llama.cpp's; this crate reads only the keys a file gives
/// ([`crate::engine::EOG_KEYS`]).
pub const GENERATED_TOKENIZER: &str = "llama";

/// Writes the minimal vocabulary of `n_vocab` tokens llama.cpp loads
/// ([`GENERATED_TOKENIZER`]): `tokenizer.ggml.model` and
/// `tokenizer.ggml.tokens` = `"tok0"`, `"tok1"`, … (distinct texts, as
/// llama.cpp requires). Token ids are what both engines take, so the texts
/// only name the ids.
///
/// # Errors
/// [`Error::Model`] for `n_vocab` outside 1 to 2³¹ − 1; [`Error::Gguf`]
/// from the writer.
pub fn add_vocabulary(w: &mut shardgraph::gguf::GgufWriter, n_vocab: i64) -> Result<()> {
    if !DIM.contains(&n_vocab) {
        return Err(Error::Model { detail: format!("a vocabulary of {n_vocab} tokens") });
    }
    w.add_kv("tokenizer.ggml.model", GENERATED_TOKENIZER)?;
    w.add_kv("tokenizer.ggml.tokens", (0..n_vocab).map(|i| format!("tok{i}")).collect::<Vec<String>>())?;
    Ok(())
}

/// The number of tokens in `f`'s vocabulary (`tokenizer.ggml.tokens`), or
/// `None` for a file without one (`tokenizer.ggml.model` absent, not a
/// string, `"no_vocab"` or `"none"`, and no token list). Checked as
/// llama.cpp's loader does: the list must be an array of strings, and a
/// file that names a tokenizer must have it.
///
/// # Errors
/// [`Error::Model`] naming the key for a token list that is not an array
/// of strings, or a named tokenizer without a token list.
pub(crate) fn vocabulary_len(f: &shardgraph::gguf::GgufFile) -> Result<Option<i64>> {
    use shardgraph::gguf::{Value, ValueType};
    const TOKENS: &str = "tokenizer.ggml.tokens";
    match f.get(TOKENS) {
        Some(Value::Array(a)) if a.elem_type() == ValueType::String => Ok(Some(a.len() as i64)),
        Some(v) => Err(Error::Model { detail: format!("{TOKENS} is {:?}, not an array of strings", v.value_type()) }),
        None => match f.get("tokenizer.ggml.model").and_then(|v| v.as_str()) {
            Some(m) if m != "no_vocab" && m != "none" => Err(Error::Model {
                detail: format!("tokenizer.ggml.model is {m:?} but the file has no {TOKENS} (llama.cpp refuses it)"),
            }),
            _ => Ok(None),
        },
    }
}

/// The models whose keys [`KEYS`] describes (its columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Model {
    /// `qwen3.*`.
    Qwen3 = 0,
    /// `qwen35.*`.
    Qwen35 = 1,
    /// `dflash.*`.
    Dflash = 2,
}

impl Model {
    /// `general.architecture` and the prefix of the model's keys.
    pub(crate) fn arch(self) -> &'static str {
        match self {
            Model::Qwen3 => "qwen3",
            Model::Qwen35 => "qwen35",
            Model::Dflash => "dflash",
        }
    }
}

/// A key of [`KEYS`], by what it gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    BlockCount,
    ContextLength,
    Embd,
    Ff,
    HeadCount,
    HeadCountKv,
    KeyLength,
    ValueLength,
    RopeBase,
    RopeDims,
    RmsEps,
    VocabSize,
}

/// The values a key may have.
#[derive(Clone, Debug)]
pub(crate) enum Allowed {
    /// An unsigned integer in the range.
    Int(RangeInclusive<i64>),
    /// An `f32`, finite and positive.
    Positive,
}

/// What a model reads a key as.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rule {
    /// The file must have it.
    Required,
    /// The file may leave it out (no value then).
    Optional,
    /// This integer when the file leaves it out.
    Or(i64),
    /// This `f32` when the file leaves it out.
    OrF32(f32),
    /// The value of the (earlier) key `Field` when the file leaves it out.
    OrSame(Field),
    /// `embedding_length / head_count` when the file leaves it out
    /// (llama.cpp's default head size).
    OrEmbdPerHead,
    /// Derived, not read: if the file has it (any non-negative integer, see
    /// [`ArchKeys::must_equal`]) it must equal the value of the (earlier) key
    /// `Field`, for the reason given.
    Equals(Field, &'static str),
}

/// One GGUF key every model reads: its name after `{arch}.`, its values,
/// and per model ([`Model`] order: `qwen3`, `qwen35`, `dflash`) how it is read.
#[derive(Clone, Debug)]
pub(crate) struct Key {
    /// What it gives.
    pub field: Field,
    /// The name after `{arch}.`.
    pub suffix: &'static str,
    /// The values allowed.
    pub allowed: Allowed,
    /// How each model reads it.
    pub rules: [Rule; 3],
}

const VALUE_WHY: &str = "the value heads are as wide as the key heads";
const ROPE_WHY: &str = "the rope turns whole heads";

/// The keys every model reads, in the order they are read (and written by
/// [`HparamsCore::add_to_gguf`]). A key's default may name only keys above
/// it.
pub(crate) const KEYS: [Key; 12] = {
    use Allowed::{Int, Positive};
    use Field::*;
    use Rule::*;
    const LAYERS: RangeInclusive<i64> = 1..=super::MAX_LAYERS as i64;
    [
        Key { field: BlockCount, suffix: "block_count", allowed: Int(LAYERS), rules: [Required; 3] },
        Key {
            field: ContextLength,
            suffix: "context_length",
            allowed: Int(DIM),
            rules: [Required, Or(4096), Optional],
        },
        Key { field: Embd, suffix: "embedding_length", allowed: Int(DIM), rules: [Required; 3] },
        Key { field: Ff, suffix: "feed_forward_length", allowed: Int(DIM), rules: [Required; 3] },
        Key { field: HeadCount, suffix: "attention.head_count", allowed: Int(DIM), rules: [Required; 3] },
        Key {
            field: HeadCountKv,
            suffix: "attention.head_count_kv",
            allowed: Int(DIM),
            rules: [OrSame(HeadCount), Required, OrSame(HeadCount)],
        },
        Key { field: KeyLength, suffix: "attention.key_length", allowed: Int(DIM), rules: [OrEmbdPerHead; 3] },
        Key {
            field: ValueLength,
            suffix: "attention.value_length",
            allowed: Int(DIM),
            rules: [Equals(KeyLength, VALUE_WHY); 3],
        },
        Key { field: RopeBase, suffix: "rope.freq_base", allowed: Positive, rules: [OrF32(10000.0); 3] },
        // qwen35 turns part of each head (partial rotary), the others whole heads.
        Key {
            field: RopeDims,
            suffix: "rope.dimension_count",
            allowed: Int(DIM),
            rules: [Equals(KeyLength, ROPE_WHY), OrSame(KeyLength), Equals(KeyLength, ROPE_WHY)],
        },
        Key { field: RmsEps, suffix: "attention.layer_norm_rms_epsilon", allowed: Positive, rules: [Required; 3] },
        // qwen3 falls back on the embedding's rows, qwen35 checks it against
        // them, a DFlash drafter against its target's.
        Key { field: VocabSize, suffix: "vocab_size", allowed: Int(DIM), rules: [Optional; 3] },
    ]
};

/// A value read.
#[derive(Clone, Copy, Debug)]
enum Value {
    Int(i64),
    F32(f32),
}

/// The keys of [`KEYS`] as a model read them.
#[derive(Clone, Debug)]
pub(crate) struct SharedKeys {
    /// The core (`n_layer` is `block_count`).
    pub core: HparamsCore,
    /// `context_length` (or its default), if the model reads one.
    pub context_length: Option<i64>,
    /// `rope.dimension_count` (or its default) where the model reads it
    /// (`qwen35`); `None` where it is only checked.
    pub rope_dims: Option<i64>,
    /// `vocab_size`, or the length of `tokenizer.ggml.tokens`, if the file
    /// has either (they must agree).
    pub vocab_size: Option<i64>,
}

/// Reads [`KEYS`] from `k`'s file as `k`'s model does: each in turn, its
/// range checked (the first error is returned).
///
/// # Errors
/// [`Error::Gguf`] naming a missing or mistyped key; [`Error::Model`] naming
/// a value out of range or unequal to the key it must equal.
pub(crate) fn read_shared(k: &ArchKeys) -> Result<SharedKeys> {
    let mut got: [Option<Value>; KEYS.len()] = [None; KEYS.len()];
    for key in &KEYS {
        got[key.field as usize] = read_key(k, key, &got)?;
    }
    let missing = |f: Field| Error::Model { detail: format!("{}: no value for {f:?} (the key table)", k.arch) };
    let int = |f: Field| match got[f as usize] {
        Some(Value::Int(v)) => Ok(v),
        _ => Err(missing(f)),
    };
    let f32_ = |f: Field| match got[f as usize] {
        Some(Value::F32(v)) => Ok(v),
        _ => Err(missing(f)),
    };
    let opt = |f: Field| match got[f as usize] {
        Some(Value::Int(v)) => Some(v),
        _ => None,
    };
    // The vocabulary's size: `vocab_size` and the token list agree. When
    // `vocab_size` also disagrees with the embedding's rows, it is the one
    // wrong: the tensor check names the embedding.
    let rows = k.f.tensor_info("token_embd.weight").map(|t| t.ne[1]);
    let vocab_size = match (opt(Field::VocabSize), vocabulary_len(k.f)?) {
        (Some(a), Some(b)) if a != b && rows.is_none_or(|r| r == a) => {
            return Err(Error::Model {
                detail: format!("{}: {}.vocab_size is {a} but tokenizer.ggml.tokens has {b} tokens", k.arch, k.arch),
            })
        }
        (a, b) => a.or(b),
    };
    Ok(SharedKeys {
        core: HparamsCore {
            n_layer: int(Field::BlockCount)? as usize,
            n_embd: int(Field::Embd)?,
            n_ff: int(Field::Ff)?,
            n_head: int(Field::HeadCount)?,
            n_head_kv: int(Field::HeadCountKv)?,
            head_dim: int(Field::KeyLength)?,
            rms_eps: f32_(Field::RmsEps)?,
            rope_base: f32_(Field::RopeBase)?,
        },
        context_length: opt(Field::ContextLength),
        rope_dims: opt(Field::RopeDims),
        vocab_size,
    })
}

/// One key of the table under `k`'s model's rule; `got` holds the keys above it.
fn read_key(k: &ArchKeys, key: &Key, got: &[Option<Value>]) -> Result<Option<Value>> {
    let earlier = |f: Field| match got[f as usize] {
        Some(Value::Int(v)) => Ok(v),
        _ => Err(Error::Model {
            detail: format!("{}: {} defaults to {f:?}, which is not read before it", k.arch, key.suffix),
        }),
    };
    let rule = key.rules[k.model as usize];
    let (s, int) = (key.suffix, Value::Int);
    Ok(match (&key.allowed, rule) {
        (_, Rule::Equals(f, why)) => {
            k.must_equal(s, earlier(f)?, why)?;
            None
        }
        (Allowed::Int(r), Rule::Required) => Some(int(k.int(s, r.clone())?)),
        (Allowed::Int(r), Rule::Optional) => k.opt_int(s, r.clone())?.map(int),
        (Allowed::Int(r), Rule::Or(d)) => Some(int(k.int_or(s, d, r.clone())?)),
        (Allowed::Int(r), Rule::OrSame(f)) => Some(int(k.int_or(s, earlier(f)?, r.clone())?)),
        (Allowed::Int(r), Rule::OrEmbdPerHead) => {
            let d = earlier(Field::Embd)? / earlier(Field::HeadCount)?;
            Some(int(k.int_or(s, d, r.clone())?))
        }
        (Allowed::Positive, Rule::Required) => Some(Value::F32(k.positive(s, None)?)),
        (Allowed::Positive, Rule::OrF32(d)) => Some(Value::F32(k.positive(s, Some(d))?)),
        (allowed, rule) => {
            return Err(Error::Model { detail: format!("{}: {s}: no reading of {allowed:?} as {rule:?}", k.arch) })
        }
    })
}

/// A GGUF's `{arch}.*` metadata (llama.cpp's per-architecture keys), read
/// with range checks: every value that sizes something is checked before
/// it is used, and an error names the key, the value found and the range
/// allowed.
pub(crate) struct ArchKeys<'a> {
    f: &'a shardgraph::gguf::GgufFile,
    arch: &'static str,
    model: Model,
}

impl<'a> ArchKeys<'a> {
    /// The reader of `f`'s `{arch}.*` keys for `model`.
    ///
    /// # Errors
    /// [`Error::Model`] if `general.architecture` is another;
    /// [`Error::Gguf`] if it is missing.
    pub(crate) fn new(f: &'a shardgraph::gguf::GgufFile, model: Model) -> Result<Self> {
        let arch = model.arch();
        let found = f.get_str("general.architecture")?;
        if found != arch {
            return Err(Error::Model { detail: format!("general.architecture is {found:?}, not {arch:?}") });
        }
        Ok(ArchKeys { f, arch, model })
    }

    fn full(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn out_of(&self, key: &str, v: impl std::fmt::Display, allowed: impl std::fmt::Display) -> Error {
        Error::Model { detail: format!("{}: {key} = {v} is outside {allowed}", self.arch) }
    }

    /// Integer key `key` (full name) in `range`, `None` if the file has none.
    fn int_key(&self, key: &str, range: &RangeInclusive<i64>) -> Result<Option<i64>> {
        if !self.f.contains_key(key) {
            return Ok(None);
        }
        let v = self.f.get_uint(key)?;
        match i64::try_from(v) {
            Ok(x) if range.contains(&x) => Ok(Some(x)),
            _ => Err(self.out_of(key, v, format!("{}..={}", range.start(), range.end()))),
        }
    }

    /// The integer `{arch}.{k}` in `range`.
    ///
    /// # Errors
    /// [`Error::Gguf`] if missing or not a non-negative integer;
    /// [`Error::Model`] outside `range`.
    pub(crate) fn int(&self, k: &str, range: RangeInclusive<i64>) -> Result<i64> {
        self.int_at(&self.full(k), range)
    }

    /// The integer `{arch}.{k}` in `range`, or `default` if the file has none.
    ///
    /// # Errors
    /// As [`ArchKeys::int`] for a present key.
    pub(crate) fn int_or(&self, k: &str, default: i64, range: RangeInclusive<i64>) -> Result<i64> {
        Ok(self.int_key(&self.full(k), &range)?.unwrap_or(default))
    }

    /// The integer `{arch}.{k}` in `range`, if the file has it.
    ///
    /// # Errors
    /// As [`ArchKeys::int`] for a present key.
    pub(crate) fn opt_int(&self, k: &str, range: RangeInclusive<i64>) -> Result<Option<i64>> {
        self.int_key(&self.full(k), &range)
    }

    /// The integer key `key` in `range`, by its full name (for keys outside
    /// the architecture: `tokenizer.ggml.*`).
    ///
    /// # Errors
    /// As [`ArchKeys::int`].
    pub(crate) fn int_at(&self, key: &str, range: RangeInclusive<i64>) -> Result<i64> {
        match self.int_key(key, &range)? {
            Some(v) => Ok(v),
            // Missing: the reader's error names the key.
            None => self.f.value(key).and(Err(self.out_of(key, "missing", "present keys"))),
        }
    }

    /// The `f32` `{arch}.{k}`, finite and positive (an epsilon, a rope
    /// base), or `default` if the file has none and a default is given.
    ///
    /// # Errors
    /// [`Error::Gguf`] if missing without a default or not an `f32`;
    /// [`Error::Model`] if not finite and positive.
    pub(crate) fn positive(&self, k: &str, default: Option<f32>) -> Result<f32> {
        let key = self.full(k);
        let v = match default {
            Some(d) if !self.f.contains_key(&key) => d,
            _ => self.f.get_f32(&key)?,
        };
        if !(v.is_finite() && v > 0.0) {
            return Err(self.out_of(&key, v, "finite positive numbers"));
        }
        Ok(v)
    }

    /// Checks that the optional `{arch}.{k}` equals `want` (a value this
    /// crate derives otherwise, e.g. `value_length` = `key_length`).
    ///
    /// # Errors
    /// [`Error::Model`] naming both if it differs.
    pub(crate) fn must_equal(&self, k: &str, want: i64, why: &str) -> Result<()> {
        match self.opt_int(k, 0..=i64::MAX)? {
            Some(v) if v != want => {
                Err(Error::Model { detail: format!("{}: {} = {v}, but {why} ({want})", self.arch, self.full(k)) })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Allowed, Field, Rule, KEYS};

    /// Every field has one key, indexed by the field (`read_shared` stores
    /// values at `field as usize`), every key a model defaults from or
    /// compares with is read before it, and every rule fits its key's values.
    #[test]
    fn the_key_table_is_consistent() {
        for (i, key) in KEYS.iter().enumerate() {
            assert_eq!(KEYS.iter().filter(|k| k.field == key.field).count(), 1, "{:?}", key.field);
            assert!((key.field as usize) < KEYS.len(), "{:?}", key.field);
            let earlier = |f: Field| KEYS[..i].iter().any(|k| k.field == f && matches!(k.allowed, Allowed::Int(_)));
            for rule in key.rules {
                let ok = match (&key.allowed, rule) {
                    (_, Rule::Equals(f, _)) | (Allowed::Int(_), Rule::OrSame(f)) => earlier(f),
                    (Allowed::Int(_), Rule::OrEmbdPerHead) => earlier(Field::Embd) && earlier(Field::HeadCount),
                    (Allowed::Int(_), Rule::Required | Rule::Optional | Rule::Or(_)) => true,
                    (Allowed::Positive, Rule::Required | Rule::OrF32(_)) => true,
                    _ => false,
                };
                assert!(ok, "{}: {rule:?}", key.suffix);
            }
        }
    }
}
