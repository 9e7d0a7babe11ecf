//! Lists the CUDA kernel sources (`kernels-cuda/*.cu`) for the `cuda`
//! feature, so every file in the folder is embedded and compile-checked
//! without a hand-kept list. With the `cuda-emu` feature it also compiles
//! every file as host C++ (with `kernels-cuda/emu/sg_emu.h` in front) into
//! the CUDA emulator, with a table of its kernels by name.

use std::io::Write;
#[cfg(feature = "cuda-emu")]
use std::path::Path;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=kernels-cuda");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels-hip");
    // `sg_gpu`: the GPU backend (`backend::cuda`) is built, for CUDA, HIP or both.
    println!("cargo::rustc-check-cfg=cfg(sg_gpu)");
    // `docsrs`: set by docs.rs (`[package.metadata.docs.rs]`) for `doc(cfg)` badges.
    println!("cargo::rustc-check-cfg=cfg(docsrs)");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() || std::env::var_os("CARGO_FEATURE_HIP").is_some() {
        println!("cargo::rustc-cfg=sg_gpu");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("kernels-cuda");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "cu")).collect()
        })
        .unwrap_or_default();
    files.sort();
    // Each file with its `#include "x.cuh"` lines replaced by kernels-cuda/x.cuh
    // (NVRTC compiles a file alone, with no include path).
    let expanded_dir = out.join("kernels");
    std::fs::create_dir_all(&expanded_dir).expect("create OUT_DIR/kernels");
    let mut expanded = Vec::new();
    for p in &files {
        println!("cargo:rerun-if-changed={}", p.display());
        let name = p.file_name().expect("file name");
        let e = expanded_dir.join(name);
        std::fs::write(&e, expand_includes(&dir, p)).expect("write expanded kernel file");
        expanded.push(e);
    }
    let mut f = std::fs::File::create(out.join("cuda_kernels.rs")).expect("create cuda_kernels.rs");
    writeln!(f, "&[").expect("write");
    for (p, e) in files.iter().zip(&expanded) {
        let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("?");
        writeln!(f, "    ({name:?}, include_str!({:?})),", e.display().to_string()).expect("write");
    }
    writeln!(f, "]").expect("write");
    #[cfg(feature = "cuda-emu")]
    emulator(&out, &dir, &expanded);
}

/// `path`'s text with each `#include "x.cuh"` line replaced by the text of
/// `dir/x.cuh`, itself expanded the same way (a header may include
/// another: `dequant.cuh` includes `iq_tables.cuh`), once per file: later
/// includes of the same header are dropped. A `#line` directive after each
/// header keeps compiler messages at the including file's own line numbers.
fn expand_includes(dir: &std::path::Path, path: &std::path::Path) -> String {
    let mut seen = Vec::new();
    expand_into(dir, path, &mut seen)
}

/// [`expand_includes`] of `path`, with the headers already pasted in `seen`.
fn expand_into(dir: &std::path::Path, path: &std::path::Path, seen: &mut Vec<String>) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        let header = line.trim().strip_prefix("#include \"").and_then(|r| r.strip_suffix('"'));
        match header {
            Some(h) if h.ends_with(".cuh") => {
                if !seen.iter().any(|s| s == h) {
                    seen.push(h.to_string());
                    let hp = dir.join(h);
                    println!("cargo:rerun-if-changed={}", hp.display());
                    out += &format!("#line 1 \"{h}\"\n");
                    out += &expand_into(dir, &hp, seen);
                }
                out += &format!("#line {} \"{file}\"\n", i + 2);
            }
            _ => {
                out += line;
                out.push('\n');
            }
        }
    }
    out
}

