//! The tensor model, exactly ggml's: up to 4 dimensions, `ne[0..4]` element
//! counts (`ne[0]` innermost), `nb[0..4]` byte strides (`nb[0]` = type size,
//! `nb[1]` = row size; for block-quantized types a row is
//! `ne[0] / block_size` blocks). Views share their source's storage at a byte
//! offset; permute/transpose only change `ne`/`nb`.
//!
//! A [`Tensor`] is a descriptor in a [`crate::Context`] arena, addressed by a
//! [`TensorId`]. Its data lives in a backend buffer.

pub(crate) mod convert;
pub mod quant;
mod types;

pub use types::{GgmlType, ALL_TYPES, QK_K};

use crate::ops::Op;
use smallvec::SmallVec;

/// Maximum number of dimensions (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Handle to a tensor in a [`crate::Context`]. Carries the context's id, so a
/// handle from another context is detected and rejected
/// ([`crate::Error::ForeignTensor`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId {
    pub(crate) ctx: u32,
    pub(crate) idx: u32,
}

impl TensorId {
    /// Index of the tensor inside its context (creation order).
    pub fn index(self) -> usize {
        self.idx as usize
    }
    /// Id of the owning context.
    pub fn context_id(self) -> u32 {
        self.ctx
    }
}

/// Flags as in ggml (`GGML_TENSOR_FLAG_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorFlags {
    /// Written by the caller before each compute (`ggml_set_input`).
    pub input: bool,
    /// Read by the caller after compute; its memory is never reused (`ggml_set_output`).
    pub output: bool,
    /// A scratch destination: the leaf [`crate::Context::cast`] creates for
    /// its `cpy`, which nothing but that copy touches. It is not stored
    /// state: the meta backend gives the copy a fresh intermediate instead
    /// (in the compute arena), never places the leaf in a
    /// [`crate::split::SplitStore`] and never writes the copy back there.
    /// Every other `cpy` into a leaf is a write into stored state. Set only
    /// by `cast` (ggml has no such flag: its `ggml_cast` result is its own
    /// destination).
    pub scratch: bool,
}

/// A tensor descriptor: type, shape, strides, the op that produces it and its
/// sources. Leafs have `op == Op::None`.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Element type.
    pub ty: GgmlType,
    /// Element counts, `ne[0]` innermost.
    pub ne: [i64; MAX_DIMS],
    /// Byte strides.
    pub nb: [usize; MAX_DIMS],
    /// Producing op with its typed parameters (`Op::None` for leafs).
    pub op: Op,
    /// Sources in ggml's order (`src[0]`, `src[1]`, …).
    pub src: SmallVec<[TensorId; 4]>,
    /// For views: the tensor whose storage this one shares (never itself a
    /// view: chains are resolved to the storage owner).
    pub view_src: Option<TensorId>,
    /// Byte offset into `view_src`'s storage.
    pub view_offs: usize,
    /// Name (ggml's `name`; GGUF tensor names for weights).
    pub name: String,
    /// Input/output flags.
    pub flags: TensorFlags,
}

impl Tensor {
    /// Total element count (`ggml_nelements`).
    pub fn nelements(&self) -> i64 {
        self.ne.iter().product()
    }

    /// Number of rows (`ggml_nrows`: `ne[1]·ne[2]·ne[3]`).
    pub fn nrows(&self) -> i64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes spanned by the tensor in its storage (`ggml_nbytes`): the
    /// distance from the first to one past the last byte it touches.
    pub fn nbytes(&self) -> usize {
        nbytes(self.ty, &self.ne, &self.nb)
    }

    /// Bytes of one row of `ne[0]` elements.
    pub fn row_bytes(&self) -> usize {
        (self.ne[0] as usize / self.ty.block_size()) * self.ty.type_size()
    }

    /// Bytes of the tensor's values packed contiguously (`row_bytes · nrows`);
    /// differs from [`Tensor::nbytes`] for strided views.
    pub fn data_bytes(&self) -> usize {
        self.row_bytes() * self.nrows().max(0) as usize
    }

    /// True if the elements are packed in ggml's default order with no gaps
    /// (`ggml_is_contiguous`). Dimensions of extent 1 are ignored.
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(self.ty, &self.ne, &self.nb)
    }

    /// True if each row (dimension 0) is packed (`nb[0] == type_size` and,
    /// for quantized types, the row is whole blocks): `ggml_is_contiguous_rows`.
    pub fn is_contiguous_rows(&self) -> bool {
        self.ne[0] <= 1 || self.nb[0] == self.ty.type_size()
    }

    /// True if dims 1..3 are permuted relative to each other or dim 0 is not innermost.
    pub fn is_permuted(&self) -> bool {
        self.nb[0] > self.nb[1] || self.nb[1] > self.nb[2] || self.nb[2] > self.nb[3]
    }

    /// True if the tensor is a view of another tensor's storage.
    pub fn is_view(&self) -> bool {
        self.view_src.is_some()
    }

    /// True if all four dims are equal.
    pub fn same_shape(&self, other: &Tensor) -> bool {
        self.ne == other.ne
    }

    /// Shape rendered as `[ne0, ne1, ne2, ne3]` with the type, for messages.
    pub fn describe(&self) -> String {
        format!("{}{:?}", self.ty, self.ne)
    }
}

/// Default (contiguous) strides for `ne` of type `ty` (`ggml_new_tensor`).
pub fn contiguous_strides(ty: GgmlType, ne: &[i64; MAX_DIMS]) -> [usize; MAX_DIMS] {
    let mut nb = [0usize; MAX_DIMS];
    nb[0] = ty.type_size();
    nb[1] = nb[0].saturating_mul(ne[0].max(0) as usize / ty.block_size());
    for i in 2..MAX_DIMS {
        nb[i] = nb[i - 1].saturating_mul(ne[i - 1].max(0) as usize);
    }
    nb
}

/// Bytes spanned by a tensor with this layout (`ggml_nbytes`). Zero for an
/// empty tensor.
pub fn nbytes(ty: GgmlType, ne: &[i64; MAX_DIMS], nb: &[usize; MAX_DIMS]) -> usize {
    checked_nbytes(ty, ne, nb).unwrap_or(usize::MAX)
}

/// [`nbytes`] with overflow detection: `None` if the span does not fit in
/// `usize` (a view with absurd strides).
pub fn checked_nbytes(ty: GgmlType, ne: &[i64; MAX_DIMS], nb: &[usize; MAX_DIMS]) -> Option<usize> {
    if ne.iter().any(|&n| n <= 0) {
        return Some(0);
    }
    let bs = ty.block_size();
    let mut n = if bs == 1 { ty.type_size() } else { (ne[0] as usize / bs).checked_mul(nb[0])? };
    let first = if bs == 1 { 0 } else { 1 };
    for i in first..MAX_DIMS {
        n = n.checked_add((ne[i] as usize - 1).checked_mul(nb[i])?)?;
    }
    Some(n)
}

/// `ggml_is_contiguous` on a raw layout.
pub fn is_contiguous(ty: GgmlType, ne: &[i64; MAX_DIMS], nb: &[usize; MAX_DIMS]) -> bool {
    let mut next = ty.type_size();
    for i in 0..MAX_DIMS {
        if ne[i] != 1 {
            if nb[i] != next {
                return false;
            }
            next *= if i == 0 { ne[0] as usize / ty.block_size() } else { ne[i] as usize };
        }
    }
    true
}
