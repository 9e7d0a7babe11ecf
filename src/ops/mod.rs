//! The ops: a typed enum ([`Op`]) with ggml's semantics, and the constructors
//! on [`crate::Context`] that check operand shapes and types.
//!
//! Each op family lives in its own file with its shape rules and constructors;
//! the CPU kernels live in `backend/cpu/kernels/` under the same family names.
//! Op names are ggml's (`ggml_op_name` in lower case).

mod attn;
mod data;
pub(crate) mod distributed;
mod elementwise;
mod matmul;
mod norm;
mod reduce;
mod rope;
mod ssm;

pub use distributed::RowReduce;

/// Unary element-wise functions (`enum ggml_unary_op`, subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// |x|
    Abs,
    /// −x
    Neg,
    /// tanh(x)
    Tanh,
    /// max(x, 0)
    Relu,
    /// 1 / (1 + e^−x)
    Sigmoid,
    /// ggml's tanh-approximated GELU.
    Gelu,
    /// x · sigmoid(1.702 x)
    GeluQuick,
    /// x · sigmoid(x)
    Silu,
    /// e^x
    Exp,
    /// log(1 + e^x) (ggml switches to x for x > 20).
    Softplus,
}

impl UnaryOp {
    /// Every unary op, in declaration order.
    pub const ALL: [UnaryOp; 10] = [
        UnaryOp::Abs,
        UnaryOp::Neg,
        UnaryOp::Tanh,
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::GeluQuick,
        UnaryOp::Silu,
        UnaryOp::Exp,
        UnaryOp::Softplus,
    ];

    /// ggml's name (`ggml_unary_op_name`).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Abs => "abs",
            UnaryOp::Neg => "neg",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Relu => "relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluQuick => "gelu_quick",
            UnaryOp::Silu => "silu",
            UnaryOp::Exp => "exp",
            UnaryOp::Softplus => "softplus",
        }
    }
}

/// Gated linear unit variants (`enum ggml_glu_op`, subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluOp {
    /// silu(gate) · up
    Swiglu,
    /// gelu(gate) · up (tanh approximation)
    Geglu,
}

/// Sort order for `argsort` (`enum ggml_sort_order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortOrder {
    /// Smallest first.
    Asc,
    /// Largest first.
    Desc,
}

/// Rope modes (ggml's `GGML_ROPE_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Rotate adjacent pairs (`x[2i]`, `x[2i+1]`); mode 0.
    Normal,
    /// Rotate halves (`x[i]`, `x[i + n_dims/2]`); mode 2.
    Neox,
    /// Multi-section rope (positions tensor has 4 per token); mode 8.
    Mrope,
    /// Interleaved multi-section rope (Qwen3-VL/Qwen3.5); mode 40.
    Imrope,
}

impl RopeMode {
    /// ggml's integer mode.
    pub fn ggml_mode(self) -> i32 {
        match self {
            RopeMode::Normal => 0,
            RopeMode::Neox => 2,
            RopeMode::Mrope => 8,
            RopeMode::Imrope => 40,
        }
    }
}

/// Parameters of `rope_ext` / `rope_multi` (ggml's op_params, typed).
/// YaRN parameters follow ggml (`ggml_rope_yarn_corr_dims`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Rotated dims from the start of each row (≤ ne0, even).
    pub n_dims: i32,
    /// Mode.
    pub mode: RopeMode,
    /// Original training context (YaRN).
    pub n_ctx_orig: i32,
    /// θ base.
    pub freq_base: f32,
    /// Position scale (1/linear-scaling factor).
    pub freq_scale: f32,
    /// YaRN extrapolation mix factor (0 disables).
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN β_fast.
    pub beta_fast: f32,
    /// YaRN β_slow.
    pub beta_slow: f32,
    /// Multi-section sizes (only for Mrope/Imrope; zeros otherwise).
    pub sections: [i32; 4],
}

impl Default for RopeParams {
    fn default() -> Self {
        RopeParams {
            n_dims: 0,
            mode: RopeMode::Normal,
            n_ctx_orig: 0,
            freq_base: 10000.0,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            sections: [0; 4],
        }
    }
}

