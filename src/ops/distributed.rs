//! The ops the meta backend puts into each device's graph when it compiles
//! a plan (`crate::split`): they have no ggml counterpart and no public
//! constructor, but they are ordinary graph nodes with CPU and CUDA kernels,
//! so a split plan runs on the devices without host code between them.
//!
//! * `exchange`: the tensor a collective fills between two local graphs
//!   (the executor moves the bytes; no kernel runs). Its sources are the
//!   tensors the collective reads, so the graph allocator keeps them alive
//!   until it ran and gives the result memory from that point on.
//! * `row_stats` / `row_finish`: a per-row op whose rows are split across
//!   devices (docs/split-design.md#6-per-row-ops-over-a-split-axis): each
//!   device reduces its part of every row to a few numbers (`row_stats`),
//!   the devices all-gather them, and each device finishes its part of the
//!   rows from the gathered numbers (`row_finish`). Which row ops combine
//!   this way ([`RowReduce::of`]) and the bytes their numbers take
//!   ([`RowReduce::combine_bytes`]) are decided here alone: the split
//!   rules price the combine with them and the compiler builds it.
//! * `add_n`: the sum of a partial tensor's addends (a reduction's last
//!   step), for every type a partial sum may have (integers included).
//! * `get_rows_part`: `get_rows` from a table of which this device holds
//!   only some rows (a vocabulary split): rows it does not hold are zeros,
//!   so the devices' results are addends of the single-device result
//!   (Megatron's vocabulary-parallel embedding).

use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::{attn_ops, data_ops, distributed_ops, elementwise_ops, matmul_ops, rope_ops, ssm_ops, Op};
use crate::tensor::{GgmlType, Tensor, TensorId};

/// What a distributed row op computes. Statistics are F32 words per row
/// ([`RowReduce::words`]); sums are carried as an f64 split into two f32
/// words (`hi = s as f32`, `lo = (s − hi) as f32`), so the combine keeps the
/// f64 accumulation one device's kernel uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowReduce {
    /// `rms_norm`: stats Σx² (hi, lo); finish `x / sqrt(Σ/n + eps)`.
    RmsNorm {
        /// ε.
        eps: f32,
    },
    /// `l2_norm`: stats Σx² (hi, lo); finish `x / max(sqrt(Σ), eps)`.
    L2Norm {
        /// ε.
        eps: f32,
    },
    /// `norm`: stats (Σx, Σ(x − local mean)²) as f32; finish by Chan's
    /// parallel variance over the devices' parts.
    Norm {
        /// ε.
        eps: f32,
    },
    /// `soft_max` with a 2-D mask (optional), no ALiBi, no sinks: stats
    /// (max v, Σ exp(v − max)) of `v = x·scale + mask`; finish
    /// `exp(v − M) / Σ_d s_d·exp(m_d − M)` with `M` the largest `m_d`.
    SoftMax {
        /// Scale applied to x.
        scale: f32,
    },
    /// `argmax` (ggml's scan: ties keep the last index, a NaN restarts the
    /// running maximum): stats (value, code) where the code packs the
    /// global index and how the part acts on the scan (see the kernels).
    Argmax,
    /// `top_k`: stats the part's k best (value, global index), padded with
    /// index −1; finish merges the devices' candidates (descending value,
    /// ties by lower index, as one device's kernel).
    TopK {
        /// k.
        k: i32,
    },
    /// `sum_rows`: stats Σx (hi, lo); finish the sum of the devices' sums.
    SumRows,
    /// `mean`: as `sum_rows`, divided by the global row length.
    Mean,
    /// `sum` of the whole tensor (any split): stats one f32 word per device.
    Sum,
}

impl RowReduce {
    /// F32 words of statistics per row (per tensor for [`RowReduce::Sum`]).
    pub fn words(&self) -> usize {
        match self {
            RowReduce::TopK { k } => 2 * (*k).max(0) as usize,
            RowReduce::Sum => 1,
            _ => 2,
        }
    }

    /// Bytes of statistics one device gives per row (per tensor for
    /// [`RowReduce::Sum`]): [`RowReduce::words`] F32 words.
    pub fn stat_bytes(&self) -> u64 {
        4 * self.words() as u64
    }

    /// Bytes the combine over `x`'s split rows gathers: every device's
    /// statistics of every row of `x` (one set for [`RowReduce::Sum`]),
    /// from `n` devices together. What the planner charges for it.
    pub fn combine_bytes(&self, x: &Tensor, n: usize) -> u64 {
        let rows = if *self == RowReduce::Sum { 1 } else { x.nrows().max(0) as u64 };
        rows * self.stat_bytes() * n as u64
    }

