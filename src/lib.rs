//! # shardgraph
//!
//! A ggml-compatible tensor/op compute graph that inference engines embed:
//! ggml's tensor model, type ids, block formats and op semantics; a graph
//! allocator in the manner of ggml's `gallocr`; pluggable backends (a
//! multi-threaded SIMD CPU backend, and behind features a GPU backend for
//! NVIDIA through CUDA and AMD through HIP); and a **meta backend that runs
//! one graph tensor-parallel across N devices** — like llama.cpp's
//! `--split-mode tensor`, except that every graph gets a plan: where the
//! split states of an op's inputs disagree, the planner inserts an explicit
//! repartition (all-gather, all-reduce, reduce-scatter, all-to-all, local
//! slice) chosen by cost instead of asserting, and the result equals
//! single-device execution. The workspace's `shardgraph-models` crate runs
//! the main job on top of it — **speculative decoding** (a DFlash, DFlash2
//! or MTP drafter proposing tokens a `qwen3` or `qwen35` target verifies in
//! one batch) from GGUF files, tensor-parallel, greedy or sampled — and
//! `shardgraph-capi` exposes both to C and C++ (`include/shardgraph.h`).
//!
//! ## Quick start: one device
//! ```
//! use shardgraph::{Backend, Context, CpuBackend, GgmlType, GraphAllocator, TensorStorage};
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
//! ## Quick start: tensor parallel
//! The same kind of graph on 3 CPU devices with tensor split 2,1,1
//! ([`split::Devices`]: one value for the devices, from which the policy,
//! the store and the executor take the device count). Split rules match
//! tensor names (llama.cpp's tensor-split layout: an FFN's up projection
//! split on its rows, the down projection on its input axis, so the down
//! projection's partial sums meet in one all-reduce before the soft_max):
//! ```
//! use shardgraph::split::{Devices, Planner, SplitSpec};
//! use shardgraph::{Context, GgmlType};
//!
//! let devices = Devices::cpu(3, 1)?.with_tensor_split(&[2.0, 1.0, 1.0])?;
//! let mut ctx = Context::new();
//! let x = ctx.new_input(GgmlType::F32, &[64, 2], "inp")?; // [n_embd, n_tokens]
//! let up = ctx.new_tensor_named(GgmlType::Q8_0, &[64, 256], "ffn_up.weight")?;
//! let down = ctx.new_tensor_named(GgmlType::Q8_0, &[256, 64], "ffn_down.weight")?;
//! let h = ctx.mul_mat(up, x)?; // [256, 2], split on rows
//! let a = ctx.silu(h)?;
//! let y = ctx.mul_mat(down, a)?; // [64, 2], partial sums until reduced
//! let probs = ctx.soft_max(y)?;
//! let graph = ctx.build_forward(&[probs])?;
//!
//! let axis = |axis| SplitSpec::Axis { axis, granule: 32, segments: vec![] };
//! let policy = devices.policy()?.rule("ffn_up.weight", axis(1)).rule("ffn_down.weight", axis(0));
//! let plan = Planner::default().plan(&ctx, &graph, &policy, &[])?;
//! println!("{}", plan.describe(&ctx, &graph)?); // states, collectives, bytes, memory per device
//!
//! let mut store = devices.store();
//! store.place_leafs(&ctx, &graph, &plan)?;
//! let values = |n: usize, s: f32| (0..n).map(|i| ((i as f32 * s).sin()) / 8.0).collect::<Vec<_>>();
//! store.set_f32(&ctx, up, &values(64 * 256, 0.37))?; // quantized per device part
//! store.set_f32(&ctx, down, &values(256 * 64, 0.91))?;
//! store.set_f32(&ctx, x, &values(64 * 2, 1.3))?;
//! let report = devices.executor()?.execute(&ctx, &graph, &plan, &mut store, &[probs])?;
//! let p = report.f32(0)?; // what one device computes: [64, 2]
//! assert!(p.chunks(64).all(|row| (row.iter().sum::<f32>() - 1.0).abs() < 1e-5));
//! assert_eq!(report.bytes_moved, plan.total_bytes());
//! # Ok::<(), shardgraph::Error>(())
//! ```
//!
//! ## Quick start: the main job
//! Speculative decoding from GGUF files with `shardgraph-models` (its
//! `engine` module): a target and a drafter loaded onto the devices, every
//! cache sized from one context size, and generation greedy or sampled
//! (llama.cpp's `--temp`, `--top-k`, `--top-p`, `--min-p`, `--seed`;
//! sampled drafts are verified by the rejection rule that keeps the
//! target's distribution exactly). Here with a small generated pair; pass
//! your own paths:
//! ```
//! use shardgraph::split::Devices;
//! use shardgraph_models::engine::{DraftModel, Engine, EngineParams};
//! use shardgraph_models::sampling::SamplerParams;
//!
//! let (model, draft) = shardgraph_models::generate::write_example_pair(&std::env::temp_dir())?;
//! let devices = Devices::cpu(2, 1)?; // or Devices::parse("CUDA0,CUDA1", 1)?
//! let params = EngineParams { ctx_size: 4096, ..EngineParams::default() };
//! let mut engine = Engine::load(&devices, &model, DraftModel::Gguf(draft), &params)?;
//! let greedy = engine.generate(&[1, 2, 3], 16, &SamplerParams::greedy())?;
//! assert_eq!(greedy.tokens.len(), 16);
//! engine.reset()?;
//! let sampled = engine.generate(&[1, 2, 3], 16, &SamplerParams { temp: 0.8, seed: 42, ..SamplerParams::default() })?;
//! println!("{:?} ({} of {} drafts accepted)", sampled.tokens, sampled.stats.accepted, sampled.stats.drafted);
//! # Ok::<(), shardgraph::Error>(())
//! ```
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
//! structure. [`GraphAllocator`] places intermediates by liveness (ggml's
//! `gallocr`), in place where the op allows, and can measure the peak
//! without allocating. A [`Backend`] computes a graph whose tensors are
//! placed in a [`TensorStorage`]: the CPU backend ([`CpuBackend`]) is always
//! present, and several instances are independent devices; the GPU backend
//! (`backend::cuda`, features `cuda` and `hip`) runs the same graphs on
//! NVIDIA and AMD GPUs, several virtual devices per GPU if asked.
//!
//! ## Tensor parallelism
//! [`split`] runs a graph on N devices of any backend, in named stages:
//! leaf states from a [`split::SplitPolicy`] → a [`split::Plan`] (states
//! propagated op by op, repartitions chosen by cost) → steps (per-device
//! subgraphs between collectives) → a compiled program (one local graph per
//! device, the collectives as exchanges between its stages) → execution by
//! [`split::MetaExecutor`] (a thread per device; NCCL/RCCL across GPUs,
//! copies between device buffers otherwise), with weights and caches kept
//! on the devices in a [`split::SplitStore`] (written in place).
//!
//! ## Model files
//! [`gguf`] reads GGUF v2/v3 files (memory-mapped, validated, zero-copy
//! tensor data), writes v3 files streaming, and loads tensors into a
//! [`TensorStorage`] or a tensor-parallel [`split::SplitStore`].
//!
//! ## Features
//! | feature | what it adds |
//! | --- | --- |
//! | (none) | the CPU backend, planning and the meta backend over CPU devices, GGUF |
//! | `cuda` | the GPU backend on NVIDIA GPUs: `backend::cuda::CudaBackend` (`CUDA<i>` devices, virtual devices on one GPU), kernels compiled by NVRTC at first use, cuBLAS, NCCL (`split::NcclComm`); the CUDA libraries are loaded at run time, so building needs no toolkit and a machine without a GPU gets an `Err` |
//! | `hip` | the same backend on AMD GPUs (`HIP<i>`): the same kernel sources compiled by hipRTC, hipBLAS, RCCL; ROCm loaded at run time |
//! | `cuda-emu` | `cuda` plus an emulated GPU (`EMU`, and `EMUHIP` with 64-wide waves) that runs the kernels as host C++, so the GPU backend is tested without a GPU (needs a C++17 compiler; slow) |
//!
//! The C ABI is the workspace crate `shardgraph-capi` (a `cdylib`, with
//! the header `include/shardgraph.h`) rather than a feature of this crate:
//! a feature cannot turn a crate into a C library, and the engine it
//! exposes lives in `shardgraph-models`, above this crate.

#![cfg_attr(docsrs, feature(doc_cfg))]
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

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
