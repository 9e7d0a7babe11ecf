//! CPU kernels, one module per op family (the same families as `crate::ops`).
//! Each family exposes `compute(op, dst, src)` and `supports(ctx, t)`.
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
use crate::ops::Op;
use crate::tensor::Tensor;

/// Runs the kernel for `op` writing `dst` from `src` (in the tensor's `src` order).
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match op {
        Op::None | Op::Reshape | Op::View | Op::Permute { .. } | Op::Transpose => Ok(()),
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Add1
        | Op::Scale { .. }
        | Op::Clamp { .. }
        | Op::Sqr
        | Op::Sqrt
        | Op::Unary(_)
        | Op::Glu { .. }
        | Op::Fill { .. } => elementwise::compute(op, dst, src),
        Op::Sum | Op::SumRows | Op::Mean | Op::Argmax | Op::TopK { .. } | Op::Argsort { .. } => {
            reduce::compute(op, dst, src)
        }
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::L2Norm { .. } | Op::SoftMax { .. } => norm::compute(op, dst, src),
        Op::Rope(_) => rope::compute(op, dst, src),
        Op::MulMat | Op::MulMatId | Op::AddId => matmul::compute(op, dst, src),
        Op::FlashAttnExt { .. } => attn::compute(op, dst, src),
        Op::Dup | Op::Cpy | Op::Cont | Op::GetRows | Op::SetRows | Op::Concat { .. } | Op::Repeat | Op::Pad { .. } => {
            data::compute(op, dst, src)
        }
        Op::SsmConv | Op::GatedDeltaNet { .. } => ssm::compute(op, dst, src),
        Op::RowStats { .. } | Op::RowFinish { .. } | Op::GetRowsPart { .. } | Op::AddN => {
            distributed::compute(op, dst, src)
        }
        // The executor fills it between local graphs; a backend never runs it.
        Op::Exchange => Err(unsupported(op, dst, src)),
    }
}

/// True if the CPU backend computes `t` (every op the constructors accept).
pub(crate) fn supports(ctx: &Context, t: &Tensor) -> bool {
    let _ = ctx;
    !matches!(t.op, Op::None) || t.src.is_empty()
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
