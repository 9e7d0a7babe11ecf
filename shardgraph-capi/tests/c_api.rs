//! The C ABI from C: `tests/c/tp.c` compiled with the system's `cc` against
//! `include/shardgraph.h` and the `libshardgraph_capi` cdylib that cargo
//! builds with this test (it sits next to the test executable, in
//! `target/<profile>/deps`, and is uplifted to `target/<profile>`), then
//! run:
//!
//! * a SwiGLU FFN with Q8_0 weights split on rows/columns, a residual and a
//!   vocabulary-split head into soft_max/argmax/top_k, planned on 3 CPU
//!   devices with tensor split 2,1,1 by name rules, against the same graph
//!   on 1 device (soft_max NMSE < 1e-6, identical argmax and top_k), and the
//!   error paths (bad type ids, NULL pointers, a mul_mat shape mismatch, a
//!   tensor of another context, bad enums, a split rule the planner refuses,
//!   wrong output counts) each with its code and message;
//! * the same graph on devices opened by name (emulated GPUs with the
//!   `cuda-emu` feature, `SHARDGRAPH_CAPI_DEVICES` to choose, e.g. real
//!   GPUs), against the first of them alone;
//! * the engine on generated GGUF files (a `qwen3` target whose greedy
//!   continuation is a known permutation chain and a DFlash2 drafter built
//!   to follow it): greedy tokens from C on 2 devices with the drafter equal
//!   the permutation chain, the Rust engine's on 1 device, and plain
//!   decoding from C.
//!
//! Also: the README's example compiles and prints the right product; the
//! header declares exactly the functions the library exports and
//! the source defines (both directions), and every function the op table
//! (`op_table`) names, its status codes are the crate's,
//! the C structs have the Rust layouts, and the header compiles as C99 and
//! C++.
//!
//! The C compiler (`cc`) is required. Without a C++ compiler (`c++`) or
//! binutils' `nm` those checks say they are skipped, unless
//! `SHARDGRAPH_REQUIRE_CXX` is set (as `.ci/run` does), when they fail
//! (`tests/common/require.rs` of the workspace root).

use shardgraph::split::Devices;
use shardgraph::GgmlType;
use shardgraph_capi::engine::{SgEngineParams, SgGenerateOptions, SgSamplerParams, SgSpecStats};
use shardgraph_capi::graph::SgRopeParams;
use shardgraph_capi::sg_status;
use shardgraph_models::dflash::DflashHparams;
use shardgraph_models::engine::{DraftModel, Engine, EngineParams};
use shardgraph_models::generate::{permutation, write_dflash_gguf_with, write_qwen3_gguf_with, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::Qwen3Hparams;
use shardgraph_models::sampling::SamplerParams;
use shardgraph_models::types::TensorTypes;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

#[path = "../../tests/common/require.rs"]
mod require;
use require::Tool;

/// The workspace root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the crate is in the workspace").to_path_buf()
}

fn header() -> PathBuf {
    workspace().join("include").join("shardgraph.h")
}

/// `libshardgraph_capi.so` (`.dylib` on macOS).
fn lib_file() -> String {
    format!("{}shardgraph_capi{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// The folder holding the cdylib built with this test: cargo compiles the
/// library once for both crate types, so `cargo test` leaves the cdylib in
/// `target/<profile>/deps` next to this executable (and a copy in
/// `target/<profile>`). Built with `cargo build` if neither has it.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the executable's folder").to_path_buf();
    let candidates = [deps.clone(), deps.parent().map(Path::to_path_buf).unwrap_or_else(|| deps.clone())];
    if let Some(d) = candidates.iter().find(|d| d.join(lib_file()).is_file()) {
        return d.clone();
    }
    let release = deps.parent().and_then(Path::file_name).is_some_and(|p| p == "release");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(workspace()).args(["build", "-p", "shardgraph-capi"]);
    if release {
        cmd.arg("--release");
    }
    let st = cmd.status().expect("running cargo build");
    assert!(st.success(), "cargo build -p shardgraph-capi failed");
    candidates.into_iter().find(|d| d.join(lib_file()).is_file()).expect("the cdylib after cargo build")
}

/// A private copy of the cdylib, made once per test process, that the C
/// programs link and load: every build in the target folder writes the one
/// `deps/libshardgraph_capi.so` (its name has no hash), so a build running
/// next to this test (other features, another package's tests) could
/// replace it between linking and loading.
fn lib_copy() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_api-lib-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder for the library");
        let from = lib_dir().join(lib_file());
        std::fs::copy(&from, dir.join(lib_file())).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
        dir
    })
}

