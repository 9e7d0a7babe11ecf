//! AVX2 + FMA + F16C dot products of the formats real files use beyond the
//! k-quants: IQ4_NL, MXFP4 (against Q8_0), IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS,
//! IQ2_XS, IQ2_S, IQ1_S, IQ1_M and TQ2_0 (against Q8_K). Selected at run time like the
//! kernels in `avx2.rs`, whose entry points, loads and helpers they share
//! (same safety argument: the only precondition of the `unsafe fn`s is the
//! CPU features, and every load reads a fixed-size block field or a
//! bounds-checked slice of one).
//!
//! The 4-bit non-linear formats map their codes through a 16-byte table
//! (`pshufb`). The codebook formats assemble each group's 32 magnitudes from
//! grid entries (8 or 4 bytes each), turn each sign byte into eight ±1
//! bytes by a table and apply them to the activations (`psignb`), then
//! `maddubs` magnitudes × signed activations and `madd` with the group
//! scales. Integer sums are exact, so
//! results equal the scalar kernels (`dot_iq.rs`) up to the order of float
//! additions.

use super::super::blocks::*;
use super::super::dot::blocks_for;
use super::super::dot_iq;
use super::super::fp4::e8m0_to_f32_half;
use super::super::grids::*;
use super::super::iquants::{iq4xs_scale, le16, le32, IQ1_DELTA, KSIGNS};
use super::avx2::{available, dot_i8_i8, entry, f16, hsum_ps, load16, load32, load32_at, sum_blocks};
use crate::tensor::GgmlType;
use std::arch::x86_64::*;

/// The AVX2 kernel for weight type `ty` among the formats of this file.
pub(super) fn kernel(ty: GgmlType) -> Option<crate::tensor::quant::VecDotFn> {
    use GgmlType::*;
    Some(match ty {
        IQ4_NL => iq4_nl_row,
        MXFP4 => mxfp4_row,
        IQ4_XS => iq4_xs_row,
        IQ3_S => iq3_s_row,
        IQ3_XXS => iq3_xxs_row,
        IQ2_XXS => iq2_xxs_row,
        IQ2_XS => iq2_xs_row,
        IQ2_S => iq2_s_row,
        TQ2_0 => tq2_0_row,
        IQ1_S => iq1_s_row,
        IQ1_M => iq1_m_row,
        _ => return None,
    })
}

entry!(iq4_nl_row, iq4_nl_q8_0, dot_iq::iq4_nl_q8_0, BlockIQ4NL, BlockQ8_0);
entry!(mxfp4_row, mxfp4_q8_0, dot_iq::mxfp4_q8_0, BlockMXFP4, BlockQ8_0);
entry!(iq4_xs_row, iq4_xs_q8_k, dot_iq::iq4_xs_q8_k, BlockIQ4XS, BlockQ8K);
entry!(iq3_s_row, iq3_s_q8_k, dot_iq::iq3_s_q8_k, BlockIQ3S, BlockQ8K);
entry!(iq3_xxs_row, iq3_xxs_q8_k, dot_iq::iq3_xxs_q8_k, BlockIQ3XXS, BlockQ8K);
entry!(iq2_xxs_row, iq2_xxs_q8_k, dot_iq::iq2_xxs_q8_k, BlockIQ2XXS, BlockQ8K);
entry!(iq2_xs_row, iq2_xs_q8_k, dot_iq::iq2_xs_q8_k, BlockIQ2XS, BlockQ8K);
entry!(iq2_s_row, iq2_s_q8_k, dot_iq::iq2_s_q8_k, BlockIQ2S, BlockQ8K);
entry!(tq2_0_row, tq2_0_q8_k, dot_iq::tq2_0_q8_k, BlockTQ2_0, BlockQ8K);
entry!(iq1_s_row, iq1_s_q8_k, dot_iq::iq1_s_q8_k, BlockIQ1S, BlockQ8K);
entry!(iq1_m_row, iq1_m_q8_k, dot_iq::iq1_m_q8_k, BlockIQ1M, BlockQ8K);

// ---------------------------------------------------------------------------
// Helpers.

/// A 16-entry signed byte table in both 128-bit lanes, for `pshufb`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn table16(t: &[i8; 16]) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract); the
    // unaligned 16-byte load reads exactly the borrowed 16-byte table.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i)) }
}

/// The 32 table values of the nibble codes in `q` (16 bytes, Q4_0 order).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn lut_nibbles(table: __m256i, q: __m128i) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract);
    // register-only shifts, masks and shuffles, no memory access.
    unsafe {
        let m = _mm_set1_epi8(0x0f);
        let codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(q), m), _mm_and_si128(q, m));
        _mm256_shuffle_epi8(table, codes)
    }
}

