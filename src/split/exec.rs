//! A reference executor for plans on N CPU devices: every node runs on every
//! device over its local slices (a one-node graph on that device's CPU
//! backend), conversions between states are done by [`assemble`] and
//! [`slice_local`] (collectives over plain copies), and distributed per-row
//! ops combine a few values per row on the host. Correctness first: this is
//! the executor the split tests compare against one device; lowering to
//! per-device subgraphs with real collectives replaces it for speed.
//!
//! Local data is kept contiguous in each tensor's logical order; views are
//! materialised per device.

use super::layout::{assemble, local_ne, slice_local};
use super::planner::Plan;
use super::state::SplitState;
use crate::backend::cpu::{CpuBackend, CpuConfig};
use crate::backend::{Backend, TensorStorage};
use crate::error::{Error, Result};
use crate::graph::alloc::GraphAllocator;
use crate::graph::{Context, Graph};
use crate::ops::Op;
use crate::tensor::{contiguous_strides, GgmlType, Tensor, TensorId};
use std::collections::HashMap;

/// N CPU devices that execute plans.
#[derive(Debug)]
pub struct MetaExecutor {
    devices: Vec<CpuBackend>,
}

/// One tensor's data on every device in one state.
#[derive(Clone, Debug)]
struct Dist {
    state: SplitState,
    locals: Vec<Vec<u8>>,
}

impl MetaExecutor {
    /// `n` CPU devices with `threads` worker threads each.
    ///
    /// # Errors
    /// [`Error::Split`] for `n == 0`; backend creation errors.
    pub fn new(n: usize, threads: usize) -> Result<Self> {
        if n == 0 || n > 64 {
            return Err(Error::Split { detail: format!("{n} devices: need 1..=64") });
        }
        let devices = (0..n)
            .map(|_| CpuBackend::new(CpuConfig { n_threads: threads, ..CpuConfig::default() }))
            .collect::<Result<_>>()?;
        Ok(MetaExecutor { devices })
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        self.devices.len()
    }

