//! Split rules of the data family (`ops/data.rs`): leafs, views, copies and
//! data movement. Views keep a split when the range they read maps onto it
//! ([`view_split`]); `cpy`/`set_rows` write each device's part through a view
//! of their destination; `get_rows` from a vocabulary-split table is a
//! partial sum (each device looks up the rows it holds).

use super::{keep_unary, Candidate, Node};
use crate::ops::{ops_outside, Op};
use crate::split::state::{AxisSplit, SplitState};
use crate::tensor::{GgmlType, Tensor};

/// The candidates of a data-family node (the replicated one is added by the caller).
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        Op::Cont | Op::Dup => {
            keep_unary(x, out);
            // cont_2d and friends: a copy in element order, then a reshape.
            if let SplitState::Split(s) = &x.cur[0] {
                if x.src[0].ne != x.t.ne {
                    if let Some(o) = reshape_split(s, &x.src[0].ne, &x.t.ne) {
                        out.push(Candidate::new(vec![x.cur[0].clone()], SplitState::Split(o)));
                    }
                }
            }
        }
        Op::Cpy if x.src[0].ne == x.src[1].ne => cpy(x, out),
        Op::Cpy => cpy_reshaped(x, out),
        Op::SetRows => set_rows(x, out),
        Op::View => view(x, out),
        Op::Concat { dim } => concat(x, *dim, out),
        Op::GetRows => get_rows(x, out),
        Op::Permute { axes } => keep_mapped(x, out, |s| Some(AxisSplit { axis: axes[s.axis], ..s.clone() })),
        Op::Transpose => keep_mapped(x, out, |s| Some(AxisSplit { axis: [1, 0, 2, 3][s.axis], ..s.clone() })),
        Op::Reshape => keep_mapped(x, out, |s| reshape_split(s, &x.src[0].ne, &x.t.ne)),
        // Tiling along other axes keeps a split of an axis that is not repeated.
        Op::Repeat => keep_mapped(x, out, |s| (x.t.ne[s.axis] == x.src[0].ne[s.axis]).then(|| s.clone())),
        // `pad` and leafs: replicated only.
        Op::Pad { .. } | Op::None => {}
        // Not a data op: `Op::family` routes none here.
        ops_outside!(data) => {}
    }
}

/// Shape ops and `repeat`: a split is kept where `axis_map` maps it onto
/// an axis split of the result; a partial sum stays partial.
fn keep_mapped(x: &Node, out: &mut Vec<Candidate>, axis_map: impl Fn(&AxisSplit) -> Option<AxisSplit>) {
    if let SplitState::Split(s) = &x.cur[0] {
        if let Some(o) = axis_map(s) {
            out.push(Candidate::new(vec![x.cur[0].clone()], SplitState::Split(o)));
        }
    }
    let p = SplitState::partial();
    if x.cur[0] == p {
        out.push(Candidate::new(vec![p.clone()], p));
    }
}

/// `cpy` of src0 into src1 (same shape): the destination takes the source's layout
/// or keeps its own.
fn cpy(x: &Node, out: &mut Vec<Candidate>) {
    let (src, cur) = (&x.src, x.cur);
    // A partial sum stays partial through a plain copy; a conversion to
    // another type rounds the sum, not each addend, as one device does.
    let keeps =
        matches!(cur[0], SplitState::Split(_)) || (matches!(cur[0], SplitState::Partial(_)) && src[0].ty == src[1].ty);
    if keeps {
        out.push(Candidate::new(vec![cur[0].clone(), cur[0].clone()], cur[0].clone()));
    }
    // Or the destination's layout: each device converts the part it holds.
    if let SplitState::Split(_) = &cur[1] {
        out.push(Candidate::new(vec![cur[1].clone(), cur[1].clone()], cur[1].clone()));
    }
}

