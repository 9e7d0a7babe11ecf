//! The compiled runtime, checked through the executor's deterministic
//! counters (never timed) and, independently of the executor, through
//! devices that count what passes through them (`common/counting.rs`:
//! buffers allocated, bytes written from and read to the host, bytes
//! copied in from other devices): after the first decode step of a shape a
//! step allocates nothing, copies nothing into the caches, reads to the
//! host only the output it asks for, and moves exactly its plan's bytes; and a
//! step's work follows the KV cells in use, not the allocated context — a
//! decode in a cache of any size (65536, 4104, 600 cells) gives the tokens,
//! logits and bytes moved of a 512-cell one.

use shardgraph::split::{Devices, Planner};
use shardgraph::{Context, GgmlType};
use shardgraph_models::kv_window;
use shardgraph_models::qwen3::{qwen3_policy, Qwen3, Qwen3Hparams, Qwen3Session};
use shardgraph_models::runner::Runner;
use shardgraph_models::types::TensorTypes;

#[path = "common/counting.rs"]
mod counting;
#[path = "common/decode.rs"]
mod decode;
#[path = "common/qwen35_tiny.rs"]
mod qwen35_tiny;
use decode::nmse;

fn hp() -> Qwen3Hparams {
    decode::tiny_hp()
}

/// A session on `ratios` with a KV cache of `kv_size` cells and seeded weights.
fn session(ratios: &[f32], kv_size: i64) -> Qwen3Session {
    decode::seeded_session(hp(), ratios, &TensorTypes::uniform(GgmlType::Q8_0), GgmlType::F16, kv_size)
}

#[test]
fn a_decode_step_allocates_copies_and_reads_nothing_but_its_output() {
    for ratios in [vec![1.0], vec![1.0, 1.0], vec![2.0, 1.0, 1.0]] {
        let n = ratios.len();
        // Counted devices (one CPU thread each, as `session` gives).
        let (devs, counters) = counting::devices(n, None);
        let devices = Devices::from_backends(devs).unwrap().with_tensor_split(&ratios).unwrap();
        let mut s =
            decode::seeded_session_on(hp(), &devices, &TensorTypes::uniform(GgmlType::Q8_0), GgmlType::F16, 1024);
        let mut last = *s.decode(&[3, 17, 42, 5, 88, 1], &[], false).unwrap().argmax.last().unwrap();
        // The first decode step of its shape compiles and sizes the arenas.
        last = s.decode(&[last], &[], false).unwrap().argmax[0];
        // The plan of a decode step (a graph like the session's next ones,
        // built in a context of its own so the session's graphs stay).
        let plan_bytes = {
            let mut ctx = Context::new();
            let m = Qwen3::new(&mut ctx, hp(), &TensorTypes::uniform(GgmlType::Q8_0), GgmlType::F16, 1024).unwrap();
            let step = m.build_window(&mut ctx, 1, kv_window(1024, s.n_past() + 1), &[]).unwrap();
            let g = ctx.build_forward(&step.outputs()).unwrap();
            Planner::default().plan(&ctx, &g, s.runner().policy(), &[]).unwrap().total_bytes()
        };
        // What the devices saw in one step: (bytes allocated, buffers
        // allocated, bytes from the host, bytes to the host, bytes copied in).
        let seen = || -> Vec<[u64; 5]> {
            counters
                .iter()
                .map(|c| [c.allocated(), c.allocations(), c.bytes_set(), c.bytes_got(), c.bytes_copied_in()])
                .collect()
        };
        let mut inputs_per_step = None;
        for step in 0..12 {
            let (before, moved) = (s.runner().exec().counters(), s.runner().bytes_moved());
            let dev_before = seen();
            last = s.decode(&[last], &[], false).unwrap().argmax[0];
            let dev: Vec<[u64; 5]> =
                seen().iter().zip(&dev_before).map(|(a, b)| std::array::from_fn(|k| a[k] - b[k])).collect();
            let c = s.runner().exec().counters();
            let what = format!("{ratios:?}, step {step}");
            // Counted by the devices, not by the executor: no buffer
            // allocated, the plan's bytes copied in between devices, and
            // read to the host one I32 (the greedy token) plus those bytes
            // (the host communicator reads each exchanged byte from the
            // device that sends it); the same small inputs written every
            // step. The inputs, at most, on each device: the F16 mask of
            // the 256-cell window (512 bytes), the token and its position
            // (I32) and the cache cell it is written to (I64): 528 bytes,
            // less than the 2048 bytes of one cell's K and V rows in the
            // caches (2 layers, 2 × 128 values each, F16), so no cache row
            // comes from the host.
            let sum = |k: usize| dev.iter().map(|d| d[k]).sum::<u64>();
            assert_eq!((sum(0), sum(1)), (0, 0), "{what}: the devices allocated (bytes, buffers) {dev:?}");
            assert_eq!(sum(4), plan_bytes, "{what}: bytes copied between the devices vs the plan {dev:?}");
            assert_eq!(sum(3), 4 + plan_bytes, "{what}: bytes the devices gave the host {dev:?}");
            let written: Vec<u64> = dev.iter().map(|d| d[2]).collect();
            assert_eq!(*inputs_per_step.get_or_insert_with(|| written.clone()), written, "{what}: bytes from the host");
            assert!(written.iter().all(|&w| w <= 2 * 256 + 4 + 4 + 8), "{what}: bytes from the host {written:?}");
            if step == 0 {
                println!(
                    "{what}: per device (bytes allocated, buffers, from the host, to the host, copied in) {dev:?}"
                );
            }
            assert_eq!(c.compiles - before.compiles, 0, "{what}: compiled");
            assert_eq!(c.bytes_allocated - before.bytes_allocated, 0, "{what}: bytes allocated");
            assert_eq!(c.store_bytes_copied - before.store_bytes_copied, 0, "{what}: bytes copied into the caches");
            // The greedy token (one I32), read from one device.
            assert_eq!(c.host_bytes_read - before.host_bytes_read, 4, "{what}: bytes read to the host");
            assert_eq!(s.runner().bytes_moved() - moved, plan_bytes, "{what}: bytes moved vs the plan");
            if n > 1 {
                assert!(plan_bytes > 0, "{what}: a split decode step exchanges");
            }
        }
    }
}

