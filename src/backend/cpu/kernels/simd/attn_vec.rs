//! f32 vector primitives for the attention and recurrent kernels (dot
//! product, `y += a·x`, `y *= s`), chosen once per kernel call: AVX2+FMA
//! intrinsics where the CPU has them (detected at run time), portable
//! lane-parallel loops otherwise (32 independent partial sums, so the
//! compiler can use vector registers without reassociating additions).

const LANES: usize = 32;

/// The selected implementations.
#[derive(Clone, Copy)]
pub(crate) struct VecOps {
    /// Σ a[i]·b[i] over the common length.
    pub dot: fn(&[f32], &[f32]) -> f32,
    /// y[i] += a·x[i] over the common length.
    pub axpy: fn(&mut [f32], &[f32], f32),
    /// y[i] *= s.
    pub scale: fn(&mut [f32], f32),
    /// Little-endian F16 bytes (2 per value) to f32, over `out.len()` values
    /// (or fewer if the bytes run out).
    pub f16_to_f32: fn(&[u8], &mut [f32]),
}

impl VecOps {
    /// The fastest implementation this CPU runs.
    pub(crate) fn detect() -> VecOps {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return VecOps { dot: x86::dot, axpy: x86::axpy, scale: x86::scale, f16_to_f32: x86::f16_to_f32 };
            }
        }
        VecOps { dot: dot_lanes, axpy: axpy_lanes, scale: scale_lanes, f16_to_f32: f16_to_f32_portable }
    }
}

#[inline]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    let mut sum = acc[0];
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

#[inline]
fn axpy_lanes(y: &mut [f32], x: &[f32], a: f32) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += xi * a;
    }
}

#[inline]
fn scale_lanes(y: &mut [f32], s: f32) {
    for yi in y.iter_mut() {
        *yi *= s;
    }
}

/// Asks the CPU to start loading `bytes` into the cache (a hint: no effect
/// on results, nothing on targets without a prefetch instruction).
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        for line in bytes.chunks(64) {
            // SAFETY: a prefetch never faults and the address is inside `bytes`.
            unsafe { std::arch::x86_64::_mm_prefetch(line.as_ptr() as *const i8, std::arch::x86_64::_MM_HINT_T0) }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

fn f16_to_f32_portable(src: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Horizontal sum of the 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        // SAFETY (loads): every index read is below `n`, the common length.
        while i + 32 <= n {
            for (l, a) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(pa.add(i + 8 * l));
                let y = _mm256_loadu_ps(pb.add(i + 8 * l));
                *a = _mm256_fmadd_ps(x, y, *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut sum = hsum(s);
        while i < n {
            sum += *pa.add(i) * *pb.add(i);
            i += 1;
        }
        sum
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn axpy_avx2(y: &mut [f32], x: &[f32], a: f32) {
        let n = y.len().min(x.len());
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        // SAFETY (loads/stores): every index is below `n`, the common length.
        while i + 8 <= n {
            let r = _mm256_fmadd_ps(_mm256_loadu_ps(px.add(i)), va, _mm256_loadu_ps(py.add(i)));
            _mm256_storeu_ps(py.add(i), r);
            i += 8;
        }
        while i < n {
            *py.add(i) = (*px.add(i)).mul_add(a, *py.add(i));
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn scale_avx2(y: &mut [f32], s: f32) {
        let n = y.len();
        let py = y.as_mut_ptr();
        let vs = _mm256_set1_ps(s);
        let mut i = 0;
        // SAFETY (loads/stores): every index is below `n`.
        while i + 8 <= n {
            _mm256_storeu_ps(py.add(i), _mm256_mul_ps(_mm256_loadu_ps(py.add(i)), vs));
            i += 8;
        }
        while i < n {
            *py.add(i) *= s;
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_to_f32_f16c(src: &[u8], out: &mut [f32]) {
        let n = out.len().min(src.len() / 2);
        let (ps, po) = (src.as_ptr(), out.as_mut_ptr());
        let mut i = 0;
        // SAFETY (loads/stores): 16 bytes at 2·i and 8 floats at i are inside
        // `src` and `out` while i + 8 ≤ n.
        while i + 8 <= n {
            let h = _mm_loadu_si128(ps.add(2 * i) as *const __m128i);
            _mm256_storeu_ps(po.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        while i < n {
            *po.add(i) = half::f16::from_le_bytes([*ps.add(2 * i), *ps.add(2 * i + 1)]).to_f32();
            i += 1;
        }
    }

    pub(super) fn f16_to_f32(src: &[u8], out: &mut [f32]) {
        // SAFETY: only selected by `VecOps::detect` after AVX2 and F16C were
        // detected; the function stays inside both slices.
        unsafe { f16_to_f32_f16c(src, out) }
    }

    pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: only selected by `VecOps::detect` after AVX2 and FMA were
        // detected; the function stays inside both slices.
        unsafe { dot_avx2(a, b) }
    }
    pub(super) fn axpy(y: &mut [f32], x: &[f32], a: f32) {
        // SAFETY: as above.
        unsafe { axpy_avx2(y, x, a) }
    }
    pub(super) fn scale(y: &mut [f32], s: f32) {
        // SAFETY: as above.
        unsafe { scale_avx2(y, s) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_ops_agree_with_scalar() {
        let ops = VecOps::detect();
        for n in [0usize, 1, 15, 16, 17, 64, 130] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!(((ops.dot)(&a, &b) as f64 - want).abs() < 1e-4, "n={n}");
            assert!((dot_lanes(&a, &b) as f64 - want).abs() < 1e-4, "n={n}");
            let mut y = b.clone();
            (ops.axpy)(&mut y, &a, 0.5);
            (ops.scale)(&mut y, 2.0);
            for i in 0..n {
                assert!((y[i] - 2.0 * (b[i] + 0.5 * a[i])).abs() < 1e-5);
            }
            let h: Vec<u8> = a.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
            let mut f = vec![0f32; n];
            (ops.f16_to_f32)(&h, &mut f);
            for i in 0..n {
                assert_eq!(f[i], half::f16::from_f32(a[i]).to_f32());
            }
        }
    }
}
