//! Scalar dot products of the formats ggml 0.15.3 lacked (IQ*, TQ*, MXFP4,
//! NVFP4, Q1_0, Q2_0) against their activation formats, the reference for
//! the SIMD kernels (`ggml_vec_dot_*_generic` in ggml 0.25.3's
//! `ggml-cpu/quants.c`).
//!
//! As in `dot.rs`, the integer products per group are exactly ggml's and the
//! scales are applied in f32 in ggml's order, so results equal ggml's up to
//! the order of float additions.

// The block layouts are index formulas; indexed loops state them most directly.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::dot::byte_entry;
use super::fp4::{e8m0_to_f32_half, ue4m3_to_f32_half};
use super::grids::{KVALUES_FP4, KVALUES_IQ4NL};
use super::iquants::*;
use super::lowbit::{tq1_values, tq2_value};

/// `Σ v[i]·q[i]` in i32.
#[inline(always)]
fn dot_i8(v: &[i8], q: &[i8]) -> i32 {
    v.iter().zip(q).map(|(&a, &b)| a as i32 * b as i32).sum()
}

/// `Σ table[nibble]·q` over the 32 elements of a Q4_0-ordered nibble block
/// (element `j` in the low nibble of byte `j`, `j + 16` in the high one).
#[inline(always)]
fn dot_nibbles(qs: &[u8], q: &[i8], table: &[i8; 16]) -> i32 {
    let half = qs.len();
    let mut s = 0i32;
    for j in 0..half {
        s += q[j] as i32 * table[(qs[j] & 0xf) as usize] as i32;
        s += q[j + half] as i32 * table[(qs[j] >> 4) as usize] as i32;
    }
    s
}

/// `ggml_vec_dot_q1_0_q8_0`: a Q1_0 block spans four Q8_0 blocks.
pub(crate) fn q1_0_q8_0(x: &[BlockQ1_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (a, ys) in x.iter().zip(y.chunks_exact(4)) {
        let mut sumi = 0f32;
        for (k, b) in ys.iter().enumerate() {
            let mut s = 0i32;
            for (j, &q) in b.qs.iter().enumerate() {
                let bit = (a.qs[4 * k + j / 8] >> (j % 8)) & 1;
                s += if bit != 0 { q as i32 } else { -(q as i32) };
            }
            sumi += f16_le(b.d) * s as f32;
        }
        sumf += f16_le(a.d) * sumi;
    }
    sumf
}

/// `ggml_vec_dot_q2_0_q8_0`: a Q2_0 block spans two Q8_0 blocks.
pub(crate) fn q2_0_q8_0(x: &[BlockQ2_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (a, ys) in x.iter().zip(y.chunks_exact(2)) {
        let mut sumi = 0f32;
        for (k, b) in ys.iter().enumerate() {
            let mut s = 0i32;
            for (j, &q) in b.qs.iter().enumerate() {
                let v = (a.qs[8 * k + j / 4] >> (2 * (j % 4))) & 3;
                s += (v as i32 - 1) * q as i32;
            }
            sumi += f16_le(b.d) * s as f32;
        }
        sumf += f16_le(a.d) * sumi;
    }
    sumf
}

/// `ggml_vec_dot_mxfp4_q8_0`.
pub(crate) fn mxfp4_q8_0(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let d = f16_le(b.d) * e8m0_to_f32_half(a.e);
        sumf += d * dot_nibbles(&a.qs, &b.qs, &KVALUES_FP4) as f32;
    }
    sumf
}

/// `ggml_vec_dot_nvfp4_q8_0`: a block's four 16-element sub-blocks span
/// two Q8_0 blocks.
pub(crate) fn nvfp4_q8_0(x: &[BlockNVFP4], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (a, ys) in x.iter().zip(y.chunks_exact(2)) {
        for s in 0..4 {
            let b = &ys[s / 2];
            let q = &b.qs[16 * (s % 2)..16 * (s % 2) + 16];
            let sumi = dot_nibbles(&a.qs[8 * s..8 * s + 8], q, &KVALUES_FP4);
            sumf += f16_le(b.d) * ue4m3_to_f32_half(a.d[s]) * sumi as f32;
        }
    }
    sumf
}

/// `ggml_vec_dot_iq4_nl_q8_0`.
pub(crate) fn iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let d = f16_le(b.d) * f16_le(a.d);
        sumf += d * dot_nibbles(&a.qs, &b.qs, &KVALUES_IQ4NL) as f32;
    }
    sumf
}

/// `ggml_vec_dot_iq4_xs_q8_K`.
pub(crate) fn iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let d4d8 = f16_le(a.d) * b.scale();
        for g in 0..QK_K / 32 {
            let dl = d4d8 * (iq4xs_scale(a, g) - 32) as f32;
            let sumi = dot_nibbles(&a.qs[16 * g..16 * g + 16], &b.qs[32 * g..32 * g + 32], &KVALUES_IQ4NL);
            sumf += dl * sumi as f32;
        }
    }
    sumf
}

/// `ggml_vec_dot_tq1_0_q8_K`.
pub(crate) fn tq1_0_q8_k(x: &[BlockTQ1_0], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let t = tq1_values(a);
        let sum: i32 = t.iter().zip(&b.qs).map(|(&t, &q)| (t as i32 - 1) * q as i32).sum();
        sumf += sum as f32 * (f16_le(a.d) * b.scale());
    }
    sumf
}

/// `ggml_vec_dot_tq2_0_q8_K`.
pub(crate) fn tq2_0_q8_k(x: &[BlockTQ2_0], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let sum: i32 = (0..QK_K).map(|i| (tq2_value(a, i) as i32 - 1) * b.qs[i] as i32).sum();
        sumf += sum as f32 * (b.scale() * f16_le(a.d));
    }
    sumf
}

