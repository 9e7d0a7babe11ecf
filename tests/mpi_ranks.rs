//! Devices in several processes (feature `mpi`): each test starts this test
//! binary under `mpirun -n 2|3` (Open MPI, as `scripts/setup.sh` installs
//! it), running one of the `rank_*` functions below in every process, with
//! MPI forced onto TCP between processes (`OMPI_MCA_btl=tcp,self` with the
//! `ob1` messaging layer: no shared memory, as if each process were on a
//! node of its own). Each process has one CPU device with one thread.
//!
//! The world's decoding is compared, in every process, with the same model
//! on one device and on the same devices as threads of one process: tokens
//! equal, logits bit for bit equal to one process's N devices (the same plan
//! and kernels: only the transport differs), and the bytes moved between
//! processes equal to the plan's.

#[path = "common/decode.rs"]
mod decode;
use decode::{generate, nmse, tiny_hp};
use shardgraph::split::{Devices, LinkClass, SplitMode, World};
use shardgraph::GgmlType;
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3Hparams, Qwen3Session};
use shardgraph_models::types::TensorTypes;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Set in the processes `mpirun` starts: which split to run.
const MODE: &str = "SHARDGRAPH_TEST_MPI_MODE";

/// Runs `rank_fn` (a test of this binary) in `np` processes; returns
/// mpirun's output and how long it ran.
fn mpirun(np: usize, rank_fn: &str, mode: &str) -> (Output, Duration) {
    let exe = std::env::current_exe().unwrap();
    let t = Instant::now();
    let out = Command::new("mpirun")
        // As root (CI), and more processes than cores.
        .args(["--allow-run-as-root", "--oversubscribe", "-n", &np.to_string()])
        .arg(&exe)
        .args([rank_fn, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(MODE, mode)
        // One process's devices priced as the processes' link (same node's
        // default), so both make the same plan: their logits are then
        // compared bit for bit.
        .env("SHARDGRAPH_LINK_SAME_PROCESS", "25,5")
        .env("OMPI_MCA_pml", "ob1")
        .env("OMPI_MCA_btl", "tcp,self")
        .output()
        .unwrap_or_else(|e| panic!("mpirun (Open MPI: scripts/setup.sh installs it): {e}"));
    (out, t.elapsed())
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A 4-layer tiny qwen3: layers to spread over 3 processes.
fn hp() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(4, 64, 128, 6, 3, 32), ..tiny_hp() }
}

const PROMPT: [i32; 6] = [3, 17, 42, 5, 88, 1];

/// The model's weights and KV cache types in every test.
fn types() -> (TensorTypes, GgmlType) {
    (TensorTypes::uniform(GgmlType::Q8_0), GgmlType::Q4_0)
}

/// A seeded session on one CPU device per process, the world's tensor
/// split `ratios` (equal when `None`).
fn world_session(world: &Arc<World>, ratios: Option<&[f32]>) -> Qwen3Session {
    let devices = Devices::cpu(1, 1).unwrap().across_processes(world).unwrap();
    let devices = match ratios {
        Some(r) => devices.with_tensor_split(r).unwrap(),
        None => devices,
    };
    let (types, kv) = types();
    decode::seeded_session_on(hp(), &devices, &types, kv, 32)
}
const STEPS: usize = 6;

/// Every process: `mode` is `tensor`, `layer` or `hybrid` with the world's ratios
/// after a colon (`layer:3,1`), `emu-` first for an emulated CUDA device
/// per process instead of a CPU device, `x2-` first for two devices per
/// process; decodes on the world and checks it against one process (the
/// same kind of devices), and where the plans' bytes cross links.
#[test]
#[ignore = "run in every process by mpirun from the tests below"]
fn rank_decode() {
    let Ok(mode) = std::env::var(MODE) else { return };
    let world = World::init().unwrap();
    let (per, rest) = mode.strip_prefix("x2-").map_or((1, mode.as_str()), |r| (2, r));
    let (kind, rest) = rest.strip_prefix("emu-").map_or(("CPU", rest), |r| ("EMU", r));
    let open = |n: usize| Devices::open(&vec![kind; n], 1).unwrap();
    let (split, ratios) = rest.split_once(':').unwrap();
    let ratios: Vec<f32> = ratios.split(',').map(|r| r.parse().unwrap()).collect();
    let split = match split {
        "layer" => SplitMode::Layer,
        "hybrid" => SplitMode::Hybrid,
        _ => SplitMode::Tensor,
    };
    let (types, kv) = types();
    let session = |d: &Devices| decode::seeded_session_on(hp(), d, &types, kv, 32);

    let devices = open(per).across_processes(&world).unwrap();
    assert_eq!(devices.n_devices(), world.size() * per);
    assert!(devices.is_local(world.rank() * per));
    // One machine: devices of two processes are on the same node.
    assert_eq!(devices.slowest_link(), LinkClass::SameNode);
    assert_eq!(devices.link_class(world.rank() * per, world.rank() * per), LinkClass::SameProcess);
    assert_eq!(devices.link_class(0, per), LinkClass::SameNode);
    assert_eq!(devices.link_model().unwrap(), LinkClass::SameNode.default_model());
    // Every process agrees on the transport: MPI, and for GPUs why not NCCL
    // (emulated devices: process 0 says so first, the same text everywhere).
    let exchanges = devices.exchanges();
    assert!(exchanges.starts_with(&format!("MPI between {} processes", world.size())), "{exchanges}");
    if kind == "EMU" {
        let why =
            format!("not NCCL/RCCL: split: process 0 of {}: cuda: EMU0: NCCL/RCCL needs a real GPU", world.size());
        assert!(exchanges.contains(&why), "{exchanges}");
    } else {
        assert!(!exchanges.contains("NCCL"), "{exchanges}");
    }
    let devices = devices.with_tensor_split(&ratios).unwrap().with_split_mode(split);
    let mut s = session(&devices);
    let (got, logits) = generate(&mut s, &PROMPT, STEPS);

    let (want, want_logits) = generate(&mut session(&open(1)), &PROMPT, STEPS);
    // The hybrid split's groups are the processes' devices; one process's
    // devices are grouped alike to compare with it.
    let threads = open(ratios.len()).with_tensor_split(&ratios).unwrap().with_split_mode(split);
    let threads = if split == SplitMode::Hybrid { threads.with_groups(devices.groups()).unwrap() } else { threads };
    let mut t = session(&threads);
    let (in_process, in_process_logits) = generate(&mut t, &PROMPT, STEPS);
    assert_eq!(got, want, "{mode}: tokens against one device");
    assert_eq!(got, in_process, "{mode}: tokens against one process's devices");
    let worst = logits.iter().zip(&want_logits).map(|(a, b)| nmse(a, b)).fold(0.0, f64::max);
    assert!(worst < 1e-4, "{mode}: logits NMSE {worst} against one device");
    assert_eq!(logits, in_process_logits, "{mode}: logits against one process's devices");
    let (moved, planned) = (s.runner().bytes_moved(), s.runner().bytes_planned());
    assert_eq!(moved, planned, "{mode}: bytes moved between processes against the plan");
    assert_eq!(moved, t.runner().bytes_moved(), "{mode}: bytes moved against one process's devices");
    // Every planned byte crosses a link; with one device per process every
    // collective crosses processes; with two, a layer split's boundaries
    // alternate: inside a process, between processes, inside, ...
    let by_link = s.runner().planned_by_link();
    assert_eq!(by_link.iter().map(|l| l.1).sum::<u64>(), planned, "{mode}: {by_link:?}");
    assert_eq!(by_link[2], (0, 0), "{mode}: nothing crosses machines");
    if per == 1 {
        assert_eq!(by_link[0], (0, 0), "{mode}: {by_link:?}");
    } else if split == SplitMode::Layer {
        let n = world.size() * per;
        let (inside, across) = (n - world.size(), world.size() - 1);
        assert_eq!(by_link[0].0 * across as u64, by_link[1].0 * inside as u64, "{mode}: {by_link:?}");
        assert!(by_link[1].0 > 0, "{mode}: {by_link:?}");
    } else if split == SplitMode::Hybrid {
        // Tensor split inside each process, layers across: per run, one
        // collective crosses processes, the hidden state at the boundary
        // (64 F32 per token to each of the next process's 2 devices).
        assert_eq!(devices.groups().len(), world.size(), "{mode}");
        let runs = s.runner().exec().counters().runs;
        let tokens = (PROMPT.len() + STEPS - 1) as u64;
        assert_eq!(by_link[1], (runs, tokens * 2 * 64 * 4), "{mode}: {by_link:?} over {runs} runs");
    }
    // In one process, every byte stays in it.
    let one = t.runner().planned_by_link();
    assert_eq!((one[0].1, one[1], one[2]), (planned, (0, 0), (0, 0)), "{mode}: {one:?}");
    println!(
        "process {} of {}: {mode}: tokens {got:?} (one device {want:?}), logits NMSE {worst:.2e}, {moved} bytes moved = planned {planned}, by link {by_link:?}",
        world.rank(),
        world.size()
    );
    world.finalize();
}

fn decodes_equal(np: usize, mode: &str) {
    let (out, took) = mpirun(np, "rank_decode", mode);
    let t = text(&out);
    assert!(out.status.success(), "mpirun -n {np} ({mode}) failed:\n{t}");
    for r in 0..np {
        assert!(t.contains(&format!("process {r} of {np}: {mode}:")), "process {r} did not finish:\n{t}");
    }
    println!("mpirun -n {np} {mode}: {:.1} s\n{t}", took.as_secs_f64());
}

#[test]
fn two_processes_tensor_split_decode_as_one() {
    decodes_equal(2, "tensor:1,1");
}

#[test]
fn three_processes_tensor_split_decode_as_one() {
    decodes_equal(3, "tensor:3,2,1");
}

/// GPU devices across processes (emulated: no GPU here): their messages
/// staged through host memory by the MPI communicator.
#[cfg(feature = "cuda-emu")]
#[test]
fn two_processes_of_emulated_gpus_decode_as_one() {
    decodes_equal(2, "emu-tensor:1,1");
}

#[test]
fn two_and_three_processes_layer_split_decode_as_one() {
    decodes_equal(2, "layer:1,1");
    decodes_equal(3, "layer:1,1,1");
}

/// Two devices in each of two processes: a layer split's boundaries inside
/// a process and between processes are told apart (by link), a tensor
/// split's collectives all cross processes.
#[test]
fn two_processes_of_two_devices_split_as_one() {
    decodes_equal(2, "x2-layer:1,1,1,1");
    decodes_equal(2, "x2-tensor:1,1,1,1");
}

/// The hybrid split over two processes of two devices: tensor split
/// inside each process, the layers shared between them; the same tokens
/// and logits as one process's four devices grouped alike, and only the
/// hidden state crosses processes.
#[test]
fn two_processes_of_two_devices_hybrid_split_as_one() {
    decodes_equal(2, "x2-hybrid:1,1,1,1");
}

/// Every process passes its own tensor split: process 1 a different one.
#[test]
#[ignore = "run in every process by mpirun from the tests below"]
fn rank_mismatch() {
    let Ok(_) = std::env::var(MODE) else { return };
    let world = World::init().unwrap();
    let ratios = if world.rank() == 1 { [1.0, 3.0] } else { [1.0, 1.0] };
    let mut s = world_session(&world, Some(&ratios));
    let Err(err) = s.decode(&PROMPT, &[], true) else { panic!("a run with another plan in one process") };
    println!("process {} refused: {err}", world.rank());
    world.finalize();
}

/// A process with another tensor split (as with another model file or
/// option): every process gets an error before its first step runs, none
/// hangs.
#[test]
fn a_process_with_another_plan_is_an_error_on_every_process() {
    let (out, took) = mpirun(2, "rank_mismatch", "mismatch");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for r in 0..2 {
        let line = t.lines().find(|l| l.contains(&format!("process {r} refused:"))).unwrap_or_else(|| panic!("{t}"));
        assert!(line.contains("differs from process 0's"), "{line}");
    }
    assert!(took < Duration::from_secs(60), "{took:?}");
}

/// Process 1 prices the links between nodes differently
/// (`SHARDGRAPH_LINK_OTHER_NODE`) from process 0.
#[test]
#[ignore = "run in every process by mpirun from the tests below"]
fn rank_links() {
    let Ok(_) = std::env::var(MODE) else { return };
    let world = World::init().unwrap();
    // Values that price alike are alike: unset and the default written out
    // another way (a newline in a value shifts nothing).
    if world.rank() == 1 {
        std::env::set_var(LinkClass::SameNode.env_var(), "25.0,5.0\n");
    } else {
        std::env::remove_var(LinkClass::SameNode.env_var());
    }
    if world.rank() == 1 {
        std::env::set_var(LinkClass::OtherNode.env_var(), "40,1");
    }
    let Err(err) = Devices::cpu(1, 1).unwrap().across_processes(&world) else { panic!("links differ, no error") };
    println!("process {} refused: {err}", world.rank());
    world.finalize();
}

/// Processes given different link variables: every process gets an error
/// naming the variable and both values when the world's devices are
/// gathered, before any plan.
#[test]
fn processes_with_other_link_variables_are_an_error_naming_them() {
    let (out, took) = mpirun(2, "rank_links", "links");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for r in 0..2 {
        let line = t.lines().find(|l| l.contains(&format!("process {r} refused:"))).unwrap_or_else(|| panic!("{t}"));
        assert!(
            line.contains("SHARDGRAPH_LINK_OTHER_NODE is unset in process 0 but \"40,1\" in process(es) [1]"),
            "{line}"
        );
    }
    assert!(took < Duration::from_secs(60), "{took:?}");
}

/// Process 1 decodes one step more than process 0, which has ended.
#[test]
#[ignore = "run in every process by mpirun from the tests below"]
fn rank_diverge() {
    let Ok(_) = std::env::var(MODE) else { return };
    let world = World::init().unwrap();
    let mut s = world_session(&world, None);
    s.decode(&PROMPT, &[], true).unwrap();
    for _ in 0..2 + world.rank() {
        if let Err(e) = s.decode(&[5], &[], true) {
            println!("process {} refused: {e}", world.rank());
            break;
        }
    }
    world.finalize();
}

/// Processes that run different numbers of steps (another `--n-predict`):
/// the one that goes on gets an error naming the one that ended, at the
/// start of its extra run, before any exchange; nothing hangs.
#[test]
fn a_process_that_runs_more_steps_than_another_gets_an_error() {
    let (out, took) = mpirun(2, "rank_diverge", "diverge");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let line = t.lines().find(|l| l.contains("process 1 refused:")).unwrap_or_else(|| panic!("{t}"));
    assert!(line.contains("process 0 has ended") && line.contains("diverged"), "{line}");
    assert!(!t.contains("process 0 refused"), "{t}");
    assert!(took < Duration::from_secs(60), "{took:?}");
}

/// Every process checks the world's memory before loading: process 1's
/// device does not fit what it is given (`emu`: an emulated GPU of 1 MiB
/// given 2 MiB; else its CPU device given more than any host has); every
/// process gets the same typed out-of-memory error naming it, and a fit
/// passes everywhere.
#[test]
#[ignore = "run in every process by mpirun from the tests below"]
fn rank_oom() {
    let Ok(mode) = std::env::var(MODE) else { return };
    let world = World::init().unwrap();
    let local = match mode.as_str() {
        #[cfg(feature = "cuda-emu")]
        "emu" => {
            let memory = if world.rank() == 1 { 1 << 20 } else { 64 << 20 };
            let b: Arc<dyn shardgraph::backend::Backend> =
                Arc::new(shardgraph::backend::cuda::CudaBackend::emulated(memory));
            Devices::from_backends(vec![b]).unwrap()
        }
        _ => Devices::cpu(1, 1).unwrap(),
    };
    let devices = local.across_processes(&world).unwrap();
    let exec = devices.executor().unwrap();
    exec.check_memory(&[1 << 20, 1 << 20], "the weights").unwrap();
    let too_much = if mode == "emu" { 2 << 20 } else { u64::MAX / 4 };
    let e = exec.check_memory(&[1 << 20, too_much], "the weights").unwrap_err();
    let shardgraph::Error::OutOfMemory { device, needed, .. } = &e else { panic!("{mode}: {e}") };
    if mode == "emu" {
        // Process 1's GPU, by its own memory.
        assert!(device.starts_with("device 1 (EMU") && device.ends_with("@1)"), "{mode}: {e}");
        assert_eq!(*needed, too_much, "{mode}: {e}");
    } else {
        // One machine: both processes' CPU devices share its host memory.
        assert_eq!(device, "devices 0+1 (CPU0@0+CPU0@1, host memory)", "{mode}: {e}");
        assert_eq!(*needed, too_much + (1 << 20), "{mode}: {e}");
    }
    println!("process {} of {}: {mode}: {e}", world.rank(), world.size());
    world.finalize();
}

#[test]
fn a_process_whose_device_does_not_fit_is_an_out_of_memory_error_on_every_process() {
    let modes: &[&str] = if cfg!(feature = "cuda-emu") { &["cpu", "emu"] } else { &["cpu"] };
    for mode in modes {
        let (out, _) = mpirun(2, "rank_oom", mode);
        let t = text(&out);
        assert!(out.status.success(), "{mode}:\n{t}");
        let lines: Vec<&str> = t.lines().filter_map(|l| l.split_once(&format!(": {mode}: "))).map(|(_, e)| e).collect();
        assert_eq!(lines.len(), 2, "{mode}:\n{t}");
        assert_eq!(lines[0], lines[1], "{mode}: the same error on both processes");
        println!("{mode}: {}", lines[0]);
    }
}

/// Process 1 dies (SIGKILL) in the middle of decoding; process 0 is in an
/// exchange with it.
#[test]
#[ignore = "run in every process by mpirun from the tests below"]
fn rank_killed() {
    let Ok(_) = std::env::var(MODE) else { return };
    let world = World::init().unwrap();
    // One write, so that the processes' lines do not interleave.
    let line = format!("process {} is pid {}\n", world.rank(), std::process::id());
    std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes()).unwrap();
    let mut s = world_session(&world, None);
    s.decode(&PROMPT, &[], true).unwrap();
    for step in 0..1000 {
        if world.rank() == 1 && step == 2 {
            let _ = Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
            std::thread::sleep(Duration::from_secs(60));
        }
        s.decode(&[5], &[], true).unwrap();
    }
    panic!("process {} decoded 1000 steps beside a killed process", world.rank());
}

