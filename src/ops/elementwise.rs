//! Element-wise ops: binary arithmetic with broadcasting (`add`, `sub`,
//! `mul`, `div`, `add1`), affine maps (`scale`, `scale_bias`, `clamp`),
//! `sqr`/`sqrt`, the unary activations (`unary` and its conveniences), gated
//! linear units (`glu`, `glu_split` and conveniences) and `fill`.
//!
//! Shape rules follow ggml's constructors in `ggml.c` (`ggml_add_impl`,
//! `ggml_add1_impl`, `ggml_scale_impl`, `ggml_clamp`, `ggml_unary_impl`,
//! `ggml_glu_impl`, `ggml_fill_impl`); the accepted types are those ggml's CPU
//! backend computes (`binary-ops.cpp`, `unary-ops.cpp`, `ops.cpp`), so every
//! graph accepted here also runs in ggml.

use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::{GluOp, Op, UnaryOp};
use crate::tensor::{GgmlType, Tensor, TensorId, MAX_DIMS};

/// True if `t` has a zero extent (`ggml_is_empty`).
pub(super) fn is_empty(t: &Tensor) -> bool {
    t.ne.contains(&0)
}

/// True if `big` is a whole repetition of `small` along every dim
/// (`ggml_can_repeat(small, big)`): an empty `small` only repeats into an
/// empty `big`.
pub(super) fn can_repeat(small: &Tensor, big: &Tensor) -> bool {
    if is_empty(small) {
        return is_empty(big);
    }
    (0..MAX_DIMS).all(|i| small.ne[i] > 0 && big.ne[i] % small.ne[i] == 0)
}

/// `ggml_is_contiguous_n`: rows packed and dims above `n` packed on top of
/// the dim below them (dims `1..=n` may have any stride).
pub(super) fn is_contiguous_n(t: &Tensor, n: usize) -> bool {
    let ts = t.ty.type_size();
    let bs = t.ty.block_size() as i64;
    if t.ne[0] != bs && t.nb[0] != ts {
        return false;
    }
    let mut next = ts.saturating_mul((t.ne[0].max(0) / bs) as usize);
    for i in 1..MAX_DIMS {
        let ne = t.ne[i].max(0) as usize;
        if i > n {
            if ne != 1 && t.nb[i] != next {
                return false;
            }
            next = next.saturating_mul(ne);
        } else {
            next = ne.saturating_mul(t.nb[i]);
        }
    }
    true
}

/// `ggml_is_padded_1d`: rows packed, dims 2 and 3 packed on top of dim 1.
pub(super) fn is_padded_1d(t: &Tensor) -> bool {
    t.nb[0] == t.ty.type_size()
        && t.nb[2] == t.nb[1].saturating_mul(t.ne[1].max(0) as usize)
        && t.nb[3] == t.nb[2].saturating_mul(t.ne[2].max(0) as usize)
}

/// Rejects any type outside `allowed` for `operand` of `op`.
pub(super) fn expect_type(op: &'static str, operand: &'static str, t: &Tensor, allowed: &[GgmlType]) -> Result<()> {
    if allowed.contains(&t.ty) {
        return Ok(());
    }
    let names: Vec<&str> = allowed.iter().map(|a| a.name()).collect();
    Err(Error::operand(
        op,
        operand,
        format!("{} has type {}; ggml's CPU backend takes {}", t.describe(), t.ty, names.join("/")),
    ))
}

/// Types accepted by the unary functions ggml computes through its generic
/// unary table (`unary-ops.cpp`).
const UNARY_TYPES: &[GgmlType] = &[GgmlType::F32, GgmlType::F16, GgmlType::BF16];
/// Types of the activations ggml implements only for F32/F16 (gelu,
/// gelu_quick, silu, the GLUs, clamp, fill).
const F32_F16: &[GgmlType] = &[GgmlType::F32, GgmlType::F16];

