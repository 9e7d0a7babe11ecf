//! Recurrent-layer ops: the depthwise causal convolution of Mamba-style
//! layers (`ssm_conv`, ggml's `ggml_ssm_conv`) and the gated delta rule of
//! Gated-DeltaNet layers (`gated_delta_net`, ggml's `ggml_gated_delta_net`),
//! with the shape rules of `ggml.c` and the CPU semantics of
//! `ggml_compute_forward_ssm_conv_f32` / `ggml_compute_forward_gated_delta_net`
//! in `ggml-cpu/ops.cpp`.

use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::attn::divides;
use crate::ops::Op;
use crate::tensor::{GgmlType, Tensor, TensorId};

const CONV: &str = "ssm_conv";
const GDN: &str = "gated_delta_net";

/// True if dims 0 and 1 of `t` are packed (`nb0 = type size`, `nb1 = ne0·nb0`).
fn first_two_dims_packed(t: &Tensor) -> bool {
    let ts = t.ty.type_size();
    (t.ne[0] <= 1 || t.nb[0] == ts) && (t.ne[1] <= 1 || t.nb[1] == ts * t.ne[0] as usize)
}

impl Context {
    /// Depthwise causal 1-d convolution over time for SSM layers
    /// (`ggml_ssm_conv`).
    ///
    /// * `sx`: F32 `[d_conv − 1 + n_t, d_inner, n_s]` — per channel and
    ///   sequence, the `d_conv − 1` previous inputs followed by the `n_t` new
    ///   ones; dims 0 and 1 packed (dim 2 may be strided).
    /// * `c`: F32 `[d_conv, d_inner]` convolution weights, dims 0 and 1 packed.
    ///
    /// Result: F32 `[d_inner, n_t, n_s]` with
    /// `result[i, t, s] = Σ_{j < d_conv} sx[t + j, i, s] · c[j, i]`
    /// (summed in order of `j`, in f32).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] naming `sx` or `c`: a foreign handle, a type
    /// other than F32, `sx` with a 4th dim or `c` with a 3rd/4th dim,
    /// `sx.ne1 ≠ c.ne1`, `sx.ne0 < d_conv − 1`, or unpacked dims 0/1.
    pub fn ssm_conv(&mut self, sx: TensorId, c: TensorId) -> Result<TensorId> {
        let ts = self.operand(sx, CONV, "sx")?;
        let tc = self.operand(c, CONV, "c")?;
        let shapes = || format!("sx {}, c {}", ts.describe(), tc.describe());
        if ts.ty != GgmlType::F32 {
            return Err(Error::operand(CONV, "sx", format!("sx must be F32; {}", shapes())));
        }
        if tc.ty != GgmlType::F32 {
            return Err(Error::operand(CONV, "c", format!("c must be F32; {}", shapes())));
        }
        if ts.ne[3] != 1 {
            return Err(Error::operand(CONV, "sx", format!("sx must be 3-d (ne3 = 1); {}", shapes())));
        }
        if tc.ne[2] != 1 || tc.ne[3] != 1 {
            return Err(Error::operand(CONV, "c", format!("c must be a matrix (ne2 = ne3 = 1); {}", shapes())));
        }
        let d_conv = tc.ne[0];
        let d_inner = tc.ne[1];
        let n_t = ts.ne[0] - d_conv + 1;
        let n_s = ts.ne[2];
        if ts.ne[1] != d_inner {
            return Err(Error::operand(
                CONV,
                "sx",
                format!("sx.ne1 = {} ≠ d_inner = c.ne1 = {}; {}", ts.ne[1], d_inner, shapes()),
            ));
        }
        if n_t < 0 {
            return Err(Error::operand(
                CONV,
                "sx",
                format!("sx.ne0 = {} is shorter than d_conv − 1 = {}; {}", ts.ne[0], d_conv - 1, shapes()),
            ));
        }
        if !first_two_dims_packed(ts) {
            return Err(Error::operand(
                CONV,
                "sx",
                format!("sx dims 0 and 1 must be packed (nb {:?}); {}", ts.nb, shapes()),
            ));
        }
        if !first_two_dims_packed(tc) {
            return Err(Error::operand(
                CONV,
                "c",
                format!("c dims 0 and 1 must be packed (nb {:?}); {}", tc.nb, shapes()),
            ));
        }
        self.push_op(GgmlType::F32, [d_inner, n_t, n_s, 1], Op::SsmConv, &[sx, c])
    }

