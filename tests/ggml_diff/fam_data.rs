//! Differential cases of the data-movement family: views + cont, permute,
//! transpose, dup, cpy/cast (type conversions, quantization), get_rows,
//! set_rows, concat, repeat, pad.

use crate::harness::{Builder, Built, Case, Compare, Init};
use shardgraph::{GgmlType, Result, TensorId};

use GgmlType::*;

fn leaf(ctx: &mut Builder, ty: GgmlType, ne: &[i64]) -> Result<TensorId> {
    ctx.new_tensor(ty, ne)
}

fn ints(n: usize, f: impl Fn(usize) -> i64) -> Init {
    Init::Ints((0..n).map(f).collect())
}

/// Views with offsets, permute/transpose, then cont / cont_Nd / dup.
fn view_cases(v: &mut Vec<Case>) {
    for ty in [F32, F16] {
        let ts = ty.type_size();
        v.push(Case::new("cont", format!("view_1d,type={ty},ne=[37,5],ne0=50,off=13"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[37, 5])?;
            let x = ctx.view_1d(a, 50, 13 * ts)?;
            Ok(Built::out(&[ctx.cont(x)?]))
        }));
        v.push(Case::new("cont", format!("view_2d,type={ty},ne=[16,9,3],view=[7,5]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[16, 9, 3])?;
            let nb1 = ctx.nb(a)[1];
            let x = ctx.view_2d(a, 7, 5, nb1, 3 * ts + 2 * nb1)?;
            Ok(Built::out(&[ctx.cont(x)?]))
        }));
        v.push(Case::new("cont", format!("view_3d,type={ty},ne=[10,8,6],view=[4,3,5]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[10, 8, 6])?;
            let nb = ctx.nb(a);
            let x = ctx.view_3d(a, 4, 3, 5, nb[1] * 2, nb[2], ts + nb[1])?;
            Ok(Built::out(&[ctx.cont(x)?]))
        }));
        v.push(Case::new(
            "cont",
            format!("view_4d,type={ty},ne=[6,5,4,3],view=[5,2,3,2]"),
            Compare::Exact,
            move |ctx| {
                let a = leaf(ctx, ty, &[6, 5, 4, 3])?;
                let nb = ctx.nb(a);
                let x = ctx.view_4d(a, 5, 2, 3, 2, nb[1] * 2, nb[2], nb[3], ts + nb[2])?;
                Ok(Built::out(&[ctx.cont(x)?]))
            },
        ));
        // A view of a view (offsets accumulate).
        v.push(Case::new("cont", format!("view_of_view,type={ty},ne=[12,10]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[12, 10])?;
            let nb1 = ctx.nb(a)[1];
            let x = ctx.view_2d(a, 12, 6, nb1, 2 * nb1)?;
            let y = ctx.view_2d(x, 5, 3, nb1 * 2, 4 * ts + nb1)?;
            Ok(Built::out(&[ctx.cont(y)?]))
        }));
        for axes in [[0, 2, 1, 3], [1, 0, 2, 3], [2, 0, 1, 3], [1, 2, 0, 3], [3, 1, 0, 2], [0, 1, 3, 2]] {
            v.push(Case::new("cont", format!("permute={axes:?},type={ty},ne=[8,5,7,3]"), Compare::Exact, move |ctx| {
                let a = leaf(ctx, ty, &[8, 5, 7, 3])?;
                let p = ctx.permute(a, axes)?;
                Ok(Built::out(&[ctx.cont(p)?]))
            }));
        }
        v.push(Case::new("cont", format!("transpose,type={ty},ne=[13,7,3]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[13, 7, 3])?;
            let t = ctx.transpose(a)?;
            Ok(Built::out(&[ctx.cont(t)?]))
        }));
        v.push(Case::new("cont", format!("cont_2d_of_permute,type={ty},ne=[8,5,7]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[8, 5, 7])?;
            let p = ctx.permute(a, [0, 2, 1, 3])?;
            Ok(Built::out(&[ctx.cont_2d(p, 8 * 7, 5)?]))
        }));
        v.push(Case::new("cont", format!("cont_3d_of_transpose,type={ty},ne=[6,10,2]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[6, 10, 2])?;
            let t = ctx.transpose(a)?;
            Ok(Built::out(&[ctx.cont_3d(t, 4, 15, 2)?]))
        }));
        v.push(Case::new("cont", format!("reshape_then_permute,type={ty},ne=[24,10]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[24, 10])?;
            let r = ctx.reshape_3d(a, 8, 3, 10)?;
            let p = ctx.permute(r, [1, 2, 0, 3])?;
            Ok(Built::out(&[ctx.cont(p)?]))
        }));
        v.push(Case::new("dup", format!("transposed,type={ty},ne=[9,4,3]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[9, 4, 3])?;
            let t = ctx.transpose(a)?;
            Ok(Built::out(&[ctx.dup(t)?]))
        }));
    }
    v.push(Case::new("cont", "transpose,type=i32,ne=[11,6]", Compare::Exact, |ctx| {
        let a = leaf(ctx, I32, &[11, 6])?;
        let t = ctx.transpose(a)?;
        Ok(Built::out(&[ctx.cont(t)?]).init(a, ints(66, |i| (i as i64 * 7919) % 100_003 - 50_000)))
    }));
    v.push(Case::new("cont", "permute=[0,2,1,3],type=q8_0,ne=[64,3,5]", Compare::Exact, |ctx| {
        let a = leaf(ctx, Q8_0, &[64, 3, 5])?;
        let p = ctx.permute(a, [0, 2, 1, 3])?;
        Ok(Built::out(&[ctx.cont(p)?]))
    }));
    // (A block type with a non-contiguous source and a new ne0 is covered by a
    // unit test: ggml's dup_bytes copies `ne00 · type_size` bytes per row there.)
    v.push(Case::new("cont", "reshape_4d,type=f32,ne=[12,10]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[12, 10])?;
        let r = ctx.reshape_4d(a, 3, 4, 5, 2)?;
        let p = ctx.permute(r, [3, 2, 1, 0])?;
        Ok(Built::out(&[ctx.cont(p)?]))
    }));
}

