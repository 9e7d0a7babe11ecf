//! The attention family, `kernels-cuda/flash_attn.cu`: `flash_attn_ext`
//! (F32 Q; K/V F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL in any pairing, or
//! BF16 K and V; F16 mask; soft-capping; ALiBi; sinks; GQA/MQA head and
//! batch broadcast).
//!
//! The result is ggml's permuted layout `[D_v, H, n_q, B]`: query row
//! `(i, h, b)` is stored at `dst[:, h, i, b]`.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{ops_outside, Op};
use crate::tensor::GgmlType::{self, BF16, F16, F32, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// Threads per block (one block per query row).
const B: u32 = 128;
/// The kernel's largest head size (K and V).
const MAX_D: i64 = 1024;

fn suffix(ty: GgmlType) -> Option<&'static str> {
    match ty {
        F32 => Some("f32"),
        F16 => Some("f16"),
        Q8_0 => Some("q8_0"),
        Q4_0 => Some("q4_0"),
        Q4_1 => Some("q4_1"),
        Q5_0 => Some("q5_0"),
        Q5_1 => Some("q5_1"),
        IQ4_NL => Some("iq4_nl"),
        _ => None,
    }
}

/// The kernel for K type `k` and V type `v`.
fn kernel(k: GgmlType, v: GgmlType) -> Option<String> {
    if k == BF16 && v == BF16 {
        return Some("sg_flash_attn_ext_bf16_bf16".into());
    }
    Some(format!("sg_flash_attn_ext_{}_{}", suffix(k)?, suffix(v)?))
}

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match *op {
        Op::FlashAttnExt { scale, max_bias, logit_softcap } => {
            flash_attn_ext(cx, [scale, max_bias, logit_softcap], dst, src)
        }
        // Not an attention op: `ops::run` routes none here.
        ops_outside!(attn) => Ok(false),
    }
}

/// `flash_attn_ext` with `[scale, max_bias, logit_softcap]`: src0 q, src1
/// k, src2 v, optional src3 mask and src4 sinks.
fn flash_attn_ext(cx: &Cx, params: [f32; 3], dst: &T, src: &[T]) -> Result<bool> {
    let [scale, max_bias, logit_softcap] = params;
    let (Some(q), Some(k), Some(v)) = (src.first(), src.get(1), src.get(2)) else { return Ok(false) };
    let mask = src.get(3);
    let sinks = src.get(4);
    let Some(name) = kernel(k.ty(), v.ty()) else { return Ok(false) };
    let [dk, n_q, h, ne3] = q.t.ne;
    let [n_kv, hk, nek3] = [k.t.ne[1], k.t.ne[2], k.t.ne[3]];
    let [dv, nv, hv, nev3] = v.t.ne;
    let divides = |d: i64, n: i64| d > 0 && n % d == 0;
    if q.ty() != F32
        || dst.ty() != F32
        || k.t.ne[0] != dk
        || nv != n_kv
        || dk > MAX_D
        || dv > MAX_D
        || dst.t.ne != [dv, h, n_q, ne3]
        || !divides(hk, h)
        || !divides(hv, h)
        || !divides(nek3, ne3)
        || !divides(nev3, ne3)
        || ![q, k, v].iter().all(|t| t.t.is_contiguous_rows())
        || (dv > 1 && dst.t.nb[0] != 4)
    {
        return Ok(false);
    }
    if let Some(m) = mask {
        let [m0, m1, m2, m3] = m.t.ne;
        if m.ty() != F16 || !m.t.is_contiguous_rows() || m0 < n_kv || m1 < n_q || !divides(m2, h) || !divides(m3, ne3) {
            return Ok(false);
        }
    }
    if let Some(s) = sinks {
        if s.ty() != F32 || !s.t.is_contiguous_rows() || s.t.ne[0] < h {
            return Ok(false);
        }
    }
    let i = KArg::I64;
    let nb = |t: &T, d: usize| KArg::I64(t.t.nb[d] as i64);
    let mut args = vec![
        q.ptr(),
        k.ptr(),
        v.ptr(),
        mask.map_or(KArg::Ptr(0), |m| m.ptr()),
        sinks.map_or(KArg::Ptr(0), |s| s.ptr()),
        dst.ptr(),
        i(dk),
        i(dv),
        i(n_q),
        i(h),
        i(ne3),
        nb(q, 1),
        nb(q, 2),
        nb(q, 3),
        i(n_kv),
        i(hk),
        i(nek3),
        nb(k, 1),
        nb(k, 2),
        nb(k, 3),
        i(hv),
        i(nev3),
        nb(v, 1),
        nb(v, 2),
        nb(v, 3),
    ];
    match mask {
        Some(m) => args.extend([i(m.t.ne[2]), i(m.t.ne[3]), nb(m, 1), nb(m, 2), nb(m, 3)]),
        None => args.extend([i(1), i(1), i(0), i(0), i(0)]),
    }
    args.extend([nb(dst, 1), nb(dst, 2), nb(dst, 3)]);
    args.extend([KArg::F32(scale), KArg::F32(max_bias), KArg::F32(logit_softcap)]);
    let grid = [cx.blocks(n_q * h * ne3, 1, i32::MAX as u32), 1, 1];
    cx.launch(&name, grid, [B, 1, 1], &args)?;
    Ok(true)
}