/// An op with its typed parameters. Sources are kept in the tensor's `src`
/// list in ggml's order; each variant's doc says what they are.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A leaf (weight, input, cache): no op.
    None,
    /// Copy of src0 into a new contiguous tensor of the same type.
    Dup,
    /// src0 copied (and converted) into src1's storage; the result is a view of src1.
    Cpy,
    /// Contiguous copy of src0, possibly reshaped.
    Cont,
    /// Reshape of a contiguous src0 (a view).
    Reshape,
    /// A strided view of src0 at a byte offset.
    View,
    /// Permutation of src0's dims: `axes[i]` is where source dim i goes.
    Permute {
        /// Destination position of each source dim.
        axes: [usize; 4],
    },
    /// Swap of dims 0 and 1 (a view).
    Transpose,
    /// Rows of src0 selected by I32 indices src1 → F32.
    GetRows,
    /// Rows of src0 (F32) written into the rows of src2 (the destination) at I64/I32
    /// indices src1; the result is a view of src2 (ggml's legacy source order).
    SetRows,
    /// src0 and src1 joined along `dim`.
    Concat {
        /// Axis 0..3.
        dim: usize,
    },
    /// src0 + src1 (src1 broadcast over src0).
    Add,
    /// src0 − src1 (broadcast).
    Sub,
    /// src0 · src1 (broadcast).
    Mul,
    /// src0 / src1 (broadcast).
    Div,
    /// src0 + scalar tensor src1.
    Add1,
    /// src0 + rows of src1 selected by I32 ids src2 (MoE bias).
    AddId,
    /// s·x + b.
    Scale {
        /// Multiplier.
        s: f32,
        /// Bias.
        b: f32,
    },
    /// min(max(x, min), max).
    Clamp {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// x²
    Sqr,
    /// √x
    Sqrt,
    /// Sum of all elements → `[1, 1, 1, 1]`.
    Sum,
    /// Sum over ne0 → [1, ne1, ne2, ne3].
    SumRows,
    /// Mean over ne0 → [1, ne1, ne2, ne3].
    Mean,
    /// x / sqrt(mean(x²) + eps) per row.
    RmsNorm {
        /// ε.
        eps: f32,
    },
    /// (x − mean) / sqrt(var + eps) per row.
    Norm {
        /// ε.
        eps: f32,
    },
    /// x / max(‖x‖₂, eps) per row.
    L2Norm {
        /// ε.
        eps: f32,
    },
    /// src0 [K, M, ...] × src1 [K, N, ...] → [M, N, ...] (broadcast over dims 2, 3).
    MulMat,
    /// Expert matmul: src0 experts [K, M, n_expert], src1 [K, n_used or 1, T], src2 ids I32 [n_used, T].
    MulMatId,
    /// Rotary embedding: src0 x, src1 positions I32, optional src2 frequency factors.
    Rope(RopeParams),
    /// soft_max(x·scale + mask·slope): optional src1 mask (F16/F32), optional src2 sinks.
    SoftMax {
        /// Scale applied to x.
        scale: f32,
        /// ALiBi max bias (0 disables).
        max_bias: f32,
    },
    /// Fused attention: src0 q, src1 k, src2 v, optional src3 mask (F16), optional src4 sinks.
    FlashAttnExt {
        /// Scale of q·k.
        scale: f32,
        /// ALiBi max bias.
        max_bias: f32,
        /// Logit soft-cap (0 disables).
        logit_softcap: f32,
    },
    /// Gated linear unit: fused (src0 holds gate and up halves) or split (src0 gate, src1 up).
    Glu {
        /// Which GLU.
        op: GluOp,
        /// Fused form only: up half first.
        swapped: bool,
    },
    /// Element-wise unary function.
    Unary(UnaryOp),
    /// Index of the max of each row → I32 `[ne1]`.
    Argmax,
    /// Indices of the k largest per row → I32 [k, ne1, ne2, ne3] (order within the k unspecified in ggml; ours is descending).
    TopK {
        /// k.
        k: i32,
    },
    /// Row-wise sort indices → I32, same shape.
    Argsort {
        /// Order.
        order: SortOrder,
    },
    /// Depthwise causal conv for SSMs: src0 sx [d_conv−1+n_t, d_inner, n_s], src1 c [d_conv, d_inner] → [d_inner, n_t, n_s].
    SsmConv,
    /// Gated delta rule: src0 q, src1 k, src2 v, src3 g, src4 beta, src5 state; see the constructor.
    GatedDeltaNet {
        /// Snapshot slot count (ggml's K op param).
        k_snapshots: i64,
    },
    /// src0 tiled to the result's shape.
    Repeat,
    /// Zero-padding: `lp[i]` before and `rp[i]` after along each dim.
    Pad {
        /// Left pads.
        lp: [i32; 4],
        /// Right pads.
        rp: [i32; 4],
    },
    /// Tensor of src0's shape filled with `c`.
    Fill {
        /// Fill value.
        c: f32,
    },
    /// Meta backend only (`distributed.rs`): the tensor a collective fills
    /// between two local graphs; its sources are what the collective reads.
    /// No kernel computes it.
    Exchange,
    /// Meta backend only: per-row statistics of this device's part of rows
    /// split across devices (src0 x, src1 an optional soft_max mask).
    RowStats {
        /// The row op.
        reduce: RowReduce,
        /// Global positions along the row the part holds, in its order.
        ranges: Vec<(i64, i64)>,
    },
    /// Meta backend only: a distributed row op finished from the gathered
    /// statistics (src0 stats `[words, rows, N]`, src1 x and src2 mask for
    /// norms and soft_max).
    RowFinish {
        /// The row op.
        reduce: RowReduce,
        /// Each device's part length along the row.
        lens: Vec<i64>,
    },
    /// Meta backend only: the element-wise sum of its sources (the addends
    /// of a partial sum; one type and shape; integers exactly, floats
    /// accumulated in f32 and rounded once).
    AddN,
    /// Meta backend only: `get_rows` from a table holding the global rows
    /// `ranges` of `n_rows` (others give zero rows).
    GetRowsPart {
        /// Global rows the local table holds, in order.
        ranges: Vec<(i64, i64)>,
        /// Rows of the whole table (ids must lie below).
        n_rows: i64,
    },
}

