//! The tests' one measure of how far float values are from a reference: the
//! normalised mean squared error of ggml's `test-backend-ops`.
#![allow(dead_code)]

/// Normalised mean squared error of `a` against the reference `b`:
/// `Σ(a−b)² / Σb²` (ggml's `test-backend-ops` measure), each term in f64,
/// over the positions both slices have (the shorter length; callers compare
/// lengths themselves).
///
/// When the reference is all zeros (`Σb² = 0`) the ratio is undefined; here
/// an all-zero output equals it (0) and any other output is infinitely far
/// (`f64::INFINITY`, which fails every bound): an absolute `Σ(a−b)²` in its
/// place would let a small wrong output pass a relative bound.
///
/// Non-finite values are not special-cased: a NaN or an infinity in either
/// slice makes the result NaN or infinite, which fails every `e <= bound`
/// check. Callers with their own rule for non-finite values apply it and
/// measure the rest with [`nmse_finite`].
pub fn nmse<T: Copy + Into<f64>>(a: &[T], b: &[T]) -> f64 {
    ratio(a.iter().zip(b).map(|(&x, &y)| (x.into(), y.into())))
}

/// [`nmse`] over the positions where both values are finite; the caller
/// decides what the other positions mean.
pub fn nmse_finite<T: Copy + Into<f64>>(a: &[T], b: &[T]) -> f64 {
    ratio(a.iter().zip(b).map(|(&x, &y)| (x.into(), y.into())).filter(|(x, y)| x.is_finite() && y.is_finite()))
}

/// `Σ(x−y)² / Σy²` over `pairs`, with the zero-reference rule of [`nmse`].
fn ratio(pairs: impl Iterator<Item = (f64, f64)>) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in pairs {
        num += (x - y) * (x - y);
        den += y * y;
    }
    match (num == 0.0, den == 0.0) {
        (true, true) => 0.0,
        (false, true) => f64::INFINITY,
        _ => num / den,
    }
}
