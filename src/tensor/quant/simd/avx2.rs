//! AVX2 + FMA + F16C dot products (x86_64), selected at run time.
//!
//! Each public entry point has the [`crate::tensor::quant::VecDotFn`] shape
//! and is safe to call on any CPU: it validates the row lengths (NaN on a
//! mismatch, as the scalar entries do), re-checks the CPU features (a cached
//! load) and falls back to the scalar kernel when they are missing. Only
//! then does it enter the `#[target_feature]` kernel.
//!
//! Kernels take block slices of equal length; every memory access is a
//! 16/32-byte unaligned load from a field of a block (an array of at least
//! that many bytes) or from a slice whose length was checked, so the only
//! precondition of the `unsafe fn`s is the CPU features.
//!
//! Integer products use `maddubs` (u8 × i8 pairs into i16) and `madd`
//! (i16 pairs into i32); like ggml's kernels they assume activation quants in
//! −127..=127, which ggml's and this crate's quantizers always produce. The
//! k-quant kernels take the Q8_K block sums (`bsums`) for the min/offset
//! terms, as ggml's kernels do, so those must match the quants (they do for
//! every Q8_K block [`crate::tensor::quant::quantize_chunk`] writes).

use super::super::blocks::*;
use super::super::dot::{self, blocks_for, scales_mins_k4};
use crate::tensor::GgmlType;
use std::arch::x86_64::*;

/// True if this CPU has AVX2, FMA and F16C (std caches the CPUID result).
#[inline(always)]
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// The AVX2 kernel for weight type `ty` among the classic, k-quant and
/// dense types, if one exists (the IQ/TQ/FP4 types: `avx2_iq::kernel`).
pub(crate) fn kernel(ty: GgmlType) -> Option<crate::tensor::quant::VecDotFn> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => q4_0_row,
        Q4_1 => q4_1_row,
        Q5_0 => q5_0_row,
        Q5_1 => q5_1_row,
        Q8_0 => q8_0_row,
        Q2_K => q2_k_row,
        Q3_K => q3_k_row,
        Q4_K => q4_k_row,
        Q5_K => q5_k_row,
        Q6_K => q6_k_row,
        F32 => f32_row,
        F16 => f16_row,
        BF16 => bf16_row,
        _ => return None,
    })
}

/// Defines a safe entry point `$name(n, x, y)` for the block kernel `$kernel`.
macro_rules! entry {
    ($name:ident, $kernel:ident, $scalar:path, $bx:ty, $by:ty) => {
        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let (Some(xb), Some(yb)) = (blocks_for::<$bx>(n, x), blocks_for::<$by>(n, y)) else {
                return f32::NAN;
            };
            if !available() {
                return $scalar(xb, yb);
            }
            // SAFETY: AVX2, FMA and F16C were detected just above; `xb` and
            // `yb` hold the same number of blocks (both are n / QK).
            unsafe { $kernel(xb, yb) }
        }
    };
}

pub(super) use entry;

entry!(q4_0_row, q4_0_q8_0, dot::q4_0_q8_0, BlockQ4_0, BlockQ8_0);
entry!(q4_1_row, q4_1_q8_1, dot::q4_1_q8_1, BlockQ4_1, BlockQ8_1);
entry!(q5_0_row, q5_0_q8_0, dot::q5_0_q8_0, BlockQ5_0, BlockQ8_0);
entry!(q5_1_row, q5_1_q8_1, dot::q5_1_q8_1, BlockQ5_1, BlockQ8_1);
entry!(q8_0_row, q8_0_q8_0, dot::q8_0_q8_0, BlockQ8_0, BlockQ8_0);
entry!(q2_k_row, q2_k_q8_k, dot::q2_k_q8_k, BlockQ2K, BlockQ8K);
entry!(q3_k_row, q3_k_q8_k, dot::q3_k_q8_k, BlockQ3K, BlockQ8K);
entry!(q4_k_row, q4_k_q8_k, dot::q4_k_q8_k, BlockQ4K, BlockQ8K);
entry!(q5_k_row, q5_k_q8_k, dot::q5_k_q8_k, BlockQ5K, BlockQ8K);
entry!(q6_k_row, q6_k_q8_k, dot::q6_k_q8_k, BlockQ6K, BlockQ8K);

