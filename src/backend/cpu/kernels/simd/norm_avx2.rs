//! Row primitives of the normalisation kernels, with an AVX2+FMA build
//! selected at run time (`is_x86_feature_detected!`) and a scalar fallback
//! that the tests compare it against:
//! * Σ x² accumulated in f64 (rms_norm, l2_norm), each square rounded to f32
//!   first as ggml does;
//! * Σ x in f64 and the centred Σ (x − mean)² (norm);
//! * the row maximum and `x ← e^(x − max)` with Σ in f64 (soft_max).
//!
//! The vector exponential is a Cephes-style `expf`: range reduction by ln 2
//! (split in two constants), a degree-6 polynomial and an exponent-field
//! scale; it is within ~2 ulp of libm's `expf` over the normal range, flushes
//! results below 2^−126 to 0, gives +∞ above 88.3 and keeps NaN.

/// The selected implementations (function pointers chosen once per call).
#[derive(Clone, Copy)]
pub(crate) struct NormOps {
    /// Σ (x[i]·x[i] in f32) in f64.
    pub sum_sq: fn(&[f32]) -> f64,
    /// Σ x[i] in f64.
    pub sum: fn(&[f32]) -> f64,
    /// x[i] ← x[i] − mean; returns Σ (x[i]·x[i] in f32) in f64.
    pub center_sum_sq: fn(&mut [f32], f32) -> f64,
    /// max over x with ggml's `a > b ? a : b` rule (−∞ for an empty row).
    pub max: fn(&[f32]) -> f32,
    /// x[i] ← e^(x[i] − max); returns Σ in f64.
    pub exp_sub_sum: fn(&mut [f32], f32) -> f64,
}

impl NormOps {
    /// The fastest implementation this CPU runs.
    pub(crate) fn detect() -> NormOps {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return x86::OPS;
            }
        }
        SCALAR
    }
}

/// The portable implementation.
pub(crate) const SCALAR: NormOps = NormOps {
    sum_sq: sum_sq_scalar,
    sum: sum_scalar,
    center_sum_sq: center_sum_sq_scalar,
    max: max_scalar,
    exp_sub_sum: exp_sub_sum_scalar,
};

fn sum_sq_scalar(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |s, &v| s + (v * v) as f64)
}

fn sum_scalar(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |s, &v| s + v as f64)
}

fn center_sum_sq_scalar(x: &mut [f32], mean: f32) -> f64 {
    let mut s = 0.0f64;
    for v in x.iter_mut() {
        let d = *v - mean;
        *v = d;
        s += (d * d) as f64;
    }
    s
}

fn max_scalar(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v })
}

fn exp_sub_sum_scalar(x: &mut [f32], max: f32) -> f64 {
    let mut s = 0.0f64;
    for v in x.iter_mut() {
        let e = (*v - max).exp();
        *v = e;
        s += e as f64;
    }
    s
}

