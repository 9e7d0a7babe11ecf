//! Row normalisations: `rms_norm`, `norm`, `l2_norm`, and `soft_max` /
//! `soft_max_ext` (scale, mask, ALiBi) / `soft_max_add_sinks`.
//!
//! Shape rules follow ggml's constructors in `ggml.c` (`ggml_rms_norm_impl`,
//! `ggml_norm_impl`, `ggml_l2_norm_impl`, `ggml_soft_max_impl`,
//! `ggml_soft_max_add_sinks`); all are F32 only, as in ggml's CPU backend
//! (`ops.cpp`), which also requires `eps ≥ 0`.

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

    /// Attention sinks on a soft_max (`ggml_soft_max_add_sinks`, as gpt-oss
    /// uses them): one extra logit per head that joins each row's
    /// normaliser but has no output column. For row `(i1, h, i3)` of `x`
    /// (head `h = i2`), with `w = x·scale + slope·mask` as in
    /// [`Context::soft_max_ext`] and `s = sinks[h]`:
    /// `y = exp(w − M) / (Σ exp(w − M) + exp(s − M))`, `M = max(max w, s)`.
    ///
    /// `a` is a node made by [`Context::soft_max_ext`] (or
    /// [`Context::soft_max`]) over `x` `[ne0, ne1, ne2, ne3]`; `sinks` is a
    /// contiguous F32 tensor with `ne0 = ne2` (one logit per head, as ggml
    /// asserts `a->src[0]->ne[2] == sinks->ne[0]`). ggml sets `src[2]` of
    /// `a` in place; our nodes are immutable, so this returns a new soft_max
    /// node with the same parameters and sources `[x, mask, sinks]` (use it
    /// instead of `a`, which stays in the context unchanged).
    ///
    /// Sources are positional here (`src[1]` is the mask, `src[2]` the
    /// sinks), so when `a` has no mask the new node gets a zero F32 mask
    /// `[ne0, ne1, 1, 1]` in its place (a `fill` of a view of `x`'s first
    /// head; adding `slope·0` changes no score, so the result is ggml's
    /// without a mask).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] naming `a` (a foreign handle, not a soft_max
    /// node, one that already has sinks, or an empty `x` without a mask,
    /// which has no first head to view) or `sinks` (a foreign handle, not
    /// F32, not contiguous, or `ne0 ≠ ne2`).
    pub fn soft_max_add_sinks(&mut self, a: TensorId, sinks: TensorId) -> Result<TensorId> {
        const OP: &str = "soft_max";
        let t = self.operand(a, OP, "a")?;
        let Op::SoftMax { scale, max_bias } = t.op else {
            return Err(Error::operand(OP, "a", format!("{} is a {} node, not soft_max", t.describe(), t.op.name())));
        };
        if t.src.len() > 2 {
            return Err(Error::operand(OP, "a", format!("{} already has sinks (src[2])", t.describe())));
        }
        let (ne, x, mask) = (t.ne, t.src[0], t.src.get(1).copied());
        let tx = self.t(x);
        self.check_sinks(OP, sinks, tx.ne[2], "ne2 of src0", tx)?;
        let mask = match mask {
            Some(m) => m,
            None => self.zero_mask(x)?,
        };
        self.push_op(GgmlType::F32, ne, Op::SoftMax { scale, max_bias }, &[x, mask, sinks])
    }

    /// The zero mask `[ne0, ne1, 1, 1]` standing in for a missing soft_max
    /// mask in front of sinks: `fill(view of x's first head, 0)`.
    fn zero_mask(&mut self, x: TensorId) -> Result<TensorId> {
        let tx = self.t(x);
        if tx.nelements() == 0 && tx.ne[0] * tx.ne[1] != 0 {
            return Err(Error::operand(
                "soft_max",
                "a",
                format!("src0 {} is empty: no first head to stand in for the mask in front of sinks", tx.describe()),
            ));
        }
        let (ne0, ne1, nb1) = (tx.ne[0], tx.ne[1], tx.nb[1]);
        let head = self.view_2d(x, ne0, ne1, nb1, 0)?;
        self.fill(head, 0.0)
    }

    /// Checks a sinks operand of `op` (`ggml_soft_max_add_sinks`,
    /// `ggml_flash_attn_ext_add_sinks`): F32, contiguous, one logit per head
    /// (`ne0 = n_head`, the `what` of `of`).
    pub(super) fn check_sinks(
        &self,
        op: &'static str,
        sinks: TensorId,
        n_head: i64,
        what: &str,
        of: &crate::tensor::Tensor,
    ) -> Result<()> {
        let ts = self.operand(sinks, op, "sinks")?;
        let why = if ts.ty != GgmlType::F32 {
            "must be F32"
        } else if !ts.is_contiguous() {
            "must be contiguous"
        } else if ts.ne[0] != n_head {
            "needs one logit per head (ne0 = n_head)"
        } else {
            return Ok(());
        };
        Err(Error::operand(
            op,
            "sinks",
            format!("sinks {} (nb {:?}) {why}; {what} = {n_head} ({})", ts.describe(), ts.nb, of.describe()),
        ))
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

    #[test]
    fn soft_max_add_sinks_rules() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_4d(GgmlType::F32, 16, 5, 4, 2).unwrap();
        let m = ctx.new_tensor_4d(GgmlType::F16, 16, 8, 1, 1).unwrap();
        let sinks = ctx.new_tensor_1d(GgmlType::F32, 4).unwrap();
        // With a mask: the same parameters, sources [x, mask, sinks].
        let sm = ctx.soft_max_ext(a, Some(m), 0.5, 0.0).unwrap();
        let r = ctx.soft_max_add_sinks(sm, sinks).unwrap();
        let t = ctx.tensor(r).unwrap();
        assert_eq!(t.src.as_slice(), &[a, m, sinks]);
        assert_eq!(t.ne, [16, 5, 4, 2]);
        assert!(matches!(t.op, Op::SoftMax { scale, max_bias } if scale == 0.5 && max_bias == 0.0));
        assert_eq!(ctx.tensor(sm).unwrap().src.len(), 2, "the soft_max node itself is unchanged");
        // Without a mask: a zero F32 mask [ne0, ne1, 1, 1] takes src[1].
        let plain = ctx.soft_max(a).unwrap();
        let r = ctx.soft_max_add_sinks(plain, sinks).unwrap();
        let t = ctx.tensor(r).unwrap().clone();
        assert_eq!(t.src.len(), 3);
        assert_eq!(t.src[2], sinks);
        let zero = ctx.tensor(t.src[1]).unwrap();
        assert!(matches!(zero.op, Op::Fill { c } if c == 0.0));
        assert_eq!((zero.ty, zero.ne), (GgmlType::F32, [16, 5, 1, 1]));

        // Sinks already there; a node that is not a soft_max.
        err_names(ctx.soft_max_add_sinks(r, sinks), "soft_max", "a");
        let n = ctx.rms_norm(a, 1e-6).unwrap();
        err_names(ctx.soft_max_add_sinks(n, sinks), "soft_max", "a");
        // Sinks: wrong type, one per head, contiguous, foreign.
        let s16 = ctx.new_tensor_1d(GgmlType::F16, 4).unwrap();
        err_names(ctx.soft_max_add_sinks(sm, s16), "soft_max", "sinks");
        let s5 = ctx.new_tensor_1d(GgmlType::F32, 5).unwrap();
        err_names(ctx.soft_max_add_sinks(sm, s5), "soft_max", "sinks");
        let s2 = ctx.new_tensor_2d(GgmlType::F32, 2, 4).unwrap();
        let st = ctx.transpose(s2).unwrap();
        err_names(ctx.soft_max_add_sinks(sm, st), "soft_max", "sinks");
        let mut other = Context::new();
        let foreign = other.new_tensor_1d(GgmlType::F32, 4).unwrap();
        err_names(ctx.soft_max_add_sinks(sm, foreign), "soft_max", "sinks");
        err_names(ctx.soft_max_add_sinks(foreign, sinks), "soft_max", "a");
        // An empty input without a mask has no head to stand in for one.
        let e = ctx.new_tensor_4d(GgmlType::F32, 16, 5, 0, 1).unwrap();
        let es = ctx.soft_max(e).unwrap();
        let s0 = ctx.new_tensor_1d(GgmlType::F32, 0).unwrap();
        err_names(ctx.soft_max_add_sinks(es, s0), "soft_max", "a");
    }
}
