//! Differential cases of the reduction family: sum, sum_rows, mean, argmax,
//! top_k, argsort, on odd and vocabulary-sized rows, permuted inputs, and
//! rows with deliberate ties where ggml's result is deterministic (argmax).

use crate::fam_elementwise::{input, Layout};
use crate::harness::{Built, Case, Compare, Init, Rng, NMSE_FLOAT};
use shardgraph::{GgmlType, SortOrder};

use GgmlType::{BF16, F16, F32};

const NMSE: Compare = NMSE_FLOAT;

/// `n` distinct values in (−1, 1), shuffled deterministically, so sorts and
/// maxima have no ties.
fn distinct(n: usize, seed: u64) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|i| (2.0 * i as f64 / n as f64 - 1.0) as f32).collect();
    let mut rng = Rng::new(seed);
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

fn numel(ne: [i64; 4]) -> usize {
    ne.iter().product::<i64>() as usize
}

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();

    // sum: F32/F16/BF16, contiguous and permuted.
    for ty in [F32, F16, BF16] {
        for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [4096, 3, 1, 1], [33, 7, 2, 1]] {
            for layout in [Layout::Cont, Layout::Perm] {
                let vars = format!("type={},ne={ne:?},layout={layout:?}", ty.name());
                v.push(Case::new("sum", vars, NMSE, move |ctx| {
                    let (l, a) = input(ctx, ty, ne, layout)?;
                    let out = ctx.sum(a)?;
                    // Positive values: a sum near zero would make the relative error meaningless.
                    Ok(Built::out(&[out]).init(l, Init::Uniform(0.0, 1.0)))
                }));
            }
        }
    }

    // sum_rows / mean: F32.
    for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [4096, 3, 1, 1], [33, 7, 2, 1], [32000, 2, 1, 1]] {
        for layout in [Layout::Cont, Layout::Perm, Layout::View] {
            if ne[0] == 32000 && layout != Layout::Cont {
                continue;
            }
            let vars = format!("ne={ne:?},layout={layout:?}");
            v.push(Case::new("sum_rows", vars.clone(), NMSE, move |ctx| {
                let (_, a) = input(ctx, F32, ne, layout)?;
                let out = ctx.sum_rows(a)?;
                Ok(Built::out(&[out]))
            }));
            v.push(Case::new("mean", vars, NMSE, move |ctx| {
                let (_, a) = input(ctx, F32, ne, layout)?;
                let out = ctx.mean(a)?;
                Ok(Built::out(&[out]))
            }));
        }
    }

    // argmax: F32 matrices, distinct values; vocabulary-sized rows.
    for ne in [[10, 5, 1, 1], [1, 1, 1, 1], [33, 7, 1, 1], [32000, 3, 1, 1], [151936, 2, 1, 1]] {
        v.push(Case::new("argmax", format!("ne={ne:?}"), Compare::Exact, move |ctx| {
            let a = ctx.new_tensor(F32, &ne)?;
            let out = ctx.argmax(a)?;
            Ok(Built::out(&[out]).init(a, Init::Values(distinct(numel(ne), 7 + ne[0] as u64))))
        }));
    }
    // argmax with ties: ggml keeps the last maximal index.
    v.push(Case::new("argmax", "ne=[6,3,1,1],ties", Compare::Exact, |ctx| {
        let a = ctx.new_tensor(F32, &[6, 3])?;
        let vals = vec![
            1.0, 3.0, 2.0, 3.0, 0.0, -1.0, //
            5.0, 5.0, 5.0, 5.0, 5.0, 5.0, //
            -2.0, -1.0, -1.0, -3.0, -4.0, -5.0,
        ];
        let out = ctx.argmax(a)?;
        Ok(Built::out(&[out]).init(a, Init::Values(vals)))
    }));
    // argmax on a view (strided rows) of a bigger matrix.
    v.push(Case::new("argmax", "ne=[100,4,1,1],view", Compare::Exact, |ctx| {
        let (l, a) = input(ctx, F32, [100, 4, 1, 1], Layout::View)?;
        let out = ctx.argmax(a)?;
        Ok(Built::out(&[out]).init(l, Init::Values(distinct(103 * 4, 3))))
    }));

    // top_k: order within k is unspecified in ggml (it swaps the first two).
    for (ne, k) in [
        ([10, 5, 4, 3], 3),
        ([10, 5, 4, 3], 10),
        ([7, 3, 1, 1], 1),
        ([1, 1, 1, 1], 1),
        ([33, 7, 2, 1], 0),
        ([32000, 2, 1, 1], 40),
        ([151936, 2, 1, 1], 8),
    ] {
        v.push(Case::new("top_k", format!("ne={ne:?},k={k}"), Compare::ExactSortedRows, move |ctx| {
            let a = ctx.new_tensor(F32, &ne)?;
            let out = ctx.top_k(a, k)?;
            Ok(Built::out(&[out]).init(a, Init::Values(distinct(numel(ne), 11 + ne[0] as u64))))
        }));
    }
    v.push(Case::new("top_k", "ne=[50,6,1,1],k=5,view", Compare::ExactSortedRows, |ctx| {
        let (l, a) = input(ctx, F32, [50, 6, 1, 1], Layout::View)?;
        let out = ctx.top_k(a, 5)?;
        Ok(Built::out(&[out]).init(l, Init::Values(distinct(53 * 6, 5))))
    }));

    // argsort: distinct values, so ggml's (unstable) order is unique.
    for order in [SortOrder::Asc, SortOrder::Desc] {
        for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [33, 7, 2, 1], [1000, 3, 1, 1]] {
            v.push(Case::new("argsort", format!("ne={ne:?},order={order:?}"), Compare::Exact, move |ctx| {
                let a = ctx.new_tensor(F32, &ne)?;
                let out = ctx.argsort(a, order)?;
                Ok(Built::out(&[out]).init(a, Init::Values(distinct(numel(ne), 13 + ne[0] as u64))))
            }));
        }
    }
    v
}
