//! Split rules of the reduce family (`ops/reduce.rs`): `sum`, `sum_rows`,
//! `mean`, `argmax`, `top_k`, `argsort`. A reduction along a split row is
//! a local reduction per device and a row combine of the small results
//! (compiled into `row_stats` + exchange + `row_finish`, `ops/distributed.rs`).

use super::{row_combine, Candidate, Node};
use crate::ops::{ops_outside, Op};
use crate::split::state::SplitState;

/// The candidates of a reduce node (the replicated one is added by the caller).
pub(super) fn candidates(x: &Node, out: &mut Vec<Candidate>) {
    match &x.t.op {
        Op::Sum => sum(x, out),
        Op::Argmax => row_reduce(x, out, Some(1), false),
        Op::TopK { k } => row_reduce(x, out, Some((*k).max(0) as u64), false),
        Op::SumRows | Op::Mean => row_reduce(x, out, Some(1), true),
        // A sort needs whole rows: no combine.
        Op::Argsort { .. } => row_reduce(x, out, None, false),
        // Not a reduce op: `Op::family` routes none here.
        ops_outside!(reduce) => {}
    }
}

/// `sum`: a partial sum stays partial; a split sums locally and combines
/// one F32 per device.
fn sum(x: &Node, out: &mut Vec<Candidate>) {
    let p = SplitState::partial();
    if x.cur[0] == p {
        out.push(Candidate::new(vec![p.clone()], p));
    }
    if let SplitState::Split(_) = &x.cur[0] {
        out.push(Candidate {
            combine_bytes: Some(4 * x.n as u64),
            ..Candidate::new(vec![x.cur[0].clone()], SplitState::Mirrored)
        });
    }
}

/// Row reductions: a split row combines `8·k` bytes per row and device
/// (`k` results per row; `None` for an op with no combine); whole rows on
/// each device keep the split (`argmax`'s result `[ne1]` takes a split of
/// rows to axis 0). `linear` ops (`sum_rows`, `mean`) keep a partial sum.
fn row_reduce(x: &Node, out: &mut Vec<Candidate>, k: Option<u64>, linear: bool) {
    if let SplitState::Split(s) = &x.cur[0] {
        match k {
            Some(k) if s.axis == 0 => {
                // Local reduction per device, then combine N small results per row.
                out.push(Candidate {
                    combine_bytes: Some(row_combine(x.src[0], x.n, 8 * k)),
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
