//! Split rules of the distributed family (`ops/distributed.rs`): none. These
//! ops are made by the compiler from a plan's steps (exchanges, row
//! statistics and finishes, partial lookups, sums of addends) inside the
//! per-device programs; a graph being planned holds them only if a caller
//! built them by hand, and then they run replicated.

use super::{Candidate, Node};
use crate::ops::{ops_outside, Op};

/// No candidate besides the replicated one the caller adds.
pub(super) fn candidates(x: &Node, _out: &mut [Candidate]) {
    match &x.t.op {
        Op::Exchange | Op::RowStats { .. } | Op::RowFinish { .. } | Op::GetRowsPart { .. } | Op::AddN => {}
        // Not a distributed op: `Op::family` routes none here.
        ops_outside!(distributed) => {}
    }
}
