//! Typed host I/O on split tensors (`SplitStore::set_f32`/`get_f32`,
//! `set_i32`/`get_i32`), typed run outputs (`RunReport::f32`/`i32`), and
//! readable report labels (`Context::display_name`).
//!
//! The reference is one CPU device: `TensorStorage::set_f32` of the same
//! values, whose bytes (`get_bytes`) are what the store must hold, byte for
//! byte, for every float and quantized type, on 3 devices with ratios
//! 2:1:1, split on axis 1, on axis 0 with granule = the block size, in
//! segments and repeats, mirrored and partial; with the parts in host
//! memory and after they moved onto the devices.

#[path = "common/rng.rs"]
mod rng;

use shardgraph::graph::GraphAllocator;
use shardgraph::split::{
    local_ne, slice_local, AxisSplit, Devices, LeafInfo, Planner, SplitSpec, SplitState, SplitStore,
};
use shardgraph::{Backend, Context, CpuBackend, Error, GgmlType, TensorId, TensorStorage};

use GgmlType::*;

/// Every type `set_f32` converts to: the floats and every block type.
const TYPES: [GgmlType; 16] =
    [F32, F16, BF16, F64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K];

const RATIOS: [f32; 3] = [2.0, 1.0, 1.0];

/// Values for a tensor of `ty`: random in [-1, 1), and for float types a
/// few specials (±inf, -0.0, the canonical NaN, a value that rounds in f16).
fn values_for(ty: GgmlType, n: usize, seed: u64) -> Vec<f32> {
    let mut r = rng::Rng::new(seed);
    let mut v: Vec<f32> = (0..n).map(|_| r.unit() * 3.0).collect();
    if ty.is_float() && n >= 6 {
        v[1] = f32::INFINITY;
        v[2] = -0.0;
        v[3] = f32::NAN;
        v[4] = f32::NEG_INFINITY;
        v[5] = 1.0 + 3.0 * 2f32.powi(-11);
    }
    v
}

/// One CPU device's bytes and f32 read-back of `values` in tensor `id`.
fn reference(ctx: &Context, id: TensorId, values: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let cpu = CpuBackend::with_threads(1).unwrap();
    let mut one = TensorStorage::new();
    one.alloc_tensors(&cpu, ctx, &[id]).unwrap();
    one.set_f32(ctx, id, values).unwrap();
    let mut b = vec![0u8; ctx.tensor(id).unwrap().nbytes()];
    one.get_bytes(ctx, id, 0, &mut b).unwrap();
    (b, one.get_f32(ctx, id).unwrap())
}

