//! Device-resident storage of split tensors between graph runs (weights, KV
//! and recurrent caches, inputs), and host access to it in single-device
//! bytes: `set_tensor`/`get_tensor` of a split, mirrored or partial tensor,
//! whole or by byte range, through views and across segments, reads and
//! writes exactly the bytes one device would hold (ggml's
//! `ggml_backend_tensor_set`/`get` semantics: a byte range of the tensor's
//! memory, which for a view is a range of its owner's memory). Typed access
//! (`set_f32`/`get_f32`, `set_i32`/`get_i32`) takes and gives values in
//! logical element order and converts them to and from the tensor's type
//! (quantizing per device part on the way in).

use super::comm::BufSlice;
use super::layout::{box_bytes, boxes, local_ne, slice_local, sum_addends, LocalRun};
use super::planner::Plan;
use super::state::SplitState;
use crate::backend::MappedBytes;
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::{contiguous_strides, convert, GgmlType, TensorId};
use std::collections::HashMap;
use std::sync::Arc;

/// A device's local part of a tensor: host bytes, zeros not yet allocated,
/// or a slice of a buffer of device `device` (an executor device's
/// process-unique id). A device part is read to the host the first time
/// host code needs it and the copy kept until the part changes: runs write
/// into device parts in place, and the store then replaces the part's
/// handle (same buffer, no copy), so readers never see a stale copy.
#[derive(Debug)]
pub(crate) struct Part {
    len: usize,
    host: std::sync::OnceLock<Arc<Vec<u8>>>,
    dev: Option<(u64, BufSlice)>,
    /// Host bytes that are a range of a mapped file (a loaded weight, read
    /// in place; a device that computes on host memory adopts them).
    map: Option<MappedBytes>,
}

impl Part {
    /// A part held in host memory.
    pub(crate) fn host(bytes: Arc<Vec<u8>>) -> Arc<Part> {
        Arc::new(Part { len: bytes.len(), host: std::sync::OnceLock::from(bytes), dev: None, map: None })
    }

    /// A part whose bytes are a range of a mapped file (not copied).
    pub(crate) fn mapped(bytes: MappedBytes) -> Arc<Part> {
        Arc::new(Part { len: bytes.len(), host: std::sync::OnceLock::new(), dev: None, map: Some(bytes) })
    }

    /// The mapped file range holding the part's bytes, while it is not on a device.
    pub(crate) fn mapped_bytes(&self) -> Option<&MappedBytes> {
        self.map.as_ref().filter(|_| self.dev.is_none())
    }

    /// A zero-filled part of `len` bytes, allocated where it is first used
    /// (a device buffer starts zero-filled; the host allocates on a read).
    pub(crate) fn zeros(len: usize) -> Arc<Part> {
        Arc::new(Part { len, host: std::sync::OnceLock::new(), dev: None, map: None })
    }

    /// A part held in a buffer of device `device`.
    pub(crate) fn device(device: u64, slice: BufSlice) -> Arc<Part> {
        Arc::new(Part { len: slice.len, host: std::sync::OnceLock::new(), dev: Some((device, slice)), map: None })
    }

    /// The same device slice with no host copy (after the device wrote it).
    pub(crate) fn refreshed(&self) -> Arc<Part> {
        match &self.dev {
            Some((d, s)) => Part::device(*d, s.clone()),
            None => Arc::new(Part { len: self.len, host: self.host.clone(), dev: None, map: self.map.clone() }),
        }
    }

    /// The device slice, if the part lives on device `device`.
    pub(crate) fn slice_on(&self, device: u64) -> Option<&BufSlice> {
        self.dev.as_ref().filter(|d| d.0 == device).map(|d| &d.1)
    }

    /// The device holding the part, if any.
    pub(crate) fn device_id(&self) -> Option<u64> {
        self.dev.as_ref().map(|d| d.0)
    }

    /// True for a zero-filled part not allocated anywhere yet.
    pub(crate) fn is_lazy_zeros(&self) -> bool {
        self.dev.is_none() && self.map.is_none() && self.host.get().is_none()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The part's bytes in host memory (copied from the device once).
    ///
    /// # Errors
    /// The device's copy error.
    pub(crate) fn bytes(&self) -> Result<Arc<Vec<u8>>> {
        if let Some(m) = self.mapped_bytes() {
            let _ = self.host.set(Arc::new(m.bytes().to_vec()));
        }
        self.host_slice()?;
        self.host.get().cloned().ok_or_else(|| Error::Split { detail: "a part with no data".into() })
    }

    /// [`Part::bytes`], borrowed.
    ///
    /// # Errors
    /// As [`Part::bytes`].
    pub(crate) fn host_slice(&self) -> Result<&[u8]> {
        if let Some(m) = self.mapped_bytes().filter(|_| self.host.get().is_none()) {
            return Ok(m.bytes());
        }
        if self.host.get().is_none() {
            let mut v = vec![0u8; self.len];
            if let Some((_, s)) = &self.dev {
                s.buf.get(s.offset, &mut v)?;
            }
            let _ = self.host.set(Arc::new(v));
        }
        self.host.get().map(|b| b.as_slice()).ok_or_else(|| Error::Split { detail: "a part with no data".into() })
    }

    /// The bytes of `*part` to change in host memory: a host part of its
    /// own (shared bytes are copied first). Device parts are written with
    /// [`Part::write`] instead.
    ///
    /// # Errors
    /// As [`Part::bytes`].
    pub(crate) fn host_mut(part: &mut Arc<Part>) -> Result<&mut Vec<u8>> {
        if part.dev.is_some() || Arc::get_mut(part).is_none() || part.host.get().is_none() {
            *part = Part::host(part.bytes()?);
        }
        let p = Arc::get_mut(part).ok_or_else(|| Error::Split { detail: "a shared part".into() })?;
        let b = p.host.get_mut().ok_or_else(|| Error::Split { detail: "a part with no data".into() })?;
        Ok(Arc::make_mut(b))
    }
}

/// One stored tensor: its state and every device's contiguous local part.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub state: SplitState,
    pub locals: Vec<Arc<Part>>,
    /// Type and shape placed (a tensor id reused after `Context::truncate`
    /// with another shape is placed again).
    pub layout: Option<(crate::tensor::GgmlType, [i64; 4])>,
}

