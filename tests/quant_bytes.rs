//! Byte identity of `shardgraph::tensor::quant` with the real ggml.
//!
//! Loads ggml 0.15.3 (`libggml-base.so`, and `libggml-cpu.so` for the dot
//! products) with `libloading` and compares, for every format and a set of
//! row lengths and data shapes (normal data, outliers, all-zero rows, huge
//! and tiny values, constant rows, rounding ties):
//! - `quantize_chunk` bytes against `ggml_quantize_chunk(type, …, imatrix = NULL)`
//!   (Q8_1 and Q8_K against `quantize_row_q8_1_ref`/`quantize_row_q8_K_ref`);
//! - `dequantize_row` f32 bits against ggml's `to_float` on the same bytes;
//! - f32 → f16 / bf16 conversion bits over a sweep of all f32 bit patterns;
//! - the dot products against ggml's CPU `vec_dot` (within float rounding).
//!
//! The library is found through `GGML_LIB_DIR`, else
//! `<repo>/.venv/lib/python3*/site-packages/ggml/lib`. Without it each test
//! prints `quant_bytes: SKIPPED: …` and passes.

use libloading::Library;
use shardgraph::tensor::quant::{
    dequantize_row, fp32_to_bf16_bits, fp32_to_fp16_bits, quantize_chunk, vec_dot_fn, vec_dot_type,
};
use shardgraph::GgmlType::{self, *};
use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;

/// `struct ggml_type_traits` (ggml.h). Only the function pointers are read.
#[repr(C)]
#[allow(dead_code)]
struct TypeTraits {
    type_name: *const c_char,
    blck_size: i64,
    blck_size_interleave: i64,
    type_size: usize,
    is_quantized: bool,
    to_float: Option<unsafe extern "C" fn(*const c_void, *mut f32, i64)>,
    from_float_ref: Option<unsafe extern "C" fn(*const f32, *mut c_void, i64)>,
}

/// `struct ggml_type_traits_cpu` (ggml-cpu.h).
#[repr(C)]
#[allow(dead_code)]
struct TypeTraitsCpu {
    from_float: Option<unsafe extern "C" fn(*const f32, *mut c_void, i64)>,
    vec_dot: Option<VecDotC>,
    vec_dot_type: c_int,
    nrows: i64,
}

type VecDotC = unsafe extern "C" fn(c_int, *mut f32, usize, *const c_void, usize, *const c_void, usize, c_int);
type QuantizeChunk = unsafe extern "C" fn(c_int, *const f32, *mut c_void, i64, i64, i64, *const f32) -> usize;
type RowFn = unsafe extern "C" fn(*const f32, *mut c_void, i64);
type ToFloatFn = unsafe extern "C" fn(*const c_void, *mut f32, i64);

/// The loaded libraries and the entry points the tests use.
struct Ggml {
    quantize_chunk: QuantizeChunk,
    type_traits: unsafe extern "C" fn(c_int) -> *const TypeTraits,
    type_traits_cpu: unsafe extern "C" fn(c_int) -> *const TypeTraitsCpu,
    q8_k_ref: RowFn,
    q8_k_deq: ToFloatFn,
    fp32_to_fp16: unsafe extern "C" fn(f32) -> u16,
    fp32_to_bf16: unsafe extern "C" fn(f32) -> u16,
    _cpu: Library,
    _base: Library,
}

