//! The GGUF reader: parses and validates the header, metadata and tensor
//! infos of a memory-mapped (or in-memory) file once, then hands out values
//! and tensor data as slices of the file.

use super::value::{bytes_at, decode_fixed, str_at, ArrNode, ArrayElem, ArrayRef, Items, Value, ValueType};
use super::{gguf_err, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_TENSOR_NAME};
use crate::backend::MappedBytes;
use crate::error::{Error, Result};
use crate::tensor::{GgmlType, MAX_DIMS};
use std::path::Path;
use std::sync::Arc;

/// One tensor info of a GGUF file (or of a file being written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (at most [`MAX_TENSOR_NAME`] bytes of UTF-8, unique in the file).
    pub name: String,
    /// Element type (ggml's type id in the file).
    pub ty: GgmlType,
    /// Number of dimensions stored in the file (0 to 4).
    pub n_dims: u32,
    /// Element counts in ggml order (`ne[0]` innermost); dims past `n_dims` are 1.
    pub ne: [i64; MAX_DIMS],
    /// Byte offset of the data from the start of the data section (a
    /// multiple of the file's alignment).
    pub offset: u64,
    /// Bytes of data: `row_size(ne[0]) · ne[1] · ne[2] · ne[3]` (`ggml_nbytes`
    /// of the contiguous tensor).
    pub nbytes: usize,
}

impl TensorInfo {
    /// Total element count.
    pub fn nelements(&self) -> i64 {
        self.ne.iter().product()
    }

    /// Type and shape for messages, e.g. `q8_0[64, 3, 1, 1]`.
    pub fn describe(&self) -> String {
        format!("{}{:?}", self.ty, self.ne)
    }
}

/// A tensor of a [`GgufFile`]: its info and its bytes, a slice of the
/// mapped file (no copy).
#[derive(Clone, Copy, Debug)]
pub struct GgufTensor<'a> {
    /// Name, type, shape, offset.
    pub info: &'a TensorInfo,
    /// Absolute byte offset of the data in the file.
    pub file_offset: usize,
    /// The data, `info.nbytes` bytes, in ggml's layout for `info.ty`.
    pub data: &'a [u8],
}

/// Where a metadata value lies in the file (found and validated by the parser).
#[derive(Debug)]
pub(crate) enum Node {
    /// A fixed-size value of this type at this byte.
    Scalar(ValueType, usize),
    /// A string whose length prefix is at this byte.
    Str(usize),
    /// An array (boxed: arrays are rarer than scalars and strings).
    Array(Box<ArrNode>),
}

/// A metadata entry: where its key (a validated string) is, and its value.
#[derive(Debug)]
struct Kv {
    key_at: usize,
    node: Node,
}

