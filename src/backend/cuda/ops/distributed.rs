//! `kernels-cuda/distributed.cu`: the meta backend's ops — `row_stats` and
//! `row_finish` (distributed row ops over F32 rows), `get_rows_part`
//! (F32, F16, BF16 and block-quantized tables; I32 or I64 ids) and `add_n`
//! (F32, F16, BF16, I32, I64). A node these kernels do not cover (a part
//! holding more than 4 ranges of a row, more than 8 devices, more than 8
//! addends) runs on the host like any node without a kernel.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{ops_outside, Op, RowReduce};
use crate::tensor::GgmlType::{BF16, F16, F32, I32, I64};

const B: u32 = 256;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match op {
        Op::RowStats { reduce, ranges } => row_stats(cx, *reduce, ranges, dst, src),
        Op::RowFinish { reduce, lens } => row_finish(cx, *reduce, lens, dst, src),
        Op::GetRowsPart { ranges, n_rows } => get_rows_part(cx, ranges, *n_rows, dst, src),
        Op::AddN => add_n(cx, dst, src),
        // `exchange`: the executor fills it between local graphs; a backend
        // never runs it. No other family is routed here (`ops::run`).
        Op::Exchange | ops_outside!(distributed) => Ok(false),
    }
}

/// Up to four ranges as kernel arguments (empty ones as 0, 0).
fn ranges_args(ranges: &[(i64, i64)]) -> Option<Vec<KArg>> {
    if ranges.len() > 4 {
        return None;
    }
    let mut v = Vec::with_capacity(8);
    for r in 0..4 {
        let (a, b) = ranges.get(r).copied().unwrap_or((0, 0));
        v.push(KArg::I64(a));
        v.push(KArg::I64(b));
    }
    Some(v)
}

/// A mask operand: (pointer, F16?, row stride), or none.
fn mask_args(mask: Option<&T>) -> Option<(KArg, i32, i64)> {
    match mask {
        None => Some((KArg::Ptr(0), 0, 0)),
        Some(m) if matches!(m.ty(), F16 | F32) && m.t.nb[0] == m.ty().type_size() => {
            Some((m.ptr(), i32::from(m.ty() == F16), m.t.nb[1] as i64))
        }
        Some(_) => None,
    }
}

fn row_stats(cx: &Cx, reduce: RowReduce, ranges: &[(i64, i64)], dst: &T, src: &[T]) -> Result<bool> {
    let Some(x) = src.first() else { return Ok(false) };
    if reduce == RowReduce::Sum {
        let ty = match x.ty() {
            F32 => 0,
            F16 => 1,
            BF16 => 2,
            _ => return Ok(false),
        };
        let mut args = vec![x.ptr(), KArg::I32(ty), dst.ptr()];
        args.extend(x.ne());
        args.extend(x.nb());
        cx.launch("sg_sum_all", [1, 1, 1], [B, 1, 1], &args)?;
        return Ok(true);
    }
    let kind = match reduce {
        RowReduce::RmsNorm { .. } | RowReduce::L2Norm { .. } => 0,
        RowReduce::SumRows | RowReduce::Mean => 1,
        RowReduce::Norm { .. } => 2,
        RowReduce::SoftMax { .. } => 3,
        RowReduce::Argmax => 4,
        RowReduce::TopK { .. } => 5,
        RowReduce::Sum => return Ok(false),
    };
    let (Some(rg), Some((mp, mf16, mnb))) = (ranges_args(ranges), mask_args(src.get(1))) else { return Ok(false) };
    let contiguous = dst.t.is_contiguous() && dst.ty() == F32;
    if x.ty() != F32 || !contiguous || ranges.iter().map(|&(a, b)| b - a).sum::<i64>() != x.t.ne[0] {
        return Ok(false);
    }
    let (scale, k) = match reduce {
        RowReduce::SoftMax { scale } => (scale, 0),
        RowReduce::TopK { k } => (1.0, i64::from(k)),
        _ => (1.0, 0),
    };
    let mut args = vec![x.ptr(), mp, KArg::I32(mf16), dst.ptr()];
    args.extend(x.ne());
    args.extend(x.nb());
    args.push(KArg::I64(mnb));
    args.extend([KArg::I32(kind), KArg::F32(scale), KArg::I64(k)]);
    args.extend(rg);
    cx.launch("sg_row_stats_f32", [cx.blocks(x.nrows(), 1, i32::MAX as u32), 1, 1], [B, 1, 1], &args)?;
    Ok(true)
}

