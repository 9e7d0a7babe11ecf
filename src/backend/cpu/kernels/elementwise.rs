//! CPU kernels of the element-wise family: binary ops with broadcasting,
//! `add1`, `scale`, `clamp`, `sqr`, `sqrt`, unary activations, GLUs and
//! `fill`.
//!
//! Every kernel works row by row: a source row is loaded into f32 scratch
//! (any float/quantized type, any strides), transformed, and stored into the
//! destination row with a conversion to its type. Rows run in parallel on
//! the backend's rayon pool. Values follow ggml's CPU formulas
//! (`binary-ops.cpp`, `unary-ops.cpp`, `vec.h`, `ops.cpp`): arithmetic in f32
//! on converted inputs, one rounding to the destination type; gelu and
//! gelu_quick through ggml's F16 lookup tables.

use super::{unsupported, TView};
use crate::error::Result;
use crate::ops::{ops_outside, GluOp, Op, UnaryOp};
use crate::tensor::GgmlType;
use half::f16;
use rayon::prelude::*;
use std::sync::OnceLock;

#[path = "simd/elementwise_avx2.rs"]
mod simd;

use simd::EwOps;

/// Elements a parallel task handles at least (rows are grouped up to this).
const TASK_ELEMS: usize = 16 * 1024;

/// Runs `f(scratch, r)` for every row `r < nrows`, in parallel over groups
/// of rows of about [`TASK_ELEMS`] elements (`row_len` each); each task gets
/// its own scratch from `init`. The first error stops the work.
pub(super) fn par_rows<S, I, F>(nrows: usize, row_len: usize, init: I, f: F) -> Result<()>
where
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, usize) -> Result<()> + Sync + Send,
{
    if nrows == 0 {
        return Ok(());
    }
    let per_task = (TASK_ELEMS / row_len.max(1)).clamp(1, nrows);
    let ntasks = nrows.div_ceil(per_task);
    let run = |t: usize| -> Result<()> {
        let mut s = init();
        let lo = t * per_task;
        let hi = (lo + per_task).min(nrows);
        for r in lo..hi {
            f(&mut s, r)?;
        }
        Ok(())
    };
    if ntasks == 1 {
        return run(0);
    }
    (0..ntasks).into_par_iter().try_for_each(run)
}

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match op {
        Op::Add => binary(op, dst, src, |x, y| x + y),
        Op::Sub => binary(op, dst, src, |x, y| x - y),
        Op::Mul => binary(op, dst, src, |x, y| x * y),
        Op::Div => binary(op, dst, src, |x, y| x / y),
        Op::Add1 => add1(op, dst, src),
        Op::Scale { s, b } => {
            let (s, b) = (*s, *b);
            if b == 0.0 {
                map(op, dst, src, move |x| x * s)
            } else {
                map(op, dst, src, move |x| x * s + b)
            }
        }
        Op::Clamp { min, max } => {
            let (lo, hi) = (*min, *max);
            // ggml: MAX(MIN(x, max), min) with `a < b ? a : b` / `a > b ? a : b`.
            map(op, dst, src, move |x| {
                let t = if x < hi { x } else { hi };
                if t > lo {
                    t
                } else {
                    lo
                }
            })
        }
        Op::Sqr => map(op, dst, src, |x| x * x),
        Op::Sqrt => map(op, dst, src, f32::sqrt),
        Op::Unary(u) => unary(op, *u, dst, src),
        Op::Glu { op: g, swapped } => glu(op, *g, *swapped, dst, src),
        Op::Fill { c } => fill(op, *c, dst, src),
        // Not an element-wise op: `kernels::compute` routes none here.
        ops_outside!(elementwise) => Err(unsupported(op, dst, src)),
    }
}

/// ggml's f16 lookup table of `f` widened to f32: entry `i` is `f(f16 i)`
/// rounded to f16 (`ggml_table_gelu_f16` & co. in `ggml-cpu.c`).
fn f16_table(f: fn(f32) -> f32) -> Box<[f32]> {
    (0..=u16::MAX).map(|i| f16::from_f32(f(f16::from_bits(i).to_f32())).to_f32()).collect()
}

/// ggml's tanh-approximated GELU in f32 (`ggml_gelu_f32`).
fn gelu_exact(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// ggml's quick GELU in f32 (`ggml_gelu_quick_f32`).
fn gelu_quick_exact(x: f32) -> f32 {
    const GELU_QUICK_COEF: f32 = -1.702;
    x * (1.0 / (1.0 + (GELU_QUICK_COEF * x).exp()))
}

/// ggml's `ggml_table_gelu_f16` (as f32).
fn gelu_table() -> &'static [f32] {
    static T: OnceLock<Box<[f32]>> = OnceLock::new();
    T.get_or_init(|| f16_table(gelu_exact))
}

