//! What the speculative-decoding examples share: option parsing (devices,
//! context, sampling), the generated example models, a progress display,
//! and the measurement with [`Engine`] (plain, then speculative, on the same
//! devices; optional check against one device).

#![allow(dead_code)] // each example uses part of it

use shardgraph::split::Devices;
use shardgraph::GgmlType;
use shardgraph_models::dflash::DflashHparams;
use shardgraph_models::engine::{DraftModel, Engine, EngineParams, GenerateOptions, Generation};
use shardgraph_models::generate::{
    write_dflash_gguf_with, write_qwen35_gguf_with, Weights, GENERATOR_KEY, GENERATOR_VERSION,
};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen35::Qwen35Hparams;
use shardgraph_models::sampling::SamplerParams;
use shardgraph_models::step::Target;
use shardgraph_models::types::{cache_type_by_name, KvTypes, TensorTypes};
use std::path::Path;
use std::time::Instant;

#[path = "../../tests/common/nmse.rs"]
mod nmse;
pub use nmse::nmse;

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
}

/// This process's place among the processes `mpirun -np N` started
/// (feature `mpi`): `Some` only under mpirun with more than one process.
/// The first call initializes MPI; processes other than rank 0 then write
/// their standard output to /dev/null (rank 0 prints the results; errors
/// still reach standard error from every process). Exits with a message if
/// MPI cannot start.
#[cfg(feature = "mpi")]
pub fn world() -> Option<std::sync::Arc<shardgraph::split::World>> {
    static WORLD: std::sync::OnceLock<Option<std::sync::Arc<shardgraph::split::World>>> = std::sync::OnceLock::new();
    WORLD
        .get_or_init(|| {
            if launched_processes() < 2 {
                return None;
            }
            let w = shardgraph::split::World::init().unwrap_or_else(|e| {
                eprintln!("mpirun: {e}");
                std::process::exit(2)
            });
            same_options(&w);
            if !w.is_root() {
                quiet_stdout();
            }
            let line = format!("process {} of {} is pid {}\n", w.rank(), w.size(), std::process::id());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            Some(w)
        })
        .clone()
}

/// Without the `mpi` feature every run is one process: started by mpirun
/// with more than one process, it exits with a message (N copies would
/// each run alone and print).
#[cfg(not(feature = "mpi"))]
pub fn world() -> Option<std::sync::Arc<()>> {
    if launched_processes() > 1 {
        eprintln!("started by mpirun, but this build has no `mpi` feature: build with --features mpi");
        std::process::exit(2);
    }
    None
}

/// The process count mpirun (Open MPI, or MPICH's launcher) gave this
/// process, 1 when not started by it.
fn launched_processes() -> usize {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"].iter().find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok()).unwrap_or(1)
}

/// Exits in every process, naming the first difference, when this
/// process's options other than its own devices and threads (`--device`,
/// `--devices`, `--threads`) differ from rank 0's: the processes must run
/// the same steps on the same inputs.
#[cfg(feature = "mpi")]
fn same_options(w: &shardgraph::split::World) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The program first (`mpirun -np 1 decode : -np 1 dflash2` is two programs).
    let program = std::env::args().next().map(|p| p.rsplit('/').next().unwrap_or(&p).to_string());
    let mut shared = vec![program.unwrap_or_default()];
    let mut i = 0;
    while i < args.len() {
        if ["--device", "--devices", "--threads"].contains(&args[i].as_str()) {
            i += 2;
            continue;
        }
        shared.push(args[i].clone());
        i += 1;
    }
    let all = w.all_gather(shared.join("\u{1f}").as_bytes());
    if let Some(r) = (1..all.len()).find(|&r| all[r] != all[0]) {
        let show = |b: &[u8]| String::from_utf8_lossy(b).replace('\u{1f}', " ");
        eprintln!(
            "process {}: the program and options of process {r} ({}) differ from process 0's ({}): every process \
             runs the same program with the same options but for --device, --devices and --threads",
            w.rank(),
            show(&all[r]),
            show(&all[0])
        );
        std::process::exit(2);
    }
}

/// Exits in every process when the processes open different numbers of
/// devices (the examples' `--tensor-split` counts the world as
/// `--devices × processes`); nothing when run alone.
fn same_count(n_local: usize) {
    #[cfg(feature = "mpi")]
    if let Some(w) = world() {
        let all = w.all_gather(&(n_local as u64).to_le_bytes());
        if let Some(r) = (1..all.len()).find(|&r| all[r] != all[0]) {
            eprintln!("process {}: process {r} opens another number of devices than process 0: the examples take the same --devices (or as many --device names) in every process", w.rank());
            std::process::exit(2);
        }
    }
    let _ = n_local;
}

/// Points standard output at /dev/null (a process other than rank 0).
#[cfg(feature = "mpi")]
fn quiet_stdout() {
    use std::os::fd::AsRawFd;
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else { return };
    // SAFETY: both descriptors are open (`null` lives across the call, 1 is
    // standard output); dup2 makes 1 a copy of it and touches no memory.
    unsafe { libc::dup2(null.as_raw_fd(), 1) };
}

/// The processes' count and this one's rank (1 and 0 when run alone).
pub fn processes() -> (usize, usize) {
    #[cfg(feature = "mpi")]
    if let Some(w) = world() {
        return (w.size(), w.rank());
    }
    (1, 0)
}

/// Ends the run's MPI (every process waits for the others); nothing when
/// run alone. Call it last in `main`.
pub fn finish() {
    #[cfg(feature = "mpi")]
    if let Some(w) = world() {
        w.finalize();
    }
}