static NEXT_STORE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Per-device storage of non-view tensors over `n` devices.
///
/// Parts start in host memory (zero-filled ones are not allocated until
/// used); the first run of an executor moves every part it reads into its
/// devices' buffers, where later runs read and write them in place (a KV
/// cache written by `set_rows` is written where it lives, cell by cell).
/// [`SplitStore::set_tensor`] and [`SplitStore::get_tensor`] reach the parts
/// wherever they are. A clone is a snapshot: it copies device parts to host
/// memory (and they move to a device again when a run uses the clone).
#[derive(Debug, Default)]
pub struct SplitStore {
    n: usize,
    map: HashMap<TensorId, Stored>,
    /// Process-unique (a clone gets its own).
    id: u64,
    /// Changes whenever a part is replaced by other memory (placement,
    /// `set_locals`, a move to a device), never for writes in place: what
    /// an executor bound to the parts stays valid while it is unchanged.
    generation: u64,
}

impl Clone for SplitStore {
    fn clone(&self) -> Self {
        let snapshot = |p: &Arc<Part>| -> Arc<Part> {
            if p.device_id().is_none() {
                return p.clone();
            }
            match p.bytes() {
                Ok(b) => Part::host(b),
                Err(e) => {
                    log::error!("copying a device part for a store snapshot: {e}");
                    Part::zeros(p.len())
                }
            }
        };
        let map = self
            .map
            .iter()
            .map(|(k, v)| (*k, Stored { locals: v.locals.iter().map(snapshot).collect(), ..v.clone() }))
            .collect();
        SplitStore { n: self.n, map, id: NEXT_STORE.fetch_add(1, std::sync::atomic::Ordering::Relaxed), generation: 0 }
    }
}

impl SplitStore {
    /// Empty storage for `n_devices` devices.
    pub fn new(n_devices: usize) -> Self {
        SplitStore {
            n: n_devices,
            map: HashMap::new(),
            id: NEXT_STORE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            generation: 0,
        }
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        self.n
    }

    /// Which memory the store's parts are in: (process-unique store id,
    /// generation). It stays equal while writes go in place
    /// ([`SplitStore::set_tensor`], a run's cache writes) and changes when a
    /// part is replaced by other memory (a placement, a move to another
    /// device) or for a clone, so a caller that placed or bound something
    /// for the store (a graph's leafs, an executor's buffers) can tell
    /// whether that still holds. Never fails.
    pub fn binding_key(&self) -> (u64, u64) {
        (self.id, self.generation)
    }

    /// Allocates tensor `id` (not a view) in `state`, zero-filled: device
    /// `j` gets `local_ne(ne, state, j)` elements. Replaces an earlier placement.
    ///
    /// # Errors
    /// [`Error::Split`] for a store of 0 or more than 64 devices;
    /// [`Error::ForeignTensor`]/[`Error::InvalidOperand`] for a bad id;
    /// [`Error::Split`] for a view, an `Unknown` state, a split that does not
    /// fit the tensor or the device count, or a partial state of a type that
    /// cannot be summed.
    pub fn place(&mut self, ctx: &Context, id: TensorId, state: &SplitState) -> Result<()> {
        if self.n == 0 || self.n > 64 {
            return Err(Error::Split { detail: format!("a store for {} devices (1..=64)", self.n) });
        }
        let t = ctx.tensor(id)?;
        if t.view_src.is_some() {
            return Err(Error::Split { detail: format!("{:?} is a view; place its owner", t.name) });
        }
        let bad = |d: String| Error::Split { detail: format!("placing {:?} {}: {d}", t.name, t.describe()) };
        match state {
            SplitState::Unknown => return Err(bad("state Unknown".into())),
            SplitState::Split(s) => s.validate(t.ne[s.axis.min(3)], self.n).map_err(|e| bad(e.to_string()))?,
            SplitState::Partial(_) | SplitState::PartialOn(..) if !t.ty.is_float() && !t.ty.is_int() => {
                return Err(bad(format!("a partial {} cannot be summed", t.ty)))
            }
            _ => {}
        }
        let mut locals = Vec::with_capacity(self.n);
        for j in 0..self.n {
            let b = boxes(t.ne, state, j);
            if let SplitState::Split(s) = state {
                if s.axis == 0
                    && b[0]
                        .iter()
                        .any(|&(a, e)| a as usize % t.ty.block_size() != 0 || e as usize % t.ty.block_size() != 0)
                {
                    return Err(bad(format!("{} rows split off {}-element blocks", t.ty, t.ty.block_size())));
                }
            }
            locals.push(Part::zeros(box_bytes(t.ty, &b)));
        }
        self.map.insert(id, Stored { state: state.clone(), locals, layout: Some((t.ty, t.ne)) });
        self.generation += 1;
        Ok(())
    }

