//! The 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1: reference
//! quantizers bit-identical to ggml's `quantize_row_*_ref` and dequantizers
//! bit-identical to `dequantize_row_*` (`ggml-quants.c`).
//!
//! Every function takes `x.len() == QK · y.len()`; the public API in
//! `quant/mod.rs` checks lengths before calling in.
//!
//! Float → integer conversions follow what ggml's C compiles to on x86
//! (`cvttss2si`/`cvttps2dq`, then keep the low byte), see [`c_trunc_i32`], so
//! even NaN and infinite inputs encode to the same bytes.

use super::blocks::*;

/// C's `(int)v` as x86 executes it: truncation toward zero, and `i32::MIN`
/// (the "integer indefinite" value) for NaN or out-of-range inputs. Rust's
/// `as` saturates instead, which differs for ±∞ and huge values.
#[inline(always)]
pub(crate) fn c_trunc_i32(v: f32) -> i32 {
    // NaN is outside every range too.
    if !(-2147483648.0..2147483648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

/// C's `(int)roundf(v)` as x86 executes it: round half away from zero, then
/// [`c_trunc_i32`]'s conversion. Written without `f32::round` (a libm call on
/// baseline x86_64) so the Q8 quantizers stay fast.
#[inline(always)]
pub(crate) fn c_round_i32(v: f32) -> i32 {
    if !(-2147483648.0..2147483648.0).contains(&v) {
        return i32::MIN;
    }
    let t = v as i32;
    // Exact: for |v| < 2^24 `t as f32` is exact, and above that v is an integer.
    let frac = v - t as f32;
    // Branch-free: the comparisons are data-dependent coin flips.
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

/// Index and value of the element with the largest |x|, first one on ties,
/// as ggml's `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` loops.
#[inline(always)]
fn abs_max_signed(x: &[f32]) -> (f32, f32) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// `quantize_row_q4_0_ref`.
pub(crate) fn quantize_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    for (xb, yb) in x.chunks_exact(QK4_0).zip(y.iter_mut()) {
        let (_, max) = abs_max_signed(xb);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        for j in 0..QK4_0 / 2 {
            let q0 = (c_trunc_i32(xb[j] * id + 8.5) as i8 as i32).min(15) as u8;
            let q1 = (c_trunc_i32(xb[j + QK4_0 / 2] * id + 8.5) as i8 as i32).min(15) as u8;
            yb.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// `quantize_row_q4_1_ref`.
pub(crate) fn quantize_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    for (xb, yb) in x.chunks_exact(QK4_1).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        yb.m = f16_bytes(min);
        for j in 0..QK4_1 / 2 {
            let q0 = (c_trunc_i32((xb[j] - min) * id + 0.5) as i8 as i32).min(15) as u8;
            let q1 = (c_trunc_i32((xb[j + QK4_1 / 2] - min) * id + 0.5) as i8 as i32).min(15) as u8;
            yb.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// `min`/`max` of a block the way ggml's Q4_1/Q5_1 loops find them
/// (starting from ±FLT_MAX, NaN never taken).
#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `quantize_row_q5_0_ref`.
pub(crate) fn quantize_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    for (xb, yb) in x.chunks_exact(QK5_0).zip(y.iter_mut()) {
        let (_, max) = abs_max_signed(xb);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        let mut qh = 0u32;
        for j in 0..QK5_0 / 2 {
            let q0 = (c_trunc_i32(xb[j] * id + 16.5) as i8 as i32).min(31) as u8;
            let q1 = (c_trunc_i32(xb[j + QK5_0 / 2] * id + 16.5) as i8 as i32).min(31) as u8;
            yb.qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= (((q0 & 0x10) >> 4) as u32) << j;
            qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK5_0 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// `quantize_row_q5_1_ref`.
pub(crate) fn quantize_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    for (xb, yb) in x.chunks_exact(QK5_1).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        yb.m = f16_bytes(min);
        let mut qh = 0u32;
        for j in 0..QK5_1 / 2 {
            // ggml has no upper clamp here: `(uint8_t)(x0 + 0.5f)`.
            let q0 = c_trunc_i32((xb[j] - min) * id + 0.5) as u8;
            let q1 = c_trunc_i32((xb[j + QK5_1 / 2] - min) * id + 0.5) as u8;
            yb.qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
            qh |= (((q0 & 0x10) >> 4) as u32) << j;
            qh |= (((q1 & 0x10) >> 4) as u32) << (j + QK5_1 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// Largest |x| of a block as ggml's `amax = MAX(amax, fabsf(v))` loop finds
/// it (C's `MAX(a, b)` is `a > b ? a : b`, which also fixes how NaN behaves).
#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    for &v in x {
        // MAX(a, b) is `a > b ? a : b`.
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    amax
}

/// `quantize_row_q8_0_ref`.
pub(crate) fn quantize_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = abs_max(xb);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = c_round_i32(v * id) as i8;
        }
    }
}

/// `quantize_row_q8_1_ref`.
pub(crate) fn quantize_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(QK8_1).zip(y.iter_mut()) {
        let amax = abs_max(xb);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16_bytes(d);
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = c_round_i32(v * id) as i8;
            sum += *q as i32;
        }
        yb.s = f16_bytes(sum as f32 * d);
    }
}

/// `dequantize_row_q4_0`.
pub(crate) fn dequantize_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = f16_le(b.d);
        for j in 0..QK4_0 / 2 {
            yb[j] = ((b.qs[j] & 0x0F) as i32 - 8) as f32 * d;
            yb[j + QK4_0 / 2] = ((b.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// `dequantize_row_q4_1`.
pub(crate) fn dequantize_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let d = f16_le(b.d);
        let m = f16_le(b.m);
        for j in 0..QK4_1 / 2 {
            yb[j] = (b.qs[j] & 0x0F) as f32 * d + m;
            yb[j + QK4_1 / 2] = (b.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// The 5-bit values of a Q5 block (before any offset), in element order.
#[inline(always)]
pub(crate) fn q5_values(qs: &[u8; 16], qh: [u8; 4]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut v = [0u8; 32];
    for j in 0..16 {
        v[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        v[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    v
}

/// `dequantize_row_q5_0`.
pub(crate) fn dequantize_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = f16_le(b.d);
        for (o, q) in yb.iter_mut().zip(q5_values(&b.qs, b.qh)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// `dequantize_row_q5_1`.
pub(crate) fn dequantize_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK5_1)) {
        let d = f16_le(b.d);
        let m = f16_le(b.m);
        for (o, q) in yb.iter_mut().zip(q5_values(&b.qs, b.qh)) {
            *o = q as f32 * d + m;
        }
    }
}

/// `dequantize_row_q8_0`.
pub(crate) fn dequantize_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = f16_le(b.d);
        for (o, &q) in yb.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Q8_1 → f32 as `d·q` (ggml defines no `dequantize_row_q8_1`; `s` is
/// redundant with the quants and ignored).
pub(crate) fn dequantize_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK8_1)) {
        let d = f16_le(b.d);
        for (o, &q) in yb.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quant_c_round_matches_roundf_then_truncation() {
        let mut vals =
            vec![0.5f32, -0.5, 1.5, -1.5, 2.5, 0.49999997, -0.49999997, 126.5, -127.5, 8388607.5, -8388607.5];
        vals.extend([16777217.0, 2147483520.0, -2147483648.0, 2147483648.0, f32::INFINITY, f32::NAN, 1e30, -1e30]);
        let mut st = 0x243F_6A88_85A3_08D3u64;
        for _ in 0..100_000 {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            vals.push(f32::from_bits(st as u32));
            vals.push(((st >> 32) as u32 as f32 / 4096.0) - 524288.0);
        }
        for v in vals {
            assert_eq!(c_round_i32(v), c_trunc_i32(v.round()), "{v:e}");
        }
    }
}
