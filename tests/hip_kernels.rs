//! The HIP kernel check, on any machine (no GPU needed):
//!
//! - `hipcc`: every kernel file of `kernels-cuda/` behind the portability
//!   header (`sources::hip_source`) compiles with `hipcc -x hip
//!   --offload-arch=<arch> --genco -std=c++17 -O3` for gfx90a (CDNA, wave64)
//!   and gfx1030 (RDNA, wave32); each code object holds exactly the
//!   kernels the file declares (its `extern "C"` `__global__` functions
//!   after preprocessing, so macro-generated kernels count), each compiled
//!   for the wave size `SG_WARP` assumes on that architecture. Ends with
//!   `hip_kernels: <n> kernels compiled, <failures> failures` (n summed
//!   over both architectures). Without `hipcc` on `PATH` the test says so
//!   and passes, unless `SHARDGRAPH_REQUIRE_HIPCC` is set.
//! - hipRTC (what the backend compiles with at run time): the same files,
//!   the same kernels, for the same architectures, when hipRTC loads
//!   (ROCm 5.2's compiles without a GPU). Without it the test says so and
//!   passes, unless `SHARDGRAPH_REQUIRE_HIPRTC` is set (`common/require.rs`).
//!
//! Needs `--features hip`.
#![cfg(feature = "hip")]

use shardgraph::backend::cuda::hip::{code_object, hiprtc, wave_size};
use shardgraph::backend::cuda::sources::{hip_source, KERNEL_SOURCES};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

#[path = "common/require.rs"]
mod require;
use require::Tool;

const ARCHS: [&str; 2] = ["gfx90a", "gfx1030"];
/// The architectures hipRTC compiles for in this test.
const HIPRTC_ARCHS: [&str; 1] = ["gfx90a"];

/// The two compile tests take turns (each keeps the cores busy; their
/// timings then mean something).
static COMPILERS: Mutex<()> = Mutex::new(());

/// `hipcc` on `PATH`, if any (found without running it: ROCm 5.2's
/// `hipcc --version` probes for a GPU).
fn hipcc() -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join("hipcc")).find(|p| p.is_file())
}

/// The kernels a preprocessed source declares: the names after
/// `extern "C"`, a `__global__` (`__attribute__((global))` once
/// preprocessed) and `void`.
fn declared_kernels(preprocessed: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, m) in preprocessed.match_indices("extern \"C\"") {
        let rest = &preprocessed[at + m.len()..];
        // The declaration's head: up to its body or its end.
        let head = &rest[..rest.find(['{', ';']).unwrap_or(rest.len())];
        let Some(v) = head.find("void") else { continue };
        if !(head[..v].contains("__attribute__((global))") || head[..v].contains("__global__")) {
            continue;
        }
        let after = head[v + 4..].trim_start();
        let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() && after[name.len()..].trim_start().starts_with('(') {
            names.insert(name);
        }
    }
    names
}

/// Runs `hipcc` with `args`; `Err` with its output on failure.
fn run(hipcc: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new(hipcc).args(args).output().map_err(|e| format!("cannot run {}: {e}", hipcc.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// Runs `jobs` on `workers` threads, results in job order.
fn parallel<T: Sync, R: Send>(jobs: Vec<T>, workers: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let r = f(job);
                results.lock().unwrap()[i] = Some(r);
            });
        }
    });
    results.into_inner().unwrap().into_iter().map(|r| r.expect("every job ran")).collect()
}

