//! The DFlash drafter's graphs (context injection, then a non-causal block
//! over injected context + block) on N CPU devices equal one device: the
//! drafter's K/V caches, the block's logits (NMSE ≤ 1e-6) and its greedy
//! rows; the block plan never gathers the vocabulary-split logits. Bad
//! input: a drafter built for another target is an error naming the key.

#[path = "common/fixtures.rs"]
mod fixtures;
#[path = "common/nmse.rs"]
mod nmse;
#[path = "common/rng.rs"]
mod rng;
use fixtures::OneCpu;
use nmse::nmse;
use rng::values;
use shardgraph::split::{Collective, Devices, LinkModel, Planner};
use shardgraph::tensor::quant::quantize_chunk;
use shardgraph::{Context, GgmlType};
use shardgraph_models::dflash::{qwen3_dflash_policy, Dflash, DflashHparams};
use shardgraph_models::hparams::HparamsCore;
use shardgraph_models::qwen3::{Qwen3, Qwen3Hparams};
use shardgraph_models::runner::Runner;
use shardgraph_models::types::TensorTypes;

fn target_hp() -> Qwen3Hparams {
    Qwen3Hparams { core: HparamsCore::qwen3(3, 128, 256, 6, 3, 32), n_vocab: 160, n_ctx_train: 4096 }
}

fn drafter_hp() -> DflashHparams {
    DflashHparams {
        core: HparamsCore::qwen3(2, 128, 256, 6, 3, 32),
        target_layers: vec![1, 3],
        target_hidden: 128,
        block_size: 5,
        mask_token: 159,
        conv: None,
        selector: None,
    }
}

fn bandwidth_bound() -> LinkModel {
    LinkModel { latency_s: 0.0, ..LinkModel::default() }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Runs injection of 6 context rows, then one block, on `ratios`.
/// What [`run`] returns: block logits, argmax, layer-0 K cache bytes, the
/// runner and context (for planning), the drafter, and DFlash2's lattice.
type Run = (Vec<f32>, Vec<i32>, Vec<u8>, Runner, Context, Dflash, Vec<f32>);

fn run(ratios: &[f32], conv: Option<(i64, i64)>) -> Run {
    let mut ctx = Context::new();
    let types = TensorTypes::uniform(GgmlType::Q8_0);
    let target = Qwen3::new(&mut ctx, target_hp(), &types, GgmlType::F16, 16).unwrap();
    // DFlash2 (convolutions) also gets its candidate selector.
    let selector = conv.map(|_| (32, 8));
    let hp = DflashHparams { conv, selector, ..drafter_hp() };
    let dft = Dflash::new(&mut ctx, &target, hp, &TensorTypes::uniform(GgmlType::Q8_0), GgmlType::F16, 16).unwrap();
    let base = ctx.len();
    let policy =
        qwen3_dflash_policy(&target.hp, &types, &dft.hp, &TensorTypes::uniform(GgmlType::Q8_0), ratios).unwrap();
    let mut runner =
        Runner::new(policy, &Devices::cpu(ratios.len(), 1).unwrap().with_tensor_split(ratios).unwrap()).unwrap();
    // Bytes, not latency, decide (as at real sizes, where the logits are
    // megabytes): on these tiny shapes a latency-bound link would rather
    // gather 3 KB of logits than all-reduce the candidates' 160-byte logits.
    *runner.planner_mut() = Planner::new(bandwidth_bound());
    let ids: Vec<_> = ctx.ids().take(base).collect();
    for (k, &id) in ids.iter().enumerate() {
        runner.place(&ctx, id).unwrap();
        let t = ctx.tensor(id).unwrap().clone();
        if t.name.contains("cache_") {
            continue;
        }
        let n = t.nelements() as usize;
        let v = if t.name.ends_with("norm.weight") {
            values(n, k as u64 + 1, 0.1, 1.0)
        } else {
            values(n, k as u64 + 1, (3.0 / t.ne[0] as f32).sqrt(), 0.0)
        };
        let mut bytes = vec![0u8; t.nbytes()];
        quantize_chunk(t.ty, &v, &mut bytes, n / t.ne[0] as usize, t.ne[0] as usize).unwrap();
        runner.store_mut().set_tensor(&ctx, id, 0, &bytes).unwrap();
    }
    let i32b = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let i64b = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    // Context injection: features of 6 target rows at positions 0..6.
    let inj = dft.build_inject(&mut ctx, 6).unwrap();
    let g = ctx.build_forward(&inj.writes).unwrap();
    let feats: Vec<u8> = values(2 * 128 * 6, 99, 1.0, 0.0).iter().flat_map(|x| x.to_le_bytes()).collect();
    let pos: Vec<i32> = (0..6).collect();
    let inputs = vec![(inj.features, feats), (inj.pos, i32b(&pos)), (inj.kv_idxs, i64b(&[0, 1, 2, 3, 4, 5]))];
    runner.run(&ctx, &g, &inputs, &inj.writes).unwrap();
    // The block: anchor then masks at positions 6..11, seeing every cell < 11 (non-causal).
    ctx.truncate(base);
    let b = dft.build_block(&mut ctx, 5).unwrap();
    let mut outs = b.writes.clone();
    outs.extend(b.lattice);
    outs.push(b.logits);
    outs.push(b.argmax);
    outs.push(b.top_prob);
    let g = ctx.build_forward(&outs).unwrap();
    let mut mask = Vec::new();
    for _ in 0..5 {
        for c in 0..16 {
            let v = if c < 11 { half::f16::ZERO } else { half::f16::NEG_INFINITY };
            mask.extend(v.to_le_bytes());
        }
    }
    let toks = [42, 159, 159, 159, 159];
    let bpos: Vec<i32> = (6..11).collect();
    let inputs =
        vec![(b.tokens, i32b(&toks)), (b.pos, i32b(&bpos)), (b.mask, mask), (b.kv_idxs, i64b(&[6, 7, 8, 9, 10]))];
    let rep = runner.run(&ctx, &g, &inputs, &outs).unwrap();
    let n = outs.len();
    let logits = f32s(&rep.outputs[n - 3].bytes);
    let argmax =
        rep.outputs[n - 2].bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let lattice = if b.lattice.is_some() { f32s(&rep.outputs[n - 4].bytes) } else { vec![] };
    // v1's p_min reads each row's top probability, computed on the devices:
    // it equals 1 / Σ exp(logit − max) of the row.
    let top_prob = f32s(&rep.outputs[n - 1].bytes);
    for (r, row) in logits.chunks(160).enumerate() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want = 1.0 / row.iter().map(|&x| ((x - max) as f64).exp()).sum::<f64>();
        assert!((top_prob[r] as f64 - want).abs() <= 1e-5 * want, "{ratios:?} row {r}: {} vs {want}", top_prob[r]);
    }
    let cache = dft.layers[0].cache_k;
    let mut cb = vec![0u8; ctx.tensor(cache).unwrap().nbytes()];
    runner.store().get_tensor(&ctx, cache, 0, &mut cb).unwrap();
    ctx.truncate(base);
    (logits, argmax, cb, runner, ctx, dft, lattice)
}

