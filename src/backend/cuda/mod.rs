//! The CUDA backend (cargo feature `cuda`). Kernel sources live in
//! `kernels-cuda/` (one `.cu` file per op family) and are compiled by NVRTC
//! at first use, cached per architecture and source hash ([`nvrtc`]).
//! cudarc loads the CUDA libraries at run time, so the crate builds and its
//! tests run on a machine with no GPU and no toolkit: a missing library is
//! an [`Error::Cuda`](crate::Error::Cuda), never a panic.
//!
//! Status: NVRTC compilation of every kernel (checked for sm_86 and sm_90 by
//! `tests/cuda_kernels.rs`). Launching them — the `Backend` implementation,
//! cuBLAS GEMM, NCCL collectives and virtual devices — is not written yet.

pub mod device;
pub mod nvrtc;