/// The bytes of a file: a read-only memory map (with the open file, so
/// that devices can map tensor ranges of their own: [`GgufFile::mapped`]),
/// or an owned buffer.
enum Backing {
    Mmap { map: Arc<memmap2::Mmap>, file: Arc<std::fs::File> },
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap { map, .. } => map,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file (versions 2 and 3, little-endian), after the spec in
/// ggml's `docs/gguf.md` with ggml's `gguf.cpp` for the details the spec
/// leaves open.
///
/// Opening validates the whole structure once: magic, version, every
/// metadata value (strings UTF-8, bools 0 or 1, lengths within the file,
/// arrays of any type including strings and nested arrays up to
/// [`MAX_ARRAY_DEPTH`] levels), keys (non-empty, unique), `general.alignment`
/// (`u32`, a power of two; 32 if absent), and each tensor info (unique name
/// of at most 64 bytes, at most 4 dims, a type this crate implements, `ne[0]`
/// a whole number of blocks, an offset that is a multiple of the alignment,
/// and data that lies inside the file and shares no byte with another
/// tensor's). Afterwards accessors only decode.
///
/// Nothing in a file can make the reader panic, and what it allocates is
/// bounded by the file's size: every count and length is checked against the
/// bytes left before anything is reserved for it, and the parsed structure
/// holds positions into the file rather than copies (strings, array
/// elements and tensor data are decoded on access), so parsing allocates at
/// most about 3.5 times the file's size even for files made of nothing but
/// the smallest entries (`tests/gguf.rs` measures it); a typical model file
/// needs a few bytes per metadata entry and tensor.
pub struct GgufFile {
    name: String,
    backing: Backing,
    version: u32,
    alignment: usize,
    data_offset: usize,
    kvs: Vec<Kv>,
    /// Indices into `kvs`, sorted by key.
    kv_sorted: Vec<usize>,
    tensors: Vec<TensorInfo>,
    /// Indices into `tensors`, sorted by name.
    tensor_sorted: Vec<usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("name", &self.name)
            .field("len", &self.len())
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("n_kv", &self.kvs.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

/// Reads values off a byte slice; errors say what was being read and where.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &dyn std::fmt::Display) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len()).ok_or_else(|| {
            format!(
                "unexpected end of file at byte {} reading {what}: {n} bytes needed, {} left",
                self.pos,
                self.remaining()
            )
        })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u32(&mut self, what: &dyn std::fmt::Display) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &dyn std::fmt::Display) -> Result<u64, String> {
        let at = self.pos;
        self.take(8, what)?;
        bytes_at(self.data, at).map(u64::from_le_bytes).ok_or_else(|| format!("cannot read {what}"))
    }

    /// A GGUF string: `u64` length, then that many bytes of UTF-8.
    fn string(&mut self, what: &dyn std::fmt::Display) -> Result<&'a str, String> {
        let at = self.pos;
        let len = self.u64(&format_args!("the length of {what}"))?;
        if len > self.remaining() as u64 {
            return Err(format!(
                "{what} at byte {at}: length {len} exceeds the {} bytes left in the file",
                self.remaining()
            ));
        }
        let bytes = self.take(len as usize, what)?;
        std::str::from_utf8(bytes).map_err(|e| format!("{what} at byte {at} is not UTF-8 ({e})"))
    }
}

/// `x` rounded up to a multiple of `align` (a power of two).
pub(crate) fn align_up(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// Smallest encoding of a metadata entry: key length (of an empty key), type, a 1-byte value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
/// Smallest encoding of a tensor info: empty name, 0 dims, type, offset.
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;

/// Name of a ggml type id this crate does not implement (the ids ggml
/// removed; every other type of ggml 0.25.3 is a [`GgmlType`]), for messages.
fn ggml_type_name_of(id: u32) -> Option<&'static str> {
    Some(match id {
        4 => "q4_2 (removed from ggml)",
        5 => "q4_3 (removed from ggml)",
        31 => "q4_0_4_4 (removed from GGUF)",
        32 => "q4_0_4_8 (removed from GGUF)",
        33 => "q4_0_8_8 (removed from GGUF)",
        36 => "iq4_nl_4_4 (removed from GGUF)",
        37 => "iq4_nl_4_8 (removed from GGUF)",
        38 => "iq4_nl_8_8 (removed from GGUF)",
        _ => return None,
    })
}

fn parse_value(c: &mut Cursor<'_>, ty: ValueType, depth: usize) -> Result<Node, String> {
    match ty {
        ValueType::String => {
            let at = c.pos;
            c.string(&"the string")?;
            Ok(Node::Str(at))
        }
        ValueType::Array => Ok(Node::Array(Box::new(parse_array(c, depth + 1)?))),
        _ => {
            let size = ty.fixed_size().unwrap_or(1);
            let at = c.pos;
            let b = c.take(size, &format_args!("a {ty} value"))?;
            if ty == ValueType::Bool && b[0] > 1 {
                return Err(format!("bool at byte {at} is {} (must be 0 or 1)", b[0]));
            }
            Ok(Node::Scalar(ty, at))
        }
    }
}