/// e^x on 8 lanes, the vector exponential of this module (shared with the
/// element-wise activations).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp8_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    // SAFETY: the caller guarantees AVX2 and FMA (this fn's `# Safety` contract), which is all
    // `x86::exp8` requires.
    unsafe { x86::exp8(x) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::NormOps;
    use std::arch::x86_64::*;

    pub(super) const OPS: NormOps = NormOps { sum_sq, sum, center_sum_sq, max, exp_sub_sum };

    // Safe wrappers: `NormOps::detect` hands these out only after
    // `is_x86_feature_detected!("avx2")` and `("fma")` returned true.

    fn sum_sq(x: &[f32]) -> f64 {
        // SAFETY: AVX2 and FMA were detected before this pointer was handed out.
        unsafe { sum_sq_avx2(x) }
    }
    fn sum(x: &[f32]) -> f64 {
        // SAFETY: as above.
        unsafe { sum_avx2(x) }
    }
    fn center_sum_sq(x: &mut [f32], mean: f32) -> f64 {
        // SAFETY: as above.
        unsafe { center_sum_sq_avx2(x, mean) }
    }
    fn max(x: &[f32]) -> f32 {
        // SAFETY: as above.
        unsafe { max_avx2(x) }
    }
    fn exp_sub_sum(x: &mut [f32], max: f32) -> f64 {
        // SAFETY: as above.
        unsafe { exp_sub_sum_avx2(x, max) }
    }

    /// Adds the 8 f32 lanes of `v`, widened to f64, into `acc`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn widen_add(acc: __m256d, v: __m256) -> __m256d {
        let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        let hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        _mm256_add_pd(acc, _mm256_add_pd(lo, hi))
    }

    /// Horizontal sum of 4 f64 lanes.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum_pd(v: __m256d) -> f64 {
        // SAFETY: the caller guarantees AVX2 and FMA; the one store writes 4 f64 into the local
        // 4-element `lanes` array.
        unsafe {
            let mut lanes = [0f64; 4];
            _mm256_storeu_pd(lanes.as_mut_ptr(), v);
            (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum_sq_avx2(x: &[f32]) -> f64 {
        // SAFETY: the caller checked AVX2 and FMA (`NormOps::detect`); every 8-lane load at `p + i`
        // has i + 8 ≤ n8 = x.len() / 8 * 8, and the tail uses the safe slice `x[n8..]`.
        unsafe {
            let n8 = x.len() / 8 * 8;
            let p = x.as_ptr();
            let (mut a0, mut a1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
            let mut i = 0;
            while i + 16 <= n8 {
                // SAFETY: i + 16 ≤ len.
                let v0 = _mm256_loadu_ps(p.add(i));
                let v1 = _mm256_loadu_ps(p.add(i + 8));
                a0 = widen_add(a0, _mm256_mul_ps(v0, v0));
                a1 = widen_add(a1, _mm256_mul_ps(v1, v1));
                i += 16;
            }
            if i < n8 {
                // SAFETY: i + 8 ≤ n8 ≤ len.
                let v = _mm256_loadu_ps(p.add(i));
                a0 = widen_add(a0, _mm256_mul_ps(v, v));
            }
            let mut s = hsum_pd(_mm256_add_pd(a0, a1));
            for &v in &x[n8..] {
                s += (v * v) as f64;
            }
            s
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn sum_avx2(x: &[f32]) -> f64 {
        // SAFETY: the caller checked AVX2 and FMA (`NormOps::detect`); every 8-lane load at `p + i`
        // has i + 8 ≤ n8 = x.len() / 8 * 8, and the tail uses the safe slice `x[n8..]`.
        unsafe {
            let n8 = x.len() / 8 * 8;
            let p = x.as_ptr();
            let mut a = _mm256_setzero_pd();
            let mut i = 0;
            while i < n8 {
                // SAFETY: i + 8 ≤ len.
                a = widen_add(a, _mm256_loadu_ps(p.add(i)));
                i += 8;
            }
            let mut s = hsum_pd(a);
            for &v in &x[n8..] {
                s += v as f64;
            }
            s
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn center_sum_sq_avx2(x: &mut [f32], mean: f32) -> f64 {
        // SAFETY: the caller checked AVX2 and FMA (`NormOps::detect`); every 8-lane load/store at
        // `p + i` has i + 8 ≤ n8 = x.len() / 8 * 8, `x` is exclusively borrowed, and the tail uses
        // the safe slice `x[n8..]`.
        unsafe {
            let n8 = x.len() / 8 * 8;
            let p = x.as_mut_ptr();
            let m = _mm256_set1_ps(mean);
            let mut a = _mm256_setzero_pd();
            let mut i = 0;
            while i < n8 {
                // SAFETY: i + 8 ≤ len; `x` is exclusively borrowed.
                let d = _mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m);
                _mm256_storeu_ps(p.add(i), d);
                a = widen_add(a, _mm256_mul_ps(d, d));
                i += 8;
            }
            let mut s = hsum_pd(a);
            for v in &mut x[n8..] {
                let d = *v - mean;
                *v = d;
                s += (d * d) as f64;
            }
            s
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn max_avx2(x: &[f32]) -> f32 {
        // SAFETY: the caller checked AVX2 and FMA (`NormOps::detect`); every 8-lane load at `p + i`
        // has i + 8 ≤ n8 = x.len() / 8 * 8, and the tail uses the safe slice `x[n8..]`.
        unsafe {
            let n8 = x.len() / 8 * 8;
            let p = x.as_ptr();
            let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
            let mut i = 0;
            while i < n8 {
                // SAFETY: i + 8 ≤ len. `max_ps(m, v)` is `m > v ? m : v` per lane.
                m = _mm256_max_ps(m, _mm256_loadu_ps(p.add(i)));
                i += 8;
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), m);
            let mut r = f32::NEG_INFINITY;
            for &v in lanes.iter().chain(&x[n8..]) {
                r = if r > v { r } else { v };
            }
            r
        }
    }

    /// e^x on 8 lanes (see the module docs for range and accuracy).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp8(x: __m256) -> __m256 {
        const HI: f32 = 88.3;
        const LO: f32 = -87.3;
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        let xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LO)), _mm256_set1_ps(HI));
        let n =
            _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut q = _mm256_set1_ps(1.987_569_1e-4);
        q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.398_199_9e-3));
        q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(8.333_452e-3));
        q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(4.166_579_6e-2));
        q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.666_666_6e-1));
        q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(5e-1));
        let r2 = _mm256_mul_ps(r, r);
        let y = _mm256_add_ps(_mm256_fmadd_ps(q, r2, r), _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        let mut res = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
        // Outside the reduced range: 0 below LO, +inf above HI; NaN passes through.
        res = _mm256_blendv_ps(res, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(LO), _CMP_LT_OQ));
        res = _mm256_blendv_ps(res, _mm256_set1_ps(f32::INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(HI), _CMP_GT_OQ));
        _mm256_blendv_ps(res, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp_sub_sum_avx2(x: &mut [f32], max: f32) -> f64 {
        // SAFETY: the caller checked AVX2 and FMA (`NormOps::detect`); every 8-lane load/store at
        // `p + i` has i + 8 ≤ n8 = x.len() / 8 * 8, `x` is exclusively borrowed, and the tail uses
        // the safe slice `x[n8..]`.
        unsafe {
            let n8 = x.len() / 8 * 8;
            let p = x.as_mut_ptr();
            let m = _mm256_set1_ps(max);
            let (mut a0, mut a1) = (_mm256_setzero_pd(), _mm256_setzero_pd());
            let mut i = 0;
            while i + 16 <= n8 {
                // SAFETY: i + 16 ≤ len; `x` is exclusively borrowed.
                let e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m));
                let e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), m));
                _mm256_storeu_ps(p.add(i), e0);
                _mm256_storeu_ps(p.add(i + 8), e1);
                a0 = widen_add(a0, e0);
                a1 = widen_add(a1, e1);
                i += 16;
            }
            if i < n8 {
                // SAFETY: i + 8 ≤ n8 ≤ len.
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m));
                _mm256_storeu_ps(p.add(i), e);
                a0 = widen_add(a0, e);
            }
            let mut s = hsum_pd(_mm256_add_pd(a0, a1));
            for v in &mut x[n8..] {
                let e = (*v - max).exp();
                *v = e;
                s += e as f64;
            }
            s
        }
    }

    #[cfg(test)]
    pub(super) fn exp_lanes(x: [f32; 8]) -> Option<[f32; 8]> {
        if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")) {
            return None;
        }
        let mut out = [0f32; 8];
        // SAFETY: features checked above; pointers to 8-element arrays.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp8(_mm256_loadu_ps(x.as_ptr()))) };
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [lo, hi).
    fn values(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect()
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs().max(1e-30)
    }

    #[test]
    fn detected_matches_scalar() {
        let fast = NormOps::detect();
        for &n in &[0usize, 1, 7, 8, 15, 16, 17, 33, 4096, 32000, 151_936] {
            let x = values(n, -3.0, 3.0, n as u64 + 1);
            assert!(rel((fast.sum_sq)(&x), sum_sq_scalar(&x)) < 1e-12, "sum_sq n={n}");
            assert!(((fast.sum)(&x) - sum_scalar(&x)).abs() < 1e-9 * n as f64 + 1e-12, "sum n={n}");
            assert_eq!((fast.max)(&x), max_scalar(&x), "max n={n}");
            let (mut a, mut b) = (x.clone(), x.clone());
            let sa = (fast.center_sum_sq)(&mut a, 0.25);
            let sb = center_sum_sq_scalar(&mut b, 0.25);
            assert_eq!(a, b);
            assert!(rel(sa, sb) < 1e-12, "center n={n}");
            let m = max_scalar(&x);
            let (mut a, mut b) = (x.clone(), x.clone());
            let sa = (fast.exp_sub_sum)(&mut a, m);
            let sb = exp_sub_sum_scalar(&mut b, m);
            if n > 0 {
                assert!(rel(sa, sb) < 1e-6, "exp sum n={n}: {sa} vs {sb}");
            }
            for (p, q) in a.iter().zip(&b) {
                assert!(rel(*p as f64, *q as f64) < 4e-7, "exp n={n}: {p} vs {q}");
            }
        }
    }

    #[test]
    fn vector_exp_edges() {
        #[cfg(target_arch = "x86_64")]
        {
            let xs = [0.0, -1e-3, -20.5, -87.0, -100.0, f32::NEG_INFINITY, f32::NAN, 88.0];
            if let Some(got) = x86::exp_lanes(xs) {
                for (x, g) in xs.iter().zip(got) {
                    let want = x.exp();
                    if x.is_nan() {
                        assert!(g.is_nan());
                    } else if *x < -87.3 {
                        assert_eq!(g, 0.0);
                    } else {
                        assert!(rel(g as f64, want as f64) < 4e-7, "exp({x}) = {g} vs {want}");
                    }
                }
            }
            let wide = values(4096, -87.0, 88.0, 9);
            for c in wide.chunks_exact(8) {
                let arr: [f32; 8] = c.try_into().unwrap();
                if let Some(got) = x86::exp_lanes(arr) {
                    for (x, g) in arr.iter().zip(got) {
                        assert!(rel(g as f64, x.exp() as f64) < 4e-7, "exp({x}) = {g}");
                    }
                }
            }
        }
    }
}
