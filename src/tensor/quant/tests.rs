//! Unit tests of the quant module: round trips with error bounds, SIMD vs
//! scalar dot products, length validation. Byte identity with ggml itself is
//! checked in `tests/quant_bytes.rs` against the real library.

use super::*;
use crate::tensor::GgmlType::{self, *};

/// Tiny deterministic xorshift64* generator (no dependencies).
pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub(crate) fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Roughly normal (sum of 4 uniforms), unit-ish variance.
    pub(crate) fn normal(&mut self) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866
    }
}

const QUANT_TYPES: [GgmlType; 12] = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K];

fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_size(x.len() as i64).unwrap()];
    quantize_chunk(ty, x, &mut q, 1, x.len()).unwrap();
    q
}

fn dequantize(ty: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, q, &mut y).unwrap();
    y
}

fn rms(v: impl Iterator<Item = f32>) -> f32 {
    let (s, n) = v.fold((0f64, 0usize), |(s, n), x| (s + (x as f64) * (x as f64), n + 1));
    (s / n.max(1) as f64).sqrt() as f32
}

/// Relative RMS error bound of a quantize → dequantize round trip on
/// normal data, per type (ggml's own `test-quantize-fns` uses similar
/// absolute bounds on data in [-1, 1]).
fn rmse_bound(ty: GgmlType) -> f32 {
    match ty {
        Q8_0 | Q8_1 => 0.006,
        Q8_K => 0.008,
        Q6_K => 0.022,
        Q5_0 | Q5_1 => 0.05,
        Q5_K => 0.045,
        Q4_0 | Q4_1 => 0.1,
        Q4_K => 0.085,
        Q3_K => 0.18,
        Q2_K => 0.35,
        _ => 0.0,
    }
}

#[test]
fn quant_round_trip_error_bounds() {
    let mut rng = XorShift::new(1);
    for ty in QUANT_TYPES {
        let n = 4096;
        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let y = dequantize(ty, &quantize(ty, &x), n);
        let err = rms(x.iter().zip(&y).map(|(a, b)| a - b)) / rms(x.iter().copied());
        eprintln!("{ty}: relative rms error {err:.4}");
        assert!(err < rmse_bound(ty), "{ty}: relative rms error {err} over bound {}", rmse_bound(ty));
        assert!(y.iter().all(|v| v.is_finite()), "{ty}: non-finite output");
    }
}

#[test]
fn quant_zero_rows_and_extreme_values() {
    for ty in QUANT_TYPES {
        let n = 512;
        // All zeros dequantize to zeros.
        let y = dequantize(ty, &quantize(ty, &vec![0.0; n]), n);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}: zero row not preserved");
        // Huge and tiny magnitudes stay finite and bounded by the input range.
        // (f16 scales overflow past 65504, as in ggml, so stay below that.)
        for scale in [1e-30f32, 1e-6, 1.0, 1e4] {
            let mut rng = XorShift::new(7);
            let x: Vec<f32> = (0..n).map(|_| rng.normal() * scale).collect();
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let y = dequantize(ty, &quantize(ty, &x), n);
            for (i, &v) in y.iter().enumerate() {
                assert!(v.is_finite() && v.abs() <= amax * 1.6 + 1e-30, "{ty} scale {scale}: y[{i}] = {v}");
            }
        }
        // Non-finite input must not panic (the bytes are checked against ggml elsewhere).
        let mut x = vec![1.0f32; n];
        x[3] = f32::NAN;
        x[40] = f32::INFINITY;
        x[300] = f32::NEG_INFINITY;
        let _ = dequantize(ty, &quantize(ty, &x), n);
    }
}

#[test]
fn quant_float_types_round_trip() {
    let x = [1.0f32, -2.5, 65504.0, 1e-8, 3.25, -0.0];
    let y = dequantize(F32, &quantize(F32, &x), x.len());
    assert_eq!(x.map(f32::to_bits).to_vec(), y.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    let y = dequantize(F16, &quantize(F16, &x), x.len());
    for (a, b) in x.iter().zip(&y) {
        assert_eq!(half::f16::from_f32(*a).to_f32().to_bits(), b.to_bits());
    }
    let y = dequantize(BF16, &quantize(BF16, &x), x.len());
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b).abs() <= a.abs() / 128.0 + 1e-30, "{a} vs {b}");
    }
}

