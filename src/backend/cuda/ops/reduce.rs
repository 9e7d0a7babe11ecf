//! The reduce family, over rows of any strides.
//!
//! - `kernels-cuda/reduce.cu`: `sum` (F32/F16/BF16), `sum_rows` and `mean`
//!   (F32) and `argsort` (F32 → I32).
//! - `kernels-cuda/softmax.cu`: `argmax` and `top_k` (F32 → I32), one block
//!   per row.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{ops_outside, Op, SortOrder};
use crate::tensor::GgmlType::{BF16, F16, F32, I32};

const B: u32 = 256;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    let Some(a) = src.first() else { return Ok(false) };
    match op {
        Op::Sum => sum(cx, dst, a),
        Op::SumRows => sum_rows(cx, "sg_sum_rows_f32", dst, a),
        Op::Mean => sum_rows(cx, "sg_mean_f32", dst, a),
        Op::Argsort { order } => argsort(cx, *order, dst, a),
        Op::Argmax => argmax(cx, dst, a),
        Op::TopK { k } => top_k(cx, i64::from(*k), dst, a),
        // Not a reduce op: `ops::run` routes none here.
        ops_outside!(reduce) => Ok(false),
    }
}

/// Grid of the row launches: one block per row (grid-stride beyond).
fn grid(cx: &Cx, rows: i64) -> [u32; 3] {
    [cx.blocks(rows, 1, i32::MAX as u32), 1, 1]
}

/// The arguments the reduce.cu kernels start with: both pointers, then
/// src0's `ne` and `nb`.
fn head_args(a: &T, dst: &T) -> Vec<KArg> {
    let mut args = vec![a.ptr(), dst.ptr()];
    args.extend(a.ne());
    args.extend(a.nb());
    args
}

fn sum(cx: &Cx, dst: &T, a: &T) -> Result<bool> {
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
    cx.launch(name, [1, 1, 1], [B, 1, 1], &head_args(a, dst))?;
    Ok(true)
}

/// `sum_rows` or `mean` (kernel `name`) of an F32 src0.
fn sum_rows(cx: &Cx, name: &str, dst: &T, a: &T) -> Result<bool> {
    if a.ty() != F32 || dst.ty() != F32 || dst.t.ne != [1, a.t.ne[1], a.t.ne[2], a.t.ne[3]] {
        return Ok(false);
    }
    let mut args = head_args(a, dst);
    args.extend(dst.nb());
    cx.launch(name, grid(cx, a.nrows()), [B, 1, 1], &args)?;
    Ok(true)
}

fn argsort(cx: &Cx, order: SortOrder, dst: &T, a: &T) -> Result<bool> {
    if a.ty() != F32 || dst.ty() != I32 || dst.t.ne != a.t.ne || a.t.ne[0] > i32::MAX as i64 {
        return Ok(false);
    }
    let mut args = head_args(a, dst);
    args.extend(dst.nb());
    args.push(KArg::I32(match order {
        SortOrder::Asc => 0,
        SortOrder::Desc => 1,
    }));
    cx.launch("sg_argsort_f32", grid(cx, a.nrows()), [B, 1, 1], &args)?;
    Ok(true)
}

fn argmax(cx: &Cx, dst: &T, a: &T) -> Result<bool> {
    if a.ty() != F32 || dst.ty() != I32 || a.t.ne[2] != 1 || a.t.ne[3] != 1 || dst.t.ne != [a.t.ne[1], 1, 1, 1] {
        return Ok(false);
    }
    let args = [
        a.ptr(),
        dst.ptr(),
        KArg::I64(a.t.ne[0]),
        KArg::I64(a.t.ne[1]),
        KArg::I64(a.t.nb[0] as i64),
        KArg::I64(a.t.nb[1] as i64),
        KArg::I64(dst.t.nb[0] as i64),
    ];
    cx.launch("sg_argmax_f32", grid(cx, a.t.ne[1]), [B, 1, 1], &args)?;
    Ok(true)
}

fn top_k(cx: &Cx, k: i64, dst: &T, a: &T) -> Result<bool> {
    if a.ty() != F32
        || dst.ty() != I32
        || k < 0
        || k > a.t.ne[0]
        || a.t.ne[0] > u32::MAX as i64
        || dst.t.ne != [k, a.t.ne[1], a.t.ne[2], a.t.ne[3]]
    {
        return Ok(false);
    }
    let mut args = head_args(a, dst);
    args.push(KArg::I64(k));
    args.extend(dst.nb());
    cx.launch("sg_top_k_f32", grid(cx, a.nrows()), [B, 1, 1], &args)?;
    Ok(true)
}
