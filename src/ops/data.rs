//! Data-movement ops: views (`view_*`, `reshape_*`, `permute`, `transpose`),
//! copies (`cont*`, `dup`, `cpy`, `cast`), row gather/scatter (`get_rows`,
//! `set_rows`), `concat`, `repeat` and `pad`. Shape rules follow ggml's
//! constructors in `ggml.c` (`ggml_view_4d`, `ggml_permute`, `ggml_cpy`,
//! `ggml_get_rows`, `ggml_set_rows`, `ggml_concat`, `ggml_repeat_4d`,
//! `ggml_pad_ext`).

use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::Op;
use crate::tensor::{contiguous_strides, GgmlType, Tensor, TensorId, MAX_DIMS};

/// Checks that `ne` holds non-negative extents (a precondition of every shape
/// computation below; `check_shape` repeats it with limits).
fn non_negative(op: &'static str, operand: &'static str, ne: &[i64; MAX_DIMS]) -> Result<()> {
    if ne.iter().any(|&n| n < 0) {
        return Err(Error::operand(op, operand, format!("negative extent in {ne:?}")));
    }
    Ok(())
}

/// Element count of `ne`, saturating (extents were checked non-negative).
fn count(ne: &[i64; MAX_DIMS]) -> i64 {
    ne.iter().fold(1i64, |acc, &n| acc.saturating_mul(n))
}

impl Context {
    // ------------------------------------------------------------------
    // Views
    // ------------------------------------------------------------------

    /// Shared body of `view_1d..view_4d` (`ggml_view_impl`): a view of `a`'s
    /// storage with element counts `ne`, byte strides `nb` (`nb[0]` is always
    /// the type size) at `offset` bytes from `a`'s first byte.
    fn view_impl(
        &mut self,
        op_name: &'static str,
        a: TensorId,
        ne: [i64; MAX_DIMS],
        nb: [usize; MAX_DIMS],
        offset: usize,
    ) -> Result<TensorId> {
        let ta = self.operand(a, op_name, "src0")?;
        let ty = ta.ty;
        let desc = ta.describe();
        non_negative(op_name, "ne", &ne)?;
        if ne[0] % ty.block_size() as i64 != 0 {
            return Err(Error::operand(
                op_name,
                "ne",
                format!("ne0 = {} is not a multiple of {}'s block size {} (src0 {desc})", ne[0], ty, ty.block_size()),
            ));
        }
        self.push_view(a, ty, ne, nb, offset, Op::View, &[a]).map_err(|e| match e {
            Error::OutOfBounds { detail } => Error::OutOfBounds {
                detail: format!("{op_name}: ne {ne:?} nb {nb:?} offset {offset} of src0 {desc}: {detail}"),
            },
            other => other,
        })
    }

    /// A 1-d view of `ne0` elements of `a` starting `offset` bytes into `a`
    /// (`ggml_view_1d`). The view shares `a`'s storage.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a foreign `a`, a negative `ne0` or one
    /// that is not a multiple of the block size; [`Error::OutOfBounds`] if the
    /// viewed bytes leave `a`'s storage.
    pub fn view_1d(&mut self, a: TensorId, ne0: i64, offset: usize) -> Result<TensorId> {
        let ty = self.operand(a, "view", "src0")?.ty;
        let ne = [ne0, 1, 1, 1];
        let nb = contiguous_strides(ty, &[ne0.max(0), 1, 1, 1]);
        self.view_impl("view", a, ne, nb, offset)
    }

    /// A 2-d view `[ne0, ne1]` of `a` with row stride `nb1` bytes, starting
    /// `offset` bytes into `a` (`ggml_view_2d`; `nb2 = nb3 = nb1·ne1`).
    ///
    /// # Errors
    /// As [`Context::view_1d`].
    pub fn view_2d(&mut self, a: TensorId, ne0: i64, ne1: i64, nb1: usize, offset: usize) -> Result<TensorId> {
        let ty = self.operand(a, "view", "src0")?.ty;
        let nb2 = nb1.saturating_mul(ne1.max(0) as usize);
        let nb = [ty.type_size(), nb1, nb2, nb2];
        self.view_impl("view", a, [ne0, ne1, 1, 1], nb, offset)
    }

