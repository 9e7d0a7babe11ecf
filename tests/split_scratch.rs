//! Scratch copies are the ones `cast` makes, and only those: a `cpy` into a
//! stored leaf that nothing else in the graph reads is a write into the
//! store like any other (a cache written for a later step), on any number
//! of devices; a `cast` still computes its values without storing its
//! destination.

#[path = "common/fixtures.rs"]
mod fixtures;
use fixtures::{f32_bytes, input, named};
use shardgraph::split::{Devices, Planner, SplitPolicy, SplitSpec, SplitStore};
use shardgraph::{Context, GgmlType, TensorId};

/// `y = x + x`, `cpy(y, buf)` into a stored leaf nothing else reads, and
/// `cast(y, F16)` read as an output. Returns the context, graph, x, buf,
/// the copy, the cast.
fn graph() -> (Context, shardgraph::Graph, TensorId, TensorId, TensorId, TensorId) {
    let mut ctx = Context::new();
    let x = input(&mut ctx, GgmlType::F32, &[8, 6], "x");
    let buf = named(&mut ctx, GgmlType::F32, &[8, 6], "buf");
    let y = ctx.add(x, x).unwrap();
    let w = ctx.cpy(y, buf).unwrap();
    let c = ctx.cast(y, GgmlType::F16).unwrap();
    let g = ctx.build_forward(&[w, c]).unwrap();
    (ctx, g, x, buf, w, c)
}

/// Runs the graph on `n` devices with `buf` in the state `spec` gives it;
/// returns buf's stored bytes afterwards, the cast's output, and whether
/// the cast's destination was left alone (still zeros in the store, on no
/// device).
fn run(n: usize, spec: SplitSpec) -> (Vec<u8>, Vec<u8>, bool) {
    let (ctx, g, x, buf, _, c) = graph();
    let policy = SplitPolicy::new(&vec![1.0; n]).unwrap().rule("buf", spec);
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    let exec = Devices::cpu(n, 1).and_then(|d| d.executor()).unwrap();
    let mut store = SplitStore::new(n);
    store.place_leafs(&ctx, &g, &plan).unwrap();
    let xs: Vec<f32> = (0..48).map(|i| i as f32 * 0.25 - 3.0).collect();
    store.set_tensor(&ctx, x, 0, &f32_bytes(&xs)).unwrap();
    let rep = exec.execute(&ctx, &g, &plan, &mut store, &[c]).unwrap();
    let mut stored = vec![0u8; 48 * 4];
    store.get_tensor(&ctx, buf, 0, &mut stored).unwrap();
    let dst = ctx.tensor(c).unwrap().view_src.unwrap();
    let mut probe = vec![0xffu8; 48 * 2];
    store.get_tensor(&ctx, dst, 0, &mut probe).unwrap();
    let stored_parts: u64 = store.bytes_per_device().iter().sum();
    let on_devices: u64 = store.device_bytes().iter().sum();
    // Only the cast's destination (48 F16 values per device) stays off the devices.
    let untouched = probe.iter().all(|&b| b == 0) && stored_parts - on_devices == 48 * 2 * n as u64;
    (stored, rep.outputs[0].bytes.clone(), untouched)
}

#[test]
fn a_copy_into_a_stored_leaf_nothing_else_reads_is_written_back() {
    let (ctx, _, _, buf, w, c) = graph();
    // Only the cast's destination is scratch.
    assert!(!ctx.tensor(buf).unwrap().flags.scratch);
    let dst = ctx.tensor(c).unwrap().view_src.unwrap();
    assert!(ctx.tensor(dst).unwrap().flags.scratch);
    assert_eq!(ctx.tensor(w).unwrap().view_src, Some(buf));

    let want: Vec<u8> = f32_bytes(&(0..48).map(|i| 2.0 * (i as f32 * 0.25 - 3.0)).collect::<Vec<_>>());
    let (one, cast_one, untouched) = run(1, SplitSpec::Mirrored);
    assert_eq!(one, want, "one device: buf holds x + x");
    assert!(untouched, "one device: the cast's destination is not written back");
    assert!(cast_one.iter().any(|&b| b != 0));
    let rows = SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] };
    let cols = SplitSpec::Axis { axis: 0, granule: 1, segments: vec![] };
    for n in [2, 3] {
        for spec in [SplitSpec::Mirrored, rows.clone(), cols.clone()] {
            let what = format!("{n} devices, buf {spec:?}");
            let (stored, cast, untouched) = run(n, spec);
            assert_eq!(stored, one, "{what}: get_tensor(buf) after the copy");
            assert_eq!(cast, cast_one, "{what}: the cast's values");
            assert!(untouched, "{what}: the cast's destination is not written back");
        }
    }
}
