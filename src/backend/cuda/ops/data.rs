//! The data family: leafs and shape-only ops (no kernel: done), copies
//! (`cpy`, `dup`, `cont`), `get_rows` / `set_rows`, and `concat`, `repeat`,
//! `pad`.
//!
//! - `kernels-cuda/getrows.cu`: `get_rows` (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
//!   Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and ggml 0.25.3's IQ*, TQ*,
//!   MXFP4, NVFP4, Q1_0, Q2_0 tables to F32: `super::type_suffix`; I32 tables
//!   to I32) and `set_rows` (F32 rows into F32, F16, BF16, Q8_0, Q4_0, Q4_1,
//!   Q5_0, Q5_1 or IQ4_NL rows at I32 or I64 indices; into the other block
//!   types it runs on the host). An index out of range is an error,
//!   as ggml's assert: the kernels skip it (nothing is read or written outside
//!   the tensors) and set an error flag, which is read back when the compute
//!   has finished and fails it, naming the op.
//! - `kernels-cuda/elementwise.cu`: copies (`cpy`, `dup`, `cont`) between
//!   F32, F16, BF16 and I32, into Q8_0/Q4_0/Q4_1/Q5_0/IQ4_NL blocks, out of
//!   every block type dequant.cuh knows (Q4_0..Q8_0, Q2_K..Q6_K, the IQ*,
//!   TQ*, FP4 and Q1_0/Q2_0 types) into F32 / F16, and same-type block
//!   copies.
//! - `kernels-cuda/concat_repeat_pad.cu`: `concat`, `repeat` and `pad`,
//!   which only move elements: the `_f32` kernels serve every 4-byte type
//!   (F32, I32) and the `_f16` kernels every 2-byte type (F16, BF16, I16).

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::{ops_outside, Op};
use crate::tensor::GgmlType::{self, BF16, F16, F32, I32, I64, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// Threads per block of the get_rows launch.
const B_GET: u32 = 256;
/// Threads per block of the set_rows launch (one block per source row).
const B_SET: u32 = 128;
/// Threads per block of the copy and element-moving launches.
const B: u32 = 256;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match (op, src) {
        // A leaf holds its data and a shape-only op is its source's memory:
        // nothing to launch, the node is done.
        (Op::None | Op::Reshape | Op::View | Op::Permute { .. } | Op::Transpose, _) => Ok(true),
        (Op::GetRows, [a, idx, ..]) => get_rows(cx, dst, a, idx),
        (Op::SetRows, [rows, idx, ..]) => set_rows(cx, dst, rows, idx),
        (Op::Dup | Op::Cont | Op::Cpy, [s, ..]) => cpy(cx, dst, s),
        (Op::Concat { dim }, [a, b, ..]) => move_elements(cx, Move::Concat { b, dim: *dim }, dst, a),
        (Op::Repeat, [a, ..]) => move_elements(cx, Move::Repeat, dst, a),
        (Op::Pad { lp, rp }, [a, ..]) => move_elements(cx, Move::Pad { lp, rp }, dst, a),
        // Too few sources; no other family is routed here (`ops::run`).
        (
            Op::GetRows
            | Op::SetRows
            | Op::Dup
            | Op::Cont
            | Op::Cpy
            | Op::Concat { .. }
            | Op::Repeat
            | Op::Pad { .. }
            | ops_outside!(data),
            _,
        ) => Ok(false),
    }
}

/// Kernel-name suffix of a get_rows table type with the destination type it
/// gives (I32 tables give I32 rows, every other table F32).
fn table(ty: GgmlType) -> Option<(&'static str, GgmlType)> {
    match ty {
        I64 => None,
        I32 => Some(("i32", I32)),
        _ => super::type_suffix(ty).map(|s| (s, F32)),
    }
}

fn get_rows(cx: &Cx, dst: &T, a: &T, idx: &T) -> Result<bool> {
    let Some((sfx, dty)) = table(a.ty()) else { return Ok(false) };
    if idx.ty() != I32 || dst.ty() != dty {
        return Ok(false);
    }
    let per_thread = super::values_per_thread(a.ty());
    let Some((args, grid)) = get_rows_args(cx, dst, a, idx, a.t.ne[1], per_thread, "src0")? else { return Ok(false) };
    cx.launch(&format!("sg_get_rows_{sfx}"), grid, [B_GET, 1, 1], &args)?;
    Ok(true)
}

