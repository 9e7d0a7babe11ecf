//! Write semantics: what a write through a view (`cpy`, `set_rows`, the
//! ops [`crate::ops::Op::writes_through_view`] names) does to the tensor
//! whose storage it writes. The planner (the states it walks and prices),
//! the lowering (which nodes are a [`Step::Write`](super::Step::Write)) and
//! the compiler ask here, so they agree on which copies write storage and
//! what state the written owner is in afterwards.

use super::state::SplitState;
use crate::graph::Context;
use crate::ops::Op;
use crate::tensor::{contiguous_strides, Tensor, TensorId};

/// True if view-like node `t` covers all of its owner's bytes contiguously
/// (the owner is then replaced by what a write through `t` produced).
pub(crate) fn covers_owner(ctx: &Context, t: &Tensor) -> bool {
    let Some(o) = t.view_src else { return false };
    let ot = ctx.t(o);
    t.view_offs == 0 && t.ty == ot.ty && t.nb == contiguous_strides(t.ty, &t.ne) && t.nbytes() == ot.nbytes()
}

/// The state the owner of write node `t` is in after the write, given the
/// write's output state: the output's own state when the write covers the
/// owner with the same shape (whole on one device when the write was:
/// [`SplitState::on_device`] in the owner's shape); `before` when the write
/// is a box of an owner split as `before` (given only when the write's
/// destination was read in the state it had: on each device a view of the
/// owner's part) whose split is the owner's clipped to the box, so each
/// device wrote its own part in place (llama.cpp's copies into one row
/// of a recurrent cache); mirrored otherwise; `None` for an empty write,
/// which leaves the owner as it was.
pub(crate) fn owner_state_after_write(
    ctx: &Context,
    t: &Tensor,
    out: &SplitState,
    before: Option<&SplitState>,
) -> Option<SplitState> {
    if t.nelements() == 0 {
        // Nothing is written (llama.cpp copies the states of zero extra
        // sequences into an empty view of a recurrent cache).
        return None;
    }
    Some(state_after(ctx, t, out, before))
}

fn state_after(ctx: &Context, t: &Tensor, out: &SplitState, before: Option<&SplitState>) -> SplitState {
    let Some(o) = t.view_src else { return SplitState::Mirrored };
    let ot = ctx.t(o);
    if !covers_owner(ctx, t) {
        if let (Some(SplitState::Split(so)), SplitState::Split(s)) = (before, out) {
            let in_place = t.ty == ot.ty
                // A box of the owner, or of its contiguous bytes in the
                // shape the view's strides give them (each device's part is
                // then viewed in that shape, not copied).
                && super::rules::view_geometry(ot, t, so).is_some_and(|(q, _, _)| q.ne == ot.ne || ot.is_contiguous())
                && super::rules::view_split(ot, t, so).as_ref() == Some(s);
            if in_place {
                return SplitState::Split(so.clone());
            }
        }
        return SplitState::Mirrored;
    }
    if let (Some(j), SplitState::Split(s)) = (out.sole_holder(), out) {
        // Written whole on one device: the owner lies whole there.
        if ot.ne == t.ne {
            return out.clone();
        }
        return SplitState::on_device(j, s.n_devices(), &ot.ne).unwrap_or(SplitState::Mirrored);
    }
    match out {
        SplitState::Split(s) if ot.ne != t.ne => {
            super::rules::reshape_split(s, &t.ne, &ot.ne).map(SplitState::Split).unwrap_or(SplitState::Mirrored)
        }
        s => s.clone(),
    }
}

/// Whether write node `t`'s destination (its source `written_src`) is read
/// in the state the plan gives it (no conversion: on each device a view of
/// the owner's part), by `needs`, the states `t` reads its sources in.
pub(crate) fn destination_kept(
    t: &Tensor,
    needs: &[SplitState],
    state: impl Fn(TensorId) -> Option<SplitState>,
) -> bool {
    t.op.written_src().is_some_and(|d| {
        let (Some(&dst), Some(need)) = (t.src.get(d), needs.get(d)) else { return false };
        state(dst).as_ref() == Some(need)
    })
}

/// True if `cpy` node `node` writes a scratch destination (the leaf
/// [`Context::cast`] makes, flagged [`crate::tensor::TensorFlags::scratch`]):
/// an ordinary node into a fresh intermediate, not a write into storage.
/// The planner, the lowering and the compiler ask here (the store and the
/// memory report skip scratch destinations by their flag); every other
/// `cpy` into a leaf is a [`Step::Write`](super::Step::Write).
pub(crate) fn scratch_copy(ctx: &Context, node: TensorId) -> bool {
    let t = ctx.t(node);
    t.op == Op::Cpy && t.view_src.is_some_and(|o| t.src.get(1) == Some(&o) && ctx.t(o).flags.scratch)
}