#[test]
fn quant_lengths_are_validated() {
    let x = vec![0.5f32; 64];
    // Not whole blocks.
    assert!(matches!(quantize_chunk(Q4_0, &x[..48], &mut [0u8; 27], 1, 48), Err(Error::DataMismatch { .. })));
    // Wrong dst length.
    assert!(matches!(quantize_chunk(Q4_0, &x, &mut [0u8; 35], 1, 64), Err(Error::DataMismatch { .. })));
    // Wrong src length for nrows.
    assert!(matches!(quantize_chunk(Q4_0, &x, &mut [0u8; 72], 2, 64), Err(Error::DataMismatch { .. })));
    // Overflow.
    assert!(quantize_chunk(Q8_0, &x, &mut [0u8; 68], usize::MAX, 64).is_err());
    // Unsupported types.
    assert!(matches!(quantize_chunk(I32, &x, &mut [0u8; 256], 1, 64), Err(Error::UnsupportedType { .. })));
    assert!(matches!(dequantize_row(I8, &[0u8; 4], &mut [0f32; 4]), Err(Error::UnsupportedType { .. })));
    // Dequantize with a short or long source.
    assert!(dequantize_row(Q4_K, &[0u8; 143], &mut [0f32; 256]).is_err());
    assert!(dequantize_row(Q4_K, &[0u8; 145], &mut [0f32; 256]).is_err());
    assert!(dequantize_row(Q4_K, &[0u8; 144], &mut [0f32; 255]).is_err());
    // Dot products: short rows give NaN from the fn pointer and Err from vec_dot.
    for ty in [Q4_0, Q8_0, Q4_K, Q6_K, F32, F16, BF16] {
        let f = vec_dot_fn(ty).unwrap();
        let g = vec_dot_fn_scalar(ty).unwrap();
        let n = ty.block_size().max(32) * 2;
        let xb = vec![0u8; ty.row_size(n as i64).unwrap()];
        let yb = vec![0u8; vec_dot_type(ty).row_size(n as i64).unwrap()];
        assert!(f(n, &xb[..xb.len() - 1], &yb).is_nan(), "{ty}");
        assert!(g(n, &xb, &yb[..yb.len() - 1]).is_nan(), "{ty}");
        if ty.block_size() > 1 {
            assert!(f(n + 1, &xb, &yb).is_nan(), "{ty}");
        }
        assert_eq!(f(n, &xb, &yb), 0.0);
        assert!(vec_dot(ty, n, &xb[1..], &yb).is_err());
        assert_eq!(vec_dot(ty, n, &xb, &yb).unwrap(), 0.0);
    }
    assert!(vec_dot_fn(Q8_K).is_none());
    assert!(vec_dot(I32, 4, &[0; 16], &[0; 16]).is_err());
}

#[test]
fn quant_vec_dot_types_match_ggml() {
    assert_eq!(vec_dot_type(Q4_0), Q8_0);
    assert_eq!(vec_dot_type(Q5_0), Q8_0);
    assert_eq!(vec_dot_type(Q8_0), Q8_0);
    assert_eq!(vec_dot_type(Q4_1), Q8_1);
    assert_eq!(vec_dot_type(Q5_1), Q8_1);
    for k in [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
        assert_eq!(vec_dot_type(k), Q8_K);
    }
    for f in [F32, F16, BF16] {
        assert_eq!(vec_dot_type(f), f);
    }
}

const DOT_TYPES: [GgmlType; 13] = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F32, F16, BF16];

/// A weight row and an activation row of `n` elements, packed.
fn dot_rows(ty: GgmlType, n: usize, rng: &mut XorShift) -> (Vec<u8>, Vec<u8>, Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.normal() * 3.0).collect();
    let xq = quantize(ty, &x);
    let yq = quantize(vec_dot_type(ty), &y);
    let xd = dequantize(ty, &xq, n);
    let yd = dequantize(vec_dot_type(ty), &yq, n);
    (xq, yq, xd, yd)
}

