//! The differential suite: every op, several shapes (non-contiguous inputs,
//! broadcasting, odd sizes), run in our CPU backend and in the CPU backend
//! of every ggml release the set-up installs (0.15.3 and 0.25.3,
//! [`oracle::Version`]), compared with bounds per backend ([`harness::Tol`]).
//! Cases of the weight types only 0.25.3 has run against 0.25.3 alone.
//!
//! `cargo test --release --test ggml_diff -- --nocapture` prints one line per
//! failing case and ends with one summary per release:
//! `ggml_diff: 0.15.3: <ops> ops, <cases> cases, <failures> failures, <n> not in 0.15.3; 0.25.3: ...`.
//! Filter with `GGML_DIFF_FILTER=<substring of "op:vars">`.
//! Without an oracle (see README set-up) its cases are skipped with a
//! message, unless `SHARDGRAPH_REQUIRE_GGML=1` (set by CI), which fails.

mod harness;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod host_fallbacks;
#[path = "../common/nmse.rs"]
mod nmse;
mod oracle;

mod fam_attn;
mod fam_data;
mod fam_elementwise;
mod fam_matmul;
mod fam_norm;
mod fam_quant;
mod fam_reduce;
mod fam_rope;
mod fam_ssm;

use harness::{run_case, Case, Kind, Outcome, Run};
use oracle::{Ggml, Version};
use std::collections::{BTreeMap, BTreeSet};

fn all_cases() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(fam_elementwise::cases());
    v.extend(fam_reduce::cases());
    v.extend(fam_norm::cases());
    v.extend(fam_rope::cases());
    v.extend(fam_matmul::cases());
    v.extend(fam_attn::cases());
    v.extend(fam_data::cases());
    v.extend(fam_ssm::cases());
    v.extend(fam_quant::cases());
    v
}

/// The cases `GGML_DIFF_FILTER` keeps, and whether a filter is set.
fn filtered_cases() -> (Vec<Case>, bool) {
    let filter = std::env::var("GGML_DIFF_FILTER").unwrap_or_default();
    let cases = all_cases()
        .into_iter()
        .filter(|c| filter.is_empty() || format!("{}:{}", c.op, c.vars).contains(&filter))
        .collect();
    (cases, !filter.is_empty())
}

/// Every release that loads, with a message for each that does not; with
/// `SHARDGRAPH_REQUIRE_GGML` set, a missing release fails.
fn oracles(label: &str) -> Vec<&'static Ggml> {
    let mut loaded = Vec::new();
    for v in Version::ALL {
        match Ggml::load(v) {
            Ok(g) => loaded.push(g),
            Err(why) => {
                println!("{label}: SKIPPED the cases against ggml {v}: oracle not available: {why}");
                assert!(
                    std::env::var("SHARDGRAPH_REQUIRE_GGML").is_err(),
                    "SHARDGRAPH_REQUIRE_GGML is set but the ggml {v} oracle is missing: {why}"
                );
            }
        }
    }
    loaded
}

/// Per-release counts of a run, printed as the summary line.
#[derive(Default)]
struct Tally {
    /// release → (ops run, cases run, failures, cases not run: the release lacks a type)
    per: BTreeMap<Version, (BTreeSet<&'static str>, usize, usize, usize)>,
}

impl Tally {
    /// Counts `run` of `case`, prints its failures (and passes when
    /// `verbose`); returns its failures.
    fn add(&mut self, label: &str, case: &Case, run: &Run, verbose: bool, note: &str) -> usize {
        let mut failures = 0;
        for (v, o) in &run.outcomes {
            let e = self.per.entry(*v).or_default();
            match o {
                Outcome::Pass(err, bound) => {
                    e.0.insert(case.op);
                    e.1 += 1;
                    if verbose {
                        println!(
                            "  ok   {label} {v} {}({}) nmse={err:.2e} (bound {bound:.0e}){note}",
                            case.op, case.vars
                        );
                    }
                }
                Outcome::Fail(why) => {
                    e.0.insert(case.op);
                    e.1 += 1;
                    e.2 += 1;
                    failures += 1;
                    println!("  FAIL {label} {v} {}({}){note}: {why}", case.op, case.vars);
                }
                Outcome::Lacks(_) => e.3 += 1,
            }
        }
        // A case every loaded release lacks a type of compared nothing.
        if !run.outcomes.is_empty() && run.outcomes.iter().all(|(_, o)| matches!(o, Outcome::Lacks(_))) {
            println!("  SKIP {label} {}({}): no loaded ggml release has its types", case.op, case.vars);
        }
        failures
    }

