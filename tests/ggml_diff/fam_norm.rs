//! Differential cases of the normalisation family: rms_norm, norm, l2_norm
//! on odd, long (vocabulary-sized) and non-contiguous rows; soft_max and
//! soft_max_ext with scale, F16/F32 masks (taller than the input, broadcast
//! over dims 2/3, causal −∞ entries) and ALiBi (power-of-two and other head
//! counts); soft_max with attention sinks (`ggml_soft_max_add_sinks`).

use crate::fam_elementwise::{input, Layout};
use crate::harness::{Builder, Built, Case, Compare, Init, NMSE_FLOAT};
use shardgraph::{GgmlType, Result, TensorId};

use GgmlType::{F16, F32};

const NMSE: Compare = NMSE_FLOAT;

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    norm_cases(&mut v);
    soft_max_cases(&mut v);
    soft_max_sink_cases(&mut v);
    v
}

fn norm_cases(v: &mut Vec<Case>) {
    type Ctor = fn(&mut Builder, TensorId, f32) -> Result<TensorId>;
    let ops: [(&'static str, Ctor, f32); 3] =
        [("rms_norm", Builder::rms_norm, 1e-6), ("norm", Builder::norm, 1e-5), ("l2_norm", Builder::l2_norm, 1e-12)];
    for (name, ctor, eps) in ops {
        let shapes: Vec<([i64; 4], Layout)> = vec![
            ([10, 5, 4, 3], Layout::Cont),
            ([1, 1, 1, 1], Layout::Cont),
            ([4096, 3, 1, 1], Layout::Cont),
            ([33, 7, 2, 1], Layout::Cont),
            ([151936, 2, 1, 1], Layout::Cont),
            ([10, 5, 4, 3], Layout::Perm),
            ([64, 5, 4, 1], Layout::View),
            // ggml's rms_norm asserts packed rows; norm and l2_norm take strided ones.
            ([10, 5, 4, 3], Layout::Trans),
        ];
        for (ne, layout) in shapes {
            if name == "rms_norm" && layout == Layout::Trans {
                continue;
            }
            for eps in [eps, 0.1] {
                if eps == 0.1 && ne != [10, 5, 4, 3] {
                    continue;
                }
                let vars = format!("ne={ne:?},layout={layout:?},eps={eps}");
                v.push(Case::new(name, vars, NMSE, move |ctx| {
                    let (l, a) = input(ctx, F32, ne, layout)?;
                    let out = ctor(ctx, a, eps)?;
                    // An offset keeps norm's centred rows away from all-zero.
                    Ok(Built::out(&[out]).init(l, Init::Uniform(-1.0, 3.0)))
                }));
            }
        }
    }
}

/// A causal mask `[n_kv, n_rows]`: row `i` sees keys `0..=i + n_kv − n_rows`.
fn causal(n_kv: i64, n_rows: i64, ne2: i64, ne3: i64) -> Vec<f32> {
    let mut m = Vec::new();
    for _ in 0..ne2 * ne3 {
        for i in 0..n_rows {
            for j in 0..n_kv {
                m.push(if j <= i + n_kv - n_rows { 0.0 } else { f32::NEG_INFINITY });
            }
        }
    }
    m
}

fn soft_max_cases(v: &mut Vec<Case>) {
    // Plain soft_max and scaled, no mask.
    for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [33, 7, 2, 1], [4096, 3, 1, 1], [32000, 4, 1, 1], [151936, 2, 1, 1]] {
        for scale in [1.0f32, 0.125] {
            v.push(Case::new("soft_max", format!("ne={ne:?},scale={scale},mask=none"), NMSE, move |ctx| {
                let a = ctx.new_tensor(F32, &ne)?;
                let out = if scale == 1.0 { ctx.soft_max(a)? } else { ctx.soft_max_ext(a, None, scale, 0.0)? };
                Ok(Built::out(&[out]).init(a, Init::Uniform(-8.0, 8.0)))
            }));
        }
    }
    // Masks: (a shape, mask shape, max_bias).
    let masked: Vec<([i64; 4], [i64; 4], f32)> = vec![
        ([10, 5, 4, 3], [10, 5, 1, 1], 0.0),
        ([10, 5, 4, 3], [10, 8, 4, 3], 0.0),
        ([10, 5, 4, 3], [10, 5, 2, 1], 0.0),
        ([10, 5, 4, 3], [10, 5, 4, 1], 0.0),
        ([10, 5, 4, 3], [10, 5, 1, 3], 0.0),
        ([10, 5, 4, 3], [10, 5, 1, 1], 8.0),
        ([16, 3, 12, 1], [16, 3, 1, 1], 8.0),
        ([16, 3, 12, 2], [16, 4, 3, 2], 4.0),
        ([33, 7, 5, 1], [33, 7, 1, 1], 1.0),
        ([4096, 2, 2, 1], [4096, 2, 1, 1], 0.0),
    ];
    for ty in [F32, F16] {
        for &(ne, nem, max_bias) in &masked {
            for scale in [1.0f32, 0.25] {
                let vars = format!("ne={ne:?},mask={}{nem:?},scale={scale},max_bias={max_bias}", ty.name());
                v.push(Case::new("soft_max", vars, NMSE, move |ctx| {
                    let a = ctx.new_tensor(F32, &ne)?;
                    let m = ctx.new_tensor(ty, &nem)?;
                    let out = ctx.soft_max_ext(a, Some(m), scale, max_bias)?;
                    Ok(Built::out(&[out]).init(a, Init::Uniform(-5.0, 5.0)).init(m, Init::Uniform(-2.0, 0.0)))
                }));
            }
        }
        // Causal −∞ mask over kv = 12, 5 query rows, 4 heads.
        let vars = format!("ne=[12,5,4,1],mask={}[12,5,1,1],causal", ty.name());
        v.push(Case::new("soft_max", vars, NMSE, move |ctx| {
            let a = ctx.new_tensor(F32, &[12, 5, 4, 1])?;
            let m = ctx.new_tensor(ty, &[12, 5, 1, 1])?;
            let out = ctx.soft_max_ext(a, Some(m), 0.125, 0.0)?;
            Ok(Built::out(&[out]).init(m, Init::Values(causal(12, 5, 1, 1))))
        }));
    }
    // The input is a contiguous result of another node (a permuted copy).
    v.push(Case::new("soft_max", "ne=[10,5,4,3],src=mul", NMSE, |ctx| {
        let (_, a) = input(ctx, F32, [10, 5, 4, 3], Layout::Perm)?;
        let b = ctx.new_tensor(F32, &[10, 1, 1, 1])?;
        let x = ctx.mul(a, b)?;
        let out = ctx.soft_max_ext(x, None, 2.0, 0.0)?;
        Ok(Built::out(&[out]))
    }));
}

/// soft_max with sinks: one F32 logit per head (`ne2`) that joins each row's
/// normaliser (`ggml_soft_max_add_sinks`), without a mask (ours gets a zero
/// mask in its place) and with F32/F16 masks, scales, ALiBi and fully
/// masked rows.
fn soft_max_sink_cases(v: &mut Vec<Case>) {
    // (a shape, mask: None or (type, shape), scale, max_bias)
    type Sink = ([i64; 4], Option<(GgmlType, [i64; 4])>, f32, f32);
    let cases: Vec<Sink> = vec![
        ([10, 5, 4, 3], None, 1.0, 0.0),
        ([10, 5, 4, 3], None, 0.125, 0.0),
        ([33, 7, 8, 1], None, 0.5, 0.0),
        ([1, 1, 1, 1], None, 1.0, 0.0),
        ([4096, 2, 2, 1], None, 1.0, 0.0),
        ([10, 5, 4, 3], Some((F32, [10, 5, 1, 1])), 1.0, 0.0),
        ([10, 5, 4, 3], Some((F16, [10, 8, 4, 3])), 0.25, 0.0),
        ([10, 5, 4, 3], Some((F16, [10, 5, 2, 1])), 0.125, 0.0),
        ([16, 3, 12, 2], Some((F32, [16, 4, 3, 2])), 0.5, 4.0),
        ([16, 3, 12, 1], Some((F16, [16, 3, 1, 1])), 1.0, 8.0),
        ([64, 7, 64, 1], Some((F16, [64, 7, 1, 1])), 0.125, 0.0),
    ];
    for (ne, mask, scale, max_bias) in cases {
        let m = mask.map_or("none".to_string(), |(ty, nem)| format!("{}{nem:?}", ty.name()));
        let vars = format!("ne={ne:?},mask={m},scale={scale},max_bias={max_bias},sinks");
        v.push(Case::new("soft_max", vars, NMSE, move |ctx| {
            let a = ctx.new_tensor(F32, &ne)?;
            let m = match mask {
                Some((ty, nem)) => Some(ctx.new_tensor(ty, &nem)?),
                None => None,
            };
            let sm = ctx.soft_max_ext(a, m, scale, max_bias)?;
            let sinks = ctx.new_tensor_1d(F32, ne[2])?;
            let out = ctx.soft_max_add_sinks(sm, sinks)?;
            let mut b = Built::out(&[out]).init(a, Init::Uniform(-5.0, 5.0)).init(sinks, Init::Uniform(-4.0, 4.0));
            if let Some(m) = m {
                b = b.init(m, Init::Uniform(-2.0, 0.0));
            }
            Ok(b)
        }));
    }
    // Causal −∞ masks whose third row is fully masked: the sink alone
    // normalises it, so the row is 0 (ggml gives NaN there without sinks).
    for ty in [F32, F16] {
        let vars = format!("ne=[12,5,4,1],mask={}[12,5,1,1],causal,masked_row,sinks", ty.name());
        v.push(Case::new("soft_max", vars, NMSE, move |ctx| {
            let a = ctx.new_tensor(F32, &[12, 5, 4, 1])?;
            let m = ctx.new_tensor(ty, &[12, 5, 1, 1])?;
            let sm = ctx.soft_max_ext(a, Some(m), 0.125, 0.0)?;
            let sinks = ctx.new_tensor_1d(F32, 4)?;
            let out = ctx.soft_max_add_sinks(sm, sinks)?;
            let mut vals = causal(12, 5, 1, 1);
            vals[2 * 12..3 * 12].fill(f32::NEG_INFINITY);
            Ok(Built::out(&[out]).init(m, Init::Values(vals)).init(sinks, Init::Values(vec![-1.0, 0.0, 2.5, 10.0])))
        }));
    }
}