/// Kernel names in a preprocessed kernel file: `extern "C" void sg_…(`
/// (`__global__` expands to nothing in the emulator).
#[cfg_attr(not(feature = "cuda-emu"), allow(dead_code))]
fn kernel_names(expanded: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expanded;
    while let Some(i) = rest.find("extern \"C\"") {
        rest = &rest[i + 10..];
        let head = rest.trim_start();
        let Some(after) = head.strip_prefix("void") else { continue };
        let after = after.trim_start();
        let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        // `sg_emu_*` are the emulator's own declarations (sg_emu.h), not kernels.
        let kernel = name.starts_with("sg_") && !name.starts_with("sg_emu_");
        if kernel && after[name.len()..].trim_start().starts_with('(') && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

#[cfg(feature = "cuda-emu")]
fn emulator(out: &Path, dir: &Path, files: &[PathBuf]) {
    let header = dir.join("emu").join("sg_emu.h");
    let runtime = dir.join("emu").join("runtime.cpp");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed={}", runtime.display());
    println!("cargo:rerun-if-env-changed=SHARDGRAPH_EMU_SANITIZE");
    let sanitize = std::env::var("SHARDGRAPH_EMU_SANITIZE").ok();
    let sanitize_alignment = sanitize.as_deref() == Some("alignment");
    if let Some(other) = sanitize.as_deref().filter(|v| !v.is_empty() && *v != "alignment") {
        println!("cargo:warning=SHARDGRAPH_EMU_SANITIZE={other:?} ignored: the one check is `alignment` (UBSan, GCC's libubsan)");
    }
    if sanitize_alignment {
        println!("cargo:rustc-link-lib=ubsan");
    }
    let base = || {
        let mut b = cc::Build::new();
        b.cpp(true)
            .std("c++17")
            .opt_level(2)
            .warnings(false)
            // Kernels pun through byte pointers and rely on unfused IEEE operations.
            .flag("-fno-strict-aliasing")
            .flag("-ffp-contract=off")
            .flag("-fno-fast-math");
        if sanitize_alignment {
            // A GPU faults on a misaligned access (CUDA_ERROR_MISALIGNED_ADDRESS)
            // that an x86 host forgives: with SHARDGRAPH_EMU_SANITIZE=alignment
            // the emulator aborts on the first one, naming the kernel's line.
            b.flag("-fsanitize=alignment").flag("-fno-sanitize-recover=alignment");
        }
        b
    };
    let hip_header = dir.join("..").join("kernels-hip").join("sg_hip.h");
    println!("cargo:rerun-if-changed={}", hip_header.display());
    // Variant 0: as CUDA compiles the files (32-wide warps); variant 1: as
    // HIP compiles them for a CDNA GPU (the portability header in front,
    // 64-wide waves), so the wave-64 paths run in the tests too.
    let variants = [("k", "", 0), ("h", "#define SG_WARP 64\n", 1)];
    let mut build = base();
    let mut units = Vec::new();
    for p in files {
        let fam = p.file_stem().and_then(|s| s.to_str()).expect("file name").to_string();
        let probe = out.join(format!("emu_probe_{fam}.cpp"));
        std::fs::write(
            &probe,
            format!("#include {:?}\n#include {:?}\n", header.display().to_string(), p.display().to_string()),
        )
        .expect("write probe");
        let expanded = base().file(&probe).expand();
        let names = kernel_names(&String::from_utf8_lossy(&expanded));
        assert!(!names.is_empty(), "no kernels found in {}", p.display());
        let src = std::fs::read_to_string(p).expect("read kernel file");
        // Block barriers or shuffles (directly or through the shared
        // reductions): the threads run as fibers.
        let cooperative = ["__syncthreads", "__shfl", "sg_shfl_xor", "sg_sum32", "sg_warp_reduce", "sg_block_"]
            .iter()
            .any(|k| src.contains(k)) as i32;
        for &(tag, defs, variant) in &variants {
            // The HIP variant: the portability header in front, and every
            // kernel renamed (`extern "C"` names are one entity whatever
            // the namespace, so the two copies need distinct names; the
            // table keeps the kernel's own name).
            let hip = if variant == 1 {
                let mut h = format!("#include {:?}\n", hip_header.display().to_string());
                for n in &names {
                    h += &format!("#define {n} {n}__hip\n");
                }
                h
            } else {
                String::new()
            };
            let ns = format!("sg_emu_{tag}_{fam}");
            let mut tu = format!(
                "#include {:?}\n{defs}namespace {ns} {{\n{hip}#include {:?}\nconst sg_emu_entry table[] = {{\n",
                header.display().to_string(),
                p.display().to_string()
            );
            for n in &names {
                tu += &format!("    {{\"{n}\", [](void **a) {{ sg_emu_call({n}, a); }}, {cooperative}}},\n");
            }
            tu += &format!(
                "}};\n}}\nextern \"C\" const sg_emu_entry *{ns}_table(std::size_t *n) {{\n    *n = {};\n    return {ns}::table;\n}}\n",
                names.len()
            );
            let tu_path = out.join(format!("emu_{tag}_{fam}.cpp"));
            std::fs::write(&tu_path, tu).expect("write emulator unit");
            build.file(&tu_path);
            units.push((ns, variant));
        }
    }
    let mut reg = format!("#include {:?}\n#include <vector>\n", header.display().to_string());
    for (ns, _) in &units {
        reg += &format!("extern \"C\" const sg_emu_entry *{ns}_table(std::size_t *n);\n");
    }
    reg += "extern \"C\" const sg_emu_entry *sg_emu_entries(int variant, std::size_t *n) {\n";
    for &(_, _, variant) in &variants {
        reg += &format!("    static std::vector<sg_emu_entry> v{variant} = [] {{\n        std::vector<sg_emu_entry> v;\n        std::size_t k = 0;\n");
        for (ns, _) in units.iter().filter(|u| u.1 == variant) {
            reg += &format!("        {{ const sg_emu_entry *t = {ns}_table(&k); v.insert(v.end(), t, t + k); }}\n");
        }
        reg += "        return v;\n    }();\n";
        reg += &format!("    if (variant == {variant}) {{\n        *n = v{variant}.size();\n        return v{variant}.data();\n    }}\n");
    }
    reg += "    *n = 0;\n    return nullptr;\n}\n";
    let reg_path = out.join("emu_registry.cpp");
    std::fs::write(&reg_path, reg).expect("write registry");
    build.file(&reg_path).file(&runtime).compile("sg_cuda_emu");
}
