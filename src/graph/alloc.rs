//! The graph allocator, in the manner of ggml's `gallocr`: it gives every
//! intermediate tensor of a [`Graph`] a byte offset in one or more backend
//! buffers, reusing memory as soon as a tensor is dead.
//!
//! # What gets memory
//!
//! A tensor is *planned* (given an offset) when it is a **storage owner**
//! (`view_src` is `None`) that appears in the graph (a node, a leaf, a source
//! or a view's owner) and either has no storage yet in the
//! [`TensorStorage`] passed in, or lives in a buffer this allocator handed out
//! earlier (so re-running the same graph re-plans it instead of treating it
//! as external). Tensors with storage elsewhere (weights allocated with
//! [`TensorStorage::alloc_tensors`], KV caches, …) are *external*: they are
//! read, never moved, freed or reused. Views (`reshape`, `view`, `permute`,
//! `transpose`, and `cpy`/`set_rows`, whose result is a view of their
//! destination) get no memory of their own; they share their owner's.
//!
//! # Liveness
//!
//! Nodes are walked in graph order (the order [`Graph::nodes`] gives, which
//! is the execution order). Leafs that need memory are placed first (as ggml
//! does, so nothing overwrites them before they are read). Each node is then
//! placed, and after it every owner whose **last use** was that node is freed
//! (in the node's source order, then the node itself if nothing reads it). A use of a view counts as a use of its owner, and a
//! view node itself keeps its owner alive up to its own position (ggml's
//! `n_views`). These are never freed, so their memory is never reused:
//!
//! * outputs: `flags.output` or listed in [`Graph::outputs`] (a view in the
//!   graph that is an output pins its owner; flags of tensors outside the
//!   graph are not looked at);
//! * inputs: `flags.input` (the caller writes them before each compute and
//!   may compute again with the same inputs). An input is alive for the whole
//!   graph, so it is placed *above* everything else (at the high-water mark
//!   of a buffer, after the rest is planned): it adds exactly its size to the
//!   peak and fragments nothing. [`GraphAllocator::set_reuse_inputs`] turns
//!   this off and frees inputs after their last use, as ggml does.
//!
//! Freed memory returns to a **best-fit free-block allocator** (ggml's
//! dynamic `tallocr`): free blocks sorted by offset, merged with their
//! neighbours on release; an allocation takes the smallest free block that
//! fits, otherwise the free tail of a buffer, otherwise a new buffer. The
//! high-water mark of each buffer is its size: the *peak*.
//!
//! # In place
//!
//! A node whose op allows it ([`Op::can_inplace`](crate::ops::Op::can_inplace)) takes over the memory of
//! its `src[0]` instead of getting new memory when all of these hold:
//! `src[0]`'s owner was planned by this allocator (not external), is a node
//! (not a leaf), is neither input nor output, its last use is this node, no
//! other source of the node reads the same owner, `src[0]` has exactly the
//! node's type, shape and strides, and, if `src[0]` is a view, it starts at
//! byte 0 of its owner (the owner's unused tail is freed). Only `src[0]` is
//! considered, so kernels only ever have to support `dst == src0` aliasing.
//! [`AllocStats::n_inplace`] counts these hand-overs and
//! [`Placement::inplace_of`] names the owner reused.
//!
//! # Several buffers
//!
//! A buffer type has a maximum buffer size ([`BufferType::max_size`]). When
//! the next tensor does not fit into any existing buffer without crossing it,
//! the allocator opens another buffer ("chunk" in ggml); a tensor is never
//! split across buffers. One tensor larger than the maximum is an
//! [`Error::Alloc`].
//!
//! # Units
//!
//! All sizes and offsets are in bytes. Offsets are multiples of the buffer
//! type's alignment; each tensor reserves its `nbytes()` rounded up to the
//! alignment (a tensor that fills a whole maximum-size buffer reserves exactly
//! the maximum). Zero-byte tensors are placed at offset 0 of buffer 0 and
//! reserve nothing.
//!
//! # Reserve, then allocate
//!
//! [`GraphAllocator::measure`] plans without allocating and remembers the
//! per-buffer sizes it found (ggml's `gallocr_reserve`): a later
//! [`GraphAllocator::alloc_graph`] allocates at least that much, so smaller
//! graphs that follow fit without reallocating. `alloc_graph` keeps its
//! buffers and reuses them (and the cached plan, for an identical graph) as
//! long as they are large enough; it reallocates only when the plan needs
//! more. Every `alloc_graph` invalidates the placements of the previous graph
//! allocated with this allocator (their memory is shared, as in ggml).
//!
//! # Example
//!
//! ```no_run
//! use shardgraph::graph::GraphAllocator;
//! use shardgraph::{Context, CpuBackend, GgmlType, TensorStorage};
//!
//! # fn main() -> shardgraph::Result<()> {
//! let backend = CpuBackend::with_threads(4)?;
//! let mut ctx = Context::new();
//! let w = ctx.new_tensor_2d(GgmlType::F32, 64, 64)?; // a weight
//! let x = ctx.new_tensor_2d(GgmlType::F32, 64, 8)?;
//! ctx.set_input(x)?;
//! let h = ctx.mul_mat(w, x)?;
//! let y = ctx.silu(h)?; // runs in place over `h`
//! let graph = ctx.build_forward(&[y])?;
//!
//! let mut storage = TensorStorage::new();
//! storage.alloc_tensors(&backend, &ctx, &[w])?; // weights: their own buffer
//! let mut galloc = GraphAllocator::for_backend(&backend);
//! let need = galloc.measure(&ctx, &graph, &storage)?; // plan only
//! let got = galloc.alloc_graph(&backend, &ctx, &graph, &mut storage)?;
//! assert_eq!(need.peak_bytes, got.peak_bytes);
//! # Ok(())
//! # }
//! ```

use crate::backend::{Backend, Buffer, BufferType, TensorStorage};
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::{Tensor, TensorId};
use std::sync::Arc;

/// Where one planned tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The storage owner that was placed.
    pub tensor: TensorId,
    /// Index of the buffer (chunk) in [`AllocStats::buffer_sizes`] and
    /// [`GraphAllocator::buffers`].
    pub buffer: usize,
    /// Byte offset inside that buffer (a multiple of the alignment).
    pub offset: usize,
    /// The tensor's `nbytes()`.
    pub size: usize,
    /// Bytes reserved for it: `size` rounded up to the alignment (0 for an
    /// empty tensor).
    pub reserved: usize,
    /// If the tensor reuses its `src[0]`'s memory in place: that owner.
    pub inplace_of: Option<TensorId>,
}