fn whole(store: &SplitStore, ctx: &Context, id: TensorId) -> Vec<u8> {
    let mut out = vec![0u8; ctx.tensor(id).unwrap().nbytes()];
    store.get_tensor(ctx, id, 0, &mut out).unwrap();
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The states a tensor of `ty`, shape `ne` is tested in on 3 devices, labelled.
fn states(devices: &Devices, ty: GgmlType, ne: [i64; 4]) -> Vec<(String, SplitState)> {
    let bs = ty.block_size() as i64;
    let via_policy = |axis: usize, granule: i64| {
        let p = devices.policy().unwrap().rule("w", SplitSpec::Axis { axis, granule, segments: vec![] });
        p.state_for(&LeafInfo { name: "w", ne, ty }).unwrap().unwrap()
    };
    let mut v = vec![
        ("mirrored".to_string(), SplitState::Mirrored),
        ("axis 1 by 2:1:1".into(), via_policy(1, 1)),
        ("axis 0 by 2:1:1, granule = block".into(), via_policy(0, bs)),
        (
            "axis 1 two segments".into(),
            SplitState::Split(AxisSplit { axis: 1, segments: vec![vec![1, 0, 1], vec![0, 1, 1]], repeat: 1 }),
        ),
        (
            "axis 0 segment repeated twice".into(),
            SplitState::Split(AxisSplit { axis: 0, segments: vec![vec![bs, 0, bs]], repeat: 2 }),
        ),
        ("axis 2 by 2:1:1".into(), via_policy(2, 1)),
    ];
    if matches!(ty, F32 | F16 | BF16) {
        v.push(("partial".into(), SplitState::partial()));
    }
    v
}

/// The store holds exactly the single-device bytes `want`, split as
/// `slice_local` says, and reads back the single device's f32 values.
fn check(store: &SplitStore, ctx: &Context, id: TensorId, st: &SplitState, want: &[u8], want_f32: &[f32], what: &str) {
    let t = ctx.tensor(id).unwrap();
    assert_eq!(whole(store, ctx, id), want, "{what}: get_tensor");
    let (got_state, parts) = store.locals(id).unwrap();
    assert_eq!(got_state, st, "{what}");
    for (j, p) in parts.iter().enumerate() {
        let expect = slice_local(t.ty, t.ne, want, st, j).unwrap();
        assert!(*p == expect.as_slice(), "{what}: device {j}'s part");
    }
    assert_eq!(bits(&store.get_f32(ctx, id).unwrap()), bits(want_f32), "{what}: get_f32");
}

#[test]
fn set_f32_equals_one_device_for_every_type_and_state() {
    let devices = Devices::cpu(3, 1).unwrap().with_tensor_split(&RATIOS).unwrap();
    let exec = devices.executor().unwrap();
    let mut checked = 0;
    for (k, &ty) in TYPES.iter().enumerate() {
        let bs = ty.block_size() as i64;
        let ne = [4 * bs, 4, 4, 1];
        let mut ctx = Context::new();
        let w = ctx.new_tensor_named(ty, &ne, "w").unwrap();
        let n = (ne[0] * ne[1] * ne[2]) as usize;
        let first = values_for(ty, n, 1 + k as u64);
        let second = values_for(ty, n, 101 + k as u64);
        let (want1, want1_f) = reference(&ctx, w, &first);
        let (want2, want2_f) = reference(&ctx, w, &second);
        assert_ne!(want1, want2, "{ty}: the two value sets differ");
        for (label, st) in states(&devices, ty, ne) {
            let what = format!("{ty} {label}");
            let mut store = devices.store();
            store.place(&ctx, w, &st).unwrap();
            store.set_f32(&ctx, w, &first).unwrap();
            check(&store, &ctx, w, &st, &want1, &want1_f, &format!("{what}, host parts"));
            // The parts move onto the devices (as a run moves them); the
            // next write goes into the device buffers.
            exec.upload(&mut store).unwrap();
            let on_devices = store.device_bytes();
            assert_eq!(on_devices, store.bytes_per_device(), "{what}: every part on its device");
            store.set_f32(&ctx, w, &second).unwrap();
            assert_eq!(store.device_bytes(), on_devices, "{what}: the parts stay on the devices");
            check(&store, &ctx, w, &st, &want2, &want2_f, &format!("{what}, device parts"));
            // Per device, the bytes of the local shape.
            for j in 0..3 {
                let lne = local_ne(ne, &st, j);
                let rows = (lne[1] * lne[2] * lne[3]) as u64;
                let expect = ty.row_size(lne[0]).unwrap() as u64 * rows;
                assert_eq!(store.bytes_per_device()[j], expect, "{what}: device {j}");
            }
            checked += 1;
        }
    }
    println!("set_f32: {checked} (type, state) pairs byte-identical to one device, host and device parts");
    assert_eq!(checked, 16 * 6 + 3);
}

#[test]
fn set_f32_after_a_run_writes_where_the_parts_live() {
    // y = mul_mat(w, x) with w split on rows; a run moves w onto the
    // devices; a new set_f32 must reach the run after it.
    let devices = Devices::cpu(3, 1).unwrap().with_tensor_split(&RATIOS).unwrap();
    let exec = devices.executor().unwrap();
    let (k, m, t) = (256i64, 8i64, 3i64);
    for ty in [F32, F16, Q8_0, Q4_K] {
        let mut ctx = Context::new();
        let w = ctx.new_tensor_named(ty, &[k, m], "blk.0.ffn_up.weight").unwrap();
        let x = ctx.new_input(F32, &[k, t], "inp_embd").unwrap();
        let y = ctx.mul_mat(w, x).unwrap();
        let best = ctx.argmax(y).unwrap();
        let graph = ctx.build_forward(&[y, best]).unwrap();
        let policy = devices
            .policy()
            .unwrap()
            .rule("blk.*.ffn_up.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
        let plan = Planner::default().plan(&ctx, &graph, &policy, &[]).unwrap();
        let mut store = devices.store();
        store.place_leafs(&ctx, &graph, &plan).unwrap();
        let xs = values_for(F32, (k * t) as usize, 7);
        store.set_f32(&ctx, x, &xs).unwrap();
        let mut last = Vec::new();
        for round in 0..2u64 {
            let ws = values_for(ty, (k * m) as usize, 11 + round);
            store.set_f32(&ctx, w, &ws).unwrap();
            let rep = exec.execute(&ctx, &graph, &plan, &mut store, &[y, best]).unwrap();
            assert!(store.device_bytes().iter().all(|&b| b > 0), "{ty}: parts on the devices after a run");
            assert_eq!(rep.outputs.iter().map(|o| o.ty).collect::<Vec<_>>(), vec![F32, I32]);
            assert_eq!(rep.outputs.iter().map(|o| o.ne).collect::<Vec<_>>(), vec![[m, t, 1, 1], [t, 1, 1, 1]]);
            // One CPU device with the same values.
            let cpu = CpuBackend::with_threads(1).unwrap();
            let mut one = TensorStorage::new();
            one.alloc_tensors(&cpu, &ctx, graph.leafs()).unwrap();
            one.set_f32(&ctx, w, &ws).unwrap();
            one.set_f32(&ctx, x, &xs).unwrap();
            GraphAllocator::new(cpu.buffer_type()).alloc_graph(&cpu, &ctx, &graph, &mut one).unwrap();
            cpu.compute(&ctx, &graph, &one).unwrap();
            let want = one.get_f32(&ctx, y).unwrap();
            let got = rep.f32(0).unwrap();
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let scale = want.iter().map(|v| v.abs()).fold(0f32, f32::max);
            assert!(err <= 1e-4 * scale.max(1.0), "{ty} round {round}: max |diff| {err} (scale {scale})");
            assert_eq!(rep.i32(1).unwrap(), one.get_i32(&ctx, best).unwrap(), "{ty} round {round}: argmax");
            // The bytes in the store are the single device's.
            let mut wb = vec![0u8; ctx.tensor(w).unwrap().nbytes()];
            one.get_bytes(&ctx, w, 0, &mut wb).unwrap();
            assert_eq!(whole(&store, &ctx, w), wb, "{ty} round {round}: stored weight");
            assert_ne!(got, last, "{ty}: the second weights change the result");
            last = got;
        }
    }
}

#[test]
fn views_of_whole_rows_and_errors() {
    let devices = Devices::cpu(3, 1).unwrap().with_tensor_split(&RATIOS).unwrap();
    let mut ctx = Context::new();
    let w = ctx.new_tensor_named(Q8_0, &[64, 6, 2], "w").unwrap();
    let nb1 = ctx.tensor(w).unwrap().nb[1];
    // Rows 2..5 of the first matrix: a contiguous view of whole rows.
    let rows = ctx.view_2d(w, 64, 3, nb1, 2 * nb1).unwrap();
    // Half a row: not whole rows. A transposed F32 view: not contiguous.
    let half = ctx.view_1d(w, 32, 0).unwrap();
    let f = ctx.new_tensor_named(F32, &[4, 6], "f").unwrap();
    let ft = ctx.transpose(f).unwrap();
    let ids = ctx.new_tensor_named(I32, &[5, 4, 3], "ids").unwrap();
    let st = SplitState::split(1, vec![2, 2, 2]);
    let base = values_for(Q8_0, 64 * 12, 3);
    let part = values_for(Q8_0, 64 * 3, 4);
    // Reference: one device, the owner written, then the view.
    let cpu = CpuBackend::with_threads(1).unwrap();
    let mut one = TensorStorage::new();
    one.alloc_tensors(&cpu, &ctx, &[w]).unwrap();
    one.set_f32(&ctx, w, &base).unwrap();
    one.set_f32(&ctx, rows, &part).unwrap();
    let mut want = vec![0u8; ctx.tensor(w).unwrap().nbytes()];
    one.get_bytes(&ctx, w, 0, &mut want).unwrap();

    let mut store = devices.store();
    store.place(&ctx, w, &st).unwrap();
    store.place(&ctx, f, &SplitState::split(1, vec![3, 2, 1])).unwrap();
    store.place(&ctx, ids, &SplitState::split(1, vec![2, 1, 1])).unwrap();
    store.set_f32(&ctx, w, &base).unwrap();
    store.set_f32(&ctx, rows, &part).unwrap();
    assert_eq!(whole(&store, &ctx, w), want, "a view of whole rows, through set_tensor");
    assert_eq!(bits(&store.get_f32(&ctx, rows).unwrap()), bits(&one.get_f32(&ctx, rows).unwrap()));

    let e = store.set_f32(&ctx, half, &[0.0; 32]).unwrap_err().to_string();
    assert!(e.contains("whole rows"), "{e}");
    let e = store.set_f32(&ctx, ft, &[0.0; 24]).unwrap_err().to_string();
    assert!(e.contains("contiguous"), "{e}");
    // A transposed view reads its logical elements.
    let fv: Vec<f32> = (0..24).map(|i| i as f32).collect();
    store.set_f32(&ctx, f, &fv).unwrap();
    let tv = store.get_f32(&ctx, ft).unwrap();
    let want_t: Vec<f32> = (0..4).flat_map(|i0| (0..6).map(move |i1| (i1 * 4 + i0) as f32)).collect();
    assert_eq!(tv, want_t, "transposed read");

    // Wrong counts name the tensor and both counts.
    match store.set_f32(&ctx, w, &[1.0; 10]).unwrap_err() {
        Error::DataMismatch { name, detail } => {
            assert_eq!(name, "w");
            assert!(detail.contains("10") && detail.contains("768"), "{detail}");
        }
        e => panic!("{e}"),
    }
    // Integer tensors take set_i32; float tensors refuse it.
    let e = store.set_f32(&ctx, ids, &[0.0; 60]).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedType { ty, .. } if ty == "i32"), "{e}");
    let e = store.get_f32(&ctx, ids).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedType { ty, .. } if ty == "i32"), "{e}");
    let e = store.set_i32(&ctx, f, &[0; 24]).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedType { ty, .. } if ty == "f32"), "{e}");
    let e = store.get_i32(&ctx, w).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedType { ty, .. } if ty == "q8_0"), "{e}");
    assert!(store.set_i32(&ctx, ids, &[0; 59]).is_err());
    // Not placed.
    let other = ctx.new_tensor_named(F32, &[4], "unplaced").unwrap();
    let e = store.set_f32(&ctx, other, &[0.0; 4]).unwrap_err().to_string();
    assert!(e.contains("unplaced") && e.contains("not placed"), "{e}");
}