/// Bytes `[off, off + 16)` of a slice that holds them.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn load16_at(a: &[u8], off: usize) -> __m128i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract); the
    // unaligned 16-byte load reads `s`, a bounds-checked 16-byte subslice (the fixed block
    // layouts keep the index in range).
    unsafe {
        let s = &a[off..off + 16];
        _mm_loadu_si128(s.as_ptr() as *const __m128i)
    }
}

/// Per sign byte, eight byte multipliers: 0xFF (−1) where the bit is set,
/// 1 elsewhere (for `psignb`).
const SIGN_BYTES: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            t[b] |= (if b & (1 << j) != 0 { 0xff } else { 0x01 }) << (8 * j);
            j += 1;
        }
        b += 1;
    }
    t
};

/// 16 i16 pair sums of unsigned magnitudes `g` (≤ 127) times the
/// activations `q8` negated where bit `j` of the little-endian `signs` is
/// set.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn signed_maddubs(g: __m256i, q8: __m256i, signs: [u8; 4]) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract);
    // register-only integer arithmetic on values from an indexed (u8, so in-bounds) table.
    unsafe {
        let sb = |l: usize| SIGN_BYTES[signs[l] as usize] as i64;
        let m = _mm256_set_epi64x(sb(3), sb(2), sb(1), sb(0));
        _mm256_maddubs_epi16(g, _mm256_sign_epi8(q8, m))
    }
}

/// The sign bytes of four 7-bit `ksigns` indices packed 7 bits apart in `aux`.
#[inline(always)]
fn ksigns4(aux: u32) -> [u8; 4] {
    std::array::from_fn(|l| KSIGNS[((aux >> (7 * l)) & 127) as usize])
}

/// The i16 scale vector for a group of 32 whose first 16 elements have
/// scale `s1` and last 16 `s2` (the layout of a `maddubs` result).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn halves_i16(s1: i32, s2: i32) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract);
    // register-only, no memory access.
    unsafe { _mm256_set_m128i(_mm_set1_epi16(s2 as i16), _mm_set1_epi16(s1 as i16)) }
}

// ---------------------------------------------------------------------------
// Against Q8_0.

/// One IQ4_NL · Q8_0 block: (scale, integer dot as 8 f32 lanes, 0).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn iq4_nl_block(a: &BlockIQ4NL, b: &BlockQ8_0) -> (__m256, __m256, f32) {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract); the loads
    // read the fixed-size `qs` arrays of the two borrowed blocks and the 16-byte table.
    unsafe {
        let v = lut_nibbles(table16(&KVALUES_IQ4NL), load16(&a.qs));
        let p = _mm256_cvtepi32_ps(dot_i8_i8(v, load32(&b.qs)));
        (_mm256_set1_ps(f16(b.d) * f16(a.d)), p, 0.0)
    }
}

/// One MXFP4 · Q8_0 block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn mxfp4_block(a: &BlockMXFP4, b: &BlockQ8_0) -> (__m256, __m256, f32) {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract); the loads
    // read the fixed-size `qs` arrays of the two borrowed blocks and the 16-byte table.
    unsafe {
        let v = lut_nibbles(table16(&KVALUES_FP4), load16(&a.qs));
        let p = _mm256_cvtepi32_ps(dot_i8_i8(v, load32(&b.qs)));
        (_mm256_set1_ps(f16(b.d) * e8m0_to_f32_half(a.e)), p, 0.0)
    }
}

/// IQ4_NL · Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); all memory access goes through the block helper on blocks from safe iteration.
    unsafe { sum_blocks!(x, y, iq4_nl_block) }
}

/// MXFP4 · Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4_q8_0(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); all memory access goes through the block helper on blocks from safe iteration.
    unsafe { sum_blocks!(x, y, mxfp4_block) }
}

// ---------------------------------------------------------------------------
// Against Q8_K.

/// IQ4_XS · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip`, and every load is of the 16-byte table or a
    // bounds-checked subslice of a block's fixed-size `qs` array.
    unsafe {
        let table = table16(&KVALUES_IQ4NL);
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let mut sumi = _mm256_setzero_si256();
            for g in 0..QK_K / 32 {
                let v = lut_nibbles(table, load16_at(&a.qs, 16 * g));
                let q8 = load32_at(&b.qs, 32 * g);
                let p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(q8, v));
                let ls = _mm256_set1_epi16((iq4xs_scale(a, g) - 32) as i16);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, ls));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(a.d) * b.scale()), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc)
    }
}

