//! Split execution equals single-device execution: the field cases C1-C9 of
//! docs/split-design.md (section 7) and its section 5 rows, planned by the
//! planner and run by the reference executor on N CPU devices, against one CPU
//! device with the same bytes (exact for integer outputs, byte-exact for
//! quantized outputs such as caches written by set_rows, NMSE ≤ 1e-6 for F32
//! values).

#[path = "common/devices.rs"]
mod devices;
#[path = "common/nmse.rs"]
mod nmse;
#[path = "common/rng.rs"]
mod rng;

#[path = "common/qwen3.rs"]
mod qwen3;

use nmse::nmse;
use qwen3::fixtures::OneCpu;
use qwen3::{input, named, qwen3_layers, qwen3_policy, Dims};
use shardgraph::split::{
    split_extents, AxisSplit, Collective, DeviceSet, Plan, Planner, SplitPolicy, SplitSpec, SplitState, SplitStore,
};
use shardgraph::{Context, GgmlType, RopeMode, RopeParams, TensorId};
use shardgraph_models::qwen35::{delta_net_rules, DeltaNetHeads};

/// Deterministic leaf values.
/// `n` values in [-1, 1) from `seed`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    rng::values(n, seed, 1.0, 0.0)
}

/// Runs `outputs` on one device and on `ratios.len()` devices under `policy`
/// (plus explicit states) and asserts equal results. `ints` fills I32/I64 leafs.
/// Panics with the planner's or the executor's error text if either fails.
fn check(
    ctx: &Context,
    outputs: &[TensorId],
    policy: &SplitPolicy,
    explicit: &[(TensorId, SplitState)],
    ints: &dyn Fn(TensorId, usize) -> Vec<i64>,
) -> shardgraph::split::Plan {
    let g = ctx.build_forward(outputs).unwrap();
    let one = OneCpu::new(ctx, &g, 2, |st, l| {
        let t = ctx.tensor(l).unwrap();
        let n = t.nelements() as usize;
        match t.ty {
            GgmlType::I32 => st.set_i32(ctx, l, &ints(l, n).iter().map(|&v| v as i32).collect::<Vec<_>>()).unwrap(),
            GgmlType::I64 => st.set_i64(ctx, l, &ints(l, n)).unwrap(),
            _ => st.set_f32(ctx, l, &values(n, l.index() as u64 + 7)).unwrap(),
        }
    })
    .unwrap();
    one.compute(ctx, &g).unwrap();
    let (st, leaf_bytes) = (&one.storage, &one.leaf_bytes);

    let plan = Planner::default()
        .plan(ctx, &g, policy, explicit)
        .unwrap_or_else(|e| panic!("planning on {} devices {:?}: {e}", policy.n_devices(), policy.ratios()));
    let exec = devices::executor(policy.n_devices());
    let got = exec.run(ctx, &g, &plan, &|l| leaf_bytes.get(&l).cloned(), outputs).unwrap_or_else(|e| {
        panic!("running on {} devices {:?}: {e}\n{}", policy.n_devices(), policy.ratios(), plan.report(ctx))
    });
    for (k, &o) in outputs.iter().enumerate() {
        let t = ctx.tensor(o).unwrap();
        let what = format!(
            "output {k} ({} {}) on {} devices {:?}\n{}",
            t.op.name(),
            t.describe(),
            policy.n_devices(),
            policy.ratios(),
            plan.report(ctx)
        );
        match t.ty {
            ty if ty.is_quantized() && !devices::exact() => {
                // On CUDA devices: the dequantized values (the rows were
                // quantized from values that agree to rounding).
                let want = st.get_f32(ctx, o).unwrap();
                let mut have = vec![0f32; want.len()];
                let rb = t.row_bytes();
                for (r, row) in have.chunks_mut(t.ne[0] as usize).enumerate() {
                    shardgraph::tensor::quant::dequantize_row(ty, &got[k][r * rb..(r + 1) * rb], row).unwrap();
                }
                let e = nmse(&have, &want);
                assert!(e <= devices::tolerance(0.0), "nmse {e:.3e}: {what}");
            }
            ty if ty.is_quantized() => {
                // Quantized outputs (caches written by set_rows, concat of
                // blocks): the bytes themselves, block by block.
                let mut want = vec![0u8; t.nbytes()];
                st.get_bytes(ctx, o, 0, &mut want).unwrap();
                assert_eq!(got[k].len(), want.len(), "{what}");
                if let Some(i) = got[k].iter().zip(&want).position(|(a, b)| a != b) {
                    panic!("first differing byte at {i} of {}: {what}", want.len());
                }
            }
            GgmlType::I32 => {
                let want = st.get_i32(ctx, o).unwrap();
                let have: Vec<i32> =
                    got[k].chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
                assert_eq!(have, want, "{what}");
            }
            _ => {
                let want = st.get_f32(ctx, o).unwrap();
                let have: Vec<f32> =
                    got[k].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                assert_eq!(have.len(), want.len(), "{what}");
                let e = nmse(&have, &want);
                assert!(e <= devices::tolerance(1e-6), "nmse {e:.3e}: {what}");
            }
        }
    }
    plan
}

const RATIOS: [&[f32]; 6] =
    [&[1.0], &[1.0, 1.0], &[3.0, 1.0], &[1.0, 1.0, 1.0], &[1.0, 1.0, 1.0, 1.0], &[1.0, 0.0, 2.0]];

fn no_ints(_: TensorId, n: usize) -> Vec<i64> {
    (0..n as i64).collect()
}

#[test]
fn c1_vocab_split_head_into_row_ops() {
    for ratios in RATIOS {
        let (e, v, t) = (64, 200, 3);
        let mut ctx = Context::new();
        let w = named(&mut ctx, GgmlType::Q8_0, &[e, v], "output.weight");
        let x = input(&mut ctx, GgmlType::F32, &[e, t], "x");
        let mask = input(&mut ctx, GgmlType::F32, &[v, t], "mask");
        let logits = ctx.mul_mat(w, x).unwrap();
        let outs = [
            ctx.argmax(logits).unwrap(),
            ctx.top_k(logits, 4).unwrap(),
            ctx.soft_max(logits).unwrap(),
            ctx.soft_max_ext(logits, Some(mask), 0.7, 0.0).unwrap(),
            ctx.rms_norm(logits, 1e-6).unwrap(),
            ctx.sum_rows(logits).unwrap(),
            ctx.mean(logits).unwrap(),
            ctx.norm(logits, 1e-5).unwrap(),
            ctx.l2_norm(logits, 1e-12).unwrap(),
        ];
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("output.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
        let plan = check(&ctx, &outs, &policy, &[], &no_ints);
        if ratios.len() > 1 {
            assert_eq!(plan.count(Collective::AllGather), 0, "{}", plan.report(&ctx));
        }
    }
}

#[test]
fn c1_ties_break_as_on_one_device() {
    // Equal maxima on different devices: argmax must pick ggml's (last) index.
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let x = named(&mut ctx, GgmlType::F32, &[8, 2], "logits");
        let am = ctx.argmax(x).unwrap();
        let tk = ctx.top_k(x, 3).unwrap();
        let policy =
            SplitPolicy::new(ratios).unwrap().rule("logits", SplitSpec::Axis { axis: 0, granule: 1, segments: vec![] });
        let g = ctx.build_forward(&[am, tk]).unwrap();
        let vals = [1.0f32, 5.0, 2.0, 5.0, 0.0, 5.0, -1.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0];
        let one = OneCpu::new(&ctx, &g, 1, |st, l| {
            if l == x {
                st.set_f32(&ctx, x, &vals).unwrap();
            }
        })
        .unwrap();
        one.compute(&ctx, &g).unwrap();
        let st = &one.storage;
        let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = devices::executor(ratios.len()).run(&ctx, &g, &plan, &|_| Some(bytes.clone()), &[am, tk]).unwrap();
        let i32s = |b: &[u8]| b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
        assert_eq!(i32s(&got[0]), st.get_i32(&ctx, am).unwrap(), "{ratios:?}");
        assert_eq!(i32s(&got[1]), st.get_i32(&ctx, tk).unwrap(), "{ratios:?}");
    }
}

