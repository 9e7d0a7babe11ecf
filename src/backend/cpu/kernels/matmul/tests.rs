//! Kernel tests against a plain f64 reference (weights decoded with ggml's
//! formulas, activations rounded through the dot type as the kernels do),
//! for every instruction set this CPU has.

use super::acts::round_through;
use super::kern::Isa;
use super::*;
use crate::graph::Context;
use crate::tensor::{GgmlType, TensorId};
use half::f16;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 32) as u8
    }
}

fn put_f16(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// Random weights of `ty` ([K, rows]) as bytes, and their values.
fn weights(ty: GgmlType, k: usize, rows: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f64>) {
    let mut bytes = Vec::new();
    let mut vals = Vec::new();
    for _ in 0..rows {
        match ty {
            GgmlType::F32 => (0..k).for_each(|_| {
                let v = rng.f();
                bytes.extend_from_slice(&v.to_le_bytes());
                vals.push(v as f64);
            }),
            GgmlType::F16 => (0..k).for_each(|_| {
                let v = f16::from_f32(rng.f());
                bytes.extend_from_slice(&v.to_bits().to_le_bytes());
                vals.push(v.to_f64());
            }),
            GgmlType::BF16 => (0..k).for_each(|_| {
                let v = half::bf16::from_f32(rng.f());
                bytes.extend_from_slice(&v.to_bits().to_le_bytes());
                vals.push(v.to_f64());
            }),
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
                for _ in 0..k / 32 {
                    let d = f16::from_f32(0.001 + 0.02 * rng.f().abs());
                    put_f16(&mut bytes, d.to_f32());
                    let d = d.to_f64();
                    let mut q = [0i32; 32];
                    match ty {
                        GgmlType::Q4_0 => {
                            for j in 0..16 {
                                let v = rng.byte();
                                bytes.push(v);
                                q[j] = (v & 15) as i32 - 8;
                                q[j + 16] = (v >> 4) as i32 - 8;
                            }
                        }
                        GgmlType::Q5_0 => {
                            let qh: [u8; 4] = [rng.byte(), rng.byte(), rng.byte(), rng.byte()];
                            bytes.extend_from_slice(&qh);
                            let h = u32::from_le_bytes(qh);
                            for j in 0..16 {
                                let v = rng.byte();
                                bytes.push(v);
                                q[j] = ((v & 15) as i32 | (((h >> j) & 1) << 4) as i32) - 16;
                                q[j + 16] = ((v >> 4) as i32 | (((h >> (j + 16)) & 1) << 4) as i32) - 16;
                            }
                        }
                        _ => {
                            for qj in q.iter_mut() {
                                let v = rng.byte();
                                bytes.push(v);
                                *qj = v as i8 as i32;
                            }
                        }
                    }
                    vals.extend(q.iter().map(|&x| d * x as f64));
                }
            }
            GgmlType::Q4_K => {
                for _ in 0..k / 256 {
                    let d = f16::from_f32(0.001 + 0.01 * rng.f().abs());
                    let dm = f16::from_f32(0.001 + 0.01 * rng.f().abs());
                    put_f16(&mut bytes, d.to_f32());
                    put_f16(&mut bytes, dm.to_f32());
                    let s: Vec<u8> = (0..12).map(|_| rng.byte()).collect();
                    bytes.extend_from_slice(&s);
                    let qs: Vec<u8> = (0..128).map(|_| rng.byte()).collect();
                    bytes.extend_from_slice(&qs);
                    for j in 0..8 {
                        let (sc, mn) = if j < 4 {
                            (s[j] & 63, s[j + 4] & 63)
                        } else {
                            ((s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
                        };
                        let g = j / 2;
                        for l in 0..32 {
                            let b = qs[32 * g + l];
                            let q = if j % 2 == 0 { b & 15 } else { b >> 4 };
                            vals.push(d.to_f64() * sc as f64 * q as f64 - dm.to_f64() * mn as f64);
                        }
                    }
                }
            }
            GgmlType::Q6_K => {
                // Random bytes (every quant, high bit and scale, −128
                // included) with a sane f16 `d` at the end of each block;
                // decoded by the quant module for the reference.
                let mut row: Vec<u8> = (0..k / 256 * 210).map(|_| rng.byte()).collect();
                for blk in row.chunks_exact_mut(210) {
                    blk[208..].copy_from_slice(&f16::from_f32(0.0001 + 0.001 * rng.f().abs()).to_bits().to_le_bytes());
                }
                let mut deq = vec![0f32; k];
                crate::tensor::quant::dequantize_row(ty, &row, &mut deq).unwrap();
                bytes.extend_from_slice(&row);
                vals.extend(deq.iter().map(|&v| v as f64));
            }
            other if crate::tensor::quant::quantize_requires_imatrix(other) => {
                // Random valid blocks (every index, sign and sub-scale bit
                // random) with a sane f16 scale, which these types keep in
                // front; decoded by the quant module for the reference.
                let mut row: Vec<u8> = (0..k / other.block_size() * other.type_size()).map(|_| rng.byte()).collect();
                for blk in row.chunks_exact_mut(other.type_size()) {
                    blk[..2].copy_from_slice(&f16::from_f32(0.001 + 0.02 * rng.f().abs()).to_bits().to_le_bytes());
                }
                let mut deq = vec![0f32; k];
                crate::tensor::quant::dequantize_row(other, &row, &mut deq).unwrap();
                bytes.extend_from_slice(&row);
                vals.extend(deq.iter().map(|&v| v as f64));
            }
            other => {
                // Quantized by the quant module, decoded by it for the reference.
                let x: Vec<f32> = (0..k).map(|_| rng.f()).collect();
                let mut row = vec![0u8; k / other.block_size() * other.type_size()];
                crate::tensor::quant::quantize_chunk(other, &x, &mut row, 1, k).unwrap();
                let mut deq = vec![0f32; k];
                crate::tensor::quant::dequantize_row(other, &row, &mut deq).unwrap();
                bytes.extend_from_slice(&row);
                vals.extend(deq.iter().map(|&v| v as f64));
            }
        }
    }
    (bytes, vals)
}

fn vdt(ty: GgmlType) -> GgmlType {
    crate::tensor::quant::vec_dot_type(ty)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A view over `mem` for tensor `id`.
fn view(ctx: &Context, id: TensorId, mem: &mut [u8]) -> TView {
    let t = ctx.tensor(id).unwrap();
    assert!(mem.len() >= t.nbytes());
    // SAFETY: `mem` holds the tensor's bytes and outlives the view's use in each test.
    unsafe { TView::new(mem.as_mut_ptr(), t) }
}

fn isas() -> Vec<Isa> {
    let mut v = vec![Isa::Scalar];
    if kern::isa() != Isa::Scalar {
        v.push(Isa::Avx2);
    }
    if kern::isa() == Isa::Vnni {
        v.push(Isa::Vnni);
    }
    v
}

fn check_close(ours: &[f32], want: &[f64], scale: &[f64], rel: f64, what: &str) {
    for (i, ((&o, &w), &s)) in ours.iter().zip(want).zip(scale).enumerate() {
        let tol = rel * s + 1e-6;
        assert!((o as f64 - w).abs() <= tol, "{what}: element {i}: ours {o} vs reference {w} (tol {tol})");
    }
}

fn mul_mat_case(ty: GgmlType, k: usize, m: usize, n: usize, transposed_b: bool) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (k * 31 + m * 7 + n) as u64);
    let (mut abytes, avals) = weights(ty, k, m, &mut rng);
    let bvals: Vec<f32> = (0..k * n).map(|_| rng.f()).collect();
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(ty, k as i64, m as i64).unwrap();
    // b as [K, N] (or the transpose of an [N, K] tensor holding the same values).
    let (b, mut bbytes) = if transposed_b {
        let x = ctx.new_tensor_2d(GgmlType::F32, n as i64, k as i64).unwrap();
        let mut tr = vec![0f32; k * n];
        for j in 0..n {
            for e in 0..k {
                tr[e * n + j] = bvals[j * k + e];
            }
        }
        (ctx.transpose(x).unwrap(), f32_bytes(&tr))
    } else {
        (ctx.new_tensor_2d(GgmlType::F32, k as i64, n as i64).unwrap(), f32_bytes(&bvals))
    };
    let c = ctx.mul_mat(a, b).unwrap();
    // Reference.
    let mut want = vec![0f64; m * n];
    let mut scale = vec![0f64; m * n];
    for j in 0..n {
        let mut col = bvals[j * k..(j + 1) * k].to_vec();
        round_through(vdt(ty), &mut col).unwrap();
        for i in 0..m {
            for e in 0..k {
                want[j * m + i] += avals[i * k + e] * col[e] as f64;
                scale[j * m + i] += (avals[i * k + e] * col[e] as f64).abs();
            }
        }
    }
    for isa in isas() {
        let mut cbytes = vec![0u8; 4 * m * n];
        let (av, bv, cv) = (view(&ctx, a, &mut abytes), view(&ctx, b, &mut bbytes), view(&ctx, c, &mut cbytes));
        mul_mat_isa(&cv, &av, &bv, isa).unwrap();
        let ours: Vec<f32> = cbytes.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect();
        // Q8_1's block sum is stored as f16 (ggml's `s`), which the f64
        // reference does not round.
        let rel = if vdt(ty) == GgmlType::Q8_1 { 2e-3 } else { 2e-5 };
        check_close(&ours, &want, &scale, rel, &format!("{ty} k={k} m={m} n={n} t={transposed_b} {isa:?}"));
    }
}

#[test]
fn mul_mat_all_kernel_types_match_reference() {
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
        for &(k, m, n) in
            &[(64, 7, 1), (32, 9, 2), (800, 11, 4), (96, 13, 7), (64, 33, 17), (256, 9, 1), (288, 6, 1), (544, 3, 1)]
        {
            mul_mat_case(ty, k, m, n, false);
        }
    }
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        for &(k, m, n) in &[
            (256, 7, 1),
            (512, 9, 5),
            (256, 11, 9),
            (768, 5, 1),
            (512, 2, 1),
            (2304, 5, 1),
            (2304, 7, 9),
            (512, 6, 2),
            (768, 5, 3),
            (1024, 9, 17),
            (512, 7, 4),
        ] {
            mul_mat_case(ty, k, m, n, false);
        }
    }
    mul_mat_case(GgmlType::Q6_K, 512, 5, 6, true);
    for ty in [GgmlType::F32, GgmlType::F16] {
        mul_mat_case(ty, 33, 7, 3, false);
        mul_mat_case(ty, 1, 3, 2, false);
        mul_mat_case(ty, 45, 5, 1, false);
    }
}