/// IQ2_XXS · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq2_xxs_q8_k(x: &[BlockIQ2XXS], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip`, grid entries are indexed (bounds-checked) table
    // reads, and the activation loads are bounds-checked subslices of the `qs` arrays.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let mut sumi = _mm256_setzero_si256();
            for g in 0..QK_K / 32 {
                let (idx, aux) = (le32(&a.qs, 8 * g), le32(&a.qs, 8 * g + 4));
                let grid = |l: u32| IQ2XXS_GRID[((idx >> (8 * l)) & 255) as usize] as i64;
                let gv = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
                let p = signed_maddubs(gv, load32_at(&b.qs, 32 * g), ksigns4(aux));
                let ls = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, ls));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(a.d) * b.scale()), _mm256_cvtepi32_ps(sumi), acc);
        }
        0.125 * hsum_ps(acc)
    }
}

/// IQ2_XS · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq2_xs_q8_k(x: &[BlockIQ2XS], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip`, grid entries are indexed (bounds-checked) table
    // reads, and the activation loads are bounds-checked subslices of the `qs` arrays.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let mut sumi = _mm256_setzero_si256();
            for g in 0..QK_K / 32 {
                let q: [u16; 4] =
                    std::array::from_fn(|l| u16::from_le_bytes([a.qs[8 * g + 2 * l], a.qs[8 * g + 2 * l + 1]]));
                let grid = |l: usize| IQ2XS_GRID[(q[l] & 511) as usize] as i64;
                let gv = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
                let signs = std::array::from_fn(|l| KSIGNS[(q[l] >> 9) as usize]);
                let p = signed_maddubs(gv, load32_at(&b.qs, 32 * g), signs);
                let sc = a.scales[g] as i32;
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, halves_i16(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1)));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(a.d) * b.scale()), _mm256_cvtepi32_ps(sumi), acc);
        }
        0.125 * hsum_ps(acc)
    }
}

/// IQ2_S · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq2_s_q8_k(x: &[BlockIQ2S], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip`, grid entries are indexed (bounds-checked) table
    // reads, and the activation loads are bounds-checked subslices of the `qs` arrays.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let mut sumi = _mm256_setzero_si256();
            for g in 0..QK_K / 32 {
                let qh = a.qh[g] as usize;
                let grid = |l: usize| IQ2S_GRID[a.qs[4 * g + l] as usize | ((qh << (8 - 2 * l)) & 0x300)] as i64;
                let gv = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
                let p = signed_maddubs(gv, load32_at(&b.qs, 32 * g), le32(&a.qs, QK_K / 8 + 4 * g).to_le_bytes());
                let sc = a.scales[g] as i32;
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, halves_i16(2 * (sc & 15) + 1, 2 * (sc >> 4) + 1)));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(a.d) * b.scale()), _mm256_cvtepi32_ps(sumi), acc);
        }
        0.125 * hsum_ps(acc)
    }
}

/// IQ3_XXS · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3_xxs_q8_k(x: &[BlockIQ3XXS], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip`, grid entries are indexed (bounds-checked) table
    // reads, and the activation loads are bounds-checked subslices of the `qs` arrays.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let mut sumi = _mm256_setzero_si256();
            for g in 0..QK_K / 32 {
                let grid = |j: usize| IQ3XXS_GRID[a.qs[8 * g + j] as usize] as i32;
                let gv = _mm256_setr_epi32(grid(0), grid(1), grid(2), grid(3), grid(4), grid(5), grid(6), grid(7));
                let aux = le32(&a.qs, QK_K / 4 + 4 * g);
                let p = signed_maddubs(gv, load32_at(&b.qs, 32 * g), ksigns4(aux));
                let ls = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, ls));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(a.d) * b.scale()), _mm256_cvtepi32_ps(sumi), acc);
        }
        0.25 * hsum_ps(acc)
    }
}

/// IQ3_S · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3_s_q8_k(x: &[BlockIQ3S], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip`, grid entries are indexed (bounds-checked) table
    // reads, and the activation loads are bounds-checked subslices of the `qs` arrays.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let mut sumi = _mm256_setzero_si256();
            for g in 0..QK_K / 32 {
                let qh = a.qh[g] as usize;
                let grid = |j: usize| IQ3S_GRID[a.qs[8 * g + j] as usize | (((qh >> j) & 1) << 8)] as i32;
                let gv = _mm256_setr_epi32(grid(0), grid(1), grid(2), grid(3), grid(4), grid(5), grid(6), grid(7));
                let p = signed_maddubs(gv, load32_at(&b.qs, 32 * g), le32(&a.signs, 4 * g).to_le_bytes());
                let sc = (a.scales[g / 2] >> (4 * (g % 2))) & 15;
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(2 * sc as i16 + 1)));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(a.d) * b.scale()), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc)
    }
}

