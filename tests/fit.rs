//! Fitting a session to the devices before anything is allocated: the
//! largest context (in 256-cell steps) whose weights, caches and worst
//! steps fit every device — for the `qwen3` target alone and `qwen3` /
//! `qwen35` targets with DFlash, DFlash2 and MTP drafters — checked
//! against devices that report small, made-up memory sizes: the chosen
//! context fits and 256 cells more do not; a device too small for 256
//! cells is an error naming it; nothing is allocated on the devices.
//!
//! "Fits" is judged twice: by the estimate `fit_ctx_size` searches
//! ([`FitSpec::memory`]), and by measurement, independent of it: the
//! session's long-lived tensors placed and its worst steps (every step over
//! the whole context, built here from the models' public API) run on
//! devices that count their buffers (`common/counting.rs`): at the chosen
//! context on devices that refuse to allocate past their memory, they run;
//! at 256 cells more, some device's measured peak exceeds its memory —
//! except for qwen35 + MTP, whose estimate is conservative (the measured
//! ratio is pinned, see the test).

use shardgraph::split::{DeviceSet, Devices, LinkModel, SplitMode};
use shardgraph::{Backend, Context, GgmlType, Graph, TensorId};
use shardgraph_models::dflash::{qwen35_dflash_policy, qwen3_dflash_policy, Dflash, DflashHparams, TargetInfo};
use shardgraph_models::fit::{fit_ctx_size, FitDraft, FitSpec, FitTarget, CTX_STEP};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{qwen3_policy, Qwen3, Qwen3Hparams};
use shardgraph_models::qwen35::{qwen35_policy, Qwen35, Qwen35Hparams};
use shardgraph_models::runner::Runner;
use shardgraph_models::types::TensorTypes;
use std::sync::Arc;

#[path = "common/counting.rs"]
mod counting;
#[path = "common/qwen35_tiny.rs"]
mod qwen35_tiny;

fn qwen3_target() -> FitTarget {
    let hp = Qwen3Hparams { core: HparamsCore::qwen3(3, 128, 256, 6, 3, 32), n_vocab: 160, n_ctx_train: 8192 };
    FitTarget::Qwen3 { hp, types: TensorTypes::uniform(GgmlType::Q8_0) }
}

fn qwen35_target() -> FitTarget {
    let hp = Qwen35Hparams { n_nextn: 1, n_ctx_train: 8192, ..qwen35_tiny::tiny() };
    FitTarget::Qwen35 { hp, types: TensorTypes::uniform(GgmlType::Q8_0) }
}

fn dflash(n_embd: i64, target_layers: Vec<usize>, n_vocab: i64, v2: bool) -> FitDraft {
    let hp = DflashHparams {
        core: HparamsCore::qwen3(2, n_embd, 256, 6, 3, 32),
        target_layers,
        target_hidden: n_embd,
        block_size: 5,
        mask_token: (n_vocab - 1) as i32,
        conv: v2.then_some((2, 16)),
        selector: v2.then_some((32, 8)),
    };
    FitDraft::Dflash { hp, types: TensorTypes::uniform(GgmlType::Q8_0) }
}

/// The specs: qwen3 alone, qwen3 + DFlash, qwen3 + DFlash2, qwen35 +
/// DFlash2, qwen35 + MTP (with snapshots), on `n` devices.
fn specs(n: usize) -> Vec<(&'static str, FitSpec)> {
    let spec = |target: FitTarget, draft: FitDraft, snapshot_slots: usize| FitSpec {
        target,
        draft,
        cache_types: GgmlType::F16.into(),
        ratios: vec![1.0; n],
        mode: SplitMode::Tensor,
        groups: Vec::new(),
        n_batch: 16,
        snapshot_slots,
        link: LinkModel::default(),
    };
    vec![
        ("qwen3", spec(qwen3_target(), FitDraft::None, 0)),
        ("qwen3 + dflash", spec(qwen3_target(), dflash(128, vec![1, 3], 160, false), 0)),
        ("qwen3 + dflash2", spec(qwen3_target(), dflash(128, vec![1, 3], 160, true), 0)),
        ("qwen35 + dflash2", spec(qwen35_target(), dflash(256, vec![1, 4], 320, true), 0)),
        ("qwen35 + mtp", spec(qwen35_target(), FitDraft::Mtp { n_max: 3 }, 4)),
    ]
}

