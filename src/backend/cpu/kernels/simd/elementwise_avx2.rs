//! Row primitives of the element-wise activations with an AVX2+FMA(+F16C)
//! build selected at run time and a scalar fallback the tests compare it
//! against:
//! * silu `x / (1 + e^−x)` and swiglu `silu(g) · u`, using the vector
//!   exponential of `norm_avx2.rs` (within ~2 ulp of libm's `expf`);
//! * table activations (ggml's gelu / gelu_quick): each input rounded to f16
//!   (round-to-nearest-even, as F16C and `half` both do) indexes a 65536-entry
//!   f32 table; with `clamp`, inputs ≤ −10 give 0 and inputs ≥ 10 pass
//!   through (`ggml_vec_gelu_f32`). The vector build gives bit-identical
//!   results to the scalar one.

use half::f16;

/// The selected implementations (chosen once per kernel call).
#[derive(Clone, Copy)]
pub(crate) struct EwOps {
    /// x[i] ← silu(x[i]).
    pub silu: fn(&mut [f32]),
    /// out[i] ← silu(g[i]) · u[i] over the common length.
    pub swiglu: fn(&mut [f32], &[f32], &[f32]),
    /// x[i] ← table[f16(x[i])], with ggml's ±10 clamp when the flag is set.
    pub table: fn(&mut [f32], &[f32], bool),
}

impl EwOps {
    /// The fastest implementation this CPU runs.
    pub(crate) fn detect() -> EwOps {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return x86::OPS;
            }
        }
        SCALAR
    }
}

/// The portable implementation.
pub(crate) const SCALAR: EwOps = EwOps { silu: silu_scalar, swiglu: swiglu_scalar, table: table_scalar };

#[inline]
fn silu1(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn silu_scalar(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu1(*v));
}

