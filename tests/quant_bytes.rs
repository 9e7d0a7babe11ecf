//! Byte identity of `shardgraph::tensor::quant` with the real ggml, version
//! 0.25.3 (the libraries llama-cpp-python bundles: `libggml-base.so`, and
//! `libggml-cpu.so` for the dot products). 0.25.3 has every type 0.15.3 has,
//! with the same reference code for them, so these tests use 0.25.3 alone.
//!
//! For every block format of ggml 0.25.3 and a set of row lengths and data
//! shapes (normal data, outliers, all-zero rows, huge and tiny values,
//! constant rows, rounding ties, NaN/±∞):
//! - the type traits (name, block size, type size) and
//!   `ggml_quantize_requires_imatrix` equal ggml's;
//! - `quantize_chunk` bytes equal `ggml_quantize_chunk(type, …, imatrix =
//!   NULL)` (Q8_1 and Q8_K against `quantize_row_q8_1_ref`/`_q8_K_ref`); the
//!   types ggml quantizes only with an importance matrix (IQ2_XXS, IQ2_XS,
//!   IQ1_S) are refused with `Error::UnsupportedType`;
//! - `from_float` (what `cpy`/`set_rows` write) equals ggml's CPU
//!   `from_float` for the new types (IQ4_NL's differs from its
//!   `ggml_quantize_chunk`);
//! - `dequantize_row` f32 bits equal ggml's `to_float`, on ggml's bytes
//!   (for the importance-matrix types, blocks ggml made with a made-up
//!   importance matrix) and on random bytes;
//! - the dot products equal ggml's CPU `vec_dot` within 1e-5 of Σ|x·y|, on
//!   ggml-quantized rows and on random blocks with sane scales;
//! - f32 → f16 / bf16 conversion bits over a sweep of all f32 bit patterns.
//!
//! `quant_bytes_match_ggml` prints one table row per type. ggml aborts the
//! process on NaN/∞ (and on values whose squares overflow) in its
//! codebook-search quantizers, so those inputs are not given to it for
//! IQ3_XXS, IQ3_S, IQ2_S, IQ1_M and the importance-matrix types.
//!
//! The library is found through `GGML_0_25_LIB_DIR` (not `GGML_LIB_DIR`,
//! which points the op suite at its ggml 0.15.3), else
//! `<repo>/.venv/lib/python3*/site-packages/llama_cpp/lib`. Without it each
//! test prints `quant_bytes: SKIPPED: …` and passes, unless
//! `SHARDGRAPH_REQUIRE_GGML` is set (as `.ci/run` does): then a missing
//! library or symbol fails.

#[path = "common/quant_blocks.rs"]
mod quant_blocks;
#[path = "common/rng.rs"]
mod rng;

use libloading::Library;
use shardgraph::tensor::quant::{
    dequantize_row, fp32_to_bf16_bits, fp32_to_fp16_bits, from_float, quantize_chunk, quantize_requires_imatrix,
    vec_dot_fn, vec_dot_type,
};
use shardgraph::tensor::ALL_TYPES;
use shardgraph::GgmlType::{self, *};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;

/// `struct ggml_type_traits` (ggml.h).
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
    requires_imatrix: unsafe extern "C" fn(c_int) -> bool,
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
    if let Ok(d) = std::env::var("GGML_0_25_LIB_DIR") {
        return Ok(PathBuf::from(d));
    }
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    let entries =
        std::fs::read_dir(&lib).map_err(|e| format!("{}/python3*/site-packages/llama_cpp/lib ({e})", lib.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let cand = e.path().join("site-packages/llama_cpp/lib");
        if name.starts_with("python3") && cand.join("libggml-base.so").exists() {
            return Ok(cand);
        }
    }
    Err(format!("{}/python3*/site-packages/llama_cpp/lib", lib.display()))
}

