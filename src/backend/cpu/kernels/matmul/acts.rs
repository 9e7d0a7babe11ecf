//! Activation preparation: every column of `b` (a row of the `src1` tensor)
//! is converted once into the form the tile kernels read, following ggml's
//! CPU backend, which turns `src1` into the weights' `vec_dot_type` before
//! any dot product (`ggml_compute_forward_mul_mat`, `from_float`):
//!
//! * [`ActKind::F32`]: the f32 values (F32 weights).
//! * [`ActKind::Round`]: f32 values rounded through F16, BF16, Q8_0, Q8_1 or
//!   Q8_K (then decoded back to f32), for weights the kernels handle as f32
//!   after decoding their rows.
//! * [`ActKind::Q8`]: Q8_0 in a split layout (i8 quants, f32 block scales,
//!   per-lane integer corrections) for the u8 × i8 block kernels.
//! * [`ActKind::Q8K`]: Q8_K in a split layout (i8 quants, f32 super-block
//!   scales, sums of each 32-element sub-block, or of each 16-element one for
//!   Q6_K) for the k-quant kernels.
//!
//! The Q8_0/Q8_1 quantizer reproduces ggml's x86 `quantize_row_q8_0` /
//! `quantize_row_q8_1` (scale `amax/127`, multiplier `127/amax`, rounding to
//! nearest even); Q8_K reproduces `quantize_row_q8_K_ref`.

use crate::backend::cpu::TView;
use crate::error::{Error, Result};
use crate::tensor::GgmlType;
use half::{bf16, f16};
use rayon::prelude::*;

/// Elements per Q8_0/Q8_1 block.
pub(super) const QK8: usize = 32;
/// Elements per Q8_K super-block.
pub(super) const QKK: usize = 256;

/// The activation format a plan needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ActKind {
    /// Plain f32.
    F32,
    /// f32 values rounded through `GgmlType` (F16, BF16, Q8_0, Q8_1 or Q8_K).
    Round(GgmlType),
    /// Split Q8_0 with per-lane corrections `-corr_mul · Σq` per block
    /// (see [`Acts::c`]).
    Q8 {
        /// Multiplier of the block sum in the correction (0 = none).
        corr_mul: i32,
    },
    /// Split Q8_K.
    Q8K {
        /// The sums in [`Acts::bs`] are of 16 quants (Q6_K's sub-blocks;
        /// ggml's `bsums`), else of 32 (Q4_K's).
        sums16: bool,
    },
    /// ggml's own packed rows of `GgmlType` (Q8_0, Q8_1 or Q8_K), for
    /// `quant::vec_dot_fn` (see [`Acts::raw`]).
    Raw(GgmlType),
}

/// Prepared activations, one column after another (column `c` of `f`/`q`
/// starts at `c·k`).
#[derive(Default)]
pub(super) struct Acts {
    /// Elements per column (K).
    pub k: usize,
    /// f32 values ([`ActKind::F32`], [`ActKind::Round`]).
    pub f: Vec<f32>,
    /// i8 quants ([`ActKind::Q8`], [`ActKind::Q8K`]).
    pub q: Vec<i8>,
    /// Block scales: per 32 elements (Q8) or per 256 (Q8K).
    pub d: Vec<f32>,
    /// Q8: per block, the value each of the 8 i32 lanes of a block dot starts
    /// from, `-corr_mul · Σq`, so that the integer dot of offset-encoded
    /// weights (`q_w + 8·corr_mul`) comes out exact.
    pub c: Vec<i32>,
    /// Q8K: per super-block, the 8 sums of each 32-element sub-block, or
    /// with `sums16` the 16 sums of each 16-element one (Q6_K's offset term).
    pub bs: Vec<i16>,
    /// Raw: the columns in ggml's block layout, [`Acts::raw_row`] bytes each.
    pub raw: Vec<u8>,
    /// Raw: bytes per column.
    pub raw_row: usize,
}

/// A source row of `b` to prepare: (i1, i2, i3).
pub(super) type SrcRow = (usize, usize, usize);

