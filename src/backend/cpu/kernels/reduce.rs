//! CPU kernels of the reduction family: `sum`, `sum_rows`, `mean`,
//! `argmax`, `top_k`, `argsort`.
//!
//! Accumulation follows ggml's CPU (`ops.cpp`, `vec.h`): F32 sums in f64
//! (`ggml_float`), F16/BF16 `sum` in f32 row by row; argmax keeps the last
//! maximal index as ggml's loop does. `top_k` and `argsort` are
//! deterministic: descending value then lower index for `top_k`, a stable
//! sort for `argsort` (ggml's `std::sort` / `partial_sort` leave ties
//! unspecified). Values compare by IEEE total order with −0 = +0, so NaN
//! never breaks the sort.

use super::elementwise::par_rows;
use super::{unsupported, TView};
use crate::error::Result;
use crate::ops::{Op, SortOrder};
use crate::tensor::GgmlType;
use rayon::prelude::*;
use std::cmp::Ordering;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    let Some(a) = src.first() else {
        return Err(unsupported(op, dst, src));
    };
    match op {
        Op::Sum => sum(op, dst, src, a),
        Op::SumRows | Op::Mean => row_sums(op, dst, src, a, matches!(op, Op::Mean)),
        Op::Argmax => argmax(op, dst, src, a),
        Op::TopK { k } => top_k(op, *k, dst, src, a),
        Op::Argsort { order } => argsort(op, *order, dst, src, a),
        _ => Err(unsupported(op, dst, src)),
    }
}

/// Sum of a row in f64, ggml's `ggml_vec_sum_f32_ggf` order.
#[inline]
fn sum_f64(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |s, &v| s + v as f64)
}

/// `sum`: every row summed (f64 for F32, f32 for F16/BF16, as ggml), the
/// row sums added in row order.
fn sum(op: &Op, dst: &TView, src: &[TView], a: &TView) -> Result<()> {
    if dst.nelements() != 1 {
        return Err(unsupported(op, dst, src));
    }
    let n0 = a.ne[0];
    let nrows = a.nrows();
    let wide = a.ty == GgmlType::F32;
    // Per-row sums in parallel, then combined sequentially so the result does
    // not depend on the thread count.
    let rows: Vec<f64> = (0..nrows)
        .into_par_iter()
        .map_init(
            || vec![0f32; n0],
            |x, r| -> Result<f64> {
                let (i1, i2, i3) = a.row_index(r);
                a.load_row_f32(i1, i2, i3, x)?;
                Ok(if wide { sum_f64(x) } else { x.iter().fold(0.0f32, |s, &v| s + v) as f64 })
            },
        )
        .collect::<Result<_>>()?;
    let total = if wide { rows.iter().sum::<f64>() as f32 } else { rows.iter().fold(0.0f32, |s, &v| s + v as f32) };
    dst.set_f32(0, 0, 0, 0, total);
    Ok(())
}

/// `sum_rows` / `mean`: one f64 sum per row, stored as f32 (mean divides in
/// f32 by `ne0`, as ggml).
fn row_sums(op: &Op, dst: &TView, src: &[TView], a: &TView, mean: bool) -> Result<()> {
    if dst.ne[0] != 1 || dst.ne[1..] != a.ne[1..] {
        return Err(unsupported(op, dst, src));
    }
    let n0 = a.ne[0];
    par_rows(
        a.nrows(),
        n0,
        || vec![0f32; n0],
        |x, r| {
            let (i1, i2, i3) = a.row_index(r);
            a.load_row_f32(i1, i2, i3, x)?;
            let mut s = sum_f64(x) as f32;
            if mean {
                s /= n0 as f32;
            }
            dst.set_f32(0, i1, i2, i3, s);
            Ok(())
        },
    )
}

/// Index of the maximum with ggml's update rule (`ggml_vec_argmax_f32`):
/// `max = max > x ? max : x; if max == x { idx = i }`, so ties keep the last
/// index.
pub(crate) fn argmax_row(x: &[f32]) -> usize {
    let mut max = f32::NEG_INFINITY;
    let mut idx = 0;
    for (i, &v) in x.iter().enumerate() {
        max = if max > v { max } else { v };
        if max == v {
            idx = i;
        }
    }
    idx
}

