//! The GGUF writer: collects metadata and tensor infos, then streams the
//! file (header, metadata, infos, padding, then each tensor's data padded to
//! the alignment) to any [`Write`], taking tensor data in order, in chunks if
//! need be, so a large model never has to be assembled in memory.

use super::reader::{align_up, TensorInfo};
use super::value::{encode_str, MetaValue};
use super::{gguf_err, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_TENSOR_NAME};
use crate::error::{Error, Result};
use crate::tensor::{GgmlType, MAX_DIMS};
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

/// Name used in errors of a writer not tied to a path.
const STREAM_NAME: &str = "<writer>";

/// Builds a GGUF file: metadata entries (any [`MetaValue`]) and tensor infos
/// in the order added, version 3 (or 2 on request), alignment 32 unless
/// [`GgufWriter::set_alignment`] (or a `general.alignment` `u32` entry) says
/// otherwise. Tensor offsets are assigned as tensors are added: each
/// tensor's data starts at a multiple of the alignment after the previous
/// one's, as ggml and the `gguf` Python package lay them out.
///
/// Writing is streamed: [`GgufWriter::begin`] writes everything up to the
/// data section and returns a [`GgufStream`] that takes each tensor's bytes
/// in order; [`GgufWriter::write_to`] / [`GgufWriter::write_file`] drive it
/// with a callback per tensor.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: usize,
    kvs: Vec<(String, MetaValue)>,
    keys: HashSet<String>,
    tensors: Vec<TensorInfo>,
    names: HashSet<String>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