/// Defines a safe entry point for a dense (F32/F16/BF16) kernel over `n`
/// elements of `$width` bytes.
macro_rules! dense_entry {
    ($name:ident, $kernel:ident, $scalar:path, $width:expr) => {
        pub(crate) fn $name(n: usize, x: &[u8], y: &[u8]) -> f32 {
            let Some(len) = n.checked_mul($width) else { return f32::NAN };
            let (Some(xs), Some(ys)) = (x.get(..len), y.get(..len)) else {
                return f32::NAN;
            };
            if !available() {
                return $scalar(n, xs, ys);
            }
            // SAFETY: features detected just above; `xs` and `ys` are exactly
            // `n` elements long.
            unsafe { $kernel(n, xs, ys) }
        }
    };
}

dense_entry!(f32_row, f32_dot, dot::f32_row, 4);
dense_entry!(f16_row, f16_dot, dot::f16_row, 2);
dense_entry!(bf16_row, bf16_dot, dot::bf16_row, 2);

// ---------------------------------------------------------------------------
// Helpers. All are `#[inline(always)]` and only called from kernels that
// carry the target features, so they compile to plain AVX2 instructions.

/// Sum of the 8 lanes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); register-only lane shuffles and adds, no memory
    // access.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// An f16 (two little-endian bytes) as f32, by the F16C instruction.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
pub(super) unsafe fn f16(b: [u8; 2]) -> f32 {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); a register-only F16C conversion of a value, no
    // memory access.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(b) as i32))) }
}

/// 32 bytes from a 32-byte array.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below), and `T` must be a one-byte type (`u8`/`i8`).
#[inline(always)]
pub(super) unsafe fn load32<T>(a: &[T; 32]) -> __m256i
where
    T: Copy,
{
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the unaligned 32-byte load reads exactly the 32
    // elements of the borrowed `[T; 32]` array, one byte each by the contract.
    unsafe {
        // The array is exactly 32 one-byte elements; unaligned load.
        _mm256_loadu_si256(a.as_ptr() as *const __m256i)
    }
}

/// Bytes `[off, off + 32)` of a slice that was checked to hold them.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below), and `T` must be a one-byte type (`u8`/`i8`).
#[inline(always)]
pub(super) unsafe fn load32_at<T: Copy>(a: &[T], off: usize) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the unaligned 32-byte load reads
    // `s = &a[off..off + 32]`, a bounds-checked slice of 32 elements, one byte each by the
    // contract.
    unsafe {
        let s = &a[off..off + 32];
        // `s` is 32 one-byte elements (the slice index above panics otherwise,
        // which the fixed block layouts rule out).
        _mm256_loadu_si256(s.as_ptr() as *const __m256i)
    }
}

/// 16 bytes from a 16-byte array.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
pub(super) unsafe fn load16(a: &[u8; 16]) -> __m128i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the unaligned 16-byte load reads exactly the
    // borrowed 16-byte array.
    unsafe { _mm_loadu_si128(a.as_ptr() as *const __m128i) }
}

/// Σ of `x·y` over each 4 consecutive byte pairs, signed × signed, as 8 i32.
/// `|x| ≤ 128`, `|y| ≤ 127` keeps the i16 pair sums exact.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
pub(super) unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); register-only integer arithmetic and shuffles, no
    // memory access.
    unsafe {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
    }
}

/// Σ of `x·y` over each 4 consecutive byte pairs, unsigned x (≤ 127) ×
/// signed y, as 8 i32.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); register-only integer arithmetic and shuffles, no
    // memory access.
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)) }
}

/// The 32 nibbles of 16 packed bytes: low nibbles in bytes 0..16, high
/// nibbles in bytes 16..32 (the Q4_0/Q4_1/Q5 element order).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the only memory access is `load16` of the borrowed
    // 16-byte `qs` array; the rest is register arithmetic.
    unsafe {
        let v = load16(qs);
        let m = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(v), m), _mm_and_si128(v, m))
    }
}

/// Byte `j` is 0xFF if bit `j` of `bits` is set, else 0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn bits_to_bytes(bits: u32) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); register-only integer arithmetic and shuffles, no
    // memory access.
    unsafe {
        let x = _mm256_set1_epi32(bits as i32);
        let shuf = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let x = _mm256_shuffle_epi8(x, shuf);
        let m = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(x, m), m)
    }
}