/// `f` in rank 0 first, then in the other processes (for the example
/// model files: rank 0 writes them, the others find them written).
pub fn one_process_first<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "mpi")]
    if let Some(w) = world() {
        if w.is_root() {
            let r = f();
            w.barrier();
            return r;
        }
        w.barrier();
        return f();
    }
    f()
}

/// `v` as rank 0 has it, in every process (a seed drawn per process).
fn from_rank_0(v: u64) -> u64 {
    #[cfg(feature = "mpi")]
    if let Some(w) = world() {
        let mut b = v.to_le_bytes().to_vec();
        if w.broadcast(0, &mut b).is_ok() {
            if let Ok(a) = <[u8; 8]>::try_from(&b[..]) {
                return u64::from_le_bytes(a);
            }
        }
    }
    v
}

/// `--devices`, `--tensor-split` and `--split-mode` (llama.cpp's: `none` is
/// one device, and the other two are then ignored; `layer` puts each layer
/// whole on one device, the ratios setting the devices' shares of the
/// layers; `tensor`, the default, splits every layer): the tensor-split
/// ratios, one per device, and the mode. The device count is `--devices`,
/// else the number of `--device` names, else the number of `--tensor-split`
/// ratios, else `default_n`. Exits with a message on bad values.
pub fn devices(args: &[String], default_n: usize) -> (Vec<f32>, String) {
    // Under mpirun every process finds the same fault: rank 0 says it.
    let fail = |m: String| -> ! {
        if processes().1 == 0 {
            eprintln!("{m}");
        }
        std::process::exit(2)
    };
    let mode = arg(args, "--split-mode").unwrap_or_else(|| "tensor".into());
    match mode.as_str() {
        "tensor" | "layer" | "hybrid" => {}
        // The whole model on the main device (a --devices given is still
        // checked: 0 or too many is a typo, not ignored).
        "none" => {
            if processes().0 > 1 {
                fail("--split-mode none runs in one process, not under mpirun".into());
            }
            if arg(args, "--devices").is_some() {
                let n: usize = parsed(args, "--devices", 1);
                if !(1..=shardgraph::split::MAX_DEVICES).contains(&n) {
                    fail(format!("--devices {n}: 1 to {}", shardgraph::split::MAX_DEVICES));
                }
            }
            return (vec![1.0], mode);
        }
        other => fail(format!("--split-mode {other}: use none, layer, tensor or hybrid")),
    }
    let listed = arg(args, "--device").map(|l| l.split(',').count());
    let split: Option<Vec<f32>> = arg(args, "--tensor-split").map(|s| {
        s.split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .ok()
                    .filter(|r: &f32| r.is_finite())
                    .unwrap_or_else(|| fail(format!("--tensor-split {s}: {:?} is not a finite number", x.trim())))
            })
            .collect()
    });
    // Under mpirun, --devices and --device are each process's (1 device by
    // default) and --tensor-split lists the world's devices in rank order.
    let procs = processes().0;
    let default_n =
        if procs > 1 { listed.unwrap_or(1) } else { listed.or(split.as_ref().map(Vec::len)).unwrap_or(default_n) };
    let n_local: usize = parsed(args, "--devices", default_n);
    if !(1..=shardgraph::split::MAX_DEVICES).contains(&n_local) {
        fail(format!("--devices {n_local}: 1 to {}", shardgraph::split::MAX_DEVICES));
    }
    if listed.is_some_and(|k| k != n_local) {
        fail(format!("--device names {} device(s) but --devices is {n_local}", listed.unwrap_or(0)));
    }
    same_count(n_local);
    let n = n_local * procs;
    if n > shardgraph::split::MAX_DEVICES {
        fail(format!(
            "{n_local} device(s) in each of {procs} processes: at most {} in all",
            shardgraph::split::MAX_DEVICES
        ));
    }
    let ratios = split.unwrap_or_else(|| vec![1.0; n]);
    if ratios.len() != n {
        let per = if procs > 1 {
            format!(" ({n_local} per process × {procs} processes: under mpirun --devices and --device count each process's)")
        } else {
            String::new()
        };
        fail(format!("--tensor-split gives {} ratio(s) for {n} device(s){per}", ratios.len()));
    }
    if ratios.iter().any(|r| !r.is_finite() || *r < 0.0) || ratios.iter().all(|r| *r == 0.0) {
        fail(format!("--tensor-split needs non-negative numbers, not all zero, got {ratios:?}"));
    }
    (ratios, mode)
}