fn totals(spec: &FitSpec, cells: i64) -> Vec<u64> {
    spec.memory(cells).unwrap().iter().map(|m| m.total()).collect()
}

/// Builds `spec`'s session with a context of `cells` on `backends` and runs
/// its worst steps once each (zero weights and inputs: the memory is the
/// same), as a session would: the long-lived tensors placed and uploaded
/// (weights, caches, snapshot slots), then a target step of
/// `max(n_batch, verification batch)` tokens with the drafter's taps, the
/// drafter's steps (DFlash: a block and an injection of `n_batch` rows;
/// MTP: a step of `n_batch` rows and a chain of `n_max`), every one over
/// all `cells`.
fn run_worst_steps(spec: &FitSpec, cells: i64, backends: Vec<Arc<dyn Backend>>) -> shardgraph::Result<()> {
    let devices = Devices::from_backends(backends)?.with_tensor_split(&spec.ratios)?;
    let (kv, r) = (spec.cache_types, &spec.ratios);
    let mut ctx = Context::new();
    enum T {
        Q3(Qwen3),
        Q35(Box<Qwen35>),
    }
    let (target, info, n_layer) = match &spec.target {
        FitTarget::Qwen3 { hp, types } => {
            let m = Qwen3::new(&mut ctx, hp.clone(), types, kv, cells)?;
            let info = TargetInfo::from(&m);
            (T::Q3(m), info, hp.n_layer)
        }
        FitTarget::Qwen35 { hp, types } => {
            let mut m = Qwen35::new(&mut ctx, hp.clone(), types, kv, cells)?;
            if spec.snapshot_slots > 0 {
                m.add_snapshots(&mut ctx, spec.snapshot_slots)?;
            }
            let info = TargetInfo::from(&m);
            (T::Q35(Box::new(m)), info, hp.n_layer)
        }
    };
    let dflash = match &spec.draft {
        FitDraft::Dflash { hp, types } => Some(Dflash::new(&mut ctx, info, hp.clone(), types, kv, cells)?),
        _ => None,
    };
    let tensor = |r: &[f32]| match (&spec.target, &spec.draft) {
        (FitTarget::Qwen3 { hp, types }, FitDraft::Dflash { hp: d, types: dt }) => {
            qwen3_dflash_policy(hp, types, d, dt, r)
        }
        (FitTarget::Qwen35 { hp, types }, FitDraft::Dflash { hp: d, types: dt }) => {
            qwen35_dflash_policy(hp, types, d, dt, r)
        }
        (FitTarget::Qwen3 { hp, types }, _) => qwen3_policy(hp, types, r),
        (FitTarget::Qwen35 { hp, types }, _) => qwen35_policy(hp, types, r),
    };
    let policy = match spec.mode {
        SplitMode::Layer => shardgraph::split::SplitPolicy::layer_split(r, n_layer)?,
        SplitMode::Hybrid => shardgraph::split::SplitPolicy::hybrid(r, &spec.groups, n_layer, &tensor)?,
        SplitMode::Tensor => tensor(r)?,
    };
    let base = ctx.len();
    let (verify, taps) = match &spec.draft {
        FitDraft::Dflash { hp, .. } => (hp.block_size as i64, hp.target_layers.clone()),
        FitDraft::Mtp { n_max } => (*n_max as i64 + 1, vec![n_layer]),
        FitDraft::None => (1, Vec::new()),
    };
    let t = spec.n_batch.max(verify);
    let mut steps: Vec<(Graph, Vec<TensorId>)> = Vec::new();
    let mut step = |ctx: &mut Context, outs: Vec<TensorId>| -> shardgraph::Result<()> {
        steps.push((ctx.build_forward(&outs)?, outs));
        Ok(())
    };
    match &target {
        T::Q3(m) => {
            let s = m.build_window(&mut ctx, t, cells, &taps)?;
            let mut outs = s.writes.clone();
            outs.extend(s.taps.iter().map(|x| x.1));
            outs.extend([s.logits, s.argmax]);
            step(&mut ctx, outs)?;
        }
        T::Q35(m) => {
            let s = m.build_window(&mut ctx, t, cells, &taps)?;
            let mut outs = s.writes.clone();
            outs.extend(s.taps.iter().map(|x| x.1));
            outs.extend([s.logits, s.argmax]);
            step(&mut ctx, outs)?;
            if let FitDraft::Mtp { n_max } = spec.draft {
                let st = m.build_mtp_window(&mut ctx, spec.n_batch, cells)?;
                let mut outs = st.writes.clone();
                outs.extend([st.h_out, st.argmax, st.top_prob]);
                step(&mut ctx, outs)?;
                let c = m.build_mtp_chain_window(&mut ctx, n_max, cells)?;
                let mut outs = c.writes.clone();
                outs.extend(c.steps.iter().flat_map(|s| [s.argmax, s.top_prob]));
                step(&mut ctx, outs)?;
            }
        }
    }
    if let Some(d) = &dflash {
        let b = d.build_block_window(&mut ctx, d.hp.block_size as i64, cells)?;
        let mut outs = b.writes.clone();
        match b.lattice {
            Some(l) => outs.push(l),
            None => outs.extend([b.argmax, b.top_prob]),
        }
        step(&mut ctx, outs)?;
        let inj = d.build_inject(&mut ctx, spec.n_batch)?;
        step(&mut ctx, inj.writes.clone())?;
    }
    let mut runner = Runner::new(policy, &devices)?;
    let ids: Vec<TensorId> = ctx.ids().take(base).collect();
    runner.place_all(&ctx, &ids, "the session's weights and caches")?;
    runner.upload()?;
    for (g, outs) in &steps {
        runner.run(&ctx, g, &[], outs)?;
    }
    Ok(())
}