/// A killed process ends the run: mpirun exits non-zero within 10 s,
/// naming the killed process's rank.
#[test]
fn a_killed_process_ends_the_others_within_10_s() {
    let (out, took) = mpirun(2, "rank_killed", "kill");
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    let at = t.find("process 1 is pid ").unwrap_or_else(|| panic!("process 1 did not start:\n{t}"));
    let pid: String = t[at + 17..].chars().take_while(char::is_ascii_digit).collect();
    assert!(!pid.is_empty(), "{t}");
    // Open MPI names the rank (its pid there can read 0).
    assert!(t.contains("process rank 1 with PID") && t.contains("signal 9"), "{t}");
    // The test's bound (the 10 s) on the whole run, start-up included.
    assert!(took < Duration::from_secs(10), "{took:?}\n{t}");
    println!("killed process 1 (pid {pid}): mpirun ended after {:.1} s\n{t}", took.as_secs_f64());
}

/// The built example `name` (`cargo test` builds the examples next to the
/// test binaries, with this run's features).
fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().and_then(|d| d.parent()).unwrap().join("examples").join(name);
    // (An example built without the `mpi` feature exits under mpirun
    // saying so: "this build has no `mpi` feature".)
    assert!(
        p.is_file(),
        "{} is not built: run `cargo test --features mpi` or `cargo build --features mpi --examples`",
        p.display()
    );
    p
}