#[test]
fn quant_dot_equals_dot_of_dequantized() {
    let mut rng = XorShift::new(11);
    for ty in DOT_TYPES {
        for n in [256usize, 4096] {
            let (xq, yq, xd, yd) = dot_rows(ty, n, &mut rng);
            let exact: f64 = xd.iter().zip(&yd).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = xd.iter().zip(&yd).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            // Q8_1 keeps s = fp16(d·Σq) rounded: allow its f16 error too.
            let tol = mag * 2e-6 + if vec_dot_type(ty) == Q8_1 { mag * 1e-3 } else { 0.0 };
            for (name, f) in [("scalar", vec_dot_fn_scalar(ty).unwrap()), ("best", vec_dot_fn(ty).unwrap())] {
                let got = f(n, &xq, &yq) as f64;
                assert!((got - exact).abs() <= tol, "{ty} n={n} {name}: {got} vs {exact} (tol {tol})");
            }
        }
    }
}

#[test]
fn quant_simd_matches_scalar() {
    let mut rng = XorShift::new(5);
    eprintln!("quant: dot kernels use {}", simd_isa());
    for ty in DOT_TYPES {
        let (s, f) = (vec_dot_fn_scalar(ty).unwrap(), vec_dot_fn(ty).unwrap());
        for n in [256usize, 512, 4096, 8192] {
            for _ in 0..4 {
                let (xq, yq, xd, yd) = dot_rows(ty, n, &mut rng);
                let mag: f64 = xd.iter().zip(&yd).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                let (a, b) = (s(n, &xq, &yq), f(n, &xq, &yq));
                assert!(((a - b) as f64).abs() <= mag * 1e-6, "{ty} n={n}: scalar {a} simd {b}");
                // Unaligned buffers give the same answer.
                let mut xu = vec![0u8; xq.len() + 1];
                xu[1..].copy_from_slice(&xq);
                let mut yu = vec![0u8; yq.len() + 3];
                yu[3..].copy_from_slice(&yq);
                assert_eq!(f(n, &xu[1..], &yu[3..]).to_bits(), b.to_bits(), "{ty}: unaligned");
            }
        }
        // Dense rows of lengths that are not multiples of 8 exercise the tails.
        if !ty.is_quantized() {
            for n in [1usize, 7, 33, 100] {
                let (xq, yq, _, _) = dot_rows(ty, n, &mut rng);
                let (a, b) = (s(n, &xq, &yq), f(n, &xq, &yq));
                assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{ty} n={n}: {a} vs {b}");
            }
        }
    }
}

/// Times `f` on `n`-element rows; returns ns per call.
fn time_dot(f: VecDotFn, n: usize, x: &[u8], y: &[u8]) -> f64 {
    let iters = 5_000;
    let mut acc = 0f32;
    // Best of 7 runs: the machine may be shared.
    let mut best = f64::MAX;
    for _ in 0..7 {
        let t = std::time::Instant::now();
        for _ in 0..iters {
            acc += f(n, std::hint::black_box(x), std::hint::black_box(y));
        }
        best = best.min(t.elapsed().as_nanos() as f64 / iters as f64);
    }
    std::hint::black_box(acc);
    best
}

/// `cargo test --release --lib quant_bench -- --ignored --nocapture`
#[test]
#[ignore]
fn quant_bench_dot() {
    let mut rng = XorShift::new(3);
    let n = 4096;
    eprintln!("dot of {n} elements, ns per call (simd = {}):", simd_isa());
    for ty in DOT_TYPES {
        let (xq, yq, _, _) = dot_rows(ty, n, &mut rng);
        let s = time_dot(vec_dot_fn_scalar(ty).unwrap(), n, &xq, &yq);
        let f = time_dot(vec_dot_fn(ty).unwrap(), n, &xq, &yq);
        eprintln!("  {:>5}: scalar {s:>8.0}  best {f:>7.0}  speedup {:>5.1}x", ty.name(), s / f);
    }
}

/// `cargo test --release --lib quant_bench -- --ignored --nocapture`
#[test]
#[ignore]
fn quant_bench_quantize_dequantize() {
    let mut rng = XorShift::new(9);
    let n = 4096;
    let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    eprintln!("one row of {n} elements, µs per call:");
    for ty in QUANT_TYPES.iter().copied().chain([F16, BF16]) {
        let mut q = vec![0u8; ty.row_size(n as i64).unwrap()];
        let mut y = vec![0f32; n];
        let reps = 200;
        let (mut tq, mut td) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                quantize_chunk(ty, std::hint::black_box(&x), &mut q, 1, n).unwrap();
            }
            tq = tq.min(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
            let t = std::time::Instant::now();
            for _ in 0..reps {
                dequantize_row(ty, std::hint::black_box(&q), &mut y).unwrap();
            }
            td = td.min(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
        }
        eprintln!("  {:>5}: quantize {tq:>8.1}  dequantize {td:>6.1}", ty.name());
    }
}

