//! The differential suite: every op, several shapes (non-contiguous inputs,
//! broadcasting, odd sizes), run in our CPU backend and in ggml 0.15.3's,
//! compared with ggml's own test tolerances (NMSE ~1e-7 for exact float ops).
//!
//! `cargo test --release --test ggml_diff -- --nocapture` prints one line per
//! failing case and ends with
//! `ggml_diff: <ops> ops, <cases> cases, <failures> failures, <skipped> skipped`.
//! Filter with `GGML_DIFF_FILTER=<substring of "op:vars">`.
//! Without the oracle (see README set-up) every case is skipped with a
//! message, unless `SHARDGRAPH_REQUIRE_GGML=1` (set by CI), which fails.

mod harness;
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

use harness::{run_case, Case, Outcome};
use std::collections::BTreeSet;

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

#[test]
fn ggml_diff() {
    let filter = std::env::var("GGML_DIFF_FILTER").unwrap_or_default();
    let cases: Vec<Case> = all_cases()
        .into_iter()
        .filter(|c| filter.is_empty() || format!("{}:{}", c.op, c.vars).contains(&filter))
        .collect();
    let ops: BTreeSet<&str> = cases.iter().map(|c| c.op).collect();
    let g = match oracle::Ggml::get() {
        Ok(g) => g,
        Err(why) => {
            println!("ggml_diff: SKIPPED all cases: ggml oracle not available: {why}");
            println!("ggml_diff: {} ops, {} cases, 0 failures, {} skipped", ops.len(), cases.len(), cases.len());
            assert!(
                std::env::var("SHARDGRAPH_REQUIRE_GGML").is_err(),
                "SHARDGRAPH_REQUIRE_GGML is set but the oracle is missing"
            );
            return;
        }
    };
    let backend = shardgraph::CpuBackend::with_threads(2).expect("cpu backend");
    let verbose = std::env::var("GGML_DIFF_VERBOSE").is_ok();
    let mut failures = 0;
    for c in &cases {
        match run_case(g, c, &backend, backend.n_threads() as i32) {
            Outcome::Pass(e) => {
                if verbose {
                    println!("  ok   {}({}) nmse={e:.2e}", c.op, c.vars);
                }
            }
            Outcome::Fail(why) => {
                failures += 1;
                println!("  FAIL {}({}): {why}", c.op, c.vars);
            }
        }
    }
    println!("ggml_diff: {} ops, {} cases, {} failures, 0 skipped", ops.len(), cases.len(), failures);
    assert_eq!(failures, 0, "{failures} differential cases failed");
}

/// The same cases on the CUDA backend: a GPU when the driver sees one, else
/// the emulated GPU (`cuda-emu` feature), else skipped with a message. Ends
/// with `cuda_diff: <cases> cases, <failures> failures, <n> cases with host
/// nodes` and lists the ops that ran on the host (no kernel for their types).
/// On a GPU, `SHARDGRAPH_CUBLAS=0` turns cuBLAS off, so the mul_mat cases run
/// the backend's own GEMM kernels (`scripts/gpu-check.sh` runs both); the
/// emulator runs the mul_mat cases both ways in one run.
#[cfg(feature = "cuda")]
#[test]
fn cuda_diff() {
    use shardgraph::backend::cuda::CudaBackend;
    use shardgraph::Backend;
    let Some((g, cases)) = gpu_cases("cuda_diff") else { return };
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
    gpu_diff("cuda_diff", g, &cases, &backend, no_blas);
}

/// The same cases on the HIP backend: an AMD GPU when the HIP runtime sees
/// one (`hip` feature), else the emulated CDNA GPU (`cuda-emu` feature: the
/// kernels through the HIP portability header, 64-wide waves), else
/// skipped with a message. Ends with `hip_diff: <cases> cases, <failures>
/// failures, ...` as [`cuda_diff`].
#[cfg(any(feature = "hip", feature = "cuda-emu"))]
#[test]
fn hip_diff() {
    use shardgraph::backend::cuda::CudaBackend;
    let Some((g, cases)) = gpu_cases("hip_diff") else { return };
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
    gpu_diff("hip_diff", g, &cases, &backend, None);
}

