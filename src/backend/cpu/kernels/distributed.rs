//! CPU kernels of the meta backend's ops (`ops/distributed.rs`):
//! `row_stats`, `row_finish` (distributed row ops) and `get_rows_part`.
//! `exchange` has no kernel: the executor fills it.
//!
//! The statistics and their combine reproduce one device's kernels: sums in
//! f64 as ggml's `ggml_float` (carried between devices as an (hi, lo) pair
//! of f32), soft_max's `x·scale + mask` rounded as the single-device kernel
//! does, argmax's scan with ties to the last index and NaN restarts, top_k's
//! order (descending value, ties by lower index).

use super::data::{load_f32, store_f32, HalfScratch};
use super::elementwise::par_rows;
use super::norm::simd::NormOps;
use super::reduce::{desc_key, top_k_row};
use super::{unsupported, TView};
use crate::error::{Error, Result};
use crate::ops::distributed::{global_pos, local_pos};
use crate::ops::{ops_outside, Op, RowReduce};
use crate::tensor::GgmlType;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match op {
        Op::RowStats { reduce, ranges } => row_stats(op, *reduce, ranges, dst, src),
        Op::RowFinish { reduce, lens } => row_finish(op, *reduce, lens, dst, src),
        Op::GetRowsPart { ranges, n_rows } => get_rows_part(op, ranges, *n_rows, dst, src),
        Op::AddN => add_n(op, dst, src),
        // `exchange` is filled by the executor between local graphs, never
        // computed; no other family is routed here.
        Op::Exchange | ops_outside!(distributed) => Err(unsupported(op, dst, src)),
    }
}

/// An f64 as the (hi, lo) pair of f32 words the statistics carry.
#[inline]
pub(crate) fn split_f64(s: f64) -> (f32, f32) {
    let hi = s as f32;
    (hi, (s - hi as f64) as f32)
}

/// Argmax statistics: how a part of a row acts on ggml's scan
/// (`max = max > v ? max : v; if max == v { idx = i }`), packed in the
/// code word's top two bits with the global index in the low 30.
pub(crate) mod scan {
    /// No NaN in the part: the scan continues with the part's maximum (the
    /// value word) at its last position, if it is at least the running one.
    pub const PLAIN: u32 = 0;
    /// Elements after a NaN: the scan ends in (value, index) whatever came before.
    pub const RESET: u32 = 1;
    /// No NaN but a trailing run of NaN: as [`PLAIN`], then the running
    /// maximum becomes NaN (the index stays).
    pub const PLAIN_THEN_NAN: u32 = 2;
    /// The index field of a part with no element.
    pub const NONE: u32 = (1 << 30) - 1;

    /// Packs a kind and a global index (`NONE` for none).
    pub fn code(kind: u32, idx: u32) -> u32 {
        (kind << 30) | (idx & NONE)
    }

    /// The summary `(value, code)` of a part whose elements are `x` at
    /// global positions `global(i)`, in scan order.
    pub fn summary(x: &[f32], global: impl Fn(usize) -> u32) -> (f32, u32) {
        let Some(last_nan) = x.iter().rposition(|v| v.is_nan()) else {
            return plain(x, 0, &global, PLAIN);
        };
        if last_nan + 1 < x.len() {
            // The scan restarts after the last NaN.
            return plain(x, last_nan + 1, &global, RESET);
        }
        // A trailing NaN run: what comes before it decides the index.
        let end = x.iter().rposition(|v| !v.is_nan()).map_or(0, |p| p + 1);
        match x[..end].iter().rposition(|v| v.is_nan()) {
            // The index after the NaN inside: a constant, the maximum NaN.
            Some(p) => (f32::NAN, plain(&x[..end], p + 1, &global, RESET).1),
            None => plain(&x[..end], 0, &global, PLAIN_THEN_NAN),
        }
    }

    /// The NaN-free scan of `x[from..]`: its maximum and last position.
    fn plain(x: &[f32], from: usize, global: &impl Fn(usize) -> u32, kind: u32) -> (f32, u32) {
        let mut best = (f32::NEG_INFINITY, NONE);
        for (i, &v) in x.iter().enumerate().skip(from) {
            if v >= best.0 {
                best = (v, global(i));
            }
        }
        (best.0, code(kind, best.1))
    }

