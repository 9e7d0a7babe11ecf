//! The element-wise family.
//!
//! - `kernels-cuda/elementwise.cu`: binary ops with broadcasting (F32, F16,
//!   BF16 and their F32-src1 mixes; Q8_0/Q4_0 + F32), add1, unary ops (F32,
//!   F16, BF16), scale, clamp, fill.
//! - `kernels-cuda/glu.cu`: the gated linear units (`swiglu`, `geglu`) in
//!   their fused (one tensor holding both halves, optionally swapped) and
//!   split (two tensors) forms, F32 and F16, any strides.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{ops_outside, GluOp, Op, UnaryOp};
use crate::tensor::GgmlType::{self, BF16, F16, F32, Q4_0, Q8_0};

const B: u32 = 256;

/// The "row launch" of the file: x strides over `ne0`, y over the rows.
fn row_grid(cx: &Cx, t: &T) -> [u32; 3] {
    [cx.blocks(t.t.ne[0], B as i64, 1024), cx.blocks(t.nrows(), 1, 65535), 1]
}

/// The arguments of the binary kernels (broadcasting src1, as ggml's
/// binary ops): the three pointers, dst's ne, src0's nb, src1's ne and nb,
/// dst's nb — the order of `binary_t` in `elementwise.cu`.
fn binary_args(a: &T, b: &T, dst: &T) -> Vec<KArg> {
    let mut args = vec![a.ptr(), b.ptr(), dst.ptr()];
    args.extend(dst.ne());
    args.extend(a.nb());
    args.extend(b.ne());
    args.extend(b.nb());
    args.extend(dst.nb());
    args
}

fn suffix(ty: GgmlType) -> Option<&'static str> {
    match ty {
        F32 => Some("f32"),
        F16 => Some("f16"),
        _ => None,
    }
}

/// Kernel-name suffix of a binary / add1 source pair (dst has src0's type).
fn pair_suffix(a: GgmlType, b: GgmlType) -> Option<&'static str> {
    match (a, b) {
        (F32, F32) => Some("f32_f32"),
        (F16, F16) => Some("f16_f16"),
        (F16, F32) => Some("f16_f32"),
        (BF16, BF16) => Some("bf16_bf16"),
        (BF16, F32) => Some("bf16_f32"),
        _ => None,
    }
}

/// Unary functions with a BF16 kernel (`sg_<op>_bf16`): every one the
/// graph takes on BF16 (gelu, gelu_quick and silu are F32/F16 only, as in
/// ggml).
fn unary_has_bf16(u: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(u, Neg | Abs | Exp | Relu | Sigmoid | Tanh | Softplus)
}

/// True if src0 is a Q8_0 / Q4_0 tensor (`add` and `add1` by [`add_quant`]).
fn quant_src0(src: &[T]) -> bool {
    src.first().is_some_and(|a| matches!(a.ty(), Q8_0 | Q4_0))
}

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match op {
        Op::Add1 | Op::Add if quant_src0(src) => add_quant(cx, dst, src),
        Op::Add | Op::Sub | Op::Mul | Op::Div => binary(cx, op.name(), dst, src),
        Op::Add1 => add1(cx, dst, src),
        Op::Unary(u) => {
            let base = match (u, dst.ty()) {
                // ggml's CPU evaluates these through its F16 tables.
                (UnaryOp::Gelu, F32) => "gelu_lut",
                (UnaryOp::GeluQuick, F32) => "gelu_quick_lut",
                (u, _) => u.name(),
            };
            map(cx, base, unary_has_bf16(*u), vec![], dst, src)
        }
        Op::Sqr => map(cx, "sqr", true, vec![], dst, src),
        Op::Sqrt => map(cx, "sqrt", true, vec![], dst, src),
        Op::Scale { s, b } if dst.ty() == F32 => map(cx, "scale", false, vec![KArg::F32(*s), KArg::F32(*b)], dst, src),
        // `scale` of F16: the host runs it.
        Op::Scale { .. } => Ok(false),
        Op::Clamp { min, max } => map(cx, "clamp", false, vec![KArg::F32(*min), KArg::F32(*max)], dst, src),
        Op::Fill { c } => {
            let Some(sfx) = suffix(dst.ty()) else { return Ok(false) };
            let mut args = vec![dst.ptr()];
            args.extend(dst.ne());
            args.extend(dst.nb());
            args.push(KArg::F32(*c));
            cx.launch(&format!("sg_fill_{sfx}"), row_grid(cx, dst), [B, 1, 1], &args)?;
            Ok(true)
        }
        Op::Glu { op: g, swapped } => glu(cx, *g, *swapped, dst, src),
        // Not an element-wise op: `ops::run` routes none here.
        ops_outside!(elementwise) => Ok(false),
    }
}

