//! Op dispatch of the CUDA backend: which `kernels-cuda` kernel computes a
//! node, with which launch shape and arguments. One file per kernel file;
//! each `run` returns `Ok(false)` for a node it has no kernel for (the
//! backend then computes it on the host), and `Ok(true)` once launched.
//!
//! The same code answers `supports_op` in a dry run ([`Cx::dry`]), where
//! nothing is launched and addresses are 0, so what is supported and what
//! runs cannot drift apart.
//!
//! Memory safety: [`Cx::launch`] is safe to call because every pointer the
//! dispatchers pass is an operand's address ([`T::p`]) whose whole span
//! (`nbytes`) the backend checked against its buffer, and the shapes and
//! strides passed with it are that operand's own `ne`/`nb` (or a
//! reinterpretation that stays inside the span), which is each kernel's
//! contract in its `.cu` file.

mod concat;
mod elementwise;
mod flash_attn;
mod getrows;
mod glu;
mod matmul;
mod norm;
mod reduce;
mod rope;
mod softmax;
mod ssm;

use super::api::{DevPtr, Gpu, KArg};
use crate::error::Result;
use crate::ops::Op;
use crate::tensor::{GgmlType, Tensor};
use std::cell::Cell;

/// A node operand: its tensor and device address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct T<'a> {
    /// The tensor (type, `ne`, `nb`).
    pub t: &'a Tensor,
    /// Device address of its first byte (0 in a dry run).
    pub p: DevPtr,
}

impl T<'_> {
    /// Element type.
    pub fn ty(&self) -> GgmlType {
        self.t.ty
    }
    /// The address as a kernel argument.
    pub fn ptr(&self) -> KArg {
        KArg::Ptr(self.p)
    }
    /// `ne[0..4]` as i64 arguments.
    pub fn ne(&self) -> [KArg; 4] {
        self.t.ne.map(KArg::I64)
    }
    /// `nb[0..4]` (bytes) as i64 arguments.
    pub fn nb(&self) -> [KArg; 4] {
        self.t.nb.map(|b| KArg::I64(b as i64))
    }
    /// Rows: `ne1·ne2·ne3`.
    pub fn nrows(&self) -> i64 {
        self.t.ne[1] * self.t.ne[2] * self.t.ne[3]
    }
    /// Element count.
    pub fn nelements(&self) -> i64 {
        self.t.nelements()
    }
}

/// Launch context: the device, and whether this is a dry run.
pub(crate) struct Cx<'a> {
    gpu: &'a dyn Gpu,
    dry: bool,
    sms: u32,
    launches: Cell<u64>,
}

impl<'a> Cx<'a> {
    /// A context that launches on `gpu`.
    pub fn live(gpu: &'a dyn Gpu) -> Self {
        Cx { gpu, dry: false, sms: gpu.info().multiprocessors.max(1), launches: Cell::new(0) }
    }
    /// A context that only answers whether a node has a kernel.
    pub fn dry(gpu: &'a dyn Gpu) -> Self {
        Cx { gpu, dry: true, sms: 1, launches: Cell::new(0) }
    }
    /// Launches issued so far.
    pub fn launches(&self) -> u64 {
        self.launches.get()
    }
    /// True in a dry run (nothing is launched).
    pub fn is_dry(&self) -> bool {
        self.dry
    }
    /// The most blocks worth launching for a grid-stride loop: enough to
    /// fill the device (32 per SM), not more.
    pub fn max_blocks(&self) -> u32 {
        self.sms.saturating_mul(32).max(1)
    }
    /// Blocks for `n` items at `per_block` items per block, capped by
    /// [`Cx::max_blocks`] and `limit` (CUDA's grid limits), at least 1.
    pub fn blocks(&self, n: i64, per_block: i64, limit: u32) -> u32 {
        let want = (n.max(1) + per_block.max(1) - 1) / per_block.max(1);
        want.clamp(1, self.max_blocks().min(limit) as i64) as u32
    }
    /// Launches `kernel` (see the module's safety argument).
    pub fn launch(&self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        if self.dry {
            return Ok(());
        }
        self.launches.set(self.launches.get() + 1);
        // SAFETY: the module invariant: every pointer argument is a checked
        // operand address passed with that operand's own layout.
        unsafe { self.gpu.launch(kernel, grid, block, args) }
    }
    /// The device (for GEMM).
    pub fn gpu(&self) -> &dyn Gpu {
        self.gpu
    }
}

/// Launches the kernels for `op` computing `dst` from `src`; `Ok(false)` if
/// no kernel covers this node's types and layout.
pub(crate) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match op {
        Op::Add
        | Op::Sub
        | Op::Mul
        | Op::Div
        | Op::Scale { .. }
        | Op::Clamp { .. }
        | Op::Sqr
        | Op::Sqrt
        | Op::Unary(_)
        | Op::Fill { .. }
        | Op::Dup
        | Op::Cpy
        | Op::Cont
        | Op::Add1 => elementwise::run(cx, op, dst, src),
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::L2Norm { .. } => norm::run(cx, op, dst, src),
        Op::SoftMax { .. } | Op::Argmax | Op::TopK { .. } => softmax::run(cx, op, dst, src),
        Op::Sum | Op::SumRows | Op::Mean | Op::Argsort { .. } => reduce::run(cx, op, dst, src),
        Op::Glu { .. } => glu::run(cx, op, dst, src),
        Op::Concat { .. } | Op::Repeat | Op::Pad { .. } => concat::run(cx, op, dst, src),
        Op::MulMat | Op::MulMatId | Op::AddId => matmul::run(cx, op, dst, src),
        Op::GetRows | Op::SetRows => getrows::run(cx, op, dst, src),
        Op::Rope(_) => rope::run(cx, op, dst, src),
        Op::FlashAttnExt { .. } => flash_attn::run(cx, op, dst, src),
        Op::SsmConv | Op::GatedDeltaNet { .. } => ssm::run(cx, op, dst, src),
        Op::None | Op::Reshape | Op::View | Op::Permute { .. } | Op::Transpose => Ok(true),
    }
}
