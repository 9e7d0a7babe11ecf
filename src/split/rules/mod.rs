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

pub(crate) use data::{partial_lookup, reshape_split, view_geometry, view_split};

pub(crate) use ssm::PackedView;

use super::state::{AxisSplit, DeviceSet, SplitState};
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
    if n > 1 && t.nelements() == 0 {
        // An empty result has no values: it reads nothing, so its sources
        // stay as they are, and it is computed nowhere (an empty view or
        // write, as llama.cpp's copy of zero extra sequences' states).
        let keep = cur.iter().map(|c| if *c == SplitState::Unknown { SplitState::Mirrored } else { c.clone() });
        out.push(Candidate::new(keep.collect(), SplitState::Mirrored));
    }
    on_one_device(&x, &mut out);
    family(&x, &mut out);
    in_groups(&x, &mut out);
    // A block-typed tensor is never partial nor cut inside a block, whatever
    // a rule derived from its neighbours' states (an F32 operand's K split, a
    // partial addend): such a candidate is dropped here, in one place, and
    // the planner's prices choose among the rest.
    out.retain(|c| c.output.suits(t.ty) && c.inputs.iter().zip(&x.src).all(|(st, s)| st.suits(s.ty)));
    out.push(Candidate::new(vec![SplitState::Mirrored; x.src.len()], SplitState::Mirrored));
    out
}

/// The candidates of `x`'s op family's rule.
fn family(x: &Node, out: &mut Vec<Candidate>) {
    match x.t.op.family() {
        OpFamily::Elementwise => elementwise::candidates(x, out),
        OpFamily::Reduce => reduce::candidates(x, out),
        OpFamily::Norm => norm::candidates(x, out),
        OpFamily::Rope => rope::candidates(x, out),
        OpFamily::Matmul => matmul::candidates(x, out),
        OpFamily::Attn => attn::candidates(x, out),
        OpFamily::Data => data::candidates(x, out),
        OpFamily::Ssm => ssm::candidates(x, out),
        OpFamily::Distributed => distributed::candidates(x, out),
    }
}

/// The strategies of a node whose sources live on a **device group** (2 or
/// more devices, not all): a split with zero extents elsewhere (a
/// `--tensor-split` with zero shares, fewer heads than devices), or a
/// tensor mirrored or partial on a group. For each such group the family's
/// rule runs over the group's devices as if they were all the devices
/// (every source projected there: mirrored stays mirrored, the group's own
/// states become whole-world ones, a split keeps its members' extents, any
/// other state is brought to the group as mirrored), and each strategy is
/// lifted back: mirrored and partial on the group, splits with zero
/// extents outside it. The devices outside take no part in the node nor in
/// the reductions of its partial sums (`docs/split-design.md`, section
/// 4b); a row combine's statistics are gathered among the group. Strategies
/// with a vocabulary lookup or a device-local packing are not lifted (their
/// steps run on every device).
fn in_groups(x: &Node, out: &mut Vec<Candidate>) {
    if x.n < 3 || x.t.nelements() == 0 || reads_owner_layout(x.t, x.src.first().copied()) {
        return;
    }
    let all = DeviceSet::all(x.n);
    let mut groups: Vec<DeviceSet> = Vec::new();
    for c in x.cur {
        let g = match c {
            SplitState::MirroredOn(g) | SplitState::PartialOn(g, _) => *g,
            SplitState::Split(_) => c.holders(x.n),
            _ => continue,
        };
        if g.len() >= 2 && g != all && !groups.contains(&g) {
            groups.push(g);
        }
    }
    for g in groups {
        on_group(x, g, out);
    }
}

/// [`in_groups`]' strategies for node `t` (sources in states `cur`, `n`
/// devices) on group `g`, which no source need be on: what the planner
/// offers a node whose consumers' weights lie on `g`.
pub(crate) fn on_device_group(ctx: &Context, t: &Tensor, cur: &[SplitState], n: usize, g: DeviceSet) -> Vec<Candidate> {
    let x = Node { ctx, t, src: t.src.iter().map(|&s| ctx.t(s)).collect(), cur, n };
    let mut out = Vec::new();
    if n >= 3 && t.nelements() > 0 && g.len() >= 2 && g.within(n) && !reads_owner_layout(t, x.src.first().copied()) {
        on_group(&x, g, &mut out);
    }
    out.retain(|c| c.output.suits(t.ty) && c.inputs.iter().zip(&x.src).all(|(st, s)| st.suits(s.ty)));
    out
}

