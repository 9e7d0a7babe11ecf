//! Differential cases of the element-wise family: add/sub/mul/div with
//! broadcasting and mixed types, add1, scale, clamp, sqr, sqrt, the unary
//! activations, fused and split GLUs, fill. Inputs come contiguous,
//! permuted (dims 1/2 swapped: packed rows, non-monotonic strides), as
//! offset views with padded rows, and (src1 of binary ops) transposed.

use crate::harness::{Builder, Built, Case, Compare, Init, Tol, NMSE_FLOAT};
use shardgraph::{GgmlType, GluOp, Result, TensorId, UnaryOp};

use GgmlType::{BF16, F16, F32};

/// How an input is laid out in the case graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Layout {
    /// A plain leaf.
    Cont,
    /// A leaf `[ne0, ne2, ne1, ne3]` permuted to `[ne0, ne1, ne2, ne3]`.
    Perm,
    /// A view into a leaf with 3 extra elements per row, 1 element in.
    View,
    /// A leaf `[ne1, ne0, ne2, ne3]` transposed (rows not packed).
    Trans,
}

/// Builds an input of shape `ne` with `layout`; returns (leaf, input).
pub fn input(ctx: &mut Builder, ty: GgmlType, ne: [i64; 4], layout: Layout) -> Result<(TensorId, TensorId)> {
    match layout {
        Layout::Cont => {
            let l = ctx.new_tensor(ty, &ne)?;
            Ok((l, l))
        }
        Layout::Perm => {
            let l = ctx.new_tensor(ty, &[ne[0], ne[2], ne[1], ne[3]])?;
            let p = ctx.permute(l, [0, 2, 1, 3])?;
            Ok((l, p))
        }
        Layout::View => {
            let l = ctx.new_tensor(ty, &[ne[0] + 3, ne[1], ne[2], ne[3]])?;
            let nb = ctx.nb(l);
            let v = ctx.view_4d(l, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], ty.type_size())?;
            Ok((l, v))
        }
        Layout::Trans => {
            let l = ctx.new_tensor(ty, &[ne[1], ne[0], ne[2], ne[3]])?;
            let t = ctx.transpose(l)?;
            Ok((l, t))
        }
    }
}

fn tn(t: GgmlType) -> &'static str {
    t.name()
}

const NMSE: Compare = NMSE_FLOAT;

/// A block-type result: ggml re-quantizes the F32 result into the block
/// type with its CPU quantizer, and so do we (the CPU and the emulated GPU
/// measure 0; a real GPU at ggml's 5e-4).
const QUANT_RESULT: Compare = Compare::Nmse(Tol::new(1e-9, 1e-9, 5e-4));

