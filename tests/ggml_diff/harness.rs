//! Test cases in the manner of ggml's `test-backend-ops`: each case builds a
//! small graph with our constructors, names itself with its variables, owns
//! its tolerance, and is run in our CPU backend and in ggml's with the same
//! input bytes.
#![allow(dead_code)]

use super::nmse::nmse_finite;
use super::oracle::{ggml_layout, Ggml, P};
use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::tensor::quant;
use shardgraph::{Backend, Context, GgmlType, Result, Tensor, TensorId, TensorStorage};

/// How a leaf is filled.
#[derive(Clone, Debug)]
pub enum Init {
    /// Uniform values in [lo, hi) (floats; quantized types are quantized by ggml).
    Uniform(f32, f32),
    /// Exact values, one per element (floats).
    Values(Vec<f32>),
    /// Exact integers, one per element (I32/I64 leafs: indices, positions).
    Ints(Vec<i64>),
}

/// What a case's build function returns: the outputs to compare, and how to
/// fill leafs (leafs not listed get `Uniform(-1, 1)`).
#[derive(Default)]
pub struct Built {
    /// Tensors compared between the two libraries.
    pub outputs: Vec<TensorId>,
    /// Leaf initialisers.
    pub inits: Vec<(TensorId, Init)>,
}

impl Built {
    /// Outputs with default inits.
    pub fn out(outputs: &[TensorId]) -> Self {
        Built { outputs: outputs.to_vec(), inits: vec![] }
    }
    /// Adds an initialiser.
    pub fn init(mut self, id: TensorId, init: Init) -> Self {
        self.inits.push((id, init));
        self
    }
}

/// How outputs are compared.
#[derive(Clone, Copy, Debug)]
pub enum Compare {
    /// Normalised mean squared error `Σ(a−b)² / Σb²` at most this.
    Nmse(f64),
    /// Every value equal (integer outputs, data movement).
    Exact,
    /// Integer outputs equal after sorting each row (ops whose order within a row is unspecified).
    ExactSortedRows,
}

type BuildFn = Box<dyn Fn(&mut Context) -> Result<Built>>;

/// One differential case.
pub struct Case {
    /// ggml op name.
    pub op: &'static str,
    /// Variables, e.g. `type=f16,ne=[10,5,4,3]`.
    pub vars: String,
    /// Comparison.
    pub cmp: Compare,
    /// Graph builder.
    pub build: BuildFn,
}

impl Case {
    /// A case for `op` with `vars`, compared by `cmp`.
    pub fn new(
        op: &'static str,
        vars: impl Into<String>,
        cmp: Compare,
        build: impl Fn(&mut Context) -> Result<Built> + 'static,
    ) -> Self {
        Case { op, vars: vars.into(), cmp, build: Box::new(build) }
    }
}

/// Tiny deterministic RNG (xorshift64*), so runs are reproducible.
pub struct Rng(u64);
impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next u64.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

fn seed_of(s: &str) -> u64 {
    s.bytes().fold(1469598103934665603u64, |h, b| (h ^ b as u64).wrapping_mul(1099511628211))
}

/// The leaf's bytes in its type.
fn leaf_bytes(g: &Ggml, t: &Tensor, init: &Init, rng: &mut Rng) -> Vec<u8> {
    let n = t.nelements() as usize;
    match init {
        Init::Ints(v) => {
            assert_eq!(v.len(), n, "Init::Ints length for {}", t.describe());
            match t.ty {
                GgmlType::I32 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
                GgmlType::I64 => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
                other => panic!("Init::Ints on a {other} tensor"),
            }
        }
        _ => {
            let vals: Vec<f32> = match init {
                Init::Values(v) => {
                    assert_eq!(v.len(), n, "Init::Values length for {}", t.describe());
                    v.clone()
                }
                Init::Uniform(lo, hi) => (0..n).map(|_| rng.uniform(*lo, *hi)).collect(),
                Init::Ints(_) => unreachable!(),
            };
            match t.ty {
                GgmlType::F32 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
                GgmlType::F16 => vals.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
                GgmlType::BF16 => vals.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
                GgmlType::I32 => vals.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
                GgmlType::I64 => vals.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect(),
                q if q.is_quantized() => {
                    let ne0 = t.ne[0] as usize;
                    g.quantize_chunk(q.id(), &vals, n / ne0.max(1), ne0)
                }
                other => panic!("no initialiser for {other}"),
            }
        }
    }
}

/// Decodes the logical elements of a tensor with layout (ty, ne, nb) from
/// its storage bytes, as f64 (integers exactly).
pub fn decode(ty: GgmlType, ne: [i64; 4], nb: [usize; 4], bytes: &[u8]) -> Vec<f64> {
    let mut out = Vec::with_capacity(ne.iter().product::<i64>().max(0) as usize);
    let ne0 = ne[0] as usize;
    let mut row = vec![0f32; ne0];
    for i3 in 0..ne[3] as usize {
        for i2 in 0..ne[2] as usize {
            for i1 in 0..ne[1] as usize {
                let base = i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                if ty.is_quantized() {
                    let rb = ne0 / ty.block_size() * ty.type_size();
                    quant::dequantize_row(ty, &bytes[base..base + rb], &mut row).expect("dequantize");
                    out.extend(row.iter().map(|&x| x as f64));
                    continue;
                }
                for i0 in 0..ne0 {
                    let o = base + i0 * nb[0];
                    let b = &bytes[o..o + ty.type_size()];
                    out.push(match ty {
                        GgmlType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
                        GgmlType::F16 => half::f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
                        GgmlType::BF16 => half::bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
                        GgmlType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
                        GgmlType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
                        GgmlType::I16 => i16::from_le_bytes(b.try_into().unwrap()) as f64,
                        GgmlType::I8 => b[0] as i8 as f64,
                        other => panic!("decode: {other}"),
                    });
                }
            }
        }
    }
    out
}

