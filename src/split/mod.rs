//! Tensor parallelism (docs/split-design.md): one graph on N devices of any
//! backend (CPU instances, CUDA or HIP GPUs, virtual devices on one GPU),
//! with a result equal to one device's.
//!
//! * [`Devices`] is the one value a run is configured by: the backends
//!   (one per rank), the tensor-split ratios, CPU threads and the
//!   communicator; [`Devices::policy`], [`Devices::store`] and
//!   [`Devices::executor`] take their device count from it.
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
//! * [`lower`] turns a plan into [`Step`]s: per-device subgraphs separated
//!   by collectives; `compile` turns the steps into a program, one local
//!   graph per device in which collectives are exchanges between stages and
//!   row combines, packing and sums are device nodes; [`MetaExecutor`]
//!   keeps the program and replays it on N devices of any backend, a
//!   thread per device, with exchanges through a [`Comm`] ([`HostComm`]:
//!   copies between device buffers; NCCL across GPUs), writing caches in
//!   place, and counts the bytes moved, allocated and read ([`ExecCounters`]).
//! * [`SplitStore`] keeps split tensors on the devices between runs, with
//!   host `set_tensor`/`get_tensor` in single-device bytes.

mod comm;
mod compile;
mod cost;
mod devices;
mod exec;
mod layout;
mod lower;
mod memory;
mod planner;
mod policy;
mod rules;
mod state;
mod store;
mod writes;

#[cfg(sg_gpu)]
#[cfg_attr(docsrs, doc(cfg(any(feature = "cuda", feature = "hip"))))]
pub use comm::NcclComm;
pub use comm::{is_peer_failure, peer_failed, BufSlice, Comm, HostComm, ProcessGroup};
#[cfg(feature = "mpi")]
#[cfg_attr(docsrs, doc(cfg(feature = "mpi")))]
pub use comm::{MpiComm, RemoteDevice, World};
pub use cost::{conversion, Collective, LinkClass, LinkModel, Links, Traffic};
pub use devices::{Devices, MAX_DEVICES};
pub use exec::{ExecCounters, MetaExecutor, ProgramSummary, RunOutput, RunReport, FIT_HOST_HEADROOM};
pub use layout::{assemble, local_ne, slice_local};
pub use lower::{lower, Lowered, Step};
pub use memory::DeviceMemory;
pub use planner::{Plan, Planner, Repartition};
pub use policy::{glob_match, layer_device, layer_of, LeafInfo, SplitMode, SplitPolicy, SplitRule, SplitSpec};
pub use state::{split_extents, AxisSplit, DeviceSet, ReduceOp, SplitState};
pub use store::SplitStore;
