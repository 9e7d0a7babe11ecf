//! Where each tensor's bytes live: a map from tensor to (buffer, byte offset).
//! Views resolve to their storage owner plus the view offset.

use super::{Backend, Buffer};
use crate::error::{Error, Result};
use crate::graph::Context;
use crate::tensor::{convert, GgmlType, TensorId};
use std::sync::Arc;

/// Tensor → (buffer, offset) placements for one context, plus the buffers.
#[derive(Debug, Default, Clone)]
pub struct TensorStorage {
    pub(crate) ctx_id: Option<u32>,
    pub(crate) buffers: Vec<Arc<dyn Buffer>>,
    /// Indexed by tensor index: (buffer index, byte offset) for storage owners.
    pub(crate) slots: Vec<Option<(usize, usize)>>,
}

impl TensorStorage {
    /// An empty storage map.
    pub fn new() -> Self {
        Self::default()
    }

    /// The buffers, in the order they were added.
    pub fn buffers(&self) -> &[Arc<dyn Buffer>] {
        &self.buffers
    }

    /// Total bytes of all buffers.
    pub fn total_bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.size()).sum()
    }

    /// Checks that the storage holds tensors of `ctx` (or none yet).
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] naming the context the storage belongs to.
    pub(crate) fn check_context(&self, ctx: &Context) -> Result<()> {
        match self.ctx_id {
            Some(c) if c != ctx.id() => {
                Err(Error::ForeignTensor { id: 0, ctx: ctx.id(), detail: format!("storage belongs to context {c}") })
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn bind_ctx(&mut self, ctx: &Context) -> Result<()> {
        self.check_context(ctx)?;
        self.ctx_id = Some(ctx.id());
        if self.slots.len() < ctx.len() {
            self.slots.resize(ctx.len(), None);
        }
        Ok(())
    }

    /// Adds a buffer; returns its index.
    pub(crate) fn add_buffer(&mut self, b: Arc<dyn Buffer>) -> usize {
        self.buffers.push(b);
        self.buffers.len() - 1
    }

    /// Places storage owner `id` at (`buffer`, `offset`).
    pub(crate) fn place(&mut self, id: TensorId, buffer: usize, offset: usize) {
        if self.slots.len() <= id.index() {
            self.slots.resize(id.index() + 1, None);
        }
        self.slots[id.index()] = Some((buffer, offset));
    }

    /// Places storage owner `id` of `ctx` at byte `offset` of `buffer`
    /// (memory allocated elsewhere, such as a ggml buffer of an embedding
    /// engine: shardgraph's ggml backend library binds the tensors of each
    /// graph it receives where ggml's allocator put them). The buffer is
    /// added once however many tensors it holds.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] if the storage holds another context's
    /// tensors; [`Error::InvalidOperand`] if `id` is a view (views follow
    /// their owner); [`Error::OutOfBounds`] if the tensor's bytes leave the
    /// buffer.
    pub fn place_in(&mut self, ctx: &Context, id: TensorId, buffer: &Arc<dyn Buffer>, offset: usize) -> Result<()> {
        self.bind_ctx(ctx)?;
        let t = ctx.tensor(id)?;
        if t.view_src.is_some() {
            return Err(Error::operand("place_in", "id", format!("{} is a view", t.describe())));
        }
        if offset.checked_add(t.nbytes()).is_none_or(|e| e > buffer.size()) {
            return Err(Error::OutOfBounds {
                detail: format!("{} at byte {offset} of a {}-byte buffer", t.describe(), buffer.size()),
            });
        }
        let bi = match self.buffers.iter().position(|b| Arc::ptr_eq(b, buffer)) {
            Some(i) => i,
            None => self.add_buffer(buffer.clone()),
        };
        self.place(id, bi, offset);
        Ok(())
    }

    /// True if `id` (or, for a view, its storage owner) has storage.
    pub fn has_storage(&self, ctx: &Context, id: TensorId) -> bool {
        self.locate(ctx, id).is_ok()
    }

    /// (buffer, byte offset of the tensor's first byte) for `id`.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`], [`Error::NoStorage`].
    pub fn locate(&self, ctx: &Context, id: TensorId) -> Result<(&Arc<dyn Buffer>, usize)> {
        let t = ctx.tensor(id)?;
        if self.ctx_id.is_some_and(|c| c != ctx.id()) {
            return Err(Error::ForeignTensor {
                id: id.idx,
                ctx: ctx.id(),
                detail: "storage belongs to another context".into(),
            });
        }
        let (owner, offs) = match t.view_src {
            Some(o) => (o, t.view_offs),
            None => (id, 0),
        };
        match self.slots.get(owner.index()).copied().flatten() {
            Some((b, o)) => Ok((&self.buffers[b], o + offs)),
            None => {
                Err(Error::NoStorage { name: t.name.clone(), detail: format!("{} is not allocated", t.describe()) })
            }
        }
    }

    /// Allocates one buffer on `backend` holding every tensor in `ids` that is
    /// a storage owner without storage yet (ggml's
    /// `ggml_backend_alloc_ctx_tensors`, for weights and caches).
    /// Returns the buffer's size in bytes.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`], [`Error::Alloc`].
    pub fn alloc_tensors(&mut self, backend: &dyn Backend, ctx: &Context, ids: &[TensorId]) -> Result<usize> {
        self.bind_ctx(ctx)?;
        let align = backend.buffer_type().alignment.max(1);
        let mut offs = 0usize;
        let mut todo = Vec::new();
        for &id in ids {
            let t = ctx.tensor(id)?;
            if t.view_src.is_some()
                || self.slots.get(id.index()).copied().flatten().is_some()
                || todo.iter().any(|(i, _)| *i == id)
            {
                continue;
            }
            todo.push((id, offs));
            offs = offs
                .checked_add(t.nbytes().div_ceil(align) * align)
                .ok_or_else(|| Error::Alloc { detail: "size overflow".into() })?;
        }
        let b = backend.alloc_buffer(offs.max(align))?;
        let bi = self.add_buffer(b);
        for (id, o) in todo {
            self.place(id, bi, o);
        }
        Ok(offs)
    }

    fn check_range(&self, ctx: &Context, id: TensorId, offset: usize, len: usize) -> Result<()> {
        let t = ctx.tensor(id)?;
        let n = t.nbytes();
        if offset.checked_add(len).is_none_or(|e| e > n) {
            return Err(Error::OutOfBounds {
                detail: format!("bytes {offset}..+{len} of tensor {:?} ({} bytes)", t.name, n),
            });
        }
        Ok(())
    }

    /// Writes raw bytes into `id` starting at byte `offset` of its span
    /// (`ggml_backend_tensor_set`). For a non-contiguous view the bytes are
    /// its storage span as laid out in memory.
    ///
    /// # Errors
    /// [`Error::NoStorage`], [`Error::OutOfBounds`].
    pub fn set_bytes(&self, ctx: &Context, id: TensorId, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range(ctx, id, offset, data.len())?;
        let (b, o) = self.locate(ctx, id)?;
        b.set(o + offset, data)
    }

    /// Reads raw bytes of `id` from byte `offset` (`ggml_backend_tensor_get`).
    ///
    /// # Errors
    /// [`Error::NoStorage`], [`Error::OutOfBounds`].
    pub fn get_bytes(&self, ctx: &Context, id: TensorId, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(ctx, id, offset, out.len())?;
        let (b, o) = self.locate(ctx, id)?;
        b.get(o + offset, out)
    }

    /// Writes `data` (one value per element, ggml order) into a contiguous
    /// tensor of type F32, F16 or BF16 (converted), or any quantized type
    /// (quantized with ggml's reference quantizer).
    ///
    /// # Errors
    /// [`Error::DataMismatch`] if `data.len()` differs from the element count
    /// or the tensor is not contiguous; [`Error::UnsupportedType`] for integer types.
    pub fn set_f32(&self, ctx: &Context, id: TensorId, data: &[f32]) -> Result<()> {
        let t = ctx.tensor(id)?;
        if data.len() as i64 != t.nelements() || !t.is_contiguous() {
            return Err(Error::DataMismatch {
                name: t.name.clone(),
                detail: format!("{} values for {} (contiguous: {})", data.len(), t.describe(), t.is_contiguous()),
            });
        }
        let bytes = convert::encode_rows(t.ty, data, t.ne[0] as usize)?;
        self.set_bytes(ctx, id, 0, &bytes)
    }

    /// Reads a tensor of any float or quantized type as f32 values in ggml
    /// element order (`ne[0]` fastest), following its strides (views and
    /// permuted tensors read their logical elements).
    ///
    /// # Errors
    /// [`Error::NoStorage`]; [`Error::UnsupportedType`] for integer types (use [`Self::get_i32`]);
    /// [`Error::DataMismatch`] for a quantized view whose rows are not packed.
    pub fn get_f32(&self, ctx: &Context, id: TensorId) -> Result<Vec<f32>> {
        let t = ctx.tensor(id)?;
        if t.nelements() == 0 {
            return Ok(Vec::new());
        }
        let mut raw = vec![0u8; t.nbytes()];
        self.get_bytes(ctx, id, 0, &mut raw)?;
        convert::read_elements(t, &raw)
    }

    /// Writes I32 values into a contiguous I32 tensor (positions, row ids).
    ///
    /// # Errors
    /// [`Error::DataMismatch`] on a wrong type, length or a non-contiguous tensor.
    pub fn set_i32(&self, ctx: &Context, id: TensorId, data: &[i32]) -> Result<()> {
        let t = ctx.tensor(id)?;
        if t.ty != GgmlType::I32 || data.len() as i64 != t.nelements() || !t.is_contiguous() {
            return Err(Error::DataMismatch {
                name: t.name.clone(),
                detail: format!("{} i32 values for {}", data.len(), t.describe()),
            });
        }
        self.set_bytes(ctx, id, 0, bytemuck::cast_slice(data))
    }

    /// Writes I64 values into a contiguous I64 tensor (set_rows indices).
    ///
    /// # Errors
    /// [`Error::DataMismatch`] on a wrong type, length or a non-contiguous tensor.
    pub fn set_i64(&self, ctx: &Context, id: TensorId, data: &[i64]) -> Result<()> {
        let t = ctx.tensor(id)?;
        if t.ty != GgmlType::I64 || data.len() as i64 != t.nelements() || !t.is_contiguous() {
            return Err(Error::DataMismatch {
                name: t.name.clone(),
                detail: format!("{} i64 values for {}", data.len(), t.describe()),
            });
        }
        self.set_bytes(ctx, id, 0, bytemuck::cast_slice(data))
    }

    /// Reads a contiguous I32 tensor (argmax, top_k, argsort results).
    ///
    /// # Errors
    /// [`Error::DataMismatch`] on a wrong type or a non-contiguous tensor.
    pub fn get_i32(&self, ctx: &Context, id: TensorId) -> Result<Vec<i32>> {
        let t = ctx.tensor(id)?;
        if t.ty != GgmlType::I32 || !t.is_contiguous() {
            return Err(Error::DataMismatch { name: t.name.clone(), detail: format!("get_i32 on {}", t.describe()) });
        }
        let mut raw = vec![0u8; t.nbytes()];
        self.get_bytes(ctx, id, 0, &mut raw)?;
        Ok(raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}