/// cpy / cast between types and layouts.
fn cpy_cases(v: &mut Vec<Case>) {
    let pairs: [(GgmlType, GgmlType, i64); 17] = [
        (F32, F16, 33),
        (F32, BF16, 33),
        (F32, F32, 33),
        (F16, F32, 33),
        (BF16, F32, 33),
        (F16, BF16, 33),
        (F16, F16, 33),
        (F32, Q8_0, 64),
        (F32, Q4_0, 64),
        (F32, Q4_1, 64),
        (F32, Q5_0, 64),
        (F32, Q4_K, 256),
        (Q8_0, F32, 64),
        (Q4_0, F32, 64),
        (F16, Q8_0, 64),
        (BF16, Q4_0, 64),
        (Q6_K, F32, 256),
    ];
    for (src, dst, ne0) in pairs {
        v.push(Case::new("cpy", format!("src={src},dst={dst},ne=[{ne0},6,2]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, src, &[ne0, 6, 2])?;
            let b = leaf(ctx, dst, &[ne0, 6, 2])?;
            Ok(Built::out(&[ctx.cpy(a, b)?]))
        }));
    }
    // Out of every other block type (ggml's CPU dequantizes to F32 only).
    for (src, ne0) in [(Q4_1, 64), (Q5_0, 64), (Q5_1, 64), (Q2_K, 256), (Q3_K, 256), (Q4_K, 256), (Q5_K, 256)] {
        v.push(Case::new("cpy", format!("src={src},dst=f32,ne=[{ne0},6,2]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, src, &[ne0, 6, 2])?;
            let b = leaf(ctx, F32, &[ne0, 6, 2])?;
            Ok(Built::out(&[ctx.cpy(a, b)?]))
        }));
    }
    // A permuted block-type source (rows of blocks packed, rows strided), and
    // a different destination shape.
    for (src, ne0) in [(Q6_K, 256), (Q5_1, 64)] {
        v.push(Case::new("cpy", format!("src={src} permuted,dst=f32,ne=[{ne0},4,3]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, src, &[ne0, 3, 4])?;
            let p = ctx.permute(a, [0, 2, 1, 3])?;
            let b = leaf(ctx, F32, &[ne0, 4, 3])?;
            Ok(Built::out(&[ctx.cpy(p, b)?]))
        }));
    }
    v.push(Case::new("cpy", "src=q4_K [256,3],dst=f32 [128,6]", Compare::Exact, |ctx| {
        let a = leaf(ctx, Q4_K, &[256, 3])?;
        let b = leaf(ctx, F32, &[128, 6])?;
        Ok(Built::out(&[ctx.cpy(a, b)?]))
    }));
    // Non-contiguous source into quantized/float destinations.
    for dst in [F32, F16, Q8_0, Q4_0] {
        v.push(Case::new("cpy", format!("src=f32 permuted,dst={dst},ne=[64,4,3]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, F32, &[64, 3, 4])?;
            let p = ctx.permute(a, [0, 2, 1, 3])?;
            let b = leaf(ctx, dst, &[64, 4, 3])?;
            Ok(Built::out(&[ctx.cpy(p, b)?]))
        }));
    }
    // Different shapes, same element count.
    v.push(Case::new("cpy", "src=f32 [128,3],dst=q8_0 [64,6]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[128, 3])?;
        let b = leaf(ctx, Q8_0, &[64, 6])?;
        Ok(Built::out(&[ctx.cpy(a, b)?]))
    }));
    v.push(Case::new("cpy", "src=q4_0 [64,3],dst=f32 [32,6]", Compare::Exact, |ctx| {
        let a = leaf(ctx, Q4_0, &[64, 3])?;
        let b = leaf(ctx, F32, &[32, 6])?;
        Ok(Built::out(&[ctx.cpy(a, b)?]))
    }));
    v.push(Case::new("cpy", "src=f32 [6,8],dst=f16 [16,3]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[6, 8])?;
        let b = leaf(ctx, F16, &[16, 3])?;
        Ok(Built::out(&[ctx.cpy(a, b)?]))
    }));
    v.push(Case::new("cpy", "src=f32 transposed [5,7],dst=f32 [35]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[7, 5])?;
        let t = ctx.transpose(a)?;
        let b = leaf(ctx, F32, &[35])?;
        Ok(Built::out(&[ctx.cpy(t, b)?]))
    }));
    // Into a non-contiguous destination (a view of a bigger cache).
    v.push(Case::new("cpy", "src=f32 [8,3],dst=f16 view of [8,10] rows 4..7", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[8, 3])?;
        let cache = leaf(ctx, F16, &[8, 10])?;
        let nb1 = ctx.nb(cache)[1];
        let dv = ctx.view_2d(cache, 8, 3, nb1, 4 * nb1)?;
        Ok(Built::out(&[ctx.cpy(a, dv)?]))
    }));
    v.push(Case::new("cpy", "src=f32 [6,4],dst=f32 transposed [4,6]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[6, 4])?;
        let b = leaf(ctx, F32, &[4, 6])?;
        let bt = ctx.transpose(b)?;
        Ok(Built::out(&[ctx.cpy(a, bt)?]))
    }));
    v.push(Case::new("cpy", "src=i32,dst=f32,ne=[17,3]", Compare::Exact, |ctx| {
        let a = leaf(ctx, I32, &[17, 3])?;
        let b = leaf(ctx, F32, &[17, 3])?;
        Ok(Built::out(&[ctx.cpy(a, b)?]).init(a, ints(51, |i| (i as i64 * 104_729) % 2_000_001 - 1_000_000)))
    }));
    v.push(Case::new("cpy", "src=f32,dst=i32,ne=[17,3]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[17, 3])?;
        let b = leaf(ctx, I32, &[17, 3])?;
        Ok(Built::out(&[ctx.cpy(a, b)?]).init(a, Init::Uniform(-1000.0, 1000.0)))
    }));
    for ty in [F16, BF16, Q8_0] {
        v.push(Case::new("cpy", format!("cast,src=f32,dst={ty},ne=[64,5]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, F32, &[64, 5])?;
            Ok(Built::out(&[ctx.cast(a, ty)?]))
        }));
    }
}

