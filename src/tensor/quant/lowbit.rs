//! The 1- and 2-bit formats Q1_0 (signs, 128 per block), Q2_0 (2 bits, 64
//! per block) and the ternary TQ1_0 (base-3 packing) and TQ2_0 (2 bits), the
//! last two in 256-element blocks: reference quantizers bit-identical to
//! ggml 0.25.3's `quantize_row_*_ref` and dequantizers bit-identical to
//! `dequantize_row_*` (`ggml-quants.c`).
//!
//! Every function takes `y.len() == QK · x.len()` (or the reverse); `quant/mod.rs` checks.

use super::blocks::*;
use super::legacy::c_round_i32;

/// `quantize_row_q1_0_ref`: `d` is the mean |x| of the block, each weight
/// keeps its sign (`x ≥ 0` sets the bit).
pub(crate) fn quantize_q1_0(x: &[f32], y: &mut [BlockQ1_0]) {
    for (xb, yb) in x.chunks_exact(QK1_0).zip(y.iter_mut()) {
        let mut sum_abs = 0f32;
        for &v in xb {
            sum_abs += v.abs();
        }
        yb.d = f16_bytes(sum_abs / QK1_0 as f32);
        yb.qs = [0; QK1_0 / 8];
        for (j, &v) in xb.iter().enumerate() {
            if v >= 0.0 {
                yb.qs[j / 8] |= 1 << (j % 8);
            }
        }
    }
}

/// `quantize_row_q2_0_ref`: `d` is the block's largest |x|, and each weight
/// becomes `round(x/d)` clamped to −1..=2, stored plus one.
pub(crate) fn quantize_q2_0(x: &[f32], y: &mut [BlockQ2_0]) {
    for (xb, yb) in x.chunks_exact(QK2_0).zip(y.iter_mut()) {
        let mut amax = 0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
            }
        }
        let id = if amax > 0.0 { 1.0 / amax } else { 0.0 };
        yb.d = f16_bytes(amax);
        yb.qs = [0; QK2_0 / 4];
        for (j, &v) in xb.iter().enumerate() {
            let q = c_round_i32(v * id).wrapping_add(1).clamp(0, 3);
            yb.qs[j / 4] |= (q as u8) << (2 * (j % 4));
        }
    }
}

/// C's `lroundf(v)` (round half away from zero) as x86 glibc executes it,
/// truncated to `int` as ggml's `int xi = lroundf(…) + 1` does: non-finite
/// and huge inputs give `LONG_MIN`, whose low 32 bits are 0.
#[inline(always)]
fn c_lround_low32(v: f32) -> i32 {
    if !(-9.223_372e18..9.223_372e18).contains(&v) {
        return 0;
    }
    // `f32::round` rounds half away from zero, as `lroundf` does.
    (v.round() as i64) as i32
}

/// The trit (0, 1, 2) of `v · id` for the TQ quantizers: `lroundf(v·id) + 1`.
#[inline(always)]
fn tq_trit(v: f32, id: f32) -> i32 {
    c_lround_low32(v * id).wrapping_add(1)
}

/// The largest |x| of a TQ block, by ggml's `MAX(amax, fabsf(v))` (a NaN
/// is replaced by the next value).
#[inline(always)]
fn tq_amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, &v| if m > v.abs() { m } else { v.abs() })
}

/// Packs 5 (or 4, then shifted by one trit) trits, most significant first,
/// as a fixed-point fraction of 3⁵ rounded up (ggml's TQ1_0 byte).
#[inline(always)]
fn tq1_pack(trits: impl Iterator<Item = i32>, shift: bool) -> u8 {
    let mut q = 0u8;
    for t in trits {
        q = q.wrapping_mul(3).wrapping_add(t as u8);
    }
    if shift {
        q = q.wrapping_mul(3);
    }
    (q as u32 * 256).div_ceil(243) as u8
}