fn swiglu_scalar(out: &mut [f32], g: &[f32], u: &[f32]) {
    for ((o, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
        *o = silu1(gv) * uv;
    }
}

/// One table lookup (`table.len()` must be 65536 for a full lookup; a short
/// table yields 0 instead of reading past it).
#[inline]
pub(crate) fn table1(table: &[f32], clamp: bool, x: f32) -> f32 {
    if clamp {
        if x <= -10.0 {
            return 0.0;
        }
        if x >= 10.0 {
            return x;
        }
    }
    table.get(f16::from_f32(x).to_bits() as usize).copied().unwrap_or(0.0)
}

fn table_scalar(x: &mut [f32], table: &[f32], clamp: bool) {
    x.iter_mut().for_each(|v| *v = table1(table, clamp, *v));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::EwOps;
    use crate::backend::cpu::kernels::norm::simd::exp8_avx2;
    use std::arch::x86_64::*;

    pub(super) const OPS: EwOps = EwOps { silu, swiglu, table };

    // Safe wrappers: `EwOps::detect` hands these out only after AVX2, FMA and
    // F16C were detected.

    fn silu(x: &mut [f32]) {
        // SAFETY: features detected before this pointer was handed out.
        unsafe { silu_avx2(x) }
    }
    fn swiglu(out: &mut [f32], g: &[f32], u: &[f32]) {
        // SAFETY: as above.
        unsafe { swiglu_avx2(out, g, u) }
    }
    fn table(x: &mut [f32], t: &[f32], clamp: bool) {
        if t.len() < 65536 {
            super::table_scalar(x, t, clamp);
            return;
        }
        // SAFETY: as above; the table holds every f16 index.
        unsafe { table_avx2(x, t, clamp) }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn silu8(x: __m256) -> __m256 {
        // SAFETY: the CPU supports AVX2 and FMA (this fn's `# Safety` contract, inherited by
        // `exp8_avx2`); register-only arithmetic, no memory access.
        unsafe {
            let e = exp8_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
            _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn silu_avx2(x: &mut [f32]) {
        // SAFETY: the caller checked AVX2 and FMA (`EwOps::detect`); every 8-lane load/store at
        // `p + i` has i + 8 ≤ n8 ≤ x.len(), and `x` is exclusively borrowed.
        unsafe {
            let n8 = x.len() / 8 * 8;
            let p = x.as_mut_ptr();
            let mut i = 0;
            while i < n8 {
                // SAFETY: i + 8 ≤ len; `x` is exclusively borrowed.
                _mm256_storeu_ps(p.add(i), silu8(_mm256_loadu_ps(p.add(i))));
                i += 8;
            }
            super::silu_scalar(&mut x[n8..]);
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn swiglu_avx2(out: &mut [f32], g: &[f32], u: &[f32]) {
        // SAFETY: the caller checked AVX2 and FMA (`EwOps::detect`); loads/stores at index i have
        // i + 8 ≤ n8 ≤ n = min(out, g, u lengths), and `out` (&mut) cannot alias `g`/`u`.
        unsafe {
            let n = out.len().min(g.len()).min(u.len());
            let n8 = n / 8 * 8;
            let (po, pg, pu) = (out.as_mut_ptr(), g.as_ptr(), u.as_ptr());
            let mut i = 0;
            while i < n8 {
                // SAFETY: i + 8 ≤ n ≤ each length; `out` does not alias `g`/`u` (&mut vs &).
                let s = silu8(_mm256_loadu_ps(pg.add(i)));
                _mm256_storeu_ps(po.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(pu.add(i))));
                i += 8;
            }
            super::swiglu_scalar(&mut out[n8..n], &g[n8..n], &u[n8..n]);
        }
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `t.len()` must be at least 65536.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn table_avx2(x: &mut [f32], t: &[f32], clamp: bool) {
        // SAFETY: the caller checked AVX2, FMA and F16C (`EwOps::detect`) and that t.len() ≥ 65536;
        // loads/stores at `p + i` have i + 8 ≤ n8 ≤ x.len(), and each gather index is a 16-bit f16
        // bit pattern, so < 65536 ≤ t.len().
        unsafe {
            let n8 = x.len() / 8 * 8;
            let p = x.as_mut_ptr();
            let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
            let mut i = 0;
            while i < n8 {
                // SAFETY: i + 8 ≤ len; gather indices are f16 bit patterns < 65536 ≤ t.len().
                let v = _mm256_loadu_ps(p.add(i));
                let h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
                let idx = _mm256_cvtepu16_epi32(h);
                let mut r = _mm256_i32gather_ps(t.as_ptr(), idx, 4);
                if clamp {
                    r = _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps(v, lo, _CMP_LE_OQ));
                    r = _mm256_blendv_ps(r, v, _mm256_cmp_ps(v, hi, _CMP_GE_OQ));
                }
                _mm256_storeu_ps(p.add(i), r);
                i += 8;
            }
            super::table_scalar(&mut x[n8..], t, clamp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn close(a: f32, b: f32) -> bool {
        a == b || (a - b).abs() <= 1e-6 * b.abs().max(1e-30)
    }

    #[test]
    fn detected_matches_scalar() {
        let fast = EwOps::detect();
        // A synthetic table: entry i = i as f32, so lookups are easy to check.
        let table: Vec<f32> = (0..65536).map(|i| i as f32).collect();
        for &n in &[0usize, 1, 7, 8, 9, 31, 1000, 4099] {
            let x = values(n, -100.0, 100.0, n as u64 + 3);
            let (mut a, mut b) = (x.clone(), x.clone());
            (fast.silu)(&mut a);
            silu_scalar(&mut b);
            for (p, q) in a.iter().zip(&b) {
                assert!(close(*p, *q), "silu {p} vs {q}");
            }
            let u = values(n, -2.0, 2.0, 77);
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            (fast.swiglu)(&mut a, &x, &u);
            swiglu_scalar(&mut b, &x, &u);
            for (p, q) in a.iter().zip(&b) {
                assert!(close(*p, *q), "swiglu {p} vs {q}");
            }
            for clamp in [false, true] {
                let y = values(n, -15.0, 15.0, n as u64 + 5);
                let (mut a, mut b) = (y.clone(), y.clone());
                (fast.table)(&mut a, &table, clamp);
                table_scalar(&mut b, &table, clamp);
                assert_eq!(a, b, "table clamp={clamp}");
            }
        }
        let mut edge = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e5, -1e5, 0.0, -0.0, 65520.0];
        let mut e2 = edge.clone();
        (fast.table)(&mut edge, &table, false);
        table_scalar(&mut e2, &table, false);
        assert_eq!(edge, e2);
    }
}