/// The 32 unsigned 5-bit quants of a Q5 block in element order.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn q5_bytes(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the only memory access is `load16` of the borrowed
    // 16-byte `qs` array; the rest is register arithmetic.
    unsafe {
        let hi = _mm256_and_si256(bits_to_bytes(u32::from_le_bytes(qh)), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles(qs), hi)
    }
}

// ---------------------------------------------------------------------------
// 32-element formats.

/// Runs `$block(&x[i], &y[i]) -> (d, p, extra)` over all block pairs with
/// four independent accumulators (so FMA latency does not serialise the
/// loop) and returns `Σ d·p` summed over lanes plus `Σ extra`.
macro_rules! sum_blocks {
    ($x:expr, $y:expr, $block:ident) => {{
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut extra = [0f32; 4];
        let (xc, yc) = ($x.chunks_exact(4), $y.chunks_exact(4));
        let (xr, yr) = (xc.remainder(), yc.remainder());
        for (xs, ys) in xc.zip(yc) {
            for k in 0..4 {
                let (d, p, e) = $block(&xs[k], &ys[k]);
                acc[k] = _mm256_fmadd_ps(d, p, acc[k]);
                extra[k] += e;
            }
        }
        for (a, b) in xr.iter().zip(yr) {
            let (d, p, e) = $block(a, b);
            acc[0] = _mm256_fmadd_ps(d, p, acc[0]);
            extra[0] += e;
        }
        let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        hsum_ps(v) + ((extra[0] + extra[1]) + (extra[2] + extra[3]))
    }};
}
pub(super) use sum_blocks;

/// One Q4_0 · Q8_0 block: (scale, integer dot as 8 f32 lanes, 0).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn q4_0_block(a: &BlockQ4_0, b: &BlockQ8_0) -> (__m256, __m256, f32) {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the loads read the fixed-size `qs` arrays of the two
    // borrowed blocks (`load32`/`nibbles`/`q5_bytes`); the rest is register arithmetic.
    unsafe {
        let qx = _mm256_sub_epi8(nibbles(&a.qs), _mm256_set1_epi8(8));
        let p = _mm256_cvtepi32_ps(dot_i8_i8(qx, load32(&b.qs)));
        (_mm256_set1_ps(f16(a.d) * f16(b.d)), p, 0.0)
    }
}

/// One Q4_1 · Q8_1 block: (scale, integer dot, m·s).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn q4_1_block(a: &BlockQ4_1, b: &BlockQ8_1) -> (__m256, __m256, f32) {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the loads read the fixed-size `qs` arrays of the two
    // borrowed blocks (`load32`/`nibbles`/`q5_bytes`); the rest is register arithmetic.
    unsafe {
        let p = _mm256_cvtepi32_ps(dot_u8_i8(nibbles(&a.qs), load32(&b.qs)));
        (_mm256_set1_ps(f16(a.d) * f16(b.d)), p, f16(a.m) * f16(b.s))
    }
}

/// One Q5_0 · Q8_0 block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn q5_0_block(a: &BlockQ5_0, b: &BlockQ8_0) -> (__m256, __m256, f32) {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the loads read the fixed-size `qs` arrays of the two
    // borrowed blocks (`load32`/`nibbles`/`q5_bytes`); the rest is register arithmetic.
    unsafe {
        let qx = _mm256_sub_epi8(q5_bytes(&a.qs, a.qh), _mm256_set1_epi8(16));
        let p = _mm256_cvtepi32_ps(dot_i8_i8(qx, load32(&b.qs)));
        (_mm256_set1_ps(f16(a.d) * f16(b.d)), p, 0.0)
    }
}

/// One Q5_1 · Q8_1 block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn q5_1_block(a: &BlockQ5_1, b: &BlockQ8_1) -> (__m256, __m256, f32) {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the loads read the fixed-size `qs` arrays of the two
    // borrowed blocks (`load32`/`nibbles`/`q5_bytes`); the rest is register arithmetic.
    unsafe {
        let p = _mm256_cvtepi32_ps(dot_u8_i8(q5_bytes(&a.qs, a.qh), load32(&b.qs)));
        (_mm256_set1_ps(f16(a.d) * f16(b.d)), p, f16(a.m) * f16(b.s))
    }
}

