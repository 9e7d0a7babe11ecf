//! llama.cpp as the model tests' oracle, through the set-up's
//! llama-cpp-python 0.3.36 (`./.venv`, installed by `scripts/setup.sh`):
//! its logits and greedy tokens on a GGUF ([`llama_cpp`], [`llama_cpp_kv`],
//! [`llama_cpp_runs`]) and its quantizer ([`quantize`], [`try_quantize`],
//! [`try_quantize_many`]), in python processes of their own (llama.cpp
//! aborts the process on some errors).
//!
//! Without the venv or the package a test calls [`python_or_skip`], which
//! prints `SKIPPED: <reason>` and lets it pass, unless
//! `SHARDGRAPH_REQUIRE_GGML` is set (as `.ci/run` does).
#![allow(dead_code)]

use shardgraph::GgmlType;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `.venv/bin/python` with `llama_cpp` (llama-cpp-python 0.3.36)
/// importable, or why not.
pub fn python() -> Result<PathBuf, String> {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv").join("bin").join("python");
    if !py.exists() {
        return Err("no .venv (run ./scripts/setup.sh)".into());
    }
    let out = Command::new(&py)
        .args(["-c", "import importlib.metadata as m; print(m.version('llama_cpp_python'))"])
        .output()
        .map_err(|e| e.to_string())?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || v != "0.3.36" {
        return Err(format!("llama-cpp-python 0.3.36 is not installed in .venv (found {v:?}; run ./scripts/setup.sh)"));
    }
    Ok(py)
}

/// [`python`], or `None` after printing `{test}: SKIPPED: <why>`.
///
/// # Panics
/// When `SHARDGRAPH_REQUIRE_GGML` is set and there is no python.
pub fn python_or_skip(test: &str) -> Option<PathBuf> {
    match python() {
        Ok(p) => Some(p),
        Err(why) => {
            println!("{test}: SKIPPED: {why}");
            assert!(std::env::var("SHARDGRAPH_REQUIRE_GGML").is_err(), "SHARDGRAPH_REQUIRE_GGML is set: {why}");
            None
        }
    }
}

/// What llama.cpp computed on one file: the logits of every position of
/// the prompt (one batch, `[prompt.len()][n_vocab]`), its greedy
/// continuation of `n_gen` tokens, and the logits of each of those tokens'
/// single-token steps (`steps[i]` after decoding `gen[i]`); or, for a
/// job with given tokens, those tokens in `gen`.
#[derive(Clone, Debug)]
pub struct LlamaRun {
    /// The prompt batch's logits, one row per position.
    pub logits: Vec<Vec<f32>>,
    /// The greedy tokens: `gen[0]` from the prompt's last row, `gen[i + 1]`
    /// from `steps[i]`.
    pub gen: Vec<i32>,
    /// The logits of the step that decoded `gen[i]`.
    pub steps: Vec<Vec<f32>>,
}

/// The script behind [`llama_cpp_runs`]: argv = a JSON list of jobs
/// `[path, forced tokens or null]`, the prompt (JSON), n_gen, type_k,
/// type_v; prints one JSON list of runs.
const RUN_SCRIPT: &str = r#"
import sys, json, ctypes, llama_cpp as L
jobs, toks, n_gen, type_k, type_v = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
L.llama_backend_init()
runs = []
for path, forced in jobs:
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(path.encode(), mp)
    assert model, f"llama.cpp could not load {path}"
    cp = L.llama_context_default_params()
    cp.n_ctx = 256; cp.n_batch = 256; cp.n_ubatch = 256; cp.n_threads = 2; cp.n_threads_batch = 2
    cp.type_k = type_k; cp.type_v = type_v; cp.flash_attn_type = 1  # K/V types as asked (ggml ids), flash attention on (as our graph)
    ctx = L.llama_init_from_model(model, cp)
    assert ctx, "llama.cpp could not create a context"
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    def decode(ids, start):
        b = L.llama_batch_init(len(ids), 0, 1)
        for i, t in enumerate(ids):
            b.token[i] = t; b.pos[i] = start + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1
        b.n_tokens = len(ids)
        rc = L.llama_decode(ctx, b)
        assert rc == 0, f"llama_decode returned {rc}"
        rows = [list(ctypes.cast(L.llama_get_logits_ith(ctx, i), ctypes.POINTER(ctypes.c_float))[:n_vocab]) for i in range(len(ids))]
        L.llama_batch_free(b)
        return rows
    rows = decode(toks, 0)
    gen, steps, last, pos = [], [], rows[-1], len(toks)
    for k in range(len(forced) if forced is not None else n_gen):
        t = forced[k] if forced is not None else max(range(n_vocab), key=lambda i: last[i])
        gen.append(t)
        last = decode([t], pos)[0]; pos += 1
        steps.append(last)
    runs.append({"logits": rows, "gen": gen, "steps": steps})
    L.llama_free(ctx)
    L.llama_model_free(model)
