//! The graph arena: a [`Context`] owns tensor descriptors addressed by
//! [`TensorId`]s. Op constructors (in `crate::ops`) add nodes to it.

use crate::error::{Error, Result};
use crate::ops::Op;
use crate::tensor::{checked_nbytes, contiguous_strides, GgmlType, Tensor, TensorFlags, TensorId, MAX_DIMS};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT_CONTEXT_ID: AtomicU32 = AtomicU32::new(1);

/// Tensors [`Context::display_name`] visits at most looking for a name.
const DISPLAY_NAME_VISITS: usize = 64;

/// Largest element count accepted in one dimension and in total (2^48), so
/// byte sizes never overflow `usize` arithmetic.
pub const MAX_ELEMENTS: i64 = 1 << 48;

/// An arena of tensor descriptors (ggml's `ggml_context` with `no_alloc`):
/// tensors are created here, data lives in backend buffers.
#[derive(Debug)]
pub struct Context {
    id: u32,
    /// Bumped by [`Context::truncate`]; graphs built before are stale.
    generation: u64,
    tensors: Vec<Tensor>,
}

impl Default for Context {
    fn default() -> Self {
        Self::new()
    }
}

impl Context {
    /// An empty context with a process-unique id.
    pub fn new() -> Self {
        Context { id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed), generation: 0, tensors: Vec::new() }
    }

    /// Drops every tensor created after the first `len`, so a per-step graph
    /// can be rebuilt on top of long-lived tensors (weights, caches) whose
    /// ids stay valid, as llama.cpp rebuilds its graph for each batch over
    /// the model's tensors. Graphs built before are stale afterwards: every
    /// function taking a context and a graph returns an error for them.
    /// `len` beyond the current length changes nothing.
    pub fn truncate(&mut self, len: usize) {
        if len < self.tensors.len() {
            self.tensors.truncate(len);
            self.generation += 1;
        }
    }

    /// How many times [`Context::truncate`] removed tensors.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// This context's id (stored in every [`TensorId`] it hands out).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Number of tensors created so far.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True if no tensor was created.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// All tensor ids in creation order.
    pub fn ids(&self) -> impl Iterator<Item = TensorId> + '_ {
        let ctx = self.id;
        (0..self.tensors.len() as u32).map(move |idx| TensorId { ctx, idx })
    }

    /// The descriptor of `id`.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] if `id` comes from another context.
    pub fn tensor(&self, id: TensorId) -> Result<&Tensor> {
        if id.ctx != self.id {
            return Err(Error::ForeignTensor {
                id: id.idx,
                ctx: self.id,
                detail: format!("handle from context {}", id.ctx),
            });
        }
        self.tensors.get(id.idx as usize).ok_or_else(|| Error::ForeignTensor {
            id: id.idx,
            ctx: self.id,
            detail: "index out of range".into(),
        })
    }

    /// Descriptor access for ids already validated (crate-internal; ids stored
    /// in a context's own tensors always belong to it).
    pub(crate) fn t(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.idx as usize]
    }

    /// Validated access for op constructors: names the op and operand in the error.
    pub(crate) fn operand(&self, id: TensorId, op: &'static str, operand: &'static str) -> Result<&Tensor> {
        self.tensor(id).map_err(|e| Error::operand(op, operand, e.to_string()))
    }

    /// Looks a tensor up by name (first match in creation order).
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors.iter().position(|t| t.name == name).map(|i| TensorId { ctx: self.id, idx: i as u32 })
    }

    /// A new leaf tensor of type `ty` with `ne.len()` (1..=4) dims; missing
    /// dims are 1. Strides are contiguous.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] for 0 or more than 4 dims, a negative extent,
    /// more than [`MAX_ELEMENTS`] elements, or `ne[0]` not a multiple of the
    /// type's block size.
    pub fn new_tensor(&mut self, ty: GgmlType, ne: &[i64]) -> Result<TensorId> {
        if ne.is_empty() || ne.len() > MAX_DIMS {
            return Err(Error::InvalidShape { ne: ne.to_vec(), detail: "a tensor has 1 to 4 dims".into() });
        }
        let mut full = [1i64; MAX_DIMS];
        full[..ne.len()].copy_from_slice(ne);
        self.push_op(ty, full, Op::None, &[])
    }

    /// `new_tensor(ty, &[ne0])`.
    pub fn new_tensor_1d(&mut self, ty: GgmlType, ne0: i64) -> Result<TensorId> {
        self.new_tensor(ty, &[ne0])
    }
    /// `new_tensor(ty, &[ne0, ne1])`.
    pub fn new_tensor_2d(&mut self, ty: GgmlType, ne0: i64, ne1: i64) -> Result<TensorId> {
        self.new_tensor(ty, &[ne0, ne1])
    }
    /// `new_tensor(ty, &[ne0, ne1, ne2])`.
    pub fn new_tensor_3d(&mut self, ty: GgmlType, ne0: i64, ne1: i64, ne2: i64) -> Result<TensorId> {
        self.new_tensor(ty, &[ne0, ne1, ne2])
    }
    /// `new_tensor(ty, &[ne0, ne1, ne2, ne3])`.
    pub fn new_tensor_4d(&mut self, ty: GgmlType, ne0: i64, ne1: i64, ne2: i64, ne3: i64) -> Result<TensorId> {
        self.new_tensor(ty, &[ne0, ne1, ne2, ne3])
    }

    /// [`Context::new_tensor`] named `name` (ggml's `ggml_new_tensor` then
    /// `ggml_set_name`): a weight or cache under its GGUF name
    /// (`blk.0.ffn_up.weight`). Names are what a
    /// [`crate::split::SplitPolicy`]'s rules match (globs such as
    /// `blk.*.ffn_up.weight`), what [`Context::find`] looks up, and what
    /// plan reports print.
    ///
    /// # Errors
    /// As [`Context::new_tensor`] (nothing is created on an error).
    pub fn new_tensor_named(&mut self, ty: GgmlType, ne: &[i64], name: &str) -> Result<TensorId> {
        let id = self.new_tensor(ty, ne)?;
        self.tensors[id.idx as usize].name = name.to_string();
        Ok(id)
    }

    /// [`Context::new_tensor_named`] marked as a graph input (`ggml_set_input`):
    /// a tensor the caller writes before each run (`inp_embd`, `inp_pos`).
    /// A split policy's rules match its name like any leaf's; an input no
    /// rule covers is mirrored (every device gets all of it).
    ///
    /// # Errors
    /// As [`Context::new_tensor`] (nothing is created on an error).
    pub fn new_input(&mut self, ty: GgmlType, ne: &[i64], name: &str) -> Result<TensorId> {
        let id = self.new_tensor_named(ty, ne, name)?;
        self.tensors[id.idx as usize].flags.input = true;
        Ok(id)
    }

    /// How reports print tensor `id`: its name if it has one; otherwise its
    /// op with the nearest named tensor it is computed from and its index,
    /// `mul_mat(blk.3.ffn_up.weight)#1091` (nearest: breadth-first through
    /// the sources, ggml's `src[0]` first, visiting at most 64 tensors), or
    /// `op#index` when none is found (`leaf#index` for an unnamed leaf).
    /// Every plan, lowered-plan and DOT
    /// report uses it. Never fails: an id of another context prints as
    /// `#index`.
    pub fn display_name(&self, id: TensorId) -> String {
        let Ok(t) = self.tensor(id) else { return format!("#{}", id.index()) };
        if !t.name.is_empty() {
            return t.name.clone();
        }
        let mut queue: std::collections::VecDeque<TensorId> = t.src.iter().copied().collect();
        let mut seen: Vec<TensorId> = vec![id];
        let mut found = None;
        while let Some(s) = queue.pop_front() {
            if seen.len() >= DISPLAY_NAME_VISITS {
                break;
            }
            if seen.contains(&s) {
                continue;
            }
            seen.push(s);
            let Ok(st) = self.tensor(s) else { continue };
            if !st.name.is_empty() {
                found = Some(st.name.as_str());
                break;
            }
            queue.extend(st.src.iter().copied());
        }
        match found {
            Some(n) => format!("{}({n})#{}", t.op.name(), id.index()),
            None if t.op.is_leaf() => format!("leaf#{}", id.index()),
            None => format!("{}#{}", t.op.name(), id.index()),
        }
    }

    /// Sets a tensor's name (GGUF names for weights).
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] for a handle from another context.
    pub fn set_name(&mut self, id: TensorId, name: &str) -> Result<()> {
        self.tensor(id)?;
        self.tensors[id.idx as usize].name = name.to_string();
        Ok(())
    }

    /// Marks `id` as a graph input (`ggml_set_input`).
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] for a handle from another context.
    pub fn set_input(&mut self, id: TensorId) -> Result<()> {
        self.tensor(id)?;
        self.tensors[id.idx as usize].flags.input = true;
        Ok(())
    }

    /// Marks `id` as a graph output (`ggml_set_output`): its memory is not
    /// reused by the allocator.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] for a handle from another context.
    pub fn set_output(&mut self, id: TensorId) -> Result<()> {
        self.tensor(id)?;
        self.tensors[id.idx as usize].flags.output = true;
        Ok(())
    }

    /// Marks leaf `id` as a scratch destination ([`crate::tensor::TensorFlags::scratch`]).
    pub(crate) fn set_scratch(&mut self, id: TensorId) -> Result<()> {
        self.tensor(id)?;
        self.tensors[id.idx as usize].flags.scratch = true;
        Ok(())
    }

    /// Adds a tensor with contiguous strides produced by `op` from `src`.
    /// Sources must already be validated by the caller.
    pub(crate) fn push_op(&mut self, ty: GgmlType, ne: [i64; MAX_DIMS], op: Op, src: &[TensorId]) -> Result<TensorId> {
        if let Err(e) = check_shape(ty, &ne) {
            return Err(match op {
                Op::None => e,
                _ => Error::operand(op.name(), "result", e.to_string()),
            });
        }
        let nb = contiguous_strides(ty, &ne);
        self.push(Tensor {
            ty,
            ne,
            nb,
            op,
            src: SmallVec::from_slice(src),
            view_src: None,
            view_offs: 0,
            name: String::new(),
            flags: TensorFlags::default(),
        })
    }

    /// Adds a view of `base`'s storage with layout (`ty`, `ne`, `nb`) at byte
    /// offset `offs` relative to `base`'s own data. View chains resolve to the
    /// storage owner. The view must lie inside the owner's bytes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_view(
        &mut self,
        base: TensorId,
        ty: GgmlType,
        ne: [i64; MAX_DIMS],
        nb: [usize; MAX_DIMS],
        offs: usize,
        op: Op,
        src: &[TensorId],
    ) -> Result<TensorId> {
        check_shape(ty, &ne)?;
        let b = self.t(base);
        let (owner, owner_offs) = match b.view_src {
            Some(o) => (o, b.view_offs),
            None => (base, 0),
        };
        let total_offs = owner_offs
            .checked_add(offs)
            .ok_or_else(|| Error::OutOfBounds { detail: "view offset overflows".into() })?;
        let owner_bytes = self.t(owner).nbytes();
        let need = checked_nbytes(ty, &ne, &nb).ok_or_else(|| Error::OutOfBounds {
            detail: format!("{}: strides {nb:?} with shape {ne:?} overflow the address space", op.name()),
        })?;
        // An empty view still needs its offset inside the source.
        if total_offs.checked_add(need).is_none_or(|end| end > owner_bytes) {
            return Err(Error::OutOfBounds {
                detail: format!(
                    "{}: view of {} bytes at offset {} exceeds the {} bytes of its source {}",
                    op.name(),
                    need,
                    total_offs,
                    owner_bytes,
                    self.t(owner).describe()
                ),
            });
        }
        self.push(Tensor {
            ty,
            ne,
            nb,
            op,
            src: SmallVec::from_slice(src),
            view_src: Some(owner),
            view_offs: total_offs,
            name: String::new(),
            flags: TensorFlags::default(),
        })
    }

    fn push(&mut self, t: Tensor) -> Result<TensorId> {
        if self.tensors.len() >= u32::MAX as usize {
            return Err(Error::Graph { detail: "context is full".into() });
        }
        let id = TensorId { ctx: self.id, idx: self.tensors.len() as u32 };
        self.tensors.push(t);
        Ok(id)
    }
}

