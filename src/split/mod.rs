//! Tensor parallelism (DESIGN.md sections 3-5): split states, the leaf split
//! policy, the cost model and the planner.
//!
//! * [`SplitState`] says how one logical tensor lies over N devices (split
//!   along an axis with uneven/zero extents, segments and repeats; mirrored;
//!   partial sum).
//! * [`SplitPolicy`] assigns states to leafs (name rules and a callback,
//!   like llama.cpp's `get_split_state`), with granularity checks.
//! * [`Planner`] propagates states node by node: each op's rule lists
//!   candidate strategies, the cheapest under the alpha-beta [`LinkModel`]
//!   wins, and every disagreement becomes an explicit [`Repartition`]
//!   (all-gather, all-reduce, reduce-scatter, all-to-all, rebalance, local
//!   slice) instead of an assert. Partial sums flow through linear ops and are
//!   reduced only where a non-linear consumer needs them; per-row ops over a
//!   split row (argmax, top_k, soft_max, norms, sum_rows/mean) combine a few
//!   values per row instead of gathering it.
//! * [`slice_local`] / [`assemble`] define what device `j` holds of a
//!   tensor in each state (the reference for placing leafs, collectives over
//!   plain copies, and host access to split tensors).
//!
//! Not here yet: lowering a plan to per-device subgraphs, the executor and
//! its collectives, plan caching, memory reports and DOT output. Until they
//! land, plans are checked for their states and bytes, not executed.

mod cost;
mod exec;
mod layout;
mod planner;
mod policy;
mod rules;
mod state;

pub use cost::{conversion, Collective, LinkModel, Traffic};
pub use exec::MetaExecutor;
pub use layout::{assemble, local_ne, slice_local};
pub use planner::{Plan, Planner, Repartition};
pub use policy::{glob_match, LeafInfo, SplitPolicy, SplitRule, SplitSpec};
pub use state::{split_extents, AxisSplit, ReduceOp, SplitState};