/// Loads ggml, or explains why not.
fn try_load() -> Result<Ggml, String> {
    let dir = lib_dir()?;
    let (base_path, cpu_path) = (dir.join("libggml-base.so"), dir.join("libggml-cpu.so"));
    // SAFETY: loading ggml runs its (side-effect free) initialisers; the
    // symbols are resolved with the C signatures declared in ggml.h /
    // ggml-cpu.h / ggml-quants.h of ggml 0.25.3, and the libraries outlive
    // the pointers (they are kept in the returned struct).
    unsafe {
        // libloading's errors name the file.
        let base = Library::new(&base_path).map_err(|e| e.to_string())?;
        let cpu = Library::new(&cpu_path).map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($lib:ident, $name:literal) => {
                *$lib.get(concat!($name, "\0").as_bytes()).map_err(|e| format!("symbol {}: {e}", $name))?
            };
        }
        let cpu_init: unsafe extern "C" fn() = sym!(cpu, "ggml_cpu_init");
        cpu_init();
        let version: unsafe extern "C" fn() -> *const c_char = sym!(base, "ggml_version");
        let v = CStr::from_ptr(version()).to_string_lossy().into_owned();
        if v != "0.25.3" {
            return Err(format!("{} is ggml {v}, not 0.25.3", base_path.display()));
        }
        Ok(Ggml {
            quantize_chunk: sym!(base, "ggml_quantize_chunk"),
            requires_imatrix: sym!(base, "ggml_quantize_requires_imatrix"),
            type_traits: sym!(base, "ggml_get_type_traits"),
            type_traits_cpu: sym!(cpu, "ggml_get_type_traits_cpu"),
            q8_k_ref: sym!(base, "quantize_row_q8_K_ref"),
            q8_k_deq: sym!(base, "dequantize_row_q8_K"),
            fp32_to_fp16: sym!(base, "ggml_fp32_to_fp16"),
            fp32_to_bf16: sym!(base, "ggml_fp32_to_bf16"),
            _cpu: cpu,
            _base: base,
        })
    }
}

/// Loads ggml, or prints the SKIP line and returns `None`; with
/// `SHARDGRAPH_REQUIRE_GGML` set a missing library or symbol fails instead.
fn load() -> Option<Ggml> {
    match try_load() {
        Ok(g) => Some(g),
        Err(why) => {
            assert!(std::env::var("SHARDGRAPH_REQUIRE_GGML").is_err(), "SHARDGRAPH_REQUIRE_GGML is set: {why}");
            eprintln!("quant_bytes: SKIPPED: ggml 0.25.3 not available: {why}");
            None
        }
    }
}

impl Ggml {
    fn traits(&self, ty: GgmlType) -> &TypeTraits {
        // SAFETY: ggml returns a pointer into its static traits table for
        // every id below GGML_TYPE_COUNT.
        unsafe { &*(self.type_traits)(ty.id() as c_int) }
    }

