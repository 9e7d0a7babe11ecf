//! `kernels-cuda/rope.cu`: rotary position embedding (NORMAL, NEOX, MROPE,
//! IMROPE; partial rotation, YaRN, frequency factors) for F32 and F16.

use super::{Cx, KArg, T};
use crate::backend::cpu::kernels::rope::corr_dims;
use crate::error::Result;
use crate::ops::{ops_outside, Op, RopeMode, RopeParams};
use crate::tensor::GgmlType::{F16, F32, I32};

/// Threads per block (one block per token).
const B: u32 = 128;
/// The kernel's largest `n_dims` (shared tables of 512 pairs).
const MAX_DIMS: i32 = 1024;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match op {
        Op::Rope(p) => rope(cx, p, dst, src),
        // Not a rope op: `ops::run` routes none here.
        ops_outside!(rope) => Ok(false),
    }
}

/// `rope` with parameters `p`: src0 x, src1 positions, optional src2
/// frequency factors.
fn rope(cx: &Cx, p: &RopeParams, dst: &T, src: &[T]) -> Result<bool> {
    let (Some(a), Some(pos)) = (src.first(), src.get(1)) else { return Ok(false) };
    let ff = src.get(2);
    let name = match (a.ty(), dst.ty()) {
        (F32, F32) => "sg_rope_f32",
        (F16, F16) => "sg_rope_f16",
        _ => return Ok(false),
    };
    let n_dims = p.n_dims;
    if a.t.ne != dst.t.ne || n_dims <= 0 || n_dims > MAX_DIMS || n_dims % 2 != 0 || n_dims as i64 > a.t.ne[0] {
        return Ok(false);
    }
    let multi = matches!(p.mode, RopeMode::Mrope | RopeMode::Imrope);
    let ne2 = a.t.ne[2];
    let need_pos = if multi { 4 * ne2 } else { ne2 };
    // Positions are read as a packed I32 vector.
    if pos.ty() != I32 || !pos.t.is_contiguous() || pos.nelements() < need_pos {
        return Ok(false);
    }
    // Frequency factors are read as a packed F32 vector.
    if let Some(f) = ff {
        if f.ty() != F32 || !f.t.is_contiguous_rows() || f.t.ne[0] < (n_dims / 2) as i64 {
            return Ok(false);
        }
    }
    let theta_scale = p.freq_base.powf(-2.0 / n_dims as f32);
    let corr = corr_dims(p);
    let s = p.sections;
    let mut args = vec![a.ptr(), pos.ptr(), ff.map_or(KArg::Ptr(0), |f| f.ptr()), dst.ptr()];
    args.extend(a.ne());
    args.extend(a.nb());
    args.extend(dst.nb());
    args.extend([
        KArg::I32(n_dims),
        KArg::I32(p.mode.ggml_mode()),
        KArg::F32(theta_scale),
        KArg::F32(p.freq_scale),
        KArg::F32(p.ext_factor),
        KArg::F32(p.attn_factor),
        KArg::F32(corr[0]),
        KArg::F32(corr[1]),
        KArg::I32(s[0]),
        KArg::I32(s[1]),
        KArg::I32(s[2]),
        KArg::I32(s[3]),
    ]);
    let grid = [cx.blocks(ne2 * a.t.ne[3], 1, i32::MAX as u32), 1, 1];
    cx.launch(name, grid, [B, 1, 1], &args)?;
    Ok(true)
}
