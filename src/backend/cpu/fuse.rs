//! The one fusion the CPU backend applies to a graph before running it: a
//! recurrent layer's states written where they are kept (the state update
//! in place, a verify batch's snapshots into their caches).
//!
//! A Gated-DeltaNet layer (llama.cpp's graph, and `qwen35`'s) computes
//! `r = gated_delta_net(q, k, v, g, beta, state)` (the output rows, then the
//! final state) and copies the state part of `r` into the cache the state
//! was read from: `cpy(view(r, state part), cache)`. Run as written, every
//! step writes the whole state twice (into `r`, then into the cache). When
//! the copy's destination is exactly the memory of the op's state operand
//! and nothing else touches either in between, the op writes its final
//! state straight back into that memory ([`gated_delta_net_in_place`]) and
//! the copy is skipped: the cache holds the same bytes afterwards, and the
//! state part of `r`, which nothing else reads, is left unwritten.
//!
//! With several snapshots (a verify batch's: slot `i` holds the state after
//! token `T − 1 − i`), the graph copies each slot out whole, into its
//! snapshot cache (`set_rows` at row 0 of a one-row tensor) and the newest
//! also into the state's cache (`cpy`): the op then writes each slot
//! straight into those destinations ([`gated_delta_net_direct`]) and the
//! copies are skipped, when they are the only readers of the result's
//! state part and nothing between the op and a copy touches its
//! destination.
//!
//! [`gated_delta_net_in_place`]: super::kernels::ssm::gated_delta_net_in_place
//! [`gated_delta_net_direct`]: super::kernels::ssm::gated_delta_net_direct

use super::TView;
use crate::error::Result;
use crate::graph::{Context, Graph};
use crate::ops::Op;
use crate::tensor::{contiguous_strides, GgmlType, TensorId};
use std::collections::{HashMap, HashSet};

/// What the fusion changes in one run: the `gated_delta_net` nodes that
/// update their state in place and the `cpy` nodes skipped (node indices).
#[derive(Debug, Default)]
pub(crate) struct Fused {
    /// `gated_delta_net` nodes run by `gated_delta_net_in_place`.
    pub in_place: HashSet<usize>,
    /// The `cpy` and `set_rows` nodes their in-place or direct writes
    /// replace.
    pub skipped: HashSet<usize>,
    /// Several-snapshot `gated_delta_net` nodes run by
    /// `gated_delta_net_direct`: per slot, the copies whose destinations
    /// it writes.
    pub direct: HashMap<usize, Vec<Vec<TensorId>>>,
}

/// One candidate: the op, the copy, the copy's source view, the op's state
/// part (byte range inside the op's result) and the cache bytes (addresses).
struct Candidate {
    gdn: TensorId,
    cpy: TensorId,
    part: (usize, usize),
    cache: (usize, usize),
}

/// Finds the state updates of `graph` that can run in place; `view` gives
/// a tensor's placed memory (as the backend's kernels see it).
///
/// # Errors
/// Those of `view` (a tensor without storage).
pub(crate) fn plan(ctx: &Context, graph: &Graph, view: impl Fn(TensorId) -> Result<TView>) -> Result<Fused> {
    let mut fused = Fused::default();
    let mut cands = Vec::new();
    let mut several = Vec::new();
    for &c in &graph.nodes {
        if let Some(cand) = candidate(ctx, c, &view)? {
            cands.push(cand);
        }
        if matches!(ctx.t(c).op, Op::GatedDeltaNet { k_snapshots } if k_snapshots >= 2) {
            several.push(c);
        }
    }
    if cands.is_empty() && several.is_empty() {
        // A graph without recurrent layers (qwen3's): nothing more to scan.
        return Ok(fused);
    }
    let pos: HashMap<usize, usize> = graph.nodes.iter().enumerate().map(|(i, id)| (id.index(), i)).collect();
    for g in several {
        if let Some(slots) = snapshot_copies(ctx, graph, g, &pos, &view)? {
            fused.skipped.extend(slots.iter().flatten().map(|c| c.index()));
            fused.direct.insert(g.index(), slots);
        }
    }
    for cand in cands {
        let (Some(&ig), Some(&ic)) = (pos.get(&cand.gdn.index()), pos.get(&cand.cpy.index())) else { continue };
        if fused.in_place.contains(&cand.gdn.index()) || !undisturbed(ctx, graph, &cand, (ig, ic), &view)? {
            continue;
        }
        fused.in_place.insert(cand.gdn.index());
        fused.skipped.insert(cand.cpy.index());
    }
    Ok(fused)
}