/// One Q8_0 · Q8_0 block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn q8_0_block(a: &BlockQ8_0, b: &BlockQ8_0) -> (__m256, __m256, f32) {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the loads read the fixed-size `qs` arrays of the two
    // borrowed blocks (`load32`/`nibbles`/`q5_bytes`); the rest is register arithmetic.
    unsafe {
        let p = _mm256_cvtepi32_ps(dot_i8_i8(load32(&a.qs), load32(&b.qs)));
        (_mm256_set1_ps(f16(a.d) * f16(b.d)), p, 0.0)
    }
}

/// Q4_0 · Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); all memory access goes through the `*_block` helpers on `&x[i]`, `&y[i]` from
    // safe `chunks_exact`/`zip` iteration, so every block is in bounds.
    unsafe { sum_blocks!(x, y, q4_0_block) }
}

/// Q4_1 · Q8_1.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); all memory access goes through the `*_block` helpers on `&x[i]`, `&y[i]` from
    // safe `chunks_exact`/`zip` iteration, so every block is in bounds.
    unsafe { sum_blocks!(x, y, q4_1_block) }
}

/// Q5_0 · Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); all memory access goes through the `*_block` helpers on `&x[i]`, `&y[i]` from
    // safe `chunks_exact`/`zip` iteration, so every block is in bounds.
    unsafe { sum_blocks!(x, y, q5_0_block) }
}

/// Q5_1 · Q8_1.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); all memory access goes through the `*_block` helpers on `&x[i]`, `&y[i]` from
    // safe `chunks_exact`/`zip` iteration, so every block is in bounds.
    unsafe { sum_blocks!(x, y, q5_1_block) }
}

/// Q8_0 · Q8_0.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); all memory access goes through the `*_block` helpers on `&x[i]`, `&y[i]` from
    // safe `chunks_exact`/`zip` iteration, so every block is in bounds.
    unsafe { sum_blocks!(x, y, q8_0_block) }
}

// ---------------------------------------------------------------------------
// K-quants against Q8_K.

/// The 16 block sums of a Q8_K block as 16 i16 lanes.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn bsums(b: &BlockQ8K) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); the 32-byte unaligned load reads the borrowed
    // `bsums` field, 16 × i16 = 32 bytes.
    unsafe {
        // `bsums` is 16 × 2 bytes = 32 bytes.
        _mm256_loadu_si256(b.bsums.as_ptr() as *const __m256i)
    }
}

/// Σ_j bsums[j]·mins[j/2] as 8 i32 lanes (Q4_K/Q5_K min correction).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn bsums_times_mins(b: &BlockQ8K, mins: &[u8; 8]) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); `_mm_loadl_epi64` reads 8 bytes, exactly the
    // borrowed `[u8; 8]` `mins`; `bsums` reads the 32-byte `bsums` field.
    unsafe {
        let m = _mm_loadl_epi64(mins.as_ptr() as *const __m128i);
        let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
        _mm256_madd_epi16(bsums(b), m16)
    }
}

/// Σ over a 64-element chunk of a Q4_K/Q5_K block: `lo` holds elements
/// 0..32 (scale `s1`), `hi` elements 32..64 (scale `s2`), as 8 i32.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn k4_chunk(lo: __m256i, hi: __m256i, ylo: __m256i, yhi: __m256i, s1: u8, s2: u8) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); register-only integer arithmetic and shuffles, no
    // memory access.
    unsafe {
        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_set1_epi16(s1 as i16));
        let p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), _mm256_set1_epi16(s2 as i16));
        _mm256_add_epi32(p1, p2)
    }
}

/// 16 per-group i16 scales `s16` → the scale vector for groups `g` and
/// `g + 1` (`g` even) as a `maddubs` result of 32 elements needs it: lanes
/// 0..8 = `s[g]`, lanes 8..16 = `s[g + 1]`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (only called from the `#[target_feature]` kernels
/// below).
#[inline(always)]
unsafe fn group_pair(s16: __m256i, g: usize) -> __m256i {
    // SAFETY: the CPU supports AVX2, FMA and F16C (this helper's `# Safety` contract; it is only
    // called from the target-feature kernels); register-only integer arithmetic and shuffles, no
    // memory access.
    unsafe {
        let w = _mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32((g / 2) as i32));
        let ctl = _mm256_setr_epi8(
            0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
        );
        _mm256_shuffle_epi8(w, ctl)
    }
}

