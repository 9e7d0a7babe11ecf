//! Rotary position embedding: `rope_ext` (normal and NEOX modes, with YaRN
//! extension parameters and optional frequency factors), `rope_multi`
//! (multi-section MROPE and interleaved IMROPE), and the `rope` shorthand.
//! Shape rules follow `ggml_rope_impl` in `ggml.c`; the CPU computation is
//! `ggml_compute_forward_rope_flt` in ggml-cpu `ops.cpp`.

use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::{Op, RopeMode, RopeParams};
use crate::tensor::{GgmlType, TensorId};

impl Context {
    /// Rotary embedding (`ggml_rope_ext`), modes [`RopeMode::Normal`]
    /// (adjacent pairs) and [`RopeMode::Neox`] (halves).
    ///
    /// - `a`: F32 or F16 `[head_dim, n_head, n_tokens, ne3]`, any strides (a
    ///   view of a fused QKV tensor is fine).
    /// - `pos`: I32 vector `[n_tokens]`, the position of each token.
    /// - `freq_factors`: optional F32 vector with at least `n_dims / 2`
    ///   entries; pair `i`'s angle is divided by `freq_factors[i]`.
    /// - `params`: `n_dims` (even, `0 ≤ n_dims ≤ head_dim`; dims past it are
    ///   copied unchanged), θ base, `freq_scale`, YaRN `ext_factor`,
    ///   `attn_factor`, `beta_fast`/`beta_slow` with `n_ctx_orig`.
    ///
    /// The angle of pair `i` at position `p` is `p · base^(−2i/n_dims)`
    /// (accumulated as ggml does), scaled by `freq_scale` and mixed with the
    /// unscaled angle by YaRN's ramp when `ext_factor ≠ 0`. Result: a new
    /// contiguous tensor of `a`'s type and shape.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] (op `"rope"`) for a mode other than
    /// Normal/Neox, a type other than F32/F16, `pos` not an I32 vector of
    /// `a.ne[2]` entries, bad `freq_factors`, or an odd/out-of-range `n_dims`.
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        params: RopeParams,
    ) -> Result<TensorId> {
        if !matches!(params.mode, RopeMode::Normal | RopeMode::Neox) {
            return Err(Error::operand(
                "rope",
                "mode",
                format!("rope_ext takes Normal or Neox, got {:?} (use rope_multi)", params.mode),
            ));
        }
        self.rope_impl(a, pos, freq_factors, params)
    }

    /// Multi-section rotary embedding (`ggml_rope_multi`), modes
    /// [`RopeMode::Mrope`] and [`RopeMode::Imrope`] (Qwen2-VL / Qwen3-VL,
    /// Qwen3.5). Like [`Context::rope_ext`] with NEOX-style rotation, but
    /// `pos` is I32 `[4 · n_tokens]`: four position streams (t, h, w, e),
    /// each `n_tokens` long. Pair `i` uses stream `s(i)` chosen by
    /// `params.sections` (sizes in pairs; contiguous ranges for Mrope,
    /// interleaved t,h,w,t,h,w,… for Imrope), with `i` taken modulo the
    /// sections' sum.
    ///
    /// # Errors
    /// As [`Context::rope_ext`]; also a mode other than Mrope/Imrope,
    /// negative sections, sections[0..3] all zero, or a sections' sum larger
    /// than `a.ne[0]`.
    pub fn rope_multi(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        params: RopeParams,
    ) -> Result<TensorId> {
        if !matches!(params.mode, RopeMode::Mrope | RopeMode::Imrope) {
            return Err(Error::operand(
                "rope",
                "mode",
                format!("rope_multi takes Mrope or Imrope, got {:?} (use rope_ext)", params.mode),
            ));
        }
        self.rope_impl(a, pos, freq_factors, params)
    }

    /// Rotary embedding with ggml's defaults (`ggml_rope`): θ base 10000, no
    /// scaling, no YaRN, no frequency factors.
    ///
    /// # Errors
    /// As [`Context::rope_ext`] (or [`Context::rope_multi`] for the
    /// multi-section modes, which then need sections and fail here).
    pub fn rope(&mut self, a: TensorId, pos: TensorId, n_dims: i32, mode: RopeMode) -> Result<TensorId> {
        let params = RopeParams {
            n_dims,
            mode,
            n_ctx_orig: 0,
            freq_base: 10000.0,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 0.0,
            beta_slow: 0.0,
            sections: [0; 4],
        };
        self.rope_impl(a, pos, None, params)
    }

    fn rope_impl(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        mut params: RopeParams,
    ) -> Result<TensorId> {
        let ta = self.operand(a, "rope", "src0")?;
        let tp = self.operand(pos, "rope", "pos")?;
        if !matches!(ta.ty, GgmlType::F32 | GgmlType::F16) {
            return Err(Error::operand("rope", "src0", format!("type must be F32 or F16, got {}", ta.describe())));
        }
        let multi = matches!(params.mode, RopeMode::Mrope | RopeMode::Imrope);
        let want = if multi { ta.ne[2].saturating_mul(4) } else { ta.ne[2] };
        if tp.ty != GgmlType::I32 || tp.ne[1] != 1 || tp.ne[2] != 1 || tp.ne[3] != 1 || tp.ne[0] != want {
            return Err(Error::operand(
                "rope",
                "pos",
                format!(
                    "positions must be an I32 vector of {want} entries ({}src0.ne2) for src0 {}, got {}",
                    if multi { "4·" } else { "" },
                    ta.describe(),
                    tp.describe()
                ),
            ));
        }
        let n = params.n_dims;
        if n < 0 || n % 2 != 0 || n as i64 > ta.ne[0] {
            return Err(Error::operand(
                "rope",
                "n_dims",
                format!("n_dims = {n} must be even and within 0..={} (src0 {})", ta.ne[0], ta.describe()),
            ));
        }
        if let Some(ff) = freq_factors {
            let tf = self.operand(ff, "rope", "freq_factors")?;
            if tf.ty != GgmlType::F32 || tf.ne[0] < (n / 2) as i64 {
                return Err(Error::operand(
                    "rope",
                    "freq_factors",
                    format!("must be F32 with at least n_dims/2 = {} entries, got {}", n / 2, tf.describe()),
                ));
            }
        }
        if multi {
            let s = params.sections;
            if s.iter().any(|&x| x < 0) || (s[0] <= 0 && s[1] <= 0 && s[2] <= 0) {
                return Err(Error::operand(
                    "rope",
                    "sections",
                    format!("sections {s:?} must be non-negative with one of the first three positive"),
                ));
            }
            let sum: i64 = s.iter().map(|&x| x as i64).sum();
            if sum > ta.ne[0] {
                return Err(Error::operand(
                    "rope",
                    "sections",
                    format!("sections {s:?} sum to {sum} > ne0 = {} (src0 {})", ta.ne[0], ta.describe()),
                ));
            }
        } else {
            params.sections = [0; 4];
        }
        let (ty, ne) = (ta.ty, ta.ne);
        let mut src = vec![a, pos];
        if let Some(ff) = freq_factors {
            src.push(ff);
        }
        self.push_op(ty, ne, Op::Rope(params), &src)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::ops::{RopeMode, RopeParams};
    use crate::tensor::GgmlType::*;
    use crate::Context;

    fn params(n_dims: i32, mode: RopeMode) -> RopeParams {
        RopeParams { n_dims, mode, ..RopeParams::default() }
    }

    fn detail(r: crate::Result<crate::TensorId>) -> (&'static str, &'static str, String) {
        match r {
            Err(Error::InvalidOperand { op, operand, detail }) => (op, operand, detail),
            other => panic!("expected InvalidOperand, got {other:?}"),
        }
    }

    #[test]
    fn rope_rejects_bad_operands() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_3d(F32, 64, 4, 5).unwrap();
        let pos = ctx.new_tensor_1d(I32, 5).unwrap();
        let pos4 = ctx.new_tensor_1d(I32, 20).unwrap();
        let bad_pos = ctx.new_tensor_1d(I32, 4).unwrap();
        assert_eq!(detail(ctx.rope_ext(a, bad_pos, None, params(64, RopeMode::Neox))).1, "pos");
        assert_eq!(detail(ctx.rope_ext(a, pos, None, params(66, RopeMode::Neox))).1, "n_dims");
        assert_eq!(detail(ctx.rope_ext(a, pos, None, params(31, RopeMode::Neox))).1, "n_dims");
        assert_eq!(detail(ctx.rope_ext(a, pos, None, params(64, RopeMode::Mrope))).1, "mode");
        assert_eq!(detail(ctx.rope_multi(a, pos, None, params(64, RopeMode::Neox))).1, "mode");
        let ff = ctx.new_tensor_1d(F32, 16).unwrap();
        let (op, operand, d) = detail(ctx.rope_ext(a, pos, Some(ff), params(64, RopeMode::Normal)));
        assert_eq!((op, operand), ("rope", "freq_factors"));
        assert!(d.contains("f32[16, 1, 1, 1]"));
        let mut mp = params(64, RopeMode::Imrope);
        assert_eq!(detail(ctx.rope_multi(a, pos4, None, mp)).1, "sections");
        mp.sections = [11, 11, 10, 0];
        assert_eq!(detail(ctx.rope_multi(a, pos, None, mp)).1, "pos");
        assert!(ctx.rope_multi(a, pos4, None, mp).is_ok());
        let q = ctx.new_tensor_3d(Q8_0, 64, 4, 5).unwrap();
        assert_eq!(detail(ctx.rope_ext(q, pos, None, params(64, RopeMode::Neox))).1, "src0");
        let r = ctx.rope(a, pos, 32, RopeMode::Normal).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().ne, [64, 4, 5, 1]);
    }
}
