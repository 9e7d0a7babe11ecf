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
    /// The scores of a block of F16 keys: see [`BlockF16`].
    pub scores_f16: fn(&BlockF16, &[f32], &mut [f32]),
    /// The weighted sum of a block of F16 values: see [`BlockF16`].
    pub accum_f16: fn(&BlockF16, &[f32], &mut [f32]),
}

/// A block of `n` F16 rows of `d` values read for `nt` query rows: query
/// row `t` reads row `j` at byte `j·stride + offs[t]` of `rows` (which holds
/// them all), with `live[j]` false for rows no query row reads.
///
/// `scores_f16(b, q, out)`: `out[t·KV_BLOCK_STRIDE + j] = Σ_i q[t·d + i]·row_j[i]`
/// for live rows. `accum_f16(b, p, acc)`: `acc[t·d + i] += Σ_j p[t·stride_p + j]·row_j[i]`
/// over live rows, `stride_p` = [`BlockF16::p_stride`].
pub(crate) struct BlockF16<'a> {
    pub rows: &'a [u8],
    /// Per query row: where its row starts within each block row (bytes;
    /// GQA heads of one cell row), at most `max_off`.
    pub offs: &'a [usize],
    pub max_off: usize,
    pub stride: usize,
    pub n: usize,
    pub d: usize,
    pub nt: usize,
    pub live: &'a [bool],
    /// Stride of a query row's scores / weights.
    pub p_stride: usize,
}

fn scores_f16_portable(b: &BlockF16, q: &[f32], out: &mut [f32]) {
    for j in (0..b.n).filter(|&j| b.live[j]) {
        for t in 0..b.nt {
            let o = j * b.stride + b.offs[t];
            out[t * b.p_stride + j] = dot_f16_portable(&q[t * b.d..(t + 1) * b.d], &b.rows[o..o + 2 * b.d]);
        }
    }
}

fn accum_f16_portable(b: &BlockF16, p: &[f32], acc: &mut [f32]) {
    for j in (0..b.n).filter(|&j| b.live[j]) {
        for t in 0..b.nt {
            let w = p[t * b.p_stride + j];
            if w != 0.0 {
                let o = j * b.stride + b.offs[t];
                axpy_f16_portable(&mut acc[t * b.d..(t + 1) * b.d], &b.rows[o..o + 2 * b.d], w);
            }
        }
    }
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
                return VecOps {
                    dot: x86::dot,
                    axpy: x86::axpy,
                    scale: x86::scale,
                    f16_to_f32: x86::f16_to_f32,
                    scores_f16: x86::scores_f16,
                    accum_f16: x86::accum_f16,
                };
            }
        }
        VecOps {
            dot: dot_lanes,
            axpy: axpy_lanes,
            scale: scale_lanes,
            f16_to_f32: f16_to_f32_portable,
            scores_f16: scores_f16_portable,
            accum_f16: accum_f16_portable,
        }
    }
}

fn dot_f16_portable(a: &[f32], x: &[u8]) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, (&ai, b)) in a.iter().zip(x.chunks_exact(2)).enumerate() {
        acc[i % LANES] += ai * half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
    acc.iter().sum()
}

