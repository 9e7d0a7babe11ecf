//! Propagation rules: for each op, the candidate strategies — the state each
//! input must be in and the state the output then has (DESIGN.md section 4,
//! in the manner of DTensor's per-op strategy tables). Every op has the
//! replicated strategy (all inputs mirrored → mirrored), so every graph has
//! a plan. Candidates are derived from the inputs' current states; the
//! planner prices the conversions and picks the cheapest.

use super::state::{AxisSplit, SplitState};
use crate::graph::Context;
use crate::ops::{Op, UnaryOp};
use crate::tensor::Tensor;

/// One strategy for a node.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Candidate {
    /// Required state per input (same order as the node's sources).
    pub inputs: Vec<SplitState>,
    /// Resulting state of the node.
    pub output: SplitState,
    /// Bytes of the per-row combine a distributed row op needs (all devices together), if any.
    pub combine_bytes: Option<u64>,
}

fn cand(inputs: Vec<SplitState>, output: SplitState) -> Candidate {
    Candidate { inputs, output, combine_bytes: None }
}

/// The candidates for node `t` whose inputs currently have states `cur`, on `n` devices.
/// The replicated strategy is always the last candidate.
pub(crate) fn candidates(ctx: &Context, t: &Tensor, cur: &[SplitState], n: usize) -> Vec<Candidate> {
    let mut out = Vec::new();
    let src: Vec<&Tensor> = t.src.iter().map(|&s| ctx.t(s)).collect();
    let m = SplitState::Mirrored;
    let p = SplitState::partial;
    match &t.op {
        // Element-wise non-linear functions of one input keep a split.
        Op::Sqr
        | Op::Sqrt
        | Op::Unary(_)
        | Op::Clamp { .. }
        | Op::Scale { .. }
        | Op::Cont
        | Op::Dup
        | Op::Fill { .. } => {
            if let SplitState::Split(s) = &cur[0] {
                if src[0].ne == t.ne {
                    out.push(cand(vec![cur[0].clone()], SplitState::Split(s.clone())));
                } else if matches!(t.op, Op::Cont | Op::Dup) {
                    // cont_2d and friends: a copy in element order, then a reshape.
                    if let Some(o) = reshape_split(s, &src[0].ne, &t.ne) {
                        out.push(cand(vec![cur[0].clone()], SplitState::Split(o)));
                    }
                }
            }
            let linear = matches!(t.op, Op::Unary(UnaryOp::Neg) | Op::Cont | Op::Dup)
                || matches!(t.op, Op::Scale { b, .. } if b == 0.0);
            if linear && cur[0] == p() && src[0].ne == t.ne {
                out.push(cand(vec![p()], p()));
            }
        }
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            let (a, b) = (src[0], src[1]);
            for st in [&cur[0], &cur[1]] {
                if let SplitState::Split(s) = st {
                    let ax = s.axis;
                    if a.ne[ax] != s.axis_len() {
                        continue;
                    }
                    if b.ne[ax] == a.ne[ax] {
                        out.push(cand(vec![st.clone(), st.clone()], st.clone()));
                    } else if b.ne[ax] == 1 {
                        out.push(cand(vec![st.clone(), m.clone()], st.clone()));
                    }
                }
            }
            // Sums of partial sums (b may broadcast: each addend broadcasts alike).
            let any_partial = cur.iter().any(|s| *s == p());
            if any_partial && matches!(t.op, Op::Add | Op::Sub) {
                out.push(cand(vec![p(), p()], p()));
            }
            // Scaling a partial sum by a mirrored factor is linear. (Division is
            // too, but x/0 on zero addends gives NaN where one device gives inf.)
            if cur[0] == p() && matches!(t.op, Op::Mul) {
                out.push(cand(vec![p(), m.clone()], p()));
            }
            if cur[1] == p() && matches!(t.op, Op::Mul) {
                out.push(cand(vec![m.clone(), p()], p()));
            }
        }
        // Copy/convert into a destination: the destination takes the source's layout.
        Op::Cpy if src[0].ne == src[1].ne => {
            // A partial sum stays partial through a plain copy; a conversion to
            // another type rounds the sum, not each addend, as one device does.
            let keeps = matches!(cur[0], SplitState::Split(_))
                || (matches!(cur[0], SplitState::Partial(_)) && src[0].ty == src[1].ty);
            if keeps {
                out.push(cand(vec![cur[0].clone(), cur[0].clone()], cur[0].clone()));
            }
            // Or the destination's layout: each device converts the part it holds.
            if let SplitState::Split(_) = &cur[1] {
                out.push(cand(vec![cur[1].clone(), cur[1].clone()], cur[1].clone()));
            }
        }
        Op::Glu { .. } if src.len() == 2 => {
            for st in &cur[..2] {
                if matches!(st, SplitState::Split(_)) && src[1].ne == src[0].ne {
                    out.push(cand(vec![st.clone(), st.clone()], st.clone()));
                }
            }
        }
        Op::Glu { .. } => {
            if let SplitState::Split(s) = &cur[0] {
                if s.axis >= 1 {
                    // Rows split: each row's gate and value halves stay together.
                    out.push(cand(vec![cur[0].clone()], cur[0].clone()));
                } else if s.repeat == 1 && s.segments.len() == 2 && s.segments[0] == s.segments[1] {
                    // A fused gate|up row split as two equal segments: device j
                    // holds gate[j] then up[j], which glu pairs locally.
                    out.push(cand(vec![cur[0].clone()], SplitState::split(0, s.segments[0].clone())));
                }
            }
        }
        Op::View => {
            if let SplitState::Split(s) = &cur[0] {
                let o = match gdn_view(ctx, src[0], t, s) {
                    Some(g) => Some(g.split),
                    None if matches!(src[0].op, Op::GatedDeltaNet { .. }) => None,
                    None => view_split(src[0], t, s),
                };
                if let Some(o) = o {
                    out.push(cand(vec![cur[0].clone()], SplitState::Split(o)));
                }
            }
            // A view of a partial sum is one when it reads whole elements of the same type.
            let ts = t.ty.type_size();
            if cur[0] == p() && t.ty == src[0].ty && t.view_offs % ts == 0 && t.nb.iter().all(|b| b % ts == 0) {
                out.push(cand(vec![p()], p()));
            }
        }
        Op::Concat { dim } => concat(&mut out, src[0], src[1], *dim, cur),
        Op::GatedDeltaNet { .. } => gated_delta_net(&mut out, &src, cur),
        Op::SsmConv => {
            // Channels: sx [d_conv−1+n_t, d_inner, n_s] axis 1, c [d_conv, d_inner] axis 1 → out axis 0.
            for st in &cur[..2] {
                if let SplitState::Split(s) = st {
                    if s.axis == 1 && src[0].ne[1] == src[1].ne[1] {
                        let o = AxisSplit { axis: 0, ..s.clone() };
                        out.push(cand(vec![st.clone(), st.clone()], SplitState::Split(o)));
                    }
                }
            }
        }
        Op::SetRows => {
            // src: rows [ne0, n, ne2, ne3], idx, dst [ne0, m, ne2, ne3]; a split of
            // ne0 or of dims 2/3 (heads) writes each device's part of every row.
            let (rows, idx, dst) = (src[0], src[1], src[2]);
            for st in [&cur[2], &cur[0]] {
                if let SplitState::Split(s) = st {
                    let ax = s.axis;
                    let idx_ok = ax == 0 || (ax == 2 && idx.ne[1] == 1) || (ax == 3 && idx.ne[2] == 1);
                    if ax != 1 && idx_ok && rows.ne[ax] == dst.ne[ax] && s.axis_len() == dst.ne[ax] {
                        out.push(cand(vec![st.clone(), m.clone(), st.clone()], st.clone()));
                    }
                }
            }
        }
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::L2Norm { .. } | Op::SoftMax { .. } => {
            // ALiBi slopes depend on the global head index (axis 2).
            let alibi = matches!(t.op, Op::SoftMax { max_bias, .. } if max_bias > 0.0);
            if let SplitState::Split(s) = &cur[0] {
                let ax = s.axis;
                if ax == 0 {
                    // Rows split: the distributed row op (a 2-D mask, no ALiBi, no sinks).
                    let mask_2d = src.len() < 2 || (src[1].ne[2] == 1 && src[1].ne[3] == 1);
                    if !alibi && mask_2d && src.len() <= 2 {
                        let mut ins = vec![cur[0].clone()];
                        if src.len() > 1 {
                            if src[1].ne[0] != src[0].ne[0] {
                                return with_replicated(out, src.len());
                            }
                            ins.push(cur[0].clone());
                        }
                        let combine = Some(row_combine(src[0], n, 8));
                        out.push(Candidate { inputs: ins, output: cur[0].clone(), combine_bytes: combine });
                    }
                } else if !(alibi && ax == 2) {
                    // Whole rows on each device: the mask (per row, broadcast or not)
                    // splits the same way or is mirrored; sinks follow the heads.
                    let mut ins = vec![cur[0].clone()];
                    let mut ok = true;
                    if let Some(mk) = src.get(1) {
                        if mk.ne[ax] == 1 {
                            ins.push(m.clone());
                        } else if mk.ne[ax] == src[0].ne[ax] {
                            ins.push(cur[0].clone());
                        } else {
                            ok = false;
                        }
                    }
                    if let Some(sk) = src.get(2) {
                        if ax == 2 && sk.ne[0] == src[0].ne[2] {
                            ins.push(SplitState::Split(AxisSplit { axis: 0, ..s.clone() }));
                        } else if ax == 2 {
                            ok = false;
                        } else {
                            ins.push(m.clone());
                        }
                    }
                    if ok {
                        out.push(cand(ins, cur[0].clone()));
                    }
                }
            }
        }
        Op::Argmax | Op::TopK { .. } | Op::SumRows | Op::Mean | Op::Argsort { .. } => {
            let k = match t.op {
                Op::TopK { k } => k.max(0) as u64,
                _ => 1,
            };
            if let SplitState::Split(s) = &cur[0] {
                if s.axis == 0 && !matches!(t.op, Op::Argsort { .. }) {
                    // Local reduction per device, then combine N small results per row.
                    out.push(Candidate {
                        inputs: vec![cur[0].clone()],
                        output: m.clone(),
                        combine_bytes: Some(row_combine(src[0], n, 8 * k)),
                    });
                } else if s.axis > 0 {
                    let mut o = s.clone();
                    if matches!(t.op, Op::Argmax) {
                        if s.axis != 1 {
                            return with_replicated(out, src.len());
                        }
                        o.axis = 0;
                    }
                    out.push(cand(vec![cur[0].clone()], SplitState::Split(o)));
                }
            }
            if cur[0] == p() && matches!(t.op, Op::SumRows | Op::Mean) {
                out.push(cand(vec![p()], p()));
            }
        }
        Op::Sum => {
            if cur[0] == p() {
                out.push(cand(vec![p()], p()));
            }
            if let SplitState::Split(_) = &cur[0] {
                out.push(Candidate {
                    inputs: vec![cur[0].clone()],
                    output: m.clone(),
                    combine_bytes: Some(4 * n as u64),
                });
            }
        }
        Op::MulMat => mul_mat(&mut out, src[0], src[1], cur),
        Op::GetRows => {
            // A lookup is linear in the table.
            if cur[0] == p() && t.ty == src[0].ty && t.ty == crate::tensor::GgmlType::F32 {
                out.push(cand(vec![p(), m.clone()], p()));
            }
            if let SplitState::Split(s) = &cur[0] {
                match s.axis {
                    // Vocabulary-parallel embedding: the owner looks the row up, the others give zeros.
                    1 if t.ty == crate::tensor::GgmlType::F32 => out.push(cand(vec![cur[0].clone(), m.clone()], p())),
                    0 => out.push(cand(vec![cur[0].clone(), m.clone()], cur[0].clone())),
                    _ => {}
                }
            }
            if let SplitState::Split(s) = &cur[1] {
                if s.axis == 0 && src[1].ne[1] == 1 {
                    let mut o = s.clone();
                    o.axis = 1;
                    out.push(cand(vec![m.clone(), cur[1].clone()], SplitState::Split(o)));
                }
            }
        }
        Op::Permute { axes } => {
            if let SplitState::Split(s) = &cur[0] {
                let mut o = s.clone();
                o.axis = axes[s.axis];
                out.push(cand(vec![cur[0].clone()], SplitState::Split(o)));
            }
            if cur[0] == p() {
                out.push(cand(vec![p()], p()));
            }
        }
        Op::Transpose => {
            if let SplitState::Split(s) = &cur[0] {
                let mut o = s.clone();
                o.axis = [1, 0, 2, 3][s.axis];
                out.push(cand(vec![cur[0].clone()], SplitState::Split(o)));
            }
            if cur[0] == p() {
                out.push(cand(vec![p()], p()));
            }
        }
        Op::Reshape => {
            if let SplitState::Split(s) = &cur[0] {
                if let Some(o) = reshape_split(s, &src[0].ne, &t.ne) {
                    out.push(cand(vec![cur[0].clone()], SplitState::Split(o)));
                }
            }
            if cur[0] == p() {
                out.push(cand(vec![p()], p()));
            }
        }
        Op::Rope(rp) => {
            let mut rest = vec![m.clone(); src.len().saturating_sub(2)];
            if let SplitState::Split(s) = &cur[0] {
                let multi = matches!(rp.mode, crate::ops::RopeMode::Mrope | crate::ops::RopeMode::Imrope);
                if s.axis == 1 || s.axis == 3 {
                    let mut ins = vec![cur[0].clone(), m.clone()];
                    ins.append(&mut rest.clone());
                    out.push(cand(ins, cur[0].clone()));
                } else if s.axis == 2 && !multi && s.segments.len() == 1 && s.repeat == 1 {
                    // Tokens split: positions split the same way.
                    let ps = SplitState::Split(AxisSplit { axis: 0, ..s.clone() });
                    let mut ins = vec![cur[0].clone(), ps];
                    ins.append(&mut rest.clone());
                    out.push(cand(ins, cur[0].clone()));
                }
            }
            if cur[0] == p() {
                // Rotation is linear in x.
                let mut ins = vec![p(), m.clone()];
                ins.append(&mut rest);
                out.push(cand(ins, p()));
            }
        }
        Op::FlashAttnExt { .. } => flash_attn(&mut out, t, &src, cur),
        Op::Repeat => {
            // Tiling along other axes keeps a split of an axis that is not repeated.
            if let SplitState::Split(s) = &cur[0] {
                if t.ne[s.axis] == src[0].ne[s.axis] {
                    out.push(cand(vec![cur[0].clone()], cur[0].clone()));
                }
            }
            if cur[0] == p() {
                out.push(cand(vec![p()], p()));
            }
        }
        _ => {}
    }
    with_replicated(out, src.len())
}

