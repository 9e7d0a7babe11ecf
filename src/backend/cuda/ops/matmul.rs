//! `kernels-cuda/quant_matvec.cu` and `kernels-cuda/mul_mat.cu` (with the
//! dequantising kernels of `kernels-cuda/getrows.cu`): `mul_mat`,
//! `mul_mat_id` and `add_id`.
//!
//! `mul_mat` picks, per node:
//! - few columns (`ne11 <= MMV_MAX_COLS`, packed weight rows): the
//!   matrix-vector kernels, for every weight type they have (F32, F16,
//!   BF16, Q4_0..Q8_0, Q2_K..Q6_K, and ggml 0.25.3's IQ1_S, IQ1_M, IQ2_XXS,
//!   IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4,
//!   NVFP4, Q1_0, Q2_0: `super::float_suffix`);
//! - many columns, F32 weights: the device's GEMM library (cuBLAS) when it
//!   has one and the layouts fit it, one GEMM per batch matrix, else the
//!   tiled F32 kernel (any strides);
//! - many columns, F16 or quantised weights: the weights dequantised into an
//!   F32 scratch buffer, then as F32.
//!
//! F16 / BF16 activations (`src1`) of `mul_mat` and `mul_mat_id` are first
//! converted into a packed F32 scratch copy (`sg_cpy_<f16|bf16>_f32` of
//! `kernels-cuda/elementwise.cu`), then computed as F32 activations.
//!
//! `mul_mat_id` runs the matrix-vector kernels once per (slot, token)
//! column, each reading its expert id on the device; `add_id` has its own
//! kernel. An expert id out of range is an error (as ggml's assert), read
//! back from the kernels' error flag when the compute has finished
//! ([`Cx::error_flag`](super::Cx::error_flag)).

use super::super::api::Gemm;
use super::{Cx, KArg, T};
use crate::error::{Error, Result};
use crate::ops::{ops_outside, Op};
use crate::tensor::GgmlType::{BF16, F16, F32, I32};

/// Most activation columns for which `mul_mat` uses the matrix-vector kernels.
const MMV_MAX_COLS: i64 = 8;
/// Warps per block of the matrix-vector kernels.
const MMV_WARPS: u32 = 4;
/// Threads per block of the tiled and row kernels.
const B: u32 = 256;

/// True if the rows of `t` are packed (elements or blocks back to back).
fn rows_packed(t: &T) -> bool {
    t.t.ne[0] <= 1 || t.t.nb[0] == t.ty().type_size()
}

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match (op, src) {
        (Op::MulMat, [a, b, ..]) if matches!(b.ty(), F16 | BF16) => {
            with_f32_activations(cx, b, |cx, b| mul_mat(cx, dst, a, b))
        }
        (Op::MulMat, [a, b, ..]) => mul_mat(cx, dst, a, b),
        (Op::MulMatId, [a, b, ids, ..]) if matches!(b.ty(), F16 | BF16) => {
            with_f32_activations(cx, b, |cx, b| mul_mat_id(cx, dst, a, b, ids))
        }
        (Op::MulMatId, [a, b, ids, ..]) => mul_mat_id(cx, dst, a, b, ids),
        (Op::AddId, [a, b, ids, ..]) => add_id(cx, dst, a, b, ids),
        // Too few sources; no other family is routed here (`ops::run`).
        (Op::MulMat | Op::MulMatId | Op::AddId | ops_outside!(matmul), _) => Ok(false),
    }
}

