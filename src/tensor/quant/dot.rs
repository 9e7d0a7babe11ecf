//! Dot products of a weight row with an activation row, the kernels of
//! ggml's `mul_mat` (`ggml_vec_dot_*` in `ggml-cpu/quants.c` and
//! `ggml-cpu/vec.c`).
//!
//! The quantized kernels compute the same integer products per block as
//! ggml (exact) and combine them with the block scales in f32, so results
//! equal ggml's up to the order of float additions. The scalar kernels here
//! are the reference; `simd/` holds faster ones chosen at run time, tested
//! against these.

// The block layouts are index formulas (element 128·c + 32·k + l, …);
// indexed loops state them most directly.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::float::{bf16_bits_to_f32, fp16_bits_to_f32};
use super::kquants::q6k_values;
use super::legacy::q5_values;

/// Casts the first `n / B::QK` blocks of `bytes`, or `None` if `n` is not a
/// whole number of blocks or `bytes` is too short.
#[inline(always)]
pub(crate) fn blocks_for<B: Block>(n: usize, bytes: &[u8]) -> Option<&[B]> {
    if n % B::QK != 0 {
        return None;
    }
    let len = (n / B::QK).checked_mul(std::mem::size_of::<B>())?;
    bytes.get(..len).map(bytemuck::cast_slice)
}

/// Reads `n` little-endian 16-bit words, or `None` if `bytes` is too short.
#[inline(always)]
fn words(n: usize, bytes: &[u8]) -> Option<&[[u8; 2]]> {
    bytes.get(..n.checked_mul(2)?).map(bytemuck::cast_slice)
}

/// Reads `n` little-endian f32, or `None` if `bytes` is too short.
#[inline(always)]
fn f32s(n: usize, bytes: &[u8]) -> Option<&[[u8; 4]]> {
    bytes.get(..n.checked_mul(4)?).map(bytemuck::cast_slice)
}

/// Turns a kernel over block slices into a [`super::VecDotFn`]-shaped
/// function that validates lengths (NaN on a mismatch: a `fn` pointer can
/// not return an error, and must not panic).
macro_rules! byte_entry {
    ($name:ident, $kernel:path, $bx:ty, $by:ty) => {
        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            match (
                crate::tensor::quant::dot::blocks_for::<$bx>(n, x),
                crate::tensor::quant::dot::blocks_for::<$by>(n, y),
            ) {
                (Some(x), Some(y)) => $kernel(x, y),
                _ => f32::NAN,
            }
        }
    };
}
pub(crate) use byte_entry;

/// `ggml_vec_dot_q4_0_q8_0`.
pub(crate) fn q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += ((a.qs[j] & 0xF) as i32 - 8) * b.qs[j] as i32;
            sumi += ((a.qs[j] >> 4) as i32 - 8) * b.qs[j + 16] as i32;
        }
        sumf += sumi as f32 * f16_le(a.d) * f16_le(b.d);
    }
    sumf
}

/// `ggml_vec_dot_q4_1_q8_1`.
pub(crate) fn q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += (a.qs[j] & 0xF) as i32 * b.qs[j] as i32;
            sumi += (a.qs[j] >> 4) as i32 * b.qs[j + 16] as i32;
        }
        sumf += f16_le(a.d) * f16_le(b.d) * sumi as f32 + f16_le(a.m) * f16_le(b.s);
    }
    sumf
}

/// `ggml_vec_dot_q5_0_q8_0`.
pub(crate) fn q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let v = q5_values(&a.qs, a.qh);
        let sumi: i32 = v.iter().zip(&b.qs).map(|(&q, &r)| (q as i32 - 16) * r as i32).sum();
        sumf += f16_le(a.d) * f16_le(b.d) * sumi as f32;
    }
    sumf
}

/// `ggml_vec_dot_q5_1_q8_1`.
pub(crate) fn q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let v = q5_values(&a.qs, a.qh);
        let sumi: i32 = v.iter().zip(&b.qs).map(|(&q, &r)| q as i32 * r as i32).sum();
        sumf += f16_le(a.d) * f16_le(b.d) * sumi as f32 + f16_le(a.m) * f16_le(b.s);
    }
    sumf
}

