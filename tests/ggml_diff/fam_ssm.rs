//! Differential cases of the recurrent-layer family: `ssm_conv` and
//! `gated_delta_net` (scalar and per-channel gates, snapshot slots, GQA-style
//! q/k head broadcast, q/k/v as strided views of a fused projection).

use crate::harness::{row_bytes, Builder, Built, Case, Init, NMSE_FLOAT};
use shardgraph::{GgmlType, Result};

fn ssm_conv_case(d_conv: i64, d_inner: i64, n_t: i64, n_s: i64, strided: bool) -> Case {
    let vars = format!("d_conv={d_conv},d_inner={d_inner},n_t={n_t},n_s={n_s},strided={strided}");
    Case::new("ssm_conv", vars, NMSE_FLOAT, move |ctx: &mut Builder| {
        let ncs = d_conv - 1 + n_t;
        let sx = if strided {
            // Dim 2 strided: every other sequence slab of a larger tensor.
            let base = ctx.new_tensor_3d(GgmlType::F32, ncs, d_inner, 2 * n_s)?;
            let nb1 = (ncs * 4) as usize;
            let nb2 = 2 * nb1 * d_inner as usize;
            ctx.view_3d(base, ncs, d_inner, n_s, nb1, nb2, nb1 * d_inner as usize)?
        } else {
            ctx.new_tensor_3d(GgmlType::F32, ncs, d_inner, n_s)?
        };
        let c = ctx.new_tensor_2d(GgmlType::F32, d_conv, d_inner)?;
        let out = ctx.ssm_conv(sx, c)?;
        Ok(Built::out(&[out]))
    })
}

/// One gated-delta-net case.
#[derive(Clone, Copy, Debug)]
struct Gdn {
    s: i64,
    h: i64,
    /// Heads of q and k (divides h; head i reads q/k head i % h_qk).
    h_qk: i64,
    t: i64,
    b: i64,
    g_vec: bool,
    k_snap: i64,
    /// q, k, v are strided views of one fused `[S·(2·h_qk + h), T, B]` tensor.
    fused: bool,
    /// q and k are permuted from `[S, T, h_qk, B]` tensors (rows packed, dims 1/2 swapped).
    permuted: bool,
}

impl Gdn {
    fn vars(&self) -> String {
        format!(
            "s={},h={},h_qk={},t={},b={},g={},k_snap={},fused={},permuted={}",
            self.s,
            self.h,
            self.h_qk,
            self.t,
            self.b,
            if self.g_vec { "vector" } else { "scalar" },
            self.k_snap,
            self.fused,
            self.permuted
        )
    }

    fn build(&self, ctx: &mut Builder) -> Result<Built> {
        let (s, h, hk, t, b) = (self.s, self.h, self.h_qk, self.t, self.b);
        // Unit-norm-ish rows: E|x|² = 1, as after llama.cpp's l2_norm.
        let a = (3.0 / s as f32).sqrt();
        let mut inits = Vec::new();
        let (q, k, v) = if self.fused {
            let width = s * (2 * hk + h);
            let base = ctx.new_tensor_3d(GgmlType::F32, width, t, b)?;
            inits.push((base, Init::Uniform(-a, a)));
            let f = 4usize;
            let (nb1, nb2, nb3) = (s as usize * f, width as usize * f, (width * t) as usize * f);
            let q = ctx.view_4d(base, s, hk, t, b, nb1, nb2, nb3, 0)?;
            let k = ctx.view_4d(base, s, hk, t, b, nb1, nb2, nb3, (s * hk) as usize * f)?;
            let v = ctx.view_4d(base, s, h, t, b, nb1, nb2, nb3, (2 * s * hk) as usize * f)?;
            (q, k, v)
        } else if self.permuted {
            let q0 = ctx.new_tensor_4d(GgmlType::F32, s, t, hk, b)?;
            let k0 = ctx.new_tensor_4d(GgmlType::F32, s, t, hk, b)?;
            let v = ctx.new_tensor_4d(GgmlType::F32, s, h, t, b)?;
            for id in [q0, k0, v] {
                inits.push((id, Init::Uniform(-a, a)));
            }
            (ctx.permute(q0, [0, 2, 1, 3])?, ctx.permute(k0, [0, 2, 1, 3])?, v)
        } else {
            let q = ctx.new_tensor_4d(GgmlType::F32, s, hk, t, b)?;
            let k = ctx.new_tensor_4d(GgmlType::F32, s, hk, t, b)?;
            let v = ctx.new_tensor_4d(GgmlType::F32, s, h, t, b)?;
            for id in [q, k, v] {
                inits.push((id, Init::Uniform(-a, a)));
            }
            (q, k, v)
        };
        let g = ctx.new_tensor_4d(GgmlType::F32, if self.g_vec { s } else { 1 }, h, t, b)?;
        let beta = ctx.new_tensor_4d(GgmlType::F32, 1, h, t, b)?;
        let state = ctx.new_tensor_4d(GgmlType::F32, s, s, h, b)?;
        inits.push((g, Init::Uniform(-1.0, 0.0)));
        inits.push((beta, Init::Uniform(0.0, 1.0)));
        let out = ctx.gated_delta_net(q, k, v, g, beta, state, self.k_snap)?;
        // With fewer tokens than slots, slots T..K are left unwritten (by
        // ggml too): compare only the written rows.
        let written = t * b + self.k_snap.min(t.max(1)) * s * b;
        let cmp = if written < t * b + self.k_snap * s * b {
            // The result is contiguous F32 rows of S·H values.
            let nb1 = row_bytes(GgmlType::F32, s * h);
            ctx.view_2d(out, s * h, written, nb1, 0)?
        } else {
            out
        };
        let mut built = Built::out(&[cmp]);
        for (id, init) in inits {
            built = built.init(id, init);
        }
        Ok(built)
    }
}