/// The devices of the run (llama.cpp's `--device`, `--devices`,
/// `--tensor-split`, `--threads`): `ratios` from [`devices`], one device per
/// ratio. `--device` lists comma-separated names, one per device: `CPU` (the
/// default for every device), `CUDA<i>` (NVIDIA GPU `i`; `--features
/// cuda`), `HIP<i>` (AMD GPU `i`; `--features hip`) — a GPU named k times
/// gives k virtual devices on it, each with its own stream and share of
/// memory — `EMU` (an emulated NVIDIA GPU: the kernels as host C++, slow)
/// and `EMUHIP` (an emulated AMD CDNA GPU, 64-wide waves), both
/// `--features cuda-emu` ([`Devices::open`]). With `--split-mode none` (one
/// ratio) only the first name is used. Exits with status 2 and a message
/// naming the value for a name that is none of these or that this build
/// cannot open; call it before any work.
///
/// # Errors
/// Opening a GPU (no driver, no such GPU).
pub fn open_devices(args: &[String], ratios: &[f32], threads: usize) -> shardgraph::Result<Devices> {
    let fail = |what: String, e: &shardgraph::Error| -> ! {
        match e {
            shardgraph::Error::Split { detail } => eprintln!("{what}: {detail}"),
            e => eprintln!("{what}: {e}"),
        }
        std::process::exit(2)
    };
    let procs = processes().0;
    let n = ratios.len() / procs;
    let devices = match arg(args, "--device") {
        Some(list) => {
            let mut names: Vec<&str> = list.split(',').map(str::trim).collect();
            if names.len() != n {
                if n != 1 {
                    eprintln!("--device names {} device(s) for {n}", names.len());
                    std::process::exit(2);
                }
                // --split-mode none: the main (first) device only.
                names.truncate(1);
            }
            match Devices::open(&names, threads) {
                Ok(d) => d,
                Err(e @ shardgraph::Error::Split { .. }) => fail(format!("--device {list}"), &e),
                Err(e) => return Err(e),
            }
        }
        None => Devices::cpu(n, threads).unwrap_or_else(|e| fail(format!("--devices {n} --threads {threads}"), &e)),
    };
    let mode = match arg(args, "--split-mode").as_deref() {
        Some("layer") => shardgraph::split::SplitMode::Layer,
        Some("hybrid") => shardgraph::split::SplitMode::Hybrid,
        _ => shardgraph::split::SplitMode::Tensor,
    };
    // Without the `mpi` feature, mpirun's copies would each run alone and
    // print: `world` exits naming the feature.
    #[cfg(not(feature = "mpi"))]
    let _ = world();
    #[cfg(feature = "mpi")]
    let devices = match world() {
        Some(w) => {
            let d = devices.across_processes(&w).unwrap_or_else(|e| fail("mpirun".into(), &e));
            d.links().unwrap_or_else(|e| fail("link model".into(), &e));
            let link = d.slowest_link();
            let m = d.link_model().unwrap_or_else(|e| fail("link model".into(), &e));
            println!(
                "{} device(s) in {} processes {:?}; slowest link: {} (priced at {:.0} µs per step, {:.3} GB/s; {})",
                d.n_devices(),
                w.size(),
                d.names(),
                link.name(),
                m.latency_s * 1e6,
                m.bandwidth / 1e9,
                link.env_var()
            );
            println!("exchanges: {}", d.exchanges());
            d
        }
        None => devices,
    };
    // Every link variable checked before anything loads (the plans price
    // each collective by its class's).
    devices.links().unwrap_or_else(|e| fail("link model".into(), &e));
    let devices = devices.with_tensor_split(ratios).unwrap_or_else(|e| fail(format!("--tensor-split {ratios:?}"), &e));
    Ok(devices.with_split_mode(mode))
}

/// `--ctx-size` (llama.cpp's: the KV cells a run can use, prompt and
/// generated tokens; a drafter's caches add its block) with `--fit on|off`
/// (llama.cpp's flag, which llama.cpp does not implement for `--split-mode
/// tensor`; default off here, so a run's context is what it asks for):
/// * off: `--ctx-size`, or `default` when not given;
/// * on: `fit(max)`, the largest context whose session — weights, caches
///   and worst steps, sized from plans before anything is allocated
///   ([`shardgraph_models::fit::fit_ctx_size`], [`Engine::fit_ctx_size`]) —
///   fits every device of the run, at most `max`: `--ctx-size` if given,
///   else 0 (the model's training context).
///
/// Exits with a message when the context is below `need` (the prompt and
/// the generated tokens) or `--fit` has another value.
///
/// # Errors
/// `fit`'s: [`shardgraph::Error::OutOfMemory`] naming the device when even
/// 256 cells do not fit; the model's and the devices' errors.
pub fn ctx_size(
    args: &[String],
    default: i64,
    need: i64,
    fit: impl FnOnce(i64) -> shardgraph::Result<i64>,
) -> shardgraph::Result<i64> {
    let asked = ctx_request(args, default, need);
    // ctx_request allowed only on and off.
    let n = match arg(args, "--fit").as_deref() {
        Some("on") => {
            let n = fit(asked.unwrap_or(0))?;
            let max = asked.map_or("the training context".to_string(), |a| a.to_string());
            println!(
                "--fit on: ctx-size {n} (the largest up to {max} that fits every device, caches in steps of 256 cells)"
            );
            n
        }
        _ => asked.unwrap_or(default),
    };
    if n < need {
        eprintln!("--ctx-size {n} is too small: this run needs {need} cells (prompt and generated tokens)");
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
        bad(format!("this run needs {need} cells (prompt and generated tokens): more than a KV cache holds ({max})"));
    }
    let asked: Option<i64> = arg(args, "--ctx-size").map(|_| parsed(args, "--ctx-size", default));
    if let Some(n) = asked.filter(|&n| n > max) {
        bad(format!("--ctx-size {n} is too large: a KV cache holds 1 to {max} cells"));
    }
    if let Some(n) = asked.filter(|&n| n < need) {
        bad(format!("--ctx-size {n} is too small: this run needs {need} cells (prompt and generated tokens)"));
    }
    asked
}

/// `--cache-type-k` and `--cache-type-v` (llama.cpp's: each one of its
/// cache types, [`shardgraph_models::types::LLAMA_CACHE_TYPES`], that this build's core has; default
/// f16 each, and they may differ); exits with status 2 naming the option
/// and the value otherwise.
pub fn cache_types(args: &[String]) -> KvTypes {
    let one = |option: &str| match arg(args, option) {
        None => GgmlType::F16,
        Some(name) => cache_type_by_name(option, &name).unwrap_or_else(|e| {
            match e {
                shardgraph::Error::Model { detail } => eprintln!("{detail}"),
                e => eprintln!("{option} {name}: {e}"),
            }
            std::process::exit(2)
        }),
    };
    KvTypes::new(one("--cache-type-k"), one("--cache-type-v"))
}