    /// Combines the parts' summaries (in device order) into the row's index.
    /// Without NaN the maximum's last global position (order-free); with
    /// NaN the scan is folded in device order (exact when the devices hold
    /// consecutive ranges, as a plain split does).
    pub fn combine(parts: impl Iterator<Item = (f32, u32)> + Clone) -> i32 {
        let idx = |c: u32| c & NONE;
        if parts.clone().all(|(_, c)| c >> 30 == PLAIN) {
            let mut best: Option<(f32, u32)> = None;
            for (v, c) in parts {
                if idx(c) != NONE && best.is_none_or(|(bv, bi)| v > bv || (v == bv && idx(c) > bi)) {
                    best = Some((v, idx(c)));
                }
            }
            return best.map_or(0, |b| b.1 as i32);
        }
        let (mut max, mut at) = (f32::NEG_INFINITY, 0u32);
        for (v, c) in parts {
            match c >> 30 {
                RESET => (max, at) = (v, idx(c)),
                kind => {
                    if idx(c) != NONE && (max.is_nan() || v >= max) {
                        (max, at) = (v, idx(c));
                    }
                    if kind == PLAIN_THEN_NAN {
                        max = f32::NAN;
                    }
                }
            }
        }
        at as i32
    }
}

fn row_stats(op: &Op, reduce: RowReduce, ranges: &[(i64, i64)], dst: &TView, src: &[TView]) -> Result<()> {
    let Some(x) = src.first() else { return Err(unsupported(op, dst, src)) };
    let mask = src.get(1);
    let n0 = x.ne[0];
    let ops = NormOps::detect();
    if reduce == RowReduce::Sum {
        // One f64 over every row, in row order (the thread count does not matter).
        let mut s = HalfScratch::default();
        let mut row = vec![0f32; n0];
        let mut total = 0f64;
        for r in 0..x.nrows() {
            let (i1, i2, i3) = x.row_index(r);
            load_f32(x, i1, i2, i3, &mut row, &mut s)?;
            total += if x.ty == GgmlType::F32 {
                row.iter().fold(0.0f64, |a, &v| a + v as f64)
            } else {
                row.iter().fold(0.0f32, |a, &v| a + v) as f64
            };
        }
        dst.set_f32(0, 0, 0, 0, total as f32);
        return Ok(());
    }
    if dst.ne[0] != reduce.words() || dst.ne[1] != x.nrows() {
        return Err(unsupported(op, dst, src));
    }
    par_rows(
        x.nrows(),
        n0,
        || (vec![0f32; n0], vec![0f32; n0], Vec::new(), Vec::new()),
        |(row, mrow, keys, idx), r| {
            let (i1, i2, i3) = x.row_index(r);
            x.load_row_f32(i1, i2, i3, row)?;
            let put = |q: usize, v: f32| dst.set_f32(q, r, 0, 0, v);
            let put_bits = |q: usize, v: u32| dst.set_f32(q, r, 0, 0, f32::from_bits(v));
            match reduce {
                RowReduce::RmsNorm { .. } | RowReduce::L2Norm { .. } => {
                    let (hi, lo) = split_f64((ops.sum_sq)(row));
                    put(0, hi);
                    put(1, lo);
                }
                RowReduce::SumRows | RowReduce::Mean => {
                    let (hi, lo) = split_f64(row.iter().fold(0.0f64, |a, &v| a + v as f64));
                    put(0, hi);
                    put(1, lo);
                }
                RowReduce::Norm { .. } => {
                    let sum = (ops.sum)(row);
                    let mean = if n0 > 0 { sum / n0 as f64 } else { 0.0 };
                    let m2: f64 = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum();
                    put(0, sum as f32);
                    put(1, m2 as f32);
                }
                RowReduce::SoftMax { scale } => {
                    scaled_masked(row, mrow, mask, scale, i1)?;
                    let m = (ops.max)(row);
                    let s = if m == f32::NEG_INFINITY { 0.0 } else { (ops.exp_sub_sum)(row, m) };
                    put(0, m);
                    put(1, s as f32);
                }
                RowReduce::Argmax => {
                    let (v, c) = scan::summary(row, |i| global_pos(ranges, i) as u32);
                    put(0, v);
                    put_bits(1, c);
                }
                RowReduce::TopK { k } => {
                    let k = k.max(0) as usize;
                    top_k_row(row, k, keys, idx);
                    for q in 0..k {
                        let (v, g) = match idx.get(q) {
                            Some(&i) => (row[i as usize], global_pos(ranges, i as usize) as i32),
                            None => (f32::NEG_INFINITY, -1),
                        };
                        put(2 * q, v);
                        put_bits(2 * q + 1, g as u32);
                    }
                }
                RowReduce::Sum => {}
            }
            Ok(())
        },
    )
}

