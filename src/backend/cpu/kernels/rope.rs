//! CPU kernel of rotary position embedding (ggml-cpu `ops.cpp`,
//! `ggml_compute_forward_rope_flt`, forward direction).
//!
//! For every token (dim 2) a table of (cos θ_i, sin θ_i)·mscale for the
//! `n_dims / 2` rotated pairs is built once, with ggml's exact f32 recurrence
//! (θ multiplied by `base^(−2/n_dims)` pair after pair, YaRN ramp and
//! magnitude correction, per-pair frequency factors, multi-section position
//! streams). Rows (one head of one token) are then rotated in parallel
//! through an f32 scratch row, so F16 tensors and in-place results work.

use super::data::{load_f32, store_f32, HalfScratch};
use super::{unsupported, TView};
use crate::error::Result;
use crate::ops::{ops_outside, Op, RopeMode, RopeParams};
use rayon::prelude::*;
use std::f32::consts::PI;

/// `a > b ? a : b` (C macro semantics, including NaN operands).
#[inline]
fn cmax(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `a < b ? a : b`.
#[inline]
fn cmin(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// The dim index at which YaRN's correction for `n_rot` rotations sets in
/// (`ggml_rope_yarn_corr_dim`).
fn corr_dim(n_dims: i32, n_ctx_orig: i32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * PI)).ln() / (2.0 * base.ln())
}

/// YaRN's correction range `[start, end]` in pairs (`ggml_rope_yarn_corr_dims`).
pub(crate) fn corr_dims(p: &RopeParams) -> [f32; 2] {
    let start = corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
    let end = corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
    [cmax(0.0, start), cmin((p.n_dims - 1) as f32, end)]
}

/// 1 for pairs below the correction range, 0 above, linear between.
#[inline]
fn ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = ((i0 / 2) as f32 - low) / cmax(0.001, high - low);
    1.0 - cmin(1.0, cmax(0.0, y))
}

/// Shared per-op constants.
struct Consts {
    freq_scale: f32,
    ext_factor: f32,
    attn_factor: f32,
    corr: [f32; 2],
}

/// (cos, sin)·mscale of angle `theta_extrap` for pair starting at dim `i0`.
#[inline]
fn yarn(theta_extrap: f32, i0: usize, k: &Consts) -> (f32, f32) {
    let theta_interp = k.freq_scale * theta_extrap;
    let mut theta = theta_interp;
    let mut mscale = k.attn_factor;
    if k.ext_factor != 0.0 {
        let mix = ramp(k.corr[0], k.corr[1], i0) * k.ext_factor;
        theta = theta_interp * (1.0 - mix) + theta_extrap * mix;
        mscale *= 1.0 + 0.1 * (1.0 / k.freq_scale).ln();
    }
    (theta.cos() * mscale, theta.sin() * mscale)
}

/// Fills `cache` (`n_dims` floats: cos, sin per pair) for one token.
#[allow(clippy::too_many_arguments)]
fn fill_cache(cache: &mut [f32], p: &RopeParams, k: &Consts, theta_scale: f32, pos: [f32; 4], ff: Option<&TView>) {
    let n = cache.len();
    let multi = matches!(p.mode, RopeMode::Mrope | RopeMode::Imrope);
    let imrope = p.mode == RopeMode::Imrope;
    let s = p.sections;
    let sect_dims = (s[0] + s[1] + s[2] + s[3]).max(1) as usize;
    let (s0, s1, s2) = (s[0] as usize, s[1] as usize, s[2] as usize);
    let sec_w = s0 + s1;
    // θ for the four position streams (only the first is used without sections).
    let mut th = pos;
    for i0 in (0..n).step_by(2) {
        let f = ff.map_or(1.0, |v| v.get_f32(i0 / 2, 0, 0, 0));
        let theta = if !multi {
            th[0]
        } else {
            let sector = (i0 / 2) % sect_dims;
            let stream = if imrope {
                if sector % 3 == 1 && sector < 3 * s1 {
                    1
                } else if sector % 3 == 2 && sector < 3 * s2 {
                    2
                } else if sector % 3 == 0 && sector < 3 * s0 {
                    0
                } else {
                    3
                }
            } else if sector >= s0 && sector < sec_w {
                1
            } else if sector >= sec_w && sector < sec_w + s2 {
                2
            } else if sector >= sec_w + s2 {
                3
            } else {
                0
            };
            th[stream]
        };
        let (c, sn) = yarn(theta / f, i0, k);
        cache[i0] = c;
        if let Some(x) = cache.get_mut(i0 + 1) {
            *x = sn;
        }
        for t in th.iter_mut() {
            *t *= theta_scale;
        }
    }
}

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match op {
        Op::Rope(p) => rope(op, p, dst, src),
        // Not a rope op: `kernels::compute` routes none here.
        ops_outside!(rope) => Err(unsupported(op, dst, src)),
    }
}