/// `Σ_g (2·sc[g] + 1) · Σ_{i in g} v[i]·q[i]` over groups of `v.len() / sc.len()`.
#[inline(always)]
fn scaled_group_sum(v: &[i8; QK_K], sc: &[u8], q: &[i8; QK_K]) -> i32 {
    let w = QK_K / sc.len();
    sc.iter().enumerate().map(|(g, &s)| (2 * s as i32 + 1) * dot_i8(&v[w * g..w * g + w], &q[w * g..w * g + w])).sum()
}

/// `ggml_vec_dot_iq2_xxs_q8_K`.
pub(crate) fn iq2_xxs_q8_k(x: &[BlockIQ2XXS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (v, sc) = iq2xxs_values(a);
        sumf += f16_le(a.d) * b.scale() * scaled_group_sum(&v, &sc, &b.qs) as f32;
    }
    0.125 * sumf
}

/// `ggml_vec_dot_iq2_xs_q8_K`.
pub(crate) fn iq2_xs_q8_k(x: &[BlockIQ2XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (v, sc) = iq2xs_values(a);
        sumf += f16_le(a.d) * b.scale() * scaled_group_sum(&v, &sc, &b.qs) as f32;
    }
    0.125 * sumf
}

/// `ggml_vec_dot_iq2_s_q8_K`.
pub(crate) fn iq2_s_q8_k(x: &[BlockIQ2S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (v, sc) = iq2s_values(a);
        sumf += f16_le(a.d) * b.scale() * scaled_group_sum(&v, &sc, &b.qs) as f32;
    }
    0.125 * sumf
}

/// `ggml_vec_dot_iq3_xxs_q8_K`.
pub(crate) fn iq3_xxs_q8_k(x: &[BlockIQ3XXS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (v, sc) = iq3xxs_values(a);
        sumf += f16_le(a.d) * b.scale() * scaled_group_sum(&v, &sc, &b.qs) as f32;
    }
    0.25 * sumf
}

/// `ggml_vec_dot_iq3_s_q8_K`.
pub(crate) fn iq3_s_q8_k(x: &[BlockIQ3S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (v, sc) = iq3s_values(a);
        sumf += f16_le(a.d) * b.scale() * scaled_group_sum(&v, &sc, &b.qs) as f32;
    }
    sumf
}

/// `ggml_vec_dot_iq1_s_q8_K`: the ±1/8 shifts go through the Q8_K block sums.
pub(crate) fn iq1_s_q8_k(x: &[BlockIQ1S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let (v, sc, neg) = iq1s_values(a);
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for g in 0..QK_K / 32 {
            let ls = 2 * sc[g] as i32 + 1;
            sumi += ls * dot_i8(&v[32 * g..32 * g + 32], &b.qs[32 * g..32 * g + 32]);
            let delta = if neg[g] { -1 } else { 1 };
            sumi1 += ls * delta * (b.bsum(2 * g) as i32 + b.bsum(2 * g + 1) as i32);
        }
        sumf += f16_le(a.d) * b.scale() * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
    }
    sumf
}

/// `ggml_vec_dot_iq1_m_q8_K`.
pub(crate) fn iq1_m_q8_k(x: &[BlockIQ1M], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0f32;
    for (a, b) in x.iter().zip(y) {
        let m = iq1m_values(a);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for k in 0..QK_K / 8 {
            let q = &b.qs[8 * k..8 * k + 8];
            let ls = 2 * m.sc[k / 2] as i32 + 1;
            let qsum: i32 = q.iter().map(|&v| v as i32).sum();
            sumi1 += ls * dot_i8(&m.v[8 * k..8 * k + 8], q);
            sumi2 += ls * if m.neg[k] { -qsum } else { qsum };
        }
        let d = super::float::fp16_bits_to_f32(m.d_bits);
        sumf += d * b.scale() * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
    }
    sumf
}

byte_entry!(q1_0_row, q1_0_q8_0, BlockQ1_0, BlockQ8_0);
byte_entry!(q2_0_row, q2_0_q8_0, BlockQ2_0, BlockQ8_0);
byte_entry!(mxfp4_row, mxfp4_q8_0, BlockMXFP4, BlockQ8_0);
byte_entry!(nvfp4_row, nvfp4_q8_0, BlockNVFP4, BlockQ8_0);
byte_entry!(iq4_nl_row, iq4_nl_q8_0, BlockIQ4NL, BlockQ8_0);
byte_entry!(iq4_xs_row, iq4_xs_q8_k, BlockIQ4XS, BlockQ8K);
byte_entry!(tq1_0_row, tq1_0_q8_k, BlockTQ1_0, BlockQ8K);
byte_entry!(tq2_0_row, tq2_0_q8_k, BlockTQ2_0, BlockQ8K);
byte_entry!(iq2_xxs_row, iq2_xxs_q8_k, BlockIQ2XXS, BlockQ8K);
byte_entry!(iq2_xs_row, iq2_xs_q8_k, BlockIQ2XS, BlockQ8K);
byte_entry!(iq2_s_row, iq2_s_q8_k, BlockIQ2S, BlockQ8K);
byte_entry!(iq3_xxs_row, iq3_xxs_q8_k, BlockIQ3XXS, BlockQ8K);
byte_entry!(iq3_s_row, iq3_s_q8_k, BlockIQ3S, BlockQ8K);
byte_entry!(iq1_s_row, iq1_s_q8_k, BlockIQ1S, BlockQ8K);
byte_entry!(iq1_m_row, iq1_m_q8_k, BlockIQ1M, BlockQ8K);
