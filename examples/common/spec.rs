//! What the speculative-decoding examples share: the generated example
//! models, a progress display, and the measurement (plain greedy, then
//! speculative, on the same devices; optional check against one device).

#![allow(dead_code)] // each example uses part of it

use shardgraph::split::MetaExecutor;
use shardgraph::{Backend, GgmlType};
use shardgraph_models::dflash::DflashHparams;
use shardgraph_models::fit::{fit_ctx_size, FitSpec, CTX_STEP};
use shardgraph_models::generate::{write_dflash_gguf_with, write_qwen35_gguf_with, Weights};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen35::{Qwen35Hparams, Qwen35Types};
use shardgraph_models::runner::Runner;
use shardgraph_models::speculative::{generate, Drafter, SpecParams, SpecStats, Target};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The value after option `name`, if given.
pub fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

/// Option `name` parsed, or `default`; exits with a message on a bad value.
pub fn parsed<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    match arg(args, name) {
        None => default,
        Some(v) => v.parse().unwrap_or_else(|_| {
            eprintln!("{name} {v}: not a valid value");
            std::process::exit(2)
        }),
    }
}

/// Prints usage for `--help` (and exits), or exits on an unknown option or
/// a missing value; `options` take a value, `--verify` does not.
pub fn check_options(args: &[String], example: &str, options: &[&str]) {
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--help" | "-h" => {
                let usage: Vec<String> = options.iter().map(|o| format!("[{o} V]")).collect();
                println!("usage: {example} [--verify] {}", usage.join(" "));
                println!("(see the doc comment of examples/{example}.rs for what each does)");
                std::process::exit(0);
            }
            "--verify" => i += 1,
            a if options.contains(&a) && i + 1 < args.len() => {
                if args[i + 2..].iter().any(|b| b == a) {
                    eprintln!("{a} is given more than once");
                    std::process::exit(2);
                }
                i += 2
            }
            a => {
                eprintln!("unknown option or missing value: {a} (try --help)");
                std::process::exit(2);
            }
        }
    }
    if let Some(list) = arg(args, "--device") {
        device_names(&list);
    }
}

/// The most devices a tensor split takes (the library's limit).
pub const MAX_DEVICES: usize = 64;

/// `--devices`, `--tensor-split` and `--split-mode` (llama.cpp's: `none` is
/// one device, and the other two are then ignored): the tensor-split
/// ratios, one per device, and the mode. The device count is `--devices`,
/// else the number of `--device` names, else the number of `--tensor-split`
/// ratios, else `default_n`. Exits with a message on bad values.
pub fn devices(args: &[String], default_n: usize) -> (Vec<f32>, String) {
    let fail = |m: String| -> ! {
        eprintln!("{m}");
        std::process::exit(2)
    };
    let mode = arg(args, "--split-mode").unwrap_or_else(|| "tensor".into());
    match mode.as_str() {
        "tensor" => {}
        // The whole model on the main device.
        "none" => return (vec![1.0], mode),
        other => fail(format!("--split-mode {other}: use none or tensor")),
    }
    let listed = arg(args, "--device").map(|l| l.split(',').count());
    let split: Option<Vec<f32>> =
        arg(args, "--tensor-split").map(|s| s.split(',').map(|x| x.trim().parse().unwrap_or(f32::NAN)).collect());
    let n: usize = parsed(args, "--devices", listed.or(split.as_ref().map(Vec::len)).unwrap_or(default_n));
    if !(1..=MAX_DEVICES).contains(&n) {
        fail(format!("--devices {n}: 1 to {MAX_DEVICES}"));
    }
    if listed.is_some_and(|k| k != n) {
        fail(format!("--device names {} device(s) but --devices is {n}", listed.unwrap_or(0)));
    }
    let ratios = split.unwrap_or_else(|| vec![1.0; n]);
    if ratios.len() != n {
        fail(format!("--tensor-split gives {} ratio(s) for {n} device(s)", ratios.len()));
    }
    if ratios.iter().any(|r| !r.is_finite() || *r < 0.0) || ratios.iter().all(|r| *r == 0.0) {
        fail(format!("--tensor-split needs non-negative numbers, not all zero, got {ratios:?}"));
    }
    (ratios, mode)
}