#[test]
fn c7_mul_mat_combinations_and_c8_partial_into_non_linear_ops() {
    for ratios in RATIOS {
        let mut ctx = Context::new();
        // Weight-sized B: slicing A and reducing the small product beats
        // gathering B under the cost model (a gather of a few KB would not).
        let a = named(&mut ctx, GgmlType::F32, &[4096, 6], "a"); // [K, N] mirrored
        let b = named(&mut ctx, GgmlType::F32, &[4096, 256], "b"); // [K, M] split on K
        let p = ctx.mul_mat(a, b).unwrap(); // C7(a): partial
        let a3 = named(&mut ctx, GgmlType::F32, &[8, 4, 6], "a3"); // split on heads
        let b3 = named(&mut ctx, GgmlType::F32, &[8, 3, 6], "b3");
        let h = ctx.mul_mat(a3, b3).unwrap(); // C7(b): heads stay split
        let pp = ctx.mul_mat(p, p).unwrap(); // C7(c): product of partial sums
        let outs = [
            ctx.rms_norm(p, 1e-6).unwrap(),
            ctx.soft_max(p).unwrap(),
            ctx.silu(p).unwrap(),
            ctx.sqr(p).unwrap(),
            ctx.scale(p, 3.0).unwrap(),
            h,
            pp,
        ];
        let n = ratios.len();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("b", SplitSpec::Axis { axis: 0, granule: 1, segments: vec![] })
            .rule("a3", SplitSpec::Axis { axis: 2, granule: 1, segments: vec![] })
            .rule("b3", SplitSpec::Axis { axis: 2, granule: 1, segments: vec![] })
            .rule("a", SplitSpec::Mirrored);
        let plan = check(&ctx, &outs, &policy, &[], &no_ints);
        if n > 1 {
            // A partial sum over the devices that hold part of `b` (all of
            // them, or {0, 2} for the ratios 1,0,2: a device with a zero
            // share holds no addend and takes no part in its reduction).
            let holders = DeviceSet::of((0..n).filter(|&j| ratios[j] > 0.0));
            assert_eq!(plan.state(p), Some(&SplitState::partial_on(holders, n)), "{ratios:?}");
            assert!(matches!(plan.state(h), Some(SplitState::Split(s)) if s.axis == 2));
        }
    }
}

#[test]
fn c9_mean_over_uneven_slices_with_an_empty_one() {
    for (ne, ext) in [([4i64, 3], vec![2i64, 1]), ([4, 1], vec![1, 0])] {
        let mut ctx = Context::new();
        let x = named(&mut ctx, GgmlType::F32, &ne, "x");
        let m = ctx.mean(x).unwrap();
        let s = ctx.sum_rows(x).unwrap();
        let ms = ctx.mean(s).unwrap();
        let policy = SplitPolicy::new(&[1.0, 1.0]).unwrap();
        check(&ctx, &[m, s, ms], &policy, &[(x, SplitState::split(1, ext.clone()))], &no_ints);
        // Split on the reduced axis too: the combine sums values and counts.
        check(&ctx, &[m, s, ms], &policy, &[(x, SplitState::split(0, vec![3, 1]))], &no_ints);
    }
}

