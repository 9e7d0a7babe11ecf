//! MUL_MAT throughput: shardgraph's CPU backend against ggml 0.15.3's CPU
//! backend (loaded through the differential-test oracle), same thread count,
//! same input bytes, same process.
//!
//! `cargo bench --bench ops` prints one table row per (weight type, N) with
//! 4096 × 4096 weights: milliseconds per product and GFLOP/s (2·K·M·N / time)
//! for both libraries, and ours/ggml throughput. Threads: 2, or
//! `SHARDGRAPH_BENCH_THREADS`. `SHARDGRAPH_BENCH_FILTER=q4_0` limits the rows
//! (substring of "type,N"); `SHARDGRAPH_BENCH_TYPES=q6_K,bf16` replaces the
//! type list; `SHARDGRAPH_BENCH_K`/`_M` change the shape.
//! Without the ggml libraries the ggml columns read "n/a".
//!
//! Each side is timed the same way, in alternating rounds (so both see the
//! same machine load): a warm-up run, then repeated runs for about
//! `SHARDGRAPH_BENCH_SECS` (default 1.2) seconds per side, reporting the fastest
//! (`SHARDGRAPH_BENCH_STAT=median` for the median; `SHARDGRAPH_BENCH_VERBOSE=1`
//! prints min/median/max of every measurement).

#[path = "../tests/ggml_diff/oracle.rs"]
mod oracle;

use shardgraph::tensor::quant;
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorStorage};
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Timing samples (seconds per call) of one side.
#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    /// Runs `f` repeatedly for about `budget` (at least 3 times).
    fn run(&mut self, f: &mut dyn FnMut(), budget: Duration) {
        let start = Instant::now();
        let mut n = 0;
        while n < 3 || (start.elapsed() < budget && self.0.len() < 2000) {
            let t = Instant::now();
            f();
            self.0.push(t.elapsed().as_secs_f64());
            n += 1;
        }
    }

    /// The fastest run (`SHARDGRAPH_BENCH_STAT=median` for the median). The
    /// fastest is the default because on a shared machine other processes
    /// only ever add time.
    fn stat(&mut self, who: &str) -> f64 {
        let s = &mut self.0;
        s.sort_by(|a, b| a.total_cmp(b));
        if std::env::var("SHARDGRAPH_BENCH_VERBOSE").is_ok() {
            println!(
                "  {who}: {} runs: min {:.3} ms, median {:.3} ms, max {:.3} ms",
                s.len(),
                s[0] * 1e3,
                s[s.len() / 2] * 1e3,
                s[s.len() - 1] * 1e3
            );
        }
        if std::env::var("SHARDGRAPH_BENCH_STAT").as_deref() == Ok("median") {
            s[s.len() / 2]
        } else {
            s[0]
        }
    }
}

/// Times `ours` and (if given) `theirs` in alternating rounds, so both see
/// the same machine conditions; `budget` is the total per side.
fn time_pair(ours: &mut dyn FnMut(), mut theirs: Option<&mut dyn FnMut()>, budget: Duration) -> (f64, Option<f64>) {
    const ROUNDS: u32 = 12;
    ours();
    if let Some(t) = theirs.as_mut() {
        t();
    }
    let (mut a, mut b) = (Samples::default(), Samples::default());
    for _ in 0..ROUNDS {
        a.run(ours, budget / ROUNDS);
        if let Some(t) = theirs.as_mut() {
            b.run(*t, budget / ROUNDS);
        }
    }
    let ta = a.stat("ours");
    let tb = theirs.map(|_| b.stat("ggml"));
    (ta, tb)
}

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Bytes of `vals` ([K, rows]) in type `ty`.
fn encode(ty: GgmlType, vals: &[f32], k: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
        GgmlType::F16 => vals.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
        _ => {
            let rows = vals.len() / k;
            let mut out = vec![0u8; rows * k / ty.block_size() * ty.type_size()];
            quant::quantize_chunk(ty, vals, &mut out, rows, k).expect("quantize weights");
            out
        }
    }
}

struct Row {
    ty: GgmlType,
    n: usize,
    ours: f64,
    ggml: Option<f64>,
    nmse: Option<f64>,
}

