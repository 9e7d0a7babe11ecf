//! Split rules of the norm family (`ops/norm.rs`): `norm`, `rms_norm`,
//! `l2_norm`, `soft_max` (with its mask and sinks). A split row runs the
//! distributed row op (statistics per device, a row combine, a local
//! finish: `ops/distributed.rs`); whole rows on each device keep the split.

use super::{row_combine, Candidate, Node};
use crate::ops::{ops_outside, Op};
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
        split_rows(x, out, alibi);
    } else if !(alibi && s.axis == 2) {
        whole_rows(x, s, out);
    }
}

/// Rows split along ne0: the distributed row op, for a 2-D mask without
/// ALiBi or sinks; 8 bytes of statistics per row and device.
fn split_rows(x: &Node, out: &mut Vec<Candidate>, alibi: bool) {
    let src = &x.src;
    let mask_2d = src.len() < 2 || (src[1].ne[2] == 1 && src[1].ne[3] == 1);
    if alibi || !mask_2d || src.len() > 2 {
        return;
    }
    let mut ins = vec![x.cur[0].clone()];
    if src.len() > 1 {
        if src[1].ne[0] != src[0].ne[0] {
            return;
        }
        ins.push(x.cur[0].clone());
    }
    out.push(Candidate { combine_bytes: Some(row_combine(src[0], x.n, 8)), ..Candidate::new(ins, x.cur[0].clone()) });
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