    /// Runs `plan` for `graph`. `leaf_data(id)` gives each leaf's full
    /// contiguous bytes (ggml layout of its type); each device receives its
    /// slice per the plan. Returns the full contiguous bytes of `outputs`, in
    /// logical element order, exactly what one device would hold.
    ///
    /// # Errors
    /// [`Error::Split`] if the plan is for another device count or graph, a
    /// leaf has no data, or a local computation fails.
    pub fn run(
        &self,
        ctx: &Context,
        graph: &Graph,
        plan: &Plan,
        leaf_data: &dyn Fn(TensorId) -> Option<Vec<u8>>,
        outputs: &[TensorId],
    ) -> Result<Vec<Vec<u8>>> {
        let n = self.devices.len();
        if plan.n_devices != n || plan.graph_hash != graph.hash() {
            return Err(Error::Split { detail: "plan was made for another graph or device count".into() });
        }
        let mut data: HashMap<usize, Vec<Dist>> = HashMap::new();
        for &l in graph.leafs() {
            let t = ctx.tensor(l)?;
            let st = plan.state(l).cloned().unwrap_or(SplitState::Mirrored);
            let full = leaf_data(l).unwrap_or_else(|| vec![0; full_len(t)]);
            let locals = (0..n).map(|j| slice_local(t.ty, t.ne, &full, &st, j)).collect::<Result<_>>()?;
            data.insert(l.index(), vec![Dist { state: st, locals }]);
        }
        for &node in graph.nodes() {
            let t = ctx.t(node).clone();
            let out_state = plan.state(node).cloned().unwrap_or(SplitState::Mirrored);
            let needs = required_inputs(plan, node, &t, &data);
            let mut ins = Vec::with_capacity(t.src.len());
            for (k, &s) in t.src.iter().enumerate() {
                ins.push(in_state(ctx, &mut data, s, &needs[k], n)?);
            }
            let ctx_err = |e: Error| Error::Split {
                detail: format!("{} {} ({}): {e}", t.op.name(), t.describe(), out_state.label()),
            };
            let locals = if let Some(r) = row_combine(ctx, &t, &ins, &out_state, self.devices.len()).map_err(ctx_err)? {
                r
            } else if let Some(r) = vocab_get_rows(ctx, &t, &ins, &out_state, self.devices.len()).map_err(ctx_err)? {
                r
            } else if t.op.is_view_op()
                && !matches!(t.op, Op::Cpy | Op::SetRows)
                && !matches!(out_state, SplitState::Split(_))
            {
                // Mirrored/partial views read their storage owner directly.
                let owner = t.view_src.ok_or_else(|| Error::Split { detail: "view without owner".into() })?;
                let od = in_state(ctx, &mut data, owner, &out_state, n)?;
                let ot = ctx.t(owner).clone();
                (0..n).map(|j| self.local_view(j, &ot, &od.locals[j], &t)).collect::<Result<_>>().map_err(ctx_err)?
            } else {
                (0..n).map(|j| self.local_node(j, ctx, &t, &ins, &out_state)).collect::<Result<_>>().map_err(ctx_err)?
            };
            let dist = Dist { state: out_state.clone(), locals };
            if matches!(t.op, Op::Cpy | Op::SetRows) {
                // The destination now holds what the copy wrote.
                if let Some(owner) = t.view_src {
                    let ot = ctx.t(owner);
                    if ot.ne == t.ne && ot.nb == t.nb && t.view_offs == 0 {
                        data.insert(owner.index(), vec![dist.clone()]);
                    } else {
                        // A write through a view: put the written elements into
                        // the owner's full bytes, which become mirrored.
                        let cur = in_state(ctx, &mut data, owner, &SplitState::Mirrored, n)?;
                        let mut full = cur.locals[0].clone();
                        let res = assemble(t.ty, t.ne, &dist.locals, &dist.state)?;
                        scatter(&mut full, &res, &t).map_err(ctx_err)?;
                        data.insert(owner.index(), vec![Dist { state: SplitState::Mirrored, locals: vec![full; n] }]);
                    }
                }
            }
            data.insert(node.index(), vec![dist]);
        }
        outputs
            .iter()
            .map(|&o| {
                let t = ctx.tensor(o)?;
                let d = data
                    .get(&o.index())
                    .and_then(|v| v.first())
                    .ok_or_else(|| Error::Split { detail: "output not computed".into() })?;
                assemble(t.ty, t.ne, &d.locals, &d.state)
            })
            .collect()
    }

    /// Computes node `t` on device `j` from its inputs' local parts.
    fn local_node(&self, j: usize, ctx: &Context, t: &Tensor, ins: &[Dist], out_state: &SplitState) -> Result<Vec<u8>> {
        let dev = &self.devices[j];
        let mut l = Context::new();
        let mut srcs = Vec::with_capacity(ins.len());
        for (k, d) in ins.iter().enumerate() {
            let st = ctx.t(t.src[k]);
            let id = l.new_tensor(st.ty, &local_ne(st.ne, &d.state, j))?;
            srcs.push(id);
        }
        let ne = local_ne(t.ne, out_state, j);
        let out = match &t.op {
            Op::Reshape => l.push_view(srcs[0], t.ty, ne, contiguous_strides(t.ty, &ne), 0, Op::Reshape, &srcs)?,
            Op::Permute { axes } => {
                let s = l.t(srcs[0]).clone();
                let (mut pne, mut pnb) = (s.ne, s.nb);
                for i in 0..4 {
                    pne[axes[i]] = s.ne[i];
                    pnb[axes[i]] = s.nb[i];
                }
                l.push_view(srcs[0], t.ty, pne, pnb, 0, t.op.clone(), &srcs)?
            }
            Op::Transpose => {
                let s = l.t(srcs[0]).clone();
                let (mut pne, mut pnb) = (s.ne, s.nb);
                pne.swap(0, 1);
                pnb.swap(0, 1);
                l.push_view(srcs[0], t.ty, pne, pnb, 0, Op::Transpose, &srcs)?
            }
            Op::Cpy => l.push_view(srcs[1], t.ty, ne, contiguous_strides(t.ty, &ne), 0, Op::Cpy, &srcs)?,
            Op::SetRows => l.push_view(srcs[2], t.ty, ne, contiguous_strides(t.ty, &ne), 0, Op::SetRows, &srcs)?,
            Op::View => return Err(Error::Split { detail: "a split view is not supported yet".into() }),
            op => l.push_op(t.ty, ne, op.clone(), &srcs)?,
        };
        // Views are materialised so every local part is contiguous.
        let out = if l.t(out).is_contiguous() { out } else { l.push_op(t.ty, ne, Op::Cont, &[out])? };
        let g = l.build_forward(&[out])?;
        let mut st = TensorStorage::new();
        st.alloc_tensors(dev, &l, g.leafs())?;
        for (k, d) in ins.iter().enumerate() {
            st.set_bytes(&l, srcs[k], 0, &d.locals[j])?;
        }
        GraphAllocator::new(dev.buffer_type()).alloc_graph(dev, &l, &g, &mut st)?;
        dev.compute(&l, &g, &st)?;
        let mut bytes = vec![0u8; l.t(out).nbytes()];
        st.get_bytes(&l, out, 0, &mut bytes)?;
        Ok(bytes)
    }

