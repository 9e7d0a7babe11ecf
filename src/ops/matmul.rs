//! The matrix-product family: `mul_mat`, `mul_mat_id` (mixture-of-experts
//! product) and `add_id` (per-expert bias). Shape rules follow ggml's
//! constructors in `ggml.c` (`ggml_mul_mat`, `ggml_mul_mat_id`,
//! `ggml_add_id`) plus the layout assertions of the CPU kernels in
//! `ggml-cpu/ggml-cpu.c` (`ggml_compute_forward_mul_mat*`) and
//! `ggml-cpu/ops.cpp` (`ggml_compute_forward_add_id_f32`), so a graph that
//! builds here also computes.

use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::Op;
use crate::tensor::{GgmlType, Tensor, TensorId};

/// Weight types the matrix product accepts as `a` (ggml's CPU types with a
/// `vec_dot`): F32, F16, BF16 and every block format except the activation
/// formats Q8_1 and Q8_K ([`crate::tensor::quant::vec_dot_fn`] exists).
pub(crate) fn mul_mat_weight_type_ok(ty: GgmlType) -> bool {
    crate::tensor::quant::vec_dot_fn_scalar(ty).is_some()
}

/// Activation types accepted as `b` for weights of type `wt`: F32 always
/// (the kernel converts or quantizes it to the weights' dot type), and F16 /
/// BF16 when the weights have that same type (ggml passes `b` through when it
/// already has the weights' `vec_dot_type`). Quantized `b` is rejected.
pub(crate) fn mul_mat_act_type_ok(wt: GgmlType, bt: GgmlType) -> bool {
    bt == GgmlType::F32 || (matches!(bt, GgmlType::F16 | GgmlType::BF16) && bt == wt)
}

/// Checks the weights operand shared by `mul_mat` and `mul_mat_id`.
fn check_weights(op: &'static str, operand: &'static str, a: &Tensor) -> Result<()> {
    if !mul_mat_weight_type_ok(a.ty) {
        return Err(Error::operand(
            op,
            operand,
            format!(
                "{}: weights must be f32, f16, bf16 or a block type with a dot product (not q8_1, q8_K)",
                a.describe()
            ),
        ));
    }
    // ggml_mul_mat asserts !ggml_is_transposed(a); the CPU kernel also needs
    // packed rows (nb[0] == type size).
    if a.ne[0] > 1 && a.nb[0] != a.ty.type_size() {
        return Err(Error::operand(
            op,
            operand,
            format!("{} with strides {:?}: rows must be packed (nb[0] = type size)", a.describe(), a.nb),
        ));
    }
    if a.nb[0] > a.nb[1] && a.ne[1] > 1 {
        return Err(Error::operand(op, operand, format!("{} with strides {:?} is transposed", a.describe(), a.nb)));
    }
    Ok(())
}

/// Checks that `b` can feed weights of type `wt`.
/// Both operands of a matrix product have the same inner dimension K (`ne[0]`).
fn check_k(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.ne[0] != b.ne[0] {
        return Err(Error::operand(
            op,
            "src1",
            format!(
                "inner dimensions differ: src0 {} has K = {}, src1 {} has K = {}",
                a.describe(),
                a.ne[0],
                b.describe(),
                b.ne[0]
            ),
        ));
    }
    Ok(())
}

fn check_act(op: &'static str, wt: GgmlType, b: &Tensor) -> Result<()> {
    if !mul_mat_act_type_ok(wt, b.ty) {
        return Err(Error::operand(
            op,
            "src1",
            format!(
                "{} cannot multiply {wt} weights: src1 must be f32 (or the weights' own f16/bf16 type)",
                b.describe()
            ),
        ));
    }
    Ok(())
}

