//! The 256-element k-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the activation
//! format Q8_K: reference quantizers bit-identical to ggml's
//! `quantize_row_*_ref` and dequantizers bit-identical to `dequantize_row_*`
//! (`ggml-quants.c`).
//!
//! The reference quantizers search for scales (ggml's `make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants`); to reproduce ggml's bytes every
//! float expression below is evaluated in the same order and precision as
//! the C code (single precision, no fused multiply-add, left to right).
//!
//! Every function takes `x.len() == QK_K · y.len()`; `quant/mod.rs` checks.

// The block layouts are index formulas (element 128·c + 32·k + l, …);
// indexed loops state them most directly.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;

/// ggml's `GROUP_MAX_EPS`: groups whose largest |x| is below it are all-zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, by ggml's magic-number trick
/// (`nearest_int`): exact for |v| ≤ 2²², and for larger or non-finite inputs
/// the same bits ggml computes.
#[inline(always)]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let t = v + 12582912.0;
    (t.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)`: symmetric
/// quants `L` in `0..2·nmax` with weights `x²`; returns the scale.
fn make_qx_quants_rmse1(nmax: i32, x: &[f32], out: &mut [i8]) -> f32 {
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        out.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *o = (l + nmax) as i8;
        let w = v * v;
        let lf = l as f32;
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            let lf = l as f32;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants(n, nmax, x, L, do_rmse = true)`: symmetric quants in
/// `0..2·nmax` refined by coordinate descent on the `x²`-weighted error;
/// returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], out: &mut [i8]) -> f32 {
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0f32;
    let mut suml2 = 0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *o = l as i8;
        let w = v * v;
        let lf = l as f32;
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (o, &v) in out.iter_mut().zip(x) {
            let w = v * v;
            let cur = *o as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *o as i32 {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *o = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for o in out.iter_mut() {
        *o += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of ggml's `make_qkx2_quants` search.
struct Qkx2 {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
}

/// `make_qkx2_quants`: asymmetric quants `L` in `0..=nmax` for
/// `x ≈ scale·L − min` minimising the weighted error (squared or absolute);
/// returns `(scale, min)` with `min ≥ 0` (ggml's `the_min`).
fn make_qkx2_quants(p: &Qkx2, x: &[f32], weights: &[f32], out: &mut [u8], aux: &mut [u8]) -> (f32, f32) {
    let n = x.len();
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0f32;
        let mut sum_l2 = 0f32;
        let mut sum_xl = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                out[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs 2-bit values: byte `32·c + l` of `qs` holds elements
/// `128·c + l + 32·k` in bits `2k..2k+2` (Q2_K and Q3_K layout).
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for c in 0..QK_K / 128 {
        for i in 0..32 {
            let b = 128 * c + i;
            qs[32 * c + i] = l[b] | (l[b + 32] << 2) | (l[b + 64] << 4) | (l[b + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`.
pub(crate) fn quantize_q2_k(x: &[f32], y: &mut [BlockQ2K]) {
    const Q4SCALE: f32 = 15.0;
    let params = Qkx2 { nmax: 3, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: true };
    let mut l = [0u8; QK_K];
    let mut aux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0f32;
        let mut max_min = 0f32;
        for j in 0..QK_K / 16 {
            let xs = &xb[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(&params, xs, &weights, &mut l[16 * j..16 * j + 16], &mut aux);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                yb.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            yb.d = f16_bytes(max_scale / Q4SCALE);
        } else {
            yb.scales = [0; QK_K / 16];
            yb.d = f16_bytes(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                yb.scales[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            yb.dmin = f16_bytes(max_min / Q4SCALE);
        } else {
            yb.dmin = f16_bytes(0.0);
        }
        let d_all = f16_le(yb.d);
        let dmin_all = f16_le(yb.dmin);
        for j in 0..QK_K / 16 {
            let d = d_all * (yb.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmin_all * (yb.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((xb[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut yb.qs);
    }
}

/// `quantize_row_q3_K_ref`.
pub(crate) fn quantize_q3_k(x: &[f32], y: &mut [BlockQ3K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0f32;
        let mut amax = 0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(4, &xb[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            let s = scales[j].abs();
            if s > amax {
                amax = s;
                max_scale = scales[j];
            }
        }
        yb.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..QK_K / 16 {
                let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                if j < 8 {
                    yb.scales[j] = (q & 0xF) as u8;
                } else {
                    yb.scales[j - 8] |= ((q & 0xF) << 4) as u8;
                }
                yb.scales[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
            }
            yb.d = f16_bytes(1.0 / iscale);
        } else {
            yb.d = f16_bytes(0.0);
        }
        let d_all = f16_le(yb.d);
        let sc = q3k_scales(&yb.scales);
        for j in 0..QK_K / 16 {
            let d = d_all * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int(xb[16 * j + ii] / d).clamp(-4, 3) as i8 + 4;
            }
        }
        yb.hmask = [0; QK_K / 8];
        let mut lu = [0u8; QK_K];
        for (j, (&q, u)) in l.iter().zip(lu.iter_mut()).enumerate() {
            let mut q = q as u8;
            if q > 3 {
                yb.hmask[j % 32] |= 1 << (j / 32);
                q -= 4;
            }
            *u = q;
        }
        pack_2bit(&lu, &mut yb.qs);
    }
}

/// Packs Q4_K/Q5_K's 8 six-bit scales and mins into 12 bytes.
fn pack_scales_mins_k4(ls: &[u8; 8], lm: &[u8; 8], out: &mut [u8; K_SCALE_SIZE]) {
    for j in 0..8 {
        if j < 4 {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            out[j - 4] |= (ls[j] >> 4) << 6;
            out[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// The shared first half of `quantize_row_q4_K_ref`/`q5_K_ref`: per group of
/// 32 a weighted asymmetric fit, then 6-bit scales and mins, then the quants
/// recomputed with the rounded scales. Returns `(d, dmin)` as f16 bytes and
/// writes the packed scales and the quants `l` (0..=nmax).
fn quantize_k4_like(
    xb: &[f32],
    params: &Qkx2,
    scales_out: &mut [u8; K_SCALE_SIZE],
    l: &mut [u8; QK_K],
) -> ([u8; 2], [u8; 2]) {
    let mut aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut max_scale = 0f32;
    let mut max_min = 0f32;
    for j in 0..QK_K / 32 {
        let xs = &xb[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(params, xs, &weights, &mut l[32 * j..32 * j + 32], &mut aux);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..QK_K / 32 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scales_mins_k4(&ls, &lm, scales_out);
    let d = f16_bytes(max_scale / 63.0);
    let dmin = f16_bytes(max_min / 63.0);
    let d_all = f16_le(d);
    let dmin_all = f16_le(dmin);
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, scales_out);
        let dj = d_all * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((xb[32 * j + ii] + dm) / dj).clamp(0, params.nmax) as u8;
        }
    }
    (d, dmin)
}

/// `quantize_row_q4_K_ref`.
pub(crate) fn quantize_q4_k(x: &[f32], y: &mut [BlockQ4K]) {
    let params = Qkx2 { nmax: 15, rmin: -1.0, rdelta: 0.1, nstep: 20, use_mad: false };
    let mut l = [0u8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        (yb.d, yb.dmin) = quantize_k4_like(xb, &params, &mut yb.scales, &mut l);
        for c in 0..QK_K / 64 {
            for i in 0..32 {
                yb.qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

/// `quantize_row_q5_K_ref`.
pub(crate) fn quantize_q5_k(x: &[f32], y: &mut [BlockQ5K]) {
    let params = Qkx2 { nmax: 31, rmin: -0.5, rdelta: 0.1, nstep: 15, use_mad: false };
    let mut l = [0u8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        (yb.d, yb.dmin) = quantize_k4_like(xb, &params, &mut yb.scales, &mut l);
        yb.qh = [0; QK_K / 8];
        for c in 0..QK_K / 64 {
            for i in 0..32 {
                let mut l1 = l[64 * c + i];
                if l1 > 15 {
                    l1 -= 16;
                    yb.qh[i] |= 1 << (2 * c);
                }
                let mut l2 = l[64 * c + 32 + i];
                if l2 > 15 {
                    l2 -= 16;
                    yb.qh[i] |= 2 << (2 * c);
                }
                yb.qs[32 * c + i] = l1 | (l2 << 4);
            }
        }
    }
}

/// `quantize_row_q6_K_ref`.
pub(crate) fn quantize_q6_k(x: &[f32], y: &mut [BlockQ6K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0f32;
        let mut max_abs_scale = 0f32;
        for ib in 0..QK_K / 16 {
            let s = make_qx_quants_rmse1(32, &xb[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *yb = BlockQ6K::zeroed();
            continue;
        }
        let iscale = -128.0 / max_scale;
        yb.d = f16_bytes(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            yb.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        let d_all = f16_le(yb.d);
        for j in 0..QK_K / 16 {
            let d = d_all * yb.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(xb[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for c in 0..QK_K / 128 {
            let (ql, qh) = (&mut yb.ql[64 * c..64 * c + 64], &mut yb.qh[32 * c..32 * c + 32]);
            let lb = &l[128 * c..128 * c + 128];
            for i in 0..32 {
                let (q1, q2, q3, q4) = (lb[i] as u8, lb[i + 32] as u8, lb[i + 64] as u8, lb[i + 96] as u8);
                ql[i] = (q1 & 0xF) | ((q3 & 0xF) << 4);
                ql[i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
                qh[i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

/// `quantize_row_q8_K_ref`. An all-zero block gets `d = 0`, zero quants and
/// zero block sums (ggml leaves the sums of such a block unwritten).
pub(crate) fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = BlockQ8K::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let s: i32 = yb.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
            yb.bsums[j] = (s as i16).to_le_bytes();
        }
        yb.d = (1.0 / iscale).to_le_bytes();
    }
}

/// `dequantize_row_q2_K`.
pub(crate) fn dequantize_q2_k(x: &[BlockQ2K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let min = f16_le(b.dmin);
        let mut o = 0;
        let mut is = 0;
        for c in 0..QK_K / 128 {
            let q = &b.qs[32 * c..32 * c + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = b.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for &qv in &q[16 * half..16 * half + 16] {
                        yb[o] = dl * ((qv >> shift) & 3) as f32 - ml;
                        o += 1;
                    }
                }
            }
        }
    }
}

/// `dequantize_row_q3_K`.
pub(crate) fn dequantize_q3_k(x: &[BlockQ3K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = f16_le(b.d);
        let scales = q3k_scales(&b.scales);
        let mut o = 0;
        let mut is = 0;
        let mut m = 1u8;
        for c in 0..QK_K / 128 {
            let q = &b.qs[32 * c..32 * c + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = d_all * scales[is] as f32;
                    is += 1;
                    for l in 16 * half..16 * half + 16 {
                        let v = ((q[l] >> shift) & 3) as i32 - if b.hmask[l] & m != 0 { 0 } else { 4 };
                        yb[o] = dl * v as f32;
                        o += 1;
                    }
                }
                m = m.wrapping_shl(1);
            }
        }
    }
}

/// `dequantize_row_q4_K`.
pub(crate) fn dequantize_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let min = f16_le(b.dmin);
        for c in 0..QK_K / 64 {
            let (sc1, m1) = scale_min_k4(2 * c, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let q = &b.qs[32 * c..32 * c + 32];
            let out = &mut yb[64 * c..64 * c + 64];
            for l in 0..32 {
                out[l] = d1 * (q[l] & 0xF) as f32 - m1;
                out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// `dequantize_row_q5_K`.
pub(crate) fn dequantize_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let min = f16_le(b.dmin);
        for c in 0..QK_K / 64 {
            let (sc1, m1) = scale_min_k4(2 * c, &b.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &b.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            let q = &b.qs[32 * c..32 * c + 32];
            let out = &mut yb[64 * c..64 * c + 64];
            for l in 0..32 {
                let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                out[l] = d1 * ((q[l] & 0xF) + h1) as f32 - m1;
                out[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// The 256 signed 6-bit values (−32..=31) of a Q6_K block in element order.
#[inline(always)]
pub(crate) fn q6k_values(b: &BlockQ6K) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for c in 0..QK_K / 128 {
        let ql = &b.ql[64 * c..64 * c + 64];
        let qh = &b.qh[32 * c..32 * c + 32];
        let out = &mut v[128 * c..128 * c + 128];
        for l in 0..32 {
            out[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    v
}

/// `dequantize_row_q6_K`.
pub(crate) fn dequantize_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let v = q6k_values(b);
        for (i, (o, &q)) in yb.iter_mut().zip(v.iter()).enumerate() {
            *o = d * b.scales[i / 16] as f32 * q as f32;
        }
    }
}

/// `dequantize_row_q8_K`.
pub(crate) fn dequantize_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.scale();
        for (o, &q) in yb.iter_mut().zip(b.qs.iter()) {
            *o = d * q as f32;
        }
    }
}

use bytemuck::Zeroable;