/// A command running the C program `exe` with the library copy: without
/// cargo's `LD_LIBRARY_PATH` (it names `target/<profile>/deps`, and the
/// loader prefers it to the program's run path).
fn c_command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.env_remove("LD_LIBRARY_PATH").env_remove("DYLD_LIBRARY_PATH").env_remove("DYLD_FALLBACK_LIBRARY_PATH");
    cmd
}

/// Runs `cmd`, returning stdout; panics with both streams on failure.
fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    stdout
}

/// `tests/c/tp.c` compiled once per test process.
fn tp() -> &'static Path {
    static TP: OnceLock<PathBuf> = OnceLock::new();
    TP.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_api-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder for the C program");
        let exe = dir.join("tp");
        let lib = lib_copy();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("c").join("tp.c");
        let mut cc = Command::new("cc");
        cc.args(["-std=c99", "-O1", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
            .arg(workspace().join("include"))
            .arg(&src)
            .arg("-L")
            .arg(lib)
            .arg("-lshardgraph_capi")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lm")
            .arg("-o")
            .arg(&exe);
        run_ok(&mut cc, "cc tests/c/tp.c");
        exe
    })
}

/// The header without comments.
fn header_code() -> String {
    let text = std::fs::read_to_string(header()).expect("include/shardgraph.h");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("/*") {
            rest = r.find("*/").map_or("", |i| &r[i + 2..]);
            out.push(' ');
        } else if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The `sg_*` functions the header declares (identifiers followed by `(`).
fn header_functions() -> BTreeSet<String> {
    let code = header_code();
    let mut names = BTreeSet::new();
    for (i, _) in code.match_indices("sg_") {
        if code[..i].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let name: String = code[i..].chars().take_while(|&c| is_ident(c)).collect();
        if code[i + name.len()..].trim_start().starts_with('(') {
            names.insert(name);
        }
    }
    names
}

/// The `sg_*` functions the crate's source defines: `extern "C" fn sg_x`
/// and the op macros' `sg_x => method;` entries.
fn source_functions() -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("src/") {
        let path = entry.expect("a source file").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file");
        for line in text.lines() {
            let t = line.trim();
            let name = if let Some(i) = t.find("extern \"C\" fn sg_") {
                &t[i + "extern \"C\" fn ".len()..]
            } else if t.starts_with("sg_") && t.contains(" => ") && t.ends_with(';') {
                t
            } else {
                continue;
            };
            names.insert(name.chars().take_while(|&c| is_ident(c)).collect());
        }
    }
    names
}