impl Acts {
    /// Prepares the rows `rows` of `b` (each `b.ne[0]` = K elements) in
    /// parallel into the format `kind`.
    pub(super) fn prepare(b: &TView, rows: &[SrcRow], kind: ActKind) -> Result<Acts> {
        let k = b.ne[0];
        let n = rows.len();
        let mut acts = Acts { k, ..Acts::default() };
        if n == 0 || k == 0 {
            return Ok(acts);
        }
        let total =
            n.checked_mul(k).ok_or_else(|| Error::Compute { detail: "mul_mat: activation size overflows".into() })?;
        match kind {
            ActKind::F32 | ActKind::Round(_) => {
                acts.f = vec![0f32; total];
                acts.f.par_chunks_mut(k).zip(rows.par_iter()).try_for_each(|(col, &(i1, i2, i3))| -> Result<()> {
                    b.load_row_f32(i1, i2, i3, col)?;
                    if let ActKind::Round(t) = kind {
                        round_through(t, col)?;
                    }
                    Ok(())
                })?;
            }
            ActKind::Q8 { corr_mul } => {
                if k % QK8 != 0 {
                    return Err(Error::Compute { detail: format!("mul_mat: K = {k} is not a multiple of {QK8}") });
                }
                let nb = k / QK8;
                acts.q = vec![0i8; total];
                acts.d = vec![0f32; n * nb];
                acts.c = vec![0i32; n * nb];
                acts.q
                    .par_chunks_mut(k)
                    .zip(acts.d.par_chunks_mut(nb))
                    .zip(acts.c.par_chunks_mut(nb))
                    .zip(rows.par_iter())
                    .try_for_each_init(
                        || vec![0f32; k],
                        |tmp, (((q, d), c), &(i1, i2, i3))| -> Result<()> {
                            b.load_row_f32(i1, i2, i3, tmp)?;
                            quantize_q8_row(tmp, q, d, c, corr_mul);
                            Ok(())
                        },
                    )?;
            }
            ActKind::Raw(t) => {
                let (bs, bsz) = match t {
                    GgmlType::Q8_0 => (QK8, Q8_0_BYTES),
                    GgmlType::Q8_1 => (QK8, Q8_1_BYTES),
                    GgmlType::Q8_K => (QKK, Q8_K_BYTES),
                    other => return Err(Error::unsupported_type(other, "mul_mat: not a raw activation type")),
                };
                if k % bs != 0 {
                    return Err(Error::Compute { detail: format!("mul_mat: K = {k} is not a multiple of {bs}") });
                }
                acts.raw_row = k / bs * bsz;
                acts.raw = vec![0u8; n * acts.raw_row];
                acts.raw.par_chunks_mut(acts.raw_row).zip(rows.par_iter()).try_for_each_init(
                    || vec![0f32; k],
                    |tmp, (out, &(i1, i2, i3))| -> Result<()> {
                        b.load_row_f32(i1, i2, i3, tmp)?;
                        match t {
                            GgmlType::Q8_0 => raw_q8_0(tmp, out),
                            GgmlType::Q8_1 => raw_q8_1(tmp, out),
                            _ => raw_q8_k(tmp, out),
                        }
                        Ok(())
                    },
                )?;
            }
            ActKind::Q8K { sums16 } => {
                if k % QKK != 0 {
                    return Err(Error::Compute { detail: format!("mul_mat: K = {k} is not a multiple of {QKK}") });
                }
                let nsb = k / QKK;
                acts.q = vec![0i8; total];
                acts.d = vec![0f32; n * nsb];
                let per = if sums16 { 16 } else { 8 };
                acts.bs = vec![0i16; n * nsb * per];
                acts.q
                    .par_chunks_mut(k)
                    .zip(acts.d.par_chunks_mut(nsb))
                    .zip(acts.bs.par_chunks_mut(nsb * per))
                    .zip(rows.par_iter())
                    .try_for_each_init(
                        // The row and, for sums of 16, the quantizer's sums of 32.
                        || (vec![0f32; k], vec![0i16; if sums16 { nsb * 8 } else { 0 }]),
                        |(tmp, bs32), (((q, d), bs), &(i1, i2, i3))| -> Result<()> {
                            b.load_row_f32(i1, i2, i3, tmp)?;
                            if !sums16 {
                                quantize_q8k_row(tmp, q, d, bs);
                                return Ok(());
                            }
                            quantize_q8k_row(tmp, q, d, bs32);
                            for (s, qs) in bs.iter_mut().zip(q.chunks_exact(16)) {
                                *s = qs.iter().map(|&v| v as i16).sum();
                            }
                            Ok(())
                        },
                    )?;
            }
        }
        Ok(acts)
    }
}

