//! `kernels-cuda/getrows.cu`: `get_rows` (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K tables to F32; I32 tables to
//! I32) and `set_rows` (F32 rows into F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0
//! or Q5_1 rows at I32 or I64 indices).
//!
//! An index out of range is an error, as ggml's assert: the kernels skip it
//! (nothing is read or written outside the tensors) and set an error flag,
//! which is read back when the compute has finished and fails it, naming the op.

use super::{Cx, KArg, T};
use crate::error::Result;
use crate::ops::Op;
use crate::tensor::GgmlType::{self, BF16, F16, F32, I32, I64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};

/// Threads per block of the get_rows launch.
const B_GET: u32 = 256;
/// Threads per block of the set_rows launch (one block per source row).
const B_SET: u32 = 128;

pub(super) fn run(cx: &Cx, op: &Op, dst: &T, src: &[T]) -> Result<bool> {
    match (op, src) {
        (Op::GetRows, [a, idx, ..]) => get_rows(cx, dst, a, idx),
        (Op::SetRows, [rows, idx, ..]) => set_rows(cx, dst, rows, idx),
        _ => Ok(false),
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
    let Some((args, grid)) = launch_args(cx, dst, a, idx, a.t.ne[1], "src0")? else { return Ok(false) };
    cx.launch(&format!("sg_get_rows_{sfx}"), grid, [B_GET, 1, 1], &args)?;
    Ok(true)
}

/// The arguments and grid of a get_rows kernel (`sg_get_rows_*` here,
/// `sg_get_rows_part_*` in `distributed.cu`, which append their ranges)
/// for table `a` `[ne00, .., ne02, ne03]` of `n_rows` global rows, indices
/// `idx` `[ne10, ne11, ne12, 1]` and `dst` `[ne00, ne10, ne11, ne12]`; the
/// error flag names `what` the table is. `None` where the shapes or the
/// table's layout do not fit (the caller's types are checked there).
pub(super) fn launch_args(
    cx: &Cx,
    dst: &T,
    a: &T,
    idx: &T,
    n_rows: i64,
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
    let grid = [cx.blocks(ne00, B_GET as i64, 1024), cx.blocks(ne10 * ne11 * ne12, 1, 65535), 1];
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