/// The op families: one file per family in `ops/`, in the CPU kernels
/// (`backend/cpu/kernels/<family>.rs`), the CUDA dispatch
/// (`backend/cuda/ops/<family>.rs`) and the split rules
/// (`split/rules/<family>.rs`). [`Op::family`] is the one table that assigns
/// an op to its family; every layer dispatches on it with an exhaustive match,
/// so an op cannot be added without a place in each layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpFamily {
    /// Element-wise arithmetic, unary functions, GLUs, `scale`, `clamp`, `fill`.
    Elementwise,
    /// Reductions over rows or the whole tensor: `sum`, `sum_rows`, `mean`,
    /// `argmax`, `top_k`, `argsort`.
    Reduce,
    /// Row normalisations: `norm`, `rms_norm`, `l2_norm`, `soft_max`.
    Norm,
    /// Rotary position embedding.
    Rope,
    /// Matrix products: `mul_mat`, `mul_mat_id`, and `add_id` (MoE bias).
    Matmul,
    /// Fused attention: `flash_attn_ext`.
    Attn,
    /// Leafs, views, copies and data movement: `none`, `reshape`, `view`,
    /// `permute`, `transpose`, `dup`, `cpy`, `cont`, `get_rows`, `set_rows`,
    /// `concat`, `repeat`, `pad`.
    Data,
    /// State-space and linear-attention recurrences: `ssm_conv`, `gated_delta_net`.
    Ssm,
    /// Ops that exist only for the meta backend (`distributed.rs`): no ggml
    /// counterpart.
    Distributed,
}

impl OpFamily {
    /// Every family, in declaration order.
    pub const ALL: [OpFamily; 9] = [
        OpFamily::Elementwise,
        OpFamily::Reduce,
        OpFamily::Norm,
        OpFamily::Rope,
        OpFamily::Matmul,
        OpFamily::Attn,
        OpFamily::Data,
        OpFamily::Ssm,
        OpFamily::Distributed,
    ];

    /// The family's file name in every layer (`"elementwise"`, …).
    pub fn name(self) -> &'static str {
        match self {
            OpFamily::Elementwise => "elementwise",
            OpFamily::Reduce => "reduce",
            OpFamily::Norm => "norm",
            OpFamily::Rope => "rope",
            OpFamily::Matmul => "matmul",
            OpFamily::Attn => "attn",
            OpFamily::Data => "data",
            OpFamily::Ssm => "ssm",
            OpFamily::Distributed => "distributed",
        }
    }
}