/// `cpy` between shapes that differ (ggml copies in element order, as a
/// reshape reads): a split of the source that [`reshape_split`] maps onto
/// the destination's shape, or a split of the destination that maps back,
/// writes each device's elements into its part of the destination
/// (llama.cpp stores a delta-net layer's `[d_conv−1, channels]` conv state
/// and its `[S, S, H_v, B]` recurrent state into flat cache rows).
fn cpy_reshaped(x: &Node, out: &mut Vec<Candidate>) {
    let (a, b) = (&x.src[0].ne, &x.src[1].ne);
    if let SplitState::Split(s) = &x.cur[0] {
        if let Some(o) = reshape_split(s, a, b) {
            let o = SplitState::Split(o);
            out.push(Candidate::new(vec![x.cur[0].clone(), o.clone()], o));
        }
    }
    if let SplitState::Split(o) = &x.cur[1] {
        if let Some(s) = reshape_split(o, b, a) {
            out.push(Candidate::new(vec![SplitState::Split(s), x.cur[1].clone()], x.cur[1].clone()));
        }
    }
}

/// `set_rows`: rows `[ne0, n, ne2, ne3]`, idx, dst `[ne0, m, ne2, ne3]`; a
/// split of ne0 or of dims 2/3 (heads) writes each device's part of every row.
fn set_rows(x: &Node, out: &mut Vec<Candidate>) {
    let (rows, idx, dst) = (x.src[0], x.src[1], x.src[2]);
    for st in [&x.cur[2], &x.cur[0]] {
        if let SplitState::Split(s) = st {
            let ax = s.axis;
            let idx_ok = ax == 0 || (ax == 2 && idx.ne[1] == 1) || (ax == 3 && idx.ne[2] == 1);
            if ax != 1 && idx_ok && rows.ne[ax] == dst.ne[ax] && s.axis_len() == dst.ne[ax] {
                out.push(Candidate::new(vec![st.clone(), SplitState::Mirrored, st.clone()], st.clone()));
            }
        }
    }
}

/// `view`: a split parent gives the view's part of it (or, for a parent held
/// in a device-local packing, what its rule says the view reads); a view
/// of a partial sum is one when it reads whole elements of the same type.
fn view(x: &Node, out: &mut Vec<Candidate>) {
    let (t, parent, p) = (x.t, x.src[0], SplitState::partial());
    if let SplitState::Split(s) = &x.cur[0] {
        let o = if super::holds_packed(parent) {
            super::packed_view(x.ctx, parent, t, s).map(|g| g.split)
        } else {
            view_split(parent, t, s)
        };
        if let Some(o) = o {
            out.push(Candidate::new(vec![x.cur[0].clone()], SplitState::Split(o)));
        }
    }
    let ts = t.ty.type_size();
    if x.cur[0] == p && t.ty == parent.ty && t.view_offs % ts == 0 && t.nb.iter().all(|b| b % ts == 0) {
        out.push(Candidate::new(vec![p.clone()], p));
    }
}

/// `get_rows`: linear in the table (a partial table gives a partial
/// result); a table split on rows (axis 1, the vocabulary) gives a partial
/// sum ([`partial_lookup`]); split on ne0 it gives rows split alike; ids
/// split give rows split alike.
fn get_rows(x: &Node, out: &mut Vec<Candidate>) {
    let (t, src, cur) = (x.t, &x.src, x.cur);
    let (m, p) = (SplitState::Mirrored, SplitState::partial());
    if cur[0] == p && t.ty == src[0].ty && t.ty == GgmlType::F32 {
        out.push(Candidate::new(vec![p.clone(), m.clone()], p.clone()));
    }
    if let SplitState::Split(s) = &cur[0] {
        match s.axis {
            // Vocabulary-parallel embedding: the owner looks the row up, the others give zeros.
            1 if t.ty == GgmlType::F32 => out.push(Candidate::new(vec![cur[0].clone(), m.clone()], p)),
            0 => out.push(Candidate::new(vec![cur[0].clone(), m.clone()], cur[0].clone())),
            _ => {}
        }
    }
    if let SplitState::Split(s) = &cur[1] {
        if s.axis == 0 && src[1].ne[1] == 1 {
            let mut o = s.clone();
            o.axis = 1;
            out.push(Candidate::new(vec![m, cur[1].clone()], SplitState::Split(o)));
        }
    }
}

