//! `kernels-cuda/concat_repeat_pad.cu`: `concat`, `repeat` and `pad`, which
//! only move elements: the `_f32` kernels serve every 4-byte type (F32,
//! I32) and the `_f16` kernels every 2-byte type (F16, BF16, I16).

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::Op;

const B: u32 = 256;

/// Kernel suffix of the element size of a non-block type.
fn suffix(t: &T) -> Option<&'static str> {
    if t.ty().block_size() != 1 {
        return None;
    }
    match t.ty().type_size() {
        4 => Some("f32"),
        2 => Some("f16"),
        _ => None,
    }
}

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    let Some(a) = src.first() else { return Ok(false) };
    if a.ty() != dst.ty() {
        return Ok(false);
    }
    let Some(sfx) = suffix(dst) else { return Ok(false) };
    let (ne, ane) = (dst.t.ne, a.t.ne);
    // The file's row launch over the destination.
    let grid = [cx.blocks(ne[0], B as i64, 1024), cx.blocks(dst.nrows(), 1, 65535), 1];
    let mut args = Vec::with_capacity(32);
    let name = match op {
        Op::Concat { dim } => {
            let Some(b) = src.get(1) else { return Ok(false) };
            let d = *dim;
            if d > 3 || b.ty() != dst.ty() {
                return Ok(false);
            }
            let fits = |k: usize| {
                if k == d {
                    ne[k] == ane[k] + b.t.ne[k]
                } else {
                    ne[k] == ane[k] && ne[k] == b.t.ne[k]
                }
            };
            if !(0..4).all(fits) {
                return Ok(false);
            }
            args.extend([a.ptr(), b.ptr(), dst.ptr()]);
            args.extend(dst.ne());
            args.extend(a.ne());
            args.extend(a.nb());
            args.extend(b.nb());
            args.extend(dst.nb());
            args.push(KArg::I32(d as i32));
            format!("sg_concat_{sfx}")
        }
        Op::Repeat => {
            if (0..4).any(|k| ane[k] <= 0 || ne[k] % ane[k] != 0) {
                return Ok(false);
            }
            args.extend([a.ptr(), dst.ptr()]);
            args.extend(dst.ne().into_iter().chain(a.ne()).chain(a.nb()).chain(dst.nb()));
            format!("sg_repeat_{sfx}")
        }
        Op::Pad { lp, rp } => {
            if (0..4).any(|k| lp[k] < 0 || rp[k] < 0 || ne[k] != ane[k] + i64::from(lp[k]) + i64::from(rp[k])) {
                return Ok(false);
            }
            args.extend([a.ptr(), dst.ptr()]);
            args.extend(dst.ne().into_iter().chain(a.ne()).chain(a.nb()).chain(dst.nb()));
            for k in 0..4 {
                args.push(KArg::I32(lp[k]));
                args.push(KArg::I32(rp[k]));
            }
            args.push(KArg::I32(0)); // zero padding (not circular)
            format!("sg_pad_{sfx}")
        }
        _ => return Ok(false),
    };
    cx.launch(&name, grid, [B, 1, 1], &args)?;
    Ok(true)
}