    /// ggml's bytes for `nrows` rows of `n` values of `x`, with importance
    /// matrix `imatrix` (`n` weights) or none.
    fn quantize_with(&self, ty: GgmlType, x: &[f32], nrows: usize, n: usize, imatrix: Option<&[f32]>) -> Vec<u8> {
        let mut out = vec![0u8; nrows * ty.row_size(n as i64).unwrap()];
        assert_eq!(x.len(), nrows * n);
        assert!(imatrix.is_none_or(|w| w.len() == n));
        // SAFETY: `x` holds nrows·n floats, `imatrix` (if any) n, and `out`
        // nrows·row_size bytes, as ggml requires; the row functions write
        // exactly that many bytes.
        unsafe {
            match ty {
                Q8_1 => {
                    let f = self.traits(ty).from_float_ref.unwrap();
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
                        imatrix.map_or(std::ptr::null(), |w| w.as_ptr()),
                    );
                    assert_eq!(written, out.len());
                }
            }
        }
        out
    }

    /// ggml's bytes without an importance matrix (or with a made-up one for
    /// the types that need one).
    fn quantize(&self, ty: GgmlType, x: &[f32], nrows: usize, n: usize) -> Vec<u8> {
        if quantize_requires_imatrix(ty) {
            let w = made_up_imatrix(n);
            self.quantize_with(ty, x, nrows, n, Some(&w))
        } else {
            self.quantize_with(ty, x, nrows, n, None)
        }
    }

    /// ggml's CPU `from_float` of one row (what its `cpy`/`set_rows` write),
    /// or `None` where ggml's CPU has none.
    fn cpu_from_float(&self, ty: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
        let mut out = vec![0u8; ty.row_size(x.len() as i64).unwrap()];
        // SAFETY: ggml's CPU traits table has an entry for every type id; the
        // row function reads `x.len()` floats and writes that row's bytes.
        unsafe {
            let f = (*(self.type_traits_cpu)(ty.id() as c_int)).from_float?;
            f(x.as_ptr(), out.as_mut_ptr().cast(), x.len() as i64);
        }
        Some(out)
    }

    /// ggml's f32 values of `n` elements packed in `q`, or `None` if ggml
    /// has no dequantizer for `ty` (Q8_1).
    fn dequantize(&self, ty: GgmlType, q: &[u8], n: usize) -> Option<Vec<f32>> {
        let mut out = vec![0f32; n];
        let f = if ty == Q8_K { Some(self.q8_k_deq) } else { self.traits(ty).to_float };
        // SAFETY: `q` holds the row size of n elements, `out` n floats.
        unsafe { f?(q.as_ptr().cast(), out.as_mut_ptr(), n as i64) };
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

/// An importance matrix for the types ggml quantizes only with one: varied,
/// positive weights.
fn made_up_imatrix(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.5 + ((i * 37) % 11) as f32 * 0.3).collect()
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

/// Every block format and the float types, in id order.
fn types() -> Vec<GgmlType> {
    ALL_TYPES.iter().copied().filter(|t| t.is_quantized() || matches!(t, F16 | BF16 | F32)).collect()
}

/// Types whose ggml quantizer searches a codebook and aborts the process
/// on non-finite weights.
fn ggml_aborts_on_non_finite(ty: GgmlType) -> bool {
    quantize_requires_imatrix(ty) || matches!(ty, IQ3_XXS | IQ3_S | IQ2_S | IQ1_M)
}

/// Data sets given to ggml's quantizer for `ty`.
fn dataset_ok(ty: GgmlType, name: &str) -> bool {
    !(ggml_aborts_on_non_finite(ty) && matches!(name, "nan_inf" | "very_huge"))
}

/// f32 bits equal, or both NaN (ggml and Rust may quiet NaNs differently
/// when the value goes through arithmetic).
fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// One row of the report.
#[derive(Default)]
struct Row {
    /// Quantize cases and byte mismatches (`None`: not quantized here).
    quant: Option<(usize, Vec<String>)>,
    /// Dequantize cases and mismatches.
    deq: (usize, Vec<String>),
    /// `from_float` cases and mismatches against ggml's CPU `from_float`
    /// (`None`: not compared).
    from_float: Option<(usize, Vec<String>)>,
    /// Largest |ours − ggml| / Σ|x·y| of the dot products (`None`: no dot).
    dot: Option<f64>,
    /// Dot products over the bound.
    dot_bad: Vec<String>,
}

/// Our dequantization of ggml's bytes against ggml's (records a mismatch).
fn check_dequant(g: &Ggml, ty: GgmlType, q: &[u8], n: usize, what: &str, row: &mut Row) {
    if let Some(ref_y) = g.dequantize(ty, q, n) {
        row.deq.0 += 1;
        let mut y = vec![0f32; n];
        dequantize_row(ty, q, &mut y).unwrap();
        if let Some(i) = y.iter().zip(&ref_y).position(|(a, b)| !same_f32(*a, *b)) {
            row.deq.1.push(format!("{what} [{i}]: {} vs {}", y[i], ref_y[i]));
        }
    }
}

/// Quantize (bytes) and dequantize (bits) checks of `ty` on every data set.
fn check_quantize(g: &Ggml, ty: GgmlType, row: &mut Row) {
    let bs = ty.block_size();
    let lens: &[usize] = match bs {
        1 | 32 => &[32, 256, 4096],
        64 | 128 => &[128, 256, 4096],
        _ => &[256, 4096],
    };
    let ours = !quantize_requires_imatrix(ty);
    let mut quant = (0, Vec::new());
    for &n in lens {
        for nrows in [1usize, 3] {
            for (name, x) in datasets(n * nrows, (n * 31 + nrows) as u64) {
                if !dataset_ok(ty, name) {
                    continue;
                }
                let want = g.quantize(ty, &x, nrows, n);
                if ours {
                    quant.0 += 1;
                    let mut got = vec![0u8; want.len()];
                    if let Err(e) = quantize_chunk(ty, &x, &mut got, nrows, n) {
                        quant.1.push(format!("{name} n={n} rows={nrows}: {e}"));
                    } else if got != want {
                        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
                        quant.1.push(format!("{name} n={n} rows={nrows} first diff at byte {first}"));
                    }
                }
                check_dequant(g, ty, &want, n * nrows, &format!("{name} n={n} rows={nrows}"), row);
            }
        }
    }
    if ours {
        row.quant = Some(quant);
    } else {
        // The importance-matrix types are refused, with a typed error.
        let x = vec![0.5f32; 256];
        let mut q = vec![0u8; ty.type_size()];
        let e = quantize_chunk(ty, &x, &mut q, 1, 256).unwrap_err();
        assert!(
            matches!(e, shardgraph::Error::UnsupportedType { .. }) && e.to_string().contains("importance matrix"),
            "{ty}: {e}"
        );
    }
    // Dequantize random bytes too (all bit patterns of the quants and scales).
    if ty.is_quantized() {
        let mut r = Rng(ty.id() as u64 + 99);
        let n = 8 * bs.max(32);
        let bytes: Vec<u8> = (0..ty.row_size(n as i64).unwrap()).map(|_| r.next() as u8).collect();
        check_dequant(g, ty, &bytes, n, "random bytes", row);
    }
}

/// The types ggml 0.15.3 lacked that ggml's CPU converts to in `cpy` and
/// `set_rows` (its `from_float` is the reference quantizer, as this crate's
/// [`from_float`]; for older types ggml's CPU uses x86-specific converters
/// for Q8_0/Q8_1/Q8_K).
const FROM_FLOAT_TYPES: [GgmlType; 8] = [IQ4_NL, IQ4_XS, MXFP4, NVFP4, TQ1_0, TQ2_0, Q1_0, Q2_0];

/// Our [`from_float`] of one row against ggml's CPU `from_float`, on every
/// data set: bytes equal, except IQ4_NL blocks of zeros, whose codes ggml
/// leaves as they were in its scratch (they decode to ±0 either way).
fn check_from_float(g: &Ggml, ty: GgmlType, row: &mut Row) {
    let mut res = (0, Vec::new());
    for n in [256usize, 4096] {
        for (name, x) in datasets(n, n as u64 * 13 + ty.id() as u64) {
            let Some(want) = g.cpu_from_float(ty, &x) else { continue };
            res.0 += 1;
            let mut got = vec![0u8; want.len()];
            from_float(ty, &x, &mut got).unwrap();
            let ts = ty.type_size();
            let zero_block = |b: &[u8]| ty == IQ4_NL && b[..2] == [0, 0];
            let bad = got.chunks_exact(ts).zip(want.chunks_exact(ts)).position(|(a, b)| a != b && !zero_block(b));
            if let Some(blk) = bad {
                res.1.push(format!("from_float {name} n={n}: block {blk} differs"));
            } else if deq(ty, &got, n).iter().zip(&deq(ty, &want, n)).any(|(a, b)| a != b && !same_f32(*a, *b)) {
                res.1.push(format!("from_float {name} n={n}: values differ"));
            }
        }
    }
    row.from_float = Some(res);
}

/// Dot products of `ty` against ggml's `vec_dot`: ggml-quantized rows of
/// every finite data set, and random blocks.
fn check_dot(g: &Ggml, ty: GgmlType, row: &mut Row) {
    // SAFETY: ggml's CPU traits table has an entry for every type id.
    let ggml_has_dot = unsafe { (*(g.type_traits_cpu)(ty.id() as c_int)).vec_dot.is_some() };
    let Some(f) = vec_dot_fn(ty) else {
        if ggml_has_dot {
            row.dot_bad.push("ggml has a vec_dot for it, this crate has none".into());
        }
        return;
    };
    let vt = vec_dot_type(ty);
    let mut worst = 0f64;
    let mut one = |name: &str, n: usize, wq: &[u8], xa: &[f32]| {
        let aq = g.quantize(vt, xa, 1, n);
        let want = g.vec_dot(ty, n, wq, &aq) as f64;
        let got = f(n, wq, &aq) as f64;
        let mag = dot_magnitude(ty, wq, &aq, n);
        let rel = (got - want).abs() / mag.max(f64::MIN_POSITIVE);
        worst = worst.max(rel);
        if rel.is_nan() || rel > 1e-5 {
            row.dot_bad.push(format!("{name} n={n}: ours {got} ggml {want} (Σ|xy| = {mag})"));
        }
    };
    let lens = [256usize.max(ty.block_size()), 4096];
    for n in lens {
        for (name, x) in datasets(2 * n, n as u64 + ty.id() as u64) {
            if matches!(name, "nan_inf" | "very_huge" | "huge" | "subnormal" | "tiny") {
                continue;
            }
            let (xw, xa) = x.split_at(n);
            one(name, n, &g.quantize(ty, xw, 1, n), xa);
        }
        if ty.is_quantized() {
            let seed = n as u64 * 7 + ty.id() as u64;
            let wq = quant_blocks::random_blocks(ty, n / ty.block_size(), &mut rng::Rng::new(seed));
            let mut r = Rng(seed | 1);
            let xa: Vec<f32> = (0..n).map(|_| r.normal()).collect();
            one("random blocks", n, &wq, &xa);
        }
    }
    row.dot = Some(worst);
}

/// The scale of a dot product's terms, for its error bound: Σ |x|·|y| of
/// the dequantized rows. For TQ1_0/TQ2_0 plus Σ d·|y|: ggml's CPU kernels
/// compute Σ t·y − Σ y with the stored trits t = x/d + 1 (the second sum from
/// the Q8_K block sums), lane by lane, so their rounding scales with that
/// offset term even where Σ |x|·|y| is zero.
fn dot_magnitude(ty: GgmlType, wq: &[u8], aq: &[u8], n: usize) -> f64 {
    let (wd, ad) = (deq(ty, wq, n), deq(vec_dot_type(ty), aq, n));
    let mut mag: f64 = wd.iter().zip(&ad).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    let d_at = match ty {
        TQ1_0 => Some(52),
        TQ2_0 => Some(64),
        _ => None,
    };
    if let Some(o) = d_at {
        for (blk, ys) in wq.chunks_exact(ty.type_size()).zip(ad.chunks_exact(ty.block_size())) {
            let d = half::f16::from_bits(u16::from_le_bytes([blk[o], blk[o + 1]])).to_f32() as f64;
            mag += ys.iter().map(|&y| (d * y as f64).abs()).sum::<f64>();
        }
    }
    mag
}

fn deq(ty: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, q, &mut y).unwrap();
    y
}