/// `row ← row·scale + mask[:, i1]` as the single-device soft_max rounds it.
fn scaled_masked(row: &mut [f32], mrow: &mut [f32], mask: Option<&TView>, scale: f32, i1: usize) -> Result<()> {
    row.iter_mut().for_each(|v| *v *= scale);
    if let Some(m) = mask {
        m.load_row_f32(i1, 0, 0, mrow)?;
        for (v, &mv) in row.iter_mut().zip(mrow.iter()) {
            *v += mv;
        }
    }
    Ok(())
}

/// The devices' statistics of a distributed row op, gathered as
/// `g[q, r, d]` (word `q` of row `r` from device `d`), and the devices' row
/// lengths (`lens[d]` elements of each row on device `d`).
struct Gathered<'a> {
    g: &'a TView,
    n_dev: usize,
    lens: &'a [i64],
    /// The whole row's length (the sum of `lens`).
    n_global: i64,
}

impl Gathered<'_> {
    /// Word `q` of row `r` from device `d`.
    fn word(&self, q: usize, r: usize, d: usize) -> f32 {
        self.g.get_f32(q, r, d, 0)
    }

    /// The bits of word `q` of row `r` from device `d` (an index or code).
    fn bits(&self, q: usize, r: usize, d: usize) -> u32 {
        self.word(q, r, d).to_bits()
    }

    /// Row `r`'s f64 sum over the devices, each carried as words (hi, lo).
    fn wide(&self, r: usize) -> f64 {
        (0..self.n_dev).map(|d| self.word(0, r, d) as f64 + self.word(1, r, d) as f64).sum()
    }

    /// `sum`: the devices' totals (word 0 of row 0) added in f64.
    fn sum(&self, dst: &TView) {
        let total: f64 = (0..self.n_dev).map(|d| self.word(0, 0, d) as f64).sum();
        dst.set_f32(0, 0, 0, 0, total as f32);
    }

    /// `sum_rows` (or `mean` when `mean`): one value per row.
    fn row_sums(&self, mean: bool, dst: &TView) {
        for r in 0..self.g.ne[1] {
            let mut s = self.wide(r) as f32;
            if mean {
                s /= self.n_global as f32;
            }
            let (i1, i2, i3) = dst.row_index(r);
            dst.set_f32(0, i1, i2, i3, s);
        }
    }

    /// `argmax`: each row's index from the devices' scan summaries.
    fn argmax(&self, dst: &TView) {
        for r in 0..self.g.ne[1] {
            let parts = (0..self.n_dev).map(|d| (self.word(0, r, d), self.bits(1, r, d)));
            dst.set_i32(r, 0, 0, 0, scan::combine(parts));
        }
    }

    /// `top_k`: each row's `k` global indices, merged from the devices'
    /// (value, index) candidates in top_k's order.
    fn top_k(&self, k: usize, dst: &TView) {
        let mut c: Vec<u64> = Vec::with_capacity(k * self.n_dev);
        for r in 0..self.g.ne[1] {
            c.clear();
            for d in 0..self.n_dev {
                for q in 0..k {
                    let i = self.bits(2 * q + 1, r, d) as i32;
                    if i >= 0 {
                        c.push(desc_key(self.word(2 * q, r, d), i as usize));
                    }
                }
            }
            c.sort_unstable();
            let (i1, i2, i3) = dst.row_index(r);
            for (q, &key) in c.iter().take(k).enumerate() {
                dst.set_i32(q, i1, i2, i3, key as u32 as i32);
            }
        }
    }

    /// The row-wise ops that rewrite the rows of `x` (the local part) into
    /// `dst`: rms_norm, l2_norm, norm and soft_max (after `x·scale + mask`).
    fn normalize(&self, reduce: RowReduce, x: &TView, mask: Option<&TView>, dst: &TView) -> Result<()> {
        let ops = NormOps::detect();
        let n0 = x.ne[0];
        par_rows(
            x.nrows(),
            n0,
            || (vec![0f32; n0], vec![0f32; n0]),
            |(row, mrow), r| {
                let (i1, i2, i3) = x.row_index(r);
                x.load_row_f32(i1, i2, i3, row)?;
                if let RowReduce::SoftMax { scale } = reduce {
                    scaled_masked(row, mrow, mask, scale, i1)?;
                }
                self.normalize_row(reduce, &ops, row, r);
                dst.store_row_f32(i1, i2, i3, row)
            },
        )
    }

    /// Row `r` of [`Gathered::normalize`], in place, with the statistics
    /// combined over the devices (soft_max's row already scaled and masked).
    fn normalize_row(&self, reduce: RowReduce, ops: &NormOps, row: &mut [f32], r: usize) {
        let (n_dev, n_global) = (self.n_dev, self.n_global);
        match reduce {
            RowReduce::RmsNorm { eps } => {
                let scale = 1.0 / ((self.wide(r) / n_global.max(1) as f64) as f32 + eps).sqrt();
                row.iter_mut().for_each(|v| *v *= scale);
            }
            RowReduce::L2Norm { eps } => {
                let scale = 1.0 / (self.wide(r).sqrt() as f32).max(eps);
                row.iter_mut().for_each(|v| *v *= scale);
            }
            RowReduce::Norm { eps } => {
                // Chan's parallel variance over the devices' (sum, M2).
                let n = n_global.max(1) as f64;
                let mean = (0..n_dev).map(|d| self.word(0, r, d) as f64).sum::<f64>() / n;
                let mut m2 = 0.0f64;
                for (d, &nd) in self.lens.iter().enumerate() {
                    if nd > 0 {
                        let nd = nd as f64;
                        m2 += self.word(1, r, d) as f64 + nd * (self.word(0, r, d) as f64 / nd - mean).powi(2);
                    }
                }
                let scale = 1.0 / ((m2 / n) as f32 + eps).sqrt();
                let mean = mean as f32;
                row.iter_mut().for_each(|v| *v = (*v - mean) * scale);
            }
            RowReduce::SoftMax { .. } => {
                let gmax = (0..n_dev).map(|d| self.word(0, r, d)).fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = (0..n_dev)
                    .filter(|&d| self.word(0, r, d) != f32::NEG_INFINITY)
                    .map(|d| self.word(1, r, d) as f64 * ((self.word(0, r, d) - gmax) as f64).exp())
                    .sum();
                let inv = (1.0 / sum) as f32;
                let _ = (ops.exp_sub_sum)(row, gmax);
                row.iter_mut().for_each(|v| *v *= inv);
            }
            _ => {}
        }
    }
}

