//! Split rules of the norm family (`ops/norm.rs`): `norm`, `rms_norm`,
//! `l2_norm`, `soft_max` (with its mask and sinks). A split row runs the
//! distributed row op (statistics per device, a row combine, a local
//! finish: `ops/distributed.rs`); whole rows on each device keep the split.

use super::{Candidate, Node};
use crate::ops::{ops_outside, Op, RowReduce};
use crate::split::state::{AxisSplit, SplitState};

/// The candidates of a norm-family node (the replicated one is added by the caller).
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        // One rule for every row normalisation.
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::L2Norm { .. } | Op::SoftMax { .. } => row_op(x, out),
        // Not a norm op: `Op::family` routes none here.
        ops_outside!(norm) => {}
    }
}

/// A row normalisation: split rows (axis 0) combine, whole rows on each
/// device keep the split.
fn row_op(x: &Node, out: &mut Vec<Candidate>) {
    let SplitState::Split(s) = &x.cur[0] else { return };
    // ALiBi slopes depend on the global head index (axis 2).
    let alibi = x.t.op.has_alibi();
    if s.axis == 0 {
        split_rows(x, out);
    } else if !(alibi && s.axis == 2) {
        whole_rows(x, s, out);
    }
}

/// Rows split along ne0: the distributed row op where [`RowReduce::of`]
/// gives one (soft_max: a 2-D mask, split like x, without ALiBi or
/// sinks), priced by its statistics ([`RowReduce::combine_bytes`]).
fn split_rows(x: &Node, out: &mut Vec<Candidate>) {
    let Some(r) = RowReduce::of(&x.t.op, &x.src) else { return };
    let ins = vec![x.cur[0].clone(); x.src.len()];
    out.push(Candidate {
        combine_bytes: Some(r.combine_bytes(x.src[0], x.n)),
        ..Candidate::new(ins, x.cur[0].clone())
    });
}

/// Whole rows on each device (a split of axis 1, 2 or 3): the mask (per
/// row, broadcast or not) splits the same way or is mirrored; sinks (one
/// per head, axis 2) follow a head split and are mirrored otherwise.
fn whole_rows(x: &Node, s: &AxisSplit, out: &mut Vec<Candidate>) {
    let (src, ax) = (&x.src, s.axis);
    let mut ins = vec![x.cur[0].clone()];
    if let Some(mk) = src.get(1) {
        if mk.ne[ax] == 1 {
            ins.push(SplitState::Mirrored);
        } else if mk.ne[ax] == src[0].ne[ax] {
            ins.push(x.cur[0].clone());
        } else {
            return;
        }
    }
    if let Some(sk) = src.get(2) {
        if ax == 2 && sk.ne[0] == src[0].ne[2] {
            ins.push(SplitState::Split(AxisSplit { axis: 0, ..s.clone() }));
        } else if ax == 2 {
            return;
        } else {
            ins.push(SplitState::Mirrored);
        }
    }
    out.push(Candidate::new(ins, x.cur[0].clone()));
}
