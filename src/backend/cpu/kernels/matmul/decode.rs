//! Weight-row decoders: turn rows of `a` into the tile kernels' formats once
//! per row tile, so the decode cost is shared by every column the tile meets.
//!
//! * Q4_0 / Q5_0 → u8 quants `q` (the stored unsigned value: the weight is
//!   `d·(q − 8)` / `d·(q − 16)`) plus one f32 scale per 32.
//! * Q8_0 → u8 quants `q + 128` (VNNI and portable) or the raw i8 (AVX2 sign
//!   trick), plus scales.
//! * Q4_K → u8 nibbles in element order, per super-block f32 `d`, `dmin`,
//!   8 six-bit scales (each duplicated into a u32 for a broadcast) and 8 mins.
//! * Q6_K → u8 six-bit quants in element order (the stored unsigned value:
//!   the weight is `d·sc·(q − 32)`), per super-block f32 `d` and the 16 i8
//!   scales of its 16-element sub-blocks.
//!
//! Block layouts are ggml's (`ggml-common.h`); `get_scale_min_k4` unpacking
//! follows `ggml-quants.c`.

use half::f16;

/// Bytes of one Q4_0 block.
pub(super) const Q4_0_BYTES: usize = 18;
/// Bytes of one Q5_0 block.
pub(super) const Q5_0_BYTES: usize = 22;
/// Bytes of one Q8_0 block.
pub(super) const Q8_0_BYTES: usize = 34;
/// Bytes of one Q4_K super-block.
pub(super) const Q4_K_BYTES: usize = 144;
/// Bytes of one Q6_K super-block (`ql[128]`, `qh[64]`, `scales[16]`, f16 `d`).
pub(super) const Q6_K_BYTES: usize = 210;

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Q4_0 row (`q.len()` elements) → u8 quants and scales.
pub(super) fn q4_0(src: &[u8], q: &mut [u8], d: &mut [f32], simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is set only when the CPU has AVX2; lengths are
        // checked inside.
        unsafe { x86::q4_0(src, q, d) };
        return;
    }
    let _ = simd;
    for ((blk, qs), dd) in src.chunks_exact(Q4_0_BYTES).zip(q.chunks_exact_mut(32)).zip(d.iter_mut()) {
        *dd = f16_at(blk, 0);
        for j in 0..16 {
            qs[j] = blk[2 + j] & 0x0f;
            qs[j + 16] = blk[2 + j] >> 4;
        }
    }
}

/// Q5_0 row → u8 quants (0..31) and scales.
pub(super) fn q5_0(src: &[u8], q: &mut [u8], d: &mut [f32]) {
    for ((blk, qs), dd) in src.chunks_exact(Q5_0_BYTES).zip(q.chunks_exact_mut(32)).zip(d.iter_mut()) {
        *dd = f16_at(blk, 0);
        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
        for j in 0..16 {
            let h0 = (((qh >> j) << 4) & 0x10) as u8;
            let h1 = ((qh >> (j + 12)) & 0x10) as u8;
            qs[j] = (blk[6 + j] & 0x0f) | h0;
            qs[j + 16] = (blk[6 + j] >> 4) | h1;
        }
    }
}

