//! The IQ formats (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
//! IQ4_NL, IQ4_XS): block decoding and dequantizers bit-identical to ggml
//! 0.25.3's `dequantize_row_iq*` (`ggml-quants.c`).
//!
//! The codebook formats are decoded in two steps that the dequantizers and
//! the dot products share: a block becomes its 256 signed integer grid
//! values (`*_values`, exactly the integers ggml multiplies) plus its
//! integer group scales; then the dequantizer applies the float scales in
//! ggml's order, and the dot products (`dot_iq.rs`) sum integer products.
//!
//! Every function takes `y.len() == QK · x.len()`; `quant/mod.rs` checks.

// The block layouts are index formulas (group 32·g + 8·l + j, …); indexed
// loops state them most directly.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::grids::*;

/// ggml's `ksigns_iq2xs`: the 7 stored sign bits of 8 values plus an 8th
/// bit making the number of negative signs even.
pub(crate) const KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | (((i as u32).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
};

/// The ±1/8 shift of the IQ1 formats (`IQ1S_DELTA`, `IQ1M_DELTA`).
pub(crate) const IQ1_DELTA: f32 = 0.125;

/// Little-endian u16 at byte `i` of `b`.
#[inline(always)]
pub(crate) fn le16(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

/// Little-endian u32 at byte `i` of `b`.
#[inline(always)]
pub(crate) fn le32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Writes the 8 coordinates of grid point `g` into `out`, negated where bit
/// `j` of `signs` is set.
#[inline(always)]
fn put_signed8(out: &mut [i8], g: u64, signs: u8) {
    for (j, (o, c)) in out.iter_mut().zip(g.to_le_bytes()).enumerate() {
        *o = if signs & (1 << j) != 0 { -(c as i8) } else { c as i8 };
    }
}

/// Writes the 4 coordinates of grid point `g` into `out`, negated where bit
/// `j` of `signs` is set.
#[inline(always)]
fn put_signed4(out: &mut [i8], g: u32, signs: u8) {
    for (j, (o, c)) in out.iter_mut().zip(g.to_le_bytes()).enumerate() {
        *o = if signs & (1 << j) != 0 { -(c as i8) } else { c as i8 };
    }
}

/// IQ2_XXS: the 256 signed grid values and the 4-bit scale of each group of 32.
pub(crate) fn iq2xxs_values(b: &BlockIQ2XXS) -> ([i8; QK_K], [u8; 8]) {
    let mut v = [0i8; QK_K];
    let mut sc = [0u8; 8];
    for g in 0..8 {
        let (idx, aux) = (le32(&b.qs, 8 * g), le32(&b.qs, 8 * g + 4));
        sc[g] = (aux >> 28) as u8;
        for l in 0..4 {
            let point = IQ2XXS_GRID[((idx >> (8 * l)) & 255) as usize];
            put_signed8(&mut v[32 * g + 8 * l..], point, KSIGNS[((aux >> (7 * l)) & 127) as usize]);
        }
    }
    (v, sc)
}

/// IQ2_XS: the 256 signed grid values and the 4-bit scale of each group of 16.
pub(crate) fn iq2xs_values(b: &BlockIQ2XS) -> ([i8; QK_K], [u8; 16]) {
    let mut v = [0i8; QK_K];
    let mut sc = [0u8; 16];
    for g in 0..8 {
        sc[2 * g] = b.scales[g] & 0xf;
        sc[2 * g + 1] = b.scales[g] >> 4;
        for l in 0..4 {
            let q = le16(&b.qs, 2 * (4 * g + l));
            put_signed8(&mut v[32 * g + 8 * l..], IQ2XS_GRID[(q & 511) as usize], KSIGNS[(q >> 9) as usize]);
        }
    }
    (v, sc)
}

/// IQ2_S: the 256 signed grid values and the 4-bit scale of each group of 16.
pub(crate) fn iq2s_values(b: &BlockIQ2S) -> ([i8; QK_K], [u8; 16]) {
    let mut v = [0i8; QK_K];
    let mut sc = [0u8; 16];
    for g in 0..8 {
        sc[2 * g] = b.scales[g] & 0xf;
        sc[2 * g + 1] = b.scales[g] >> 4;
        for l in 0..4 {
            let idx = b.qs[4 * g + l] as usize | ((b.qh[g] as usize) << (8 - 2 * l) & 0x300);
            put_signed8(&mut v[32 * g + 8 * l..], IQ2S_GRID[idx], b.qs[QK_K / 8 + 4 * g + l]);
        }
    }
    (v, sc)
}

/// IQ3_XXS: the 256 signed grid values and the 4-bit scale of each group of 32.
pub(crate) fn iq3xxs_values(b: &BlockIQ3XXS) -> ([i8; QK_K], [u8; 8]) {
    let mut v = [0i8; QK_K];
    let mut sc = [0u8; 8];
    for g in 0..8 {
        let aux = le32(&b.qs, QK_K / 4 + 4 * g);
        sc[g] = (aux >> 28) as u8;
        for l in 0..4 {
            let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
            let o = 32 * g + 8 * l;
            put_signed4(&mut v[o..], IQ3XXS_GRID[b.qs[8 * g + 2 * l] as usize], signs);
            put_signed4(&mut v[o + 4..], IQ3XXS_GRID[b.qs[8 * g + 2 * l + 1] as usize], signs >> 4);
        }
    }
    (v, sc)
}

/// IQ3_S: the 256 signed grid values and the 4-bit scale of each group of 32.
pub(crate) fn iq3s_values(b: &BlockIQ3S) -> ([i8; QK_K], [u8; 8]) {
    let mut v = [0i8; QK_K];
    let mut sc = [0u8; 8];
    for g in 0..8 {
        sc[g] = (b.scales[g / 2] >> (4 * (g % 2))) & 0xf;
        let qh = b.qh[g] as usize;
        for l in 0..4 {
            let i1 = b.qs[8 * g + 2 * l] as usize | ((qh << (8 - 2 * l)) & 256);
            let i2 = b.qs[8 * g + 2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256);
            let signs = b.signs[4 * g + l];
            let o = 32 * g + 8 * l;
            put_signed4(&mut v[o..], IQ3S_GRID[i1], signs);
            put_signed4(&mut v[o + 4..], IQ3S_GRID[i2], signs >> 4);
        }
    }
    (v, sc)
}

/// IQ1_S: the 256 grid values (−1, 0, 1), the 3-bit scale of each group of
/// 32 and whether its shift is −1/8 (else +1/8).
pub(crate) fn iq1s_values(b: &BlockIQ1S) -> ([i8; QK_K], [u8; 8], [bool; 8]) {
    let mut v = [0i8; QK_K];
    let mut sc = [0u8; 8];
    let mut neg = [false; 8];
    for g in 0..8 {
        let qh = le16(&b.qh, 2 * g);
        sc[g] = ((qh >> 12) & 7) as u8;
        neg[g] = qh & 0x8000 != 0;
        for l in 0..4 {
            let idx = b.qs[4 * g + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
            put_signed8(&mut v[32 * g + 8 * l..], IQ1S_GRID[idx], 0);
        }
    }
    (v, sc, neg)
}

/// The decoded parts of an IQ1_M block.
pub(crate) struct Iq1m {
    /// The 256 grid values (−1, 0, 1).
    pub(crate) v: [i8; QK_K],
    /// The 3-bit scale of each group of 16.
    pub(crate) sc: [u8; 16],
    /// Per group of 8: the shift is −1/8 (else +1/8).
    pub(crate) neg: [bool; 32],
    /// The f16 super-block scale's bits, gathered from the scales' top nibbles.
    pub(crate) d_bits: u16,
}

/// IQ1_M: grid values, scales, shifts and super-block scale.
pub(crate) fn iq1m_values(b: &BlockIQ1M) -> Iq1m {
    let s = [le16(&b.scales, 0), le16(&b.scales, 2), le16(&b.scales, 4), le16(&b.scales, 6)];
    let d_bits = (s[0] >> 12) | ((s[1] >> 8) & 0x00f0) | ((s[2] >> 4) & 0x0f00) | (s[3] & 0xf000);
    let mut out = Iq1m { v: [0; QK_K], sc: [0; 16], neg: [false; 32], d_bits };
    for g in 0..8 {
        out.sc[2 * g] = ((s[g / 2] >> (6 * (g % 2))) & 7) as u8;
        out.sc[2 * g + 1] = ((s[g / 2] >> (6 * (g % 2) + 3)) & 7) as u8;
        for l in 0..4 {
            let qh = b.qh[2 * g + l / 2] as usize;
            let idx = b.qs[4 * g + l] as usize | ((qh << (8 - 4 * (l % 2))) & 0x700);
            out.neg[4 * g + l] = qh & (0x08 << (4 * (l % 2))) != 0;
            put_signed8(&mut out.v[32 * g + 8 * l..], IQ1S_GRID[idx], 0);
        }
    }
    out
}

/// `dequantize_row_iq2_xxs`.
pub(crate) fn dequantize_iq2_xxs(x: &[BlockIQ2XXS], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let (v, sc) = iq2xxs_values(b);
        for (g, (yg, vg)) in yb.chunks_exact_mut(32).zip(v.chunks_exact(32)).enumerate() {
            let db = d * (0.5 + sc[g] as f32) * 0.25;
            for (o, &q) in yg.iter_mut().zip(vg) {
                *o = db * q as f32;
            }
        }
    }
}

/// The dequantizer shared by IQ2_XS and IQ2_S (4-bit scales per 16).
fn dequantize_iq2_per16(d: f32, v: &[i8; QK_K], sc: &[u8; 16], y: &mut [f32]) {
    for (g, (yg, vg)) in y.chunks_exact_mut(16).zip(v.chunks_exact(16)).enumerate() {
        let db = d * (0.5 + sc[g] as f32) * 0.25;
        for (o, &q) in yg.iter_mut().zip(vg) {
            *o = db * q as f32;
        }
    }
}

/// `dequantize_row_iq2_xs`.
pub(crate) fn dequantize_iq2_xs(x: &[BlockIQ2XS], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (v, sc) = iq2xs_values(b);
        dequantize_iq2_per16(f16_le(b.d), &v, &sc, yb);
    }
}

/// `dequantize_row_iq2_s`.
pub(crate) fn dequantize_iq2_s(x: &[BlockIQ2S], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (v, sc) = iq2s_values(b);
        dequantize_iq2_per16(f16_le(b.d), &v, &sc, yb);
    }
}