/// `--device` (llama.cpp's option): comma-separated device names, one per
/// device of the tensor split: `CPU` (the default for every device),
/// `CUDA<i>` (NVIDIA GPU `i`; `--features cuda`), `HIP<i>` (AMD GPU `i`;
/// `--features hip`) — a GPU named k times gives k virtual devices on it,
/// each with its own stream and share of memory — `EMU` (an emulated
/// NVIDIA GPU: the kernels as host C++, slow) and `EMUHIP` (an emulated AMD
/// CDNA GPU, 64-wide waves), both `--features cuda-emu`. Returns the
/// devices to run on, or `None` for CPU devices; exits with status 2 on a
/// name this build cannot open ([`check_options`] checks the names first,
/// before any work).
pub fn backends(args: &[String], n: usize) -> shardgraph::Result<Option<Vec<Arc<dyn Backend>>>> {
    let Some(list) = arg(args, "--device") else { return Ok(None) };
    let mut names: Vec<Device> = device_names(&list);
    if names.len() != n {
        if n != 1 {
            eprintln!("--device names {} device(s) for {n}", names.len());
            std::process::exit(2);
        }
        // --split-mode none: the main (first) device only.
        names.truncate(1);
    }
    if names.iter().all(|d| *d == Device::Cpu) {
        return Ok(None);
    }
    open_devices(&names).map(Some)
}

/// One `--device` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// `CPU`.
    Cpu,
    /// `CUDA<i>`: NVIDIA GPU `i`.
    Cuda(usize),
    /// `HIP<i>`: AMD GPU `i`.
    Hip(usize),
    /// `EMU`: an emulated NVIDIA GPU.
    Emu,
    /// `EMUHIP`: an emulated AMD CDNA GPU.
    EmuHip,
}

/// The devices `--device list` names (case-insensitive; `<i>` is 1 to 9
/// decimal digits); exits with status 2 on a name that is none of them or
/// that this build cannot open.
pub fn device_names(list: &str) -> Vec<Device> {
    list.split(',').map(|x| device(x.trim())).collect()
}

fn device(name: &str) -> Device {
    let up = name.to_uppercase();
    let ordinal = |prefix: &str| {
        let digits = up.strip_prefix(prefix)?;
        (1..=9).contains(&digits.len()).then_some(())?;
        digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse::<usize>().ok())?
    };
    let (d, built) = match up.as_str() {
        "CPU" => (Device::Cpu, true),
        "EMU" => (Device::Emu, cfg!(feature = "cuda-emu")),
        "EMUHIP" => (Device::EmuHip, cfg!(feature = "cuda-emu")),
        _ => match (ordinal("CUDA"), ordinal("HIP")) {
            (Some(i), _) => (Device::Cuda(i), cfg!(feature = "cuda")),
            (_, Some(i)) => (Device::Hip(i), cfg!(feature = "hip")),
            _ => {
                eprintln!("--device {name}: use CPU, CUDA<i>, HIP<i>, EMU or EMUHIP");
                std::process::exit(2)
            }
        },
    };
    if !built {
        eprintln!(
            "--device {name}: this build cannot open it (CUDA<i> needs --features cuda, HIP<i> --features hip, \
             EMU and EMUHIP --features cuda-emu)"
        );
        std::process::exit(2)
    }
    d
}