/// Q2_K · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip` over `x` and `y`, and every load is
    // `load32`/`load16` of a fixed-size block array, `load32_at` of a bounds-checked slice, `bsums`
    // of the 32-byte field, or `_mm_loadu_si128` of a 16-byte `[i8; 16]` scales array.
    unsafe {
        let m2 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let dy = b.scale();
            let d = _mm256_set1_ps(f16(a.d) * dy);
            let dmin = _mm256_set1_ps(-(f16(a.dmin) * dy));
            let sc = load16(&a.scales);
            let s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, _mm_set1_epi8(0x0F)));
            let m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), _mm_set1_epi8(0x0F)));
            let mut sumi = _mm256_setzero_si256();
            for c in 0..QK_K / 128 {
                let q = load32_at(&a.qs, 32 * c);
                let qk = [
                    _mm256_and_si256(q, m2),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(q), m2),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q), m2),
                    _mm256_and_si256(_mm256_srli_epi16::<6>(q), m2),
                ];
                for (k, &v) in qk.iter().enumerate() {
                    let yk = load32_at(&b.qs, 128 * c + 32 * k);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(v, yk), group_pair(s16, 8 * c + 2 * k));
                    sumi = _mm256_add_epi32(sumi, p);
                }
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
            acc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums(b), m16)), acc);
        }
        hsum_ps(acc)
    }
}

/// Q3_K · Q8_K. Quants are dotted unsigned as `lo2 + 4·hbit` (0..8) and
/// the offset of 4 is removed with the block sums.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip` over `x` and `y`, and every load is
    // `load32`/`load16` of a fixed-size block array, `load32_at` of a bounds-checked slice, `bsums`
    // of the 32-byte field, or `_mm_loadu_si128` of a 16-byte `[i8; 16]` scales array.
    unsafe {
        let m2 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let d = _mm256_set1_ps(f16(a.d) * b.scale());
            let scales = q3k_scales(&a.scales);
            // 16 signed scales (one byte each) widened to i16.
            let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(scales.as_ptr() as *const __m128i));
            let hm = load32(&a.hmask);
            let mut sumi = _mm256_setzero_si256();
            for c in 0..QK_K / 128 {
                let q = load32_at(&a.qs, 32 * c);
                let qk = [
                    _mm256_and_si256(q, m2),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(q), m2),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q), m2),
                    _mm256_and_si256(_mm256_srli_epi16::<6>(q), m2),
                ];
                for (k, &lo) in qk.iter().enumerate() {
                    let bit = _mm256_set1_epi8((1u8 << (4 * c + k)) as i8);
                    let hb = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
                    let v = _mm256_or_si256(lo, hb);
                    let yk = load32_at(&b.qs, 128 * c + 32 * k);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(v, yk), group_pair(s16, 8 * c + 2 * k));
                    sumi = _mm256_add_epi32(sumi, p);
                }
            }
            let corr = _mm256_madd_epi16(bsums(b), s16);
            sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<2>(corr));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc)
    }
}

/// Q4_K · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip` over `x` and `y`, and every load is
    // `load32`/`load16` of a fixed-size block array, `load32_at` of a bounds-checked slice, `bsums`
    // of the 32-byte field, or `_mm_loadu_si128` of a 16-byte `[i8; 16]` scales array.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let dy = b.scale();
            let d = _mm256_set1_ps(f16(a.d) * dy);
            let dmin = _mm256_set1_ps(-(f16(a.dmin) * dy));
            let (sc, mn) = scales_mins_k4(&a.scales);
            let mut sumi = _mm256_setzero_si256();
            for c in 0..QK_K / 64 {
                let q = load32_at(&a.qs, 32 * c);
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                let ylo = load32_at(&b.qs, 64 * c);
                let yhi = load32_at(&b.qs, 64 * c + 32);
                sumi = _mm256_add_epi32(sumi, k4_chunk(lo, hi, ylo, yhi, sc[2 * c], sc[2 * c + 1]));
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
            acc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(bsums_times_mins(b, &mn)), acc);
        }
        hsum_ps(acc)
    }
}