/// `dequantize_row_iq3_xxs`.
pub(crate) fn dequantize_iq3_xxs(x: &[BlockIQ3XXS], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let (v, sc) = iq3xxs_values(b);
        for (g, (yg, vg)) in yb.chunks_exact_mut(32).zip(v.chunks_exact(32)).enumerate() {
            let db = d * (0.5 + sc[g] as f32) * 0.5;
            for (o, &q) in yg.iter_mut().zip(vg) {
                *o = db * q as f32;
            }
        }
    }
}

/// `dequantize_row_iq3_s`.
pub(crate) fn dequantize_iq3_s(x: &[BlockIQ3S], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let (v, sc) = iq3s_values(b);
        for (g, (yg, vg)) in yb.chunks_exact_mut(32).zip(v.chunks_exact(32)).enumerate() {
            let db = d * (1 + 2 * sc[g] as i32) as f32;
            for (o, &q) in yg.iter_mut().zip(vg) {
                *o = db * q as f32;
            }
        }
    }
}

/// `dequantize_row_iq1_s`.
pub(crate) fn dequantize_iq1_s(x: &[BlockIQ1S], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let (v, sc, neg) = iq1s_values(b);
        for (g, (yg, vg)) in yb.chunks_exact_mut(32).zip(v.chunks_exact(32)).enumerate() {
            let dl = d * (2 * sc[g] as i32 + 1) as f32;
            let delta = if neg[g] { -IQ1_DELTA } else { IQ1_DELTA };
            for (o, &q) in yg.iter_mut().zip(vg) {
                *o = dl * (q as f32 + delta);
            }
        }
    }
}