/// Opens the named devices (each GPU once, with as many virtual devices as
/// it is named).
#[cfg(sg_gpu)]
fn open_devices(names: &[Device]) -> shardgraph::Result<Vec<Arc<dyn Backend>>> {
    use shardgraph::backend::cuda::CudaBackend;
    use std::collections::HashMap;
    let mut virtuals: HashMap<Device, Vec<CudaBackend>> = HashMap::new();
    for &d in names {
        if virtuals.contains_key(&d) {
            continue;
        }
        let k = names.iter().filter(|x| **x == d).count();
        let opened = match d {
            #[cfg(feature = "cuda")]
            Device::Cuda(i) => CudaBackend::virtual_devices(i, k)?,
            #[cfg(feature = "hip")]
            Device::Hip(i) => CudaBackend::hip_virtual_devices(i, k)?,
            _ => continue,
        };
        virtuals.insert(d, opened.into_iter().rev().collect());
    }
    let mut out: Vec<Arc<dyn Backend>> = Vec::new();
    for &d in names {
        let b: Arc<dyn Backend> = match d {
            Device::Cpu => Arc::new(shardgraph::CpuBackend::with_threads(1)?),
            #[cfg(feature = "cuda-emu")]
            Device::Emu => Arc::new(CudaBackend::emulated(8 << 30)),
            #[cfg(feature = "cuda-emu")]
            Device::EmuHip => Arc::new(CudaBackend::emulated_hip(8 << 30)),
            gpu => match virtuals.get_mut(&gpu).and_then(|v| v.pop()) {
                Some(b) => Arc::new(b),
                // `device` refused names this build cannot open.
                None => {
                    eprintln!("--device {gpu:?}: this build cannot open it");
                    std::process::exit(2)
                }
            },
        };
        out.push(b);
    }
    Ok(out)
}

#[cfg(not(sg_gpu))]
fn open_devices(_: &[Device]) -> shardgraph::Result<Vec<Arc<dyn Backend>>> {
    // `device` refused every name but CPU in this build, and CPU-only lists
    // return before opening.
    Ok(Vec::new())
}

/// Moves a session's runner onto the `--device` devices for `n` devices
/// (nothing for CPU devices). Exits on a bad name, as [`backends`].
///
/// # Errors
/// Opening the devices (no GPU, no driver); a device count the runner's
/// policy does not have.
pub fn use_devices(args: &[String], runner: &mut Runner, n: usize) -> shardgraph::Result<()> {
    if let Some(d) = backends(args, n)? {
        runner.set_backends(d)?;
    }
    Ok(())
}

/// `--ctx-size` (llama.cpp's: KV cells per cache) with `--fit on|off`
/// (llama.cpp's flag, which llama.cpp does not implement for
/// `--split-mode tensor`; default off here, so a run's context is what it
/// asks for):
/// * off: `--ctx-size`, or `default` when not given;
/// * on: the largest context of 256-cell steps whose session — the
///   weights, caches and worst steps of `spec()`, sized from plans before
///   anything is allocated ([`shardgraph_models::fit::fit_ctx_size`]) —
///   fits every device of the run (`--device`, `--threads`), at most
///   `--ctx-size` if given, else at most the model's training context.
///
/// Exits with a message when the context is below `need` (the prompt, the
/// generated tokens and a draft beyond them) or `--fit` has another value.
///
/// # Errors
/// [`shardgraph::Error::OutOfMemory`] naming the device when even 256
/// cells do not fit; the model's and the devices' errors.
pub fn ctx_size(
    args: &[String],
    default: i64,
    need: i64,
    threads: usize,
    spec: impl FnOnce() -> shardgraph::Result<FitSpec>,
) -> shardgraph::Result<i64> {
    let asked = ctx_request(args, default, need);
    // ctx_request allowed only on and off.
    let n = match arg(args, "--fit").as_deref() {
        Some("on") => {
            let spec = spec()?;
            let exec = match backends(args, spec.ratios.len())? {
                Some(devices) => MetaExecutor::with_backends(devices)?,
                None => MetaExecutor::new(spec.ratios.len(), threads)?,
            };
            let max = asked.unwrap_or_else(|| spec.max_ctx()).max(CTX_STEP);
            let n = fit_ctx_size(&spec, max, &exec)?;
            println!(
                "--fit on: ctx-size {n} (the largest multiple of {CTX_STEP} cells up to {max} that fits every device)"
            );
            n
        }
        _ => asked.unwrap_or(default),
    };
    if n < need {
        eprintln!("--ctx-size {n} is too small: this run needs {need} cells (prompt, generated tokens, a draft)");
        std::process::exit(2);
    }
    Ok(n)
}