// The family macros: each expands, in pattern position, to the pattern of
// one family's ops, and `Op::family` is written with them. A family's files
// in every layer (CPU kernels, CUDA dispatch, split rules) match their own
// ops one by one and every other family through `ops_outside!(<family>)`,
// so an op added to family F compiles everywhere but in F's files, until
// each of them says what it does with it (ggml keeps
// `static_assert(GGML_OP_COUNT == N)` beside each table for the same end).

/// The element-wise family's ops, as a pattern ([`OpFamily::Elementwise`]).
macro_rules! elementwise_ops {
    () => {
        $crate::ops::Op::Add
            | $crate::ops::Op::Sub
            | $crate::ops::Op::Mul
            | $crate::ops::Op::Div
            | $crate::ops::Op::Add1
            | $crate::ops::Op::Scale { .. }
            | $crate::ops::Op::Clamp { .. }
            | $crate::ops::Op::Sqr
            | $crate::ops::Op::Sqrt
            | $crate::ops::Op::Unary(_)
            | $crate::ops::Op::Glu { .. }
            | $crate::ops::Op::Fill { .. }
    };
}

/// The reduce family's ops, as a pattern ([`OpFamily::Reduce`]).
macro_rules! reduce_ops {
    () => {
        $crate::ops::Op::Sum
            | $crate::ops::Op::SumRows
            | $crate::ops::Op::Mean
            | $crate::ops::Op::Argmax
            | $crate::ops::Op::TopK { .. }
            | $crate::ops::Op::Argsort { .. }
    };
}

/// The norm family's ops, as a pattern ([`OpFamily::Norm`]).
macro_rules! norm_ops {
    () => {
        $crate::ops::Op::RmsNorm { .. }
            | $crate::ops::Op::Norm { .. }
            | $crate::ops::Op::L2Norm { .. }
            | $crate::ops::Op::SoftMax { .. }
    };
}

/// The rope family's ops, as a pattern ([`OpFamily::Rope`]).
macro_rules! rope_ops {
    () => {
        $crate::ops::Op::Rope(_)
    };
}

/// The matmul family's ops, as a pattern ([`OpFamily::Matmul`]).
macro_rules! matmul_ops {
    () => {
        $crate::ops::Op::MulMat | $crate::ops::Op::MulMatId | $crate::ops::Op::AddId
    };
}

/// The attention family's ops, as a pattern ([`OpFamily::Attn`]).
macro_rules! attn_ops {
    () => {
        $crate::ops::Op::FlashAttnExt { .. }
    };
}

/// The data family's ops, as a pattern ([`OpFamily::Data`]).
macro_rules! data_ops {
    () => {
        $crate::ops::Op::None
            | $crate::ops::Op::Reshape
            | $crate::ops::Op::View
            | $crate::ops::Op::Permute { .. }
            | $crate::ops::Op::Transpose
            | $crate::ops::Op::Dup
            | $crate::ops::Op::Cpy
            | $crate::ops::Op::Cont
            | $crate::ops::Op::GetRows
            | $crate::ops::Op::SetRows
            | $crate::ops::Op::Concat { .. }
            | $crate::ops::Op::Repeat
            | $crate::ops::Op::Pad { .. }
    };
}

/// The ssm family's ops, as a pattern ([`OpFamily::Ssm`]).
macro_rules! ssm_ops {
    () => {
        $crate::ops::Op::SsmConv | $crate::ops::Op::GatedDeltaNet { .. }
    };
}

/// The distributed family's ops, as a pattern ([`OpFamily::Distributed`]).
macro_rules! distributed_ops {
    () => {
        $crate::ops::Op::Exchange
            | $crate::ops::Op::RowStats { .. }
            | $crate::ops::Op::RowFinish { .. }
            | $crate::ops::Op::GetRowsPart { .. }
            | $crate::ops::Op::AddN
    };
}