#[test]
fn vocab_parallel_embedding_lookup() {
    for ratios in RATIOS {
        let mut ctx = Context::new();
        // A table large enough that gathering it costs more than reducing the lookup.
        let emb = named(&mut ctx, GgmlType::Q8_0, &[256, 8000], "token_embd.weight");
        let ids = input(&mut ctx, GgmlType::I32, &[7], "tokens");
        let e = ctx.get_rows(emb, ids).unwrap();
        let y = ctx.rms_norm(e, 1e-6).unwrap();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("token_embd.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
        let plan = check(&ctx, &[y, e], &policy, &[], &|_, n| (0..n as i64).map(|i| (i * 1777 + 3) % 8000).collect());
        if ratios.len() > 1 {
            assert_eq!(plan.state(e), Some(&SplitState::partial()));
        }
    }
}

#[test]
fn qwen3_layers_equal_one_device() {
    for (ratios, h, hkv) in
        [(vec![1.0, 1.0], 8, 2), (vec![3.0, 1.0], 16, 4), (vec![1.0, 1.0, 1.0], 12, 3), (vec![1.0; 4], 16, 4)]
    {
        let dm = Dims { e: 128, h, hkv, d: 16, f: 384, t: 4 };
        let mut ctx = Context::new();
        let out = qwen3_layers(&mut ctx, &dm, 2);
        let policy = qwen3_policy(&ratios, dm.d, h / hkv);
        let plan = check(&ctx, &[out], &policy, &[], &|_, n| (0..n as i64).collect());
        assert_eq!(plan.count(Collective::AllGather), 0, "{}", plan.report(&ctx));
    }
}

/// Moved from split_plan.rs: the plan of Qwen3-style layers moves exactly
/// Megatron's minimum (two all-reduces of the hidden state per layer, no
/// gathers).
#[test]
fn qwen3_layers_move_exactly_the_megatron_minimum() {
    for (ratios, n_layer, h, hkv) in [
        (vec![1.0, 1.0], 2, 8, 2),
        (vec![1.0, 1.0, 1.0, 1.0], 3, 16, 4),
        (vec![3.0, 1.0], 1, 16, 4),
        (vec![1.0, 1.0, 1.0], 2, 12, 3),
    ] {
        let dm = Dims { e: 256, h, hkv, d: 32, f: 768, t: 5 };
        let mut ctx = Context::new();
        let out = qwen3_layers(&mut ctx, &dm, n_layer);
        let g = ctx.build_forward(&[out]).unwrap();
        let plan = Planner::default().plan(&ctx, &g, &qwen3_policy(&ratios, dm.d, h / hkv), &[]).unwrap();
        let n = ratios.len() as u64;
        let b = (dm.e * dm.t * 4) as u64;
        let all_reduce = 2 * b * (n - 1);
        assert_eq!(plan.count(Collective::AllGather), 0, "{}", plan.report(&ctx));
        assert_eq!(plan.count(Collective::AllReduce), 2 * n_layer, "{}", plan.report(&ctx));
        assert_eq!(plan.total_bytes(), 2 * n_layer as u64 * all_reduce, "{}", plan.report(&ctx));
        // Executed: the communicator moves exactly those bytes, and each layer
        // lowers to per-device subgraphs between its two all-reduces.
        let exec = devices::executor(ratios.len());
        let lowered = exec.lower(&ctx, &g, &plan).unwrap();
        assert_eq!(lowered.n_subgraphs(), 2 * n_layer + 1, "{}", lowered.describe(&ctx));
        if std::env::var("SHOW_LOWERING").is_ok() {
            eprintln!("{}", lowered.describe(&ctx));
        }
        let mut store = SplitStore::new(ratios.len());
        let rep = exec.execute(&ctx, &g, &plan, &mut store, &[out]).unwrap();
        assert_eq!((rep.bytes_moved, rep.unplanned_bytes), (plan.total_bytes(), 0));
        // The conversions (both all-reduces of every layer) run between
        // device buffers, on every kind of device (one data path): one
        // exchange each on two devices (one-shot), two on more (two-shot).
        let per = if n == 2 { 1 } else { 2 };
        assert_eq!(rep.device_conversions, 2 * n_layer * per, "{n} devices");
    }
}

/// The collectives (exchanges between device buffers, packing and sums as
/// device graph nodes) give one device's bytes and move exactly the plan's
/// bytes, for every conversion a qwen3 layer stack plans (all-reduces) and
/// for all-gathers, all-to-alls and reduce-scatters between split states,
/// on 2 and 3 devices. (Before the compiled runtime this compared a host
/// path with a device path; there is one data path now.)
#[test]
fn device_side_collectives_equal_one_device() {
    use shardgraph::split::Devices;
    for n in [2usize, 3] {
        let dm = Dims { e: 96, h: 6, hkv: 3, d: 16, f: 192, t: 3 };
        let mut ctx = Context::new();
        let out = qwen3_layers(&mut ctx, &dm, 1);
        // Then: the hidden state split on rows, on tokens, and a partial sum
        // reduce-scattered (x·W with W split on its inputs).
        let w = named(&mut ctx, GgmlType::F32, &[dm.e, 40], "extra.w");
        let y = ctx.mul_mat(w, out).unwrap();
        let z = ctx.soft_max(y).unwrap();
        let zt = ctx.transpose(z).unwrap();
        let tr = ctx.cont(zt).unwrap();
        // Leafs split on different axes meet: all-to-all, reduce-scatter.
        let leaf = |ctx: &mut Context, name: &str, ne0: i64, ne1: i64| named(ctx, GgmlType::F32, &[ne0, ne1], name);
        let (a, b) = (leaf(&mut ctx, "act.a", 24, 30), leaf(&mut ctx, "act.b", 24, 30));
        let ab = ctx.add(a, b).unwrap();
        let (w2, x2, c) =
            (leaf(&mut ctx, "w2", 24, 30), leaf(&mut ctx, "act.x", 24, 6), leaf(&mut ctx, "act.c", 30, 6));
        let p = ctx.mul_mat(w2, x2).unwrap();
        let pc = ctx.add(p, c).unwrap();
        let pcs = ctx.silu(pc).unwrap();
        let outs = [out, y, z, tr, ab, pcs];
        let g = ctx.build_forward(&outs).unwrap();
        let ax = |axis| SplitSpec::Axis { axis, granule: 1, segments: vec![] };
        let policy = qwen3_policy(&vec![1.0; n], dm.d, dm.h / dm.hkv)
            .rule("extra.w", ax(0))
            .rule("act.a", ax(1))
            .rule("act.b", ax(0))
            .rule("w2", ax(0))
            .rule("act.x", ax(0))
            .rule("act.c", ax(1));
        let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
        let data = |id: TensorId| {
            let t = ctx.tensor(id).unwrap();
            let k = id.index() as f32;
            (t.ty == GgmlType::F32).then(|| {
                (0..t.nelements())
                    .flat_map(|i| (((i as f32 * 0.37 + k).sin()) * 0.2).to_le_bytes())
                    .collect::<Vec<u8>>()
            })
        };
        let mut reports = Vec::new();
        for devices in [1, n] {
            let plan = if devices == 1 {
                Planner::default()
                    .plan(&ctx, &g, &SplitPolicy::new(&[1.0]).unwrap().rule("*", SplitSpec::Mirrored), &[])
                    .unwrap()
            } else {
                plan.clone()
            };
            let exec = Devices::cpu(devices, 1).and_then(|d| d.executor()).unwrap();
            let mut store = SplitStore::new(devices);
            store.place_leafs(&ctx, &g, &plan).unwrap();
            for &l in g.leafs() {
                if let Some(b) = data(l) {
                    store.set_tensor(&ctx, l, 0, &b).unwrap();
                }
            }
            reports.push(exec.execute(&ctx, &g, &plan, &mut store, &outs).unwrap());
        }
        if std::env::var("SHOW_PLAN").is_ok() {
            eprintln!("{}", plan.report(&ctx));
        }
        let (one, dev) = (&reports[0], &reports[1]);
        let f32s =
            |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
        assert!(dev.device_conversions >= 5, "{n} devices: {} device conversions", dev.device_conversions);
        assert_eq!((dev.bytes_moved, dev.unplanned_bytes), (plan.total_bytes(), 0), "{n} devices");
        for (k, (a, b)) in one.outputs.iter().zip(&dev.outputs).enumerate() {
            let (a, b) = (f32s(&a.bytes), f32s(&b.bytes));
            let err = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            // Partial sums add in another order than one device's dot products.
            assert!(err <= 1e-5, "{n} devices, output {k}: max error {err}");
            assert!(a.iter().any(|&x| x != 0.0), "output {k} is all zeros");
        }
    }
}

// ---------------------------------------------------------------------------
// docs/split-design.md, section 7: C2-C6.
// ---------------------------------------------------------------------------

/// The leaf named `name`.
fn leaf(ctx: &Context, name: &str) -> TensorId {
    ctx.find(name).unwrap_or_else(|| panic!("no tensor {name:?}"))
}

fn neox(d: i64) -> RopeParams {
    RopeParams { n_dims: d as i32, mode: RopeMode::Neox, freq_base: 1e6, ..RopeParams::default() }
}

/// Plan expectations missed over a sweep. Values are asserted at once (by
/// `check`); plan shape (no gather, states kept split) is collected so that
/// every configuration runs before the test fails, listing every miss with
/// its configuration, then that configuration's plan once.
#[derive(Default)]
struct Gaps(Vec<(String, String, String)>);

impl Gaps {
    /// Records `what` under configuration `cfg` (with the plan) unless `ok`.
    fn expect(&mut self, ok: bool, cfg: &str, what: impl std::fmt::Display, plan: &Plan, ctx: &Context) {
        if !ok {
            self.0.push((cfg.to_string(), what.to_string(), plan.report(ctx)));
        }
    }

    /// Records a state other than `want` for `id`.
    fn state(&mut self, cfg: &str, name: &str, id: TensorId, want: &SplitState, plan: &Plan, ctx: &Context) {
        let have = plan.state(id);
        let what = format!("{name}: state {}, want {}", have.map_or("none".into(), |s| s.label()), want.label());
        self.expect(have == Some(want), cfg, what, plan, ctx);
    }

    /// Records a count of `kind` other than `want`.
    fn count(&mut self, cfg: &str, kind: Collective, want: usize, plan: &Plan, ctx: &Context) {
        let have = plan.count(kind);
        self.expect(have == want, cfg, format!("{have} {kind:?}, want {want}"), plan, ctx);
    }

    /// Fails the test if anything was recorded.
    fn assert_none(self) {
        let mut msg = String::new();
        for (k, (cfg, what, report)) in self.0.iter().enumerate() {
            msg += &format!("[{cfg}] {what}\n");
            if self.0.get(k + 1).is_none_or(|next| next.0 != *cfg) {
                msg += report;
            }
        }
        assert!(self.0.is_empty(), "{} plan expectation(s) not met:\n{msg}", self.0.len());
    }
}

#[test]
fn c2_one_kv_head_split_on_head_dim_then_rms_norm() {
    // V = reshape(mul_mat(Wv, x)) → [head_dim=512, n_head_kv=1, T]; the head
    // axis cannot be split, so the policy splits head_dim (axis 0).
    let mut gaps = Gaps::default();
    for ratios in RATIOS {
        let (e, d, t) = (64, 512, 3);
        let mut ctx = Context::new();
        let wv = named(&mut ctx, GgmlType::Q8_0, &[e, d], "blk.0.attn_v.weight");
        let nw = named(&mut ctx, GgmlType::F32, &[d], "blk.0.attn_v_norm.weight");
        let x = input(&mut ctx, GgmlType::F32, &[e, t], "x");
        let v = ctx.mul_mat(wv, x).unwrap();
        let v = ctx.reshape_3d(v, d, 1, t).unwrap();
        let vn = ctx.rms_norm(v, 1e-6).unwrap();
        let vw = ctx.mul(vn, nw).unwrap();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("blk.*.attn_v.weight", SplitSpec::Axis { axis: 1, granule: 32, segments: vec![] })
            .rule("*norm*", SplitSpec::Mirrored);
        let plan = check(&ctx, &[vn, vw], &policy, &[], &no_ints);
        if ratios.len() > 1 {
            // The norm over all 512 values is a per-row combine, not a gather.
            let cfg = format!("{ratios:?}");
            let ext = split_extents(d, ratios, 32).unwrap();
            gaps.state(&cfg, "rms_norm(V)", vn, &SplitState::split(0, ext), &plan, &ctx);
            gaps.count(&cfg, Collective::AllGather, 0, &plan, &ctx);
        }
    }
    gaps.assert_none();
}

#[test]
fn c2_one_kv_head_stays_mirrored_while_q_heads_split() {
    // The better plan: K/V mirrored, only Q's heads split; every Q head
    // reads KV head 0, the output projection gives a partial sum.
    let mut gaps = Gaps::default();
    for ratios in RATIOS {
        let (e, h, d, t) = (64, 4, 512, 3);
        let mut ctx = Context::new();
        let x = input(&mut ctx, GgmlType::F32, &[e, t], "inp_embd");
        let pos = input(&mut ctx, GgmlType::I32, &[t], "inp_pos");
        let mask = input(&mut ctx, GgmlType::F16, &[t, t], "kq_mask");
        let wq = named(&mut ctx, GgmlType::Q8_0, &[e, h * d], "blk.0.attn_q.weight");
        let wk = named(&mut ctx, GgmlType::Q8_0, &[e, d], "blk.0.attn_k.weight");
        let wv = named(&mut ctx, GgmlType::Q8_0, &[e, d], "blk.0.attn_v.weight");
        let wo = named(&mut ctx, GgmlType::Q8_0, &[h * d, e], "blk.0.attn_output.weight");
        let q = ctx.mul_mat(wq, x).unwrap();
        let q = ctx.reshape_3d(q, d, h, t).unwrap();
        let q = ctx.rms_norm(q, 1e-6).unwrap();
        let q = ctx.rope_ext(q, pos, None, neox(d)).unwrap();
        let q = ctx.permute(q, [0, 2, 1, 3]).unwrap();
        let k = ctx.mul_mat(wk, x).unwrap();
        let k = ctx.reshape_3d(k, d, 1, t).unwrap();
        let k = ctx.rms_norm(k, 1e-6).unwrap();
        let k = ctx.rope_ext(k, pos, None, neox(d)).unwrap();
        let k = ctx.permute(k, [0, 2, 1, 3]).unwrap();
        let k = ctx.cast(k, GgmlType::F16).unwrap();
        let v = ctx.mul_mat(wv, x).unwrap();
        let v = ctx.reshape_3d(v, d, 1, t).unwrap();
        let v = ctx.permute(v, [0, 2, 1, 3]).unwrap();
        let v = ctx.cast(v, GgmlType::F16).unwrap();
        let a = ctx.flash_attn_ext(q, k, v, Some(mask), 1.0 / (d as f32).sqrt(), 0.0, 0.0).unwrap();
        let a = ctx.reshape_2d(a, h * d, t).unwrap();
        let y = ctx.mul_mat(wo, a).unwrap();
        let r = ctx.add(y, x).unwrap();
        let out = ctx.rms_norm(r, 1e-6).unwrap();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("blk.*.attn_q.weight", SplitSpec::Axis { axis: 1, granule: d, segments: vec![] })
            .rule("blk.*.attn_k.weight", SplitSpec::Mirrored)
            .rule("blk.*.attn_v.weight", SplitSpec::Mirrored)
            .rule("blk.*.attn_output.weight", SplitSpec::Axis { axis: 0, granule: d, segments: vec![] });
        let plan = check(&ctx, &[out, r], &policy, &[], &|_, n| (0..n as i64).collect());
        if ratios.len() > 1 {
            let cfg = format!("{ratios:?}");
            gaps.state(&cfg, "K", k, &SplitState::Mirrored, &plan, &ctx);
            gaps.state(&cfg, "V", v, &SplitState::Mirrored, &plan, &ctx);
            let heads = split_extents(h * d, ratios, d).unwrap();
            gaps.state(&cfg, "attention output", a, &SplitState::split(0, heads), &plan, &ctx);
            gaps.count(&cfg, Collective::AllGather, 0, &plan, &ctx);
            gaps.count(&cfg, Collective::AllReduce, 1, &plan, &ctx);
        }
    }
    gaps.assert_none();
}

#[test]
fn c3_fused_gate_up_as_two_segments_pairs_gate_and_up_on_each_device() {
    // W_up = gate|up [n_embd, 2·n_ff] split on axis 1 as two segments: device
    // j holds gate[j] and up[j]; g and u are views of the product.
    let mut gaps = Gaps::default();
    for ratios in RATIOS {
        let (e, f, t) = (64, 96, 3);
        let mut ctx = Context::new();
        let x = input(&mut ctx, GgmlType::F32, &[e, t], "x");
        let wgu = named(&mut ctx, GgmlType::Q8_0, &[e, 2 * f], "blk.0.ffn_gate_up.weight");
        let wd = named(&mut ctx, GgmlType::Q8_0, &[f, e], "blk.0.ffn_down.weight");
        let h = ctx.mul_mat(wgu, x).unwrap();
        let nb1 = ctx.tensor(h).unwrap().nb[1];
        let g = ctx.view_2d(h, f, t, nb1, 0).unwrap();
        let u = ctx.view_2d(h, f, t, nb1, f as usize * 4).unwrap();
        let sg = ctx.silu(g).unwrap();
        let a = ctx.mul(sg, u).unwrap();
        let a2 = ctx.swiglu_split(g, u).unwrap();
        let y = ctx.mul_mat(wd, a).unwrap();
        let r = ctx.add(y, x).unwrap();
        let out = ctx.rms_norm(r, 1e-6).unwrap();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("blk.*.ffn_gate_up.weight", SplitSpec::Axis { axis: 1, granule: 32, segments: vec![f, f] })
            .rule("blk.*.ffn_down.weight", SplitSpec::Axis { axis: 0, granule: 32, segments: vec![] });
        let plan = check(&ctx, &[a, a2, out], &policy, &[], &no_ints);
        if ratios.len() > 1 {
            let cfg = format!("{ratios:?}");
            let ext = split_extents(f, ratios, 32).unwrap();
            let two = SplitState::Split(AxisSplit { axis: 0, segments: vec![ext.clone(), ext.clone()], repeat: 1 });
            gaps.state(&cfg, "gate|up product", h, &two, &plan, &ctx);
            // Each device pairs its gate rows with its own up rows, on the
            // boundaries W_down is split on: nothing is gathered.
            gaps.state(&cfg, "gate view", g, &SplitState::split(0, ext.clone()), &plan, &ctx);
            gaps.state(&cfg, "up view", u, &SplitState::split(0, ext.clone()), &plan, &ctx);
            gaps.count(&cfg, Collective::AllGather, 0, &plan, &ctx);
            gaps.count(&cfg, Collective::AllReduce, 1, &plan, &ctx);
        }
    }
    gaps.assert_none();
}

#[test]
fn c3_fused_swiglu_on_a_two_segment_gate_up() {
    // ggml_swiglu on the fused product (llama.cpp's path for a fused
    // ffn_up of gate|up): each device's local [gate[j] | up[j]] halves pair
    // correctly, so the result is a one-segment split on the same extents.
    let mut gaps = Gaps::default();
    for ratios in RATIOS {
        let (e, f, t) = (64, 96, 3);
        let mut ctx = Context::new();
        let x = input(&mut ctx, GgmlType::F32, &[e, t], "x");
        let wgu = named(&mut ctx, GgmlType::Q8_0, &[e, 2 * f], "blk.0.ffn_up.weight");
        let wd = named(&mut ctx, GgmlType::Q8_0, &[f, e], "blk.0.ffn_down.weight");
        let h = ctx.mul_mat(wgu, x).unwrap();
        let a = ctx.swiglu(h).unwrap();
        let y = ctx.mul_mat(wd, a).unwrap();
        let out = ctx.rms_norm(y, 1e-6).unwrap();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("blk.*.ffn_up.weight", SplitSpec::Axis { axis: 1, granule: 32, segments: vec![f, f] })
            .rule("blk.*.ffn_down.weight", SplitSpec::Axis { axis: 0, granule: 32, segments: vec![] });
        let plan = check(&ctx, &[a, out], &policy, &[], &no_ints);
        if ratios.len() > 1 {
            let cfg = format!("{ratios:?}");
            let ext = split_extents(f, ratios, 32).unwrap();
            gaps.state(&cfg, "swiglu(gate|up)", a, &SplitState::split(0, ext), &plan, &ctx);
            gaps.count(&cfg, Collective::AllGather, 0, &plan, &ctx);
        }
    }
    gaps.assert_none();
}

/// A fused QKV attention block: `W_qkv = [n_embd, (h + 2·hkv)·d]`, q/k/v
/// as views of the product (as llama.cpp builds it), rope, flash attention
/// with GQA, output projection, residual, norm. Returns (qkv, out).
fn fused_qkv_block(ctx: &mut Context, e: i64, h: i64, hkv: i64, d: i64, t: i64) -> (TensorId, TensorId) {
    let x = input(ctx, GgmlType::F32, &[e, t], "inp_embd");
    let pos = input(ctx, GgmlType::I32, &[t], "inp_pos");
    let mask = input(ctx, GgmlType::F16, &[t, t], "kq_mask");
    let wqkv = named(ctx, GgmlType::Q8_0, &[e, (h + 2 * hkv) * d], "blk.0.attn_qkv.weight");
    let wo = named(ctx, GgmlType::Q8_0, &[h * d, e], "blk.0.attn_output.weight");
    let qkv = ctx.mul_mat(wqkv, x).unwrap();
    let nb1 = ctx.tensor(qkv).unwrap().nb[1];
    let es = 4usize;
    let q = ctx.view_3d(qkv, d, h, t, d as usize * es, nb1, 0).unwrap();
    let k = ctx.view_3d(qkv, d, hkv, t, d as usize * es, nb1, (h * d) as usize * es).unwrap();
    let v = ctx.view_3d(qkv, d, hkv, t, d as usize * es, nb1, ((h + hkv) * d) as usize * es).unwrap();
    let q = ctx.rope_ext(q, pos, None, neox(d)).unwrap();
    let k = ctx.rope_ext(k, pos, None, neox(d)).unwrap();
    let q = ctx.permute(q, [0, 2, 1, 3]).unwrap();
    let k = ctx.permute(k, [0, 2, 1, 3]).unwrap();
    let v = ctx.permute(v, [0, 2, 1, 3]).unwrap();
    let k = ctx.cast(k, GgmlType::F16).unwrap();
    let v = ctx.cast(v, GgmlType::F16).unwrap();
    let a = ctx.flash_attn_ext(q, k, v, Some(mask), 1.0 / (d as f32).sqrt(), 0.0, 0.0).unwrap();
    let a = ctx.reshape_2d(a, h * d, t).unwrap();
    let y = ctx.mul_mat(wo, a).unwrap();
    let r = ctx.add(y, x).unwrap();
    (qkv, ctx.rms_norm(r, 1e-6).unwrap())
}

#[test]
fn c3_fused_qkv_three_segments_of_different_sizes() {
    // Q (8 heads) is wider than K and V (2 heads each): three segments of
    // different sizes, each split on its own over whole GQA groups, so
    // device j holds Q[j], K[j], V[j] of the same groups.
    let (e, h, hkv, d, t) = (64, 8, 2, 32, 3);
    let g = h / hkv;
    let mut gaps = Gaps::default();
    for ratios in RATIOS {
        let kv = split_extents(hkv * d, ratios, d).unwrap();
        let qe: Vec<i64> = kv.iter().map(|x| x * g).collect();
        let segments = vec![qe, kv.clone(), kv.clone()];
        let state = SplitState::Split(AxisSplit { axis: 1, segments: segments.clone(), repeat: 1 });
        let mut ctx = Context::new();
        let (qkv, out) = fused_qkv_block(&mut ctx, e, h, hkv, d, t);
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("blk.*.attn_output.weight", SplitSpec::Axis { axis: 0, granule: g * d, segments: vec![] });
        let w = leaf(&ctx, "blk.0.attn_qkv.weight");
        let plan = check(&ctx, &[out], &policy, &[(w, state.clone())], &|_, n| (0..n as i64).collect());
        if ratios.len() > 1 && state.sole_holder().is_some() {
            // All of Q, K and V on one device ([1, 0, 2]: two KV heads,
            // both on device 2): it runs the block alone, nothing moves.
            let cfg = format!("{ratios:?}");
            let on = plan.state(qkv).and_then(SplitState::sole_holder);
            gaps.expect(on == state.sole_holder(), &cfg, format!("qkv on {on:?}"), &plan, &ctx);
            gaps.expect(plan.total_bytes() == 0, &cfg, format!("{} B moved", plan.total_bytes()), &plan, &ctx);
        } else if ratios.len() > 1 {
            let cfg = format!("{ratios:?}");
            let three = SplitState::Split(AxisSplit { axis: 0, segments, repeat: 1 });
            gaps.state(&cfg, "qkv", qkv, &three, &plan, &ctx);
            gaps.count(&cfg, Collective::AllGather, 0, &plan, &ctx);
            gaps.count(&cfg, Collective::AllReduce, 1, &plan, &ctx);
        }
        // The same graph with the segments from a policy rule (one granule of
        // a head for all three segments, so Q and K/V need not fall on the
        // same GQA groups): whatever the planner does, the values are right.
        let policy = policy.rule(
            "blk.*.attn_qkv.weight",
            SplitSpec::Axis { axis: 1, granule: d, segments: vec![h * d, hkv * d, hkv * d] },
        );
        check(&ctx, &[out], &policy, &[], &|_, n| (0..n as i64).collect());
    }
    gaps.assert_none();
}

#[test]
fn c4_flattened_head_split_into_q8_0_and_q4_0_caches() {
    // K = [128, 8, T] split on heads; K2 = reshape(K, [128, 8·T]) is one
    // segment of 8 repeated T times; mul_mat by a mirrored [128, 128],
    // reshape back to [128, 8, T], set_rows into a Q8_0 and a Q4_0 cache
    // split by heads. The caches' bytes must equal one device's.
    let (e, d, hkv, t, kv) = (64, 128, 8, 3, 6);
    let mut gaps = Gaps::default();
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let x = input(&mut ctx, GgmlType::F32, &[e, t], "inp_embd");
        let idx = input(&mut ctx, GgmlType::I64, &[t], "k_idxs");
        let wk = named(&mut ctx, GgmlType::Q8_0, &[e, hkv * d], "blk.0.attn_k.weight");
        let hm = named(&mut ctx, GgmlType::F32, &[d, d], "hadamard");
        let c8 = named(&mut ctx, GgmlType::Q8_0, &[hkv * d, kv], "cache_k_l0");
        let c4 = named(&mut ctx, GgmlType::Q4_0, &[hkv * d, kv], "cache_v_l0");
        let k = ctx.mul_mat(wk, x).unwrap();
        let k = ctx.reshape_3d(k, d, hkv, t).unwrap();
        let k2 = ctx.reshape_2d(k, d, hkv * t).unwrap();
        let y = ctx.mul_mat(hm, k2).unwrap();
        let y3 = ctx.reshape_3d(y, d, hkv, t).unwrap();
        let rows = ctx.reshape_2d(y3, hkv * d, t).unwrap();
        let w8 = ctx.set_rows(c8, rows, idx).unwrap();
        let w4 = ctx.set_rows(c4, rows, idx).unwrap();
        let heads = SplitSpec::Axis { axis: 1, granule: d, segments: vec![] };
        let cache = SplitSpec::Axis { axis: 0, granule: d, segments: vec![] };
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("blk.*.attn_k.weight", heads)
            .rule("hadamard", SplitSpec::Mirrored)
            .rule("cache_*", cache);
        // Distinct cache slots, not in order.
        let ints = |l: TensorId, n: usize| -> Vec<i64> {
            if l == idx {
                (0..n as i64).map(|i| (i * 2 + 1) % kv).collect()
            } else {
                (0..n as i64).collect()
            }
        };
        let plan = check(&ctx, &[w8, w4, c8, c4, y3], &policy, &[], &ints);
        if ratios.len() > 1 {
            let cfg = format!("{ratios:?}");
            let ext: Vec<i64> = split_extents(hkv, ratios, 1).unwrap();
            let rep = SplitState::Split(AxisSplit { axis: 1, segments: vec![ext.clone()], repeat: t });
            gaps.state(&cfg, "K2 = reshape(K, [128, 8·T])", k2, &rep, &plan, &ctx);
            gaps.state(&cfg, "mul_mat(H, K2)", y, &rep, &plan, &ctx);
            gaps.state(&cfg, "reshape back to [128, 8, T]", y3, &SplitState::split(1, ext.clone()), &plan, &ctx);
            // Each device writes its own heads' rows into its own cache slice.
            let by_heads = SplitState::split(0, ext.iter().map(|x| x * d).collect());
            gaps.state(&cfg, "Q8_0 cache after set_rows", w8, &by_heads, &plan, &ctx);
            gaps.state(&cfg, "Q4_0 cache after set_rows", w4, &by_heads, &plan, &ctx);
            gaps.count(&cfg, Collective::AllGather, 0, &plan, &ctx);
        }
    }
    gaps.assert_none();
}

