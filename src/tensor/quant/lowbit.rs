//! The 1- and 2-bit formats Q1_0 (signs, 128 per block), Q2_0 (2 bits, 64
//! per block) and the ternary TQ1_0 (base-3 packing) and TQ2_0 (2 bits), the
//! last two in 256-element blocks: reference quantizers bit-identical to
//! ggml 0.25.3's `quantize_row_*_ref` and dequantizers bit-identical to
//! `dequantize_row_*` (`ggml-quants.c`).
//!
//! Every function takes `y.len() == QK · x.len()` (or the reverse); `quant/mod.rs` checks.

use super::blocks::*;

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
