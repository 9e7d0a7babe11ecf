//! Partial addends for the split tests: a leaf in the partial state gets one
//! addend per device, each comparable in size to the value it is part of, so
//! a reduction that drops, doubles or mis-sums the addend of ANY device
//! (not only the first or the last) is off by a large fraction of the value.
//!
//! Per tensor, the float addends are `x · r_j` for fixed ratios `r_j` with
//! `|r_j| ∈ [0.5, 2]` and `Σ r_j = 1` (each rounded to a grid, the last one
//! the exact remainder), so dropping device `j` leaves `(1 − r_j)·x` and
//! doubling it gives `(1 + r_j)·x`: an NMSE of `r_j² ≥ 0.25` either way.
//! The sum is exact in any order: values lie on a grid ([`grid`]: `2^-16`
//! for F32, `2^-6` for F16) with `|x| ≤ 2`, so every addend is a multiple
//! of the grid below 4 in magnitude and every sub-sum of up to
//! [`MAX_DEVICES`] addends stays under 32, which F32 (24 bits) and F16 (11
//! bits) hold exactly on those grids. Fills that feed partial leafs round
//! their values with [`on_grid`]. I32/I64 addends are random non-zero
//! integers with the remainder on the last device (wrapping sums are exact).
#![allow(dead_code)]

#[path = "rng.rs"]
pub mod rng;

use shardgraph::GgmlType;

/// The most devices [`addends`] splits a value over (the exactness bound).
pub const MAX_DEVICES: usize = 7;

/// The grid the values of a `ty` leaf lie on so that [`addends`] can split
/// them exactly; `None` for types split as "whole value on device 0".
pub fn grid(ty: GgmlType) -> Option<f64> {
    match ty {
        GgmlType::F32 => Some(1.0 / 65536.0),
        GgmlType::F16 => Some(1.0 / 64.0),
        _ => None,
    }
}

/// `v` clamped to `[-2, 2]` and rounded to the grid of `ty` (unchanged for
/// a type without one).
pub fn on_grid(ty: GgmlType, v: f32) -> f32 {
    match grid(ty) {
        Some(g) => ((v.clamp(-2.0, 2.0) as f64 / g).round() * g) as f32,
        None => v,
    }
}

/// The per-tensor ratios `r_j` (`|r_j| ∈ [0.5, 2]`, `Σ r_j = 1`) for `n`
/// devices from `seed`.
fn ratios(n: usize, seed: u64) -> Vec<f64> {
    let mut r = rng::Rng::new(seed);
    if n == 1 {
        return vec![1.0];
    }
    loop {
        let mut v: Vec<f64> = (0..n - 1)
            .map(|_| {
                let m = 0.5 + r.below(1025) as f64 / 1024.0;
                if r.next() & 1 == 0 {
                    m
                } else {
                    -m
                }
            })
            .collect();
        let last = 1.0 - v.iter().sum::<f64>();
        if (0.5..=2.0).contains(&last.abs()) {
            v.push(last);
            return v;
        }
    }
}

fn floats(ty: GgmlType, bytes: &[u8]) -> Vec<f64> {
    match ty {
        GgmlType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        _ => bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
    }
}

/// `v` as `ty` bytes; panics if a value is not exactly representable.
fn float_bytes(ty: GgmlType, v: &[f64]) -> Vec<u8> {
    match ty {
        GgmlType::F32 => v
            .iter()
            .flat_map(|&x| {
                assert_eq!(x as f32 as f64, x, "addend {x} is not exact in f32");
                (x as f32).to_le_bytes()
            })
            .collect(),
        _ => v
            .iter()
            .flat_map(|&x| {
                let h = half::f16::from_f64(x);
                assert_eq!(h.to_f64(), x, "addend {x} is not exact in f16");
                h.to_le_bytes()
            })
            .collect(),
    }
}

