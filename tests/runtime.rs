//! The compiled runtime, checked through the executor's deterministic
//! counters (never timed): after the first decode step of a shape a step
//! allocates nothing, copies nothing into the caches, reads to the host
//! only the output it asks for, and moves exactly its plan's bytes; and a
//! step's work follows the KV cells in use, not the allocated context — a
//! decode in a cache of any size (65536, 4104, 600 cells) gives the tokens,
//! logits and bytes moved of a 512-cell one.

use shardgraph::split::{Devices, Planner};
use shardgraph::{Context, GgmlType};
use shardgraph_models::kv_window;
use shardgraph_models::qwen3::{qwen3_policy, Qwen3, Qwen3Hparams, Qwen3Session};
use shardgraph_models::runner::Runner;
use shardgraph_models::types::TensorTypes;

#[path = "common/decode.rs"]
mod decode;
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
        let mut s = session(&ratios, 1024);
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
        for step in 0..12 {
            let (before, moved) = (s.runner().exec().counters(), s.runner().bytes_moved());
            last = s.decode(&[last], &[], false).unwrap().argmax[0];
            let c = s.runner().exec().counters();
            let what = format!("{ratios:?}, step {step}");
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