/// Checks `--ctx-size` and `--fit` before any work (exits with status 2 on
/// a bad `--fit` value, a `--ctx-size` below `need` or above
/// [`shardgraph_models::MAX_CTX`], fit or not, or a `need` above it) and
/// returns `--ctx-size` if given. [`ctx_size`] calls it; an example that
/// learns its model later calls it first to refuse bad values early.
pub fn ctx_request(args: &[String], default: i64, need: i64) -> Option<i64> {
    let bad = |m: String| -> ! {
        eprintln!("{m}");
        std::process::exit(2)
    };
    if let Some(f) = arg(args, "--fit").filter(|f| f != "on" && f != "off") {
        bad(format!("--fit {f}: use on or off"));
    }
    let max = shardgraph_models::MAX_CTX;
    if need > max {
        bad(format!(
            "this run needs {need} cells (prompt, generated tokens, a draft): more than a KV cache holds ({max})"
        ));
    }
    let asked: Option<i64> = arg(args, "--ctx-size").map(|_| parsed(args, "--ctx-size", default));
    if let Some(n) = asked.filter(|&n| n > max) {
        bad(format!("--ctx-size {n} is too large: a KV cache holds 1 to {max} cells"));
    }
    if let Some(n) = asked.filter(|&n| n < need) {
        bad(format!("--ctx-size {n} is too small: this run needs {need} cells (prompt, generated tokens, a draft)"));
    }
    asked
}

/// `--cache-type-k f16|q8_0|q4_0` (default f16); exits on another value.
pub fn cache_type(args: &[String]) -> GgmlType {
    match arg(args, "--cache-type-k").as_deref() {
        None | Some("f16") => GgmlType::F16,
        Some("q8_0") => GgmlType::Q8_0,
        Some("q4_0") => GgmlType::Q4_0,
        Some(other) => {
            eprintln!("--cache-type-k {other}: use f16, q8_0 or q4_0");
            std::process::exit(2);
        }
    }
}

/// Proposes nothing: plain greedy decoding through the same loop.
pub struct NoDraft;

impl<T> Drafter<T> for NoDraft {
    fn draft(&mut self, _: &mut T, _: i32, _: i64, _: usize) -> shardgraph::Result<Vec<i32>> {
        Ok(Vec::new())
    }
}

/// A progress line on stderr, every 5%.
pub fn progress(what: &str) -> impl FnMut(u64, u64) + '_ {
    let mut shown = u64::MAX;
    move |done, total| {
        let pct = done * 100 / total.max(1);
        if shown == u64::MAX || pct >= shown + 5 || done == total {
            shown = pct;
            eprint!("\r{what}: {pct:3}% ({:.0}/{:.0} MB)", done as f64 / 1e6, total as f64 / 1e6);
            if done == total {
                eprintln!();
            }
        }
    }
}

/// Writes the generated example model `path` with `write` (through a
/// `.partial` file, renamed when complete) unless it exists and `current`
/// accepts it; a cached file that does not parse or is not the model this
/// build generates (an older version, a damaged copy) is written again.
/// Only for the examples' own files in the temp folder: a `--model` path is
/// the user's and is never written.
pub fn ensure(
    path: &Path,
    current: impl Fn(&shardgraph::gguf::GgufFile) -> bool,
    write: impl FnOnce(&Path) -> shardgraph::Result<u64>,
) -> shardgraph::Result<()> {
    if path.exists() {
        match shardgraph::gguf::GgufFile::open(path) {
            Ok(f) if current(&f) => return Ok(()),
            Ok(_) => eprintln!("{}: not the model this build generates; writing it again", path.display()),
            Err(e) => eprintln!("{}: {e}; writing it again", path.display()),
        }
    }
    let t = Instant::now();
    let tmp = path.with_extension("partial");
    let bytes = write(&tmp)?;
    std::fs::rename(&tmp, path).map_err(|e| shardgraph::Error::Model {
        detail: format!("renaming {} to {}: {e}", tmp.display(), path.display()),
    })?;
    println!("wrote {} ({:.0} MB) in {:.1} s", path.display(), bytes as f64 / 1e6, t.elapsed().as_secs_f64());
    Ok(())
}

/// The path option `name` if given (it must be an existing file: exits
/// otherwise), else `None`.
pub fn given_file(args: &[String], name: &str) -> Option<std::path::PathBuf> {
    let p = std::path::PathBuf::from(arg(args, name)?);
    if !p.is_file() {
        eprintln!("{name} {}: not a file", p.display());
        std::process::exit(2);
    }
    Some(p)
}

