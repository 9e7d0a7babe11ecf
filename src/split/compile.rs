//! Compiling a lowered plan into a [`Program`]: for every device, one local
//! graph over its parts of every tensor, in execution order, in which the
//! collectives are `exchange` nodes (the bytes moved between two local
//! graphs) and everything else — packing a message, summing a reduction,
//! finishing a distributed row op, a vocabulary-parallel lookup, a write
//! into a stored cache — is an ordinary node the device's backend computes.
//!
//! The compiler walks the lowered steps as an executor would walk them with
//! data, but symbolically: it tracks, per global tensor, which local tensors
//! hold it in which states, and emits the local ops that produce a state it
//! lacks. Everything it decides depends only on the plan, so it runs once
//! per plan and the devices then replay the program (`split::exec`).
//!
//! Stored tensors (weights, caches, inputs) are local leafs bound to the
//! store's device buffers; a write (`cpy`, `set_rows`) into a stored cache
//! is a node that writes there in place. Conversions the plan did not
//! contain but the walk needs (a view read again after its owner was
//! written, a written cache returning to its planned state) are compiled
//! the same way and marked unplanned, so their bytes are reported apart.

use super::layout::{box_bytes, boxes, intersect, lens, local_ne, Boxes};
use super::lower::{folds, lower, Step};
use super::planner::Plan;
use super::state::{AxisSplit, DeviceSet, SplitState};
use super::writes::{covers_owner, destination_kept, owner_state_after_write, scratch_copy};
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::ops::distributed::local_pos;
use crate::ops::{Op, RowReduce};
use crate::tensor::{contiguous_strides, GgmlType, Tensor, TensorId};
use std::collections::HashMap;

/// One device's part of a [`Program`]: its local graph, the stages it runs,
/// and where its intermediates live.
#[derive(Debug)]
pub(crate) struct DeviceProgram {
    /// The local context: leafs are stored tensors' parts, nodes the ops.
    pub ctx: Context,
    /// In execution order.
    pub stages: Vec<Stage>,
    /// Every node in execution order (what the allocator planned).
    pub graph: Graph,
    /// Where each intermediate lives: (local tensor, arena chunk, offset).
    pub placements: Vec<(TensorId, usize, usize)>,
    /// Bytes of each arena chunk the placements need.
    pub chunk_sizes: Vec<usize>,
    /// Bytes written into stored tensors by copies the plan did not make
    /// (a written cache returning to its planned state), per run.
    pub writeback_bytes: u64,
}

/// What one message of an exchange sends: `len` bytes at byte `offset` of
/// a local tensor (`None`: nothing to this device).
pub(crate) type Msg = Option<(TensorId, usize, usize)>;

/// An exchange between the devices: what this device sends each device and
/// where in its exchange node it receives what each device sends.
#[derive(Clone, Debug)]
pub(crate) struct Exchange {
    /// The exchange node (the receiving tensor).
    pub node: TensorId,
    /// Per device: what this device sends it.
    pub send: Vec<Msg>,
    /// Per device: where its message lands, `(byte offset, len)` in the node.
    pub recv: Vec<Option<(usize, usize)>>,
    /// The node is zero-filled first (a partial sum's zero addend).
    pub zero: bool,
    /// Not in the plan (a conversion the walk needed): its bytes are
    /// reported apart.
    pub unplanned: bool,
}

/// The stand-in buffer of stored tensors while the allocator plans a
/// program (they are external to it); never read or written.
#[derive(Debug)]
struct NoBuffer;

impl crate::backend::Buffer for NoBuffer {
    fn size(&self) -> usize {
        0
    }
    fn set(&self, _: usize, _: &[u8]) -> Result<()> {
        Err(Error::Split { detail: "a planning stand-in buffer".into() })
    }
    fn get(&self, _: usize, _: &mut [u8]) -> Result<()> {
        Err(Error::Split { detail: "a planning stand-in buffer".into() })
    }
    fn clear(&self, _: u8) {}
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A step of a device's program.
#[derive(Debug)]
pub(crate) enum Stage {
    /// Nodes the backend computes (one call).
    Compute(Graph),
    /// An exchange between the devices (same position on every device).
    Exchange(Exchange),
}

/// A stored tensor the program reads or writes: the state it is bound in
/// and each device's local leaf.
#[derive(Clone, Debug)]
pub(crate) struct Binding {
    /// The global leaf.
    pub tensor: TensorId,
    /// Its planned state (the store holds it so).
    pub state: SplitState,
    /// Per device: the local leaf.
    pub local: Vec<TensorId>,
}

/// A requested output: the state its parts are in and each device's local
/// (contiguous) tensor.
#[derive(Clone, Debug)]
pub(crate) struct Output {
    /// The global tensor.
    pub tensor: TensorId,
    /// The state of the parts.
    pub state: SplitState,
    /// Per device: the local tensor holding its part.
    pub local: Vec<TensorId>,
}

/// A plan compiled for its devices (see the module documentation).
#[derive(Debug)]
pub(crate) struct Program {
    /// Per device (rank order).
    pub devices: Vec<DeviceProgram>,
    /// The stored tensors it binds.
    pub bindings: Vec<Binding>,
    /// The requested outputs, in request order.
    pub outputs: Vec<Output>,
    /// Stored tensors the program writes (their parts change in place).
    pub written: Vec<TensorId>,
    /// Exchanges per device (the same on every device).
    pub n_exchanges: usize,
    /// Local graphs per device (compute stages).
    pub n_subgraphs: usize,
}

impl Program {
    /// Compiles `plan` for `graph` of `ctx`, with `outputs` requested, for
    /// devices whose buffers align offsets to `alignment[j]` bytes and hold at
    /// most `max_size[j]` bytes.
    ///
    /// # Errors
    /// [`Error::Split`] if the plan is for another graph, a state does not
    /// fit its tensor, or a local op cannot be built (naming the node);
    /// allocator errors.
    pub(crate) fn compile(
        ctx: &Context,
        graph: &Graph,
        plan: &Plan,
        outputs: &[TensorId],
        buffer_types: &[crate::backend::BufferType],
    ) -> Result<Program> {
        let n = plan.n_devices;
        if buffer_types.len() != n {
            return Err(Error::Split { detail: format!("a plan for {n} devices compiled for {}", buffer_types.len()) });
        }
        for &o in outputs {
            ctx.tensor(o)?;
            if !graph.contains(o) {
                return Err(Error::Split { detail: format!("output #{} is not in the graph", o.index()) });
            }
        }
        let lowered = lower(ctx, graph, plan)?;
        let mut devices = Vec::with_capacity(n);
        let mut bindings: Vec<Binding> = Vec::new();
        let mut outs: Vec<Output> = Vec::new();
        let mut written = Vec::new();
        let mut n_exchanges = 0;
        let mut n_subgraphs = 0;
        for (j, bt) in buffer_types.iter().enumerate() {
            let mut c = Compiler::new(ctx, graph, plan, j, n);
            c.run(&lowered.steps)?;
            let out_locals = c.finish_outputs(outputs)?;
            let writeback_bytes = c.write_back()?;
            if j == 0 {
                bindings = c
                    .leafs
                    .iter()
                    .map(|(g, st, _)| Binding { tensor: *g, state: st.clone(), local: Vec::new() })
                    .collect();
                outs = out_locals
                    .iter()
                    .map(|(g, st, _)| Output { tensor: *g, state: st.clone(), local: Vec::new() })
                    .collect();
                written = c.written.clone();
            }
            if c.leafs.len() != bindings.len() || out_locals.len() != outs.len() {
                return Err(Error::Split { detail: format!("device {j} compiled a different program") });
            }
            for (b, (_, _, lid)) in bindings.iter_mut().zip(&c.leafs) {
                b.local.push(*lid);
            }
            for (o, (_, st, lid)) in outs.iter_mut().zip(&out_locals) {
                if *st != o.state {
                    return Err(Error::Split {
                        detail: format!(
                            "device {j} holds output #{} as {st:?}, device 0 as {:?}",
                            o.tensor.index(),
                            o.state
                        ),
                    });
                }
                o.local.push(*lid);
            }
            let pinned: Vec<TensorId> = out_locals.iter().map(|o| o.2).collect();
            let d = c.into_device(pinned, bt, writeback_bytes)?;
            n_exchanges = d.stages.iter().filter(|s| matches!(s, Stage::Exchange(_))).count();
            n_subgraphs = d.stages.iter().filter(|s| matches!(s, Stage::Compute(_))).count();
            devices.push(d);
        }
        Ok(Program { devices, bindings, outputs: outs, written, n_exchanges, n_subgraphs })
    }

