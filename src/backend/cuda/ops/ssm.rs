//! `kernels-cuda/ssm.cu`: `ssm_conv` (depthwise causal convolution) and
//! `gated_delta_net` (with K state snapshot slots and q/k head and sequence
//! broadcast), all F32.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{ops_outside, Op};
use crate::tensor::GgmlType::F32;

/// Threads per block of `ssm_conv`.
const B_CONV: u32 = 256;
/// Threads per block of `gated_delta_net` (one state row per thread).
const B_GDN: u32 = 128;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match *op {
        Op::SsmConv => ssm_conv(cx, dst, src),
        Op::GatedDeltaNet { k_snapshots } => gated_delta_net(cx, dst, src, k_snapshots),
        // Not an ssm op: `ops::run` routes none here.
        ops_outside!(ssm) => Ok(false),
    }
}

fn nb(t: &T, d: usize) -> KArg {
    KArg::I64(t.t.nb[d] as i64)
}

fn ssm_conv(cx: &Cx, dst: &T, src: &[T]) -> Result<bool> {
    let (Some(sx), Some(c)) = (src.first(), src.get(1)) else { return Ok(false) };
    let (d_conv, d_inner) = (c.t.ne[0], c.t.ne[1]);
    let (n_t, n_s) = (dst.t.ne[1], dst.t.ne[2]);
    if [sx.ty(), c.ty(), dst.ty()] != [F32; 3]
        || sx.t.ne[1] != d_inner
        || dst.t.ne[0] != d_inner
        || sx.t.ne[2] != n_s
        || sx.t.ne[0] + 1 != d_conv + n_t
        || sx.t.ne[3] != 1
        || c.t.ne[2] != 1
        || c.t.ne[3] != 1
        || dst.t.ne[3] != 1
    {
        return Ok(false);
    }
    let args = [
        sx.ptr(),
        c.ptr(),
        dst.ptr(),
        KArg::I64(d_conv),
        KArg::I64(d_inner),
        KArg::I64(n_t),
        KArg::I64(n_s),
        nb(sx, 0),
        nb(sx, 1),
        nb(sx, 2),
        nb(c, 0),
        nb(c, 1),
        nb(dst, 0),
        nb(dst, 1),
        nb(dst, 2),
    ];
    let grid = [cx.blocks(d_inner, B_CONV as i64, 1024), cx.blocks(n_t * n_s, 1, 65535), 1];
    cx.launch("sg_ssm_conv_f32", grid, [B_CONV, 1, 1], &args)?;
    Ok(true)
}

fn gated_delta_net(cx: &Cx, dst: &T, src: &[T], k_snapshots: i64) -> Result<bool> {
    let [q, k, v, g, beta, state] = match src {
        [q, k, v, g, beta, state, ..] => [q, k, v, g, beta, state],
        _ => return Ok(false),
    };
    let [s, h, n_t, n_b] = v.t.ne;
    // Same operand checks as the CPU kernel, plus the kernel's packed rows.
    let ok = [q, k, v, g, beta, state, dst].iter().all(|t| t.ty() == F32)
        && k_snapshots >= 1
        && [q, k].iter().all(|t| {
            t.t.ne[0] == s
                && t.t.ne[2] == n_t
                && t.t.ne[1] > 0
                && t.t.ne[3] > 0
                && h % t.t.ne[1] == 0
                && n_b % t.t.ne[3] == 0
        })
        && (g.t.ne[0] == 1 || g.t.ne[0] == s)
        && g.t.ne[1..] == [h, n_t, n_b]
        && beta.t.ne == [1, h, n_t, n_b]
        && state.t.ne == [s, s, h, n_b]
        && dst.t.is_contiguous()
        && Some(dst.t.ne[0]) == s.checked_mul(h)
        && k_snapshots.checked_mul(s).and_then(|x| x.checked_mul(n_b)).and_then(|x| x.checked_add(n_t * n_b))
            == Some(dst.t.ne[1])
        && [q, k, v, g, state].iter().all(|t| t.t.is_contiguous_rows());
    if !ok {
        return Ok(false);
    }
    let rows = s * h * n_b;
    if rows == 0 {
        return Ok(true);
    }
    let name = match s {
        ..=64 => "sg_gated_delta_net_f32_s64",
        65..=128 => "sg_gated_delta_net_f32_s128",
        _ => "sg_gated_delta_net_f32_any",
    };
    let i = KArg::I64;
    let args = [
        q.ptr(),
        k.ptr(),
        v.ptr(),
        g.ptr(),
        beta.ptr(),
        state.ptr(),
        dst.ptr(),
        i(s),
        i(h),
        i(n_t),
        i(n_b),
        i(q.t.ne[1]),
        i(q.t.ne[3]),
        nb(q, 1),
        nb(q, 2),
        nb(q, 3),
        i(k.t.ne[1]),
        i(k.t.ne[3]),
        nb(k, 1),
        nb(k, 2),
        nb(k, 3),
        nb(v, 1),
        nb(v, 2),
        nb(v, 3),
        i(g.t.ne[0]),
        nb(g, 1),
        nb(g, 2),
        nb(g, 3),
        nb(beta, 1),
        nb(beta, 2),
        nb(beta, 3),
        nb(state, 1),
        nb(state, 2),
        nb(state, 3),
        i(k_snapshots),
    ];
    let grid = [cx.blocks(rows, B_GDN as i64, 65535), 1, 1];
    cx.launch(name, grid, [B_GDN, 1, 1], &args)?;
    Ok(true)
}