    /// A 3-d view `[ne0, ne1, ne2]` of `a` with byte strides `nb1`, `nb2`,
    /// starting `offset` bytes into `a` (`ggml_view_3d`; `nb3 = nb2·ne2`).
    ///
    /// # Errors
    /// As [`Context::view_1d`].
    #[allow(clippy::too_many_arguments)]
    pub fn view_3d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        ne2: i64,
        nb1: usize,
        nb2: usize,
        offset: usize,
    ) -> Result<TensorId> {
        let ty = self.operand(a, "view", "src0")?.ty;
        let nb3 = nb2.saturating_mul(ne2.max(0) as usize);
        let nb = [ty.type_size(), nb1, nb2, nb3];
        self.view_impl("view", a, [ne0, ne1, ne2, 1], nb, offset)
    }

    /// A 4-d view `[ne0, ne1, ne2, ne3]` of `a` with byte strides `nb1`,
    /// `nb2`, `nb3`, starting `offset` bytes into `a` (`ggml_view_4d`).
    ///
    /// # Errors
    /// As [`Context::view_1d`].
    #[allow(clippy::too_many_arguments)]
    pub fn view_4d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        ne2: i64,
        ne3: i64,
        nb1: usize,
        nb2: usize,
        nb3: usize,
        offset: usize,
    ) -> Result<TensorId> {
        let ty = self.operand(a, "view", "src0")?.ty;
        let nb = [ty.type_size(), nb1, nb2, nb3];
        self.view_impl("view", a, [ne0, ne1, ne2, ne3], nb, offset)
    }

    /// A view of `a` with its own shape and strides (`ggml_view_tensor`,
    /// used for `cpy`/`set_rows` results).
    fn view_same(&mut self, a: TensorId, op: Op, src: &[TensorId]) -> Result<TensorId> {
        let t = self.t(a);
        let (ty, ne, nb) = (t.ty, t.ne, t.nb);
        self.push_view(a, ty, ne, nb, 0, op, src)
    }

    /// Shared body of `reshape*`: contiguous `a`, same element count.
    fn reshape_impl(&mut self, a: TensorId, ne: [i64; MAX_DIMS]) -> Result<TensorId> {
        let ta = self.operand(a, "reshape", "src0")?;
        if !ta.is_contiguous() {
            return Err(Error::operand(
                "reshape",
                "src0",
                format!("{} with strides {:?} is not contiguous (use cont first)", ta.describe(), ta.nb),
            ));
        }
        non_negative("reshape", "ne", &ne)?;
        if count(&ne) != ta.nelements() {
            return Err(Error::operand(
                "reshape",
                "ne",
                format!("{ne:?} has {} elements, src0 {} has {}", count(&ne), ta.describe(), ta.nelements()),
            ));
        }
        let ty = ta.ty;
        if ne[0] % ty.block_size() as i64 != 0 {
            return Err(Error::operand(
                "reshape",
                "ne",
                format!("ne0 = {} is not a multiple of {}'s block size {}", ne[0], ty, ty.block_size()),
            ));
        }
        let nb = contiguous_strides(ty, &ne);
        self.push_view(a, ty, ne, nb, 0, Op::Reshape, &[a])
    }

    /// `a` reshaped to the shape of `like` (`ggml_reshape`): `a` must be
    /// contiguous and both must have the same element count; `like`'s own
    /// layout does not matter. The result is a view of `a`.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a non-contiguous `a`, an element-count
    /// mismatch, a first dim that is not whole blocks, or foreign handles.
    pub fn reshape(&mut self, a: TensorId, like: TensorId) -> Result<TensorId> {
        let ne = self.operand(like, "reshape", "src1")?.ne;
        self.reshape_impl(a, ne)
    }

    /// `a` (contiguous) viewed as `[ne0]` (`ggml_reshape_1d`).
    ///
    /// # Errors
    /// As [`Context::reshape`].
    pub fn reshape_1d(&mut self, a: TensorId, ne0: i64) -> Result<TensorId> {
        self.reshape_impl(a, [ne0, 1, 1, 1])
    }

    /// `a` (contiguous) viewed as `[ne0, ne1]` (`ggml_reshape_2d`).
    ///
    /// # Errors
    /// As [`Context::reshape`].
    pub fn reshape_2d(&mut self, a: TensorId, ne0: i64, ne1: i64) -> Result<TensorId> {
        self.reshape_impl(a, [ne0, ne1, 1, 1])
    }

    /// `a` (contiguous) viewed as `[ne0, ne1, ne2]` (`ggml_reshape_3d`).
    ///
    /// # Errors
    /// As [`Context::reshape`].
    pub fn reshape_3d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64) -> Result<TensorId> {
        self.reshape_impl(a, [ne0, ne1, ne2, 1])
    }

    /// `a` (contiguous) viewed as `[ne0, ne1, ne2, ne3]` (`ggml_reshape_4d`).
    ///
    /// # Errors
    /// As [`Context::reshape`].
    pub fn reshape_4d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64, ne3: i64) -> Result<TensorId> {
        self.reshape_impl(a, [ne0, ne1, ne2, ne3])
    }

    /// Permutes `a`'s dims (`ggml_permute`): source dim `i` goes to position
    /// `axes[i]`, so `result.ne[axes[i]] = a.ne[i]` (and the same for the
    /// strides). `permute(a, [0, 2, 1, 3])` swaps dims 1 and 2. A view.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] if `axes` is not a permutation of 0..4.
    pub fn permute(&mut self, a: TensorId, axes: [usize; 4]) -> Result<TensorId> {
        let ta = self.operand(a, "permute", "src0")?;
        let mut seen = [false; MAX_DIMS];
        for &ax in &axes {
            if ax >= MAX_DIMS || seen[ax] {
                return Err(Error::operand(
                    "permute",
                    "axes",
                    format!("{axes:?} is not a permutation of 0..4 (src0 {})", ta.describe()),
                ));
            }
            seen[ax] = true;
        }
        let mut ne = [0i64; MAX_DIMS];
        let mut nb = [0usize; MAX_DIMS];
        for (i, &ax) in axes.iter().enumerate() {
            ne[ax] = ta.ne[i];
            nb[ax] = ta.nb[i];
        }
        let ty = ta.ty;
        if ne[0] % ty.block_size() as i64 != 0 {
            return Err(Error::operand(
                "permute",
                "axes",
                format!("{axes:?} puts {} elements on dim 0 of block type {} (src0 {})", ne[0], ty, ta.describe()),
            ));
        }
        self.push_view(a, ty, ne, nb, 0, Op::Permute { axes }, &[a])
    }

    /// Swaps dims 0 and 1 of `a` (`ggml_transpose`); a view.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a foreign handle or a block-quantized
    /// `a` whose new dim 0 is not whole blocks.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "transpose", "src0")?;
        let ty = ta.ty;
        let ne = [ta.ne[1], ta.ne[0], ta.ne[2], ta.ne[3]];
        let nb = [ta.nb[1], ta.nb[0], ta.nb[2], ta.nb[3]];
        if ne[0] % ty.block_size() as i64 != 0 {
            return Err(Error::operand(
                "transpose",
                "src0",
                format!("{} would put {} elements on dim 0 of a block type", ta.describe(), ne[0]),
            ));
        }
        self.push_view(a, ty, ne, nb, 0, Op::Transpose, &[a])
    }

    // ------------------------------------------------------------------
    // Copies
    // ------------------------------------------------------------------

    /// A contiguous copy of `a` with the same type and shape (`ggml_cont`).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a foreign handle.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        let ne = self.operand(a, "cont", "src0")?.ne;
        self.cont_4d(a, ne[0], ne[1], ne[2], ne[3])
    }

    /// A contiguous copy of `a` shaped `[ne0]` (`ggml_cont_1d`).
    ///
    /// # Errors
    /// As [`Context::cont_4d`].
    pub fn cont_1d(&mut self, a: TensorId, ne0: i64) -> Result<TensorId> {
        self.cont_4d(a, ne0, 1, 1, 1)
    }

    /// A contiguous copy of `a` shaped `[ne0, ne1]` (`ggml_cont_2d`).
    ///
    /// # Errors
    /// As [`Context::cont_4d`].
    pub fn cont_2d(&mut self, a: TensorId, ne0: i64, ne1: i64) -> Result<TensorId> {
        self.cont_4d(a, ne0, ne1, 1, 1)
    }

    /// A contiguous copy of `a` shaped `[ne0, ne1, ne2]` (`ggml_cont_3d`).
    ///
    /// # Errors
    /// As [`Context::cont_4d`].
    pub fn cont_3d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64) -> Result<TensorId> {
        self.cont_4d(a, ne0, ne1, ne2, 1)
    }

    /// A contiguous copy of `a` (any layout) shaped `[ne0, ne1, ne2, ne3]`,
    /// same type and element count (`ggml_cont_4d`). Elements are taken in
    /// `a`'s logical order (dim 0 fastest).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for an element-count mismatch, a foreign
    /// handle, or (block-quantized types) a new ne0 that is not whole blocks;
    /// block types are copied block by block in logical order.
    pub fn cont_4d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64, ne3: i64) -> Result<TensorId> {
        let ta = self.operand(a, "cont", "src0")?;
        let ne = [ne0, ne1, ne2, ne3];
        non_negative("cont", "ne", &ne)?;
        if count(&ne) != ta.nelements() {
            return Err(Error::operand(
                "cont",
                "ne",
                format!("{ne:?} has {} elements, src0 {} has {}", count(&ne), ta.describe(), ta.nelements()),
            ));
        }
        let ty = ta.ty;
        self.push_op(ty, ne, Op::Cont, &[a]).map_err(|e| Error::operand("cont", "ne", e.to_string()))
    }

    /// A contiguous copy of `a`, same type and shape (`ggml_dup`).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a foreign handle.
    pub fn dup(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "dup", "src0")?;
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Dup, &[a])
    }

    /// Copies `a` into `b`'s storage, converting types (`ggml_cpy`). Elements
    /// are matched in logical order (dim 0 fastest), so shapes may differ as
    /// long as the element counts are equal. The result is a view of `b`
    /// (same shape and strides as `b`); sources are `[a, b]`.
    ///
    /// Supported conversions (the CPU backend's): F32/F16/BF16 to any of
    /// F32/F16/BF16 and to the block types (all but Q8_1, Q8_K and the
    /// importance-matrix types IQ2_XXS, IQ2_XS, IQ1_S; rows of whole blocks,
    /// `b` row-contiguous, converted as ggml's CPU `from_float` does:
    /// [`crate::tensor::quant::from_float`]); any block type to F32
    /// (dequantized); I32 ↔ F32; and same-type copies between arbitrary
    /// layouts (block types block by block).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for different element counts, a conversion
    /// outside the list, or foreign handles.
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "cpy", "src0")?;
        let tb = self.operand(b, "cpy", "src1")?;
        check_cpy(ta, tb)?;
        self.view_same(b, Op::Cpy, &[a, b])
    }

    /// `a` converted to type `ty` in a new contiguous tensor of `a`'s shape
    /// (`ggml_cast`). ggml marks the result as its own destination; here a
    /// fresh destination leaf of type `ty` is created, flagged
    /// [`crate::tensor::TensorFlags::scratch`], and `cpy(a, leaf)` is
    /// returned. On one device the leaf needs storage like any other leaf
    /// (the graph allocator places it); the meta backend treats it as an
    /// intermediate of the copy, not as stored state.
    ///
    /// # Errors
    /// As [`Context::cpy`]; for block types `a`'s ne0 must be whole blocks.
    pub fn cast(&mut self, a: TensorId, ty: GgmlType) -> Result<TensorId> {
        let ne = self.operand(a, "cpy", "src0")?.ne;
        let dst = self.push_op(ty, ne, Op::None, &[]).map_err(|e| Error::operand("cpy", "type", e.to_string()))?;
        self.set_scratch(dst)?;
        self.cpy(a, dst)
    }

    // ------------------------------------------------------------------
    // Row gather / scatter
    // ------------------------------------------------------------------

    /// Gathers rows of `a` (`ggml_get_rows`): `a` is `[ne0, n_rows, ne2, ne3]`
    /// of any type (block types, F16, BF16, F32, I32), `b` is I32
    /// `[n, ne2, ne3]` (its dims 1 and 2 must equal `a`'s dims 2 and 3, its
    /// dim 3 must be 1). Result `[ne0, n, ne2, ne3]`: `result[:, i, j, k] =
    /// a[:, b[i, j, k], j, k]`, F32 (dequantized/converted), or I32 when `a`
    /// is I32 (copied exactly).
    ///
    /// At compute time an index outside `0..n_rows` makes the node fail with
    /// [`Error::Compute`] (ggml asserts).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] if `b` is not I32, the batch dims disagree,
    /// `a`'s type has no row loader (Q8_1, Q8_K, I64, …), a block-quantized
    /// `a` whose rows are not packed, or foreign handles.
    pub fn get_rows(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "get_rows", "src0")?;
        let tb = self.operand(b, "get_rows", "src1")?;
        if tb.ty != GgmlType::I32 {
            return Err(Error::operand("get_rows", "src1", format!("indices must be I32, got {}", tb.describe())));
        }
        if ta.ne[2] != tb.ne[1] || ta.ne[3] != tb.ne[2] || tb.ne[3] != 1 {
            return Err(Error::operand(
                "get_rows",
                "src1",
                format!("indices {} must be [n, src0.ne2, src0.ne3, 1] for src0 {}", tb.describe(), ta.describe()),
            ));
        }
        let loadable = matches!(ta.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::I32)
            || (ta.ty.is_quantized() && !matches!(ta.ty, GgmlType::Q8_1 | GgmlType::Q8_K) && ta.is_contiguous_rows());
        if !loadable {
            return Err(Error::operand(
                "get_rows",
                "src0",
                format!("type {} not supported ({})", ta.ty, ta.describe()),
            ));
        }
        let ty = if ta.ty == GgmlType::I32 { GgmlType::I32 } else { GgmlType::F32 };
        let ne = [ta.ne[0], tb.ne[0], tb.ne[1], tb.ne[2]];
        self.push_op(ty, ne, Op::GetRows, &[a, b])
    }

    /// Scatters the F32 rows of `b` into `a` at indices `c`
    /// (`ggml_set_rows`): `a` `[ne0, n_dst, ne2, ne3]` is the destination
    /// (F32, F16, BF16 or a block type `cpy` can write; each row is
    /// converted/quantized whole as by `cpy`), `b`
    /// `[ne0, n, ne2, ne3]`, `c` I64 or I32 `[n, c2, c3]` with `ne2 % c2 ==
    /// 0`, `ne3 % c3 == 0` (indices broadcast over dims 2, 3). Effect:
    /// `a[:, c[i, j % c2, k % c3], j, k] = b[:, i, j, k]`. The result is a
    /// view of `a` (whole destination); sources are `[b, c, a]` (ggml's order).
    ///
    /// At compute time any index outside `0..n_dst` makes the node fail with
    /// [`Error::Compute`] before anything is written; for duplicate indices
    /// the last source row wins.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for shape mismatches, `b` not F32, `c` not
    /// I64/I32, an unsupported destination type, rows of `a` or `b` that are
    /// not packed, or foreign handles.
    pub fn set_rows(&mut self, a: TensorId, b: TensorId, c: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "set_rows", "dst")?;
        let tb = self.operand(b, "set_rows", "src0")?;
        let tc = self.operand(c, "set_rows", "src1")?;
        let shapes = || format!("dst {}, src0 {}, indices {}", ta.describe(), tb.describe(), tc.describe());
        use GgmlType::*;
        if !(matches!(ta.ty, F32 | F16 | BF16) || quantizable(ta.ty)) {
            return Err(Error::operand(
                "set_rows",
                "dst",
                format!("destination type {} not supported ({})", ta.ty, shapes()),
            ));
        }
        if tb.ty != F32 {
            return Err(Error::operand("set_rows", "src0", format!("rows must be F32 ({})", shapes())));
        }
        if !matches!(tc.ty, I64 | I32) {
            return Err(Error::operand("set_rows", "src1", format!("indices must be I64 or I32 ({})", shapes())));
        }
        if ta.ne[0] != tb.ne[0] || ta.ne[2] != tb.ne[2] || ta.ne[3] != tb.ne[3] {
            return Err(Error::operand("set_rows", "src0", format!("dims 0, 2, 3 must match ({})", shapes())));
        }
        if tb.ne[1] != tc.ne[0]
            || tc.ne[3] != 1
            || tc.ne[1] == 0
            || tc.ne[2] == 0
            || tb.ne[2] % tc.ne[1] != 0
            || tb.ne[3] % tc.ne[2] != 0
        {
            return Err(Error::operand(
                "set_rows",
                "src1",
                format!("indices must be [src0.ne1, c2, c3, 1] with c2 | ne2, c3 | ne3 ({})", shapes()),
            ));
        }
        if !ta.is_contiguous_rows() || !tb.is_contiguous_rows() {
            return Err(Error::operand(
                "set_rows",
                "dst",
                format!("rows of dst and src0 must be packed ({})", shapes()),
            ));
        }
        self.view_same(a, Op::SetRows, &[b, c, a])
    }

    // ------------------------------------------------------------------
    // concat / repeat / pad
    // ------------------------------------------------------------------

    /// `a` and `b` joined along `dim` (`ggml_concat`): same type, all other
    /// dims equal; result dim `dim` = `a.ne[dim] + b.ne[dim]`. Inputs may be
    /// non-contiguous. Works for every type (block types copy whole blocks).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for `dim > 3`, different types, or a
    /// mismatch in another dim.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        let ta = self.operand(a, "concat", "src0")?;
        let tb = self.operand(b, "concat", "src1")?;
        if dim >= MAX_DIMS {
            return Err(Error::operand("concat", "dim", format!("dim {dim} outside 0..4")));
        }
        if ta.ty != tb.ty {
            return Err(Error::operand(
                "concat",
                "src1",
                format!("types differ: src0 {}, src1 {}", ta.describe(), tb.describe()),
            ));
        }
        if let Some(d) = (0..MAX_DIMS).find(|&d| d != dim && ta.ne[d] != tb.ne[d]) {
            return Err(Error::operand(
                "concat",
                "src1",
                format!("dim {d} differs (concat on dim {dim}): src0 {}, src1 {}", ta.describe(), tb.describe()),
            ));
        }
        let mut ne = ta.ne;
        ne[dim] = ta.ne[dim] + tb.ne[dim];
        let ty = ta.ty;
        self.push_op(ty, ne, Op::Concat { dim }, &[a, b])
    }

    /// `a` tiled to `b`'s shape (`ggml_repeat`; only `b`'s shape is used).
    ///
    /// # Errors
    /// As [`Context::repeat_4d`].
    pub fn repeat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ne = self.operand(b, "repeat", "src1")?.ne;
        self.repeat_4d(a, ne[0], ne[1], ne[2], ne[3])
    }

    /// `a` tiled to `[ne0, ne1, ne2, ne3]` (`ggml_repeat_4d`): every result
    /// dim must be a multiple of `a`'s; `result[i] = a[i mod a.ne]`.
    /// Non-block types only (ggml's CPU repeats F32/F16/BF16/I16/I32).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a dim that is not a multiple, an empty
    /// `a` with a non-empty result, or a block-quantized `a`.
    pub fn repeat_4d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64, ne3: i64) -> Result<TensorId> {
        let ta = self.operand(a, "repeat", "src0")?;
        let ne = [ne0, ne1, ne2, ne3];
        non_negative("repeat", "ne", &ne)?;
        if ta.ty.block_size() != 1 {
            return Err(Error::operand("repeat", "src0", format!("block type not supported ({})", ta.describe())));
        }
        let empty_result = ne.contains(&0);
        let ok = if ta.ne.contains(&0) { empty_result } else { (0..MAX_DIMS).all(|d| ne[d] % ta.ne[d] == 0) };
        if !ok {
            return Err(Error::operand(
                "repeat",
                "ne",
                format!("{ne:?} is not a multiple of src0 {} in every dim", ta.describe()),
            ));
        }
        let ty = ta.ty;
        self.push_op(ty, ne, Op::Repeat, &[a])
    }

    /// Zero padding after each dim (`ggml_pad`): result dim `i` is
    /// `a.ne[i] + p_i`.
    ///
    /// # Errors
    /// As [`Context::pad_ext`].
    pub fn pad(&mut self, a: TensorId, p0: i32, p1: i32, p2: i32, p3: i32) -> Result<TensorId> {
        self.pad_ext(a, 0, p0, 0, p1, 0, p2, 0, p3)
    }

    /// Zero padding with `lp_i` zeros before and `rp_i` after along dim `i`
    /// (`ggml_pad_ext`, non-circular): result dim `i` is
    /// `a.ne[i] + lp_i + rp_i`. Any non-block type (ggml's CPU pads F32).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for negative pads, a block-quantized `a`, or
    /// an oversized result.
    #[allow(clippy::too_many_arguments)]
    pub fn pad_ext(
        &mut self,
        a: TensorId,
        lp0: i32,
        rp0: i32,
        lp1: i32,
        rp1: i32,
        lp2: i32,
        rp2: i32,
        lp3: i32,
        rp3: i32,
    ) -> Result<TensorId> {
        let ta = self.operand(a, "pad", "src0")?;
        let lp = [lp0, lp1, lp2, lp3];
        let rp = [rp0, rp1, rp2, rp3];
        if lp.iter().chain(rp.iter()).any(|&p| p < 0) {
            return Err(Error::operand(
                "pad",
                "pads",
                format!("negative pad lp {lp:?} rp {rp:?} (src0 {})", ta.describe()),
            ));
        }
        if ta.ty.block_size() != 1 {
            return Err(Error::operand("pad", "src0", format!("block type not supported ({})", ta.describe())));
        }
        let mut ne = ta.ne;
        for d in 0..MAX_DIMS {
            ne[d] = ta.ne[d] + lp[d] as i64 + rp[d] as i64;
        }
        let ty = ta.ty;
        self.push_op(ty, ne, Op::Pad { lp, rp }, &[a]).map_err(|e| Error::operand("pad", "pads", e.to_string()))
    }
}