#[test]
fn mul_mat_vec_dot_types_match_reference() {
    for ty in [GgmlType::Q4_1, GgmlType::Q5_1] {
        for &(k, m, n) in &[(64, 7, 1), (96, 5, 6)] {
            mul_mat_case(ty, k, m, n, false);
        }
    }
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q5_K] {
        for &(k, m, n) in &[(256, 7, 1), (512, 3, 5)] {
            mul_mat_case(ty, k, m, n, false);
        }
    }
}

/// The types of ggml 0.25.3 that 0.15.3 lacked, against dequantized
/// weights times activations rounded through their dot type (one column,
/// several, and a column count over the packed-kernel threshold).
#[test]
fn mul_mat_new_types_match_reference() {
    use GgmlType::*;
    for ty in
        [IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0]
    {
        for &(k, m, n) in &[(256, 7, 1), (512, 3, 5), (256, 9, 9)] {
            mul_mat_case(ty, k, m, n, false);
        }
        mul_mat_case(ty, 256, 4, 3, true);
    }
}

#[test]
fn mul_mat_k0_is_rejected_like_ggml() {
    // ggml_mul_mat asserts !ggml_is_transposed(a), and a contiguous [0, M]
    // tensor has nb[0] > nb[1].
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(GgmlType::F32, 0, 3).unwrap();
    let b = ctx.new_tensor_2d(GgmlType::F32, 0, 2).unwrap();
    assert!(ctx.mul_mat(a, b).is_err());
}