/// `add`, `sub`, `mul` or `div` (`base`, the kernel's stem) with src1
/// broadcast over src0 (`sg_<base>_<pair>`).
fn binary(cx: &Cx, base: &str, dst: &T, src: &[T]) -> Result<bool> {
    let (Some(a), Some(b)) = (src.first(), src.get(1)) else { return Ok(false) };
    let Some(pair) = pair_suffix(a.ty(), b.ty()) else { return Ok(false) };
    if dst.ty() != a.ty() || a.t.ne != dst.t.ne {
        return Ok(false);
    }
    if (0..4).any(|k| b.t.ne[k] <= 0 || a.t.ne[k] % b.t.ne[k] != 0) {
        return Ok(false);
    }
    let name = if pair == "f32_f32" { format!("sg_{base}_f32") } else { format!("sg_{base}_{pair}") };
    let args = binary_args(a, b, dst);
    cx.launch(&name, row_grid(cx, dst), [B, 1, 1], &args)?;
    Ok(true)
}

/// `add1`: src0 plus the one value of src1 (`sg_add1_<pair>`).
fn add1(cx: &Cx, dst: &T, src: &[T]) -> Result<bool> {
    let (Some(a), Some(b)) = (src.first(), src.get(1)) else { return Ok(false) };
    let Some(pair) = pair_suffix(a.ty(), b.ty()) else { return Ok(false) };
    if dst.ty() != a.ty() || a.t.ne != dst.t.ne || b.nelements() != 1 {
        return Ok(false);
    }
    let mut args = vec![a.ptr(), b.ptr(), dst.ptr()];
    args.extend(dst.ne());
    args.extend(a.nb());
    args.extend(dst.nb());
    cx.launch(&format!("sg_add1_{pair}"), row_grid(cx, dst), [B, 1, 1], &args)?;
    Ok(true)
}

/// A one-source element-wise kernel `sg_<base>_<type>` (unary functions,
/// `sqr`, `sqrt`, `scale`, `clamp`) of src0's type and shape, `extra`
/// arguments after the strides; `bf16`: the kernel exists for BF16.
fn map(cx: &Cx, base: &str, bf16: bool, extra: Vec<KArg>, dst: &T, src: &[T]) -> Result<bool> {
    let Some(s) = src.first() else { return Ok(false) };
    if s.ty() != dst.ty() || s.t.ne != dst.t.ne {
        return Ok(false);
    }
    let sfx = match dst.ty() {
        BF16 if bf16 => "bf16",
        t => match suffix(t) {
            Some(x) => x,
            None => return Ok(false),
        },
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

/// `add` / `add1` of a Q8_0 / Q4_0 src0 (and dst) and an F32 src1: blocks
/// dequantized, src1 added, requantized (`sg_add_<q>_f32`).
fn add_quant(cx: &Cx, dst: &T, src: &[T]) -> Result<bool> {
    let (Some(a), Some(b)) = (src.first(), src.get(1)) else { return Ok(false) };
    let name = match a.ty() {
        Q8_0 => "sg_add_q8_0_f32",
        Q4_0 => "sg_add_q4_0_f32",
        _ => return Ok(false),
    };
    if b.ty() != F32
        || dst.ty() != a.ty()
        || a.t.ne != dst.t.ne
        || a.t.ne[0] % 32 != 0
        || !a.t.is_contiguous_rows()
        || !dst.t.is_contiguous_rows()
        || (0..4).any(|k| b.t.ne[k] <= 0 || a.t.ne[k] % b.t.ne[k] != 0)
    {
        return Ok(false);
    }
    let args = binary_args(a, b, dst);
    let grid = [cx.blocks(a.t.ne[0] / 32, B as i64, 1024), cx.blocks(dst.nrows(), 1, 65535), 1];
    cx.launch(name, grid, [B, 1, 1], &args)?;
    Ok(true)
}

/// `swiglu` / `geglu`, fused (src0 holds both halves) or split (src0 gate,
/// src1 up) (`kernels-cuda/glu.cu`).
fn glu(cx: &Cx, g: GluOp, swapped: bool, dst: &T, src: &[T]) -> Result<bool> {
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
            args.push(KArg::I32(i32::from(swapped)));
            cx.launch(&format!("sg_{base}_{sfx}"), grid, [B, 1, 1], &args)?;
        }
    }
    Ok(true)
}
