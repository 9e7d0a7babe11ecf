//! `kernels-cuda/glu.cu`: the gated linear units (`swiglu`, `geglu`) in
//! their fused (one tensor holding both halves, optionally swapped) and
//! split (two tensors) forms, F32 and F16, any strides.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{GluOp, Op};
use crate::tensor::GgmlType::{F16, F32};

const B: u32 = 256;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    let Op::Glu { op: g, swapped } = op else { return Ok(false) };
    let Some(a) = src.first() else { return Ok(false) };
    let sfx = match dst.ty() {
        F32 => "f32",
        F16 => "f16",
        _ => return Ok(false),
    };
    if a.ty() != dst.ty() || a.t.ne[1..] != dst.t.ne[1..] {
        return Ok(false);
    }
    // ggml-cpu computes GEGLU through its F16 table (with the F32 range
    // clamp), which the `_lut` kernel reproduces.
    let base = match g {
        GluOp::Swiglu => "swiglu",
        GluOp::Geglu => "geglu_lut",
    };
    let nc = dst.t.ne[0];
    let grid = [cx.blocks(nc, B as i64, 1024), cx.blocks(dst.nrows(), 1, 65535), 1];
    match src.get(1) {
        Some(b) => {
            if b.ty() != dst.ty() || a.t.ne != dst.t.ne || b.t.ne != dst.t.ne {
                return Ok(false);
            }
            let mut args = vec![a.ptr(), b.ptr(), dst.ptr()];
            args.extend(dst.ne());
            args.extend(a.nb());
            args.extend(b.nb());
            args.extend(dst.nb());
            cx.launch(&format!("sg_{base}_split_{sfx}"), grid, [B, 1, 1], &args)?;
        }
        None => {
            if a.t.ne[0] / 2 != nc {
                return Ok(false);
            }
            let mut args = vec![a.ptr(), dst.ptr()];
            args.extend(dst.ne());
            args.extend(a.nb());
            args.extend(dst.nb());
            args.push(KArg::I32(i32::from(*swapped)));
            cx.launch(&format!("sg_{base}_{sfx}"), grid, [B, 1, 1], &args)?;
        }
    }
    Ok(true)
}