fn lib_dir() -> Result<PathBuf, String> {
    if let Ok(d) = std::env::var("GGML_LIB_DIR") {
        return Ok(PathBuf::from(d));
    }
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    let entries =
        std::fs::read_dir(&lib).map_err(|e| format!("{}/python3*/site-packages/ggml/lib ({e})", lib.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let cand = e.path().join("site-packages/ggml/lib");
        if name.starts_with("python3") && cand.join("libggml-base.so").exists() {
            return Ok(cand);
        }
    }
    Err(format!("{}/python3*/site-packages/ggml/lib", lib.display()))
}

/// Loads ggml, or prints the SKIP line and returns `None`.
fn load() -> Option<Ggml> {
    let dir = match lib_dir() {
        Ok(d) if d.join("libggml-base.so").exists() && d.join("libggml-cpu.so").exists() => d,
        Ok(d) => {
            eprintln!("quant_bytes: SKIPPED: ggml library not found at {}", d.display());
            return None;
        }
        Err(p) => {
            eprintln!("quant_bytes: SKIPPED: ggml library not found at {p}");
            return None;
        }
    };
    // SAFETY: loading ggml runs its (side-effect free) initialisers; the
    // symbols are resolved with the C signatures declared in ggml.h /
    // ggml-cpu.h for ggml 0.15.3, and the libraries outlive the pointers
    // (they are kept in the returned struct).
    unsafe {
        let base = Library::new(dir.join("libggml-base.so")).ok()?;
        let cpu = Library::new(dir.join("libggml-cpu.so")).ok()?;
        let cpu_init: libloading::Symbol<unsafe extern "C" fn()> = cpu.get(b"ggml_cpu_init\0").ok()?;
        cpu_init();
        let g = Ggml {
            quantize_chunk: *base.get(b"ggml_quantize_chunk\0").ok()?,
            type_traits: *base.get(b"ggml_get_type_traits\0").ok()?,
            type_traits_cpu: *cpu.get(b"ggml_get_type_traits_cpu\0").ok()?,
            q8_k_ref: *base.get(b"quantize_row_q8_K_ref\0").ok()?,
            q8_k_deq: *base.get(b"dequantize_row_q8_K\0").ok()?,
            fp32_to_fp16: *base.get(b"ggml_fp32_to_fp16\0").ok()?,
            fp32_to_bf16: *base.get(b"ggml_fp32_to_bf16\0").ok()?,
            _cpu: cpu,
            _base: base,
        };
        Some(g)
    }
}

impl Ggml {
    /// ggml's bytes for `nrows` rows of `n` values of `x`.
    fn quantize(&self, ty: GgmlType, x: &[f32], nrows: usize, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; nrows * ty.row_size(n as i64).unwrap()];
        // SAFETY: `x` holds nrows·n floats and `out` nrows·row_size bytes, as
        // ggml requires; the row functions write exactly that many bytes.
        unsafe {
            match ty {
                Q8_1 => {
                    let f = (*(self.type_traits)(ty.id() as c_int)).from_float_ref.unwrap();
                    f(x.as_ptr(), out.as_mut_ptr().cast(), (nrows * n) as i64);
                }
                Q8_K => (self.q8_k_ref)(x.as_ptr(), out.as_mut_ptr().cast(), (nrows * n) as i64),
                _ => {
                    let written = (self.quantize_chunk)(
                        ty.id() as c_int,
                        x.as_ptr(),
                        out.as_mut_ptr().cast(),
                        0,
                        nrows as i64,
                        n as i64,
                        std::ptr::null(),
                    );
                    assert_eq!(written, out.len());
                }
            }
        }
        out
    }

    /// ggml's f32 values of `n` elements packed in `q`, or `None` if ggml
    /// has no dequantizer for `ty` (Q8_1).
    fn dequantize(&self, ty: GgmlType, q: &[u8], n: usize) -> Option<Vec<f32>> {
        let mut out = vec![0f32; n];
        // SAFETY: `q` holds the row size of n elements, `out` n floats.
        unsafe {
            let f = if ty == Q8_K { Some(self.q8_k_deq) } else { (*(self.type_traits)(ty.id() as c_int)).to_float };
            f?(q.as_ptr().cast(), out.as_mut_ptr(), n as i64);
        }
        Some(out)
    }

    /// ggml's CPU dot product for weight type `ty`.
    fn vec_dot(&self, ty: GgmlType, n: usize, x: &[u8], y: &[u8]) -> f32 {
        let mut s = 0f32;
        // SAFETY: x and y hold one row of n elements each of ty and its
        // vec_dot_type (checked by the caller); nrc = 1 reads one row.
        unsafe {
            let t = &*(self.type_traits_cpu)(ty.id() as c_int);
            assert_eq!(t.vec_dot_type as u32, vec_dot_type(ty).id(), "{ty}: vec_dot_type differs from ggml");
            (t.vec_dot.unwrap())(n as c_int, &mut s, 0, x.as_ptr().cast(), 0, y.as_ptr().cast(), 0, 1);
        }
        s
    }
}

/// xorshift64*, deterministic.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn normal(&mut self) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866
    }
}