/// The chosen context, judged by measurement: the worst steps run on
/// devices that refuse to allocate past `memory` (each device's measured
/// peak within it). Returns the peaks at `ctx` and, on devices that
/// allocate whatever is asked, at `ctx + 256`.
fn check_by_measurement(spec: &FitSpec, ctx: i64, memory: &[usize], what: &str) -> (Vec<u64>, Vec<u64>) {
    let (devs, counters) = counting::limited(memory);
    run_worst_steps(spec, ctx, devs).unwrap_or_else(|e| panic!("{what}: {ctx} cells chosen, but they do not run: {e}"));
    let at: Vec<u64> = counters.iter().map(|c| c.peak()).collect();
    for (j, (&p, &m)) in at.iter().zip(memory).enumerate() {
        assert!(p <= m as u64, "{what}: device {j} peaked at {p} bytes of {m}");
    }
    // Devices that report no memory size (the host's is far larger), so the
    // session is not refused before it runs: its peaks are measured.
    let (devs, counters) = counting::devices(memory.len(), None);
    let more = ctx + CTX_STEP;
    run_worst_steps(spec, more, devs).unwrap_or_else(|e| panic!("{what}: {more} cells: {e}"));
    let above: Vec<u64> = counters.iter().map(|c| c.peak()).collect();
    (at, above)
}

