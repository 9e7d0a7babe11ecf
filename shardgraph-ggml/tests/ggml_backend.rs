//! The library as ggml's own programs load it: ggml's `test-backend-ops`
//! (built by `scripts/setup.sh` from the llama.cpp tree of llama-cpp-python
//! 0.3.36, ggml 0.25.3) compares the `SG` backend with ggml's CPU backend
//! op by op, and llama.cpp (the set-up's llama-cpp-python) runs generated
//! qwen3 and qwen35 files with every layer on `SG`
//! (`scripts/llama-on-sg.py`), against its own CPU backend.
//!
//! Without the built tools or the venv the tests print `SKIPPED` and pass,
//! unless `SHARDGRAPH_REQUIRE_LLAMA_TOOLS` is set (as `.ci/run` does).

#[path = "../../tests/common/qwen35_tiny.rs"]
mod qwen35_tiny;
#[path = "../../tests/common/require.rs"]
mod require;

use require::{or_skip, Tool};
use shardgraph::GgmlType;
use shardgraph_models::generate::{write_qwen35_gguf_with, write_qwen3_gguf_with, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::Qwen3Hparams;
use shardgraph_models::types::TensorTypes;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// `libshardgraph_ggml.so`, which cargo builds with this test (the crate's
/// cdylib, in `target/<profile>/deps` next to the test and in
/// `target/<profile>`).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let deps = exe.parent().expect("deps").to_path_buf();
    [deps.join("libshardgraph_ggml.so"), deps.parent().expect("profile").join("libshardgraph_ggml.so")]
        .into_iter()
        .find(|p| p.is_file())
        .expect("cargo builds the cdylib with the tests")
}

/// ggml's `test-backend-ops` of the set-up, or why not.
fn test_backend_ops() -> Result<PathBuf, String> {
    let cache = std::env::var_os("SHARDGRAPH_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/shardgraph")))
        .ok_or("no HOME")?;
    let exe = cache.join("llama-0.3.36-build/bin/test-backend-ops");
    exe.is_file().then_some(exe.clone()).ok_or_else(|| format!("{} is missing (run ./scripts/setup.sh)", exe.display()))
}

/// The set-up's `llama-speculative-simple` (patched to take the prompt as
/// token ids and print one line per step), or why not.
fn speculative_simple() -> Result<PathBuf, String> {
    let dir = std::env::var_os("SHARDGRAPH_LLAMA_TOOLS").map(PathBuf::from).or_else(|| {
        let cache = std::env::var_os("SHARDGRAPH_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/shardgraph")))?;
        Some(cache.join("llama-tools"))
    });
    let exe = dir.ok_or("no HOME")?.join("build/bin/llama-speculative-simple");
    exe.is_file().then_some(exe.clone()).ok_or_else(|| format!("{} is missing (run ./scripts/setup.sh)", exe.display()))
}

/// Counts of one `test-backend-ops test -b SG -o <op>` run.
#[derive(Debug, Default)]
struct Counts {
    ok: usize,
    failed: usize,
    unsupported: usize,
}