fn get_rows_cases(v: &mut Vec<Case>) {
    let idx = [3i64, 0, 7, 3, 19, 1, 0];
    for (ty, ne0) in [
        (F32, 10),
        (F16, 10),
        (BF16, 10),
        (Q8_0, 64),
        (Q4_0, 64),
        (Q4_1, 64),
        (Q5_0, 64),
        (Q5_1, 64),
        (Q2_K, 256),
        (Q3_K, 256),
        (Q4_K, 256),
        (Q5_K, 256),
        (Q6_K, 256),
    ] {
        v.push(Case::new("get_rows", format!("type={ty},ne=[{ne0},20],idx={idx:?}"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[ne0, 20])?;
            let b = leaf(ctx, I32, &[idx.len() as i64])?;
            Ok(Built::out(&[ctx.get_rows(a, b)?]).init(b, Init::Ints(idx.to_vec())))
        }));
    }
    // Batched: a [12, 10, 3, 2], b [5, 3, 2].
    for ty in [F32, F16, Q8_0] {
        let ne0 = if ty == Q8_0 { 32 } else { 12 };
        v.push(Case::new(
            "get_rows",
            format!("batched,type={ty},ne=[{ne0},10,3,2],idx=[5,3,2]"),
            Compare::Exact,
            move |ctx| {
                let a = leaf(ctx, ty, &[ne0, 10, 3, 2])?;
                let b = leaf(ctx, I32, &[5, 3, 2])?;
                Ok(Built::out(&[ctx.get_rows(a, b)?]).init(b, ints(30, |i| ((i * 7 + 3) % 10) as i64)))
            },
        ));
    }
    v.push(Case::new("get_rows", "type=i32,ne=[6,8],idx=[4]", Compare::Exact, |ctx| {
        let a = leaf(ctx, I32, &[6, 8])?;
        let b = leaf(ctx, I32, &[4])?;
        Ok(Built::out(&[ctx.get_rows(a, b)?])
            .init(a, ints(48, |i| i as i64 * 1_000_003 - 20_000_000))
            .init(b, Init::Ints(vec![7, 7, 2, 0])))
    }));
}

