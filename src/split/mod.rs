//! Tensor parallelism: split states and the leaf split policy.
//!
//! This is the first layer of the meta backend (DESIGN.md sections 3-4):
//! [`SplitState`] says how one logical tensor lies over N devices, and
//! [`SplitPolicy`] assigns states to leafs with granularity checks. The
//! planner (propagation with repartition), lowering, executor, collectives
//! and plan reports build on these and are not in the crate yet.

mod policy;
mod state;

pub use policy::{glob_match, LeafInfo, SplitPolicy, SplitRule, SplitSpec};
pub use state::{split_extents, AxisSplit, ReduceOp, SplitState};