    /// A mirrored/partial view of `owner`'s full data on device `j`, made contiguous.
    fn local_view(&self, j: usize, owner: &Tensor, owner_bytes: &[u8], t: &Tensor) -> Result<Vec<u8>> {
        let dev = &self.devices[j];
        let mut l = Context::new();
        let o = l.new_tensor(owner.ty, &owner.ne)?;
        let v = l.push_view(o, t.ty, t.ne, t.nb, t.view_offs, Op::View, &[o])?;
        let c = l.push_op(t.ty, t.ne, Op::Cont, &[v])?;
        let g = l.build_forward(&[c])?;
        let mut st = TensorStorage::new();
        st.alloc_tensors(dev, &l, g.leafs())?;
        st.set_bytes(&l, o, 0, owner_bytes)?;
        GraphAllocator::new(dev.buffer_type()).alloc_graph(dev, &l, &g, &mut st)?;
        dev.compute(&l, &g, &st)?;
        let mut bytes = vec![0u8; l.t(c).nbytes()];
        st.get_bytes(&l, c, 0, &mut bytes)?;
        Ok(bytes)
    }
}

/// Distributed per-row ops over rows split on axis 0 (and `sum` over any
/// split): each device reduces its part of every row, a few values per row
/// are combined, and the result is formed where the data lives. `None` if
/// `t` is not such a node.
fn row_combine(
    ctx: &Context,
    t: &Tensor,
    ins: &[Dist],
    out_state: &SplitState,
    n: usize,
) -> Result<Option<Vec<Vec<u8>>>> {
    let row_op = matches!(
        t.op,
        Op::RmsNorm { .. }
            | Op::L2Norm { .. }
            | Op::Norm { .. }
            | Op::SoftMax { .. }
            | Op::Argmax
            | Op::TopK { .. }
            | Op::SumRows
            | Op::Mean
            | Op::Sum
    );
    let Some(SplitState::Split(s)) = ins.first().map(|d| &d.state) else { return Ok(None) };
    if !row_op || (s.axis != 0 && !matches!(t.op, Op::Sum)) {
        return Ok(None);
    }
    if matches!(t.op, Op::Sum) {
        let ty = ctx.t(t.src[0]).ty;
        let total: f64 = ins[0].locals.iter().flat_map(|b| floats(b, ty)).map(|v| v as f64).sum();
        let bytes = match t.ty {
            GgmlType::F16 => half::f16::from_f32(total as f32).to_le_bytes().to_vec(),
            GgmlType::BF16 => half::bf16::from_f32(total as f32).to_le_bytes().to_vec(),
            _ => (total as f32).to_le_bytes().to_vec(),
        };
        return Ok(Some(vec![bytes; n]));
    }
    let row_len: Vec<usize> = (0..n).map(|j| s.local_len(j) as usize).collect();
    let ne0_global = s.axis_len() as usize;
    let x: Vec<Vec<f32>> = ins[0].locals.iter().map(|b| f32s(b)).collect();
    let nrows = ctx.t(t.src[0]).nrows().max(0) as usize;
    let row = |j: usize, r: usize| -> &[f32] { &x[j][r * row_len[j]..(r + 1) * row_len[j]] };
    let ranges: Vec<Vec<(i64, i64)>> = (0..n).map(|j| s.ranges(j)).collect();
    // Local position i of device j → global position along the row.
    let global = |j: usize, i: usize| -> i32 {
        let mut i = i as i64;
        for &(a, b) in &ranges[j] {
            if i < b - a {
                return (a + i) as i32;
            }
            i -= b - a;
        }
        -1
    };
    let to_bytes = |v: Vec<Vec<f32>>| -> Vec<Vec<u8>> {
        v.into_iter().map(|d| d.iter().flat_map(|x| x.to_le_bytes()).collect()).collect()
    };
    let out = match &t.op {
        Op::RmsNorm { eps } | Op::L2Norm { eps } => {
            let l2 = matches!(t.op, Op::L2Norm { .. });
            let mut outs: Vec<Vec<f32>> = row_len.iter().map(|&l| Vec::with_capacity(l * nrows)).collect();
            for r in 0..nrows {
                let ss: f64 = (0..n).map(|j| row(j, r).iter().map(|&v| (v * v) as f64).sum::<f64>()).sum();
                let scale = if l2 {
                    1.0 / (ss.sqrt() as f32).max(*eps)
                } else {
                    1.0 / ((ss / ne0_global.max(1) as f64) as f32 + eps).sqrt()
                };
                for (j, o) in outs.iter_mut().enumerate() {
                    o.extend(row(j, r).iter().map(|&v| v * scale));
                }
            }
            to_bytes(outs)
        }
        Op::Norm { eps } => {
            let mut outs: Vec<Vec<f32>> = row_len.iter().map(|&l| Vec::with_capacity(l * nrows)).collect();
            for r in 0..nrows {
                let sum: f64 = (0..n).map(|j| row(j, r).iter().map(|&v| v as f64).sum::<f64>()).sum();
                let mean = (sum / ne0_global.max(1) as f64) as f32;
                let var: f64 =
                    (0..n).map(|j| row(j, r).iter().map(|&v| ((v - mean) * (v - mean)) as f64).sum::<f64>()).sum();
                let scale = 1.0 / ((var / ne0_global.max(1) as f64) as f32 + eps).sqrt();
                for (j, o) in outs.iter_mut().enumerate() {
                    o.extend(row(j, r).iter().map(|&v| (v - mean) * scale));
                }
            }
            to_bytes(outs)
        }
        Op::SoftMax { scale, max_bias } => {
            if *max_bias > 0.0 || ins.len() > 2 {
                return Err(Error::Split {
                    detail: "distributed soft_max supports a 2-D mask without ALiBi or sinks".into(),
                });
            }
            let mask_ty = t.src.get(1).map(|&m| ctx.t(m).ty).unwrap_or(GgmlType::F32);
            let mask: Option<Vec<Vec<f32>>> = ins.get(1).map(|m| m.locals.iter().map(|b| floats(b, mask_ty)).collect());
            let mut outs: Vec<Vec<f32>> = row_len.iter().map(|&l| Vec::with_capacity(l * nrows)).collect();
            let ne1 = (t.ne[1].max(1)) as usize;
            for r in 0..nrows {
                let vals: Vec<Vec<f32>> = (0..n)
                    .map(|j| {
                        row(j, r)
                            .iter()
                            .enumerate()
                            .map(|(i, &v)| {
                                let mv = mask.as_ref().map_or(0.0, |m| m[j][(r % ne1) * row_len[j] + i]);
                                v * scale + mv
                            })
                            .collect()
                    })
                    .collect();
                let gmax = vals.iter().flatten().cloned().fold(f32::NEG_INFINITY, f32::max);
                let sum: f64 = vals.iter().flatten().map(|&v| ((v - gmax).exp()) as f64).sum();
                let inv = (1.0 / sum) as f32;
                for (o, v) in outs.iter_mut().zip(&vals) {
                    o.extend(v.iter().map(|&v| (v - gmax).exp() * inv));
                }
            }
            to_bytes(outs)
        }
        Op::Argmax | Op::TopK { .. } | Op::SumRows | Op::Mean => {
            let mut res: Vec<u8> = Vec::new();
            match &t.op {
                Op::Argmax => {
                    for r in 0..nrows {
                        if (0..n).any(|j| row(j, r).iter().any(|v| v.is_nan())) {
                            // ggml's scan restarts after a NaN: replay it in global order.
                            let mut full = vec![0f32; ne0_global];
                            for j in 0..n {
                                for (i, &v) in row(j, r).iter().enumerate() {
                                    full[global(j, i) as usize] = v;
                                }
                            }
                            let (mut max, mut idx) = (f32::NEG_INFINITY, 0i32);
                            for (i, &v) in full.iter().enumerate() {
                                max = if max > v { max } else { v };
                                if max == v {
                                    idx = i as i32;
                                }
                            }
                            res.extend(idx.to_le_bytes());
                            continue;
                        }
                        let mut best = (f32::NEG_INFINITY, -1i32);
                        for j in 0..n {
                            for (i, &v) in row(j, r).iter().enumerate() {
                                // ggml's argmax keeps the last of equal maxima.
                                let gi = global(j, i);
                                if v > best.0 || (v == best.0 && gi > best.1) {
                                    best = (v, gi);
                                }
                            }
                        }
                        // An empty row gives index 0, as on one device.
                        res.extend(best.1.max(0).to_le_bytes());
                    }
                }
                Op::TopK { k } => {
                    for r in 0..nrows {
                        let mut cands: Vec<(f32, i32)> = Vec::new();
                        for j in 0..n {
                            cands.extend(row(j, r).iter().enumerate().map(|(i, &v)| (v, global(j, i))));
                        }
                        // The single-device order: descending value, ties by lower index.
                        cands.sort_by_key(|&(v, i)| crate::backend::cpu::kernels::reduce::desc_key(v, i as usize));
                        res.extend(cands.iter().take((*k).max(0) as usize).flat_map(|c| c.1.to_le_bytes()));
                    }
                }
                _ => {
                    for r in 0..nrows {
                        let sum: f64 = (0..n).map(|j| row(j, r).iter().map(|&v| v as f64).sum::<f64>()).sum();
                        let v = if matches!(t.op, Op::Mean) { sum / ne0_global as f64 } else { sum };
                        res.extend((v as f32).to_le_bytes());
                    }
                }
            }
            if *out_state != SplitState::Mirrored {
                return Err(Error::Split { detail: format!("{} combine must give a mirrored result", t.op.name()) });
            }
            vec![res; n]
        }
        _ => return Ok(None),
    };
    Ok(Some(out))
}