#[test]
fn quant_bytes_type_traits_match_ggml() {
    let Some(g) = load() else { return };
    for id in 0..43u32 {
        // SAFETY: ids below GGML_TYPE_COUNT (43) index ggml's traits table.
        let t = unsafe { &*(g.type_traits)(id as c_int) };
        match GgmlType::from_id(id) {
            Ok(ty) => {
                // SAFETY: a NUL-terminated static string of ggml's.
                let name = unsafe { CStr::from_ptr(t.type_name) }.to_str().unwrap();
                assert_eq!((ty.name(), ty.block_size(), ty.type_size()), (name, t.blck_size as usize, t.type_size));
                assert_eq!(ty.is_quantized(), t.is_quantized, "{ty}");
                // SAFETY: a plain function of the type id.
                assert_eq!(quantize_requires_imatrix(ty), unsafe { (g.requires_imatrix)(id as c_int) }, "{ty}");
            }
            // Removed ids: ggml keeps a placeholder without a block size.
            Err(_) => assert_eq!(t.blck_size, 0, "id {id} is a ggml type this crate lacks"),
        }
    }
}

#[test]
fn quant_bytes_match_ggml() {
    let Some(g) = load() else { return };
    let rows: Vec<(GgmlType, Row)> = std::thread::scope(|s| {
        let handles: Vec<_> = types()
            .into_iter()
            .map(|ty| {
                let g = &g;
                s.spawn(move || {
                    let mut row = Row::default();
                    check_quantize(g, ty, &mut row);
                    if FROM_FLOAT_TYPES.contains(&ty) {
                        check_from_float(g, ty, &mut row);
                    }
                    check_dot(g, ty, &mut row);
                    (ty, row)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut report = vec![format!(
        "{:>8} | {:>28} | {:>24} | {:>22} | {:>26}",
        "type",
        "quantize bytes = ggml",
        "dequantize bits = ggml",
        "from_float = ggml CPU",
        "dot: max |ours−ggml|/Σ|xy|"
    )];
    let mut ok = true;
    for (ty, r) in &rows {
        let quant = match &r.quant {
            Some((n, bad)) => {
                format!("{} ({n} cases, {} differ)", if bad.is_empty() { "yes" } else { "NO" }, bad.len())
            }
            None => "— (needs an imatrix)".to_string(),
        };
        let verdict = |n: usize, bad: &[String]| {
            format!("{} ({n} cases, {} differ)", if bad.is_empty() { "yes" } else { "NO" }, bad.len())
        };
        let (n, bad) = &r.deq;
        let deq = verdict(*n, bad);
        let ff = r.from_float.as_ref().map_or("—".to_string(), |(n, b)| verdict(*n, b));
        let ff_bad = r.from_float.as_ref().map_or(&[][..], |f| &f.1[..]);
        let dot = match r.dot {
            Some(w) => format!("{w:.2e}{}", if r.dot_bad.is_empty() { "" } else { " OVER 1e-5" }),
            None => "— (no vec_dot)".to_string(),
        };
        report.push(format!("{:>8} | {quant:>28} | {deq:>24} | {ff:>22} | {dot:>26}", ty.name()));
        let quant_bad = r.quant.as_ref().map_or(&[][..], |q| &q.1[..]);
        let msgs = [quant_bad, &bad[..], ff_bad, &r.dot_bad[..]];
        for m in msgs.iter().flat_map(|m| m.iter().take(3)) {
            report.push(format!("           {m}"));
        }
        ok &= msgs.iter().all(|m| m.is_empty());
    }
    eprintln!("quant_bytes vs ggml 0.25.3 (dot bound 1e-5):\n{}", report.join("\n"));
    assert!(ok, "mismatches against ggml (see the table above)");
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
    for ty in types() {
        let Some(f) = vec_dot_fn(ty) else { continue };
        let x = &datasets(2 * n, 5)[0].1;
        let wq = g.quantize(ty, &x[..n], 1, n);
        let aq = g.quantize(vec_dot_type(ty), &x[n..], 1, n);
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
        eprintln!("  {:>7}: ours {ours:>6.0}  ggml {theirs:>6.0}", ty.name());
    }
}