#[test]
fn c5_linked_tensors_share_boundaries_on_3_devices() {
    // qkv [10240, T] with 3 segments rounded to W_qkv's quant block; the
    // conv-state cache and the conv weights rounded differently; concat
    // along time, then ssm_conv.
    let (e, t, dc) = (256, 4, 4);
    let segs = vec![2048i64, 2048, 6144];
    let di: i64 = segs.iter().sum();
    let mut gaps = Gaps::default();
    for ratios in [&[1.0f32, 1.0, 1.0][..], &[41.0, 29.0, 30.0]] {
        for (wty, granule) in [(GgmlType::Q8_0, 32), (GgmlType::Q4_K, 256)] {
            let mut ctx = Context::new();
            let x = input(&mut ctx, GgmlType::F32, &[e, t], "inp_embd");
            let wqkv = named(&mut ctx, wty, &[e, di], "blk.0.attn_qkv.weight");
            let states = named(&mut ctx, GgmlType::F32, &[dc - 1, di], "cache_r_l0");
            let wconv = named(&mut ctx, GgmlType::F32, &[dc, di], "blk.0.ssm_conv1d.weight");
            let qkv = ctx.mul_mat(wqkv, x).unwrap();
            let qt = ctx.transpose(qkv).unwrap();
            let conv_in = ctx.concat(states, qt, 0).unwrap();
            let conv = ctx.ssm_conv(conv_in, wconv).unwrap();
            let out = ctx.silu(conv).unwrap();
            let policy = SplitPolicy::new(ratios)
                .unwrap()
                .rule("blk.*.attn_qkv.weight", SplitSpec::Axis { axis: 1, granule, segments: segs.clone() })
                .rule("cache_r_*", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] })
                .rule("blk.*.ssm_conv1d.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: segs.clone() });
            let plan = check(&ctx, &[out, conv], &policy, &[], &no_ints);
            let cfg = format!("{wty} granule {granule}, ratios {ratios:?}");
            // The channels stay split: ssm_conv reads conv_in and W_conv on the
            // same boundaries (after a repartition if need be) and runs on
            // each device's channels.
            let st = plan.state(conv).map_or("none".into(), |s| s.label());
            let split0 = matches!(plan.state(conv), Some(SplitState::Split(s)) if s.axis == 0);
            gaps.expect(split0, &cfg, format!("ssm_conv output: state {st}, want split on axis 0"), &plan, &ctx);
            let ins = plan.inputs_of(conv).unwrap();
            let same = match (&ins[0], &ins[1]) {
                (SplitState::Split(a), SplitState::Split(b)) => {
                    a.axis == 1 && b.axis == 1 && (0..3).all(|j| a.ranges(j) == b.ranges(j))
                }
                _ => false,
            };
            let what = format!("ssm_conv reads conv_in as {} and W_conv as {}", ins[0].label(), ins[1].label());
            gaps.expect(same, &cfg, format!("{what}, want both split on axis 1, same boundaries"), &plan, &ctx);
        }
    }
    gaps.assert_none();
}

