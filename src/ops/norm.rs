//! Row normalisations: `rms_norm`, `norm`, `l2_norm`, and `soft_max` /
//! `soft_max_ext` (scale, mask, ALiBi).
//!
//! Shape rules follow ggml's constructors in `ggml.c` (`ggml_rms_norm_impl`,
//! `ggml_norm_impl`, `ggml_l2_norm_impl`, `ggml_soft_max_impl`); all are F32
//! only, as in ggml's CPU backend (`ops.cpp`), which also requires `eps ≥ 0`.

use super::elementwise::expect_type;
use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::Op;
use crate::tensor::{GgmlType, TensorId};

impl Context {
    /// Shared body of the three norms.
    fn norm_impl(&mut self, name: &'static str, a: TensorId, eps: f32, op: Op) -> Result<TensorId> {
        let ta = self.operand(a, name, "src0")?;
        expect_type(name, "src0", ta, &[GgmlType::F32])?;
        // ggml's CPU asserts `eps >= 0.0f`, which also rejects NaN.
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::operand(name, "eps", format!("eps = {eps} must be ≥ 0 (src0 {})", ta.describe())));
        }
        let ne = ta.ne;
        self.push_op(GgmlType::F32, ne, op, &[a])
    }

    /// RMS normalisation of each row (`ggml_rms_norm`):
    /// `y = x / sqrt(mean(x²) + eps)` over `ne0`, for the F32 tensor `a`
    /// `[ne0, ne1, ne2, ne3]`; result F32 of the same shape. The sum of
    /// squares is accumulated in f64, as ggml does.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a non-F32 `a` or `eps < 0` / NaN.
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.norm_impl("rms_norm", a, eps, Op::RmsNorm { eps })
    }

    /// Layer normalisation of each row without affine parameters
    /// (`ggml_norm`): `y = (x − mean) / sqrt(var + eps)` over `ne0`, F32.
    ///
    /// # Errors
    /// As [`Context::rms_norm`].
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.norm_impl("norm", a, eps, Op::Norm { eps })
    }

    /// L2 normalisation of each row (`ggml_l2_norm`):
    /// `y = x / max(‖x‖₂, eps)` over `ne0`, F32.
    ///
    /// # Errors
    /// As [`Context::rms_norm`].
    pub fn l2_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.norm_impl("l2_norm", a, eps, Op::L2Norm { eps })
    }

    /// Softmax over `ne0` of each row of the contiguous F32 tensor `a`
    /// (`ggml_soft_max`); `soft_max_ext(a, None, 1.0, 0.0)`.
    ///
    /// # Errors
    /// As [`Context::soft_max_ext`].
    pub fn soft_max(&mut self, a: TensorId) -> Result<TensorId> {
        self.soft_max_ext(a, None, 1.0, 0.0)
    }

    /// `softmax(a·scale + slope·mask)` over `ne0` of each row
    /// (`ggml_soft_max_ext`). `a` `[ne0, ne1, ne2, ne3]` is a contiguous F32
    /// tensor; the result is F32 of the same shape.
    ///
    /// `mask` (optional) is contiguous F16 or F32 `[ne0, ne1', ne2', ne3']`
    /// with `ne1' ≥ ne1` (row `i1` of `a` uses mask row `i1`), and `ne2'`,
    /// `ne3'` dividing `a`'s `ne2`, `ne3` (the mask repeats over them).
    ///
    /// ALiBi: with `max_bias > 0` (which needs a mask), head `h = i2` of
    /// `n_head = ne2` gets `slope = m0^(h+1)` for `h < n` and
    /// `m1^(2(h−n)+1)` otherwise, where `n = 2^⌊log2 n_head⌋`,
    /// `m0 = 2^(−max_bias/n)`, `m1 = 2^(−max_bias/2/n)`; otherwise slope = 1.
    /// Exponentials are summed in f64.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] naming `src0` (type, contiguity) or `mask`
    /// (type, contiguity, shape), or `max_bias` when it is positive without a mask.
    pub fn soft_max_ext(&mut self, a: TensorId, mask: Option<TensorId>, scale: f32, max_bias: f32) -> Result<TensorId> {
        let ta = self.operand(a, "soft_max", "src0")?;
        expect_type("soft_max", "src0", ta, &[GgmlType::F32])?;
        if !ta.is_contiguous() {
            return Err(Error::operand(
                "soft_max",
                "src0",
                format!("{} with strides {:?} is not contiguous", ta.describe(), ta.nb),
            ));
        }
        if let Some(m) = mask {
            let tm = self.operand(m, "soft_max", "mask")?;
            expect_type("soft_max", "mask", tm, &[GgmlType::F16, GgmlType::F32])?;
            if !tm.is_contiguous() {
                return Err(Error::operand(
                    "soft_max",
                    "mask",
                    format!("{} with strides {:?} is not contiguous", tm.describe(), tm.nb),
                ));
            }
            let shape_ok = tm.ne[0] == ta.ne[0]
                && tm.ne[1] >= ta.ne[1]
                && tm.ne[2] > 0
                && tm.ne[3] > 0
                && ta.ne[2] % tm.ne[2] == 0
                && ta.ne[3] % tm.ne[3] == 0;
            if !shape_ok {
                return Err(Error::operand(
                    "soft_max",
                    "mask",
                    format!(
                        "{} does not fit src0 {}: need mask ne0 = ne0, mask ne1 ≥ ne1, mask ne2 | ne2, mask ne3 | ne3",
                        tm.describe(),
                        ta.describe()
                    ),
                ));
            }
        } else if max_bias > 0.0 {
            return Err(Error::operand(
                "soft_max",
                "max_bias",
                format!("max_bias = {max_bias} > 0 (ALiBi) needs a mask (src0 {})", ta.describe()),
            ));
        }
        let ne = ta.ne;
        let srcs: Vec<TensorId> = std::iter::once(a).chain(mask).collect();
        self.push_op(GgmlType::F32, ne, Op::SoftMax { scale, max_bias }, &srcs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::err_names;

    #[test]
    fn soft_max_mask_rules() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_4d(GgmlType::F32, 16, 5, 4, 2).unwrap();
        let m = ctx.new_tensor_4d(GgmlType::F16, 16, 8, 2, 1).unwrap();
        let r = ctx.soft_max_ext(a, Some(m), 0.5, 8.0).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().src.len(), 2);
        let small = ctx.new_tensor_4d(GgmlType::F32, 16, 4, 1, 1).unwrap();
        err_names(ctx.soft_max_ext(a, Some(small), 1.0, 0.0), "soft_max", "mask");
        let wrong_heads = ctx.new_tensor_4d(GgmlType::F32, 16, 5, 3, 1).unwrap();
        err_names(ctx.soft_max_ext(a, Some(wrong_heads), 1.0, 0.0), "soft_max", "mask");
        let bf = ctx.new_tensor_4d(GgmlType::BF16, 16, 5, 1, 1).unwrap();
        err_names(ctx.soft_max_ext(a, Some(bf), 1.0, 0.0), "soft_max", "mask");
        err_names(ctx.soft_max_ext(a, None, 1.0, 1.0), "soft_max", "max_bias");
        let t = ctx.transpose(a).unwrap();
        err_names(ctx.soft_max(t), "soft_max", "src0");
        err_names(ctx.rms_norm(a, -1.0), "rms_norm", "eps");
        err_names(ctx.norm(a, f32::NAN), "norm", "eps");
        let h = ctx.new_tensor_1d(GgmlType::F16, 4).unwrap();
        err_names(ctx.l2_norm(h, 1e-6), "l2_norm", "src0");
        assert!(ctx.rms_norm(t, 1e-6).is_ok());
    }
}
