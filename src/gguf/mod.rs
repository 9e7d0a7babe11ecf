//! GGUF model files: reading (versions 2 and 3), writing (version 3, or 2
//! on request) and loading tensors into device storage.
//!
//! The format is the one specified in ggml's `docs/gguf.md`; where the spec
//! leaves details open, ggml's `gguf.cpp` is followed (a `general.alignment`
//! entry must be a power-of-two `u32`; keys must be non-empty and unique; the
//! data section starts at the end of the tensor infos rounded up to the
//! alignment; every tensor's data is padded to the alignment). Layout of a
//! little-endian file:
//!
//! ```text
//! "GGUF"  version: u32  n_tensors: u64  n_kv: u64
//! n_kv × (key: string, type: u32, value)
//! n_tensors × (name: string, n_dims: u32, ne[n_dims]: u64, ggml type: u32, offset: u64)
//! zero padding to the alignment
//! tensor data, each at data-section offset `offset` (a multiple of the alignment)
//! ```
//!
//! A string is a `u64` byte count and UTF-8 bytes; an array is an element
//! type (`u32`), a `u64` element count and the elements (strings and arrays
//! included: arrays of arrays nest, each inner array with its own type).
//! Shapes are in ggml order (`ne[0]` innermost), tensor types are ggml's ids
//! ([`crate::GgmlType`]), sizes and offsets are in bytes.
//!
//! * [`GgufFile`] memory-maps and validates a file once, then hands out
//!   typed metadata ([`GgufFile::get_u32`], [`GgufFile::get_str`],
//!   [`GgufFile::get_arr_of`], …; errors name the key and the type found) and
//!   tensors as zero-copy slices of the mapping ([`GgufFile::tensor`]).
//!   It never panics on malformed input and allocates no more than the file
//!   size justifies.
//! * [`GgufWriter`] streams a file to any `Write` with tensor data supplied
//!   in order, by a callback or chunk by chunk.
//! * [`load_into_split_store`] / [`load_into_storage`] copy each tensor from
//!   the mapping into a [`crate::split::SplitStore`] placed for a plan, or
//!   into one CPU device's [`crate::TensorStorage`].
//!
//! ```
//! use shardgraph::gguf::{GgufFile, GgufWriter};
//! use shardgraph::GgmlType;
//!
//! let mut w = GgufWriter::new();
//! w.add_kv("general.architecture", "llama")?;
//! w.add_kv("llama.block_count", 2u32)?;
//! w.add_tensor("w", GgmlType::F32, &[4, 2])?; // ne = [4, 2]: 2 rows of 4
//! let bytes = w.write_to(Vec::new(), |_info, sink| sink.put(&[0u8; 32]))?;
//!
//! let f = GgufFile::from_bytes(bytes, "example.gguf")?;
//! assert_eq!(f.get_str("general.architecture")?, "llama");
//! assert_eq!(f.get_u32("llama.block_count")?, 2);
//! assert!(f.get_u64("llama.block_count").is_err()); // it is a u32
//! let t = f.tensor("w")?;
//! assert_eq!((t.info.ty, t.info.ne, t.data.len()), (GgmlType::F32, [4, 2, 1, 1], 32));
//! # Ok::<(), shardgraph::Error>(())
//! ```

mod load;
mod reader;
mod value;
mod writer;

pub use load::{
    load_into_split_store, load_into_storage, load_tensor_into_split_store, load_tensor_into_storage, LoadReport,
};
pub use reader::{GgufFile, GgufTensor, TensorInfo};
pub use value::{ArrayElem, ArrayRef, MetaArray, MetaValue, Value, ValueType, ALL_VALUE_TYPES};
pub use writer::{GgufStream, GgufWriter, TensorSink};

use crate::error::Error;

/// The magic bytes a GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// The version [`GgufWriter`] writes by default.
pub const VERSION: u32 = 3;

/// The metadata key of the data alignment (`u32`).
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Alignment in bytes when a file has no `general.alignment`.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// Longest tensor name in bytes (the spec's limit; ggml itself takes names
/// of at most 63 bytes).
pub const MAX_TENSOR_NAME: usize = 64;

/// Deepest nesting of arrays accepted (an array of non-arrays has depth 1).
/// The spec sets no limit; this one keeps parsing bounded. ggml's own reader
/// accepts no nested arrays at all.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// [`Error::Gguf`] for file `file`.
pub(crate) fn gguf_err(file: &str, detail: String) -> Error {
    Error::Gguf { file: file.to_string(), detail }
}