/// Named input data sets of `len` values.
fn datasets(len: usize, seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let mut r = Rng(seed | 1);
    let normal: Vec<f32> = (0..len).map(|_| r.normal()).collect();
    let mut outliers = normal.clone();
    for i in (0..len).step_by(37) {
        outliers[i] *= 100.0;
    }
    let mut zero_rows = normal.clone();
    for v in zero_rows.iter_mut().take(len / 2) {
        *v = 0.0;
    }
    let mut one_hot = vec![0f32; len];
    for i in (0..len).step_by(97) {
        one_hot[i] = if i % 2 == 0 { 3.5 } else { -0.25 };
    }
    let huge: Vec<f32> = (0..len).map(|_| r.normal() * 1e4).collect();
    let very_huge: Vec<f32> = (0..len).map(|_| r.normal() * 1e30).collect();
    let tiny: Vec<f32> = (0..len).map(|_| r.normal() * 1e-30).collect();
    let subnormal: Vec<f32> = (0..len).map(|_| r.normal() * 1e-40).collect();
    let constant = vec![0.7f32; len];
    let neg_constant = vec![-2.0f32; len];
    // Values on a coarse grid produce exact rounding ties in the quantizers.
    let grid: Vec<f32> = (0..len).map(|_| ((r.next() % 33) as f32 - 16.0) / 8.0).collect();
    let uniform_pos: Vec<f32> = (0..len).map(|_| r.uniform().abs() * 5.0 + 1.0).collect();
    let heavy_tail: Vec<f32> = (0..len).map(|_| r.normal().powi(3)).collect();
    let mixed_scale: Vec<f32> = (0..len).map(|_| r.normal() * (r.uniform() * 6.0).exp()).collect();
    let mut specials = normal.clone();
    for (i, v) in specials.iter_mut().enumerate() {
        match i % 61 {
            5 => *v = f32::NAN,
            17 => *v = f32::INFINITY,
            29 => *v = f32::NEG_INFINITY,
            _ => {}
        }
    }
    vec![
        ("normal", normal),
        ("outliers", outliers),
        ("zero_rows", zero_rows),
        ("one_hot", one_hot),
        ("huge", huge),
        ("very_huge", very_huge),
        ("tiny", tiny),
        ("subnormal", subnormal),
        ("constant", constant),
        ("neg_constant", neg_constant),
        ("grid", grid),
        ("uniform_pos", uniform_pos),
        ("heavy_tail", heavy_tail),
        ("mixed_scale", mixed_scale),
        ("nan_inf", specials),
    ]
}

const TYPES: [GgmlType; 15] = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, F16, BF16, F32];

/// f32 bits equal, or both NaN (ggml and Rust may quiet NaNs differently
/// when the value goes through arithmetic).
fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn quant_bytes_match_ggml() {
    let Some(g) = load() else { return };
    let mut report = Vec::new();
    for ty in TYPES {
        let bs = ty.block_size();
        let lens: &[usize] = if bs == 32 || bs == 1 { &[32, 256, 4096] } else { &[256, 4096] };
        let (mut cases, mut byte_mismatch, mut deq_mismatch) = (0, Vec::new(), Vec::new());
        for &n in lens {
            for nrows in [1usize, 3] {
                for (name, x) in datasets(n * nrows, (n * 31 + nrows) as u64) {
                    cases += 1;
                    let want = g.quantize(ty, &x, nrows, n);
                    let mut got = vec![0u8; want.len()];
                    quantize_chunk(ty, &x, &mut got, nrows, n).unwrap();
                    if got != want {
                        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
                        byte_mismatch.push(format!("{name} n={n} rows={nrows} first diff at byte {first}"));
                    }
                    // Dequantize ggml's bytes both ways.
                    if let Some(ref_y) = g.dequantize(ty, &want, n * nrows) {
                        let mut y = vec![0f32; n * nrows];
                        dequantize_row(ty, &want, &mut y).unwrap();
                        if let Some(i) = y.iter().zip(&ref_y).position(|(a, b)| !same_f32(*a, *b)) {
                            deq_mismatch.push(format!("{name} n={n} rows={nrows} [{i}]: {} vs {}", y[i], ref_y[i]));
                        }
                    }
                }
            }
        }
        // Dequantize random bytes too (all bit patterns of the quants and scales).
        if ty.is_quantized() {
            let mut r = Rng(ty.id() as u64 + 99);
            let n = 8 * bs;
            let bytes: Vec<u8> = (0..ty.row_size(n as i64).unwrap()).map(|_| r.next() as u8).collect();
            if let Some(ref_y) = g.dequantize(ty, &bytes, n) {
                let mut y = vec![0f32; n];
                dequantize_row(ty, &bytes, &mut y).unwrap();
                if let Some(i) = y.iter().zip(&ref_y).position(|(a, b)| !same_f32(*a, *b)) {
                    deq_mismatch.push(format!("random bytes [{i}]: {} vs {}", y[i], ref_y[i]));
                }
            }
        }
        report.push(format!(
            "{:>5}: {cases} cases, {} byte mismatches, {} dequant mismatches",
            ty.name(),
            byte_mismatch.len(),
            deq_mismatch.len()
        ));
        for m in byte_mismatch.iter().chain(&deq_mismatch).take(6) {
            report.push(format!("         {m}"));
        }
    }
    eprintln!("quant_bytes vs ggml 0.15.3:\n{}", report.join("\n"));
    assert!(
        report.iter().all(|l| l.contains(" 0 byte mismatches, 0 dequant")),
        "mismatches against ggml (see report above)"
    );
}

