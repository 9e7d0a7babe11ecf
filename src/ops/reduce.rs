//! Reductions and index selection: `sum`, `sum_rows`, `mean`, `argmax`,
//! `top_k`, `argsort`.
//!
//! Shape rules follow ggml's constructors in `ggml.c` (`ggml_sum`,
//! `ggml_sum_rows`, `ggml_mean`, `ggml_argmax`, `ggml_top_k`,
//! `ggml_argsort`); accepted types are those ggml's CPU backend computes
//! (`ops.cpp`).

use super::elementwise::expect_type;
use crate::error::{Error, Result};
use crate::graph::Context;
use crate::ops::{Op, SortOrder};
use crate::tensor::{GgmlType, TensorId};

impl Context {
    /// Sum of all elements of `a` → `[1, 1, 1, 1]` of `a`'s type (`ggml_sum`).
    /// Types F32/F16/BF16. F32 accumulates in f64; F16/BF16 in f32, row by
    /// row, as ggml's CPU does.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for another type.
    pub fn sum(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "sum", "src0")?;
        expect_type("sum", "src0", ta, &[GgmlType::F32, GgmlType::F16, GgmlType::BF16])?;
        let ty = ta.ty;
        self.push_op(ty, [1, 1, 1, 1], Op::Sum, &[a])
    }

    /// Sum of each row of `a` `[ne0, ne1, ne2, ne3]` → `[1, ne1, ne2, ne3]`
    /// (`ggml_sum_rows`). F32 only (ggml's CPU), accumulated in f64.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for another type.
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "sum_rows", "src0")?;
        expect_type("sum_rows", "src0", ta, &[GgmlType::F32])?;
        let ne = [1, ta.ne[1], ta.ne[2], ta.ne[3]];
        self.push_op(GgmlType::F32, ne, Op::SumRows, &[a])
    }

    /// Mean of each row of `a` `[ne0, ne1, ne2, ne3]` → F32 `[1, ne1, ne2,
    /// ne3]` (`ggml_mean`). F32 only (ggml's CPU).
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for another type.
    pub fn mean(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "mean", "src0")?;
        expect_type("mean", "src0", ta, &[GgmlType::F32])?;
        let ne = [1, ta.ne[1], ta.ne[2], ta.ne[3]];
        self.push_op(GgmlType::F32, ne, Op::Mean, &[a])
    }

    /// Index of the largest element of each row of the F32 matrix `a`
    /// `[ne0, ne1]` → I32 `[ne1]` (`ggml_argmax`). On ties ggml's CPU loop
    /// keeps the **last** maximal index, and so does ours.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] if `a` is not a matrix (`ne2 = ne3 = 1`),
    /// not F32, or has `ne0 > i32::MAX`.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        let ta = self.operand(a, "argmax", "src0")?;
        if ta.ne[2] != 1 || ta.ne[3] != 1 {
            return Err(Error::operand("argmax", "src0", format!("{} is not a matrix (ne2 = ne3 = 1)", ta.describe())));
        }
        if ta.ne[0] > i32::MAX as i64 {
            return Err(Error::operand("argmax", "src0", format!("{}: ne0 exceeds i32::MAX", ta.describe())));
        }
        expect_type("argmax", "src0", ta, &[GgmlType::F32])?;
        let ne = [ta.ne[1], 1, 1, 1];
        self.push_op(GgmlType::I32, ne, Op::Argmax, &[a])
    }

    /// Indices of the `k` largest elements of each row of the F32 tensor `a`
    /// `[ne0, ne1, ne2, ne3]` → I32 `[k, ne1, ne2, ne3]` (`ggml_top_k`).
    ///
    /// ggml leaves the order within the `k` unspecified (its CPU kernel even
    /// swaps the first two); ours is deterministic: descending value, ties
    /// by lower index.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for `k < 0`, `k > ne0`, or a non-F32 `a`.
    pub fn top_k(&mut self, a: TensorId, k: i32) -> Result<TensorId> {
        let ta = self.operand(a, "top_k", "src0")?;
        if k < 0 || k as i64 > ta.ne[0] {
            return Err(Error::operand("top_k", "k", format!("k = {k} outside 0..=ne0 of src0 {}", ta.describe())));
        }
        expect_type("top_k", "src0", ta, &[GgmlType::F32])?;
        let ne = [k as i64, ta.ne[1], ta.ne[2], ta.ne[3]];
        self.push_op(GgmlType::I32, ne, Op::TopK { k }, &[a])
    }

    /// Indices that sort each row of the F32 tensor `a` → I32 of `a`'s shape
    /// (`ggml_argsort`). Our sort is stable (equal values keep index order);
    /// ggml's `std::sort` leaves the order of equal values unspecified.
    ///
    /// # Errors
    /// [`Error::InvalidOperand`] for a non-F32 `a` or `ne0 > i32::MAX`.
    pub fn argsort(&mut self, a: TensorId, order: SortOrder) -> Result<TensorId> {
        let ta = self.operand(a, "argsort", "src0")?;
        if ta.ne[0] > i32::MAX as i64 {
            return Err(Error::operand("argsort", "src0", format!("{}: ne0 exceeds i32::MAX", ta.describe())));
        }
        expect_type("argsort", "src0", ta, &[GgmlType::F32])?;
        let ne = ta.ne;
        self.push_op(GgmlType::I32, ne, Op::Argsort { order }, &[a])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_util::err_names;

    #[test]
    fn shapes_and_errors() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_4d(GgmlType::F32, 10, 5, 4, 3).unwrap();
        let s = ctx.sum(a).unwrap();
        assert_eq!(ctx.tensor(s).unwrap().ne, [1, 1, 1, 1]);
        let r = ctx.sum_rows(a).unwrap();
        assert_eq!(ctx.tensor(r).unwrap().ne, [1, 5, 4, 3]);
        let t = ctx.top_k(a, 3).unwrap();
        assert_eq!(ctx.tensor(t).unwrap().ne, [3, 5, 4, 3]);
        assert_eq!(ctx.tensor(t).unwrap().ty, GgmlType::I32);
        err_names(ctx.argmax(a), "argmax", "src0");
        err_names(ctx.top_k(a, 11), "top_k", "k");
        err_names(ctx.top_k(a, -1), "top_k", "k");
        let m = ctx.new_tensor_2d(GgmlType::F32, 7, 2).unwrap();
        let am = ctx.argmax(m).unwrap();
        assert_eq!(ctx.tensor(am).unwrap().ne, [2, 1, 1, 1]);
        let h = ctx.new_tensor_2d(GgmlType::F16, 7, 2).unwrap();
        err_names(ctx.argmax(h), "argmax", "src0");
        err_names(ctx.mean(h), "mean", "src0");
        err_names(ctx.argsort(h, SortOrder::Asc), "argsort", "src0");
        let hs = ctx.sum(h).unwrap();
        assert_eq!(ctx.tensor(hs).unwrap().ty, GgmlType::F16);
    }
}