/// ggml's `ggml_table_gelu_quick_f16` (as f32).
fn gelu_quick_table() -> &'static [f32] {
    static T: OnceLock<Box<[f32]>> = OnceLock::new();
    T.get_or_init(|| f16_table(gelu_quick_exact))
}

/// Checks that `a` and `dst` have the same extents (kernel precondition;
/// constructors guarantee it, this keeps memory access in bounds regardless).
fn same_shape(op: &Op, dst: &TView, src: &[TView], a: &TView) -> Result<()> {
    if a.ne != dst.ne {
        return Err(unsupported(op, dst, src));
    }
    Ok(())
}

/// Binary op `f(src0, src1)` with src1 repeated over src0.
fn binary<F>(op: &Op, dst: &TView, src: &[TView], f: F) -> Result<()>
where
    F: Fn(f32, f32) -> f32 + Sync + Send,
{
    let (Some(a), Some(b)) = (src.first(), src.get(1)) else {
        return Err(unsupported(op, dst, src));
    };
    same_shape(op, dst, src, a)?;
    if (0..4).any(|i| b.ne[i] == 0 || dst.ne[i] % b.ne[i] != 0) {
        return Err(unsupported(op, dst, src));
    }
    let n0 = dst.ne[0];
    let n10 = b.ne[0];
    par_rows(
        dst.nrows(),
        n0,
        || (vec![0f32; n0], vec![0f32; n10], usize::MAX),
        |(x, y, cached), r| {
            let (i1, i2, i3) = dst.row_index(r);
            a.load_row_f32(i1, i2, i3, x)?;
            let (j1, j2, j3) = (i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
            let key = j1 + b.ne[1] * (j2 + b.ne[2] * j3);
            if key != *cached {
                b.load_row_f32(j1, j2, j3, y)?;
                *cached = key;
            }
            if n10 == n0 {
                for (xv, &yv) in x.iter_mut().zip(y.iter()) {
                    *xv = f(*xv, yv);
                }
            } else {
                for chunk in x.chunks_mut(n10) {
                    for (xv, &yv) in chunk.iter_mut().zip(y.iter()) {
                        *xv = f(*xv, yv);
                    }
                }
            }
            dst.store_row_f32(i1, i2, i3, x)
        },
    )
}

/// `src0 + scalar src1`.
fn add1(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    let Some(b) = src.get(1) else {
        return Err(unsupported(op, dst, src));
    };
    if b.nelements() != 1 {
        return Err(unsupported(op, dst, src));
    }
    let v = b.get_f32(0, 0, 0, 0);
    map(op, dst, src, move |x| x + v)
}

/// `dst = f(src0)` element-wise.
fn map<F>(op: &Op, dst: &TView, src: &[TView], f: F) -> Result<()>
where
    F: Fn(f32) -> f32 + Sync + Send,
{
    map_rows(op, dst, src, |x| x.iter_mut().for_each(|v| *v = f(*v)))
}

/// `dst row = f(src0 row)`, the row transformed in place in f32 scratch.
fn map_rows<F>(op: &Op, dst: &TView, src: &[TView], f: F) -> Result<()>
where
    F: Fn(&mut [f32]) + Sync + Send,
{
    let Some(a) = src.first() else {
        return Err(unsupported(op, dst, src));
    };
    same_shape(op, dst, src, a)?;
    transform_rows(dst, a, f)
}

/// Loads each row of `a` into f32 scratch, applies `f` in place and stores
/// the row into `dst` (same shape). Safe when `dst` aliases `a` (in place).
pub(super) fn transform_rows<F>(dst: &TView, a: &TView, f: F) -> Result<()>
where
    F: Fn(&mut [f32]) + Sync + Send,
{
    let n0 = dst.ne[0];
    par_rows(
        dst.nrows(),
        n0,
        || vec![0f32; n0],
        |x, r| {
            let (i1, i2, i3) = dst.row_index(r);
            a.load_row_f32(i1, i2, i3, x)?;
            f(x);
            dst.store_row_f32(i1, i2, i3, x)
        },
    )
}

/// Unary activations.
fn unary(op: &Op, u: UnaryOp, dst: &TView, src: &[TView]) -> Result<()> {
    let Some(a) = src.first() else {
        return Err(unsupported(op, dst, src));
    };
    // ggml clamps gelu at ±10 only on its F32 path.
    let clamp = a.ty == GgmlType::F32;
    let ew = EwOps::detect();
    match u {
        UnaryOp::Abs => map(op, dst, src, f32::abs),
        UnaryOp::Neg => map(op, dst, src, |x| -x),
        UnaryOp::Tanh => map(op, dst, src, f32::tanh),
        UnaryOp::Relu => map(op, dst, src, |x| if x > 0.0 { x } else { 0.0 }),
        UnaryOp::Sigmoid => map(op, dst, src, |x| 1.0 / (1.0 + (-x).exp())),
        UnaryOp::Gelu => {
            let t = gelu_table();
            map_rows(op, dst, src, move |x| (ew.table)(x, t, clamp))
        }
        UnaryOp::GeluQuick => {
            let t = gelu_quick_table();
            map_rows(op, dst, src, move |x| (ew.table)(x, t, false))
        }
        UnaryOp::Silu => map_rows(op, dst, src, move |x| (ew.silu)(x)),
        UnaryOp::Exp => map(op, dst, src, f32::exp),
        UnaryOp::Softplus => map(op, dst, src, |x| if x > 20.0 { x } else { (1.0 + x.exp()).ln() }),
    }
}

/// Gated linear units, fused (one source holding both halves) or split.
fn glu(op: &Op, g: GluOp, swapped: bool, dst: &TView, src: &[TView]) -> Result<()> {
    let Some(a) = src.first() else {
        return Err(unsupported(op, dst, src));
    };
    let split = src.get(1);
    let nc = dst.ne[0];
    let rows_ok = dst.ne[1..] == a.ne[1..];
    let cols_ok = match split {
        Some(b) => a.ne[0] == nc && b.ne == a.ne,
        None => a.ne[0] / 2 == nc,
    };
    if !rows_ok || !cols_ok {
        return Err(unsupported(op, dst, src));
    }
    let clamp = a.ty == GgmlType::F32;
    let table = gelu_table();
    let ew = EwOps::detect();
    let n_a = a.ne[0];
    par_rows(
        dst.nrows(),
        nc,
        || (vec![0f32; n_a], vec![0f32; if split.is_some() { nc } else { 0 }], vec![0f32; nc]),
        |(x, y, out), r| {
            let (i1, i2, i3) = dst.row_index(r);
            a.load_row_f32(i1, i2, i3, x)?;
            let (gate, up): (&[f32], &[f32]) = match split {
                Some(b) => {
                    b.load_row_f32(i1, i2, i3, y)?;
                    (&x[..nc], &y[..nc])
                }
                None if swapped => (&x[nc..2 * nc], &x[..nc]),
                None => (&x[..nc], &x[nc..2 * nc]),
            };
            match g {
                GluOp::Swiglu => (ew.swiglu)(out, gate, up),
                GluOp::Geglu => {
                    out.copy_from_slice(gate);
                    (ew.table)(out, table, clamp);
                    out.iter_mut().zip(up).for_each(|(o, &u)| *o *= u);
                }
            }
            dst.store_row_f32(i1, i2, i3, out)
        },
    )
}

/// Every element of `dst` set to `c` (rounded once to the destination type).
fn fill(op: &Op, c: f32, dst: &TView, src: &[TView]) -> Result<()> {
    let _ = (op, src);
    let n0 = dst.ne[0];
    par_rows(
        dst.nrows(),
        n0,
        || vec![c; n0],
        |x, r| {
            let (i1, i2, i3) = dst.row_index(r);
            dst.store_row_f32(i1, i2, i3, x)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::simd::table1;
    use super::*;

    #[test]
    fn gelu_table_matches_formula_on_f16_grid() {
        let t = gelu_table();
        for &x in &[-3.0f32, -0.5, 0.0, 0.25, 1.0, 2.5, 9.5] {
            let want = f16::from_f32(gelu_exact(x)).to_f32();
            assert_eq!(table1(t, true, x), want, "x = {x}");
        }
        assert_eq!(table1(t, true, -11.0), 0.0);
        assert_eq!(table1(t, true, 12.5), 12.5);
        let q = gelu_quick_table();
        assert_eq!(table1(q, false, 1.0), f16::from_f32(gelu_quick_exact(1.0)).to_f32());
        let mut v = vec![-11.0f32, -0.5, 0.5, 3.0, 12.0, 1.0, 2.0, -2.0, 0.1];
        let want: Vec<f32> = v.iter().map(|&x| table1(t, true, x)).collect();
        (EwOps::detect().table)(&mut v, t, true);
        assert_eq!(v, want);
    }

    #[test]
    fn par_rows_visits_every_row_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        par_rows(
            1000,
            100,
            || (),
            |_, r| {
                hits[r].fetch_add(1, Ordering::Relaxed);
                Ok(())
            },
        )
        .unwrap();
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }
}