fn row_finish(cx: &Cx, reduce: RowReduce, lens: &[i64], dst: &T, src: &[T]) -> Result<bool> {
    let Some(g) = src.first() else { return Ok(false) };
    if lens.len() > 8 || g.ty() != F32 || !g.t.is_contiguous() {
        return Ok(false);
    }
    let (rows, ndev, w) = (g.t.ne[1], g.t.ne[2], g.t.ne[0]);
    let n_global: i64 = lens.iter().sum();
    let (kind, eps, scale, k) = match reduce {
        RowReduce::RmsNorm { eps } => (0, eps, 1.0, 0),
        RowReduce::L2Norm { eps } => (1, eps, 1.0, 0),
        RowReduce::Norm { eps } => (2, eps, 1.0, 0),
        RowReduce::SoftMax { scale } => (3, 0.0, scale, 0),
        RowReduce::Argmax => (4, 0.0, 1.0, 0),
        RowReduce::TopK { k } => (5, 0.0, 1.0, i64::from(k)),
        RowReduce::SumRows => (6, 0.0, 1.0, 0),
        RowReduce::Mean => (7, 0.0, 1.0, 0),
        RowReduce::Sum => {
            let ty = match dst.ty() {
                F32 => 0,
                F16 => 1,
                BF16 => 2,
                _ => return Ok(false),
            };
            (8, 0.0, 1.0, ty)
        }
    };
    // The tensor the rows are laid out in: x for the norms and soft_max, dst otherwise.
    let x = if reduce.finishes_from_x() { src.get(1) } else { None };
    let shape = x.unwrap_or(dst);
    let ok = match kind {
        0..=3 => x.is_some_and(|x| x.ty() == F32) && dst.ty() == F32,
        4 => dst.ty() == I32 && dst.t.ne[0] == rows,
        5 => dst.ty() == I32,
        6 | 7 => dst.ty() == F32,
        _ => true,
    };
    let Some((mp, mf16, mnb)) = mask_args(src.get(2)) else { return Ok(false) };
    if !ok {
        return Ok(false);
    }
    let mut args = vec![g.ptr(), x.map_or(KArg::Ptr(0), |x| x.ptr()), mp, KArg::I32(mf16), dst.ptr()];
    args.extend([KArg::I64(rows), KArg::I64(ndev), KArg::I64(w)]);
    args.extend(shape.ne());
    args.extend(shape.nb());
    args.push(KArg::I64(mnb));
    args.extend(dst.nb());
    args.extend([KArg::I32(kind), KArg::F32(eps), KArg::F32(scale), KArg::I64(k), KArg::I64(n_global)]);
    args.extend((0..8).map(|d| KArg::I64(lens.get(d).copied().unwrap_or(0))));
    cx.launch("sg_row_finish_f32", [cx.blocks(rows, 1, i32::MAX as u32), 1, 1], [B, 1, 1], &args)?;
    Ok(true)
}

fn get_rows_part(cx: &Cx, ranges: &[(i64, i64)], n_rows: i64, dst: &T, src: &[T]) -> Result<bool> {
    let (Some(a), Some(idx)) = (src.first(), src.get(1)) else { return Ok(false) };
    let (Some(t), Some(rg)) = (super::float_suffix(a.ty()), ranges_args(ranges)) else { return Ok(false) };
    let ix = match idx.ty() {
        I32 => "i32",
        I64 => "i64",
        _ => return Ok(false),
    };
    if dst.ty() != F32 {
        return Ok(false);
    }
    let Some((mut args, grid)) = super::data::get_rows_args(cx, dst, a, idx, n_rows, 1, "src0 part")? else {
        return Ok(false);
    };
    args.extend(rg);
    cx.launch(&format!("sg_get_rows_part_{t}_{ix}"), grid, [B, 1, 1], &args)?;
    Ok(true)
}

fn add_n(cx: &Cx, dst: &T, src: &[T]) -> Result<bool> {
    let name = match dst.ty() {
        F32 => "sg_add_n_f32",
        F16 => "sg_add_n_f16",
        BF16 => "sg_add_n_bf16",
        I32 => "sg_add_n_i32",
        I64 => "sg_add_n_i64",
        _ => return Ok(false),
    };
    let ok = !src.is_empty()
        && src.len() <= 8
        && dst.t.is_contiguous()
        && src.iter().all(|s| s.ty() == dst.ty() && s.t.ne == dst.t.ne && s.t.is_contiguous());
    if !ok {
        return Ok(false);
    }
    let n = dst.nelements();
    let mut args = vec![dst.ptr(), KArg::I64(n), KArg::I64(src.len() as i64)];
    args.extend((0..8).map(|i| src.get(i).map_or(KArg::Ptr(0), |s| s.ptr())));
    cx.launch(name, [cx.blocks(n, B as i64, i32::MAX as u32), 1, 1], [B, 1, 1], &args)?;
    Ok(true)
}
