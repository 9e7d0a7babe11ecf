//! Differential cases of rotary embedding: `rope_ext` (Normal, Neox; partial
//! rotation, frequency factors, YaRN, linear scaling, non-contiguous input
//! from a fused QKV tensor, F16) and `rope_multi` (Mrope, Imrope with
//! Qwen-style sections).

use crate::harness::{Builder, Built, Case, Compare, Init, Tol, FLOAT, NMSE_FLOAT};
use shardgraph::{GgmlType, RopeMode, RopeParams};

fn positions(n: usize, seed: i64) -> Vec<i64> {
    // Unsorted, repeated, and some large positions.
    (0..n).map(|i| ((i as i64 * 37 + seed * 11) % 97) + if i % 5 == 4 { 3000 + i as i64 } else { 0 }).collect()
}

#[allow(clippy::too_many_arguments)]
fn ext_params(n_dims: i32, mode: RopeMode, freq_scale: f32, ext_factor: f32, attn_factor: f32) -> RopeParams {
    RopeParams {
        n_dims,
        mode,
        n_ctx_orig: 4096,
        freq_base: 10000.0,
        freq_scale,
        ext_factor,
        attn_factor,
        beta_fast: 32.0,
        beta_slow: 1.0,
        sections: [0; 4],
    }
}

/// One plain `rope_ext` case on a fresh `[hd, nh, nt, ne3]` leaf.
#[allow(clippy::too_many_arguments)]
fn plain(v: &mut Vec<Case>, ty: GgmlType, ne: [i64; 4], p: RopeParams, with_ff: bool, tol: Tol, label: &str) {
    let vars = format!(
        "{label},type={ty},ne={ne:?},mode={:?},n_dims={},fs={},ext={},attn={},ff={with_ff}",
        p.mode, p.n_dims, p.freq_scale, p.ext_factor, p.attn_factor
    );
    v.push(Case::new("rope", vars, Compare::Nmse(tol), move |ctx: &mut Builder| {
        let a = ctx.new_tensor(ty, &ne)?;
        let pos = ctx.new_tensor(GgmlType::I32, &[ne[2]])?;
        let ff = if with_ff { Some(ctx.new_tensor(GgmlType::F32, &[(p.n_dims / 2) as i64])?) } else { None };
        let r = ctx.rope_ext(a, pos, ff, p)?;
        let mut b = Built::out(&[r]).init(pos, Init::Ints(positions(ne[2] as usize, 1)));
        if let Some(f) = ff {
            b = b.init(f, Init::Uniform(0.5, 4.0));
        }
        Ok(b)
    }));
}

/// Q and K heads taken as views of a fused QKV row block, then roped.
fn fused_qkv(v: &mut Vec<Case>, mode: RopeMode, hd: i64, n_dims: i32, ty: GgmlType) {
    let (nh, nkv, nt) = (4i64, 2i64, 5i64);
    let vars = format!("fused_qkv_view,type={ty},hd={hd},nh={nh},nkv={nkv},nt={nt},mode={mode:?},n_dims={n_dims}");
    v.push(Case::new("rope", vars, NMSE_FLOAT, move |ctx: &mut Builder| {
        let qkv = ctx.new_tensor(ty, &[hd * (nh + 2 * nkv), nt])?;
        let nb = ctx.nb(qkv);
        let (es, nb1) = (nb[0], nb[1]);
        let q = ctx.view_3d(qkv, hd, nh, nt, hd as usize * es, nb1, 0)?;
        let k = ctx.view_3d(qkv, hd, nkv, nt, hd as usize * es, nb1, (hd * nh) as usize * es)?;
        let pos = ctx.new_tensor(GgmlType::I32, &[nt])?;
        let p = ext_params(n_dims, mode, 1.0, 0.0, 1.0);
        let qr = ctx.rope_ext(q, pos, None, p)?;
        let kr = ctx.rope_ext(k, pos, None, p)?;
        Ok(Built::out(&[qr, kr]).init(pos, Init::Ints(positions(nt as usize, 2))))
    }));
}

/// `rope_multi` on `[hd, nh, nt, 1]` with four position streams.
fn multi(v: &mut Vec<Case>, mode: RopeMode, hd: i64, n_dims: i32, sections: [i32; 4], ty: GgmlType, ext: f32) {
    let (nh, nt) = (3i64, 6i64);
    let vars = format!(
        "multi,type={ty},hd={hd},nh={nh},nt={nt},mode={mode:?},n_dims={n_dims},sections={sections:?},ext={ext}"
    );
    v.push(Case::new("rope", vars, NMSE_FLOAT, move |ctx: &mut Builder| {
        let a = ctx.new_tensor(ty, &[hd, nh, nt])?;
        let pos = ctx.new_tensor(GgmlType::I32, &[4 * nt])?;
        let mut p = ext_params(n_dims, mode, if ext > 0.0 { 0.5 } else { 1.0 }, ext, 1.0);
        p.sections = sections;
        p.freq_base = 1_000_000.0;
        let r = ctx.rope_multi(a, pos, None, p)?;
        let mut ps = Vec::new();
        for s in 0..4 {
            ps.extend(positions(nt as usize, s + 3));
        }
        Ok(Built::out(&[r]).init(pos, Init::Ints(ps)))
    }));
}