/// True if node `t`, with inputs in states `inputs` and output `out`, is a
/// vocabulary-parallel lookup (`get_rows` from a table split on rows giving
/// a partial sum): lowered to its own step, compiled to `get_rows_part`.
pub(crate) fn partial_lookup(t: &Tensor, inputs: &[SplitState], out: &SplitState) -> bool {
    t.op == Op::GetRows
        && matches!(inputs.first(), Some(SplitState::Split(s)) if s.axis == 1)
        && matches!(out, SplitState::Partial(_))
}

/// If view `t` is a box of its parent `p` (the same strides; a range per
/// axis): the start index along each axis of `p`.
pub(crate) fn box_starts(p: &Tensor, t: &Tensor) -> Option<[i64; 4]> {
    if t.ty != p.ty || t.view_src.is_none() {
        return None;
    }
    let p_offs = if p.view_src.is_some() { p.view_offs } else { 0 };
    let mut rel = t.view_offs.checked_sub(p_offs)?;
    for k in 0..4 {
        if t.ne[k] > 1 && t.nb[k] != p.nb[k] {
            return None;
        }
    }
    let bs = p.ty.block_size() as i64;
    let mut starts = [0i64; 4];
    let mut order: Vec<usize> = (0..4).filter(|&k| p.ne[k] > 1).collect();
    order.sort_by(|&a, &b| p.nb[b].cmp(&p.nb[a]));
    for &k in &order {
        let step = p.nb[k];
        if step == 0 {
            continue;
        }
        let d = rel / step;
        rel -= d * step;
        starts[k] = d as i64 * if k == 0 { bs } else { 1 };
    }
    if rel != 0 {
        return None;
    }
    (0..4).all(|k| starts[k] >= 0 && starts[k] + t.ne[k] <= p.ne[k]).then_some(starts)
}

/// How view `t` of a parent `p` split as `s` reads it: `p` seen in the
/// shape the view's strides imply (for a contiguous parent: a reshape, as
/// llama.cpp's q/k/v views of a fused qkv product `[d, h, T]` of `[(h+2·hkv)·d, T]`),
/// that shape's split, and the view's start index per axis of it.
pub(crate) fn view_geometry(p: &Tensor, t: &Tensor, s: &AxisSplit) -> Option<(Tensor, AxisSplit, [i64; 4])> {
    if let Some(st) = box_starts(p, t) {
        return Some((p.clone(), s.clone(), st));
    }
    if !p.is_contiguous() || t.ty != p.ty {
        return None;
    }
    // The shape whose contiguous strides are the view's.
    let (ts, bs) = (p.ty.type_size(), p.ty.block_size() as i64);
    if t.nb[0] != ts {
        return None;
    }
    // Up to the view's outermost axis with more than one element (`top`)
    // the strides give the extents; that axis takes the rest of the parent.
    // (A view's strides above `top` are products of its own extents — a
    // window of 256 cells of a 4104-cell cache has nb[3] = 256 rows — and
    // say nothing of the parent's shape.)
    let top = (0..4).rev().find(|&k| t.ne[k] > 1).unwrap_or(0);
    let mut ne = [1i64; 4];
    for (k, e) in ne.iter_mut().take(top).enumerate() {
        if t.nb[k] == 0 || t.nb[k + 1] % t.nb[k] != 0 {
            return None;
        }
        *e = (t.nb[k + 1] / t.nb[k]) as i64 * if k == 0 { bs } else { 1 };
    }
    let total: i64 = p.ne.iter().product();
    let inner: i64 = ne[..top].iter().product();
    if inner <= 0 || total % inner != 0 {
        return None;
    }
    ne[top] = total / inner;
    let q = Tensor { ne, nb: crate::tensor::contiguous_strides(p.ty, &ne), ..p.clone() };
    let sq = if ne == p.ne { s.clone() } else { reshape_split(s, &p.ne, &ne)? };
    let st = box_starts(&q, t)?;
    Some((q, sq, st))
}

