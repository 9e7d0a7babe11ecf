//! Random blocks of any quantized type for tests that need every bit
//! pattern a file may hold (not only what a quantizer writes): random
//! bytes with finite, moderate scales. The types ggml quantizes only with
//! an importance matrix (IQ2_XXS, IQ2_XS, IQ1_S) can only be tested this way.
#![allow(dead_code)]

use super::rng::Rng;
use shardgraph::tensor::quant::fp32_to_fp16_bits;
use shardgraph::GgmlType::{self, *};

/// Byte offsets of the f16 scales in one block of `ty` (ggml-common.h's
/// layouts; MXFP4, NVFP4 and IQ1_M keep theirs elsewhere, see
/// [`random_blocks`]).
pub fn f16_scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        MXFP4 | NVFP4 | IQ1_M => &[],
        _ => &[0],
    }
}

/// `nblocks` blocks of `ty` of random bytes whose scales are finite and
/// moderate (±0.001..0.101; an MXFP4 exponent in 110..140; NVFP4's UE4M3
/// scales stay random, all finite), every other bit random.
pub fn random_blocks(ty: GgmlType, nblocks: usize, r: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size();
    let mut bytes = r.bytes(nblocks * ts);
    let scale = |r: &mut Rng| {
        let v = (0.001 + r.unit().abs() * 0.1) * if r.next() & 1 == 0 { 1.0 } else { -1.0 };
        fp32_to_fp16_bits(v)
    };
    for b in bytes.chunks_exact_mut(ts) {
        for &o in f16_scale_offsets(ty) {
            b[o..o + 2].copy_from_slice(&scale(r).to_le_bytes());
        }
        match ty {
            IQ1_M => {
                // The f16 scale is spread over the top nibbles of the 4 u16 scales.
                let d = scale(r);
                for k in 0..4 {
                    let o = 48 + 2 * k + 1;
                    b[o] = (b[o] & 0x0f) | ((((d >> (4 * k)) & 0xf) as u8) << 4);
                }
            }
            MXFP4 => b[0] = 110 + (r.next() % 30) as u8,
            _ => {}
        }
    }
    bytes
}