/// The copies of a several-snapshot `gated_delta_net` `g`'s slots, per
/// slot, when its slot states can go straight into their destinations:
/// the op writes every slot (no more slots than tokens), every node that
/// reads the result's state part is a whole-slot copy (a `cpy`, or a
/// `set_rows` of the one row of a one-row tensor at an index 0 that is a
/// leaf no node writes) into contiguous F32 memory, no output of the graph reaches into the
/// part, the destinations lie apart from each other, from `g`'s result and
/// from its operands (a destination may be exactly the state operand: each
/// task has read its head's state before it writes the head's rows), and
/// no node between `g` and a copy reads or writes that copy's destination.
/// `None` otherwise.
fn snapshot_copies(
    ctx: &Context,
    graph: &Graph,
    g: TensorId,
    pos: &HashMap<usize, usize>,
    view: &impl Fn(TensorId) -> Result<TView>,
) -> Result<Option<Vec<Vec<TensorId>>>> {
    let gt = ctx.t(g);
    let (Op::GatedDeltaNet { k_snapshots }, Some(&st)) = (&gt.op, gt.src.get(5)) else { return Ok(None) };
    let (Ok(k), state_bytes) = (usize::try_from(*k_snapshots), ctx.t(st).nbytes()) else { return Ok(None) };
    let Some(out_bytes) = k.checked_mul(state_bytes).and_then(|b| gt.nbytes().checked_sub(b)) else {
        return Ok(None);
    };
    // Every slot written by the op (slots past the batch's tokens are left
    // to the caller: their copies would copy whatever the result holds).
    let n_tok = gt.src.get(2).map_or(0, |&v| ctx.t(v).ne[2]);
    if state_bytes == 0 || gt.flags.output || *k_snapshots > n_tok {
        return Ok(None);
    }
    let part = (out_bytes, gt.nbytes());
    let overlaps = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
    let f32c = |t: &crate::tensor::Tensor| t.ty == GgmlType::F32 && t.nb == contiguous_strides(t.ty, &t.ne);
    // `x` reaching into the state part (the result itself, or a view of it).
    let reads_part = |x: TensorId| {
        let t = ctx.t(x);
        let off = if x == g { Some(0) } else { (t.view_src == Some(g)).then_some(t.view_offs) };
        off.is_some_and(|o| overlaps((o, o.saturating_add(t.nbytes())), part))
    };
    // The slot `x` is, as a whole-slot contiguous F32 view of the result.
    let slot_of = |x: TensorId| -> Option<usize> {
        let t = ctx.t(x);
        let o = t.view_offs.checked_sub(out_bytes)?;
        (t.view_src == Some(g) && f32c(t) && t.nbytes() == state_bytes && o % state_bytes == 0)
            .then_some(o / state_bytes)
            .filter(|&i| i < k)
    };
    let flagged = graph.nodes.iter().copied().filter(|&x| ctx.t(x).flags.output);
    if graph.outputs.iter().copied().chain(flagged).any(reads_part) {
        return Ok(None);
    }
    let mut slots = vec![Vec::new(); k];
    let mut dests: Vec<(TensorId, (usize, usize))> = Vec::new();
    for &n in &graph.nodes {
        let t = ctx.t(n);
        if t.op.is_shape_only() || !t.src.iter().any(|&s| reads_part(s)) {
            continue;
        }
        let slot = match t.op {
            Op::Cpy if f32c(t) && t.nbytes() == state_bytes => t.src.first().and_then(|&v| slot_of(v)),
            Op::SetRows if f32c(t) && t.nbytes() == state_bytes && t.ne[1] == 1 => {
                let (v, idx) = (t.src.first().copied(), t.src.get(1).copied());
                // The index as the run starts: a leaf that no node of the
                // graph writes (one computed in the graph is not known yet).
                let fixed = |i: TensorId| {
                    ctx.t(i).op.is_leaf()
                        && !graph.nodes.iter().any(|&x| x == i || ctx.t(x).view_src == Some(i))
                        && ctx.t(i).nelements() == 1
                };
                match idx.filter(|&i| fixed(i)) {
                    Some(i) if view(i)?.get_i64(0, 0, 0, 0) == 0 => v.and_then(slot_of),
                    _ => None,
                }
            }
            _ => None,
        };
        let Some(slot) = slot else { return Ok(None) };
        slots[slot].push(n);
        dests.push((n, view(n)?.addr_range()));
    }
    if dests.is_empty() {
        return Ok(None);
    }
    let state = view(st)?.addr_range();
    let mut apart: Vec<(usize, usize)> = vec![view(g)?.addr_range()];
    for &x in gt.src.iter().take(5) {
        apart.push(view(x)?.addr_range());
    }
    let Some(&ig) = pos.get(&g.index()) else { return Ok(None) };
    for (i, &(c, d)) in dests.iter().enumerate() {
        // Exactly the state operand's bytes only when they are laid out as
        // a slot is (contiguous F32: the rows a task writes are its own).
        let clash = apart.iter().any(|&a| overlaps(a, d))
            || (overlaps(d, state) && (d != state || !f32c(ctx.t(st))))
            || dests.iter().enumerate().any(|(j, &(_, e))| j != i && overlaps(d, e));
        let Some(&ic) = pos.get(&c.index()) else { return Ok(None) };
        if clash || ic <= ig {
            return Ok(None);
        }
        for &n in &graph.nodes[ig + 1..ic] {
            let t = ctx.t(n);
            if t.op.is_shape_only() || dests.iter().any(|&(x, _)| x == n) {
                continue;
            }
            for &x in t.src.iter().chain(std::iter::once(&n)) {
                if overlaps(view(x)?.addr_range(), d) {
                    return Ok(None);
                }
            }
        }
    }
    Ok(Some(slots))
}

