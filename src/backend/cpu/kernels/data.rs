//! CPU kernels of the data-movement family: `dup`/`cont`/`cpy` (copies in
//! logical element order with type conversion), `get_rows`, `set_rows`,
//! `concat`, `repeat` and `pad` (ggml-cpu `ops.cpp`: `ggml_compute_forward_dup*`,
//! `_get_rows*`, `_set_rows*`, `_concat*`, `_repeat*`, `_pad*`).
//!
//! Every kernel splits work by destination rows with rayon and moves whole
//! rows through per-task scratch buffers (so a destination that aliases a
//! source is read before it is written, row by row).
//!
//! Index policy: an index outside the table (`get_rows`) or the destination
//! (`set_rows`) makes the node fail with [`Error::Compute`] naming the op,
//! the index and the valid range. `set_rows` checks all indices before it
//! writes anything, so a failed `set_rows` leaves the destination untouched.
//! Duplicate `set_rows` indices within one (i2, i3) slice: the last source
//! row wins (deterministic; ggml leaves the order to its threads).

use super::{unsupported, TView};
use crate::error::{Error, Result};
use crate::ops::{ops_outside, Op};
use crate::tensor::GgmlType;
use rayon::prelude::*;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    let s0 = src.first().ok_or_else(|| unsupported(op, dst, src))?;
    match op {
        Op::Dup | Op::Cont | Op::Cpy => copy(op, dst, s0),
        Op::GetRows => get_rows(dst, s0, src.get(1).ok_or_else(|| unsupported(op, dst, src))?),
        Op::SetRows => set_rows(dst, s0, src.get(1).ok_or_else(|| unsupported(op, dst, src))?),
        Op::Concat { dim } => concat(dst, s0, src.get(1).ok_or_else(|| unsupported(op, dst, src))?, *dim),
        Op::Repeat => repeat(dst, s0),
        Op::Pad { lp, rp } => pad(dst, s0, lp, rp),
        // Leafs and shape-only ops run no kernel (`kernels::compute` takes
        // them before this file), and no other family is routed here.
        Op::None | Op::Reshape | Op::View | Op::Permute { .. } | Op::Transpose | ops_outside!(data) => {
            Err(unsupported(op, dst, src))
        }
    }
}

/// Minimum rows per rayon task so tiny rows are not scheduled one by one.
fn min_rows(row_elems: usize) -> usize {
    (16384 / row_elems.max(1)).max(1)
}

/// `nrows` rows of `row_elems` elements as parallel runs of
/// [`min_rows`] rows (the last one shorter).
fn row_runs(nrows: usize, row_elems: usize) -> impl ParallelIterator<Item = std::ops::Range<usize>> {
    let per = min_rows(row_elems);
    (0..nrows.div_ceil(per)).into_par_iter().map(move |c| c * per..((c + 1) * per).min(nrows))
}

/// Rows of at most this many elements are copied element by element
/// ([`TView::copy_elems_rows`]): below it, a row's scratch copy and two
/// `memcpy` calls cost more than its elements.
const SHORT_ROW: usize = 16;

/// Units (elements, or blocks for block types) in one row of `v`.
fn units(v: &TView) -> usize {
    v.ne[0] / v.ty.block_size()
}

/// Bytes of a row one task copies at most ([`copy_packed_rows`]).
const COPY_CHUNK: usize = 64 << 10;

/// Same-type copy of `nrows` packed rows of `row_bytes` bytes between
/// views that do not overlap (others go through scratch rows): row `r` of
/// `d` (at `d.row_index(r)`) from the source row `src_row(r)` gives, raw
/// bytes straight from one to the other (no scratch), in chunks of at most
/// [`COPY_CHUNK`] bytes spread over the threads: a recurrent state of a
/// megabyte per row (llama.cpp's graphs copy them with `get_rows` and
/// `cpy`) moves once, on every thread.
fn copy_packed_rows(
    d: &TView,
    s: &TView,
    nrows: usize,
    row_bytes: usize,
    src_row: &(dyn Fn(usize) -> Result<(usize, usize, usize)> + Sync),
) -> Result<()> {
    let chunks = row_bytes.div_ceil(COPY_CHUNK).max(1);
    let per = (COPY_CHUNK / row_bytes.max(1)).max(1);
    (0..nrows * chunks).into_par_iter().with_min_len(per).try_for_each(|k| {
        let (r, c) = (k / chunks, k % chunks);
        let start = c * COPY_CHUNK;
        d.copy_row_bytes_from(d.row_index(r), s, src_row(r)?, start, COPY_CHUNK.min(row_bytes - start));
        Ok(())
    })
}