/// Random weight bytes (every quant, scale and high-bit pattern) with sane
/// f16 super-scales, against quantized activations: SIMD equals scalar.
#[test]
fn quant_simd_matches_scalar_on_random_weight_bytes() {
    use super::blocks::*;
    let mut rng = XorShift::new(77);
    let n = 2048;
    for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
        for _ in 0..8 {
            let mut w: Vec<u8> = (0..ty.row_size(n as i64).unwrap()).map(|_| rng.next_u64() as u8).collect();
            let mut scale = || f16_bytes(rng.uniform() * 0.1);
            match ty {
                Q4_0 => bytemuck::cast_slice_mut::<u8, BlockQ4_0>(&mut w).iter_mut().for_each(|b| b.d = scale()),
                Q4_1 => bytemuck::cast_slice_mut::<u8, BlockQ4_1>(&mut w).iter_mut().for_each(|b| {
                    b.d = scale();
                    b.m = scale();
                }),
                Q5_0 => bytemuck::cast_slice_mut::<u8, BlockQ5_0>(&mut w).iter_mut().for_each(|b| b.d = scale()),
                Q5_1 => bytemuck::cast_slice_mut::<u8, BlockQ5_1>(&mut w).iter_mut().for_each(|b| {
                    b.d = scale();
                    b.m = scale();
                }),
                Q8_0 => bytemuck::cast_slice_mut::<u8, BlockQ8_0>(&mut w).iter_mut().for_each(|b| {
                    b.d = scale();
                    // Weight quants of −128 are outside what ggml produces.
                    b.qs.iter_mut().for_each(|q| *q = (*q).max(-127));
                }),
                Q2_K => bytemuck::cast_slice_mut::<u8, BlockQ2K>(&mut w).iter_mut().for_each(|b| {
                    b.d = scale();
                    b.dmin = scale();
                }),
                Q3_K => bytemuck::cast_slice_mut::<u8, BlockQ3K>(&mut w).iter_mut().for_each(|b| b.d = scale()),
                Q4_K => bytemuck::cast_slice_mut::<u8, BlockQ4K>(&mut w).iter_mut().for_each(|b| {
                    b.d = scale();
                    b.dmin = scale();
                }),
                Q5_K => bytemuck::cast_slice_mut::<u8, BlockQ5K>(&mut w).iter_mut().for_each(|b| {
                    b.d = scale();
                    b.dmin = scale();
                }),
                Q6_K => bytemuck::cast_slice_mut::<u8, BlockQ6K>(&mut w).iter_mut().for_each(|b| b.d = scale()),
                _ => unreachable!(),
            }
            let y: Vec<f32> = (0..n).map(|_| rng.normal() * 2.0).collect();
            let a = quantize(vec_dot_type(ty), &y);
            let xd = dequantize(ty, &w, n);
            let yd = dequantize(vec_dot_type(ty), &a, n);
            let mag: f64 = xd.iter().zip(&yd).map(|(p, q)| (*p as f64 * *q as f64).abs()).sum();
            let exact: f64 = xd.iter().zip(&yd).map(|(p, q)| *p as f64 * *q as f64).sum();
            let s = vec_dot_fn_scalar(ty).unwrap()(n, &w, &a) as f64;
            let f = vec_dot_fn(ty).unwrap()(n, &w, &a) as f64;
            let tol = mag * 2e-6 + if vec_dot_type(ty) == Q8_1 { mag * 1e-3 } else { 0.0 };
            assert!((s - f).abs() <= mag * 1e-6, "{ty}: scalar {s} simd {f}");
            assert!((s - exact).abs() <= tol, "{ty}: scalar {s} vs dequantized {exact}");
        }
    }
}

/// The types ggml 0.15.3 lacked (the IQ, TQ and FP4 formats, Q1_0, Q2_0).
const NEW_TYPES: [GgmlType; 15] =
    [IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0];