#[test]
fn set_i32_equals_one_device() {
    let devices = Devices::cpu(3, 1).unwrap().with_tensor_split(&RATIOS).unwrap();
    let exec = devices.executor().unwrap();
    let mut ctx = Context::new();
    let ids = ctx.new_tensor_named(I32, &[5, 4, 3], "ids").unwrap();
    let mut r = rng::Rng::new(9);
    let vals: Vec<i32> = (0..60).map(|_| r.next() as i32).collect();
    let cpu = CpuBackend::with_threads(1).unwrap();
    let mut one = TensorStorage::new();
    one.alloc_tensors(&cpu, &ctx, &[ids]).unwrap();
    one.set_i32(&ctx, ids, &vals).unwrap();
    let mut want = vec![0u8; 240];
    one.get_bytes(&ctx, ids, 0, &mut want).unwrap();
    for st in [
        SplitState::Mirrored,
        SplitState::partial(),
        SplitState::split(1, vec![2, 1, 1]),
        SplitState::split(0, vec![3, 0, 2]),
        SplitState::split(2, vec![1, 1, 1]),
    ] {
        let mut store = devices.store();
        store.place(&ctx, ids, &st).unwrap();
        store.set_i32(&ctx, ids, &vals).unwrap();
        assert_eq!(whole(&store, &ctx, ids), want, "{}", st.label());
        exec.upload(&mut store).unwrap();
        let rev: Vec<i32> = vals.iter().rev().copied().collect();
        store.set_i32(&ctx, ids, &rev).unwrap();
        assert_eq!(store.get_i32(&ctx, ids).unwrap(), rev, "{} on the devices", st.label());
        let (_, parts) = store.locals(ids).unwrap();
        let rev_bytes: Vec<u8> = rev.iter().flat_map(|v| v.to_le_bytes()).collect();
        for (j, p) in parts.iter().enumerate() {
            assert!(*p == slice_local(I32, [5, 4, 3, 1], &rev_bytes, &st, j).unwrap().as_slice(), "{} {j}", st.label());
        }
    }
}