    /// Per device: bytes of the intermediates (the arena the program needs).
    pub(crate) fn compute_bytes(&self) -> Vec<u64> {
        self.devices.iter().map(|d| d.chunk_sizes.iter().map(|&s| s as u64).sum()).collect()
    }
}

/// The symbolic walk of one device (see the module documentation).
struct Compiler<'a> {
    ctx: &'a Context,
    graph: &'a Graph,
    plan: &'a Plan,
    j: usize,
    n: usize,
    l: Context,
    /// Per global tensor: the local tensors holding it, by state, the first current.
    data: HashMap<usize, Vec<(SplitState, TensorId)>>,
    /// Stored tensors bound: (global, state, local leaf).
    leafs: Vec<(TensorId, SplitState, TensorId)>,
    /// Exchanges by local node index.
    exchanges: HashMap<usize, Exchange>,
    /// Global owners written through views, in order.
    written: Vec<TensorId>,
    /// Inside a conversion the steps did not ask for.
    fetching: bool,
}

impl<'a> Compiler<'a> {
    fn new(ctx: &'a Context, graph: &'a Graph, plan: &'a Plan, j: usize, n: usize) -> Self {
        Compiler {
            ctx,
            graph,
            plan,
            j,
            n,
            l: Context::new(),
            data: HashMap::new(),
            leafs: Vec::new(),
            exchanges: HashMap::new(),
            written: Vec::new(),
            fetching: false,
        }
    }

    fn state_of(&self, id: TensorId) -> SplitState {
        self.plan.state(id).cloned().unwrap_or(SplitState::Mirrored)
    }

    fn needs(&self, node: TensorId) -> Vec<SplitState> {
        self.plan.inputs_of(node).map(|v| v.to_vec()).unwrap_or_default()
    }

    /// Adds `lid` as `id`'s local tensor in `state` (keeping its other states).
    fn put(&mut self, id: TensorId, state: SplitState, lid: TensorId) {
        let list = self.data.entry(id.index()).or_default();
        list.retain(|(s, _)| *s != state);
        list.push((state, lid));
    }

    /// Makes `lid` `id`'s only local tensor (a new value).
    fn set(&mut self, id: TensorId, state: SplitState, lid: TensorId) {
        self.data.insert(id.index(), vec![(state, lid)]);
    }

    fn get(&self, id: TensorId, state: &SplitState) -> Option<TensorId> {
        self.data.get(&id.index())?.iter().find(|(s, _)| s == state).map(|(_, l)| *l)
    }

    fn current(&self, id: TensorId) -> Result<(SplitState, TensorId)> {
        self.data.get(&id.index()).and_then(|v| v.first().cloned()).ok_or_else(|| Error::Split {
            detail: format!("tensor #{} is read before it is computed on device {}", id.index(), self.j),
        })
    }