/// Q5_K · Q8_K.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip` over `x` and `y`, and every load is
    // `load32`/`load16` of a fixed-size block array, `load32_at` of a bounds-checked slice, `bsums`
    // of the 32-byte field, or `_mm_loadu_si128` of a 16-byte `[i8; 16]` scales array.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let sixteen = _mm256_set1_epi8(16);
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let dy = b.scale();
            let d = _mm256_set1_ps(f16(a.d) * dy);
            let dmin = _mm256_set1_ps(-(f16(a.dmin) * dy));
            let (sc, mn) = scales_mins_k4(&a.scales);
            let qh = load32(&a.qh);
            let mut sumi = _mm256_setzero_si256();
            for c in 0..QK_K / 64 {
                let q = load32_at(&a.qs, 32 * c);
                let b1 = _mm256_set1_epi8((1u8 << (2 * c)) as i8);
                let b2 = _mm256_set1_epi8((2u8 << (2 * c)) as i8);
                let h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen);
                let h2 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b2), b2), sixteen);
                let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h1);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q), m4), h2);
                let ylo = load32_at(&b.qs, 64 * c);
                let yhi = load32_at(&b.qs, 64 * c + 32);
                sumi = _mm256_add_epi32(sumi, k4_chunk(lo, hi, ylo, yhi, sc[2 * c], sc[2 * c + 1]));
            }
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
            acc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(bsums_times_mins(b, &mn)), acc);
        }
        hsum_ps(acc)
    }
}

/// Q6_K · Q8_K. The 6-bit quants are dotted unsigned (0..64) and the offset
/// of 32 is removed with the block sums: Σ s_g·Σ (q−32)·y =
/// Σ s_g·Σ q·y − 32·Σ s_g·bsum_g.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `entry!`); blocks come from a safe `zip` over `x` and `y`, and every load is
    // `load32`/`load16` of a fixed-size block array, `load32_at` of a bounds-checked slice, `bsums`
    // of the 32-byte field, or `_mm_loadu_si128` of a 16-byte `[i8; 16]` scales array.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            let d = _mm256_set1_ps(f16(a.d) * b.scale());
            // 16 scales as i16.
            let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.scales.as_ptr() as *const __m128i));
            let mut sumi = _mm256_setzero_si256();
            for c in 0..QK_K / 128 {
                let ql0 = load32_at(&a.ql, 64 * c);
                let ql1 = load32_at(&a.ql, 64 * c + 32);
                let qh = load32_at(&a.qh, 32 * c);
                let q = [
                    _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m2))),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<2>(qh), m2)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<4>(qh), m2)),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(qh), m2)),
                    ),
                ];
                for (k, &qk) in q.iter().enumerate() {
                    let yk = load32_at(&b.qs, 128 * c + 32 * k);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qk, yk), group_pair(s16, 8 * c + 2 * k));
                    sumi = _mm256_add_epi32(sumi, p);
                }
            }
            // The scales against the 16 block sums.
            let corr = _mm256_madd_epi16(bsums(b), s16);
            sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(corr));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_ps(acc)
    }
}

// ---------------------------------------------------------------------------
// Dense rows.

/// F32 · F32 with four 8-lane FMA accumulators.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x` and `y` hold `n` f32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_dot(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `dense_entry!`), which also checked x and y hold 4·n bytes; each 8-float load at element i + 8k
    // has i + 8k + 8 ≤ n, and the tail indexes the slices safely.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let px = x.as_ptr() as *const f32;
        let py = y.as_ptr() as *const f32;
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                // i + 8k + 8 ≤ n elements: in bounds of both slices.
                let vx = _mm256_loadu_ps(px.add(i + 8 * k));
                let vy = _mm256_loadu_ps(py.add(i + 8 * k));
                *a = _mm256_fmadd_ps(vx, vy, *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            // i + 8 ≤ n: in bounds.
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)), acc[0]);
            i += 8;
        }
        let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        while i < n {
            let a = f32::from_le_bytes([x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]]);
            let b = f32::from_le_bytes([y[4 * i], y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]]);
            sum += a * b;
            i += 1;
        }
        sum
    }
}

/// 8 consecutive 16-bit words at element `i` (caller checked `i + 8 ≤ n`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C, and `p` must be valid for reading `2·(i + 8)` bytes.
#[inline(always)]
unsafe fn load8_u16(p: *const u8, i: usize) -> __m128i {
    // SAFETY: the caller guarantees AVX2 and that `p` is valid for 2·(i + 8) bytes (it checked i +
    // 8 ≤ n of a slice holding n 16-bit values), so the 16-byte unaligned load at p + 2·i is in
    // bounds.
    unsafe { _mm_loadu_si128(p.add(2 * i) as *const __m128i) }
}