fn werr(detail: String) -> Error {
    gguf_err(STREAM_NAME, detail)
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment (32).
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            kvs: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Sets the version field: 3 (the default) or 2. The little-endian
    /// layouts of both are the same; version 2 exists for compatibility tests.
    ///
    /// # Errors
    /// [`Error::Gguf`] for any other version.
    pub fn set_version(&mut self, version: u32) -> Result<()> {
        if version != 2 && version != 3 {
            return Err(werr(format!("cannot write GGUF version {version} (only 2 and 3)")));
        }
        self.version = version;
        Ok(())
    }

    /// The version that will be written.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Sets the data alignment (bytes) and writes it as the `u32` entry
    /// `general.alignment` (replacing an earlier one, keeping its position).
    /// Offsets of tensors already added are recomputed.
    ///
    /// # Errors
    /// [`Error::Gguf`] unless `alignment` is a non-zero power of two.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<()> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(werr(format!("alignment {alignment} is not a power of two")));
        }
        match self.kvs.iter_mut().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some(kv) => kv.1 = MetaValue::U32(alignment),
            None => {
                self.kvs.push((ALIGNMENT_KEY.to_string(), MetaValue::U32(alignment)));
                self.keys.insert(ALIGNMENT_KEY.to_string());
            }
        }
        self.alignment = alignment as usize;
        self.relayout();
        Ok(())
    }

    /// The data alignment in bytes.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Adds metadata entry `key` (written in the order added).
    /// `general.alignment` must be a power-of-two `u32` and sets the alignment.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the key if it is empty or already present, if
    /// arrays nest deeper than [`MAX_ARRAY_DEPTH`], or for a bad
    /// `general.alignment`.
    pub fn add_kv(&mut self, key: &str, value: impl Into<MetaValue>) -> Result<()> {
        let value = value.into();
        if key.is_empty() {
            return Err(werr("empty metadata key".into()));
        }
        if self.keys.contains(key) {
            return Err(werr(format!("duplicate metadata key {key:?}")));
        }
        if let MetaValue::Array(a) = &value {
            if a.depth() > MAX_ARRAY_DEPTH {
                return Err(werr(format!("key {key:?}: arrays nested {} deep (at most {MAX_ARRAY_DEPTH})", a.depth())));
            }
        }
        if key == ALIGNMENT_KEY {
            match value {
                MetaValue::U32(a) => return self.set_alignment(a),
                v => return Err(werr(format!("key {key:?} must be u32, not {}", v.value_type()))),
            }
        }
        self.keys.insert(key.to_string());
        self.kvs.push((key.to_string(), value));
        Ok(())
    }

    /// The metadata entries in order.
    pub fn kvs(&self) -> &[(String, MetaValue)] {
        &self.kvs
    }

    /// Adds a tensor info: `ne` in ggml order (`ne[0]` innermost), 0 to 4
    /// dims (the count written as `n_dims`). Its data is expected, in the
    /// order tensors were added, by the stream.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the tensor for a name longer than
    /// [`MAX_TENSOR_NAME`] bytes or already used, more than 4 dims, a negative
    /// extent, `ne[0]` not a whole number of blocks, or a size that overflows.
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, ne: &[i64]) -> Result<()> {
        let t = |d: String| werr(format!("tensor {name:?}: {d}"));
        if name.len() > MAX_TENSOR_NAME {
            return Err(t(format!("name is {} bytes long (at most {MAX_TENSOR_NAME})", name.len())));
        }
        if self.names.contains(name) {
            return Err(t("duplicate tensor name".into()));
        }
        if ne.len() > MAX_DIMS {
            return Err(t(format!("{} dims (at most {MAX_DIMS})", ne.len())));
        }
        if let Some(d) = ne.iter().find(|&&d| d < 0) {
            return Err(t(format!("negative extent {d} in {ne:?}")));
        }
        let mut full = [1i64; MAX_DIMS];
        full[..ne.len()].copy_from_slice(ne);
        if full.iter().try_fold(1i64, |a, &d| a.checked_mul(d)).is_none() {
            return Err(t(format!("element count of {ne:?} overflows i64")));
        }
        let row = ty.row_size(full[0]).map_err(|_| {
            t(format!("ne[0] = {} is not a multiple of {ty}'s block size {}", full[0], ty.block_size()))
        })?;
        let nbytes = full[1..]
            .iter()
            .try_fold(row, |a, &d| a.checked_mul(d as usize))
            .filter(|&n| n < (u64::MAX / 2) as usize)
            .ok_or_else(|| t(format!("{ty}{ne:?} has more bytes than fit in usize")))?;
        self.names.insert(name.to_string());
        self.tensors.push(TensorInfo {
            name: name.to_string(),
            ty,
            n_dims: ne.len() as u32,
            ne: full,
            offset: 0,
            nbytes,
        });
        self.relayout();
        Ok(())
    }

    /// The tensor infos in order, with their data offsets (relative to the
    /// data section) for the current alignment.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Recomputes tensor offsets: each at the previous end rounded up to the alignment.
    fn relayout(&mut self) {
        let a = self.alignment as u64;
        let mut off = 0u64;
        for t in &mut self.tensors {
            t.offset = off;
            off = align_up(off.saturating_add(t.nbytes as u64), a).unwrap_or(u64::MAX);
        }
    }

    /// Header, metadata and tensor infos, unpadded.
    fn header(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&self.version.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            encode_str(k, &mut h);
            h.extend_from_slice(&v.value_type().id().to_le_bytes());
            v.encode(&mut h);
        }
        for t in &self.tensors {
            encode_str(&t.name, &mut h);
            h.extend_from_slice(&t.n_dims.to_le_bytes());
            for &d in &t.ne[..t.n_dims as usize] {
                h.extend_from_slice(&(d as u64).to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        h
    }

    /// Absolute byte offset of the data section in the file that would be written.
    pub fn data_offset(&self) -> u64 {
        align_up(self.header().len() as u64, self.alignment as u64).unwrap_or(u64::MAX)
    }

    /// Size in bytes of the file that would be written (the data section
    /// ends padded to the alignment, as ggml writes it).
    pub fn file_len(&self) -> u64 {
        let a = self.alignment as u64;
        let data = self
            .tensors
            .last()
            .map_or(0, |t| align_up(t.offset.saturating_add(t.nbytes as u64), a).unwrap_or(u64::MAX));
        self.data_offset().saturating_add(data)
    }

    /// Writes the header, metadata, tensor infos and the padding up to the
    /// data section to `out`, and returns the stream that takes the tensor
    /// data. Only the metadata is buffered (once); tensor data goes straight
    /// to `out`, so wrap a file in a [`std::io::BufWriter`].
    ///
    /// # Errors
    /// [`Error::Gguf`] if writing fails.
    pub fn begin<W: Write>(self, out: W) -> Result<GgufStream<W>> {
        self.begin_named(out, STREAM_NAME.to_string())
    }

    fn begin_named<W: Write>(self, mut out: W, name: String) -> Result<GgufStream<W>> {
        let mut h = self.header();
        let data_offset = align_up(h.len() as u64, self.alignment as u64)
            .ok_or_else(|| gguf_err(&name, "header size overflows".into()))?;
        h.resize(data_offset as usize, 0);
        out.write_all(&h).map_err(|e| gguf_err(&name, format!("write failed in the header: {e}")))?;
        let mut s = GgufStream {
            out,
            name,
            alignment: self.alignment as u64,
            data_offset,
            pos: data_offset,
            tensors: self.tensors,
            cur: 0,
            written: 0,
        };
        s.skip_empty();
        Ok(s)
    }

    /// Writes the whole file to `out`, asking `fill` for each tensor's data
    /// in order: `fill(info, sink)` must write exactly `info.nbytes` bytes to
    /// `sink` (in any number of pieces). Returns `out`.
    ///
    /// # Errors
    /// [`Error::Gguf`] if writing fails or `fill` writes another number of
    /// bytes than the tensor has; errors from `fill` are passed on.
    pub fn write_to<W, F>(self, out: W, fill: F) -> Result<W>
    where
        W: Write,
        F: FnMut(&TensorInfo, &mut TensorSink<'_, W>) -> Result<()>,
    {
        self.begin(out)?.fill_all(fill)
    }

    /// [`GgufWriter::write_to`] a new file at `path` (created or truncated,
    /// buffered). Returns the number of bytes written.
    ///
    /// # Errors
    /// As [`GgufWriter::write_to`], naming the path.
    pub fn write_file<F>(self, path: impl AsRef<Path>, fill: F) -> Result<u64>
    where
        F: FnMut(&TensorInfo, &mut TensorSink<'_, std::io::BufWriter<std::fs::File>>) -> Result<()>,
    {
        let name = path.as_ref().display().to_string();
        let f = std::fs::File::create(path.as_ref()).map_err(|e| gguf_err(&name, format!("cannot create: {e}")))?;
        let s = self.begin_named(std::io::BufWriter::with_capacity(1 << 20, f), name.clone())?;
        let len = s.file_len();
        let w = s.fill_all(fill)?;
        let f = w.into_inner().map_err(|e| gguf_err(&name, format!("write failed: {}", e.error())))?;
        f.sync_all().map_err(|e| gguf_err(&name, format!("sync failed: {e}")))?;
        Ok(len)
    }
}

/// The data section of a file being written (from [`GgufWriter::begin`]):
/// takes each tensor's bytes in the order the tensors were added, pads
/// between them, and checks that every tensor got exactly its byte count.
/// Tensors of 0 bytes need no data.
#[derive(Debug)]
pub struct GgufStream<W: Write> {
    out: W,
    name: String,
    alignment: u64,
    data_offset: u64,
    /// Bytes written to `out` so far.
    pos: u64,
    tensors: Vec<TensorInfo>,
    /// The tensor receiving data (`tensors.len()` when all are complete).
    cur: usize,
    /// Bytes of `tensors[cur]` written.
    written: usize,
}

impl<W: Write> GgufStream<W> {
    fn err(&self, detail: String) -> Error {
        gguf_err(&self.name, detail)
    }

    /// Moves `cur` past complete (and empty) tensors.
    fn skip_empty(&mut self) {
        while self.cur < self.tensors.len() && self.written == self.tensors[self.cur].nbytes {
            self.cur += 1;
            self.written = 0;
        }
    }

    fn emit(&mut self, bytes: &[u8]) -> Result<()> {
        if let Err(e) = self.out.write_all(bytes) {
            return Err(self.err(format!("write failed at byte {}: {e}", self.pos)));
        }
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Zero bytes up to absolute position `to`.
    fn pad_to(&mut self, to: u64) -> Result<()> {
        const ZEROS: [u8; 256] = [0; 256];
        while self.pos < to {
            let n = (to - self.pos).min(ZEROS.len() as u64) as usize;
            self.emit(&ZEROS[..n])?;
        }
        Ok(())
    }

    /// Absolute byte offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Bytes written so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Size of the complete file.
    pub fn file_len(&self) -> u64 {
        let data = self
            .tensors
            .last()
            .map_or(0, |t| align_up(t.offset.saturating_add(t.nbytes as u64), self.alignment).unwrap_or(u64::MAX));
        self.data_offset.saturating_add(data)
    }

    /// The tensor whose data is expected next (`None` when all are written).
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.cur)
    }

    /// Bytes still expected for the tensor returned by [`GgufStream::next_tensor`].
    pub fn remaining_in_tensor(&self) -> usize {
        self.tensors.get(self.cur).map_or(0, |t| t.nbytes - self.written)
    }

    /// Appends `chunk` to the data of the current tensor
    /// ([`GgufStream::next_tensor`]); when the tensor is complete the stream
    /// moves on to the next one.
    ///
    /// # Errors
    /// [`Error::Gguf`] if `chunk` is longer than what the current tensor
    /// still needs (naming it), if all data was written, or if writing fails.
    pub fn write_data(&mut self, chunk: &[u8]) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        let Some(t) = self.tensors.get(self.cur) else {
            return Err(self.err(format!("{} bytes of tensor data after the last tensor", chunk.len())));
        };
        let left = t.nbytes - self.written;
        if chunk.len() > left {
            return Err(self.err(format!(
                "tensor {:?} ({}): {} bytes given with {left} of its {} bytes left",
                t.name,
                t.describe(),
                chunk.len(),
                t.nbytes
            )));
        }
        if self.written == 0 {
            let start = self.data_offset + t.offset;
            self.pad_to(start)?;
        }
        self.emit(chunk)?;
        self.written += chunk.len();
        self.skip_empty();
        Ok(())
    }

    /// Writes all of tensor `name`'s data at once; it must be the tensor
    /// expected next (or a 0-byte tensor with empty `data`).
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the tensor if it is not the next one, if part
    /// of it was already written, or if `data` has another length.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        if data.is_empty() && self.tensors.iter().any(|t| t.name == name && t.nbytes == 0) {
            return Ok(());
        }
        let Some(t) = self.tensors.get(self.cur) else {
            return Err(self.err(format!("tensor {name:?}: all tensor data was already written")));
        };
        if t.name != name || self.written != 0 {
            return Err(self.err(format!(
                "tensor {name:?} given while {:?} is expected next ({} of its {} bytes written)",
                t.name, self.written, t.nbytes
            )));
        }
        if data.len() != t.nbytes {
            return Err(self.err(format!(
                "tensor {name:?} ({}): {} bytes given, {} expected",
                t.describe(),
                data.len(),
                t.nbytes
            )));
        }
        self.write_data(data)
    }

    /// Writes the final padding, flushes and returns the writer.
    ///
    /// # Errors
    /// [`Error::Gguf`] naming the first tensor whose data is incomplete, or
    /// if writing fails.
    pub fn finish(mut self) -> Result<W> {
        if let Some(t) = self.tensors.get(self.cur) {
            return Err(self.err(format!(
                "tensor {:?} ({}): {} of {} bytes written when the file was finished",
                t.name,
                t.describe(),
                self.written,
                t.nbytes
            )));
        }
        let end = self.file_len();
        self.pad_to(end)?;
        if let Err(e) = self.out.flush() {
            return Err(self.err(format!("flush failed: {e}")));
        }
        Ok(self.out)
    }

    fn fill_all<F>(mut self, mut fill: F) -> Result<W>
    where
        F: FnMut(&TensorInfo, &mut TensorSink<'_, W>) -> Result<()>,
    {
        let infos = self.tensors.clone();
        for t in &infos {
            let mut sink = TensorSink { stream: &mut self, left: t.nbytes, error: None };
            let r = fill(t, &mut sink);
            let (left, sink_err) = (sink.left, sink.error.take());
            if let Some(e) = sink_err {
                return Err(e);
            }
            r?;
            if left != 0 {
                return Err(self.err(format!(
                    "tensor {:?} ({}): the callback wrote {} of {} bytes",
                    t.name,
                    t.describe(),
                    t.nbytes - left,
                    t.nbytes
                )));
            }
        }
        self.finish()
    }
}

/// Where a [`GgufWriter::write_to`] callback writes one tensor's data: an
/// [`std::io::Write`] that refuses bytes beyond the tensor's size.
#[derive(Debug)]
pub struct TensorSink<'a, W: Write> {
    stream: &'a mut GgufStream<W>,
    left: usize,
    error: Option<Error>,
}

impl<W: Write> TensorSink<'_, W> {
    /// Writes `bytes` as the next part of the tensor's data.
    ///
    /// # Errors
    /// [`Error::Gguf`] if they exceed the tensor's size or writing fails.
    pub fn put(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > self.left {
            let t = self.stream.next_tensor().map(|t| t.name.clone()).unwrap_or_default();
            return Err(self.stream.err(format!(
                "tensor {t:?}: {} bytes written with {} left",
                bytes.len(),
                self.left
            )));
        }
        self.stream.write_data(bytes)?;
        self.left -= bytes.len();
        Ok(())
    }

    /// Bytes the tensor still needs.
    pub fn remaining(&self) -> usize {
        self.left
    }
}

impl<W: Write> Write for TensorSink<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.put(buf) {
            Ok(()) => Ok(buf.len()),
            Err(e) => {
                let msg = e.to_string();
                self.error.get_or_insert(e);
                Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg))
            }
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