#[test]
fn drafter_graphs_on_n_devices_equal_one_device() {
    // DFlash v1, and DFlash2 with its dynamic convolutions around each sublayer.
    for conv in [None, Some((2, 16))] {
        let (want, want_arg, want_cache, _, _, _, want_lattice) = run(&[1.0], conv);
        if conv.is_some() {
            // The lattice: row 0 zeros; rows 1..5 hold 8 distinct candidate ids then 64 finite scores.
            assert_eq!(want_lattice.len(), 5 * 128);
            assert!(want_lattice[..128].iter().all(|&x| x == 0.0));
            for row in want_lattice.chunks(128).skip(1) {
                let mut ids: Vec<i64> = row[..8].iter().map(|&x| x as i64).collect();
                assert!(ids.iter().all(|&i| (0..160).contains(&i)) && row[..8].iter().all(|x| x.fract() == 0.0));
                ids.sort();
                ids.dedup();
                assert_eq!(ids.len(), 8, "{row:?}");
                assert!(row[8..72].iter().all(|x| x.is_finite()) && row[72..].iter().all(|&x| x == 0.0));
            }
        }
        // The injected context and the block's own K/V are in the cache (cells 0..11).
        let row = 3 * 32 * 2;
        assert!(want_cache[..11 * row].chunks(row).all(|r| r.iter().any(|&b| b != 0)));
        assert!(want_cache[11 * row..].iter().all(|&b| b == 0));
        assert_eq!(want_arg.len(), 5);
        for ratios in [vec![1.0, 1.0], vec![3.0, 1.0], vec![1.0, 1.0, 1.0]] {
            let (got, arg, cache, runner, mut ctx, dft, lattice) = run(&ratios, conv);
            let e = nmse(&got, &want);
            assert!(e <= 1e-6, "{ratios:?}: block logits NMSE {e:.3e}");
            assert_eq!(arg, want_arg, "{ratios:?}");
            assert_eq!(cache, want_cache, "{ratios:?}: drafter K cache bytes");
            // Same candidates; scores to rounding (the candidates' logits are summed across devices).
            assert_eq!(lattice.len(), want_lattice.len());
            for (r, (a, b)) in lattice.chunks(128).zip(want_lattice.chunks(128)).enumerate() {
                assert_eq!(a[..8], b[..8], "{ratios:?}: candidates of row {r}");
                for (x, y) in a[8..].iter().zip(&b[8..]) {
                    assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{ratios:?}: row {r}: {x} vs {y}");
                }
            }
            // The block's plan keeps the logits split by vocabulary: argmax, top_k and the
            // candidates' logits are computed where the slices live, and no collective
            // moves anything near the logits' size.
            let b = dft.build_block(&mut ctx, 5).unwrap();
            let mut outs = vec![b.argmax, b.top_prob];
            outs.extend(b.lattice);
            let g = ctx.build_forward(&outs).unwrap();
            let plan = Planner::new(bandwidth_bound()).plan(&ctx, &g, runner.policy(), &[]).unwrap();
            assert_eq!(plan.count(Collective::AllGather), 0, "{}", plan.report(&ctx));
            for r in &plan.repartitions {
                let t = ctx.tensor(r.tensor).unwrap();
                if t.nelements() >= 160 * 5 {
                    // Logit-sized tensors only take row combines (8 bytes per row, 8·K for top_k).
                    assert!(r.traffic.total_bytes <= 2 * 8 * 8 * 5, "{}", plan.report(&ctx));
                }
            }
            eprintln!("{ratios:?} {conv:?}: block plan moves {} bytes", plan.total_bytes());
        }
    }
}