/// Finishes a distributed row op from the devices' statistics (`src[0]`,
/// gathered; see [`Gathered`]) and, for the ops that rewrite rows, the local
/// part `src[1]` (and soft_max's mask `src[2]`).
fn row_finish(op: &Op, reduce: RowReduce, lens: &[i64], dst: &TView, src: &[TView]) -> Result<()> {
    let Some(g) = src.first() else { return Err(unsupported(op, dst, src)) };
    let n_dev = g.ne[2];
    if n_dev != lens.len() || g.ne[0] != reduce.words() {
        return Err(unsupported(op, dst, src));
    }
    let st = Gathered { g, n_dev, lens, n_global: lens.iter().sum() };
    match reduce {
        RowReduce::Sum => st.sum(dst),
        RowReduce::SumRows | RowReduce::Mean | RowReduce::Argmax => {
            if dst.nelements() != g.ne[1] {
                return Err(unsupported(op, dst, src));
            }
            match reduce {
                RowReduce::Argmax => st.argmax(dst),
                _ => st.row_sums(reduce == RowReduce::Mean, dst),
            }
        }
        RowReduce::TopK { k } => {
            let k = k.max(0) as usize;
            if dst.ne[0] != k || dst.nrows() != g.ne[1] {
                return Err(unsupported(op, dst, src));
            }
            st.top_k(k, dst);
        }
        RowReduce::RmsNorm { .. } | RowReduce::L2Norm { .. } | RowReduce::Norm { .. } | RowReduce::SoftMax { .. } => {
            let (Some(x), mask) = (src.get(1), src.get(2)) else { return Err(unsupported(op, dst, src)) };
            if x.ne != dst.ne || x.nrows() != g.ne[1] {
                return Err(unsupported(op, dst, src));
            }
            return st.normalize(reduce, x, mask, dst);
        }
    }
    Ok(())
}