/// The `sg_*` symbols the built library exports (`nm -D`), if `nm` runs;
/// `None` after saying `test` skips the comparison (a failure when
/// `SHARDGRAPH_REQUIRE_CXX` is set).
fn exported_functions(test: &str) -> Option<BTreeSet<String>> {
    let lib = lib_copy().join(lib_file());
    let what = format!("c_api {test}: exports against `nm -D`");
    let out = require::or_skip(
        Tool::Cxx,
        &what,
        Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output().map_err(|e| format!("nm: {e}")),
    )?;
    if !out.status.success() {
        let why = format!("nm -D {} failed: {}", lib.display(), String::from_utf8_lossy(&out.stderr));
        require::missing(Tool::Cxx, &what, &why);
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some(
        text.lines()
            .filter_map(|l| l.split_whitespace().last())
            .map(|s| s.trim_start_matches('_'))
            .filter(|s| s.starts_with("sg_"))
            .map(str::to_string)
            .collect(),
    )
}

fn diff(a: &BTreeSet<String>, b: &BTreeSet<String>) -> Vec<String> {
    a.difference(b).cloned().collect()
}

#[test]
fn header_declares_exactly_the_exported_functions() {
    let declared = header_functions();
    let defined = source_functions();
    assert!(declared.len() > 100, "only {} functions parsed from the header", declared.len());
    assert_eq!(
        declared,
        defined,
        "header without definition: {:?}; defined, not in the header: {:?}",
        diff(&declared, &defined),
        diff(&defined, &declared)
    );
    if let Some(exported) = exported_functions("header_declares_exactly_the_exported_functions") {
        assert_eq!(
            declared,
            exported,
            "declared, not exported: {:?}; exported, not declared: {:?}",
            diff(&declared, &exported),
            diff(&exported, &declared)
        );
    }
    eprintln!("{} functions in the header, the source and the library", declared.len());
}

/// Every function the op table names (`shardgraph_capi::op_table`, one
/// exhaustive match over `Op`) is declared in the header and exported by
/// the library, and no row that has C constructors names none.
#[test]
fn the_op_tables_functions_are_declared_and_exported() {
    use shardgraph_capi::op_table::{CAbi, OP_ROWS};
    let declared = header_functions();
    let exported = exported_functions("the_op_tables_functions_are_declared_and_exported");
    let mut n = 0;
    for row in OP_ROWS {
        if let CAbi::Fns(fns) = row.c {
            assert!(!fns.is_empty(), "{}: no function named", row.pattern);
        }
        for &f in row.c.functions() {
            assert!(declared.contains(f), "{}: {f} is not declared in include/shardgraph.h", row.pattern);
            if let Some(e) = &exported {
                assert!(e.contains(f), "{}: the library does not export {f}", row.pattern);
            }
            n += 1;
        }
    }
    eprintln!("{} op rows, {n} op functions, all in the header and the library", OP_ROWS.len());
}

#[test]
fn header_status_codes_are_the_crates() {
    let code = header_code();
    let start = code.find("typedef enum sg_status").expect("the sg_status enum");
    let body = &code[start..code[start..].find('}').map(|i| start + i).expect("the enum's end")];
    let body = &body[body.find('{').expect("the enum's body") + 1..];
    let in_header: Vec<(String, i32)> = body
        .split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (n, v) = e.split_once('=').unwrap_or_else(|| panic!("{e:?} has no explicit value"));
            (n.trim().to_string(), v.trim().parse().unwrap_or_else(|_| panic!("{e:?}: not a number")))
        })
        .collect();
    let in_crate: Vec<(String, i32)> = sg_status::ALL.iter().map(|s| (format!("{s:?}"), *s as i32)).collect();
    assert_eq!(in_header, in_crate);
}

#[test]
fn header_compiles_as_c99_and_cpp() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_api-hdr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder");
    let src = dir.join("h.c");
    std::fs::write(&src, "#include \"shardgraph.h\"\nint main(void) { return SG_OK; }\n").expect("h.c");
    let inc = workspace().join("include");
    run_ok(
        Command::new("cc")
            .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-I"])
            .arg(&inc)
            .arg(&src),
        "cc -std=c99 shardgraph.h",
    );
    let cxx = match Command::new("c++").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("`c++ --version` failed: {}", String::from_utf8_lossy(&o.stderr))),
        Err(e) => Err(format!("c++: {e}")),
    };
    if require::or_skip(Tool::Cxx, "c_api header_compiles_as_c99_and_cpp: the C++ check", cxx).is_some() {
        run_ok(
            Command::new("c++")
                .args(["-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-x", "c++", "-I"])
                .arg(&inc)
                .arg(&src),
            "c++ shardgraph.h",
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn readme_example_compiles_and_prints_the_product() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).expect("README.md");
    let start = readme.find("```c\n").expect("a C example in the README") + "```c\n".len();
    let code = &readme[start..start + readme[start..].find("```").expect("the example's end")];
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_api-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder");
    let (src, exe) = (dir.join("example.c"), dir.join("example"));
    std::fs::write(&src, code).expect("example.c");
    let lib = lib_copy();
    run_ok(
        Command::new("cc")
            .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
            .arg(workspace().join("include"))
            .arg(&src)
            .arg("-L")
            .arg(lib)
            .arg("-lshardgraph_capi")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-o")
            .arg(&exe),
        "cc README example",
    );
    // w = the first 3 rows of the identity: y = x's first 3 values per column.
    assert_eq!(run_ok(&mut c_command(&exe), "README example").trim(), "1 2 3 5 6 7");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The value after `key` on the line starting with `prefix`.
fn field<'a>(out: &'a str, prefix: &str, key: &str) -> &'a str {
    let line = out.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} line in:\n{out}"));
    let rest = &line[line.find(key).unwrap_or_else(|| panic!("no {key:?} in {line:?}")) + key.len()..];
    rest.split_whitespace().next().unwrap_or("")
}