/// The lines of `out` that hold `key`.
fn lines_with<'a>(out: &'a str, key: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.contains(key)).collect()
}

/// The main job (`dflash2 --verify`, on the example pair written to a temp
/// folder) under `mpirun -n 2`, one device per process: it verifies
/// (tokens equal one device's), and drafts, accepts and moves exactly what
/// one process with two devices does.
#[test]
fn the_main_job_runs_across_two_processes_as_in_one() {
    let dir = std::env::temp_dir().join(format!("shardgraph-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (target, drafter) = shardgraph_models::generate::write_example_pair(&dir).unwrap();
    let args = [
        "--model",
        target.to_str().unwrap(),
        "--model-draft",
        drafter.to_str().unwrap(),
        "--n-predict",
        "24",
        "--prompt-tokens",
        "5,17,300,42,7,1000,3,88",
    ];
    let exe = example("dflash2");
    let one = Command::new(&exe).args(args).args(["--devices", "2", "--verify"]).output().unwrap();
    let one_text = text(&one);
    assert!(one.status.success(), "{one_text}");
    let two = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .arg(&exe)
        .args(args)
        .arg("--verify")
        .env("OMPI_MCA_pml", "ob1")
        .env("OMPI_MCA_btl", "tcp,self")
        .output()
        .unwrap();
    let two_text = text(&two);
    assert!(two.status.success(), "{two_text}");
    assert_eq!(lines_with(&two_text, "verify: identical").len(), 2, "{two_text}");
    assert!(two_text.contains("verify: layers identical"), "{two_text}");
    // Only rank 0 prints the results.
    assert_eq!(lines_with(&two_text, "dflash2: ").len(), 1, "{two_text}");
    let counts = |t: &str| -> String {
        let l = lines_with(t, "dflash2: ")[0];
        l[l.find("drafted").unwrap()..].to_string()
    };
    assert_eq!(counts(&two_text), counts(&one_text), "drafts and acceptance:\n{one_text}\n{two_text}");
    let moved = |t: &str| -> String {
        let l = lines_with(t, "bytes moved between devices")[0];
        l[l.find("; ").unwrap()..].to_string()
    };
    assert_eq!(moved(&two_text), moved(&one_text), "bytes moved:\n{one_text}\n{two_text}");
    println!("{two_text}");
    let _ = std::fs::remove_dir_all(&dir);
}