/// An array after its (outer) type id: element type, count, elements.
fn parse_array(c: &mut Cursor<'_>, depth: usize) -> Result<ArrNode, String> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"));
    }
    let at = c.pos;
    let elem_id = c.u32(&"an array's element type")?;
    let elem = ValueType::from_id(elem_id)
        .ok_or_else(|| format!("array at byte {at} has unknown element type id {elem_id}"))?;
    let n = c.u64(&"an array's length")?;
    let rem = c.remaining();
    let too_long = |min: usize| {
        format!("array of {n} {elem} elements at byte {at} needs at least {min} bytes each, {rem} bytes left")
    };
    match elem.fixed_size() {
        Some(size) => {
            let total = n.checked_mul(size as u64).filter(|&t| t <= rem as u64).ok_or_else(|| too_long(size))?;
            let pos = c.pos;
            let bytes = c.take(total as usize, &"array elements")?;
            if elem == ValueType::Bool {
                if let Some(i) = bytes.iter().position(|&b| b > 1) {
                    return Err(format!("bool element {i} of the array at byte {at} is {} (must be 0 or 1)", bytes[i]));
                }
            }
            Ok(ArrNode { elem, pos, items: Items::Fixed(total as usize / size) })
        }
        None if elem == ValueType::String => {
            if n > (rem / 8) as u64 {
                return Err(too_long(8));
            }
            let pos = c.pos;
            let mut starts = Vec::with_capacity(n as usize);
            for i in 0..n {
                starts.push(c.pos);
                c.string(&format_args!("string element {i}"))?;
            }
            Ok(ArrNode { elem, pos, items: Items::Strings(starts.into_boxed_slice()) })
        }
        None => {
            if n > (rem / 12) as u64 {
                return Err(too_long(12));
            }
            let pos = c.pos;
            let mut inner = Vec::with_capacity(n as usize);
            for i in 0..n {
                inner.push(parse_array(c, depth + 1).map_err(|e| format!("array element {i}: {e}"))?);
            }
            Ok(ArrNode { elem, pos, items: Items::Arrays(inner.into_boxed_slice()) })
        }
    }
}

/// What the parser found; `GgufFile` adds the bytes and the name.
struct Parsed {
    version: u32,
    alignment: usize,
    data_offset: usize,
    kvs: Vec<Kv>,
    kv_sorted: Vec<usize>,
    tensors: Vec<TensorInfo>,
    tensor_sorted: Vec<usize>,
}

/// The key of entry `kv` (validated by the parser).
fn key_of<'a>(data: &'a [u8], kv: &Kv) -> &'a str {
    str_at(data, kv.key_at).unwrap_or("")
}

/// Indices `0..n` sorted (stably) by `key`; the first adjacent pair with
/// equal keys, in file order, is a duplicate.
fn sorted_index<'a>(n: usize, key: impl Fn(usize) -> &'a str) -> (Vec<usize>, Option<(usize, usize)>) {
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| key(a).cmp(key(b)));
    let dup = idx.windows(2).filter(|w| key(w[0]) == key(w[1])).map(|w| (w[0], w[1])).min_by_key(|&(_, j)| j);
    (idx, dup)
}

/// Binary search of `sorted` (indices sorted by `key`) for `want`.
fn find_sorted<'a>(sorted: &[usize], want: &str, key: impl Fn(usize) -> &'a str) -> Option<usize> {
    sorted.binary_search_by(|&i| key(i).cmp(want)).ok().map(|p| sorted[p])
}

/// Reads the header: checks the magic and the version (2 or 3) and returns
/// `(version, n_tensors, n_kv)`, both counts checked against the bytes left.
fn parse_header(c: &mut Cursor<'_>) -> Result<(u32, u64, u64), String> {
    let magic = c.take(4, &"the magic")?;
    if magic != MAGIC {
        return Err(format!("bad magic {:?} (expected \"GGUF\"): not a GGUF file", String::from_utf8_lossy(magic)));
    }
    let version = c.u32(&"the version")?;
    match version {
        2 | 3 => {}
        0 => return Err("version 0 is not a GGUF version".into()),
        1 => return Err("GGUF version 1 is not supported (only versions 2 and 3)".into()),
        v if v & 0xFFFF == 0 => {
            return Err(format!(
                "version {v:#010x} reads as a byte-swapped small number: big-endian GGUF files are not supported"
            ))
        }
        v => return Err(format!("GGUF version {v} is not supported (only versions 2 and 3)")),
    }
    let n_tensors = c.u64(&"the tensor count")?;
    let n_kv = c.u64(&"the metadata count")?;
    if n_kv > (c.remaining() / MIN_KV_BYTES) as u64 {
        return Err(format!(
            "metadata count {n_kv} cannot fit in the {} bytes left (each entry takes at least {MIN_KV_BYTES})",
            c.remaining()
        ));
    }
    if n_tensors > (c.remaining() / MIN_TENSOR_INFO_BYTES) as u64 {
        return Err(format!(
            "tensor count {n_tensors} cannot fit in the {} bytes left (each info takes at least \
             {MIN_TENSOR_INFO_BYTES})",
            c.remaining()
        ));
    }
    Ok((version, n_tensors, n_kv))
}