/// TQ2_0 · Q8_K: the 2-bit codes minus one, dotted signed.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq2_0_q8_k(x: &[BlockTQ2_0], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip` and every load is a bounds-checked subslice of a
    // block's fixed-size `qs` array.
    unsafe {
        let (m3, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let mut sumi = _mm256_setzero_si256();
            for c in 0..2 {
                let q = load32_at(&a.qs, 32 * c);
                let v = [q, _mm256_srli_epi16::<2>(q), _mm256_srli_epi16::<4>(q), _mm256_srli_epi16::<6>(q)];
                for (l, &vl) in v.iter().enumerate() {
                    let t = _mm256_sub_epi8(_mm256_and_si256(vl, m3), one);
                    sumi = _mm256_add_epi32(sumi, dot_i8_i8(t, load32_at(&b.qs, 128 * c + 32 * l)));
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(b.scale() * f16(a.d)), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc)
    }
}

/// `Σ x·y` of signed bytes in pairs (`|x| ≤ 127`), times the i16 `scales`
/// per pair lane, as 8 i32.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn dot_i8_scaled(x: __m256i, y: __m256i, scales: __m256i) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract);
    // register-only integer arithmetic, no memory access.
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)), scales) }
}

/// Eight bytes of +1, or of −1 when `neg`.
#[inline(always)]
fn ones8(neg: bool) -> i64 {
    if neg {
        -1
    } else {
        0x0101_0101_0101_0101
    }
}

/// IQ1_S · Q8_K: grid values (−1, 0, 1) dotted signed; the ±1/8 shifts
/// through the Q8_K block sums, as ggml does.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_s_q8_k(x: &[BlockIQ1S], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip`, grid entries are indexed (bounds-checked) table
    // reads, and the activation loads are bounds-checked subslices of the `qs` arrays.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut shift = 0f32;
        for (a, b) in x.iter().zip(y) {
            let mut sumi = _mm256_setzero_si256();
            let mut sumi1 = 0i32;
            for g in 0..QK_K / 32 {
                let qh = le16(&a.qh, 2 * g) as usize;
                let grid = |l: usize| IQ1S_GRID[a.qs[4 * g + l] as usize | (((qh >> (3 * l)) & 7) << 8)] as i64;
                let gv = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
                let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                sumi =
                    _mm256_add_epi32(sumi, dot_i8_scaled(gv, load32_at(&b.qs, 32 * g), _mm256_set1_epi16(ls as i16)));
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                sumi1 += ls * delta * (b.bsum(2 * g) as i32 + b.bsum(2 * g + 1) as i32);
            }
            let d = f16(a.d) * b.scale();
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            shift += d * (IQ1_DELTA * sumi1 as f32);
        }
        hsum_ps(acc) + shift
    }
}

/// IQ1_M · Q8_K: grid values dotted signed with per-16 scales; the ±1/8
/// shifts as ±1 bytes per 8 dotted with the activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_m_q8_k(x: &[BlockIQ1M], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip`, grid entries are indexed (bounds-checked) table
    // reads, and the activation loads are bounds-checked subslices of the `qs` arrays.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let sc: [u16; 4] = std::array::from_fn(|k| le16(&a.scales, 2 * k));
            let d_bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
            let (mut sumi1, mut sumi2) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for g in 0..QK_K / 32 {
                let qh = [a.qh[2 * g] as usize, a.qh[2 * g + 1] as usize];
                let idx = |l: usize| a.qs[4 * g + l] as usize | ((qh[l / 2] << (8 - 4 * (l % 2))) & 0x700);
                let gv = _mm256_set_epi64x(
                    IQ1S_GRID[idx(3)] as i64,
                    IQ1S_GRID[idx(2)] as i64,
                    IQ1S_GRID[idx(1)] as i64,
                    IQ1S_GRID[idx(0)] as i64,
                );
                let neg = |l: usize| qh[l / 2] & (0x08 << (4 * (l % 2))) != 0;
                let dv = _mm256_set_epi64x(ones8(neg(3)), ones8(neg(2)), ones8(neg(1)), ones8(neg(0)));
                let s = sc[g / 2] as i32 >> (6 * (g % 2));
                let scales = halves_i16(2 * (s & 7) + 1, 2 * ((s >> 3) & 7) + 1);
                let q8 = load32_at(&b.qs, 32 * g);
                sumi1 = _mm256_add_epi32(sumi1, dot_i8_scaled(gv, q8, scales));
                sumi2 = _mm256_add_epi32(sumi2, dot_i8_scaled(dv, q8, scales));
            }
            let d = f16(d_bits.to_le_bytes()) * b.scale();
            let sum = _mm256_fmadd_ps(_mm256_set1_ps(IQ1_DELTA), _mm256_cvtepi32_ps(sumi2), _mm256_cvtepi32_ps(sumi1));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), sum, acc);
        }
        hsum_ps(acc)
    }
}