/// The steps' window: 256 cells while fewer are used, then 512 — the same
/// tokens and logits as with a small cache, on 1 and 2 devices.
#[test]
fn decoding_in_a_cache_of_any_size_gives_the_tokens_and_bytes_of_a_512_cell_cache() {
    assert_eq!(kv_window(65536, 1), 256);
    assert_eq!(kv_window(65536, 256), 256);
    assert_eq!(kv_window(65536, 257), 512);
    assert_eq!(kv_window(100, 7), 100);
    let prompt: Vec<i32> = (0..250).map(|i| (i * 37 + 11) % 96).collect();
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        let mut runs = Vec::new();
        // Caches of any size: 4104 and 600 cells are not multiples of the
        // 256-cell window (a cache with a drafter's block on top).
        for kv in [512, 65536, 4104, 600] {
            let mut s = session(&ratios, kv);
            let out = s.decode(&prompt, &[], true).unwrap();
            let mut logits = vec![out.logits.unwrap()];
            let mut tokens = vec![*out.argmax.last().unwrap()];
            let before = s.runner().bytes_moved();
            // Across the window's edge at 256 cells.
            for _ in 0..12 {
                let o = s.decode(&[*tokens.last().unwrap()], &[], true).unwrap();
                tokens.push(o.argmax[0]);
                logits.push(o.logits.unwrap());
            }
            assert_eq!(s.n_past(), 262);
            runs.push((kv, tokens, logits, s.runner().bytes_moved() - before));
        }
        let (_, tokens, logits, moved) = &runs[0];
        for (kv, t, l, m) in &runs[1..] {
            assert_eq!(t, tokens, "{ratios:?}: tokens with 512 and {kv} cells");
            for (a, b) in logits.iter().zip(l) {
                let e = nmse(a, b);
                assert!(e <= 1e-12, "{ratios:?}: logits NMSE {e:.3e} between 512 and {kv} cells");
            }
            // The steps move the same bytes whatever the cache's size (no
            // cache is gathered).
            assert_eq!(m, moved, "{ratios:?}: bytes moved by 12 steps with 512 and {kv} cells");
        }
    }
}