#[test]
fn c6_more_devices_than_kv_heads_gives_zero_size_slices() {
    // n_head_kv = 2 on 4 devices: two devices get no heads of Q, K, V; flash
    // attention, the row-split output projection and the all-reduce run on
    // empty slices.
    let mut gaps = Gaps::default();
    for (ratios, h, hkv) in [
        (vec![1.0, 1.0, 1.0, 1.0], 4, 2),
        (vec![1.0, 1.0, 1.0, 1.0], 8, 2),
        (vec![1.0, 1.0, 0.0, 0.0], 8, 2),
        (vec![1.0, 1.0, 1.0, 1.0], 4, 1),
        (vec![1.0, 1.0, 1.0], 6, 2),
    ] {
        let dm = Dims { e: 128, h, hkv, d: 32, f: 128, t: 3 };
        let mut ctx = Context::new();
        let out = qwen3_layers(&mut ctx, &dm, 1);
        let policy = qwen3_policy(&ratios, dm.d, h / hkv);
        let plan = check(&ctx, &[out], &policy, &[], &|_, n| (0..n as i64).collect());
        // The configuration really has empty slices.
        let wk = plan.state(leaf(&ctx, "blk.0.attn_k.weight")).and_then(|s| s.as_split().cloned());
        let wk = wk.unwrap_or_else(|| panic!("attn_k not split\n{}", plan.report(&ctx)));
        assert!((0..ratios.len()).any(|j| wk.local_len(j) == 0), "some device must hold no KV head: {wk:?}");
        // Never more than the two all-reduces of the layer's activations
        // (attention and FFN outputs, `[e, t]` F32); with one KV head the
        // attention lies whole on one device, which runs it alone and sends
        // its output to the others (a gather, 3 × 1536 B, where an
        // all-reduce moves 6 × 1536 B). (Keeping the residual there, the
        // FFN's input sent from it and its sum reduced to it, would move
        // 6 × 1536 B in all; the greedy walk, pricing the residual's gather
        // where the split FFN wants it, moves 9 × 1536 B.)
        let cfg = format!("{ratios:?} h {h} hkv {hkv}");
        let (act, n) = ((dm.e * dm.t * 4) as u64, ratios.len() as u64);
        let two_all_reduces = 2 * 2 * act * (n - 1);
        let total = plan.total_bytes();
        gaps.expect(total <= two_all_reduces, &cfg, format!("{total} B, more than {two_all_reduces}"), &plan, &ctx);
        if hkv == 1 {
            let want = 3 * act * (n - 1);
            gaps.expect(total <= want, &cfg, format!("{total} B, more than {want}"), &plan, &ctx);
        } else {
            // The attention's output is a partial sum on the m devices that
            // hold KV heads only: all-reduced among them (2 (m−1) × act),
            // the residual gathered from them where the FFN, split over the
            // f devices with a share, wants it ((f − m) × act), the FFN's
            // sum all-reduced among those (2 (f−1) × act). Without device
            // groups, two all-reduces over all n (4 (n−1) × act), also
            // through the devices with a zero share.
            let m = (0..ratios.len()).filter(|&j| wk.local_len(j) > 0).count() as u64;
            let f = ratios.iter().filter(|&&r| r > 0.0).count() as u64;
            let want = act * (2 * (m - 1) + (f - m) + 2 * (f - 1));
            gaps.expect(total == want, &cfg, format!("{total} B, want {want}"), &plan, &ctx);
        }
    }
    gaps.assert_none();
}

