//! f32 ↔ f16 / bf16 conversions with ggml's exact bit results.
//!
//! * f32 → f16: round to nearest even (ggml's `ggml_compute_fp32_to_fp16`,
//!   the FP16 library algorithm). Finite values and infinities round exactly
//!   as IEEE does, which `half` implements; NaN becomes ggml's canonical quiet
//!   NaN `0x7E00` with the input's sign (payload dropped).
//! * f16 → f32: exact (`ggml_compute_fp16_to_fp32`); NaN payloads are kept
//!   and quieted.
//! * f32 → bf16: round to nearest even on the upper 16 bits; NaN keeps its
//!   upper bits and is forced quiet (`ggml_compute_fp32_to_bf16`).
//! * bf16 → f32: the 16 bits become the upper half of an f32.

use half::f16;

/// ggml's f32 → f16 bits (`GGML_FP32_TO_FP16`).
#[inline(always)]
pub fn fp32_to_fp16_bits(v: f32) -> u16 {
    if v.is_nan() {
        ((v.to_bits() >> 16) as u16 & 0x8000) | 0x7E00
    } else {
        f16::from_f32(v).to_bits()
    }
}

/// ggml's f16 bits → f32 (`GGML_FP16_TO_FP32`), exact; NaN payloads are
/// kept and quieted. Written out (instead of `half`'s runtime dispatch) so it
/// inlines into the per-block loops.
#[inline(always)]
pub fn fp16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    match exp {
        // Zero and subnormals: man · 2⁻²⁴, exact in f32.
        0 => f32::from_bits((man as f32 * (1.0 / 16_777_216.0)).to_bits() | sign),
        31 => f32::from_bits(sign | 0x7f80_0000 | (man << 13) | if man != 0 { 0x0040_0000 } else { 0 }),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// ggml's f32 → bf16 bits (`ggml_compute_fp32_to_bf16`): round to nearest
/// even, NaN forced quiet.
#[inline(always)]
pub fn fp32_to_bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// bf16 bits → f32 (`GGML_BF16_TO_FP32`), exact.
#[inline(always)]
pub fn bf16_bits_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quant_fp16_special_values() {
        assert_eq!(fp32_to_fp16_bits(0.0), 0);
        assert_eq!(fp32_to_fp16_bits(-0.0), 0x8000);
        assert_eq!(fp32_to_fp16_bits(1.0), 0x3C00);
        assert_eq!(fp32_to_fp16_bits(65504.0), 0x7BFF);
        assert_eq!(fp32_to_fp16_bits(65520.0), 0x7C00);
        assert_eq!(fp32_to_fp16_bits(f32::INFINITY), 0x7C00);
        assert_eq!(fp32_to_fp16_bits(f32::NEG_INFINITY), 0xFC00);
        assert_eq!(fp32_to_fp16_bits(f32::NAN), 0x7E00);
        assert_eq!(fp32_to_fp16_bits(-f32::NAN), 0xFE00);
        // Ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
        assert_eq!(fp32_to_fp16_bits(1.0 + 2f32.powi(-11)), 0x3C00);
        assert_eq!(fp32_to_fp16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
        // Smallest subnormal and half of it (tie to even → 0).
        assert_eq!(fp32_to_fp16_bits(2f32.powi(-24)), 1);
        assert_eq!(fp32_to_fp16_bits(2f32.powi(-25)), 0);
        assert_eq!(fp16_bits_to_f32(0x3C00), 1.0);
        assert_eq!(fp16_bits_to_f32(1), 2f32.powi(-24));
    }

    #[test]
    fn quant_fp16_decode_matches_half_for_all_bits() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = fp16_bits_to_f32(h);
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }

    #[test]
    fn quant_bf16_rounding_and_nan() {
        assert_eq!(fp32_to_bf16_bits(1.0), 0x3F80);
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even → 1.
        assert_eq!(fp32_to_bf16_bits(1.0 + 2f32.powi(-8)), 0x3F80);
        assert_eq!(fp32_to_bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
        assert_eq!(fp32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(fp32_to_bf16_bits(f32::INFINITY), 0x7f80);
        assert_eq!(fp32_to_bf16_bits(f32::MAX), 0x7f80);
        assert_eq!(bf16_bits_to_f32(0x3F80), 1.0);
    }
}