/// A context that does not fit is a typed error naming the device, the
/// bytes needed and the bytes available — before anything is allocated
/// (a cache of the most cells a context may have, 2^31 − 1, would be
/// terabytes).
#[test]
fn a_ctx_size_that_does_not_fit_is_an_error_before_allocating() {
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        let mut ctx = Context::new();
        let model = Qwen3::new(&mut ctx, hp(), &types, GgmlType::F16, i32::MAX as i64).unwrap();
        let policy = qwen3_policy(&model.hp, &types, &ratios).unwrap();
        let runner =
            Runner::new(policy, &Devices::cpu(ratios.len(), 1).unwrap().with_tensor_split(&ratios).unwrap()).unwrap();
        match Qwen3Session::new(model, ctx, runner) {
            Err(shardgraph::Error::OutOfMemory { device, needed, available, detail }) => {
                assert!(device.contains("CPU"), "{device}");
                assert!(needed > 1 << 39 && available < needed, "{needed} needed, {available} available");
                assert!(detail.contains("2147483647 cells"), "{detail}");
                let msg = shardgraph::Error::OutOfMemory { device, needed, available, detail }.to_string();
                assert!(msg.contains(&needed.to_string()) && msg.contains(&available.to_string()), "{msg}");
            }
            other => panic!("{ratios:?}: expected OutOfMemory, got {other:?}"),
        }
    }
}