#[test]
fn the_chosen_ctx_size_fits_and_256_cells_more_do_not() {
    for n in [1, 2, 3] {
        for (name, spec) in specs(n) {
            // Devices sized for about 2900 cells, the last one for about 1700.
            let at = |cells: i64| totals(&spec, cells);
            let (big, small) = (at(2900), at(1700));
            let memory: Vec<usize> =
                (0..n).map(|j| if j + 1 == n && n > 1 { small[j] } else { big[j] } as usize).collect();
            let (devs, counters) = counting::devices(n, Some(&memory));
            let exec = Devices::from_backends(devs).and_then(|d| d.executor()).unwrap();
            let ctx = fit_ctx_size(&spec, spec.max_ctx(), &exec).unwrap();
            let what = format!("{name} on {n} device(s), memory {memory:?}");
            assert_eq!(ctx % CTX_STEP, 0, "{what}: {ctx}");
            let fits = |cells: i64| at(cells).iter().zip(&memory).all(|(&need, &m)| need <= m as u64);
            assert!(fits(ctx), "{what}: {ctx} cells chosen but they do not fit");
            assert!(!fits(ctx + CTX_STEP), "{what}: {} cells would fit too", ctx + CTX_STEP);
            let want = if n > 1 { 1536 } else { 2816 };
            assert_eq!(ctx, want, "{what}");
            // Sized from plans: nothing was allocated on the devices.
            assert!(counters.iter().all(|c| c.peak() == 0), "{what}: the fit allocated");
            let (at, above) = check_by_measurement(&spec, ctx, &memory, &what);
            // The largest ratio of a device's measured peak at 256 cells
            // more to its memory: above 1 when the chosen size is the
            // largest that runs.
            let over = above.iter().zip(&memory).map(|(&p, &m)| p as f64 / m as f64).fold(0.0, f64::max);
            println!("{what}: ctx-size {ctx}; measured peaks {at:?} there, {above:?} with 256 cells more (x{over:.4} of the memory)");
            if name == "qwen35 + mtp" {
                // Measured: the estimate of the MTP steps' compute is 2.4 MB
                // on one device and 3.3 MB on each of three, several times
                // what they use, so 256 cells more still run (at x0.81,
                // x0.72, x0.58 of the memory on 1, 2, 3 devices). Pinned so
                // that it may only get tighter.
                let floor = [0.80, 0.72, 0.57][n - 1];
                assert!(
                    over >= floor,
                    "{what}: {} cells peak at x{over:.4} of the memory (pinned: x{floor})",
                    ctx + 256
                );
            } else {
                assert!(
                    over > 1.0,
                    "{what}: {} cells peak at {above:?}, within the memory {memory:?}: the chosen {ctx} was not the largest",
                    ctx + CTX_STEP
                );
            }
        }
    }
}

/// `--split-mode layer`: the fit sizes each device's layers from the layer
/// split's plans: a target's weights are held once (their sum over 2 and 3
/// devices is one device's, and a byte per empty part), and the worst steps
/// of every spec (drafters too) run within each device's estimate, as they
/// do under the tensor split (where a DFlash2 step's zero column, a leaf of
/// the step, was not counted: one hidden row per device over).
#[test]
fn a_layer_split_is_sized_from_its_plans_and_holds_the_weights_once() {
    let cells = 1024;
    for (name, spec) in specs(1) {
        let one = spec.memory(cells).unwrap();
        let modes = [2, 3].into_iter().flat_map(|n| [(n, SplitMode::Layer), (n, SplitMode::Tensor)]);
        for (n, mode) in modes.chain([(3, SplitMode::Hybrid), (4, SplitMode::Hybrid)]) {
            // Hybrid: two groups, {0, 1} and the rest.
            let groups = match mode {
                SplitMode::Hybrid => vec![DeviceSet::of([0, 1]), DeviceSet::of(2..n)],
                _ => Vec::new(),
            };
            let spec = FitSpec { ratios: vec![1.0; n], mode, groups, ..spec.clone() };
            let est = spec.memory(cells).unwrap();
            let what = format!("{name}, {} split over {n} devices", mode.name());
            // Each device holds its layers' weights; an empty part costs the
            // one byte the executor allocates for it. (A DFlash drafter's
            // tensors outside its layers, its `fc` and norms, are mirrored.)
            let sum = est.iter().map(|m| m.weights).sum::<u64>();
            if !name.contains("dflash") && mode == SplitMode::Layer {
                assert!(sum >= one[0].weights && sum - one[0].weights < 64 * n as u64, "{what}: {est:?} vs {one:?}");
            }
            assert!(est.iter().all(|m| m.weights > 1), "{what}: a device without layers: {est:?}");
            let (devs, counters) = counting::devices(n, None);
            run_worst_steps(&spec, cells, devs).unwrap_or_else(|e| panic!("{what}: {e}"));
            for (j, (c, m)) in counters.iter().zip(&est).enumerate() {
                assert!(
                    c.peak() <= m.total(),
                    "{what}: device {j} peaked at {} of an estimate {}",
                    c.peak(),
                    m.total()
                );
            }
        }
    }
}