// ---------------------------------------------------------------------------
// The docs/split-design.md section 5 rows not covered above. Covered elsewhere:
// zero-size slices (RATIOS' [1, 0, 2] in C1/C7/vocab, C9, C6), ratio 3:1 and
// N = 3 (RATIOS in every sweep, qwen3 layers).
// ---------------------------------------------------------------------------

#[test]
fn sec5_inputs_of_one_op_in_different_split_states() {
    // docs/split-design.md, section 5:
    // "inputs of one op in different split states" (ggml's SPLIT_AXIS_UNKNOWN):
    // split on different axes, on the same axis with other extents, split
    // against partial, split against mirrored.
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let a = named(&mut ctx, GgmlType::F32, &[8, 6], "a"); // axis 0
        let b = named(&mut ctx, GgmlType::F32, &[8, 6], "b"); // axis 1
        let c = named(&mut ctx, GgmlType::F32, &[8, 6], "c"); // axis 0, other extents
        let m = named(&mut ctx, GgmlType::F32, &[8, 1], "m"); // mirrored, broadcast
        let w = named(&mut ctx, GgmlType::F32, &[8, 6], "w"); // axis 0
        let z = named(&mut ctx, GgmlType::F32, &[8, 6], "z"); // axis 0
        let s6 = named(&mut ctx, GgmlType::F32, &[6, 6], "s6"); // axis 1
        let p = ctx.mul_mat(w, z).unwrap(); // [6, 6] partial
        let outs = [
            ctx.add(a, b).unwrap(),
            ctx.mul(b, a).unwrap(),
            ctx.sub(a, c).unwrap(),
            ctx.div(c, m).unwrap(),
            ctx.add(p, s6).unwrap(),
            ctx.mul(s6, p).unwrap(),
            ctx.mul_mat(a, b).unwrap(),
            ctx.mul_mat(b, c).unwrap(),
            ctx.concat(a, b, 1).unwrap(),
            ctx.swiglu_split(a, b).unwrap(),
        ];
        let rev: Vec<f32> = ratios.iter().rev().cloned().collect();
        let c_state = SplitState::split(0, split_extents(8, &rev, 1).unwrap());
        let ax = |axis| SplitSpec::Axis { axis, granule: 1, segments: vec![] };
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("a", ax(0))
            .rule("b", ax(1))
            .rule("w", ax(0))
            .rule("z", ax(0))
            .rule("s6", ax(1))
            .rule("m", SplitSpec::Mirrored);
        check(&ctx, &outs, &policy, &[(c, c_state)], &no_ints);
    }
}

#[test]
fn sec5_mul_mat_with_both_operands_split_on_axis_1() {
    // docs/split-design.md, section 5:
    // "matmul with both operands split on axis 1" — the output can keep one
    // operand's split; the other must be gathered (one all-gather per product
    // at most).
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let a = named(&mut ctx, GgmlType::F32, &[16, 6], "a");
        let b = named(&mut ctx, GgmlType::F32, &[16, 5], "b");
        let aq = named(&mut ctx, GgmlType::Q8_0, &[32, 6], "aq");
        let bq = named(&mut ctx, GgmlType::F32, &[32, 7], "bq");
        let a3 = named(&mut ctx, GgmlType::F32, &[16, 6, 2], "a3");
        let b3 = named(&mut ctx, GgmlType::F32, &[16, 5, 2], "b3");
        let y = ctx.mul_mat(a, b).unwrap();
        let yq = ctx.mul_mat(aq, bq).unwrap();
        let y3 = ctx.mul_mat(a3, b3).unwrap();
        let outs = [y, yq, y3, ctx.rms_norm(y, 1e-6).unwrap(), ctx.argmax(yq).unwrap()];
        let policy =
            SplitPolicy::new(ratios).unwrap().rule("*", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
        let plan = check(&ctx, &outs, &policy, &[], &no_ints);
        assert!(plan.count(Collective::AllGather) <= 3, "{}", plan.report(&ctx));
    }
}