#[test]
fn run_report_typed_outputs_and_errors() {
    let devices = Devices::cpu(2, 1).unwrap();
    let exec = devices.executor().unwrap();
    let mut ctx = Context::new();
    let a = ctx.new_input(F32, &[8, 2], "a").unwrap();
    let doubled = ctx.scale(a, 2.0).unwrap();
    let s = ctx.cast(doubled, F16).unwrap();
    let best = ctx.argmax(doubled).unwrap();
    let graph = ctx.build_forward(&[s, best]).unwrap();
    let plan = Planner::default().plan(&ctx, &graph, &devices.policy().unwrap(), &[]).unwrap();
    let mut store = devices.store();
    store.place_leafs(&ctx, &graph, &plan).unwrap();
    let av: Vec<f32> = vec![0.5, 1.0, -3.0, 2.0, 0.25, 0.0, 7.0, 1.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -7.0, -8.0];
    store.set_f32(&ctx, a, &av).unwrap();
    let rep = exec.execute(&ctx, &graph, &plan, &mut store, &[s, best]).unwrap();
    assert_eq!(rep.outputs.iter().map(|o| o.ty).collect::<Vec<_>>(), vec![F16, I32]);
    // Exact in f16: doubling.
    assert_eq!(rep.f32(0).unwrap(), av.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    assert_eq!(rep.i32(1).unwrap(), vec![6, 5]);
    assert!(matches!(rep.f32(2), Err(Error::OutOfBounds { .. })));
    assert!(matches!(rep.i32(0), Err(Error::UnsupportedType { ref ty, .. }) if ty == "f16"));
    assert!(matches!(rep.f32(1), Err(Error::UnsupportedType { ref ty, .. }) if ty == "i32"));
    let mut cut = rep.clone();
    cut.outputs[0].bytes.truncate(3);
    assert!(matches!(cut.f32(0), Err(Error::DataMismatch { .. })));
    assert!(shardgraph::split::RunReport::default().f32(0).is_err());
}

#[test]
fn reports_name_unnamed_nodes_by_op_and_nearest_named_source() {
    let devices = Devices::cpu(3, 1).unwrap();
    let mut ctx = Context::new();
    let w = ctx.new_tensor_named(F32, &[16, 12], "blk.0.ffn_up.weight").unwrap();
    let x = ctx.new_input(F32, &[16, 2], "inp_embd").unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let p = ctx.soft_max(y).unwrap();
    let q = ctx.scale(p, 0.5).unwrap();
    let graph = ctx.build_forward(&[q]).unwrap();
    let policy = devices
        .policy()
        .unwrap()
        .rule("blk.*.ffn_up.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
    let plan = Planner::default().plan(&ctx, &graph, &policy, &[]).unwrap();
    assert_eq!(ctx.display_name(y), format!("mul_mat(blk.0.ffn_up.weight)#{}", y.index()));
    assert_eq!(ctx.display_name(p), format!("soft_max(blk.0.ffn_up.weight)#{}", p.index()));
    assert_eq!(ctx.display_name(w), "blk.0.ffn_up.weight");
    let lowered = shardgraph::split::lower(&ctx, &graph, &plan).unwrap();
    let texts = [
        ("lowered", lowered.describe(&ctx)),
        ("report", plan.report(&ctx)),
        ("dot", plan.to_dot(&ctx, &graph).unwrap()),
    ];
    for (what, text) in &texts {
        println!("{what}:\n{text}");
        for bare in [" #", "(#", "\"#", "\n#"] {
            assert!(!text.contains(bare), "{what} prints a bare #id:\n{text}");
        }
    }
    let all: String = texts.iter().map(|(_, t)| t.as_str()).collect();
    assert!(all.contains("mul_mat(blk.0.ffn_up.weight)#"), "{all}");
    assert!(texts[0].1.contains("(blk.0.ffn_up.weight)#"), "{}", texts[0].1);
}

#[test]
fn runner_with_devices_keeps_typed_outputs_aligned() {
    use shardgraph_models::runner::Runner;
    let devices = Devices::cpu(3, 1).unwrap().with_tensor_split(&RATIOS).unwrap();
    let wrong = Devices::cpu(2, 1).unwrap().policy().unwrap();
    let e = Runner::new(wrong, &devices).unwrap_err().to_string();
    assert!(e.contains("2 devices") && e.contains("3 devices"), "{e}");

    let policy = devices.policy().unwrap().rule("cache", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
    let mut runner = Runner::new(policy, &devices).unwrap();
    assert_eq!(runner.n_devices(), 3);
    let mut ctx = Context::new();
    let cache = ctx.new_tensor_named(F16, &[8, 4], "cache").unwrap();
    runner.place(&ctx, cache).unwrap();
    let x = ctx.new_input(F32, &[8, 1], "x").unwrap();
    let at = ctx.new_input(I32, &[1], "at").unwrap();
    let write = ctx.set_rows(cache, x, at).unwrap();
    let y = ctx.scale(x, 2.0).unwrap();
    let best = ctx.argmax(y).unwrap();
    let graph = ctx.build_forward(&[write, y, best]).unwrap();
    let xs: Vec<f32> = vec![0.5, -1.0, 2.0, 0.25, 3.0, -4.0, 1.5, 0.0];
    let xb: Vec<u8> = xs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let rep = runner.run(&ctx, &graph, &[(x, xb), (at, 2i32.to_le_bytes().to_vec())], &[write, y, best]).unwrap();
    assert_eq!(rep.outputs.len(), 3);
    assert!(rep.outputs[0].bytes.is_empty(), "a write into a cache is not read back");
    assert_eq!(rep.outputs.iter().map(|o| o.id).collect::<Vec<_>>(), vec![write, y, best]);
    assert_eq!(rep.get(y).map(|o| o.f32().unwrap()), Some(xs.iter().map(|v| v * 2.0).collect::<Vec<_>>()));
    assert_eq!(rep.outputs.iter().map(|o| o.ty).collect::<Vec<_>>(), vec![F16, F32, I32]);
    assert_eq!(rep.outputs.iter().map(|o| o.ne).collect::<Vec<_>>(), vec![[8, 4, 1, 1], [8, 1, 1, 1], [1, 1, 1, 1]]);
    assert!(matches!(rep.f32(0), Err(Error::DataMismatch { .. })));
    assert_eq!(rep.f32(1).unwrap(), xs.iter().map(|v| v * 2.0).collect::<Vec<_>>());
    assert_eq!(rep.i32(2).unwrap(), vec![4]);
    // The cache row written on the devices, read back typed (exact in f16).
    let c = runner.store().get_f32(&ctx, cache).unwrap();
    let mut want = vec![0f32; 32];
    want[16..24].copy_from_slice(&xs);
    assert_eq!(c, want);
}