#[test]
fn a_drafter_for_another_target_is_an_error() {
    let mut ctx = Context::new();
    let target = Qwen3::new(&mut ctx, target_hp(), &TensorTypes::uniform(GgmlType::F32), GgmlType::F16, 8).unwrap();
    let mut wrong = drafter_hp();
    wrong.n_embd = 256;
    let e = Dflash::new(&mut ctx, &target, wrong, &TensorTypes::uniform(GgmlType::F32), GgmlType::F16, 8).unwrap_err();
    assert!(e.to_string().contains("embedding_length"), "{e}");
    let mut wrong = drafter_hp();
    wrong.target_layers = vec![7];
    assert!(Dflash::new(&mut ctx, &target, wrong, &TensorTypes::uniform(GgmlType::F32), GgmlType::F16, 8).is_err());
    let mut wrong = drafter_hp();
    wrong.mask_token = 1000;
    assert!(Dflash::new(&mut ctx, &target, wrong, &TensorTypes::uniform(GgmlType::F32), GgmlType::F16, 8).is_err());
}

#[test]
fn dflash2_conv_matches_its_formula_on_one_and_two_devices() {
    use shardgraph::split::{Devices, SplitPolicy, SplitSpec};
    use shardgraph_models::decoder::dflash2_conv;
    let (e, group, k, bl, nb) = (64i64, 16i64, 2i64, 4i64, 3i64);
    let (gc, t) = (e / group, bl * nb);
    let xs = values((e * t) as usize, 1, 1.0, 0.0);
    let ds = values((2 * k * gc * t) as usize, 2, 0.5, 0.0);
    let bs = values((e * k * 2) as usize, 3, 1.0, 0.0);
    for side in 0..2usize {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(GgmlType::F32, &[e, t]).unwrap();
        let d = ctx.new_tensor(GgmlType::F32, &[2 * k * gc, t]).unwrap();
        let b = ctx.new_tensor(GgmlType::F32, &[e, k, 2]).unwrap();
        for id in [x, d, b] {
            ctx.set_input(id).unwrap();
        }
        let out = dflash2_conv(&mut ctx, x, d, b, side, nb, group).unwrap();
        let g = ctx.build_forward(&[out]).unwrap();
        // The formula, on the host.
        let mut want = vec![0f32; (e * t) as usize];
        for blk in 0..nb {
            for i in 0..bl {
                let row = blk * bl + i;
                for c in 0..e {
                    let mut acc = 0f32;
                    for tau in 0..k.min(i + 1) {
                        let w = bs[(c + e * tau + e * k * side as i64) as usize]
                            + ds[((c / group) + gc * tau + gc * k * side as i64 + 2 * k * gc * row) as usize];
                        acc += w * xs[(c + e * (row - tau)) as usize];
                    }
                    want[(c + e * row) as usize] = acc;
                }
            }
        }
        let one = OneCpu::new(&ctx, &g, 1, |st, l| {
            for (id, v) in [(x, &xs), (d, &ds), (b, &bs)] {
                if l == id {
                    st.set_f32(&ctx, id, v).unwrap();
                }
            }
        })
        .unwrap();
        one.compute(&ctx, &g).unwrap();
        let got = one.storage.get_f32(&ctx, out).unwrap();
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-4, "side {side}: max error {err}");
        // Tensor-parallel: the hidden state split by channels (a DFlash2 sublayer's input is mirrored
        // in llama.cpp's policy; a split must give the same values).
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let policy = SplitPolicy::new(&[1.0, 1.0]).unwrap().rule("*", SplitSpec::Mirrored);
        let plan = shardgraph::split::Planner::default()
            .plan(&ctx, &g, &policy, &[(x, shardgraph::split::SplitState::split(0, vec![32, 32]))])
            .unwrap();
        let data = [(x, f(&xs)), (d, f(&ds)), (b, f(&bs))];
        let two = Devices::cpu(2, 1)
            .and_then(|d| d.executor())
            .unwrap()
            .run(&ctx, &g, &plan, &|l| data.iter().find(|(i, _)| *i == l).map(|(_, v)| v.clone()), &[out])
            .unwrap();
        assert_eq!(f32s(&two[0]), got, "side {side}: 2 devices");
    }
}