/// Reads the `n_kv` metadata entries (non-empty keys, validated values) and
/// returns them with their key-sorted index; a repeated key is an error.
fn parse_kvs(c: &mut Cursor<'_>, n_kv: u64) -> Result<(Vec<Kv>, Vec<usize>), String> {
    let mut kvs = Vec::with_capacity(n_kv as usize);
    for i in 0..n_kv as usize {
        let key_at = c.pos;
        let key = c.string(&format_args!("the key of metadata entry {i}"))?;
        if key.is_empty() {
            return Err(format!("metadata entry {i} has an empty key"));
        }
        let at = c.pos;
        let type_id = c.u32(&format_args!("the value type of key {key:?}"))?;
        let ty = ValueType::from_id(type_id)
            .ok_or_else(|| format!("key {key:?}: unknown value type id {type_id} at byte {at}"))?;
        let node = parse_value(c, ty, 0).map_err(|e| format!("key {key:?}: {e}"))?;
        kvs.push(Kv { key_at, node });
    }
    let data = c.data;
    let (kv_sorted, dup) = sorted_index(kvs.len(), |i| key_of(data, &kvs[i]));
    if let Some((i, j)) = dup {
        return Err(format!("duplicate key {:?} (metadata entries {i} and {j})", key_of(data, &kvs[i])));
    }
    Ok((kvs, kv_sorted))
}

/// The file's alignment: `general.alignment` (a `u32` power of two) or
/// [`DEFAULT_ALIGNMENT`] when the key is absent.
fn alignment_of(data: &[u8], kvs: &[Kv], kv_sorted: &[usize]) -> Result<usize, String> {
    Ok(match find_sorted(kv_sorted, ALIGNMENT_KEY, |i| key_of(data, &kvs[i])).map(|i| &kvs[i].node) {
        None => DEFAULT_ALIGNMENT,
        Some(Node::Scalar(ValueType::U32, at)) => {
            let a = bytes_at(data, *at).map(u32::from_le_bytes).unwrap_or(0);
            if a == 0 || !a.is_power_of_two() {
                return Err(format!("key {ALIGNMENT_KEY:?}: alignment {a} is not a power of two"));
            }
            a as usize
        }
        Some(n) => {
            let found = match n {
                Node::Scalar(t, _) => t.name(),
                Node::Str(_) => "str",
                Node::Array(_) => "arr",
            };
            return Err(format!("key {ALIGNMENT_KEY:?} is {found}, must be u32"));
        }
    })
}

