//! The hostile-input suite: every case of the corpus (`tests/common/hostile.rs`:
//! edited copies of the generated models) is loaded as the examples load a
//! model, and must end in an `Err` with a message (or, for edits that may
//! leave a valid file, either outcome) — never a panic, an abort, a hang or
//! an allocation beyond a cap. The global allocator here counts live bytes
//! and refuses any request that would take them past [`CAP`], so a
//! metadata-sized allocation fails the test at once instead of exhausting
//! the machine; each case runs on a worker thread with a time bound.

#[path = "common/hostile.rs"]
mod hostile;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Live heap bytes the process may hold (tiny models need a few MB; the
/// rest is the corpus and the test harness).
const CAP: usize = 1 << 30;
/// Peak heap bytes one case may add over what was live before it.
const CASE_PEAK: usize = 256 << 20;
/// Time one case may take.
const CASE_TIME: Duration = Duration::from_secs(30);

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts, and
// returns null (an allocation failure the caller handles) past the cap.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        if now > CAP {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn every_hostile_model_file_is_an_error_not_a_crash() {
    let bases = hostile::bases();
    let target = bases[0].bytes.clone();
    // The bases themselves load and decode.
    for b in &bases {
        hostile::load(&b.bytes, &target).unwrap_or_else(|e| panic!("base {} does not load: {e}", b.arch));
    }
    let (mut n, mut failures, mut loaded) = (0, Vec::new(), 0);
    let mut slowest = (Duration::ZERO, String::new());
    let mut peak = (0usize, String::new());
    // The cases of the field report, with what their error must name.
    let mut reported: Vec<(&str, &str, Option<String>)> = vec![
        ("dflash: dflash.block_count = 2^31-1", "dflash.block_count", None),
        ("dflash: dflash.block_count = 2^32-1", "dflash.block_count", None),
        ("qwen3: qwen3.block_count = 2^31-1", "qwen3.block_count", None),
        ("dflash: dflash.block_size = 2^31-1", "dflash.block_size", None),
        ("dflash: dflash.conv_kernel_size = 2^31-1", "conv_base", None),
        ("qwen3: qwen3.vocab_size = 2^31-1", "token_embd.weight", None),
        ("qwen3: qwen3.attention.value_length = 0", "value_length", None),
        ("qwen3: qwen3.context_length = 0", "context_length", None),
        ("qwen3: qwen3.rope.dimension_count = 0", "dimension_count", None),
        ("qwen3: qwen3.attention.layer_norm_rms_epsilon = inf", "layer_norm_rms_epsilon", None),
        ("qwen3: tensor output.weight at the previous tensor's offset", "overlap", None),
        ("qwen3: tensor token_embd.weight retyped q4_k", "token_embd.weight", None),
    ];
    for b in &bases {
        hostile::cases(b, &mut |case| {
            n += 1;
            if std::env::var_os("HOSTILE_TRACE").is_some() {
                eprintln!("case {n}: {}", case.name);
            }
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            let (tx, rx) = std::sync::mpsc::channel();
            let (bytes, tgt) = (case.bytes, target.clone());
            let start = Instant::now();
            std::thread::spawn(move || {
                let r = std::panic::catch_unwind(|| hostile::load(&bytes, &tgt).map_err(|e| e.to_string()));
                let _ = tx.send(r);
            });
            let result = rx.recv_timeout(CASE_TIME);
            let took = start.elapsed();
            if took > slowest.0 {
                slowest = (took, case.name.clone());
            }
            let grew = PEAK.load(Ordering::Relaxed).saturating_sub(before);
            if grew > peak.0 {
                peak = (grew, case.name.clone());
            }
            if let (Some(r), Ok(Ok(res))) = (reported.iter_mut().find(|r| r.0 == case.name), &result) {
                r.2 = Some(res.as_ref().err().cloned().unwrap_or_else(|| "loaded".into()));
            }
            let verdict = match result {
                Err(_) => Some(format!("no result within {CASE_TIME:?}")),
                Ok(Err(_)) => Some("panicked".to_string()),
                Ok(Ok(Ok(()))) if case.expect == hostile::Expect::Err => Some("loaded".to_string()),
                Ok(Ok(Ok(()))) => {
                    loaded += 1;
                    None
                }
                Ok(Ok(Err(m))) if m.trim().is_empty() => Some("an error without a message".to_string()),
                Ok(Ok(Err(_))) => None,
            };
            let verdict = verdict.or_else(|| (grew > CASE_PEAK).then(|| format!("took {grew} bytes of heap")));
            if let Some(v) = verdict {
                failures.push(format!("{}: {v}", case.name));
            }
        });
    }
    println!(
        "hostile: {n} cases, {} failures ({loaded} loaded where allowed); slowest {:.1} ms ({}); largest heap growth \
         {:.1} MB ({})",
        failures.len(),
        slowest.0.as_secs_f64() * 1e3,
        slowest.1,
        peak.0 as f64 / 1e6,
        peak.1
    );
    for (case, names, error) in &reported {
        let error = error.as_deref().unwrap_or_else(|| panic!("the corpus lacks {case:?}"));
        println!("  {case}: {error}");
        assert!(error.contains(names), "{case}: the error should name {names:?}: {error}");
    }
    assert!(failures.is_empty(), "{} of {n} cases failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn sizes_from_callers_are_bounded() {
    use shardgraph::gguf::GgufFile;
    use shardgraph::split::Devices;
    use shardgraph::GgmlType;
    use shardgraph_models::qwen3::Qwen3Session;
    use shardgraph_models::speculative::{generate, SpecParams};
    use shardgraph_models::step::MAX_DRAFT;
    let target = hostile::bases().swap_remove(0).bytes;
    let f = GgufFile::from_bytes(target, "qwen3.gguf").unwrap();
    // A cache no device can hold is refused before anything is allocated,
    // naming the device and the bytes (the example's --n-predict 100000000).
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    for kv in [100_000_025i64, i32::MAX as i64] {
        match Qwen3Session::load_file(&f, &Devices::cpu(2, 1).unwrap(), GgmlType::F16, kv) {
            Err(shardgraph::Error::OutOfMemory { needed, available, .. }) => assert!(needed > available, "{kv}"),
            other => panic!("kv_size {kv}: {:?}", other.map(|_| ())),
        }
    }
    assert!(PEAK.load(Ordering::Relaxed) - before < CASE_PEAK, "refusing took heap");
    for kv in [0, -1, 1 << 40, i64::MAX] {
        assert!(Qwen3Session::load_file(&f, &Devices::cpu(2, 1).unwrap(), GgmlType::F16, kv).is_err(), "kv_size {kv}");
    }
    // Ratios: negative, NaN, all zero, too many devices; thread counts: none,
    // too many.
    let load = |ratios: &[f32], threads: usize| {
        Devices::cpu(ratios.len(), threads)
            .and_then(|d| d.with_tensor_split(ratios))
            .and_then(|d| Qwen3Session::load_file(&f, &d, GgmlType::F16, 256))
            .map(|_| ())
    };
    for ratios in [vec![0.0, 0.0], vec![-1.0, 1.0], vec![f32::NAN, 1.0], vec![f32::INFINITY, 1.0]] {
        let e = load(&ratios, 1).unwrap_err();
        assert!(!e.to_string().is_empty(), "{ratios:?}");
    }
    // A device whose ratio gives it no KV head keeps the attention mirrored
    // (the policies' fallback): it loads.
    load(&[1e-45, 1.0], 1).unwrap();
    assert!(load(&[1.0; 65], 1).is_err());
    assert!(load(&[1.0], 0).is_err());
    assert!(load(&[1.0], 100_000).is_err());
    // Drafts per step are bounded, and a generation longer than the cache
    // stops with an error at the step that would overflow it.
    let mut s = Qwen3Session::load_file(&f, &Devices::cpu(2, 1).unwrap(), GgmlType::F16, 256).unwrap();
    let mut d = shardgraph_models::dflash::DflashDrafter::attach_file(
        &mut s,
        &GgufFile::from_bytes(hostile::bases().swap_remove(2).bytes, "dflash.gguf").unwrap(),
        GgmlType::F16,
        0.0,
    )
    .unwrap();
    let e = generate(&mut s, &mut d, &[1, 2], 8, SpecParams { n_max: MAX_DRAFT + 1, n_min: 0 }).unwrap_err();
    assert!(e.to_string().contains("n_max 257"), "{e}");
    let e = generate(&mut s, &mut d, &[1, 2], usize::MAX, SpecParams { n_max: 3, n_min: 0 }).unwrap_err();
    assert!(e.to_string().contains("too small"), "{e}");
    // p_min is a probability.
    let drafter = GgufFile::from_bytes(hostile::bases().swap_remove(2).bytes, "dflash.gguf").unwrap();
    for p_min in [f32::NAN, -0.5, 2.0] {
        let mut s = Qwen3Session::load_file(&f, &Devices::cpu(1, 1).unwrap(), GgmlType::F16, 256).unwrap();
        let e = shardgraph_models::dflash::DflashDrafter::attach_file(&mut s, &drafter, GgmlType::F16, p_min);
        assert!(e.is_err(), "p_min {p_min}");
    }
    // Snapshot slots are bounded (a verification batch's rows).
    let q35 = GgufFile::from_bytes(hostile::bases().swap_remove(1).bytes, "qwen35.gguf").unwrap();
    let one = Devices::cpu(1, 1).unwrap();
    let mut s35 = shardgraph_models::qwen35::Qwen35Session::load_file(&q35, &one, GgmlType::F16, 256).unwrap();
    for slots in [1, MAX_DRAFT + 2, usize::MAX] {
        assert!(s35.enable_snapshots(slots).is_err(), "{slots} slots");
    }
    assert!(shardgraph_models::mtp::MtpDrafter::new(&s35, f32::NAN).is_err());
}

#[test]
fn paths_that_are_not_model_files_are_errors() {
    use shardgraph::gguf::GgufFile;
    let dir = std::env::temp_dir().join(format!("shardgraph-hostile-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A FIFO would block an open for reading until a writer comes.
    let fifo = dir.join("fifo.gguf");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().map(|s| s.success()).unwrap_or(false);
    let mut paths = vec![dir.clone(), dir.join("missing.gguf"), std::path::PathBuf::from("/dev/null")];
    if made {
        paths.push(fifo);
    }
    for p in paths {
        let e = GgufFile::open(&p).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains(&p.display().to_string()), "{}: {e}", p.display());
    }
    // A key of the wrong type is named with its type and value.
    let mut w = shardgraph::gguf::GgufWriter::new();
    w.add_kv("qwen3.block_count", "2").unwrap();
    w.add_kv("n", -2i64).unwrap();
    let f = GgufFile::from_bytes(w.write_to(Vec::new(), |_, _| Ok(())).unwrap(), "k.gguf").unwrap();
    let e = f.get_uint("qwen3.block_count").unwrap_err().to_string();
    assert!(e.contains("is str \"2\", not a non-negative integer"), "{e}");
    let e = f.get_uint("n").unwrap_err().to_string();
    assert!(e.contains("is i64 -2,"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
