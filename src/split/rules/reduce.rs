//! Split rules of the reduce family (`ops/reduce.rs`): `sum`, `sum_rows`,
//! `mean`, `argmax`, `top_k`, `argsort`. A reduction along a split row is
//! a local reduction per device and a row combine of the small results
//! (compiled into `row_stats` + exchange + `row_finish`, `ops/distributed.rs`).

use super::{Candidate, Node};
use crate::ops::{ops_outside, Op, RowReduce};
use crate::split::state::SplitState;

/// The candidates of a reduce node (the replicated one is added by the caller).
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        Op::Sum => sum(x, out),
        Op::Argmax | Op::TopK { .. } => row_reduce(x, out, false),
        Op::SumRows | Op::Mean => row_reduce(x, out, true),
        // A sort needs whole rows: no combine (`RowReduce::of` has none).
        Op::Argsort { .. } => row_reduce(x, out, false),
        // Not a reduce op: `Op::family` routes none here.
        ops_outside!(reduce) => {}
    }
}

/// `sum`: a partial sum stays partial; a split sums locally and combines
/// the devices' sums ([`RowReduce::combine_bytes`]).
fn sum(x: &Node, out: &mut Vec<Candidate>) {
    let p = SplitState::partial();
    if x.cur[0] == p {
        out.push(Candidate::new(vec![p.clone()], p));
    }
    if let (SplitState::Split(_), Some(r)) = (&x.cur[0], RowReduce::of(&x.t.op, &x.src)) {
        out.push(Candidate {
            combine_bytes: Some(r.combine_bytes(x.src[0], x.n)),
            ..Candidate::new(vec![x.cur[0].clone()], SplitState::Mirrored)
        });
    }
}

/// Row reductions: a split row combines the statistics
/// [`RowReduce::of`] gives the op (none for a sort); whole rows on each
/// device keep the split (`argmax`'s result `[ne1]` takes a split of rows
/// to axis 0). `linear` ops (`sum_rows`, `mean`) keep a partial sum.
fn row_reduce(x: &Node, out: &mut Vec<Candidate>, linear: bool) {
    if let SplitState::Split(s) = &x.cur[0] {
        match RowReduce::of(&x.t.op, &x.src) {
            Some(r) if s.axis == 0 => {
                // Local reduction per device, then combine N small results per row.
                out.push(Candidate {
                    combine_bytes: Some(r.combine_bytes(x.src[0], x.n)),
                    ..Candidate::new(vec![x.cur[0].clone()], SplitState::Mirrored)
                });
            }
            _ if s.axis > 0 => {
                let mut o = s.clone();
                if x.t.op == Op::Argmax {
                    if s.axis != 1 {
                        return;
                    }
                    o.axis = 0;
                }
                out.push(Candidate::new(vec![x.cur[0].clone()], SplitState::Split(o)));
            }
            _ => {}
        }
    }
    if linear && x.cur[0] == SplitState::partial() {
        out.push(Candidate::new(vec![SplitState::partial()], SplitState::partial()));
    }
}