/// The prompt as token ids: `--prompt-tokens 1,2,3` (comma- or
/// space-separated) or `--prompt-tokens-file F` (ids separated by commas,
/// spaces or newlines), else `default`. Exits with status 2 naming the
/// option and the value for both given, an unreadable file, an empty
/// list, or an entry that is not a non-negative 32-bit integer (the model
/// checks the ids against its vocabulary before decoding).
pub fn prompt_tokens(args: &[String], default: impl FnOnce() -> Vec<i32>) -> Vec<i32> {
    let bad = |m: String| -> ! {
        eprintln!("{m}");
        std::process::exit(2)
    };
    let (text, what) = match (arg(args, "--prompt-tokens"), arg(args, "--prompt-tokens-file")) {
        (Some(_), Some(_)) => bad("--prompt-tokens and --prompt-tokens-file: give one of them".into()),
        (Some(t), None) => (t.clone(), format!("--prompt-tokens {t}")),
        (None, Some(f)) => match std::fs::read_to_string(&f) {
            Ok(t) => (t, format!("--prompt-tokens-file {f}")),
            Err(e) => bad(format!("--prompt-tokens-file {f}: {e}")),
        },
        (None, None) => return default(),
    };
    // Comma- or whitespace-separated; an empty entry between commas is an
    // error (a lost id), not skipped.
    if !text.trim().is_empty() && text.split(',').any(|p| p.trim().is_empty()) {
        bad(format!("{what}: an empty entry between commas"));
    }
    let ids: Vec<i32> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<i32>()
                .ok()
                .filter(|&v| v >= 0)
                .unwrap_or_else(|| bad(format!("{what}: {t:?} is not a token id (0 to 2147483647)")))
        })
        .collect();
    if ids.is_empty() {
        bad(format!("{what}: no token ids"));
    }
    ids
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
/// accepts it and carries this build's generator version
/// ([`GENERATOR_VERSION`]); a cached file that does not parse or is not the
/// model this build generates (another version, a damaged copy) is written
/// again.
/// Only for the examples' own files in the temp folder: a `--model` path is
/// the user's and is never written.
pub fn ensure(
    path: &Path,
    current: impl Fn(&shardgraph::gguf::GgufFile) -> bool,
    write: impl FnOnce(&Path) -> shardgraph::Result<u64>,
) -> shardgraph::Result<()> {
    // Under mpirun rank 0 writes it; the others find it written.
    one_process_first(|| ensure_now(path, current, write))
}