/// Reads tensor info `i`: name (at most [`MAX_TENSOR_NAME`] bytes), dims
/// (at most [`MAX_DIMS`], element count within `i64`), a type this crate
/// implements with `ne[0]` a whole number of blocks, a byte size that fits
/// `usize`, and an offset that is a multiple of `alignment`.
fn parse_tensor_info(c: &mut Cursor<'_>, i: usize, alignment: usize) -> Result<TensorInfo, String> {
    let name = c.string(&format_args!("the name of tensor {i}"))?;
    if name.len() > MAX_TENSOR_NAME {
        return Err(format!("tensor {i} name {name:?} is {} bytes long (at most {MAX_TENSOR_NAME})", name.len()));
    }
    let t = |e: String| format!("tensor {name:?}: {e}");
    let n_dims = c.u32(&"the dimension count").map_err(t)?;
    if n_dims as usize > MAX_DIMS {
        return Err(t(format!("{n_dims} dimensions (at most {MAX_DIMS})")));
    }
    let mut ne = [1i64; MAX_DIMS];
    for (j, d) in ne.iter_mut().enumerate().take(n_dims as usize) {
        let v = c.u64(&format_args!("ne[{j}]")).map_err(t)?;
        *d = i64::try_from(v).map_err(|_| t(format!("ne[{j}] = {v} exceeds i64::MAX")))?;
    }
    if ne.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d)).is_none() {
        return Err(t(format!("element count of {ne:?} overflows i64")));
    }
    let type_id = c.u32(&"the type").map_err(t)?;
    let ty = GgmlType::from_id(type_id).map_err(|_| match ggml_type_name_of(type_id) {
        Some(n) => t(format!("ggml type id {type_id} ({n}) is not supported by this crate")),
        None => t(format!("unknown ggml type id {type_id}")),
    })?;
    let row = ty
        .row_size(ne[0])
        .map_err(|_| t(format!("ne[0] = {} is not a multiple of {}'s block size {}", ne[0], ty, ty.block_size())))?;
    let nbytes = [ne[1], ne[2], ne[3]]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .ok_or_else(|| t(format!("{ty}{ne:?} has more bytes than fit in usize")))?;
    let offset = c.u64(&"the data offset").map_err(t)?;
    if offset % alignment as u64 != 0 {
        return Err(t(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
    }
    Ok(TensorInfo { name: name.to_string(), ty, n_dims, ne, offset, nbytes })
}

/// Reads the `n_tensors` tensor infos and returns them with their
/// name-sorted index; a repeated name is an error.
fn parse_tensor_infos(
    c: &mut Cursor<'_>,
    n_tensors: u64,
    alignment: usize,
) -> Result<(Vec<TensorInfo>, Vec<usize>), String> {
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors as usize {
        tensors.push(parse_tensor_info(c, i, alignment)?);
    }
    let (tensor_sorted, dup) = sorted_index(tensors.len(), |i| tensors[i].name.as_str());
    if let Some((i, j)) = dup {
        return Err(format!("duplicate tensor name {:?} (tensors {i} and {j})", tensors[i].name));
    }
    Ok((tensors, tensor_sorted))
}

/// Checks that every tensor's data lies inside the file (`len` bytes, data
/// section at `data_offset`, which must itself be inside the file when there
/// are tensors; `infos_end` is where the tensor infos end, for the message).
fn check_tensor_bounds(
    tensors: &[TensorInfo],
    data_offset: u64,
    infos_end: usize,
    alignment: usize,
    len: u64,
) -> Result<(), String> {
    if !tensors.is_empty() && data_offset > len {
        return Err(format!(
            "the data section starts at byte {data_offset} (tensor infos end at {infos_end}, alignment {alignment}), \
             past the end of the file ({len} bytes)"
        ));
    }
    for ti in tensors {
        let start = data_offset.checked_add(ti.offset);
        let end = start.and_then(|s| s.checked_add(ti.nbytes as u64));
        match (start, end) {
            (Some(_), Some(e)) if e <= len => {}
            _ => {
                return Err(format!(
                    "tensor {:?} ({}, {} bytes at data offset {}): data runs past the end of the file ({len} bytes, \
                     data section at byte {data_offset})",
                    ti.name,
                    ti.describe(),
                    ti.nbytes,
                    ti.offset
                ))
            }
        }
    }
    Ok(())
}

/// Checks that no two tensors share bytes (ggml's loader lays them out one
/// after another; a retyped or hand-edited info that overlaps another is
/// corrupt). Needs [`check_tensor_bounds`] first, so the ends cannot overflow.
fn check_no_overlap(tensors: &[TensorInfo]) -> Result<(), String> {
    let mut by_offset: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].nbytes > 0).collect();
    by_offset.sort_by_key(|&i| tensors[i].offset);
    for w in by_offset.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        // Both ends are within the file (checked above), so this cannot overflow.
        if a.offset + a.nbytes as u64 > b.offset {
            return Err(format!(
                "tensors {:?} ({}, {} bytes at data offset {}) and {:?} (at data offset {}) overlap",
                a.name,
                a.describe(),
                a.nbytes,
                a.offset,
                b.name,
                b.offset
            ));
        }
    }
    Ok(())
}