/// All cases of this family.
pub fn cases() -> Vec<Case> {
    use GgmlType::{F16, F32};
    use RopeMode::{Imrope, Mrope, Neox, Normal};
    let mut v = Vec::new();
    for mode in [Normal, Neox] {
        // Full and partial rotation, several shapes.
        plain(&mut v, F32, [64, 4, 7, 1], ext_params(64, mode, 1.0, 0.0, 1.0), false, FLOAT, "full");
        plain(&mut v, F32, [128, 3, 5, 2], ext_params(64, mode, 1.0, 0.0, 1.0), false, FLOAT, "partial");
        plain(&mut v, F32, [10, 3, 9, 1], ext_params(6, mode, 1.0, 0.0, 1.0), false, FLOAT, "odd_rest");
        // Frequency factors (Llama 3 / Phi long-rope style).
        plain(&mut v, F32, [64, 2, 6, 1], ext_params(64, mode, 1.0, 0.0, 1.0), true, FLOAT, "freq_factors");
        plain(&mut v, F32, [96, 2, 6, 1], ext_params(32, mode, 1.0, 0.0, 1.0), true, FLOAT, "freq_factors_partial");
        // Linear scaling, YaRN (ext_factor > 0) with magnitude correction.
        plain(&mut v, F32, [64, 3, 6, 1], ext_params(64, mode, 0.25, 0.0, 1.0), false, FLOAT, "linear");
        plain(&mut v, F32, [64, 3, 6, 1], ext_params(64, mode, 0.25, 1.0, 1.0), false, FLOAT, "yarn");
        plain(&mut v, F32, [128, 2, 5, 1], ext_params(96, mode, 0.125, 0.5, 1.2), true, FLOAT, "yarn_partial_ff");
        // F16 tensors.
        plain(&mut v, F16, [64, 4, 5, 1], ext_params(64, mode, 1.0, 0.0, 1.0), false, FLOAT, "f16");
        plain(&mut v, F16, [128, 2, 4, 1], ext_params(64, mode, 0.5, 1.0, 1.0), false, FLOAT, "f16_yarn_partial");
        // Non-contiguous input: q/k views of a fused QKV tensor.
        fused_qkv(&mut v, mode, 64, 64, F32);
        fused_qkv(&mut v, mode, 128, 64, F32);
        fused_qkv(&mut v, mode, 64, 32, F16);
        // Permuted input (heads and tokens swapped).
        let vars = format!("permuted,type=f32,ne=[32,6,4],mode={mode:?}");
        v.push(Case::new("rope", vars, NMSE_FLOAT, move |ctx: &mut Builder| {
            let a0 = ctx.new_tensor(F32, &[32, 4, 6])?;
            let a = ctx.permute(a0, [0, 2, 1, 3])?;
            let pos = ctx.new_tensor(GgmlType::I32, &[4])?;
            let r = ctx.rope_ext(a, pos, None, ext_params(32, mode, 1.0, 0.0, 1.0))?;
            Ok(Built::out(&[r]).init(pos, Init::Ints(vec![5, 0, 1023, 7])))
        }));
    }
    // The plain `rope` shorthand.
    v.push(Case::new("rope", "shorthand,type=f32,ne=[16,2,3],mode=Neox", NMSE_FLOAT, |ctx: &mut Builder| {
        let a = ctx.new_tensor(F32, &[16, 2, 3])?;
        let pos = ctx.new_tensor(GgmlType::I32, &[3])?;
        let r = ctx.rope(a, pos, 16, Neox)?;
        Ok(Built::out(&[r]).init(pos, Init::Ints(vec![3, 1, 2])))
    }));
    // Multi-section rope: Qwen3.5-style sections on head_dim 64/128, Qwen2-VL-style on 128.
    for mode in [Mrope, Imrope] {
        multi(&mut v, mode, 64, 64, [11, 11, 10, 0], F32, 0.0);
        multi(&mut v, mode, 128, 64, [11, 11, 10, 0], F32, 0.0);
        multi(&mut v, mode, 128, 128, [11, 11, 10, 0], F32, 0.0);
        multi(&mut v, mode, 128, 128, [16, 24, 24, 0], F32, 0.0);
        multi(&mut v, mode, 64, 64, [8, 8, 8, 8], F32, 0.0);
        multi(&mut v, mode, 64, 64, [11, 11, 10, 0], F16, 0.0);
        multi(&mut v, mode, 128, 64, [11, 11, 10, 0], F32, 1.0);
    }
    v
}