/// `rope` with parameters `p`: src0 x, src1 positions, optional src2
/// frequency factors.
fn rope(op: &Op, p: &RopeParams, dst: &TView, src: &[TView]) -> Result<()> {
    let (Some(a), Some(pos)) = (src.first(), src.get(1)) else {
        return Err(unsupported(op, dst, src));
    };
    let ff = src.get(2);
    let n_dims = p.n_dims.max(0) as usize;
    if a.ne != dst.ne || n_dims > a.ne[0] || n_dims % 2 != 0 {
        return Err(unsupported(op, dst, src));
    }
    let multi = matches!(p.mode, RopeMode::Mrope | RopeMode::Imrope);
    let ne2 = a.ne[2];
    let need_pos = if multi { 4 * ne2 } else { ne2 };
    if pos.nelements() < need_pos || ff.is_some_and(|f| f.ne[0] < n_dims / 2) {
        return Err(unsupported(op, dst, src));
    }
    let k =
        Consts { freq_scale: p.freq_scale, ext_factor: p.ext_factor, attn_factor: p.attn_factor, corr: corr_dims(p) };
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);

    // One cache row per token.
    let mut caches = vec![0f32; ne2 * n_dims];
    if n_dims > 0 {
        caches.par_chunks_mut(n_dims).enumerate().for_each(|(i2, cache)| {
            let at = |j: usize| pos.get_i64(j, 0, 0, 0) as f32;
            let ps = if multi {
                [at(i2), at(i2 + ne2), at(i2 + 2 * ne2), at(i2 + 3 * ne2)]
            } else {
                let x = at(i2);
                [x, x, x, x]
            };
            fill_cache(cache, p, &k, theta_scale, ps, ff);
        });
    }

    let neox = p.mode != RopeMode::Normal;
    let half = n_dims / 2;
    let ne0 = a.ne[0];
    (0..dst.nrows()).into_par_iter().with_min_len((8192 / ne0.max(1)).max(1)).try_for_each_init(
        || (vec![0f32; ne0], HalfScratch::default()),
        |(row, hs), r| -> Result<()> {
            let (i1, i2, i3) = dst.row_index(r);
            load_f32(a, i1, i2, i3, row, hs)?;
            let cache = &caches[i2 * n_dims..(i2 + 1) * n_dims];
            if neox {
                let (lo, hi) = row[..n_dims].split_at_mut(half);
                for ((x0, x1), cs) in lo.iter_mut().zip(hi.iter_mut()).zip(cache.chunks_exact(2)) {
                    let (c, s) = (cs[0], cs[1]);
                    let (v0, v1) = (*x0, *x1);
                    *x0 = v0 * c - v1 * s;
                    *x1 = v0 * s + v1 * c;
                }
            } else {
                for (xs, cs) in row[..n_dims].chunks_exact_mut(2).zip(cache.chunks_exact(2)) {
                    let (c, s) = (cs[0], cs[1]);
                    let (v0, v1) = (xs[0], xs[1]);
                    xs[0] = v0 * c - v1 * s;
                    xs[1] = v0 * s + v1 * c;
                }
            }
            store_f32(dst, i1, i2, i3, row, hs)
        },
    )
}