fn gdn_case(g: Gdn) -> Case {
    Case::new("gated_delta_net", g.vars(), NMSE_FLOAT, move |ctx| g.build(ctx))
}

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for &d_inner in &[64, 1000, 10240] {
        for &n_t in &[1, 5] {
            for &n_s in &[1, 2] {
                v.push(ssm_conv_case(4, d_inner, n_t, n_s, false));
            }
        }
    }
    v.push(ssm_conv_case(4, 64, 5, 2, true));
    v.push(ssm_conv_case(3, 100, 9, 3, true));
    v.push(ssm_conv_case(1, 33, 4, 1, false));

    for &s in &[16, 128] {
        for &h in &[2, 4] {
            for &(t, b) in &[(1, 1), (7, 2), (1, 2), (7, 1)] {
                for &g_vec in &[false, true] {
                    for &k_snap in &[1, 2] {
                        // Keep the sweep small: all combinations for S = 16, a subset for 128.
                        if s == 128 && (g_vec == (k_snap == 1) || h == 2 && t == 1) {
                            continue;
                        }
                        v.push(gdn_case(Gdn { s, h, h_qk: h, t, b, g_vec, k_snap, fused: false, permuted: false }));
                    }
                }
            }
        }
    }
    // q/k head broadcast (modulo), fused strided views, more slots than tokens.
    v.push(gdn_case(Gdn { s: 16, h: 4, h_qk: 2, t: 7, b: 2, g_vec: false, k_snap: 2, fused: false, permuted: false }));
    v.push(gdn_case(Gdn { s: 16, h: 4, h_qk: 2, t: 7, b: 2, g_vec: true, k_snap: 1, fused: true, permuted: false }));
    v.push(gdn_case(Gdn { s: 128, h: 4, h_qk: 2, t: 7, b: 1, g_vec: false, k_snap: 2, fused: true, permuted: false }));
    v.push(gdn_case(Gdn { s: 128, h: 2, h_qk: 2, t: 1, b: 2, g_vec: false, k_snap: 1, fused: true, permuted: false }));
    v.push(gdn_case(Gdn { s: 16, h: 2, h_qk: 1, t: 3, b: 1, g_vec: true, k_snap: 5, fused: false, permuted: false }));
    v.push(gdn_case(Gdn { s: 16, h: 4, h_qk: 2, t: 7, b: 2, g_vec: false, k_snap: 1, fused: false, permuted: true }));
    v.push(gdn_case(Gdn { s: 128, h: 2, h_qk: 2, t: 7, b: 1, g_vec: true, k_snap: 2, fused: false, permuted: true }));
    v
}