/// Bytes of a ggml `block_q8_0` (f16 d, 32 × i8).
pub(super) const Q8_0_BYTES: usize = 34;
/// Bytes of a ggml `block_q8_1` (f16 d, f16 s = d·Σq, 32 × i8).
pub(super) const Q8_1_BYTES: usize = 36;
/// Bytes of a ggml `block_q8_K` (f32 d, 256 × i8, 16 × i16 sums of 16).
pub(super) const Q8_K_BYTES: usize = 292;

/// One row as ggml's x86 `quantize_row_q8_0` writes it.
fn raw_q8_0(x: &[f32], out: &mut [u8]) {
    let mut q = [0i8; QK8];
    for (xs, blk) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let (d16, _) = quantize_q8_block(xs, &mut q);
        blk[0..2].copy_from_slice(&f16::from_f32(d16).to_bits().to_le_bytes());
        for (o, &v) in blk[2..].iter_mut().zip(q.iter()) {
            *o = v as u8;
        }
    }
}

/// One row as ggml's x86 `quantize_row_q8_1` writes it.
fn raw_q8_1(x: &[f32], out: &mut [u8]) {
    let mut q = [0i8; QK8];
    for (xs, blk) in x.chunks_exact(QK8).zip(out.chunks_exact_mut(Q8_1_BYTES)) {
        let (d16, sum) = quantize_q8_block(xs, &mut q);
        let d32 = xs.iter().fold(0f32, |m, &v| m.max(v.abs())) / 127.0;
        blk[0..2].copy_from_slice(&f16::from_f32(d16).to_bits().to_le_bytes());
        blk[2..4].copy_from_slice(&f16::from_f32(d32 * sum as f32).to_bits().to_le_bytes());
        for (o, &v) in blk[4..].iter_mut().zip(q.iter()) {
            *o = v as u8;
        }
    }
}

/// One row as ggml's `quantize_row_q8_K_ref` writes it.
fn raw_q8_k(x: &[f32], out: &mut [u8]) {
    let mut q = [0i8; QKK];
    let mut s32 = [0i16; 8];
    for (xs, blk) in x.chunks_exact(QKK).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        let d = quantize_q8k_block(xs, &mut q, &mut s32);
        blk[0..4].copy_from_slice(&d.to_le_bytes());
        for (o, &v) in blk[4..260].iter_mut().zip(q.iter()) {
            *o = v as u8;
        }
        for (j, s) in q.chunks_exact(16).enumerate() {
            let sum: i16 = s.iter().map(|&v| v as i16).sum();
            blk[260 + 2 * j..262 + 2 * j].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// Rounds `v` in place through `t` as ggml's `from_float` of `t` followed by
/// the exact decode (F16, BF16, Q8_0, Q8_1, Q8_K).
pub(super) fn round_through(t: GgmlType, v: &mut [f32]) -> Result<()> {
    match t {
        GgmlType::F32 => {}
        GgmlType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        GgmlType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            if v.len() % QK8 != 0 {
                return Err(Error::Compute { detail: format!("mul_mat: K = {} is not a multiple of {QK8}", v.len()) });
            }
            let mut q = [0i8; QK8];
            for xs in v.chunks_exact_mut(QK8) {
                let (d, _) = quantize_q8_block(xs, &mut q);
                for (x, &qq) in xs.iter_mut().zip(&q) {
                    *x = d * qq as f32;
                }
            }
        }
        GgmlType::Q8_K => {
            if v.len() % QKK != 0 {
                return Err(Error::Compute { detail: format!("mul_mat: K = {} is not a multiple of {QKK}", v.len()) });
            }
            let mut q = [0i8; QKK];
            let mut s = [0i16; 8];
            for xs in v.chunks_exact_mut(QKK) {
                let d = quantize_q8k_block(xs, &mut q, &mut s);
                for (x, &qq) in xs.iter_mut().zip(q.iter()) {
                    *x = d * qq as f32;
                }
            }
        }
        other => return Err(Error::unsupported_type(other, "not an activation type of mul_mat")),
    }
    Ok(())
}

/// Quantizes a row into split Q8 (quants, scales, corrections
/// `-corr_mul · Σq` per block); bit-identical on every path.
fn quantize_q8_row(x: &[f32], q: &mut [i8], d: &mut [f32], c: &mut [i32], corr_mul: i32) {
    #[cfg(target_arch = "x86_64")]
    if super::kern::isa() != super::kern::Isa::Scalar {
        // SAFETY: AVX2/FMA/F16C are present (detected by `isa`).
        unsafe { x86::quantize_q8_row(x, q, d, c, corr_mul) };
        return;
    }
    for ((xs, qs), (dd, cc)) in x.chunks_exact(QK8).zip(q.chunks_exact_mut(QK8)).zip(d.iter_mut().zip(c.iter_mut())) {
        let (dv, sum) = quantize_q8_block(xs, qs);
        *dd = dv;
        *cc = -corr_mul * sum;
    }
}

/// Quantizes a row into split Q8_K (quants, scales, 8 sums of 32 per
/// super-block); bit-identical on every path.
fn quantize_q8k_row(x: &[f32], q: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if super::kern::isa() != super::kern::Isa::Scalar {
        // SAFETY: AVX2/FMA/F16C are present (detected by `isa`).
        unsafe { x86::quantize_q8k_row(x, q, d, bs) };
        return;
    }
    for ((xs, qs), (dd, sums)) in
        x.chunks_exact(QKK).zip(q.chunks_exact_mut(QKK)).zip(d.iter_mut().zip(bs.chunks_exact_mut(8)))
    {
        *dd = quantize_q8k_block(xs, qs, sums);
    }
}

/// Quantizes 32 values like ggml's x86 `quantize_row_q8_0`: returns the
/// block scale as stored (f16, decoded) and the sum of the quants.
#[inline]
pub(super) fn quantize_q8_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (qq, &v) in q.iter_mut().zip(x) {
        let r = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        *qq = r;
        sum += r as i32;
    }
    (f16::from_f32(d).to_f32(), sum)
}