/// Loads the raw bytes of row (i1, i2, i3) of `v` into `out`
/// (`units(v) · type_size` bytes), for any strides.
fn load_bytes(v: &TView, i1: usize, i2: usize, i3: usize, out: &mut [u8]) {
    if v.rows_packed() {
        v.load_row_bytes(i1, i2, i3, out);
    } else {
        let (ts, bs) = (v.ty.type_size(), v.ty.block_size());
        for (k, chunk) in out.chunks_exact_mut(ts).enumerate() {
            v.load_elem_bytes(k * bs, i1, i2, i3, chunk);
        }
    }
}

/// Stores `data` (`units(v) · type_size` bytes) into row (i1, i2, i3) of
/// `v`, for any strides.
fn store_bytes(v: &TView, i1: usize, i2: usize, i3: usize, data: &[u8]) {
    if v.rows_packed() {
        v.store_row_bytes(i1, i2, i3, data);
    } else {
        let (ts, bs) = (v.ty.type_size(), v.ty.block_size());
        for (k, chunk) in data.chunks_exact(ts).enumerate() {
            v.store_elem_bytes(k * bs, i1, i2, i3, chunk);
        }
    }
}

/// Scratch for [`load_f32`]/[`store_f32`]: half-precision staging.
#[derive(Default)]
pub(crate) struct HalfScratch {
    h: Vec<half::f16>,
    b: Vec<half::bf16>,
}

/// Loads row (i1, i2, i3) of `v` as f32 (`out.len()` = `ne[0]`): packed
/// F16/BF16 rows are converted in bulk (SIMD where the CPU has it), every
/// other case goes through [`TView::load_row_f32`].
pub(crate) fn load_f32(v: &TView, i1: usize, i2: usize, i3: usize, out: &mut [f32], s: &mut HalfScratch) -> Result<()> {
    use half::slice::HalfFloatSliceExt;
    if v.rows_packed() && out.len() == v.ne[0] {
        match v.ty {
            GgmlType::F16 => {
                s.h.resize(out.len(), half::f16::ZERO);
                v.load_row_bytes(i1, i2, i3, bytemuck::cast_slice_mut(&mut s.h));
                s.h.convert_to_f32_slice(out);
                return Ok(());
            }
            GgmlType::BF16 => {
                s.b.resize(out.len(), half::bf16::ZERO);
                v.load_row_bytes(i1, i2, i3, bytemuck::cast_slice_mut(&mut s.b));
                s.b.convert_to_f32_slice(out);
                return Ok(());
            }
            _ => {}
        }
    }
    v.load_row_f32(i1, i2, i3, out)
}

/// Stores `data` (`ne[0]` values) into row (i1, i2, i3) of `v`, converting;
/// the bulk counterpart of [`TView::store_row_f32`] for packed F16/BF16 rows.
pub(crate) fn store_f32(v: &TView, i1: usize, i2: usize, i3: usize, data: &[f32], s: &mut HalfScratch) -> Result<()> {
    use half::slice::HalfFloatSliceExt;
    if v.rows_packed() && data.len() == v.ne[0] {
        match v.ty {
            GgmlType::F16 => {
                s.h.resize(data.len(), half::f16::ZERO);
                s.h.convert_from_f32_slice(data);
                v.store_row_bytes(i1, i2, i3, bytemuck::cast_slice(&s.h));
                return Ok(());
            }
            GgmlType::BF16 => {
                s.b.resize(data.len(), half::bf16::ZERO);
                s.b.convert_from_f32_slice(data);
                v.store_row_bytes(i1, i2, i3, bytemuck::cast_slice(&s.b));
                return Ok(());
            }
            _ => {}
        }
    }
    v.store_row_f32(i1, i2, i3, data)
}

fn compute_err(detail: String) -> Error {
    Error::Compute { detail }
}

// ----------------------------------------------------------------------
// dup / cont / cpy
// ----------------------------------------------------------------------

