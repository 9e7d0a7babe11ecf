//! CPU kernels, one module per op family (the same families as `crate::ops`).
//! Each family exposes `compute(op, dst, src)`, whose match names every op of
//! the family (the others through `ops_outside!`, no catch-all), so a new op
//! does not compile until its family's kernel file says what it does.
//! Multi-threading: kernels run inside the backend's rayon pool and split
//! work by destination rows (see `access.rs` for the memory invariants).

pub(crate) mod attn;
pub(crate) mod data;
pub(crate) mod distributed;
pub(crate) mod elementwise;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod reduce;
pub(crate) mod rope;
pub(crate) mod ssm;

use super::TView;
use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::{Op, OpFamily};
use crate::tensor::Tensor;

/// Runs the kernel for `op` writing `dst` from `src` (in the tensor's `src` order).
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match op.family() {
        // A leaf holds its data and a shape-only op is its source's memory.
        OpFamily::Data if op.is_leaf() || op.is_shape_only() => Ok(()),
        OpFamily::Data => data::compute(op, dst, src),
        OpFamily::Elementwise => elementwise::compute(op, dst, src),
        OpFamily::Reduce => reduce::compute(op, dst, src),
        OpFamily::Norm => norm::compute(op, dst, src),
        OpFamily::Rope => rope::compute(op, dst, src),
        OpFamily::Matmul => matmul::compute(op, dst, src),
        OpFamily::Attn => attn::compute(op, dst, src),
        OpFamily::Ssm => ssm::compute(op, dst, src),
        // `exchange` (filled by the executor between local graphs, never
        // computed) is unsupported there.
        OpFamily::Distributed => distributed::compute(op, dst, src),
    }
}

/// True if the CPU backend computes `t` (every op the constructors accept).
pub(crate) fn supports(ctx: &Context, t: &Tensor) -> bool {
    let _ = ctx;
    !t.op.is_leaf() || t.src.is_empty()
}

/// The error a kernel returns for a type/layout combination it lacks.
pub(crate) fn unsupported(op: &Op, dst: &TView, src: &[TView]) -> Error {
    Error::UnsupportedOp {
        backend: "CPU".into(),
        op: op.name(),
        detail: format!(
            "dst {}{:?}, src {:?}",
            dst.ty,
            dst.ne,
            src.iter().map(|s| format!("{}{:?}", s.ty, s.ne)).collect::<Vec<_>>()
        ),
    }
}