/// Quantizes 256 values like ggml's `quantize_row_q8_K_ref`: returns the
/// scale and writes the quants and the 8 sums of each 32 quants.
#[inline]
pub(super) fn quantize_q8k_block(x: &[f32], q: &mut [i8], sums: &mut [i16]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.iter_mut().for_each(|v| *v = 0);
        sums.iter_mut().for_each(|v| *v = 0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (qq, &v) in q.iter_mut().zip(x) {
        // ggml's nearest_int: round to nearest even.
        *qq = (iscale * v).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    for (s, qs) in sums.iter_mut().zip(q.chunks_exact(32)) {
        *s = qs.iter().map(|&v| v as i16).sum();
    }
    1.0 / iscale
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{QK8, QKK};
    use core::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        // SAFETY: AVX.
        unsafe {
            let x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
            _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)))
        }
    }

    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        // SAFETY: AVX2.
        unsafe {
            let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b01_00_11_10));
            _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 0b10_11_00_01)))
        }
    }

    /// 32 i32 (four vectors) → 32 i8 in order.
    #[inline(always)]
    unsafe fn pack32(i0: __m256i, i1: __m256i, i2: __m256i, i3: __m256i) -> __m256i {
        // SAFETY: AVX2.
        unsafe {
            let a = _mm256_packs_epi32(i0, i1);
            let b = _mm256_packs_epi32(i2, i3);
            _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
        }
    }

    /// True if a lane of `i` is `i32::MIN`: what `rne` gives a NaN or a
    /// value out of the i32 range, which finite inputs scaled to ±127 never
    /// produce (such blocks go to the portable path, which decides them).
    #[inline(always)]
    unsafe fn any_invalid(i: &[__m256i; 4]) -> bool {
        // SAFETY: AVX2.
        unsafe {
            let m = _mm256_set1_epi32(i32::MIN);
            let hit = _mm256_or_si256(
                _mm256_or_si256(_mm256_cmpeq_epi32(i[0], m), _mm256_cmpeq_epi32(i[1], m)),
                _mm256_or_si256(_mm256_cmpeq_epi32(i[2], m), _mm256_cmpeq_epi32(i[3], m)),
            );
            _mm256_movemask_epi8(hit) != 0
        }
    }

    /// Rounds to nearest, ties to even (ggml's `_mm256_round_ps(.., _MM_ROUND_NEAREST)` / `nearest_int`).
    #[inline(always)]
    unsafe fn rne(v: __m256) -> __m256i {
        // SAFETY: AVX.
        unsafe { _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v)) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8_row(x: &[f32], q: &mut [i8], d: &mut [f32], c: &mut [i32], corr_mul: i32) {
        let nb = (x.len() / QK8).min(q.len() / QK8).min(d.len()).min(c.len());
        let sign = _mm256_set1_ps(-0.0);
        for blk in 0..nb {
            // SAFETY: block `blk` is inside `x` and `q`.
            unsafe {
                let p = x.as_ptr().add(QK8 * blk);
                let v = [
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                ];
                let m = _mm256_max_ps(
                    _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                    _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])),
                );
                let amax = hmax(m);
                let dv = amax / 127.0;
                let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
                let i = [
                    rne(_mm256_mul_ps(v[0], id)),
                    rne(_mm256_mul_ps(v[1], id)),
                    rne(_mm256_mul_ps(v[2], id)),
                    rne(_mm256_mul_ps(v[3], id)),
                ];
                if any_invalid(&i) {
                    // A NaN or an infinity in the block: the portable path
                    // decides it (its quants saturate, its sum cannot overflow).
                    let (dv, sum) =
                        super::quantize_q8_block(&x[QK8 * blk..QK8 * (blk + 1)], &mut q[QK8 * blk..QK8 * (blk + 1)]);
                    d[blk] = dv;
                    c[blk] = -corr_mul * sum;
                    continue;
                }
                let sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
                _mm256_storeu_si256(q.as_mut_ptr().add(QK8 * blk) as *mut __m256i, pack32(i[0], i[1], i[2], i[3]));
                d[blk] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(_mm_set_ss(dv))));
                c[blk] = -corr_mul * sum;
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_q8k_row(x: &[f32], q: &mut [i8], d: &mut [f32], bs: &mut [i16]) {
        let ns = (x.len() / QKK).min(q.len() / QKK).min(d.len()).min(bs.len() / 8);
        let sign = _mm256_set1_ps(-0.0);
        for sb in 0..ns {
            let xs = &x[QKK * sb..QKK * (sb + 1)];
            // SAFETY: super-block `sb` is inside `x`, `q` and `bs`.
            unsafe {
                let p = xs.as_ptr();
                let mut m = _mm256_setzero_ps();
                for j in 0..32 {
                    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * j))));
                }
                let amax = hmax(m);
                if amax == 0.0 || amax.is_nan() {
                    // The portable path decides NaN and all-zero blocks.
                    let sums = &mut bs[8 * sb..8 * sb + 8];
                    d[sb] = super::quantize_q8k_block(xs, &mut q[QKK * sb..QKK * (sb + 1)], sums);
                    continue;
                }
                // The first value of largest magnitude, with its sign (as the reference).
                let max = xs.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
                let iscale = -127.0 / max;
                let is = _mm256_set1_ps(iscale);
                let hi = _mm256_set1_epi32(127);
                let lo = _mm256_set1_epi32(-128);
                let mut invalid = false;
                for g in 0..8 {
                    let mut i = [_mm256_setzero_si256(); 4];
                    for (u, iu) in i.iter_mut().enumerate() {
                        let v = _mm256_loadu_ps(p.add(32 * g + 8 * u));
                        *iu = rne(_mm256_mul_ps(v, is));
                    }
                    if any_invalid(&i) {
                        invalid = true;
                        break;
                    }
                    for iu in i.iter_mut() {
                        *iu = _mm256_max_epi32(_mm256_min_epi32(*iu, hi), lo);
                    }
                    let sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
                    bs[8 * sb + g] = sum as i16;
                    _mm256_storeu_si256(
                        q.as_mut_ptr().add(QKK * sb + 32 * g) as *mut __m256i,
                        pack32(i[0], i[1], i[2], i[3]),
                    );
                }
                d[sb] = if invalid {
                    // A NaN or an infinity the maximum missed: the portable path decides the block.
                    let sums = &mut bs[8 * sb..8 * sb + 8];
                    super::quantize_q8k_block(xs, &mut q[QKK * sb..QKK * (sb + 1)], sums)
                } else {
                    1.0 / iscale
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_quantizers_match_portable() {
        let x: Vec<f32> = (0..1024)
            .map(|i| ((i * 7919 % 2003) as f32 / 1001.0 - 1.0) * if i % 97 == 0 { 3.0 } else { 1.0 })
            .collect();
        let (mut q1, mut d1, mut c1) = (vec![0i8; 1024], vec![0f32; 32], vec![0i32; 32]);
        quantize_q8_row(&x, &mut q1, &mut d1, &mut c1, 16);
        let (mut q2, mut d2, mut c2) = (vec![0i8; 1024], vec![0f32; 32], vec![0i32; 32]);
        for (((xs, qs), dd), cc) in x.chunks(32).zip(q2.chunks_mut(32)).zip(d2.iter_mut()).zip(c2.iter_mut()) {
            let (d, s) = quantize_q8_block(xs, qs);
            *dd = d;
            *cc = -16 * s;
        }
        assert_eq!((q1, d1, c1), (q2, d2, c2));
        let (mut q1, mut d1, mut s1) = (vec![0i8; 1024], vec![0f32; 4], vec![0i16; 32]);
        quantize_q8k_row(&x, &mut q1, &mut d1, &mut s1);
        let (mut q2, mut d2, mut s2) = (vec![0i8; 1024], vec![0f32; 4], vec![0i16; 32]);
        for (((xs, qs), dd), ss) in x.chunks(256).zip(q2.chunks_mut(256)).zip(d2.iter_mut()).zip(s2.chunks_mut(8)) {
            *dd = quantize_q8k_block(xs, qs, ss);
        }
        assert_eq!((q1, d1, s1), (q2, d2, s2));
    }

    /// Activations with NaN or ±inf (a caller's input) quantize without
    /// overflowing (the SIMD sum of `i32::MIN` lanes used to overflow the
    /// correction) and the same on every path.
    #[test]
    fn non_finite_activations_quantize_alike_on_every_path() {
        for (pos, bad) in
            [(0, f32::NAN), (5, f32::INFINITY), (31, f32::NEG_INFINITY), (300, f32::NAN), (700, f32::INFINITY)]
        {
            let mut x: Vec<f32> = (0..1024).map(|i| (i as f32 * 0.37).sin()).collect();
            x[pos] = bad;
            let (mut q1, mut d1, mut c1) = (vec![0i8; 1024], vec![0f32; 32], vec![0i32; 32]);
            quantize_q8_row(&x, &mut q1, &mut d1, &mut c1, 16);
            let (mut q2, mut d2, mut c2) = (vec![0i8; 1024], vec![0f32; 32], vec![0i32; 32]);
            for (((xs, qs), dd), cc) in x.chunks(32).zip(q2.chunks_mut(32)).zip(d2.iter_mut()).zip(c2.iter_mut()) {
                let (d, s) = quantize_q8_block(xs, qs);
                *dd = d;
                *cc = -16 * s;
            }
            let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!((&q1, bits(&d1), &c1), (&q2, bits(&d2), &c2), "q8, {bad} at {pos}");
            let (mut q1, mut d1, mut s1) = (vec![0i8; 1024], vec![0f32; 4], vec![0i16; 32]);
            quantize_q8k_row(&x, &mut q1, &mut d1, &mut s1);
            let (mut q2, mut d2, mut s2) = (vec![0i8; 1024], vec![0f32; 4], vec![0i16; 32]);
            for (((xs, qs), dd), ss) in x.chunks(256).zip(q2.chunks_mut(256)).zip(d2.iter_mut()).zip(s2.chunks_mut(8)) {
                *dd = quantize_q8k_block(xs, qs, ss);
            }
            assert_eq!((&q1, bits(&d1), &s1), (&q2, bits(&d2), &s2), "q8_K, {bad} at {pos}");
        }
    }

    #[test]
    fn q8_block_matches_ggml_rules() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) * 0.1).collect();
        let mut q = [0i8; 32];
        let (d, s) = quantize_q8_block(&x, &mut q);
        assert_eq!(q[0], -127);
        assert_eq!(q[31], 127);
        assert_eq!(s, q.iter().map(|&v| v as i32).sum::<i32>());
        assert!((d - 1.55 / 127.0).abs() < 1e-5);
        let zero = [0f32; 32];
        let (d0, s0) = quantize_q8_block(&zero, &mut q);
        assert_eq!((d0, s0), (0.0, 0));
        assert!(q.iter().all(|&v| v == 0));
    }

    #[test]
    fn q8k_block_sums() {
        let x: Vec<f32> = (0..256).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let mut q = [0i8; 256];
        let mut s = [0i16; 8];
        let d = quantize_q8k_block(&x, &mut q, &mut s);
        for (j, &sj) in s.iter().enumerate() {
            assert_eq!(sj as i32, q[32 * j..32 * j + 32].iter().map(|&v| v as i32).sum::<i32>());
        }
        for (a, &b) in x.iter().zip(q.iter()) {
            assert!((a - d * b as f32).abs() <= d.abs() * 0.5 + 1e-6);
        }
    }
}