/// The arguments and grid of a get_rows kernel (`sg_get_rows_*` here,
/// `sg_get_rows_part_*` in `distributed.cu`, which append their ranges)
/// for table `a` `[ne00, .., ne02, ne03]` of `n_rows` global rows, indices
/// `idx` `[ne10, ne11, ne12, 1]` and `dst` `[ne00, ne10, ne11, ne12]`, each
/// thread writing `per_thread` values of a row; the error flag names `what`
/// the table is. `None` where the shapes or the table's layout do not fit
/// (the caller's types are checked there).
pub(super) fn get_rows_args(
    cx: &Cx,
    dst: &T,
    a: &T,
    idx: &T,
    n_rows: i64,
    per_thread: i64,
    what: &str,
) -> Result<Option<(Vec<KArg>, [u32; 3])>> {
    let [ne00, _, ne02, ne03] = a.t.ne;
    let [ne10, ne11, ne12, ne13] = idx.t.ne;
    let bs = a.ty().block_size() as i64;
    // Block types are read block by block from the row start: rows must be packed.
    let packed = bs == 1 || ne00 <= 1 || a.t.nb[0] == a.ty().type_size();
    let ok =
        ne00 % bs == 0 && packed && ne13 == 1 && ne02 == ne11 && ne03 == ne12 && dst.t.ne == [ne00, ne10, ne11, ne12];
    if !ok {
        return Ok(None);
    }
    let flag = cx.error_flag(format!(
        "get_rows: an index in {:?} is outside the table's {n_rows} rows ({what} {})",
        idx.t.ne,
        a.t.describe()
    ))?;
    let mut args = vec![a.ptr(), idx.ptr(), dst.ptr(), KArg::I64(ne00), KArg::I64(n_rows)];
    args.extend(a.nb());
    args.extend(idx.ne()[..3].iter().copied());
    args.extend(idx.nb()[..3].iter().copied());
    args.extend(dst.nb());
    args.push(flag);
    let grid = [cx.blocks(ne00 / per_thread, B_GET as i64, 1024), cx.blocks(ne10 * ne11 * ne12, 1, 65535), 1];
    Ok(Some((args, grid)))
}

fn set_rows(cx: &Cx, dst: &T, rows: &T, idx: &T) -> Result<bool> {
    let dname = match dst.ty() {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q8_0 => "q8_0",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        IQ4_NL => "iq4_nl",
        _ => return Ok(false),
    };
    let iname = match idx.ty() {
        I32 => "i32",
        I64 => "i64",
        _ => return Ok(false),
    };
    let [ne00, ne01, ne02, ne03] = rows.t.ne;
    let [ne10, ne11, ne12, ne13] = idx.t.ne;
    let bs = dst.ty().block_size() as i64;
    let dst_packed = bs == 1 || ne00 <= 1 || dst.t.nb[0] == dst.ty().type_size();
    let ok = rows.ty() == F32
        && dst.t.ne[0] == ne00
        && dst.t.ne[2] == ne02
        && dst.t.ne[3] == ne03
        && ne00 % bs == 0
        && dst_packed
        && ne10 == ne01
        && ne11 > 0
        && ne12 > 0
        && ne13 == 1
        && ne02 % ne11 == 0
        && ne03 % ne12 == 0;
    if !ok {
        return Ok(false);
    }
    let flag = cx.error_flag(format!(
        "set_rows: an index in {:?} is outside the destination's {} rows (dst {})",
        idx.t.ne,
        dst.t.ne[1],
        dst.t.describe()
    ))?;
    let mut args = vec![rows.ptr(), idx.ptr(), dst.ptr()];
    args.extend(rows.ne());
    args.extend(rows.nb());
    args.extend([ne11, ne12].map(KArg::I64));
    args.extend(idx.nb()[..3].iter().copied());
    args.push(KArg::I64(dst.t.ne[1]));
    args.extend(dst.nb());
    args.push(flag);
    let grid = [cx.blocks(ne01 * ne02 * ne03, 1, i32::MAX as u32), 1, 1];
    cx.launch(&format!("sg_set_rows_{dname}_{iname}"), grid, [B_SET, 1, 1], &args)?;
    Ok(true)
}

/// Kernel-name suffix of a float or I32 copy operand.
fn cpy_suffix(ty: GgmlType) -> Option<&'static str> {
    match ty {
        F32 => Some("f32"),
        F16 => Some("f16"),
        BF16 => Some("bf16"),
        I32 => Some("i32"),
        _ => None,
    }
}

/// Kernel-name suffix of a block type with a quantizing copy kernel.
fn quant_suffix(ty: GgmlType) -> Option<&'static str> {
    match ty {
        Q8_0 => Some("q8_0"),
        Q4_0 => Some("q4_0"),
        Q4_1 => Some("q4_1"),
        Q5_0 => Some("q5_0"),
        IQ4_NL => Some("iq4_nl"),
        _ => None,
    }
}

/// Kernel-name suffix of a block type with dequantizing copy kernels
/// (`sg_cpy_<q>_<f32|f16>`, dequant.cuh's types).
fn dequant_suffix(ty: GgmlType) -> Option<&'static str> {
    super::type_suffix(ty).filter(|_| ty.is_quantized())
}