/// What a plan needs, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Peak (high-water mark) of each buffer, in bytes; the buffer sizes the
    /// plan needs. Empty when nothing had to be placed.
    pub buffer_sizes: Vec<usize>,
    /// Sum of `buffer_sizes`: the memory the graph needs, in bytes.
    pub peak_bytes: usize,
    /// Number of nodes that reuse their `src[0]`'s memory in place.
    pub n_inplace: usize,
    /// Number of tensors placed (storage owners planned by this allocator).
    pub n_allocated: usize,
    /// Sum of the aligned sizes of all placed tensors: what the graph would
    /// need with no reuse at all, in bytes.
    pub naive_bytes: usize,
    /// Bytes reserved for inputs kept for the whole graph (placed above the
    /// rest; 0 with [`GraphAllocator::set_reuse_inputs`]). Included in
    /// `peak_bytes`.
    pub input_bytes: usize,
    /// Alignment of the offsets, in bytes.
    pub alignment: usize,
    /// True if the plan was taken from the cache (same graph, same flags,
    /// same tensors to place as the previous call).
    pub reused_plan: bool,
    /// [`GraphAllocator::alloc_graph`] only: true if new buffers were
    /// allocated, false if the previous ones were large enough.
    pub reallocated: bool,
    /// [`GraphAllocator::alloc_graph`]: total size of the buffers actually
    /// held (at least `peak_bytes`; more when earlier graphs or
    /// [`GraphAllocator::measure`] reserved more). `measure`: the size of
    /// the buffers held now (0 before the first `alloc_graph`).
    pub allocated_bytes: usize,
}

/// One free range inside a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FreeBlock {
    offset: usize,
    size: usize,
}

/// One buffer under planning: its free ranges (sorted by offset, never
/// empty ranges, never adjacent ones), its capacity and its high-water mark.
#[derive(Clone, Debug)]
struct Chunk {
    cap: usize,
    free: Vec<FreeBlock>,
    high: usize,
}

impl Chunk {
    fn new(cap: usize) -> Self {
        let free = if cap > 0 { vec![FreeBlock { offset: 0, size: cap }] } else { Vec::new() };
        Chunk { cap, free, high: 0 }
    }

    /// Index of the free block that reaches the end of the chunk, if any.
    fn tail(&self) -> Option<usize> {
        let last = self.free.len().checked_sub(1)?;
        let b = self.free[last];
        (b.offset.checked_add(b.size) == Some(self.cap)).then_some(last)
    }

    /// Carves `size` bytes from the front of free block `idx`.
    fn take(&mut self, idx: usize, size: usize) -> usize {
        let b = &mut self.free[idx];
        let offset = b.offset;
        b.offset += size;
        b.size -= size;
        if b.size == 0 {
            self.free.remove(idx);
        }
        self.high = self.high.max(offset + size);
        offset
    }

    /// Returns `[offset, offset + size)` to the free list, merging neighbours.
    fn release(&mut self, offset: usize, size: usize) {
        if size == 0 {
            return;
        }
        let pos = self.free.partition_point(|b| b.offset < offset);
        let joins_prev = pos > 0 && {
            let p = self.free[pos - 1];
            p.offset + p.size == offset
        };
        let joins_next = pos < self.free.len() && offset + size == self.free[pos].offset;
        match (joins_prev, joins_next) {
            (true, true) => {
                let next = self.free.remove(pos);
                self.free[pos - 1].size += size + next.size;
            }
            (true, false) => self.free[pos - 1].size += size,
            (false, true) => {
                self.free[pos].offset = offset;
                self.free[pos].size += size;
            }
            (false, false) => self.free.insert(pos, FreeBlock { offset, size }),
        }
    }
}

/// The dynamic multi-chunk allocator used while planning.
#[derive(Clone, Debug)]
struct Arena {
    chunk_cap: usize,
    chunks: Vec<Chunk>,
}

impl Arena {
    fn new(chunk_cap: usize) -> Self {
        Arena { chunk_cap, chunks: Vec::new() }
    }

    /// Reserves `size` bytes (`size <= chunk_cap`, `size > 0`); returns
    /// (chunk, offset).
    fn alloc(&mut self, size: usize) -> (usize, usize) {
        // 1. Best fit among the interior free blocks (not a chunk's tail):
        //    smallest block that fits; among equals the last one seen.
        let mut best: Option<(usize, usize, usize)> = None; // (chunk, block, block size)
        for (c, chunk) in self.chunks.iter().enumerate() {
            let tail = chunk.tail();
            for (i, b) in chunk.free.iter().enumerate() {
                if Some(i) == tail || b.size < size {
                    continue;
                }
                if best.is_none_or(|(_, _, s)| b.size <= s) {
                    best = Some((c, i, b.size));
                }
            }
        }
        if let Some((c, i, _)) = best {
            return (c, self.chunks[c].take(i, size));
        }
        // 2. A chunk's free tail. Prefer the chunk where the tensor fits under
        //    the high-water mark already reached, leaving the least unused;
        //    else the one that grows the least.
        let mut best_tail: Option<(usize, usize, (bool, usize))> = None; // (chunk, block, rank)
        for (c, chunk) in self.chunks.iter().enumerate() {
            let Some(i) = chunk.tail() else { continue };
            let b = chunk.free[i];
            if b.size < size {
                continue;
            }
            let end = b.offset + size;
            let rank = if end <= chunk.high { (false, chunk.high - end) } else { (true, end - chunk.high) };
            if best_tail.is_none_or(|(_, _, r)| rank < r) {
                best_tail = Some((c, i, rank));
            }
        }
        if let Some((c, i, _)) = best_tail {
            return (c, self.chunks[c].take(i, size));
        }
        // 3. A new chunk.
        let mut chunk = Chunk::new(self.chunk_cap);
        let offset = chunk.take(0, size);
        self.chunks.push(chunk);
        (self.chunks.len() - 1, offset)
    }

    /// Reserves `size` bytes (`0 < size <= chunk_cap`) above the high-water
    /// mark of the first chunk with room (or of a new chunk), for a tensor
    /// alive during the whole graph. Only valid once all other tensors are
    /// planned: it leaves the free lists alone.
    fn alloc_top(&mut self, size: usize) -> (usize, usize) {
        for (c, chunk) in self.chunks.iter_mut().enumerate() {
            if chunk.cap - chunk.high >= size {
                let offset = chunk.high;
                chunk.high += size;
                return (c, offset);
            }
        }
        let mut chunk = Chunk::new(self.chunk_cap);
        chunk.high = size;
        self.chunks.push(chunk);
        (self.chunks.len() - 1, 0)
    }