fn set_rows_cases(v: &mut Vec<Case>) {
    for (dty, ne0) in
        [(F32, 16), (F16, 16), (BF16, 16), (Q8_0, 64), (Q4_0, 64), (Q4_1, 64), (Q5_0, 64), (Q5_1, 64), (Q4_K, 256)]
    {
        for ity in [I64, I32] {
            v.push(Case::new(
                "set_rows",
                format!("dst={dty},idx={ity},ne=[{ne0},10],n=4"),
                Compare::Exact,
                move |ctx| {
                    let dst = leaf(ctx, dty, &[ne0, 10])?;
                    let b = leaf(ctx, F32, &[ne0, 4])?;
                    let c = leaf(ctx, ity, &[4])?;
                    Ok(Built::out(&[ctx.set_rows(dst, b, c)?]).init(c, Init::Ints(vec![7, 2, 9, 0])))
                },
            ));
        }
    }
    // Broadcast of the indices over dims 2 and 3.
    for dty in [F32, F16] {
        v.push(Case::new(
            "set_rows",
            format!("broadcast,dst={dty},ne=[8,10,6,2],idx=[3,2,1]"),
            Compare::Exact,
            move |ctx| {
                let dst = leaf(ctx, dty, &[8, 10, 6, 2])?;
                let b = leaf(ctx, F32, &[8, 3, 6, 2])?;
                let c = leaf(ctx, I64, &[3, 2, 1])?;
                Ok(Built::out(&[ctx.set_rows(dst, b, c)?]).init(c, Init::Ints(vec![1, 5, 8, 9, 0, 4])))
            },
        ));
    }
    // Source rows from a non-contiguous (permuted, rows packed) tensor, destination a view.
    v.push(Case::new("set_rows", "src strided view,dst=f16 view,ne=[16,12]", Compare::Exact, |ctx| {
        let cache = leaf(ctx, F16, &[16, 12, 2])?;
        let nb = ctx.nb(cache);
        let dst = ctx.view_2d(cache, 16, 12, nb[1], nb[2])?;
        let a = leaf(ctx, F32, &[16, 6])?;
        let anb1 = ctx.nb(a)[1];
        let b = ctx.view_2d(a, 16, 3, 2 * anb1, anb1)?;
        let c = leaf(ctx, I64, &[3])?;
        Ok(Built::out(&[ctx.set_rows(dst, b, c)?]).init(c, Init::Ints(vec![11, 0, 5])))
    }));
}