/// cpy / dup / cont of `s` into `dst` (same element count, element k of
/// `s` in logical order to element k of `dst`).
fn cpy(cx: &Cx, dst: &T, s: &T) -> Result<bool> {
    if s.nelements() != dst.nelements() {
        return Ok(false);
    }
    let mut args = vec![s.ptr(), dst.ptr()];
    args.extend(s.ne());
    args.extend(s.nb());
    args.extend(dst.ne());
    args.extend(dst.nb());
    let n = s.nelements();
    match (cpy_suffix(s.ty()), cpy_suffix(dst.ty())) {
        (Some(from), Some(to)) => {
            // No I32 <-> F16/BF16 kernels.
            if (from == "i32" || to == "i32") && !matches!((from, to), ("i32", "i32" | "f32") | ("f32", "i32")) {
                return Ok(false);
            }
            let grid = [cx.blocks(n, B as i64, 65535), 1, 1];
            cx.launch(&format!("sg_cpy_{from}_{to}"), grid, [B, 1, 1], &args)?;
            return Ok(true);
        }
        // Quantize into a contiguous block-type destination.
        (Some(from), None) if from != "i32" => {
            let Some(to) = quant_suffix(dst.ty()) else { return Ok(false) };
            if !dst.t.is_contiguous() || n % 32 != 0 {
                return Ok(false);
            }
            let grid = [cx.blocks(n / 32, B as i64, 65535), 1, 1];
            cx.launch(&format!("sg_cpy_{from}_{to}"), grid, [B, 1, 1], &args)?;
            return Ok(true);
        }
        // Dequantize a block-type source (rows of packed blocks) to F32 / F16.
        (None, Some(to)) if matches!(to, "f32" | "f16") => {
            let Some(from) = dequant_suffix(s.ty()) else { return Ok(false) };
            let ty = s.ty();
            let packed = s.t.ne[0] <= ty.block_size() as i64 || s.t.nb[0] == ty.type_size();
            if !packed || s.t.ne[0] % ty.block_size() as i64 != 0 {
                return Ok(false);
            }
            let grid = [cx.blocks(n, B as i64, 65535), 1, 1];
            cx.launch(&format!("sg_cpy_{from}_{to}"), grid, [B, 1, 1], &args)?;
            return Ok(true);
        }
        _ => {}
    }
    // Same block type, same shape: copy whole blocks.
    let ty = s.ty();
    let (blk, size) = (ty.block_size() as i64, ty.type_size());
    if dst.ty() != ty
        || !ty.is_quantized()
        || s.t.ne != dst.t.ne
        || s.t.ne[0] % blk != 0
        || !s.t.is_contiguous_rows()
        || !dst.t.is_contiguous_rows()
    {
        return Ok(false);
    }
    let units = [s.t.ne[0] / blk, s.t.ne[1], s.t.ne[2], s.t.ne[3]];
    let mut args = vec![s.ptr(), dst.ptr(), KArg::I64(size as i64)];
    args.extend(units.map(KArg::I64));
    args.extend(s.nb());
    args.extend(dst.nb());
    let grid = [cx.blocks(units.iter().product(), B as i64, 65535), 1, 1];
    cx.launch("sg_cpy_units", grid, [B, 1, 1], &args)?;
    Ok(true)
}

/// Kernel suffix of the element size of a non-block type.
fn move_suffix(t: &T) -> Option<&'static str> {
    if t.ty().block_size() != 1 {
        return None;
    }
    match t.ty().type_size() {
        4 => Some("f32"),
        2 => Some("f16"),
        _ => None,
    }
}

/// What [`move_elements`] does with src0.
enum Move<'a, 'b> {
    /// `concat` with src1 `b` along `dim`.
    Concat { b: &'a T<'b>, dim: usize },
    /// `repeat` (tiled to the result's shape).
    Repeat,
    /// `pad` by `lp` before and `rp` after along each dim.
    Pad { lp: &'a [i32; 4], rp: &'a [i32; 4] },
}

/// `concat`, `repeat` or `pad` of src0 `a` (`kernels-cuda/concat_repeat_pad.cu`).
fn move_elements(cx: &Cx, what: Move, dst: &T, a: &T) -> Result<bool> {
    if a.ty() != dst.ty() {
        return Ok(false);
    }
    let Some(sfx) = move_suffix(dst) else { return Ok(false) };
    let (ne, ane) = (dst.t.ne, a.t.ne);
    // concat_repeat_pad.cu's row launch over the destination.
    let grid = [cx.blocks(ne[0], B as i64, 1024), cx.blocks(dst.nrows(), 1, 65535), 1];
    let mut args = Vec::with_capacity(32);
    let name = match what {
        Move::Concat { b, dim: d } => {
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
        Move::Repeat => {
            if (0..4).any(|k| ane[k] <= 0 || ne[k] % ane[k] != 0) {
                return Ok(false);
            }
            args.extend([a.ptr(), dst.ptr()]);
            args.extend(dst.ne().into_iter().chain(a.ne()).chain(a.nb()).chain(dst.nb()));
            format!("sg_repeat_{sfx}")
        }
        Move::Pad { lp, rp } => {
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
    };
    cx.launch(&name, grid, [B, 1, 1], &args)?;
    Ok(true)
}