/// Runs `f` (a product with F32 activations) on F16 / BF16 activations `b`
/// converted into a packed F32 scratch copy (exact: every f16 and bf16 value
/// is an f32), as ggml's CUDA backend converts src1. Whether `f` takes the
/// converted operand is asked first in a dry run, so nothing is converted for
/// a node that then runs on the host.
fn with_f32_activations(cx: &Cx, b: &T, f: impl Fn(&Cx, &T) -> Result<bool>) -> Result<bool> {
    let from = match b.ty() {
        F16 => "f16",
        BF16 => "bf16",
        _ => return Ok(false),
    };
    let n = b.nelements();
    let Some(bytes) = usize::try_from(n).ok().and_then(|n| n.checked_mul(4)) else { return Ok(false) };
    let mut t = b.t.clone();
    t.ty = F32;
    let [ne0, ne1, ne2, _] = t.ne.map(|d| d.max(0) as usize);
    t.nb = [4, 4 * ne0, 4 * ne0 * ne1, 4 * ne0 * ne1 * ne2];
    if !f(&Cx::dry(cx.gpu()), &T { t: &t, p: 0 })? {
        return Ok(false);
    }
    if cx.is_dry() {
        return Ok(true);
    }
    let scratch = match cx.scratch(bytes) {
        Ok(s) => s,
        // Too big for the device now: the host computes this node.
        Err(Error::Alloc { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    let b32 = T { t: &t, p: scratch.p() };
    let mut args = vec![b.ptr(), b32.ptr()];
    args.extend(b.ne());
    args.extend(b.nb());
    args.extend(b32.ne());
    args.extend(b32.nb());
    cx.launch(&format!("sg_cpy_{from}_f32"), [cx.blocks(n, B as i64, 65535), 1, 1], [B, 1, 1], &args)?;
    let r = f(cx, &b32);
    // Freed after the product's launches (stream-ordered).
    drop(scratch);
    r
}

/// An F32 weight operand of the F32 product: address, shape, byte strides.
struct Wf32 {
    p: u64,
    ne: [i64; 4],
    nb: [usize; 4],
}

fn mul_mat(cx: &Cx, dst: &T, a: &T, b: &T) -> Result<bool> {
    let Some(sfx) = super::float_suffix(a.ty()) else { return Ok(false) };
    let [k, m, ne02, ne03] = a.t.ne;
    let [_, n, ne12, ne13] = b.t.ne;
    let shapes_ok = b.ty() == F32
        && dst.ty() == F32
        && k > 0
        && b.t.ne[0] == k
        && k % a.ty().block_size() as i64 == 0
        && ne02 > 0
        && ne03 > 0
        && ne12 % ne02 == 0
        && ne13 % ne03 == 0
        && dst.t.ne == [m, n, ne12, ne13];
    if !shapes_ok {
        return Ok(false);
    }
    let packed = rows_packed(a);
    if n <= MMV_MAX_COLS && packed {
        let mut args = vec![a.ptr(), b.ptr(), dst.ptr()];
        args.extend(a.ne());
        args.extend(a.nb()[1..].iter().copied());
        args.extend(b.ne()[1..].iter().copied());
        args.extend(b.nb());
        args.extend(dst.nb());
        let grid = [cx.blocks(m, MMV_WARPS as i64, i32::MAX as u32), cx.blocks(n * ne12 * ne13, 1, 65535), 1];
        cx.launch(&format!("sg_mul_mat_vec_{sfx}"), grid, [32 * MMV_WARPS, 1, 1], &args)?;
        return Ok(true);
    }
    if a.ty() == F32 {
        return f32_product(cx, dst, &Wf32 { p: a.p, ne: a.t.ne, nb: a.t.nb }, b);
    }
    if !packed && !matches!(a.ty(), F16 | BF16) {
        return Ok(false);
    }
    // Dequantise the weights into a packed F32 copy, then the F32 product.
    let Some(bytes) = [k, m, ne02, ne03].iter().try_fold(4usize, |acc, &d| acc.checked_mul(d as usize)) else {
        return Ok(false);
    };
    let scratch = match cx.scratch(bytes) {
        Ok(s) => s,
        // Too big for the device now: the host computes this node.
        Err(Error::Alloc { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut args = vec![a.ptr(), scratch.ptr()];
    args.extend(a.ne());
    args.extend(a.nb());
    let per_thread = super::values_per_thread(a.ty());
    let grid = [cx.blocks(k / per_thread, B as i64, 1024), cx.blocks(m * ne02 * ne03, 1, 65535), 1];
    cx.launch(&format!("sg_dequant_{sfx}"), grid, [B, 1, 1], &args)?;
    let nb0 = 4usize;
    let nb1 = nb0 * k as usize;
    let nb2 = nb1 * m as usize;
    let w = Wf32 { p: scratch.p(), ne: a.t.ne, nb: [nb0, nb1, nb2, nb2 * ne02 as usize] };
    let r = f32_product(cx, dst, &w, b);
    // Freed after the product's launches (stream-ordered).
    drop(scratch);
    r
}

/// `dst = wᵀ·b` with F32 weights `w`: GEMM library first, else the tiled kernel.
fn f32_product(cx: &Cx, dst: &T, w: &Wf32, b: &T) -> Result<bool> {
    let [k, m, ne02, ne03] = w.ne;
    let [_, n, ne12, ne13] = b.t.ne;
    if !cx.is_dry() && gemm(cx, dst, w, b)? {
        return Ok(true);
    }
    let mut args = vec![KArg::Ptr(w.p), b.ptr(), dst.ptr()];
    args.extend([k, m, n, ne02, ne03, ne12, ne13].map(KArg::I64));
    args.extend(w.nb.map(|x| KArg::I64(x as i64)));
    args.extend(b.nb());
    args.extend(dst.nb());
    let tiles = ((m + 31) / 32) * ((n + 31) / 32);
    let grid = [cx.blocks(tiles, 1, 65535), cx.blocks(ne12 * ne13, 1, 65535), 1];
    cx.launch("sg_mul_mat_f32", grid, [B, 1, 1], &args)?;
    Ok(true)
}

/// The product as one column-major GEMM per batch matrix (see [`Gemm`]):
/// the weight `[k, m]` is the k×m matrix A with `lda = nb01/4` (used
/// transposed), the activations `[k, n]` the k×n matrix B with
/// `ldb = nb11/4`, the result `[m, n]` the m×n matrix C with `ldc = nb1/4`.
/// `Ok(false)` (nothing run) when the library is missing or a layout does
/// not fit it (dim 0 not unit-stride, leading dimensions too small or not
/// whole elements, sizes beyond i32).
fn gemm(cx: &Cx, dst: &T, w: &Wf32, b: &T) -> Result<bool> {
    let [k, m, ne02, ne03] = w.ne;
    let [_, n, ne12, ne13] = b.t.ne;
    let ld = |nb: usize| -> Option<i32> { (nb % 4 == 0).then(|| i32::try_from(nb / 4).ok()).flatten() };
    let (Some(lda), Some(ldb), Some(ldc)) = (ld(w.nb[1]), ld(b.t.nb[1]), ld(dst.t.nb[1])) else { return Ok(false) };
    let (Ok(mi), Ok(ni), Ok(ki)) = (i32::try_from(m), i32::try_from(n), i32::try_from(k)) else { return Ok(false) };
    let fits = w.nb[0] == 4
        && b.t.nb[0] == 4
        && dst.t.nb[0] == 4
        && lda as i64 >= k.max(1)
        && ldb as i64 >= k.max(1)
        && ldc as i64 >= m.max(1);
    if !fits {
        return Ok(false);
    }
    let (r2, r3) = (ne12 / ne02, ne13 / ne03);
    for i13 in 0..ne13 {
        for i12 in 0..ne12 {
            let g = Gemm {
                m: mi,
                n: ni,
                k: ki,
                a: w.p + ((i12 / r2) as usize * w.nb[2] + (i13 / r3) as usize * w.nb[3]) as u64,
                lda,
                a_f16: false,
                b: b.p + (i12 as usize * b.t.nb[2] + i13 as usize * b.t.nb[3]) as u64,
                ldb,
                c: dst.p + (i12 as usize * dst.t.nb[2] + i13 as usize * dst.t.nb[3]) as u64,
                ldc,
            };
            if !cx.gemm(&g)? {
                // No library (or it stopped midway): the caller's kernel does all of it.
                return Ok(false);
            }
        }
    }
    Ok(true)
}

fn mul_mat_id(cx: &Cx, dst: &T, a: &T, b: &T, ids: &T) -> Result<bool> {
    let Some(sfx) = super::float_suffix(a.ty()) else { return Ok(false) };
    let [k, m, n_expert, _] = a.t.ne;
    let [_, n_b, n_tok, _] = b.t.ne;
    let n_used = ids.t.ne[0];
    let ok = b.ty() == F32
        && dst.ty() == F32
        && ids.ty() == I32
        && k > 0
        && b.t.ne[0] == k
        && k % a.ty().block_size() as i64 == 0
        && rows_packed(a)
        && a.t.ne[3] == 1
        && b.t.ne[3] == 1
        && n_b > 0
        && n_used % n_b == 0
        && ids.t.ne[1] == n_tok
        && ids.t.ne[2] == 1
        && ids.t.ne[3] == 1
        && dst.t.ne == [m, n_used, n_tok, 1];
    if !ok {
        return Ok(false);
    }
    let flag = cx.error_flag(format!("mul_mat_id: an expert id in ids {:?} is outside 0..{n_expert}", ids.t.ne))?;
    let mut args = vec![a.ptr(), b.ptr(), ids.ptr(), dst.ptr()];
    args.extend([k, m, n_expert].map(KArg::I64));
    args.extend(a.nb()[1..3].iter().copied());
    args.push(KArg::I64(n_b));
    args.extend(b.nb()[..3].iter().copied());
    args.extend([n_used, n_tok].map(KArg::I64));
    args.extend(ids.nb()[..2].iter().copied());
    args.extend(dst.nb()[..3].iter().copied());
    args.push(flag);
    let grid = [cx.blocks(m, MMV_WARPS as i64, i32::MAX as u32), cx.blocks(n_used * n_tok, 1, 65535), 1];
    cx.launch(&format!("sg_mul_mat_id_vec_{sfx}"), grid, [32 * MMV_WARPS, 1, 1], &args)?;
    Ok(true)
}

fn add_id(cx: &Cx, dst: &T, a: &T, b: &T, ids: &T) -> Result<bool> {
    let ok = a.ty() == F32
        && b.ty() == F32
        && dst.ty() == F32
        && ids.ty() == I32
        && a.t.ne[0] == b.t.ne[0]
        && ids.t.ne[0] == a.t.ne[1]
        && ids.t.ne[1] == a.t.ne[2]
        && dst.t.ne == a.t.ne
        && b.t.ne[1] > 0;
    if !ok {
        return Ok(false);
    }
    let n_expert = b.t.ne[1];
    let flag = cx.error_flag(format!("add_id: an expert id in ids {:?} is outside 0..{n_expert}", ids.t.ne))?;
    let mut args = vec![a.ptr(), b.ptr(), ids.ptr(), dst.ptr()];
    args.extend(a.ne());
    args.extend(a.nb());
    args.extend(b.nb()[..2].iter().copied());
    args.push(KArg::I64(n_expert));
    args.extend(ids.nb()[..2].iter().copied());
    args.extend(dst.nb());
    args.push(flag);
    let grid = [cx.blocks(a.t.ne[0], B as i64, 1024), cx.blocks(a.nrows(), 1, 65535), 1];
    cx.launch("sg_add_id_f32", grid, [B, 1, 1], &args)?;
    Ok(true)
}
