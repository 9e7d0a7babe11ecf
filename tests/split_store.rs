//! Host access to split tensors (`SplitStore::set_tensor`/`get_tensor`):
//! on a split, mirrored or partial tensor, whole or by byte range, through
//! views and across segments, the store reads and writes exactly the bytes
//! one device would hold (ggml's `ggml_backend_tensor_set`/`get`: a byte
//! range of the tensor's memory, for a view a range of its owner's memory).
//! Embedders save and restore KV/recurrent state this way.
//!
//! The reference for what device `j` holds is `slice_local` (which the store
//! itself uses), and, independent of it, parts written out by hand for
//! small tensors in every kind of state (`hand_computed_parts_in_every_state`);
//! the reference for single-device bytes is a plain `Vec<u8>` edited the
//! same way, or one CPU device's `TensorStorage`.

#[path = "common/devices.rs"]
mod devices;
#[path = "common/fixtures.rs"]
mod fixtures;
#[path = "common/rng.rs"]
mod rng;
use fixtures::{f32_bytes, input, named, OneCpu};
use rng::Rng;

use shardgraph::split::{
    assemble, local_ne, slice_local, split_extents, AxisSplit, Planner, SplitPolicy, SplitSpec, SplitState, SplitStore,
};
use shardgraph::{Backend, Context, CpuBackend, GgmlType, TensorId, TensorStorage};

use GgmlType::{F16, F32, Q4_0, Q4_K, Q8_0};

/// Values that sum exactly in any order and are never -0.0 or NaN: k/8.
fn exact_values(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let vals: Vec<f32> = (0..n).map(|_| (rng.below(129) as i32 - 64) as f32 / 8.0).collect();
    encode(ty, &vals)
}

/// Finite values without -0.0 (so a partial sum with zeros keeps their bits).
fn finite_values(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let vals: Vec<f32> = (0..n).map(|_| rng.unit() + 0.0).collect();
    encode(ty, &vals)
}

fn encode(ty: GgmlType, vals: &[f32]) -> Vec<u8> {
    match ty {
        F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        F16 => vals.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
        t => panic!("no float encoding for {t}"),
    }
}

/// Bytes of one tensor: random for copies, element values for partial sums.
fn data_for(ty: GgmlType, state: &SplitState, nbytes: usize, rng: &mut Rng) -> Vec<u8> {
    if matches!(state, SplitState::Partial(_)) {
        finite_values(ty, nbytes / ty.type_size(), rng)
    } else {
        rng.bytes(nbytes)
    }
}

fn nbytes_of(ty: GgmlType, ne: [i64; 4]) -> usize {
    ty.row_size(ne[0]).unwrap() * (ne[1] * ne[2] * ne[3]) as usize
}

fn row_size(ty: GgmlType, ne: [i64; 4]) -> usize {
    ty.row_size(ne[0]).unwrap()
}

/// Shapes per type: every axis ≥ 2 units, axis 0 in whole quant blocks.
const TYPES: [(GgmlType, [i64; 4]); 5] = [
    (F32, [12, 6, 4, 2]),
    (F16, [10, 6, 4, 2]),
    (Q8_0, [128, 3, 2, 2]),
    (Q4_0, [192, 2, 3, 2]),
    (Q4_K, [512, 3, 2, 2]),
];

fn ext(len: i64, ratios: &[f32], granule: i64) -> Vec<i64> {
    split_extents(len, ratios, granule).unwrap_or_else(|e| panic!("split_extents({len}, {ratios:?}, {granule}): {e}"))
}

/// Every state a tensor of `ty`/`ne` is tested in on `n` devices, labelled.
fn states(ty: GgmlType, ne: [i64; 4], n: usize) -> Vec<(String, SplitState)> {
    let mut v = vec![("mirrored".to_string(), SplitState::Mirrored)];
    if matches!(ty, F32 | F16) {
        v.push(("partial".into(), SplitState::partial()));
    }
    let even: Vec<f32> = vec![1.0; n];
    let uneven: Vec<f32> = (0..n).map(|j| if j % 2 == 0 { 3.0 } else { 1.0 }).collect();
    let zero: Vec<f32> = (0..n).map(|j| if n == 1 || j % 2 == 1 { 1.0 } else { 0.0 }).collect();
    for (axis, &len) in ne.iter().enumerate() {
        let g = if axis == 0 { ty.block_size() as i64 } else { 1 };
        let units = len / g;
        for (what, r) in [("even", &even), ("3:1", &uneven), ("zero", &zero)] {
            v.push((format!("axis {axis} {what}"), SplitState::split(axis, ext(len, r, g))));
        }
        // Two segments of different sizes, split differently.
        let a = (units / 3).max(1) * g;
        let segs = vec![ext(a, &uneven, g), ext(len - a, &even, g)];
        v.push((format!("axis {axis} two segments"), SplitState::Split(AxisSplit { axis, segments: segs, repeat: 1 })));
        // One segment repeated.
        if let Some(r) = [2i64, 3].into_iter().find(|r| units % r == 0) {
            let segs = vec![ext(len / r, &uneven, g)];
            v.push((
                format!("axis {axis} repeat {r}"),
                SplitState::Split(AxisSplit { axis, segments: segs, repeat: r }),
            ));
        }
    }
    v
}

fn whole(store: &SplitStore, ctx: &Context, id: TensorId) -> Vec<u8> {
    let mut out = vec![0u8; ctx.tensor(id).unwrap().nbytes()];
    store.get_tensor(ctx, id, 0, &mut out).unwrap();
    out
}