/// Relative RMS error bound of a quantize → dequantize round trip of the
/// new types on normal data (measured values are printed; the bounds leave
/// ~20% headroom). Q1_0 keeps only signs, the ternary formats three levels
/// at ±amax (made for ternary weights, which they keep exactly).
fn rmse_bound_new(ty: GgmlType) -> f32 {
    match ty {
        IQ4_NL | IQ4_XS => 0.09,
        MXFP4 => 0.14,
        NVFP4 => 0.12,
        IQ3_S => 0.19,
        IQ3_XXS => 0.25,
        IQ2_S => 0.31,
        IQ1_M => 0.7,
        TQ1_0 | TQ2_0 => 0.92,
        Q2_0 => 0.83,
        Q1_0 => 0.7,
        _ => 0.0,
    }
}

#[test]
fn quant_new_types_round_trip_and_edge_inputs() {
    let mut rng = XorShift::new(21);
    for ty in NEW_TYPES {
        let n = 4096;
        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let mut q = vec![0u8; ty.row_size(n as i64).unwrap()];
        if quantize_requires_imatrix(ty) {
            // Refused with a typed error, never a panic.
            let e = quantize_chunk(ty, &x, &mut q, 1, n).unwrap_err();
            assert!(matches!(e, Error::UnsupportedType { .. }) && e.to_string().contains("importance matrix"), "{e}");
            continue;
        }
        let y = dequantize(ty, &quantize(ty, &x), n);
        let err = rms(x.iter().zip(&y).map(|(a, b)| a - b)) / rms(x.iter().copied());
        eprintln!("{ty}: relative rms error {err:.4}");
        assert!(err < rmse_bound_new(ty), "{ty}: relative rms error {err} over bound {}", rmse_bound_new(ty));
        if matches!(ty, TQ1_0 | TQ2_0 | Q1_0) {
            // Ternary (and for Q1_0 binary) weights round-trip exactly.
            let levels: &[f32] = if ty == Q1_0 { &[-0.75, 0.75] } else { &[-0.75, 0.0, 0.75] };
            let t: Vec<f32> = (0..n).map(|i| levels[(i * 7 + i / 5) % levels.len()]).collect();
            assert_eq!(dequantize(ty, &quantize(ty, &t), n), t, "{ty}: ternary weights");
        }
        // All-zero rows dequantize to zeros; tiny, huge and non-finite
        // inputs give some bytes without panicking, in one row or many.
        let z = dequantize(ty, &quantize(ty, &vec![0.0; n]), n);
        assert!(z.iter().all(|&v| v == 0.0), "{ty}: zero row not preserved");
        for scale in [1e-40f32, 1e-30, 1e-6, 1e4, 1e30] {
            let x: Vec<f32> = (0..n).map(|_| rng.normal() * scale).collect();
            let _ = dequantize(ty, &quantize(ty, &x), n);
        }
        let mut x = x.clone();
        for (i, v) in x.iter_mut().enumerate() {
            match i % 53 {
                3 => *v = f32::NAN,
                9 => *v = f32::INFINITY,
                21 => *v = f32::NEG_INFINITY,
                _ => {}
            }
        }
        let _ = dequantize(ty, &quantize(ty, &x), n);
        let rows = 17;
        let big: Vec<f32> = (0..rows * 4096).map(|_| rng.normal()).collect();
        let mut par = vec![0u8; rows * ty.row_size(4096).unwrap()];
        quantize_chunk(ty, &big, &mut par, rows, 4096).unwrap();
        let mut seq = vec![0u8; par.len()];
        for (r, (xs, qs)) in big.chunks_exact(4096).zip(seq.chunks_exact_mut(par.len() / rows)).enumerate() {
            quantize_chunk(ty, xs, qs, 1, 4096).unwrap_or_else(|e| panic!("{ty} row {r}: {e}"));
        }
        assert_eq!(par, seq, "{ty}: parallel and row-by-row quantization differ");
    }
}