#[test]
fn every_kernel_compiles_with_hipcc_for_gfx90a_and_gfx1030() {
    let Some(hipcc) = hipcc() else {
        let why = "hipcc is not on PATH (install ROCm's hipcc, e.g. Debian's `hipcc` package)";
        require::missing(Tool::Hipcc, "hip_kernels: hipcc", &why);
        return;
    };
    assert!(!KERNEL_SOURCES.is_empty(), "kernels-cuda/ holds no .cu file");
    let _turn = COMPILERS.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("shardgraph-hip-kernels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let start = Instant::now();
    // The expected kernels of each file: its declarations after
    // preprocessing for the device (fast: no code generation).
    for &(name, src) in KERNEL_SOURCES {
        std::fs::write(dir.join(format!("{name}.hip")), hip_source(name, src)).unwrap();
    }
    let expected: Vec<Result<BTreeSet<String>, String>> = parallel(KERNEL_SOURCES.to_vec(), 2, |&(name, _)| {
        let (input, output) = (dir.join(format!("{name}.hip")), dir.join(format!("{name}.ii")));
        let args = ["-x", "hip", "--offload-arch=gfx90a", "--cuda-device-only", "-E", "-std=c++17"];
        let mut all: Vec<&str> = args.to_vec();
        let (i, o) = (input.to_str().unwrap(), output.to_str().unwrap());
        all.extend(["-o", o, i]);
        run(&hipcc, &all)?;
        Ok(declared_kernels(&std::fs::read_to_string(&output).map_err(|e| e.to_string())?))
    });
    let jobs: Vec<(&str, &str)> =
        KERNEL_SOURCES.iter().flat_map(|&(name, _)| ARCHS.iter().map(move |&arch| (name, arch))).collect();
    let compiled = parallel(jobs.clone(), 2, |&(name, arch)| {
        let t = Instant::now();
        let input = dir.join(format!("{name}.hip"));
        let output = dir.join(format!("{name}.{arch}.co"));
        let offload = format!("--offload-arch={arch}");
        let args = ["-x", "hip", &offload, "--genco", "-std=c++17", "-O3", "-o"];
        let mut all: Vec<&str> = args.to_vec();
        all.extend([output.to_str().unwrap(), input.to_str().unwrap()]);
        let r = run(&hipcc, &all).and_then(|_| std::fs::read(&output).map_err(|e| e.to_string()));
        (r, t.elapsed().as_secs_f64())
    });
    let (mut kernels, mut failures) = (0usize, Vec::new());
    let mut per_arch: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (&(name, arch), (result, secs)) in jobs.iter().zip(compiled) {
        let want = match &expected[KERNEL_SOURCES.iter().position(|&(n, _)| n == name).unwrap()] {
            Ok(w) => w,
            Err(e) => {
                failures.push(format!("{name}.cu: preprocessing failed:\n{e}"));
                continue;
            }
        };
        let code = match result {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{name}.cu for {arch}: hipcc failed:\n{e}"));
                continue;
            }
        };
        let objects = match code_object::parse(&code) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{name}.cu for {arch}: {e}"));
                continue;
            }
        };
        let targets: Vec<&str> = objects.iter().map(|o| o.target.as_str()).collect();
        if objects.len() != 1 || !objects[0].target.ends_with(arch) {
            failures.push(format!("{name}.cu for {arch}: bundle targets {targets:?}"));
            continue;
        }
        if name == "softmax" {
            // A real bundle, truncated anywhere, is an error (never a panic).
            let cut = (0..code.len()).step_by(53).find(|&n| code_object::parse(&code[..n]).is_ok());
            assert_eq!(cut, None, "{name}.cu for {arch}: truncated to {cut:?} bytes still parses");
        }
        let got: BTreeSet<String> = objects[0].kernels.iter().map(|k| k.name.clone()).collect();
        let wave = wave_size(arch).unwrap();
        let wrong_wave: Vec<&str> =
            objects[0].kernels.iter().filter(|k| k.wave_size != wave).map(|k| k.name.as_str()).collect();
        println!("{name}.cu for {arch}: {} kernels, wave {wave}, {secs:.1} s", got.len());
        if got != *want || got.is_empty() {
            let missing: Vec<_> = want.difference(&got).collect();
            let extra: Vec<_> = got.difference(want).collect();
            failures.push(format!("{name}.cu for {arch}: kernels missing {missing:?}, unexpected {extra:?}"));
            continue;
        }
        if !wrong_wave.is_empty() {
            failures.push(format!("{name}.cu for {arch}: not compiled for waves of {wave}: {wrong_wave:?}"));
            continue;
        }
        kernels += got.len();
        per_arch.entry(arch).or_default().extend(got);
    }
    for f in &failures {
        println!("{f}");
    }
    println!("hip_kernels: hipcc: {:.0} s for {} compiles, 2 at a time", start.elapsed().as_secs_f64(), jobs.len());
    println!("hip_kernels: {kernels} kernels compiled, {} failures", failures.len());
    assert!(failures.is_empty(), "{} kernel files failed for some architecture", failures.len());
    // Both architectures have the same kernels, and names are unique across files.
    let sets: Vec<&BTreeSet<String>> = per_arch.values().collect();
    assert_eq!(sets.len(), ARCHS.len());
    assert_eq!(sets[0], sets[1], "gfx90a and gfx1030 compiled different kernels");
    assert_eq!(kernels, 2 * sets[0].len(), "a kernel name is defined in two files");
    let _ = std::fs::remove_dir_all(&dir);
}