/// The example `qwen35`: 8 layers (6 Gated-DeltaNet + 2 gated attention),
/// n_embd 1024, n_ff 2816, 12 heads / 3 KV heads of 128 (IMROPE over 32
/// dims), 8 key / 16 value heads of 128, vocabulary 8192, an MTP layer;
/// Q8_0, about 175 MB. Its greedy continuation follows a vocabulary
/// permutation, which its MTP head predicts.
pub fn qwen35_hp() -> Qwen35Hparams {
    Qwen35Hparams {
        core: HparamsCore {
            n_layer: 8,
            n_embd: 1024,
            n_ff: 2816,
            n_head: 12,
            n_head_kv: 3,
            head_dim: 128,
            rms_eps: 1e-6,
            rope_base: 1e7,
        },
        n_vocab: 8192,
        n_rot: 32,
        rope_sections: [6, 5, 5, 0],
        full_attention_interval: 4,
        d_conv: 4,
        d_state: 128,
        n_k_heads: 8,
        n_v_heads: 16,
        n_nextn: 1,
        n_ctx_train: 4096,
    }
}

/// The DFlash2 drafter for the example `qwen35`: as the `qwen3` example's,
/// tapping the input of layer 2 and the post-final-norm state (8).
pub fn qwen35_drafter_hp() -> DflashHparams {
    let t = qwen35_hp();
    DflashHparams {
        core: HparamsCore::qwen3(2, t.n_embd, t.n_vocab, 16, 8, 64),
        target_layers: vec![2, t.n_layer],
        target_hidden: t.n_embd,
        block_size: 8,
        mask_token: (t.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((64, 16)),
    }
}

/// Writes the example `qwen35` (with its MTP layer) unless it exists.
pub fn ensure_qwen35(path: &Path) -> shardgraph::Result<()> {
    let current = |f: &shardgraph::gguf::GgufFile| Qwen35Hparams::from_gguf(f).is_ok_and(|h| h == qwen35_hp());
    ensure(path, current, |tmp| {
        eprintln!("generating {} ...", path.display());
        write_qwen35_gguf_with(tmp, &qwen35_hp(), &Qwen35Types::all(GgmlType::Q8_0), 1, Weights::Permutation)
    })
}

/// Writes the DFlash2 drafter for the example `qwen35` unless it exists.
pub fn ensure_qwen35_drafter(path: &Path) -> shardgraph::Result<()> {
    let current = |f: &shardgraph::gguf::GgufFile| DflashHparams::from_gguf(f).is_ok_and(|h| h == qwen35_drafter_hp());
    ensure(path, current, |tmp| {
        write_dflash_gguf_with(tmp, &qwen35_drafter_hp(), GgmlType::Q8_0, qwen35_hp().n_vocab, 1, Weights::Permutation)
    })
}

/// Creates a drafter in a target session.
pub type Attach<'a, T> = dyn Fn(&mut T) -> shardgraph::Result<Box<dyn Drafter<T>>> + 'a;

/// Exits with a message naming the first out-of-range count and its value.
pub fn check_counts(n_gen: usize, threads: usize, n_max: usize, n_min: usize, p_min: f32) {
    use shardgraph_models::speculative::MAX_DRAFT;
    let bad = |m: &str| -> ! {
        eprintln!("{m}");
        std::process::exit(2)
    };
    if n_gen == 0 || n_gen > i32::MAX as usize {
        bad(&format!("--n-predict {n_gen}: must be within 1..=2147483647"));
    }
    if threads == 0 || threads > MAX_THREADS {
        bad(&format!("--threads {threads}: must be within 1..={MAX_THREADS}"));
    }
    if n_max == 0 || n_max > MAX_DRAFT {
        bad(&format!("--spec-draft-n-max {n_max}: must be within 1..={MAX_DRAFT}"));
    }
    if n_min > n_max {
        bad(&format!("--spec-draft-n-min {n_min} exceeds --spec-draft-n-max {n_max}: nothing would be drafted"));
    }
    if !(0.0..=1.0).contains(&p_min) {
        bad(&format!("--spec-draft-p-min {p_min}: must be within 0..=1"));
    }
}

/// The most threads per device the examples take (more than any machine
/// has cores; a typo like `--threads 100000` is refused, not spawned).
pub const MAX_THREADS: usize = 1024;

/// A rate with three significant digits at least (the emulated GPU decodes
/// well under one token per second).
fn rate(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// One measurement's setting.
pub struct Bench<'a> {
    /// Tensor-split ratios of the devices.
    pub ratios: Vec<f32>,
    /// The prompt.
    pub prompt: Vec<i32>,
    /// Tokens to generate.
    pub n_gen: usize,
    /// Draft limits.
    pub params: SpecParams,
    /// Check against plain greedy decoding on one device.
    pub verify: bool,
    /// The drafter's name in the report.
    pub label: &'a str,
    /// The devices are not CPU devices (`--device`): verify against a CPU run.
    pub accelerated: bool,
}

/// Plain greedy decoding (after a short warm-up run), then speculative
/// decoding, on sessions from `open(ratios)`; prints tokens/s, drafted and
/// accepted counts, the speed-up and the bytes moved (`moved` reads a
/// session's counter), and with `verify` a last line `verify: identical`
/// (or exits with status 1 on a mismatch).
pub fn bench<T: Target>(
    b: &Bench<'_>,
    open: &dyn Fn(&[f32]) -> shardgraph::Result<T>,
    reference: &dyn Fn() -> shardgraph::Result<T>,
    attach: &Attach<'_, T>,
    moved: &dyn Fn(&T) -> u64,
) -> shardgraph::Result<()> {
    let plain_params = SpecParams { n_max: 0, n_min: 0 };
    let mut s = open(&b.ratios)?;
    generate(&mut s, &mut NoDraft, &b.prompt, b.n_gen.min(8), plain_params)?;
    drop(s);
    let mut s = open(&b.ratios)?;
    let t = Instant::now();
    let (plain, _) = generate(&mut s, &mut NoDraft, &b.prompt, b.n_gen, plain_params)?;
    let plain_s = t.elapsed().as_secs_f64();
    drop(s);
    let mut s = open(&b.ratios)?;
    let mut d = attach(&mut s)?;
    let before = moved(&s);
    let t = Instant::now();
    let (tokens, st): (Vec<i32>, SpecStats) = generate(&mut s, d.as_mut(), &b.prompt, b.n_gen, b.params)?;
    let spec_s = t.elapsed().as_secs_f64();
    let bytes = moved(&s) - before;
    let (plain_tps, spec_tps) = (b.n_gen as f64 / plain_s, b.n_gen as f64 / spec_s);
    println!("plain greedy: {} tokens/s", rate(plain_tps));
    println!(
        "{:<13} {} tokens/s; drafted {}, accepted {} ({:.0}%), {} target steps ({:.2} tokens per step), n_max {}",
        format!("{}:", b.label),
        rate(spec_tps),
        st.drafted,
        st.accepted,
        100.0 * st.accepted as f64 / st.drafted.max(1) as f64,
        st.target_steps,
        b.n_gen.saturating_sub(1) as f64 / st.target_steps.max(1) as f64,
        b.params.n_max
    );
    println!(
        "speed-up over plain greedy: {:.2}x; {bytes} bytes moved between devices ({:.0} per token)",
        spec_tps / plain_tps,
        bytes as f64 / b.n_gen as f64
    );
    if plain != tokens {
        let i = plain.iter().zip(&tokens).position(|(a, b)| a != b).unwrap_or(0);
        println!("verify: MISMATCH between plain greedy and speculative on the same devices at token {i}");
        std::process::exit(1);
    }
    if b.verify {
        let reference = if b.ratios.len() == 1 && !b.accelerated {
            plain
        } else {
            let mut one = reference()?;
            generate(&mut one, &mut NoDraft, &b.prompt, b.n_gen, plain_params)?.0
        };
        match reference.iter().zip(&tokens).position(|(a, b)| a != b) {
            None if reference.len() == tokens.len() => println!(
                "verify: identical — {} tokens equal plain greedy decoding on one CPU device (first: {:?})",
                tokens.len(),
                &tokens[..tokens.len().min(8)]
            ),
            i => {
                println!("verify: MISMATCH with one-device greedy decoding at token {}", i.unwrap_or(reference.len()));
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
