//! The HIP backend (AMD GPUs) as an embedder meets it.
//!
//! Without a GPU (or without ROCm) every way in — `CudaBackend::hip`,
//! `hip_virtual_devices`, `hip::device_count`, `hip::load_all_kernels` —
//! is an `Error::Hip` that says why, never a panic. With a GPU
//! (`hip::device_count() > 0`) a small graph (add, mul_mat through the
//! matrix-vector kernels and through GEMM, soft_max, rms_norm) on GPU 0
//! equals the CPU backend, two virtual devices copy between each other,
//! and every kernel file loads. Every test prints what it skipped and why.
//!
//! Needs `--features hip`.
#![cfg(feature = "hip")]

use shardgraph::backend::cuda::{hip, CudaBackend};
use shardgraph::{Backend, Context, Error, GgmlType};

#[path = "common/fixtures.rs"]
mod fixtures;
#[path = "common/nmse.rs"]
mod nmse;
use fixtures::run_graph;
#[path = "common/rng.rs"]
mod rng;
use nmse::nmse;
use rng::values;

/// The number of AMD GPUs, or `None` with the reason printed.
fn gpus(test: &str) -> Option<usize> {
    if std::env::var_os("SHARDGRAPH_REQUIRE_GPU").is_some() {
        let n = hip::device_count();
        assert!(matches!(n, Ok(n) if n > 0), "{test}: SHARDGRAPH_REQUIRE_GPU is set but no AMD GPU: {n:?}");
    }
    match hip::device_count() {
        Ok(n) if n > 0 => Some(n),
        Ok(_) => {
            println!("hip_backend: {test}: SKIPPED: the HIP runtime sees no AMD GPU");
            None
        }
        Err(e) => {
            println!("hip_backend: {test}: SKIPPED: {e}");
            None
        }
    }
}

/// The message of an `Error::Hip`, failing on any other outcome.
fn hip_error<T>(what: &str, r: shardgraph::Result<T>) -> String {
    match r {
        Err(e @ Error::Hip { .. }) => e.to_string(),
        Err(e) => panic!("{what}: expected Error::Hip, got {e:?}"),
        Ok(_) => panic!("{what}: expected an error"),
    }
}

/// Without a GPU, every way to a HIP device is an `Err` saying why (no
/// usable GPU, or no ROCm); bad virtual-device counts are errors anyway.
#[test]
fn a_missing_gpu_is_an_error_that_says_why() {
    assert!(hip_error("0 virtual devices", CudaBackend::hip_virtual_devices(0, 0)).contains("1..=64"));
    assert!(hip_error("65 virtual devices", CudaBackend::hip_virtual_devices(0, 65)).contains("1..=64"));
    if let Ok(n) = hip::device_count() {
        if n > 0 {
            let d = CudaBackend::hip(0).unwrap();
            println!("hip_backend: {n} AMD GPU(s); GPU 0: {}", d.device().description);
            let e = hip_error("GPU 1000000", CudaBackend::hip(1_000_000));
            assert!(e.contains("1000000") && e.contains(&format!("sees {n}")), "{e}");
            return;
        }
    }
    println!("hip_backend: no AMD GPU, checking that each entry point says why");
    let says_why = |e: &str| e.contains("no usable AMD GPU") || e.contains("no HIP runtime");
    for (what, e) in [
        ("hip::device_count()", hip_error("device_count", hip::device_count())),
        ("CudaBackend::hip(0)", hip_error("hip(0)", CudaBackend::hip(0))),
        (
            "CudaBackend::hip_virtual_devices(0, 2)",
            hip_error("hip_virtual_devices", CudaBackend::hip_virtual_devices(0, 2)),
        ),
        ("hip::load_all_kernels(0)", hip_error("load_all_kernels", hip::load_all_kernels(0))),
    ] {
        println!("hip_backend: {what}: {e}");
        assert!(e.starts_with("hip: "), "{what}: {e}");
        assert!(says_why(&e), "{what} does not say why: {e}");
    }
}