#[test]
fn mul_mat_transposed_activations() {
    mul_mat_case(GgmlType::F32, 40, 6, 5, true);
    mul_mat_case(GgmlType::Q8_0, 64, 6, 3, true);
    mul_mat_case(GgmlType::Q8_0, 96, 6, 4, true);
}

#[test]
fn mul_mat_many_tasks() {
    // Enough rows and columns for several tasks and column chunks.
    mul_mat_case(GgmlType::Q4_0, 4096, 37, 70, false);
    mul_mat_case(GgmlType::F32, 512, 301, 9, false);
}

#[test]
fn mul_mat_id_routes_and_rejects_bad_ids() {
    let (k, m, ne, nu, nt) = (64usize, 5usize, 4usize, 3usize, 4usize);
    let mut rng = Rng(77);
    let (mut abytes, avals) = weights(GgmlType::F32, k, m * ne, &mut rng);
    let bvals: Vec<f32> = (0..k * nt).map(|_| rng.f()).collect();
    let ids: Vec<i32> = vec![0, 2, 2, 3, 3, 3, 1, 0, 2, 2, 1, 0];
    let mut ctx = Context::new();
    let a = ctx.new_tensor_3d(GgmlType::F32, k as i64, m as i64, ne as i64).unwrap();
    let b = ctx.new_tensor_3d(GgmlType::F32, k as i64, 1, nt as i64).unwrap();
    let ii = ctx.new_tensor_2d(GgmlType::I32, nu as i64, nt as i64).unwrap();
    let c = ctx.mul_mat_id(a, b, ii).unwrap();
    let mut bbytes = f32_bytes(&bvals);
    let mut ibytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut cbytes = vec![0u8; 4 * m * nu * nt];
    for isa in isas() {
        let (av, bv, iv, cv) = (
            view(&ctx, a, &mut abytes),
            view(&ctx, b, &mut bbytes),
            view(&ctx, ii, &mut ibytes),
            view(&ctx, c, &mut cbytes),
        );
        mul_mat_id_isa(&cv, &av, &bv, &iv, isa).unwrap();
        let ours: Vec<f32> = cbytes.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect();
        for t in 0..nt {
            for s in 0..nu {
                let e = ids[t * nu + s] as usize;
                for i in 0..m {
                    let want: f64 = (0..k).map(|x| avals[(e * m + i) * k + x] * bvals[t * k + x] as f64).sum();
                    let got = ours[(t * nu + s) * m + i] as f64;
                    assert!((got - want).abs() < 1e-4, "{isa:?} t={t} s={s} i={i}: {got} vs {want}");
                }
            }
        }
    }
    // An expert id out of range is an error, not a crash.
    ibytes[..4].copy_from_slice(&7i32.to_le_bytes());
    let (av, bv, iv, cv) = (
        view(&ctx, a, &mut abytes),
        view(&ctx, b, &mut bbytes),
        view(&ctx, ii, &mut ibytes),
        view(&ctx, c, &mut cbytes),
    );
    let e = compute(&Op::MulMatId, &cv, &[av, bv, iv]).unwrap_err();
    assert!(e.to_string().contains("expert id 7"), "{e}");
}