print(json.dumps(runs))
"#;

fn floats(v: &serde_json::Value) -> Vec<Vec<f32>> {
    let rows = v.as_array().expect("rows");
    rows.iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()).collect()
}

/// One file for [`llama_cpp_runs`]: its path, and the tokens to decode
/// after the prompt (`None`: llama.cpp's greedy tokens).
pub type Job = (PathBuf, Option<Vec<i32>>);

/// llama.cpp's [`LlamaRun`] of `prompt` and then, one token per step,
/// `n_gen` greedy tokens (or a job's given tokens, in `gen`) on each GGUF
/// of `jobs` (one python process for them all), with K and V caches of the
/// types `kv` (its context's `type_k` and `type_v`, flash attention on, 2
/// threads).
///
/// # Panics
/// If llama.cpp fails on a file (the message is its stderr).
pub fn llama_cpp_runs(
    py: &Path,
    jobs: &[Job],
    prompt: &[i32],
    n_gen: usize,
    kv: (GgmlType, GgmlType),
) -> Vec<LlamaRun> {
    let list: Vec<(&str, &Option<Vec<i32>>)> = jobs.iter().map(|(p, f)| (p.to_str().unwrap(), f)).collect();
    let out = Command::new(py)
        .args(["-c", RUN_SCRIPT, &serde_json::to_string(&list).unwrap(), &format!("{prompt:?}"), &n_gen.to_string()])
        .args([kv.0.id().to_string(), kv.1.id().to_string()])
        .output()
        .expect("run python");
    assert!(out.status.success(), "llama.cpp run failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(line).expect("json from llama.cpp");
    v.as_array()
        .expect("a list of runs")
        .iter()
        .map(|r| LlamaRun {
            logits: floats(&r["logits"]),
            gen: r["gen"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap() as i32).collect(),
            steps: floats(&r["steps"]),
        })
        .collect()
}

/// llama.cpp's logits for every position of `tokens` (one batch), and its
/// greedy continuation of `n_gen` tokens, from the GGUF at `path` (F32 K
/// and V caches).
pub fn llama_cpp(py: &Path, path: &Path, tokens: &[i32], n_gen: usize) -> (Vec<Vec<f32>>, Vec<i32>) {
    llama_cpp_kv(py, path, tokens, n_gen, (GgmlType::F32, GgmlType::F32))
}

/// [`llama_cpp`] with K and V caches of the types `kv` (its context's
/// `type_k` and `type_v`, flash attention on).
pub fn llama_cpp_kv(
    py: &Path,
    path: &Path,
    tokens: &[i32],
    n_gen: usize,
    kv: (GgmlType, GgmlType),
) -> (Vec<Vec<f32>>, Vec<i32>) {
    let run = llama_cpp_runs(py, &[(path.to_path_buf(), None)], tokens, n_gen, kv).remove(0);
    (run.logits, run.gen)
}

/// How llama.cpp's quantizer is asked to write a file beyond its file type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QuantExtra {
    /// `llama_model_quantize_default_params()` with the file type alone.
    None,
    /// With an importance matrix (`params.imatrix`): a made-up one, every
    /// weight matrix's columns weighted `0.5 + ((i·37) mod 11)·0.3` — what
    /// the types llama.cpp quantizes only with an importance matrix need.
    Imatrix,
    /// Every `blk.*` weight matrix of this type (`params.tt_overrides`,
    /// llama-quantize's `--tensor-type`): for types no file type picks for
    /// a dense model (MXFP4, NVFP4).
    Override(GgmlType),
}

/// The script behind [`try_quantize_many`]: argv = a JSON list of jobs
/// `[src, dst, ftype, imatrix (0/1), override type id (−1 for none)]`.
/// Before job `k` it writes `@@job k` to stderr (llama.cpp's log goes
/// there), after it `{"k": k, "rc": rc}` to stdout.
const QUANTIZE_SCRIPT: &str = r#"
import sys, json, ctypes, llama_cpp as L
L.llama_backend_init()
imatrices = {}
def imatrix(src):
    # A made-up importance matrix for every weight matrix of src (built once per file).
    if src not in imatrices:
        import gguf
        keep, ents = [], []
        for t in gguf.GGUFReader(src).tensors:
            if len(t.shape) < 2: continue
            ne0 = int(t.shape[0])
            vals = (ctypes.c_float * ne0)(*[0.5 + ((i * 37) % 11) * 0.3 for i in range(ne0)])
            name = t.name.encode(); keep += [vals, name]; ents.append((name, vals, ne0))
        arr = (L.llama_model_imatrix_data * (len(ents) + 1))()
        for k, (n, v, s) in enumerate(ents):
            arr[k].name = n; arr[k].data = ctypes.cast(v, ctypes.POINTER(ctypes.c_float)); arr[k].size = s
        keep.append(arr)
        imatrices[src] = (keep, ctypes.cast(arr, ctypes.POINTER(L.llama_model_imatrix_data)))
    return imatrices[src][1]