#[test]
fn best_path_follows_the_edges_from_the_anchor_and_stops_below_p_min() {
    use shardgraph_models::dflash::best_path;
    // E = 8, K = 2: each row is [c0, c1 | s(p0→c0), s(p0→c1), s(p1→c0), s(p1→c1) | 0, 0].
    let lattice = [
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],   // row 0: the anchor
        [11.0, 12.0, 1.0, 5.0, 9.0, 9.0, 0.0, 0.0], // from the anchor (p = 0): c1 = 12 wins
        [21.0, 22.0, 0.0, 9.0, 7.0, 2.0, 0.0, 0.0], // after candidate 1: c0 = 21 wins (7 > 2)
        [31.0, 32.0, 3.0, 3.1, 0.0, 0.0, 0.0, 0.0], // after candidate 0: 32 wins narrowly (p ≈ 0.52)
    ]
    .concat();
    assert_eq!(best_path(&lattice, 8, 2, 3, 0.0), vec![12, 21, 32]);
    assert_eq!(best_path(&lattice, 8, 2, 2, 0.0), vec![12, 21]);
    // p_min 0.9: row 3's best candidate has probability 1/(1 + e^-0.1) ≈ 0.52 < 0.9.
    assert_eq!(best_path(&lattice, 8, 2, 3, 0.9), vec![12, 21]);
    // Rows beyond the lattice end the path.
    assert_eq!(best_path(&lattice, 8, 2, 7, 0.0), vec![12, 21, 32]);
}

#[test]
fn a_selector_that_does_not_fit_is_an_error() {
    let mut ctx = Context::new();
    let target = Qwen3::new(&mut ctx, target_hp(), &TensorTypes::uniform(GgmlType::F32), GgmlType::F16, 8).unwrap();
    // K + K² = 132 > E = 128: a lattice row cannot hold the scores.
    let wide = DflashHparams { conv: Some((2, 16)), selector: Some((32, 11)), ..drafter_hp() };
    let e = Dflash::new(&mut ctx, &target, wide, &TensorTypes::uniform(GgmlType::F32), GgmlType::F16, 8).unwrap_err();
    assert!(e.to_string().contains("selector_top_k"), "{e}");
    // A structured drafter needs the selector.
    let dir = std::env::temp_dir().join(format!("shardgraph-dflash-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = shardgraph_models::generate::write_dflash_gguf_with(
        dir.join("d.gguf"),
        &drafter_hp(),
        &TensorTypes::uniform(GgmlType::F32),
        160,
        1,
        shardgraph_models::generate::Weights::Permutation,
    )
    .unwrap_err();
    assert!(e.to_string().contains("selector"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