/// Every op outside family `$f` (`elementwise`, `reduce`, `norm`, `rope`,
/// `matmul`, `attn`, `data`, `ssm`, `distributed`), as a pattern: the arm
/// by which a family's file says "not mine" without a catch-all.
macro_rules! ops_outside {
    (elementwise) => {
        $crate::ops::reduce_ops!()
            | $crate::ops::norm_ops!()
            | $crate::ops::rope_ops!()
            | $crate::ops::matmul_ops!()
            | $crate::ops::attn_ops!()
            | $crate::ops::data_ops!()
            | $crate::ops::ssm_ops!()
            | $crate::ops::distributed_ops!()
    };
    (reduce) => {
        $crate::ops::elementwise_ops!()
            | $crate::ops::norm_ops!()
            | $crate::ops::rope_ops!()
            | $crate::ops::matmul_ops!()
            | $crate::ops::attn_ops!()
            | $crate::ops::data_ops!()
            | $crate::ops::ssm_ops!()
            | $crate::ops::distributed_ops!()
    };
    (norm) => {
        $crate::ops::elementwise_ops!()
            | $crate::ops::reduce_ops!()
            | $crate::ops::rope_ops!()
            | $crate::ops::matmul_ops!()
            | $crate::ops::attn_ops!()
            | $crate::ops::data_ops!()
            | $crate::ops::ssm_ops!()
            | $crate::ops::distributed_ops!()
    };
    (rope) => {
        $crate::ops::elementwise_ops!()
            | $crate::ops::reduce_ops!()
            | $crate::ops::norm_ops!()
            | $crate::ops::matmul_ops!()
            | $crate::ops::attn_ops!()
            | $crate::ops::data_ops!()
            | $crate::ops::ssm_ops!()
            | $crate::ops::distributed_ops!()
    };
    (matmul) => {
        $crate::ops::elementwise_ops!()
            | $crate::ops::reduce_ops!()
            | $crate::ops::norm_ops!()
            | $crate::ops::rope_ops!()
            | $crate::ops::attn_ops!()
            | $crate::ops::data_ops!()
            | $crate::ops::ssm_ops!()
            | $crate::ops::distributed_ops!()
    };
    (attn) => {
        $crate::ops::elementwise_ops!()
            | $crate::ops::reduce_ops!()
            | $crate::ops::norm_ops!()
            | $crate::ops::rope_ops!()
            | $crate::ops::matmul_ops!()
            | $crate::ops::data_ops!()
            | $crate::ops::ssm_ops!()
            | $crate::ops::distributed_ops!()
    };
    (data) => {
        $crate::ops::elementwise_ops!()
            | $crate::ops::reduce_ops!()
            | $crate::ops::norm_ops!()
            | $crate::ops::rope_ops!()
            | $crate::ops::matmul_ops!()
            | $crate::ops::attn_ops!()
            | $crate::ops::ssm_ops!()
            | $crate::ops::distributed_ops!()
    };
    (ssm) => {
        $crate::ops::elementwise_ops!()
            | $crate::ops::reduce_ops!()
            | $crate::ops::norm_ops!()
            | $crate::ops::rope_ops!()
            | $crate::ops::matmul_ops!()
            | $crate::ops::attn_ops!()
            | $crate::ops::data_ops!()
            | $crate::ops::distributed_ops!()
    };
    (distributed) => {
        $crate::ops::elementwise_ops!()
            | $crate::ops::reduce_ops!()
            | $crate::ops::norm_ops!()
            | $crate::ops::rope_ops!()
            | $crate::ops::matmul_ops!()
            | $crate::ops::attn_ops!()
            | $crate::ops::data_ops!()
            | $crate::ops::ssm_ops!()
    };
}

pub(crate) use {
    attn_ops, data_ops, distributed_ops, elementwise_ops, matmul_ops, norm_ops, ops_outside, reduce_ops, rope_ops,
    ssm_ops,
};