    fn free(&mut self, chunk: usize, offset: usize, size: usize) {
        if let Some(c) = self.chunks.get_mut(chunk) {
            c.release(offset, size);
        }
    }
}

/// Identifies a graph as planned: everything the plan depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PlanKey {
    ctx_id: u32,
    hash: u64,
    nodes: Vec<TensorId>,
    leafs: Vec<TensorId>,
    outputs: Vec<TensorId>,
    /// Per referenced tensor (in collection order): bit 0 planned here,
    /// bit 1 input, bit 2 output.
    marks: Vec<u8>,
}

/// A finished plan.
#[derive(Clone, Debug)]
struct Plan {
    key: PlanKey,
    placements: Vec<Placement>,
    chunk_sizes: Vec<usize>,
    n_inplace: usize,
    naive_bytes: usize,
    input_bytes: usize,
}

/// Planning state of one storage owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Not placed (yet).
    Empty,
    /// A kept input, to be placed above everything else at the end.
    Deferred,
    /// Placed and alive: (chunk, offset, reserved bytes).
    Live(usize, usize, usize),
    /// Placed, then freed or handed over to an in-place consumer.
    Done,
}

/// Per-tensor facts gathered before planning, indexed by tensor index.
struct Facts {
    /// Tensors the graph references, owners included, in first-seen order.
    refs: Vec<TensorId>,
    seen: Vec<bool>,
    /// Planned by this allocator (storage owner without outside storage).
    planned: Vec<bool>,
    /// Never freed (input/output, or a view of it is).
    pinned: Vec<bool>,
    /// Kept inputs: placed above everything else once the rest is planned.
    top: Vec<bool>,
    /// Last node position that uses the owner (directly, through a view, or
    /// as its own birth).
    last_use: Vec<Option<usize>>,
}

/// The graph allocator (ggml's `gallocr`) for one buffer type: plans byte
/// offsets by liveness, reuses memory in place, and allocates and keeps the
/// buffers. See the [module documentation](self) for the rules.
#[derive(Debug)]
pub struct GraphAllocator {
    buffer_type: BufferType,
    alignment: usize,
    plan: Option<Plan>,
    /// Per-chunk sizes remembered by `measure` (ggml's reserve).
    reserved: Vec<usize>,
    buffers: Vec<Arc<dyn Buffer>>,
    /// Which backend allocated `buffers` (name and device).
    buffers_from: Option<(String, String)>,
    /// ggml's behaviour for inputs: free them after their last use.
    reuse_inputs: bool,
}

impl GraphAllocator {
    /// An allocator for buffers of type `buffer_type`: offsets are aligned to
    /// `buffer_type.alignment` bytes (rounded up to a power of two, clamped to
    /// 1 B..=1 MiB) and no buffer exceeds `buffer_type.max_size` bytes.
    pub fn new(buffer_type: BufferType) -> Self {
        let alignment = buffer_type.alignment.clamp(1, 1 << 20).next_power_of_two();
        GraphAllocator {
            buffer_type,
            alignment,
            plan: None,
            reserved: Vec::new(),
            buffers: Vec::new(),
            buffers_from: None,
            reuse_inputs: false,
        }
    }

    /// An allocator for `backend`'s default buffer type.
    pub fn for_backend(backend: &dyn Backend) -> Self {
        Self::new(backend.buffer_type())
    }

    /// The buffer type this allocator plans for.
    pub fn buffer_type(&self) -> &BufferType {
        &self.buffer_type
    }

    /// The buffers held since the last [`Self::alloc_graph`] (one per chunk;
    /// empty before the first one).
    pub fn buffers(&self) -> &[Arc<dyn Buffer>] {
        &self.buffers
    }

    /// The placements of the last plan (from [`Self::measure`] or
    /// [`Self::alloc_graph`]), in planning order; empty before the first.
    pub fn placements(&self) -> &[Placement] {
        self.plan.as_ref().map_or(&[], |p| &p.placements)
    }

    /// With `true`, inputs (`flags.input`) are treated like any other tensor
    /// placed by the allocator: placed before the first node and freed after
    /// their last use, so their memory is reused (ggml's `gallocr`
    /// behaviour; the caller must then write the inputs again before every
    /// compute). Default `false`: inputs are never freed.
    pub fn set_reuse_inputs(&mut self, reuse: bool) {
        if self.reuse_inputs != reuse {
            self.reuse_inputs = reuse;
            self.plan = None;
        }
    }

    /// Whether inputs are freed after their last use (see [`Self::set_reuse_inputs`]).
    pub fn reuse_inputs(&self) -> bool {
        self.reuse_inputs
    }

    /// Forgets the cached plan, the reserved sizes and the buffers (the
    /// buffers stay alive as long as a [`TensorStorage`] still holds them).
    pub fn reset(&mut self) {
        self.plan = None;
        self.reserved.clear();
        self.buffers.clear();
        self.buffers_from = None;
    }