    /// The name of the row op it distributes (ggml's).
    pub fn name(&self) -> &'static str {
        match self {
            RowReduce::RmsNorm { .. } => "rms_norm",
            RowReduce::L2Norm { .. } => "l2_norm",
            RowReduce::Norm { .. } => "norm",
            RowReduce::SoftMax { .. } => "soft_max",
            RowReduce::Argmax => "argmax",
            RowReduce::TopK { .. } => "top_k",
            RowReduce::SumRows => "sum_rows",
            RowReduce::Mean => "mean",
            RowReduce::Sum => "sum",
        }
    }

    /// The distributed form of a node with op `op` and sources `src` (src0
    /// the rows) when its rows are split along ne0, if it has one: the one
    /// place that decides which row ops combine over a split row (the split
    /// rules price the candidate, the compiler builds it). The norms,
    /// `argmax`, `top_k`, `sum_rows`, `mean`, `sum` (over any split), and
    /// `soft_max` without ALiBi (whose slopes need the global head index),
    /// without sinks, with no mask or a 2-D one as long as the row.
    /// `argsort` needs whole rows: none.
    pub fn of(op: &Op, src: &[&Tensor]) -> Option<RowReduce> {
        Some(match op {
            Op::RmsNorm { eps } => RowReduce::RmsNorm { eps: *eps },
            Op::L2Norm { eps } => RowReduce::L2Norm { eps: *eps },
            Op::Norm { eps } => RowReduce::Norm { eps: *eps },
            Op::SoftMax { scale, max_bias } if *max_bias <= 0.0 && src.len() <= 2 => {
                let mask_2d =
                    |m: &&Tensor| m.ne[2] == 1 && m.ne[3] == 1 && src.first().is_some_and(|x| m.ne[0] == x.ne[0]);
                if !src.get(1).is_none_or(mask_2d) {
                    return None;
                }
                RowReduce::SoftMax { scale: *scale }
            }
            Op::Argmax => RowReduce::Argmax,
            Op::TopK { k } => RowReduce::TopK { k: *k },
            Op::SumRows => RowReduce::SumRows,
            Op::Mean => RowReduce::Mean,
            Op::Sum => RowReduce::Sum,
            // ALiBi or sinks; a sort.
            Op::SoftMax { .. } | Op::Argsort { .. } => return None,
            elementwise_ops!()
            | rope_ops!()
            | matmul_ops!()
            | attn_ops!()
            | data_ops!()
            | ssm_ops!()
            | distributed_ops!() => return None,
        })
    }

    /// True if the finish reads the local part of the row again (norms,
    /// soft_max); the others finish from the statistics alone.
    pub fn finishes_from_x(&self) -> bool {
        matches!(
            self,
            RowReduce::RmsNorm { .. } | RowReduce::L2Norm { .. } | RowReduce::Norm { .. } | RowReduce::SoftMax { .. }
        )
    }
}

impl Context {
    /// The tensor a collective fills: type `ty`, shape `ne`, reading `srcs`
    /// (kept alive until the collective ran). No kernel computes it.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] for a bad shape.
    pub(crate) fn exchange(&mut self, ty: GgmlType, ne: [i64; 4], srcs: &[TensorId]) -> Result<TensorId> {
        for &s in srcs {
            self.operand(s, "exchange", "src")?;
        }
        self.push_op(ty, ne, Op::Exchange, srcs)
    }