/// hipRTC, the run-time compiler, compiles every file for gfx90a (one
/// architecture: hipRTC compiles serially, about 50 s here; hipcc above
/// covers both wave sizes and checks each file's kernels are all there)
/// to kernels of the right wave size; a second compile is a cache lookup.
#[test]
fn every_kernel_compiles_with_hiprtc_for_gfx90a() {
    if require::or_skip(Tool::Hiprtc, "hip_kernels: hipRTC", hiprtc::load()).is_none() {
        return;
    }
    let _turn = COMPILERS.lock().unwrap_or_else(|p| p.into_inner());
    let start = Instant::now();
    let jobs: Vec<(&str, &str, &str)> = KERNEL_SOURCES
        .iter()
        .flat_map(|&(name, src)| HIPRTC_ARCHS.iter().map(move |&arch| (name, src, arch)))
        .collect();
    // One at a time: hipRTC compiles serially (its own lock).
    let results: Vec<_> = jobs.iter().map(|&(name, src, arch)| hiprtc::compile_kernel_file(name, src, arch)).collect();
    let (mut failures, mut per_arch) = (Vec::new(), BTreeMap::<&str, BTreeSet<String>>::new());
    let mut per_file: BTreeMap<&str, Vec<BTreeSet<String>>> = BTreeMap::new();
    for ((name, _, arch), r) in jobs.iter().zip(results) {
        match r.and_then(|code| code_object::elf_kernels(&code)) {
            Ok(ks) => {
                let wave = wave_size(arch).unwrap();
                if ks.is_empty() || ks.iter().any(|k| k.wave_size != wave) {
                    failures.push(format!("{name}.cu for {arch}: {} kernels, not all of wave {wave}", ks.len()));
                }
                let names: BTreeSet<String> = ks.into_iter().map(|k| k.name).collect();
                per_arch.entry(arch).or_default().extend(names.iter().cloned());
                per_file.entry(name).or_default().push(names);
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    for f in &failures {
        println!("{f}");
    }
    let n: usize = per_arch.values().map(|s| s.len()).sum();
    println!(
        "hip_kernels: hipRTC ({}): {n} kernels compiled, {} failures ({:.0} s)",
        hiprtc::describe().unwrap_or_default(),
        failures.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty());
    assert_eq!(per_file.len(), KERNEL_SOURCES.len(), "a kernel file gave no code object");
    for &(name, src) in KERNEL_SOURCES {
        for arch in HIPRTC_ARCHS {
            assert!(hiprtc::is_cached(&hip_source(name, src), arch), "{name} for {arch} is not cached");
        }
    }
}

/// The declaration scanner finds macro-expanded kernels and ignores other
/// `extern "C"` declarations.
#[test]
fn the_declaration_scanner_finds_kernels() {
    let pre = "extern \"C\" __attribute__((global)) void sg_a(const char *x) {}\n\
               extern \"C\" int printf(const char *, ...);\n\
               extern \"C\" __attribute__((global)) void sg_b( char *d) { } extern \"C\" __global__ void sg_c(int n);";
    let got: Vec<String> = declared_kernels(pre).into_iter().collect();
    assert_eq!(got, ["sg_a", "sg_b", "sg_c"]);
}