/// A `qwen35` decode step (the tiny hybrid: 2 Gated-DeltaNet and 2
/// attention layers), on 1 and 2 counted devices, after the first step of
/// its shape: no buffer allocated, nothing copied into the caches by the
/// executor, no compile; the recurrent states are updated in place by their
/// `gated_delta_net` (the CPU backend fuses the op with llama.cpp's copy of
/// its final state into the cache, `cpu/fuse.rs`), so the only bytes the
/// graph copies into the caches are the ones a step must write: each
/// attention layer's K and V row of the new token (F16, 3 KV heads of 64:
/// 384 bytes each) and each delta-net layer's conv state, the last
/// `d_conv − 1 = 3` inputs of its 1536 channels (F32: 18432 bytes), which
/// shift by one token every step. Without the fusion the copies would add
/// the whole recurrent state of each delta-net layer (64·64·12 F32:
/// 196608 bytes) every step.
#[test]
fn a_qwen35_decode_step_allocates_nothing_and_copies_only_its_new_cache_rows() {
    use shardgraph_models::generate::write_qwen35_gguf;
    use shardgraph_models::qwen35::Qwen35Session;
    let hp = qwen35_tiny::tiny();
    let dir = std::env::temp_dir().join(format!("shardgraph-runtime-q35-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen35-q8_0.gguf");
    write_qwen35_gguf(&path, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 3).unwrap();
    let (n_att, n_dn) = (2u64, 2u64);
    let kv_rows = n_att * 2 * (hp.core.n_head_kv * hp.core.head_dim) as u64 * 2;
    let conv = n_dn * ((hp.d_conv - 1) * hp.conv_channels()) as u64 * 4;
    let state = n_dn * (hp.d_state * hp.d_state * hp.n_v_heads) as u64 * 4;
    assert_eq!((kv_rows, conv, state), (1536, 36864, 393216));
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        let (devs, counters) = counting::devices(ratios.len(), None);
        let devices = Devices::from_backends(devs).unwrap().with_tensor_split(&ratios).unwrap();
        let mut s = Qwen35Session::load(&path, &devices, GgmlType::F16, 256).unwrap();
        let mut last = *s.decode(&[11, 205, 3, 99, 42], &[], false).unwrap().argmax.last().unwrap();
        last = s.decode(&[last], &[], false).unwrap().argmax[0];
        let seen = || -> Vec<[u64; 5]> {
            counters
                .iter()
                .map(|c| [c.allocated(), c.stored_copy_bytes(), c.in_place_state_bytes(), c.fused_copies(), 0])
                .collect()
        };
        for step in 0..8 {
            let (before, dev_before) = (s.runner().exec().counters(), seen());
            last = s.decode(&[last], &[], false).unwrap().argmax[0];
            let c = s.runner().exec().counters();
            let dev: Vec<[u64; 5]> =
                seen().iter().zip(&dev_before).map(|(a, b)| std::array::from_fn(|k| a[k] - b[k])).collect();
            let sum = |k: usize| dev.iter().map(|d| d[k]).sum::<u64>();
            let what = format!("{ratios:?}, step {step}: per device {dev:?}");
            assert_eq!(c.compiles - before.compiles, 0, "{what}: compiled");
            assert_eq!(c.bytes_allocated - before.bytes_allocated, 0, "{what}: bytes allocated");
            assert_eq!(c.store_bytes_copied - before.store_bytes_copied, 0, "{what}: executor copies into the caches");
            assert_eq!(sum(0), 0, "{what}: device bytes allocated");
            // Every device updates the states of its own heads in place, one
            // fused copy per delta-net layer each; the split parts sum to
            // one device's bytes.
            assert_eq!(sum(2), state, "{what}: state bytes updated in place");
            assert_eq!(sum(3), n_dn * ratios.len() as u64, "{what}: state copies fused away");
            assert_eq!(sum(1), kv_rows + conv, "{what}: bytes the graph copied into the caches");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A verify batch on the `qwen35` hybrid with device-side snapshots (4
/// tokens, 4 slots): each delta-net layer's op writes the state after
/// every token straight into its snapshot slot and the newest into the
/// state cache (`cpu/fuse.rs`): per layer and device, 5 copies fused away;
/// the graph copies only the KV rows and the conv states (the cache and
/// its 4 snapshots), no recurrent state. On 1 and 2 devices, the second
/// batch of that shape.
#[test]
fn a_qwen35_verify_batch_writes_its_state_snapshots_where_they_are_kept() {
    use shardgraph_models::generate::write_qwen35_gguf;
    use shardgraph_models::qwen35::Qwen35Session;
    let hp = qwen35_tiny::tiny();
    let dir = std::env::temp_dir().join(format!("shardgraph-runtime-q35-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen35-q8_0.gguf");
    write_qwen35_gguf(&path, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 3).unwrap();
    let (n_att, n_dn, t) = (2u64, 2u64, 4u64);
    let kv_rows = n_att * 2 * (hp.core.n_head_kv * hp.core.head_dim) as u64 * 2;
    let conv = n_dn * ((hp.d_conv - 1) * hp.conv_channels()) as u64 * 4;
    let state = n_dn * (hp.d_state * hp.d_state * hp.n_v_heads) as u64 * 4;
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        let (devs, counters) = counting::devices(ratios.len(), None);
        let devices = Devices::from_backends(devs).unwrap().with_tensor_split(&ratios).unwrap();
        let mut s = Qwen35Session::load(&path, &devices, GgmlType::F16, 256).unwrap();
        s.enable_snapshots(t as usize).unwrap();
        s.decode(&[11, 205, 3, 99, 42], &[], false).unwrap();
        let seen = || -> Vec<[u64; 3]> {
            counters.iter().map(|c| [c.stored_copy_bytes(), c.in_place_state_bytes(), c.fused_copies()]).collect()
        };
        for batch in 0..2 {
            let before = seen();
            s.decode(&[7, 8, 9, 10], &[], true).unwrap();
            let dev: Vec<[u64; 3]> =
                seen().iter().zip(&before).map(|(a, b)| std::array::from_fn(|k| a[k] - b[k])).collect();
            let sum = |k: usize| dev.iter().map(|d| d[k]).sum::<u64>();
            let what = format!("{ratios:?}, batch {batch}: per device {dev:?}");
            assert_eq!(sum(2), n_dn * (t + 1) * ratios.len() as u64, "{what}: copies fused away");
            assert_eq!(sum(1), (t + 1) * state, "{what}: state bytes written where they are kept");
            assert_eq!(sum(0), t * kv_rows + (t + 1) * conv, "{what}: bytes the graph copied");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Speculative decoding on the `qwen35` hybrid, as the `mtp` example runs
/// it (MTP drafts, 3 per step, verified in one batch whose every token's
/// recurrent state lands in the device-side snapshots; a rejected draft
/// rolls the states back by copying one snapshot on the devices): once a
/// generation has run every shape, a second one of the same length
/// compiles nothing, allocates nothing (executor and devices), and copies
/// nothing from the host into the caches; the same with drafts that are
/// all rejected (a rollback every step). On 1 and 2 devices.
#[test]
fn a_speculative_qwen35_generation_allocates_compiles_and_copies_nothing_once_warm() {
    use shardgraph_models::generate::{write_qwen35_gguf_with, Weights};
    use shardgraph_models::mtp::MtpDrafter;
    use shardgraph_models::qwen35::{Qwen35Hparams, Qwen35Session};
    use shardgraph_models::speculative::{generate, SpecParams};
    use shardgraph_models::step::Drafter;
    /// Drafts `n_max` copies of a token no permutation step gives.
    struct Wrong;
    impl Drafter<Qwen35Session> for Wrong {
        fn draft(&mut self, _: &mut Qwen35Session, last: i32, _: i64, n_max: usize) -> shardgraph::Result<Vec<i32>> {
            Ok(vec![last; n_max])
        }
    }
    let hp = Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    let dir = std::env::temp_dir().join(format!("shardgraph-runtime-q35-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen35-mtp-q8_0.gguf");
    write_qwen35_gguf_with(&path, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 7, Weights::Permutation).unwrap();
    let prompt = [3, 14, 15, 92, 65, 35];
    let params = SpecParams { n_max: 3, n_min: 1 };
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        let (devs, counters) = counting::devices(ratios.len(), None);
        let devices = Devices::from_backends(devs).unwrap().with_tensor_split(&ratios).unwrap();
        let mut s = Qwen35Session::load(&path, &devices, GgmlType::F16, 64).unwrap();
        s.enable_snapshots(4).unwrap();
        for mtp in [true, false] {
            let run = |s: &mut Qwen35Session| {
                s.reset().unwrap();
                if mtp {
                    let mut d = MtpDrafter::new(s, 0.0).unwrap();
                    generate(s, &mut d, &prompt, 16, params).unwrap()
                } else {
                    generate(s, &mut Wrong, &prompt, 16, params).unwrap()
                }
            };
            let (first, st) = run(&mut s);
            let (before, dev_before) =
                (s.runner().exec().counters(), counters.iter().map(|c| c.allocated()).sum::<u64>());
            let (again, st2) = run(&mut s);
            let c = s.runner().exec().counters();
            let what = format!("{ratios:?}, {}: {st2:?}", if mtp { "MTP" } else { "all drafts rejected" });
            assert_eq!(again, first, "{what}: tokens");
            assert_eq!((st2.drafted, st2.accepted), (st.drafted, st.accepted), "{what}: the same steps");
            if mtp {
                assert!(st2.accepted * 2 >= st2.drafted && st2.drafted > 0, "{what}: MTP accepts");
            } else {
                assert_eq!(st2.accepted, 0, "{what}");
            }
            assert_eq!(c.compiles - before.compiles, 0, "{what}: compiled");
            assert_eq!(c.bytes_allocated - before.bytes_allocated, 0, "{what}: bytes allocated");
            assert_eq!(c.store_bytes_copied - before.store_bytes_copied, 0, "{what}: bytes copied into the caches");
            let dev_after = counters.iter().map(|c| c.allocated()).sum::<u64>();
            assert_eq!(dev_after - dev_before, 0, "{what}: device bytes allocated");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// DFlash2 speculative decoding on the `qwen35` hybrid, as the engine runs
/// it: the drafter attached to the target's session (its weights and caches
/// in the target's context, its inject and block graphs run by the target's
/// runner, so the one runner's counters cover both models), then `n_max + 1`
/// device-side snapshot slots; and, apart, with no snapshots (a rollback
/// restores the host checkpoint and decodes the kept tokens again). A
/// drafter built to follow the target's permutation has every draft
/// accepted; one built for another permutation has most rejected (a
/// rollback of the states, and an inject of fewer rows than verified, on
/// most steps). Once a generation has run every shape, a second identical
/// one (after a reset; the drafter holds no state of its own, and its stale
/// cache cells stay masked until overwritten) gives the same tokens and
/// steps, compiles nothing, allocates nothing (executor and counted
/// devices), and copies nothing from the host into the caches. On 1 and 2
/// devices.
#[test]
fn a_dflash2_qwen35_generation_allocates_compiles_and_copies_nothing_once_warm() {
    use shardgraph_models::dflash::{DflashDrafter, DflashHparams};
    use shardgraph_models::generate::{write_dflash_gguf_with, write_qwen35_gguf_with, Weights};
    use shardgraph_models::hparams::HparamsCore;
    use shardgraph_models::qwen35::{Qwen35Hparams, Qwen35Session};
    use shardgraph_models::speculative::{generate, SpecParams};
    let hp = Qwen35Hparams { n_nextn: 1, ..qwen35_tiny::tiny() };
    let dir = std::env::temp_dir().join(format!("shardgraph-runtime-q35-dflash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("qwen35-q8_0.gguf");
    write_qwen35_gguf_with(&target, &hp, &TensorTypes::uniform(GgmlType::Q8_0), 13, Weights::Permutation).unwrap();
    // DFlash2: taps of a layer input and of the post-final-norm state, a
    // convolution and the candidate selector.
    let dhp = DflashHparams {
        core: HparamsCore::qwen3(2, 256, 384, 6, 3, 32),
        target_layers: vec![1, hp.n_layer],
        target_hidden: 256,
        block_size: 5,
        mask_token: (hp.n_vocab - 1) as i32,
        conv: Some((2, 16)),
        selector: Some((32, 8)),
    };
    // The target's seed (its permutation) and another one.
    let drafters = [13, 14].map(|seed| {
        let path = dir.join(format!("dflash2-q8_0-{seed}.gguf"));
        let types = TensorTypes::uniform(GgmlType::Q8_0);
        write_dflash_gguf_with(&path, &dhp, &types, hp.n_vocab, seed, Weights::Permutation).unwrap();
        path
    });
    let prompt = [3, 14, 15, 92, 65, 35];
    let params = SpecParams { n_max: 4, n_min: 1 };
    let kv = GgmlType::F16;
    for ratios in [vec![1.0], vec![1.0, 1.0]] {
        for (follows, drafter) in [true, false].into_iter().zip(&drafters) {
            for snapshots in [true, false] {
                let (devs, counters) = counting::devices(ratios.len(), None);
                let devices = Devices::from_backends(devs).unwrap().with_tensor_split(&ratios).unwrap();
                let mut s = Qwen35Session::load(&target, &devices, kv, 64).unwrap();
                let mut d = DflashDrafter::attach_gguf(&mut s, drafter, kv, 0.0).unwrap();
                if snapshots {
                    // After the drafter, as the engine does: its policy is
                    // the one the snapshots are placed under.
                    s.enable_snapshots(params.n_max + 1).unwrap();
                }
                let mut run = |s: &mut Qwen35Session| {
                    s.reset().unwrap();
                    generate(s, &mut d, &prompt, 16, params).unwrap()
                };
                let (first, st) = run(&mut s);
                let (before, dev_before) =
                    (s.runner().exec().counters(), counters.iter().map(|c| c.allocated()).sum::<u64>());
                let (again, st2) = run(&mut s);
                let c = s.runner().exec().counters();
                let what = format!(
                    "{ratios:?}, {}, {}: {st2:?}",
                    if follows { "drafter following the target" } else { "drafter following another permutation" },
                    if snapshots { "snapshots" } else { "host checkpoints" }
                );
                assert_eq!(again, first, "{what}: tokens");
                assert_eq!(st2, st, "{what}: the same steps");
                if follows {
                    assert!(st2.accepted * 2 >= st2.drafted && st2.drafted > 0, "{what}: DFlash2 accepts");
                } else {
                    assert!(st2.drafted > 0 && st2.accepted * 2 < st2.drafted, "{what}: drafts mostly rejected");
                }
                assert_eq!(c.compiles - before.compiles, 0, "{what}: compiled");
                assert_eq!(c.bytes_allocated - before.bytes_allocated, 0, "{what}: bytes allocated");
                assert_eq!(c.store_bytes_copied - before.store_bytes_copied, 0, "{what}: bytes copied into the caches");
                let dev_after = counters.iter().map(|c| c.allocated()).sum::<u64>();
                assert_eq!(dev_after - dev_before, 0, "{what}: device bytes allocated");
                println!(
                    "{what}: after load and warm-up: compiles {}, bytes allocated {} (devices {dev_before}), copied {}; \
                     second run read to the host {}",
                    before.compiles,
                    before.bytes_allocated,
                    before.store_bytes_copied,
                    c.host_bytes_read - before.host_bytes_read
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
