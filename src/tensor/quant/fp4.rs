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