/// Checks extents: non-negative, bounded, whole blocks along ne0.
pub(crate) fn check_shape(ty: GgmlType, ne: &[i64; MAX_DIMS]) -> Result<()> {
    let mut total: i64 = 1;
    for &n in ne {
        if !(0..=MAX_ELEMENTS).contains(&n) {
            return Err(Error::InvalidShape { ne: ne.to_vec(), detail: format!("extent {n} outside 0..=2^48") });
        }
        total = total.saturating_mul(n.max(1));
        if total > MAX_ELEMENTS {
            return Err(Error::InvalidShape { ne: ne.to_vec(), detail: "more than 2^48 elements".into() });
        }
    }
    if ne[0] % ty.block_size() as i64 != 0 {
        return Err(Error::InvalidShape {
            ne: ne.to_vec(),
            detail: format!("ne[0] = {} is not a multiple of {}'s block size {}", ne[0], ty, ty.block_size()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_name_finds_the_nearest_named_source_within_64_tensors() {
        let mut ctx = Context::new();
        let w = ctx.new_tensor_named(GgmlType::F32, &[4, 3], "w").unwrap();
        let x = ctx.new_input(GgmlType::F32, &[4, 2], "x").unwrap();
        assert!(ctx.tensor(x).unwrap().flags.input && !ctx.tensor(w).unwrap().flags.input);
        assert_eq!(ctx.find("x"), Some(x));
        let anon = ctx.new_tensor(GgmlType::F32, &[4, 2]).unwrap();
        assert_eq!(ctx.display_name(anon), format!("leaf#{}", anon.index()));
        let y = ctx.mul_mat(w, x).unwrap();
        assert_eq!(ctx.display_name(y), format!("mul_mat(w)#{}", y.index()));
        // Breadth-first: the source one step away wins over a deeper one.
        let s = ctx.add(anon, x).unwrap();
        let z = ctx.add(s, anon).unwrap();
        assert_eq!(ctx.display_name(z), format!("add(x)#{}", z.index()));
        // 70 unnamed nodes above `x`: beyond the bound, no name.
        let mut t = ctx.scale(x, 1.0).unwrap();
        for _ in 0..70 {
            t = ctx.scale(t, 1.0).unwrap();
        }
        assert_eq!(ctx.display_name(t), format!("scale#{}", t.index()));
        assert!(ctx.new_tensor_named(GgmlType::Q8_0, &[31], "bad").is_err());
        assert_eq!(ctx.find("bad"), None, "nothing is created on an error");
        let other = Context::new();
        assert_eq!(other.display_name(y), format!("#{}", y.index()));
    }
}
