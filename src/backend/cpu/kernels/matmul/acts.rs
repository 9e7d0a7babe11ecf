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
//!   scales, sums of each 32-element sub-block) for the k-quant kernels.
//!
//! The Q8_0/Q8_1 quantizer reproduces ggml's x86 `quantize_row_q8_0` /
//! `quantize_row_q8_1` (scale `amax/127`, multiplier `127/amax`, rounding to
//! nearest even); Q8_K reproduces `quantize_row_q8_K_ref`.

use crate::backend::cpu::TView;
use crate::error::{Error, Result};
use half::{bf16, f16};
use crate::tensor::GgmlType;
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
    Q8K,
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
    /// Q8K: per super-block, the 8 sums of each 32-element sub-block.
    pub bs: Vec<i16>,
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
        let total = n.checked_mul(k).ok_or_else(|| Error::Compute { detail: "mul_mat: activation size overflows".into() })?;
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
                            for (blk, ((xs, qs), (dd, cc))) in
                                tmp.chunks_exact(QK8).zip(q.chunks_exact_mut(QK8)).zip(d.iter_mut().zip(c.iter_mut())).enumerate()
                            {
                                let _ = blk;
                                let (dv, sum) = quantize_q8_block(xs, qs);
                                *dd = dv;
                                *cc = -corr_mul * sum;
                            }
                            Ok(())
                        },
                    )?;
            }
            ActKind::Q8K => {
                if k % QKK != 0 {
                    return Err(Error::Compute { detail: format!("mul_mat: K = {k} is not a multiple of {QKK}") });
                }
                let nsb = k / QKK;
                acts.q = vec![0i8; total];
                acts.d = vec![0f32; n * nsb];
                acts.bs = vec![0i16; n * nsb * 8];
                acts.q
                    .par_chunks_mut(k)
                    .zip(acts.d.par_chunks_mut(nsb))
                    .zip(acts.bs.par_chunks_mut(nsb * 8))
                    .zip(rows.par_iter())
                    .try_for_each_init(
                        || vec![0f32; k],
                        |tmp, (((q, d), bs), &(i1, i2, i3))| -> Result<()> {
                            b.load_row_f32(i1, i2, i3, tmp)?;
                            for ((xs, qs), (dd, sums)) in tmp
                                .chunks_exact(QKK)
                                .zip(q.chunks_exact_mut(QKK))
                                .zip(d.iter_mut().zip(bs.chunks_exact_mut(8)))
                            {
                                *dd = quantize_q8k_block(xs, qs, sums);
                            }
                            Ok(())
                        },
                    )?;
            }
        }
        Ok(acts)
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

#[cfg(test)]
mod tests {
    use super::*;

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