/// Gated DeltaNet split by key heads (llama.cpp's meta backend: q/k/v/g/β
/// on their head axis, the state by heads → the result by heads). Value
/// head `h` reads key head `h % H_k`, so device `j` holding key heads
/// `e_j` holds the value heads `r·H_k + e_j` of every repetition `r <
/// H_v/H_k`: v, g, β and the state are split as `H_v/H_k` equal segments.
/// The result `[S·H_v, T·B + K·S·B]` is then held by heads in this
/// device-local packing: its own `[S, H_vj]` output rows, then its own
/// states `[S, S, H_vj, B]` — an axis-0 split of the output rows, but not
/// of the state rows, so the result is marked split on axis 0 and only its
/// two views ([`gdn_view`]) read it; the planner never converts it.
fn gated_delta_net(out: &mut Vec<Candidate>, src: &[&Tensor], cur: &[SplitState]) {
    let (q, k, v) = (src[0], src[1], src[2]);
    let (s, hk, hv) = (v.ne[0], q.ne[1], v.ne[1]);
    if hk <= 0 || hv % hk != 0 || k.ne[1] != hk || q.ne[3] != v.ne[3] || k.ne[3] != v.ne[3] {
        return;
    }
    let r = (hv / hk) as usize;
    let flat = |a: &AxisSplit| -> Vec<Vec<i64>> {
        let mut v = Vec::new();
        for _ in 0..a.repeat {
            v.extend(a.segments.iter().cloned());
        }
        v
    };
    // Key-head extents from q or k (one segment), or from v, g, β (r equal segments).
    let mut ext: Option<Vec<i64>> = None;
    for (i, st) in cur.iter().enumerate().take(5) {
        if let SplitState::Split(a) = st {
            if a.axis != 1 {
                continue;
            }
            let segs = flat(a);
            let want = if i < 2 { 1 } else { r };
            if segs.len() == want && segs.iter().all(|x| x == &segs[0]) && segs[0].iter().sum::<i64>() == hk {
                ext = Some(segs[0].clone());
                break;
            }
        }
    }
    let Some(e) = ext else { return };
    let heads = |axis: usize, scale: i64| {
        SplitState::Split(AxisSplit { axis, segments: vec![e.iter().map(|x| x * scale).collect(); r], repeat: 1 })
    };
    let qk = SplitState::Split(AxisSplit { axis: 1, segments: vec![e.clone()], repeat: 1 });
    out.push(cand(vec![qk.clone(), qk, heads(1, 1), heads(1, 1), heads(1, 1), heads(2, 1)], heads(0, s)));
}