impl Op {
    /// ggml's op name in lower case (`"mul_mat"`, `"unary"` ops by their function).
    pub fn name(&self) -> &'static str {
        match self {
            Op::None => "none",
            Op::Dup => "dup",
            Op::Cpy => "cpy",
            Op::Cont => "cont",
            Op::Reshape => "reshape",
            Op::View => "view",
            Op::Permute { .. } => "permute",
            Op::Transpose => "transpose",
            Op::GetRows => "get_rows",
            Op::SetRows => "set_rows",
            Op::Concat { .. } => "concat",
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Div => "div",
            Op::Add1 => "add1",
            Op::AddId => "add_id",
            Op::Scale { .. } => "scale",
            Op::Clamp { .. } => "clamp",
            Op::Sqr => "sqr",
            Op::Sqrt => "sqrt",
            Op::Sum => "sum",
            Op::SumRows => "sum_rows",
            Op::Mean => "mean",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Norm { .. } => "norm",
            Op::L2Norm { .. } => "l2_norm",
            Op::MulMat => "mul_mat",
            Op::MulMatId => "mul_mat_id",
            Op::Rope(_) => "rope",
            Op::SoftMax { .. } => "soft_max",
            Op::FlashAttnExt { .. } => "flash_attn_ext",
            Op::Glu { .. } => "glu",
            Op::Unary(u) => u.name(),
            Op::Argmax => "argmax",
            Op::TopK { .. } => "top_k",
            Op::Argsort { .. } => "argsort",
            Op::SsmConv => "ssm_conv",
            Op::GatedDeltaNet { .. } => "gated_delta_net",
            Op::Repeat => "repeat",
            Op::Pad { .. } => "pad",
            Op::Fill { .. } => "fill",
            Op::Exchange => "exchange",
            Op::RowStats { .. } => "row_stats",
            Op::RowFinish { .. } => "row_finish",
            Op::GetRowsPart { .. } => "get_rows_part",
            Op::AddN => "add_n",
        }
    }

    /// The op's family (see [`OpFamily`]): the one table every layer
    /// dispatches on, written with the crate's family macros
    /// (`elementwise_ops!()` and the others), so an op in none of them does
    /// not compile.
    pub fn family(&self) -> OpFamily {
        match self {
            elementwise_ops!() => OpFamily::Elementwise,
            reduce_ops!() => OpFamily::Reduce,
            norm_ops!() => OpFamily::Norm,
            rope_ops!() => OpFamily::Rope,
            matmul_ops!() => OpFamily::Matmul,
            attn_ops!() => OpFamily::Attn,
            data_ops!() => OpFamily::Data,
            ssm_ops!() => OpFamily::Ssm,
            distributed_ops!() => OpFamily::Distributed,
        }
    }

    /// True for a leaf (`Op::None`: a weight, input or cache; no op).
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::None)
    }

    /// True for the shape-only ops (`reshape`, `view`, `permute`,
    /// `transpose`): the result is src0's memory seen with another shape, and
    /// no kernel runs.
    pub fn is_shape_only(&self) -> bool {
        matches!(self, Op::Reshape | Op::View | Op::Permute { .. } | Op::Transpose)
    }

    /// For the ops that write through a view into another tensor's storage
    /// (`cpy` into src1, `set_rows` into src2; the result is a view of that
    /// source): the index of the destination source. `None` for every other op.
    pub fn written_src(&self) -> Option<usize> {
        match self {
            Op::Cpy => Some(1),
            Op::SetRows => Some(2),
            _ => None,
        }
    }

    /// True for the ops that write through a view into a source's storage
    /// (see [`Op::written_src`]).
    pub fn writes_through_view(&self) -> bool {
        self.written_src().is_some()
    }

    /// True for the ops linear in src0 alone (`f(a + b) = f(a) + f(b)`):
    /// `neg`, `cont`, `dup` and `scale` without bias. A partial sum passes
    /// through them unreduced.
    pub fn is_linear_unary(&self) -> bool {
        matches!(self, Op::Unary(UnaryOp::Neg) | Op::Cont | Op::Dup) || matches!(self, Op::Scale { b, .. } if *b == 0.0)
    }

    /// True when the op carries an ALiBi bias (`soft_max` or `flash_attn_ext`
    /// with `max_bias > 0`): each head's slope depends on its global index.
    pub fn has_alibi(&self) -> bool {
        matches!(self, Op::SoftMax { max_bias, .. } | Op::FlashAttnExt { max_bias, .. } if *max_bias > 0.0)
    }

    /// Feeds the op and its parameters to `h` (floats by their bits): the
    /// graph's structural hash, without formatting.
    pub(crate) fn hash_into<H: std::hash::Hasher>(&self, h: &mut H) {
        use std::hash::Hash;
        std::mem::discriminant(self).hash(h);
        let f = |h: &mut H, v: &[f32]| v.iter().for_each(|x| x.to_bits().hash(h));
        match self {
            Op::Permute { axes } => axes.hash(h),
            Op::Concat { dim } => dim.hash(h),
            Op::Scale { s, b } => f(h, &[*s, *b]),
            Op::Clamp { min, max } => f(h, &[*min, *max]),
            Op::RmsNorm { eps } | Op::Norm { eps } | Op::L2Norm { eps } => f(h, &[*eps]),
            Op::Rope(p) => {
                (p.n_dims, p.mode, p.n_ctx_orig, p.sections).hash(h);
                f(h, &[p.freq_base, p.freq_scale, p.ext_factor, p.attn_factor, p.beta_fast, p.beta_slow]);
            }
            Op::SoftMax { scale, max_bias } => f(h, &[*scale, *max_bias]),
            Op::FlashAttnExt { scale, max_bias, logit_softcap } => f(h, &[*scale, *max_bias, *logit_softcap]),
            Op::Glu { op, swapped } => (op, swapped).hash(h),
            Op::Unary(u) => u.hash(h),
            Op::TopK { k } => k.hash(h),
            Op::Argsort { order } => order.hash(h),
            Op::GatedDeltaNet { k_snapshots } => k_snapshots.hash(h),
            Op::Pad { lp, rp } => (lp, rp).hash(h),
            Op::Fill { c } => f(h, &[*c]),
            Op::RowStats { reduce, ranges } => {
                format!("{reduce:?}").hash(h);
                ranges.hash(h);
            }
            Op::RowFinish { reduce, lens } => {
                format!("{reduce:?}").hash(h);
                lens.hash(h);
            }
            Op::GetRowsPart { ranges, n_rows } => (ranges, n_rows).hash(h),
            Op::None
            | Op::Dup
            | Op::Cpy
            | Op::Cont
            | Op::Reshape
            | Op::View
            | Op::Transpose
            | Op::GetRows
            | Op::SetRows
            | Op::Add
            | Op::Sub
            | Op::Mul
            | Op::Div
            | Op::Add1
            | Op::AddId
            | Op::Sqr
            | Op::Sqrt
            | Op::Sum
            | Op::SumRows
            | Op::Mean
            | Op::MulMat
            | Op::MulMatId
            | Op::Argmax
            | Op::SsmConv
            | Op::Repeat
            | Op::Exchange
            | Op::AddN => {}
        }
    }

    /// True for ops whose result is a view of a source's storage (no kernel
    /// runs, or the kernel writes into the source: `cpy`, `set_rows`).
    pub fn is_view_op(&self) -> bool {
        self.is_shape_only() || self.writes_through_view()
    }

    /// True if the result may be written into src0's memory when src0 is not
    /// used afterwards (same shape, same type, element-wise; ggml's
    /// `ggml_op_can_inplace`).
    pub fn can_inplace(&self) -> bool {
        // Element-wise ops but a GLU (whose fused src0 is twice as wide),
        // the row normalisations and rope.
        match self.family() {
            OpFamily::Elementwise => !matches!(self, Op::Glu { .. }),
            OpFamily::Norm | OpFamily::Rope => true,
            OpFamily::Reduce
            | OpFamily::Matmul
            | OpFamily::Attn
            | OpFamily::Data
            | OpFamily::Ssm
            | OpFamily::Distributed => false,
        }
    }
}

/// Assertions shared by the op families' unit tests.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::error::{Error, Result};
    use crate::tensor::TensorId;

    /// Asserts `r` is an `InvalidOperand` error for `op` and `operand`.
    pub(crate) fn err_names(r: Result<TensorId>, op: &str, operand: &str) {
        match r {
            Err(Error::InvalidOperand { op: o, operand: w, .. }) => assert_eq!((o, w), (op, operand)),
            other => panic!("expected InvalidOperand({op}, {operand}), got {other:?}"),
        }
    }

    /// The message of the error `r` must be.
    pub(crate) fn err_of(r: Result<TensorId>) -> String {
        match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("expected an error"),
        }
    }
}