#[test]
fn the_requested_maximum_bounds_the_choice() {
    let (_, spec) = specs(2).remove(1);
    let huge = vec![usize::MAX / 4; 2];
    let exec = Devices::from_backends(counting::devices(2, Some(&huge)).0).and_then(|d| d.executor()).unwrap();
    assert_eq!(fit_ctx_size(&spec, 1000, &exec).unwrap(), 768);
    assert_eq!(fit_ctx_size(&spec, spec.max_ctx(), &exec).unwrap(), 8192);
    assert_eq!(fit_ctx_size(&spec, 256, &exec).unwrap(), 256);
    assert!(matches!(fit_ctx_size(&spec, 255, &exec), Err(shardgraph::Error::Model { .. })));
    // A spec for another number of devices.
    let exec3 = Devices::from_backends(counting::devices(3, Some(&[1 << 40; 3])).0).and_then(|d| d.executor()).unwrap();
    assert!(fit_ctx_size(&spec, 4096, &exec3).is_err());
}

#[test]
fn a_device_too_small_for_256_cells_is_named() {
    for (name, spec) in specs(2) {
        let need = totals(&spec, 256);
        // Device 1 is one byte short of 256 cells.
        let memory = vec![need[0] as usize * 4, need[1] as usize - 1];
        let exec = Devices::from_backends(counting::devices(2, Some(&memory)).0).and_then(|d| d.executor()).unwrap();
        match fit_ctx_size(&spec, 4096, &exec) {
            Err(shardgraph::Error::OutOfMemory { device, needed, available, detail }) => {
                assert_eq!(device, "device 1 (COUNT1)", "{name}");
                assert_eq!((needed, available), (need[1], need[1] - 1), "{name}");
                assert!(detail.contains("256 cells"), "{name}: {detail}");
            }
            other => panic!("{name}: expected OutOfMemory, got {other:?}"),
        }
    }
}

#[test]
fn bad_specs_are_errors() {
    let spec = |target: FitTarget, draft: FitDraft, snapshot_slots: usize| FitSpec {
        target,
        draft,
        cache_types: GgmlType::F16.into(),
        ratios: vec![1.0],
        mode: SplitMode::Tensor,
        groups: Vec::new(),
        n_batch: 1,
        snapshot_slots,
        link: LinkModel::default(),
    };
    // MTP needs a qwen35 target with a NextN layer; snapshots need qwen35.
    assert!(spec(qwen3_target(), FitDraft::Mtp { n_max: 2 }, 0).memory(256).is_err());
    let FitTarget::Qwen35 { hp, types } = qwen35_target() else { unreachable!() };
    let no_nextn = FitTarget::Qwen35 { hp: Qwen35Hparams { n_nextn: 0, ..hp }, types };
    assert!(spec(no_nextn, FitDraft::Mtp { n_max: 2 }, 0).memory(256).is_err());
    assert!(spec(qwen3_target(), FitDraft::None, 4).memory(256).is_err());
    assert!(spec(qwen3_target(), FitDraft::None, 0).memory(0).is_err());
    assert!(FitSpec { n_batch: 0, ..spec(qwen3_target(), FitDraft::None, 0) }.memory(256).is_err());
    // A drafter built for another target.
    assert!(spec(qwen3_target(), dflash(64, vec![1, 3], 160, false), 0).memory(256).is_err());
    // Sizes beyond what a session may take are errors, not panics or
    // million-tensor graphs: MTP chains over MAX_DRAFT, snapshot slots over
    // MAX_DRAFT + 1, batches larger than the context, contexts over MAX_CTX.
    use shardgraph_models::step::MAX_DRAFT;
    let q35 = || qwen35_target();
    for n_max in [0, MAX_DRAFT + 1, usize::MAX] {
        let e = spec(q35(), FitDraft::Mtp { n_max }, 0).memory(256).unwrap_err();
        assert!(e.to_string().contains("MTP chains"), "{n_max}: {e}");
    }
    for slots in [MAX_DRAFT + 2, usize::MAX] {
        let e = spec(q35(), FitDraft::Mtp { n_max: 2 }, slots).memory(256).unwrap_err();
        assert!(e.to_string().contains("snapshot slots"), "{slots}: {e}");
    }
    for n_batch in [257, i64::MAX, -1] {
        assert!(FitSpec { n_batch, ..spec(qwen3_target(), FitDraft::None, 0) }.memory(256).is_err(), "{n_batch}");
    }
    let e = spec(qwen3_target(), FitDraft::None, 0).memory(i64::MAX).unwrap_err();
    assert!(e.to_string().contains("positions are 32-bit"), "{e}");
    // A requested maximum beyond MAX_CTX is clamped, not a shape error.
    let exec = Devices::from_backends(counting::devices(1, Some(&[1 << 30])).0).and_then(|d| d.executor()).unwrap();
    let n = fit_ctx_size(&spec(qwen3_target(), FitDraft::None, 0), i64::MAX, &exec).unwrap();
    assert!(n % CTX_STEP == 0 && n <= shardgraph_models::MAX_CTX, "{n}");
    // Figures that overflow a u64 fit no device.
    use shardgraph::split::DeviceMemory;
    let huge = DeviceMemory { weights: u64::MAX, caches: 1, ..DeviceMemory::default() };
    assert!(matches!(exec.check_fit(&[huge], "x"), Err(shardgraph::Error::OutOfMemory { .. })));
}