#[test]
fn quant_new_types_vec_dot_types_match_ggml() {
    for ty in [IQ4_NL, MXFP4, NVFP4, Q1_0, Q2_0] {
        assert_eq!(vec_dot_type(ty), Q8_0, "{ty}");
    }
    for ty in [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_XS, TQ1_0, TQ2_0] {
        assert_eq!(vec_dot_type(ty), Q8_K, "{ty}");
    }
    for ty in NEW_TYPES {
        assert!(vec_dot_fn(ty).is_some() && vec_dot_fn_scalar(ty).is_some(), "{ty}");
        assert_eq!(quantize_requires_imatrix(ty), matches!(ty, IQ2_XXS | IQ2_XS | IQ1_S), "{ty}");
    }
}

/// Random bytes of `n` elements of `ty` with moderate f16 scales (every
/// quant, index, sign and sub-scale bit random): valid blocks of every type.
pub(crate) fn random_valid_blocks(ty: GgmlType, n: usize, rng: &mut XorShift) -> Vec<u8> {
    use super::blocks::*;
    let mut w: Vec<u8> = (0..ty.row_size(n as i64).unwrap()).map(|_| rng.next_u64() as u8).collect();
    let mut scale = || f16_bytes(rng.uniform() * 0.1);
    macro_rules! set_d {
        ($b:ty) => {
            bytemuck::cast_slice_mut::<u8, $b>(&mut w).iter_mut().for_each(|b| b.d = scale())
        };
    }
    match ty {
        IQ2_XXS => set_d!(BlockIQ2XXS),
        IQ2_XS => set_d!(BlockIQ2XS),
        IQ2_S => set_d!(BlockIQ2S),
        IQ3_XXS => set_d!(BlockIQ3XXS),
        IQ3_S => set_d!(BlockIQ3S),
        IQ1_S => set_d!(BlockIQ1S),
        IQ4_NL => set_d!(BlockIQ4NL),
        IQ4_XS => set_d!(BlockIQ4XS),
        TQ1_0 => set_d!(BlockTQ1_0),
        TQ2_0 => set_d!(BlockTQ2_0),
        Q1_0 => set_d!(BlockQ1_0),
        Q2_0 => set_d!(BlockQ2_0),
        IQ1_M => bytemuck::cast_slice_mut::<u8, BlockIQ1M>(&mut w).iter_mut().for_each(|b| {
            // The f16 scale lives in the top nibbles of the four u16 scales.
            let d = u16::from_le_bytes(scale());
            for k in 0..4 {
                b.scales[2 * k + 1] = (b.scales[2 * k + 1] & 0x0f) | ((((d >> (4 * k)) & 0xf) as u8) << 4);
            }
        }),
        MXFP4 => bytemuck::cast_slice_mut::<u8, BlockMXFP4>(&mut w).iter_mut().for_each(|b| b.e = 110 + b.e % 30),
        NVFP4 => {}
        _ => unreachable!("{ty} is not a new type"),
    }
    w
}

/// Weight rows of every new type: quantized normal data (where this crate
/// quantizes the type) and random valid blocks.
fn new_type_rows(ty: GgmlType, n: usize, rng: &mut XorShift) -> Vec<Vec<u8>> {
    let mut rows = vec![random_valid_blocks(ty, n, rng)];
    if !quantize_requires_imatrix(ty) {
        let x: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        rows.push(quantize(ty, &x));
    }
    rows
}

#[test]
fn quant_new_types_dot_equals_dot_of_dequantized() {
    let mut rng = XorShift::new(31);
    for ty in NEW_TYPES {
        for n in [256usize, 4096] {
            for w in new_type_rows(ty, n, &mut rng) {
                let y: Vec<f32> = (0..n).map(|_| rng.normal() * 3.0).collect();
                let a = quantize(vec_dot_type(ty), &y);
                let (xd, yd) = (dequantize(ty, &w, n), dequantize(vec_dot_type(ty), &a, n));
                let exact: f64 = xd.iter().zip(&yd).map(|(p, q)| *p as f64 * *q as f64).sum();
                let mag: f64 = xd.iter().zip(&yd).map(|(p, q)| (*p as f64 * *q as f64).abs()).sum();
                for (name, f) in [("scalar", vec_dot_fn_scalar(ty).unwrap()), ("best", vec_dot_fn(ty).unwrap())] {
                    let got = f(n, &w, &a) as f64;
                    assert!((got - exact).abs() <= mag * 2e-6, "{ty} n={n} {name}: {got} vs {exact} (Σ|xy| {mag})");
                }
            }
        }
    }
}