    /// Per-row statistics of this device's part `x` `[n, ne1, ne2, ne3]` of
    /// rows split on axis 0 (`ranges`: the global positions along the row
    /// the part holds, in its order) → F32 `[words, ne1·ne2·ne3]`
    /// (`[1, 1]` for [`RowReduce::Sum`]). `mask` (soft_max only): this
    /// device's part of a 2-D mask `[n, ≥ ne1]`, F16 or F32.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a non-F32 `x` (F16/BF16 are accepted
    /// for `sum`), a mask of another shape or type, or ranges that do not
    /// cover `n` positions.
    pub(crate) fn row_stats(
        &mut self,
        x: TensorId,
        mask: Option<TensorId>,
        reduce: RowReduce,
        ranges: Vec<(i64, i64)>,
    ) -> Result<TensorId> {
        let name = "row_stats";
        let tx = self.operand(x, name, "src0")?.clone();
        let float = matches!(tx.ty, GgmlType::F16 | GgmlType::BF16) && reduce == RowReduce::Sum;
        if tx.ty != GgmlType::F32 && !float {
            return Err(Error::operand(name, "src0", format!("{} for {}", tx.describe(), reduce.name())));
        }
        let held: i64 = ranges.iter().map(|&(a, b)| b - a).sum();
        if reduce != RowReduce::Sum && (held != tx.ne[0] || ranges.iter().any(|&(a, b)| a < 0 || b < a)) {
            return Err(Error::operand(name, "ranges", format!("{ranges:?} for a part of {} positions", tx.ne[0])));
        }
        let mut srcs = vec![x];
        if let Some(m) = mask {
            let tm = self.operand(m, name, "mask")?;
            let ok = matches!(reduce, RowReduce::SoftMax { .. })
                && matches!(tm.ty, GgmlType::F16 | GgmlType::F32)
                && tm.ne[0] == tx.ne[0]
                && tm.ne[1] >= tx.ne[1]
                && tm.ne[2] == 1
                && tm.ne[3] == 1;
            if !ok {
                return Err(Error::operand(name, "mask", format!("{} for src0 {}", tm.describe(), tx.describe())));
            }
            srcs.push(m);
        }
        let ne = match reduce {
            RowReduce::Sum => [1, 1, 1, 1],
            _ => [reduce.words() as i64, tx.nrows(), 1, 1],
        };
        self.push_op(GgmlType::F32, ne, Op::RowStats { reduce, ranges }, &srcs)
    }

    /// Finishes a distributed row op from `stats` F32 `[words, rows, N]`
    /// (every device's [`Context::row_stats`], in device order) into a
    /// result of type `ty` and shape `ne` (this device's part for norms and
    /// soft_max, the whole result for the others). `x` and `mask` are this
    /// device's inputs of the norms and soft_max; `lens` each device's part
    /// length along the row.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] when the statistics, inputs, lengths or
    /// result do not fit `reduce`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn row_finish(
        &mut self,
        stats: TensorId,
        x: Option<TensorId>,
        mask: Option<TensorId>,
        reduce: RowReduce,
        lens: Vec<i64>,
        ty: GgmlType,
        ne: [i64; 4],
    ) -> Result<TensorId> {
        let name = "row_finish";
        let ts = self.operand(stats, name, "stats")?.clone();
        if ts.ty != GgmlType::F32 || ts.ne[0] != reduce.words() as i64 || ts.ne[2] != lens.len() as i64 {
            return Err(Error::operand(
                name,
                "stats",
                format!("{} for {} over {} devices", ts.describe(), reduce.name(), lens.len()),
            ));
        }
        let mut srcs = vec![stats];
        match (reduce.finishes_from_x(), x) {
            (true, Some(x)) => {
                let tx = self.operand(x, name, "src1")?;
                if tx.ne != ne || tx.ty != GgmlType::F32 || ty != GgmlType::F32 || tx.nrows() != ts.ne[1] {
                    return Err(Error::operand(name, "src1", format!("{} for a result {ty}{ne:?}", tx.describe())));
                }
                srcs.push(x);
            }
            (false, None) => {}
            _ => {
                return Err(Error::operand(
                    name,
                    "src1",
                    format!("{} needs its input iff it rescales it", reduce.name()),
                ))
            }
        }
        if let Some(m) = mask {
            if !matches!(reduce, RowReduce::SoftMax { .. }) {
                return Err(Error::operand(name, "mask", "only soft_max takes a mask"));
            }
            let tm = self.operand(m, name, "mask")?;
            if tm.ne[0] != ne[0] || tm.ne[1] < ne[1] || !matches!(tm.ty, GgmlType::F16 | GgmlType::F32) {
                return Err(Error::operand(name, "mask", format!("{} for a result {ne:?}", tm.describe())));
            }
            srcs.push(m);
        }
        self.push_op(ty, ne, Op::RowFinish { reduce, lens }, &srcs)
    }

    /// The element-wise sum of `srcs` (at least one; all of one type and
    /// shape, contiguous): F32/F16/BF16 accumulated in f32 in source order
    /// and rounded once, I32/I64 exactly (wrapping).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for no sources, mixed types or shapes, a
    /// non-contiguous source, or another type.
    pub(crate) fn add_n(&mut self, srcs: &[TensorId]) -> Result<TensorId> {
        let name = "add_n";
        let first = self
            .operand(*srcs.first().ok_or_else(|| Error::operand(name, "src", "no addends"))?, name, "src0")?
            .clone();
        if !matches!(first.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::I32 | GgmlType::I64) {
            return Err(Error::operand(name, "src0", format!("{} cannot be summed", first.describe())));
        }
        for &s in srcs {
            let t = self.operand(s, name, "src")?;
            if t.ty != first.ty || t.ne != first.ne || !t.is_contiguous() {
                return Err(Error::operand(name, "src", format!("{} with {}", t.describe(), first.describe())));
            }
        }
        self.push_op(first.ty, first.ne, Op::AddN, srcs)
    }

    /// `get_rows(table, ids)` where `table` holds only the global rows
    /// `ranges` (in order) of a table of `n_rows` rows: ids it does not hold
    /// give zero rows. Shapes as [`Context::get_rows`] with the local table;
    /// the result is F32 `[ne0, n, ne2, ne3]`.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] as [`Context::get_rows`], or for ranges that
    /// do not match the table's rows or lie outside `0..n_rows`.
    pub(crate) fn get_rows_part(
        &mut self,
        table: TensorId,
        ids: TensorId,
        ranges: Vec<(i64, i64)>,
        n_rows: i64,
    ) -> Result<TensorId> {
        let name = "get_rows_part";
        let ta = self.operand(table, name, "src0")?.clone();
        let tb = self.operand(ids, name, "src1")?.clone();
        let held: i64 = ranges.iter().map(|&(a, b)| b - a).sum();
        if held != ta.ne[1] || ranges.iter().any(|&(a, b)| a < 0 || b < a || b > n_rows) {
            return Err(Error::operand(name, "ranges", format!("{ranges:?} of {n_rows} rows for {}", ta.describe())));
        }
        if !matches!(tb.ty, GgmlType::I32 | GgmlType::I64)
            || ta.ne[2] != tb.ne[1]
            || ta.ne[3] != tb.ne[2]
            || tb.ne[3] != 1
        {
            return Err(Error::operand(name, "src1", format!("{} for table {}", tb.describe(), ta.describe())));
        }
        let loadable = matches!(ta.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
            || (ta.ty.is_quantized() && !matches!(ta.ty, GgmlType::Q8_1 | GgmlType::Q8_K) && ta.is_contiguous_rows());
        if !loadable {
            return Err(Error::operand(name, "src0", format!("type {} not supported ({})", ta.ty, ta.describe())));
        }
        let ne = [ta.ne[0], tb.ne[0], tb.ne[1], tb.ne[2]];
        self.push_op(GgmlType::F32, ne, Op::GetRowsPart { ranges, n_rows }, &[table, ids])
    }
}