/// Copies `s` into `d` in logical element order (dim 0 fastest), converting
/// types. Shapes may differ; element counts must match.
fn copy(op: &Op, d: &TView, s: &TView) -> Result<()> {
    if d.nelements() != s.nelements() {
        return Err(compute_err(format!(
            "{}: element counts differ: src {}{:?}, dst {}{:?}",
            op.name(),
            s.ty,
            s.ne,
            d.ty,
            d.ne
        )));
    }
    if d.nelements() == 0 {
        return Ok(());
    }
    if d.ty == s.ty {
        copy_same_type(d, s)
    } else {
        copy_convert(d, s)
    }
}

/// A streaming reader of a tensor's rows in logical order, caching the last
/// row loaded.
struct RowCache<T> {
    row: usize,
    buf: Vec<T>,
}

/// Same-type copy: raw bytes, one unit (element or block) at a time in
/// logical order; whole rows when the row lengths agree.
fn copy_same_type(d: &TView, s: &TView) -> Result<()> {
    let ts = d.ty.type_size();
    let (du, su) = (units(d), units(s));
    let nrows = d.nrows();
    if du == su && du <= SHORT_ROW && d.copies_by_element() {
        // Short rows of the same length: element by element, a run of rows per task.
        row_runs(nrows, d.ne[0]).for_each(|rows| {
            d.copy_elems_rows(rows, 0, s, 0, du);
        });
        return Ok(());
    }
    if du == su && d.rows_packed() && s.rows_packed() && !d.overlaps(s) {
        return copy_packed_rows(d, s, nrows, du * ts, &|r| Ok(s.row_index(r)));
    }
    (0..nrows).into_par_iter().with_min_len(min_rows(d.ne[0])).try_for_each_init(
        // The source-row cache is only for rows of other lengths: no
        // zero-filled scratch for the common whole-row copy.
        || (vec![0u8; du * ts], RowCache { row: usize::MAX, buf: Vec::new() }),
        |(drow, cache), r| {
            let (i1, i2, i3) = d.row_index(r);
            if du == su {
                let (j1, j2, j3) = s.row_index(r);
                load_bytes(s, j1, j2, j3, drow);
                store_bytes(d, i1, i2, i3, drow);
                return Ok(());
            }
            // Row lengths differ: walk the unit stream.
            let mut pos = r * du;
            let mut filled = 0;
            while filled < du {
                let sr = pos / su;
                let off = pos % su;
                if cache.row != sr {
                    let (j1, j2, j3) = s.row_index(sr);
                    cache.buf.resize(su * ts, 0);
                    load_bytes(s, j1, j2, j3, &mut cache.buf);
                    cache.row = sr;
                }
                let take = (su - off).min(du - filled);
                drow[filled * ts..(filled + take) * ts].copy_from_slice(&cache.buf[off * ts..(off + take) * ts]);
                filled += take;
                pos += take;
            }
            store_bytes(d, i1, i2, i3, drow);
            Ok(())
        },
    )
}

/// Converting copy through f32 scratch rows (dequantizing, quantizing whole
/// destination rows with the reference quantizer).
fn copy_convert(d: &TView, s: &TView) -> Result<()> {
    let (d0, s0) = (d.ne[0], s.ne[0]);
    let nrows = d.nrows();
    (0..nrows).into_par_iter().with_min_len(min_rows(d0)).try_for_each_init(
        || (vec![0f32; d0], RowCache { row: usize::MAX, buf: vec![0f32; s0] }, HalfScratch::default()),
        |(drow, cache, hs), r| -> Result<()> {
            let (i1, i2, i3) = d.row_index(r);
            if d0 == s0 {
                let (j1, j2, j3) = s.row_index(r);
                load_f32(s, j1, j2, j3, drow, hs)?;
                return store_f32(d, i1, i2, i3, drow, hs);
            }
            let mut pos = r * d0;
            let mut filled = 0;
            while filled < d0 {
                let sr = pos / s0;
                let off = pos % s0;
                if cache.row != sr {
                    let (j1, j2, j3) = s.row_index(sr);
                    load_f32(s, j1, j2, j3, &mut cache.buf, hs)?;
                    cache.row = sr;
                }
                let take = (s0 - off).min(d0 - filled);
                drow[filled..filled + take].copy_from_slice(&cache.buf[off..off + take]);
                filled += take;
                pos += take;
            }
            store_f32(d, i1, i2, i3, drow, hs)
        },
    )
}