/// The new types with SIMD dot kernels (the formats real files use).
const NEW_SIMD_TYPES: [GgmlType; 11] =
    [IQ4_XS, IQ4_NL, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, MXFP4, TQ2_0];

#[test]
fn quant_new_types_simd_matches_scalar() {
    let mut rng = XorShift::new(41);
    eprintln!("quant: dot kernels use {}", simd_isa());
    for ty in NEW_SIMD_TYPES {
        assert_eq!(simd::best(ty).is_some(), simd_isa() != "scalar", "{ty}: SIMD kernel");
        let (s, f) = (vec_dot_fn_scalar(ty).unwrap(), vec_dot_fn(ty).unwrap());
        for n in [256usize, 512, 4096, 8192] {
            for _ in 0..3 {
                for w in new_type_rows(ty, n, &mut rng) {
                    let y: Vec<f32> = (0..n).map(|_| rng.normal() * 2.0).collect();
                    let a = quantize(vec_dot_type(ty), &y);
                    let xd = dequantize(ty, &w, n);
                    let yd = dequantize(vec_dot_type(ty), &a, n);
                    let mag: f64 = xd.iter().zip(&yd).map(|(p, q)| (*p as f64 * *q as f64).abs()).sum();
                    let (p, q) = (s(n, &w, &a), f(n, &w, &a));
                    assert!(((p - q) as f64).abs() <= mag * 1e-6, "{ty} n={n}: scalar {p} simd {q} (Σ|xy| {mag})");
                    // Unaligned buffers give the same answer.
                    let mut wu = vec![0u8; w.len() + 1];
                    wu[1..].copy_from_slice(&w);
                    let mut au = vec![0u8; a.len() + 3];
                    au[3..].copy_from_slice(&a);
                    assert_eq!(f(n, &wu[1..], &au[3..]).to_bits(), q.to_bits(), "{ty}: unaligned");
                    // Short rows are NaN, as for every kernel.
                    assert!(f(n, &w[..w.len() - 1], &a).is_nan(), "{ty}: short row");
                }
            }
        }
    }
}

/// `cargo test --release --lib quant_bench_new -- --ignored --nocapture`
#[test]
#[ignore]
fn quant_bench_new_types() {
    let mut rng = XorShift::new(3);
    let n = 4096;
    eprintln!("dot of {n} elements, ns per call (simd = {}); quantize one row, µs:", simd_isa());
    for ty in NEW_TYPES {
        let w = random_valid_blocks(ty, n, &mut rng);
        let y: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let a = quantize(vec_dot_type(ty), &y);
        let s = time_dot(vec_dot_fn_scalar(ty).unwrap(), n, &w, &a);
        let f = time_dot(vec_dot_fn(ty).unwrap(), n, &w, &a);
        let mut tq = f64::NAN;
        if !quantize_requires_imatrix(ty) {
            let mut q = vec![0u8; w.len()];
            let t = std::time::Instant::now();
            for _ in 0..20 {
                quantize_chunk(ty, std::hint::black_box(&y), &mut q, 1, n).unwrap();
            }
            tq = t.elapsed().as_secs_f64() * 1e6 / 20.0;
        }
        eprintln!("  {:>7}: scalar {s:>8.0}  best {f:>7.0}  speedup {:>5.1}x  quantize {tq:>9.1}", ty.name(), s / f);
    }
}