/// `c` as the copy of a one-snapshot `gated_delta_net`'s whole final state,
/// contiguous F32, into the very memory of its state operand (the op and
/// the view not requested outputs); `None` otherwise.
fn candidate(ctx: &Context, c: TensorId, view: &impl Fn(TensorId) -> Result<TView>) -> Result<Option<Candidate>> {
    let ct = ctx.t(c);
    let (Op::Cpy, Some(&v)) = (&ct.op, ct.src.first()) else { return Ok(None) };
    let vt = ctx.t(v);
    let Some(g) = vt.view_src else { return Ok(None) };
    let gt = ctx.t(g);
    if gt.op != (Op::GatedDeltaNet { k_snapshots: 1 }) || gt.flags.output || vt.flags.output {
        return Ok(None);
    }
    let Some(&st) = gt.src.get(5) else { return Ok(None) };
    let state_bytes = ctx.t(st).nbytes();
    let contiguous_f32 = |t: &crate::tensor::Tensor| t.ty == GgmlType::F32 && t.nb == contiguous_strides(t.ty, &t.ne);
    let (total, out_bytes) = (gt.nbytes(), gt.nbytes().saturating_sub(state_bytes));
    if !contiguous_f32(vt)
        || !contiguous_f32(ct)
        || !contiguous_f32(ctx.t(st))
        || vt.view_offs != out_bytes
        || vt.nbytes() != state_bytes
        || ct.nbytes() != state_bytes
    {
        return Ok(None);
    }
    let cache = view(st)?.addr_range();
    if view(c)?.addr_range() != cache {
        return Ok(None);
    }
    Ok(Some(Candidate { gdn: g, cpy: c, part: (out_bytes, total), cache }))
}