fn run_ops(exe: &Path, op: &str, params: Option<&str>, devices: Option<&str>) -> (Counts, String) {
    let mut cmd = Command::new(exe);
    cmd.args(["test", "-b", "SG", "-o", op])
        .env("GGML_BACKEND_PATH", library())
        .env_remove("SHARDGRAPH_DEVICES")
        .env_remove("SHARDGRAPH_TENSOR_SPLIT");
    if let Some(d) = devices {
        cmd.env("SHARDGRAPH_DEVICES", d);
    }
    if let Some(p) = params {
        cmd.args(["-p", p]);
    }
    let out = cmd.output().expect("test-backend-ops runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let mut c = Counts::default();
    for l in text.lines() {
        if l.contains("not supported [SG]") {
            c.unsupported += 1;
        } else if l.ends_with("OK\u{1b}[0m") && l.contains('(') {
            c.ok += 1;
        } else if l.contains("FAIL") && l.contains('(') {
            c.failed += 1;
        }
    }
    assert!(out.status.success() || c.failed > 0, "test-backend-ops -o {op} exited with {}: {text}", out.status);
    (c, text)
}

/// ggml's own op tests, on one CPU device and on 2 CPU sub-devices, on
/// the ops the qwen3, qwen35 and DFlash2 graphs use (the long flash-attention and matrix suites filtered to the head
/// sizes and types those models have): every case SG supports equals
/// ggml's CPU backend within test-backend-ops' tolerances, and the ops the
/// models need are supported for their shapes.
#[test]
fn test_backend_ops_passes_on_sg() {
    let Some(exe) = or_skip(Tool::LlamaTools, "test_backend_ops_passes_on_sg", test_backend_ops()) else {
        return;
    };
    let ops: &[(&str, Option<&str>)] = &[
        ("ADD", None),
        ("MUL", None),
        ("SCALE", None),
        ("RMS_NORM", None),
        ("L2_NORM", None),
        ("SOFT_MAX", None),
        ("ROPE", Some("type=f32")),
        ("GET_ROWS", None),
        ("SET_ROWS", None),
        ("CONT", None),
        ("CPY", None),
        ("CONCAT", None),
        ("SILU", None),
        ("SIGMOID", None),
        ("SOFTPLUS", None),
        ("SWIGLU", None),
        ("SSM_CONV", None),
        ("GATED_DELTA_NET", None),
        ("MUL_MAT", Some("type_a=(f32|f16|q8_0|q4_K|q6_K),type_b=f32")),
        ("FLASH_ATTN_EXT", Some("hsk=128,hsv=128,.*kv=512,.*type_K=(f16|q8_0)")),
    ];
    let mut failures = Vec::new();
    // One CPU device: every op; 2 CPU sub-devices (the meta backend behind
    // SG): the ops of the models' graphs, the matrix and attention suites
    // narrowed to the models' types and GQA shape (the test's time).
    let meta: &[(&str, Option<&str>)] = &[
        ("ADD", None),
        ("MUL", None),
        ("RMS_NORM", None),
        ("SOFT_MAX", None),
        ("ROPE", Some("type=f32")),
        ("GET_ROWS", None),
        ("SET_ROWS", None),
        ("CPY", None),
        ("SWIGLU", None),
        ("MUL_MAT", Some("type_a=(q8_0|q4_K),type_b=f32")),
        ("FLASH_ATTN_EXT", Some("hsk=128,hsv=128,nh=4,nr23=\\[4,1\\],kv=512,.*type_K=f16")),
    ];
    let mut one_device = std::collections::HashMap::new();
    println!("{:<16} {:<8} {:>6} {:>6} {:>14}", "op", "devices", "passed", "failed", "not supported");
    for (devices, list) in [(None, ops), (Some("CPU,CPU"), meta)] {
        for &(op, params) in list {
            let (c, text) = run_ops(&exe, op, params, devices);
            let label = devices.unwrap_or("CPU");
            println!("{op:<16} {label:<8} {:>6} {:>6} {:>14}", c.ok, c.failed, c.unsupported);
            if c.failed > 0 {
                let lines: Vec<&str> = text.lines().filter(|l| l.contains("FAIL")).collect();
                failures.push(format!("{label}: {}", lines.join("\n")));
            }
            assert!(c.ok > 0, "{op} on {label}: no case ran on SG:\n{text}");
            if devices.is_none() {
                one_device.insert(op, c.ok);
            } else if op == "CPY" {
                // Over sub-devices SG takes every copy one device takes,
                // strided destinations too (llama.cpp's snapshot planes of
                // a recurrent cache with several sequence slots: refused
                // before, which aborted llama.cpp in ggml's scheduler).
                assert_eq!(Some(&c.ok), one_device.get(op), "CPY over sub-devices:\n{text}");
            }
        }
    }
    assert!(failures.is_empty(), "cases where SG differs from ggml's CPU backend:\n{}", failures.join("\n"));
}

/// A view of a view at non-zero offsets (`tests/c/view_of_view.c`, built
/// with `cc` against the pinned headers and the built libggml): SG computes
/// `2 · x[6..10]` = 12 14 16 18. ggml's `view_offs` of the inner view counts
/// from the storage owner, its op parameter from the outer view; reading
/// the wrong one was accepted by `supports_op` and then failed the compute.
#[test]
fn a_view_of_a_view_lands_on_ggmls_bytes() {
    let Some(text) = run_c_program("view_of_view", None) else { return };
    assert!(text.contains("status 0") && text.contains("y = 12 14 16 18"), "{text}");
}

/// `tests/c/llama_shapes.c`, on one device and on 2 sub-devices: two
/// shapes of llama.cpp's DFlash2 drafter graph that SG failed, `ggml_cast`
/// (a CPY whose destination is itself: the recursive source walk followed
/// it until the stack overflowed, a segfault) and a strided input leaf (the
/// scheduler's copy of a view input: refused at compute, so the drafter
/// gave no drafts), plus a chain of 30000 nodes, each with its exact result.
#[test]
fn deep_chains_casts_and_strided_inputs_compute_on_sg() {
    for devices in [None, Some("CPU,CPU")] {
        let Some(text) = run_c_program("llama_shapes", devices) else { return };
        let want = ["supports_op 1 1", "status 0", "y1 = 1 3 5 7", "y2 = 0.5 1.5 2.5 3.5", "y3 = 0 1 4 5 8 9"];
        assert!(want.iter().all(|w| text.contains(w)), "{devices:?}: {text}");
    }
}

/// `tests/c/async_events.c`, on one device and on 2 sub-devices: SG
/// reports asynchronous copies and events (llama.cpp's pipeline
/// parallelism needs both on every non-CPU device); `set_tensor_async` /
/// `get_tensor_async` round-trip bytes at an offset; an event is made,
/// recorded, waited for, synchronized and freed; and ggml's scheduler in
/// its parallel mode (4 copies of each input, events between the splits)
/// computes `y = 0.5 · (2x + x)` over SG and the CPU backend right on 6
/// steps with new inputs. (Before, SG had neither: no event, and
/// llama.cpp turned pipeline parallelism off beside SG.)
#[test]
fn asynchronous_copies_and_events_serve_the_parallel_scheduler() {
    for devices in [None, Some("CPU,CPU")] {
        let Some(text) = run_c_program("async_events", devices) else { return };
        let mut want = vec![
            "caps async 1 events 1".to_string(),
            "roundtrip = 0 2 3 4".to_string(),
            "events ok".to_string(),
            "copies 4 splits 3".to_string(),
        ];
        for k in 0..6 {
            let ys: Vec<String> = (0..8).map(|i| format!("{}", 1.5 * (i + 10 * k) as f64)).collect();
            want.push(format!("run {k}: y = {}", ys.join(" ")));
        }
        for w in &want {
            assert!(text.lines().any(|l| l == w), "{devices:?}: no line {w:?} in:\n{text}");
        }
    }
}

/// Compiles `tests/c/<name>.c` with `cc` against the pinned headers and the
/// set-up's libggml, runs it on the library (SG over `devices`, if given),
/// and returns its output; `None` when the tools are missing (skipped).
fn run_c_program(name: &str, devices: Option<&str>) -> Option<String> {
    let exe = or_skip(Tool::LlamaTools, name, test_backend_ops())?;
    let bin = exe.parent().expect("the build's bin folder").to_path_buf();
    let cache = bin.parent().and_then(Path::parent).expect("the cache folder");
    let include = cache.join("llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/include");
    let dir = std::env::temp_dir().join(format!("sg-ggml-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prog = dir.join(name);
    let out = Command::new("cc")
        .arg("-I")
        .arg(&include)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c")))
        .arg("-o")
        .arg(&prog)
        .arg(format!("-L{}", bin.display()))
        .args(["-lggml", "-lggml-base"])
        .arg(format!("-Wl,-rpath,{}", bin.display()))
        .output()
        .expect("cc runs");
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    let mut cmd = Command::new(&prog);
    cmd.arg(library()).env_remove("SHARDGRAPH_DEVICES").env_remove("SHARDGRAPH_TENSOR_SPLIT");
    if let Some(d) = devices {
        cmd.env("SHARDGRAPH_DEVICES", d);
    }
    let run = cmd.output().expect("the program runs");
    let _ = std::fs::remove_dir_all(&dir);
    Some(format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr)))
}

/// The set-up's python with llama-cpp-python 0.3.36, or why not.
fn python() -> Result<PathBuf, String> {
    let py = root().join(".venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import importlib.metadata as m, sys; sys.exit(m.version('llama_cpp_python') != '0.3.36')"])
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(py).ok_or_else(|| "no .venv with llama-cpp-python 0.3.36 (run ./scripts/setup.sh)".into())
}

