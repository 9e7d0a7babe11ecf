//! Split rules of the ssm family (`ops/ssm.rs`): `ssm_conv` by channels and
//! `gated_delta_net` by heads, whose split result is held in a device-local
//! packing ([`Candidate::packed`]) that only its two views read.

use super::{Candidate, Node};
use crate::graph::Context;
use crate::ops::{ops_outside, Op};
use crate::split::state::{AxisSplit, SplitState};
use crate::tensor::Tensor;

/// The candidates of an ssm-family node (the replicated one is added by the caller).
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        Op::SsmConv => ssm_conv(x, out),
        Op::GatedDeltaNet { .. } => gated_delta_net(x, out),
        // Not an ssm op: `Op::family` routes none here.
        ops_outside!(ssm) => {}
    }
}

/// True if a split result of `p` is held in a device-local packing
/// (`gated_delta_net`: see [`gated_delta_net`]).
pub(super) fn packs(p: &Tensor) -> bool {
    matches!(p.op, Op::GatedDeltaNet { .. })
}

/// `ssm_conv` by channels: sx `[d_conv−1+n_t, d_inner, n_s]` and c
/// `[d_conv, d_inner]` split on axis 1 → the result `[d_inner, n_t, n_s]` on axis 0.
fn ssm_conv(x: &Node, out: &mut Vec<Candidate>) {
    for st in &x.cur[..2] {
        if let SplitState::Split(s) = st {
            if s.axis == 1 && x.src[0].ne[1] == x.src[1].ne[1] {
                let o = AxisSplit { axis: 0, ..s.clone() };
                out.push(Candidate::new(vec![st.clone(), st.clone()], SplitState::Split(o)));
            }
        }
    }
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
/// two views ([`packed_view`]) read it; the planner never converts it.
fn gated_delta_net(x: &Node, out: &mut Vec<Candidate>) {
    let (src, cur) = (&x.src, x.cur);
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
    let ins = vec![qk.clone(), qk, heads(1, 1), heads(1, 1), heads(1, 1), heads(2, 1)];
    out.push(Candidate { packed: true, ..Candidate::new(ins, heads(0, s)) });
}

/// How a view of a head-split Gated-DeltaNet result reads this device's
/// packing (see [`gated_delta_net`]; the planner and compiler reach it
/// through [`super::packed_view`]).
pub(crate) struct PackedView {
    /// The view's split.
    pub split: AxisSplit,
    /// Head size S, output rows T and sequences B of the result.
    s: i64,
    t: i64,
    b: i64,
    /// `None` for the output view; `Some((slot, rows, slots))` for a view
    /// of the states of `rows` sequences in `slots` slots from `slot` on.
    state: Option<(i64, i64, i64)>,
    /// A state view shaped `[S, S, H_v, rows]` (llama.cpp's `new_state`)
    /// rather than `[S·S·H_v, rows, slots]`.
    by_head: bool,
}

impl PackedView {
    /// The view of this device's packing when it holds `parent_len`
    /// elements of the result's axis 0 (`S` per value head it holds):
    /// local `ne`, `nb` (bytes) and byte offset.
    pub fn local(&self, parent_len: i64) -> ([i64; 4], [usize; 4], usize) {
        let h = parent_len / self.s.max(1);
        let f = 4usize;
        let (s, t, b) = (self.s, self.t, self.b);
        match self.state {
            None => {
                let nb = [f, s as usize * f, (s * h) as usize * f, (s * h * t) as usize * f];
                ([s, h, t, b], nb, 0)
            }
            Some((slot, rows, slots)) => {
                let state = (s * s * h) as usize * f;
                let offs = (s * h * t * b) as usize * f + slot as usize * state * b as usize;
                if self.by_head {
                    let nb = [f, s as usize * f, (s * s) as usize * f, state];
                    return ([s, s, h, rows], nb, offs);
                }
                let per_slot = state * b as usize;
                let nb = [f, state, per_slot, per_slot * slots as usize];
                ([s * s * h, rows, slots, 1], nb, offs)
            }
        }
    }
}

/// The two views llama.cpp takes of a Gated-DeltaNet result `p` split by
/// heads as `sp`: the output `[S, H_v, T, B]` at offset 0 (split on its
/// head axis) and a state snapshot `[S·S·H_v, rows ≤ B]` (split on axis 0).
/// `None` for any other view of it.
pub(super) fn packed_view(ctx: &Context, p: &Tensor, t: &Tensor, sp: &AxisSplit) -> Option<PackedView> {
    if !packs(p) || t.op != Op::View || sp.axis != 0 || t.ty != p.ty {
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
        return Some(PackedView { split, s, t: t_, b, state: None, by_head: false });
    }
    let state = (s * s * hv) as usize * fs;
    if offs < out_bytes || (offs - out_bytes) % (state * b as usize) != 0 {
        return None;
    }
    let slot = ((offs - out_bytes) / (state * b as usize)) as i64;
    let slots_left = match p.op {
        Op::GatedDeltaNet { k_snapshots } => k_snapshots - slot,
        _ => 0,
    };
    // `[S·S·H_v, rows ≤ B, slots]`: the states of `rows` sequences in
    // consecutive slots (a verify batch's snapshots).
    if t.ne[0] == s * s * hv
        && t.ne[1] <= b
        && (1..=slots_left).contains(&t.ne[2])
        && t.ne[3] == 1
        && (t.ne[1] == 1 || t.nb[1] == state)
        && (t.ne[2] == 1 || t.nb[2] == state * b as usize)
    {
        let split = AxisSplit { axis: 0, segments: per_head(s * s)?, repeat: sp.repeat };
        return Some(PackedView { split, s, t: t_, b, state: Some((slot, t.ne[1], t.ne[2])), by_head: false });
    }
    // `[S, S, H_v, rows ≤ B]`: one slot's states by head (llama.cpp's
    // `new_state` of a plain step).
    if t.ne[0] == s
        && t.ne[1] == s
        && t.ne[2] == hv
        && t.ne[3] <= b
        && slots_left >= 1
        && t.nb[1] == s as usize * fs
        && t.nb[2] == (s * s) as usize * fs
        && (t.ne[3] == 1 || t.nb[3] == state)
    {
        let split = AxisSplit { axis: 2, segments: per_head(1)?, repeat: sp.repeat };
        return Some(PackedView { split, s, t: t_, b, state: Some((slot, t.ne[3], 1)), by_head: true });
    }
    None
}