fn concat_cases(v: &mut Vec<Case>) {
    for dim in 0..4usize {
        for ty in [F32, F16, I32] {
            v.push(Case::new(
                "concat",
                format!("dim={dim},type={ty},ne=[5,4,3,2]+extra"),
                Compare::Exact,
                move |ctx| {
                    let ne_a = [5i64, 4, 3, 2];
                    let mut ne_b = ne_a;
                    ne_b[dim] = 3;
                    let a = leaf(ctx, ty, &ne_a)?;
                    let b = leaf(ctx, ty, &ne_b)?;
                    let mut built = Built::out(&[ctx.concat(a, b, dim)?]);
                    if ty == I32 {
                        let na = ne_a.iter().product::<i64>() as usize;
                        let nb = ne_b.iter().product::<i64>() as usize;
                        built = built.init(a, ints(na, |i| i as i64)).init(b, ints(nb, |i| -(i as i64) - 1));
                    }
                    Ok(built)
                },
            ));
        }
        // Non-contiguous inputs: both permuted views.
        v.push(Case::new("concat", format!("dim={dim},type=f32,non-contiguous"), Compare::Exact, move |ctx| {
            let mut ne = [6i64, 5, 4, 3];
            let a0 = leaf(ctx, F32, &[ne[1], ne[0], ne[2], ne[3]])?;
            let a = ctx.transpose(a0)?;
            ne[dim] = 2;
            let b0 = leaf(ctx, F32, &[ne[0], ne[2], ne[1], ne[3]])?;
            let b = ctx.permute(b0, [0, 2, 1, 3])?;
            Ok(Built::out(&[ctx.concat(a, b, dim)?]))
        }));
    }
    // A conv state ([d_conv − 1, channels]) and the step's inputs seen
    // transposed, as qwen35 builds its conv input; then the new state (the
    // last d_conv − 1 columns) made contiguous: short rows both ways. The
    // [.., 37, 29, 4] shape has 4292 rows: more than one run of rows per
    // task (4096 rows of 4 or 5), the second starting inside dims 1-3.
    for (ty, planes) in [(F32, [1i64, 1]), (F16, [1, 1]), (F32, [29, 4])] {
        v.push(Case::new(
            "concat",
            format!("dim=0,type={ty},conv state + transposed inputs,planes={planes:?}"),
            Compare::Exact,
            move |ctx| {
                let [p2, p3] = planes;
                let state = leaf(ctx, ty, &[3, 37, p2, p3])?;
                let x = leaf(ctx, ty, &[37, 2, p2, p3])?;
                let xt = ctx.transpose(x)?;
                let cin = ctx.concat(state, xt, 0)?;
                // `cin` is a new [5, 37, p2, p3] tensor: packed rows of 5.
                let ts = ty.type_size();
                let (nb1, nb2) = (5 * ts, 5 * 37 * ts);
                let last = ctx.view_4d(cin, 3, 37, p2, p3, nb1, nb2, nb2 * p2 as usize, 2 * ts)?;
                let last = ctx.cont(last)?;
                Ok(Built::out(&[cin, last]))
            },
        ));
    }
    v.push(Case::new("concat", "dim=1,type=f32,view inputs", Compare::Exact, |ctx| {
        let a0 = leaf(ctx, F32, &[10, 4])?;
        let nb1 = ctx.nb(a0)[1];
        let a = ctx.view_2d(a0, 7, 4, nb1, 3 * 4)?;
        let b = leaf(ctx, F32, &[7, 3])?;
        Ok(Built::out(&[ctx.concat(a, b, 1)?]))
    }));
}