/// Splits the value `full` (bytes of a `ty` tensor) into `n` addends, one
/// per device (see the module doc), drawn from `seed`. `None` for a type
/// without addends (BF16, quantized: the caller puts the whole value on
/// device 0).
///
/// # Panics
/// If `n > MAX_DEVICES`, or a float value is off its [`grid`] or larger
/// than 2 in magnitude (a fill that did not use [`on_grid`]).
pub fn addends(ty: GgmlType, full: &[u8], n: usize, seed: u64) -> Option<Vec<Vec<u8>>> {
    assert!((1..=MAX_DEVICES).contains(&n), "addends for {n} devices");
    match ty {
        GgmlType::F32 | GgmlType::F16 => {
            let g = grid(ty).unwrap();
            let v = floats(ty, full);
            for &x in &v {
                assert!(
                    x.abs() <= 2.0 && (x / g).fract() == 0.0,
                    "{ty} value {x} is off the addend grid {g} (fill the leaf through partial::on_grid)"
                );
            }
            let r = ratios(n, seed);
            let mut parts: Vec<Vec<f64>> = Vec::with_capacity(n);
            for &rj in &r[..n - 1] {
                parts.push(v.iter().map(|&x| (x * rj / g).round() * g).collect());
            }
            let last = v.iter().enumerate().map(|(i, &x)| x - parts.iter().map(|p| p[i]).sum::<f64>()).collect();
            parts.push(last);
            Some(parts.iter().map(|p| float_bytes(ty, p)).collect())
        }
        GgmlType::I32 | GgmlType::I64 => {
            let w = ty.type_size();
            let mut r = rng::Rng::new(seed);
            let v: Vec<i64> = full
                .chunks_exact(w)
                .map(|c| {
                    if w == 4 {
                        i32::from_le_bytes(c.try_into().unwrap()) as i64
                    } else {
                        i64::from_le_bytes(c.try_into().unwrap())
                    }
                })
                .collect();
            let mut parts: Vec<Vec<i64>> = (0..n - 1)
                .map(|_| {
                    v.iter()
                        .map(|_| {
                            let m = 1 + r.below(16) as i64;
                            if r.next() & 1 == 0 {
                                m
                            } else {
                                -m
                            }
                        })
                        .collect()
                })
                .collect();
            let last = v.iter().enumerate().map(|(i, &x)| x.wrapping_sub(parts.iter().map(|p| p[i]).sum())).collect();
            parts.push(last);
            Some(
                parts
                    .iter()
                    .map(|p| {
                        p.iter()
                            .flat_map(
                                |&x| if w == 4 { (x as i32).to_le_bytes().to_vec() } else { x.to_le_bytes().to_vec() },
                            )
                            .collect()
                    })
                    .collect(),
            )
        }
        _ => None,
    }
}

/// `Σ_j weights[j] · parts[j]` element-wise in f64 (a reduction that
/// drops device `j` has weight 0 there, one that doubles it weight 2), for
/// the tests that show a wrong reduction misses the bounds.
pub fn weighted_sum(ty: GgmlType, parts: &[Vec<u8>], weights: &[f64]) -> Vec<f64> {
    let decode = |b: &[u8]| -> Vec<f64> {
        match ty {
            GgmlType::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            GgmlType::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            _ => floats(ty, b),
        }
    };
    let mut out = decode(&parts[0]).iter().map(|x| x * weights[0]).collect::<Vec<_>>();
    for (p, w) in parts.iter().zip(weights).skip(1) {
        for (o, x) in out.iter_mut().zip(decode(p)) {
            *o += w * x;
        }
    }
    out
}

/// Every sub-sum of `parts` (F32/F16), summed in the type's own precision in
/// device order, equals the exact (f64) sub-sum: the sum is exact in any
/// order and grouping. Checked over all `2^n` subsets.
pub fn sums_exact(ty: GgmlType, parts: &[Vec<u8>]) -> bool {
    let n = parts.len();
    let vals: Vec<Vec<f64>> = parts.iter().map(|p| floats(ty, p)).collect();
    let round = |x: f64| -> f64 {
        match ty {
            GgmlType::F32 => x as f32 as f64,
            _ => half::f16::from_f64(x).to_f64(),
        }
    };
    (1u32..1 << n).all(|mask| {
        (0..vals[0].len()).all(|i| {
            let (mut acc, mut exact) = (0.0f64, 0.0f64);
            for (j, v) in vals.iter().enumerate() {
                if mask >> j & 1 == 1 {
                    acc = round(acc + v[i]);
                    exact += v[i];
                }
            }
            acc == exact
        })
    })
}