#[test]
fn c_program_runs_a_tensor_parallel_graph_and_its_error_paths() {
    let start = std::time::Instant::now();
    let out = run_ok(&mut c_command(tp()), "tp");
    println!("{out}");
    assert!(out.contains("ALL OK (0 failed checks)"), "{out}");
    // The struct layouts C sees are the Rust ones.
    let size = |key: &str| field(&out, "layout:", key).parse::<usize>().expect("a size");
    assert_eq!(size("sg_rope_params "), std::mem::size_of::<SgRopeParams>());
    assert_eq!(size("sg_engine_params "), std::mem::size_of::<SgEngineParams>());
    assert_eq!(size("sg_sampler_params "), std::mem::size_of::<SgSamplerParams>());
    assert_eq!(size("sg_sampler_params.seed "), std::mem::offset_of!(SgSamplerParams, seed));
    assert_eq!(size("sg_spec_stats "), std::mem::size_of::<SgSpecStats>());
    assert_eq!(size("sg_status "), std::mem::size_of::<sg_status>());
    assert_eq!(size("sg_generate_options "), std::mem::size_of::<SgGenerateOptions>());
    assert_eq!(size("sg_generate_options.on_token "), std::mem::offset_of!(SgGenerateOptions, on_token));
    // The split run: a plan report, bytes moved as planned, the numbers checked in C.
    assert!(out.contains("--- plan on 3 devices ---") && out.contains("all-reduce"), "{out}");
    let nmse: f64 = field(&out, "soft_max NMSE", "device: ").parse().expect("the NMSE");
    assert!(nmse < 1e-6, "NMSE {nmse}");
    assert!(out.contains("argmax identical: yes"), "{out}");
    let moved: u64 = field(&out, "3 devices (CPU x3, split 2,1,1)", "repartitions, ").parse().expect("bytes moved");
    assert!(moved > 0, "{out}");
    // Every error path printed its code and message.
    for code in [
        sg_status::SG_ERR_INVALID_ARGUMENT,
        sg_status::SG_ERR_INVALID_OPERAND,
        sg_status::SG_ERR_FOREIGN_TENSOR,
        sg_status::SG_ERR_SHAPE,
        sg_status::SG_ERR_UNSUPPORTED,
        sg_status::SG_ERR_SPLIT,
    ] {
        assert!(out.contains(&format!("error ok: {} ", code as i32)), "{code:?} not seen:\n{out}");
    }
    eprintln!("tp: NMSE {nmse:.3e}, {moved} bytes moved, {:.2} s", start.elapsed().as_secs_f64());
}

/// The same graph on devices opened by name through `sg_devices_open`:
/// `SHARDGRAPH_CAPI_DEVICES` if set (e.g. `CUDA0,CUDA0,CUDA0` on a GPU
/// machine), else an emulated NVIDIA GPU, a CPU and an emulated AMD GPU
/// when the library has the `cuda-emu` feature (the C program asks it:
/// `sg_build_features`), else three CPU devices; against the first device
/// alone.
#[test]
fn c_program_runs_the_graph_on_devices_opened_by_name() {
    let names = std::env::var("SHARDGRAPH_CAPI_DEVICES").unwrap_or_else(|_| "auto".to_string());
    let start = std::time::Instant::now();
    let out = run_ok(c_command(tp()).arg("devices").arg(&names), "tp devices");
    println!("{out}");
    assert!(out.contains("ALL OK (0 failed checks)"), "{out}");
    let features = field(&out, "features:", "features: ").trim_matches('"').to_string();
    let emu = features.split(',').any(|f| f == "cuda-emu");
    if emu != cfg!(feature = "cuda-emu") {
        // One cdylib file per target folder whatever the features: a build
        // with other features since this test's build replaced it.
        eprintln!("note: the library has features {features:?}, this test was built with others");
    }
    let names = match names.as_str() {
        "auto" if emu => "EMU,CPU,EMUHIP".to_string(),
        "auto" => "CPU,cpu,CPU".to_string(),
        n => n.to_string(),
    };
    assert!(out.contains(&format!("({names}): ")), "{out}");
    let nmse: f64 = field(&out, "soft_max NMSE", "device: ").parse().expect("the NMSE");
    assert!(nmse < 1e-6, "{names}: NMSE {nmse}");
    assert!(out.contains("argmax identical: yes"), "{out}");
    eprintln!("tp devices {names}: NMSE {nmse:.3e}, {:.2} s", start.elapsed().as_secs_f64());
}