    /// Plans `graph` without allocating anything and returns what it needs
    /// (per-buffer peaks and their sum, in bytes). The per-buffer sizes are
    /// remembered: the next [`Self::alloc_graph`] allocates at least that
    /// much (ggml's `gallocr_reserve`).
    ///
    /// `storage` says which tensors already have memory (they are external
    /// and not planned); it is not modified.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] if `graph` or `storage` belongs to another
    /// context or the graph names a tensor `ctx` does not have;
    /// [`Error::Alloc`] if one tensor is larger than the buffer type's
    /// maximum buffer size (or sizes overflow).
    pub fn measure(&mut self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> Result<AllocStats> {
        graph.check_context(ctx)?;
        storage.check_context(ctx)?;
        let (plan, reused) = self.get_plan(ctx, graph, storage)?;
        if self.reserved.len() < plan.chunk_sizes.len() {
            self.reserved.resize(plan.chunk_sizes.len(), 0);
        }
        for (r, &s) in self.reserved.iter_mut().zip(&plan.chunk_sizes) {
            *r = (*r).max(s);
        }
        let mut stats = stats_of(&plan, self.alignment);
        stats.reused_plan = reused;
        stats.allocated_bytes = self.buffers.iter().map(|b| b.size()).sum();
        self.plan = Some(plan);
        Ok(stats)
    }

    /// Plans `graph` (or reuses the cached plan of an identical graph),
    /// makes sure the buffers are large enough (allocating on `backend` only
    /// if they are not), and places every planned tensor in `storage`.
    /// Afterwards every node and leaf of the graph has storage.
    ///
    /// Placements made into this allocator's buffers for an earlier graph
    /// are removed from `storage` first (their memory now belongs to this
    /// graph).
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] if `graph` or `storage` belongs to another
    /// context; [`Error::Alloc`] if a tensor exceeds the maximum buffer size,
    /// the backend's alignment does not divide this allocator's, or the
    /// backend cannot allocate. On error `storage` is unchanged.
    pub fn alloc_graph(
        &mut self,
        backend: &dyn Backend,
        ctx: &Context,
        graph: &Graph,
        storage: &mut TensorStorage,
    ) -> Result<AllocStats> {
        graph.check_context(ctx)?;
        storage.check_context(ctx)?;
        let backend_align = backend.buffer_type().alignment.max(1);
        if self.alignment % backend_align != 0 {
            return Err(Error::Alloc {
                detail: format!(
                    "backend {} needs {backend_align}-byte alignment, the graph allocator uses {}",
                    backend.name(),
                    self.alignment
                ),
            });
        }
        let (plan, reused) = self.get_plan(ctx, graph, storage)?;

        // Buffers: keep the current ones if they come from this backend and
        // each is at least as large as both this plan and what `measure`
        // reserved.
        let n = plan.chunk_sizes.len().max(self.reserved.len());
        let want: Vec<usize> = (0..n)
            .map(|c| plan.chunk_sizes.get(c).copied().unwrap_or(0).max(self.reserved.get(c).copied().unwrap_or(0)))
            .collect();
        let from = (backend.name().to_string(), backend.device().name);
        let fits = self.buffers_from.as_ref() == Some(&from)
            && self.buffers.len() >= n
            && want.iter().zip(&self.buffers).all(|(&need, b)| b.size() >= need);
        let mut old = Vec::new();
        if !fits {
            let mut fresh = Vec::with_capacity(n);
            for &size in &want {
                fresh.push(backend.alloc_buffer(size)?);
            }
            old = std::mem::replace(&mut self.buffers, fresh);
            self.buffers_from = Some(from);
        }

        storage.bind_ctx(ctx)?;
        // Storage indices of our buffers (current and replaced).
        let index_of = |s: &TensorStorage, b: &Arc<dyn Buffer>| s.buffers.iter().position(|x| Arc::ptr_eq(x, b));
        let ours: Vec<usize> = self.buffers.iter().chain(&old).filter_map(|b| index_of(storage, b)).collect();
        if !ours.is_empty() {
            for slot in storage.slots.iter_mut() {
                if slot.is_some_and(|(b, _)| ours.contains(&b)) {
                    *slot = None;
                }
            }
        }
        let mut buf_index = Vec::with_capacity(self.buffers.len());
        for (c, b) in self.buffers.iter().enumerate() {
            let idx = match index_of(storage, b) {
                Some(i) => i,
                None => match old.get(c).and_then(|o| index_of(storage, o)) {
                    Some(i) => {
                        storage.buffers[i] = Arc::clone(b);
                        i
                    }
                    None => storage.add_buffer(Arc::clone(b)),
                },
            };
            buf_index.push(idx);
        }
        for p in &plan.placements {
            storage.place(p.tensor, buf_index[p.buffer], p.offset);
        }

        let mut stats = stats_of(&plan, self.alignment);
        stats.reused_plan = reused;
        stats.reallocated = !fits;
        stats.allocated_bytes = self.buffers.iter().map(|b| b.size()).sum();
        self.plan = Some(plan);
        Ok(stats)
    }