fn binary_cases(v: &mut Vec<Case>) {
    type Ctor = fn(&mut Builder, TensorId, TensorId) -> Result<TensorId>;
    let ops: [(&'static str, Ctor); 4] =
        [("add", Builder::add), ("sub", Builder::sub), ("mul", Builder::mul), ("div", Builder::div)];
    // (src0 shape, src1 shape, src0 layout, src1 layout)
    let shapes: Vec<([i64; 4], [i64; 4], Layout, Layout)> = vec![
        ([10, 5, 4, 3], [10, 5, 4, 3], Layout::Cont, Layout::Cont),
        ([10, 5, 4, 3], [10, 1, 4, 1], Layout::Cont, Layout::Cont),
        ([10, 5, 4, 3], [1, 5, 1, 1], Layout::Cont, Layout::Cont),
        ([10, 5, 4, 3], [10, 1, 1, 1], Layout::Cont, Layout::Cont),
        ([10, 5, 4, 3], [5, 1, 2, 3], Layout::Cont, Layout::Cont),
        ([1, 1, 1, 1], [1, 1, 1, 1], Layout::Cont, Layout::Cont),
        ([4096, 3, 1, 1], [4096, 1, 1, 1], Layout::Cont, Layout::Cont),
        ([33, 7, 2, 1], [33, 7, 1, 1], Layout::Cont, Layout::Cont),
        ([10, 5, 4, 3], [10, 1, 4, 1], Layout::Perm, Layout::Cont),
        ([10, 5, 4, 3], [10, 5, 1, 3], Layout::View, Layout::Perm),
        ([10, 5, 4, 3], [10, 5, 4, 1], Layout::Cont, Layout::Trans),
    ];
    let types = [(F32, F32), (F16, F16), (BF16, BF16), (F16, F32), (BF16, F32)];
    for (name, ctor) in ops {
        for &(ne0, ne1, l0, l1) in &shapes {
            for &(t0, t1) in &types {
                // Mixed and 16-bit types on a subset of shapes.
                if (t0, t1) != (F32, F32) && !(ne0 == [10, 5, 4, 3] && matches!(l0, Layout::Cont | Layout::Perm)) {
                    continue;
                }
                let vars = format!(
                    "type_a={},type_b={},ne_a={ne0:?},ne_b={ne1:?},layout_a={l0:?},layout_b={l1:?}",
                    tn(t0),
                    tn(t1)
                );
                v.push(Case::new(name, vars, NMSE, move |ctx| {
                    let (_, a) = input(ctx, t0, ne0, l0)?;
                    let (lb, b) = input(ctx, t1, ne1, l1)?;
                    let out = ctor(ctx, a, b)?;
                    let mut built = Built::out(&[out]);
                    if name == "div" {
                        built = built.init(lb, Init::Uniform(0.5, 2.0));
                    }
                    Ok(built)
                }));
            }
        }
    }
    // A quantized src0 plus F32 (ggml re-quantizes with its CPU quantizer).
    for q in [GgmlType::Q8_0, GgmlType::Q4_0] {
        v.push(Case::new("add", format!("type_a={},type_b=f32,ne=[64,3,2,1]", tn(q)), QUANT_RESULT, move |ctx| {
            let a = ctx.new_tensor(q, &[64, 3, 2, 1])?;
            let b = ctx.new_tensor(F32, &[64, 3, 2, 1])?;
            let out = ctx.add(a, b)?;
            Ok(Built::out(&[out]))
        }));
    }
}

fn add1_cases(v: &mut Vec<Case>) {
    let types = [(F32, F32), (F16, F16), (F16, F32), (BF16, BF16), (BF16, F32)];
    for &(t0, t1) in &types {
        for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [4096, 3, 1, 1]] {
            v.push(Case::new("add1", format!("type_a={},type_b={},ne={ne:?}", tn(t0), tn(t1)), NMSE, move |ctx| {
                let a = ctx.new_tensor(t0, &ne)?;
                let b = ctx.new_tensor(t1, &[1])?;
                let out = ctx.add1(a, b)?;
                Ok(Built::out(&[out]))
            }));
        }
    }
    // Quantized src0 (ne3 = 1: ggml's add1_q_f32 indexes dst dim 3 with nb0).
    v.push(Case::new("add1", "type_a=q8_0,type_b=f32,ne=[64,3,2,1]", QUANT_RESULT, |ctx| {
        let a = ctx.new_tensor(GgmlType::Q8_0, &[64, 3, 2, 1])?;
        let b = ctx.new_tensor(F32, &[1])?;
        let out = ctx.add1(a, b)?;
        Ok(Built::out(&[out]))
    }));
}

fn affine_cases(v: &mut Vec<Case>) {
    for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [4096, 3, 1, 1], [33, 7, 2, 1]] {
        for (s, b) in [(0.5f32, 0.0f32), (2.0, -0.75), (-1.25, 3.0)] {
            v.push(Case::new("scale", format!("ne={ne:?},s={s},b={b}"), NMSE, move |ctx| {
                let a = ctx.new_tensor(F32, &ne)?;
                let out = if b == 0.0 { ctx.scale(a, s)? } else { ctx.scale_bias(a, s, b)? };
                Ok(Built::out(&[out]))
            }));
        }
    }
    for ty in [F32, F16] {
        for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [33, 7, 2, 1]] {
            for (lo, hi) in [(-0.5f32, 0.5f32), (0.0, 0.25), (-2.0, 2.0)] {
                v.push(Case::new("clamp", format!("type={},ne={ne:?},min={lo},max={hi}", tn(ty)), NMSE, move |ctx| {
                    let a = ctx.new_tensor(ty, &ne)?;
                    let out = ctx.clamp(a, lo, hi)?;
                    Ok(Built::out(&[out]))
                }));
            }
        }
    }
    for ty in [F32, F16, BF16] {
        for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [4096, 3, 1, 1]] {
            for layout in [Layout::Cont, Layout::Perm] {
                v.push(Case::new("sqr", format!("type={},ne={ne:?},layout={layout:?}", tn(ty)), NMSE, move |ctx| {
                    let (_, a) = input(ctx, ty, ne, layout)?;
                    let out = ctx.sqr(a)?;
                    Ok(Built::out(&[out]))
                }));
                v.push(Case::new("sqrt", format!("type={},ne={ne:?},layout={layout:?}", tn(ty)), NMSE, move |ctx| {
                    let (l, a) = input(ctx, ty, ne, layout)?;
                    let out = ctx.sqrt(a)?;
                    Ok(Built::out(&[out]).init(l, Init::Uniform(0.0, 10.0)))
                }));
            }
        }
    }
}

