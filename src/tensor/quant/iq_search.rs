//! The codebook-search quantizers IQ3_XXS, IQ3_S, IQ2_S and IQ1_M,
//! bit-identical to ggml 0.25.3's `ggml_quantize_chunk(type, …, imatrix =
//! NULL)` (`quantize_row_iq3_xxs_impl`, `quantize_row_iq3_s_impl`,
//! `quantize_row_iq2_s_impl`, `quantize_row_iq1_m_impl` in `ggml-quants.c`).
//!
//! Per group the quantizer tries a range of scales; at each, the rounded
//! magnitudes of every 4 (IQ3) or 8 (IQ2, IQ1) weights form a code, which is
//! a codebook point or is replaced by its best neighbour
//! ([`GridIndex`]); the scale with the best weighted fit wins, then the
//! group scales are quantized against the largest one. IQ1_M instead splits
//! each group of 16 exhaustively into three levels.
//!
//! Every float expression is evaluated in the same order and precision as
//! the C code, ggml's `MAX` macro keeps its NaN behaviour ([`cmax`]), and
//! ggml's quirks are kept: IQ3_S packs the grid indices and signs of the
//! non-zero groups one after another (an all-zero group of 32 takes no
//! slot, so later groups move down and the last slots stay zero).
//!
//! ggml aborts the process on inputs for which no neighbour has a finite
//! distance (NaN, or squares that overflow f32); here those groups take the
//! first neighbour instead, so any input gives some bytes and never panics.
//!
//! Every function takes `x.len() == QK_K · y.len()`; `quant/mod.rs` checks.

// The block layouts are index formulas; indexed loops state them most directly.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::iq_quantize::{cmax, iq1_index, iq2s_index, iq3s_index, iq3xxs_index, GridIndex, Lookup};
use super::kquants::nearest_int;
use bytemuck::Zeroable;

/// ggml's `GROUP_MAX_EPS_IQ3_XXS`.
const GROUP_MAX_EPS_IQ3_XXS: f32 = 1e-8;
/// ggml's `GROUP_MAX_EPS_IQ2_S`.
const GROUP_MAX_EPS_IQ2_S: f32 = 1e-8;
/// ggml's `GROUP_MAX_EPS_IQ1_M`.
const GROUP_MAX_EPS_IQ1_M: f32 = 1e-7;

/// The rank of `v` at inverse scale `id` among `0..=lmax`:
/// `nearest_int((id·v − 1)/2)` clamped.
#[inline(always)]
fn rank(id: f32, v: f32, lmax: i32) -> i8 {
    nearest_int(0.5 * (id * v - 1.0)).clamp(0, lmax) as i8
}