/// add (with broadcast), mul_mat (one column: the matrix-vector kernel;
/// 40 columns: hipBLAS or the tiled kernel), soft_max with a scale and
/// rms_norm on GPU 0 equal the CPU backend, all on the device.
#[test]
fn a_graph_on_the_gpu_equals_the_cpu() {
    if gpus("a_graph_on_the_gpu_equals_the_cpu").is_none() {
        return;
    }
    let d = CudaBackend::hip(0).unwrap();
    let mut ctx = Context::new();
    let mut leafs = Vec::new();
    let mut leaf = |ctx: &mut Context, ne: &[i64], seed: u64| {
        let t = ctx.new_tensor(GgmlType::F32, ne).unwrap();
        leafs.push((t, values(ne.iter().product::<i64>() as usize, seed, 1.0, 0.0)));
        t
    };
    let a = leaf(&mut ctx, &[96, 40], 1);
    let bias = leaf(&mut ctx, &[96], 2);
    let w = leaf(&mut ctx, &[96, 72], 3);
    let x1 = leaf(&mut ctx, &[96, 1], 4);
    let sum = ctx.add(a, bias).unwrap();
    let mv = ctx.mul_mat(w, x1).unwrap();
    let mm = ctx.mul_mat(w, sum).unwrap();
    let scaled = ctx.soft_max_ext(mm, None, 0.25, 0.0).unwrap();
    let normed = ctx.rms_norm(sum, 1e-6).unwrap();
    let outs = [sum, mv, mm, scaled, normed];
    let cpu = shardgraph::CpuBackend::with_threads(2).unwrap();
    let want = run_graph(&cpu, &ctx, &leafs, &outs);
    let got = run_graph(&d, &ctx, &leafs, &outs);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let e = nmse(g, w);
        println!("hip_backend: {} on {}: nmse {e:.2e}", ctx.tensor(outs[i]).unwrap().op.name(), d.name());
        assert_eq!(g.len(), w.len());
        assert!(e < 1e-10, "output {i}: nmse {e:e}");
    }
    assert!(d.stats().host_nodes.is_empty(), "nodes ran on the host: {:?}", d.stats().host_nodes);
}

/// Two virtual devices on GPU 0 copy a buffer between each other
/// (device-to-device, stream-ordered) and keep separate memory budgets.
#[test]
fn virtual_devices_copy_between_each_other() {
    if gpus("virtual_devices_copy_between_each_other").is_none() {
        return;
    }
    let devs = CudaBackend::hip_virtual_devices(0, 2).unwrap();
    assert_eq!(devs[1].name(), "HIP0.1");
    let a = devs[0].alloc_buffer(4096).unwrap();
    let b = devs[1].alloc_buffer(4096).unwrap();
    let mut zeros = vec![1u8; 4096];
    b.get(0, &mut zeros).unwrap();
    assert!(zeros.iter().all(|&z| z == 0), "a new buffer is zero-filled");
    let data: Vec<u8> = (0..4096).map(|i| (i * 7 % 251) as u8).collect();
    a.set(0, &data).unwrap();
    b.copy_from(100, a.as_ref(), 0, 3000).unwrap();
    let mut back = vec![0u8; 4096];
    b.get(0, &mut back).unwrap();
    assert_eq!(&back[100..3100], &data[..3000]);
    assert!(back[..100].iter().chain(&back[3100..]).all(|&z| z == 0));
    let total = devs[0].device().memory_total;
    let e = devs[0].alloc_buffer(total + 1).unwrap_err().to_string();
    assert!(e.contains("out of device memory") && e.contains("HIP0.0"), "{e}");
}

/// Every kernel file compiles (hipRTC) and loads on GPU 0, and every
/// kernel its code object names resolves.
#[test]
fn every_kernel_loads_on_the_gpu() {
    let Some(n) = gpus("every_kernel_loads_on_the_gpu") else { return };
    for d in 0..n {
        let k = hip::load_all_kernels(d).unwrap();
        println!("hip_backend: GPU {d}: {k} kernels loaded");
        assert!(k > 100, "{k} kernels");
    }
}