/// The split of view `t` of a parent `p` split as `s` (see
/// [`view_geometry`]): the segment instances clipped to the view's range
/// along the split axis.
pub(crate) fn view_split(p: &Tensor, t: &Tensor, s: &AxisSplit) -> Option<AxisSplit> {
    let (p, s, starts) = view_geometry(p, t, s)?;
    let (p, s) = (&p, &s);
    let a = s.axis;
    let (st, len) = (starts[a], t.ne[a]);
    if st == 0 && len == p.ne[a] {
        return Some(s.clone());
    }
    let n = s.n_devices();
    let mut segments = Vec::new();
    let mut base = 0i64;
    for _ in 0..s.repeat {
        for seg in &s.segments {
            let mut ext = Vec::with_capacity(n);
            let mut pos = base;
            for &e in seg {
                let (lo, hi) = (pos.max(st), (pos + e).min(st + len));
                ext.push((hi - lo).max(0));
                pos += e;
            }
            if ext.iter().any(|&e| e > 0) {
                segments.push(ext);
            }
            base = pos;
        }
    }
    if segments.is_empty() {
        segments.push(vec![0; n]);
    }
    // Blocks of a quantized row must stay whole on each device.
    let bs = p.ty.block_size() as i64;
    if a == 0 && segments.iter().flatten().any(|e| e % bs != 0) {
        return None;
    }
    Some(AxisSplit { axis: a, segments, repeat: 1 })
}

/// Concat along `dim`: splits of another axis carry through when both
/// inputs agree; splits along `dim` give the first input's segments then
/// the second's (each device holds its part of both, in order).
fn concat(x: &Node, dim: usize, out: &mut Vec<Candidate>) {
    let (a, b, cur) = (x.src[0], x.src[1], x.cur);
    let m = SplitState::Mirrored;
    for st in [&cur[0], &cur[1]] {
        if let SplitState::Split(s) = st {
            if s.axis != dim && a.ne[s.axis] == b.ne[s.axis] {
                out.push(Candidate::new(vec![st.clone(), st.clone()], st.clone()));
            }
        }
    }
    let seg_list = |s: &AxisSplit| -> Vec<Vec<i64>> {
        let mut v = Vec::new();
        for _ in 0..s.repeat {
            v.extend(s.segments.iter().cloned());
        }
        v
    };
    let joined = |x: &AxisSplit, y: &AxisSplit| AxisSplit {
        axis: dim,
        segments: seg_list(x).into_iter().chain(seg_list(y)).collect(),
        repeat: 1,
    };
    match (&cur[0], &cur[1]) {
        (SplitState::Split(x), SplitState::Split(y)) if x.axis == dim && y.axis == dim => {
            out.push(Candidate::new(cur.to_vec(), SplitState::Split(joined(x, y))));
        }
        // One input split along dim, the other mirrored: slice the other in the same proportions.
        (SplitState::Split(x), o) | (o, SplitState::Split(x)) if x.axis == dim && *o == m => {
            let first = matches!(cur[0], SplitState::Split(ref s) if s.axis == dim);
            let other = if first { b } else { a };
            let lens: Vec<f32> = (0..x.n_devices()).map(|j| x.local_len(j) as f32).collect();
            let bs = if dim == 0 { other.ty.block_size() as i64 } else { 1 };
            if let Ok(ext) = crate::split::state::split_extents(other.ne[dim], &lens, bs) {
                let y = AxisSplit::even(dim, ext);
                let (sa, sb) = if first { (x.clone(), y) } else { (y, x.clone()) };
                let o = joined(&sa, &sb);
                out.push(Candidate::new(vec![SplitState::Split(sa), SplitState::Split(sb)], SplitState::Split(o)));
            }
        }
        _ => {}
    }
}