/// `quantize_row_tq1_0_ref`.
pub(crate) fn quantize_tq1_0(x: &[f32], y: &mut [BlockTQ1_0]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let d = tq_amax(xb);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        // 32 bytes of 5 trits (elements m + 32·n), then 16 (m + 16·n), then 4 of 4.
        for m in 0..32 {
            yb.qs[m] = tq1_pack((0..5).map(|n| tq_trit(xb[m + 32 * n], id)), false);
        }
        for m in 0..16 {
            yb.qs[32 + m] = tq1_pack((0..5).map(|n| tq_trit(xb[160 + m + 16 * n], id)), false);
        }
        for j in 0..4 {
            yb.qh[j] = tq1_pack((0..4).map(|n| tq_trit(xb[240 + j + 4 * n], id)), true);
        }
    }
}

/// `quantize_row_tq2_0_ref`.
pub(crate) fn quantize_tq2_0(x: &[f32], y: &mut [BlockTQ2_0]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let d = tq_amax(xb);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        for c in 0..2 {
            for m in 0..32 {
                let mut q = 0u8;
                for n in 0..4 {
                    q = q.wrapping_add(((tq_trit(xb[128 * c + m + 32 * n], id) & 3) << (2 * n)) as u8);
                }
                yb.qs[32 * c + m] = q;
            }
        }
    }
}

/// `dequantize_row_q1_0`.
pub(crate) fn dequantize_q1_0(x: &[BlockQ1_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK1_0)) {
        let d = f16_le(b.d);
        for (j, o) in yb.iter_mut().enumerate() {
            *o = if (b.qs[j / 8] >> (j % 8)) & 1 != 0 { d } else { -d };
        }
    }
}

/// `dequantize_row_q2_0`.
pub(crate) fn dequantize_q2_0(x: &[BlockQ2_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK2_0)) {
        let d = f16_le(b.d);
        for (j, o) in yb.iter_mut().enumerate() {
            let q = (b.qs[j / 4] >> (2 * (j % 4))) & 3;
            *o = (q as i32 - 1) as f32 * d;
        }
    }
}

/// Trit `k` (0, 1 or 2) of a TQ1_0 byte: the byte is a fixed-point fraction
/// of 3⁵, so multiplying by 3ᵏ (mod 256) brings trit `k` to the top.
#[inline(always)]
pub(crate) fn tq1_trit(q: u8, k: usize) -> i32 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    ((q.wrapping_mul(POW3[k]) as u16 * 3) >> 8) as i32
}

/// The 256 trits (0, 1, 2; the weight is `d·(t − 1)`) of a TQ1_0 block in
/// element order: 32 bytes × 5 trits, 16 bytes × 5 trits, then 4 bytes × 4
/// trits.
pub(crate) fn tq1_values(b: &BlockTQ1_0) -> [u8; QK_K] {
    let mut t = [0u8; QK_K];
    let mut o = 0;
    for (start, width) in [(0usize, 32usize), (32, 16)] {
        for k in 0..5 {
            for &q in &b.qs[start..start + width] {
                t[o] = tq1_trit(q, k) as u8;
                o += 1;
            }
        }
    }
    for k in 0..4 {
        for &q in &b.qh {
            t[o] = tq1_trit(q, k) as u8;
            o += 1;
        }
    }
    t
}

/// `dequantize_row_tq1_0`.
pub(crate) fn dequantize_tq1_0(x: &[BlockTQ1_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (o, t) in yb.iter_mut().zip(tq1_values(b)) {
            *o = (t as i32 - 1) as f32 * d;
        }
    }
}

/// The 2-bit value (0..=3) of element `i` of a TQ2_0 block.
#[inline(always)]
pub(crate) fn tq2_value(b: &BlockTQ2_0, i: usize) -> u8 {
    let (c, l, m) = (i / 128, (i % 128) / 32, i % 32);
    (b.qs[32 * c + m] >> (2 * l)) & 3
}

/// `dequantize_row_tq2_0`.
pub(crate) fn dequantize_tq2_0(x: &[BlockTQ2_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (i, o) in yb.iter_mut().enumerate() {
            *o = (tq2_value(b, i) as i32 - 1) as f32 * d;
        }
    }
}