/// Parses and validates a whole file: header, metadata, alignment, tensor
/// infos, then where the tensor data lies.
fn parse(data: &[u8]) -> Result<Parsed, String> {
    let mut c = Cursor { data, pos: 0 };
    let (version, n_tensors, n_kv) = parse_header(&mut c)?;
    let (kvs, kv_sorted) = parse_kvs(&mut c, n_kv)?;
    let alignment = alignment_of(data, &kvs, &kv_sorted)?;
    let (tensors, tensor_sorted) = parse_tensor_infos(&mut c, n_tensors, alignment)?;
    let len = data.len() as u64;
    let data_offset = align_up(c.pos as u64, alignment as u64).unwrap_or(u64::MAX);
    check_tensor_bounds(&tensors, data_offset, c.pos, alignment, len)?;
    check_no_overlap(&tensors)?;
    Ok(Parsed {
        version,
        alignment,
        data_offset: data_offset.min(len) as usize,
        kvs,
        kv_sorted,
        tensors,
        tensor_sorted,
    })
}

fn node_value<'a>(data: &'a [u8], node: &'a Node) -> Option<Value<'a>> {
    match node {
        Node::Scalar(ty, at) => decode_fixed(data, *ty, *at),
        Node::Str(at) => str_at(data, *at).map(Value::String),
        Node::Array(a) => Some(Value::Array(ArrayRef { data, node: a })),
    }
}

/// `str`, `u32`, or `arr[u32]` for messages.
fn type_label(v: &Value<'_>) -> String {
    match v {
        Value::Array(a) => format!("arr[{}]", a.elem_type()),
        v => v.value_type().name().to_string(),
    }
}

/// A value for messages: its type and, for a scalar or string, the value
/// (`i64 -2`, `str "2"`, `arr[str] of 1`).
fn value_label(v: &Value<'_>) -> String {
    match v {
        Value::Array(a) => format!("arr[{}] of {}", a.elem_type(), a.len()),
        Value::String(t) => format!("str {t:?}"),
        v => format!("{} {}", type_label(v), scalar_text(v)),
    }
}

/// A scalar value's text.
fn scalar_text(v: &Value<'_>) -> String {
    match *v {
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        Value::Bool(x) => x.to_string(),
        _ => String::new(),
    }
}

