//! Which `sg_*` functions build each [`Op`]: one exhaustive match over
//! `Op` (no catch-all), so a variant added to `Op` does not compile here
//! until its C constructors are named, or it is marked as made only by the
//! meta backend. `tests/c_api.rs` checks that every function the table
//! names is declared in `include/shardgraph.h` and exported by the library,
//! and `tests/ops.rs` that its op sequence (built through the C functions
//! and the Rust constructors alike) builds every op the table gives a C
//! constructor.

use shardgraph::Op;

/// How the C ABI builds one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CAbi {
    /// These `sg_*` functions build it (`include/shardgraph.h`).
    Fns(&'static [&'static str]),
    /// None: the meta backend alone makes it, inside the per-device
    /// programs it compiles from a plan (`exchange`, `row_stats`, …).
    MetaBackendOnly,
}

impl CAbi {
    /// The functions (none for [`CAbi::MetaBackendOnly`]).
    pub fn functions(self) -> &'static [&'static str] {
        match self {
            CAbi::Fns(f) => f,
            CAbi::MetaBackendOnly => &[],
        }
    }
}

/// One row of the table: the `Op` pattern as written here and how the C
/// ABI builds the ops it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRow {
    /// The pattern (`"Op::Scale { .. }"`), which names the row.
    pub pattern: &'static str,
    /// Its C constructors.
    pub c: CAbi,
}

/// Writes [`op_row`] (the match) and [`OP_ROWS`] (its rows in order) from
/// one list, so the two cannot differ.
macro_rules! op_table {
    ($($pat:pat => $c:expr;)*) => {
        /// The row of the table that `op` falls in (every `Op` has one).
        pub fn op_row(op: &Op) -> OpRow {
            use CAbi::*;
            match op {
                $($pat => OpRow { pattern: stringify!($pat), c: $c },)*
            }
        }

        /// Every row of the table, in order.
        pub const OP_ROWS: &[OpRow] = {
            use CAbi::*;
            &[$(OpRow { pattern: stringify!($pat), c: $c }),*]
        };
    };
}

op_table! {
    // Data.
    Op::None => Fns(&["sg_new_tensor"]);
    Op::Dup => Fns(&["sg_dup"]);
    Op::Cpy => Fns(&["sg_cpy", "sg_cast"]);
    Op::Cont => Fns(&["sg_cont", "sg_cont_1d", "sg_cont_2d", "sg_cont_3d", "sg_cont_4d"]);
    Op::Reshape => Fns(&["sg_reshape", "sg_reshape_1d", "sg_reshape_2d", "sg_reshape_3d", "sg_reshape_4d"]);
    Op::View => Fns(&["sg_view_1d", "sg_view_2d", "sg_view_3d", "sg_view_4d"]);
    Op::Permute { .. } => Fns(&["sg_permute"]);
    Op::Transpose => Fns(&["sg_transpose"]);
    Op::GetRows => Fns(&["sg_get_rows"]);
    Op::SetRows => Fns(&["sg_set_rows"]);
    Op::Concat { .. } => Fns(&["sg_concat"]);
    Op::Repeat => Fns(&["sg_repeat", "sg_repeat_4d"]);
    Op::Pad { .. } => Fns(&["sg_pad"]);
    // Element-wise.
    Op::Add => Fns(&["sg_add"]);
    Op::Sub => Fns(&["sg_sub"]);
    Op::Mul => Fns(&["sg_mul"]);
    Op::Div => Fns(&["sg_div"]);
    Op::Add1 => Fns(&["sg_add1"]);
    Op::Scale { .. } => Fns(&["sg_scale", "sg_scale_bias"]);
    Op::Clamp { .. } => Fns(&["sg_clamp"]);
    Op::Sqr => Fns(&["sg_sqr"]);
    Op::Sqrt => Fns(&["sg_sqrt"]);
    Op::Unary(_) => Fns(&[
        "sg_unary",
        "sg_abs",
        "sg_neg",
        "sg_tanh",
        "sg_relu",
        "sg_sigmoid",
        "sg_gelu",
        "sg_gelu_quick",
        "sg_silu",
        "sg_exp",
        "sg_softplus",
    ]);
    Op::Glu { .. } => Fns(&["sg_glu", "sg_glu_split", "sg_swiglu", "sg_geglu", "sg_swiglu_split", "sg_geglu_split"]);
    Op::Fill { .. } => Fns(&["sg_fill"]);
    // Reductions.
    Op::Sum => Fns(&["sg_sum"]);
    Op::SumRows => Fns(&["sg_sum_rows"]);
    Op::Mean => Fns(&["sg_mean"]);
    Op::Argmax => Fns(&["sg_argmax"]);
    Op::TopK { .. } => Fns(&["sg_top_k"]);
    Op::Argsort { .. } => Fns(&["sg_argsort"]);
    // Norms.
    Op::RmsNorm { .. } => Fns(&["sg_rms_norm"]);
    Op::Norm { .. } => Fns(&["sg_norm"]);
    Op::L2Norm { .. } => Fns(&["sg_l2_norm"]);
    Op::SoftMax { .. } => Fns(&["sg_soft_max", "sg_soft_max_ext", "sg_soft_max_add_sinks"]);
    // Rope, matrix products, attention, recurrences.
    Op::Rope(_) => Fns(&["sg_rope_ext", "sg_rope_multi"]);
    Op::MulMat => Fns(&["sg_mul_mat"]);
    Op::MulMatId => Fns(&["sg_mul_mat_id"]);
    Op::AddId => Fns(&["sg_add_id"]);
    Op::FlashAttnExt { .. } => Fns(&["sg_flash_attn_ext", "sg_flash_attn_ext_add_sinks"]);
    Op::SsmConv => Fns(&["sg_ssm_conv"]);
    Op::GatedDeltaNet { .. } => Fns(&["sg_gated_delta_net"]);
    // The meta backend's own ops.
    Op::Exchange => MetaBackendOnly;
    Op::RowStats { .. } => MetaBackendOnly;
    Op::RowFinish { .. } => MetaBackendOnly;
    Op::GetRowsPart { .. } => MetaBackendOnly;
    Op::AddN => MetaBackendOnly;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row names one pattern, and a function builds one op.
    #[test]
    fn rows_and_functions_are_distinct() {
        let mut patterns: Vec<&str> = OP_ROWS.iter().map(|r| r.pattern).collect();
        patterns.sort_unstable();
        patterns.dedup();
        assert_eq!(patterns.len(), OP_ROWS.len(), "a pattern twice");
        let mut fns: Vec<&str> = OP_ROWS.iter().flat_map(|r| r.c.functions().iter().copied()).collect();
        let n = fns.len();
        fns.sort_unstable();
        fns.dedup();
        assert_eq!(fns.len(), n, "a function in two rows");
        assert_eq!(op_row(&Op::Scale { s: 1.0, b: 0.0 }).pattern, "Op::Scale { .. }");
        assert_eq!(op_row(&Op::AddN).c, CAbi::MetaBackendOnly);
    }
}
