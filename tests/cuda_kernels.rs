//! Compiles every CUDA kernel source in `kernels-cuda/` with NVRTC to PTX
//! and CUBIN for sm_86 and sm_90, on any machine (no GPU needed: NVRTC
//! comes from the `nvidia-cuda-nvrtc` wheel `scripts/setup.sh` installs), so
//! a syntax or type error in a kernel fails CI. Ends with
//! `cuda_kernels: <n> kernels compiled, <failures> failures` and the
//! process's compile counts (`nvrtc: <c> compiles, <d> disk-cache hits, ...`:
//! each (file, architecture) compiled at most once; with a warm disk cache
//! none is compiled). `versions` prints the NVRTC loaded and, with a GPU,
//! the driver, the device and what was loaded on it.
//!
//! `SHARDGRAPH_NVRTC_ARCHS=sm_90` (a comma-separated list) compiles for
//! those architectures only (`scripts/gpu-check.sh` on an sm_90 GPU).
//!
//! Without NVRTC each test that needs it prints `SKIPPED` with the reason,
//! unless `SHARDGRAPH_REQUIRE_NVRTC` is set (as `.ci/run` and
//! `scripts/gpu-check.sh run` do), when it fails; without a GPU the device
//! checks say so, unless `SHARDGRAPH_REQUIRE_GPU` is set (`common/require.rs`).

use shardgraph::backend::cuda::nvrtc::{compile, describe, is_cached, load, stats, supported_archs, KERNEL_SOURCES};

#[path = "common/require.rs"]
mod require;
use require::Tool;

/// True when NVRTC loads; otherwise says `test` is skipped (a failure
/// when `SHARDGRAPH_REQUIRE_NVRTC` is set).
fn nvrtc(test: &str) -> bool {
    require::or_skip(Tool::Nvrtc, &format!("cuda_kernels: {test}"), load()).is_some()
}

#[test]
fn every_kernel_compiles_for_sm_86_and_sm_90() {
    if !nvrtc("every_kernel_compiles_for_sm_86_and_sm_90") {
        return;
    }
    assert!(!KERNEL_SOURCES.is_empty(), "kernels-cuda/ holds no .cu file");
    let archs: Vec<String> = std::env::var("SHARDGRAPH_NVRTC_ARCHS")
        .map(|v| v.split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect())
        .unwrap_or_else(|_| vec!["sm_86".into(), "sm_90".into()]);
    assert!(!archs.is_empty(), "SHARDGRAPH_NVRTC_ARCHS names no architecture");
    let (mut kernels, mut failures) = (0usize, Vec::new());
    // Every (file, architecture) compiled in parallel, checked in order.
    let jobs: Vec<(&str, &str, &str)> =
        KERNEL_SOURCES.iter().flat_map(|&(name, src)| archs.iter().map(move |a| (name, src, a.as_str()))).collect();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = jobs.iter().map(|&(name, src, arch)| s.spawn(move || compile(name, src, arch))).collect();
        hs.into_iter().map(|h| h.join().expect("a compile thread panicked")).collect()
    });
    for (&(name, _, arch), result) in jobs.iter().zip(results) {
        match result {
            Ok(c) => {
                let e = c.entries();
                assert!(!c.cubin.is_empty(), "{name}.cu for {arch}: no CUBIN");
                assert!(!e.is_empty(), "{name}.cu for {arch}: no kernel entry point in the PTX");
                if arch == archs[0] {
                    println!("{name}.cu: {} kernels: {}", e.len(), e.join(", "));
                    kernels += e.len();
                }
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    for f in &failures {
        println!("{f}");
    }
    println!("cuda_kernels: {kernels} kernels compiled, {} failures", failures.len());
    assert!(failures.is_empty(), "{} kernel files failed to compile", failures.len());
    // Every source compiled above is cached: a second compile is a lookup.
    for (name, src) in KERNEL_SOURCES {
        assert!(archs.iter().all(|a| is_cached(src, a)), "{name} is not in the NVRTC cache");
    }
    let (name, src) = KERNEL_SOURCES[0];
    assert_eq!(compile(name, src, &archs[0]).unwrap(), compile(name, src, &archs[0]).unwrap());
    // No (file, architecture) was compiled twice in this process, whichever
    // test asked first (the tests run concurrently).
    let st = stats();
    println!("cuda_kernels: {st}");
    assert!(st.max_runs_per_key <= 1, "{st}");
}

/// The NVRTC this process loaded (file and version, checked against the
/// build's) and its architectures; with a GPU, the driver, each device and
/// the kernels loaded on it (CUBIN for its architecture).
#[test]
fn versions() {
    match describe() {
        Ok(d) => println!("cuda_kernels: NVRTC: {d}; architectures {:?}", supported_archs().unwrap_or_default()),
        Err(e) => require::missing(Tool::Nvrtc, "cuda_kernels: versions (NVRTC)", &e),
    }
    use shardgraph::backend::cuda::device::{describe_device, device_count, driver_version};
    match (driver_version(), device_count()) {
        (Ok((major, minor)), Ok(n)) => {
            println!("cuda_kernels: driver: CUDA {major}.{minor}, {n} device(s)");
            for d in 0..n {
                println!("cuda_kernels: {}", describe_device(d).unwrap());
            }
        }
        (v, n) => require::missing(
            Tool::Gpu,
            "cuda_kernels: versions (driver and devices)",
            &v.err().or(n.err()).map(|e| e.to_string()).unwrap_or_default(),
        ),
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_naming_it() {
    if !nvrtc("a_kernel_that_does_not_compile_is_an_error_naming_it") {
        return;
    }
    let e = compile("broken", "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }", "sm_86")
        .unwrap_err()
        .to_string();
    assert!(e.contains("broken.cu") && e.contains("sm_86"), "{e}");
}

/// Without a GPU the driver is an error, not a panic; with one, every
/// kernel's module loads on every device and each entry point resolves.
#[test]
fn without_a_gpu_the_driver_is_an_error_not_a_panic() {
    use shardgraph::backend::cuda::device::device_count;
    match device_count() {
        Ok(n) => {
            println!("cuda_kernels: {n} CUDA device(s)");
            for d in 0..n {
                let k = shardgraph::backend::cuda::device::load_all_kernels(d).unwrap();
                println!("cuda_kernels: device {d}: {k} kernels loaded");
            }
        }
        Err(e) => {
            assert!(e.to_string().contains("cuda"), "{e}");
            require::missing(Tool::Gpu, "cuda_kernels: kernels loaded on the GPU", &e);
        }
    }
}

/// The emulator (`cuda-emu`) holds every kernel NVRTC finds in the sources,
/// for its CUDA devices and its HIP (CDNA) devices alike: build.rs's list of
/// kernel names misses none.
#[cfg(feature = "cuda-emu")]
#[test]
fn the_emulator_has_every_kernel() {
    use shardgraph::backend::cuda::emu::{kernel_count, EmuKind};
    if !nvrtc("the_emulator_has_every_kernel") {
        return;
    }
    let n: usize = KERNEL_SOURCES.iter().map(|&(name, src)| compile(name, src, "sm_86").unwrap().entries().len()).sum();
    assert_eq!(kernel_count(EmuKind::Cuda), n);
    assert_eq!(kernel_count(EmuKind::HipCdna), n);
    println!("cuda_kernels: the emulator has all {n} kernels for CUDA and for HIP (CDNA) devices");
}