fn ensure_now(
    path: &Path,
    current: impl Fn(&shardgraph::gguf::GgufFile) -> bool,
    write: impl FnOnce(&Path) -> shardgraph::Result<u64>,
) -> shardgraph::Result<()> {
    if path.exists() {
        match shardgraph::gguf::GgufFile::open(path) {
            Ok(f) if current(&f) && f.get_str(GENERATOR_KEY).is_ok_and(|v| v == GENERATOR_VERSION) => return Ok(()),
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
/// tapping the inputs of layers 2 and 7 (below `n_layer`, as llama.cpp needs).
pub fn qwen35_drafter_hp() -> DflashHparams {
    let t = qwen35_hp();
    DflashHparams {
        core: HparamsCore::qwen3(2, t.n_embd, t.n_vocab, 16, 8, 64),
        target_layers: vec![2, t.n_layer - 1],
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
        write_qwen35_gguf_with(tmp, &qwen35_hp(), &TensorTypes::uniform(GgmlType::Q8_0), 1, Weights::Permutation)
    })
}

/// Writes the DFlash2 drafter for the example `qwen35` unless it exists.
pub fn ensure_qwen35_drafter(path: &Path) -> shardgraph::Result<()> {
    let current = |f: &shardgraph::gguf::GgufFile| DflashHparams::from_gguf(f).is_ok_and(|h| h == qwen35_drafter_hp());
    ensure(path, current, |tmp| {
        write_dflash_gguf_with(
            tmp,
            &qwen35_drafter_hp(),
            &TensorTypes::uniform(GgmlType::Q8_0),
            qwen35_hp().n_vocab,
            1,
            Weights::Permutation,
        )
    })
}

/// Exits with a message naming the first out-of-range count and its value.
pub fn check_counts(n_gen: usize, threads: usize, n_max: usize, n_min: usize, p_min: f32) {
    use shardgraph_models::step::MAX_DRAFT;
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

/// A 32-bit seed from the clock and the process id (`--seed -1`).
fn random_seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mix = (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32);
    // splitmix64's finalizer spreads the bits; the seed is its low 32.
    let z = (mix ^ (mix >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) & u64::from(u32::MAX)
}

/// llama.cpp's sampling options: `--temp` (default 0: greedy; llama.cpp's
/// is 0.8), `--top-k` (default 40, 0 off), `--top-p` (default 0.95, 1
/// off), `--min-p` (default 0.05, 0 off), `--seed` (0 to 4294967295, as
/// llama.cpp's 32-bit seeds; default 4294967295, used as given, so a run
/// without `--seed` repeats; `-1` draws a new seed per run, as llama.cpp's
/// `-1` does, and the run prints it). The filters apply once
/// `--temp` is above 0. Exits with status 2 and a message naming the option
/// and its value for a value that is not a number or out of range
/// (`--temp` not finite, `--top-p` outside (0, 1], `--min-p` outside [0, 1]).
pub fn sampler(args: &[String]) -> SamplerParams {
    let d = SamplerParams::default();
    let p = SamplerParams {
        temp: parsed(args, "--temp", d.temp),
        top_k: parsed(args, "--top-k", d.top_k),
        top_p: parsed(args, "--top-p", d.top_p),
        min_p: parsed(args, "--min-p", d.min_p),
        // llama.cpp's seeds are 32-bit; -1 (its LLAMA_DEFAULT_SEED) draws a
        // new one per run, printed with the sampling settings.
        seed: match arg(args, "--seed").as_deref() {
            Some("-1") => from_rank_0(random_seed()),
            _ => u64::from(parsed::<u32>(args, "--seed", d.seed as u32)),
        },
    };
    let bad = |m: String| -> ! {
        eprintln!("{m}");
        std::process::exit(2)
    };
    if !p.temp.is_finite() {
        bad(format!("--temp {}: must be a finite number (0 or less: greedy)", p.temp));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        bad(format!("--top-p {}: must be within (0, 1]", p.top_p));
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        bad(format!("--min-p {}: must be within [0, 1]", p.min_p));
    }
    if let Err(e) = p.validate() {
        bad(format!("sampling options: {e}"));
    }
    p
}

/// Describes the sampling of a run: `greedy` or the options.
pub fn describe_sampler(p: &SamplerParams) -> String {
    if p.is_greedy() {
        "greedy".into()
    } else {
        format!("sampled: temp {}, top-k {}, top-p {}, min-p {}, seed {}", p.temp, p.top_k, p.top_p, p.min_p, p.seed)
    }
}

/// Refuses `--verify` with `--temp` above 0 (exit status 2, before any
/// work): the check compares with plain decoding on one device, which only
/// greedy decoding reproduces token for token — speculative sampling draws
/// other tokens than plain sampling for the same seed (with the target's
/// distribution, not its draws), and N devices' logits differ from one
/// device's in their last bits, which can move a draw.
pub fn check_verify(verify: bool, sampler: &SamplerParams) {
    if verify && !sampler.is_greedy() {
        eprintln!(
            "--verify needs --temp 0 (greedy), given --temp {}: speculative sampling has plain sampling's \
             distribution, not its tokens",
            sampler.temp
        );
        std::process::exit(2);
    }
}

/// What `--verify` tolerates between these devices and one CPU device fed
/// the same tokens ([`verify_line`]).
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    /// The logits NMSE allowed per step: 1e-3 when every device is a CPU,
    /// 1e-2 with a GPU among them (the GPU keeps activations in f32 where
    /// the CPU quantizes them to Q8 for quantized weights). Measured on the
    /// `decode` example's random-weights model on 2 CPU devices: at most
    /// 2.8e-4 over 17 steps, and 2.7e-3 to 8.7e-3 with a rope computed
    /// wrongly on device 1 only (its greedy tokens unchanged). On the
    /// speculative examples' permutation models, whose layers write little,
    /// the same wrong rope moves the logits by about 2e-5 only: there the
    /// check is the tokens and this bound.
    pub nmse: f64,
    /// Whether a greedy token may differ where that step's logits still
    /// agree within `nmse` ([`rounding_flip`]): with a GPU among the devices
    /// or more than one device, never on one CPU device, which rounds as
    /// the reference does. (On an H200 and on emulated GPUs alike, the small
    /// qwen3 of the GPU check chose 2774 where one CPU device chose 4619 at
    /// token 21: logits 3.335 and 3.448 on the CPU, RMS 0.704, the step's
    /// logits within NMSE 9.1e-4. On 3 CPU devices the `decode` example's
    /// random qwen3 chose 28770 where one device chose 4002 at token 28:
    /// logits 4.2057 and 4.2548, RMS 1.003, NMSE 2.56e-4: a split sums each
    /// row's partial products in another order.)
    pub close_choices: bool,
}

/// The [`Tolerance`] of `--verify` on these devices.
pub fn verify_tolerance(devices: &Devices) -> Tolerance {
    match (devices.all_cpu(), devices.n_devices()) {
        (true, 1) => Tolerance { nmse: 1e-3, close_choices: false },
        (true, _) => Tolerance { nmse: 1e-3, close_choices: true },
        _ => Tolerance { nmse: 1e-2, close_choices: true },
    }
}

/// How many times the RMS of a step's logit error (here against the
/// reference) the reference's gap between the two tokens may be for a flip
/// to count as a close choice ([`rounding_flip`]). Seen on an H200: 5.3
/// (gap 0.113, error RMS 0.021) and 3.0 (gap 0.060, error RMS 0.020); one
/// wrong logit of +5 in a row of 32 000 at RMS 0.7 gives about 180.
pub const CLOSE_CHOICE_GAP: f64 = 8.0;

/// Whether greedy decoding may choose `got` from logits `here` where the
/// reference chose `want` from `reference` (one step's logits, `[n_vocab]`
/// each): when `tol.close_choices` allows, the two rows agree within
/// `tol.nmse`, and the reference put `want` above `got` by at most
/// [`CLOSE_CHOICE_GAP`] times the RMS of the step's logit error, the error
/// the backends' rounding makes explains the flip. Then the phrase for it
/// (the reference's two logits and RMS, the step's NMSE and the gap in
/// error RMS); else `None`.
pub fn rounding_flip(tol: Tolerance, here: &[f32], reference: &[f32], got: i32, want: i32) -> Option<String> {
    if !tol.close_choices || here.len() != reference.len() || here.is_empty() {
        return None;
    }
    let e = nmse(here, reference);
    let pair = logit_pair(reference, want, got)?;
    let at = |l: &[f32], t: i32| f64::from(l[t as usize]);
    let gap = at(reference, want) - at(reference, got);
    let err = (here.iter().zip(reference).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum::<f64>()
        / here.len() as f64)
        .sqrt();
    let ratio = if gap <= 0.0 { 0.0 } else { gap / err };
    (e <= tol.nmse && ratio <= CLOSE_CHOICE_GAP).then(|| {
        format!(
            "the reference's {pair}; the step's logits within NMSE {e:.2e}, the gap {ratio:.1} times their error's RMS"
        )
    })
}

/// `"<chose>: <logit>, <other>: <logit>; RMS <rms>"` of one step's logits
/// (`None` for a token outside the row).
fn logit_pair(logits: &[f32], chose: i32, other: i32) -> Option<String> {
    let (a, b) = (logits.get(usize::try_from(chose).ok()?)?, logits.get(usize::try_from(other).ok()?)?);
    let rms = (logits.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / logits.len() as f64).sqrt();
    Some(format!("{chose}: {a}, {other}: {b}; RMS {rms:.3}"))
}

/// What `--verify` compares with one CPU device: step by step, the logits
/// each token was chosen from (NMSE against the reference's, at most
/// `tol.nmse`) and the token itself, which must be the reference's unless
/// `tol.close_choices` allows and that step's logits agree
/// ([`rounding_flip`]). The reference was fed `history` after the prompt
/// (its step i saw `history[..i]`: the run's own tokens, so a close choice
/// does not end the comparison); steps after the first token that leaves
/// `history` followed another history and are not compared. Prints one
/// line, `verify: identical — <n> <what> (first: ..); logits NMSE at most
/// <worst> (bound <bound>) over <n> steps` (`identical except <k> close
/// choice(s)` and the first of them, and the steps not compared, if any) or `verify: MISMATCH …` naming the first
/// token or step that differs, and returns whether they agree.
pub fn verify_line(
    what: &str,
    tokens: &[i32],
    logits: &[Vec<f32>],
    history: &[i32],
    ref_tokens: &[i32],
    ref_logits: &[Vec<f32>],
    tol: Tolerance,
) -> bool {
    let bound = tol.nmse;
    // Step i is comparable while the run's tokens before it are the history.
    let left = (0..tokens.len()).find(|&i| history.get(i) != Some(&tokens[i]));
    let compared = left.map_or(tokens.len(), |j| j + 1);
    if logits.len() != tokens.len()
        || ref_tokens.len() < compared
        || ref_logits.len() < compared
        || logits.iter().zip(ref_logits).take(compared).any(|(a, b)| a.len() != b.len())
    {
        println!(
            "verify: MISMATCH: {} tokens and {} logits rows here, {} tokens and {} rows on one device (or rows of other lengths)",
            tokens.len(),
            logits.len(),
            ref_tokens.len(),
            ref_logits.len()
        );
        return false;
    }
    let errors: Vec<f64> = logits.iter().zip(ref_logits).take(compared).map(|(a, b)| nmse(a, b)).collect();
    let worst = errors.iter().copied().fold(0.0f64, f64::max);
    let mut flips = Vec::new();
    for i in 0..compared {
        if tokens[i] == ref_tokens[i] {
            continue;
        }
        match rounding_flip(tol, &logits[i], &ref_logits[i], tokens[i], ref_tokens[i]) {
            Some(why) => flips.push((i, why)),
            None => {
                let pair = logit_pair(&ref_logits[i], ref_tokens[i], tokens[i]).unwrap_or_default();
                println!(
                    "verify: MISMATCH with one CPU device at token {i}: {} here, {} on one device ({pair}; this step's logits NMSE {:.3e})",
                    tokens[i], ref_tokens[i], errors[i]
                );
                return false;
            }
        }
    }
    if let Some(i) = errors.iter().position(|e| e.is_nan() || *e > bound) {
        println!(
            "verify: MISMATCH with one CPU device: the logits of step {i} are off by NMSE {:.3e} (bound {bound:e}; worst {worst:.3e}), though the tokens agree",
            errors[i]
        );
        return false;
    }
    let mut notes = String::new();
    if let Some((i, why)) = flips.first() {
        notes += &format!("; the first close choice at token {i} ({why})");
    }
    if let Some(j) = left.filter(|&j| j + 1 < tokens.len()) {
        notes +=
            &format!("; the {} steps after token {j} followed another history (not compared)", tokens.len() - j - 1);
    }
    let except = if flips.is_empty() { String::new() } else { format!(" except {} close choice(s)", flips.len()) };
    println!(
        "verify: identical{except} — {compared} {what} (first: {:?}); logits NMSE at most {worst:.2e} (bound {bound:e}) over {} steps{notes}",
        &tokens[..tokens.len().min(8)],
        errors.len()
    );
    true
}

/// Plain greedy decoding of `n` tokens after `prompt` on one CPU device
/// (`threads` threads), fed `forced` (each step's input the forced token,
/// not its own choice): its own choices and the logits of each step, the
/// reference [`verify_line`] compares a run on other devices with.
fn one_cpu_reference(
    model: &Path,
    kv: KvTypes,
    prompt: &[i32],
    n: usize,
    forced: &[i32],
    threads: usize,
) -> shardgraph::Result<(Vec<i32>, Vec<Vec<f32>>)> {
    use shardgraph_models::qwen3::Qwen3Session;
    use shardgraph_models::qwen35::Qwen35Session;
    let one = Devices::cpu(1, threads)?;
    let file = shardgraph::gguf::GgufFile::open(model)?;
    let ctx = (prompt.len() + n + 1) as i64;
    if Qwen35Hparams::from_gguf(&file).is_ok() {
        greedy_logits(&mut Qwen35Session::load(model, &one, kv, ctx)?, prompt, n, Some(forced))
    } else {
        greedy_logits(&mut Qwen3Session::load(model, &one, kv, ctx)?, prompt, n, Some(forced))
    }
}

/// Greedy decoding of `n` tokens after `prompt` on `target` (each token
/// the previous step's argmax, or `forced[i]` when given); the tokens
/// chosen and the logits `[n_vocab]` they were chosen from.
fn greedy_logits(
    target: &mut impl Target,
    prompt: &[i32],
    n: usize,
    forced: Option<&[i32]>,
) -> shardgraph::Result<(Vec<i32>, Vec<Vec<f32>>)> {
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    let mut input = prompt.to_vec();
    for i in 0..n {
        let out = target.decode(&input, &[], true)?;
        let l = out.logits.unwrap_or_default();
        let v = l.len() / input.len().max(1);
        logits.push(l[l.len() - v..].to_vec());
        let t = out.argmax.last().copied().unwrap_or(0);
        tokens.push(t);
        input = vec![forced.and_then(|f| f.get(i).copied()).unwrap_or(t)];
    }
    Ok((tokens, logits))
}

/// `--verify`'s check of the layers: a target of `model`'s architecture and
/// shape with random weights (written once into the temp folder), whose
/// every layer moves the logits — the generated permutation targets keep
/// their greedy tokens whatever their layers do — decoded greedily on
/// `devices` and on one CPU device fed the same tokens: the logits of
/// every step within [`verify_tolerance`]'s bound (a `qwen3`) or 1e-2 (a `qwen35`).
/// Prints `verify: layers …` and returns whether they agree.
pub fn verify_layers(
    devices: &Devices,
    model: &Path,
    kv: KvTypes,
    prompt: &[i32],
    n: usize,
    threads: usize,
) -> shardgraph::Result<bool> {
    use shardgraph_models::generate::write_qwen3_gguf_with;
    use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session};
    use shardgraph_models::qwen35::Qwen35Session;
    let file = shardgraph::gguf::GgufFile::open(model)?;
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    let ctx = (prompt.len() + n + 1) as i64;
    let one = Devices::cpu(1, threads)?;
    let qwen35 = Qwen35Hparams::from_gguf(&file);
    // Random weights amplify rounding more in the hybrid's recurrent layers:
    // measured on the example qwen35 on 2 CPU devices, NMSE up to 9.6e-4
    // (1.0e-3 to 3.8e-3 for the tiny one on 2 emulated GPUs).
    let bound = if qwen35.is_ok() { 1e-2 } else { verify_tolerance(devices).nmse };
    let ((tokens, logits), (_, want)) = if let Ok(hp) = qwen35 {
        let p = std::env::temp_dir().join(format!("shardgraph-verify-qwen35-random-{}.gguf", std::process::id()));
        write_qwen35_gguf_with(&p, &hp, &types, 7, Weights::Random)?;
        let got = greedy_logits(&mut Qwen35Session::load(&p, devices, kv, ctx)?, prompt, n, None)?;
        let want = greedy_logits(&mut Qwen35Session::load(&p, &one, kv, ctx)?, prompt, n, Some(&got.0))?;
        let _ = std::fs::remove_file(&p);
        (got, want)
    } else {
        let hp = Qwen3Hparams::from_gguf(&file)?;
        let p = std::env::temp_dir().join(format!("shardgraph-verify-qwen3-random-{}.gguf", std::process::id()));
        write_qwen3_gguf_with(&p, &hp, &types, 7, Weights::Random)?;
        let got = greedy_logits(&mut Qwen3Session::load(&p, devices, kv, ctx)?, prompt, n, None)?;
        let want = greedy_logits(&mut Qwen3Session::load(&p, &one, kv, ctx)?, prompt, n, Some(&got.0))?;
        let _ = std::fs::remove_file(&p);
        (got, want)
    };
    let errors: Vec<f64> = logits.iter().zip(&want).map(|(a, b)| nmse(a, b)).collect();
    let worst = errors.iter().copied().fold(0.0f64, f64::max);
    let ok = errors.len() == n && errors.iter().all(|e| *e <= bound);
    println!(
        "verify: layers {} — the same shape with random weights, {n} greedy steps ({:?}…): logits NMSE at most {worst:.2e} against one CPU device fed the same tokens (bound {bound:e})",
        if ok { "identical" } else { "MISMATCH" },
        &tokens[..tokens.len().min(4)]
    );
    Ok(ok)
}

/// One measurement's setting.
pub struct Bench<'a> {
    /// The devices of the run.
    pub devices: &'a Devices,
    /// The target GGUF.
    pub model: &'a Path,
    /// The drafter.
    pub draft: DraftModel,
    /// Context, cache type and draft limits.
    pub params: EngineParams,
    /// The prompt.
    pub prompt: Vec<i32>,
    /// Tokens to generate.
    pub n_gen: usize,
    /// Greedy or sampled.
    pub sampler: SamplerParams,
    /// Check against plain greedy decoding on one CPU device.
    pub verify: bool,
    /// Worker threads of the one-device check.
    pub threads: usize,
}