#[test]
fn quant_bytes_half_conversions_match_ggml() {
    let Some(g) = load() else { return };
    // Every 61st f32 bit pattern (≈70M values) plus a dense sweep of the
    // f16 rounding region.
    let mut bad = Vec::new();
    let dense = (0x3300_0000u32..0x4780_0000).step_by(3);
    for bits in (0..=u32::MAX).step_by(61).chain(dense) {
        let v = f32::from_bits(bits);
        // SAFETY: plain value functions of ggml.
        let (h, b) = unsafe { ((g.fp32_to_fp16)(v), (g.fp32_to_bf16)(v)) };
        if fp32_to_fp16_bits(v) != h || fp32_to_bf16_bits(v) != b {
            bad.push(bits);
            if bad.len() > 5 {
                break;
            }
        }
    }
    assert!(bad.is_empty(), "f16/bf16 conversion differs from ggml for f32 bits {bad:08x?}");
}

#[test]
fn quant_bytes_dot_matches_ggml_vec_dot() {
    let Some(g) = load() else { return };
    let mut lines = Vec::new();
    for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16, F32] {
        let vt = vec_dot_type(ty);
        let f = vec_dot_fn(ty).unwrap();
        let mut worst = 0f64;
        for n in [256usize, 4096] {
            for (name, x) in datasets(2 * n, n as u64 + ty.id() as u64) {
                if matches!(name, "nan_inf" | "very_huge" | "huge" | "subnormal" | "tiny") {
                    continue;
                }
                let (xw, xa) = x.split_at(n);
                let wq = g.quantize(ty, xw, 1, n);
                let aq = g.quantize(vt, xa, 1, n);
                let want = g.vec_dot(ty, n, &wq, &aq) as f64;
                let got = f(n, &wq, &aq) as f64;
                // Scale of the terms: Σ |x|·|y| of the dequantized rows.
                let (wd, ad) = (deq(ty, &wq, n), deq(vt, &aq, n));
                let mag: f64 = wd.iter().zip(&ad).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                let rel = (got - want).abs() / mag.max(f64::MIN_POSITIVE);
                worst = worst.max(rel);
                assert!(rel <= 1e-5, "{ty} {name} n={n}: ours {got} ggml {want} (Σ|xy| = {mag})");
            }
        }
        lines.push(format!("{:>5}: max |ours − ggml| / Σ|x·y| = {worst:.2e}", ty.name()));
    }
    eprintln!("dot vs ggml vec_dot:\n{}", lines.join("\n"));
}

fn deq(ty: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, q, &mut y).unwrap();
    y
}

#[test]
fn quant_bytes_q8_k_all_zero_block_sums() {
    // ggml leaves the block sums of an all-zero Q8_K block unwritten; this
    // crate writes zeros. With a zeroed destination both agree.
    let Some(g) = load() else { return };
    let x = vec![0f32; 256];
    let want = g.quantize(Q8_K, &x, 1, 256);
    let mut got = vec![0xAAu8; want.len()];
    quantize_chunk(Q8_K, &x, &mut got, 1, 256).unwrap();
    assert_eq!(got, want);
}

/// Speed of this crate's dot kernels against ggml's CPU kernels, 4096
/// elements: `cargo test --release --test quant_bytes -- --ignored --nocapture`.
#[test]
#[ignore]
fn quant_bytes_bench_dot_vs_ggml() {
    let Some(g) = load() else { return };
    let n = 4096;
    let iters = 5_000;
    eprintln!("ns per {n}-element dot (ours = {}):", shardgraph::tensor::quant::simd_isa());
    for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16, F32] {
        let x = &datasets(2 * n, 5)[0].1;
        let wq = g.quantize(ty, &x[..n], 1, n);
        let aq = g.quantize(vec_dot_type(ty), &x[n..], 1, n);
        let f = vec_dot_fn(ty).unwrap();
        let mut acc = 0f32;
        // Best of 7 runs: the machine may be shared.
        let (mut ours, mut theirs) = (f64::MAX, f64::MAX);
        for _ in 0..7 {
            let t = std::time::Instant::now();
            for _ in 0..iters {
                acc += f(n, std::hint::black_box(&wq), std::hint::black_box(&aq));
            }
            ours = ours.min(t.elapsed().as_nanos() as f64 / iters as f64);
            let t = std::time::Instant::now();
            for _ in 0..iters {
                acc += g.vec_dot(ty, n, std::hint::black_box(&wq), std::hint::black_box(&aq));
            }
            theirs = theirs.min(t.elapsed().as_nanos() as f64 / iters as f64);
        }
        std::hint::black_box(acc);
        eprintln!("  {:>5}: ours {ours:>6.0}  ggml {theirs:>6.0}", ty.name());
    }
}