/// llama.cpp with every layer on SG (one CPU device, and 2 and 3 CPU
/// sub-devices through the meta backend) gives its own CPU backend's logits
/// (NMSE ≤ 1e-3, the bound the issue sets; measured ~1e-5) and the same
/// greedy tokens over 32 steps, on a qwen3 file with llama.cpp's Q4_K_M
/// type mix, a tied Q8_0 qwen3 and a Q8_0 qwen35 hybrid (both with the
/// permutation weights, whose wide margins make the greedy tokens a sharp
/// test). The scheduler's graph splits are printed: llama.cpp keeps the
/// token embeddings on its CPU backend, so a step is at most 2 splits.
#[test]
fn llama_cpp_runs_models_on_sg() {
    let Some(py) = or_skip(Tool::LlamaTools, "llama_cpp_runs_models_on_sg", python()) else { return };
    let dir = std::env::temp_dir().join(format!("sg-ggml-models-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let q3 = Qwen3Hparams { core: HparamsCore::qwen3(2, 256, 512, 8, 4, 64), n_vocab: 320, n_ctx_train: 4096 };
    let q35 = qwen35_tiny::tiny();
    let files = [("qwen3-q4_k_m.gguf", 0), ("qwen3-tied-q8_0.gguf", 1), ("qwen35-q8_0.gguf", 2)];
    for (name, kind) in files {
        let path = dir.join(name);
        match kind {
            0 => write_qwen3_gguf_with(&path, &q3, &TensorTypes::llama_q4_k_m(2), 5, Weights::Permutation).map(|_| ()),
            1 => {
                write_qwen3_gguf_with(&path, &q3, &TensorTypes::uniform(GgmlType::Q8_0).tied(), 6, Weights::Permutation)
                    .map(|_| ())
            }
            _ => write_qwen35_gguf_with(&path, &q35, &TensorTypes::uniform(GgmlType::Q8_0), 7, Weights::Permutation)
                .map(|_| ()),
        }
        .expect("the GGUF");
        // One CPU device; 2 sub-devices 1:1 and 3 sub-devices 3:2:1
        // through the meta backend (llama.cpp's FFN split by name).
        // And llama.cpp's layer split over 2 sub-devices, and for the
        // hybrid (its recurrent layers too) over 3 sub-devices 1:0:1 (one
        // holds nothing).
        let mut configs = vec![
            (None, None, None),
            (Some("CPU,CPU"), None, None),
            (Some("CPU,CPU,CPU"), Some("3,2,1"), None),
            (Some("CPU,CPU"), None, Some("layer")),
        ];
        if kind == 2 {
            configs.push((Some("CPU,CPU,CPU"), Some("1,0,1"), Some("layer")));
        }
        if cfg!(feature = "cuda-emu") && kind == 1 {
            // Emulated GPU sub-devices (NVIDIA's 32-wide warps, a CDNA GPU's
            // 64-wide waves): the GPU backend's kernels and copies under
            // llama.cpp's graphs (slow: one file).
            configs.extend([(Some("EMU,EMU"), None, None), (Some("EMUHIP,EMUHIP"), None, None)]);
        }
        for (devices, split, mode) in configs {
            let mut cmd = Command::new(&py);
            cmd.arg(root().join("scripts/llama-on-sg.py"))
                .arg("--lib")
                .arg(library())
                .arg("--model")
                .arg(&path)
                .args(["--prompt", "11,205,3,99,42,310,7,64", "--n-gen", "32", "--json"])
                .env("SHARDGRAPH_GGML_VERBOSE", "1")
                .env_remove("SHARDGRAPH_DEVICES")
                .env_remove("SHARDGRAPH_TENSOR_SPLIT")
                .env_remove("SHARDGRAPH_SPLIT_MODE");
            if let Some(d) = devices {
                cmd.env("SHARDGRAPH_DEVICES", d);
            }
            if let Some(r) = split {
                cmd.env("SHARDGRAPH_TENSOR_SPLIT", r);
            }
            if let Some(m) = mode {
                cmd.env("SHARDGRAPH_SPLIT_MODE", m);
            }
            let out = cmd.output().expect("python runs");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name} on {devices:?}: {err}");
            let text = String::from_utf8_lossy(&out.stdout);
            let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default()).expect("json");
            let (nmse, steps) = (v["prompt_nmse"].as_f64().unwrap(), v["max_step_nmse"].as_f64().unwrap());
            let moved = err
                .lines()
                .find_map(|l| l.split(" bytes exchanged").next().filter(|_| l.contains("bytes exchanged")))
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
            println!(
                "{name} on {} {}: prompt NMSE {nmse:.3e}, steps max NMSE {steps:.3e}, splits {}, bytes exchanged {moved:?}",
                devices.unwrap_or("SG (1 CPU)"),
                mode.unwrap_or(""),
                v["splits"]
            );
            assert!(nmse <= 1e-3 && steps <= 1e-3, "{name} on {devices:?}: NMSE {nmse:e} / {steps:e} above 1e-3");
            assert!(v["tokens_equal"].as_bool().unwrap(), "{name} on {devices:?}: greedy tokens differ: {v}");
            let sg = v["splits"]["SG"].as_array().expect("SG's split counts");
            assert!(!sg.is_empty() && sg.iter().all(|s| s.as_u64().is_some_and(|n| n <= 2)), "{name}: splits {sg:?}");
            if devices.is_some() {
                // The FFN weights are split: each step all-reduces; the
                // layer split moves the hidden state at the boundary.
                assert!(moved.is_some_and(|b| b > 0), "{name} on {devices:?}: no bytes exchanged: {err}");
            }
            if kind == 2 && devices == Some("CPU,CPU") && mode.is_none() {
                // Every layer split end to end, the delta-net ones by key
                // heads too: exactly Megatron's two all-reduces of the
                // hidden state per layer and token (40 tokens, 4 layers,
                // 256 F32 each way between 2 sub-devices), nothing
                // gathered (the delta-net states were gathered before:
                // 443 906 048 B over a run on the qwen35 example).
                let want = 40 * q35.core.n_layer as u64 * 2 * (2 * q35.core.n_embd as u64 * 4);
                assert_eq!(moved, Some(want), "{name}: bytes exchanged");
            }
            if devices == Some("CPU,CPU") && mode.is_none() {
                state_roundtrip(&py, &path, name);
            }
            if devices.is_none() {
                pipeline_parallel(&py, &path, name);
            }
            if devices == Some("CPU,CPU") && mode.is_none() {
                restarts(&py, &path, name);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over 2 sub-devices with `SHARDGRAPH_GGML_MAX_GRAPHS=1`: the context
/// starts again at each new graph shape (the bound on what a long run of
/// changing shapes holds: 491 → 975 MB over 120 prompts of different
/// lengths before, 660 MB at most with the default of 64), the caches
/// written back to ggml's memory and uploaded again, and llama.cpp's
/// tokens and logits are still its CPU backend's.
fn restarts(py: &Path, model: &Path, name: &str) {
    let out = Command::new(py)
        .arg(root().join("scripts/llama-on-sg.py"))
        .arg("--lib")
        .arg(library())
        .arg("--model")
        .arg(model)
        .args(["--prompt", "11,205,3,99,42,310,7,64", "--n-gen", "8", "--json"])
        .env("SHARDGRAPH_DEVICES", "CPU,CPU")
        .env("SHARDGRAPH_GGML_MAX_GRAPHS", "1")
        .env("SHARDGRAPH_GGML_VERBOSE", "1")
        .env_remove("SHARDGRAPH_TENSOR_SPLIT")
        .env_remove("SHARDGRAPH_SPLIT_MODE")
        .output()
        .expect("python runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: restarts: {err}");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default()).expect("json");
    let n = err.lines().filter(|l| l.contains("the context starts again")).count();
    let (p, s) = (v["prompt_nmse"].as_f64().unwrap(), v["max_step_nmse"].as_f64().unwrap());
    println!("{name} with the context started again {n} time(s): prompt NMSE {p:.3e}, steps {s:.3e}");
    assert!(n >= 1, "{name}: the context never started again: {err}");
    // Tighter than the 1e-3 (measured ~3e-6): caches not written
    // back before the restart gave 5e-4 to 7e-4 with the tokens unchanged.
    assert!(p <= 5e-5 && s <= 5e-5 && v["tokens_equal"].as_bool() == Some(true), "{name}: {v}");
}

/// llama.cpp's pipeline parallelism with the devices [SG, SG] and
/// `--split-mode layer` (`tests/py/pipeline_parallel.py`): llama.cpp turns
/// it on (it needs asynchronous copies and events from every non-CPU
/// device; before, SG had neither and llama.cpp ran without it), and the
/// logits and greedy tokens equal its CPU backend's.
fn pipeline_parallel(py: &Path, model: &Path, name: &str) {
    let out = Command::new(py)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pipeline_parallel.py"))
        .arg(model)
        .arg(library())
        .env_remove("SHARDGRAPH_DEVICES")
        .env_remove("SHARDGRAPH_TENSOR_SPLIT")
        .env_remove("SHARDGRAPH_SPLIT_MODE")
        .output()
        .expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{name}: pipeline parallel: {text}{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default()).expect("json");
    let e = v["max_nmse"].as_f64().unwrap();
    println!("{name} on [SG, SG], llama.cpp's pipeline parallelism: {v}");
    assert_eq!(v["pipeline_parallel"].as_bool(), Some(true), "{name}: llama.cpp did not enable it: {v}");
    assert!(e <= 1e-3 && v["tokens_equal"].as_bool() == Some(true), "{name}: {v}");
}

/// One run of llama.cpp's speculative loop: its step lines, `n_drafted`,
/// `n_accept` and the decode speed it prints.
struct SpecRun {
    steps: Vec<String>,
    drafted: u64,
    accepted: u64,
    tokens_per_s: f64,
    log: String,
}

fn speculative_run(exe: &Path, target: &Path, drafter: &Path, devices: Option<&str>) -> SpecRun {
    let mut cmd = Command::new(exe);
    // The seeds' command (--spec-type draft-dflash, 6 drafts, 65536 cells
    // of q4_0 K and V), greedy, on the prompt as token ids.
    cmd.arg("-m").arg(target).arg("-md").arg(drafter);
    cmd.args(["--spec-type", "draft-dflash", "--spec-draft-n-max", "6", "--ctx-size", "65536"]);
    cmd.args(["--cache-type-k", "q4_0", "--cache-type-v", "q4_0", "-p", "11,400,789,1178,1567,1956,345,734"]);
    cmd.args(["-n", "48", "--temp", "0", "-t", "2"])
        .env_remove("SHARDGRAPH_DEVICES")
        .env_remove("SHARDGRAPH_TENSOR_SPLIT");
    if let Some(d) = devices {
        cmd.args(["--device", "SG", "--device-draft", "SG", "-ngl", "99", "-ngld", "99"]);
        cmd.env("GGML_BACKEND_PATH", library()).env("SHARDGRAPH_DEVICES", d).env("SHARDGRAPH_GGML_VERBOSE", "1");
    }
    let out = cmd.output().expect("llama-speculative-simple runs");
    let (stdout, log) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "llama-speculative-simple on {devices:?} exited with {}: {log}", out.status);
    let value =
        |key: &str| log.lines().find_map(|l| l.split_once(key).map(|(_, v)| v.trim().to_string())).unwrap_or_default();
    let speed = value("decoded").rsplit(' ').nth(1).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    SpecRun {
        steps: stdout.lines().filter(|l| l.starts_with("step ")).map(str::to_string).collect(),
        drafted: value("n_drafted =").parse().unwrap_or(0),
        accepted: value("n_accept  =").parse().unwrap_or(0),
        tokens_per_s: speed,
        log,
    }
}

/// The seeds' command through llama.cpp's own speculative loop: its DFlash2
/// drafter and qwen3 target with both models on SG over 2 CPU sub-devices
/// (1:1) run without an abort and give llama.cpp's one-CPU-device result
/// step for step (drafts, accepted counts, tokens). The files are the
/// example pair (`write_example_pair`: the drafter predicts the target's
/// permutation, so drafts are accepted and the loop is exercised).
#[test]
fn llama_cpp_dflash2_on_sg_sub_devices_equals_one_cpu_device() {
    let Some(exe) = or_skip(Tool::LlamaTools, "llama_cpp_dflash2_on_sg", speculative_simple()) else { return };
    let dir = std::env::temp_dir().join(format!("sg-ggml-dflash2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (target, drafter) = shardgraph_models::generate::write_example_pair(&dir).expect("the example pair");
    let cpu = speculative_run(&exe, &target, &drafter, None);
    let sg = speculative_run(&exe, &target, &drafter, Some("CPU,CPU"));
    for (name, r) in [("CPU", &cpu), ("SG = CPU,CPU", &sg)] {
        println!(
            "{name}: {} steps, drafted {}, accepted {} ({:.1} %), {:.1} tokens/s",
            r.steps.len(),
            r.drafted,
            r.accepted,
            100.0 * r.accepted as f64 / r.drafted.max(1) as f64,
            r.tokens_per_s
        );
    }
    assert!(cpu.drafted > 0 && cpu.accepted > 0, "llama.cpp drafted nothing on its CPU backend: {}", cpu.log);
    assert!(!cpu.steps.is_empty(), "no step lines (is llama-speculative-simple patched?)");
    assert_eq!(sg.steps, cpu.steps, "steps on SG differ from one CPU device:\n{}", sg.log);
    assert_eq!((sg.drafted, sg.accepted), (cpu.drafted, cpu.accepted));
    // Both models ran through the meta backend and exchanged bytes.
    let runs: Vec<&str> = sg.log.lines().filter(|l| l.contains("bytes exchanged between sub-devices")).collect();
    let busy = runs.iter().filter(|l| !l.contains(": 0 runs")).count();
    assert!(busy >= 2, "expected the target's and the drafter's SG backends to run: {runs:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// llama.cpp's sequence state saved and restored with every layer on SG
/// over 2 sub-devices (`tests/py/state_roundtrip.py`): the caches live in
/// the sub-devices' store, so ggml's `get_tensor`/`set_tensor` of them go
/// there; the restored context, and a new one the state is loaded into,
/// give the logits of a fresh context exactly (before, a qwen35 restore
/// left the recurrent state as it was, NMSE 5e-3, and a qwen3 snapshot
/// read the cache as first uploaded, NMSE 5e-4 to 1.6); so does a context
/// after another one was made and freed (before, any freed cache buffer
/// reset every sub-device store: NMSE 5e-4 to 1.3e-3); and so does a
/// sequence dropped and begun again in its cell, with 1 and 3 sequence
/// slots (before, llama.cpp's in-graph zeroing of a reused recurrent cell
/// wrote ggml's memory, not the store: the new sequence began from the old
/// one's state, NMSE 1.1e-4 on the qwen35 examples; the 3 slots keep 2
/// rollback snapshots each, whose strided copies SG refused over
/// sub-devices, which aborted llama.cpp in ggml's scheduler).
fn state_roundtrip(py: &Path, model: &Path, name: &str) {
    let out = Command::new(py)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/state_roundtrip.py"))
        .arg(model)
        .arg(library())
        .env("SHARDGRAPH_DEVICES", "CPU,CPU")
        .env_remove("SHARDGRAPH_TENSOR_SPLIT")
        .output()
        .expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{name}: state round trip: {text}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(lines.len(), 3, "{name}: {text}");
    for v in &lines[..2] {
        let (r, m) = (v["restored_nmse"].as_f64().unwrap(), v["moved_nmse"].as_f64().unwrap());
        let o = v["other_freed_nmse"].as_f64().unwrap();
        println!(
            "{name} state round trip on {}: restored NMSE {r:.3e}, moved NMSE {m:.3e}, after another context freed {o:.3e}",
            v["backend"]
        );
        assert!(r <= 1e-12 && m <= 1e-12, "{name}: the restored state differs from a fresh context: {v}");
        assert!(o <= 1e-12, "{name}: freeing another context changed this one's: {v}");
        for slots in [1, 3] {
            let u = v[format!("reused_{slots}_slots_nmse")].as_f64().unwrap();
            println!("{name} sequence begun again in a reused cell, {slots} slot(s): NMSE {u:.3e}");
            assert!(u <= 1e-12, "{name}: a sequence begun again in its cell ({slots} slots) differs: {v}");
        }
    }
    let e = lines[2]["sg_vs_cpu_nmse"].as_f64().unwrap();
    assert!(e <= 1e-3, "{name}: SG against the CPU backend NMSE {e:e}");
}