/// `dequantize_row_iq1_m`.
pub(crate) fn dequantize_iq1_m(x: &[BlockIQ1M], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let m = iq1m_values(b);
        let d = super::float::fp16_bits_to_f32(m.d_bits);
        for (k, (yk, vk)) in yb.chunks_exact_mut(8).zip(m.v.chunks_exact(8)).enumerate() {
            let dl = d * (2 * m.sc[k / 2] as i32 + 1) as f32;
            let delta = if m.neg[k] { -IQ1_DELTA } else { IQ1_DELTA };
            for (o, &q) in yk.iter_mut().zip(vk) {
                *o = dl * (q as f32 + delta);
            }
        }
    }
}

/// `dequantize_row_iq4_nl`.
pub(crate) fn dequantize_iq4_nl(x: &[BlockIQ4NL], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK4_NL)) {
        let d = f16_le(b.d);
        for j in 0..QK4_NL / 2 {
            yb[j] = d * KVALUES_IQ4NL[(b.qs[j] & 0xf) as usize] as f32;
            yb[j + QK4_NL / 2] = d * KVALUES_IQ4NL[(b.qs[j] >> 4) as usize] as f32;
        }
    }
}

/// The 6-bit scale (0..64, stored with a +32 offset) of group `g` of an IQ4_XS block.
#[inline(always)]
pub(crate) fn iq4xs_scale(b: &BlockIQ4XS, g: usize) -> i32 {
    let lo = (b.scales_l[g / 2] >> (4 * (g % 2))) & 0xf;
    let hi = (u16::from_le_bytes(b.scales_h) >> (2 * g)) & 3;
    (lo as u16 | (hi << 4)) as i32
}