    /// Places every leaf of `graph` that is not placed yet (or was placed
    /// with another type or shape, as an input of an earlier step) in its
    /// planned state, zero-filled (so memory is allocated as the plan sizes
    /// it). A scratch destination ([`crate::tensor::TensorFlags::scratch`],
    /// what `cast` makes) is placed too, so host access to it works, but no
    /// program binds it: its part never moves onto a device, and its copy
    /// writes a fresh intermediate instead (the part keeps what the host
    /// gave it, zeros by default).
    ///
    /// # Errors
    /// As [`SplitStore::place`]; [`Error::Split`] if the plan is for another
    /// graph ([`Plan::check_graph`]) or device count.
    pub fn place_leafs(&mut self, ctx: &Context, graph: &Graph, plan: &Plan) -> Result<()> {
        plan.check_graph(ctx, graph)?;
        if plan.n_devices != self.n {
            return Err(Error::Split { detail: format!("plan for {} devices, store for {}", plan.n_devices, self.n) });
        }
        for &l in graph.leafs() {
            let t = ctx.tensor(l)?;
            let same = self.map.get(&l).is_some_and(|e| e.layout.is_none_or(|(ty, ne)| ty == t.ty && ne == t.ne));
            if t.view_src.is_none() && !same {
                let st = plan.state(l).cloned().unwrap_or(SplitState::Mirrored);
                self.place(ctx, l, &st)?;
            }
        }
        Ok(())
    }

    /// Replaces tensor `id`'s device parts with raw local bytes in `state`
    /// (`locals[j]` contiguous, of shape `local_ne(ne, state, j)`). Partial
    /// addends may differ per device; this is how an embedder hands over
    /// already-split data.
    ///
    /// # Errors
    /// As [`SplitStore::place`]; [`Error::DataMismatch`] for a wrong count or size.
    pub fn set_locals(&mut self, ctx: &Context, id: TensorId, state: &SplitState, locals: Vec<Vec<u8>>) -> Result<()> {
        let old = self.map.remove(&id);
        let placed = self.place(ctx, id, state);
        let fits = placed.is_ok()
            && self.map.get(&id).is_some_and(|e| {
                locals.len() == self.n && locals.iter().zip(&e.locals).all(|(a, b)| a.len() == b.len())
            });
        if !fits {
            // The earlier contents stay.
            self.map.remove(&id);
            if let Some(o) = old {
                self.map.insert(id, o);
            }
            placed?;
            return Err(Error::DataMismatch {
                name: ctx.t(id).name.clone(),
                detail: format!(
                    "{} device parts of {:?} bytes for {}",
                    locals.len(),
                    locals.iter().map(|l| l.len()).collect::<Vec<_>>(),
                    state.label()
                ),
            });
        }
        if let Some(e) = self.map.get_mut(&id) {
            e.locals = locals.into_iter().map(|l| Part::host(Arc::new(l))).collect();
        }
        Ok(())
    }

    /// Tensor `id`'s state and device parts, if placed (parts the devices
    /// keep, such as caches written by a run, are read from them first).
    /// `None` if not placed, or if a device cannot be read (logged).
    pub fn locals(&self, id: TensorId) -> Option<(&SplitState, Vec<&[u8]>)> {
        let e = self.map.get(&id)?;
        match e.locals.iter().map(|l| l.host_slice()).collect::<Result<Vec<_>>>() {
            Ok(parts) => Some((&e.state, parts)),
            Err(err) => {
                log::error!("reading the device parts of tensor #{}: {err}", id.index());
                None
            }
        }
    }

    /// Bytes stored on each device.
    pub fn bytes_per_device(&self) -> Vec<u64> {
        let mut out = vec![0u64; self.n];
        for e in self.map.values() {
            for (o, l) in out.iter_mut().zip(&e.locals) {
                *o += l.len() as u64;
            }
        }
        out
    }

    /// Bytes of each device's stored parts that live in device buffers:
    /// parts a run moved there (weights, KV and recurrent caches), used in
    /// place by the next run on the same devices.
    pub fn device_bytes(&self) -> Vec<u64> {
        let mut out = vec![0u64; self.n];
        for e in self.map.values() {
            for (o, l) in out.iter_mut().zip(&e.locals) {
                if l.device_id().is_some() {
                    *o += l.len() as u64;
                }
            }
        }
        out
    }

    /// The stored tensors.
    pub(crate) fn ids(&self) -> Vec<TensorId> {
        self.map.keys().copied().collect()
    }

    pub(crate) fn get_stored(&self, id: TensorId) -> Option<&Stored> {
        self.map.get(&id)
    }

    /// Replaces tensor `id`'s state and parts (other memory: the generation changes).
    pub(crate) fn put_stored(&mut self, id: TensorId, s: Stored) {
        self.map.insert(id, s);
        self.generation += 1;
    }

    /// Replaces device `j`'s part of `id` (other memory: the generation changes).
    pub(crate) fn put_part(&mut self, id: TensorId, j: usize, part: Arc<Part>) {
        if let Some(p) = self.map.get_mut(&id).and_then(|e| e.locals.get_mut(j)) {
            *p = part;
            self.generation += 1;
        }
    }

    /// Forgets the host copies of `ids`' device parts (a run wrote them in place).
    pub(crate) fn device_wrote(&mut self, ids: &[TensorId]) {
        for id in ids {
            if let Some(e) = self.map.get_mut(id) {
                for p in &mut e.locals {
                    // Only a host copy can be stale.
                    if p.device_id().is_some() && p.host.get().is_some() {
                        *p = p.refreshed();
                    }
                }
            }
        }
    }

