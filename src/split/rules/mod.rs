//! Propagation rules: for each op, the candidate strategies — the state each
//! input must be in and the state the output then has (in the manner of
//! DTensor's per-op strategy tables). One file per op family (the families
//! of [`crate::ops::OpFamily`]); [`candidates`] dispatches on the family with
//! an exhaustive match, so a new family cannot lack a rule file, and each
//! file matches its family's ops one by one (the others through
//! `ops_outside!`), so a new op cannot lack an arm in its rule. Every op
//! has the replicated strategy (all inputs mirrored → mirrored), added here
//! last, so every graph has a plan. Candidates are derived from the inputs'
//! current states; the planner prices the conversions and picks the
//! cheapest.

mod attn;
mod data;
mod distributed;
mod elementwise;
mod matmul;
mod norm;
mod reduce;
mod rope;
mod ssm;

pub(crate) use data::{partial_lookup, reshape_split, view_geometry};

pub(crate) use ssm::PackedView;

use super::state::{AxisSplit, SplitState};
use crate::graph::Context;
use crate::ops::OpFamily;
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
    /// The split output is held in a device-local packing, not in the
    /// layout its state names: only the views [`packed_view`] accepts may
    /// read it, and it is never converted (a head-split `gated_delta_net`).
    pub packed: bool,
}

impl Candidate {
    /// A plain candidate: `inputs` → `output`, no combine, no packing.
    pub(crate) fn new(inputs: Vec<SplitState>, output: SplitState) -> Self {
        Candidate { inputs, output, combine_bytes: None, packed: false }
    }
}

/// What a family's rule sees of one node.
pub(crate) struct Node<'a> {
    /// The graph's tensors.
    ctx: &'a Context,
    /// The node.
    t: &'a Tensor,
    /// Its sources, in order.
    src: Vec<&'a Tensor>,
    /// The sources' current states.
    cur: &'a [SplitState],
    /// Devices.
    n: usize,
}

/// The candidates for node `t` whose inputs currently have states `cur`, on `n` devices.
/// The replicated strategy is always the last candidate.
pub(crate) fn candidates(ctx: &Context, t: &Tensor, cur: &[SplitState], n: usize) -> Vec<Candidate> {
    let x = Node { ctx, t, src: t.src.iter().map(|&s| ctx.t(s)).collect(), cur, n };
    let mut out = Vec::new();
    match t.op.family() {
        OpFamily::Elementwise => elementwise::candidates(&x, &mut out),
        OpFamily::Reduce => reduce::candidates(&x, &mut out),
        OpFamily::Norm => norm::candidates(&x, &mut out),
        OpFamily::Rope => rope::candidates(&x, &mut out),
        OpFamily::Matmul => matmul::candidates(&x, &mut out),
        OpFamily::Attn => attn::candidates(&x, &mut out),
        OpFamily::Data => data::candidates(&x, &mut out),
        OpFamily::Ssm => ssm::candidates(&x, &mut out),
        OpFamily::Distributed => distributed::candidates(&x, &mut out),
    }
    // A block-typed tensor is never partial nor cut inside a block, whatever
    // a rule derived from its neighbours' states (an F32 operand's K split, a
    // partial addend): such a candidate is dropped here, in one place, and
    // the planner's prices choose among the rest.
    out.retain(|c| c.output.suits(t.ty) && c.inputs.iter().zip(&x.src).all(|(st, s)| st.suits(s.ty)));
    out.push(Candidate::new(vec![SplitState::Mirrored; x.src.len()], SplitState::Mirrored));
    out
}

/// True if a split result of `p` is held in a device-local packing (its
/// rule's candidate is [`Candidate::packed`]).
pub(crate) fn holds_packed(p: &Tensor) -> bool {
    p.op.family() == OpFamily::Ssm && ssm::packs(p)
}

/// How view `t` reads the device-local packing of `p` split as `sp` (see
/// [`holds_packed`]); `None` if `p` holds no packing or `t` cannot read it.
pub(crate) fn packed_view(ctx: &Context, p: &Tensor, t: &Tensor, sp: &AxisSplit) -> Option<PackedView> {
    match p.op.family() {
        OpFamily::Ssm => ssm::packed_view(ctx, p, t, sp),
        OpFamily::Elementwise
        | OpFamily::Reduce
        | OpFamily::Norm
        | OpFamily::Rope
        | OpFamily::Matmul
        | OpFamily::Attn
        | OpFamily::Data
        | OpFamily::Distributed => None,
    }
}

/// One-input ops that act on each element alone (element-wise functions,
/// `cont`, `dup`): a split is kept when the shape is; the ops linear in
/// their input ([`crate::ops::Op::is_linear_unary`]) keep a partial sum.
fn keep_unary(x: &Node, out: &mut Vec<Candidate>) {
    if let SplitState::Split(s) = &x.cur[0] {
        if x.src[0].ne == x.t.ne {
            out.push(Candidate::new(vec![x.cur[0].clone()], SplitState::Split(s.clone())));
        }
    }
    let p = SplitState::partial();
    if x.t.op.is_linear_unary() && x.cur[0] == p && x.src[0].ne == x.t.ne {
        out.push(Candidate::new(vec![p.clone()], p));
    }
}