/// The element-wise sum of the sources (see `Context::add_n`).
fn add_n(op: &Op, d: &TView, src: &[TView]) -> Result<()> {
    if src.is_empty() || src.iter().any(|s| s.ne != d.ne || s.ty != d.ty) {
        return Err(unsupported(op, d, src));
    }
    let n0 = d.ne[0];
    match d.ty {
        GgmlType::I32 | GgmlType::I64 => par_rows(
            d.nrows(),
            n0,
            || (),
            |_, r| {
                let (i1, i2, i3) = d.row_index(r);
                for i0 in 0..n0 {
                    let v = src.iter().fold(0i64, |a, s| a.wrapping_add(s.get_i64(i0, i1, i2, i3)));
                    if d.ty == GgmlType::I64 {
                        d.set_i64(i0, i1, i2, i3, v);
                    } else {
                        d.set_i32(i0, i1, i2, i3, v as i32);
                    }
                }
                Ok(())
            },
        ),
        _ => par_rows(
            d.nrows(),
            n0,
            || (vec![0f32; n0], vec![0f32; n0], HalfScratch::default()),
            |(acc, row, hs), r| {
                let (i1, i2, i3) = d.row_index(r);
                load_f32(&src[0], i1, i2, i3, acc, hs)?;
                for s in &src[1..] {
                    load_f32(s, i1, i2, i3, row, hs)?;
                    acc.iter_mut().zip(row.iter()).for_each(|(a, &b)| *a += b);
                }
                store_f32(d, i1, i2, i3, acc, hs)
            },
        ),
    }
}

/// `get_rows` over a table holding the global rows `ranges`: ids it does not
/// hold give zero rows; ids outside `0..n_rows` fail as in `get_rows`.
fn get_rows_part(op: &Op, ranges: &[(i64, i64)], n_rows: i64, d: &TView, src: &[TView]) -> Result<()> {
    let (Some(a), Some(b)) = (src.first(), src.get(1)) else { return Err(unsupported(op, d, src)) };
    let ne0 = d.ne[0];
    par_rows(
        d.nrows(),
        ne0,
        || (vec![0f32; ne0], HalfScratch::default()),
        |(row, hs), r| {
            let (i10, i11, i12) = d.row_index(r);
            let id = b.get_i64(i10, i11, i12, 0);
            if id < 0 || id >= n_rows {
                return Err(Error::Compute {
                    detail: format!("get_rows: index {id} at [{i10}, {i11}, {i12}] outside the table's {n_rows} rows"),
                });
            }
            match local_pos(ranges, id) {
                Some(l) => load_f32(a, l as usize, i11, i12, row, hs)?,
                None => row.fill(0.0),
            }
            store_f32(d, i10, i11, i12, row, hs)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::scan;
    use crate::backend::cpu::kernels::reduce::argmax_row;

    /// The scan summaries of a row cut into consecutive parts combine to
    /// ggml's index for the whole row, NaN included.
    #[test]
    fn argmax_parts_combine_to_the_whole_row_scan() {
        let n = f32::NAN;
        let rows: Vec<Vec<f32>> = vec![
            vec![1.0, 3.0, 2.0, 3.0, 0.0, -1.0],
            vec![1.0, n, 2.0, 0.5, 4.0, n],
            vec![5.0, n, n, 1.0, 1.0, n],
            vec![n, n, n, n],
            vec![f32::NEG_INFINITY; 5],
            vec![2.0, 7.0, n, 3.0, n, n],
            vec![9.0, 1.0, 1.0, n, n, 0.0],
        ];
        for row in rows {
            let want = argmax_row(&row) as i32;
            for cut1 in 0..=row.len() {
                for cut2 in cut1..=row.len() {
                    let parts: Vec<(f32, u32)> = [(0, cut1), (cut1, cut2), (cut2, row.len())]
                        .iter()
                        .map(|&(a, b)| scan::summary(&row[a..b], |i| (a + i) as u32))
                        .collect();
                    assert_eq!(scan::combine(parts.iter().copied()), want, "{row:?} cut at {cut1}, {cut2}");
                }
            }
        }
    }
}
