//! The 4-bit float formats MXFP4 (OCP microscaling: E2M1 values with an E8M0
//! exponent per 32) and NVFP4 (E2M1 values with a UE4M3 scale per 16, in
//! blocks of 64): scale conversions, the reference quantizers bit-identical
//! to ggml 0.25.3's `quantize_row_mxfp4_ref` / `quantize_row_nvfp4_ref` and
//! the dequantizers (`dequantize_row_mxfp4` / `_nvfp4`, `ggml-quants.c`).
//!
//! Both store E2M1 codes through the table [`KVALUES_FP4`] of *doubled*
//! values (0, ±0.5, …, ±6 become 0, ±1, …, ±12), so the scales are halved to
//! match: E8M0 `e` means `2^(e − 128)`, UE4M3 `s` means `s / 2`.
//!
//! Every function takes `y.len() == QK · x.len()` (or the reverse); `quant/mod.rs` checks.

use super::blocks::*;
use super::grids::KVALUES_FP4;
use super::legacy::c_trunc_i32;

/// Half the value of an E8M0 exponent byte: `2^(e − 128)` as f32 bits
/// (ggml's `ggml_e8m0_to_fp32_half`; e = 0 and 1 are f32 subnormals).
#[inline(always)]
pub(crate) fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { ((e - 1) as u32) << 23 };
    f32::from_bits(bits)
}

/// Half the value of a UE4M3 scale byte (ggml's `ggml_ue4m3_to_fp32`: 4
/// exponent bits with bias 7, 3 mantissa bits; bit 7 is ignored; 0 and 0x7F
/// are zero).
#[inline(always)]
pub(crate) fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let (exp, man) = ((x >> 3) & 0xf, x & 7);
    let raw = if exp == 0 {
        // man · 2⁻⁹, exact.
        man as f32 * (1.0 / 512.0)
    } else {
        (1.0 + man as f32 / 8.0) * f32::from_bits(((exp as u32) + 120) << 23)
    };
    raw * 0.5
}

/// A UE4M3 scale byte for `x` (ggml's `ggml_fp32_to_ue4m3`): 0 for
/// non-positive or NaN, saturating at 448, the mantissa rounded half up
/// on its fourth bit (not to even), subnormals as `(int)(x·2⁹ + 0.5)`.
pub(crate) fn f32_to_ue4m3(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let mut exp = ((bits >> 23) & 0xff) as i32 - 127 + 7;
    if exp <= 0 {
        let man = c_trunc_i32(x * 512.0 + 0.5).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7e;
    }
    let mut man = ((bits >> 20) & 7) as i32 + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7e;
        }
    }
    ((exp << 3) | man) as u8
}

/// The E2M1 code whose value times `e` is nearest to `x`, the first on
/// ties and 0 for NaN (ggml's `best_index_mxfp4`).
#[inline(always)]
fn best_fp4_index(x: f32, e: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (KVALUES_FP4[0] as f32 * e - x).abs();
    for (i, &k) in KVALUES_FP4.iter().enumerate().skip(1) {
        let err = (k as f32 * e - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// The largest |x| by `if (amax < fabsf(v)) amax = fabsf(v)` (NaN skipped).
#[inline(always)]
fn amax_of(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, &v| if m < v.abs() { v.abs() } else { m })
}

/// `quantize_row_mxfp4_ref`: the exponent is `floor(log2(amax)) − 2 + 127`
/// (so the largest |x| lands in E2M1's top binade), converted to a byte as
/// x86 C does (through a 32-bit truncation).
pub(crate) fn quantize_mxfp4(x: &[f32], y: &mut [BlockMXFP4]) {
    for (xb, yb) in x.chunks_exact(QK_MXFP4).zip(y.iter_mut()) {
        let amax = amax_of(xb);
        // `log2` is the C library's `log2f`, as in ggml.
        yb.e = if amax > 0.0 { c_trunc_i32(amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
        let d = e8m0_to_f32_half(yb.e);
        for j in 0..QK_MXFP4 / 2 {
            yb.qs[j] = best_fp4_index(xb[j], d) | (best_fp4_index(xb[j + QK_MXFP4 / 2], d) << 4);
        }
    }
}

/// `quantize_row_nvfp4_ref`: per 16 elements a UE4M3 scale of amax/6 (E2M1's
/// largest value is 6), then the nearest codes.
pub(crate) fn quantize_nvfp4(x: &[f32], y: &mut [BlockNVFP4]) {
    for (xb, yb) in x.chunks_exact(QK_NVFP4).zip(y.iter_mut()) {
        for (s, xs) in xb.chunks_exact(QK_NVFP4_SUB).enumerate() {
            let ue = f32_to_ue4m3(amax_of(xs) / 6.0);
            yb.d[s] = ue;
            let d = ue4m3_to_f32_half(ue);
            for j in 0..QK_NVFP4_SUB / 2 {
                let q = best_fp4_index(xs[j], d) | (best_fp4_index(xs[j + QK_NVFP4_SUB / 2], d) << 4);
                yb.qs[s * QK_NVFP4_SUB / 2 + j] = q;
            }
        }
    }
}

/// `dequantize_row_mxfp4`.
pub(crate) fn dequantize_mxfp4(x: &[BlockMXFP4], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_MXFP4)) {
        let d = e8m0_to_f32_half(b.e);
        for (j, &q) in b.qs.iter().enumerate() {
            yb[j] = KVALUES_FP4[(q & 0xf) as usize] as f32 * d;
            yb[j + QK_MXFP4 / 2] = KVALUES_FP4[(q >> 4) as usize] as f32 * d;
        }
    }
}

/// `dequantize_row_nvfp4`.
pub(crate) fn dequantize_nvfp4(x: &[BlockNVFP4], y: &mut [f32]) {
    for (b, yb) in x.iter().zip(y.chunks_exact_mut(QK_NVFP4)) {
        for (s, ys) in yb.chunks_exact_mut(QK_NVFP4_SUB).enumerate() {
            let d = ue4m3_to_f32_half(b.d[s]);
            let qs = &b.qs[s * QK_NVFP4_SUB / 2..(s + 1) * QK_NVFP4_SUB / 2];
            for (j, &q) in qs.iter().enumerate() {
                ys[j] = KVALUES_FP4[(q & 0xf) as usize] as f32 * d;
                ys[j + QK_NVFP4_SUB / 2] = KVALUES_FP4[(q >> 4) as usize] as f32 * d;
            }
        }
    }
}