    /// Walks the lowered steps.
    fn run(&mut self, steps: &[Step]) -> Result<()> {
        let ctx = self.ctx;
        // Every stored tensor starts as a local leaf bound in its planned state.
        for &g in self.graph.leafs() {
            let t = ctx.t(g);
            // Views share their owner's part; a scratch destination is not
            // stored (its copy writes a fresh intermediate).
            if t.view_src.is_some() || t.flags.scratch {
                continue;
            }
            let st = self.state_of(g);
            let lid = self.l.new_tensor(t.ty, &local_ne(t.ne, &st, self.j))?;
            if !t.name.is_empty() {
                self.l.set_name(lid, &t.name)?;
            }
            self.leafs.push((g, st.clone(), lid));
            self.put(g, st, lid);
        }
        for step in steps {
            match step {
                Step::Compute(nodes) => {
                    for &node in nodes {
                        self.node(node)?;
                    }
                }
                Step::Convert { tensor, from, to, .. } => self.convert(*tensor, from, to)?,
                // One device holds whole rows and the whole table: the plain op.
                Step::RowCombine(node) | Step::VocabGetRows(node) if self.n == 1 => self.node(*node)?,
                Step::RowCombine(node) => self.row_combine(*node)?,
                Step::VocabGetRows(node) => self.vocab_get_rows(*node)?,
                Step::Write(node) => {
                    if let Some(o) = self.write(*node)? {
                        if self.graph.leafs().contains(&o) && !self.written.contains(&o) {
                            self.written.push(o);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `id` in `state`, converting now (marked unplanned) if no step did. A
    /// view whose owner was written since it was computed is read again from
    /// the owner, as one device reads its memory.
    fn fetch(&mut self, id: TensorId, state: &SplitState) -> Result<TensorId> {
        if let Some(l) = self.get(id, state) {
            return Ok(l);
        }
        let outer = std::mem::replace(&mut self.fetching, true);
        let r = (|| {
            if !self.data.contains_key(&id.index()) {
                if let Some(owner) = self.ctx.t(id).view_src {
                    // A view of a written owner is that owner's memory now:
                    // a view computed again from its parent, in its planned
                    // state (nothing moves when the owner was written in that
                    // state), else the owner read whole.
                    if self.ctx.t(id).op.is_shape_only() && self.plan.state(id).is_some() {
                        self.node(id)?;
                    }
                    if !self.data.contains_key(&id.index()) {
                        self.reread_view(id, owner)?;
                    }
                }
            }
            if let Some(l) = self.get(id, state) {
                return Ok(l);
            }
            let (from, _) = self.current(id)?;
            self.convert(id, &from, state)?;
            self.get(id, state).ok_or_else(|| Error::Split { detail: "conversion".into() })
        })();
        self.fetching = outer;
        r
    }

    /// View `id` of `owner` read again from the owner's current data (mirrored).
    fn reread_view(&mut self, id: TensorId, owner: TensorId) -> Result<()> {
        let t = self.ctx.t(id).clone();
        let o = self.fetch(owner, &SplitState::Mirrored)?;
        let o = self.contiguous(o)?;
        let v = self.l.push_view(o, t.ty, t.ne, t.nb, t.view_offs, Op::View, &[o])?;
        let c = self.l.push_op(t.ty, t.ne, Op::Cont, &[v])?;
        self.put(id, SplitState::Mirrored, c);
        Ok(())
    }

    /// Drops what this device holds of views of `owner` (other than the
    /// writer `writer`): one device would read them from the owner's memory,
    /// which `writer` just changed. A local view of `part` (the owner's
    /// local storage, written in place) reads that memory itself and is
    /// kept; a copy made of it is not. Where this device's part is empty
    /// (a split held by the others), its empty views are kept as the other
    /// devices keep their views of their parts: every device then holds
    /// such a view in the same state, as the executor requires of an
    /// output and an exchange of every member.
    fn invalidate_views_of(&mut self, owner: TensorId, writer: TensorId, part: Option<TensorId>) {
        let (ctx, l) = (self.ctx, &self.l);
        let aliases = |lid: TensorId| {
            part.is_some_and(|p| {
                lid == p || l.t(lid).view_src == Some(p) || (l.t(p).nelements() == 0 && l.t(lid).nelements() == 0)
            })
        };
        self.data.retain(|&i, held| {
            let id = TensorId { ctx: ctx.id(), idx: i as u32 };
            if i == writer.index() || i == owner.index() || ctx.t(id).view_src != Some(owner) {
                return true;
            }
            held.retain(|&(_, lid)| aliases(lid));
            !held.is_empty()
        });
    }

    /// `lid`, or a contiguous copy of it.
    fn contiguous(&mut self, lid: TensorId) -> Result<TensorId> {
        contiguous(&mut self.l, lid)
    }

    /// A new local tensor written by the nodes that follow (no data moves).
    fn fresh(&mut self, ty: GgmlType, ne: [i64; 4]) -> Result<TensorId> {
        let id = self.l.exchange(ty, ne, &[])?;
        Ok(id)
    }

    /// An exchange node of type `ty` and shape `ne` receiving `recv` and
    /// sending `send` (messages of local tensors), read after the tensors in
    /// `srcs` exist.
    fn exchange(
        &mut self,
        ty: GgmlType,
        ne: [i64; 4],
        msgs: Vec<Msg>,
        recv: Vec<Option<(usize, usize)>>,
    ) -> Result<TensorId> {
        let srcs: Vec<TensorId> = msgs.iter().filter_map(|m| m.as_ref().map(|m| m.0)).collect();
        let mut uniq = Vec::new();
        for s in srcs {
            if !uniq.contains(&s) {
                uniq.push(s);
            }
        }
        let id = self.l.exchange(ty, ne, &uniq)?;
        self.exchanges
            .insert(id.index(), Exchange { node: id, send: msgs, recv, zero: false, unplanned: self.fetching });
        Ok(id)
    }

    /// Converts `id` from `from` to `to`.
    fn convert(&mut self, id: TensorId, from: &SplitState, to: &SplitState) -> Result<()> {
        if matches!((from, to), (SplitState::Unknown, _) | (_, SplitState::Unknown)) {
            return Err(Error::Split { detail: format!("conversion of #{} with an Unknown state", id.index()) });
        }
        let t = self.ctx.t(id).clone();
        let x = self.fetch(id, from)?;
        let y = self.transform(t.ty, t.ne, x, from, to)?;
        self.put(id, to.clone(), y);
        Ok(())
    }

    /// This device's part under `to` of a `ty` tensor of shape `ne` whose
    /// part under `from` is `x`.
    fn transform(
        &mut self,
        ty: GgmlType,
        ne: [i64; 4],
        x: TensorId,
        from: &SplitState,
        to: &SplitState,
    ) -> Result<TensorId> {
        let all = DeviceSet::all(self.n);
        let mirrored_form = |s: &SplitState| match s {
            SplitState::PartialOn(g, _) => SplitState::MirroredOn(*g),
            _ => SplitState::Mirrored,
        };
        Ok(match (from, to) {
            // On one device every state holds the whole tensor in one layout
            // (a split of one extent, a sum of one addend): nothing to do.
            _ if self.n == 1 => x,
            (a, b) if a == b => x,
            (SplitState::Mirrored, SplitState::Split(s)) => local_slice(&mut self.l, x, s, self.j)?,
            // The group's members keep their copies, the others drop theirs.
            (SplitState::Mirrored, SplitState::MirroredOn(_)) => self.restrict(ty, ne, x, to)?,
            (SplitState::Mirrored, SplitState::Partial(_)) => self.held_by_first(x, to)?,
            (SplitState::Mirrored, SplitState::PartialOn(..)) => {
                let m = self.restrict(ty, ne, x, to)?;
                self.held_by_first(m, to)?
            }
            (SplitState::MirroredOn(g), SplitState::PartialOn(h, _)) if h.subset_of(*g) => {
                let m = self.restrict(ty, ne, x, to)?;
                self.held_by_first(m, to)?
            }
            (SplitState::Partial(_), SplitState::Mirrored) => self.all_reduce(all, ty, ne, x)?,
            (SplitState::Partial(_), SplitState::Split(_)) => self.reduce_scatter(all, ty, ne, to, x)?,
            (SplitState::PartialOn(g, _), SplitState::MirroredOn(h)) if g == h => self.all_reduce(*g, ty, ne, x)?,
            (SplitState::PartialOn(g, _), SplitState::Split(_)) if to.holders(self.n).subset_of(*g) => {
                self.reduce_scatter(*g, ty, ne, to, x)?
            }
            // Reduced where the addends are, then taken on from the value.
            (SplitState::Partial(_) | SplitState::PartialOn(..), _) => {
                let (g, on) = match from {
                    SplitState::PartialOn(g, _) => (*g, SplitState::MirroredOn(*g)),
                    _ => (all, SplitState::Mirrored),
                };
                let m = self.all_reduce(g, ty, ne, x)?;
                self.transform(ty, ne, m, &on, to)?
            }
            (SplitState::Split(_) | SplitState::MirroredOn(_), SplitState::Partial(_) | SplitState::PartialOn(..)) => {
                // Gathered, then held by the first holder (the cost model's all-gather).
                let via = mirrored_form(to);
                let m = self.redistribute(ty, ne, from, &via, x)?;
                self.held_by_first(m, to)?
            }
            _ => self.redistribute(ty, ne, from, to, x)?,
        })
    }

    /// A value this device holds (`x`, mirrored) as its part under `to`, a
    /// state on a group: `x` on a member, an empty part elsewhere.
    fn restrict(&mut self, ty: GgmlType, ne: [i64; 4], x: TensorId, to: &SplitState) -> Result<TensorId> {
        if to.outside(self.j) {
            return self.fresh(ty, local_ne(ne, to, self.j));
        }
        Ok(x)
    }

    /// A mirrored tensor as a partial sum (on every device, or on a group):
    /// the first holder keeps it, the others hold zeros (a local fill where
    /// the type has one, F32 and F16 as [`folds`] says; otherwise a
    /// zero-filled exchange node with no messages); a device outside the
    /// group keeps its empty part.
    fn held_by_first(&mut self, x: TensorId, to: &SplitState) -> Result<TensorId> {
        let first = to.holders(self.n).iter().next().unwrap_or(0);
        if self.j == first || to.outside(self.j) {
            return Ok(x);
        }
        let t = self.l.t(x).clone();
        if folds(&SplitState::Mirrored, to, t.ty) {
            return self.l.push_op(t.ty, t.ne, Op::Fill { c: 0.0 }, &[x]);
        }
        let z = self.l.exchange(t.ty, t.ne, &[])?;
        let (send, recv) = (vec![None; self.n], vec![None; self.n]);
        self.exchanges.insert(z.index(), Exchange { node: z, send, recv, zero: true, unplanned: false });
        Ok(z)
    }

    /// The local pieces of `region` in a buffer laid out as `layout` (per
    /// axis, the ranges in the region and their positions in the buffer).
    fn pieces(region: &Boxes, layout: &Boxes) -> Option<Vec<[(i64, i64, i64); 4]>> {
        // (start in layout, start in region, len) per axis and range.
        let per_axis: Vec<Vec<(i64, i64, i64)>> = (0..4)
            .map(|k| {
                let mut at = 0;
                region[k]
                    .iter()
                    .map(|&(s, e)| {
                        let p = (local_pos(&layout[k], s).unwrap_or(-1), at, e - s);
                        at += e - s;
                        p
                    })
                    .collect()
            })
            .collect();
        if per_axis.iter().flatten().any(|p| p.0 < 0) {
            return None;
        }
        let mut out = Vec::new();
        for &a3 in &per_axis[3] {
            for &a2 in &per_axis[2] {
                for &a1 in &per_axis[1] {
                    for &a0 in &per_axis[0] {
                        out.push([a0, a1, a2, a3]);
                    }
                }
            }
        }
        Some(out)
    }

    /// A view of local tensor `t` (contiguous, of type `ty`) at element
    /// offsets `at` with extents `ne`.
    fn sub_view(&mut self, t: TensorId, at: [i64; 4], ne: [i64; 4]) -> Result<TensorId> {
        let tt = self.l.t(t).clone();
        let bs = tt.ty.block_size() as i64;
        let offs: usize = if ne.contains(&0) {
            0
        } else {
            (0..4).map(|k| (at[k] / if k == 0 { bs } else { 1 }) as usize * tt.nb[k]).sum()
        };
        self.l.push_view(t, tt.ty, ne, tt.nb, offs, Op::View, &[t])
    }

    /// Copies `region` from `src` (laid out as `src_layout`) into `dst` (laid
    /// out as `dst_layout`) with `cpy` nodes, piece by piece.
    fn copy_region(
        &mut self,
        region: &Boxes,
        src: TensorId,
        src_layout: &Boxes,
        dst: TensorId,
        dst_layout: &Boxes,
    ) -> Result<()> {
        let bad = || Error::Split { detail: "a collective's region lies outside its tensor".into() };
        let sp = Self::pieces(region, src_layout).ok_or_else(bad)?;
        let dp = Self::pieces(region, dst_layout).ok_or_else(bad)?;
        for (s, d) in sp.iter().zip(&dp) {
            let ne = [s[0].2, s[1].2, s[2].2, s[3].2];
            if ne.contains(&0) {
                continue;
            }
            let vs = self.sub_view(src, [s[0].0, s[1].0, s[2].0, s[3].0], ne)?;
            let vd = self.sub_view(dst, [d[0].0, d[1].0, d[2].0, d[3].0], ne)?;
            self.l.cpy(vs, vd)?;
        }
        Ok(())
    }

    /// A message holding `region` of `x` (laid out as `layout`): a slice of
    /// `x` where the region is one run of its bytes, else a packed copy.
    fn message(
        &mut self,
        ty: GgmlType,
        region: &Boxes,
        x: TensorId,
        layout: &Boxes,
    ) -> Result<Option<(TensorId, usize, usize)>> {
        let bytes = box_bytes(ty, region);
        if bytes == 0 {
            return Ok(None);
        }
        if let Some((off, len)) = contiguous_span(ty, region, layout) {
            return Ok(Some((x, off, len)));
        }
        let m = self.fresh(ty, lens(region))?;
        self.copy_region(region, x, layout, m, region)?;
        Ok(Some((m, 0, bytes)))
    }

    /// [`Comm`](super::Comm)-level redistribution of a split or mirrored
    /// tensor: this device sends each other device what it lacks of its new
    /// part and assembles its own new part from what it holds and receives.
    fn redistribute(
        &mut self,
        ty: GgmlType,
        ne: [i64; 4],
        from: &SplitState,
        to: &SplitState,
        x: TensorId,
    ) -> Result<TensorId> {
        let (j, n) = (self.j, self.n);
        for s in [from, to] {
            if s.is_partial() || *s == SplitState::Unknown {
                return Err(Error::Split { detail: format!("redistribute cannot move a {} tensor", s.label()) });
            }
        }
        let have = boxes(ne, from, j);
        let need = boxes(ne, to, j);
        // Nothing moves between any two devices (a device with a zero
        // extent in both states): every device decides the same, no exchange.
        let quiet = (0..n).all(|a| (0..n).all(|b| a == b || box_bytes(ty, &owed(ne, from, to, a, b)) == 0));
        if (quiet || *from == SplitState::Mirrored) && have == need {
            return Ok(x);
        }
        let x = self.contiguous(x)?;
        if self.l.t(x).nbytes() != box_bytes(ty, &have) {
            return Err(Error::Split {
                detail: format!("device {j}: a part of {} bytes for {}", self.l.t(x).nbytes(), from.label()),
            });
        }
        let own = intersect(&have, &need);
        if *from == SplitState::Mirrored || quiet {
            // A local slice.
            let y = self.fresh(ty, lens(&need))?;
            self.copy_region(&own, x, &have, y, &need)?;
            return Ok(y);
        }
        let mut msgs: Vec<Msg> = vec![None; n];
        for (i, m) in msgs.iter_mut().enumerate() {
            if i != j {
                *m = self.message(ty, &owed(ne, from, to, j, i), x, &have)?;
            }
        }
        // Messages land in the new part directly where their region is one
        // run of it, else in a receive area unpacked by copies.
        let regions: Vec<Boxes> = (0..n).map(|i| owed(ne, from, to, i, j)).collect();
        let direct = (0..n)
            .all(|i| i == j || box_bytes(ty, &regions[i]) == 0 || contiguous_span(ty, &regions[i], &need).is_some());
        if direct {
            let recv = (0..n)
                .map(|i| if i == j { None } else { contiguous_span(ty, &regions[i], &need).filter(|s| s.1 > 0) })
                .collect();
            let y = self.exchange(ty, lens(&need), msgs, recv)?;
            self.copy_region(&own, x, &have, y, &need)?;
            return Ok(y);
        }
        let (recv, at) = packed_recv(n, j, |i| box_bytes(ty, &regions[i]));
        let area = self.exchange(GgmlType::I8, [at as i64, 1, 1, 1], msgs, recv.clone())?;
        let y = self.fresh(ty, lens(&need))?;
        self.copy_region(&own, x, &have, y, &need)?;
        for i in 0..n {
            if let Some((off, _)) = recv[i] {
                let r = &regions[i];
                let rn = lens(r);
                let msg = self.l.push_view(area, ty, rn, contiguous_strides(ty, &rn), off, Op::View, &[area])?;
                self.copy_region(r, msg, r, y, &need)?;
            }
        }
        Ok(y)
    }

    /// Reduce-scatter of a partial sum `x` (full shape) over the devices of
    /// `members` (every device, or a group) into this device's part under
    /// `to` (whose parts lie on members only): each member sends every
    /// other member that one's part of its addend (`(M−1)·B` bytes in all)
    /// and sums what it receives with its own, in device order after its
    /// own addend. A device outside `members` takes part in the exchange
    /// with nothing to send or receive.
    fn reduce_scatter(
        &mut self,
        members: DeviceSet,
        ty: GgmlType,
        ne: [i64; 4],
        to: &SplitState,
        x: TensorId,
    ) -> Result<TensorId> {
        let (j, n) = (self.j, self.n);
        if !members.contains(j) {
            self.exchange(GgmlType::I8, [0, 1, 1, 1], vec![None; n], vec![None; n])?;
            return self.fresh(ty, local_ne(ne, to, j));
        }
        let full = boxes(ne, &SplitState::Mirrored, 0);
        let x = self.contiguous(x)?;
        let mine = boxes(ne, to, j);
        let mut msgs: Vec<Msg> = vec![None; n];
        for (i, m) in msgs.iter_mut().enumerate() {
            if i != j && members.contains(i) {
                *m = self.message(ty, &boxes(ne, to, i), x, &full)?;
            }
        }
        let b = box_bytes(ty, &mine);
        let own = match contiguous_span(ty, &mine, &full) {
            Some((off, _)) => {
                self.l.push_view(x, ty, lens(&mine), contiguous_strides(ty, &lens(&mine)), off, Op::View, &[x])?
            }
            None => {
                let o = self.fresh(ty, lens(&mine))?;
                self.copy_region(&mine, x, &full, o, &mine)?;
                o
            }
        };
        // Every device takes part in the exchange, also one whose part is empty.
        let (recv, at) = packed_recv(n, j, |i| if members.contains(i) { b } else { 0 });
        let area = self.exchange(GgmlType::I8, [at as i64, 1, 1, 1], msgs, recv.clone())?;
        let mn = lens(&mine);
        // This device's own addend first, then the others in device order.
        let mut addends = vec![self.contiguous(own)?];
        for (off, _) in recv.into_iter().flatten() {
            addends.push(self.l.push_view(area, ty, mn, contiguous_strides(ty, &mn), off, Op::View, &[area])?);
        }
        self.l.add_n(&addends)
    }

    /// All-reduce of a partial sum `x` over the devices of `members` (every
    /// device, or a group). Two members: one-shot (each sends its whole
    /// addend to the other and both add them, `2 B` bytes in one exchange);
    /// more: two-shot, a reduce-scatter over M near-equal element ranges,
    /// then an all-gather (`2 (M−1) B` bytes in two exchanges). Both give
    /// every member the same bits (two addends: `a + b` is `b + a`; the
    /// two-shot sums each range once). A device outside `members` takes
    /// part in the same exchanges with nothing to send and keeps an empty
    /// part.
    fn all_reduce(&mut self, members: DeviceSet, ty: GgmlType, ne: [i64; 4], x: TensorId) -> Result<TensorId> {
        let (j, n) = (self.j, self.n);
        let total: i64 = ne.iter().product();
        if total == 0 {
            return Ok(x);
        }
        let m = members.len();
        if !members.contains(j) {
            for _ in 0..if m == 2 { 1 } else { 2 } {
                self.exchange(GgmlType::I8, [0, 1, 1, 1], vec![None; n], vec![None; n])?;
            }
            return self.fresh(ty, [ne[0], ne[1], ne[2], 0]);
        }
        let x = self.contiguous(x)?;
        if m == 2 {
            let b = self.l.t(x).nbytes();
            let other = members.iter().find(|&i| i != j).unwrap_or(j);
            let mut msgs: Vec<Msg> = vec![None; n];
            msgs[other] = Some((x, 0, b));
            let mut recv = vec![None; n];
            recv[other] = Some((0, b));
            let theirs = self.exchange(ty, ne, msgs, recv)?;
            // In device order on both devices.
            let addends = if j < other { [x, theirs] } else { [theirs, x] };
            return self.l.add_n(&addends);
        }
        let flat = [total, 1, 1, 1];
        // M near-equal ranges, one per member, none for the other devices.
        let mut ext = vec![0i64; n];
        for (r, d) in members.iter().enumerate() {
            let (r, mm) = (r as i64, m as i64);
            ext[d] = total * (r + 1) / mm - total * r / mm;
        }
        let chunks = SplitState::split(0, ext);
        let xf = self.l.push_view(x, ty, flat, contiguous_strides(ty, &flat), 0, Op::Reshape, &[x])?;
        let mine = self.reduce_scatter(members, ty, flat, &chunks, xf)?;
        // All-gather: every member sends its summed chunk; chunks land in place.
        let part = |d: usize| boxes(flat, &chunks, d);
        let span = |d: usize| contiguous_span(ty, &part(d), &boxes(flat, &SplitState::Mirrored, 0));
        let mut msgs: Vec<Msg> = vec![None; n];
        let b = box_bytes(ty, &part(j));
        for (i, msg) in msgs.iter_mut().enumerate() {
            if i != j && b > 0 && members.contains(i) {
                *msg = Some((mine, 0, b));
            }
        }
        let recv = (0..n).map(|d| if d == j { None } else { span(d).filter(|s| s.1 > 0) }).collect();
        let y = self.exchange(ty, flat, msgs, recv)?;
        if let Some((off, _)) = span(j).filter(|s| s.1 > 0) {
            let pn = lens(&part(j));
            let v = self.l.push_view(y, ty, pn, contiguous_strides(ty, &pn), off, Op::View, &[y])?;
            self.l.cpy(mine, v)?;
        }
        self.l.push_view(y, ty, ne, contiguous_strides(ty, &ne), 0, Op::Reshape, &[y])
    }

    /// `node`'s sources, each in the state the plan reads it in (`needs`).
    fn fetch_sources(&mut self, node: TensorId, needs: &[SplitState]) -> Result<Vec<TensorId>> {
        let ctx = self.ctx;
        ctx.t(node)
            .src
            .iter()
            .enumerate()
            .map(|(k, &s)| self.fetch(s, needs.get(k).unwrap_or(&SplitState::Mirrored)))
            .collect()
    }

    /// One node of a `Compute` step, over this device's parts.
    fn node(&mut self, node: TensorId) -> Result<()> {
        let ctx = self.ctx;
        let t = ctx.t(node);
        let out_state = self.state_of(node);
        let needs = self.needs(node);
        if t.nelements() == 0 && self.n > 1 {
            // An empty result has no values: nothing to compute or read.
            let lid = self.fresh(t.ty, local_ne(t.ne, &out_state, self.j))?;
            if scratch_copy(ctx, node) {
                self.set(t.src[1], out_state.clone(), lid);
            }
            self.set(node, out_state, lid);
            return Ok(());
        }
        // A copy into a scratch destination (what `cast` makes) writes a
        // fresh intermediate, not the store.
        let srcs = if scratch_copy(ctx, node) {
            let d = ctx.t(t.src[1]);
            let need = needs.get(1).unwrap_or(&out_state);
            let x = self.fetch(t.src[0], needs.first().unwrap_or(&out_state))?;
            vec![x, self.fresh(d.ty, local_ne(d.ne, need, self.j))?]
        } else {
            self.fetch_sources(node, &needs)?
        };
        let parent = t.src.first().map(|&p| ctx.t(p));
        let alone = alone_on(&out_state, &needs, self.n).filter(|_| !super::rules::reads_owner_layout(t, parent));
        let lid = if alone.is_some_and(|h| h != self.j) || !runs_here(&out_state, &needs, self.j) {
            // It runs on another device alone, or on a group without this
            // device: nothing of it is here.
            self.fresh(t.ty, local_ne(t.ne, &out_state, self.j))?
        } else if alone.is_some() {
            // It runs here alone, over whole sources laid out as on one device.
            // (`reads_owner_layout` left out the views whose parent's layout matters.)
            let m = vec![SplitState::Mirrored; srcs.len()];
            local_op(&mut self.l, ctx, t, &srcs, &m, &SplitState::Mirrored, self.j)
                .map_err(|e| node_err(t, &out_state, e))?
        } else if let Some(owner) = view_owner(&self.l, ctx, t, &srcs, &out_state) {
            // A view the parent's local copy cannot express: view the owner's memory.
            let olid = self.fetch(owner, &out_state)?;
            self.l
                .push_view(olid, t.ty, t.ne, t.nb, t.view_offs, Op::View, &[olid])
                .map_err(|e| node_err(t, &out_state, e))?
        } else {
            local_op(&mut self.l, ctx, t, &srcs, &needs, &out_state, self.j).map_err(|e| node_err(t, &out_state, e))?
        };
        // A view of a parent held in another layout (a contiguous copy of a
        // transposed tensor, transposed back) may come out strided where one
        // device's is packed; kernels that need packed rows get packed rows.
        let lt = self.l.t(lid).clone();
        let lid = if t.is_contiguous() && !lt.is_contiguous() {
            self.l.push_op(lt.ty, lt.ne, Op::Cont, &[lid])?
        } else {
            lid
        };
        if scratch_copy(ctx, node) {
            // The scratch destination holds the cast's values (ggml's `cpy`
            // result is a view of its destination): a later view or write
            // through it finds them there.
            self.set(t.src[1], out_state.clone(), lid);
        }
        self.set(node, out_state, lid);
        Ok(())
    }

    /// A write (`cpy`/`set_rows`) on every device: it writes where the
    /// destination's part lives (the store, for a stored cache), and the
    /// owner takes the result.
    fn write(&mut self, node: TensorId) -> Result<Option<TensorId>> {
        let ctx = self.ctx;
        let t = ctx.t(node);
        let out_state = self.state_of(node);
        let needs = self.needs(node);
        if t.nelements() == 0 {
            // An empty write writes nothing; its owner stays as it is.
            let w = self.fresh(t.ty, local_ne(t.ne, &out_state, self.j))?;
            self.set(node, out_state, w);
            return Ok(None);
        }
        let srcs = self.fetch_sources(node, &needs)?;
        let w = match (t.op.clone(), alone_on(&out_state, &needs, self.n)) {
            // Another device writes its whole destination alone.
            (_, Some(h)) if h != self.j => Ok(self.fresh(t.ty, local_ne(t.ne, &out_state, self.j))?),
            // A group without this device writes it.
            _ if !runs_here(&out_state, &needs, self.j) => Ok(self.fresh(t.ty, local_ne(t.ne, &out_state, self.j))?),
            (Op::Cpy, _) => self.l.cpy(srcs[0], srcs[1]),
            (Op::SetRows, _) => self.l.set_rows(srcs[2], srcs[0], srcs[1]),
            _ => return Err(Error::Split { detail: format!("{} is not a write", t.op.name()) }),
        }
        .map_err(|e| node_err(t, &out_state, e))?;
        self.set(node, out_state.clone(), w);
        let Some(owner) = t.view_src else { return Ok(None) };
        let before = if destination_kept(t, &needs, |id| self.plan.state(id).cloned()) {
            Some(self.current(owner)?)
        } else {
            None
        };
        let after =
            owner_state_after_write(ctx, t, &out_state, before.as_ref().map(|b| &b.0)).unwrap_or(SplitState::Mirrored);
        let ot = ctx.t(owner).clone();
        if let Some((b, local)) =
            before.filter(|b| !covers_owner(ctx, t) && b.0 == after && matches!(after, SplitState::Split(_)))
        {
            // A box of the owner on every device, each writing its part in
            // place through its view of the owner's part: the owner stays
            // as it was, and so do the views that read its part's memory.
            let part = self.l.t(local).view_src.unwrap_or(local);
            self.invalidate_views_of(owner, node, Some(part));
            self.set(owner, b, local);
            return Ok(Some(owner));
        }
        self.invalidate_views_of(owner, node, None);
        if covers_owner(ctx, t)
            && (after == out_state
                || ot.ne == t.ne
                || after == SplitState::Mirrored && out_state == SplitState::Mirrored
                || after.sole_holder().is_some() && after.sole_holder() == out_state.sole_holder())
        {
            // The same bytes in the owner's shape.
            let w = self.contiguous(w)?;
            let one = local_ne(ot.ne, &after, self.j);
            let o = if self.l.t(w).ne == one {
                w
            } else {
                self.l.push_view(w, ot.ty, one, contiguous_strides(ot.ty, &one), 0, Op::Reshape, &[w])?
            };
            self.set(owner, after, o);
        } else {
            // A write into part of the owner: its values go into the owner's
            // mirrored copy (where the write did not already put them).
            let wm = self.fetch(node, &SplitState::Mirrored)?;
            let om = self.fetch(owner, &SplitState::Mirrored)?;
            let om = self.contiguous(om)?;
            let v = self
                .l
                .push_view(om, t.ty, t.ne, t.nb, t.view_offs, Op::View, &[om])
                .map_err(|e| node_err(t, &out_state, e))?;
            self.l.cpy(wm, v).map_err(|e| node_err(t, &out_state, e))?;
            self.set(owner, SplitState::Mirrored, om);
        }
        Ok(Some(owner))
    }

    /// A distributed per-row op over rows split on axis 0 (`sum` over any
    /// split): local statistics, an all-gather of them, the local finish.
    fn row_combine(&mut self, node: TensorId) -> Result<()> {
        let ctx = self.ctx;
        let t = ctx.t(node);
        let out_state = self.state_of(node);
        let needs = self.needs(node);
        let Some(SplitState::Split(s)) = needs.first().cloned() else {
            return Err(Error::Split { detail: format!("{}: row combine of an unsplit input", t.op.name()) });
        };
        let srcs: Vec<&Tensor> = t.src.iter().map(|&s| ctx.t(s)).collect();
        let Some(reduce) = RowReduce::of(&t.op, &srcs) else {
            return Err(Error::Split {
                detail: format!(
                    "{} has no distributed row combine (soft_max: a 2-D mask without ALiBi or sinks)",
                    t.op.name()
                ),
            });
        };
        if !reduce.finishes_from_x() && !matches!(out_state, SplitState::Mirrored | SplitState::MirroredOn(_)) {
            return Err(Error::Split { detail: format!("{} combine must give a mirrored result", t.op.name()) });
        }
        // The devices holding part of the rows send their statistics (one
        // slot each, in device order) to the devices holding part of the
        // result: every device for a mirrored result, a group's members for
        // one on a group. Any other device takes part in the exchange with
        // nothing to send, and holds nothing of the result.
        let (j, n) = (self.j, self.n);
        let (senders, receivers) = (needs[0].holders(n), out_state.holders(n));
        // Every device fetches the sources, here: the conversions they take
        // are exchanges, which pair up by their order on every device (a
        // device outside that fetched them later, for another node, paired
        // them with other exchanges: seed 14999119299995926029).
        let x = self.fetch(t.src[0], &needs[0])?;
        let mask = match (reduce, t.src.get(1)) {
            (RowReduce::SoftMax { .. }, Some(&m)) => Some(self.fetch(m, &needs[1])?),
            _ => None,
        };
        if !senders.contains(j) && !receivers.contains(j) {
            self.exchange(GgmlType::I8, [0, 1, 1, 1], vec![None; n], vec![None; n])?;
            let lid = self.fresh(t.ty, local_ne(t.ne, &out_state, j))?;
            self.set(node, out_state, lid);
            return Ok(());
        }
        let members: Vec<usize> = senders.iter().collect();
        let ranges = if reduce == RowReduce::Sum { Vec::new() } else { s.ranges(self.j) };
        // (A device with no rows computes the statistics' shape too.)
        let stats = self.l.row_stats(x, mask, reduce, ranges).map_err(|e| node_err(t, &out_state, e))?;
        let st = self.l.t(stats).clone();
        let bytes = st.nbytes();
        let slot = |i: usize| members.iter().position(|&d| d == i);
        let sends = senders.contains(j) && bytes > 0;
        let msgs: Vec<Msg> =
            (0..n).map(|i| (i != j && sends && receivers.contains(i)).then_some((stats, 0, bytes))).collect();
        let recv = (0..n)
            .map(|i| slot(i).filter(|_| i != j && bytes > 0 && receivers.contains(j)).map(|k| (k * bytes, bytes)))
            .collect();
        let m = members.len();
        let g = self.exchange(GgmlType::F32, [st.ne[0], st.ne[1], m as i64, 1], msgs, recv)?;
        if let Some(me) = slot(j) {
            let own = self.l.push_view(g, GgmlType::F32, st.ne, st.nb, me * bytes, Op::View, &[g])?;
            self.l.cpy(stats, own)?;
        }
        let lens = members.iter().map(|&d| s.local_len(d)).collect();
        let xin = reduce.finishes_from_x().then_some(x);
        let ne = local_ne(t.ne, &out_state, j);
        let y = self.l.row_finish(g, xin, mask, reduce, lens, t.ty, ne).map_err(|e| node_err(t, &out_state, e))?;
        self.set(node, out_state, y);
        Ok(())
    }

    /// Vocabulary-parallel `get_rows` (Megatron's embedding): the table is
    /// split on its rows (axis 1), the ids mirrored; this device looks up
    /// the rows it holds and gives zeros for the others (a partial sum).
    fn vocab_get_rows(&mut self, node: TensorId) -> Result<()> {
        let ctx = self.ctx;
        let t = ctx.t(node);
        let needs = self.needs(node);
        let Some(SplitState::Split(s)) = needs.first().cloned() else {
            return Err(Error::Split { detail: "vocab get_rows without a split table".into() });
        };
        let table = self.fetch(t.src[0], &needs[0])?;
        let ids = self.fetch(t.src[1], &SplitState::Mirrored)?;
        let out_state = self.state_of(node);
        let y = self
            .l
            .get_rows_part(table, ids, s.ranges(self.j), ctx.t(t.src[0]).ne[1])
            .map_err(|e| node_err(t, &out_state, e))?;
        self.set(node, out_state, y);
        Ok(())
    }

    /// The requested outputs: each in its current state, contiguous. A view
    /// whose owner was written after it is read again.
    fn finish_outputs(&mut self, outputs: &[TensorId]) -> Result<Vec<(TensorId, SplitState, TensorId)>> {
        let mut out = Vec::with_capacity(outputs.len());
        for &o in outputs {
            if !self.data.contains_key(&o.index()) {
                let st = self.state_of(o);
                self.fetch(o, &st)?;
            }
            let (st, lid) = self.current(o)?;
            let lid = self.contiguous(lid)?;
            out.push((o, st, lid));
        }
        Ok(out)
    }

    /// Written stored tensors end in their planned state in their store
    /// parts: where the last write did not land there, a copy does (after a
    /// conversion if needed). Returns the bytes those copies write.
    fn write_back(&mut self) -> Result<u64> {
        let mut bytes = 0u64;
        for o in self.written.clone() {
            let Some(&(_, ref st, leaf)) = self.leafs.iter().find(|b| b.0 == o) else { continue };
            let st = st.clone();
            let cur = self.fetch(o, &st)?;
            if self.is_binding(cur, leaf) {
                continue;
            }
            let lt = self.l.t(leaf).clone();
            let src = if self.l.t(cur).ne == lt.ne {
                cur
            } else {
                let c = self.contiguous(cur)?;
                self.l.push_view(c, lt.ty, lt.ne, contiguous_strides(lt.ty, &lt.ne), 0, Op::Reshape, &[c])?
            };
            self.l.cpy(src, leaf)?;
            bytes += lt.nbytes() as u64;
        }
        Ok(bytes)
    }

    /// True if local `lid` is the bytes of bound leaf `leaf`, as laid out there.
    fn is_binding(&self, lid: TensorId, leaf: TensorId) -> bool {
        let (t, lt) = (self.l.t(lid), self.l.t(leaf));
        lid == leaf
            || (t.view_src == Some(leaf)
                && t.view_offs == 0
                && t.is_contiguous()
                && t.nbytes() == lt.nbytes()
                && t.ty == lt.ty)
    }

    /// The device's program: stages split at exchanges, intermediates
    /// planned by the graph allocator for buffers of type `bt`.
    fn into_device(
        self,
        pinned: Vec<TensorId>,
        bt: &crate::backend::BufferType,
        writeback_bytes: u64,
    ) -> Result<DeviceProgram> {
        let Compiler { l, mut exchanges, .. } = self;
        let nodes: Vec<TensorId> = l.ids().filter(|&id| !l.t(id).op.is_leaf()).collect();
        let mut stages = Vec::new();
        let mut seg: Vec<TensorId> = Vec::new();
        for &id in &nodes {
            if l.t(id).op == Op::Exchange {
                if let Some(x) = exchanges.remove(&id.index()) {
                    if !seg.is_empty() {
                        stages.push(Stage::Compute(l.graph_of(std::mem::take(&mut seg), Vec::new())));
                    }
                    stages.push(Stage::Exchange(x));
                }
                continue;
            }
            seg.push(id);
        }
        if !seg.is_empty() {
            stages.push(Stage::Compute(l.graph_of(seg, Vec::new())));
        }
        let graph = l.graph_of(nodes, pinned);
        // Leafs are the store's parts: external to the allocator.
        let mut storage = crate::backend::TensorStorage::new();
        storage.bind_ctx(&l)?;
        let k = storage.add_buffer(std::sync::Arc::new(NoBuffer));
        for id in l.ids().filter(|&id| l.t(id).op.is_leaf()) {
            storage.place(id, k, 0);
        }
        let mut alloc = crate::graph::alloc::GraphAllocator::new(bt.clone());
        let stats = alloc.measure(&l, &graph, &storage)?;
        let placements = alloc.placements().iter().map(|p| (p.tensor, p.buffer, p.offset)).collect();
        Ok(DeviceProgram { ctx: l, stages, graph, placements, chunk_sizes: stats.buffer_sizes, writeback_bytes })
    }
}

/// The elements rank `dst` needs under `to` that rank `src` holds under
/// `from` (for a split `from`, `dst` holds none of them itself).
/// From a tensor mirrored on a group, each device outside it is served by
/// one member ([`DeviceSet::server`]), the others owe it nothing.
fn owed(ne: [i64; 4], from: &SplitState, to: &SplitState, src: usize, dst: usize) -> Boxes {
    if let SplitState::MirroredOn(g) = from {
        if src != dst && g.server(dst) != Some(src) {
            return std::array::from_fn(|_| Vec::new());
        }
    }
    intersect(&boxes(ne, from, src), &boxes(ne, to, dst))
}

/// The byte range `(offset, len)` of `region` in a `ty` buffer laid out as
/// `layout`, when the region is one contiguous run there.
fn contiguous_span(ty: GgmlType, region: &Boxes, layout: &Boxes) -> Option<(usize, usize)> {
    if region.iter().any(|r| r.len() != 1) {
        return None;
    }
    let l = lens(layout);
    let nb = contiguous_strides(ty, &l);
    let e: [i64; 4] = std::array::from_fn(|k| region[k][0].1 - region[k][0].0);
    // Contiguous: below the outermost axis with more than one element, every axis is whole.
    let top = (0..4).rev().find(|&k| e[k] > 1).unwrap_or(0);
    if (0..top).any(|k| e[k] != l[k]) {
        return None;
    }
    let bs = ty.block_size() as i64;
    let mut offset = 0usize;
    for k in 0..4 {
        let p = local_pos(&layout[k], region[k][0].0)?;
        offset += (if k == 0 { p / bs } else { p }) as usize * nb[k];
    }
    Some((offset, box_bytes(ty, region)))
}

/// Device `j`'s part of local mirrored tensor `lid` split as `s`, by local
/// ops (see `lower::folds`): views of its ranges, concatenated, made
/// contiguous.
fn local_slice(l: &mut Context, lid: TensorId, s: &AxisSplit, j: usize) -> Result<TensorId> {
    let t = l.t(lid).clone();
    let a = s.axis;
    if s.ranges(j) == [(0, t.ne[a])] {
        // This device holds the whole axis: its part is the tensor.
        return Ok(lid);
    }
    let bs = if a == 0 { t.ty.block_size() as i64 } else { 1 };
    let mut parts = Vec::new();
    for (x, y) in s.ranges(j) {
        let mut ne = t.ne;
        ne[a] = y - x;
        // An empty tensor has no bytes to offset into.
        let offs = if t.ne.contains(&0) { 0 } else { (x / bs) as usize * t.nb[a] };
        let v = l.push_view(lid, t.ty, ne, t.nb, offs, Op::View, &[lid])?;
        parts.push(l.push_op(t.ty, ne, Op::Cont, &[v])?);
    }
    let Some(mut acc) = parts.first().copied() else {
        let mut ne = t.ne;
        ne[a] = 0;
        return l.push_view(lid, t.ty, ne, contiguous_strides(t.ty, &ne), 0, Op::View, &[lid]);
    };
    for &p in &parts[1..] {
        let mut ne = l.t(acc).ne;
        ne[a] += l.t(p).ne[a];
        acc = l.push_op(t.ty, ne, Op::Concat { dim: a }, &[acc, p])?;
    }
    Ok(acc)
}

/// Local tensor `id`, or a contiguous copy of it.
fn contiguous(l: &mut Context, id: TensorId) -> Result<TensorId> {
    let t = l.t(id);
    if t.is_contiguous() {
        Ok(id)
    } else {
        let (ty, ne) = (t.ty, t.ne);
        l.push_op(ty, ne, Op::Cont, &[id])
    }
}

/// Receive areas packed one after another: for each device `i` but `j`
/// with `bytes(i) > 0`, `(offset, bytes)` in the area; and the area's size.
fn packed_recv(n: usize, j: usize, bytes: impl Fn(usize) -> usize) -> (Vec<Option<(usize, usize)>>, usize) {
    let mut recv = vec![None; n];
    let mut at = 0usize;
    for (i, r) in recv.iter_mut().enumerate() {
        let b = bytes(i);
        if i != j && b > 0 {
            *r = Some((at, b));
            at += b;
        }
    }
    (recv, at)
}

/// For a mirrored/partial `view` whose parent is held here in another
/// layout than one device's (a contiguous copy of a strided parent), or that
/// reaches outside its parent's bytes: the owner to view instead.
fn view_owner(l: &Context, ctx: &Context, t: &Tensor, srcs: &[TensorId], out: &SplitState) -> Option<TensorId> {
    if t.op != Op::View || matches!(out, SplitState::Split(_)) {
        return None;
    }
    let parent = ctx.t(t.src[0]);
    let lp = l.t(srcs[0]);
    let same = lp.ne == parent.ne && lp.nb == parent.nb;
    if (parent.is_contiguous() || same) && super::rules::view_inside_parent(t, parent) {
        return None;
    }
    t.view_src
}

/// The device a node runs on alone ([`super::rules`]' one-device
/// strategy, or a family rule's that comes to the same): its result lies
/// whole on that device and every source it reads is mirrored or lies
/// whole there, so that device computes it as one device would and the
/// others hold nothing of it.
fn alone_on(out: &SplitState, needs: &[SplitState], n: usize) -> Option<usize> {
    if n < 2 {
        return None;
    }
    let h = out.sole_holder()?;
    needs.iter().all(|s| *s == SplitState::Mirrored || s.sole_holder() == Some(h)).then_some(h)
}

/// Whether device `j` takes part in a node whose result is in `out` and
/// whose sources are read in `needs`: not when a state of them lives on a
/// device group without `j` (the group's strategies, [`super::rules`]'
/// `in_groups`, put every state of a node on one group).
fn runs_here(out: &SplitState, needs: &[SplitState], j: usize) -> bool {
    std::iter::once(out).chain(needs).find_map(SplitState::group).is_none_or(|g| g.contains(j))
}

fn node_err(t: &Tensor, st: &SplitState, e: Error) -> Error {
    Error::Split { detail: format!("{} {} ({}): {e}", t.op.name(), t.describe(), st.label()) }
}

/// Builds node `t` in local context `l` over local sources `srcs`, with the
/// output shape device `j` holds in `out_state`.
#[allow(clippy::too_many_arguments)]
fn local_op(
    l: &mut Context,
    ctx: &Context,
    t: &Tensor,
    srcs: &[TensorId],
    in_states: &[SplitState],
    out_state: &SplitState,
    j: usize,
) -> Result<TensorId> {
    let ne = local_ne(t.ne, out_state, j);
    // A local view chain may hold a contiguous parent in a strided layout.
    match &t.op {
        Op::Reshape => {
            let base = contiguous(l, srcs[0])?;
            l.push_view(base, t.ty, ne, contiguous_strides(t.ty, &ne), 0, Op::Reshape, &[base])
        }
        Op::Permute { axes } => {
            let s = l.t(srcs[0]).clone();
            let (mut pne, mut pnb) = (s.ne, s.nb);
            for i in 0..4 {
                pne[axes[i]] = s.ne[i];
                pnb[axes[i]] = s.nb[i];
            }
            l.push_view(srcs[0], t.ty, pne, pnb, 0, t.op.clone(), srcs)
        }
        Op::Transpose => {
            let s = l.t(srcs[0]).clone();
            let (mut pne, mut pnb) = (s.ne, s.nb);
            pne.swap(0, 1);
            pnb.swap(0, 1);
            l.push_view(srcs[0], t.ty, pne, pnb, 0, Op::Transpose, srcs)
        }
        Op::Cpy => l.cpy(srcs[0], srcs[1]),
        Op::SetRows => l.set_rows(srcs[2], srcs[0], srcs[1]),
        Op::View if matches!(out_state, SplitState::Split(_)) => {
            let parent = ctx.t(t.src[0]);
            // A view of a result held in a device-local packing: this device's packing.
            if let Some(SplitState::Split(is)) = in_states.first() {
                if let Some(g) = super::rules::packed_view(ctx, parent, t, is) {
                    let (lne, lnb, offs) = g.local(is.local_len(j));
                    return l.push_view(srcs[0], t.ty, lne, lnb, offs, Op::View, srcs);
                }
            }
            // A box of a split parent: the same box of this device's part.
            let geometry = match in_states.first() {
                Some(SplitState::Split(is)) => super::rules::view_geometry(parent, t, is),
                _ => None,
            };
            let Some((q, is, starts)) = geometry else {
                return Err(Error::Split { detail: "split view that is not a box of a split parent".into() });
            };
            // The parent's part in the shape the view reads it in.
            let mut base = srcs[0];
            if q.ne != parent.ne {
                base = contiguous(l, base)?;
                let qne = local_ne(q.ne, &SplitState::Split(is.clone()), j);
                base = l.push_view(base, t.ty, qne, contiguous_strides(t.ty, &qne), 0, Op::Reshape, &[base])?;
            }
            let srcs = &[base];
            let lp = l.t(base).clone();
            let a = is.axis;
            let mut ls = starts;
            ls[a] = is.ranges(j).iter().map(|&(x, y)| (y.min(starts[a]) - x).max(0)).sum();
            let bs = t.ty.block_size() as i64;
            let offs: i64 = if ne.contains(&0) {
                0
            } else {
                (0..4).map(|k| ls[k] / if k == 0 { bs } else { 1 } * lp.nb[k] as i64).sum()
            };
            l.push_view(srcs[0], t.ty, ne, lp.nb, offs as usize, Op::View, srcs)
        }
        Op::View => {
            // Relative to the parent as this device holds it: the parent's own
            // layout, or (for a contiguous parent) a contiguous copy.
            let parent = ctx.t(t.src[0]);
            let p_offs = if parent.view_src.is_some() { parent.view_offs } else { 0 };
            let offs = t
                .view_offs
                .checked_sub(p_offs)
                .ok_or_else(|| Error::Split { detail: "view before its parent".into() })?;
            let nb = t.nb;
            let lp = l.t(srcs[0]).clone();
            let base = if lp.ne == parent.ne && lp.nb == parent.nb { srcs[0] } else { contiguous(l, srcs[0])? };
            l.push_view(base, t.ty, t.ne, nb, offs, Op::View, &[base])
        }
        op => l.push_op(t.ty, ne, op.clone(), srcs),
    }
}
