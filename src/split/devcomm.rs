//! The collectives over device buffers: the same algorithms, messages and
//! byte counts as [`Comm`](super::Comm)'s host methods (so a run still matches its
//! plan's traffic), with the packing, unpacking and sums done by local
//! graphs on each device (`cpy` between views, `add`) and the messages moved
//! by [`Comm::exchange_buffers`](super::Comm::exchange_buffers) (device-to-device copies, or NCCL).
//!
//! A message holds a region of a tensor in the layout [`super::layout`]
//! defines for boxes (per axis the region's ranges, concatenated; ggml's
//! contiguous order), as the host collectives' `pack` does. A region that is
//! one contiguous run of its buffer needs no graph: it is sent as a slice of
//! that buffer, or copied into place buffer to buffer — so an all-reduce is
//! one `add` graph and copies. Block-quantized types keep the host path
//! (see [`movable`]).

use super::comm::{owed, BufSlice};
use super::exec::{Device, Input, Part, Results};
use super::layout::{box_bytes, boxes, intersect, lens, local_pos, Boxes};
use super::state::SplitState;
use crate::error::{Error, Result};
use crate::graph::Context;
use crate::tensor::{contiguous_strides, GgmlType, TensorId};
use std::sync::Arc;

/// True if a conversion of a `ty` tensor from state `from` runs on the
/// devices: element types (views of block types along axis 0 would need
/// whole blocks; such tensors are rare between steps), and for partial sums
/// the types `add` computes (F32, F16, BF16; integer partial sums, which
/// only index arithmetic makes, take the host path).
pub(crate) fn movable(ty: GgmlType, from: &SplitState) -> bool {
    match from {
        SplitState::Partial(_) => matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16),
        _ => !ty.is_quantized(),
    }
}

/// Adds to `l` the copies of `region` from `src` (laid out as `src_boxes`)
/// to `dst` (laid out as `dst_boxes`): one `cpy` between views per box of
/// the region (each of its ranges lies in one range of either layout, as
/// `intersect` gives them). Returns the copies (the graph's outputs).
fn region_copies(
    l: &mut Context,
    region: &Boxes,
    src: TensorId,
    src_boxes: &Boxes,
    dst: TensorId,
    dst_boxes: &Boxes,
) -> Result<Vec<TensorId>> {
    let bad = || Error::Split { detail: "a collective's region lies outside its buffer".into() };
    let mut out = Vec::new();
    let view = |l: &mut Context, t: TensorId, layout: &Boxes, r: [(i64, i64); 4]| -> Result<TensorId> {
        let nb = l.t(t).nb;
        let mut offset = 0usize;
        for (k, &(s, _)) in r.iter().enumerate() {
            offset += local_pos(&layout[k], s).ok_or_else(bad)? as usize * nb[k];
        }
        let e = r.map(|(s, e)| e - s);
        l.view_4d(t, e[0], e[1], e[2], e[3], nb[1], nb[2], nb[3], offset)
    };
    for &r3 in &region[3] {
        for &r2 in &region[2] {
            for &r1 in &region[1] {
                for &r0 in &region[0] {
                    let r = [r0, r1, r2, r3];
                    let vs = view(l, src, src_boxes, r)?;
                    let vd = view(l, dst, dst_boxes, r)?;
                    out.push(l.cpy(vs, vd)?);
                }
            }
        }
    }
    Ok(out)
}