/// The oracle and the cases (`GGML_DIFF_FILTER` applied) for a GPU run, or
/// `None` with a message when the oracle is missing.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn gpu_cases(label: &str) -> Option<(&'static oracle::Ggml, Vec<Case>)> {
    let filter = std::env::var("GGML_DIFF_FILTER").unwrap_or_default();
    let cases: Vec<Case> = all_cases()
        .into_iter()
        .filter(|c| filter.is_empty() || format!("{}:{}", c.op, c.vars).contains(&filter))
        .collect();
    match oracle::Ggml::get() {
        Ok(g) => Some((g, cases)),
        Err(why) => {
            println!("{label}: SKIPPED: ggml oracle not available: {why}");
            assert!(
                std::env::var("SHARDGRAPH_REQUIRE_GGML").is_err(),
                "SHARDGRAPH_REQUIRE_GGML is set but the oracle is missing"
            );
            None
        }
    }
}

/// Every case on `backend` against the oracle (and the mul_mat cases once
/// more on `again_without_blas`), with the summary line `<label>: ...`.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn gpu_diff(
    label: &str,
    g: &oracle::Ggml,
    cases: &[Case],
    backend: &shardgraph::backend::cuda::CudaBackend,
    again_without_blas: Option<shardgraph::backend::cuda::CudaBackend>,
) {
    use shardgraph::Backend;
    use std::collections::BTreeMap;
    let verbose = std::env::var("GGML_DIFF_VERBOSE").is_ok();
    let (mut failures, mut with_host) = (0, 0);
    let mut host_ops: BTreeMap<String, u64> = BTreeMap::new();
    for c in cases {
        let before = backend.stats().host_nodes;
        let outcome = run_case(g, c, backend, 2);
        let after = backend.stats().host_nodes;
        let on_host: Vec<String> =
            after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, _)| k.clone()).collect();
        if !on_host.is_empty() {
            with_host += 1;
            for op in &on_host {
                *host_ops.entry(op.clone()).or_default() += 1;
            }
        }
        match outcome {
            Outcome::Pass(e) => {
                if verbose {
                    println!(
                        "  ok   {}({}) nmse={e:.2e}{}",
                        c.op,
                        c.vars,
                        if on_host.is_empty() { "" } else { " [host]" }
                    );
                }
            }
            Outcome::Fail(why) => {
                failures += 1;
                println!("  FAIL {}({}): {why}", c.op, c.vars);
            }
        }
    }
    // The emulated GPU emulates cuBLAS; the mul_mat cases once more
    // without it run the backend's own GEMM kernels (a GPU without libcublas).
    #[cfg(feature = "cuda-emu")]
    if let Some(no_blas) = again_without_blas {
        let mm: Vec<&Case> = cases.iter().filter(|c| c.op.starts_with("mul_mat")).collect();
        for c in &mm {
            if let Outcome::Fail(why) = run_case(g, c, &no_blas, 2) {
                failures += 1;
                println!("  FAIL {}({}) without cuBLAS: {why}", c.op, c.vars);
            }
        }
        println!("{label}: {} mul_mat cases again without cuBLAS", mm.len());
    }
    let s = backend.stats();
    println!("{label}: host nodes per op (cases): {host_ops:?}");
    println!(
        "{label}: {} cases, {failures} failures, {with_host} cases with host nodes ({} kernel launches, {} device nodes)",
        cases.len(),
        s.launches,
        s.device_nodes
    );
    assert_eq!(failures, 0, "{failures} differential cases failed on {}", backend.name());
    #[cfg(not(feature = "cuda-emu"))]
    let _ = again_without_blas;
}