/// Q8_0 row → quants (`signed`: raw i8 bits; else `q + 128`) and scales.
pub(super) fn q8_0(src: &[u8], q: &mut [u8], d: &mut [f32], signed: bool, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` is set only when the CPU has AVX2.
        unsafe { x86::q8_0(src, q, d, signed) };
        return;
    }
    let _ = simd;
    let flip = if signed { 0 } else { 0x80 };
    for ((blk, qs), dd) in src.chunks_exact(Q8_0_BYTES).zip(q.chunks_exact_mut(32)).zip(d.iter_mut()) {
        *dd = f16_at(blk, 0);
        for (o, &v) in qs.iter_mut().zip(&blk[2..34]) {
            *o = v ^ flip;
        }
    }
}

/// Q4_K super-block metadata of one row, decoded.
pub(super) struct Q4kMeta<'a> {
    /// Super-block scale.
    pub d: &'a mut [f32],
    /// Super-block min scale.
    pub dmin: &'a mut [f32],
    /// 8 scales per super-block, duplicated into both u16 halves.
    pub sc: &'a mut [u32],
    /// 8 mins per super-block.
    pub mn: &'a mut [i16],
}

/// Q4_K row → u8 nibbles in element order plus metadata.
pub(super) fn q4_k(src: &[u8], q: &mut [u8], m: Q4kMeta<'_>, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` only with AVX2 + F16C; lengths are checked inside.
        unsafe { x86::q4_k(src, q, m) };
        return;
    }
    let _ = simd;
    for (sb, (blk, qs)) in src.chunks_exact(Q4_K_BYTES).zip(q.chunks_exact_mut(256)).enumerate() {
        m.d[sb] = f16_at(blk, 0);
        m.dmin[sb] = f16_at(blk, 2);
        let s = &blk[4..16];
        for j in 0..8 {
            let (sc, mn) = if j < 4 {
                (s[j] & 63, s[j + 4] & 63)
            } else {
                ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
            };
            m.sc[8 * sb + j] = (sc as u32) | ((sc as u32) << 16);
            m.mn[8 * sb + j] = mn as i16;
        }
        let packed = &blk[16..144];
        for g in 0..4 {
            for l in 0..32 {
                let v = packed[32 * g + l];
                qs[64 * g + l] = v & 0x0f;
                qs[64 * g + 32 + l] = v >> 4;
            }
        }
    }
}

