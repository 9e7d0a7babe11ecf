//! CPU kernels of the reduction family: `sum`, `sum_rows`, `mean`,
//! `argmax`, `top_k`, `argsort`.
//!
//! Accumulation follows ggml's CPU (`ops.cpp`, `vec.h`): F32 sums in f64
//! (`ggml_float`), F16/BF16 `sum` in f32 row by row; argmax keeps the last
//! maximal index as ggml's loop does. `top_k` and `argsort` are
//! deterministic: descending value then lower index for `top_k`, a stable
//! sort for `argsort` (ggml's `std::sort` / `partial_sort` leave ties
//! unspecified). Values compare by IEEE total order with −0 = +0, so NaN
//! never breaks the sort; keys pack the value's order and the index in one
//! `u64`, so ties fall to the lower index without an indirect comparator.

use super::elementwise::par_rows;
use super::{unsupported, TView};
use crate::error::Result;
use crate::ops::{ops_outside, Op, SortOrder};
use crate::tensor::GgmlType;
use rayon::prelude::*;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    let Some(a) = src.first() else {
        return Err(unsupported(op, dst, src));
    };
    match op {
        Op::Sum => sum(op, dst, src, a),
        Op::SumRows => row_sums(op, dst, src, a, false),
        Op::Mean => row_sums(op, dst, src, a, true),
        Op::Argmax => argmax(op, dst, src, a),
        Op::TopK { k } => top_k(op, *k, dst, src, a),
        Op::Argsort { order } => argsort(op, *order, dst, src, a),
        // Not a reduce op: `kernels::compute` routes none here.
        ops_outside!(reduce) => Err(unsupported(op, dst, src)),
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
/// index. Without NaN that is the last position of the row maximum, found
/// with a lane-parallel max and a backward search; rows holding NaN run
/// ggml's sequential loop, whose running maximum NaN resets.
pub(crate) fn argmax_row(x: &[f32]) -> usize {
    const L: usize = 8;
    let mut acc = [f32::NEG_INFINITY; L];
    let mut nan = [false; L];
    let chunks = x.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..L {
            acc[j] = if acc[j] > c[j] { acc[j] } else { c[j] };
            nan[j] |= c[j].is_nan();
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in acc.iter().chain(tail) {
        max = if max > v { max } else { v };
    }
    if nan.iter().any(|&n| n) || tail.iter().any(|v| v.is_nan()) {
        return argmax_sequential(x);
    }
    x.iter().rposition(|&v| v == max).unwrap_or(0)
}

/// ggml's loop verbatim (the reference for rows with NaN).
fn argmax_sequential(x: &[f32]) -> usize {
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

/// A `u32` whose unsigned order is the IEEE total order of `v` with −0 and
/// +0 equal (negative NaN below −∞, positive NaN above +∞).
#[inline]
fn ord_key(v: f32) -> u32 {
    let bits = if v == 0.0 { 0 } else { v.to_bits() };
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// Sort key of element `i` for "descending value, then lower index": the
/// smaller the key, the earlier the element.
#[inline]
pub(crate) fn desc_key(v: f32, i: usize) -> u64 {
    ((!ord_key(v) as u64) << 32) | i as u64
}

/// Fills `idx` with the `k` indices of the largest values of `x`: descending
/// value, ties by lower index. Small `k` keeps a max-heap of the `k` best
/// keys (one comparison for most elements); large `k` selects on all keys.
pub(crate) fn top_k_row(x: &[f32], k: usize, keys: &mut Vec<u64>, idx: &mut Vec<u32>) {
    let k = k.min(x.len());
    keys.clear();
    idx.clear();
    if k == 0 {
        return;
    }
    if k <= 512 && k * 16 <= x.len() {
        let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
        for (i, &v) in x.iter().enumerate() {
            let key = desc_key(v, i);
            if heap.len() < k {
                heap.push(key);
            } else if heap.peek().is_some_and(|&worst| key < worst) {
                if let Some(mut top) = heap.peek_mut() {
                    *top = key;
                }
            }
        }
        keys.extend(heap.into_vec());
    } else {
        keys.extend(x.iter().enumerate().map(|(i, &v)| desc_key(v, i)));
        if k < keys.len() {
            keys.select_nth_unstable(k - 1);
            keys.truncate(k);
        }
    }
    keys.sort_unstable();
    idx.extend(keys.iter().map(|&key| key as u32));
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
        || (vec![0f32; n0], Vec::new(), Vec::with_capacity(k)),
        |(x, keys, idx), r| {
            let (i1, i2, i3) = a.row_index(r);
            a.load_row_f32(i1, i2, i3, x)?;
            top_k_row(x, k, keys, idx);
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
        || (vec![0f32; n0], Vec::<u64>::with_capacity(n0)),
        |(x, keys), r| {
            let (i1, i2, i3) = a.row_index(r);
            a.load_row_f32(i1, i2, i3, x)?;
            // Value key in the high half, index in the low half: sorting the
            // packed keys orders by value and keeps equal values in index
            // order (a stable argsort) in both directions.
            keys.clear();
            match order {
                SortOrder::Asc => {
                    keys.extend(x.iter().enumerate().map(|(i, &v)| ((ord_key(v) as u64) << 32) | i as u64))
                }
                SortOrder::Desc => keys.extend(x.iter().enumerate().map(|(i, &v)| desc_key(v, i))),
            }
            keys.sort_unstable();
            for (j, &key) in keys.iter().enumerate() {
                dst.set_i32(j, i1, i2, i3, key as u32 as i32);
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
        assert_eq!(argmax_row(&[]), 0);
        let long: Vec<f32> = (0..1003).map(|i| ((i * 37) % 101) as f32).collect();
        assert_eq!(argmax_row(&long), argmax_sequential(&long));
        let mut with_nan = long.clone();
        with_nan[500] = f32::NAN;
        assert_eq!(argmax_row(&with_nan), argmax_sequential(&with_nan));
    }

    #[test]
    fn top_k_descending_ties_by_index() {
        let x = [0.5, 2.0, -1.0, 2.0, 7.0, 0.0, -0.0, 3.0];
        let (mut keys, mut idx) = (Vec::new(), Vec::new());
        top_k_row(&x, 4, &mut keys, &mut idx);
        assert_eq!(idx, vec![4, 7, 1, 3]);
        top_k_row(&x, 8, &mut keys, &mut idx);
        assert_eq!(idx, vec![4, 7, 1, 3, 0, 5, 6, 2]);
        top_k_row(&x, 0, &mut keys, &mut idx);
        assert!(idx.is_empty());
        let nan = [1.0, f32::NAN, 2.0];
        top_k_row(&nan, 2, &mut keys, &mut idx);
        assert_eq!(idx.len(), 2);
        // Heap path (k·16 ≤ n) agrees with a full stable sort.
        let long: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        top_k_row(&long, 20, &mut keys, &mut idx);
        let mut all: Vec<u32> = (0..1000).collect();
        all.sort_by(|&p, &q| long[q as usize].total_cmp(&long[p as usize]));
        assert_eq!(idx, all[..20].to_vec());
    }

    #[test]
    fn ord_key_is_total_order_with_equal_zeros() {
        let vals = [f32::NEG_INFINITY, -3.5, -1e-30, -0.0, 0.0, 1e-30, 2.0, f32::INFINITY];
        for w in vals.windows(2) {
            assert!(ord_key(w[0]) <= ord_key(w[1]), "{} {}", w[0], w[1]);
        }
        assert_eq!(ord_key(-0.0), ord_key(0.0));
        assert!(ord_key(f32::NAN) > ord_key(f32::INFINITY));
    }
}