#[test]
fn add_id_adds_selected_rows() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor_3d(GgmlType::F32, 3, 2, 2).unwrap();
    let b = ctx.new_tensor_2d(GgmlType::F32, 3, 3).unwrap();
    let ii = ctx.new_tensor_2d(GgmlType::I32, 2, 2).unwrap();
    let c = ctx.add_id(a, b, ii).unwrap();
    let av: Vec<f32> = (0..12).map(|x| x as f32).collect();
    let bv: Vec<f32> = vec![100.0, 200.0, 300.0, 1000.0, 2000.0, 3000.0, 10.0, 20.0, 30.0];
    let ids = [2i32, 0, 1, 1];
    let (mut ab, mut bb) = (f32_bytes(&av), f32_bytes(&bv));
    let mut ib: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut cb = vec![0u8; 48];
    let views = [view(&ctx, a, &mut ab), view(&ctx, b, &mut bb), view(&ctx, ii, &mut ib)];
    compute(&Op::AddId, &view(&ctx, c, &mut cb), &views).unwrap();
    let out: Vec<f32> = cb.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect();
    assert_eq!(&out[..3], &[10.0, 21.0, 32.0]);
    assert_eq!(&out[3..6], &[103.0, 204.0, 305.0]);
    assert_eq!(&out[6..9], &[1006.0, 2007.0, 3008.0]);
    assert_eq!(&out[9..12], &[1009.0, 2010.0, 3011.0]);
    ib[..4].copy_from_slice(&(-1i32).to_le_bytes());
    let views = [view(&ctx, a, &mut ab), view(&ctx, b, &mut bb), view(&ctx, ii, &mut ib)];
    assert!(compute(&Op::AddId, &view(&ctx, c, &mut cb), &views).is_err());
}