fn unary_cases(v: &mut Vec<Case>) {
    for u in UnaryOp::ALL {
        let types: &[GgmlType] = match u {
            UnaryOp::Gelu | UnaryOp::GeluQuick | UnaryOp::Silu => &[F32, F16],
            _ => &[F32, F16, BF16],
        };
        // Ranges that reach every branch (gelu's ±10 clamp, softplus's x > 20).
        let (lo, hi) = match u {
            UnaryOp::Gelu | UnaryOp::GeluQuick => (-12.0f32, 12.0f32),
            UnaryOp::Softplus => (-30.0, 30.0),
            UnaryOp::Exp => (-6.0, 6.0),
            _ => (-4.0, 4.0),
        };
        for &ty in types {
            let shapes: Vec<([i64; 4], Layout)> = vec![
                ([10, 5, 4, 3], Layout::Cont),
                ([1, 1, 1, 1], Layout::Cont),
                ([4096, 3, 1, 1], Layout::Cont),
                ([33, 7, 2, 1], Layout::Cont),
                ([10, 5, 4, 3], Layout::Perm),
                ([10, 5, 4, 3], Layout::View),
            ];
            for (ne, layout) in shapes {
                let vars = format!("type={},ne={ne:?},layout={layout:?}", tn(ty));
                v.push(Case::new(u.name(), vars, NMSE, move |ctx| {
                    let (l, a) = input(ctx, ty, ne, layout)?;
                    let out = ctx.unary(a, u)?;
                    Ok(Built::out(&[out]).init(l, Init::Uniform(lo, hi)))
                }));
            }
        }
    }
}

fn glu_cases(v: &mut Vec<Case>) {
    for g in [GluOp::Swiglu, GluOp::Geglu] {
        for ty in [F32, F16] {
            for ne in [[20, 5, 4, 3], [66, 7, 2, 1], [33, 7, 2, 1], [2, 1, 1, 1], [8192, 3, 1, 1]] {
                for swapped in [false, true] {
                    let vars = format!("glu={g:?},type={},ne={ne:?},swapped={swapped}", tn(ty));
                    v.push(Case::new("glu", vars, NMSE, move |ctx| {
                        let a = ctx.new_tensor(ty, &ne)?;
                        let out = ctx.glu(a, g, swapped)?;
                        Ok(Built::out(&[out]).init(a, Init::Uniform(-12.0, 12.0)))
                    }));
                }
            }
            for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [4096, 3, 1, 1]] {
                let vars = format!("glu={g:?},type={},ne={ne:?},split", tn(ty));
                v.push(Case::new("glu", vars, NMSE, move |ctx| {
                    let a = ctx.new_tensor(ty, &ne)?;
                    let b = ctx.new_tensor(ty, &ne)?;
                    let out = match g {
                        GluOp::Swiglu => ctx.swiglu_split(a, b)?,
                        GluOp::Geglu => ctx.geglu_split(a, b)?,
                    };
                    Ok(Built::out(&[out]).init(a, Init::Uniform(-12.0, 12.0)))
                }));
            }
            // Split halves of one fused tensor through row-strided views.
            let vars = format!("glu={g:?},type={},ne=[16,6,1,1],split_views", tn(ty));
            v.push(Case::new("glu", vars, NMSE, move |ctx| {
                let fused = ctx.new_tensor(ty, &[32, 6])?;
                let rb = ctx.nb(fused)[1];
                let gate = ctx.view_2d(fused, 16, 6, rb, 0)?;
                let up = ctx.view_2d(fused, 16, 6, rb, 16 * ty.type_size())?;
                let out = ctx.glu_split(gate, up, g)?;
                Ok(Built::out(&[out]).init(fused, Init::Uniform(-4.0, 4.0)))
            }));
        }
    }
}

fn fill_cases(v: &mut Vec<Case>) {
    for ty in [F32, F16] {
        for ne in [[10, 5, 4, 3], [1, 1, 1, 1], [33, 7, 2, 1]] {
            for c in [0.3f32, -2.0, 0.0] {
                v.push(Case::new("fill", format!("type={},ne={ne:?},c={c}", tn(ty)), Compare::Exact, move |ctx| {
                    let a = ctx.new_tensor(ty, &ne)?;
                    let out = ctx.fill(a, c)?;
                    Ok(Built::out(&[out]))
                }));
            }
        }
    }
}

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    binary_cases(&mut v);
    add1_cases(&mut v);
    affine_cases(&mut v);
    unary_cases(&mut v);
    glu_cases(&mut v);
    fill_cases(&mut v);
    v
}
