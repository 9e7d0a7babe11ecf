//! `kernels-cuda/reduce.cu`: `sum` (F32/F16/BF16), `sum_rows` and `mean`
//! (F32) and `argsort` (F32 → I32), any strides.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{Op, SortOrder};
use crate::tensor::GgmlType::{BF16, F16, F32, I32};

const B: u32 = 256;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    let Some(a) = src.first() else { return Ok(false) };
    let mut args = vec![a.ptr(), dst.ptr()];
    args.extend(a.ne());
    args.extend(a.nb());
    let rows = [cx.blocks(a.nrows(), 1, i32::MAX as u32), 1, 1];
    match op {
        Op::Sum => {
            let name = match a.ty() {
                F32 => "sg_sum_f32",
                F16 => "sg_sum_f16",
                BF16 => "sg_sum_bf16",
                _ => return Ok(false),
            };
            if dst.ty() != a.ty() || dst.nelements() != 1 {
                return Ok(false);
            }
            // One block sums the whole tensor (the kernel's contract).
            cx.launch(name, [1, 1, 1], [B, 1, 1], &args)?;
        }
        Op::SumRows | Op::Mean => {
            if a.ty() != F32 || dst.ty() != F32 || dst.t.ne != [1, a.t.ne[1], a.t.ne[2], a.t.ne[3]] {
                return Ok(false);
            }
            args.extend(dst.nb());
            let name = if matches!(op, Op::Mean) { "sg_mean_f32" } else { "sg_sum_rows_f32" };
            cx.launch(name, rows, [B, 1, 1], &args)?;
        }
        Op::Argsort { order } => {
            if a.ty() != F32 || dst.ty() != I32 || dst.t.ne != a.t.ne || a.t.ne[0] > i32::MAX as i64 {
                return Ok(false);
            }
            args.extend(dst.nb());
            args.push(KArg::I32(match order {
                SortOrder::Asc => 0,
                SortOrder::Desc => 1,
            }));
            cx.launch("sg_argsort_f32", rows, [B, 1, 1], &args)?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}