fn argmax(op: &Op, dst: &TView, src: &[TView], a: &TView) -> Result<()> {
    if a.ne[2] != 1 || a.ne[3] != 1 || dst.ne != [a.ne[1], 1, 1, 1] {
        return Err(unsupported(op, dst, src));
    }
    let n0 = a.ne[0];
    par_rows(
        a.ne[1],
        n0,
        || vec![0f32; n0],
        |x, r| {
            a.load_row_f32(r, 0, 0, x)?;
            dst.set_i32(r, 0, 0, 0, argmax_row(x) as i32);
            Ok(())
        },
    )
}

/// Total order on values with −0 and +0 equal (NaN sorts by its sign bit,
/// beyond ±∞).
#[inline]
fn cmp_val(a: f32, b: f32) -> Ordering {
    let canon = |v: f32| if v == 0.0 { 0.0f32 } else { v };
    canon(a).total_cmp(&canon(b))
}

/// Fills `idx` with the `k` indices of the largest values of `x`: descending
/// value, ties by lower index.
pub(crate) fn top_k_row(x: &[f32], k: usize, idx: &mut Vec<u32>) {
    idx.clear();
    idx.extend(0..x.len() as u32);
    let k = k.min(x.len());
    if k == 0 {
        idx.clear();
        return;
    }
    let key = |a: &u32, b: &u32| cmp_val(x[*b as usize], x[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, key);
        idx.truncate(k);
    }
    idx.sort_unstable_by(key);
}

fn top_k(op: &Op, k: i32, dst: &TView, src: &[TView], a: &TView) -> Result<()> {
    let k = usize::try_from(k).unwrap_or(usize::MAX);
    if k > a.ne[0] || dst.ne != [k, a.ne[1], a.ne[2], a.ne[3]] {
        return Err(unsupported(op, dst, src));
    }
    let n0 = a.ne[0];
    par_rows(
        a.nrows(),
        n0,
        || (vec![0f32; n0], Vec::with_capacity(n0)),
        |(x, idx), r| {
            let (i1, i2, i3) = a.row_index(r);
            a.load_row_f32(i1, i2, i3, x)?;
            top_k_row(x, k, idx);
            for (j, &i) in idx.iter().enumerate() {
                dst.set_i32(j, i1, i2, i3, i as i32);
            }
            Ok(())
        },
    )
}

fn argsort(op: &Op, order: SortOrder, dst: &TView, src: &[TView], a: &TView) -> Result<()> {
    if dst.ne != a.ne {
        return Err(unsupported(op, dst, src));
    }
    let n0 = a.ne[0];
    par_rows(
        a.nrows(),
        n0,
        || (vec![0f32; n0], Vec::<u32>::with_capacity(n0)),
        |(x, idx), r| {
            let (i1, i2, i3) = a.row_index(r);
            a.load_row_f32(i1, i2, i3, x)?;
            idx.clear();
            idx.extend(0..n0 as u32);
            // Stable: equal values keep index order in both directions.
            match order {
                SortOrder::Asc => idx.sort_by(|&p, &q| cmp_val(x[p as usize], x[q as usize])),
                SortOrder::Desc => idx.sort_by(|&p, &q| cmp_val(x[q as usize], x[p as usize])),
            }
            for (j, &i) in idx.iter().enumerate() {
                dst.set_i32(j, i1, i2, i3, i as i32);
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_keeps_last_tie_like_ggml() {
        assert_eq!(argmax_row(&[1.0, 3.0, 2.0, 3.0, 0.0]), 3);
        assert_eq!(argmax_row(&[f32::NEG_INFINITY; 3]), 2);
        assert_eq!(argmax_row(&[-1.0]), 0);
    }

    #[test]
    fn top_k_descending_ties_by_index() {
        let x = [0.5, 2.0, -1.0, 2.0, 7.0, 0.0, -0.0, 3.0];
        let mut idx = Vec::new();
        top_k_row(&x, 4, &mut idx);
        assert_eq!(idx, vec![4, 7, 1, 3]);
        top_k_row(&x, 8, &mut idx);
        assert_eq!(idx, vec![4, 7, 1, 3, 0, 5, 6, 2]);
        top_k_row(&x, 0, &mut idx);
        assert!(idx.is_empty());
        let nan = [1.0, f32::NAN, 2.0];
        top_k_row(&nan, 2, &mut idx);
        assert_eq!(idx.len(), 2);
    }
}