/// The family's strategies for `x` over the devices of group `g`, lifted
/// back to all the devices ([`in_groups`]).
fn on_group(x: &Node, g: DeviceSet, out: &mut Vec<Candidate>) {
    {
        let sub: Vec<SplitState> = x.cur.iter().map(|c| project(c, g, x.n)).collect();
        if x.t.op.is_view_op() {
            // The tensor whose memory the result is must already be on the
            // group (a write's deferred destination is laid out as needed).
            let a = x.t.op.written_src().unwrap_or(0);
            let anchored = match x.cur.get(a) {
                Some(SplitState::Unknown) => x.t.op.writes_through_view(),
                Some(SplitState::Mirrored) => true,
                Some(c) => c.group() == Some(g) || matches!(c, SplitState::Split(_)) && c.holders(x.n).subset_of(g),
                None => false,
            };
            if !anchored {
                return;
            }
        }
        let y = Node { ctx: x.ctx, t: x.t, src: x.src.clone(), cur: &sub, n: g.len() };
        let mut inner = Vec::new();
        family(&y, &mut inner);
        inner.push(Candidate::new(vec![SplitState::Mirrored; x.src.len()], SplitState::Mirrored));
        for c in inner {
            if c.packed || partial_lookup(x.t, &c.inputs, &c.output) {
                continue;
            }
            let inputs: Option<Vec<SplitState>> = c.inputs.iter().map(|s| lift(s, g, x.n)).collect();
            if let (Some(inputs), Some(output)) = (inputs, lift(&c.output, g, x.n)) {
                // A combine priced as the rules price one over all the devices.
                let combine_bytes = c.combine_bytes.map(|b| b / g.len() as u64 * x.n as u64);
                let c = Candidate { combine_bytes, ..Candidate::new(inputs, output) };
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
    }
}

/// `s` (a state over `n` devices) as the devices of group `g` see it when
/// they are taken for all the devices ([`in_groups`]).
fn project(s: &SplitState, g: DeviceSet, n: usize) -> SplitState {
    match s {
        SplitState::Mirrored => SplitState::Mirrored,
        SplitState::MirroredOn(h) if *h == g => SplitState::Mirrored,
        SplitState::PartialOn(h, op) if *h == g => SplitState::Partial(*op),
        SplitState::Split(a) if s.holders(n).subset_of(g) => SplitState::Split(AxisSplit {
            axis: a.axis,
            segments: a.segments.iter().map(|v| g.iter().map(|j| v.get(j).copied().unwrap_or(0)).collect()).collect(),
            repeat: a.repeat,
        }),
        SplitState::Unknown => SplitState::Unknown,
        _ => SplitState::Mirrored,
    }
}

/// A state over group `g`'s devices (as [`project`] gives them) as a state
/// over all `n` devices; `None` for a split over another device count.
fn lift(s: &SplitState, g: DeviceSet, n: usize) -> Option<SplitState> {
    Some(match s {
        SplitState::Mirrored => SplitState::mirrored_on(g, n),
        SplitState::Partial(op) => SplitState::PartialOn(g, *op),
        SplitState::Split(a) => {
            let members: Vec<usize> = g.iter().collect();
            let mut segments = Vec::with_capacity(a.segments.len());
            for v in &a.segments {
                if v.len() != members.len() {
                    return None;
                }
                let mut w = vec![0; n];
                for (k, &j) in members.iter().enumerate() {
                    w[j] = v[k];
                }
                segments.push(w);
            }
            SplitState::Split(AxisSplit { axis: a.axis, segments, repeat: a.repeat })
        }
        SplitState::Unknown => SplitState::Unknown,
        SplitState::MirroredOn(_) | SplitState::PartialOn(..) => return None,
    })
}

/// The strategies of any op whose sources lie whole on one device or are
/// mirrored (llama.cpp's `--split-mode layer`, a `--tensor-split` share of
/// zero): for each device `j` some source lies whole on, the node runs on
/// `j` alone, as on one device, and its result lies whole on `j` (in the
/// state of a same-shaped source that does, else [`SplitState::on_device`]);
/// every other source that is not mirrored is
/// moved there first (a point-to-point copy; a partial sum reduced there).
/// The other devices take no part. Offered first, so a family rule's
/// strategy of the same cost (a split whose extents are all on `j`) does
/// not win over it. A view or a write is offered it only where the tensor
/// whose memory it is already lies whole on `j` (its layout there is one
/// device's).
fn on_one_device(x: &Node, out: &mut Vec<Candidate>) {
    let mut homes: Vec<usize> = x.cur.iter().filter_map(SplitState::sole_holder).collect();
    homes.sort_unstable();
    homes.dedup();
    out.extend(homes.into_iter().filter_map(|j| one_device(x, j)));
}

/// The one-device strategy of [`on_one_device`] on device `j`, if it may run there.
fn one_device(x: &Node, j: usize) -> Option<Candidate> {
    if x.n < 2 || x.t.nelements() == 0 || j >= x.n {
        return None;
    }
    if reads_owner_layout(x.t, x.src.first().copied()) {
        return None;
    }
    if x.t.op.is_view_op() {
        // The tensor whose memory the result is (a view's parent, a
        // write's destination) must already lie whole on `j`; a write's
        // deferred destination is laid out as needed.
        let a = x.t.op.written_src().unwrap_or(0);
        let anchored = match x.cur.get(a) {
            Some(SplitState::Unknown) => x.t.op.writes_through_view(),
            Some(c) => c.sole_holder() == Some(j),
            None => false,
        };
        if !anchored {
            return None;
        }
    }
    // In the state of a source of the same shape lying whole on `j` (a
    // write's destination stays in its own), else in the one form.
    let same = x.cur.iter().zip(&x.src).find(|(c, s)| c.sole_holder() == Some(j) && s.ne == x.t.ne);
    let output = same.map(|(c, _)| c.clone()).or_else(|| SplitState::on_device(j, x.n, &x.t.ne))?;
    let inputs: Option<Vec<SplitState>> = x
        .cur
        .iter()
        .zip(&x.src)
        .map(|(cur, s)| match cur {
            SplitState::Mirrored => Some(SplitState::Mirrored),
            c if c.sole_holder() == Some(j) => Some(c.clone()),
            _ => SplitState::on_device(j, x.n, &s.ne),
        })
        .collect();
    let c = Candidate::new(inputs?, output);
    (c.output.suits(x.t.ty) && c.inputs.iter().zip(&x.src).all(|(st, s)| st.suits(s.ty))).then_some(c)
}

/// [`on_one_device`]'s strategy for node `t` (sources in states `cur`, `n`
/// devices) on device `j`, which no source need lie on: what the planner
/// offers a node whose consumers' weights lie whole on `j`.
pub(crate) fn on_device(ctx: &Context, t: &Tensor, cur: &[SplitState], n: usize, j: usize) -> Option<Candidate> {
    let x = Node { ctx, t, src: t.src.iter().map(|&s| ctx.t(s)).collect(), cur, n };
    one_device(&x, j)
}

/// True for a `view` whose strides are its owner's, which one device's
/// copy of its parent need not share: a view of a parent that is not
/// contiguous or whose bytes it reaches outside. It does not run on one
/// device alone (its parent may be held there in another layout).
pub(crate) fn reads_owner_layout(t: &Tensor, parent: Option<&Tensor>) -> bool {
    t.op == crate::ops::Op::View && parent.is_none_or(|p| !p.is_contiguous() || !view_inside_parent(t, p))
}

/// True if view `t` of `parent` reads only bytes of its parent (always for
/// a parent that is not itself a view); a view reaching outside them reads
/// its owner's memory.
pub(crate) fn view_inside_parent(t: &Tensor, parent: &Tensor) -> bool {
    parent.view_src.is_none() || {
        let span = crate::tensor::checked_nbytes(t.ty, &t.ne, &t.nb).unwrap_or(usize::MAX);
        t.view_offs >= parent.view_offs && t.view_offs.saturating_add(span) <= parent.view_offs + parent.nbytes()
    }
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