// ----------------------------------------------------------------------
// get_rows / set_rows
// ----------------------------------------------------------------------

/// dst[:, i10, i11, i12] = a[:, b[i10, i11, i12], i11, i12].
fn get_rows(d: &TView, a: &TView, b: &TView) -> Result<()> {
    let n_table = a.ne[1];
    let ne0 = d.ne[0];
    let same = d.ty == a.ty;
    let ts = a.ty.type_size();
    let nrows = d.nrows();
    // Destination row `r` → its source row, the index checked.
    let source = |r: usize| -> Result<(usize, usize, usize)> {
        let (i10, i11, i12) = d.row_index(r);
        let idx = b.get_i64(i10, i11, i12, 0);
        if idx < 0 || idx as u64 >= n_table as u64 {
            return Err(compute_err(format!(
                "get_rows: index {idx} at [{i10}, {i11}, {i12}] outside the table's {n_table} rows (src0 {}{:?})",
                a.ty, a.ne
            )));
        }
        Ok((idx as usize, i11, i12))
    };
    if same && d.rows_packed() && a.rows_packed() && !d.overlaps(a) {
        return copy_packed_rows(d, a, nrows, units(a) * ts, &source);
    }
    (0..nrows).into_par_iter().with_min_len(min_rows(ne0)).try_for_each_init(
        || (vec![0f32; ne0], vec![0u8; units(a) * ts], HalfScratch::default()),
        |(frow, brow, hs), r| -> Result<()> {
            let (i10, i11, i12) = d.row_index(r);
            let (idx, j1, j2) = source(r)?;
            if same {
                load_bytes(a, idx, j1, j2, brow);
                store_bytes(d, i10, i11, i12, brow);
                Ok(())
            } else {
                load_f32(a, idx, j1, j2, frow, hs)?;
                store_f32(d, i10, i11, i12, frow, hs)
            }
        },
    )
}

/// dst[:, c[i, i02 % c.ne1, i03 % c.ne2], i02, i03] = b[:, i, i02, i03]
/// (`dst` is the destination's storage; `b` F32 rows; `c` I64/I32 indices).
fn set_rows(d: &TView, b: &TView, c: &TView) -> Result<()> {
    let (n, ne2, ne3) = (b.ne[1], b.ne[2], b.ne[3]);
    let (c1, c2) = (c.ne[1].max(1), c.ne[2].max(1));
    let n_dst = d.ne[1];
    // (dst row, i02, i03, source row i): validated before any write.
    let mut tasks: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(n * ne2 * ne3);
    for i03 in 0..ne3 {
        for i02 in 0..ne2 {
            for i in 0..n {
                let idx = c.get_i64(i, i02 % c1, i03 % c2, 0);
                if idx < 0 || idx as u64 >= n_dst as u64 {
                    return Err(compute_err(format!(
                        "set_rows: index {idx} at [{i}, {}, {}] outside the destination's {n_dst} rows (dst {}{:?})",
                        i02 % c1,
                        i03 % c2,
                        d.ty,
                        d.ne
                    )));
                }
                tasks.push((idx as usize, i02, i03, i));
            }
        }
    }
    // Last writer wins for duplicate destination rows: keep the final task
    // of each (row, i02, i03) key (stable sort keeps source order in a key).
    tasks.sort_by_key(|t| (t.2, t.1, t.0));
    let mut winners: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(tasks.len());
    for t in tasks {
        match winners.last_mut() {
            Some(last) if (last.0, last.1, last.2) == (t.0, t.1, t.2) => *last = t,
            _ => winners.push(t),
        }
    }
    let ne0 = b.ne[0];
    winners.par_iter().with_min_len(min_rows(ne0)).try_for_each_init(
        || (vec![0f32; ne0], HalfScratch::default()),
        |(row, hs), &(i1, i02, i03, i)| -> Result<()> {
            load_f32(b, i, i02, i03, row, hs)?;
            store_f32(d, i1, i02, i03, row, hs)
        },
    )
}

// ----------------------------------------------------------------------
// concat / repeat / pad
// ----------------------------------------------------------------------