    /// The cached plan if `graph` is planned exactly as before, else a new one.
    fn get_plan(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> Result<(Plan, bool)> {
        let facts = self.gather(ctx, graph, storage)?;
        let key = PlanKey {
            ctx_id: ctx.id(),
            hash: graph.hash,
            nodes: graph.nodes.clone(),
            leafs: graph.leafs.clone(),
            outputs: graph.outputs.clone(),
            marks: facts
                .refs
                .iter()
                .map(|&id| {
                    let t = ctx.t(id);
                    u8::from(facts.planned[id.index()])
                        | (u8::from(t.flags.input) << 1)
                        | (u8::from(t.flags.output) << 2)
                })
                .collect(),
        };
        if let Some(p) = &self.plan {
            if p.key == key {
                return Ok((p.clone(), true));
            }
        }
        Ok((self.plan_graph(ctx, graph, facts, key)?, false))
    }

    /// Validates every tensor the graph references and computes which are
    /// planned, pinned, and their last use.
    fn gather(&self, ctx: &Context, graph: &Graph, storage: &TensorStorage) -> Result<Facts> {
        let n = ctx.len();
        let mut f = Facts {
            refs: Vec::new(),
            seen: vec![false; n],
            planned: vec![false; n],
            pinned: vec![false; n],
            top: vec![false; n],
            last_use: vec![None; n],
        };
        let visit = |f: &mut Facts, id: TensorId| -> Result<()> {
            let t = ctx.tensor(id)?;
            if !f.seen[id.index()] {
                f.seen[id.index()] = true;
                f.refs.push(id);
            }
            if let Some(o) = t.view_src {
                let _ = ctx.tensor(o)?;
                if !f.seen[o.index()] {
                    f.seen[o.index()] = true;
                    f.refs.push(o);
                }
            }
            Ok(())
        };
        for &id in &graph.leafs {
            visit(&mut f, id)?;
        }
        for &id in &graph.nodes {
            for &s in &ctx.tensor(id)?.src {
                visit(&mut f, s)?;
            }
            visit(&mut f, id)?;
        }
        for &id in &graph.outputs {
            visit(&mut f, id)?;
        }

        let in_our_buffer = |id: TensorId| -> bool {
            match storage.slots.get(id.index()).copied().flatten() {
                None => true,
                Some((b, _)) => {
                    storage.buffers.get(b).is_some_and(|buf| self.buffers.iter().any(|o| Arc::ptr_eq(o, buf)))
                }
            }
        };
        for &id in &f.refs {
            let t = ctx.t(id);
            let owner = t.view_src.unwrap_or(id);
            if t.view_src.is_none() {
                f.planned[id.index()] = in_our_buffer(id);
            }
            if t.flags.output || (t.flags.input && !self.reuse_inputs) {
                f.pinned[owner.index()] = true;
            }
            if t.flags.input && !self.reuse_inputs {
                f.top[owner.index()] = true;
            }
        }
        for &id in &graph.outputs {
            f.pinned[owner_of(ctx, id).index()] = true;
        }
        let mark = |f: &mut Facts, owner: TensorId, pos: usize| {
            let l = &mut f.last_use[owner.index()];
            *l = Some(l.map_or(pos, |p| p.max(pos)));
        };
        for (pos, &id) in graph.nodes.iter().enumerate() {
            let t = ctx.t(id);
            for &s in &t.src {
                mark(&mut f, owner_of(ctx, s), pos);
            }
            mark(&mut f, t.view_src.unwrap_or(id), pos);
        }
        Ok(f)
    }

    /// Bytes reserved for tensor `t`, or an error if it can never fit.
    fn reserve_size(&self, id: TensorId, t: &Tensor) -> Result<usize> {
        let n = t.nbytes();
        let max = self.buffer_type.max_size;
        if n > max {
            return Err(Error::Alloc {
                detail: format!(
                    "tensor {} {:?} {} needs {n} bytes, more than the maximum buffer size of {max} bytes of buffer type {}",
                    id.index(),
                    t.name,
                    t.describe(),
                    self.buffer_type.name
                ),
            });
        }
        let aligned = n
            .checked_next_multiple_of(self.alignment)
            .ok_or_else(|| Error::Alloc { detail: format!("size of tensor {} overflows", id.index()) })?;
        // A tensor that fits the maximum only unpadded fills a chunk exactly.
        Ok(aligned.min(max))
    }

    fn plan_graph(&self, ctx: &Context, graph: &Graph, facts: Facts, key: PlanKey) -> Result<Plan> {
        let mut planner = Planner {
            alloc: self,
            ctx,
            facts,
            slots: vec![Slot::Empty; ctx.len()],
            arena: Arena::new(self.buffer_type.max_size),
            placements: Vec::new(),
            n_inplace: 0,
            naive_bytes: 0,
            input_bytes: 0,
            has_empty: false,
            deferred: Vec::new(),
        };
        // Leafs first, then graph inputs (ggml's order), then any owner the
        // node list does not contain (hand-edited graphs).
        for &id in &graph.leafs {
            planner.place(id)?;
        }
        for &id in &graph.nodes {
            let t = ctx.t(id);
            if t.flags.input {
                planner.place(owner_of(ctx, id))?;
            }
            for &s in &t.src {
                if ctx.t(s).flags.input {
                    planner.place(owner_of(ctx, s))?;
                }
            }
        }
        let mut in_nodes = vec![false; ctx.len()];
        for &id in &graph.nodes {
            in_nodes[id.index()] = true;
        }
        for i in 0..planner.facts.refs.len() {
            let id = planner.facts.refs[i];
            if !in_nodes[id.index()] {
                planner.place(id)?;
            }
        }

        for (pos, &id) in graph.nodes.iter().enumerate() {
            let t = ctx.t(id);
            if !(t.op.can_inplace() && planner.try_inplace(id, pos)?) {
                planner.place(id)?;
            }
            // Free every owner whose last use was this node, in source order.
            for &s in &t.src {
                planner.release_if_dead(owner_of(ctx, s), pos);
            }
            planner.release_if_dead(t.view_src.unwrap_or(id), pos);
        }

        planner.place_deferred()?;
        if planner.has_empty && planner.arena.chunks.is_empty() {
            planner.arena.chunks.push(Chunk::new(self.buffer_type.max_size));
        }
        let chunk_sizes = planner.arena.chunks.iter().map(|c| c.high).collect();
        Ok(Plan {
            key,
            placements: planner.placements,
            chunk_sizes,
            n_inplace: planner.n_inplace,
            naive_bytes: planner.naive_bytes,
            input_bytes: planner.input_bytes,
        })
    }
}

/// The mutable state of one planning pass.
struct Planner<'a> {
    alloc: &'a GraphAllocator,
    ctx: &'a Context,
    facts: Facts,
    slots: Vec<Slot>,
    arena: Arena,
    placements: Vec<Placement>,
    n_inplace: usize,
    naive_bytes: usize,
    input_bytes: usize,
    has_empty: bool,
    /// Kept inputs waiting to be placed above everything else.
    deferred: Vec<TensorId>,
}

impl Planner<'_> {
    /// Gives `id` fresh memory if it is a planned owner not placed yet.
    fn place(&mut self, id: TensorId) -> Result<()> {
        let i = id.index();
        if !self.facts.planned[i] || self.slots[i] != Slot::Empty {
            return Ok(());
        }
        let reserved = self.alloc.reserve_size(id, self.ctx.t(id))?;
        if reserved > 0 && self.facts.top[i] {
            self.slots[i] = Slot::Deferred;
            self.deferred.push(id);
            return Ok(());
        }
        self.place_with(id, reserved, false);
        Ok(())
    }

    /// Places the kept inputs above the high-water mark of a buffer.
    fn place_deferred(&mut self) -> Result<()> {
        for id in std::mem::take(&mut self.deferred) {
            let reserved = self.alloc.reserve_size(id, self.ctx.t(id))?;
            self.input_bytes = self.input_bytes.saturating_add(reserved);
            self.place_with(id, reserved, true);
        }
        Ok(())
    }

    /// Records `id` at fresh memory of `reserved` bytes (above everything
    /// else if `top`).
    fn place_with(&mut self, id: TensorId, reserved: usize, top: bool) {
        let i = id.index();
        let t = self.ctx.t(id);
        let (chunk, offset) = if reserved == 0 {
            self.has_empty = true;
            (0, 0)
        } else if top {
            self.arena.alloc_top(reserved)
        } else {
            self.arena.alloc(reserved)
        };
        self.naive_bytes = self.naive_bytes.saturating_add(reserved);
        self.slots[i] = if reserved == 0 { Slot::Done } else { Slot::Live(chunk, offset, reserved) };
        self.placements.push(Placement {
            tensor: id,
            buffer: chunk,
            offset,
            size: t.nbytes(),
            reserved,
            inplace_of: None,
        });
    }

    /// Places node `id` (at position `pos`) in its `src[0]`'s memory if the
    /// in-place rules allow it; returns whether it did.
    fn try_inplace(&mut self, id: TensorId, pos: usize) -> Result<bool> {
        let ctx = self.ctx;
        let i = id.index();
        if !self.facts.planned[i] || self.slots[i] != Slot::Empty {
            return Ok(false);
        }
        let t = ctx.t(id);
        let Some(&s0) = t.src.first() else { return Ok(false) };
        let src = ctx.t(s0);
        let p = src.view_src.unwrap_or(s0);
        let pi = p.index();
        let Slot::Live(chunk, offset, p_reserved) = self.slots[pi] else { return Ok(false) };
        let ok = self.facts.planned[pi]
            && !self.facts.pinned[pi]
            && !ctx.t(p).op.is_leaf()
            && !ctx.t(p).flags.input
            && self.facts.last_use[pi] == Some(pos)
            && t.src[1..].iter().all(|&s| owner_of(ctx, s) != p)
            && src.ty == t.ty
            && src.ne == t.ne
            && src.nb == t.nb
            && src.view_offs == 0;
        if !ok {
            return Ok(false);
        }
        let reserved = self.alloc.reserve_size(id, t)?;
        if reserved == 0 || reserved > p_reserved {
            return Ok(false);
        }
        // The owner's memory now belongs to the node; give back any tail.
        self.arena.free(chunk, offset + reserved, p_reserved - reserved);
        self.slots[pi] = Slot::Done;
        self.slots[i] = Slot::Live(chunk, offset, reserved);
        self.naive_bytes = self.naive_bytes.saturating_add(reserved);
        self.n_inplace += 1;
        self.placements.push(Placement {
            tensor: id,
            buffer: chunk,
            offset,
            size: t.nbytes(),
            reserved,
            inplace_of: Some(p),
        });
        Ok(true)
    }

    /// Frees `owner` if it is live, not pinned, and its last use is `pos`.
    fn release_if_dead(&mut self, owner: TensorId, pos: usize) {
        let i = owner.index();
        if self.facts.pinned[i] || self.facts.last_use[i] != Some(pos) {
            return;
        }
        if let Slot::Live(chunk, offset, reserved) = self.slots[i] {
            self.arena.free(chunk, offset, reserved);
            self.slots[i] = Slot::Done;
        }
    }
}