/// `ggml_vec_dot_q8_0_q8_0`.
pub(crate) fn q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let sumi: i32 = a.qs.iter().zip(&b.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sumf += sumi as f32 * (f16_le(a.d) * f16_le(b.d));
    }
    sumf
}

/// `Σ_j bsums[j] · mins[j / 2]` of a Q8_K block against Q4_K/Q5_K mins.
#[inline(always)]
fn bsum_mins(b: &BlockQ8K, mins: &[u8; 8]) -> i32 {
    (0..QK_K / 16).map(|j| b.bsum(j) as i32 * mins[j / 2] as i32).sum()
}

/// The 8 six-bit scales and mins of a Q4_K/Q5_K block.
#[inline(always)]
pub(crate) fn scales_mins_k4(s: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, s);
    }
    (sc, mn)
}

/// `ggml_vec_dot_q2_K_q8_K`.
pub(crate) fn q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let summs: i32 = (0..16).map(|j| b.bsum(j) as i32 * (a.scales[j] >> 4) as i32).sum();
        let dall = b.scale() * f16_le(a.d);
        let dmin = b.scale() * f16_le(a.dmin);
        let mut isum = 0i32;
        for c in 0..QK_K / 128 {
            let q2 = &a.qs[32 * c..32 * c + 32];
            for (k, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
                for half in 0..2 {
                    let g = 8 * c + 2 * k + half;
                    let q8 = &b.qs[16 * g..16 * g + 16];
                    let s: i32 = q2[16 * half..16 * half + 16]
                        .iter()
                        .zip(q8)
                        .map(|(&q, &r)| ((q >> shift) & 3) as i32 * r as i32)
                        .sum();
                    isum += (a.scales[g] & 0xF) as i32 * s;
                }
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// `ggml_vec_dot_q3_K_q8_K`.
pub(crate) fn q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let scales = q3k_scales(&a.scales);
        let mut isum = 0i32;
        for c in 0..QK_K / 128 {
            let q3 = &a.qs[32 * c..32 * c + 32];
            for (k, shift) in [0u32, 2, 4, 6].into_iter().enumerate() {
                let m = 1u8 << (4 * c + k);
                for half in 0..2 {
                    let g = 8 * c + 2 * k + half;
                    let mut s = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        let v = ((q3[l] >> shift) & 3) as i32 - if a.hmask[l] & m != 0 { 0 } else { 4 };
                        s += v * b.qs[16 * g + l - 16 * half] as i32;
                    }
                    isum += scales[g] as i32 * s;
                }
            }
        }
        sumf += f16_le(a.d) * b.scale() * isum as f32;
    }
    sumf
}

/// `ggml_vec_dot_q4_K_q8_K`.
pub(crate) fn q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (sc, mn) = scales_mins_k4(&a.scales);
        let mut isum = 0i32;
        for c in 0..QK_K / 64 {
            let q4 = &a.qs[32 * c..32 * c + 32];
            let (lo, hi) = (&b.qs[64 * c..64 * c + 32], &b.qs[64 * c + 32..64 * c + 64]);
            let s1: i32 = q4.iter().zip(lo).map(|(&q, &r)| (q & 0xF) as i32 * r as i32).sum();
            let s2: i32 = q4.iter().zip(hi).map(|(&q, &r)| (q >> 4) as i32 * r as i32).sum();
            isum += sc[2 * c] as i32 * s1 + sc[2 * c + 1] as i32 * s2;
        }
        let d = f16_le(a.d) * b.scale();
        let dmin = f16_le(a.dmin) * b.scale();
        sumf += d * isum as f32 - dmin * bsum_mins(b, &mn) as f32;
    }
    sumf
}