fn main() {
    let threads = env_usize("SHARDGRAPH_BENCH_THREADS", 2).max(1);
    let k = env_usize("SHARDGRAPH_BENCH_K", 4096);
    let m = env_usize("SHARDGRAPH_BENCH_M", 4096);
    let budget = Duration::from_secs_f64(
        std::env::var("SHARDGRAPH_BENCH_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(1.2),
    );
    let filter = std::env::var("SHARDGRAPH_BENCH_FILTER").unwrap_or_default();
    let ggml = match oracle::Ggml::get().and_then(|g| {
        if std::env::var("SHARDGRAPH_BENCH_NO_GGML").is_ok() {
            Err("SHARDGRAPH_BENCH_NO_GGML is set".to_string())
        } else {
            Ok(g)
        }
    }) {
        Ok(g) => Some(g),
        Err(why) => {
            println!("ops bench: ggml not available ({why}); ggml columns are n/a");
            None
        }
    };
    let backend = CpuBackend::with_threads(threads).expect("CPU backend");
    let stat = if std::env::var("SHARDGRAPH_BENCH_STAT").as_deref() == Ok("median") { "median" } else { "fastest" };
    println!(
        "ops bench: MUL_MAT, weights {k} x {m}, {threads} threads, {stat} of repeated runs (ours: shardgraph CPU; ggml: ggml 0.15.3 CPU)"
    );

    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let wvals: Vec<f32> = (0..k * m).map(|_| rng.f()).collect();
    let mut rows = Vec::new();
    // SHARDGRAPH_BENCH_TYPES=q6_K,q5_K,... replaces the default type list.
    let types: Vec<GgmlType> = match std::env::var("SHARDGRAPH_BENCH_TYPES") {
        Ok(list) => list
            .split(',')
            .filter_map(|n| shardgraph::tensor::ALL_TYPES.iter().copied().find(|t| t.name() == n.trim()))
            .collect(),
        Err(_) => vec![GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K],
    };
    // SHARDGRAPH_BENCH_NS=1,7,64 replaces the default column counts (1 and 64).
    let ns: Vec<usize> = match std::env::var("SHARDGRAPH_BENCH_NS") {
        Ok(list) => list.split(',').filter_map(|n| n.trim().parse().ok()).filter(|&n| n > 0).collect(),
        Err(_) => vec![1, 64],
    };
    for ty in types {
        let cases: Vec<usize> = ns.iter().copied().filter(|n| format!("{ty},{n}").contains(&filter)).collect();
        if cases.is_empty() {
            continue;
        }
        let wbytes = encode(ty, &wvals, k);
        for n in cases {
            let bvals: Vec<f32> = (0..k * n).map(|_| rng.f()).collect();
            let bbytes: Vec<u8> = bvals.iter().flat_map(|x| x.to_le_bytes()).collect();

            // Ours.
            let mut ctx = Context::new();
            let a = ctx.new_tensor_2d(ty, k as i64, m as i64).expect("a");
            let b = ctx.new_tensor_2d(GgmlType::F32, k as i64, n as i64).expect("b");
            let c = ctx.mul_mat(a, b).expect("mul_mat");
            let graph = ctx.build_forward(&[c]).expect("graph");
            let mut storage = TensorStorage::new();
            storage.alloc_tensors(&backend, &ctx, &[a, b, c]).expect("alloc");
            storage.set_bytes(&ctx, a, 0, &wbytes).expect("set a");
            storage.set_bytes(&ctx, b, 0, &bbytes).expect("set b");
            let mut ours_fn = || backend.compute(&ctx, &graph, &storage).expect("compute");

            // ggml, same bytes.
            let (ours, gtime, nmse) = match ggml {
                Some(g) => {
                    let gc = g.init(wbytes.len() + bbytes.len() + 4 * m * n + (16 << 20));
                    let ga = gc.new_tensor(ty.id(), [k as i64, m as i64, 1, 1]);
                    let gb = gc.new_tensor(GgmlType::F32.id(), [k as i64, n as i64, 1, 1]);
                    gc.data(ga).copy_from_slice(&wbytes);
                    gc.data(gb).copy_from_slice(&bbytes);
                    // SAFETY: exact signature of ggml_mul_mat.
                    let gcres = unsafe {
                        g.sym::<unsafe extern "C" fn(oracle::P, oracle::P, oracle::P) -> oracle::P>("ggml_mul_mat")(
                            gc.ctx, ga, gb,
                        )
                    };
                    let mut gg = gc.graph(&[gcres], threads as i32);
                    let mut ggml_fn = || gg.compute();
                    let (ours, theirs) = time_pair(&mut ours_fn, Some(&mut ggml_fn), budget);
                    drop(gg);
                    let ours_out = storage.get_f32(&ctx, c).expect("result");
                    let theirs_out: Vec<f32> =
                        gc.data(gcres).chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect();
                    let (mut num, mut den) = (0f64, 0f64);
                    for (&x, &y) in ours_out.iter().zip(&theirs_out) {
                        num += (x as f64 - y as f64).powi(2);
                        den += (y as f64).powi(2);
                    }
                    (ours, theirs, Some(if den > 0.0 { num / den } else { num }))
                }
                None => (time_pair(&mut ours_fn, None, budget).0, None, None),
            };
            rows.push(Row { ty, n, ours, ggml: gtime, nmse });
        }
    }

    let gflops = |n: usize, t: f64| 2.0 * k as f64 * m as f64 * n as f64 / t / 1e9;
    println!();
    println!(
        "| {:<5} | {:>3} | {:>9} | {:>10} | {:>9} | {:>10} | {:>11} | {:>9} |",
        "type", "N", "ours ms", "ours GF/s", "ggml ms", "ggml GF/s", "ours/ggml", "nmse"
    );
    println!("|-------|-----|-----------|------------|-----------|------------|-------------|-----------|");
    for r in &rows {
        let (gms, ggf, ratio, nmse) = match (r.ggml, r.nmse) {
            (Some(t), Some(e)) => (
                format!("{:.3}", t * 1e3),
                format!("{:.1}", gflops(r.n, t)),
                format!("{:.2}x", t / r.ours),
                format!("{e:.1e}"),
            ),
            _ => ("n/a".into(), "n/a".into(), "n/a".into(), "n/a".into()),
        };
        println!(
            "| {:<5} | {:>3} | {:>9.3} | {:>10.1} | {:>9} | {:>10} | {:>11} | {:>9} |",
            r.ty.name(),
            r.n,
            r.ours * 1e3,
            gflops(r.n, r.ours),
            gms,
            ggf,
            ratio,
            nmse
        );
    }
    println!();
    println!("ours/ggml = ours throughput / ggml throughput (> 1: ours faster); nmse = ours vs ggml result");
}
