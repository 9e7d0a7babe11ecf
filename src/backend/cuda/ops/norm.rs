//! `kernels-cuda/norm.cu`: `rms_norm`, `norm` and `l2_norm` over F32 rows
//! of any strides (one block per row, f64 sums as ggml's CPU).

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::Op;
use crate::tensor::GgmlType::F32;

const B: u32 = 256;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    let (name, eps) = match op {
        Op::RmsNorm { eps } => ("sg_rms_norm_f32", *eps),
        Op::Norm { eps } => ("sg_norm_f32", *eps),
        Op::L2Norm { eps } => ("sg_l2_norm_f32", *eps),
        _ => return Ok(false),
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
    cx.launch(name, [cx.blocks(dst.nrows(), 1, i32::MAX as u32), 1, 1], [B, 1, 1], &args)?;
    Ok(true)
}