/// `ggml_vec_dot_q5_K_q8_K`.
pub(crate) fn q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (sc, mn) = scales_mins_k4(&a.scales);
        let mut isum = 0i32;
        for c in 0..QK_K / 64 {
            let q4 = &a.qs[32 * c..32 * c + 32];
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            let (mut s1, mut s2) = (0i32, 0i32);
            for l in 0..32 {
                let v1 = (q4[l] & 0xF) as i32 + if a.qh[l] & u1 != 0 { 16 } else { 0 };
                let v2 = (q4[l] >> 4) as i32 + if a.qh[l] & u2 != 0 { 16 } else { 0 };
                s1 += v1 * b.qs[64 * c + l] as i32;
                s2 += v2 * b.qs[64 * c + 32 + l] as i32;
            }
            isum += sc[2 * c] as i32 * s1 + sc[2 * c + 1] as i32 * s2;
        }
        let d = f16_le(a.d) * b.scale();
        let dmin = f16_le(a.dmin) * b.scale();
        sumf += d * isum as f32 - dmin * bsum_mins(b, &mn) as f32;
    }
    sumf
}

/// `ggml_vec_dot_q6_K_q8_K`.
pub(crate) fn q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let v = q6k_values(a);
        let mut isum = 0i32;
        for g in 0..QK_K / 16 {
            let s: i32 =
                v[16 * g..16 * g + 16].iter().zip(&b.qs[16 * g..16 * g + 16]).map(|(&q, &r)| q as i32 * r as i32).sum();
            isum += a.scales[g] as i32 * s;
        }
        sumf += f16_le(a.d) * b.scale() * isum as f32;
    }
    sumf
}

byte_entry!(q4_0_row, q4_0_q8_0, BlockQ4_0, BlockQ8_0);
byte_entry!(q4_1_row, q4_1_q8_1, BlockQ4_1, BlockQ8_1);
byte_entry!(q5_0_row, q5_0_q8_0, BlockQ5_0, BlockQ8_0);
byte_entry!(q5_1_row, q5_1_q8_1, BlockQ5_1, BlockQ8_1);
byte_entry!(q8_0_row, q8_0_q8_0, BlockQ8_0, BlockQ8_0);
byte_entry!(q2_k_row, q2_k_q8_k, BlockQ2K, BlockQ8K);
byte_entry!(q3_k_row, q3_k_q8_k, BlockQ3K, BlockQ8K);
byte_entry!(q4_k_row, q4_k_q8_k, BlockQ4K, BlockQ8K);
byte_entry!(q5_k_row, q5_k_q8_k, BlockQ5K, BlockQ8K);
byte_entry!(q6_k_row, q6_k_q8_k, BlockQ6K, BlockQ8K);

/// `ggml_vec_dot_f32` (scalar form: products accumulated in f64, as
/// ggml's generic path does with `ggml_float`).
pub(crate) fn f32_row(n: usize, x: &[u8], y: &[u8]) -> f32 {
    match (f32s(n, x), f32s(n, y)) {
        (Some(x), Some(y)) => {
            x.iter().zip(y).map(|(&a, &b)| (f32::from_le_bytes(a) * f32::from_le_bytes(b)) as f64).sum::<f64>() as f32
        }
        _ => f32::NAN,
    }
}

/// `ggml_vec_dot_f16` (scalar form, f64 accumulation).
pub(crate) fn f16_row(n: usize, x: &[u8], y: &[u8]) -> f32 {
    match (words(n, x), words(n, y)) {
        (Some(x), Some(y)) => x
            .iter()
            .zip(y)
            .map(|(&a, &b)| (fp16_bits_to_f32(u16::from_le_bytes(a)) * fp16_bits_to_f32(u16::from_le_bytes(b))) as f64)
            .sum::<f64>() as f32,
        _ => f32::NAN,
    }
}

/// `ggml_vec_dot_bf16` (scalar form, f64 accumulation).
pub(crate) fn bf16_row(n: usize, x: &[u8], y: &[u8]) -> f32 {
    match (words(n, x), words(n, y)) {
        (Some(x), Some(y)) => x
            .iter()
            .zip(y)
            .map(|(&a, &b)| (bf16_bits_to_f32(u16::from_le_bytes(a)) * bf16_bits_to_f32(u16::from_le_bytes(b))) as f64)
            .sum::<f64>() as f32,
        _ => f32::NAN,
    }
}