impl Context {
    /// Shared body of `add`/`sub`/`mul`/`div` (`ggml_add_impl` & co.).
    fn binary_impl(&mut self, name: &'static str, op: Op, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, name, "src0")?;
        let tb = self.operand(b, name, "src1")?;
        if !can_repeat(tb, ta) {
            return Err(Error::operand(
                name,
                "src1",
                format!(
                    "{} cannot be broadcast over src0 {} (each src0 extent must be a multiple of src1's)",
                    tb.describe(),
                    ta.describe()
                ),
            ));
        }
        use GgmlType::*;
        let ok = match (ta.ty, tb.ty) {
            (F32, F32) | (F16, F16) | (BF16, BF16) | (F16, F32) | (BF16, F32) => true,
            // ggml_compute_forward_add_q_f32: a quantized src0 plus an F32 src1 of the same shape.
            (q, F32) if q.is_quantized() && matches!(op, Op::Add) => {
                if ta.ne != tb.ne {
                    return Err(Error::operand(
                        name,
                        "src1",
                        format!(
                            "a quantized src0 {} needs an F32 src1 of the same shape, got {}",
                            ta.describe(),
                            tb.describe()
                        ),
                    ));
                }
                true
            }
            _ => false,
        };
        if !ok {
            return Err(Error::operand(
                name,
                "src1",
                format!(
                    "type combination src0 {} / src1 {} is not computed by ggml's CPU backend (F32/F32, F16/F16, BF16/BF16, F16/F32, BF16/F32{})",
                    ta.describe(),
                    tb.describe(),
                    if matches!(op, Op::Add) { ", quantized/F32 same shape" } else { "" }
                ),
            ));
        }
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, op, &[a, b])
    }

    /// `a + b` element-wise, `b` repeated over `a` (`ggml_add`). The result
    /// has `a`'s type and shape `[ne0, ne1, ne2, ne3]` of `a`.
    ///
    /// `b.ne[i]` must divide `a.ne[i]` for every dim (`ggml_can_repeat`).
    /// Types (src0/src1): F32/F32, F16/F16, BF16/BF16, F16/F32, BF16/F32, or a
    /// quantized `a` with an F32 `b` of the same shape (the result is
    /// re-quantized, as ggml's `add_q_f32`). Any strides are accepted.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] naming `src1` for a shape that does not
    /// broadcast or a type combination ggml does not compute; foreign handles.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl("add", Op::Add, a, b)
    }

    /// `a − b` with `b` broadcast over `a` (`ggml_sub`); rules as [`Context::add`]
    /// without the quantized case.
    ///
    /// # Errors
    /// As [`Context::add`].
    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl("sub", Op::Sub, a, b)
    }

    /// `a · b` with `b` broadcast over `a` (`ggml_mul`); rules as [`Context::sub`].
    ///
    /// # Errors
    /// As [`Context::add`].
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl("mul", Op::Mul, a, b)
    }

    /// `a / b` with `b` broadcast over `a` (`ggml_div`); rules as [`Context::sub`].
    ///
    /// # Errors
    /// As [`Context::add`].
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary_impl("div", Op::Div, a, b)
    }

    /// `a + b` where `b` is a one-element tensor `[1, 1, 1, 1]` (`ggml_add1`).
    /// Result: `a`'s type and shape.
    ///
    /// `a` must be padded 1-d (`ggml_is_padded_1d`: packed rows, dims 2-3
    /// packed on dim 1). Types: F32 + F32, F16 + F16/F32, BF16 + BF16/F32,
    /// quantized + F32 (`ggml_compute_forward_add1`).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a non-scalar `b`, a strided `a` or an
    /// unsupported type pair.
    pub fn add1(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "add1", "src0")?;
        let tb = self.operand(b, "add1", "src1")?;
        if tb.ne != [1, 1, 1, 1] {
            return Err(Error::operand("add1", "src1", format!("{} is not a scalar [1, 1, 1, 1]", tb.describe())));
        }
        if !is_padded_1d(ta) {
            return Err(Error::operand(
                "add1",
                "src0",
                format!("{} with strides {:?} is not padded 1-d (ggml_is_padded_1d)", ta.describe(), ta.nb),
            ));
        }
        use GgmlType::*;
        let ok = match (ta.ty, tb.ty) {
            (F32, F32) | (F16, F16) | (F16, F32) | (BF16, BF16) | (BF16, F32) => true,
            (q, F32) => q.is_quantized(),
            _ => false,
        };
        if !ok {
            return Err(Error::operand(
                "add1",
                "src1",
                format!(
                    "type combination src0 {} / src1 {} is not computed by ggml's CPU backend",
                    ta.describe(),
                    tb.describe()
                ),
            ));
        }
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Add1, &[a, b])
    }

    /// `s · a` (`ggml_scale`). `a` must be F32 and padded 1-d; the result is
    /// a new F32 tensor of `a`'s shape.
    ///
    /// # Errors
    /// As [`Context::scale_bias`].
    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId> {
        self.scale_bias(a, s, 0.0)
    }

    /// `s · a + b` (`ggml_scale_bias`, `Op::Scale { s, b }`). `a` must be F32
    /// (ggml's CPU `scale` is F32-only) and padded 1-d (`ggml_is_padded_1d`).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for another type or a strided `a`.
    pub fn scale_bias(&mut self, a: TensorId, s: f32, b: f32) -> Result<TensorId> {
        let ta = self.operand(a, "scale", "src0")?;
        expect_type("scale", "src0", ta, &[GgmlType::F32])?;
        if !is_padded_1d(ta) {
            return Err(Error::operand(
                "scale",
                "src0",
                format!("{} with strides {:?} is not padded 1-d (ggml_is_padded_1d)", ta.describe(), ta.nb),
            ));
        }
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Scale { s, b }, &[a])
    }

    /// `min(max(a, min), max)` element-wise (`ggml_clamp`; NaN maps to `max`
    /// as in ggml). Types F32/F16; the result is a new contiguous tensor of
    /// `a`'s type and shape (ggml returns a view of `a` written in place; the
    /// values are the same).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for another type.
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        let ta = self.operand(a, "clamp", "src0")?;
        expect_type("clamp", "src0", ta, F32_F16)?;
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Clamp { min, max }, &[a])
    }

    /// `a²` element-wise (`ggml_sqr`). Types F32/F16/BF16; result of `a`'s
    /// type and shape.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for another type.
    pub fn sqr(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "sqr", "src0")?;
        expect_type("sqr", "src0", ta, UNARY_TYPES)?;
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Sqr, &[a])
    }

    /// `√a` element-wise (`ggml_sqrt`; negative inputs give NaN). Types
    /// F32/F16/BF16; result of `a`'s type and shape.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for another type.
    pub fn sqrt(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "sqrt", "src0")?;
        expect_type("sqrt", "src0", ta, UNARY_TYPES)?;
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Sqrt, &[a])
    }

    /// Applies the unary function `f` element-wise (`ggml_unary`). `a` must
    /// have packed rows (`ggml_is_contiguous_rows`). Types: F32/F16 for
    /// `Gelu`, `GeluQuick` and `Silu`; F32/F16/BF16 for the others. The
    /// result has `a`'s type and shape.
    ///
    /// Formulas (ggml's CPU): gelu is the tanh approximation looked up in an
    /// F16 table (F32 inputs: 0 at x ≤ −10, x at x ≥ 10); gelu_quick is
    /// x·σ(1.702x) from an F16 table; silu x/(1+e^−x); softplus
    /// log(1+e^x), or x above 20.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for strided rows or an unsupported type.
    pub fn unary(&mut self, a: TensorId, f: UnaryOp) -> Result<TensorId> {
        let name = f.name();
        let ta = self.operand(a, name, "src0")?;
        if !ta.is_contiguous_rows() {
            return Err(Error::operand(
                name,
                "src0",
                format!(
                    "{} with nb0 = {} does not have packed rows (ggml_is_contiguous_rows)",
                    ta.describe(),
                    ta.nb[0]
                ),
            ));
        }
        let types = match f {
            UnaryOp::Gelu | UnaryOp::GeluQuick | UnaryOp::Silu => F32_F16,
            _ => UNARY_TYPES,
        };
        expect_type(name, "src0", ta, types)?;
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Unary(f), &[a])
    }

    /// `unary(a, Silu)`: x / (1 + e^−x) (`ggml_silu`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Silu)
    }

    /// `unary(a, Gelu)`: ggml's tanh-approximated GELU (`ggml_gelu`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Gelu)
    }

    /// `unary(a, GeluQuick)`: x · σ(1.702 x) (`ggml_gelu_quick`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn gelu_quick(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::GeluQuick)
    }

    /// `unary(a, Relu)`: max(x, 0) (`ggml_relu`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn relu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Relu)
    }

    /// `unary(a, Sigmoid)`: 1 / (1 + e^−x) (`ggml_sigmoid`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn sigmoid(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Sigmoid)
    }

    /// `unary(a, Tanh)` (`ggml_tanh`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn tanh(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Tanh)
    }

    /// `unary(a, Exp)`: e^x (`ggml_exp`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn exp(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Exp)
    }

    /// `unary(a, Neg)`: −x (`ggml_neg`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn neg(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Neg)
    }

    /// `unary(a, Abs)`: |x| (`ggml_abs`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn abs(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Abs)
    }

    /// `unary(a, Softplus)`: log(1 + e^x), x above 20 (`ggml_softplus`).
    ///
    /// # Errors
    /// As [`Context::unary`].
    pub fn softplus(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(a, UnaryOp::Softplus)
    }

    /// Fused gated linear unit (`ggml_glu`): each row of `a` `[ne0, ne1,
    /// ne2, ne3]` holds the gate in its first `ne0/2` elements and the up
    /// projection in the next `ne0/2` (the other way round when `swapped`);
    /// the result is `act(gate) · up`, shape `[ne0/2, ne1, ne2, ne3]`, `a`'s
    /// type. `a` must be F32/F16 and `ggml_is_contiguous_1` (packed rows,
    /// dims 2-3 packed on dim 1).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a layout or type ggml rejects.
    pub fn glu(&mut self, a: TensorId, op: GluOp, swapped: bool) -> Result<TensorId> {
        let ta = self.operand(a, "glu", "src0")?;
        if !is_contiguous_n(ta, 1) {
            return Err(Error::operand(
                "glu",
                "src0",
                format!(
                    "{} with strides {:?} is not contiguous above dim 1 (ggml_is_contiguous_1)",
                    ta.describe(),
                    ta.nb
                ),
            ));
        }
        expect_type("glu", "src0", ta, F32_F16)?;
        let ty = ta.ty;
        let ne = [ta.ne[0] / 2, ta.ne[1], ta.ne[2], ta.ne[3]];
        self.push_op(ty, ne, Op::Glu { op, swapped }, &[a])
    }

    /// Split gated linear unit (`ggml_glu_split`): `act(a) · b` with `a` the
    /// gate and `b` the up projection, same shape and type (F32/F16), both
    /// `ggml_is_contiguous_1`. The result has `a`'s shape and type.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for different shapes/types or a layout ggml
    /// rejects.
    pub fn glu_split(&mut self, a: TensorId, b: TensorId, op: GluOp) -> Result<TensorId> {
        let ta = self.operand(a, "glu", "src0")?;
        let tb = self.operand(b, "glu", "src1")?;
        for (t, name) in [(ta, "src0"), (tb, "src1")] {
            if !is_contiguous_n(t, 1) {
                return Err(Error::operand(
                    "glu",
                    name,
                    format!(
                        "{} with strides {:?} is not contiguous above dim 1 (ggml_is_contiguous_1)",
                        t.describe(),
                        t.nb
                    ),
                ));
            }
        }
        expect_type("glu", "src0", ta, F32_F16)?;
        if ta.ne != tb.ne || ta.ty != tb.ty {
            return Err(Error::operand(
                "glu",
                "src1",
                format!("{} must have the shape and type of src0 {}", tb.describe(), ta.describe()),
            ));
        }
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Glu { op, swapped: false }, &[a, b])
    }

    /// `glu(a, Swiglu, false)`: silu(first half) · second half (`ggml_swiglu`).
    ///
    /// # Errors
    /// As [`Context::glu`].
    pub fn swiglu(&mut self, a: TensorId) -> Result<TensorId> {
        self.glu(a, GluOp::Swiglu, false)
    }

    /// `glu_split(a, b, Swiglu)`: silu(a) · b (`ggml_swiglu_split`).
    ///
    /// # Errors
    /// As [`Context::glu_split`].
    pub fn swiglu_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.glu_split(a, b, GluOp::Swiglu)
    }

    /// `glu(a, Geglu, false)`: gelu(first half) · second half (`ggml_geglu`).
    ///
    /// # Errors
    /// As [`Context::glu`].
    pub fn geglu(&mut self, a: TensorId) -> Result<TensorId> {
        self.glu(a, GluOp::Geglu, false)
    }

    /// `glu_split(a, b, Geglu)`: gelu(a) · b (`ggml_geglu_split`).
    ///
    /// # Errors
    /// As [`Context::glu_split`].
    pub fn geglu_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.glu_split(a, b, GluOp::Geglu)
    }

    /// A new tensor of `a`'s type and shape with every element `c`
    /// (`ggml_fill`; `a`'s values are not read). `a` must be F32/F16 and
    /// contiguous.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for another type or a strided `a`.
    pub fn fill(&mut self, a: TensorId, c: f32) -> Result<TensorId> {
        let ta = self.operand(a, "fill", "src0")?;
        expect_type("fill", "src0", ta, F32_F16)?;
        if !ta.is_contiguous() {
            return Err(Error::operand(
                "fill",
                "src0",
                format!("{} with strides {:?} is not contiguous", ta.describe(), ta.nb),
            ));
        }
        let (ty, ne) = (ta.ty, ta.ne);
        self.push_op(ty, ne, Op::Fill { c }, &[a])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::err_names;

    #[test]
    fn broadcast_rules() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_4d(GgmlType::F32, 10, 5, 4, 3).unwrap();
        let b = ctx.new_tensor_4d(GgmlType::F32, 10, 1, 4, 1).unwrap();
        let r = ctx.add(a, b).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().ne, [10, 5, 4, 3]);
        let bad = ctx.new_tensor_4d(GgmlType::F32, 10, 3, 1, 1).unwrap();
        err_names(ctx.mul(a, bad), "mul", "src1");
        // Broadcasting is one-way: the bigger tensor cannot be src1.
        err_names(ctx.sub(b, a), "sub", "src1");
        let f16 = ctx.new_tensor_4d(GgmlType::F16, 10, 1, 1, 1).unwrap();
        err_names(ctx.div(a, f16), "div", "src1");
        let h = ctx.new_tensor_4d(GgmlType::F16, 10, 5, 4, 3).unwrap();
        assert!(ctx.div(h, b).is_ok());
        // Empty src1 only over an empty src0.
        let e = ctx.new_tensor_4d(GgmlType::F32, 0, 1, 1, 1).unwrap();
        err_names(ctx.add(a, e), "add", "src1");
        let e2 = ctx.new_tensor_4d(GgmlType::F32, 0, 5, 1, 1).unwrap();
        assert!(ctx.add(e2, e).is_ok());
        let q = ctx.new_tensor_2d(GgmlType::Q8_0, 64, 2).unwrap();
        let qb = ctx.new_tensor_2d(GgmlType::F32, 64, 1).unwrap();
        err_names(ctx.add(q, qb), "add", "src1");
        let qf = ctx.new_tensor_2d(GgmlType::F32, 64, 2).unwrap();
        let qa = ctx.add(q, qf).unwrap();
        assert_eq!(ctx.tensor(qa).unwrap().ty, GgmlType::Q8_0);
        err_names(ctx.mul(q, qf), "mul", "src1");
    }

    #[test]
    fn unary_and_glu_rules() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_3d(GgmlType::F32, 8, 3, 2).unwrap();
        let t = ctx.transpose(a).unwrap();
        err_names(ctx.silu(t), "silu", "src0");
        let bf = ctx.new_tensor_2d(GgmlType::BF16, 8, 3).unwrap();
        err_names(ctx.gelu(bf), "gelu", "src0");
        assert!(ctx.relu(bf).is_ok());
        let g = ctx.swiglu(a).unwrap();
        assert_eq!(ctx.tensor(g).unwrap().ne, [4, 3, 2, 1]);
        let b = ctx.new_tensor_3d(GgmlType::F32, 8, 3, 1).unwrap();
        err_names(ctx.swiglu_split(a, b), "glu", "src1");
        let i = ctx.new_tensor_1d(GgmlType::I32, 4).unwrap();
        err_names(ctx.glu(i, GluOp::Geglu, false), "glu", "src0");
        err_names(ctx.scale(bf, 2.0), "scale", "src0");
        err_names(ctx.fill(t, 1.0), "fill", "src0");
        let s = ctx.new_tensor_1d(GgmlType::F32, 2).unwrap();
        err_names(ctx.add1(a, s), "add1", "src1");
        err_names(ctx.clamp(bf, 0.0, 1.0), "clamp", "src0");
    }

    #[test]
    fn contiguity_helpers() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_3d(GgmlType::F32, 8, 3, 2).unwrap();
        assert!(is_contiguous_n(ctx.tensor(a).unwrap(), 0));
        let v = ctx.view_2d(a, 4, 3, 32, 0).unwrap();
        let tv = ctx.tensor(v).unwrap();
        assert!(!is_contiguous_n(tv, 0));
        assert!(is_contiguous_n(tv, 1));
        let p = ctx.permute(a, [0, 2, 1, 3]).unwrap();
        assert!(!is_contiguous_n(ctx.tensor(p).unwrap(), 1));
        assert!(!is_padded_1d(ctx.tensor(p).unwrap()));
    }
}