/// F16 · F16, converted by F16C, f32 FMA accumulators.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x` and `y` hold `n` f16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_dot(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `dense_entry!`), which also checked x and y hold 2·n bytes, and every `load8_u16(_, j)` call has
    // j + 8 ≤ n (its contract); the tail indexes the slices safely.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let (px, py) = (x.as_ptr(), y.as_ptr());
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                // i + 8k + 8 ≤ n elements: in bounds.
                let vx = _mm256_cvtph_ps(load8_u16(px, i + 8 * k));
                let vy = _mm256_cvtph_ps(load8_u16(py, i + 8 * k));
                *a = _mm256_fmadd_ps(vx, vy, *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            // i + 8 ≤ n: in bounds.
            let vx = _mm256_cvtph_ps(load8_u16(px, i));
            let vy = _mm256_cvtph_ps(load8_u16(py, i));
            acc[0] = _mm256_fmadd_ps(vx, vy, acc[0]);
            i += 8;
        }
        let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        while i < n {
            sum += f16([x[2 * i], x[2 * i + 1]]) * f16([y[2 * i], y[2 * i + 1]]);
            i += 1;
        }
        sum
    }
}

/// 16 bf16 at element `i` (caller checked `i + 16 ≤ n`) as two f32
/// vectors: the even elements (shifted into the high half) and the odd
/// elements (already in the high half, low half masked off). A dot product
/// does not care about the order, so no lane shuffles are needed.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C, and `p` must be valid for reading `2·(i + 16)` bytes.
#[inline(always)]
unsafe fn bf16x16(p: *const u8, i: usize) -> (__m256, __m256) {
    // SAFETY: the caller guarantees AVX2 and that `p` is valid for 2·(i + 16) bytes (it checked i +
    // 16 ≤ n of a slice holding n bf16), so the 32-byte unaligned load at p + 2·i is in bounds.
    unsafe {
        let v = _mm256_loadu_si256(p.add(2 * i) as *const __m256i);
        let even = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
        let odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF_0000u32 as i32)));
        (even, odd)
    }
}

/// BF16 · BF16, f32 FMA accumulators.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `x` and `y` hold `n` bf16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_dot(n: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: AVX2, FMA and F16C were detected (`available()`, checked by the safe wrapper from
    // `dense_entry!`), which also checked x and y hold 2·n bytes, and every `bf16x16(_, j)` call
    // has j + 16 ≤ n (its contract); the tail indexes the slices safely.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let (px, py) = (x.as_ptr(), y.as_ptr());
        let mut i = 0;
        while i + 32 <= n {
            // i + 32 ≤ n elements: both 16-element loads are in bounds.
            let (xe0, xo0) = bf16x16(px, i);
            let (ye0, yo0) = bf16x16(py, i);
            let (xe1, xo1) = bf16x16(px, i + 16);
            let (ye1, yo1) = bf16x16(py, i + 16);
            acc[0] = _mm256_fmadd_ps(xe0, ye0, acc[0]);
            acc[1] = _mm256_fmadd_ps(xo0, yo0, acc[1]);
            acc[2] = _mm256_fmadd_ps(xe1, ye1, acc[2]);
            acc[3] = _mm256_fmadd_ps(xo1, yo1, acc[3]);
            i += 32;
        }
        while i + 16 <= n {
            // i + 16 ≤ n: in bounds.
            let (xe, xo) = bf16x16(px, i);
            let (ye, yo) = bf16x16(py, i);
            acc[0] = _mm256_fmadd_ps(xe, ye, acc[0]);
            acc[1] = _mm256_fmadd_ps(xo, yo, acc[1]);
            i += 16;
        }
        let mut sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        while i < n {
            let a = f32::from_bits((u16::from_le_bytes([x[2 * i], x[2 * i + 1]]) as u32) << 16);
            let b = f32::from_bits((u16::from_le_bytes([y[2 * i], y[2 * i + 1]]) as u32) << 16);
            sum += a * b;
            i += 1;
        }
        sum
    }
}
