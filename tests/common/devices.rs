//! The devices the meta backend's tests run on, chosen by the environment
//! variable `SHARDGRAPH_TEST_DEVICES`:
//! - unset or `cpu`: CPU backend instances (one worker thread each);
//! - `cpu-data`: the same (kept for old scripts: since the compiled runtime
//!   every device keeps its data in its buffers; there is one data path);
//! - `cuda`: virtual devices on GPU 0 (needs `--features cuda` and a GPU;
//!   with `--features cuda-emu` and no GPU, emulated GPUs instead);
//! - `hip`: virtual devices on AMD GPU 0 (needs `--features hip` and a GPU;
//!   with `--features cuda-emu` and no AMD GPU, emulated CDNA GPUs instead:
//!   the kernels through the HIP portability header, 64-wide waves).
//!
//! The same regression and property tests then check split execution on
//! GPU devices against the single-device CPU results.
#![allow(dead_code)]

use shardgraph::split::{Devices, MetaExecutor};

/// `ratios.len()` CPU devices with one worker thread each and tensor-split
/// `ratios`: what the model tests load a session onto.
///
/// # Panics
/// For a device count or ratios [`Devices`] refuses (a test set-up error).
pub fn cpu(ratios: &[f32]) -> Devices {
    Devices::cpu(ratios.len(), 1)
        .and_then(|d| d.with_tensor_split(ratios))
        .unwrap_or_else(|e| panic!("CPU devices at {ratios:?}: {e}"))
}

/// Called where a test would fall back to emulated GPUs or skip because
/// no GPU opened: with `SHARDGRAPH_REQUIRE_GPU=1` (set by
/// `scripts/gpu-check.sh` on a GPU machine) that is a failure naming
/// `why`; otherwise it prints what happens instead.
pub fn no_gpu(what: &str, why: &dyn std::fmt::Display, instead: &str) {
    assert!(
        std::env::var_os("SHARDGRAPH_REQUIRE_GPU").is_none(),
        "{what}: SHARDGRAPH_REQUIRE_GPU is set but no GPU opened: {why}"
    );
    println!("{what}: no GPU ({why}); {instead}");
}

/// What `SHARDGRAPH_TEST_DEVICES` asks for ("cpu" by default).
pub fn kind() -> String {
    std::env::var("SHARDGRAPH_TEST_DEVICES").unwrap_or_else(|_| "cpu".into())
}

/// An executor over `n` devices of the kind [`kind`] names.
///
/// # Panics
/// For an unknown kind, or `cuda` without the feature or a device (a test
/// set-up error, reported as such).
pub fn executor(n: usize) -> MetaExecutor {
    match kind().as_str() {
        "cpu" => Devices::cpu(n, 1).and_then(|d| d.executor()).expect("CPU devices"),
        "cpu-data" => Devices::cpu(n, 1).and_then(|d| d.executor()).expect("CPU devices"),
        #[cfg(feature = "cuda")]
        "cuda" => {
            use shardgraph::backend::cuda::CudaBackend;
            #[cfg(feature = "cuda-emu")]
            let emu = Some(CudaBackend::emulated as fn(usize) -> CudaBackend);
            #[cfg(not(feature = "cuda-emu"))]
            let emu = None;
            gpu_executor("cuda", n, CudaBackend::virtual_devices(0, n), emu)
        }
        #[cfg(any(feature = "hip", feature = "cuda-emu"))]
        "hip" => {
            use shardgraph::backend::cuda::CudaBackend;
            #[cfg(feature = "hip")]
            let real = CudaBackend::hip_virtual_devices(0, n);
            #[cfg(not(feature = "hip"))]
            let real = Err(shardgraph::Error::Hip { detail: "built without the `hip` feature".into() });
            #[cfg(feature = "cuda-emu")]
            let emu = Some(CudaBackend::emulated_hip as fn(usize) -> CudaBackend);
            #[cfg(not(feature = "cuda-emu"))]
            let emu = None;
            gpu_executor("hip", n, real, emu)
        }
        other => {
            panic!(
                "SHARDGRAPH_TEST_DEVICES={other:?}: expected cpu, cpu-data, cuda or hip \
                 (cuda needs --features cuda, hip --features hip or cuda-emu)"
            )
        }
    }
}

/// True when the devices compute exactly as the single-device CPU reference
/// (CPU devices). CUDA kernels sum in another order and keep activations in
/// f32 where the CPU quantises them to Q8 for quantized weights, so on CUDA
/// devices results agree to the tolerance ggml's `test-backend-ops` allows
/// between backends ([`tolerance`]), not bit for bit.
pub fn exact() -> bool {
    kind().starts_with("cpu")
}

/// `tol` for CPU devices; on CUDA devices at least 2e-3: ggml's
/// between-backend NMSE for one mul_mat is 5e-4, and these graphs chain
/// several quantized products (and re-quantize into Q4_0 caches, where a
/// value that moved by rounding can change level).
pub fn tolerance(tol: f64) -> f64 {
    if exact() {
        tol
    } else {
        tol.max(2e-3)
    }
}

/// An executor over `real` (a GPU's virtual devices), else over `n`
/// devices made by `emulated` (1 GiB each; see [`no_gpu`]), else a panic
/// saying there is no GPU (a test set-up error).
#[cfg(sg_gpu)]
fn gpu_executor(
    kind: &str,
    n: usize,
    real: shardgraph::Result<Vec<shardgraph::backend::cuda::CudaBackend>>,
    emulated: Option<fn(usize) -> shardgraph::backend::cuda::CudaBackend>,
) -> MetaExecutor {
    use shardgraph::Backend;
    use std::sync::Arc;
    let devs = match (real, emulated) {
        (Ok(d), _) => d,
        (Err(e), Some(emu)) => {
            no_gpu(&format!("SHARDGRAPH_TEST_DEVICES={kind}"), &e, "emulated GPUs instead");
            (0..n).map(|_| emu(1 << 30)).collect()
        }
        (Err(e), None) => panic!("SHARDGRAPH_TEST_DEVICES={kind} but no GPU: {e}"),
    };
    Devices::from_backends(devs.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect())
        .and_then(|d| d.executor())
        .unwrap_or_else(|e| panic!("{kind} devices: {e}"))
}