for k, (src, dst, ftype, imat, override) in enumerate(json.loads(sys.argv[1])):
    print(f"@@job {k}", file=sys.stderr, flush=True)
    p = L.llama_model_quantize_default_params()
    p.ftype = ftype; p.nthread = 2
    keep = []
    if imat:
        p.imatrix = imatrix(src)
    if override >= 0:
        ov = (L.llama_model_tensor_override * 2)()
        pat = rb"blk\..*\.weight"; keep.append(pat)
        ov[0].pattern = pat; ov[0].type = override
        keep.append(ov); p.tt_overrides = ctypes.cast(ov, ctypes.POINTER(L.llama_model_tensor_override))
    rc = L.llama_model_quantize(src.encode(), dst.encode(), p)
    print(json.dumps({"k": k, "rc": rc}), flush=True)
"#;

/// One file for [`try_quantize_many`]: llama.cpp's quantizer writes `src`
/// as file type `ftype` (`LLAMA_FTYPE_MOSTLY_*`) with `extra` to `dst`.
#[derive(Clone, Debug)]
pub struct QuantJob {
    /// The source GGUF (F16 or F32).
    pub src: PathBuf,
    /// Where the quantized file goes.
    pub dst: PathBuf,
    /// `LLAMA_FTYPE_MOSTLY_*`.
    pub ftype: u32,
    /// What beyond the file type.
    pub extra: QuantExtra,
}

/// llama.cpp's reason in its log of one job: the lines naming the failure
/// (e.g. "this quantization requires an imatrix!", "invalid output file
/// type"), else all of it.
fn refusal(log: &str, status: Option<i32>) -> String {
    let why: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed to quantize") || l.contains("offending tensor") || l.contains("target type"))
        .map(str::trim)
        .collect();
    if why.is_empty() {
        format!("{} (exit {status:?})", log.trim())
    } else {
        why.join("; ")
    }
}

/// Has llama.cpp's quantizer (`llama_model_quantize`) write each of `jobs`
/// — files whose types llama.cpp picks tensor by tensor — in one python
/// process (its start, a second or more, dominates a small file's time);
/// if llama.cpp aborts that process on a job, that job fails and the rest
/// go on in a new process.
///
/// Returns one result per job, in order: `Err` holds llama.cpp's refusal
/// (its log lines naming the failure) or how the process ended.
pub fn try_quantize_many(py: &Path, jobs: &[QuantJob]) -> Vec<Result<(), String>> {
    let mut results = Vec::with_capacity(jobs.len());
    while results.len() < jobs.len() {
        let rest = &jobs[results.len()..];
        let list: Vec<(&str, &str, u32, u8, i64)> = rest
            .iter()
            .map(|j| {
                let (imatrix, over) = match j.extra {
                    QuantExtra::None => (0, -1),
                    QuantExtra::Imatrix => (1, -1),
                    QuantExtra::Override(t) => (0, t.id() as i64),
                };
                (j.src.to_str().unwrap(), j.dst.to_str().unwrap(), j.ftype, imatrix, over)
            })
            .collect();
        let out = match Command::new(py).args(["-c", QUANTIZE_SCRIPT, &serde_json::to_string(&list).unwrap()]).output()
        {
            Ok(o) => o,
            Err(e) => {
                results.extend(rest.iter().map(|_| Err(format!("run python: {e}"))));
                break;
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The log of job k: from its marker to the next one.
        let logs: Vec<&str> = stderr.split("@@job ").skip(1).collect();
        let log = |k: usize| logs.get(k).map_or("", |l| l.split_once('\n').map_or("", |(_, rest)| rest));
        let done: Vec<i64> = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["rc"].as_i64())
            .collect();
        for (k, rc) in done.iter().enumerate() {
            results.push(if *rc == 0 { Ok(()) } else { Err(refusal(log(k), Some(*rc as i32))) });
        }
        if done.len() < rest.len() {
            // The process ended during job done.len(): that job failed.
            results.push(Err(refusal(log(done.len()), out.status.code())));
        }
    }
    results
}

/// [`try_quantize_many`] for one file.
///
/// # Errors
/// llama.cpp's refusal, or an abort.
pub fn try_quantize(py: &Path, src: &Path, dst: &Path, ftype: u32, extra: QuantExtra) -> Result<(), String> {
    let job = QuantJob { src: src.to_path_buf(), dst: dst.to_path_buf(), ftype, extra };
    try_quantize_many(py, &[job]).remove(0)
}

/// [`try_quantize`] without extras, which must succeed.
///
/// # Panics
/// If llama.cpp's quantizer fails.
pub fn quantize(py: &Path, src: &Path, dst: &Path, ftype: u32) {
    if let Err(e) = try_quantize(py, src, dst, ftype, QuantExtra::None) {
        panic!("llama.cpp's quantizer failed: {e}");
    }
}