/// Block types a row of F32 values can be converted to
/// ([`crate::tensor::quant::from_float`]): every block type except the
/// activation formats Q8_1/Q8_K and the types ggml quantizes only with an
/// importance matrix (IQ2_XXS, IQ2_XS, IQ1_S).
pub(crate) fn quantizable(ty: GgmlType) -> bool {
    use GgmlType::*;
    ty.is_quantized() && !matches!(ty, Q8_1 | Q8_K) && !crate::tensor::quant::quantize_requires_imatrix(ty)
}

/// The conversion rules of `cpy` (and of `set_rows` destinations).
pub(crate) fn cpy_supported(src: GgmlType, dst: GgmlType) -> bool {
    use GgmlType::*;
    if src == dst {
        return true;
    }
    let float = |t: GgmlType| matches!(t, F32 | F16 | BF16);
    match (src, dst) {
        (s, d) if float(s) && float(d) => true,
        (F32 | F16 | BF16, d) if quantizable(d) => true,
        (s, F32) if s.is_quantized() && s != Q8_1 && s != Q8_K => true,
        (I32, F32) | (F32, I32) => true,
        _ => false,
    }
}

/// Validates a `cpy(a, b)` pair.
fn check_cpy(ta: &Tensor, tb: &Tensor) -> Result<()> {
    if ta.nelements() != tb.nelements() {
        return Err(Error::operand(
            "cpy",
            "src1",
            format!(
                "src0 {} has {} elements, src1 {} has {}",
                ta.describe(),
                ta.nelements(),
                tb.describe(),
                tb.nelements()
            ),
        ));
    }
    if !cpy_supported(ta.ty, tb.ty) {
        return Err(Error::operand(
            "cpy",
            "src1",
            format!("no conversion from {} to {} (src0 {}, src1 {})", ta.ty, tb.ty, ta.describe(), tb.describe()),
        ));
    }
    if tb.ty.is_quantized() && ta.ty != tb.ty {
        // Quantizing: elements are consumed row by row of the destination.
        if !tb.is_contiguous_rows() {
            return Err(Error::operand(
                "cpy",
                "src1",
                format!("quantized destination {} rows not packed", tb.describe()),
            ));
        }
    }
    if ta.ty.is_quantized() && ta.ty != tb.ty && !ta.is_contiguous_rows() {
        return Err(Error::operand("cpy", "src0", format!("quantized source {} rows not packed", ta.describe())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Backend, TensorStorage};
    use crate::error::Error;
    use crate::tensor::{GgmlType, TensorId};
    use crate::Context;
    use GgmlType::*;

    fn expect_operand(r: crate::Result<TensorId>, op: &str, needle: &str) {
        match r {
            Err(Error::InvalidOperand { op: o, detail, .. }) => {
                assert_eq!(o, op);
                assert!(detail.contains(needle), "{detail:?} lacks {needle:?}");
            }
            other => panic!("expected InvalidOperand from {op}, got {other:?}"),
        }
    }

    #[test]
    fn permute_rejects_bad_axes() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_3d(F32, 4, 5, 6).unwrap();
        expect_operand(ctx.permute(a, [0, 1, 1, 3]), "permute", "f32[4, 5, 6, 1]");
        expect_operand(ctx.permute(a, [0, 1, 2, 4]), "permute", "not a permutation");
        let p = ctx.permute(a, [1, 2, 0, 3]).unwrap();
        let t = ctx.tensor(p).unwrap();
        assert_eq!(t.ne, [6, 4, 5, 1]);
        assert_eq!(t.nb, [80, 4, 16, 480]);
    }

    #[test]
    fn view_out_of_bounds_is_an_error() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(F32, 8, 4).unwrap();
        match ctx.view_1d(a, 30, 12) {
            Err(Error::OutOfBounds { detail }) => {
                assert!(detail.contains("view") && detail.contains("f32[8, 4, 1, 1]"))
            }
            other => panic!("{other:?}"),
        }
        assert!(ctx.view_2d(a, 8, 4, 32, 4).is_err());
        assert!(ctx.view_2d(a, 4, 4, 32, 16).is_ok());
        expect_operand(ctx.view_1d(a, -1, 0), "view", "negative");
        // Offsets are relative to the viewed tensor.
        let v = ctx.view_2d(a, 8, 2, 32, 64).unwrap();
        let w = ctx.view_1d(v, 8, 32).unwrap();
        assert_eq!(ctx.tensor(w).unwrap().view_offs, 96);
        assert!(ctx.view_1d(v, 8, 64).is_err());
    }

    #[test]
    fn reshape_checks_count_and_contiguity() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(F32, 6, 4).unwrap();
        expect_operand(ctx.reshape_2d(a, 5, 5), "reshape", "has 25 elements");
        let t = ctx.transpose(a).unwrap();
        expect_operand(ctx.reshape_1d(t, 24), "reshape", "not contiguous");
        let r = ctx.reshape_3d(a, 2, 3, 4).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().nb, [4, 8, 24, 96]);
        let q = ctx.new_tensor_2d(Q8_0, 64, 2).unwrap();
        expect_operand(ctx.reshape_2d(q, 16, 8), "reshape", "block size");
        expect_operand(ctx.cont_2d(a, 5, 5), "cont", "has 25 elements");
    }

    #[test]
    fn concat_and_friends_reject_mismatches() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_3d(F32, 4, 5, 6).unwrap();
        let b = ctx.new_tensor_3d(F32, 4, 3, 6).unwrap();
        let c = ctx.new_tensor_3d(F16, 4, 5, 6).unwrap();
        expect_operand(ctx.concat(a, b, 0), "concat", "f32[4, 3, 6, 1]");
        expect_operand(ctx.concat(a, c, 1), "concat", "types differ");
        expect_operand(ctx.concat(a, b, 4), "concat", "outside");
        let cc = ctx.concat(a, b, 1).unwrap();
        assert_eq!(ctx.tensor(cc).unwrap().ne, [4, 8, 6, 1]);
        expect_operand(ctx.repeat_4d(a, 8, 7, 6, 1), "repeat", "not a multiple");
        expect_operand(ctx.pad_ext(a, -1, 0, 0, 0, 0, 0, 0, 0), "pad", "negative");
        let i = ctx.new_tensor_1d(I64, 3).unwrap();
        expect_operand(ctx.get_rows(a, i), "get_rows", "I32");
        let f = ctx.new_tensor_2d(F32, 4, 3).unwrap();
        expect_operand(ctx.cpy(a, f), "cpy", "elements");
        let i8t = ctx.new_tensor_1d(I8, 120).unwrap();
        expect_operand(ctx.cpy(a, i8t), "cpy", "no conversion");
    }

    #[test]
    fn set_rows_rejects_bad_operands() {
        let mut ctx = Context::new();
        let dst = ctx.new_tensor_2d(I32, 16, 10).unwrap();
        let b = ctx.new_tensor_2d(F32, 16, 4).unwrap();
        let c = ctx.new_tensor_1d(I64, 4).unwrap();
        expect_operand(ctx.set_rows(dst, b, c), "set_rows", "destination type i32");
        let dst = ctx.new_tensor_2d(F16, 16, 10).unwrap();
        let c3 = ctx.new_tensor_1d(I64, 3).unwrap();
        expect_operand(ctx.set_rows(dst, b, c3), "set_rows", "i64[3, 1, 1, 1]");
        let cf = ctx.new_tensor_1d(F32, 4).unwrap();
        expect_operand(ctx.set_rows(dst, b, cf), "set_rows", "I64 or I32");
        let b16 = ctx.new_tensor_2d(F16, 16, 4).unwrap();
        expect_operand(ctx.set_rows(dst, b16, c), "set_rows", "F32");
        let r = ctx.set_rows(dst, b, c).unwrap();
        let t = ctx.tensor(r).unwrap();
        assert_eq!((t.view_src, t.ne), (Some(dst), [16, 10, 1, 1]));
        assert_eq!(t.src.as_slice(), &[b, c, dst]);
    }

    /// Allocates every tensor, fills leafs, computes `out`.
    fn run(
        ctx: &Context,
        out: &[TensorId],
        fill: impl Fn(&TensorStorage) -> crate::Result<()>,
    ) -> (crate::Result<()>, TensorStorage) {
        let backend = CpuBackend::with_threads(2).unwrap();
        let mut st = TensorStorage::new();
        let ids: Vec<TensorId> = ctx.ids().collect();
        st.alloc_tensors(&backend, ctx, &ids).unwrap();
        fill(&st).unwrap();
        let g = ctx.build_forward(out).unwrap();
        let r = backend.compute(ctx, &g, &st);
        (r, st)
    }

    #[test]
    fn get_rows_out_of_range_index_is_a_compute_error() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(F32, 3, 4).unwrap();
        let b = ctx.new_tensor_1d(I32, 2).unwrap();
        let r = ctx.get_rows(a, b).unwrap();
        for bad in [4, -1] {
            let (res, _) = run(&ctx, &[r], |st| {
                st.set_f32(&ctx, a, &[0.0; 12])?;
                st.set_i32(&ctx, b, &[1, bad])
            });
            match res {
                Err(Error::Compute { detail }) => assert!(detail.contains("get_rows") && detail.contains("index")),
                other => panic!("{other:?}"),
            }
        }
        let (res, st) = run(&ctx, &[r], |st| {
            st.set_f32(&ctx, a, &(0..12).map(|x| x as f32).collect::<Vec<_>>())?;
            st.set_i32(&ctx, b, &[3, 0])
        });
        res.unwrap();
        assert_eq!(st.get_f32(&ctx, r).unwrap(), vec![9.0, 10.0, 11.0, 0.0, 1.0, 2.0]);
    }

    #[test]
    fn set_rows_bad_index_writes_nothing_and_duplicates_keep_the_last() {
        let mut ctx = Context::new();
        let dst = ctx.new_tensor_2d(F32, 2, 3).unwrap();
        let b = ctx.new_tensor_2d(F32, 2, 3).unwrap();
        let c = ctx.new_tensor_1d(I32, 3).unwrap();
        let r = ctx.set_rows(dst, b, c).unwrap();
        let fill = |idx: [i32; 3]| {
            let ctx = &ctx;
            move |st: &TensorStorage| {
                st.set_f32(ctx, dst, &[-1.0; 6])?;
                st.set_f32(ctx, b, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
                st.set_i32(ctx, c, &idx)
            }
        };
        let (res, st) = run(&ctx, &[r], fill([0, 3, 1]));
        assert!(matches!(res, Err(Error::Compute { ref detail }) if detail.contains("set_rows")));
        assert_eq!(st.get_f32(&ctx, dst).unwrap(), vec![-1.0; 6]);
        let (res, st) = run(&ctx, &[r], fill([2, 0, 2]));
        res.unwrap();
        assert_eq!(st.get_f32(&ctx, r).unwrap(), vec![3.0, 4.0, -1.0, -1.0, 5.0, 6.0]);
    }

    /// Rows of `ty` (`k` elements each): quantized data where this crate
    /// quantizes the type, else random bytes with a sane f16 scale at the
    /// front of each block (the importance-matrix types keep it there).
    fn rows_of(ty: GgmlType, k: usize, rows: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let vals: Vec<f32> = (0..k * rows).map(|_| (next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect();
        let mut bytes = vec![0u8; rows * ty.row_size(k as i64).unwrap()];
        if crate::tensor::quant::quantize_requires_imatrix(ty) {
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = (next() >> (8 * (i % 4))) as u8;
            }
            let d = crate::tensor::quant::fp32_to_fp16_bits(0.01).to_le_bytes();
            for blk in bytes.chunks_exact_mut(ty.type_size()) {
                blk[..2].copy_from_slice(&d);
            }
        } else {
            crate::tensor::quant::quantize_chunk(ty, &vals, &mut bytes, rows, k).unwrap();
        }
        (bytes, vals)
    }

    /// `get_rows`, `cpy` to and from F32, `set_rows` and a strided `cont` of
    /// every type of ggml 0.25.3 that 0.15.3 lacked, on the CPU backend,
    /// against `dequantize_row` / `from_float` of the same rows.
    #[test]
    fn data_ops_of_the_new_block_types() {
        use crate::tensor::quant::{dequantize_row, from_float};
        let types = [
            IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0,
            Q2_0,
        ];
        for ty in types {
            let (k, rows) = (256usize, 5usize);
            let rb = ty.row_size(k as i64).unwrap();
            let (table_bytes, vals) = rows_of(ty, k, rows, 0x5eed ^ ty.id() as u64);
            let deq = |bytes: &[u8]| {
                let mut y = vec![0f32; bytes.len() / ty.type_size() * ty.block_size()];
                dequantize_row(ty, bytes, &mut y).unwrap();
                y
            };
            let mut ctx = Context::new();
            let table = ctx.new_tensor_2d(ty, k as i64, rows as i64).unwrap();
            let idx = ctx.new_tensor_1d(I32, 4).unwrap();
            let got = ctx.get_rows(table, idx).unwrap();
            let f = ctx.new_tensor_2d(F32, k as i64, rows as i64).unwrap();
            let to_f32 = ctx.cpy(table, f).unwrap();
            // A permuted view of the table made contiguous: whole blocks move.
            let t3 = ctx.reshape_3d(table, k as i64, 1, rows as i64).unwrap();
            let p = ctx.permute(t3, [0, 2, 1, 3]).unwrap();
            let dup = ctx.cont(p).unwrap();
            let mut outs = vec![got, to_f32, dup];
            // F32 → ty by cpy (5 rows) and by set_rows (3 rows into 3, permuted).
            let src = ctx.new_tensor_2d(F32, k as i64, rows as i64).unwrap();
            let back = ctx.new_tensor_2d(ty, k as i64, rows as i64).unwrap();
            let src3 = ctx.new_tensor_2d(F32, k as i64, 3).unwrap();
            let idx3 = ctx.new_tensor_1d(I32, 3).unwrap();
            let dst = ctx.new_tensor_2d(ty, k as i64, 3).unwrap();
            let quantizable = super::quantizable(ty);
            if quantizable {
                let back = ctx.cpy(src, back).unwrap();
                let scat = ctx.set_rows(dst, src3, idx3).unwrap();
                outs.extend([back, scat]);
            } else {
                expect_operand(ctx.cpy(src, back), "cpy", "no conversion");
                expect_operand(ctx.set_rows(dst, src3, idx3), "set_rows", "destination type");
            }
            let ids = [3i32, 0, 4, 1];
            let (res, st) = run(&ctx, &outs, |st| {
                st.set_bytes(&ctx, table, 0, &table_bytes)?;
                st.set_i32(&ctx, idx, &ids)?;
                st.set_f32(&ctx, src, &vals)?;
                st.set_f32(&ctx, src3, &vals[..3 * k])?;
                st.set_i32(&ctx, idx3, &[2, 0, 1])?;
                st.set_bytes(&ctx, dst, 0, &vec![0u8; 3 * rb])
            });
            res.unwrap_or_else(|e| panic!("{ty}: {e}"));
            let all = deq(&table_bytes);
            let want: Vec<f32> = ids.iter().flat_map(|&i| all[i as usize * k..(i as usize + 1) * k].to_vec()).collect();
            assert_eq!(st.get_f32(&ctx, got).unwrap(), want, "{ty}: get_rows");
            assert_eq!(st.get_f32(&ctx, to_f32).unwrap(), all, "{ty}: cpy to f32");
            let bytes_of = |id: TensorId, n: usize| {
                let mut b = vec![0u8; n * rb];
                st.get_bytes(&ctx, id, 0, &mut b).unwrap();
                b
            };
            assert_eq!(bytes_of(dup, rows), table_bytes, "{ty}: cont of a permuted view");
            if quantizable {
                let mut want = vec![0u8; rows * rb];
                for (x, q) in vals.chunks_exact(k).zip(want.chunks_exact_mut(rb)) {
                    from_float(ty, x, q).unwrap();
                }
                assert_eq!(bytes_of(back, rows), want, "{ty}: cpy from f32");
                let scattered: Vec<u8> =
                    [1usize, 2, 0].iter().flat_map(|&r| want[r * rb..(r + 1) * rb].to_vec()).collect();
                assert_eq!(bytes_of(dst, 3), scattered, "{ty}: set_rows");
            }
        }
    }

    #[test]
    fn block_cont_with_new_ne0_follows_logical_order() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_3d(Q8_0, 64, 3, 4).unwrap();
        let p = ctx.permute(a, [0, 2, 1, 3]).unwrap();
        let c = ctx.cont_2d(p, 32, 24).unwrap();
        let vals: Vec<f32> = (0..768).map(|i| ((i * 37 % 101) as f32 - 50.0) / 16.0).collect();
        let (res, st) = run(&ctx, &[c], |st| st.set_f32(&ctx, a, &vals));
        res.unwrap();
        assert_eq!(st.get_f32(&ctx, c).unwrap(), st.get_f32(&ctx, p).unwrap());
    }

    #[test]
    fn layouts_ggml_cpu_rejects_still_compute() {
        // repeat of a transposed source, pad of F16, concat of Q8_0 rows.
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(F32, 2, 3).unwrap();
        let t = ctx.transpose(a).unwrap();
        let rep = ctx.repeat_4d(t, 6, 2, 1, 1).unwrap();
        let h = ctx.new_tensor_1d(F16, 2).unwrap();
        let pd = ctx.pad_ext(h, 1, 1, 0, 1, 0, 0, 0, 0).unwrap();
        let q1 = ctx.new_tensor_2d(Q8_0, 32, 1).unwrap();
        let q2 = ctx.new_tensor_2d(Q8_0, 32, 2).unwrap();
        let qc = ctx.concat(q1, q2, 1).unwrap();
        let vals: Vec<f32> = (0..96).map(|i| (i as f32 - 40.0) / 8.0).collect();
        let (res, st) = run(&ctx, &[rep, pd, qc], |st| {
            st.set_f32(&ctx, a, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
            st.set_f32(&ctx, h, &[7.0, 8.0])?;
            st.set_f32(&ctx, q1, &vals[..32])?;
            st.set_f32(&ctx, q2, &vals[32..])
        });
        res.unwrap();
        assert_eq!(st.get_f32(&ctx, rep).unwrap(), vec![1.0, 3.0, 5.0, 1.0, 3.0, 5.0, 2.0, 4.0, 6.0, 2.0, 4.0, 6.0]);
        assert_eq!(st.get_f32(&ctx, pd).unwrap(), vec![0.0, 7.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let mut want = st.get_f32(&ctx, q1).unwrap();
        want.extend(st.get_f32(&ctx, q2).unwrap());
        assert_eq!(st.get_f32(&ctx, qc).unwrap(), want);
    }
}