/// The NMSE of `a` against reference `b` (`common/nmse.rs`) with the
/// suite's rule for non-finite values: positions where both are the same
/// non-finite value count as equal; any other non-finite value gives
/// infinity.
pub fn nmse(a: &[f64], b: &[f64]) -> f64 {
    let agree = |(&x, &y): (&f64, &f64)| {
        (x.is_finite() && y.is_finite()) || x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
    };
    if a.iter().zip(b).all(agree) {
        nmse_finite(a, b)
    } else {
        f64::INFINITY
    }
}

/// The result of one case.
pub enum Outcome {
    /// Passed, with the measured error.
    Pass(f64),
    /// Failed: why.
    Fail(String),
}

/// Runs `case` in both libraries (ours on `backend`, ggml's CPU with
/// `threads` threads) and compares.
pub fn run_case(g: &Ggml, case: &Case, backend: &dyn Backend, threads: i32) -> Outcome {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case_inner(g, case, backend, threads))) {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => Outcome::Fail(format!("error: {e}")),
        Err(p) => Outcome::Fail(format!(
            "panic: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

fn run_case_inner(g: &Ggml, case: &Case, backend: &dyn Backend, threads: i32) -> Result<Outcome> {
    let mut ctx = Context::new();
    let built = (case.build)(&mut ctx)?;
    let graph = ctx.build_forward(&built.outputs)?;
    let mut rng = Rng::new(seed_of(&format!("{}:{}", case.op, case.vars)));

    // Leaf bytes, shared by both sides.
    let mut storage = TensorStorage::new();
    storage.alloc_tensors(backend, &ctx, graph.leafs())?;
    let mut leaf_data = Vec::new();
    for &l in graph.leafs() {
        let t = ctx.tensor(l)?;
        let init =
            built.inits.iter().find(|(id, _)| *id == l).map(|(_, i)| i.clone()).unwrap_or(Init::Uniform(-1.0, 1.0));
        let bytes = leaf_bytes(g, t, &init, &mut rng);
        storage.set_bytes(&ctx, l, 0, &bytes)?;
        leaf_data.push((l, bytes));
    }
    let mut galloc = GraphAllocator::new(backend.buffer_type());
    galloc.alloc_graph(backend, &ctx, &graph, &mut storage)?;
    backend.compute(&ctx, &graph, &storage)?;

    // ggml side.
    let total: usize =
        ctx.ids().map(|id| ctx.tensor(id).map(|t| t.nbytes()).unwrap_or(0) + 1024).sum::<usize>() + (8 << 20);
    let gc = g.init(total);
    let mut map: Vec<P> = vec![std::ptr::null_mut(); ctx.len()];
    for (l, bytes) in &leaf_data {
        let t = ctx.tensor(*l)?;
        let gt = gc.new_tensor(t.ty.id(), t.ne);
        gc.data(gt).copy_from_slice(bytes);
        map[l.index()] = gt;
    }
    for &n in graph.nodes() {
        let t = ctx.tensor(n)?;
        let srcs: Vec<P> = t.src.iter().map(|s| map[s.index()]).collect();
        let gt = gc.translate(&ctx, t, &srcs);
        let (gne, _) = ggml_layout(gt);
        if gne != t.ne {
            return Ok(Outcome::Fail(format!("{}: shape ours {:?} vs ggml {:?}", t.op.name(), t.ne, gne)));
        }
        map[n.index()] = gt;
    }
    let gouts: Vec<P> = built.outputs.iter().map(|o| map[o.index()]).collect();
    gc.compute(&gouts, threads);

    let mut worst = 0.0f64;
    for (i, &o) in built.outputs.iter().enumerate() {
        let t = ctx.tensor(o)?.clone();
        let mut ours_raw = vec![0u8; t.nbytes()];
        storage.get_bytes(&ctx, o, 0, &mut ours_raw)?;
        let ours = decode(t.ty, t.ne, t.nb, &ours_raw);
        let (gne, gnb) = ggml_layout(gouts[i]);
        let theirs = decode(t.ty, gne, gnb, gc.data(gouts[i]));
        match case.cmp {
            Compare::Nmse(max) => {
                let e = nmse(&ours, &theirs);
                worst = worst.max(e);
                if e.is_nan() || e > max {
                    return Ok(Outcome::Fail(format!(
                        "output {i}: nmse {e:.3e} > {max:.1e}{}",
                        first_diff(&ours, &theirs)
                    )));
                }
            }
            Compare::Exact => {
                if ours.iter().zip(&theirs).any(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())) {
                    return Ok(Outcome::Fail(format!("output {i}: not exact{}", first_diff(&ours, &theirs))));
                }
            }
            Compare::ExactSortedRows => {
                let n0 = t.ne[0].max(1) as usize;
                let sort = |v: &[f64]| -> Vec<f64> {
                    v.chunks(n0)
                        .flat_map(|r| {
                            let mut r = r.to_vec();
                            r.sort_by(|a, b| a.total_cmp(b));
                            r
                        })
                        .collect()
                };
                let (a, b) = (sort(&ours), sort(&theirs));
                if a != b {
                    return Ok(Outcome::Fail(format!("output {i}: rows differ as sets{}", first_diff(&a, &b))));
                }
            }
        }
    }
    Ok(Outcome::Pass(worst))
}

fn first_diff(a: &[f64], b: &[f64]) -> String {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| (*x - *y).abs() > 1e-6 * y.abs().max(1.0) || x.is_nan() != y.is_nan())
        .map(|(i, (x, y))| format!(" (first difference at element {i}: ours {x} vs ggml {y})"))
        .unwrap_or_default()
}