/// The storage owner of `id` (itself unless it is a view). `id` must be valid.
fn owner_of(ctx: &Context, id: TensorId) -> TensorId {
    ctx.t(id).view_src.unwrap_or(id)
}

fn stats_of(plan: &Plan, alignment: usize) -> AllocStats {
    AllocStats {
        buffer_sizes: plan.chunk_sizes.clone(),
        peak_bytes: plan.chunk_sizes.iter().fold(0usize, |a, &b| a.saturating_add(b)),
        n_inplace: plan.n_inplace,
        n_allocated: plan.placements.len(),
        naive_bytes: plan.naive_bytes,
        input_bytes: plan.input_bytes,
        alignment,
        reused_plan: false,
        reallocated: false,
        allocated_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Op;
    use crate::tensor::{GgmlType, MAX_DIMS};
    use crate::CpuBackend;

    fn buft(alignment: usize, max_size: usize) -> BufferType {
        BufferType { name: "test".into(), alignment, max_size }
    }

    fn ne2(a: i64, b: i64) -> [i64; MAX_DIMS] {
        [a, b, 1, 1]
    }

    /// A node of `op` with the shape of `like` (element-wise).
    fn ew(ctx: &mut Context, op: Op, src: &[TensorId]) -> TensorId {
        let t = ctx.t(src[0]);
        let (ty, ne) = (t.ty, t.ne);
        ctx.push_op(ty, ne, op, src).unwrap()
    }

    /// Lifetime of every placed owner: (birth, death) node positions; -1 for
    /// tensors live before the first node, `usize::MAX` for pinned ones.
    fn lifetimes(ctx: &Context, g: &Graph, owner: TensorId) -> (i64, i64) {
        let t = ctx.t(owner);
        let pos = g.nodes.iter().position(|&n| n == owner);
        let birth = match pos {
            Some(p) if !t.flags.input => p as i64,
            _ => -1,
        };
        let owner_of = |id: TensorId| ctx.t(id).view_src.unwrap_or(id);
        let pinned = g.nodes.iter().chain(&g.leafs).any(|&id| {
            owner_of(id) == owner && (ctx.t(id).flags.input || ctx.t(id).flags.output || g.outputs.contains(&id))
        });
        if pinned {
            return (birth, i64::MAX);
        }
        let mut death = birth;
        for (p, &n) in g.nodes.iter().enumerate() {
            let nt = ctx.t(n);
            if nt.src.iter().any(|&s| owner_of(s) == owner) || nt.view_src == Some(owner) {
                death = death.max(p as i64);
            }
        }
        (birth, death)
    }

    /// Checks that no two placed tensors that are alive at the same time share
    /// bytes, except a legal in-place hand-over at the consumer's position.
    fn check_no_overlap(ctx: &Context, g: &Graph, placements: &[Placement], sizes: &[usize]) {
        for p in placements {
            assert!(p.offset + p.size <= sizes[p.buffer], "{p:?} outside buffer of {}", sizes[p.buffer]);
        }
        for (i, a) in placements.iter().enumerate() {
            for b in &placements[i + 1..] {
                if a.buffer != b.buffer || a.size == 0 || b.size == 0 {
                    continue;
                }
                if a.offset >= b.offset + b.size || b.offset >= a.offset + a.size {
                    continue;
                }
                let (ab, ad) = lifetimes(ctx, g, a.tensor);
                let (bb, bd) = lifetimes(ctx, g, b.tensor);
                if ad < bb || bd < ab {
                    continue;
                }
                let handover =
                    |x: &Placement, xd: i64, y: &Placement, yb: i64| xd == yb && y.inplace_of == Some(x.tensor);
                assert!(
                    handover(a, ad, b, bb) || handover(b, bd, a, ab),
                    "overlap: {a:?} alive {ab}..{ad} and {b:?} alive {bb}..{bd}"
                );
            }
        }
    }

    #[test]
    fn scale_chain_is_inplace() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(GgmlType::F32, 1000, 3).unwrap(); // 12000 bytes
        ctx.set_input(x).unwrap();
        let mut cur = x;
        for _ in 0..10 {
            cur = ew(&mut ctx, Op::Scale { s: 2.0, b: 0.0 }, &[cur]);
        }
        let g = ctx.build_forward(&[cur]).unwrap();
        let mut ga = GraphAllocator::new(buft(64, usize::MAX / 2));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        // x (12032 aligned) + one shared buffer for the whole chain.
        assert_eq!(st.peak_bytes, 2 * 12032);
        assert_eq!(st.n_inplace, 9);
        assert_eq!(st.naive_bytes, 11 * 12032);
        check_no_overlap(&ctx, &g, ga.placements(), &st.buffer_sizes);
    }

    #[test]
    fn non_inplace_chain_ping_pongs() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(GgmlType::F32, 256, 4).unwrap(); // 4096 bytes
        ctx.set_input(x).unwrap();
        let mut cur = x;
        for _ in 0..6 {
            cur = ew(&mut ctx, Op::Cont, &[cur]);
        }
        let g = ctx.build_forward(&[cur]).unwrap();
        let mut ga = GraphAllocator::new(buft(32, usize::MAX / 2));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        assert_eq!(st.n_inplace, 0);
        assert_eq!(st.peak_bytes, 3 * 4096);
        check_no_overlap(&ctx, &g, ga.placements(), &st.buffer_sizes);
    }

    #[test]
    fn add_chain_inplace_and_outputs_kept() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(GgmlType::F32, 64, 8).unwrap();
        ctx.set_input(x).unwrap();
        let b = ctx.new_tensor_2d(GgmlType::F32, 64, 8).unwrap();
        let mut cur = ew(&mut ctx, Op::Scale { s: 1.0, b: 0.0 }, &[x]);
        let mut mids = Vec::new();
        for _ in 0..5 {
            cur = ew(&mut ctx, Op::Add, &[cur, b]);
            mids.push(cur);
        }
        ctx.set_output(mids[2]).unwrap();
        let g = ctx.build_forward(&[cur]).unwrap();
        let mut ga = GraphAllocator::new(buft(64, usize::MAX / 2));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        // mids[3] cannot reuse the output mids[2].
        assert_eq!(st.n_inplace, 4);
        let pl = ga.placements();
        let find = |id| pl.iter().find(|p| p.tensor == id).unwrap();
        assert_eq!(find(mids[3]).inplace_of, None);
        assert_eq!(find(mids[4]).inplace_of, Some(mids[3]));
        check_no_overlap(&ctx, &g, pl, &st.buffer_sizes);
    }

    #[test]
    fn random_graphs_never_overlap() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let shapes = [ne2(64, 3), ne2(100, 7), ne2(33, 1), ne2(256, 16), ne2(0, 4)];
        for round in 0..200 {
            let mut ctx = Context::new();
            let mut all = Vec::new();
            for _ in 0..1 + rnd(4) {
                let s = shapes[rnd(shapes.len())];
                let l = ctx.push_op(GgmlType::F32, s, Op::None, &[]).unwrap();
                if rnd(2) == 0 {
                    ctx.set_input(l).unwrap();
                }
                all.push(l);
            }
            for _ in 0..5 + rnd(30) {
                let a = all[rnd(all.len())];
                let at = ctx.t(a).clone();
                let id = match rnd(6) {
                    0 => ew(&mut ctx, Op::Unary(crate::ops::UnaryOp::Silu), &[a]),
                    1 => {
                        let b = all.iter().copied().filter(|&b| ctx.t(b).ne == at.ne).nth(rnd(3)).unwrap_or(a);
                        ew(&mut ctx, if rnd(2) == 0 { Op::Add } else { Op::Mul }, &[a, b])
                    }
                    2 => ctx.push_op(GgmlType::F32, shapes[rnd(shapes.len())], Op::MulMat, &[a]).unwrap(),
                    3 => ctx.push_view(a, at.ty, at.ne, at.nb, 0, Op::View, &[a]).unwrap(),
                    4 => ew(&mut ctx, Op::Scale { s: 0.5, b: 0.0 }, &[a]),
                    _ => ew(&mut ctx, Op::Cont, &[a]),
                };
                if rnd(10) == 0 {
                    ctx.set_output(id).unwrap();
                }
                all.push(id);
            }
            let n_out = 1 + rnd(3);
            let outs: Vec<_> = all.iter().rev().take(n_out).copied().collect();
            let g = ctx.build_forward(&outs).unwrap();
            let align = [1, 32, 64][round % 3];
            let max = if round % 4 == 0 { 16384 } else { usize::MAX / 2 };
            let mut ga = GraphAllocator::new(buft(align, max));
            let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
            for p in ga.placements() {
                assert_eq!(p.offset % align, 0);
            }
            assert!(st.buffer_sizes.iter().all(|&s| s <= max));
            check_no_overlap(&ctx, &g, ga.placements(), &st.buffer_sizes);
        }
    }

    #[test]
    fn view_parent_inplace_frees_tail() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(GgmlType::F32, 64, 4).unwrap();
        ctx.set_input(x).unwrap();
        let big = ew(&mut ctx, Op::Cont, &[x]); // 1024 bytes
        let t = ctx.t(big).clone();
        let v = ctx.push_view(big, GgmlType::F32, ne2(64, 2), [4, 256, 512, 512], 0, Op::View, &[big]).unwrap();
        let _ = t;
        let s = ew(&mut ctx, Op::Scale { s: 3.0, b: 0.0 }, &[v]);
        let g = ctx.build_forward(&[s]).unwrap();
        let mut ga = GraphAllocator::new(buft(64, usize::MAX / 2));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        assert_eq!(st.n_inplace, 1);
        let p = ga.placements().iter().find(|p| p.tensor == s).unwrap();
        assert_eq!(p.inplace_of, Some(big));
        assert_eq!(st.peak_bytes, 1024 + 1024);
        check_no_overlap(&ctx, &g, ga.placements(), &st.buffer_sizes);
    }

    #[test]
    fn view_of_non_zero_offset_or_shared_src_not_inplace() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(GgmlType::F32, 64, 4).unwrap();
        ctx.set_input(x).unwrap();
        let big = ew(&mut ctx, Op::Cont, &[x]);
        let v = ctx.push_view(big, GgmlType::F32, ne2(64, 2), [4, 256, 512, 512], 512, Op::View, &[big]).unwrap();
        let s = ew(&mut ctx, Op::Scale { s: 3.0, b: 0.0 }, &[v]);
        // add(a, a) reads the owner twice: no in-place.
        let c = ew(&mut ctx, Op::Cont, &[x]);
        let d = ew(&mut ctx, Op::Add, &[c, c]);
        let g = ctx.build_forward(&[s, d]).unwrap();
        let mut ga = GraphAllocator::new(buft(64, usize::MAX / 2));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        assert_eq!(st.n_inplace, 0);
        check_no_overlap(&ctx, &g, ga.placements(), &st.buffer_sizes);
    }

    #[test]
    fn chunks_split_and_oversize_errors() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_2d(GgmlType::F32, 256, 1).unwrap(); // 1024 bytes
        ctx.set_input(x).unwrap();
        let mut outs = Vec::new();
        for _ in 0..5 {
            outs.push(ew(&mut ctx, Op::Cont, &[x]));
        }
        let g = ctx.build_forward(&outs).unwrap();
        let mut ga = GraphAllocator::new(buft(64, 2048));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        assert_eq!(st.buffer_sizes, vec![2048, 2048, 2048]);
        check_no_overlap(&ctx, &g, ga.placements(), &st.buffer_sizes);

        let mut ga = GraphAllocator::new(buft(64, 1000));
        match ga.measure(&ctx, &g, &TensorStorage::new()) {
            Err(Error::Alloc { detail }) => assert!(detail.contains("1024") && detail.contains("1000"), "{detail}"),
            other => panic!("expected an alloc error, got {other:?}"),
        }
    }

    #[test]
    fn unpadded_tensor_filling_max_size_fits() {
        let mut ctx = Context::new();
        let x = ctx.new_tensor_1d(GgmlType::F32, 25).unwrap(); // 100 bytes
        let y = ew(&mut ctx, Op::Cont, &[x]);
        let g = ctx.build_forward(&[y]).unwrap();
        let mut ga = GraphAllocator::new(buft(64, 100));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        assert_eq!(st.buffer_sizes, vec![100, 100]);
    }

    #[test]
    fn foreign_graph_and_storage_rejected() {
        let mut c1 = Context::new();
        let a = c1.new_tensor_1d(GgmlType::F32, 4).unwrap();
        let b = ew(&mut c1, Op::Cont, &[a]);
        let g1 = c1.build_forward(&[b]).unwrap();
        let c2 = Context::new();
        let mut ga = GraphAllocator::new(buft(64, 1 << 20));
        assert!(matches!(ga.measure(&c2, &g1, &TensorStorage::new()), Err(Error::ForeignTensor { .. })));
        let mut st2 = TensorStorage::new();
        st2.bind_ctx(&c2).unwrap();
        assert!(matches!(ga.measure(&c1, &g1, &st2), Err(Error::ForeignTensor { .. })));
        // A hand-edited graph naming a tensor of another context.
        let mut g_bad = g1.clone();
        g_bad.nodes.push(TensorId { ctx: c2.id(), idx: 0 });
        assert!(matches!(ga.measure(&c1, &g_bad, &TensorStorage::new()), Err(Error::ForeignTensor { .. })));
        let mut g_bad = g1.clone();
        g_bad.leafs.push(TensorId { ctx: c1.id(), idx: 999 });
        assert!(matches!(ga.measure(&c1, &g_bad, &TensorStorage::new()), Err(Error::ForeignTensor { .. })));
    }

    #[test]
    fn shuffled_graph_does_not_panic() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_1d(GgmlType::F32, 16).unwrap();
        let b = ew(&mut ctx, Op::Cont, &[a]);
        let c = ew(&mut ctx, Op::Scale { s: 1.0, b: 0.0 }, &[b]);
        let d = ew(&mut ctx, Op::Add, &[c, b]);
        let mut g = ctx.build_forward(&[d]).unwrap();
        g.nodes.reverse();
        g.nodes.push(c);
        g.leafs.clear();
        let mut ga = GraphAllocator::new(buft(64, 1 << 20));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        assert_eq!(st.n_allocated, 4);
    }

    #[test]
    fn zero_byte_and_empty_graph() {
        let mut ctx = Context::new();
        let a = ctx.new_tensor_2d(GgmlType::F32, 0, 4).unwrap();
        let b = ew(&mut ctx, Op::Scale { s: 1.0, b: 0.0 }, &[a]);
        let g = ctx.build_forward(&[b]).unwrap();
        let mut ga = GraphAllocator::new(buft(64, 1 << 20));
        let st = ga.measure(&ctx, &g, &TensorStorage::new()).unwrap();
        assert_eq!(st.peak_bytes, 0);
        assert_eq!(st.buffer_sizes, vec![0]);
        let be = CpuBackend::with_threads(1).unwrap();
        let mut storage = TensorStorage::new();
        ga.alloc_graph(&be, &ctx, &g, &mut storage).unwrap();
        assert!(storage.has_storage(&ctx, a) && storage.has_storage(&ctx, b));
    }

    #[test]
    fn alloc_graph_places_and_reuses_buffers() {
        let mut ctx = Context::new();
        let w = ctx.new_tensor_2d(GgmlType::F32, 64, 64).unwrap();
        let x = ctx.new_tensor_2d(GgmlType::F32, 64, 8).unwrap();
        ctx.set_input(x).unwrap();
        let h = ctx.push_op(GgmlType::F32, ne2(64, 8), Op::MulMat, &[w, x]).unwrap();
        let h2 = ew(&mut ctx, Op::Unary(crate::ops::UnaryOp::Silu), &[h]);
        let y = ew(&mut ctx, Op::Add, &[h2, x]);
        let be = CpuBackend::with_threads(1).unwrap();
        let mut storage = TensorStorage::new();
        storage.alloc_tensors(&be, &ctx, &[w]).unwrap();
        let g = ctx.build_forward(&[y]).unwrap();
        let mut ga = GraphAllocator::for_backend(&be);
        let s1 = ga.alloc_graph(&be, &ctx, &g, &mut storage).unwrap();
        assert!(s1.reallocated && !s1.reused_plan);
        assert_eq!(s1.n_allocated, 4); // x, h, h2, y (w is external)
        for id in [w, x, h, h2, y] {
            assert!(storage.has_storage(&ctx, id));
        }
        let n_buffers = storage.buffers().len();
        let s2 = ga.alloc_graph(&be, &ctx, &g, &mut storage).unwrap();
        assert!(!s2.reallocated && s2.reused_plan);
        assert_eq!(s1.peak_bytes, s2.peak_bytes);
        assert_eq!(storage.buffers().len(), n_buffers);
        // A bigger measured graph grows the buffers on the next alloc.
        let z = ctx.push_op(GgmlType::F32, ne2(1024, 64), Op::MulMat, &[y]).unwrap();
        let g2 = ctx.build_forward(&[z]).unwrap();
        let m = ga.measure(&ctx, &g2, &storage).unwrap();
        let s3 = ga.alloc_graph(&be, &ctx, &g, &mut storage).unwrap();
        assert!(s3.reallocated);
        assert!(s3.allocated_bytes >= m.peak_bytes);
        assert_eq!(storage.buffers().len(), n_buffers);
        let s4 = ga.alloc_graph(&be, &ctx, &g2, &mut storage).unwrap();
        assert!(!s4.reallocated);
        assert!(storage.has_storage(&ctx, z));
        // The previous graph's private tensors lost their (now shared) storage.
        assert!(!storage.has_storage(&ctx, h2) || g2.nodes.contains(&h2));
    }
}