/// True if no operand of the op but its state, and not its result, lies in
/// the cache bytes, nothing but the copy reads the op's state part (no
/// node, no output of the graph), and no node between the op and the copy
/// (positions `ig < ic`) touches the cache bytes.
fn undisturbed(
    ctx: &Context,
    graph: &Graph,
    cand: &Candidate,
    (ig, ic): (usize, usize),
    view: &impl Fn(TensorId) -> Result<TView>,
) -> Result<bool> {
    let overlaps = |a: (usize, usize), b: (usize, usize)| a.0 < b.1 && b.0 < a.1;
    // The op's other operands (q, k, v, g, beta) and its result in memory
    // apart from the cache: in place, each task holds its head's state
    // rows as `&mut` while the others read those operands.
    let gt = ctx.t(cand.gdn);
    for &x in gt.src.iter().take(5).chain(std::iter::once(&cand.gdn)) {
        if overlaps(view(x)?.addr_range(), cand.cache) {
            return Ok(false);
        }
    }
    // A tensor of the op's result (the result or a view of it) reaching
    // into the state part.
    let reads_part = |x: TensorId| {
        let t = ctx.t(x);
        let off = if x == cand.gdn { Some(0) } else { (t.view_src == Some(cand.gdn)).then_some(t.view_offs) };
        off.is_some_and(|o| overlaps((o, o.saturating_add(t.nbytes())), cand.part))
    };
    let flagged = graph.nodes.iter().copied().filter(|&x| ctx.t(x).flags.output);
    if graph.outputs.iter().copied().chain(flagged).any(|x| x != cand.cpy && reads_part(x)) {
        return Ok(false);
    }
    for (i, &n) in graph.nodes.iter().enumerate() {
        let t = ctx.t(n);
        if n == cand.cpy || t.op.is_shape_only() {
            continue;
        }
        if t.src.iter().any(|&s| reads_part(s)) {
            return Ok(false);
        }
        if i > ig && i < ic {
            for &x in t.src.iter().chain(std::iter::once(&n)) {
                if overlaps(view(x)?.addr_range(), cand.cache) {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use crate::backend::cpu::{CpuBackend, CpuStats};
    use crate::backend::{Backend, TensorStorage};
    use crate::{Context, GgmlType, TensorId};

    /// A context, its leafs' values, the cache and the tensors to compute.
    type Update = (Context, Vec<(TensorId, Vec<f32>)>, TensorId, Vec<TensorId>);

    /// `n` values in `[lo, hi)` from the xorshift state `seed`.
    fn values(seed: &mut u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                lo + (hi - lo) * ((*seed >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect()
    }

    /// Every tensor of `ctx` placed on `backend` with the F32 `leafs` set,
    /// and the graph of `outs`.
    fn placed(
        ctx: &Context,
        backend: &CpuBackend,
        outs: &[TensorId],
        leafs: &[(TensorId, Vec<f32>)],
    ) -> (crate::graph::Graph, TensorStorage) {
        let graph = ctx.build_forward(outs).unwrap();
        let mut storage = TensorStorage::new();
        let all: Vec<TensorId> = ctx.ids().collect();
        storage.alloc_tensors(backend, ctx, &all).unwrap();
        for (id, vals) in leafs {
            storage.set_f32(ctx, *id, vals).unwrap();
        }
        (graph, storage)
    }

    /// A one-token state update as llama.cpp writes it (`S = 8`, 3 heads):
    /// the op, its output rows made contiguous, and the copy of its final
    /// state into the cache it read; with `extra` also `scale(state part)`,
    /// another reader of the state part; with `alias` the queries are a
    /// view of the cache's first bytes (an operand in the state's memory).
    fn update(extra: bool, alias: bool) -> Update {
        let (s, h) = (8i64, 3i64);
        let mut ctx = Context::new();
        let mut leafs = Vec::new();
        let mut seed = 5u64;
        let mut leaf = |ctx: &mut Context, ne: [i64; 4], lo: f32, hi: f32| {
            let id = ctx.new_tensor_4d(GgmlType::F32, ne[0], ne[1], ne[2], ne[3]).unwrap();
            leafs.push((id, values(&mut seed, ne.iter().product::<i64>() as usize, lo, hi)));
            id
        };
        let q_leaf = leaf(&mut ctx, [s, h, 1, 1], -0.5, 0.5);
        let k = leaf(&mut ctx, [s, h, 1, 1], -0.5, 0.5);
        let v = leaf(&mut ctx, [s, h, 1, 1], -1.0, 1.0);
        let g = leaf(&mut ctx, [1, h, 1, 1], -1.0, 0.0);
        let beta = leaf(&mut ctx, [1, h, 1, 1], 0.0, 1.0);
        let cache = leaf(&mut ctx, [s * s * h, 1, 1, 1], -1.0, 1.0);
        let st = ctx.reshape_4d(cache, s, s, h, 1).unwrap();
        let q = if alias {
            let (rb, hb) = ((4 * s) as usize, (4 * s * h) as usize);
            ctx.view_4d(cache, s, h, 1, 1, rb, hb, hb, 0).unwrap()
        } else {
            q_leaf
        };
        let r = ctx.gated_delta_net(q, k, v, g, beta, st, 1).unwrap();
        let o = ctx.view_2d(r, s * h, 1, (4 * s * h) as usize, 0).unwrap();
        let o = ctx.cont(o).unwrap();
        let part = ctx.view_2d(r, s * s * h, 1, (4 * s * s * h) as usize, (4 * s * h) as usize).unwrap();
        let mut outs = vec![ctx.cpy(part, cache).unwrap(), o];
        if extra {
            outs.push(ctx.scale(part, 2.0).unwrap());
        }
        (ctx, leafs, cache, outs)
    }

    /// Runs `outs` (with `r` requested too when `keep_r`): the cache and the
    /// output rows afterwards, and the device's stats.
    fn run(extra: bool, keep_r: bool, alias: bool) -> (Vec<f32>, Vec<f32>, CpuStats) {
        let (ctx, leafs, cache, mut outs) = update(extra, alias);
        let o = outs[1];
        if keep_r {
            let r = ctx.t(outs[0]).src[0];
            outs.push(ctx.t(r).view_src.unwrap());
        }
        let backend = CpuBackend::with_threads(2).unwrap();
        let (graph, storage) = placed(&ctx, &backend, &outs, &leafs);
        backend.compute(&ctx, &graph, &storage).unwrap();
        (storage.get_f32(&ctx, cache).unwrap(), storage.get_f32(&ctx, o).unwrap(), backend.stats())
    }

    /// The state update runs in place (no copy) with the bytes of the op
    /// and the copy run apart, which is what happens when something else
    /// reads the state part (the op's result requested, or another node).
    #[test]
    fn a_state_update_runs_in_place_with_the_bytes_of_op_and_copy() {
        let state_bytes = 4 * 8 * 8 * 3;
        let (cache, o, fused) = run(false, false, false);
        assert_eq!(fused, CpuStats { stored_copy_bytes: 0, in_place_state_bytes: state_bytes, fused_copies: 1 });
        for (extra, keep_r) in [(false, true), (true, false)] {
            let (cache2, o2, apart) = run(extra, keep_r, false);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&cache), bits(&cache2), "cache, extra {extra}, r requested {keep_r}");
            assert_eq!(bits(&o), bits(&o2), "output rows, extra {extra}, r requested {keep_r}");
            assert_eq!(
                apart,
                CpuStats { stored_copy_bytes: state_bytes, in_place_state_bytes: 0, fused_copies: 0 },
                "extra {extra}, r requested {keep_r}"
            );
        }
    }

    /// A verify batch's state update as `qwen35` writes it (`S = 8`, 2
    /// heads, 3 tokens, a snapshot per token): each slot copied into its
    /// one-row snapshot tensor (`set_rows` at index 0) and the newest also
    /// into the cache (`cpy`). Fused, the op writes the 4 states where they
    /// are kept and the 4 copies are skipped; the caches, snapshots and
    /// output rows equal, bit for bit, the op and the copies run apart (the
    /// op's result requested); an index other than 0, or one the graph
    /// computes, keeps them apart.
    #[test]
    fn a_verify_batch_writes_its_snapshots_where_they_are_kept() {
        let (s, h, t) = (8i64, 2i64, 3i64);
        let state_bytes = (4 * s * s * h) as u64;
        let run = |keep_r: bool, index: i64, computed: bool| {
            let mut ctx = Context::new();
            let mut seed = 11u64;
            let mut vals = |n: usize, lo: f32, hi: f32| values(&mut seed, n, lo, hi);
            let mut leafs = Vec::new();
            let mut leaf = |ctx: &mut Context, ne: [i64; 4], v: Vec<f32>| {
                let id = ctx.new_tensor_4d(GgmlType::F32, ne[0], ne[1], ne[2], ne[3]).unwrap();
                leafs.push((id, v));
                id
            };
            let n = (s * h * t) as usize;
            let q = leaf(&mut ctx, [s, h, t, 1], vals(n, -0.5, 0.5));
            let k = leaf(&mut ctx, [s, h, t, 1], vals(n, -0.5, 0.5));
            let v = leaf(&mut ctx, [s, h, t, 1], vals(n, -1.0, 1.0));
            let g = leaf(&mut ctx, [1, h, t, 1], vals((h * t) as usize, -1.0, 0.0));
            let beta = leaf(&mut ctx, [1, h, t, 1], vals((h * t) as usize, 0.0, 1.0));
            let cache = leaf(&mut ctx, [s * s * h, 1, 1, 1], vals((s * s * h) as usize, -1.0, 1.0));
            let snaps: Vec<TensorId> =
                (0..t).map(|_| leaf(&mut ctx, [s * s * h, 1, 1, 1], vec![0.0; (s * s * h) as usize])).collect();
            let row0 = ctx.new_tensor(GgmlType::I64, &[1]).unwrap();
            // `computed`: the index is copied into `row0` by the graph itself.
            let given = ctx.new_tensor(GgmlType::I64, &[1]).unwrap();
            let index_node = if computed { ctx.cpy(given, row0).unwrap() } else { row0 };
            let st = ctx.reshape_4d(cache, s, s, h, 1).unwrap();
            let r = ctx.gated_delta_net(q, k, v, g, beta, st, t).unwrap();
            let out_bytes = (4 * s * h * t) as usize;
            let o = ctx.view_2d(r, s * h, t, (4 * s * h) as usize, 0).unwrap();
            let o = ctx.cont(o).unwrap();
            let slot = |ctx: &mut Context, i: i64| {
                let off = out_bytes + (i as u64 * state_bytes) as usize;
                ctx.view_2d(r, s * s * h, 1, state_bytes as usize, off).unwrap()
            };
            let last = slot(&mut ctx, 0);
            let mut outs = vec![ctx.cpy(last, cache).unwrap(), o];
            for i in 0..t {
                let sv = slot(&mut ctx, i);
                outs.push(ctx.set_rows(snaps[(t - 1 - i) as usize], sv, index_node).unwrap());
            }
            if keep_r {
                outs.push(r);
            }
            let backend = CpuBackend::with_threads(2).unwrap();
            let (graph, storage) = placed(&ctx, &backend, &outs, &leafs);
            storage.set_i64(&ctx, row0, &[if computed { 0 } else { index }]).unwrap();
            storage.set_i64(&ctx, given, &[index]).unwrap();
            let done = backend.compute(&ctx, &graph, &storage);
            let bits =
                |id: TensorId| -> Vec<u32> { storage.get_f32(&ctx, id).unwrap().iter().map(|x| x.to_bits()).collect() };
            let kept: Vec<Vec<u32>> =
                std::iter::once(cache).chain(snaps.iter().copied()).chain([o]).map(bits).collect();
            (done.is_ok(), kept, backend.stats())
        };
        let (ok, fused, stats) = run(false, 0, false);
        assert!(ok);
        assert_eq!(stats, CpuStats { stored_copy_bytes: 0, in_place_state_bytes: 4 * state_bytes, fused_copies: 4 });
        let (ok, apart, stats) = run(true, 0, false);
        assert!(ok);
        assert_eq!(stats, CpuStats { stored_copy_bytes: 4 * state_bytes, in_place_state_bytes: 0, fused_copies: 0 });
        assert_eq!(fused, apart, "caches, snapshots and output rows");
        // Every snapshot differs (the state moves every token).
        assert!(fused[1] != fused[2] && fused[2] != fused[3] && fused[3] == fused[0]);
        // Index 1 of a one-row tensor: set_rows' own error, nothing fused;
        // the same when the graph computes the index (the plan sees the 0
        // the input held before the run), and 0 computed is not fused.
        for computed in [false, true] {
            let (ok, _, stats) = run(false, 1, computed);
            assert!(!ok, "computed {computed}");
            assert_eq!(stats.fused_copies, 0, "computed {computed}");
        }
        let (ok, kept, stats) = run(false, 0, true);
        assert!(ok && kept == apart && stats.fused_copies == 0, "{stats:?}");
    }

    /// An operand read from the cache's own bytes (the queries here) keeps
    /// the op and the copy apart: in place, a task would rewrite state rows
    /// that another task still reads as queries. The result equals the op
    /// and the copy run apart by request (the op's result requested).
    #[test]
    fn an_operand_in_the_cache_memory_keeps_op_and_copy_apart() {
        let state_bytes = 4 * 8 * 8 * 3;
        let (cache, o, stats) = run(false, false, true);
        assert_eq!(stats, CpuStats { stored_copy_bytes: state_bytes, in_place_state_bytes: 0, fused_copies: 0 });
        let (cache2, o2, _) = run(false, true, true);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&cache), bits(&cache2));
        assert_eq!(bits(&o), bits(&o2));
        // Not the values of the update without the alias: the queries differ.
        assert_ne!(bits(&o), bits(&run(false, false, false).1));
    }
}
