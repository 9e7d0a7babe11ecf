//! `kernels-cuda/softmax.cu`: `soft_max` (F32 input, F32/F16 mask or none,
//! ALiBi, optional F32 sinks), `argmax` and `top_k` over F32 rows of any
//! strides, one block per row.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::Op;
use crate::tensor::GgmlType::{F16, F32, I32};

const B: u32 = 256;

/// Grid of the file's row launch: one block per row (grid-stride beyond).
fn grid(cx: &Cx, rows: i64) -> [u32; 3] {
    [cx.blocks(rows, 1, i32::MAX as u32), 1, 1]
}

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    let Some(a) = src.first() else { return Ok(false) };
    if a.ty() != F32 {
        return Ok(false);
    }
    match op {
        Op::SoftMax { scale, max_bias } => soft_max(cx, *scale, *max_bias, dst, a, src.get(1), src.get(2)),
        Op::Argmax => {
            if dst.ty() != I32 || a.t.ne[2] != 1 || a.t.ne[3] != 1 || dst.t.ne != [a.t.ne[1], 1, 1, 1] {
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
        Op::TopK { k } => {
            let k = i64::from(*k);
            if dst.ty() != I32
                || k < 0
                || k > a.t.ne[0]
                || a.t.ne[0] > u32::MAX as i64
                || dst.t.ne != [k, a.t.ne[1], a.t.ne[2], a.t.ne[3]]
            {
                return Ok(false);
            }
            let mut args = vec![a.ptr(), dst.ptr()];
            args.extend(a.ne());
            args.extend(a.nb());
            args.push(KArg::I64(k));
            args.extend(dst.nb());
            cx.launch("sg_top_k_f32", grid(cx, a.nrows()), [B, 1, 1], &args)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// `soft_max_ext`: the mask (if any) must cover every row of `a` (ggml's
/// `ne11 >= ne01`, `ne10 == ne00`) and broadcast over dims 2 and 3; sinks are
/// a contiguous F32 vector with one logit per head (`ne02`).
fn soft_max(cx: &Cx, scale: f32, max_bias: f32, dst: &T, a: &T, mask: Option<&T>, sinks: Option<&T>) -> Result<bool> {
    if dst.ty() != F32 || dst.t.ne != a.t.ne {
        return Ok(false);
    }
    let name = match mask.map(|m| m.ty()) {
        None | Some(F32) => "sg_soft_max_f32",
        Some(F16) => "sg_soft_max_f32_mask_f16",
        Some(_) => return Ok(false),
    };
    if let Some(m) = mask {
        if m.t.ne[0] != a.t.ne[0]
            || m.t.ne[1] < a.t.ne[1]
            || m.t.ne[2] <= 0
            || m.t.ne[3] <= 0
            || a.t.ne[2] % m.t.ne[2] != 0
            || a.t.ne[3] % m.t.ne[3] != 0
        {
            return Ok(false);
        }
    }
    if let Some(s) = sinks {
        if s.ty() != F32 || s.t.nb[0] != 4 || s.t.ne[0] < a.t.ne[2] {
            return Ok(false);
        }
    }
    let null = KArg::Ptr(0);
    let mut args = vec![a.ptr(), mask.map_or(null, T::ptr), sinks.map_or(null, T::ptr), dst.ptr()];
    args.extend(a.ne());
    args.extend(a.nb());
    let (ne12, ne13, nb1x) = match mask {
        Some(m) => (m.t.ne[2], m.t.ne[3], m.nb()),
        None => (1, 1, [KArg::I64(0); 4]),
    };
    args.push(KArg::I64(ne12));
    args.push(KArg::I64(ne13));
    args.extend(nb1x);
    args.extend(dst.nb());
    args.push(KArg::F32(scale));
    args.push(KArg::F32(max_bias));
    cx.launch(name, grid(cx, a.nrows()), [B, 1, 1], &args)?;
    Ok(true)
}