/// dst = a joined with b along `dim` (same type; raw bytes).
fn concat(d: &TView, a: &TView, b: &TView, dim: usize) -> Result<()> {
    if dim > 3 || a.ty != d.ty || b.ty != d.ty {
        return Err(unsupported(&Op::Concat { dim }, d, &[*a, *b]));
    }
    let ts = d.ty.type_size();
    let nrows = d.nrows();
    let (au, bu) = (units(a), units(b));
    if dim == 0 && d.ne[0] <= SHORT_ROW && d.copies_by_element() {
        // Short rows (a conv state and its new column, per channel):
        // element by element, no scratch row (a, b and d share the type).
        // (a, b and d have the same rows: concat joins along dim 0 only.)
        row_runs(nrows, d.ne[0]).for_each(|rows| {
            d.copy_elems_rows(rows.clone(), 0, a, 0, au);
            d.copy_elems_rows(rows, au, b, 0, bu);
        });
        return Ok(());
    }
    (0..nrows).into_par_iter().with_min_len(min_rows(d.ne[0])).try_for_each_init(
        || vec![0u8; units(d) * ts],
        |row, r| -> Result<()> {
            let (i1, i2, i3) = d.row_index(r);
            if dim == 0 {
                load_bytes(a, i1, i2, i3, &mut row[..au * ts]);
                load_bytes(b, i1, i2, i3, &mut row[au * ts..(au + bu) * ts]);
            } else {
                let mut idx = [0, i1, i2, i3];
                if idx[dim] < a.ne[dim] {
                    load_bytes(a, idx[1], idx[2], idx[3], row);
                } else {
                    idx[dim] -= a.ne[dim];
                    load_bytes(b, idx[1], idx[2], idx[3], row);
                }
            }
            store_bytes(d, i1, i2, i3, row);
            Ok(())
        },
    )
}

/// dst[i] = a[i mod a.ne] (non-block types; raw bytes).
fn repeat(d: &TView, a: &TView) -> Result<()> {
    if a.ty != d.ty || a.ty.block_size() != 1 || a.ne.contains(&0) {
        return Err(unsupported(&Op::Repeat, d, &[*a]));
    }
    let ts = d.ty.type_size();
    let a0 = a.ne[0] * ts;
    (0..d.nrows()).into_par_iter().with_min_len(min_rows(d.ne[0])).try_for_each_init(
        || (vec![0u8; a0], vec![0u8; d.ne[0] * ts]),
        |(arow, drow), r| -> Result<()> {
            let (i1, i2, i3) = d.row_index(r);
            load_bytes(a, i1 % a.ne[1], i2 % a.ne[2], i3 % a.ne[3], arow);
            for chunk in drow.chunks_exact_mut(a0) {
                chunk.copy_from_slice(arow);
            }
            store_bytes(d, i1, i2, i3, drow);
            Ok(())
        },
    )
}

/// Zero padding: dst[i] = a[i − lp] inside, 0 outside (non-block types).
fn pad(d: &TView, a: &TView, lp: &[i32; 4], rp: &[i32; 4]) -> Result<()> {
    let op = Op::Pad { lp: *lp, rp: *rp };
    if a.ty != d.ty || a.ty.block_size() != 1 || lp.iter().chain(rp.iter()).any(|&p| p < 0) {
        return Err(unsupported(&op, d, &[*a]));
    }
    let lpu = lp.map(|p| p as usize);
    for k in 0..4 {
        if d.ne[k] != a.ne[k] + lpu[k] + rp[k] as usize {
            return Err(unsupported(&op, d, &[*a]));
        }
    }
    let ts = d.ty.type_size();
    let a0 = a.ne[0] * ts;
    let inside = |i: usize, k: usize| i >= lpu[k] && i - lpu[k] < a.ne[k];
    (0..d.nrows()).into_par_iter().with_min_len(min_rows(d.ne[0])).try_for_each_init(
        || vec![0u8; d.ne[0] * ts],
        |row, r| -> Result<()> {
            let (i1, i2, i3) = d.row_index(r);
            row.fill(0);
            if inside(i1, 1) && inside(i2, 2) && inside(i3, 3) && a.ne[0] > 0 {
                let start = lpu[0] * ts;
                load_bytes(a, i1 - lpu[1], i2 - lpu[2], i3 - lpu[3], &mut row[start..start + a0]);
            }
            store_bytes(d, i1, i2, i3, row);
            Ok(())
        },
    )
}