    /// Makes the bytes of a mapped file range the whole of tensor `id`
    /// (placed, not a view; `bytes` as long as the tensor): each device part
    /// that is one contiguous run of the tensor's bytes (mirrored, partial
    /// on device 0, a split of a matrix's rows) refers to its range of the
    /// file without copying, and moves onto a device that computes on host
    /// memory as a mapping of the same pages ([`crate::Backend::map_buffer`]);
    /// other parts are copied out, as [`SplitStore::set_tensor`] does. What
    /// the parts held before is replaced.
    ///
    /// # Errors
    /// [`Error::Split`] if `id` is not placed or is a view;
    /// [`Error::DataMismatch`] if `bytes` is not the tensor's size.
    pub fn set_tensor_mapped(&mut self, ctx: &Context, id: TensorId, bytes: &MappedBytes) -> Result<()> {
        let t = ctx.tensor(id)?;
        if t.view_src.is_some() {
            return Err(Error::Split { detail: format!("{:?} is a view; load into its owner", t.name) });
        }
        if bytes.len() != t.nbytes() || bytes.len() != t.data_bytes() {
            return Err(Error::DataMismatch {
                name: t.name.clone(),
                detail: format!("{} mapped bytes for {} ({} bytes)", bytes.len(), t.describe(), t.nbytes()),
            });
        }
        let e = self.map.get(&id).ok_or_else(|| self.not_placed(ctx, id))?;
        let state = e.state.clone();
        let mut locals = Vec::with_capacity(e.locals.len());
        for (j, p) in e.locals.iter().enumerate() {
            let part = match super::layout::local_run(t.ty, t.ne, &state, j)? {
                LocalRun::Run(r) => Part::mapped(bytes.sub(r.start, r.len()).ok_or_else(|| oob(&t.name))?),
                LocalRun::Zeros => Part::zeros(p.len()),
                LocalRun::Gathered => Part::host(Arc::new(slice_local(t.ty, t.ne, bytes.bytes(), &state, j)?)),
            };
            if part.len() != p.len() {
                return Err(Error::Split {
                    detail: format!("{:?}: a part of {} bytes for {}", t.name, part.len(), p.len()),
                });
            }
            locals.push(part);
        }
        if let Some(e) = self.map.get_mut(&id) {
            e.locals = locals;
        }
        self.generation += 1;
        Ok(())
    }

