//! Fused attention: `flash_attn_ext` (ggml's `ggml_flash_attn_ext` in
//! `ggml.c`, computed as in `ggml_compute_forward_flash_attn_ext_f16` of
//! `ggml-cpu/ops.cpp`).
//!
//! For each query row `q[:, i, h, b]` the op computes
//! `softmax(scale·q·kᵀ (soft-capped) + slope_h·mask) · v` over the `n_kv`
//! key/value rows of K/V head `h / (H / H_kv)` (grouped-query attention by
//! broadcasting heads) and stores it at `result[:, h, i, b]`: the result is
//! the attention output already permuted to `[D_v, H, n_q, B]`.
//! `flash_attn_ext_add_sinks` adds gpt-oss's per-head sink logits
//! (`ggml_flash_attn_ext_add_sinks`).

use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::Op;
use crate::tensor::{GgmlType, Tensor, TensorId};

const OP: &str = "flash_attn_ext";

/// True if `n` is a whole multiple of `d` (an empty `d` only divides an empty `n`).
pub(crate) fn divides(d: i64, n: i64) -> bool {
    if d == 0 {
        n == 0
    } else {
        n % d == 0
    }
}

/// K/V element types the CPU attention kernel reads: the float types and the
/// block types that have a dot product against an activation format in
/// ggml's CPU backend (`vec_dot` in `type_traits_cpu`:
/// [`crate::tensor::quant::vec_dot_fn`]).
pub(crate) fn kv_type_supported(ty: GgmlType) -> bool {
    crate::tensor::quant::vec_dot_fn_scalar(ty).is_some()
}

fn rows_packed(t: &Tensor) -> bool {
    t.is_contiguous_rows()
}

