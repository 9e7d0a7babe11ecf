//! # shardgraph
//!
//! A ggml-compatible tensor/op compute graph with a graph allocator and
//! pluggable backends; the base of a meta backend that runs one graph
//! tensor-parallel across N devices.
//!
//! ## The tensor model (ggml's, exactly)
//! A tensor has up to 4 dimensions. `ne[0..4]` are element counts, `ne[0]`
//! innermost; `nb[0..4]` are byte strides (`nb[0]` = type size, `nb[1]` = row
//! size; a row of a block-quantized type is `ne[0] / block_size` blocks).
//! Views share their source's storage at a byte offset; `permute` and
//! `transpose` only change `ne`/`nb`; `reshape` needs a contiguous source;
//! `cont` makes a contiguous copy. Types carry ggml's ids and block layouts
//! ([`GgmlType`]; quantized blocks are byte-identical to ggml's,
//! [`tensor::quant`]).
//!
//! ## Ops
//! [`Op`] lists every op with typed parameters; constructors on [`Context`]
//! (`ctx.mul_mat(a, b)`, `ctx.rope_ext(..)`, `ctx.flash_attn_ext(..)`, …)
//! check operands as ggml does and return [`Result`] with an
//! [`Error::InvalidOperand`] naming the op, the operand and the shapes. The
//! semantics (broadcasting, `mul_mat` orientation `[K, M] × [K, N] → [M, N]`,
//! rope modes, soft_max_ext, flash_attn_ext, …) are ggml 0.15.3's, checked
//! against the real library by the differential suite in `tests/ggml_diff`.
//!
//! ## Graphs, allocation, backends
//! [`Context::build_forward`] orders the nodes (ggml's
//! `ggml_build_forward_expand`), separates leafs, counts uses and hashes the
//! structure. [`graph::alloc::GraphAllocator`] places intermediates by
//! liveness (ggml's `gallocr`), in place where the op allows, and can measure
//! the peak without allocating. A [`Backend`] (the CPU backend,
//! [`CpuBackend`], is always present; several instances are independent
//! devices) computes a graph whose tensors are placed in a [`TensorStorage`].
//!
//! ```
//! use shardgraph::graph::alloc::GraphAllocator;
//! use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorStorage};
//!
//! let mut ctx = Context::new();
//! let w = ctx.new_tensor_2d(GgmlType::F32, 4, 3)?; // weights [K = 4, M = 3]
//! let x = ctx.new_tensor_2d(GgmlType::F32, 4, 2)?; // input   [K = 4, N = 2]
//! let y = ctx.mul_mat(w, x)?; // [3, 2]
//! let graph = ctx.build_forward(&[y])?;
//!
//! let cpu = CpuBackend::with_threads(2)?;
//! let mut storage = TensorStorage::new();
//! storage.alloc_tensors(&cpu, &ctx, graph.leafs())?;
//! storage.set_f32(&ctx, w, &[1., 0., 0., 0., 0., 1., 0., 0., 0., 0., 1., 0.])?;
//! storage.set_f32(&ctx, x, &[1., 2., 3., 4., 5., 6., 7., 8.])?;
//! GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &ctx, &graph, &mut storage)?;
//! cpu.compute(&ctx, &graph, &storage)?;
//! assert_eq!(storage.get_f32(&ctx, y)?, vec![1., 2., 3., 5., 6., 7.]);
//! # Ok::<(), shardgraph::Error>(())
//! ```
//!
//! ## Tensor parallelism
//! [`split`] plans a graph for N devices (split states, repartitions chosen
//! by cost where states disagree), compiles the plan into one local graph
//! per device with the collectives as exchanges between its stages, and
//! [`split::MetaExecutor`] replays that program on N devices of any backend
//! with weights and caches in a [`split::SplitStore`] (written in place);
//! the result equals one device's.
//!
//! ## Model files
//! [`gguf`] reads GGUF v2/v3 files (memory-mapped, validated, zero-copy
//! tensor data), writes v3 files streaming, and loads tensors into a
//! [`TensorStorage`] or a tensor-parallel [`split::SplitStore`].

#![deny(missing_docs)]

pub mod backend;
pub mod error;
pub mod gguf;
pub mod graph;
pub mod ops;
pub mod split;
pub mod tensor;

pub use backend::cpu::{CpuBackend, CpuConfig};
pub use backend::{Backend, TensorStorage};
pub use error::{Error, Result};
pub use graph::alloc::GraphAllocator;
pub use graph::{Context, Graph};
pub use ops::{GluOp, Op, OpFamily, RopeMode, RopeParams, SortOrder, UnaryOp};
pub use tensor::{GgmlType, Tensor, TensorId};