/// `dequantize_row_iq4_xs`.
pub(crate) fn dequantize_iq4_xs(x: &[BlockIQ4XS], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (g, yg) in yb.chunks_exact_mut(32).enumerate() {
            let dl = d * (iq4xs_scale(b, g) - 32) as f32;
            let qs = &b.qs[16 * g..16 * g + 16];
            for j in 0..16 {
                yg[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as f32;
                yg[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grids' coordinates take only the documented values, and the
    /// compact codes the quantizers derive (coordinate ranks) are strictly
    /// increasing, as ggml's `kgrid_*` tables are: a corrupted or reordered
    /// entry breaks one of the two.
    #[test]
    fn quant_iq_grids_are_well_formed() {
        fn check(name: &str, points: &[u64], dims: usize, levels: &[i8], bits: u32) {
            let mut last = -1i64;
            for (k, &p) in points.iter().enumerate() {
                let mut code = 0i64;
                for i in 0..dims {
                    let c = (p >> (8 * i)) as u8 as i8;
                    let r = levels.iter().position(|&l| l == c).unwrap_or_else(|| panic!("{name}[{k}] coord {c}"));
                    code |= (r as i64) << (bits * i as u32);
                }
                assert!(code > last, "{name}[{k}] out of order");
                last = code;
            }
        }
        let widen = |g: &[u32]| g.iter().map(|&v| v as u64).collect::<Vec<_>>();
        check("iq2xxs", &IQ2XXS_GRID, 8, &[8, 25, 43], 2);
        check("iq2xs", &IQ2XS_GRID, 8, &[8, 25, 43], 2);
        check("iq2s", &IQ2S_GRID, 8, &[8, 25, 43], 2);
        check("iq1s", &IQ1S_GRID, 8, &[-1, 0, 1], 2);
        check("iq3xxs", &widen(&IQ3XXS_GRID), 4, &[4, 12, 20, 28, 36, 44, 52, 62], 3);
        check("iq3s", &widen(&IQ3S_GRID), 4, &[1, 3, 5, 7, 9, 11, 13, 15], 3);
        assert_eq!(KSIGNS[0], 0);
        assert_eq!(KSIGNS[1], 129);
        assert_eq!(KSIGNS[3], 3);
        assert_eq!(KSIGNS[127], 255);
    }
}