/// Q6_K row → u8 six-bit quants (0..63) in element order, per super-block
/// scale `d` and 16 sub-block scales `sc`.
pub(super) fn q6_k(src: &[u8], q: &mut [u8], d: &mut [f32], sc: &mut [i8], simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: `simd` only with AVX2 + F16C; lengths are checked inside.
        unsafe { x86::q6_k(src, q, d, sc) };
        return;
    }
    let _ = simd;
    for (sb, (blk, qs)) in src.chunks_exact(Q6_K_BYTES).zip(q.chunks_exact_mut(256)).enumerate() {
        d[sb] = f16_at(blk, 208);
        for (o, &v) in sc[16 * sb..16 * sb + 16].iter_mut().zip(&blk[192..208]) {
            *o = v as i8;
        }
        for h in 0..2 {
            let (ql, qh) = (&blk[64 * h..64 * h + 64], &blk[128 + 32 * h..128 + 32 * h + 32]);
            let o = &mut qs[128 * h..128 * h + 128];
            for l in 0..32 {
                o[l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
                o[l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
                o[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                o[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Q4_0_BYTES, Q6_K_BYTES, Q8_0_BYTES};
    use core::arch::x86_64::*;

    /// The f16 scales at the start of each of `d.len()` blocks of `bsz` bytes.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn scales(src: &[u8], bsz: usize, d: &mut [f32]) {
        let n = d.len().min(src.len() / bsz);
        let h = |i: usize| u16::from_le_bytes([src[i * bsz], src[i * bsz + 1]]) as i16;
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm_set_epi16(h(i + 7), h(i + 6), h(i + 5), h(i + 4), h(i + 3), h(i + 2), h(i + 1), h(i));
            // SAFETY: d[i..i + 8] is in bounds.
            unsafe { _mm256_storeu_ps(d.as_mut_ptr().add(i), _mm256_cvtph_ps(v)) };
            i += 8;
        }
        while i < n {
            d[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h(i) as u16 as i32)));
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q4_0(src: &[u8], q: &mut [u8], d: &mut [f32]) {
        let nb = d.len().min(q.len() / 32).min(src.len() / Q4_0_BYTES);
        // SAFETY: same features.
        unsafe { scales(src, Q4_0_BYTES, &mut d[..nb]) };
        let mask = _mm_set1_epi8(0x0f);
        for i in 0..nb {
            // SAFETY: block i is inside `src` (16 bytes at +2) and `q` (32 bytes at 32·i).
            unsafe {
                let v = _mm_loadu_si128(src.as_ptr().add(i * Q4_0_BYTES + 2) as *const __m128i);
                let lo = _mm_and_si128(v, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
                _mm256_storeu_si256(q.as_mut_ptr().add(32 * i) as *mut __m256i, _mm256_set_m128i(hi, lo));
            }
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q8_0(src: &[u8], q: &mut [u8], d: &mut [f32], signed: bool) {
        let nb = d.len().min(q.len() / 32).min(src.len() / Q8_0_BYTES);
        // SAFETY: same features.
        unsafe { scales(src, Q8_0_BYTES, &mut d[..nb]) };
        let flip = _mm256_set1_epi8(if signed { 0 } else { 0x80u8 as i8 });
        for i in 0..nb {
            // SAFETY: block i is inside `src` (32 bytes at +2) and `q`.
            unsafe {
                let v = _mm256_loadu_si256(src.as_ptr().add(i * Q8_0_BYTES + 2) as *const __m256i);
                _mm256_storeu_si256(q.as_mut_ptr().add(32 * i) as *mut __m256i, _mm256_xor_si256(v, flip));
            }
        }
    }

    /// [`super::q4_k`] with SIMD: per super-block, `d` and `dmin` by F16C,
    /// the 8 six-bit scales and mins unpacked as the raw-row kernel does
    /// (`kern::q4k_scales_mins`) and widened in registers, the nibbles split
    /// with two masks; one bounds check per row (the scalar unpacking and
    /// its per-element checks cost as much as the 8-column product of the
    /// row).
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q4_k(src: &[u8], q: &mut [u8], m: super::Q4kMeta<'_>) {
        let ns = (src.len() / super::Q4_K_BYTES)
            .min(q.len() / 256)
            .min(m.d.len())
            .min(m.dmin.len())
            .min(m.sc.len() / 8)
            .min(m.mn.len() / 8);
        let mask = _mm256_set1_epi8(0x0f);
        for sb in 0..ns {
            // SAFETY: super-block `sb` lies in `src` (144 bytes), `q` (256),
            // and its metadata slots in `m` (checked by `ns` above).
            unsafe {
                let blk = src.as_ptr().add(sb * super::Q4_K_BYTES);
                let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                *m.d.get_unchecked_mut(sb) = _mm_cvtss_f32(dd);
                *m.dmin.get_unchecked_mut(sb) = _mm_cvtss_f32(_mm_movehdup_ps(dd));
                let (sc, mn) = super::super::kern::q4k_scales_mins(blk);
                let sc32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
                let sc32 = _mm256_or_si256(sc32, _mm256_slli_epi32(sc32, 16));
                _mm256_storeu_si256(m.sc.as_mut_ptr().add(8 * sb) as *mut __m256i, sc32);
                _mm_storeu_si128(
                    m.mn.as_mut_ptr().add(8 * sb) as *mut __m128i,
                    _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64)),
                );
                let o = q.as_mut_ptr().add(256 * sb);
                for g in 0..4 {
                    let v = _mm256_loadu_si256(blk.add(16 + 32 * g) as *const __m256i);
                    _mm256_storeu_si256(o.add(64 * g) as *mut __m256i, _mm256_and_si256(v, mask));
                    _mm256_storeu_si256(
                        o.add(64 * g + 32) as *mut __m256i,
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), mask),
                    );
                }
            }
        }
    }

    /// [`super::q6_k`] with SIMD: `d` by F16C, the 16 scales copied, the
    /// quants unpacked as the raw-row kernel does; one bounds check per row.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q6_k(src: &[u8], q: &mut [u8], d: &mut [f32], sc: &mut [i8]) {
        let ns = (src.len() / Q6_K_BYTES).min(q.len() / 256).min(d.len()).min(sc.len() / 16);
        for sb in 0..ns {
            // SAFETY: super-block `sb` lies in `src` (210 bytes), `q` (256),
            // `d` and `sc` (16), checked by `ns` above.
            unsafe {
                let blk = src.as_ptr().add(sb * Q6_K_BYTES);
                let h = std::ptr::read_unaligned(blk.add(208) as *const u16);
                *d.get_unchecked_mut(sb) = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)));
                let s16 = _mm_loadu_si128(blk.add(192) as *const __m128i);
                _mm_storeu_si128(sc.as_mut_ptr().add(16 * sb) as *mut __m128i, s16);
                for half in 0..2 {
                    let v = super::super::kern::q6k_unpack(blk.add(64 * half), blk.add(128 + 32 * half));
                    for (j, vj) in v.iter().enumerate() {
                        _mm256_storeu_si256(q.as_mut_ptr().add(256 * sb + 128 * half + 32 * j) as *mut __m256i, *vj);
                    }
                }
            }
        }
    }
}