/// How a split on one axis maps through a reshape of a contiguous tensor
/// from `ne_in` to `ne_out`, if it stays an axis split (see the module docs
/// of `split`): device slices become slices of the output axis whose inner
/// stride divides or is divided by the input axis's inner stride.
pub(crate) fn reshape_split(s: &AxisSplit, ne_in: &[i64; 4], ne_out: &[i64; 4]) -> Option<AxisSplit> {
    let a = s.axis;
    let inner: i64 = ne_in[..a].iter().product();
    let len_a = ne_in[a];
    if inner <= 0 || len_a <= 0 {
        return None;
    }
    let mut found: Vec<AxisSplit> = Vec::new();
    for c in 0..4 {
        let inner_c: i64 = ne_out[..c].iter().product();
        let len_c = ne_out[c];
        if inner_c <= 0 || len_c <= 0 {
            continue;
        }
        let span_in = inner * len_a;
        let span_c = inner_c * len_c;
        if span_c % span_in != 0 {
            continue;
        }
        let m = span_c / span_in;
        let segments: Option<Vec<Vec<i64>>> = if inner_c >= inner {
            if inner_c % inner != 0 {
                continue;
            }
            let f = inner_c / inner;
            if len_a % f != 0 {
                continue;
            }
            // Every boundary must fall on a multiple of f.
            let mut pos = 0;
            let mut ok = true;
            let segs: Vec<Vec<i64>> = s
                .segments
                .iter()
                .map(|seg| {
                    seg.iter()
                        .map(|&e| {
                            ok &= pos % f == 0 && e % f == 0;
                            pos += e;
                            e / f
                        })
                        .collect()
                })
                .collect();
            ok.then_some(segs)
        } else {
            if inner % inner_c != 0 {
                continue;
            }
            let f = inner / inner_c;
            Some(s.segments.iter().map(|seg| seg.iter().map(|&e| e * f).collect()).collect())
        };
        if let Some(segments) = segments {
            found.push(AxisSplit { axis: c, segments, repeat: s.repeat * m });
        }
    }
    // A repeated split folds back onto an axis as long as one period
    // (`[D, H·T]` split per H repeated T times → `[D, H, T]` split on H).
    let period: i64 = s.segments.iter().flatten().sum();
    if s.repeat > 1 && period > 0 {
        for c in 0..4 {
            let inner_c: i64 = ne_out[..c].iter().product();
            if inner_c != inner || ne_out[c] <= 0 || ne_out[c] % period != 0 {
                continue;
            }
            let r1 = ne_out[c] / period;
            if r1 == 0 || s.repeat % r1 != 0 {
                continue;
            }
            // The remaining repeats must be whole outer axes of the output.
            let mut rest = s.repeat / r1;
            let mut d = c + 1;
            while rest > 1 && d < 4 {
                if ne_out[d] <= 0 || rest % ne_out[d] != 0 {
                    break;
                }
                rest /= ne_out[d];
                d += 1;
            }
            if rest == 1 {
                found.push(AxisSplit { axis: c, segments: s.segments.clone(), repeat: r1 });
            }
        }
    }
    // Fewest repeats, then the outermost axis (heads rather than head_dim).
    found.into_iter().min_by_key(|o| (o.repeat, std::cmp::Reverse(o.axis)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_maps_head_splits() {
        // [D*H, T] split on axis 0 by whole heads → [D, H, T] split on axis 1.
        let s = AxisSplit::even(0, vec![128 * 3, 128 * 5]);
        let o = reshape_split(&s, &[1024, 7, 1, 1], &[128, 8, 7, 1]).unwrap();
        assert_eq!(o, AxisSplit::even(1, vec![3, 5]));
        // And back.
        let b = reshape_split(&o, &[128, 8, 7, 1], &[1024, 7, 1, 1]).unwrap();
        assert_eq!(b, s);
        // C4: [128, 8, T] split on heads → [128, 8·T]: one segment of 8 repeated T times.
        let k = AxisSplit::even(1, vec![4, 4]);
        let f = reshape_split(&k, &[128, 8, 5, 1], &[128, 40, 1, 1]).unwrap();
        assert_eq!(f, AxisSplit { axis: 1, segments: vec![vec![4, 4]], repeat: 5 });
        // Not on whole heads: no axis split survives.
        let odd = AxisSplit::even(0, vec![100, 924]);
        assert!(reshape_split(&odd, &[1024, 7, 1, 1], &[128, 8, 7, 1]).is_none());
    }
}