/// `mul_mat` of `[K, M]` weights (`abytes`) with `n` f32 columns (`cols`,
/// `K` each) on `threads` threads: the `[M, n]` result, column-major.
fn mm_threads(ty: GgmlType, k: usize, m: usize, abytes: &[u8], cols: &[f32], isa: Isa, threads: usize) -> Vec<f32> {
    let n = cols.len() / k;
    let mut ctx = Context::new();
    let a = ctx.new_tensor_2d(ty, k as i64, m as i64).unwrap();
    let b = ctx.new_tensor_2d(GgmlType::F32, k as i64, n as i64).unwrap();
    let c = ctx.mul_mat(a, b).unwrap();
    let (mut ab, mut bb, mut cb) = (abytes.to_vec(), f32_bytes(cols), vec![0u8; 4 * m * n]);
    let (av, bv, cv) = (view(&ctx, a, &mut ab), view(&ctx, b, &mut bb), view(&ctx, c, &mut cb));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| mul_mat_isa(&cv, &av, &bv, isa)).unwrap();
    cb.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect()
}

/// Every weight type the CPU multiplies, as `mul_mat` weights.
fn mul_mat_types() -> Vec<GgmlType> {
    crate::tensor::ALL_TYPES.into_iter().filter(|&t| plan(t, Isa::Scalar).is_ok()).collect()
}

/// Batch invariance: column j of `mul_mat(W, X)` is bit-identical to
/// `mul_mat(W, X[:, j])` whatever the column count, thread count and the
/// column's place in a tile (speculative decoding verifies a batch of draft
/// tokens that plain decoding computes one at a time; ggml's CPU products
/// are batch-invariant). Q4_K and Q6_K take every path: the one-column
/// kernel, the 2- and 3-column tiles and the packed tiles from 4 columns.
#[test]
fn mul_mat_columns_are_batch_invariant() {
    batch_invariance(&mul_mat_types());
}