/// The devices are the one source of the tensor split: a fit spec or a
/// runner's policy made with other ratios than the devices' is an error
/// naming both lists, not only one with another device count.
#[test]
fn ratios_other_than_the_devices_are_refused() {
    let (_, mut spec) = specs(2).remove(1);
    let big = vec![usize::MAX / 4; 2];
    let devices = Devices::from_backends(counting::devices(2, Some(&big)).0).unwrap();
    let exec = devices.executor().unwrap();
    assert_eq!(exec.ratios(), &[1.0, 1.0]);
    spec.ratios = vec![3.0, 1.0];
    let e = fit_ctx_size(&spec, 4096, &exec).unwrap_err();
    assert!(matches!(e, shardgraph::Error::Split { .. }) && e.to_string().contains("[3.0, 1.0]"), "{e}");
    let skewed = devices.with_tensor_split(&[3.0, 1.0]).unwrap();
    assert_eq!(fit_ctx_size(&spec, 1000, &skewed.executor().unwrap()).unwrap(), 768);
    let policy = shardgraph::split::SplitPolicy::new(&[1.0, 1.0]).unwrap();
    let e = shardgraph_models::runner::Runner::new(policy, &skewed).unwrap_err();
    assert!(e.to_string().contains("[1.0, 1.0]") && e.to_string().contains("[3.0, 1.0]"), "{e}");
}

/// A fit leaves 1 GiB of the host's available memory free
/// (`FIT_HOST_HEADROOM`, llama.cpp's `--fit-target` default), so the load
/// it sizes, which checks again without it, is not refused because the
/// host's available memory moved by a few MB in between (a newcomer's
/// `dflash2 --fit on --ctx-size 2147483647`: the fit chose 457 208 cells,
/// the load then lacked 34 MB of 24.6 GB). Half a GiB below what the host
/// has: the load's check passes, the fit's does not.
#[test]
fn a_fit_leaves_host_memory_free() {
    use shardgraph::split::{DeviceMemory, FIT_HOST_HEADROOM};
    let Some(avail) = shardgraph::backend::cpu::host_memory_available() else { return };
    if avail < 2 * FIT_HOST_HEADROOM {
        return;
    }
    let exec = Devices::parse("CPU", 1).and_then(|d| d.executor()).unwrap();
    let need = DeviceMemory { weights: avail - FIT_HOST_HEADROOM / 2, ..DeviceMemory::default() };
    exec.check_memory(&[need.total()], "the weights").unwrap();
    match exec.check_fit(&[need], "a context") {
        Err(shardgraph::Error::OutOfMemory { detail, available, .. }) => {
            assert!(detail.contains("leaving 1 GiB of host memory free"), "{detail}");
            assert!(available < avail - FIT_HOST_HEADROOM / 2, "{available} of {avail}");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}
