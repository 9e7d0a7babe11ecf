//! Split rules of the rope family (`ops/rope.rs`).

use super::{Candidate, Node};
use crate::ops::{ops_outside, Op, RopeMode, RopeParams};
use crate::split::state::{AxisSplit, SplitState};

/// The candidates of a rope node (the replicated one is added by the
/// caller): heads (axis 1) or sequences (axis 3) split with the positions
/// mirrored; tokens (axis 2) split with the positions split alike (not for
/// multi-section rope, whose positions are 4 per token); rotation is linear
/// in x, so a partial sum stays partial.
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        Op::Rope(rp) => rope(x, rp, out),
        // Not a rope op: `Op::family` routes none here.
        ops_outside!(rope) => {}
    }
}

/// `rope` with parameters `rp` (see [`candidates`]).
fn rope(x: &Node, rp: &RopeParams, out: &mut Vec<Candidate>) {
    let m = SplitState::Mirrored;
    let rest = vec![m.clone(); x.src.len().saturating_sub(2)];
    let with_rest = |a: SplitState, b: SplitState| {
        let mut ins = vec![a, b];
        ins.extend(rest.iter().cloned());
        ins
    };
    if let SplitState::Split(s) = &x.cur[0] {
        let multi = matches!(rp.mode, RopeMode::Mrope | RopeMode::Imrope);
        if s.axis == 1 || s.axis == 3 {
            out.push(Candidate::new(with_rest(x.cur[0].clone(), m.clone()), x.cur[0].clone()));
        } else if s.axis == 2 && !multi && s.segments.len() == 1 && s.repeat == 1 {
            // Tokens split: positions split the same way.
            let ps = SplitState::Split(AxisSplit { axis: 0, ..s.clone() });
            out.push(Candidate::new(with_rest(x.cur[0].clone(), ps), x.cur[0].clone()));
        }
    }
    let p = SplitState::partial();
    if x.cur[0] == p {
        out.push(Candidate::new(with_rest(p.clone(), m), p));
    }
}