/// How a view of a head-split Gated-DeltaNet result reads this device's
/// packing (see [`gated_delta_net`]).
pub(crate) struct GdnView {
    /// The view's split.
    pub split: AxisSplit,
    /// Head size S, output rows T and sequences B of the result.
    s: i64,
    t: i64,
    b: i64,
    /// `None` for the output view; `Some((slot, rows))` for a state view.
    state: Option<(i64, i64)>,
}

impl GdnView {
    /// The view of this device's packing when it holds `h` value heads:
    /// local `ne`, `nb` (bytes) and byte offset.
    pub fn local(&self, h: i64) -> ([i64; 4], [usize; 4], usize) {
        let f = 4usize;
        let (s, t, b) = (self.s, self.t, self.b);
        match self.state {
            None => {
                let nb = [f, s as usize * f, (s * h) as usize * f, (s * h * t) as usize * f];
                ([s, h, t, b], nb, 0)
            }
            Some((slot, rows)) => {
                let state = (s * s * h) as usize * f;
                let nb = [f, state, state * rows as usize, state * rows as usize];
                let offs = (s * h * t * b) as usize * f + slot as usize * state * b as usize;
                ([s * s * h, rows, 1, 1], nb, offs)
            }
        }
    }
}

/// The two views llama.cpp takes of a Gated-DeltaNet result `p` split by
/// heads as `sp`: the output `[S, H_v, T, B]` at offset 0 (split on its
/// head axis) and a state snapshot `[S·S·H_v, rows ≤ B]` (split on axis 0).
/// `None` for any other view of it.
pub(crate) fn gdn_view(ctx: &Context, p: &Tensor, t: &Tensor, sp: &AxisSplit) -> Option<GdnView> {
    if !matches!(p.op, Op::GatedDeltaNet { .. }) || sp.axis != 0 || t.ty != p.ty {
        return None;
    }
    let v = ctx.t(*p.src.get(2)?);
    let (s, hv, t_, b) = (v.ne[0], v.ne[1], v.ne[2], v.ne[3]);
    if s <= 0 || hv <= 0 || b <= 0 {
        return None;
    }
    let fs = 4usize;
    let out_bytes = (s * hv * t_ * b) as usize * fs;
    let per_head = |x: i64| -> Option<Vec<Vec<i64>>> {
        sp.segments.iter().map(|seg| seg.iter().map(|&e| (e % s == 0).then_some(e / s * x)).collect()).collect()
    };
    let offs = t.view_offs;
    if offs == 0 && t.ne == [s, hv, t_, b] && t.nb[1] == s as usize * fs && t.nb[2] == (s * hv) as usize * fs {
        let split = AxisSplit { axis: 1, segments: per_head(1)?, repeat: sp.repeat };
        return Some(GdnView { split, s, t: t_, b, state: None });
    }
    let state = (s * s * hv) as usize * fs;
    if offs >= out_bytes
        && (offs - out_bytes) % (state * b as usize) == 0
        && t.ne[0] == s * s * hv
        && t.ne[1] <= b
        && t.ne[2] == 1
        && t.ne[3] == 1
        && (t.ne[1] == 1 || t.nb[1] == state)
    {
        let slot = ((offs - out_bytes) / (state * b as usize)) as i64;
        let split = AxisSplit { axis: 0, segments: per_head(s * s)?, repeat: sp.repeat };
        return Some(GdnView { split, s, t: t_, b, state: Some((slot, t.ne[1])) });
    }
    None
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
    let mut ne = [1i64; 4];
    for (k, e) in ne.iter_mut().take(3).enumerate() {
        if t.nb[k] == 0 || t.nb[k + 1] % t.nb[k] != 0 {
            return None;
        }
        *e = (t.nb[k + 1] / t.nb[k]) as i64 * if k == 0 { bs } else { 1 };
    }
    let total: i64 = p.ne.iter().product();
    let inner: i64 = ne[..3].iter().product();
    if inner <= 0 || total % inner != 0 {
        return None;
    }
    ne[3] = total / inner;
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
fn concat(out: &mut Vec<Candidate>, a: &Tensor, b: &Tensor, dim: usize, cur: &[SplitState]) {
    let m = SplitState::Mirrored;
    for st in [&cur[0], &cur[1]] {
        if let SplitState::Split(s) = st {
            if s.axis != dim && a.ne[s.axis] == b.ne[s.axis] {
                out.push(cand(vec![st.clone(), st.clone()], st.clone()));
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
            out.push(cand(cur.to_vec(), SplitState::Split(joined(x, y))));
        }
        // One input split along dim, the other mirrored: slice the other in the same proportions.
        (SplitState::Split(x), o) | (o, SplitState::Split(x)) if x.axis == dim && *o == m => {
            let first = matches!(cur[0], SplitState::Split(ref s) if s.axis == dim);
            let other = if first { b } else { a };
            let lens: Vec<f32> = (0..x.n_devices()).map(|j| x.local_len(j) as f32).collect();
            let bs = if dim == 0 { other.ty.block_size() as i64 } else { 1 };
            if let Ok(ext) = super::state::split_extents(other.ne[dim], &lens, bs) {
                let y = AxisSplit::even(dim, ext);
                let (sa, sb) = if first { (x.clone(), y) } else { (y, x.clone()) };
                let o = joined(&sa, &sb);
                out.push(cand(vec![SplitState::Split(sa), SplitState::Split(sb)], SplitState::Split(o)));
            }
        }
        _ => {}
    }
}

fn with_replicated(mut out: Vec<Candidate>, n_src: usize) -> Vec<Candidate> {
    out.push(cand(vec![SplitState::Mirrored; n_src], SplitState::Mirrored));
    out
}

/// Bytes of a per-row combine: `bytes_per_row` per row from every device.
fn row_combine(a: &Tensor, n: usize, bytes_per_row: u64) -> u64 {
    (a.nrows().max(0) as u64) * bytes_per_row * n as u64
}

fn mul_mat(out: &mut Vec<Candidate>, a: &Tensor, b: &Tensor, cur: &[SplitState]) {
    let m = SplitState::Mirrored;
    let p = SplitState::partial();
    // Weights split on rows (M): output split on axis 0.
    if let SplitState::Split(s) = &cur[0] {
        if s.axis == 1 {
            let mut o = s.clone();
            o.axis = 0;
            out.push(cand(vec![cur[0].clone(), m.clone()], SplitState::Split(o)));
        }
    }
    // Both split on K with the same boundaries: partial sums.
    for st in [&cur[0], &cur[1]] {
        if let SplitState::Split(s) = st {
            if s.axis == 0 {
                out.push(cand(vec![st.clone(), st.clone()], p.clone()));
            }
        }
    }
    // Columns (N) split: output split on axis 1.
    if let SplitState::Split(s) = &cur[1] {
        if s.axis == 1 {
            out.push(cand(vec![m.clone(), cur[1].clone()], cur[1].clone()));
        }
        // Batch dims: heads split the same way on both (a broadcast over b by whole groups).
        if s.axis >= 2 && s.segments.len() == 1 && s.repeat == 1 {
            let ax = s.axis;
            if a.ne[ax] == b.ne[ax] {
                out.push(cand(vec![cur[1].clone(), cur[1].clone()], cur[1].clone()));
            } else if a.ne[ax] == 1 {
                out.push(cand(vec![m.clone(), cur[1].clone()], cur[1].clone()));
            } else if a.ne[ax] > 0 && b.ne[ax] > 0 && b.ne[ax] % a.ne[ax] == 0 {
                let g = b.ne[ax] / a.ne[ax];
                if s.segments[0].iter().all(|e| e % g == 0) {
                    let sa = AxisSplit {
                        axis: ax,
                        segments: vec![s.segments[0].iter().map(|e| e / g).collect()],
                        repeat: 1,
                    };
                    out.push(cand(vec![SplitState::Split(sa), cur[1].clone()], cur[1].clone()));
                }
            }
        }
    }
    // A product is linear in each factor: one partial factor times a mirrored one.
    if cur[0] == p {
        out.push(cand(vec![p.clone(), m.clone()], p.clone()));
    }
    if cur[1] == p {
        out.push(cand(vec![m.clone(), p.clone()], p.clone()));
    }
}

fn flash_attn(out: &mut Vec<Candidate>, t: &Tensor, src: &[&Tensor], cur: &[SplitState]) {
    let (q, k) = (src[0], src[1]);
    let m = SplitState::Mirrored;
    // Queries (axis 1) or sequences (axis 3) split: K/V whole (or split by
    // sequence alike), the mask's rows split with the queries. Output
    // [d_v, n_head, n_q, n_seq]: queries land on axis 2.
    if let SplitState::Split(s) = &cur[0] {
        if s.axis == 1 || s.axis == 3 {
            let ax = s.axis;
            let mut ins = vec![cur[0].clone()];
            let kv = if ax == 3 && k.ne[3] == q.ne[3] { cur[0].clone() } else { m.clone() };
            ins.push(kv.clone());
            ins.push(kv);
            let mut ok = !(ax == 3 && k.ne[3] != q.ne[3] && k.ne[3] != 1);
            for (i, extra) in src[3..].iter().enumerate() {
                // src[3] is the mask [n_kv, n_q, ...]; later ones (sinks) are per head.
                let st = match (i, ax) {
                    (0, 1) if extra.ne[1] == q.ne[1] => Some(cur[0].clone()),
                    (0, 1) => None,
                    (0, _) if extra.ne[3] == 1 => Some(m.clone()),
                    (0, _) if extra.ne[3] == q.ne[3] => Some(cur[0].clone()),
                    (0, _) => None,
                    _ => Some(m.clone()),
                };
                ok &= st.is_some();
                ins.push(st.unwrap_or(SplitState::Mirrored));
            }
            if ok {
                let o = AxisSplit { axis: if ax == 1 { 2 } else { 3 }, ..s.clone() };
                out.push(cand(ins, SplitState::Split(o)));
            }
        }
    }
    // ALiBi slopes depend on the global head index.
    if matches!(t.op, Op::FlashAttnExt { max_bias, .. } if max_bias > 0.0) {
        return;
    }
    let SplitState::Split(s) = &cur[0] else { return };
    if s.axis != 2 || s.segments.len() != 1 || s.repeat != 1 {
        return;
    }
    let (h, hkv) = (q.ne[2], k.ne[2]);
    if hkv <= 0 || h % hkv != 0 {
        return;
    }
    let g = h / hkv;
    if g == 0 {
        return;
    }
    let m = SplitState::Mirrored;
    let mut kv = None;
    if s.segments[0].iter().all(|e| e % g == 0) {
        kv = Some(SplitState::Split(AxisSplit {
            axis: 2,
            segments: vec![s.segments[0].iter().map(|e| e / g).collect()],
            repeat: 1,
        }));
    } else if hkv == 1 {
        // One KV head: every Q head reads it, so K/V stay mirrored.
        kv = Some(m.clone());
    }
    let Some(kv) = kv else { return };
    let mut ins = vec![cur[0].clone(), kv.clone(), kv];
    // Mask (and sinks) are per query position, not per head, when they broadcast over heads.
    for extra in &src[3..] {
        if extra.ne[2] != 1 {
            return;
        }
        ins.push(m.clone());
    }
    out.push(cand(ins, SplitState::Split(AxisSplit { axis: 1, ..s.clone() })));
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