/// Loads `b.model` with `b.draft` on `b.devices` and times a generation of
/// `b.n_gen` tokens after a warm-up of up to 8 (then a reset); returns the
/// engine, what it generated (with `b.verify`, the logits of every token's
/// step too, read back within the timed run), the seconds it took and the
/// bytes it moved between devices.
fn timed(b: &Bench<'_>, draft: DraftModel) -> shardgraph::Result<(Engine, Generation, f64, u64)> {
    let mut e = Engine::load(b.devices, b.model, draft, &b.params)?;
    e.generate(&b.prompt, b.n_gen.min(8), &b.sampler)?;
    e.reset()?;
    let before = e.bytes_moved();
    let t = Instant::now();
    let opts = GenerateOptions { logits: b.verify, ..GenerateOptions::default() };
    let g = e.generate_with(&b.prompt, b.n_gen, &b.sampler, opts)?;
    let s = t.elapsed().as_secs_f64();
    let bytes = e.bytes_moved() - before;
    Ok((e, g, s, bytes))
}

/// Checks the files and their pairing ([`Engine::check`]), then plain
/// decoding, then speculative decoding, each with [`Engine`] on the
/// same devices (after a short warm-up); prints tokens/s, drafted and
/// accepted counts, the speed-up and the bytes moved between devices. When
/// greedy, the two outputs must be equal (else `verify: MISMATCH` and exit
/// status 1), and with `verify` both runs are compared with plain greedy
/// decoding on one CPU device ([`verify_line`]: the tokens, and the logits
/// each token was chosen from within [`verify_tolerance`]), and the layers are
/// checked on a random-weights model of the same shape ([`verify_layers`]);
/// each prints `verify: identical …` / `verify: layers identical …`, else
/// `verify: MISMATCH …` and exit status 1.
pub fn bench(b: &Bench<'_>) -> shardgraph::Result<()> {
    // Every file, and target and drafter together, before any decoding: a
    // wrong drafter is refused now, not after the plain baseline.
    Engine::check(b.devices, b.model, &b.draft, &b.params)?;
    let greedy = b.sampler.is_greedy();
    let how = if greedy { "greedy" } else { "sampling" };
    // One engine at a time: the plain one is dropped before the other loads.
    let (plain, plain_logits, plain_s) = {
        let (_, g, s, _) = timed(b, DraftModel::None)?;
        (g.tokens, g.logits, s)
    };
    let (e, g, spec_s, bytes) = timed(b, b.draft.clone())?;
    let st = g.stats;
    let (plain_tps, spec_tps) = (b.n_gen as f64 / plain_s, b.n_gen as f64 / spec_s);
    println!("plain {how}: {} tokens/s", rate(plain_tps));
    println!(
        "{:<13} {} tokens/s; drafted {}, accepted {} ({:.0}%), {} target steps ({:.2} tokens per step), n_max {}",
        format!("{}:", e.draft_kind()),
        rate(spec_tps),
        st.drafted,
        st.accepted,
        100.0 * st.accepted as f64 / st.drafted.max(1) as f64,
        st.target_steps,
        b.n_gen.saturating_sub(1) as f64 / st.target_steps.max(1) as f64,
        e.spec_params().n_max
    );
    println!(
        "speed-up over plain {how}: {:.2}x; {bytes} bytes moved between devices ({:.0} per token)",
        spec_tps / plain_tps,
        bytes as f64 / b.n_gen as f64
    );
    let (tokens, logits) = (g.tokens, g.logits);
    drop(e);
    if !greedy {
        println!("tokens (first 8): {:?}", &tokens[..tokens.len().min(8)]);
        return Ok(());
    }
    let tol = verify_tolerance(b.devices);
    if let Some(i) = (0..plain.len().max(tokens.len())).find(|&i| plain.get(i) != tokens.get(i)) {
        // (The verification batch runs other kernels than a one-token step:
        // on a GPU their rounding can flip a close choice.)
        let near = match (plain.get(i), tokens.get(i), plain_logits.get(i), logits.get(i)) {
            (Some(&p), Some(&t), Some(l), Some(h)) => rounding_flip(tol, h, l, t, p),
            _ => None,
        };
        match near {
            Some(near) => println!(
                "speculative tokens equal plain greedy on the same devices up to a close choice at token {i} ({}; plain decoding is the reference)",
                near
            ),
            None => {
                println!("verify: MISMATCH between plain greedy and speculative on the same devices at token {i}");
                std::process::exit(1);
            }
        }
    }
    if b.verify {
        let kv = KvTypes::new(b.params.cache_type_k, b.params.cache_type_v);
        // One CPU device fed the plain run's tokens: every step of it is
        // compared, a close choice included.
        let (ref_tokens, ref_logits) = if b.devices.n_devices() == 1 && b.devices.all_cpu() {
            (plain.clone(), plain_logits.clone())
        } else {
            one_cpu_reference(b.model, kv, &b.prompt, b.n_gen, &plain, b.threads)?
        };
        // Plain decoding on these devices, then speculative decoding (its
        // logits from the verification batches) against the same reference.
        let plain_ok = verify_line(
            "plain greedy tokens equal plain greedy decoding on one CPU device",
            &plain,
            &plain_logits,
            &plain,
            &ref_tokens,
            &ref_logits,
            tol,
        );
        let spec_ok = verify_line(
            "tokens equal plain greedy decoding on one CPU device",
            &tokens,
            &logits,
            &plain,
            &ref_tokens,
            &ref_logits,
            tol,
        );
        let layers_ok = verify_layers(b.devices, b.model, kv, &b.prompt, b.n_gen.min(16), b.threads)?;
        if !(plain_ok && spec_ok && layers_ok) {
            std::process::exit(1);
        }
    }
    Ok(())
}