macro_rules! getters {
    ($($(#[$doc:meta])* $fn:ident -> $t:ty, $var:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Errors
        /// [`Error::Gguf`] naming the key if it is missing or holds another
        /// type (the message names the type found).
        pub fn $fn(&self, key: &str) -> Result<$t> {
            match self.value(key)? {
                Value::$var(x) => Ok(x),
                v => Err(self.err(format!("key {key:?} is {}, not {}", type_label(&v), ValueType::$var))),
            }
        }
    )*};
}

macro_rules! array_getters {
    ($($(#[$doc:meta])* $fn:ident -> $t:ty;)*) => {$(
        $(#[$doc])*
        ///
        /// # Errors
        /// [`Error::Gguf`] naming the key if it is missing, not an array, or an
        /// array of another element type (the message names the type found).
        pub fn $fn(&self, key: &str) -> Result<Vec<$t>> {
            self.get_arr_of::<$t>(key)
        }
    )*};
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`. Tensor data stays in the
    /// mapping: [`GgufFile::tensor`] returns slices of it.
    ///
    /// The file must not be truncated or rewritten while the `GgufFile`
    /// lives, nor while a model loaded from it into a
    /// [`crate::split::SplitStore`] does: CPU devices compute on the
    /// file's pages ([`GgufFile::mapped`]). As with every memory-mapped
    /// model loader (llama.cpp's too), a shrinking file makes later reads
    /// of the mapping fault (`SIGBUS`) and a file rewritten in place changes
    /// the weights under the model. Replacing it (a new file renamed over
    /// the path) is safe: the old one stays mapped.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the path: the file cannot be opened or mapped,
    /// or it is not a valid GGUF v2/v3 file (the message names the key or
    /// tensor and what is wrong).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let name = path.display().to_string();
        // Only a regular file: opening a FIFO or a device could block or
        // read without end.
        let meta = std::fs::metadata(path).map_err(|e| gguf_err(&name, format!("cannot open: {e}")))?;
        if !meta.is_file() {
            return Err(gguf_err(&name, "not a regular file".into()));
        }
        let file = std::fs::File::open(path).map_err(|e| gguf_err(&name, format!("cannot open: {e}")))?;
        let len = file.metadata().map_err(|e| gguf_err(&name, format!("cannot stat: {e}")))?.len();
        let backing = if len == 0 {
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only and private to this value; the
            // documented contract is that the file is not modified while mapped.
            let map = unsafe { memmap2::Mmap::map(&file) };
            let map = map.map_err(|e| gguf_err(&name, format!("cannot memory-map: {e}")))?;
            Backing::Mmap { map: Arc::new(map), file: Arc::new(file) }
        };
        Self::from_backing(name, backing)
    }

    /// Parses a GGUF file held in memory; `name` stands for the path in errors.
    ///
    /// # Errors
    /// As [`GgufFile::open`].
    pub fn from_bytes(bytes: impl Into<Vec<u8>>, name: &str) -> Result<Self> {
        Self::from_backing(name.to_string(), Backing::Owned(bytes.into()))
    }

    fn from_backing(name: String, backing: Backing) -> Result<Self> {
        let p = parse(backing.bytes()).map_err(|d| gguf_err(&name, d))?;
        Ok(GgufFile {
            name,
            backing,
            version: p.version,
            alignment: p.alignment,
            data_offset: p.data_offset,
            kvs: p.kvs,
            kv_sorted: p.kv_sorted,
            tensors: p.tensors,
            tensor_sorted: p.tensor_sorted,
        })
    }

    fn err(&self, detail: String) -> Error {
        gguf_err(&self.name, detail)
    }

    /// The path (or the name given to [`GgufFile::from_bytes`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// File size in bytes.
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// True for an empty file (never the case for a parsed one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if the data is memory-mapped (opened with [`GgufFile::open`]).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mmap { .. })
    }

    /// Tensor `t`'s data as a range of the mapped file, which a device that
    /// computes on host memory adopts without copying
    /// ([`crate::Backend::map_buffer`]; the loaders in [`crate::gguf`] do);
    /// `None` for a file parsed from memory ([`GgufFile::from_bytes`]) or a
    /// tensor of another file.
    pub fn mapped(&self, t: &GgufTensor<'_>) -> Option<MappedBytes> {
        let Backing::Mmap { map, file } = &self.backing else { return None };
        let same = std::ptr::eq(t.data.as_ptr(), map.as_ptr().wrapping_add(t.file_offset));
        same.then(|| MappedBytes::new(file.clone(), map.clone(), t.file_offset, t.data.len())).flatten()
    }

    /// The format version (2 or 3; the layouts are the same for
    /// little-endian files).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment in bytes (`general.alignment`, 32 if absent).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute byte offset of the data section (the end of the tensor
    /// infos rounded up to the alignment; clamped to the file size when the
    /// file has no tensors and ends before it).
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Number of metadata entries.
    pub fn n_kv(&self) -> usize {
        self.kvs.len()
    }

    /// The keys, in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        let data = self.bytes();
        self.kvs.iter().map(move |kv| key_of(data, kv))
    }

    /// The metadata entries in file order.
    pub fn kvs(&self) -> impl Iterator<Item = (&str, Value<'_>)> + '_ {
        let data = self.bytes();
        self.kvs.iter().filter_map(move |kv| Some((key_of(data, kv), node_value(data, &kv.node)?)))
    }

    /// True if the file has metadata `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Value<'_>> {
        let data = self.bytes();
        let i = find_sorted(&self.kv_sorted, key, |i| key_of(data, &self.kvs[i]))?;
        node_value(data, &self.kvs.get(i)?.node)
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the key if it is missing.
    pub fn value(&self, key: &str) -> Result<Value<'_>> {
        self.get(key).ok_or_else(|| self.err(format!("key {key:?} not found")))
    }

    /// The type of `key`'s value, if present.
    pub fn value_type(&self, key: &str) -> Option<ValueType> {
        self.get(key).map(|v| v.value_type())
    }

    getters! {
        /// The `u8` value of `key`.
        get_u8 -> u8, U8;
        /// The `i8` value of `key`.
        get_i8 -> i8, I8;
        /// The `u16` value of `key`.
        get_u16 -> u16, U16;
        /// The `i16` value of `key`.
        get_i16 -> i16, I16;
        /// The `u32` value of `key`.
        get_u32 -> u32, U32;
        /// The `i32` value of `key`.
        get_i32 -> i32, I32;
        /// The `f32` value of `key`.
        get_f32 -> f32, F32;
        /// The `bool` value of `key`.
        get_bool -> bool, Bool;
        /// The `str` value of `key` (a slice of the file).
        get_str -> &str, String;
        /// The `u64` value of `key`.
        get_u64 -> u64, U64;
        /// The `i64` value of `key`.
        get_i64 -> i64, I64;
        /// The `f64` value of `key`.
        get_f64 -> f64, F64;
    }

    /// The value of `key` as `u64` if it is an integer of any width and
    /// signedness that is not negative (the spec recommends readers accept
    /// both `u32` and `u64` for counts).
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the key if it is missing, not an integer, or negative.
    pub fn get_uint(&self, key: &str) -> Result<u64> {
        let v = self.value(key)?;
        v.as_uint().ok_or_else(|| self.err(format!("key {key:?} is {}, not a non-negative integer", value_label(&v))))
    }

    /// The array value of `key`.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the key if it is missing or not an array.
    pub fn get_arr(&self, key: &str) -> Result<ArrayRef<'_>> {
        match self.value(key)? {
            Value::Array(a) => Ok(a),
            v => Err(self.err(format!("key {key:?} is {}, not arr", type_label(&v)))),
        }
    }

    /// The elements of array `key` as `T` (any fixed-size type, `bool` or `&str`).
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the key if it is missing, not an array, or an
    /// array of another element type.
    pub fn get_arr_of<'a, T: ArrayElem<'a>>(&'a self, key: &str) -> Result<Vec<T>> {
        let a = self.get_arr(key)?;
        a.to_vec::<T>().ok_or_else(|| self.err(format!("key {key:?} is arr[{}], not arr[{}]", a.elem_type(), T::TYPE)))
    }

    array_getters! {
        /// The `arr[u8]` value of `key`.
        get_arr_u8 -> u8;
        /// The `arr[i8]` value of `key`.
        get_arr_i8 -> i8;
        /// The `arr[u16]` value of `key`.
        get_arr_u16 -> u16;
        /// The `arr[i16]` value of `key`.
        get_arr_i16 -> i16;
        /// The `arr[u32]` value of `key`.
        get_arr_u32 -> u32;
        /// The `arr[i32]` value of `key`.
        get_arr_i32 -> i32;
        /// The `arr[f32]` value of `key`.
        get_arr_f32 -> f32;
        /// The `arr[bool]` value of `key`.
        get_arr_bool -> bool;
        /// The `arr[str]` value of `key` (slices of the file).
        get_arr_str -> &str;
        /// The `arr[u64]` value of `key`.
        get_arr_u64 -> u64;
        /// The `arr[i64]` value of `key`.
        get_arr_i64 -> i64;
        /// The `arr[f64]` value of `key`.
        get_arr_f64 -> f64;
    }

    /// The tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(self.tensor_position(name)?)
    }

    /// Position of tensor `name` in file order.
    pub fn tensor_position(&self, name: &str) -> Option<usize> {
        find_sorted(&self.tensor_sorted, name, |i| self.tensors[i].name.as_str())
    }

    /// Tensor `i` (file order) with its data, or `None` past the end.
    pub fn tensor_at(&self, i: usize) -> Option<GgufTensor<'_>> {
        let info = self.tensors.get(i)?;
        let start = self.data_offset.checked_add(usize::try_from(info.offset).ok()?)?;
        let data = self.bytes().get(start..start.checked_add(info.nbytes)?)?;
        Some(GgufTensor { info, file_offset: start, data })
    }

    /// Tensor `name` with its data: a zero-copy slice of the file of
    /// `info.nbytes` bytes, with the type and shape (ggml order) in `info`.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the tensor if the file has no tensor of that name.
    pub fn tensor(&self, name: &str) -> Result<GgufTensor<'_>> {
        self.tensor_position(name)
            .and_then(|i| self.tensor_at(i))
            .ok_or_else(|| self.err(format!("tensor {name:?} not found")))
    }

    /// All tensors with their data, in file order.
    pub fn iter_tensors(&self) -> impl Iterator<Item = GgufTensor<'_>> + '_ {
        (0..self.tensors.len()).filter_map(move |i| self.tensor_at(i))
    }
}