/// The GPU kernels' copy of the IQ and FP4 tables
/// (`kernels-cuda/iq_tables.cuh`) as rendered from this module's tables:
/// the grids of `grids.rs`, `KSIGNS` and the two 4-bit value tables. The
/// Rust tables are the one source; the header is generated from them.
fn render_kernel_tables() -> String {
    use super::grids::*;
    use super::iquants::KSIGNS;
    use std::fmt::Write;
    let mut s = String::new();
    s += "// iq_tables.cuh — GENERATED from src/tensor/quant/grids.rs (and KSIGNS of\n";
    s += "// iquants.rs) by the unit test `kernel_tables_equal_the_rust_tables`\n";
    s += "// (src/tensor/quant/tests.rs), which fails when this file differs from the\n";
    s += "// Rust tables; `SHARDGRAPH_BLESS=1 cargo test --lib kernel_tables` rewrites\n";
    s += "// it. Do not edit by hand. ggml 0.25.3's codebooks of the IQ formats (grid\n";
    s += "// point i packs its coordinates as little-endian bytes, coordinate k in byte\n";
    s += "// k: unsigned magnitudes for IQ2/IQ3, signed -1/0/1 for IQ1), the sign\n";
    s += "// patterns of IQ2_XXS/IQ2_XS/IQ3_XXS (7 stored bits plus an even-parity 8th),\n";
    s += "// and the 4-bit value tables of IQ4_NL/IQ4_XS and of MXFP4/NVFP4 (E2M1,\n";
    s += "// doubled). Included by dequant.cuh and quant.cuh (build.rs pastes it once).\n";
    s += "//\n";
    s += "// SG_TABLE: device-global read-only memory, as the lanes of a warp look up\n";
    s += "// different entries (the constant cache serialises divergent addresses).\n";
    s += "#ifndef SG_IQ_TABLES_CUH\n#define SG_IQ_TABLES_CUH\n";
    s += "#ifndef SG_TABLE\n#define SG_TABLE __device__ const\n#endif\n";
    let u64s = |s: &mut String, name: &str, t: &[u64]| {
        let _ = writeln!(s, "\nSG_TABLE unsigned long long {name}[{}] = {{", t.len());
        for row in t.chunks(4) {
            let cells: Vec<String> = row.iter().map(|v| format!("0x{v:016x}ull")).collect();
            let _ = writeln!(s, "    {},", cells.join(", "));
        }
        s.push_str("};\n");
    };
    u64s(&mut s, "sg_iq2xxs_grid", &IQ2XXS_GRID);
    u64s(&mut s, "sg_iq2xs_grid", &IQ2XS_GRID);
    u64s(&mut s, "sg_iq2s_grid", &IQ2S_GRID);
    u64s(&mut s, "sg_iq1s_grid", &IQ1S_GRID);
    let u32s = |s: &mut String, name: &str, t: &[u32]| {
        let _ = writeln!(s, "\nSG_TABLE unsigned int {name}[{}] = {{", t.len());
        for row in t.chunks(8) {
            let cells: Vec<String> = row.iter().map(|v| format!("0x{v:08x}u")).collect();
            let _ = writeln!(s, "    {},", cells.join(", "));
        }
        s.push_str("};\n");
    };
    u32s(&mut s, "sg_iq3xxs_grid", &IQ3XXS_GRID);
    u32s(&mut s, "sg_iq3s_grid", &IQ3S_GRID);
    let _ = writeln!(s, "\nSG_TABLE unsigned char sg_ksigns_iq2xs[{}] = {{", KSIGNS.len());
    for row in KSIGNS.chunks(16) {
        let cells: Vec<String> = row.iter().map(|v| v.to_string()).collect();
        let _ = writeln!(s, "    {},", cells.join(", "));
    }
    s.push_str("};\n");
    let i8s = |s: &mut String, name: &str, t: &[i8]| {
        let cells: Vec<String> = t.iter().map(|v| v.to_string()).collect();
        let _ = writeln!(s, "\nSG_TABLE signed char {name}[{}] = {{{}}};", t.len(), cells.join(", "));
    };
    i8s(&mut s, "sg_kvalues_iq4nl", &KVALUES_IQ4NL);
    i8s(&mut s, "sg_kvalues_fp4", &KVALUES_FP4);
    s += "\n#endif // SG_IQ_TABLES_CUH\n";
    s
}

/// `kernels-cuda/iq_tables.cuh` is exactly what [`render_kernel_tables`]
/// makes of the Rust tables (so the GPU kernels decode with the CPU's
/// codebooks); with `SHARDGRAPH_BLESS=1` a differing file is rewritten.
#[test]
fn kernel_tables_equal_the_rust_tables() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels-cuda").join("iq_tables.cuh");
    let want = render_kernel_tables();
    let got = std::fs::read_to_string(&path).unwrap_or_default();
    if got != want && std::env::var_os("SHARDGRAPH_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let line = got.lines().zip(want.lines()).position(|(a, b)| a != b).map_or(0, |i| i + 1);
    assert!(
        got == want,
        "{} differs from the Rust tables (first at line {line}); SHARDGRAPH_BLESS=1 regenerates it",
        path.display()
    );
}