/// The store's device parts of `id` equal `slice_local` of `full` in `state`.
fn assert_parts(store: &SplitStore, ctx: &Context, id: TensorId, state: &SplitState, full: &[u8], what: &str) {
    let t = ctx.tensor(id).unwrap();
    let (st, parts) = store.locals(id).unwrap_or_else(|| panic!("{what}: not placed"));
    assert_eq!(st, state, "{what}: stored state");
    assert_eq!(parts.len(), store.n_devices(), "{what}: part count");
    for (j, p) in parts.iter().enumerate() {
        let want = slice_local(t.ty, t.ne, full, state, j).unwrap();
        if let Some(i) = p.iter().zip(&want).position(|(a, b)| a != b) {
            panic!("{what}: device {j} differs at local byte {i} of {}", want.len());
        }
        assert_eq!(p.len(), want.len(), "{what}: device {j} part size");
    }
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

// ---------------------------------------------------------------- 1. whole

#[test]
fn whole_tensor_round_trips_in_every_state_type_and_device_count() {
    let mut rng = Rng::new(1);
    let mut cases = 0;
    for (ty, ne) in TYPES {
        for n in 1..=4usize {
            for (label, state) in states(ty, ne, n) {
                let what = format!("{ty}{ne:?} {label} {} on {n} devices", state.label());
                let mut ctx = Context::new();
                let id = ctx.new_tensor(ty, &ne).unwrap();
                let size = ctx.tensor(id).unwrap().nbytes();
                assert_eq!(size, nbytes_of(ty, ne));
                let mut store = SplitStore::new(n);
                store.place(&ctx, id, &state).unwrap_or_else(|e| panic!("{what}: place: {e}"));
                // Placed zero-filled, sized as local_ne says.
                let zeros = vec![0u8; size];
                assert_eq!(whole(&store, &ctx, id), zeros, "{what}: fresh placement");
                let per_dev: Vec<u64> = (0..n)
                    .map(|j| {
                        let l = local_ne(ne, &state, j);
                        nbytes_of(ty, l) as u64
                    })
                    .collect();
                assert_eq!(store.bytes_per_device(), per_dev, "{what}: bytes per device");

                let full = data_for(ty, &state, size, &mut rng);
                store.set_tensor(&ctx, id, 0, &full).unwrap_or_else(|e| panic!("{what}: set: {e}"));
                let got = whole(&store, &ctx, id);
                if let Some(i) = first_diff(&got, &full) {
                    panic!("{what}: whole read differs at byte {i} of {size}");
                }
                assert_parts(&store, &ctx, id, &state, &full, &what);
                let parts: Vec<Vec<u8>> = store.locals(id).unwrap().1.iter().map(|p| p.to_vec()).collect();
                assert_eq!(assemble(ty, ne, &parts, &state).unwrap(), full, "{what}: assemble of the parts");

                // The same data handed over already split.
                let mut s2 = SplitStore::new(n);
                let locals: Vec<Vec<u8>> = (0..n).map(|j| slice_local(ty, ne, &full, &state, j).unwrap()).collect();
                s2.set_locals(&ctx, id, &state, locals).unwrap_or_else(|e| panic!("{what}: set_locals: {e}"));
                assert!(first_diff(&whole(&s2, &ctx, id), &full).is_none(), "{what}: read after set_locals");
                cases += 1;
            }
        }
    }
    assert!(cases > 400, "{cases} cases");
}

/// The elements each device holds, written out by hand (not through
/// `slice_local`) for small F32 tensors whose element `i` (ggml order) has
/// the value `i`: mirrored, partial, split on axes 0, 1 and 2 with uneven
/// and zero extents, two segments, a repeated segment; and a Q8_0 weight
/// split on whole blocks. Also the bytes per device and the single-device
/// read back.
#[test]
fn hand_computed_parts_in_every_state() {
    let r = |a: i32, b: i32| (a..b).collect::<Vec<i32>>();
    let cat = |v: &[Vec<i32>]| v.concat();
    let seg =
        |axis: usize, segments: Vec<Vec<i64>>, repeat: i64| SplitState::Split(AxisSplit { axis, segments, repeat });
    // [4, 3, 2]: element (i0, i1, i2) = i0 + 4 i1 + 12 i2.
    let a = [4i64, 3, 2, 1];
    // [2, 6]: element (i0, i1) = i0 + 2 i1.
    let b = [2i64, 6, 1, 1];
    // (label, shape, state, the elements each device holds)
    type Case = (&'static str, [i64; 4], SplitState, Vec<Vec<i32>>);
    let cases: Vec<Case> = vec![
        ("mirrored", a, SplitState::Mirrored, vec![r(0, 24), r(0, 24)]),
        (
            "axis 0, extents 3 and 1",
            a,
            SplitState::split(0, vec![3, 1]),
            vec![cat(&[r(0, 3), r(4, 7), r(8, 11), r(12, 15), r(16, 19), r(20, 23)]), vec![3, 7, 11, 15, 19, 23]],
        ),
        (
            "axis 1, extents 1 and 2",
            a,
            SplitState::split(1, vec![1, 2]),
            vec![cat(&[r(0, 4), r(12, 16)]), cat(&[r(4, 12), r(16, 24)])],
        ),
        ("axis 2, extents 2 and 0", a, SplitState::split(2, vec![2, 0]), vec![r(0, 24), vec![]]),
        (
            "axis 1 on 3 devices, extents 0, 2, 1",
            a,
            SplitState::split(1, vec![0, 2, 1]),
            vec![vec![], cat(&[r(0, 8), r(12, 20)]), cat(&[r(8, 12), r(20, 24)])],
        ),
        (
            // Segment 0 (column 0 and 1: one each), segment 1 (columns 2, 3: one each).
            "axis 0, two segments [1, 1] [1, 1]",
            a,
            seg(0, vec![vec![1, 1], vec![1, 1]], 1),
            vec![
                (0..6).flat_map(|k| [4 * k, 4 * k + 2]).collect(),
                (0..6).flat_map(|k| [4 * k + 1, 4 * k + 3]).collect(),
            ],
        ),
        (
            // Segment 0 (row 0): device 0; segment 1 (rows 1, 2): one each.
            "axis 1, two segments [1, 0] [1, 1]",
            a,
            seg(1, vec![vec![1, 0], vec![1, 1]], 1),
            vec![cat(&[r(0, 8), r(12, 20)]), cat(&[r(8, 12), r(20, 24)])],
        ),
        (
            // Rows 0, 1 | 2 | 3, 4 | 5.
            "axis 1, segment [2, 1] repeated twice",
            b,
            seg(1, vec![vec![2, 1]], 2),
            vec![cat(&[r(0, 4), r(6, 10)]), cat(&[r(4, 6), r(10, 12)])],
        ),
    ];
    for (label, ne, state, want) in cases {
        let n = want.len();
        let what = format!("F32{ne:?} {label} on {n} devices");
        let mut ctx = Context::new();
        let id = ctx.new_tensor(F32, &ne).unwrap();
        let count = ne.iter().product::<i64>() as usize;
        let full: Vec<f32> = (0..count).map(|i| i as f32).collect();
        let mut store = SplitStore::new(n);
        store.place(&ctx, id, &state).unwrap_or_else(|e| panic!("{what}: place: {e}"));
        store.set_tensor(&ctx, id, 0, &encode(F32, &full)).unwrap();
        let (_, parts) = store.locals(id).unwrap();
        for (j, (p, w)) in parts.iter().zip(&want).enumerate() {
            let got: Vec<f32> = p.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let w: Vec<f32> = w.iter().map(|&i| i as f32).collect();
            assert_eq!(got, w, "{what}: device {j}");
        }
        let bytes: Vec<u64> = want.iter().map(|w| 4 * w.len() as u64).collect();
        assert_eq!(store.bytes_per_device(), bytes, "{what}: bytes per device");
        assert_eq!(whole(&store, &ctx, id), encode(F32, &full), "{what}: read back");
    }

    // Partial: a value written from the host is device 0's addend (the
    // others hold zeros); addends handed over read back as their sum.
    for n in [2usize, 3] {
        let mut ctx = Context::new();
        let id = ctx.new_tensor(F32, &[4, 3]).unwrap();
        let full: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let mut store = SplitStore::new(n);
        store.place(&ctx, id, &SplitState::partial()).unwrap();
        store.set_tensor(&ctx, id, 0, &encode(F32, &full)).unwrap();
        let (_, parts) = store.locals(id).unwrap();
        assert_eq!(parts[0], &encode(F32, &full)[..], "partial on {n}: device 0");
        for (j, p) in parts.iter().enumerate().skip(1) {
            assert!(p.len() == 48 && p.iter().all(|&x| x == 0), "partial on {n}: device {j} holds {p:?}");
        }
        assert_eq!(store.bytes_per_device(), vec![48; n], "partial on {n}: bytes per device");
        // Addends i, 100, 1000 (·j): the sum is i + 100 (+ 1000 on 3 devices).
        let addends: Vec<Vec<u8>> = (0..n)
            .map(|j| {
                encode(
                    F32,
                    &(0..12).map(|i| if j == 0 { i as f32 } else { 10f32.powi(j as i32 + 1) }).collect::<Vec<_>>(),
                )
            })
            .collect();
        store.set_locals(&ctx, id, &SplitState::partial(), addends).unwrap();
        let sum: Vec<f32> = (0..12).map(|i| i as f32 + if n == 2 { 100.0 } else { 1100.0 }).collect();
        assert_eq!(whole(&store, &ctx, id), encode(F32, &sum), "partial on {n}: the sum of the addends");
    }

    // Q8_0 [64, 2] split on axis 0 at 32: each device holds one 34-byte
    // block of each row: device 0 bytes 0..34 and 68..102, device 1 34..68
    // and 102..136.
    let mut ctx = Context::new();
    let id = ctx.new_tensor(Q8_0, &[64, 2]).unwrap();
    let full: Vec<u8> = (0..136).map(|i| i as u8).collect();
    let mut store = SplitStore::new(2);
    store.place(&ctx, id, &SplitState::split(0, vec![32, 32])).unwrap();
    store.set_tensor(&ctx, id, 0, &full).unwrap();
    let (_, parts) = store.locals(id).unwrap();
    assert_eq!(parts[0], &[&full[0..34], &full[68..102]].concat()[..], "Q8_0 axis 0: device 0");
    assert_eq!(parts[1], &[&full[34..68], &full[102..136]].concat()[..], "Q8_0 axis 0: device 1");
    assert_eq!(store.bytes_per_device(), vec![68, 68]);
    assert_eq!(whole(&store, &ctx, id), full);
}

// ---------------------------------------------------------- 2. byte ranges

/// Byte positions within a row where device ownership changes under an axis-0 split.
fn row_cuts(ty: GgmlType, state: &SplitState) -> Vec<usize> {
    let Some(s) = state.as_split().filter(|s| s.axis == 0) else { return vec![] };
    let (bs, ts) = (ty.block_size() as i64, ty.type_size());
    let mut cuts: Vec<usize> = (0..s.n_devices())
        .flat_map(|j| s.ranges(j))
        .flat_map(|(a, b)| [(a / bs) as usize * ts, (b / bs) as usize * ts])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Random byte ranges of a tensor of `size` bytes with rows of `rs` bytes:
/// arbitrary, mid-row over several rows, around device cuts inside a row,
/// single bytes, empty, the whole tensor.
fn random_ranges(rng: &mut Rng, size: usize, rs: usize, cuts: &[usize], k: usize) -> Vec<(usize, usize)> {
    let rows = size / rs;
    let mut out = vec![(0, size), (size, 0), (0, 0), (size - 1, 1)];
    for i in 0..k {
        let r = match i % 5 {
            0 => {
                let o = rng.below(size);
                (o, rng.range(1, size - o))
            }
            1 => {
                // Starts mid-row, ends mid-row some rows later.
                let row = rng.below(rows);
                let o = row * rs + rng.range(1, rs - 1);
                let span = rng.range(1, 3) * rs + rng.below(rs);
                (o.min(size - 1), span.min(size - o.min(size - 1)))
            }
            2 if !cuts.is_empty() => {
                // Crosses a device boundary within one row (axis-0 split).
                let c = cuts[rng.below(cuts.len())];
                let row = rng.below(rows);
                let before = rng.range(0, c.min(7));
                let o = row * rs + c - before;
                let len = (before + rng.range(1, 9)).min(size - o).max(1);
                (o.min(size - 1), len.min(size - o.min(size - 1)))
            }
            3 => (rng.below(size), 1),
            _ => {
                // Row-aligned runs of rows, then a ragged tail.
                let row = rng.below(rows);
                let o = row * rs;
                (o, (rng.range(1, 2) * rs + rng.below(3)).min(size - o))
            }
        };
        out.push(r);
    }
    out
}

#[test]
fn byte_ranges_write_and_read_single_device_bytes() {
    let mut rng = Rng::new(2);
    for (ty, ne) in TYPES {
        let size = nbytes_of(ty, ne);
        let rs = row_size(ty, ne);
        for n in 1..=4usize {
            for (label, state) in states(ty, ne, n) {
                let what = format!("{ty}{ne:?} {label} {} on {n} devices", state.label());
                let partial = matches!(state, SplitState::Partial(_));
                let es = ty.type_size();
                let mut ctx = Context::new();
                let id = ctx.new_tensor(ty, &ne).unwrap();
                let mut store = SplitStore::new(n);
                store.place(&ctx, id, &state).unwrap();
                let mut reference = data_for(ty, &state, size, &mut rng);
                store.set_tensor(&ctx, id, 0, &reference).unwrap();
                for (off, len) in random_ranges(&mut rng, size, rs, &row_cuts(ty, &state), 30) {
                    let (off, len) = if partial {
                        // Element-aligned only; an unaligned one must fail and change nothing.
                        if off % es != 0 || len % es != 0 {
                            let junk = vec![0xA5u8; len];
                            assert!(
                                store.set_tensor(&ctx, id, off, &junk).is_err(),
                                "{what}: unaligned set {off}+{len}"
                            );
                            let mut o = vec![0u8; len];
                            assert!(
                                store.get_tensor(&ctx, id, off, &mut o).is_err(),
                                "{what}: unaligned get {off}+{len}"
                            );
                            assert!(
                                first_diff(&whole(&store, &ctx, id), &reference).is_none(),
                                "{what}: failed set wrote"
                            );
                        }
                        let o = off / es * es;
                        (o, (len / es * es).min(size - o))
                    } else {
                        (off, len)
                    };
                    let data = data_for(ty, &state, len, &mut rng);
                    store
                        .set_tensor(&ctx, id, off, &data)
                        .unwrap_or_else(|e| panic!("{what}: set bytes {off}..{}: {e}", off + len));
                    reference[off..off + len].copy_from_slice(&data);
                    let got = whole(&store, &ctx, id);
                    if let Some(i) = first_diff(&got, &reference) {
                        panic!("{what}: after set of bytes {off}..{} (row {rs} bytes) byte {i} differs", off + len);
                    }
                    // The same range read back alone.
                    let mut back = vec![0u8; len];
                    store.get_tensor(&ctx, id, off, &mut back).unwrap();
                    assert!(back == data, "{what}: get of bytes {off}..{}", off + len);
                    // Every device holds exactly its share.
                    assert_parts(&store, &ctx, id, &state, &reference, &format!("{what} after {off}+{len}"));
                }
                // A random read range of the final contents.
                for _ in 0..8 {
                    let o = rng.below(size);
                    let o = if partial { o / es * es } else { o };
                    let l = rng.range(0, size - o);
                    let l = if partial { l / es * es } else { l };
                    let mut back = vec![0u8; l];
                    store.get_tensor(&ctx, id, o, &mut back).unwrap();
                    assert!(back[..] == reference[o..o + l], "{what}: get {o}+{l}");
                }
            }
        }
    }
}

#[test]
fn partial_ranges_over_unequal_addends_replace_the_sum() {
    // Addends of k/8 sum exactly in any order, so the reference sum is
    // unambiguous; a written range replaces the sum there (device 0 gets the
    // values, the others zeros) and leaves the other addends alone.
    let mut rng = Rng::new(3);
    for ty in [F32, F16] {
        let ne = [10i64, 6, 3, 1];
        let size = nbytes_of(ty, ne);
        let es = ty.type_size();
        for n in 1..=4usize {
            let mut ctx = Context::new();
            let id = ctx.new_tensor(ty, &ne).unwrap();
            let st = SplitState::partial();
            let mut store = SplitStore::new(n);
            let addends: Vec<Vec<u8>> = (0..n).map(|_| exact_values(ty, size / es, &mut rng)).collect();
            store.set_locals(&ctx, id, &st, addends.clone()).unwrap();
            let mut reference = assemble(ty, ne, &addends, &st).unwrap();
            assert!(whole(&store, &ctx, id) == reference, "{ty} on {n}: sum of addends");
            let mut addends = addends;
            for _ in 0..20 {
                let o = rng.below(size / es) * es;
                let l = rng.range(0, (size - o) / es) * es;
                let data = exact_values(ty, l / es, &mut rng);
                store.set_tensor(&ctx, id, o, &data).unwrap();
                reference[o..o + l].copy_from_slice(&data);
                for (j, a) in addends.iter_mut().enumerate() {
                    if j == 0 {
                        a[o..o + l].copy_from_slice(&data);
                    } else {
                        a[o..o + l].fill(0);
                    }
                }
                assert!(whole(&store, &ctx, id) == reference, "{ty} on {n}: after set {o}+{l}");
                let (_, parts) = store.locals(id).unwrap();
                for (j, p) in parts.iter().enumerate() {
                    assert!(*p == &addends[j][..], "{ty} on {n}: addend {j} after set {o}+{l}");
                }
            }
        }
    }
}

#[test]
fn partial_get_equals_assemble_of_the_addends() {
    // get_tensor of a partial tensor is the value `assemble` defines (the
    // executor's outputs are assembled the same way), also where rounding
    // matters: F16 addends on 3 and 4 devices.
    let mut rng = Rng::new(4);
    for ty in [F32, F16] {
        let ne = [16i64, 8, 1, 1];
        let size = nbytes_of(ty, ne);
        for n in 1..=4usize {
            let mut ctx = Context::new();
            let id = ctx.new_tensor(ty, &ne).unwrap();
            let st = SplitState::partial();
            let mut store = SplitStore::new(n);
            let addends: Vec<Vec<u8>> = (0..n).map(|_| finite_values(ty, size / ty.type_size(), &mut rng)).collect();
            store.set_locals(&ctx, id, &st, addends.clone()).unwrap();
            let want = assemble(ty, ne, &addends, &st).unwrap();
            let got = whole(&store, &ctx, id);
            if let Some(i) = first_diff(&got, &want) {
                let e = ty.type_size();
                panic!(
                    "{ty} partial on {n} devices: get_tensor differs from assemble at element {} ({:02x?} vs {:02x?})",
                    i / e,
                    &got[i / e * e..i / e * e + e],
                    &want[i / e * e..i / e * e + e]
                );
            }
        }
    }
}

#[test]
fn partial_set_then_get_keeps_negative_zero() {
    // One device reads back the bytes it was given; a partial tensor set
    // from the host must too (-0.0 is an ordinary value in weights/states).
    for ty in [F32, F16] {
        for n in 1..=3usize {
            let mut ctx = Context::new();
            let id = ctx.new_tensor(ty, &[4]).unwrap();
            let mut store = SplitStore::new(n);
            store.place(&ctx, id, &SplitState::partial()).unwrap();
            let data = encode(ty, &[-0.0, 1.0, -0.0, -2.5]);
            store.set_tensor(&ctx, id, 0, &data).unwrap();
            let got = whole(&store, &ctx, id);
            assert_eq!(got, data, "{ty} partial on {n} devices: -0.0 written, read back {got:02x?}");
        }
    }
}

// ---------------------------------------------------------------- 3. views

/// One view of the owner under test, with a label.
struct ViewCase {
    name: &'static str,
    view: TensorId,
}

/// Applies set/get through `views` of `owner` (placed in `state` on `n`
/// devices) and checks every write lands at `view_offs + offset` of the
/// owner's single-device bytes, against a `Vec` and a CPU `TensorStorage`.
fn check_views(ctx: &Context, owner: TensorId, views: &[ViewCase], state: &SplitState, n: usize, rng: &mut Rng) {
    let ot = ctx.tensor(owner).unwrap();
    let size = ot.nbytes();
    let what0 = format!("{} {} on {n} devices", ot.describe(), state.label());
    let mut store = SplitStore::new(n);
    store.place(ctx, owner, state).unwrap_or_else(|e| panic!("{what0}: place: {e}"));
    let cpu = CpuBackend::with_threads(1).unwrap();
    let mut st = TensorStorage::new();
    st.alloc_tensors(&cpu, ctx, &[owner]).unwrap();
    let mut reference = rng.bytes(size);
    store.set_tensor(ctx, owner, 0, &reference).unwrap();
    st.set_bytes(ctx, owner, 0, &reference).unwrap();
    for vc in views {
        let vt = ctx.tensor(vc.view).unwrap();
        assert_eq!(vt.view_src, Some(owner), "{}: a view of the owner", vc.name);
        let (vo, vlen) = (vt.view_offs, vt.nbytes());
        let what = format!("{what0}, view {} (offs {vo}, {vlen} bytes)", vc.name);
        let mut pairs = vec![(0, vlen), (0, 1), (vlen - 1, 1), (vlen, 0)];
        for _ in 0..12 {
            let o = rng.below(vlen);
            pairs.push((o, rng.range(1, vlen - o)));
        }
        for (off, len) in pairs {
            let data = rng.bytes(len);
            store.set_tensor(ctx, vc.view, off, &data).unwrap_or_else(|e| panic!("{what}: set {off}+{len}: {e}"));
            st.set_bytes(ctx, vc.view, off, &data).unwrap();
            reference[vo + off..vo + off + len].copy_from_slice(&data);
            let got = whole(&store, ctx, owner);
            if let Some(i) = first_diff(&got, &reference) {
                panic!("{what}: after set {off}+{len} owner byte {i} differs");
            }
            let mut one = vec![0u8; size];
            st.get_bytes(ctx, owner, 0, &mut one).unwrap();
            assert!(one == reference, "{what}: CPU reference disagrees with the Vec");
            // Read back through the view at another range.
            let o = rng.below(vlen);
            let l = rng.range(0, vlen - o);
            let mut a = vec![0u8; l];
            let mut b = vec![0u8; l];
            store.get_tensor(ctx, vc.view, o, &mut a).unwrap();
            st.get_bytes(ctx, vc.view, o, &mut b).unwrap();
            assert!(a == b, "{what}: get {o}+{l} through the view");
            assert_parts(&store, ctx, owner, state, &reference, &what);
        }
        // Past the view's end (though inside the owner) is an error, as in ggml.
        let mut o = vec![0u8; 1];
        assert!(store.get_tensor(ctx, vc.view, vlen, &mut o).is_err(), "{what}: get past the view");
        assert!(store.set_tensor(ctx, vc.view, vlen, &[1]).is_err(), "{what}: set past the view");
        assert!(store.set_tensor(ctx, vc.view, usize::MAX, &[1]).is_err(), "{what}: set at usize::MAX");
        assert!(store.get_tensor(ctx, vc.view, usize::MAX, &mut []).is_err(), "{what}: get at usize::MAX");
    }
    assert!(whole(&store, ctx, owner) == reference, "{what0}: failed calls wrote");
}

const RATIOS: [&[f32]; 6] =
    [&[1.0], &[1.0, 1.0], &[3.0, 1.0], &[1.0, 1.0, 1.0], &[1.0, 0.0, 2.0], &[1.0, 1.0, 1.0, 1.0]];

#[test]
fn views_of_a_head_split_2d_cache_act_on_owner_bytes() {
    // K cache [head_dim·n_kv, n_ctx] split on axis 0 by heads (F16, and Q8_0
    // with 32-element heads), views as llama.cpp makes them.
    let mut rng = Rng::new(5);
    for (ty, d) in [(F16, 8i64), (Q8_0, 32), (F32, 4)] {
        let (hkv, n_ctx) = (4i64, 6i64);
        for ratios in RATIOS {
            let mut ctx = Context::new();
            let c = ctx.new_tensor(ty, &[d * hkv, n_ctx]).unwrap();
            let nb1 = ctx.tensor(c).unwrap().nb[1];
            let hb = ty.row_size(d).unwrap(); // bytes of one head in a row
            let cells = ctx.view_2d(c, d * hkv, 3, nb1, 2 * nb1).unwrap();
            let head = ctx.view_2d(c, d, n_ctx, nb1, hb).unwrap();
            let flat = ctx.view_1d(c, d * hkv * 2, nb1 + hb).unwrap();
            let r3 = ctx.reshape_3d(c, d, hkv, n_ctx).unwrap();
            let sub = ctx.view_3d(r3, d, 2, 3, hb, nb1, hb + 2 * nb1).unwrap();
            let r1 = ctx.reshape_1d(c, d * hkv * n_ctx).unwrap();
            let tail = ctx.view_1d(r1, d * 3, (n_ctx as usize - 1) * nb1 + hb / 2 * 2).unwrap();
            let views = [
                ViewCase { name: "cells 2..5 (view_2d)", view: cells },
                ViewCase { name: "head 1 over all cells (strided view_2d)", view: head },
                ViewCase { name: "view_1d from head 1 of cell 1", view: flat },
                ViewCase { name: "view_3d of reshape_3d: heads 1..3 of cells 2..5", view: sub },
                ViewCase { name: "reshape_1d", view: r1 },
                ViewCase { name: "view_1d of reshape_1d in the last cell", view: tail },
            ];
            let heads = ext(hkv, ratios, 1);
            let by_heads = SplitState::split(0, heads.iter().map(|h| h * d).collect());
            check_views(&ctx, c, &views, &by_heads, ratios.len(), &mut rng);
            // Also with K and V fused in one row as two segments of heads.
            let fused = SplitState::Split(AxisSplit {
                axis: 0,
                segments: vec![
                    ext(hkv / 2, ratios, 1).iter().map(|h| h * d).collect(),
                    ext(hkv / 2, ratios, 1).iter().map(|h| h * d).collect(),
                ],
                repeat: 1,
            });
            check_views(&ctx, c, &views, &fused, ratios.len(), &mut rng);
            check_views(&ctx, c, &views, &SplitState::Mirrored, ratios.len(), &mut rng);
        }
    }
}

#[test]
fn views_of_a_3d_cache_split_on_heads_act_on_owner_bytes() {
    // [head_dim, n_kv, n_ctx] split on axis 1; also split over cells (axis 2)
    // and as a flattened head split ([D, H·T] with one segment repeated).
    let mut rng = Rng::new(6);
    let (d, hkv, n_ctx) = (6i64, 4i64, 5i64);
    for ratios in RATIOS {
        let n = ratios.len();
        let mut ctx = Context::new();
        let c = ctx.new_tensor(F32, &[d, hkv, n_ctx]).unwrap();
        let nb = ctx.tensor(c).unwrap().nb;
        let cell = ctx.view_2d(c, d, hkv, nb[1], 3 * nb[2]).unwrap();
        let cells = ctx.view_3d(c, d, hkv, 2, nb[1], nb[2], nb[2]).unwrap();
        let head = ctx.view_2d(c, d, n_ctx, nb[2], 2 * nb[1]).unwrap();
        let part = ctx.view_3d(c, d / 2, 2, 3, nb[1], nb[2], nb[1] + 4 * 2).unwrap();
        let r2 = ctx.reshape_2d(c, d * hkv, n_ctx).unwrap();
        let rows = ctx.view_2d(r2, d * hkv, 2, nb[2], 2 * nb[2] + 4).unwrap();
        let views = [
            ViewCase { name: "cell 3 (view_2d)", view: cell },
            ViewCase { name: "cells 1..3 (view_3d)", view: cells },
            ViewCase { name: "head 2 over cells (strided)", view: head },
            ViewCase { name: "half heads, mid-row start", view: part },
            ViewCase { name: "view_2d of reshape_2d, unaligned start", view: rows },
        ];
        check_views(&ctx, c, &views, &SplitState::split(1, ext(hkv, ratios, 1)), n, &mut rng);
        check_views(&ctx, c, &views, &SplitState::split(2, ext(n_ctx, ratios, 1)), n, &mut rng);
        let seg = AxisSplit { axis: 1, segments: vec![ext(2, ratios, 1), ext(2, ratios, 1)], repeat: 1 };
        check_views(&ctx, c, &views, &SplitState::Split(seg), n, &mut rng);
        let mut ctx2 = Context::new();
        let flat = ctx2.new_tensor(F32, &[d, hkv * n_ctx]).unwrap();
        let v = ctx2.view_2d(flat, d, 7, 4 * d as usize, 4 * 3).unwrap();
        let v1 = ctx2.view_1d(flat, 2 * d + 3, 4 * (d as usize * 3 + 1)).unwrap();
        let rep = SplitState::Split(AxisSplit { axis: 1, segments: vec![ext(hkv, ratios, 1)], repeat: n_ctx });
        check_views(
            &ctx2,
            flat,
            &[ViewCase { name: "rows across repeats", view: v }, ViewCase { name: "1d across repeats", view: v1 }],
            &rep,
            n,
            &mut rng,
        );
    }
}

// --------------------------------------------------------- 4. save/restore

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn kv_cache_written_by_set_rows_saves_and_restores_in_single_device_bytes() {
    let (d, hkv, kv, t) = (32i64, 4i64, 8i64, 3i64);
    let mut rng = Rng::new(7);
    for ty in [F16, Q8_0, F32] {
        for ratios in RATIOS {
            let n = ratios.len();
            let what = format!("{ty} cache on {ratios:?}");
            let mut ctx = Context::new();
            let cache = named(&mut ctx, ty, &[hkv * d, kv], "cache_k_l0");
            let rows = input(&mut ctx, F32, &[hkv * d, t], "k_cur");
            let idx = input(&mut ctx, GgmlType::I64, &[t], "k_idxs");
            let w = ctx.set_rows(cache, rows, idx).unwrap();
            let rs = ctx.tensor(cache).unwrap().nb[1];
            // Cells 6..8, for a restore through a view (not part of the graph).
            let v = ctx.view_2d(cache, hkv * d, 2, rs, 6 * rs).unwrap();
            let g = ctx.build_forward(&[w]).unwrap();
            let policy = SplitPolicy::new(ratios)
                .unwrap()
                .rule("cache_*", SplitSpec::Axis { axis: 0, granule: d, segments: vec![] });
            let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
            let cstate = plan.state(cache).cloned().unwrap();
            if n > 1 {
                assert!(cstate.as_split().is_some_and(|s| s.axis == 0), "{what}: cache state {}", cstate.label());
            }

            // One CPU device: the reference.
            let vals: Vec<f32> = (0..hkv * d * kv).map(|_| rng.unit()).collect();
            let one = OneCpu::new(&ctx, &g, 1, |st, l| {
                if l == cache {
                    st.set_f32(&ctx, cache, &vals).unwrap(); // valid (quantized) cache contents
                }
            })
            .unwrap();
            let size = ctx.tensor(cache).unwrap().nbytes();
            let snap0 = one.leaf_bytes[&cache].clone();
            let st = &one.storage;
            let cpu_step = |st: &TensorStorage, before: &[u8], r: &[u8], i: &[u8]| -> Vec<u8> {
                st.set_bytes(&ctx, cache, 0, before).unwrap();
                st.set_bytes(&ctx, rows, 0, r).unwrap();
                st.set_bytes(&ctx, idx, 0, i).unwrap();
                one.cpu.compute(&ctx, &g, st).unwrap();
                let mut out = vec![0u8; size];
                st.get_bytes(&ctx, cache, 0, &mut out).unwrap();
                out
            };

            let exec = devices::executor(n);
            let mut store = SplitStore::new(n);
            store.place_leafs(&ctx, &g, &plan).unwrap();
            assert_eq!(store.locals(cache).unwrap().0, &cstate, "{what}: placed as planned");
            store.set_tensor(&ctx, cache, 0, &snap0).unwrap();
            let step = |store: &mut SplitStore, r: &[u8], i: &[u8]| -> Vec<u8> {
                store.set_tensor(&ctx, rows, 0, r).unwrap();
                store.set_tensor(&ctx, idx, 0, i).unwrap();
                let rep = exec
                    .execute(&ctx, &g, &plan, store, &[w])
                    .unwrap_or_else(|e| panic!("{what}: execute: {e}\n{}", plan.report(&ctx)));
                rep.outputs[0].bytes.clone()
            };

            // Step 1 writes cells 5, 0, 3.
            let r1 = f32_bytes(&(0..hkv * d * t).map(|_| rng.unit()).collect::<Vec<_>>());
            let i1 = i64_bytes(&[5, 0, 3]);
            let out1 = step(&mut store, &r1, &i1);
            let snap1 = cpu_step(st, &snap0, &r1, &i1);
            assert_ne!(snap1, snap0, "{what}: step 1 changed nothing");
            assert!(first_diff(&out1, &snap1).is_none(), "{what}: executor output of set_rows");
            // Save: the whole cache, and per cell as llama.cpp's state writer does.
            let saved = whole(&store, &ctx, cache);
            if let Some(i) = first_diff(&saved, &snap1) {
                panic!("{what}: saved cache differs from one device at byte {i} of {size}");
            }
            assert_eq!(rs * kv as usize, size);
            for cell in 0..kv as usize {
                let mut c = vec![0u8; rs];
                store.get_tensor(&ctx, cache, cell * rs, &mut c).unwrap();
                assert!(c[..] == snap1[cell * rs..(cell + 1) * rs], "{what}: cell {cell}");
            }
            assert_parts(&store, &ctx, cache, &cstate, &snap1, &format!("{what}: after step 1"));

            // Restore the snapshot before step 1, then run step 2 from it.
            store.set_tensor(&ctx, cache, 0, &snap0).unwrap();
            assert!(whole(&store, &ctx, cache) == snap0, "{what}: restored whole");
            assert_parts(&store, &ctx, cache, &cstate, &snap0, &format!("{what}: restored"));
            let r2 = f32_bytes(&(0..hkv * d * t).map(|_| rng.unit()).collect::<Vec<_>>());
            let i2 = i64_bytes(&[1, 7, 2]);
            step(&mut store, &r2, &i2);
            let snap2 = cpu_step(st, &snap0, &r2, &i2);
            assert!(first_diff(&whole(&store, &ctx, cache), &snap2).is_none(), "{what}: step 2 after restore");

            // Restore cells 2..5 of snapshot 1 by byte range (a sequence's cells),
            // once on the cache itself and once through a view of those cells.
            let mut want = snap2.clone();
            want[2 * rs..5 * rs].copy_from_slice(&snap1[2 * rs..5 * rs]);
            store.set_tensor(&ctx, cache, 2 * rs, &snap1[2 * rs..5 * rs]).unwrap();
            assert!(whole(&store, &ctx, cache) == want, "{what}: range restore");
            want[6 * rs..8 * rs].copy_from_slice(&snap0[6 * rs..8 * rs]);
            store.set_tensor(&ctx, v, 0, &snap0[6 * rs..8 * rs]).unwrap();
            assert!(whole(&store, &ctx, cache) == want, "{what}: view restore");
            assert_parts(&store, &ctx, cache, &cstate, &want, &format!("{what}: partly restored"));
            // The next step starts from the restored bytes.
            let i3 = i64_bytes(&[4, 4, 6]);
            step(&mut store, &r1, &i3);
            let snap3 = cpu_step(st, &want, &r1, &i3);
            assert!(first_diff(&whole(&store, &ctx, cache), &snap3).is_none(), "{what}: step 3 after partial restore");
        }
    }
}

#[test]
fn recurrent_state_written_by_cpy_into_a_view_saves_and_restores() {
    // An SSM-style state cache [d_state·n_head, n_seq] split by heads; a step
    // copies a new state into sequence 1's row through a view.
    let (ds, nh, nseq) = (4i64, 6i64, 3i64);
    let mut rng = Rng::new(8);
    for ratios in RATIOS {
        let n = ratios.len();
        let what = format!("recurrent state on {ratios:?}");
        let mut ctx = Context::new();
        let s = named(&mut ctx, F32, &[ds * nh, nseq], "cache_s_l0");
        let x = input(&mut ctx, F32, &[ds * nh], "s_new");
        let rs = (ds * nh) as usize * 4;
        let view = ctx.view_1d(s, ds * nh, rs).unwrap();
        let w = ctx.cpy(x, view).unwrap();
        let g = ctx.build_forward(&[w]).unwrap();
        let policy = SplitPolicy::new(ratios)
            .unwrap()
            .rule("cache_s_*", SplitSpec::Axis { axis: 0, granule: ds, segments: vec![] });
        let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
        let sstate = plan.state(s).cloned().unwrap();
        let exec = devices::executor(n);
        let mut store = SplitStore::new(n);
        store.place_leafs(&ctx, &g, &plan).unwrap();
        let snap0 = finite_values(F32, (ds * nh * nseq) as usize, &mut rng);
        store.set_tensor(&ctx, s, 0, &snap0).unwrap();
        let xs = finite_values(F32, (ds * nh) as usize, &mut rng);
        store.set_tensor(&ctx, x, 0, &xs).unwrap();
        exec.execute(&ctx, &g, &plan, &mut store, &[w])
            .unwrap_or_else(|e| panic!("{what}: execute: {e}\n{}", plan.report(&ctx)));
        let mut want = snap0.clone();
        want[rs..2 * rs].copy_from_slice(&xs);
        assert!(first_diff(&whole(&store, &ctx, s), &want).is_none(), "{what}: state after cpy");
        let mut seq1 = vec![0u8; rs];
        store.get_tensor(&ctx, view, 0, &mut seq1).unwrap();
        assert!(seq1 == xs, "{what}: sequence 1 read through the view");
        // Restore sequence 1 from the snapshot through the view.
        store.set_tensor(&ctx, view, 0, &snap0[rs..2 * rs]).unwrap();
        assert!(whole(&store, &ctx, s) == snap0, "{what}: restored");
        assert_parts(&store, &ctx, s, &sstate, &snap0, &what);
    }
}

// ------------------------------------------------------------ 5. bad input

#[test]
fn bad_input_is_an_error_never_a_panic() {
    let mut ctx = Context::new();
    let a = ctx.new_tensor(F32, &[8, 4]).unwrap();
    let q = ctx.new_tensor(Q8_0, &[64, 2]).unwrap();
    let unplaced = ctx.new_tensor(F32, &[8, 4]).unwrap();
    let v = ctx.view_1d(a, 4, 8).unwrap();
    let vu = ctx.view_1d(unplaced, 4, 0).unwrap();
    let empty = ctx.new_tensor(F32, &[8, 0]).unwrap();
    let q4k = ctx.new_tensor(Q4_K, &[512, 1]).unwrap();
    let p = ctx.new_tensor(F16, &[8, 2]).unwrap();
    let mut store = SplitStore::new(2);
    store.place(&ctx, a, &SplitState::split(1, vec![3, 1])).unwrap();
    store.place(&ctx, q, &SplitState::split(0, vec![32, 32])).unwrap();
    let full: Vec<u8> = (0..128u8).collect();
    store.set_tensor(&ctx, a, 0, &full).unwrap();
    let mut buf = vec![0u8; 8];

    // Ranges past the end, overflowing offsets.
    assert!(store.set_tensor(&ctx, a, 121, &buf).is_err(), "set past the end");
    assert!(store.get_tensor(&ctx, a, 121, &mut buf).is_err(), "get past the end");
    assert!(store.set_tensor(&ctx, a, 129, &[]).is_err(), "empty set past the end");
    assert!(store.get_tensor(&ctx, a, 129, &mut []).is_err(), "empty get past the end");
    assert!(store.set_tensor(&ctx, a, usize::MAX, &buf).is_err(), "set at usize::MAX");
    assert!(store.get_tensor(&ctx, a, usize::MAX, &mut buf).is_err(), "get at usize::MAX");
    assert!(store.set_tensor(&ctx, a, usize::MAX - 3, &buf).is_err(), "set wrapping around");
    assert!(store.get_tensor(&ctx, a, usize::MAX, &mut []).is_err(), "empty get at usize::MAX");
    assert!(store.set_tensor(&ctx, a, 0, &[0u8; 129]).is_err(), "set longer than the tensor");
    assert!(store.set_tensor(&ctx, v, 12, &buf).is_err(), "set past a view's end");
    assert!(store.set_tensor(&ctx, v, usize::MAX, &buf).is_err(), "view offset overflow");
    assert!(store.get_tensor(&ctx, v, usize::MAX - 4, &mut buf).is_err(), "view offset overflow (get)");
    store.set_tensor(&ctx, a, 128, &[]).unwrap();
    store.get_tensor(&ctx, a, 128, &mut []).unwrap();
    assert_eq!(whole(&store, &ctx, a), full, "failed calls wrote");

    // Unplaced tensors, and views of them.
    assert!(store.set_tensor(&ctx, unplaced, 0, &buf).is_err(), "set of an unplaced tensor");
    assert!(store.get_tensor(&ctx, unplaced, 0, &mut buf).is_err(), "get of an unplaced tensor");
    assert!(store.set_tensor(&ctx, vu, 0, &buf).is_err(), "set through a view of an unplaced tensor");
    assert!(store.get_tensor(&ctx, vu, 0, &mut buf).is_err(), "get through a view of an unplaced tensor");
    assert!(store.locals(unplaced).is_none());
    // A tensor of another context.
    let mut other = Context::new();
    for _ in 0..8 {
        other.new_tensor(F32, &[8, 4]).unwrap();
    }
    let foreign = other.new_tensor(F32, &[8, 4]).unwrap();
    assert!(store.set_tensor(&ctx, foreign, 0, &buf).is_err(), "foreign id");
    assert!(store.get_tensor(&ctx, foreign, 0, &mut buf).is_err(), "foreign id (get)");
    assert!(store.place(&ctx, foreign, &SplitState::Mirrored).is_err(), "place of a foreign id");

    // Bad placements.
    let place_err = |store: &mut SplitStore, id: TensorId, st: SplitState, what: &str| {
        assert!(store.place(&ctx, id, &st).is_err(), "place {what}: {}", st.label());
    };
    place_err(&mut store, v, SplitState::Mirrored, "a view");
    place_err(&mut store, unplaced, SplitState::Unknown, "Unknown");
    place_err(&mut store, unplaced, SplitState::split(1, vec![2, 1]), "not summing to the axis");
    place_err(&mut store, unplaced, SplitState::split(1, vec![2, 3]), "over the axis");
    place_err(&mut store, unplaced, SplitState::split(1, vec![4]), "for 1 device");
    place_err(&mut store, unplaced, SplitState::split(1, vec![2, 1, 1]), "for 3 devices");
    place_err(&mut store, unplaced, SplitState::split(1, vec![5, -1]), "a negative extent");
    place_err(&mut store, unplaced, SplitState::split(4, vec![1, 0]), "axis 4");
    place_err(
        &mut store,
        unplaced,
        SplitState::Split(AxisSplit { axis: 1, segments: vec![vec![1, 1]], repeat: 0 }),
        "repeat 0",
    );
    place_err(
        &mut store,
        unplaced,
        SplitState::Split(AxisSplit { axis: 1, segments: vec![], repeat: 1 }),
        "no segments",
    );
    place_err(
        &mut store,
        unplaced,
        SplitState::Split(AxisSplit { axis: 1, segments: vec![vec![1, 1]], repeat: 3 }),
        "repeat over the axis",
    );
    place_err(&mut store, q, SplitState::split(0, vec![16, 48]), "off quant blocks");
    place_err(&mut store, q, SplitState::split(0, vec![48, 16]), "off quant blocks");
    place_err(
        &mut store,
        q,
        SplitState::Split(AxisSplit { axis: 0, segments: vec![vec![16, 0], vec![0, 48]], repeat: 1 }),
        "segments off quant blocks",
    );
    place_err(&mut store, q, SplitState::partial(), "partial of a quantized type");
    place_err(&mut store, q4k, SplitState::split(0, vec![128, 384]), "off Q4_K blocks");
    // A failed place leaves the earlier placement.
    assert_eq!(store.locals(q).unwrap().0, &SplitState::split(0, vec![32, 32]));
    assert!(store.locals(unplaced).is_none());

    // set_locals with a wrong count or sizes.
    let s1 = SplitState::split(1, vec![3, 1]);
    assert!(store.set_locals(&ctx, a, &s1, vec![vec![0; 96]]).is_err(), "one part for two devices");
    assert!(store.set_locals(&ctx, a, &s1, vec![vec![0; 96], vec![0; 32], vec![]]).is_err(), "three parts");
    assert!(store.set_locals(&ctx, a, &s1, vec![vec![0; 64], vec![0; 64]]).is_err(), "swapped sizes");
    assert!(store.set_locals(&ctx, a, &s1, vec![vec![0; 96], vec![0; 33]]).is_err(), "a byte too many");
    assert!(
        store.set_locals(&ctx, a, &SplitState::Mirrored, vec![vec![0; 128], vec![0; 127]]).is_err(),
        "mirrored short"
    );
    assert!(
        store.set_locals(&ctx, v, &SplitState::Mirrored, vec![vec![0; 16], vec![0; 16]]).is_err(),
        "set_locals of a view"
    );
    assert!(store.set_locals(&ctx, q, &SplitState::partial(), vec![vec![0; 68], vec![0; 68]]).is_err(), "partial Q8_0");
    assert!(store.set_locals(&ctx, a, &SplitState::Unknown, vec![vec![0; 128], vec![0; 128]]).is_err(), "Unknown");

    // Partial tensors: element-aligned ranges only.
    store.place(&ctx, p, &SplitState::partial()).unwrap();
    assert!(store.set_tensor(&ctx, p, 1, &[0, 0]).is_err(), "partial set at an odd byte");
    assert!(store.set_tensor(&ctx, p, 2, &[0, 0, 0]).is_err(), "partial set of an odd length");
    assert!(store.get_tensor(&ctx, p, 3, &mut [0, 0]).is_err(), "partial get at an odd byte");
    assert!(store.get_tensor(&ctx, p, 0, &mut [0]).is_err(), "partial get of an odd length");
    store.set_tensor(&ctx, p, 2, &[0, 0x3c]).unwrap();

    // Empty tensors: zero-length access only.
    store.place(&ctx, empty, &SplitState::split(0, vec![8, 0])).unwrap();
    store.set_tensor(&ctx, empty, 0, &[]).unwrap();
    store.get_tensor(&ctx, empty, 0, &mut []).unwrap();
    assert!(store.set_tensor(&ctx, empty, 0, &[1]).is_err(), "write into an empty tensor");
    assert!(store.get_tensor(&ctx, empty, 1, &mut []).is_err(), "offset past an empty tensor");

    // place_leafs with a plan for another device count.
    let mut c2 = Context::new();
    let x = c2.new_tensor(F32, &[8]).unwrap();
    c2.set_input(x).unwrap();
    let y = c2.scale(x, 2.0).unwrap();
    let g = c2.build_forward(&[y]).unwrap();
    let plan3 = Planner::default().plan(&c2, &g, &SplitPolicy::new(&[1.0, 1.0, 1.0]).unwrap(), &[]).unwrap();
    let mut s2 = SplitStore::new(2);
    assert!(s2.place_leafs(&c2, &g, &plan3).is_err(), "plan for 3 devices, store for 2");
    assert!(devices::executor(2).execute(&c2, &g, &plan3, &mut s2, &[y]).is_err(), "execute on 2");

    // place_leafs with the plan of another graph (same device count).
    let z = c2.sqr(x).unwrap();
    let g2 = c2.build_forward(&[z]).unwrap();
    let plan2 = Planner::default().plan(&c2, &g, &SplitPolicy::new(&[1.0, 1.0]).unwrap(), &[]).unwrap();
    let err = s2.place_leafs(&c2, &g2, &plan2).unwrap_err().to_string();
    assert!(err.contains("another graph"), "a plan of another graph: {err}");
    s2.place_leafs(&c2, &g, &plan2).unwrap();
}

#[test]
fn failed_set_locals_keeps_previous_contents() {
    // A rejected hand-over must not wipe what the store held (as a failed
    // execute keeps the store's previous contents).
    let mut ctx = Context::new();
    let a = ctx.new_tensor(F32, &[8, 4]).unwrap();
    let mut store = SplitStore::new(2);
    let st = SplitState::split(1, vec![3, 1]);
    store.place(&ctx, a, &st).unwrap();
    let full: Vec<u8> = (0..128u8).collect();
    store.set_tensor(&ctx, a, 0, &full).unwrap();
    assert!(store.set_locals(&ctx, a, &SplitState::Mirrored, vec![vec![7; 128], vec![7; 5]]).is_err());
    assert_eq!(store.locals(a).unwrap().0, &st, "state after a failed set_locals");
    assert_eq!(whole(&store, &ctx, a), full, "contents after a failed set_locals");
}

/// Weights stay in device buffers between runs; writing new weights through
/// the store must reach the next run (no stale device copy).
#[test]
fn new_weights_reach_the_next_run_of_the_same_executor() {
    use shardgraph::split::{Planner, SplitPolicy, SplitSpec};
    let mut ctx = Context::new();
    let w = named(&mut ctx, GgmlType::F32, &[8, 6], "w");
    let x = ctx.new_tensor(GgmlType::F32, &[8, 2]).unwrap();
    ctx.set_input(x).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let g = ctx.build_forward(&[y]).unwrap();
    let policy =
        SplitPolicy::new(&[1.0, 1.0]).unwrap().rule("w", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] });
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    let exec = devices::executor(2);
    let mut store = SplitStore::new(2);
    store.place_leafs(&ctx, &g, &plan).unwrap();
    let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    store.set_tensor(&ctx, x, 0, &f(&[1.0; 16])).unwrap();
    for scale in [1.0f32, 2.0, -3.0] {
        let wv: Vec<f32> = (0..48).map(|i| i as f32 * scale).collect();
        store.set_tensor(&ctx, w, 0, &f(&wv)).unwrap();
        let out = exec.execute(&ctx, &g, &plan, &mut store, &[y]).unwrap().outputs.remove(0).bytes;
        let got: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let want: Vec<f32> =
            (0..2).flat_map(|_| (0..6).map(|r| (0..8).map(|k| ((r * 8 + k) as f32) * scale).sum::<f32>())).collect();
        assert_eq!(got, want, "scale {scale}");
    }
}

/// A `cpy` into a stored cache that nothing else in its graph reads is a
/// write like any other (only `cast`'s destinations are scratch; issue 14):
/// the store holds the copied values afterwards, in the part on the device,
/// and a later run reads them; a clone of the store taken before keeps the
/// old bytes (a snapshot, also when the part lives in a device buffer —
/// found by a newcomer's review).
#[test]
fn a_cpy_into_a_stored_cache_nothing_else_reads_is_written_and_clones_keep_theirs() {
    use shardgraph::split::Devices;
    let mut ctx = Context::new();
    let leaf = |ctx: &mut Context, name: &str, ne: &[i64]| named(ctx, GgmlType::F32, ne, name);
    let (cache, rows, x) = (leaf(&mut ctx, "cache", &[4]), leaf(&mut ctx, "rows", &[4, 1]), leaf(&mut ctx, "x", &[4]));
    let v = ctx.view_1d(cache, 4, 0).unwrap();
    let w = ctx.cpy(x, v).unwrap();
    let rf = ctx.reshape_1d(rows, 4).unwrap();
    let c = ctx.cpy(rf, cache).unwrap();
    let y = ctx.scale(c, 2.0).unwrap();
    let r = ctx.scale(cache, 1.0).unwrap();
    let (g1, g2, g3) =
        (ctx.build_forward(&[w]).unwrap(), ctx.build_forward(&[y]).unwrap(), ctx.build_forward(&[r]).unwrap());
    let pol = SplitPolicy::new(&[1.0, 1.0]).unwrap().rule("*", SplitSpec::Mirrored);
    let plan = |g| Planner::default().plan(&ctx, g, &pol, &[]).unwrap();
    let (p1, p2, p3) = (plan(&g1), plan(&g2), plan(&g3));
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let exec = Devices::cpu(2, 1).and_then(|d| d.executor()).unwrap();
    let mut store = SplitStore::new(2);
    store.place_leafs(&ctx, &g1, &p1).unwrap();
    store.place_leafs(&ctx, &g2, &p2).unwrap();
    store.set_tensor(&ctx, x, 0, &f32s(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    store.set_tensor(&ctx, rows, 0, &f32s(&[9.0; 4])).unwrap();
    exec.execute(&ctx, &g1, &p1, &mut store, &[w]).unwrap();
    let snapshot = store.clone();
    let got = exec.execute(&ctx, &g2, &p2, &mut store, &[y]).unwrap();
    assert_eq!(got.outputs[0].bytes, f32s(&[18.0; 4]));
    let later = exec.execute(&ctx, &g3, &p3, &mut store, &[r]).unwrap();
    let (mut a, mut b) = (vec![0u8; 16], vec![0u8; 16]);
    store.get_tensor(&ctx, cache, 0, &mut a).unwrap();
    snapshot.get_tensor(&ctx, cache, 0, &mut b).unwrap();
    let (old, new) = (f32s(&[1.0, 2.0, 3.0, 4.0]), f32s(&[9.0; 4]));
    assert_eq!((later.outputs[0].bytes.clone(), a, b), (new.clone(), new, old));
}

/// A store placed from one context, asked about a tensor of another: the
/// error says the tensor is foreign to the store (`Error::ForeignTensor`,
/// `SG_ERR_FOREIGN_TENSOR` in the C ABI), not that it is not placed; a
/// tensor of the store's own context that was never placed is still
/// `Error::Split` "not placed".
#[test]
fn a_tensor_of_another_context_is_foreign_to_the_store() {
    let build = || {
        let mut ctx = Context::new();
        let w = named(&mut ctx, F32, &[8, 4], "w");
        let x = input(&mut ctx, F32, &[8, 2], "x");
        let y = ctx.mul_mat(w, x).unwrap();
        let g = ctx.build_forward(&[y]).unwrap();
        (ctx, w, g)
    };
    let (ctx, _, g) = build();
    let policy = SplitPolicy::new(&[1.0, 1.0]).unwrap().rule("w", SplitSpec::Mirrored);
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    let mut store = SplitStore::new(2);
    store.place_leafs(&ctx, &g, &plan).unwrap();
    let (other, w2, _) = build();
    let vals = vec![1.0f32; 32];
    let e = store.set_f32(&other, w2, &vals).unwrap_err();
    assert!(matches!(e, shardgraph::Error::ForeignTensor { .. }), "set_f32: {e}");
    let e = store.get_f32(&other, w2).unwrap_err();
    assert!(matches!(e, shardgraph::Error::ForeignTensor { .. }), "get_f32: {e}");
    let mut buf = vec![0u8; 4];
    let e = store.get_tensor(&other, w2, 0, &mut buf).unwrap_err();
    assert!(matches!(e, shardgraph::Error::ForeignTensor { .. }), "get_tensor: {e}");
    // The store's own context: an unplaced tensor is "not placed".
    let mut ctx = ctx;
    let z = named(&mut ctx, F32, &[8], "z");
    let e = store.set_f32(&ctx, z, &[0.0; 8]).unwrap_err();
    assert!(matches!(e, shardgraph::Error::Split { .. }) && e.to_string().contains("not placed"), "{e}");
}

/// Weights loaded from a mapped GGUF file (`load_into_split_store` of a
/// file from `GgufFile::open`): on CPU devices every part that is one run
/// of the tensor (mirrored, or a split of its rows) is computed on where
/// the file maps it (`bytes_mapped`, nothing allocated or copied for it);
/// a part gathered from several runs (a split along the rows) is copied.
/// GPU devices copy every part. Either way the results are those of the
/// same file parsed from memory (every part copied), and writing a loaded
/// weight changes the next run's result but never the file.
#[test]
fn weights_of_a_mapped_file_are_computed_in_place_and_writes_never_reach_it() {
    use shardgraph::gguf::{load_into_split_store, GgufFile, GgufWriter};
    use shardgraph::split::{Planner, SplitPolicy, SplitSpec};
    let mut rng = Rng::new(0x6d6170);
    let (wv, vv) = (exact_values(F16, 64 * 6, &mut rng), exact_values(F32, 64 * 3, &mut rng));
    let dir = std::env::temp_dir().join(format!("shardgraph-mapped-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.gguf");
    let mut wr = GgufWriter::new();
    wr.add_tensor("w", F16, &[64, 6]).unwrap();
    wr.add_tensor("v", F32, &[64, 3]).unwrap();
    wr.write_file(&path, |t, sink| sink.put(if t.name == "w" { &wv } else { &vv })).unwrap();
    let file_bytes = std::fs::read(&path).unwrap();

    let mut ctx = Context::new();
    let w = named(&mut ctx, F16, &[64, 6], "w");
    let v = named(&mut ctx, F32, &[64, 3], "v");
    let x = input(&mut ctx, F32, &[64, 2], "x");
    let (y, z) = (ctx.mul_mat(w, x).unwrap(), ctx.mul_mat(v, x).unwrap());
    let g = ctx.build_forward(&[y, z]).unwrap();
    // w by its rows (each device's part one run of the file), v along its
    // rows (each part gathered from 3 runs).
    let policy = SplitPolicy::new(&[1.0, 1.0])
        .unwrap()
        .rule("w", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] })
        .rule("v", SplitSpec::Axis { axis: 0, granule: 32, segments: vec![] });
    let plan = Planner::default().plan(&ctx, &g, &policy, &[]).unwrap();
    let xv = exact_values(F32, 128, &mut rng);
    let run = |file: &GgufFile, edit: Option<&[u8]>| {
        let exec = devices::executor(2);
        let mut store = SplitStore::new(2);
        store.place_leafs(&ctx, &g, &plan).unwrap();
        let report = load_into_split_store(file, &ctx, &mut store).unwrap();
        assert_eq!(report.bytes as usize, wv.len() + vv.len());
        store.set_tensor(&ctx, x, 0, &xv).unwrap();
        let before = exec.counters();
        let mut out = exec.execute(&ctx, &g, &plan, &mut store, &[y, z]).unwrap().outputs;
        let c = exec.counters();
        if let Some(new_w) = edit {
            store.set_tensor(&ctx, w, 0, new_w).unwrap();
            out = exec.execute(&ctx, &g, &plan, &mut store, &[y, z]).unwrap().outputs;
        }
        let outs: Vec<Vec<u8>> = out.into_iter().map(|o| o.bytes).collect();
        (outs, c.bytes_mapped - before.bytes_mapped, c.store_bytes_copied - before.store_bytes_copied)
    };
    let on_cpu = devices::kind().starts_with("cpu");
    let mapped = GgufFile::open(&path).unwrap();
    let (outs, n_mapped, n_copied) = run(&mapped, None);
    // w's two halves adopted where mapped; v's halves and the input (on
    // both devices) copied.
    let copied = vv.len() + 2 * xv.len();
    let (want_mapped, want_copied) = if on_cpu { (wv.len(), copied) } else { (0, wv.len() + copied) };
    assert_eq!((n_mapped as usize, n_copied as usize), (want_mapped, want_copied), "bytes mapped, copied");
    let from_memory = GgufFile::from_bytes(file_bytes.clone(), "w.gguf").unwrap();
    let (outs_mem, n_mapped_mem, _) = run(&from_memory, None);
    assert_eq!(n_mapped_mem, 0);
    assert_eq!(outs, outs_mem, "results of the mapped file vs the file parsed from memory");
    // The products themselves (exact values: any summation order).
    let vals = |ty: GgmlType, b: &[u8]| -> Vec<f64> {
        match ty {
            F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            _ => b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        }
    };
    let (wf, vf, xf) = (vals(F16, &wv), vals(F32, &vv), vals(F32, &xv));
    let xf = &xf;
    let product = |a: &[f64], rows: usize| -> Vec<u8> {
        let p: Vec<f32> = (0..2)
            .flat_map(|c| (0..rows).map(move |r| (0..64).map(|k| a[r * 64 + k] * xf[c * 64 + k]).sum::<f64>() as f32))
            .collect();
        f32_bytes(&p)
    };
    assert_eq!(outs, vec![product(&wf, 6), product(&vf, 3)]);
    // A write to a mapped weight: the next run uses it; the file is unchanged.
    let w2 = exact_values(F16, 64 * 6, &mut rng);
    let (outs2, _, _) = run(&mapped, Some(&w2));
    assert_eq!(outs2[0], product(&vals(F16, &w2), 6), "the written weight");
    assert_eq!(std::fs::read(&path).unwrap(), file_bytes, "the file after a write to its mapped weight");
    assert_eq!(mapped.tensor("w").unwrap().data, &wv[..], "the file's own mapping after the write");
    assert_eq!(run(&mapped, None).0, outs, "a new load of the file after the write");
    let _ = std::fs::remove_dir_all(&dir);
}