#[test]
fn sec5_views_of_a_permuted_split_tensor() {
    // docs/split-design.md, section 5: "views of permuted split tensors".
    // x = [D, H, T] split on heads; p = permute → [D, T, H] split on axis 2;
    // views select along a non-split axis (tokens), across the split axis
    // (heads, one head as a 2-D slab) and within rows. Views along axes that
    // are not split (tokens, part of each row) keep p's split.
    let mut gaps = Gaps::default();
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let x = named(&mut ctx, GgmlType::F32, &[8, 6, 5], "x");
        let p = ctx.permute(x, [0, 2, 1, 3]).unwrap(); // [8, 5, 6]
        let nb = ctx.tensor(p).unwrap().nb;
        let tok = ctx.view_3d(p, 8, 3, 6, nb[1], nb[2], nb[1]).unwrap();
        let heads = ctx.view_3d(p, 8, 5, 3, nb[1], nb[2], 2 * nb[2]).unwrap();
        let half = ctx.view_3d(p, 4, 5, 6, nb[1], nb[2], 4 * 4).unwrap();
        let one = ctx.view_2d(p, 8, 5, nb[1], 3 * nb[2]).unwrap(); // head 3: [8, 5]
        let outs = [ctx.cont(tok).unwrap(), ctx.cont(heads).unwrap(), ctx.cont(half).unwrap(), ctx.cont(one).unwrap()];
        let more = [ctx.rms_norm(outs[0], 1e-6).unwrap(), ctx.sum_rows(outs[2]).unwrap()];
        let policy =
            SplitPolicy::new(ratios).unwrap().rule("x", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
        let all: Vec<TensorId> = outs.iter().chain(&more).copied().collect();
        let plan = check(&ctx, &all, &policy, &[], &no_ints);
        if ratios.len() > 1 {
            let cfg = format!("{ratios:?}");
            let heads = SplitState::split(2, split_extents(6, ratios, 1).unwrap());
            gaps.state(&cfg, "permute", p, &heads, &plan, &ctx);
            gaps.state(&cfg, "view of tokens 1..4", tok, &heads, &plan, &ctx);
            gaps.state(&cfg, "view of half of each row", half, &heads, &plan, &ctx);
        }
    }
    gaps.assert_none();
}

#[test]
fn sec5_concat_along_the_split_axis() {
    // docs/split-design.md, section 5: "concat along the split axis" (and, for
    // contrast, along another axis with matching boundaries), F32 and Q8_0.
    // Along the split axis the result is a split with one segment per operand;
    // along another axis the operands' slices line up: no gathers.
    let mut gaps = Gaps::default();
    for ratios in RATIOS {
        let mut ctx = Context::new();
        let a = named(&mut ctx, GgmlType::F32, &[6, 4], "a"); // axis 0
        let b = named(&mut ctx, GgmlType::F32, &[10, 4], "b"); // axis 0
        let c = named(&mut ctx, GgmlType::F32, &[6, 3], "c"); // axis 1
        let d = named(&mut ctx, GgmlType::F32, &[6, 5], "d"); // axis 1
        let e = named(&mut ctx, GgmlType::F32, &[6, 2], "e"); // axis 0
        let q = named(&mut ctx, GgmlType::Q8_0, &[64, 3], "q"); // axis 1
        let q2 = named(&mut ctx, GgmlType::Q8_0, &[64, 2], "q2"); // axis 1
        let c1 = ctx.concat(a, b, 0).unwrap();
        let c2 = ctx.concat(c, d, 1).unwrap();
        let c3 = ctx.concat(a, e, 1).unwrap();
        let cq = ctx.concat(q, q2, 1).unwrap();
        let outs = [c1, c2, c3, cq, ctx.rms_norm(c1, 1e-6).unwrap(), ctx.sum_rows(c2).unwrap()];
        let ax = |axis| SplitSpec::Axis { axis, granule: 1, segments: vec![] };
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("a", ax(0))
            .rule("b", ax(0))
            .rule("e", ax(0))
            .rule("c", ax(1))
            .rule("d", ax(1))
            .rule("q*", ax(1));
        let plan = check(&ctx, &outs, &policy, &[], &no_ints);
        if ratios.len() > 1 {
            let cfg = format!("{ratios:?}");
            let rows = SplitState::split(0, split_extents(6, ratios, 1).unwrap());
            gaps.state(&cfg, "concat along axis 1 of two row-split tensors", c3, &rows, &plan, &ctx);
            gaps.count(&cfg, Collective::AllGather, 0, &plan, &ctx);
        }
    }
    gaps.assert_none();
}