/// Local position of global index `x` in a part holding `ranges` (the
/// `[start, end)` ranges of a split axis, in the order the part stores
/// them), or `None` where the part does not hold it.
pub(crate) fn local_pos(ranges: &[(i64, i64)], x: i64) -> Option<i64> {
    let mut base = 0;
    for &(s, e) in ranges {
        if x >= s && x < e {
            return Some(base + x - s);
        }
        base += e - s;
    }
    None
}

/// Global index of local position `i` of a part holding `ranges` (the
/// inverse of [`local_pos`]), or −1 past the part's end.
pub(crate) fn global_pos(ranges: &[(i64, i64)], mut i: usize) -> i64 {
    for &(a, b) in ranges {
        let n = (b - a) as usize;
        if i < n {
            return a + i as i64;
        }
        i -= n;
    }
    -1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::err_names;

    #[test]
    fn shapes_and_checks() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(GgmlType::F32, 6, 3).unwrap();
        let s = ctx.row_stats(x, None, RowReduce::TopK { k: 2 }, vec![(4, 10)]).unwrap();
        assert_eq!(ctx.tensor(s).unwrap().ne, [4, 3, 1, 1]);
        err_names(ctx.row_stats(x, None, RowReduce::Argmax, vec![(0, 5)]), "row_stats", "ranges");
        let g = ctx.new_tensor_3d(GgmlType::F32, 4, 3, 2).unwrap();
        let f =
            ctx.row_finish(g, None, None, RowReduce::TopK { k: 2 }, vec![6, 4], GgmlType::I32, [2, 3, 1, 1]).unwrap();
        assert_eq!(ctx.tensor(f).unwrap().ty, GgmlType::I32);
        err_names(
            ctx.row_finish(g, None, None, RowReduce::TopK { k: 2 }, vec![6], GgmlType::I32, [2, 3, 1, 1]),
            "row_finish",
            "stats",
        );
        let tab = ctx.new_tensor_2d(GgmlType::F32, 8, 5).unwrap();
        let ids = ctx.new_tensor_1d(GgmlType::I32, 3).unwrap();
        let r = ctx.get_rows_part(tab, ids, vec![(0, 2), (7, 10)], 10).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().ne, [8, 3, 1, 1]);
        err_names(ctx.get_rows_part(tab, ids, vec![(0, 5)], 4), "get_rows_part", "ranges");
    }
}
