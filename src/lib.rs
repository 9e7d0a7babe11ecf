//! # shardgraph
//!
//! A ggml-compatible tensor/op compute graph with a graph allocator,
//! pluggable backends and (later) a meta backend that runs one graph
//! tensor-parallel across N devices.
//!
//! ## The model
//! * [`tensor`]: ggml's tensor model — up to 4 dims, `ne` element counts
//!   (`ne[0]` innermost), `nb` byte strides, views at byte offsets, ggml's
//!   type ids and block formats ([`GgmlType`]).
//! * [`ops`]: the op enum ([`Op`]) with typed parameters; constructors on
//!   [`Context`] validate operands and return [`Result`].
//! * [`graph`]: the [`Context`] arena, [`Context::build_forward`] and the
//!   graph allocator.
//! * [`backend`]: the backend interface and the CPU backend.

#![deny(missing_docs)]

pub mod backend;
pub mod error;
pub mod graph;
pub mod ops;
pub mod tensor;

pub use backend::cpu::{CpuBackend, CpuConfig};
pub use backend::{Backend, TensorStorage};
pub use error::{Error, Result};
pub use graph::{Context, Graph};
pub use ops::{GluOp, Op, RopeMode, RopeParams, SortOrder, UnaryOp};
pub use tensor::{GgmlType, Tensor, TensorId};
