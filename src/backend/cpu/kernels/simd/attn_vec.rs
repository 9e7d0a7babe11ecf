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
    /// The scores of a block of F16 keys: see [`BlockF16`] (the last
    /// argument is scratch of at least `n·d` floats).
    pub scores_f16: fn(&BlockF16, &[f32], &mut [f32], &mut [f32]),
    /// The weighted sum of a block of F16 values: see [`BlockF16`] (the
    /// last argument is scratch of at least `n·d` floats).
    pub accum_f16: fn(&BlockF16, &[f32], &mut [f32], &mut [f32]),
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

fn scores_f16_portable(b: &BlockF16, q: &[f32], out: &mut [f32], _conv: &mut [f32]) {
    for j in (0..b.n).filter(|&j| b.live[j]) {
        for t in 0..b.nt {
            let o = j * b.stride + b.offs[t];
            out[t * b.p_stride + j] = dot_f16_portable(&q[t * b.d..(t + 1) * b.d], &b.rows[o..o + 2 * b.d]);
        }
    }
}

fn accum_f16_portable(b: &BlockF16, p: &[f32], acc: &mut [f32], _conv: &mut [f32]) {
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

    /// [`super::BlockF16`] scores, each query row dotted with the F16 rows
    /// as they are (converted in the dot, in 8-value pieces): for blocks
    /// whose K heads have few query rows (decoding), read in cell order.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `b`, `q` and `out` must satisfy the asserts of
    /// `scores_f16` (rows hold `(n - 1)·stride + max_off + 2·d` bytes, every `offs[t] ≤ max_off`,
    /// `q` holds `nt·d` floats, `out` holds `(nt - 1)·p_stride + n` floats).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_f16_direct(b: &super::BlockF16, q: &[f32], out: &mut [f32]) {
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
    /// converted in 8-value pieces (the counterpart of `scores_f16_direct`).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `b`, `p` and `acc` must satisfy the asserts of
    /// `accum_f16` (as for `scores_f16_avx2`, with `acc` holding `nt·d` floats and `p` holding
    /// `(nt - 1)·p_stride + n`).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accum_f16_direct(b: &super::BlockF16, p: &[f32], acc: &mut [f32]) {
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

    /// Fewest query rows of one K/V head for which a block's rows of that
    /// head are converted once and shared (`scores_f16_avx2`,
    /// `accum_f16_avx2`); with fewer (decoding: a GQA group of one
    /// position) the rows are read in cell order and converted in the dot,
    /// which measured faster at 4000 cells (14.6 against 11.2 tokens/s on
    /// a Qwen3-0.6B shape).
    const SHARED_ROWS: u32 = 4;

    /// True if some K/V head of `b` has [`SHARED_ROWS`] query rows or more.
    fn shared(b: &super::BlockF16) -> bool {
        head_groups(b).any(|g| g.count_ones() >= SHARED_ROWS)
    }

    /// The query rows of `b` grouped by the byte offset they read their
    /// block rows at (one K/V head each), as bit sets, in the order of
    /// their first rows (`nt ≤ 64`).
    fn head_groups<'b>(b: &'b super::BlockF16<'_>) -> impl Iterator<Item = u64> + 'b {
        let mut left: u64 = if b.nt >= 64 { u64::MAX } else { (1u64 << b.nt) - 1 };
        std::iter::from_fn(move || {
            (left != 0).then(|| {
                let o = b.offs[left.trailing_zeros() as usize];
                let group = (0..b.nt).filter(|&t| left >> t & 1 == 1 && b.offs[t] == o).fold(0, |m, t| m | 1 << t);
                left &= !group;
                group
            })
        })
    }

    /// The positions of the bits set in `m`, ascending: the first `.1` of
    /// the array.
    fn bit_positions(m: u64) -> ([usize; 64], usize) {
        let (mut at, mut n) = ([0usize; 64], 0);
        for i in (0..64).filter(|&i| m >> i & 1 == 1) {
            (at[n], n) = (i, n + 1);
        }
        (at, n)
    }

    /// The live block rows at byte offset `off` of `b`, converted to f32
    /// once into `conv` (row `j` at `j·d`).
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C; `off ≤ b.max_off`, `conv` holds
    /// `n·d` floats and `b.rows` satisfies the asserts of `scores_f16`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn convert_rows(b: &super::BlockF16, off: usize, conv: &mut [f32]) {
        for j in (0..b.n).filter(|&j| b.live[j]) {
            let row = &b.rows[j * b.stride + off..j * b.stride + off + 2 * b.d];
            // SAFETY: the caller's features; both slices are bounds-checked above.
            unsafe { f16_to_f32_f16c(row, &mut conv[j * b.d..(j + 1) * b.d]) };
        }
    }

    /// Dots of `R` query rows with `K` converted key rows (`d` floats each),
    /// each summed exactly as a one-row, one-key dot of the F16 row: two
    /// 8-lane accumulators over alternate pieces of 8, the odd piece into the
    /// first, their horizontal sum, then the scalar tail (so a row's score
    /// does not depend on which rows share its tile).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; every pointer is valid for `d` floats.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn dot_tile<const R: usize, const K: usize>(
        q: [*const f32; R],
        k: [*const f32; K],
        d: usize,
    ) -> [[f32; K]; R] {
        // SAFETY: loads at i + 8 ≤ d8 ≤ d and the tail below d (the contract).
        unsafe {
            let d8 = d / 8 * 8;
            let mut a0 = [[_mm256_setzero_ps(); K]; R];
            let mut a1 = [[_mm256_setzero_ps(); K]; R];
            let mut i = 0;
            while i + 16 <= d8 {
                let kv: [__m256; K] = std::array::from_fn(|c| _mm256_loadu_ps(k[c].add(i)));
                let kw: [__m256; K] = std::array::from_fn(|c| _mm256_loadu_ps(k[c].add(i + 8)));
                for r in 0..R {
                    let (x, y) = (_mm256_loadu_ps(q[r].add(i)), _mm256_loadu_ps(q[r].add(i + 8)));
                    for c in 0..K {
                        a0[r][c] = _mm256_fmadd_ps(x, kv[c], a0[r][c]);
                        a1[r][c] = _mm256_fmadd_ps(y, kw[c], a1[r][c]);
                    }
                }
                i += 16;
            }
            if i + 8 <= d8 {
                for r in 0..R {
                    let x = _mm256_loadu_ps(q[r].add(i));
                    for c in 0..K {
                        a0[r][c] = _mm256_fmadd_ps(x, _mm256_loadu_ps(k[c].add(i)), a0[r][c]);
                    }
                }
                i += 8;
            }
            let mut out = [[0f32; K]; R];
            for r in 0..R {
                for c in 0..K {
                    let mut sum = hsum(_mm256_add_ps(a0[r][c], a1[r][c]));
                    for e in i..d {
                        sum += *q[r].add(e) * *k[c].add(e);
                    }
                    out[r][c] = sum;
                }
            }
            out
        }
    }

    /// [`super::BlockF16`] scores: per K head (the rows sharing a byte
    /// offset), its live rows converted to f32 once, then dotted with that
    /// head's query rows two rows × two keys at a time.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `b`, `q`, `out` and
    /// `conv` must satisfy the asserts of `scores_f16` (rows hold
    /// `(n - 1)·stride + max_off + 2·d` bytes, every `offs[t] ≤ max_off`,
    /// `q` holds `nt·d` floats, `out` holds `(nt - 1)·p_stride + n` floats,
    /// `conv` `n·d`, `nt ≤ 64`).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_f16_avx2(b: &super::BlockF16, q: &[f32], out: &mut [f32], conv: &mut [f32]) {
        let d = b.d;
        let (live_at, n_live) = bit_positions((0..b.n).filter(|&j| b.live[j]).fold(0, |m, j| m | 1 << j));
        let live = &live_at[..n_live];
        for group in head_groups(b) {
            // SAFETY: the caller's features and bounds (every offset ≤ max_off).
            unsafe { convert_rows(b, b.offs[group.trailing_zeros() as usize], conv) };
            let (rows_at, n_rows) = bit_positions(group);
            let rows = &rows_at[..n_rows];
            let (qp, kp) = (q.as_ptr(), conv.as_ptr());
            // SAFETY: query row t holds d floats at t·d < nt·d; converted row
            // j at j·d < n·d; the asserted `out` length covers t·p_stride + j.
            unsafe {
                let mut put = |t: usize, j: usize, v: f32| *out.get_unchecked_mut(t * b.p_stride + j) = v;
                for tr in rows.chunks(2) {
                    let mut jc = live.chunks_exact(2);
                    for jj in &mut jc {
                        let k = [kp.add(jj[0] * d), kp.add(jj[1] * d)];
                        if let [ta, tb] = *tr {
                            let s = dot_tile::<2, 2>([qp.add(ta * d), qp.add(tb * d)], k, d);
                            put(ta, jj[0], s[0][0]);
                            put(ta, jj[1], s[0][1]);
                            put(tb, jj[0], s[1][0]);
                            put(tb, jj[1], s[1][1]);
                        } else {
                            let s = dot_tile::<1, 2>([qp.add(tr[0] * d)], k, d);
                            put(tr[0], jj[0], s[0][0]);
                            put(tr[0], jj[1], s[0][1]);
                        }
                    }
                    for &j in jc.remainder() {
                        for &t in tr {
                            put(t, j, dot_tile::<1, 1>([qp.add(t * d)], [kp.add(j * d)], d)[0][0]);
                        }
                    }
                }
            }
        }
    }

    /// [`super::BlockF16`] accumulation: per V head (the rows sharing a
    /// byte offset), its live rows converted to f32 once; then per query
    /// row, 64 values of its accumulator at a time kept in registers over
    /// the block's rows. Each value gets the same fused multiply-adds in
    /// the same order as a row-at-a-time accumulation (rows of weight 0
    /// skipped), so the result does not depend on the tile.
    ///
    /// # Safety
    /// As for `scores_f16_avx2`, with `acc` holding `nt·d` floats and `p`
    /// holding `(nt - 1)·p_stride + n`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accum_f16_avx2(b: &super::BlockF16, p: &[f32], acc: &mut [f32], conv: &mut [f32]) {
        let d = b.d;
        let d8 = d / 8 * 8;
        let mut w = [0f32; 64];
        let mut js = [0usize; 64];
        for group in head_groups(b) {
            // SAFETY: the caller's features and bounds.
            unsafe { convert_rows(b, b.offs[group.trailing_zeros() as usize], conv) };
            let vp = conv.as_ptr();
            let (rows_at, n_rows) = bit_positions(group);
            for &t in &rows_at[..n_rows] {
                // The rows this query row weighs, in order.
                let mut nw = 0;
                for j in (0..b.n).filter(|&j| b.live[j]) {
                    let x = p[t * b.p_stride + j];
                    if x != 0.0 {
                        (w[nw], js[nw]) = (x, j);
                        nw += 1;
                    }
                }
                // SAFETY: accumulator t holds d floats at t·d < nt·d; converted
                // rows hold d floats at j·d < n·d; loads and stores below d8
                // in pieces of 8, the tail below d.
                unsafe {
                    let at = acc.as_mut_ptr().add(t * d);
                    let mut i = 0;
                    while i + 64 <= d8 {
                        let mut a: [__m256; 8] = std::array::from_fn(|l| _mm256_loadu_ps(at.add(i + 8 * l)));
                        for k in 0..nw {
                            let (vw, row) = (_mm256_set1_ps(w[k]), vp.add(js[k] * d + i));
                            for (l, al) in a.iter_mut().enumerate() {
                                *al = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(8 * l)), vw, *al);
                            }
                        }
                        for (l, al) in a.iter().enumerate() {
                            _mm256_storeu_ps(at.add(i + 8 * l), *al);
                        }
                        i += 64;
                    }
                    while i + 8 <= d8 {
                        let mut a = _mm256_loadu_ps(at.add(i));
                        for k in 0..nw {
                            a = _mm256_fmadd_ps(_mm256_loadu_ps(vp.add(js[k] * d + i)), _mm256_set1_ps(w[k]), a);
                        }
                        _mm256_storeu_ps(at.add(i), a);
                        i += 8;
                    }
                    while i < d {
                        for k in 0..nw {
                            *at.add(i) = (*vp.add(js[k] * d + i)).mul_add(w[k], *at.add(i));
                        }
                        i += 1;
                    }
                }
            }
        }
    }

    pub(super) fn scores_f16(b: &super::BlockF16, q: &[f32], out: &mut [f32], conv: &mut [f32]) {
        assert!(
            b.live.len() >= b.n
                && q.len() >= b.nt * b.d
                && out.len() >= b.nt.saturating_sub(1) * b.p_stride + b.n.max(1)
                && conv.len() >= b.n * b.d
                && b.nt <= 64
                && b.n <= 64
        );
        assert!(b.offs.len() >= b.nt && b.offs.iter().take(b.nt).all(|&o| o <= b.max_off));
        assert!(b.n == 0 || b.rows.len() >= (b.n - 1) * b.stride + b.max_off + 2 * b.d);
        // SAFETY: AVX2, FMA and F16C were detected (`VecOps::detect`); the
        // asserts above keep every read and write inside the slices.
        unsafe {
            if shared(b) {
                scores_f16_avx2(b, q, out, conv)
            } else {
                scores_f16_direct(b, q, out)
            }
        }
    }

    pub(super) fn accum_f16(b: &super::BlockF16, p: &[f32], acc: &mut [f32], conv: &mut [f32]) {
        assert!(
            b.live.len() >= b.n
                && acc.len() >= b.nt * b.d
                && p.len() >= b.nt.saturating_sub(1) * b.p_stride + b.n.max(1)
                && conv.len() >= b.n * b.d
                && b.nt <= 64
                && b.n <= 64
        );
        assert!(b.offs.len() >= b.nt && b.offs.iter().take(b.nt).all(|&o| o <= b.max_off));
        assert!(b.n == 0 || b.rows.len() >= (b.n - 1) * b.stride + b.max_off + 2 * b.d);
        // SAFETY: as above.
        unsafe {
            if shared(b) {
                accum_f16_avx2(b, p, acc, conv)
            } else {
                accum_f16_direct(b, p, acc)
            }
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
                    scores(&blk, &q, &mut out, &mut vec![0f32; 3 * n]);
                    let (w0, w1) = (dot32(&b), dot32(&a));
                    for (k, want) in [(0, w0), (2, w0), (4, w1), (6, w1)] {
                        assert!((out[k] - want).abs() < 1e-4, "n={n} score {k}");
                    }
                    assert_eq!((out[1], out[5]), (7.0, 7.0), "dead rows untouched");
                }
                for accum in [ops.accum_f16, accum_f16_portable] {
                    let p = [0.5f32, 9.0, 0.25, 0.0, 1.0, 9.0, 0.0, 0.0];
                    let mut acc = vec![0f32; 2 * n];
                    accum(&blk, &p, &mut acc, &mut vec![0f32; 3 * n]);
                    for i in 0..n {
                        assert!((acc[i] - 0.75 * f[i]).abs() < 1e-5 && (acc[n + i] - f[i]).abs() < 1e-5, "n={n}");
                    }
                }
            }
            if n >= 1 {
                tile_independent(&ops, n);
            }
            let mut y1 = b.clone();
            axpy_f16_portable(&mut y1, &h, 0.25);
            for i in 0..n {
                assert!((y1[i] - (b[i] + 0.25 * f[i])).abs() < 1e-6, "n={n}");
            }
        }
    }

    /// The F16 block kernels give each query row exactly what a block read
    /// by that row alone gives (bit for bit), whatever rows share its tile
    /// and K/V head: 10 rows over 3 heads (offsets; one head of 4 rows, so
    /// converted once, the others read as they are), 5 keys with one dead,
    /// some weights 0.
    fn tile_independent(ops: &VecOps, d: usize) {
        let (n, heads, nt) = (5usize, 3usize, 10usize);
        let stride = 2 * d * heads;
        let rows: Vec<u8> = (0..n * heads * d)
            .flat_map(|i| half::f16::from_f32(((i * 7919) % 1000) as f32 / 250.0 - 2.0).to_le_bytes())
            .collect();
        let offs: Vec<usize> = (0..nt).map(|t| (t * 2 % heads) * 2 * d).collect();
        let live = [true, true, false, true, true];
        let q: Vec<f32> = (0..nt * d).map(|i| ((i * 613) % 997) as f32 / 400.0 - 1.2).collect();
        let p: Vec<f32> = (0..nt * 8).map(|i| if i % 5 == 1 { 0.0 } else { (i % 13) as f32 / 7.0 }).collect();
        let blk = |offs: &[usize]| BlockF16 {
            rows: &rows,
            offs: offs.to_vec().leak(),
            max_off: (heads - 1) * 2 * d,
            stride,
            n,
            d,
            nt: offs.len(),
            live: &live,
            p_stride: 8,
        };
        let mut conv = vec![0f32; n * d];
        let mut all = vec![0f32; nt * 8];
        (ops.scores_f16)(&blk(&offs), &q, &mut all, &mut conv);
        let mut acc_all: Vec<f32> = (0..nt * d).map(|i| i as f32 * 0.01).collect();
        let init = acc_all.clone();
        (ops.accum_f16)(&blk(&offs), &p, &mut acc_all, &mut conv);
        for t in 0..nt {
            let mut one = vec![0f32; 8];
            (ops.scores_f16)(&blk(&offs[t..t + 1]), &q[t * d..(t + 1) * d], &mut one, &mut conv);
            for j in (0..n).filter(|&j| live[j]) {
                assert_eq!(one[j].to_bits(), all[t * 8 + j].to_bits(), "d={d}: score of row {t}, key {j}");
            }
            let mut acc = init[t * d..(t + 1) * d].to_vec();
            (ops.accum_f16)(&blk(&offs[t..t + 1]), &p[t * 8..(t + 1) * 8], &mut acc, &mut conv);
            assert_eq!(acc, acc_all[t * d..(t + 1) * d], "d={d}: accumulator of row {t}");
        }
    }
}