fn tokens(out: &str, prefix: &str) -> Vec<i32> {
    let line = out.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} in:\n{out}"));
    line[prefix.len() + 1..].split_whitespace().map(|t| t.parse().expect("a token")).collect()
}

#[test]
fn c_program_generates_with_the_engine() {
    let start = std::time::Instant::now();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_api-engine-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder for the models");
    let (target, drafter) = (dir.join("qwen3.gguf"), dir.join("dflash2.gguf"));
    let hp = Qwen3Hparams { core: HparamsCore::qwen3(2, 128, 256, 6, 3, 32), n_vocab: 200, n_ctx_train: 4096 };
    let seed = 23;
    write_qwen3_gguf_with(&target, &hp, &TensorTypes::uniform(GgmlType::Q8_0), seed, Weights::Permutation)
        .expect("the target GGUF");
    // A DFlash2 drafter built to follow the permutation target of the same seed.
    let dhp = DflashHparams {
        core: HparamsCore::qwen3(2, hp.core.n_embd, hp.n_vocab.max(256), 4, 2, 32),
        target_layers: vec![1, hp.core.n_layer],
        target_hidden: hp.core.n_embd,
        block_size: 6,
        mask_token: (hp.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((32, 8)),
    };
    write_dflash_gguf_with(
        &drafter,
        &dhp,
        &TensorTypes::uniform(GgmlType::Q8_0),
        hp.n_vocab,
        seed,
        Weights::Permutation,
    )
    .expect("the drafter GGUF");
    let prompt = [5, 77, 123, 9, 64];
    let n = 16;

    let mut cmd = c_command(tp());
    cmd.arg("engine").arg(&target).arg(&drafter).arg(n.to_string());
    cmd.args(prompt.iter().map(|t| t.to_string()));
    let out = run_ok(&mut cmd, "tp engine");
    println!("{out}");
    assert!(out.contains("ALL OK (0 failed checks)"), "{out}");
    let from_c = tokens(&out, "engine dflash 2 devices:");
    let plain_c = tokens(&out, "engine plain 1 device:");
    let mixed_kv_c = tokens(&out, "engine kv q8_0/f16 1 device:");

    // The permutation chain from the last prompt token.
    let perm = permutation(hp.n_vocab, seed);
    let mut chain = Vec::with_capacity(n);
    let mut t = i64::from(prompt[prompt.len() - 1]);
    for _ in 0..n {
        t = perm[t as usize];
        chain.push(t as i32);
    }
    // The Rust engine, plain greedy on one device.
    let devices = Devices::cpu(1, 1).expect("a CPU device");
    let params = EngineParams { ctx_size: (prompt.len() + n) as i64, ..EngineParams::default() };
    let mut e = Engine::load(&devices, &target, DraftModel::None, &params).expect("the Rust engine");
    let rust = e.generate(&prompt, n, &SamplerParams::greedy()).expect("Rust generation").tokens;

    assert_eq!(from_c, chain, "C (DFlash2, 2 devices) against the permutation chain");
    assert_eq!(from_c, rust, "C against the Rust engine");
    assert_eq!(plain_c, rust, "C plain decoding against the Rust engine");
    // K q8_0 and V f16 caches: the Rust engine with the same types.
    let mixed = EngineParams { cache_type_k: GgmlType::Q8_0, cache_type_v: GgmlType::F16, ..params };
    let mut e = Engine::load(&devices, &target, DraftModel::None, &mixed).expect("the Rust engine, mixed caches");
    let rust_mixed = e.generate(&prompt, n, &SamplerParams::greedy()).expect("Rust generation").tokens;
    assert_eq!(mixed_kv_c, rust_mixed, "C with K q8_0 / V f16 caches against the Rust engine");
    let accepted: u64 = field(&out, "stats:", "accepted ").parse().expect("accepted");
    let drafted: u64 = field(&out, "stats:", "drafted ").parse().expect("drafted");
    assert!(
        accepted * 2 >= drafted && drafted > 0,
        "a drafter that follows the target: {drafted} drafted, {accepted} accepted"
    );
    eprintln!(
        "engine from C: {n} tokens, {accepted}/{drafted} drafts accepted, {:.2} s",
        start.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