impl Context {
    /// Fused multi-head attention (`ggml_flash_attn_ext`).
    ///
    /// Operands (ggml order, `ne[0]` first):
    /// * `q`: F32 `[D, n_q, H, B]`;
    /// * `k`: `[D, n_kv, H_kv, B]`, F32, F16, BF16 or a block type with a CPU
    ///   dot product (every block type but Q8_1/Q8_K: Q4_0..Q8_0, Q2_K..Q6_K,
    ///   IQ4_NL and the other formats of ggml 0.25.3); `H % H_kv == 0`;
    /// * `v`: `[D_v, n_kv, H_v, B]` of one of the same types (may differ from
    ///   K's type and head size); `H % H_v == 0`;
    /// * `mask` (optional): F16, contiguous, `[≥ n_kv, ≥ n_q, M2, M3]` with
    ///   `H % M2 == 0` and `B % M3 == 0`; mask element `[j, i, h % M2, b % M3]`
    ///   is added (times the ALiBi slope) to the score of query `i` against
    ///   key `j`; `-inf` excludes the key. ggml 0.15.3 has no mask padding
    ///   rule (`GGML_KQ_MASK_PAD` is gone); rows past `n_q` and columns past
    ///   `n_kv` are ignored.
    ///
    /// `q`, `k` and `v` may be strided views (a permuted KV cache) as long as
    /// each row (dim 0) is packed, as ggml's CPU kernel requires.
    ///
    /// Parameters: `scale` multiplies `q·k`; `max_bias > 0` enables ALiBi
    /// (slope per head as in `soft_max_ext`; needs a mask);
    /// `logit_softcap ≠ 0` replaces a score `s` by `c·tanh(s/c)` (after
    /// `scale`, before the mask).
    ///
    /// Result: F32 `[D_v, H, n_q, B]` (ggml's permuted layout,
    /// `ne = {v.ne0, q.ne2, q.ne1, q.ne3}`). A query row whose keys are all
    /// masked gives zeros.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] naming `q`, `k`, `v` or `mask` for: a foreign
    /// handle; a non-F32 `q`; an unsupported K/V type; unpacked rows;
    /// `k.ne0 ≠ q.ne0`; `v.ne1 ≠ k.ne1`; batch counts that differ; head counts
    /// where `H_kv` or `H_v` does not divide `H`; a non-F16 or non-contiguous
    /// mask, one smaller than `[n_kv, n_q]` or whose dims 2/3 do not divide
    /// `H`/`B`; `max_bias > 0` without a mask (operand `max_bias`).
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        logit_softcap: f32,
    ) -> Result<TensorId> {
        self.check_qkv(q, k, v)?;
        let mut srcs = vec![q, k, v];
        if let Some(m) = mask {
            self.check_mask(q, k, v, m)?;
            srcs.push(m);
        }
        let (tq, tv) = (self.t(q), self.t(v));
        if max_bias > 0.0 && mask.is_none() {
            return Err(Error::operand(
                OP,
                "max_bias",
                format!("max_bias = {max_bias} (ALiBi) needs a mask; {}", self.qkv_shapes(q, k, v)),
            ));
        }
        let ne = [tv.ne[0], tq.ne[2], tq.ne[1], tq.ne[3]];
        self.push_op(GgmlType::F32, ne, Op::FlashAttnExt { scale, max_bias, logit_softcap }, &srcs)
    }

    /// Attention sinks on a flash_attn_ext (`ggml_flash_attn_ext_add_sinks`,
    /// as gpt-oss uses them): one extra logit `s = sinks[h]` per query head
    /// that joins the softmax normaliser of every query row of head `h` but
    /// contributes no value row. With `M` the row's maximum score and `S`,
    /// `acc` its softmax sum and weighted V sum over the keys (as in
    /// [`Context::flash_attn_ext`]), the result row is
    /// `acc·e^(M − M') / (S·e^(M − M') + e^(s − M'))`, `M' = max(M, s)`
    /// (ggml's `ggml_compute_forward_flash_attn_ext_f16`); a row whose keys
    /// are all masked gives zeros.
    ///
    /// `a` is a node made by [`Context::flash_attn_ext`] with a mask, over
    /// `q` `[D, n_q, H, B]`; `sinks` is a contiguous F32 tensor with
    /// `ne0 = H` (one logit per query head, as ggml asserts
    /// `a->src[0]->ne[2] == sinks->ne[0]`). ggml sets `src[4]` of `a` in
    /// place; our nodes are immutable, so this returns a new flash_attn_ext
    /// node with the same parameters and sources `[q, k, v, mask, sinks]`
    /// (use it instead of `a`, which stays in the context unchanged).
    ///
    /// Sources are positional here (`src[3]` is the mask, `src[4]` the
    /// sinks), so `a` must have a mask (ggml also takes sinks without one;
    /// pass an all-zero F16 mask for that).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] naming `a` (a foreign handle, not a
    /// flash_attn_ext node, one without a mask or one that already has
    /// sinks) or `sinks` (a foreign handle, not F32, not contiguous, or
    /// `ne0 ≠ H`).
    pub fn flash_attn_ext_add_sinks(&mut self, a: TensorId, sinks: TensorId) -> Result<TensorId> {
        let t = self.operand(a, OP, "a")?;
        let Op::FlashAttnExt { scale, max_bias, logit_softcap } = t.op else {
            return Err(Error::operand(
                OP,
                "a",
                format!("{} is a {} node, not flash_attn_ext", t.describe(), t.op.name()),
            ));
        };
        match t.src.len() {
            4 => {}
            3 => {
                return Err(Error::operand(
                    OP,
                    "a",
                    format!(
                        "{} has no mask: sources are positional (src[3] mask, src[4] sinks), so sinks need a mask",
                        t.describe()
                    ),
                ))
            }
            _ => return Err(Error::operand(OP, "a", format!("{} already has sinks (src[4])", t.describe()))),
        }
        let (ne, [q, k, v, m]) = (t.ne, [t.src[0], t.src[1], t.src[2], t.src[3]]);
        let tq = self.t(q);
        self.check_sinks(OP, sinks, tq.ne[2], "q heads q.ne2", tq)?;
        self.push_op(GgmlType::F32, ne, Op::FlashAttnExt { scale, max_bias, logit_softcap }, &[q, k, v, m, sinks])
    }

    /// `q`, `k`, `v` for the error messages.
    fn qkv_shapes(&self, q: TensorId, k: TensorId, v: TensorId) -> String {
        format!("q {}, k {}, v {}", self.t(q).describe(), self.t(k).describe(), self.t(v).describe())
    }

    /// The rules of [`Context::flash_attn_ext`] for `q`, `k`, `v`.
    fn check_qkv(&self, q: TensorId, k: TensorId, v: TensorId) -> Result<()> {
        let tq = self.operand(q, OP, "q")?;
        let tk = self.operand(k, OP, "k")?;
        let tv = self.operand(v, OP, "v")?;
        let shapes = || self.qkv_shapes(q, k, v);

        if tq.ty != GgmlType::F32 {
            return Err(Error::operand(OP, "q", format!("q must be F32 ({})", shapes())));
        }
        for (name, t) in [("k", tk), ("v", tv)] {
            if !kv_type_supported(t.ty) {
                return Err(Error::operand(
                    OP,
                    name,
                    format!(
                        "type {} is not supported for K/V (F32, F16, BF16 or a block type with a dot product); {}",
                        t.ty,
                        shapes()
                    ),
                ));
            }
        }
        for (name, t) in [("q", tq), ("k", tk), ("v", tv)] {
            if !rows_packed(t) {
                return Err(Error::operand(
                    OP,
                    name,
                    format!(
                        "rows must be packed (nb0 = {} but the type size is {}); {}",
                        t.nb[0],
                        t.ty.type_size(),
                        shapes()
                    ),
                ));
            }
        }
        // ggml_can_mul_mat(k, q) plus the batch asserts; messages are built
        // only for the rule that fails.
        type Why<'a> = &'a dyn Fn() -> String;
        let rules: [(&'static str, bool, Why); 6] = [
            ("k", tk.ne[0] != tq.ne[0], &|| format!("head size k.ne0 = {} ≠ q.ne0 = {}", tk.ne[0], tq.ne[0])),
            ("v", tv.ne[1] != tk.ne[1], &|| format!("v.ne1 = {} ≠ k.ne1 = {} (n_kv)", tv.ne[1], tk.ne[1])),
            ("k", tk.ne[3] != tq.ne[3], &|| format!("batch k.ne3 = {} ≠ q.ne3 = {}", tk.ne[3], tq.ne[3])),
            ("v", tv.ne[3] != tq.ne[3], &|| format!("batch v.ne3 = {} ≠ q.ne3 = {}", tv.ne[3], tq.ne[3])),
            ("k", !divides(tk.ne[2], tq.ne[2]), &|| {
                format!("K heads k.ne2 = {} do not divide q heads q.ne2 = {}", tk.ne[2], tq.ne[2])
            }),
            ("v", !divides(tv.ne[2], tq.ne[2]), &|| {
                format!("V heads v.ne2 = {} do not divide q heads q.ne2 = {}", tv.ne[2], tq.ne[2])
            }),
        ];
        let failed = rules.iter().find(|r| r.1).map(|(name, _, why)| (*name, why()));
        match failed {
            Some((name, why)) => Err(Error::operand(OP, name, format!("{why}; {}", shapes()))),
            None => Ok(()),
        }
    }

    /// The rules of [`Context::flash_attn_ext`] for the mask `m`.
    fn check_mask(&self, q: TensorId, k: TensorId, v: TensorId, m: TensorId) -> Result<()> {
        let (tq, tk) = (self.t(q), self.t(k));
        let tm = self.operand(m, OP, "mask")?;
        let ms = || format!("mask {}, {}", tm.describe(), self.qkv_shapes(q, k, v));
        if tm.ty != GgmlType::F16 {
            return Err(Error::operand(OP, "mask", format!("mask must be F16; {}", ms())));
        }
        if !tm.is_contiguous() {
            return Err(Error::operand(OP, "mask", format!("mask must be contiguous (nb {:?}); {}", tm.nb, ms())));
        }
        if tm.ne[0] < tk.ne[1] || tm.ne[1] < tq.ne[1] {
            return Err(Error::operand(
                OP,
                "mask",
                format!("mask is smaller than [n_kv = {}, n_q = {}]; {}", tk.ne[1], tq.ne[1], ms()),
            ));
        }
        if !divides(tm.ne[2], tq.ne[2]) || !divides(tm.ne[3], tq.ne[3]) {
            return Err(Error::operand(
                OP,
                "mask",
                format!(
                    "mask.ne2/ne3 = {}/{} must divide q.ne2/ne3 = {}/{}; {}",
                    tm.ne[2],
                    tm.ne[3],
                    tq.ne[2],
                    tq.ne[3],
                    ms()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::err_of;

    #[test]
    fn flash_attn_ext_shapes_and_gqa() {
        let mut ctx = Context::new();
        let q = ctx.new_tensor_4d(GgmlType::F32, 64, 7, 8, 2).unwrap();
        let k = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 2, 2).unwrap();
        let v = ctx.new_tensor_4d(GgmlType::Q8_0, 32, 256, 2, 2).unwrap();
        let m = ctx.new_tensor_4d(GgmlType::F16, 256, 7, 1, 2).unwrap();
        let r = ctx.flash_attn_ext(q, k, v, Some(m), 0.125, 0.0, 0.0).unwrap();
        let t = ctx.tensor(r).unwrap();
        assert_eq!(t.ne, [32, 8, 7, 2]);
        assert_eq!(t.ty, GgmlType::F32);
        assert_eq!(t.src.as_slice(), &[q, k, v, m]);
        let r2 = ctx.flash_attn_ext(q, k, v, None, 0.125, 0.0, 30.0).unwrap();
        assert_eq!(ctx.tensor(r2).unwrap().src.len(), 3);
    }

    #[test]
    fn flash_attn_ext_rejects_bad_operands() {
        let mut ctx = Context::new();
        let q = ctx.new_tensor_4d(GgmlType::F32, 64, 7, 8, 1).unwrap();
        let k = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 3, 1).unwrap();
        let v = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 3, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(q, k, v, None, 1.0, 0.0, 0.0));
        assert!(e.contains("flash_attn_ext") && e.contains("invalid k") && e.contains("[64, 256, 3, 1]"), "{e}");

        let k2 = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 2, 1).unwrap();
        let v2 = ctx.new_tensor_4d(GgmlType::F16, 64, 128, 2, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(q, k2, v2, None, 1.0, 0.0, 0.0));
        assert!(e.contains("invalid v") && e.contains("n_kv"), "{e}");

        let v3 = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 2, 1).unwrap();
        let small = ctx.new_tensor_4d(GgmlType::F16, 256, 6, 1, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(q, k2, v3, Some(small), 1.0, 0.0, 0.0));
        assert!(e.contains("invalid mask") && e.contains("smaller"), "{e}");

        let m32 = ctx.new_tensor_4d(GgmlType::F32, 256, 7, 1, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(q, k2, v3, Some(m32), 1.0, 0.0, 0.0));
        assert!(e.contains("invalid mask") && e.contains("F16"), "{e}");

        let m3 = ctx.new_tensor_4d(GgmlType::F16, 256, 7, 3, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(q, k2, v3, Some(m3), 1.0, 0.0, 0.0));
        assert!(e.contains("invalid mask") && e.contains("divide"), "{e}");

        let e = err_of(ctx.flash_attn_ext(q, k2, v3, None, 1.0, 8.0, 0.0));
        assert!(e.contains("max_bias"), "{e}");

        let qh = ctx.new_tensor_4d(GgmlType::F16, 64, 7, 8, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(qh, k2, v3, None, 1.0, 0.0, 0.0));
        assert!(e.contains("invalid q") && e.contains("F32"), "{e}");

        let ki = ctx.new_tensor_4d(GgmlType::I32, 64, 256, 2, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(q, ki, v3, None, 1.0, 0.0, 0.0));
        assert!(e.contains("invalid k") && e.contains("i32"), "{e}");

        let kd = ctx.new_tensor_4d(GgmlType::F16, 32, 256, 2, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(q, kd, v3, None, 1.0, 0.0, 0.0));
        assert!(e.contains("head size"), "{e}");

        let kb = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 2, 2).unwrap();
        let e = err_of(ctx.flash_attn_ext(q, kb, v3, None, 1.0, 0.0, 0.0));
        assert!(e.contains("batch"), "{e}");

        // A transposed K has unpacked rows.
        let kt_src = ctx.new_tensor_2d(GgmlType::F32, 256, 64).unwrap();
        let kt = ctx.transpose(kt_src).unwrap();
        let q1 = ctx.new_tensor_4d(GgmlType::F32, 64, 7, 1, 1).unwrap();
        let v1 = ctx.new_tensor_4d(GgmlType::F32, 64, 256, 1, 1).unwrap();
        let e = err_of(ctx.flash_attn_ext(q1, kt, v1, None, 1.0, 0.0, 0.0));
        assert!(e.contains("invalid k") && e.contains("packed"), "{e}");
    }

    #[test]
    fn flash_attn_ext_add_sinks_rules() {
        use crate::ops::test_util::err_names;
        let mut ctx = Context::new();
        let q = ctx.new_tensor_4d(GgmlType::F32, 64, 7, 8, 1).unwrap();
        let k = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 2, 1).unwrap();
        let v = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 2, 1).unwrap();
        let m = ctx.new_tensor_4d(GgmlType::F16, 256, 7, 1, 1).unwrap();
        let sinks = ctx.new_tensor_1d(GgmlType::F32, 8).unwrap();
        let fa = ctx.flash_attn_ext(q, k, v, Some(m), 0.125, 0.0, 30.0).unwrap();
        let r = ctx.flash_attn_ext_add_sinks(fa, sinks).unwrap();
        let t = ctx.tensor(r).unwrap();
        assert_eq!(t.src.as_slice(), &[q, k, v, m, sinks]);
        assert_eq!(t.ne, [64, 8, 7, 1]);
        assert!(matches!(t.op, Op::FlashAttnExt { scale, max_bias, logit_softcap }
            if scale == 0.125 && max_bias == 0.0 && logit_softcap == 30.0));
        assert_eq!(ctx.tensor(fa).unwrap().src.len(), 4, "the flash_attn_ext node itself is unchanged");

        // Sinks already there; no mask; not a flash_attn_ext; foreign.
        err_names(ctx.flash_attn_ext_add_sinks(r, sinks), OP, "a");
        let no_mask = ctx.flash_attn_ext(q, k, v, None, 0.125, 0.0, 0.0).unwrap();
        let e = err_of(ctx.flash_attn_ext_add_sinks(no_mask, sinks));
        assert!(e.contains("invalid a") && e.contains("mask"), "{e}");
        let sm = ctx.soft_max(q).unwrap();
        err_names(ctx.flash_attn_ext_add_sinks(sm, sinks), OP, "a");
        let mut other = Context::new();
        let foreign = other.new_tensor_1d(GgmlType::F32, 8).unwrap();
        err_names(ctx.flash_attn_ext_add_sinks(fa, foreign), OP, "sinks");
        err_names(ctx.flash_attn_ext_add_sinks(foreign, sinks), OP, "a");
        // Sinks: one per query head (not per K/V head), F32, contiguous.
        let per_kv = ctx.new_tensor_1d(GgmlType::F32, 2).unwrap();
        let e = err_of(ctx.flash_attn_ext_add_sinks(fa, per_kv));
        assert!(e.contains("invalid sinks") && e.contains("one logit per head"), "{e}");
        let s16 = ctx.new_tensor_1d(GgmlType::F16, 8).unwrap();
        let e = err_of(ctx.flash_attn_ext_add_sinks(fa, s16));
        assert!(e.contains("invalid sinks") && e.contains("F32"), "{e}");
        let s2 = ctx.new_tensor_2d(GgmlType::F32, 3, 8).unwrap();
        let st = ctx.transpose(s2).unwrap();
        let e = err_of(ctx.flash_attn_ext_add_sinks(fa, st));
        assert!(e.contains("invalid sinks") && e.contains("contiguous"), "{e}");
    }

    #[test]
    fn flash_attn_ext_empty_heads_do_not_panic() {
        let mut ctx = Context::new();
        let q = ctx.new_tensor_4d(GgmlType::F32, 64, 7, 0, 1).unwrap();
        let k = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 0, 1).unwrap();
        let v = ctx.new_tensor_4d(GgmlType::F16, 64, 256, 0, 1).unwrap();
        let r = ctx.flash_attn_ext(q, k, v, None, 1.0, 0.0, 0.0).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().ne, [64, 0, 7, 1]);
        let q2 = ctx.new_tensor_4d(GgmlType::F32, 64, 7, 4, 1).unwrap();
        assert!(ctx.flash_attn_ext(q2, k, v, None, 1.0, 0.0, 0.0).is_err());
    }
}
