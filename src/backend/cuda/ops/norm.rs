//! The norm family: row normalisations over F32 rows of any strides, one
//! block per row.
//!
//! - `kernels-cuda/norm.cu`: `rms_norm`, `norm` and `l2_norm` (f64 sums as
//!   ggml's CPU).
//! - `kernels-cuda/softmax.cu`: `soft_max` (F32 input, F32/F16 mask or none,
//!   ALiBi, optional F32 sinks).

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{ops_outside, Op};
use crate::tensor::GgmlType::{F16, F32};

const B: u32 = 256;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    let (name, eps) = match op {
        Op::RmsNorm { eps } => ("sg_rms_norm_f32", *eps),
        Op::Norm { eps } => ("sg_norm_f32", *eps),
        Op::L2Norm { eps } => ("sg_l2_norm_f32", *eps),
        Op::SoftMax { scale, max_bias } => {
            let Some(a) = src.first() else { return Ok(false) };
            return soft_max(cx, *scale, *max_bias, dst, a, src.get(1), src.get(2));
        }
        // Not a norm op: `ops::run` routes none here.
        ops_outside!(norm) => return Ok(false),
    };
    let Some(s) = src.first() else { return Ok(false) };
    if s.ty() != F32 || dst.ty() != F32 || s.t.ne != dst.t.ne {
        return Ok(false);
    }
    let mut args = vec![s.ptr(), dst.ptr()];
    args.extend(dst.ne());
    args.extend(s.nb());
    args.extend(dst.nb());
    args.push(KArg::F32(eps));
    cx.launch(name, grid(cx, dst.nrows()), [B, 1, 1], &args)?;
    Ok(true)
}

/// Grid of the row launches: one block per row (grid-stride beyond).
fn grid(cx: &Cx, rows: i64) -> [u32; 3] {
    [cx.blocks(rows, 1, i32::MAX as u32), 1, 1]
}

/// `soft_max_ext`: the mask (if any) must cover every row of `a` (ggml's
/// `ne11 >= ne01`, `ne10 == ne00`) and broadcast over dims 2 and 3; sinks are
/// a contiguous F32 vector with one logit per head (`ne02`).
fn soft_max(cx: &Cx, scale: f32, max_bias: f32, dst: &T, a: &T, mask: Option<&T>, sinks: Option<&T>) -> Result<bool> {
    if a.ty() != F32 || dst.ty() != F32 || dst.t.ne != a.t.ne {
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