/// For each of `types`, checks every column of several column counts on 1
/// and 2 threads against the one-column product, bit for bit.
fn batch_invariance(types: &[GgmlType]) {
    let (m, ns) = (37usize, [2usize, 3, 4, 5, 8, 9, 16, 17, 33]);
    let mut report = Vec::new();
    for &ty in types {
        // 2304: 9 super-blocks (a whole 8 and one more); 800: 25 blocks of 32.
        let mut ks = vec![256usize, 1024, 2304];
        if ty.block_size() == 32 {
            ks.push(800);
        }
        for k in ks {
            let mut rng = Rng(0x51ed_2701 ^ (k as u64) << 8 ^ ty as u64);
            let (abytes, _) = weights(ty, k, m, &mut rng);
            let x: Vec<f32> = (0..k * 33).map(|_| rng.f()).collect();
            for isa in isas() {
                let one: Vec<Vec<f32>> =
                    (0..33).map(|j| mm_threads(ty, k, m, &abytes, &x[j * k..(j + 1) * k], isa, 1)).collect();
                let mut differ = 0;
                for &n in &ns {
                    for threads in [1, 2] {
                        let got = mm_threads(ty, k, m, &abytes, &x[..n * k], isa, threads);
                        for j in 0..n {
                            let col = &got[j * m..(j + 1) * m];
                            differ += col.iter().zip(&one[j]).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                        }
                    }
                }
                if differ > 0 {
                    report.push(format!("{ty} k={k} {isa:?}: {differ} outputs differ from N = 1"));
                }
            }
        }
    }
    assert!(report.is_empty(), "not batch-invariant:\n{}", report.join("\n"));
}

/// Batch invariance of `mul_mat_id`: each token's result for an expert is
/// bit-identical to `mul_mat` of that expert with the token's column alone,
/// whatever the number of tokens routed to the expert.
#[test]
fn mul_mat_id_columns_are_batch_invariant() {
    batch_invariance_id(&mul_mat_types());
}

/// `batch_invariance` for `mul_mat_id` (experts with 21, 14 and 7 tokens).
fn batch_invariance_id(types: &[GgmlType]) {
    let (k, m, ne, nu, nt) = (512usize, 37usize, 3usize, 2usize, 21usize);
    let mut report = Vec::new();
    for &ty in types {
        let mut rng = Rng(0x00a1_1ce5 ^ ty as u64);
        let (abytes, _) = weights(ty, k, m * ne, &mut rng);
        let x: Vec<f32> = (0..k * nt).map(|_| rng.f()).collect();
        // Expert 0 gets every token, 1 about two thirds, 2 the rest.
        let ids: Vec<i32> = (0..nt).flat_map(|t| [0, if t % 3 == 0 { 2 } else { 1 }]).collect();
        let mut ctx = Context::new();
        let a = ctx.new_tensor_3d(ty, k as i64, m as i64, ne as i64).unwrap();
        let b = ctx.new_tensor_3d(GgmlType::F32, k as i64, 1, nt as i64).unwrap();
        let ii = ctx.new_tensor_2d(GgmlType::I32, nu as i64, nt as i64).unwrap();
        let c = ctx.mul_mat_id(a, b, ii).unwrap();
        let ebytes = abytes.len() / ne;
        for isa in isas() {
            let mut differ = 0;
            for threads in [1, 2] {
                let (mut ab, mut bb) = (abytes.clone(), f32_bytes(&x));
                let mut ib: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
                let mut cb = vec![0u8; 4 * m * nu * nt];
                let (av, bv, iv, cv) =
                    (view(&ctx, a, &mut ab), view(&ctx, b, &mut bb), view(&ctx, ii, &mut ib), view(&ctx, c, &mut cb));
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| mul_mat_id_isa(&cv, &av, &bv, &iv, isa)).unwrap();
                let got: Vec<f32> = cb.chunks_exact(4).map(|v| f32::from_le_bytes([v[0], v[1], v[2], v[3]])).collect();
                for t in 0..nt {
                    for s in 0..nu {
                        let e = ids[t * nu + s] as usize;
                        let w = &abytes[e * ebytes..(e + 1) * ebytes];
                        let one = mm_threads(ty, k, m, w, &x[t * k..(t + 1) * k], isa, 1);
                        let col = &got[(t * nu + s) * m..][..m];
                        differ += col.iter().zip(&one).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    }
                }
            }
            if differ > 0 {
                report.push(format!("{ty} {isa:?}: {differ} outputs differ from N = 1"));
            }
        }
    }
    assert!(report.is_empty(), "not batch-invariant:\n{}", report.join("\n"));
}