fn axpy_f16_portable(y: &mut [f32], x: &[u8], a: f32) {
    for (yi, b) in y.iter_mut().zip(x.chunks_exact(2)) {
        *yi += half::f16::from_le_bytes([b[0], b[1]]).to_f32() * a;
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

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: AVX2 and FMA were detected (`VecOps::detect`) before the safe wrapper `dot` was
        // handed out; every load reads index i + 8 ≤ n or, in the tail, i < n, with
        // n = min(a.len(), b.len()).
        unsafe {
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
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn axpy_avx2(y: &mut [f32], x: &[f32], a: f32) {
        // SAFETY: AVX2 and FMA were detected (`VecOps::detect`); every load/store touches indices
        // below n = min(y.len(), x.len()), and `y` (&mut) cannot alias `x`.
        unsafe {
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
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn scale_avx2(y: &mut [f32], s: f32) {
        // SAFETY: AVX2 and FMA were detected (`VecOps::detect`); every load/store at `py + i` stays
        // below n = y.len(), which is exclusively borrowed.
        unsafe {
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
    }

    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_to_f32_f16c(src: &[u8], out: &mut [f32]) {
        // SAFETY: AVX2 and F16C were detected (`VecOps::detect`); with
        // n = min(out.len(), src.len() / 2), the 16-byte load at 2·i and the 8-float store at i stay
        // inside `src`/`out` while i + 8 ≤ n, and the tail reads bytes 2·i, 2·i + 1 < src.len() for
        // i < n.
        unsafe {
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
    }

    /// [`super::BlockF16`] scores: each live row converted once (in 8-value
    /// pieces) and dotted with every query row.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `b`, `q` and `out` must satisfy the asserts of
    /// `scores_f16` (rows hold `(n - 1)·stride + max_off + 2·d` bytes, every `offs[t] ≤ max_off`,
    /// `q` holds `nt·d` floats, `out` holds `(nt - 1)·p_stride + n` floats).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_f16_avx2(b: &super::BlockF16, q: &[f32], out: &mut [f32]) {
        // SAFETY: AVX2, FMA and F16C were detected (`VecOps::detect`), and the asserts in
        // `scores_f16` bound every access: `offs.get_unchecked(t)` has t < nt ≤ offs.len(); the row
        // pointer plus 2·d bytes lies within `rows` since offs[t] ≤ max_off; `qt + d` lies within
        // `q` (nt·d floats); and `out[t·p_stride + j]` is below the asserted `out` length.
        unsafe {
            let d8 = b.d / 8 * 8;
            for j in (0..b.n).filter(|&j| b.live[j]) {
                for t in 0..b.nt {
                    let row = b.rows.as_ptr().add(j * b.stride + *b.offs.get_unchecked(t));
                    let qt = q.as_ptr().add(t * b.d);
                    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                    let mut i = 0;
                    // SAFETY: 16 bytes of the row at 2·i and 8 floats of q at i
                    // lie inside their slices while i + 8 ≤ d (checked by the callers).
                    while i + 16 <= d8 {
                        a0 = _mm256_fmadd_ps(
                            _mm256_loadu_ps(qt.add(i)),
                            _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * i) as *const __m128i)),
                            a0,
                        );
                        a1 = _mm256_fmadd_ps(
                            _mm256_loadu_ps(qt.add(i + 8)),
                            _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * i + 16) as *const __m128i)),
                            a1,
                        );
                        i += 16;
                    }
                    while i + 8 <= d8 {
                        a0 = _mm256_fmadd_ps(
                            _mm256_loadu_ps(qt.add(i)),
                            _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * i) as *const __m128i)),
                            a0,
                        );
                        i += 8;
                    }
                    let mut sum = hsum(_mm256_add_ps(a0, a1));
                    while i < b.d {
                        sum += *qt.add(i) * half::f16::from_le_bytes([*row.add(2 * i), *row.add(2 * i + 1)]).to_f32();
                        i += 1;
                    }
                    *out.get_unchecked_mut(t * b.p_stride + j) = sum;
                }
            }
        }
    }

    /// [`super::BlockF16`] accumulation: each query row's weighted rows,
    /// converted in 8-value pieces.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `b`, `p` and `acc` must satisfy the asserts of
    /// `accum_f16` (as for `scores_f16_avx2`, with `acc` holding `nt·d` floats and `p` holding
    /// `(nt - 1)·p_stride + n`).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accum_f16_avx2(b: &super::BlockF16, p: &[f32], acc: &mut [f32]) {
        // SAFETY: AVX2, FMA and F16C were detected (`VecOps::detect`), and the asserts in
        // `accum_f16` bound every access: `acc + t·d .. + d` lies within `acc` (nt·d floats),
        // `p[t·p_stride + j]` is below the asserted `p` length, `offs.get_unchecked(t)` has
        // t < nt ≤ offs.len(), and each row plus 2·d bytes lies within `rows` since offs[t] ≤ max_off.
        unsafe {
            let d8 = b.d / 8 * 8;
            for t in 0..b.nt {
                let at = acc.as_mut_ptr().add(t * b.d);
                for j in (0..b.n).filter(|&j| b.live[j]) {
                    let w = *p.get_unchecked(t * b.p_stride + j);
                    if w == 0.0 {
                        continue;
                    }
                    let row = b.rows.as_ptr().add(j * b.stride + *b.offs.get_unchecked(t));
                    let vw = _mm256_set1_ps(w);
                    let mut i = 0;
                    // SAFETY: as in `scores_f16_avx2`; acc holds nt·d floats.
                    while i + 8 <= d8 {
                        let v = _mm256_cvtph_ps(_mm_loadu_si128(row.add(2 * i) as *const __m128i));
                        _mm256_storeu_ps(at.add(i), _mm256_fmadd_ps(v, vw, _mm256_loadu_ps(at.add(i))));
                        i += 8;
                    }
                    while i < b.d {
                        let v = half::f16::from_le_bytes([*row.add(2 * i), *row.add(2 * i + 1)]).to_f32();
                        *at.add(i) = v.mul_add(w, *at.add(i));
                        i += 1;
                    }
                }
            }
        }
    }

    pub(super) fn scores_f16(b: &super::BlockF16, q: &[f32], out: &mut [f32]) {
        assert!(
            b.live.len() >= b.n
                && q.len() >= b.nt * b.d
                && out.len() >= b.nt.saturating_sub(1) * b.p_stride + b.n.max(1)
        );
        assert!(b.offs.len() >= b.nt && b.offs.iter().take(b.nt).all(|&o| o <= b.max_off));
        assert!(b.n == 0 || b.rows.len() >= (b.n - 1) * b.stride + b.max_off + 2 * b.d);
        // SAFETY: AVX2, FMA and F16C were detected (`VecOps::detect`); the
        // asserts above keep every read and write inside the slices.
        unsafe { scores_f16_avx2(b, q, out) }
    }

    pub(super) fn accum_f16(b: &super::BlockF16, p: &[f32], acc: &mut [f32]) {
        assert!(
            b.live.len() >= b.n
                && acc.len() >= b.nt * b.d
                && p.len() >= b.nt.saturating_sub(1) * b.p_stride + b.n.max(1)
        );
        assert!(b.offs.len() >= b.nt && b.offs.iter().take(b.nt).all(|&o| o <= b.max_off));
        assert!(b.n == 0 || b.rows.len() >= (b.n - 1) * b.stride + b.max_off + 2 * b.d);
        // SAFETY: as above.
        unsafe { accum_f16_avx2(b, p, acc) }
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
            // The fused F16 forms equal convert-then-f32.
            let dot32 = |x: &[f32]| x.iter().zip(&f).map(|(x, y)| *x as f64 * *y as f64).sum::<f64>() as f32;
            assert!((dot_f16_portable(&b, &h) - dot32(&b)).abs() < 1e-4, "n={n}");
            // Blocks of rows: the vector and portable forms agree with the row forms.
            if n >= 1 {
                let rows: Vec<u8> = h.iter().chain(h.iter()).chain(h.iter()).copied().collect();
                let live = [true, false, true];
                let blk = BlockF16 {
                    rows: &rows,
                    offs: &[0, 0],
                    max_off: 0,
                    stride: 2 * n,
                    n: 3,
                    d: n,
                    nt: 2,
                    live: &live,
                    p_stride: 4,
                };
                let q: Vec<f32> = b.iter().chain(a.iter()).copied().collect();
                for scores in [ops.scores_f16, scores_f16_portable] {
                    let mut out = vec![7f32; 8];
                    scores(&blk, &q, &mut out);
                    let (w0, w1) = (dot32(&b), dot32(&a));
                    for (k, want) in [(0, w0), (2, w0), (4, w1), (6, w1)] {
                        assert!((out[k] - want).abs() < 1e-4, "n={n} score {k}");
                    }
                    assert_eq!((out[1], out[5]), (7.0, 7.0), "dead rows untouched");
                }
                for accum in [ops.accum_f16, accum_f16_portable] {
                    let p = [0.5f32, 9.0, 0.25, 0.0, 1.0, 9.0, 0.0, 0.0];
                    let mut acc = vec![0f32; 2 * n];
                    accum(&blk, &p, &mut acc);
                    for i in 0..n {
                        assert!((acc[i] - 0.75 * f[i]).abs() < 1e-5 && (acc[n + i] - f[i]).abs() < 1e-5, "n={n}");
                    }
                }
            }
            let mut y1 = b.clone();
            axpy_f16_portable(&mut y1, &h, 0.25);
            for i in 0..n {
                assert!((y1[i] - (b[i] + 0.25 * f[i])).abs() < 1e-6, "n={n}");
            }
        }
    }
}
