//! `kernels-cuda/elementwise.cu`: binary ops with broadcasting, unary ops,
//! scale, clamp, fill, and copies between F32 and F16 (cpy, dup, cont).

use super::{Cx, T};
use crate::error::Result;
use crate::ops::{Op, UnaryOp};
use crate::tensor::GgmlType::{self, F16, F32};

const B: u32 = 256;

/// The "row launch" of the file: x strides over `ne0`, y over the rows.
fn row_grid(cx: &Cx, t: &T) -> [u32; 3] {
    [cx.blocks(t.t.ne[0], B as i64, 1024), cx.blocks(t.nrows(), 1, 65535), 1]
}

fn suffix(ty: GgmlType) -> Option<&'static str> {
    match ty {
        F32 => Some("f32"),
        F16 => Some("f16"),
        _ => None,
    }
}

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match op {
        Op::Add | Op::Sub | Op::Mul | Op::Div => {
            let (a, b) = (&src[0], &src[1]);
            if a.ty() != F32 || b.ty() != F32 || dst.ty() != F32 {
                return Ok(false);
            }
            if (0..4).any(|k| b.t.ne[k] <= 0 || a.t.ne[k] % b.t.ne[k] != 0) {
                return Ok(false);
            }
            let name = match op {
                Op::Add => "sg_add_f32",
                Op::Sub => "sg_sub_f32",
                Op::Mul => "sg_mul_f32",
                _ => "sg_div_f32",
            };
            let mut args = vec![a.ptr(), b.ptr(), dst.ptr()];
            args.extend(dst.ne());
            args.extend(a.nb());
            args.extend(b.ne());
            args.extend(b.nb());
            args.extend(dst.nb());
            cx.launch(name, row_grid(cx, dst), [B, 1, 1], &args)?;
            Ok(true)
        }
        Op::Unary(_) | Op::Sqr | Op::Sqrt | Op::Scale { .. } | Op::Clamp { .. } => {
            let s = &src[0];
            if s.ty() != dst.ty() || s.t.ne != dst.t.ne {
                return Ok(false);
            }
            let Some(sfx) = suffix(dst.ty()) else { return Ok(false) };
            let (base, extra): (&str, Vec<super::KArg>) = match op {
                Op::Unary(u) => (
                    match (u, dst.ty()) {
                        // ggml's CPU evaluates these through its F16 tables.
                        (UnaryOp::Gelu, F32) => "gelu_lut",
                        (UnaryOp::GeluQuick, F32) => "gelu_quick_lut",
                        (u, _) => u.name(),
                    },
                    vec![],
                ),
                Op::Sqr => ("sqr", vec![]),
                Op::Sqrt => ("sqrt", vec![]),
                Op::Scale { s, b } if dst.ty() == F32 => ("scale", vec![super::KArg::F32(*s), super::KArg::F32(*b)]),
                Op::Clamp { min, max } => ("clamp", vec![super::KArg::F32(*min), super::KArg::F32(*max)]),
                _ => return Ok(false),
            };
            let name = format!("sg_{base}_{sfx}");
            let mut args = vec![s.ptr(), dst.ptr()];
            args.extend(dst.ne());
            args.extend(s.nb());
            args.extend(dst.nb());
            args.extend(extra);
            cx.launch(&name, row_grid(cx, dst), [B, 1, 1], &args)?;
            Ok(true)
        }
        Op::Fill { c } => {
            let Some(sfx) = suffix(dst.ty()) else { return Ok(false) };
            let mut args = vec![dst.ptr()];
            args.extend(dst.ne());
            args.extend(dst.nb());
            args.push(super::KArg::F32(*c));
            cx.launch(&format!("sg_fill_{sfx}"), row_grid(cx, dst), [B, 1, 1], &args)?;
            Ok(true)
        }
        Op::Dup | Op::Cont | Op::Cpy => {
            let s = &src[0];
            let (Some(from), Some(to)) = (suffix(s.ty()), suffix(dst.ty())) else { return Ok(false) };
            if s.nelements() != dst.nelements() {
                return Ok(false);
            }
            let mut args = vec![s.ptr(), dst.ptr()];
            args.extend(s.ne());
            args.extend(s.nb());
            args.extend(dst.ne());
            args.extend(dst.nb());
            let grid = [cx.blocks(s.nelements(), B as i64, 65535), 1, 1];
            cx.launch(&format!("sg_cpy_{from}_{to}"), grid, [B, 1, 1], &args)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}