fn floats(b: &[u8], ty: GgmlType) -> Vec<f32> {
    match ty {
        GgmlType::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        GgmlType::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        _ => f32s(b),
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn full_len(t: &Tensor) -> usize {
    let rows: i64 = t.ne[1..].iter().product();
    t.ty.row_size(t.ne[0]).unwrap_or(0) * rows.max(0) as usize
}

/// The states the chosen strategy reads `node`'s inputs in.
fn required_inputs(plan: &Plan, node: TensorId, t: &Tensor, data: &HashMap<usize, Vec<Dist>>) -> Vec<SplitState> {
    match plan.inputs_of(node) {
        Some(v) if v.len() == t.src.len() => v.to_vec(),
        _ => t
            .src
            .iter()
            .map(|&s| data.get(&s.index()).and_then(|v| v.first()).map_or(SplitState::Mirrored, |d| d.state.clone()))
            .collect(),
    }
}

/// `s`'s data in `state`, converting (assemble, then slice) if needed.
fn in_state(
    ctx: &Context,
    data: &mut HashMap<usize, Vec<Dist>>,
    s: TensorId,
    state: &SplitState,
    n: usize,
) -> Result<Dist> {
    let have =
        data.get(&s.index()).ok_or_else(|| Error::Split { detail: format!("tensor #{} not computed", s.index()) })?;
    if let Some(d) = have.iter().find(|d| d.state == *state) {
        return Ok(d.clone());
    }
    let t = ctx.t(s);
    let src = &have[0];
    let full = assemble(t.ty, t.ne, &src.locals, &src.state)?;
    let locals = (0..n).map(|j| slice_local(t.ty, t.ne, &full, state, j)).collect::<Result<Vec<_>>>()?;
    let d = Dist { state: state.clone(), locals };
    data.entry(s.index()).or_default().push(d.clone());
    Ok(d)
}

/// Vocabulary-parallel `get_rows` (Megatron's embedding): the table is split
/// on its rows (axis 1), indices are mirrored; each device looks up the rows
/// it owns and gives zeros for the others, so the result is a partial sum.
fn vocab_get_rows(
    ctx: &Context,
    t: &Tensor,
    ins: &[Dist],
    out_state: &SplitState,
    n: usize,
) -> Result<Option<Vec<Vec<u8>>>> {
    if !matches!(t.op, Op::GetRows) || *out_state != SplitState::partial() {
        return Ok(None);
    }
    let (Some(SplitState::Split(s)), Some(idx)) = (ins.first().map(|d| &d.state), ins.get(1)) else { return Ok(None) };
    if s.axis != 1 {
        return Ok(None);
    }
    let table = ctx.t(t.src[0]);
    let ity = ctx.t(t.src[1]).ty;
    let ne0 = table.ne[0] as usize;
    let rb = table.ty.row_size(table.ne[0])?;
    let ids: Vec<i64> = match ity {
        GgmlType::I32 => {
            idx.locals[0].chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()
        }
        _ => idx.locals[0].chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
    };
    let mut out = Vec::with_capacity(n);
    for j in 0..n {
        let ranges = s.ranges(j);
        let mut v = vec![0f32; ne0 * ids.len()];
        for (k, &id) in ids.iter().enumerate() {
            let mut base = 0i64;
            for &(a, b) in &ranges {
                if id >= a && id < b {
                    let off = (base + id - a) as usize * rb;
                    let row = ins[0].locals[j]
                        .get(off..off + rb)
                        .ok_or_else(|| Error::Split { detail: "get_rows: local row out of range".into() })?;
                    crate::tensor::quant::dequantize_row(table.ty, row, &mut v[k * ne0..(k + 1) * ne0])?;
                }
                base += b - a;
            }
        }
        out.push(v.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    Ok(Some(out))
}

/// Writes the contiguous elements `res` of view `t` into its owner's bytes
/// `owner` at the view's layout (`view_offs`, `nb`).
fn scatter(owner: &mut [u8], res: &[u8], t: &Tensor) -> Result<()> {
    let ts = t.ty.type_size();
    let rb = t.ty.row_size(t.ne[0])?;
    let oob = || Error::Split { detail: format!("write through a view of {} outside its owner", t.describe()) };
    let mut pos = 0;
    for i3 in 0..t.ne[3].max(0) as usize {
        for i2 in 0..t.ne[2].max(0) as usize {
            for i1 in 0..t.ne[1].max(0) as usize {
                let base = t.view_offs + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
                if t.ty.is_quantized() || t.nb[0] == ts {
                    let src = res.get(pos..pos + rb).ok_or_else(oob)?;
                    owner.get_mut(base..base + rb).ok_or_else(oob)?.copy_from_slice(src);
                    pos += rb;
                } else {
                    for i0 in 0..t.ne[0].max(0) as usize {
                        let o = base + i0 * t.nb[0];
                        let src = res.get(pos..pos + ts).ok_or_else(oob)?;
                        owner.get_mut(o..o + ts).ok_or_else(oob)?.copy_from_slice(src);
                        pos += ts;
                    }
                }
            }
        }
    }
    Ok(())
}