/// A communicator set on the executor serves every run; a run that fails
/// (a token id out of range) aborts it, so it is dropped and the next runs
/// use fresh ones and give the first run's result; a communicator with
/// another number of ranks is refused.
#[test]
fn a_failed_run_drops_its_communicator_and_later_runs_work() {
    use shardgraph::split::{Devices, HostComm, MetaExecutor};
    use std::sync::Arc;
    let mut ctx = Context::new();
    let emb = named(&mut ctx, GgmlType::F32, &[16, 10], "token_embd.weight");
    let ids = input(&mut ctx, GgmlType::I32, &[3], "tokens");
    let e = ctx.get_rows(emb, ids).unwrap();
    let w = named(&mut ctx, GgmlType::F32, &[16, 8], "w");
    let y = ctx.mul_mat(w, e).unwrap();
    let z = ctx.soft_max(y).unwrap();
    let g = ctx.build_forward(&[z]).unwrap();
    let policy = SplitPolicy::new(&[1.0, 1.0])
        .unwrap()
        .rule("w", SplitSpec::Axis { axis: 0, granule: 1, segments: vec![] })
        .rule("token_embd.weight", SplitSpec::Mirrored);
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    let mut exec = Devices::cpu(2, 1).and_then(|d| d.executor()).unwrap();
    assert!(!exec.has_comm());
    assert!(exec.set_comm(Some(Arc::new(HostComm::new(3)))).is_err());
    exec.set_comm(Some(Arc::new(HostComm::new(2)))).unwrap();
    let run = |exec: &MetaExecutor, tokens: [i32; 3]| {
        let mut store = SplitStore::new(2);
        store.place_leafs(&ctx, &g, &plan).unwrap();
        let f: Vec<u8> = (0..160).flat_map(|i| ((i as f32 * 0.1).sin()).to_le_bytes()).collect();
        store.set_tensor(&ctx, emb, 0, &f).unwrap();
        store.set_tensor(&ctx, w, 0, &f[..16 * 8 * 4]).unwrap();
        store.set_tensor(&ctx, ids, 0, &tokens.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        exec.execute(&ctx, &g, &plan, &mut store, &[z])
    };
    let first = run(&exec, [1, 2, 3]).unwrap();
    assert!(first.bytes_moved > 0, "the partial product is all-reduced");
    assert!(exec.has_comm(), "a good run keeps the communicator");
    let e = run(&exec, [1, 99, 2]).unwrap_err().to_string();
    assert!(e.contains("99") || e.contains("range"), "{e}");
    assert!(!exec.has_comm(), "the aborted communicator is dropped");
    let again = run(&exec, [1, 2, 3]).unwrap();
    assert_eq!(again.outputs, first.outputs);
}

/// llama.cpp's Gated-DeltaNet layer as its graph builds it
/// (`src/models/qwen35.cpp`, `delta-net-base.cpp`), split by key heads:
/// the conv state read from the cache and concatenated with the
/// projection, its last `d_conv − 1` columns copied back as a flat cache
/// row (`[d_conv−1, channels, 1]` into `[(d_conv−1)·channels, 1]`), the
/// recurrent state looked up with `get_rows` and reshaped, and the new
/// state written back from the op's result through a view `[S, S, H_v, 1]`
/// (a plain step) or `[S·S·H_v, 1, slots]` (a step keeping a snapshot per
/// token). Every state copy is per device: no all-gather, each device
/// writes its heads' part of both caches, the caches and the output equal
/// one device's. (Before, the reshaping copies and the `[S, S, H_v, 1]`
/// view gathered both states to every device each step: 13 MB per step on
/// the qwen35 example through SG.)
#[test]
fn llama_cpp_delta_net_layer_writes_its_states_per_device() {
    let (e, s, hk, hv, dc) = (64, 16, 4, 8, 4);
    let (key_dim, r) = (hk * s, (hv / hk) as usize);
    let ch = 2 * key_dim + hv * s;
    let mut gaps = Gaps::default();
    for (t, slots) in [(1, 1), (3, 1), (3, 3)] {
        for ratios in [&[1.0f32, 1.0][..], &[3.0, 1.0], &[1.0, 1.0, 2.0]] {
            let mut ctx = Context::new();
            let f = 4usize;
            let x = input(&mut ctx, GgmlType::F32, &[e, t], "inp");
            let ids = input(&mut ctx, GgmlType::I32, &[1], "s_copy");
            let wqkv = named(&mut ctx, GgmlType::F32, &[e, ch], "blk.0.attn_qkv.weight");
            let conv_w = named(&mut ctx, GgmlType::F32, &[dc, ch], "blk.0.ssm_conv1d.weight");
            let wa = named(&mut ctx, GgmlType::F32, &[e, hv], "blk.0.ssm_alpha.weight");
            let wb = named(&mut ctx, GgmlType::F32, &[e, hv], "blk.0.ssm_beta.weight");
            let wo = named(&mut ctx, GgmlType::F32, &[hv * s, e], "blk.0.ssm_out.weight");
            let cache_r = named(&mut ctx, GgmlType::F32, &[(dc - 1) * ch, slots], "cache_r_l0");
            let cache_s = named(&mut ctx, GgmlType::F32, &[s * s * hv, slots], "cache_s_l0");
            // The conv state, concatenated with the projection.
            let qkv = ctx.mul_mat(wqkv, x).unwrap();
            let qkv = ctx.reshape_3d(qkv, ch, t, 1).unwrap();
            let conv_states = ctx.get_rows(cache_r, ids).unwrap();
            let conv_states = ctx.reshape_3d(conv_states, dc - 1, ch, 1).unwrap();
            let qkv_t = ctx.transpose(qkv).unwrap();
            let conv_in = ctx.concat(conv_states, qkv_t, 0).unwrap();
            let cin = ctx.tensor(conv_in).unwrap().clone();
            // The last d_conv − 1 columns, or with a slot per token the
            // columns after each token, slot K − j ← the window ending at
            // token j (llama.cpp's rollback slots).
            let row_r = ctx.tensor(cache_r).unwrap().nb[1];
            let mut w_conv = Vec::new();
            for j in 1..=slots {
                let at = (t - slots + j).max(0) as usize;
                let last = ctx.view_3d(conv_in, dc - 1, ch, 1, cin.nb[1], cin.nb[2], at * f).unwrap();
                let dst_r = ctx.view_2d(cache_r, (dc - 1) * ch, 1, row_r, (slots - j) as usize * row_r).unwrap();
                w_conv.push(ctx.cpy(last, dst_r).unwrap());
            }
            let conv = ctx.ssm_conv(conv_in, conv_w).unwrap();
            let conv = ctx.silu(conv).unwrap();
            let nb1 = ch as usize * f;
            let q = ctx.view_4d(conv, s, hk, t, 1, s as usize * f, nb1, nb1 * t as usize, 0).unwrap();
            let k =
                ctx.view_4d(conv, s, hk, t, 1, s as usize * f, nb1, nb1 * t as usize, key_dim as usize * f).unwrap();
            let v = ctx
                .view_4d(conv, s, hv, t, 1, s as usize * f, nb1, nb1 * t as usize, 2 * key_dim as usize * f)
                .unwrap();
            let q = ctx.l2_norm(q, 1e-6).unwrap();
            let k = ctx.l2_norm(k, 1e-6).unwrap();
            let g = ctx.mul_mat(wa, x).unwrap();
            let g = ctx.softplus(g).unwrap();
            let g = ctx.scale(g, -1.0).unwrap();
            let g = ctx.reshape_4d(g, 1, hv, t, 1).unwrap();
            let b = ctx.mul_mat(wb, x).unwrap();
            let b = ctx.sigmoid(b).unwrap();
            let b = ctx.reshape_4d(b, 1, hv, t, 1).unwrap();
            // The state: one cache row by get_rows (llama.cpp's build_rs).
            let state = ctx.get_rows(cache_s, ids).unwrap();
            let state = ctx.reshape_4d(state, s, s, hv, 1).unwrap();
            let res = ctx.gated_delta_net(q, k, v, g, b, state, slots).unwrap();
            let out_bytes = (s * hv * t) as usize * f;
            let o = ctx.view_4d(res, s, hv, t, 1, s as usize * f, (s * hv) as usize * f, out_bytes, 0).unwrap();
            let d = s * s * hv;
            let w_state = if slots == 1 {
                let ss = (s * s) as usize * f;
                let new_state = ctx.view_4d(res, s, s, hv, 1, s as usize * f, ss, ss * hv as usize, out_bytes).unwrap();
                let dst = ctx.view_2d(cache_s, d, 1, d as usize * f, 0).unwrap();
                ctx.cpy(new_state, dst).unwrap()
            } else {
                // The snapshots of every token, slot by slot.
                let row = d as usize * f;
                let src = ctx.view_3d(res, d, 1, slots, row, row, out_bytes).unwrap();
                let dst = ctx.view_3d(cache_s, d, 1, slots, row, row, 0).unwrap();
                ctx.cpy(src, dst).unwrap()
            };
            let o = ctx.reshape_2d(o, s * hv, t).unwrap();
            let out = ctx.mul_mat(wo, o).unwrap();
            let heads = DeltaNetHeads { n_k_heads: hk, n_v_heads: hv, d_state: s, d_conv: dc };
            let policy = delta_net_rules("", Some(0), &heads, Some(s))
                .into_iter()
                .fold(SplitPolicy::new(ratios).unwrap(), |p, (pattern, spec)| p.rule(&pattern, spec))
                .rule("*", SplitSpec::Mirrored);
            let mut outputs = w_conv.clone();
            outputs.extend([w_state, out, cache_r, cache_s]);
            let plan = check(&ctx, &outputs, &policy, &[], &|_, n| vec![0; n]);
            let cfg = format!("T={t} slots={slots} {ratios:?}");
            gaps.count(&cfg, Collective::AllGather, 0, &plan, &ctx);
            // Each device writes its key heads' part of both caches.
            let ext = split_extents(hk, ratios, 1).unwrap();
            let by = |x: i64, n: usize| {
                SplitState::Split(AxisSplit {
                    axis: 0,
                    segments: vec![ext.iter().map(|e| e * x).collect(); n],
                    repeat: 1,
                })
            };
            for &w in &w_conv {
                gaps.state(&cfg, "conv state written", w, &by(s * (dc - 1), 2 + r), &plan, &ctx);
            }
            gaps.state(&cfg, "recurrent state written", w_state, &by(s * s, r), &plan, &ctx);
        }
    }
    gaps.assert_none();
}

/// llama.cpp's `build_rs` zeroes the recurrent state of a sequence that
/// starts in a cell (`ggml_scale_inplace(view_1d(states, d, rs_zero·nb1),
/// 0)`, which SG translates as the scale and a copy into that row), then
/// reads the cache through the same reshape (`get_rows(states, s_copy)`).
/// Over devices split by key heads the zeroed row is written in place on
/// each device, and the reshape read after it is that part's memory: the
/// cache and the read equal one device's, and no byte moves that the plan
/// did not price. (Before, the reshape read after the write gathered the
/// whole cache to every device, outside the plan: 6 586 368 B on the first
/// step of the qwen35 example through SG; with one slot the row covers the
/// whole cache, with three it is a box of it.)
#[test]
fn a_zeroed_recurrent_row_is_written_per_device_and_read_in_place() {
    let (s, hk, hv, dc) = (16, 4, 8, 4);
    let d = s * s * hv;
    for slots in [1i64, 3] {
        for ratios in [&[1.0f32, 1.0][..], &[3.0, 1.0], &[1.0, 1.0, 2.0]] {
            let mut ctx = Context::new();
            let ids = input(&mut ctx, GgmlType::I32, &[1], "s_copy");
            // llama.cpp's cache: one row of d values per slot.
            let cache_s = named(&mut ctx, GgmlType::F32, &[d, slots], "cache_s_l0");
            let states = ctx.reshape_2d(cache_s, d, slots).unwrap();
            let rs_zero = (slots - 1) as usize;
            let row = ctx.tensor(states).unwrap().nb[1];
            let zero_view = ctx.view_1d(states, d, rs_zero * row).unwrap();
            let zeroed = ctx.scale(zero_view, 0.0).unwrap();
            let w_zero = ctx.cpy(zeroed, zero_view).unwrap();
            let state = ctx.get_rows(states, ids).unwrap();
            let out = ctx.scale(state, 2.0).unwrap();
            let heads = DeltaNetHeads { n_k_heads: hk, n_v_heads: hv, d_state: s, d_conv: dc };
            let policy = delta_net_rules("", Some(0), &heads, Some(s))
                .into_iter()
                .fold(SplitPolicy::new(ratios).unwrap(), |p, (pattern, spec)| p.rule(&pattern, spec))
                .rule("*", SplitSpec::Mirrored);
            // The zeroed row is the one read back: its values are zeros.
            let outputs = [w_zero, out, cache_s];
            let plan = check(&ctx, &outputs, &policy, &[], &|_, n| vec![rs_zero as i64; n]);
            let cfg = format!("slots={slots} {ratios:?}\n{}", plan.report(&ctx));
            assert_eq!(plan.total_bytes(), 0, "{cfg}");
            let g = ctx.build_forward(&outputs).unwrap();
            let exec = devices::executor(ratios.len());
            let mut store = SplitStore::new(ratios.len());
            let rep = exec.execute(&ctx, &g, &plan, &mut store, &[out]).unwrap();
            assert_eq!((rep.bytes_moved, rep.unplanned_bytes), (0, 0), "{cfg}");
        }
    }
}