impl Context {
    /// Matrix product `a · b` in ggml's orientation (`ggml_mul_mat`): with
    /// weights `a` = [K, M, ne02, ne03] and activations `b` = [K, N, ne12, ne13]
    /// the result is F32 [M, N, ne12, ne13] with
    /// `result[m, n, i2, i3] = Σ_k a[k, m, i2 / (ne12/ne02), i3 / (ne13/ne03)] · b[k, n, i2, i3]`
    /// (`a` is broadcast over dims 2 and 3).
    ///
    /// `a` may be F32, F16, BF16 or any block type but Q8_1/Q8_K (Q4_0..Q8_0,
    /// Q2_K..Q6_K, the IQ, TQ and FP4 formats, Q1_0, Q2_0), with packed rows
    /// but any strides for dims 1..3 (e.g. a permuted K cache).
    /// `b` is F32 (F16/BF16 are also accepted when `a` has that type) with any
    /// strides, transposed included. As in ggml's CPU backend, `b` is first
    /// rounded to the weights' dot type (F16 for F16 weights, Q8_0/Q8_1/Q8_K
    /// for quantized weights: [`crate::tensor::quant::vec_dot_type`]), so
    /// quantized products carry activation quantization error.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] (op `"mul_mat"`) for a foreign operand,
    /// `a.ne[0] != b.ne[0]`, `b.ne[2]` not a multiple of `a.ne[2]` or `b.ne[3]`
    /// not a multiple of `a.ne[3]`, a transposed or row-strided `a`, an
    /// unsupported weight type, or a `b` type other than those above
    /// (quantized `b` included).
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "mul_mat";
        let ta = self.operand(a, OP, "src0")?;
        let tb = self.operand(b, OP, "src1")?;
        check_weights(OP, "src0", ta)?;
        check_act(OP, ta.ty, tb)?;
        check_k(OP, ta, tb)?;
        for d in 2..4 {
            let ok = if ta.ne[d] == 0 { tb.ne[d] == 0 } else { tb.ne[d] % ta.ne[d] == 0 };
            if !ok {
                return Err(Error::operand(
                    OP,
                    "src1",
                    format!(
                        "src0 {} cannot be broadcast over src1 {}: ne[{d}] = {} is not a multiple of {}",
                        ta.describe(),
                        tb.describe(),
                        tb.ne[d],
                        ta.ne[d]
                    ),
                ));
            }
        }
        let ne = [ta.ne[1], tb.ne[1], tb.ne[2], tb.ne[3]];
        self.push_op(GgmlType::F32, ne, Op::MulMat, &[a, b])
    }

    /// Expert matrix product (`ggml_mul_mat_id`): `as_` holds one weight
    /// matrix per expert, [K, M, n_expert]; `b` = [K, n_b, T] F32; `ids` =
    /// I32 [n_used, T] selects experts. The result is F32 [M, n_used, T] with
    /// `result[:, e, t] = as_[:, :, ids[e, t]] · b[:, e % n_b, t]`, so `b`'s
    /// dim 1 is either one row per used expert (`n_b = n_used`) or broadcast
    /// (`n_b = 1`, or any divisor of `n_used`).
    ///
    /// Weight and activation types are those of [`Context::mul_mat`]. An
    /// expert id outside `0..n_expert` found at compute time makes the
    /// backend's compute return [`Error::Compute`] (ggml asserts).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] (op `"mul_mat_id"`) for a foreign operand,
    /// `ids` not I32 or not 2-d, `as_` not 3-d (`ne[3] = 1`), `b` not 3-d,
    /// `ids.ne[1] != b.ne[2]`, `as_.ne[0] != b.ne[0]`, `ids.ne[0]` not a
    /// multiple of `b.ne[1]`, or weight/activation types and layouts
    /// rejected as in [`Context::mul_mat`].
    pub fn mul_mat_id(&mut self, as_: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "mul_mat_id";
        let ta = self.operand(as_, OP, "src0")?;
        let tb = self.operand(b, OP, "src1")?;
        let ti = self.operand(ids, OP, "ids")?;
        check_weights(OP, "src0", ta)?;
        check_act(OP, ta.ty, tb)?;
        if ti.ty != GgmlType::I32 {
            return Err(Error::operand(OP, "ids", format!("{} must be i32", ti.describe())));
        }
        if ta.ne[3] != 1 {
            return Err(Error::operand(OP, "src0", format!("{} must be 3-d [K, M, n_expert]", ta.describe())));
        }
        if tb.ne[3] != 1 {
            return Err(Error::operand(OP, "src1", format!("{} must be 3-d [K, n_used, T]", tb.describe())));
        }
        if ti.ne[2] != 1 || ti.ne[3] != 1 {
            return Err(Error::operand(OP, "ids", format!("{} must be 2-d [n_used, T]", ti.describe())));
        }
        if ti.ne[1] != tb.ne[2] {
            return Err(Error::operand(
                OP,
                "ids",
                format!(
                    "ids {} needs one expert list per token of src1 {} (ids.ne[1] != src1.ne[2])",
                    ti.describe(),
                    tb.describe()
                ),
            ));
        }
        check_k(OP, ta, tb)?;
        let bcast_ok = if tb.ne[1] == 0 { ti.ne[0] == 0 } else { ti.ne[0] % tb.ne[1] == 0 };
        if !bcast_ok {
            return Err(Error::operand(
                OP,
                "src1",
                format!(
                    "src1 {} cannot be broadcast over the {} used experts of ids {}",
                    tb.describe(),
                    ti.ne[0],
                    ti.describe()
                ),
            ));
        }
        let ne = [ta.ne[1], ti.ne[0], tb.ne[2], 1];
        self.push_op(GgmlType::F32, ne, Op::MulMatId, &[as_, b, ids])
    }

    /// Adds a per-expert bias (`ggml_add_id`): `a` = F32 [ne0, n_used, T, ne3],
    /// `b` = F32 [ne0, n_expert] (row `i` is expert `i`'s bias; only `b`'s
    /// first plane is read), `ids` = I32 [n_used, T]. The result has `a`'s
    /// shape with `result[:, e, t, i3] = a[:, e, t, i3] + b[:, ids[e, t]]`.
    ///
    /// An id outside `0..n_expert` found at compute time makes the backend's
    /// compute return [`Error::Compute`] (ggml asserts).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] (op `"add_id"`) for a foreign operand, `a` or
    /// `b` not F32 or with strided rows (`nb[0] != 4`), `ids` not I32,
    /// `a.ne[0] != b.ne[0]`, `a.ne[1] != ids.ne[0]` or `a.ne[2] != ids.ne[1]`.
    pub fn add_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "add_id";
        let ta = self.operand(a, OP, "src0")?;
        let tb = self.operand(b, OP, "src1")?;
        let ti = self.operand(ids, OP, "ids")?;
        for (name, t) in [("src0", ta), ("src1", tb)] {
            if t.ty != GgmlType::F32 {
                return Err(Error::operand(OP, name, format!("{} must be f32", t.describe())));
            }
            if t.ne[0] > 1 && t.nb[0] != 4 {
                return Err(Error::operand(
                    OP,
                    name,
                    format!("{} with strides {:?}: rows must be packed", t.describe(), t.nb),
                ));
            }
        }
        if ti.ty != GgmlType::I32 {
            return Err(Error::operand(OP, "ids", format!("{} must be i32", ti.describe())));
        }
        if ta.ne[0] != tb.ne[0] {
            return Err(Error::operand(
                OP,
                "src1",
                format!("row length differs: src0 {} vs src1 {}", ta.describe(), tb.describe()),
            ));
        }
        if ta.ne[1] != ti.ne[0] || ta.ne[2] != ti.ne[1] {
            return Err(Error::operand(
                OP,
                "ids",
                format!("ids {} must be [src0.ne[1], src0.ne[2]] for src0 {}", ti.describe(), ta.describe()),
            ));
        }
        let ne = ta.ne;
        self.push_op(GgmlType::F32, ne, Op::AddId, &[a, b, ids])
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::tensor::GgmlType;
    use crate::Context;

    fn op_of(e: &Error) -> &'static str {
        match e {
            Error::InvalidOperand { op, .. } => op,
            _ => "",
        }
    }

    #[test]
    fn mul_mat_shapes_and_errors() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_4d(GgmlType::Q4_0, 64, 7, 2, 1).unwrap();
        let b = ctx.new_tensor_4d(GgmlType::F32, 64, 5, 6, 3).unwrap();
        let c = ctx.mul_mat(a, b).unwrap();
        assert_eq!(ctx.tensor(c).unwrap().ne, [7, 5, 6, 3]);
        assert_eq!(ctx.tensor(c).unwrap().ty, GgmlType::F32);

        // K mismatch.
        let b2 = ctx.new_tensor_2d(GgmlType::F32, 32, 5).unwrap();
        let e = ctx.mul_mat(a, b2).unwrap_err();
        assert_eq!(op_of(&e), "mul_mat");
        assert!(e.to_string().contains("K = 64") && e.to_string().contains("K = 32"), "{e}");
        // Non-broadcastable batch.
        let b3 = ctx.new_tensor_4d(GgmlType::F32, 64, 5, 3, 1).unwrap();
        let e = ctx.mul_mat(a, b3).unwrap_err();
        assert!(e.to_string().contains("broadcast"), "{e}");
        // Quantized b.
        let bq = ctx.new_tensor_2d(GgmlType::Q8_0, 64, 5).unwrap();
        let e = ctx.mul_mat(a, bq).unwrap_err();
        assert_eq!(op_of(&e), "mul_mat");
        assert!(e.to_string().contains("q8_0"), "{e}");
        // F16 b only with F16 weights.
        let bh = ctx.new_tensor_2d(GgmlType::F16, 64, 5).unwrap();
        assert!(ctx.mul_mat(a, bh).is_err());
        let ah = ctx.new_tensor_2d(GgmlType::F16, 64, 3).unwrap();
        assert!(ctx.mul_mat(ah, bh).is_ok());
        // Unsupported weights.
        let ai = ctx.new_tensor_2d(GgmlType::I32, 64, 3).unwrap();
        assert!(ctx.mul_mat(ai, b2).is_err());
        // Transposed weights.
        let af = ctx.new_tensor_2d(GgmlType::F32, 8, 64).unwrap();
        let at = ctx.transpose(af).unwrap();
        let bf = ctx.new_tensor_2d(GgmlType::F32, 64, 4).unwrap();
        assert!(ctx.mul_mat(at, bf).is_err());
        // Transposed activations are fine.
        let x = ctx.new_tensor_2d(GgmlType::F32, 4, 64).unwrap();
        let xt = ctx.transpose(x).unwrap();
        let r = ctx.mul_mat(af, xt);
        assert!(r.is_err(), "af is [8, 64]: K = 8 vs 64");
        let w = ctx.new_tensor_2d(GgmlType::F32, 64, 8).unwrap();
        let r = ctx.mul_mat(w, xt).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().ne, [8, 4, 1, 1]);
        // Foreign handle.
        let mut other = Context::new();
        let f = other.new_tensor_1d(GgmlType::F32, 64).unwrap();
        assert_eq!(op_of(&ctx.mul_mat(a, f).unwrap_err()), "mul_mat");
    }

    #[test]
    fn mul_mat_id_shapes_and_errors() {
        let mut ctx = Context::new();
        let w = ctx.new_tensor_3d(GgmlType::Q8_0, 64, 9, 4).unwrap();
        let b = ctx.new_tensor_3d(GgmlType::F32, 64, 1, 5).unwrap();
        let ids = ctx.new_tensor_2d(GgmlType::I32, 2, 5).unwrap();
        let c = ctx.mul_mat_id(w, b, ids).unwrap();
        assert_eq!(ctx.tensor(c).unwrap().ne, [9, 2, 5, 1]);
        let b2 = ctx.new_tensor_3d(GgmlType::F32, 64, 2, 5).unwrap();
        assert!(ctx.mul_mat_id(w, b2, ids).is_ok());
        let b3 = ctx.new_tensor_3d(GgmlType::F32, 64, 3, 5).unwrap();
        assert_eq!(op_of(&ctx.mul_mat_id(w, b3, ids).unwrap_err()), "mul_mat_id");
        let b4 = ctx.new_tensor_3d(GgmlType::F32, 64, 2, 4).unwrap();
        assert!(ctx.mul_mat_id(w, b4, ids).is_err());
        let ids_f = ctx.new_tensor_2d(GgmlType::F32, 2, 5).unwrap();
        assert!(ctx.mul_mat_id(w, b, ids_f).is_err());
        let bk = ctx.new_tensor_3d(GgmlType::F32, 32, 1, 5).unwrap();
        assert!(ctx.mul_mat_id(w, bk, ids).is_err());
        let w4 = ctx.new_tensor_4d(GgmlType::F32, 64, 9, 4, 2).unwrap();
        assert!(ctx.mul_mat_id(w4, b, ids).is_err());
    }

    #[test]
    fn add_id_shapes_and_errors() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_3d(GgmlType::F32, 16, 2, 5).unwrap();
        let b = ctx.new_tensor_2d(GgmlType::F32, 16, 4).unwrap();
        let ids = ctx.new_tensor_2d(GgmlType::I32, 2, 5).unwrap();
        let c = ctx.add_id(a, b, ids).unwrap();
        assert_eq!(ctx.tensor(c).unwrap().ne, [16, 2, 5, 1]);
        let b2 = ctx.new_tensor_2d(GgmlType::F32, 8, 4).unwrap();
        assert_eq!(op_of(&ctx.add_id(a, b2, ids).unwrap_err()), "add_id");
        let ids2 = ctx.new_tensor_2d(GgmlType::I32, 3, 5).unwrap();
        assert!(ctx.add_id(a, b, ids2).is_err());
        let bh = ctx.new_tensor_2d(GgmlType::F16, 16, 4).unwrap();
        assert!(ctx.add_id(a, bh, ids).is_err());
    }
}