/// `Σ w·x·q` and `Σ w·q²` with `q = 2l + 1`.
#[inline(always)]
fn odd_sums(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for i in 0..l.len() {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The code of ranks `l` (`bits` per coordinate).
#[inline(always)]
fn code(l: &[i8], bits: u32) -> usize {
    l.iter().enumerate().map(|(i, &v)| (v as usize) << (bits as usize * i)).sum()
}

/// |x| of a run of 8 and its sign bits (bit i set for a negative x[i]).
#[inline(always)]
fn abs_signs(x: &[f32], xval: &mut [f32]) -> u8 {
    let mut s = 0u8;
    for i in 0..8 {
        if x[i] >= 0.0 {
            xval[i] = x[i];
        } else {
            xval[i] = -x[i];
            s |= 1 << i;
        }
    }
    s
}

/// What differs between the IQ3 quantizers.
struct Iq3 {
    index: &'static GridIndex<4>,
    /// IQ3_XXS: 7 sign bits per 8 (an odd number of negatives flips the
    /// smallest weighted one); a group is zero below `GROUP_MAX_EPS_IQ3_XXS`;
    /// scales tried in 31 steps; on-grid codes kept when refitting.
    xxs: bool,
}

/// The grid points, sign bytes and scale of one group of 32 (`None`: an
/// all-zero group).
fn iq3_group(v: &Iq3, xb: &[f32]) -> Option<([u16; 8], [u8; 4], f32)> {
    let mut weight = [0f32; 32];
    let mut waux = [0f32; 32];
    for i in 0..32 {
        weight[i] = xb[i] * xb[i];
        waux[i] = weight[i].sqrt();
    }
    let mut xval = [0f32; 32];
    let mut signs = [0u8; 4];
    for k in 0..4 {
        let mut s = abs_signs(&xb[8 * k..], &mut xval[8 * k..]);
        if v.xxs && s.count_ones() % 2 == 1 {
            let (mut imin, mut min) = (0, weight[8 * k] * xb[8 * k] * xb[8 * k]);
            for i in 1..8 {
                let ax = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if ax < min {
                    (min, imin) = (ax, i);
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= 1 << imin;
        }
        signs[k] = if v.xxs { s & 127 } else { s };
    }
    let max = xval[1..].iter().fold(xval[0], |m, &x| cmax(m, x));
    if (v.xxs && max < GROUP_MAX_EPS_IQ3_XXS) || (!v.xxs && max == 0.0) {
        return None;
    }
    let (mut best, mut scale) = (0f32, max / 15.0);
    let mut l = [0i8; 32];
    let mut on_grid = [v.xxs; 8];
    let n_is = if v.xxs { 15 } else { 9 };
    for is in -n_is..=n_is {
        let id = (15.0 + is as f32 * 0.2) / max;
        let this_scale = 1.0 / id;
        let mut laux = [0i8; 32];
        let mut aux_on = [true; 8];
        for k in 0..8 {
            for i in 4 * k..4 * k + 4 {
                laux[i] = rank(id, xval[i], 7);
            }
            let (xs, ws) = (&xval[4 * k..4 * k + 4], &waux[4 * k..4 * k + 4]);
            aux_on[k] =
                v.index.snap(code(&laux[4 * k..4 * k + 4], 3), xs, ws, this_scale, &mut laux[4 * k..4 * k + 4]).1;
        }
        let (sumqx, sumq2) = odd_sums(&weight, &xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            (l, on_grid) = (laux, aux_on);
        }
    }
    if on_grid.iter().any(|&o| !o) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..8 {
            if v.xxs && on_grid[k] {
                continue;
            }
            let r: [i8; 4] = std::array::from_fn(|i| rank(id, xval[4 * k + i], 7));
            let (xs, ws) = (&xval[4 * k..4 * k + 4], &waux[4 * k..4 * k + 4]);
            v.index.snap(code(&r, 3), xs, ws, scale, &mut l[4 * k..4 * k + 4]);
        }
        let (sumqx, sumq2) = odd_sums(&weight, &xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    if scale < 0.0 {
        scale = -scale;
        for s in signs.iter_mut() {
            *s = if v.xxs { !*s & 127 } else { !*s };
        }
    }
    let points = std::array::from_fn(|k| v.index.point_of(&l[4 * k..4 * k + 4], 3) as u16);
    Some((points, signs, scale))
}

/// The 4-bit code of group scale `s` against the block's `1/d`.
#[inline(always)]
fn scale_code(id: f32, s: f32, lmax: i32) -> u8 {
    nearest_int(0.5 * (id * s - 1.0)).clamp(0, lmax) as u8
}

/// `quantize_iq3_xxs` without an importance matrix.
pub(crate) fn quantize_iq3_xxs(x: &[f32], y: &mut [BlockIQ3XXS]) {
    let v = Iq3 { index: iq3xxs_index(), xxs: true };
    for (xbl, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut q3 = [0u8; 3 * QK_K / 8];
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        for (ib, xb) in xbl.chunks_exact(32).enumerate() {
            let Some((points, signs, scale)) = iq3_group(&v, xb) else { continue };
            for k in 0..8 {
                q3[8 * ib + k] = points[k] as u8;
            }
            let ss = signs[0] as u32 | (signs[1] as u32) << 7 | (signs[2] as u32) << 14 | (signs[3] as u32) << 21;
            q3[QK_K / 4 + 4 * ib..QK_K / 4 + 4 * ib + 4].copy_from_slice(&ss.to_le_bytes());
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            *yb = BlockIQ3XXS { d: f16_bytes(0.0), qs: [0; 3 * QK_K / 8] };
            continue;
        }
        let d = max_scale / 31.0;
        yb.d = f16_bytes(d * 1.0125);
        let id = 1.0 / d;
        for ib in 0..8 {
            q3[QK_K / 4 + 4 * ib + 3] |= scale_code(id, scales[ib], 15) << 4;
        }
        yb.qs = q3;
    }
}

/// `quantize_iq3_s` without an importance matrix.
pub(crate) fn quantize_iq3_s(x: &[f32], y: &mut [BlockIQ3S]) {
    let v = Iq3 { index: iq3s_index(), xxs: false };
    for (xbl, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        *yb = Zeroable::zeroed();
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        // ggml advances its index and sign cursors only past non-zero groups.
        let mut slot = 0;
        for (ib, xb) in xbl.chunks_exact(32).enumerate() {
            let Some((points, signs, scale)) = iq3_group(&v, xb) else { continue };
            for k in 0..8 {
                yb.qs[8 * slot + k] = points[k] as u8;
                yb.qh[ib] |= ((points[k] >> 8) as u8) << k;
            }
            yb.signs[4 * slot..4 * slot + 4].copy_from_slice(&signs);
            slot += 1;
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        yb.d = f16_bytes(d * 1.033);
        let id = 1.0 / d;
        for ib in (0..8).step_by(2) {
            yb.scales[ib / 2] = scale_code(id, scales[ib], 15) | (scale_code(id, scales[ib + 1], 15) << 4);
        }
    }
}

/// IQ2_S: the grid points, sign bytes and scale of one group of 16, with
/// weights `σ²/4 + x²` (`None`: a near-zero group).
fn iq2s_group(index: &GridIndex<8>, xb: &[f32], sigma2: f32) -> Option<([u16; 2], [u8; 2], f32)> {
    let mut weight = [0f32; 16];
    let mut waux = [0f32; 16];
    for i in 0..16 {
        weight[i] = 0.25 * sigma2 + xb[i] * xb[i];
        waux[i] = weight[i].sqrt();
    }
    let mut xval = [0f32; 16];
    let mut signs = [abs_signs(&xb[..8], &mut xval[..8]), 0];
    signs[1] = abs_signs(&xb[8..], &mut xval[8..]);
    let max = xval[1..].iter().fold(xval[0], |m, &x| cmax(m, x));
    if max < GROUP_MAX_EPS_IQ2_S {
        return None;
    }
    let (mut best, mut scale) = (0f32, max / 5.0);
    let mut l = [0i8; 16];
    let mut on_grid = [true; 2];
    for is in -9..=9 {
        let id = (5.0 + is as f32 * 0.1) / max;
        let this_scale = 1.0 / id;
        let mut laux = [0i8; 16];
        let mut aux_on = [true; 2];
        for k in 0..2 {
            for i in 8 * k..8 * k + 8 {
                laux[i] = rank(id, xval[i], 2);
            }
            let (xs, ws) = (&xval[8 * k..8 * k + 8], &waux[8 * k..8 * k + 8]);
            aux_on[k] = index.snap(code(&laux[8 * k..8 * k + 8], 2), xs, ws, this_scale, &mut laux[8 * k..8 * k + 8]).1;
        }
        let (sumqx, sumq2) = odd_sums(&weight, &xval, &laux);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            (l, on_grid) = (laux, aux_on);
        }
    }
    if on_grid.iter().any(|&o| !o) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in (0..2).filter(|&k| !on_grid[k]) {
            for i in 8 * k..8 * k + 8 {
                l[i] = rank(id, xval[i], 2);
            }
            let (xs, ws) = (&xval[8 * k..8 * k + 8], &waux[8 * k..8 * k + 8]);
            index.snap(code(&l[8 * k..8 * k + 8], 2), xs, ws, scale, &mut l[8 * k..8 * k + 8]);
        }
        let (sumqx, sumq2) = odd_sums(&weight, &xval, &l);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    if scale < 0.0 {
        scale = -scale;
        signs = [!signs[0], !signs[1]];
    }
    let points = [index.point_of(&l[..8], 2) as u16, index.point_of(&l[8..], 2) as u16];
    Some((points, signs, scale))
}

/// `quantize_iq2_s` without an importance matrix.
pub(crate) fn quantize_iq2_s(x: &[f32], y: &mut [BlockIQ2S]) {
    let index = iq2s_index();
    for (xbl, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        *yb = Zeroable::zeroed();
        let mut sumx2 = 0f32;
        for &v in xbl {
            sumx2 += v * v;
        }
        let sigma2 = 2.0 * sumx2 / QK_K as f32;
        let mut scales = [0f32; 16];
        let mut max_scale = 0f32;
        for (ib, xb) in xbl.chunks_exact(16).enumerate() {
            let Some((points, signs, scale)) = iq2s_group(index, xb, sigma2) else { continue };
            for k in 0..2 {
                let i8 = 2 * ib + k;
                yb.qs[i8] = points[k] as u8;
                yb.qh[i8 / 4] |= ((points[k] >> 8) as u8) << (2 * (i8 % 4));
                yb.qs[QK_K / 8 + i8] = signs[k];
            }
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        yb.d = f16_bytes(d * 0.9875);
        let id = 1.0 / d;
        for ib in 0..16 {
            yb.scales[ib / 2] |= scale_code(id, scales[ib], 15) << (4 * (ib % 2));
        }
    }
}

/// IQ1_M's levels shifted up by 1/8 (`x_p`) and down (`x_m`).
const X_P: [f32; 3] = [-1.0 + 0.125, 0.125, 1.0 + 0.125];
const X_M: [f32; 3] = [-1.0 - 0.125, -0.125, 1.0 - 0.125];

/// The levels of half `k` (8 weights) of an IQ1_M group of 16 with shift
/// code `shift` (bit 1: first half down, bit 0: second half down).
#[inline(always)]
fn iq1m_levels(shift: u8, k: usize) -> &'static [f32; 3] {
    let down = if k == 0 { shift >= 2 } else { shift % 2 == 1 };
    if down {
        &X_M
    } else {
        &X_P
    }
}

/// The neighbour of `list` nearest to `x` at `scale` with levels `xg`
/// (ggml's `iq1_find_best_neighbour2`); the first of the list when no
/// distance is below `f32::MAX` (where ggml aborts).
fn iq1_best_neighbour(index: &GridIndex<8>, list: &[u16], x: &[f32], w: &[f32], scale: f32, xg: &[f32; 3]) -> usize {
    let mut best_d2 = f32::MAX;
    let mut best = None;
    for &j in list {
        let mut d2 = 0f32;
        for (i, &p) in index.points[j as usize].iter().enumerate() {
            let diff = scale * xg[((p - 1) / 2) as usize] - x[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = Some(j as usize);
        }
    }
    best.unwrap_or(list.first().map_or(0, |&j| j as usize))
}

/// The best split of a group of 16 into three levels: per-half prefix sums
/// over the weights sorted by value give, for each split (i1, i2) and each
/// of the four shift combinations, the fitted scale in O(1). Returns the
/// ranks (0, 1, 2) per weight, the scale and the shift code, or `None`
/// when no split fits.
fn iq1m_split(xb: &[f32], weight: &[f32; 16]) -> Option<([i8; 16], f32, u8)> {
    // Ascending, ties (±0 included) in index order, as ggml's stable
    // `qsort` with a `<`/`>` comparator; NaNs go to the ends (ggml's order
    // for them is arbitrary) so the order stays total.
    let key = |v: f32| if v == 0.0 { 0.0 } else { v };
    let mut order: [usize; 16] = std::array::from_fn(|j| j);
    order.sort_by(|&a, &b| key(xb[a]).total_cmp(&key(xb[b])));
    let (mut px, mut pw) = ([[0f32; 17]; 2], [[0f32; 17]; 2]);
    for (j, &i) in order.iter().enumerate() {
        let h = usize::from(i >= 8);
        px[h][j + 1] = px[h][j] + weight[i] * xb[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + weight[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    let (txs, tws) = ([px[0][16], px[1][16]], [pw[0][16], pw[1][16]]);
    let (p2, m2) = (X_P[2], X_M[2]);
    let (cp1, cp2) = (X_P[0] * X_P[0] - X_P[1] * X_P[1], X_P[1] * X_P[1] - X_P[2] * X_P[2]);
    let (cm1, cm2) = (X_M[0] * X_M[0] - X_M[1] * X_M[1], X_M[1] * X_M[1] - X_M[2] * X_M[2]);
    let (mut best_score, mut scale) = (-f32::MAX, 0f32);
    let mut best = None;
    for i1 in 0..=16 {
        for i2 in i1..=16 {
            let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) = ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
            for h in 0..2 {
                let sx = px[h][i1] + px[h][i2];
                qx_p[h] = txs[h] * p2 - sx;
                qx_m[h] = txs[h] * m2 - sx;
                q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
            }
            let sumqx = [qx_p[0] + qx_p[1], qx_p[0] + qx_m[1], qx_m[0] + qx_p[1], qx_m[0] + qx_m[1]];
            let sumq2 = [q2_p[0] + q2_p[1], q2_p[0] + q2_m[1], q2_m[0] + q2_p[1], q2_m[0] + q2_m[1]];
            for k in 0..4 {
                if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                    scale = sumqx[k] / sumq2[k];
                    best_score = scale * sumqx[k];
                    best = Some((i1, i2, k as u8));
                }
            }
        }
    }
    let (i1, i2, mut shift) = best?;
    let mut l = [0i8; 16];
    for (j, &i) in order.iter().enumerate() {
        l[i] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
    if scale < 0.0 {
        l = l.map(|v| 2 - v);
        scale = -scale;
        shift = 3 - shift;
    }
    Some((l, scale, shift))
}

/// IQ1_M: the grid points, scale and shift code of one group of 16 (`None`:
/// a near-zero group or no fit).
fn iq1m_group(index: &GridIndex<8>, xb: &[f32]) -> Option<([u16; 2], f32, u8)> {
    let weight: [f32; 16] = std::array::from_fn(|i| xb[i] * xb[i]);
    let max = xb[1..].iter().fold(xb[0].abs(), |m, &x| cmax(m, x.abs()));
    if max < GROUP_MAX_EPS_IQ1_M {
        return None;
    }
    let (l, mut scale, shift) = iq1m_split(xb, &weight)?;
    let mut points = [0u16; 2];
    let mut all_on_grid = true;
    for k in 0..2 {
        let xx = iq1m_levels(shift, k);
        points[k] = match index.lookup(code(&l[8 * k..8 * k + 8], 2)) {
            Lookup::On(i) => i as u16,
            Lookup::Near(list) => {
                all_on_grid = false;
                iq1_best_neighbour(index, list, &xb[8 * k..], &weight[8 * k..], scale, xx) as u16
            }
        };
    }
    if !all_on_grid {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for k in 0..2 {
            let xx = iq1m_levels(shift, k);
            for (j, &p) in index.points[points[k] as usize].iter().enumerate() {
                let w = weight[8 * k + j];
                let q = xx[((p - 1) / 2) as usize];
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
        if sumqx > 0.0 && sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    Some((points, scale, shift))
}

/// IQ1_M's super-block scale: the weighted fit of all groups at their
/// quantized 3-bit scales `ls`.
fn iq1m_refit(index: &GridIndex<8>, xbl: &[f32], y: &BlockIQ1M, ls: &[i32; 16], shifts: &[u8; 16], d: f32) -> f32 {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (ib, xb) in xbl.chunks_exact(16).enumerate() {
        for k in 0..2 {
            let xx = iq1m_levels(shifts[ib], k);
            let gi = y.qs[2 * ib + k] as usize + (((y.qh[ib] as usize) << (8 - 4 * k)) & 0x700);
            for (j, &p) in index.points[gi].iter().enumerate() {
                let w = xb[8 * k + j] * xb[8 * k + j];
                let q = xx[((p - 1) / 2) as usize] * (2 * ls[ib] + 1) as f32;
                sumqx += w * q * xb[8 * k + j];
                sumq2 += w * q * q;
            }
        }
    }
    if sumq2 > 0.0 {
        sumqx / sumq2
    } else {
        d
    }
}

/// `quantize_iq1_m` without an importance matrix.
pub(crate) fn quantize_iq1_m(x: &[f32], y: &mut [BlockIQ1M]) {
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let index = iq1_index();
    for (xbl, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        *yb = Zeroable::zeroed();
        let mut scales = [0f32; 16];
        let mut shifts = [0u8; 16];
        let mut max_scale = 0f32;
        for (ib, xb) in xbl.chunks_exact(16).enumerate() {
            let Some((points, scale, shift)) = iq1m_group(index, xb) else { continue };
            yb.qs[2 * ib] = points[0] as u8;
            yb.qs[2 * ib + 1] = points[1] as u8;
            yb.qh[ib] = (points[0] >> 8) as u8 | (((points[1] >> 8) as u8) << 4);
            (scales[ib], shifts[ib]) = (scale, shift);
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 15.0;
        let id = 1.0 / d;
        let mut sc = [0u16; 4];
        let mut ls = [0i32; 16];
        for ib in 0..16 {
            ls[ib] = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            sc[ib / 4] |= (ls[ib] as u16) << (3 * (ib % 4));
            yb.qh[ib] |= MASKS[shifts[ib] as usize];
        }
        let d = iq1m_refit(index, xbl, yb, &ls, &shifts, d);
        let s = super::float::fp32_to_fp16_bits(d * 1.1125);
        sc[0] |= (s & 0x000f) << 12;
        sc[1] |= (s & 0x00f0) << 8;
        sc[2] |= (s & 0x0f00) << 4;
        sc[3] |= s & 0xf000;
        for (k, v) in sc.iter().enumerate() {
            yb.scales[2 * k..2 * k + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
}
