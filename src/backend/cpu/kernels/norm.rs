//! CPU kernels of the normalisation family: `rms_norm`, `norm`, `l2_norm`,
//! `soft_max` (scale, F16/F32 mask, ALiBi, optional sinks).
//!
//! Each row is loaded into f32 scratch, reduced with the f64 accumulators
//! ggml uses (`ggml_float` in `ops.cpp` / `vec.cpp`), scaled and stored.
//! The row reductions and the soft_max exponentials use AVX2+FMA where the
//! CPU has it (`simd/norm_avx2.rs`), which is what pays on vocabulary-sized
//! rows; rows run in parallel on the backend's rayon pool.

use super::elementwise::{par_rows, transform_rows as rows};
use super::{unsupported, TView};
use crate::error::Result;
use crate::ops::{ops_outside, Op};

#[path = "simd/norm_avx2.rs"]
pub(super) mod simd;

use simd::NormOps;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    let Some(a) = src.first() else {
        return Err(unsupported(op, dst, src));
    };
    if a.ne != dst.ne {
        return Err(unsupported(op, dst, src));
    }
    let ops = NormOps::detect();
    match op {
        Op::RmsNorm { eps } => {
            let eps = *eps;
            rows(dst, a, move |x| {
                let n = x.len();
                let mean = ((ops.sum_sq)(x) / n as f64) as f32;
                let scale = 1.0 / (mean + eps).sqrt();
                x.iter_mut().for_each(|v| *v *= scale);
            })
        }
        Op::Norm { eps } => {
            let eps = *eps;
            rows(dst, a, move |x| {
                let n = x.len();
                let mean = ((ops.sum)(x) as f32) / n as f32;
                let variance = ((ops.center_sum_sq)(x, mean) / n as f64) as f32;
                let scale = 1.0 / (variance + eps).sqrt();
                x.iter_mut().for_each(|v| *v *= scale);
            })
        }
        Op::L2Norm { eps } => {
            let eps = *eps;
            rows(dst, a, move |x| {
                let norm = ((ops.sum_sq)(x) as f32).sqrt();
                let scale = 1.0 / norm.max(eps);
                x.iter_mut().for_each(|v| *v *= scale);
            })
        }
        Op::SoftMax { scale, max_bias } => soft_max(op, *scale, *max_bias, ops, dst, src, a),
        // Not a norm op: `kernels::compute` routes none here.
        ops_outside!(norm) => Err(unsupported(op, dst, src)),
    }
}

/// ALiBi slope of head `h` (`ggml_compute_forward_soft_max_f32`): 1 unless
/// `max_bias > 0`.
pub(crate) fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    if max_bias <= 0.0 || n_head == 0 {
        return 1.0;
    }
    // 2^⌊log2 n_head⌋
    let n_log2 = 1usize << (usize::BITS - 1 - n_head.leading_zeros());
    let m0 = 2f32.powf(-max_bias / n_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_log2 as f32);
    if h < n_log2 {
        m0.powf((h + 1) as f32)
    } else {
        m1.powf((2 * (h - n_log2) + 1) as f32)
    }
}

/// `softmax(x·scale + slope·mask)` per row, with optional sinks (src2, one
/// logit per head `i2`) counted in the normaliser.
fn soft_max(op: &Op, scale: f32, max_bias: f32, ops: NormOps, dst: &TView, src: &[TView], a: &TView) -> Result<()> {
    let mask = src.get(1);
    let sinks = src.get(2);
    if let Some(m) = mask {
        if m.ne[0] != a.ne[0] || m.ne[1] < a.ne[1] || m.ne[2] == 0 || m.ne[3] == 0 {
            return Err(unsupported(op, dst, src));
        }
    }
    if let Some(s) = sinks {
        if s.ne[0] < a.ne[2] {
            return Err(unsupported(op, dst, src));
        }
    }
    let n0 = a.ne[0];
    let n_head = a.ne[2];
    par_rows(
        a.nrows(),
        n0,
        || (vec![0f32; n0], vec![0f32; if mask.is_some() { n0 } else { 0 }]),
        |(w, mrow), r| {
            let (i1, i2, i3) = a.row_index(r);
            a.load_row_f32(i1, i2, i3, w)?;
            w.iter_mut().for_each(|v| *v *= scale);
            if let Some(m) = mask {
                let slope = alibi_slope(max_bias, n_head, i2);
                m.load_row_f32(i1, i2 % m.ne[2], i3 % m.ne[3], mrow)?;
                for (wv, &mv) in w.iter_mut().zip(mrow.iter()) {
                    *wv += slope * mv;
                }
            }
            let mut max = (ops.max)(w);
            let sink = sinks.map(|s| s.get_f32(i2, 0, 0, 0));
            if let Some(sk) = sink {
                max = if max > sk { max } else { sk };
            }
            let mut sum = (ops.exp_sub_sum)(w, max);
            if let Some(sk) = sink {
                sum += (sk - max).exp() as f64;
            }
            let inv = (1.0 / sum) as f32;
            w.iter_mut().for_each(|v| *v *= inv);
            dst.store_row_f32(i1, i2, i3, w)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibi_slopes_follow_ggml() {
        // n_head = 8, max_bias = 8: slopes 2^-1, 2^-2, ..., 2^-8.
        for h in 0..8 {
            let want = 2f32.powi(-(h as i32 + 1));
            assert!((alibi_slope(8.0, 8, h) - want).abs() < 1e-7);
        }
        // n_head = 12: heads beyond 8 use m1 = 2^-0.5 with odd powers.
        assert!((alibi_slope(8.0, 12, 8) - 2f32.powf(-0.5)).abs() < 1e-7);
        assert!((alibi_slope(8.0, 12, 9) - 2f32.powf(-1.5)).abs() < 1e-7);
        assert_eq!(alibi_slope(0.0, 12, 3), 1.0);
    }
}