    /// The gated delta rule over a chunk of tokens (`ggml_gated_delta_net`).
    ///
    /// Operands (all F32; `S` = head size, `H` = heads, `T` = tokens,
    /// `B` = sequences):
    /// * `q`, `k`: `[S, H_qk, T, B_qk]`, rows packed (other dims may be
    ///   strided views); `H % H_qk == 0` with head `h` reading q/k head
    ///   `h % H_qk` (ggml's modulo broadcast), `B % B_qk == 0` with sequence
    ///   `b` reading `b / (B / B_qk)`. The op does not normalise q or k
    ///   (apply `l2_norm` first, as llama.cpp does).
    /// * `v`: `[S, H, T, B]`, rows packed.
    /// * `g`: contiguous `[1, H, T, B]` (one log-decay per head and token) or
    ///   `[S, H, T, B]` (per-channel log-decay, KDA form).
    /// * `beta`: contiguous `[1, H, T, B]`.
    /// * `state`: contiguous `[S, S, H, B]`, the initial state; element
    ///   `[i, j, h, b]` is `S_hb[i][j]` (row `j` of the stored matrix is
    ///   column `j` of S).
    /// * `k_snapshots` (K ≥ 1): number of state snapshot slots in the result.
    ///
    /// Per head and token: `S ← S·exp(g)` (per row `i` with `exp(g[i])` in the
    /// KDA form), `δ = β·(v − Sᵀk)`, `S ← S + k·δᵀ`,
    /// `out = (Sᵀq) / √S`.
    ///
    /// Result: F32 `[S·H, T·B + K·S·B]`, one flat buffer: first the outputs
    /// (`T·B` rows of `[S, H]`: token `t` of sequence `b` is row `b·T + t`),
    /// then K snapshot slots of `S·S·H·B` values each laid out as `state`;
    /// slot `s` holds the state after token `T − 1 − s` (slot 0 = final
    /// state). With `T < K` slots `T..K` are not written (ggml leaves them to
    /// the caller), except that with `K = 1` slot 0 always receives the final
    /// (or, for `T = 0`, the initial) state.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] naming the operand: a foreign handle, a
    /// non-F32 type, unpacked rows of q/k/v, non-contiguous g/beta/state,
    /// q/k head size ≠ `S`, token counts ≠ `T`, head or sequence counts that do
    /// not divide `H`/`B`, g/beta/state shapes other than above, or
    /// `k_snapshots` outside `1..=i32::MAX` (operand `k_snapshots`).
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_net(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        g: TensorId,
        beta: TensorId,
        state: TensorId,
        k_snapshots: i64,
    ) -> Result<TensorId> {
        let names = ["q", "k", "v", "g", "beta", "state"];
        let ids = [q, k, v, g, beta, state];
        let mut ts: Vec<&Tensor> = Vec::with_capacity(6);
        for (&id, &name) in ids.iter().zip(&names) {
            ts.push(self.operand(id, GDN, name)?);
        }
        let shapes =
            || names.iter().zip(&ts).map(|(n, t)| format!("{n} {}", t.describe())).collect::<Vec<_>>().join(", ");
        for (&name, t) in names.iter().zip(&ts) {
            if t.ty != GgmlType::F32 {
                return Err(Error::operand(GDN, name, format!("{name} must be F32; {}", shapes())));
            }
        }
        let (tq, tk, tv, tg, tb, tsn) = (ts[0], ts[1], ts[2], ts[3], ts[4], ts[5]);
        for (name, t) in [("q", tq), ("k", tk), ("v", tv)] {
            if !t.is_contiguous_rows() {
                return Err(Error::operand(
                    GDN,
                    name,
                    format!("{name} rows must be packed (nb {:?}); {}", t.nb, shapes()),
                ));
            }
        }
        for (name, t) in [("g", tg), ("beta", tb), ("state", tsn)] {
            if !t.is_contiguous() {
                return Err(Error::operand(
                    GDN,
                    name,
                    format!("{name} must be contiguous (nb {:?}); {}", t.nb, shapes()),
                ));
            }
        }
        let [s_v, h, n_t, n_s] = tv.ne;
        for (name, t) in [("q", tq), ("k", tk)] {
            if t.ne[0] != s_v {
                return Err(Error::operand(
                    GDN,
                    name,
                    format!("{name}.ne0 = {} ≠ head size v.ne0 = {s_v}; {}", t.ne[0], shapes()),
                ));
            }
            if t.ne[2] != n_t {
                return Err(Error::operand(
                    GDN,
                    name,
                    format!("{name}.ne2 = {} ≠ tokens v.ne2 = {n_t}; {}", t.ne[2], shapes()),
                ));
            }
            if !divides(t.ne[1], h) {
                return Err(Error::operand(
                    GDN,
                    name,
                    format!("{name} heads {name}.ne1 = {} do not divide v heads {h}; {}", t.ne[1], shapes()),
                ));
            }
            if !divides(t.ne[3], n_s) {
                return Err(Error::operand(
                    GDN,
                    name,
                    format!("{name} sequences {name}.ne3 = {} do not divide v sequences {n_s}; {}", t.ne[3], shapes()),
                ));
            }
        }
        if !(tg.ne[0] == 1 || tg.ne[0] == s_v) || tg.ne[1..] != [h, n_t, n_s] {
            return Err(Error::operand(GDN, "g", format!("g must be [1 or {s_v}, {h}, {n_t}, {n_s}]; {}", shapes())));
        }
        if tb.ne != [1, h, n_t, n_s] {
            return Err(Error::operand(GDN, "beta", format!("beta must be [1, {h}, {n_t}, {n_s}]; {}", shapes())));
        }
        if tsn.ne != [s_v, s_v, h, n_s] {
            return Err(Error::operand(
                GDN,
                "state",
                format!("state must be [{s_v}, {s_v}, {h}, {n_s}]; {}", shapes()),
            ));
        }
        if !(1..=i32::MAX as i64).contains(&k_snapshots) {
            return Err(Error::operand(
                GDN,
                "k_snapshots",
                format!("k_snapshots = {k_snapshots} must be in 1..=2^31−1"),
            ));
        }
        let too_big =
            || Error::operand(GDN, "k_snapshots", format!("result rows overflow for K = {k_snapshots}; {}", shapes()));
        let state_rows = k_snapshots.checked_mul(s_v).and_then(|x| x.checked_mul(n_s)).ok_or_else(too_big)?;
        let rows = n_t.checked_mul(n_s).and_then(|x| x.checked_add(state_rows)).ok_or_else(too_big)?;
        let ne0 = s_v.checked_mul(h).ok_or_else(too_big)?;
        self.push_op(GgmlType::F32, [ne0, rows, 1, 1], Op::GatedDeltaNet { k_snapshots }, &ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::err_of;

    #[test]
    fn ssm_conv_shapes_and_errors() {
        let mut ctx = Context::new();
        let sx = ctx.new_tensor_3d(GgmlType::F32, 3 + 5, 64, 2).unwrap();
        let c = ctx.new_tensor_2d(GgmlType::F32, 4, 64).unwrap();
        let r = ctx.ssm_conv(sx, c).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().ne, [64, 5, 2, 1]);

        let c2 = ctx.new_tensor_2d(GgmlType::F32, 4, 32).unwrap();
        let e = err_of(ctx.ssm_conv(sx, c2));
        assert!(e.contains("ssm_conv") && e.contains("invalid sx") && e.contains("d_inner"), "{e}");
        let short = ctx.new_tensor_3d(GgmlType::F32, 2, 64, 1).unwrap();
        let e = err_of(ctx.ssm_conv(short, c));
        assert!(e.contains("shorter"), "{e}");
        let c16 = ctx.new_tensor_2d(GgmlType::F16, 4, 64).unwrap();
        let e = err_of(ctx.ssm_conv(sx, c16));
        assert!(e.contains("invalid c") && e.contains("F32"), "{e}");
        let sx4 = ctx.new_tensor_4d(GgmlType::F32, 8, 64, 1, 2).unwrap();
        assert!(ctx.ssm_conv(sx4, c).is_err());
        let sxt_src = ctx.new_tensor_2d(GgmlType::F32, 64, 8).unwrap();
        let sxt = ctx.transpose(sxt_src).unwrap();
        let e = err_of(ctx.ssm_conv(sxt, c));
        assert!(e.contains("packed"), "{e}");
    }

    fn gdn_leaves(ctx: &mut Context, s: i64, h: i64, t: i64, b: i64, gv: bool) -> [TensorId; 6] {
        let q = ctx.new_tensor_4d(GgmlType::F32, s, h, t, b).unwrap();
        let k = ctx.new_tensor_4d(GgmlType::F32, s, h, t, b).unwrap();
        let v = ctx.new_tensor_4d(GgmlType::F32, s, h, t, b).unwrap();
        let g = ctx.new_tensor_4d(GgmlType::F32, if gv { s } else { 1 }, h, t, b).unwrap();
        let beta = ctx.new_tensor_4d(GgmlType::F32, 1, h, t, b).unwrap();
        let st = ctx.new_tensor_4d(GgmlType::F32, s, s, h, b).unwrap();
        [q, k, v, g, beta, st]
    }

    #[test]
    fn gated_delta_net_shapes_and_errors() {
        let mut ctx = Context::new();
        let [q, k, v, g, beta, st] = gdn_leaves(&mut ctx, 16, 4, 7, 2, false);
        let r = ctx.gated_delta_net(q, k, v, g, beta, st, 2).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().ne, [64, 7 * 2 + 2 * 16 * 2, 1, 1]);
        assert_eq!(ctx.tensor(r).unwrap().op, Op::GatedDeltaNet { k_snapshots: 2 });

        let e = err_of(ctx.gated_delta_net(q, k, v, g, beta, st, 0));
        assert!(e.contains("k_snapshots"), "{e}");
        let q3 = ctx.new_tensor_4d(GgmlType::F32, 16, 3, 7, 2).unwrap();
        let e = err_of(ctx.gated_delta_net(q3, k, v, g, beta, st, 1));
        assert!(e.contains("gated_delta_net") && e.contains("invalid q") && e.contains("heads"), "{e}");
        let q2 = ctx.new_tensor_4d(GgmlType::F32, 16, 2, 7, 2).unwrap();
        assert!(ctx.gated_delta_net(q2, q2, v, g, beta, st, 1).is_ok());
        let g2 = ctx.new_tensor_4d(GgmlType::F32, 2, 4, 7, 2).unwrap();
        let e = err_of(ctx.gated_delta_net(q, k, v, g2, beta, st, 1));
        assert!(e.contains("invalid g"), "{e}");
        let st2 = ctx.new_tensor_4d(GgmlType::F32, 16, 16, 4, 1).unwrap();
        let e = err_of(ctx.gated_delta_net(q, k, v, g, beta, st2, 1));
        assert!(e.contains("invalid state"), "{e}");
        let kh = ctx.new_tensor_4d(GgmlType::F16, 16, 4, 7, 2).unwrap();
        let e = err_of(ctx.gated_delta_net(q, kh, v, g, beta, st, 1));
        assert!(e.contains("invalid k") && e.contains("F32"), "{e}");
        let e = err_of(ctx.gated_delta_net(q, k, v, g, beta, st, i64::MAX));
        assert!(e.contains("k_snapshots"), "{e}");
        let big = ctx.new_tensor_4d(GgmlType::F32, 1 << 20, 1, 1, 1).unwrap();
        let _ = ctx.gated_delta_net(big, big, big, big, big, big, i32::MAX as i64);
    }
}