/// The byte range `(offset, len)` of `region` in a `ty` buffer laid out as
/// `layout`, when the region is one contiguous run there.
fn contiguous_span(ty: GgmlType, region: &Boxes, layout: &Boxes) -> Option<(usize, usize)> {
    if ty.is_quantized() || region.iter().any(|r| r.len() != 1) {
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
    let mut offset = 0usize;
    for k in 0..4 {
        offset += local_pos(&layout[k], region[k][0].0)? as usize * nb[k];
    }
    Some((offset, box_bytes(ty, region)))
}

/// A local graph being built over device buffers: its context, the buffers
/// bound to its leafs, and the copies it makes.
struct Local {
    l: Context,
    inputs: Vec<(TensorId, Input)>,
    outs: Vec<TensorId>,
}

impl Local {
    fn new() -> Self {
        Local { l: Context::new(), inputs: Vec::new(), outs: Vec::new() }
    }

    /// A leaf of type `ty` laid out as `layout`, bound to `buf`.
    fn leaf(&mut self, ty: GgmlType, layout: &Boxes, buf: &BufSlice) -> Result<TensorId> {
        let t = self.l.new_tensor(ty, &lens(layout))?;
        self.inputs.push((t, Input::Buffer(buf.clone())));
        Ok(t)
    }

    /// Copies `region` from `src` (laid out as `src_boxes`) into `dst` (laid
    /// out as `dst_boxes`), both `ty`: a buffer copy now when the region is
    /// contiguous in both, else `cpy` nodes of this graph.
    fn copy(&mut self, ty: GgmlType, region: &Boxes, src: (&BufSlice, &Boxes), dst: (&BufSlice, &Boxes)) -> Result<()> {
        if box_bytes(ty, region) == 0 {
            return Ok(());
        }
        if let (Some((so, n)), Some((d_o, _))) =
            (contiguous_span(ty, region, src.1), contiguous_span(ty, region, dst.1))
        {
            return dst.0.buf.copy_from(dst.0.offset + d_o, &*src.0.buf, src.0.offset + so, n);
        }
        let s = self.leaf(ty, src.1, src.0)?;
        let d = self.leaf(ty, dst.1, dst.0)?;
        let c = region_copies(&mut self.l, region, s, src.1, d, dst.1)?;
        self.outs.extend(c);
        Ok(())
    }
}

impl Device<'_> {
    /// A zero-filled buffer of `len` bytes on this device.
    fn zeros(&self, len: usize) -> Result<BufSlice> {
        Ok(BufSlice { buf: self.backend.alloc_buffer(len.max(1))?, offset: 0, len })
    }

    /// `part` in a buffer of this device (copied there if it is in host
    /// memory or another device's).
    fn on_device(&self, part: &Part) -> Result<BufSlice> {
        if let Some(s) = part.slice_on(self.id) {
            return Ok(s.clone());
        }
        let bytes = part.bytes()?;
        let s = self.zeros(bytes.len())?;
        s.buf.set(0, &bytes)?;
        Ok(s)
    }

    /// Runs the copies local graph `g` holds (if any).
    fn run_copies(&self, g: Local) -> Result<()> {
        if !g.outs.is_empty() {
            self.run_local_parts(&g.l, &g.outs, &g.inputs, Results::None)?;
        }
        Ok(())
    }

    /// Sends every other rank `i` `region(i)` of `src` (a `ty` buffer laid
    /// out as `layout`): as a slice of `src` where the region is contiguous
    /// in it, else packed by the copies of `g` (run with whatever `g`
    /// already holds). Returns what each rank sent this one.
    fn pack_and_exchange(
        &self,
        mut g: Local,
        ty: GgmlType,
        src: (&BufSlice, &Boxes),
        region: &dyn Fn(usize) -> Boxes,
    ) -> Result<Vec<Option<BufSlice>>> {
        let mut send = vec![None; self.n];
        for (i, slot) in send.iter_mut().enumerate() {
            let r = region(i);
            let bytes = box_bytes(ty, &r);
            if i == self.j || bytes == 0 {
                continue;
            }
            *slot = Some(match contiguous_span(ty, &r, src.1) {
                Some((off, len)) => BufSlice { buf: src.0.buf.clone(), offset: src.0.offset + off, len },
                None => {
                    let msg = self.zeros(bytes)?;
                    g.copy(ty, &r, src, (&msg, &r))?;
                    msg
                }
            });
        }
        self.run_copies(g)?;
        self.comm.exchange_buffers(self.j, send, &|b| self.backend.alloc_buffer(b.max(1)))
    }

    /// The device-side [`Device::convert`]: `id`'s part `part` (a `ty`
    /// tensor of shape `ne`) moved from `from` to `to`.
    pub(crate) fn convert_on_device(
        &mut self,
        ty: GgmlType,
        ne: [i64; 4],
        from: &SplitState,
        to: &SplitState,
        part: &Arc<Part>,
    ) -> Result<Arc<Part>> {
        let j = self.j;
        let local = self.on_device(part)?;
        let held_by_first = |d: &Self, full: BufSlice| -> Result<Arc<Part>> {
            Ok(d.dev_part(if j == 0 { full } else { d.zeros(full.len)? }))
        };
        match (from, to) {
            (a, b) if a == b => Ok(part.clone()),
            (SplitState::Partial(_), SplitState::Mirrored) => self.all_reduce_dev(ty, ne, &local),
            (SplitState::Partial(_), SplitState::Split(_)) => self.reduce_scatter_dev(ty, ne, to, &local),
            (SplitState::Mirrored, SplitState::Partial(_)) => held_by_first(self, local),
            (SplitState::Split(_), SplitState::Partial(_)) => {
                // Gathered, then held by device 0 (the cost model's all-gather).
                let full = self.redistribute_dev(ty, ne, from, &SplitState::Mirrored, &local)?;
                held_by_first(self, self.on_device(&full)?)
            }
            _ => self.redistribute_dev(ty, ne, from, to, &local),
        }
    }

    /// [`Comm::redistribute`](super::Comm::redistribute) between device
    /// buffers: this device sends what each other one lacks of its new
    /// part, and assembles its new part from what it holds and what it
    /// received.
    fn redistribute_dev(
        &self,
        ty: GgmlType,
        ne: [i64; 4],
        from: &SplitState,
        to: &SplitState,
        local: &BufSlice,
    ) -> Result<Arc<Part>> {
        let (j, n) = (self.j, self.n);
        for s in [from, to] {
            if matches!(s, SplitState::Partial(_) | SplitState::Unknown) {
                return Err(Error::Split { detail: format!("redistribute cannot move a {} tensor", s.label()) });
            }
        }
        let have = boxes(ne, from, j);
        if local.len != box_bytes(ty, &have) {
            return Err(Error::Split { detail: format!("rank {j}: part of {} bytes for {}", local.len, from.label()) });
        }
        let need = boxes(ne, to, j);
        let got = if *from == SplitState::Mirrored {
            vec![None; n]
        } else {
            self.pack_and_exchange(Local::new(), ty, (local, &have), &|i| owed(ne, from, to, j, i))?
        };
        // Assemble: what this rank holds of its new part, then the messages.
        let out = self.zeros(box_bytes(ty, &need))?;
        let mut g = Local::new();
        g.copy(ty, &intersect(&have, &need), (local, &have), (&out, &need))?;
        for (src, msg) in got.into_iter().enumerate() {
            if let Some(msg) = msg {
                let region = owed(ne, from, to, src, j);
                if msg.len != box_bytes(ty, &region) {
                    return Err(Error::Split { detail: format!("redistribute: message of {} bytes", msg.len) });
                }
                g.copy(ty, &region, (&msg, &region), (&out, &need))?;
            }
        }
        self.run_copies(g)?;
        Ok(self.dev_part(out))
    }

    /// [`Comm::reduce_scatter`](super::Comm::reduce_scatter) between device
    /// buffers: each rank sends every other rank that rank's part of its
    /// addend (`(N−1)·B` bytes in all, as the ring) and sums what it
    /// receives with its own.
    fn reduce_scatter_dev(&self, ty: GgmlType, ne: [i64; 4], to: &SplitState, addend: &BufSlice) -> Result<Arc<Part>> {
        let j = self.j;
        let full = boxes(ne, &SplitState::Mirrored, 0);
        if addend.len != box_bytes(ty, &full) {
            return Err(Error::Split { detail: format!("rank {j}: addend of {} bytes", addend.len) });
        }
        let mine = boxes(ne, to, j);
        // This rank's own part of its addend: a slice of it, or packed with the messages.
        let mut g = Local::new();
        let own = match contiguous_span(ty, &mine, &full) {
            Some((off, len)) => BufSlice { buf: addend.buf.clone(), offset: addend.offset + off, len },
            None => {
                let own = self.zeros(box_bytes(ty, &mine))?;
                g.copy(ty, &mine, (addend, &full), (&own, &mine))?;
                own
            }
        };
        let got = self.pack_and_exchange(g, ty, (addend, &full), &|i| boxes(ne, to, i))?;
        let msgs: Vec<BufSlice> = got.into_iter().flatten().collect();
        if msgs.is_empty() {
            return Ok(self.dev_part(own));
        }
        // The sum, in rank order after this rank's own addend.
        let mut g = Local::new();
        let mut sum = g.leaf(ty, &mine, &own)?;
        for msg in msgs {
            if msg.len != box_bytes(ty, &mine) {
                return Err(Error::Split { detail: format!("reduce-scatter: message of {} bytes", msg.len) });
            }
            let m = g.leaf(ty, &mine, &msg)?;
            sum = g.l.add(sum, m)?;
        }
        Ok(self.run_local_parts(&g.l, &[sum], &g.inputs, Results::Device)?.remove(0))
    }

    /// [`Comm::all_reduce`](super::Comm::all_reduce) between device buffers:
    /// a reduce-scatter over N near-equal element ranges, then an all-gather
    /// (`2 (N−1) B` bytes): contiguous ranges, so one `add` graph and copies.
    fn all_reduce_dev(&self, ty: GgmlType, ne: [i64; 4], addend: &BufSlice) -> Result<Arc<Part>> {
        let n = self.n;
        let total: i64 = ne.iter().product();
        if n == 1 || total == 0 {
            return Ok(self.dev_part(addend.clone()));
        }
        let flat = [total, 1, 1, 1];
        let ext: Vec<i64> = (0..n as i64).map(|j| total * (j + 1) / n as i64 - total * j / n as i64).collect();
        let chunks = SplitState::split(0, ext);
        let mine = self.reduce_scatter_dev(ty, flat, &chunks, addend)?;
        let mine = self.on_device(&mine)?;
        self.redistribute_dev(ty, flat, &chunks, &SplitState::Mirrored, &mine)
    }
}