    /// `0.15.3: <ops> ops, <cases> cases, <failures> failures, <n> not in 0.15.3; 0.25.3: ...`
    fn line(&self) -> String {
        self.per
            .iter()
            .map(|(v, (ops, cases, fails, lacks))| {
                let mut s = format!("{v}: {} ops, {cases} cases, {fails} failures", ops.len());
                if *lacks > 0 {
                    s += &format!(", {lacks} not in {v}");
                }
                s
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[test]
fn ggml_diff() {
    let (cases, _) = filtered_cases();
    let oracles = oracles("ggml_diff");
    if oracles.is_empty() {
        println!("ggml_diff: {} cases, all skipped (no ggml oracle)", cases.len());
        return;
    }
    let backend = shardgraph::CpuBackend::with_threads(2).expect("cpu backend");
    let verbose = std::env::var("GGML_DIFF_VERBOSE").is_ok();
    let mut tally = Tally::default();
    let mut failures = 0;
    for c in &cases {
        let run = run_case(&oracles, c, &backend, Kind::Cpu, backend.n_threads() as i32);
        failures += tally.add("ggml_diff", c, &run, verbose, "");
    }
    println!("ggml_diff: {}", tally.line());
    assert_eq!(failures, 0, "{failures} differential cases failed");
}

/// The same cases on the CUDA backend: a GPU when the driver sees one, else
/// the emulated GPU (`cuda-emu` feature), else skipped with a message. Ends
/// with `cuda_diff: <release>: <ops> ops, <cases> cases, <failures>
/// failures; ...; <n> cases with host nodes` after the host nodes per op;
/// a node on the host that [`host_fallbacks::ALLOWED`] does not list fails.
/// On a GPU, `SHARDGRAPH_CUBLAS=0` turns cuBLAS off, so the mul_mat cases run
/// the backend's own GEMM kernels (`scripts/gpu-check.sh` runs both); the
/// emulator runs the mul_mat cases both ways in one run.
#[cfg(feature = "cuda")]
#[test]
fn cuda_diff() {
    use shardgraph::backend::cuda::CudaBackend;
    use shardgraph::Backend;
    let Some((g, cases, filtered)) = gpu_cases("cuda_diff") else { return };
    let backend = match CudaBackend::new(0) {
        Ok(b) => {
            let blas = std::env::var("SHARDGRAPH_CUBLAS").map_or("on when installed".into(), |v| format!("{v:?}"));
            println!("cuda_diff: on {} ({}), SHARDGRAPH_CUBLAS {blas}", b.name(), b.device().description);
            b
        }
        Err(why) if std::env::var_os("SHARDGRAPH_REQUIRE_GPU").is_some() => {
            panic!("cuda_diff: SHARDGRAPH_REQUIRE_GPU is set but no GPU opened: {why}")
        }
        #[cfg(feature = "cuda-emu")]
        Err(why) => {
            println!("cuda_diff: no GPU ({why}); using the emulated GPU");
            CudaBackend::emulated(8 << 30)
        }
        #[cfg(not(feature = "cuda-emu"))]
        Err(why) => {
            println!("cuda_diff: SKIPPED: no GPU ({why}) and no `cuda-emu` feature");
            return;
        }
    };
    #[cfg(feature = "cuda-emu")]
    let no_blas = backend.is_emulated().then(|| CudaBackend::emulated_with(8 << 30, false));
    #[cfg(not(feature = "cuda-emu"))]
    let no_blas = None;
    gpu_diff("cuda_diff", &g, &cases, filtered, &backend, no_blas);
}

/// The same cases on the HIP backend: an AMD GPU when the HIP runtime sees
/// one (`hip` feature), else the emulated CDNA GPU (`cuda-emu` feature: the
/// kernels through the HIP portability header, 64-wide waves), else
/// skipped with a message. Ends with `hip_diff: ...` as [`cuda_diff`].
#[cfg(any(feature = "hip", feature = "cuda-emu"))]
#[test]
fn hip_diff() {
    use shardgraph::backend::cuda::CudaBackend;
    let Some((g, cases, filtered)) = gpu_cases("hip_diff") else { return };
    #[cfg(feature = "hip")]
    let gpu = CudaBackend::hip(0);
    #[cfg(not(feature = "hip"))]
    let gpu: shardgraph::Result<CudaBackend> =
        Err(shardgraph::Error::Hip { detail: "built without the `hip` feature".into() });
    let backend = match gpu {
        Ok(b) => b,
        Err(why) if std::env::var_os("SHARDGRAPH_REQUIRE_GPU").is_some() => {
            panic!("hip_diff: SHARDGRAPH_REQUIRE_GPU is set but no AMD GPU opened: {why}")
        }
        #[cfg(feature = "cuda-emu")]
        Err(why) => {
            println!("hip_diff: no AMD GPU ({why}); using the emulated CDNA GPU (64-wide waves)");
            CudaBackend::emulated_hip(8 << 30)
        }
        #[cfg(not(feature = "cuda-emu"))]
        Err(why) => {
            println!("hip_diff: SKIPPED: no AMD GPU ({why}) and no `cuda-emu` feature");
            return;
        }
    };
    gpu_diff("hip_diff", &g, &cases, filtered, &backend, None);
}

/// The oracles and the cases (`GGML_DIFF_FILTER` applied, and whether it
/// was) for a GPU run, or `None` with a message when no oracle loads.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn gpu_cases(label: &str) -> Option<(Vec<&'static Ggml>, Vec<Case>, bool)> {
    let (cases, filtered) = filtered_cases();
    let g = oracles(label);
    if g.is_empty() {
        println!("{label}: {} cases, all skipped (no ggml oracle)", cases.len());
        return None;
    }
    Some((g, cases, filtered))
}

/// Every case on `backend` against the oracles (and the mul_mat cases once
/// more on `again_without_blas`), the host nodes checked against
/// [`host_fallbacks::ALLOWED`], with the summary line `<label>: ...`.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn gpu_diff(
    label: &str,
    g: &[&Ggml],
    cases: &[Case],
    filtered: bool,
    backend: &shardgraph::backend::cuda::CudaBackend,
    again_without_blas: Option<shardgraph::backend::cuda::CudaBackend>,
) {
    use shardgraph::Backend;
    let kind = if backend.is_emulated() { Kind::EmulatedGpu } else { Kind::Gpu };
    let verbose = std::env::var("GGML_DIFF_VERBOSE").is_ok();
    let mut tally = Tally::default();
    let (mut failures, mut with_host, mut not_allowed, mut stale) = (0, 0, 0, 0);
    let mut host_ops: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut used = BTreeSet::new();
    for c in cases {
        let run = run_case(g, c, backend, kind, 2);
        if !run.host.is_empty() {
            with_host += 1;
        }
        for h in &run.host {
            *host_ops.entry(h.op).or_default() += 1;
            match host_fallbacks::allowed(h.op, h.types[0], h.types.get(1).copied().unwrap_or(h.types[0])) {
                Some(entry) => {
                    used.insert(entry);
                }
                None => {
                    failures += 1;
                    not_allowed += 1;
                    println!(
                        "  FAIL {}({}): {} ran on the host, which host_fallbacks::ALLOWED does not allow: {}",
                        c.op, c.vars, h.op, h.desc
                    );
                }
            }
        }
        failures += tally.add(label, c, &run, verbose, if run.host.is_empty() { "" } else { " [host]" });
    }
    // The emulated GPU emulates cuBLAS; the mul_mat cases once more
    // without it run the backend's own GEMM kernels (a GPU without libcublas).
    #[cfg(feature = "cuda-emu")]
    if let Some(no_blas) = again_without_blas {
        let mm: Vec<&Case> = cases.iter().filter(|c| c.op.starts_with("mul_mat")).collect();
        let mut again = Tally::default();
        for c in &mm {
            let run = run_case(g, c, &no_blas, Kind::EmulatedGpu, 2);
            failures += again.add(label, c, &run, verbose, " without cuBLAS");
        }
        println!("{label}: the mul_mat cases again without cuBLAS: {}", again.line());
    }
    // An allowed fallback that no case needs any more (a kernel now covers
    // it) is an entry to delete, checked over the whole case list only, with
    // every release loaded (a case whose types no loaded release has is not
    // run).
    if !filtered && g.len() == Version::ALL.len() {
        for (i, (op, ty, src0)) in host_fallbacks::ALLOWED.iter().enumerate() {
            if !used.contains(&i) {
                failures += 1;
                stale += 1;
                println!(
                    "  FAIL host_fallbacks::ALLOWED: no {op} of {ty} from {src0} runs on the host any more; \
                     delete (\"{op}\", {ty:?}, {src0:?})"
                );
            }
        }
    }
    let s = backend.stats();
    println!("{label}: host nodes per op (cases): {host_ops:?}");
    println!(
        "{label}: {}; {with_host} cases with host nodes, {not_allowed} host nodes not allowed, {stale} allowed \
         fallbacks no case needs ({} kernel launches, {} device nodes)",
        tally.line(),
        s.launches,
        s.device_nodes
    );
    assert_eq!(failures, 0, "{failures} differential cases failed on {}", backend.name());
    #[cfg(not(feature = "cuda-emu"))]
    let _ = again_without_blas;
}