fn repeat_pad_cases(v: &mut Vec<Case>) {
    for ty in [F32, F16] {
        v.push(Case::new("repeat", format!("type={ty},ne=[3,2,1,1]->[6,4,3,2]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[3, 2, 1, 1])?;
            Ok(Built::out(&[ctx.repeat_4d(a, 6, 4, 3, 2)?]))
        }));
        v.push(Case::new("repeat", format!("type={ty},ne=[5,3,2,1]->[5,6,4,3]"), Compare::Exact, move |ctx| {
            let a = leaf(ctx, ty, &[5, 3, 2, 1])?;
            let like = leaf(ctx, ty, &[5, 6, 4, 3])?;
            let r = ctx.repeat(a, like)?;
            Ok(Built::out(&[r]))
        }));
    }
    // ggml's repeat needs packed rows; a strided view with packed rows.
    v.push(Case::new("repeat", "type=f32,strided view,[4,3]->[8,9]", Compare::Exact, |ctx| {
        let a0 = leaf(ctx, F32, &[5, 6])?;
        let nb1 = ctx.nb(a0)[1];
        let a = ctx.view_2d(a0, 4, 3, 2 * nb1, 4)?;
        Ok(Built::out(&[ctx.repeat_4d(a, 8, 9, 1, 1)?]))
    }));
    v.push(Case::new("repeat", "type=i32,[2,3]->[6,3,2]", Compare::Exact, |ctx| {
        let a = leaf(ctx, I32, &[2, 3])?;
        Ok(Built::out(&[ctx.repeat_4d(a, 6, 3, 2, 1)?]).init(a, ints(6, |i| i as i64 * 1_234_567)))
    }));
    v.push(Case::new("pad", "p=[1,2,0,3],ne=[5,4,3,2]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[5, 4, 3, 2])?;
        Ok(Built::out(&[ctx.pad(a, 1, 2, 0, 3)?]))
    }));
    v.push(Case::new("pad", "p=[0,0,2,0],ne=[7,3,2]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[7, 3, 2])?;
        Ok(Built::out(&[ctx.pad(a, 0, 0, 2, 0)?]))
    }));
    v.push(Case::new("pad", "pad_ext=[1,2,0,1,2,0,1,1],ne=[5,4,3,2]", Compare::Exact, |ctx| {
        let a = leaf(ctx, F32, &[5, 4, 3, 2])?;
        Ok(Built::out(&[ctx.pad_ext(a, 1, 2, 0, 1, 2, 0, 1, 1)?]))
    }));
    v.push(Case::new("pad", "pad_ext=[3,0,2,2,0,0,0,0],transposed,ne=[6,4]", Compare::Exact, |ctx| {
        let a0 = leaf(ctx, F32, &[4, 6])?;
        let a = ctx.transpose(a0)?;
        Ok(Built::out(&[ctx.pad_ext(a, 3, 0, 2, 2, 0, 0, 0, 0)?]))
    }));
}

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    view_cases(&mut v);
    cpy_cases(&mut v);
    get_rows_cases(&mut v);
    set_rows_cases(&mut v);
    concat_cases(&mut v);
    repeat_pad_cases(&mut v);
    v
}