    /// Writes `data` at byte `offset` of tensor `id`'s single-device memory
    /// (for a view: of its owner's memory, from the view's offset), into
    /// every device part that holds those bytes, where the part lives (a
    /// device buffer is written in place). For a partial tensor device 0
    /// receives the values and the others zeros, so the sum is `data`.
    ///
    /// # Errors
    /// [`Error::Split`] if the owner is not placed, the range leaves the
    /// tensor, or a partial range is not element-aligned; device copy errors.
    pub fn set_tensor(&mut self, ctx: &Context, id: TensorId, offset: usize, data: &[u8]) -> Result<()> {
        let (owner, start) = self.resolve(ctx, id, offset, data.len())?;
        let t = ctx.t(owner).clone();
        let e = self.map.get_mut(&owner).ok_or_else(|| Error::Split { detail: "store".into() })?;
        let partial = e.state.is_partial();
        let first = e.state.holders(e.locals.len()).iter().next().unwrap_or(0);
        if partial && (start % t.ty.type_size() != 0 || data.len() % t.ty.type_size() != 0) {
            return Err(Error::Split { detail: format!("partial {:?}: byte range not on elements", t.name) });
        }
        let state = e.state.clone();
        if start == 0 && data.len() == t.nbytes() && data.len() == t.data_bytes() {
            // The whole tensor: each part is written whole, where it lives.
            for (j, p) in e.locals.iter_mut().enumerate() {
                let bytes = slice_local(t.ty, t.ne, data, &state, j)?;
                *p = match &p.dev {
                    Some((d, s)) => {
                        s.buf.set(s.offset, &bytes)?;
                        Arc::new(Part {
                            len: s.len,
                            host: std::sync::OnceLock::from(Arc::new(bytes)),
                            dev: Some((*d, s.clone())),
                            map: None,
                        })
                    }
                    None => Part::host(Arc::new(bytes)),
                };
            }
            return Ok(());
        }
        // A byte range: device parts are patched in a host copy and the
        // changed span written back; host parts in place.
        let n = e.locals.len();
        let mut copies: Vec<Option<Vec<u8>>> = vec![None; n];
        let mut spans: Vec<Option<(usize, usize)>> = vec![None; n];
        let locals = &mut e.locals;
        for_each_run(&t, &state, n, start, data.len(), &mut |j, local, src| {
            if locals[j].dev.is_some() {
                if copies[j].is_none() {
                    copies[j] = Some(locals[j].bytes()?.to_vec());
                }
            } else if copies[j].is_none() {
                copies[j] = Some(std::mem::take(Part::host_mut(&mut locals[j])?));
            }
            let c = copies[j].as_mut().ok_or_else(|| oob(&t.name))?;
            let d = c.get_mut(local..local + src.len()).ok_or_else(|| oob(&t.name))?;
            if partial && j != first {
                d.fill(0);
            } else {
                d.copy_from_slice(&data[src.clone()]);
            }
            let s = spans[j].get_or_insert((local, local + src.len()));
            *s = (s.0.min(local), s.1.max(local + src.len()));
            Ok(())
        })?;
        for (j, c) in copies.into_iter().enumerate() {
            let Some(c) = c else { continue };
            let p = &mut locals[j];
            *p = match &p.dev {
                Some((d, s)) => {
                    if let Some((lo, hi)) = spans[j] {
                        s.buf.set(s.offset + lo, &c[lo..hi])?;
                    }
                    Arc::new(Part {
                        len: s.len,
                        host: std::sync::OnceLock::from(Arc::new(c)),
                        dev: Some((*d, s.clone())),
                        map: None,
                    })
                }
                None => Part::host(Arc::new(c)),
            };
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at byte `offset` of tensor `id`'s
    /// single-device memory (a view reads its owner's memory), assembling
    /// split parts and summing partial addends.
    ///
    /// # Errors
    /// As [`SplitStore::set_tensor`].
    pub fn get_tensor(&self, ctx: &Context, id: TensorId, offset: usize, out: &mut [u8]) -> Result<()> {
        let (owner, start) = self.resolve(ctx, id, offset, out.len())?;
        let t = ctx.t(owner);
        let e = &self.map[&owner];
        let first = e.state.holders(e.locals.len()).iter().next().unwrap_or(0);
        if e.state.is_partial() {
            if start % t.ty.type_size() != 0 || out.len() % t.ty.type_size() != 0 {
                return Err(Error::Split { detail: format!("partial {:?}: byte range not on elements", t.name) });
            }
            let parts: Vec<&[u8]> = e
                .locals
                .iter()
                .enumerate()
                .filter(|(j, _)| !e.state.outside(*j))
                .map(|(_, l)| l)
                .map(|l| l.host_slice()?.get(start..start + out.len()).ok_or_else(|| oob(&t.name)))
                .collect::<Result<_>>()?;
            out.copy_from_slice(&sum_addends(t.ty, &parts)?);
            return Ok(());
        }
        for_each_run(t, &e.state, e.locals.len(), start, out.len(), &mut |j, local, dst| {
            let s = e.locals[j].host_slice()?.get(local..local + dst.len()).ok_or_else(|| oob(&t.name))?;
            // Mirrored: the first holder's copy; split: the one owner.
            if j == first || !matches!(e.state, SplitState::Mirrored | SplitState::MirroredOn(_)) {
                out[dst].copy_from_slice(s);
            }
            Ok(())
        })
    }

    /// The error for a tensor the store does not hold: [`Error::ForeignTensor`]
    /// when the store holds tensors of other contexts only (the caller passed
    /// a context other than the one the store was placed from), else
    /// [`Error::Split`] naming the tensor as not placed.
    pub(crate) fn not_placed(&self, ctx: &Context, id: TensorId) -> Error {
        let foreign = !self.map.is_empty() && self.map.keys().all(|k| k.ctx != id.ctx);
        if foreign {
            let other = self.map.keys().next().map_or(0, |k| k.ctx);
            return Error::ForeignTensor {
                id: id.idx,
                ctx: id.ctx,
                detail: format!(
                    "the store holds the tensors of context {other}, not of context {} (tensor {:?})",
                    id.ctx,
                    ctx.t(id).name
                ),
            };
        }
        Error::Split { detail: format!("tensor {:?} is not placed on the devices", ctx.t(id).name) }
    }

    /// The non-view owner of `id` and the byte offset in it, checked against its placement.
    fn resolve(&self, ctx: &Context, id: TensorId, offset: usize, len: usize) -> Result<(TensorId, usize)> {
        let t = ctx.tensor(id)?;
        let (owner, base) = match t.view_src {
            Some(o) => (o, t.view_offs),
            None => (id, 0),
        };
        if !self.map.contains_key(&owner) {
            return Err(self.not_placed(ctx, owner));
        }
        let size = ctx.t(owner).nbytes();
        let own_len = t.nbytes();
        let start = base.checked_add(offset).ok_or_else(|| oob(&t.name))?;
        if offset.checked_add(len).is_none_or(|e| e > own_len) || start + len > size {
            return Err(Error::Split {
                detail: format!("bytes {offset}..{} of {:?} ({own_len} bytes)", offset.saturating_add(len), t.name),
            });
        }
        Ok((owner, start))
    }
}

fn oob(name: &str) -> Error {
    Error::Split { detail: format!("byte range outside tensor {name:?}") }
}

/// Calls `f(device, local_offset, range_in_data)` for every contiguous run
/// of bytes `[start, start + len)` of contiguous tensor `t`'s single-device
/// memory, on every device holding them under `state` (one device for a
/// split, all for mirrored and partial).
fn for_each_run(
    t: &crate::tensor::Tensor,
    state: &SplitState,
    n: usize,
    start: usize,
    len: usize,
    f: &mut dyn FnMut(usize, usize, std::ops::Range<usize>) -> Result<()>,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let Some(s) = state.as_split() else {
        for j in (0..n).filter(|&j| !state.outside(j)) {
            f(j, start, 0..len)?;
        }
        return Ok(());
    };
    let rs = t.ty.row_size(t.ne[0])?;
    let (ts, bs) = (t.ty.type_size(), t.ty.block_size() as i64);
    if rs == 0 {
        return Ok(());
    }
    let end = start + len;
    let locals: Vec<[i64; 4]> = (0..n).map(|j| local_ne(t.ne, state, j)).collect();
    let lnb: Vec<[usize; 4]> = locals.iter().map(|l| contiguous_strides(t.ty, l)).collect();
    let ranges: Vec<Vec<(i64, i64)>> = (0..n).map(|j| s.ranges(j)).collect();
    // Device and local index of logical index x along the split axis.
    let owner_of = |x: i64| {
        ranges.iter().enumerate().find_map(|(j, rr)| crate::ops::distributed::local_pos(rr, x).map(|p| (j, p)))
    };
    let mut row = start / rs;
    while row * rs < end {
        let (r0, r1) = (start.max(row * rs) - row * rs, end.min((row + 1) * rs) - row * rs);
        let i1 = row as i64 % t.ne[1].max(1);
        let i2 = (row as i64 / t.ne[1].max(1)) % t.ne[2].max(1);
        let i3 = row as i64 / (t.ne[1].max(1) * t.ne[2].max(1));
        let mut idx = [0i64, i1, i2, i3];
        if s.axis == 0 {
            // The row is cut into device ranges of whole blocks.
            for (j, rr) in ranges.iter().enumerate() {
                let lrow = (i1 as usize) * lnb[j][1] + (i2 as usize) * lnb[j][2] + (i3 as usize) * lnb[j][3];
                let mut base = 0usize;
                for &(a, b) in rr {
                    let (ba, bb) = ((a / bs) as usize * ts, (b / bs) as usize * ts);
                    let (lo, hi) = (ba.max(r0), bb.min(r1));
                    if lo < hi {
                        f(j, lrow + base + lo - ba, row * rs + lo - start..row * rs + hi - start)?;
                    }
                    base += bb - ba;
                }
            }
        } else {
            let (j, li) = owner_of(idx[s.axis]).ok_or_else(|| oob(&t.name))?;
            idx[s.axis] = li;
            let lrow = (idx[1] as usize) * lnb[j][1] + (idx[2] as usize) * lnb[j][2] + (idx[3] as usize) * lnb[j][3];
            f(j, lrow + r0, row * rs + r0 - start..row * rs + r1 - start)?;
        }
        row += 1;
    }
    Ok(())
}

/// Typed host access: values in logical element order (ggml order, `ne[0]`
/// fastest), converted to and from the tensor's type on the way.
impl SplitStore {
    /// Writes the whole of tensor `id` from `values`, one f32 per element in
    /// logical order (ggml order: `ne[0]` fastest), converted to the
    /// tensor's type: F32 as is, F16/BF16 rounded as ggml does, F64
    /// widened, and every block-quantized type (Q4_0 … Q8_K) quantized
    /// with ggml's reference quantizer (`ggml_quantize_chunk`, through
    /// [`crate::tensor::quant::quantize_chunk`]). The stored bytes are
    /// exactly what one device holds after [`crate::TensorStorage::set_f32`]
    /// of the same values (ggml's `ggml_backend_tensor_set` of the
    /// converted row data).
    ///
    /// Conversion happens per device part, on the way in: for a split
    /// tensor, device `j`'s values ([`super::slice_local`] of `values` as
    /// an F32 tensor of the same shape and state, segments and repeats
    /// included) are converted row by row into that part's bytes, which
    /// are written whole where the part lives (a device buffer in place, as
    /// after a run, or host memory). The full single-device byte image of a
    /// split tensor is never built: besides `values` (the caller's) and the
    /// stored parts themselves, the peak extra host memory is one device's
    /// local f32 values plus its converted bytes (for a part on a device,
    /// freed once written). A mirrored tensor is converted once and every
    /// device gets the same bytes (host parts share them); a partial one
    /// puts the values on device 0 and zeros on the others, so the sum is
    /// `values`.
    ///
    /// A view is accepted when it is contiguous, of its owner's type, and
    /// covers whole rows of its owner (its bytes are then converted and
    /// written with [`SplitStore::set_tensor`] through the view).
    ///
    /// Non-finite values are converted as ggml converts them, not refused:
    /// F16/BF16 keep ±inf and NaN (and round values beyond their range to
    /// ±inf); a quantized block with a NaN or ±inf among its values takes
    /// whatever ggml's quantizer makes of it (a Q8_0 block with an inf
    /// reads back as NaN, a Q4_K block with a NaN as zeros). Check the
    /// values first if they may hold such numbers.
    ///
    /// # Errors
    /// [`Error::DataMismatch`] naming the tensor and both counts for a
    /// `values.len()` other than its element count;
    /// [`Error::UnsupportedType`] for an integer tensor (use
    /// [`SplitStore::set_i32`]); [`Error::Split`] naming the tensor if it is
    /// not placed (or placed with another type or shape), its state is
    /// `Unknown`, a split along axis 0 cuts inside a quantization block, or
    /// it is a view of another kind; [`Error::ForeignTensor`] for a bad id;
    /// device copy errors.
    pub fn set_f32(&mut self, ctx: &Context, id: TensorId, values: &[f32]) -> Result<()> {
        let t = ctx.tensor(id)?;
        check_count(t, values.len())?;
        if !(t.ty.is_float() || t.ty.is_quantized()) {
            return Err(Error::unsupported_type(
                t.ty,
                format!(
                    "set_f32 of tensor {:?} {}: needs a float or quantized tensor (set_i32 for I32)",
                    t.name,
                    t.describe()
                ),
            ));
        }
        let ty = t.ty;
        if t.view_src.is_some() {
            check_row_view(ctx, t, "set_f32")?;
            let bytes = convert::encode_rows(ty, values, t.ne[0].max(0) as usize)?;
            return self.set_tensor(ctx, id, 0, &bytes);
        }
        self.write_converted(ctx, id, bytemuck::cast_slice(values), &|local: Vec<u8>, ne0| {
            match bytemuck::try_cast_slice::<u8, f32>(&local) {
                Ok(v) => convert::encode_rows(ty, v, ne0),
                // A byte buffer not aligned for f32 (the allocator's choice): decoded first.
                Err(_) => {
                    let v: Vec<f32> =
                        local.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                    convert::encode_rows(ty, &v, ne0)
                }
            }
        })
    }

    /// Reads the whole of tensor `id` as f32 values in logical element order
    /// (ggml order, `ne[0]` fastest), converted from its type (F32, F16,
    /// BF16, F64; block-quantized types dequantized as ggml's
    /// `dequantize_row_*`, through [`crate::tensor::quant::dequantize_row`]):
    /// split parts assembled, partial addends summed, a mirrored tensor read
    /// from device 0, exactly as [`crate::TensorStorage::get_f32`] reads one
    /// device. A view (strided or permuted too) reads its logical elements
    /// from its owner's memory. Peak extra host memory: the tensor's bytes
    /// (single-device size) plus the returned values.
    ///
    /// # Errors
    /// [`Error::UnsupportedType`] for an integer tensor (use
    /// [`SplitStore::get_i32`]); [`Error::Split`] if it is not placed, or a
    /// quantized view whose rows are not packed; device copy errors.
    pub fn get_f32(&self, ctx: &Context, id: TensorId) -> Result<Vec<f32>> {
        let t = ctx.tensor(id)?;
        if !(t.ty.is_float() || t.ty.is_quantized()) {
            return Err(Error::unsupported_type(
                t.ty,
                format!(
                    "get_f32 of tensor {:?} {}: needs a float or quantized tensor (get_i32 for I32)",
                    t.name,
                    t.describe()
                ),
            ));
        }
        if t.nelements() <= 0 {
            return Ok(Vec::new());
        }
        if t.ty.is_quantized() && !t.is_contiguous_rows() {
            return Err(Error::Split {
                detail: format!("get_f32 of {:?} {}: a quantized view with unpacked rows", t.name, t.describe()),
            });
        }
        let mut raw = vec![0u8; t.nbytes()];
        self.get_tensor(ctx, id, 0, &mut raw)?;
        convert::read_elements(t, &raw)
    }

    /// Writes the whole of I32 tensor `id` from `values` in logical element
    /// order (ggml order, `ne[0]` fastest): positions, token ids, row
    /// indices. Per device part as [`SplitStore::set_f32`] (no full copy;
    /// mirrored: the same bytes on every device; partial: device 0 holds
    /// the values, the others zeros). A contiguous view writes its owner's
    /// bytes through [`SplitStore::set_tensor`]. The stored bytes equal one
    /// device's after [`crate::TensorStorage::set_i32`].
    ///
    /// # Errors
    /// [`Error::UnsupportedType`] naming the type for a tensor that is not
    /// I32; [`Error::DataMismatch`] naming the tensor and both counts for a
    /// wrong `values.len()`; [`Error::Split`] if it is not placed, its state
    /// is `Unknown`, or it is a non-contiguous view; device copy errors.
    pub fn set_i32(&mut self, ctx: &Context, id: TensorId, values: &[i32]) -> Result<()> {
        let t = ctx.tensor(id)?;
        if t.ty != GgmlType::I32 {
            return Err(Error::unsupported_type(
                t.ty,
                format!("set_i32 of tensor {:?} {}: needs an I32 tensor", t.name, t.describe()),
            ));
        }
        check_count(t, values.len())?;
        let le: Vec<u8>;
        let bytes: &[u8] = if cfg!(target_endian = "little") {
            bytemuck::cast_slice(values)
        } else {
            le = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            &le
        };
        if t.view_src.is_some() {
            if !t.is_contiguous() {
                return Err(Error::Split {
                    detail: format!("set_i32 of view {:?} {}: only a contiguous view", t.name, t.describe()),
                });
            }
            return self.set_tensor(ctx, id, 0, bytes);
        }
        self.write_converted(ctx, id, bytes, &|local, _| Ok(local))
    }

    /// Reads the whole of I32 tensor `id` in logical element order (ggml
    /// order, `ne[0]` fastest; a view reads its logical elements from its
    /// owner), split parts assembled and partial addends summed.
    ///
    /// # Errors
    /// [`Error::UnsupportedType`] naming the type for a tensor that is not
    /// I32; [`Error::Split`] if it is not placed; device copy errors.
    pub fn get_i32(&self, ctx: &Context, id: TensorId) -> Result<Vec<i32>> {
        let t = ctx.tensor(id)?;
        if t.ty != GgmlType::I32 {
            return Err(Error::unsupported_type(
                t.ty,
                format!("get_i32 of tensor {:?} {}: needs an I32 tensor", t.name, t.describe()),
            ));
        }
        if t.nelements() <= 0 {
            return Ok(Vec::new());
        }
        let mut raw = vec![0u8; t.nbytes()];
        self.get_tensor(ctx, id, 0, &mut raw)?;
        let ne = t.ne.map(|x| x.max(0) as usize);
        let mut out = Vec::with_capacity(t.nelements() as usize);
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    for i0 in 0..ne[0] {
                        let o = i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
                        let c = raw.get(o..o + 4).ok_or_else(|| Error::Split {
                            detail: format!("get_i32 of {:?}: bytes outside the tensor", t.name),
                        })?;
                        out.push(i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Writes every device part of non-view tensor `id` whole from `elems`,
    /// the tensor's values as 4-byte units in logical order: device `j`'s
    /// units ([`super::slice_local`] as an F32 tensor of the same shape and
    /// state) go through `convert(units, local ne[0])` into its bytes. Every
    /// check is made before any part is written.
    fn write_converted(
        &mut self,
        ctx: &Context,
        id: TensorId,
        elems: &[u8],
        convert: &dyn Fn(Vec<u8>, usize) -> Result<Vec<u8>>,
    ) -> Result<()> {
        let t = ctx.tensor(id)?;
        let bad = |d: String| Error::Split { detail: format!("tensor {:?} {}: {d}", t.name, t.describe()) };
        if !self.map.contains_key(&id) {
            return Err(self.not_placed(ctx, id));
        }
        let e = self.map.get_mut(&id).ok_or_else(|| bad("not placed on the devices".into()))?;
        if e.layout.is_some_and(|l| l != (t.ty, t.ne)) {
            return Err(bad("placed with another type or shape; place it again".into()));
        }
        let state = e.state.clone();
        if let SplitState::Unknown = state {
            return Err(bad("stored in the Unknown state".into()));
        }
        let bs = t.ty.block_size() as i64;
        for (j, p) in e.locals.iter().enumerate() {
            if let SplitState::Split(s) = &state {
                if s.axis == 0 && s.ranges(j).iter().any(|&(a, b)| a % bs != 0 || b % bs != 0) {
                    return Err(bad(format!(
                        "device {j} holds elements {:?} of each row, which cut inside {}-element {} blocks",
                        s.ranges(j),
                        bs,
                        t.ty
                    )));
                }
            }
            let want = box_bytes(t.ty, &boxes(t.ne, &state, j));
            if p.len() != want {
                return Err(bad(format!("device {j} holds {} bytes, its part is {want}", p.len())));
            }
        }
        let ne0 = t.ne[0].max(0) as usize;
        match &state {
            SplitState::Split(_) => {
                for (j, p) in e.locals.iter_mut().enumerate() {
                    let local = slice_local(GgmlType::F32, t.ne, elems, &state, j).map_err(|x| bad(x.to_string()))?;
                    let lne0 = local_ne(t.ne, &state, j)[0].max(0) as usize;
                    write_whole(p, Arc::new(convert(local, lne0)?))?;
                }
            }
            SplitState::Partial(_) | SplitState::PartialOn(..) => {
                let bytes = Arc::new(convert(elems.to_vec(), ne0)?);
                let first = state.holders(e.locals.len()).iter().next().unwrap_or(0);
                for (j, p) in e.locals.iter_mut().enumerate() {
                    if j == first {
                        write_whole(p, bytes.clone())?;
                    } else if !state.outside(j) {
                        write_zeros(p)?;
                    }
                }
            }
            _ => {
                // Mirrored: converted once, the same bytes on every device
                // (of the group).
                let bytes = Arc::new(convert(elems.to_vec(), ne0)?);
                for (j, p) in e.locals.iter_mut().enumerate() {
                    if !state.outside(j) {
                        write_whole(p, bytes.clone())?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// [`Error::DataMismatch`] unless `got` is `t`'s element count.
fn check_count(t: &crate::tensor::Tensor, got: usize) -> Result<()> {
    if got as i64 != t.nelements() {
        return Err(Error::DataMismatch {
            name: t.name.clone(),
            detail: format!("{got} values for {} ({} elements)", t.describe(), t.nelements()),
        });
    }
    Ok(())
}

/// Checks that view `t` is contiguous, of its owner's type, and covers
/// whole rows of its owner, so its values convert on their own.
fn check_row_view(ctx: &Context, t: &crate::tensor::Tensor, what: &str) -> Result<()> {
    let Some(o) = t.view_src else { return Ok(()) };
    let ot = ctx.tensor(o)?;
    let rs = ot.row_bytes();
    let whole_rows = rs > 0 && t.view_offs % rs == 0 && t.nbytes() % rs == 0;
    if ot.view_src.is_some() || ot.ty != t.ty || !t.is_contiguous() || !whole_rows {
        return Err(Error::Split {
            detail: format!(
                "{what} of view {:?} {} at byte {} of {:?} {}: only a contiguous view of whole rows of its owner, of the owner's type",
                t.name,
                t.describe(),
                t.view_offs,
                ot.name,
                ot.describe()
            ),
        });
    }
    Ok(())
}

/// Writes `bytes` as the whole of part `*p`, where it lives: a device part
/// in place (no host copy kept; it is read back when needed), a host part
/// replaced by `bytes` (shared between the mirrored copies).
fn write_whole(p: &mut Arc<Part>, bytes: Arc<Vec<u8>>) -> Result<()> {
    if bytes.len() != p.len {
        return Err(Error::Split { detail: format!("{} converted bytes for a part of {}", bytes.len(), p.len) });
    }
    *p = match &p.dev {
        Some((d, s)) => {
            s.buf.set(s.offset, &bytes)?;
            Part::device(*d, s.clone())
        }
        None => Part::host(bytes),
    };
    Ok(())
}

/// Zero-fills part `*p`: a device part in place (in chunks of at most 1 MiB),
/// a host part becomes zeros allocated when first used.
fn write_zeros(p: &mut Arc<Part>) -> Result<()> {
    *p = match &p.dev {
        Some((d, s)) => {
            let zeros = vec![0u8; s.len.min(1 << 20)];
            let mut at = 0;
            while at < s.len {
                let k = zeros.len().min(s.len - at);
                s.buf.set(s.offset + at, &zeros[..k])?;
                at += k;
            }
            Part::device(*d, s.clone())
        }
        None => Part::zeros(p.len),
    };
    Ok(())
}
