//! The collectives over device buffers: the same algorithms, messages and
//! byte counts as [`Comm`](super::Comm)'s host methods (so a run still matches its
//! plan's traffic), with the packing, unpacking and sums done by local
//! graphs on each device (`cpy` between views, `add`) and the messages moved
//! by [`Comm::exchange_buffers`](super::Comm::exchange_buffers) (device-to-device copies, or NCCL).
//!
//! A message holds a region of a tensor in the layout [`super::layout`]
//! defines for boxes (per axis the region's ranges, concatenated; ggml's
//! contiguous order), as the host collectives' `pack` does. Block-quantized
//! types keep the host path (see [`movable`]).

use super::comm::{owed, BufSlice};
use super::exec::{Device, Input, Part, Results};
use super::layout::{box_bytes, boxes, intersect, lens, local_pos, Boxes};
use super::state::SplitState;
use crate::error::{Error, Result};
use crate::graph::Context;
use crate::tensor::{GgmlType, TensorId};
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

    /// A copy of `part` in a new buffer of this device (for a kernel to write into).
    pub(crate) fn copy_on_device(&self, part: &Part) -> Result<BufSlice> {
        match part.slice_on(self.id) {
            Some(s) => {
                let c = self.zeros(s.len)?;
                c.buf.copy_from(0, &*s.buf, s.offset, s.len)?;
                Ok(c)
            }
            None => self.on_device(part),
        }
    }

    /// Runs local graph `l` for its writes into its input buffers.
    fn run_in_place(&self, l: &Context, outs: &[TensorId], inputs: &[(TensorId, Input)]) -> Result<()> {
        if !outs.is_empty() {
            self.run_local_parts(l, outs, inputs, Results::None)?;
        }
        Ok(())
    }

    /// Adds to local graph `l` (already holding `outs` over `inputs`) the
    /// packing of `region(i)` of `src` (a tensor laid out as the given
    /// boxes) into a message for every other rank `i`, runs it, and
    /// exchanges the messages; returns what each rank sent this one.
    fn pack_and_exchange(
        &self,
        mut l: Context,
        mut inputs: Vec<(TensorId, Input)>,
        mut outs: Vec<TensorId>,
        src: (TensorId, &Boxes),
        region: &dyn Fn(usize) -> Boxes,
    ) -> Result<Vec<Option<BufSlice>>> {
        let ty = l.t(src.0).ty;
        let mut send = vec![None; self.n];
        for (i, slot) in send.iter_mut().enumerate() {
            let r = region(i);
            let bytes = box_bytes(ty, &r);
            if i == self.j || bytes == 0 {
                continue;
            }
            let m = l.new_tensor(ty, &lens(&r))?;
            let msg = self.zeros(bytes)?;
            inputs.push((m, Input::Buffer(msg.clone())));
            outs.extend(region_copies(&mut l, &r, src.0, src.1, m, &r)?);
            *slot = Some(msg);
        }
        self.run_in_place(&l, &outs, &inputs)?;
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

    /// [`Comm::redistribute`](super::Comm::redistribute) between device buffers: this device packs what
    /// each other one lacks of its new part, the messages move, and it
    /// assembles its new part from what it holds and what it received.
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
        let mut got = vec![None; n];
        if *from != SplitState::Mirrored {
            // Pack every other rank's message.
            let mut l = Context::new();
            let p = l.new_tensor(ty, &lens(&have))?;
            let inputs = vec![(p, Input::Buffer(local.clone()))];
            got = self.pack_and_exchange(l, inputs, Vec::new(), (p, &have), &|i| owed(ne, from, to, j, i))?;
        }
        // Assemble: what this rank holds of its new part, then the messages.
        let out = self.zeros(box_bytes(ty, &need))?;
        let mut l = Context::new();
        let o = l.new_tensor(ty, &lens(&need))?;
        let p = l.new_tensor(ty, &lens(&have))?;
        let mut inputs = vec![(o, Input::Buffer(out.clone())), (p, Input::Buffer(local.clone()))];
        let mut outs = region_copies(&mut l, &intersect(&have, &need), p, &have, o, &need)?;
        for (src, msg) in got.into_iter().enumerate() {
            if let Some(msg) = msg {
                let region = owed(ne, from, to, src, j);
                if msg.len != box_bytes(ty, &region) {
                    return Err(Error::Split { detail: format!("redistribute: message of {} bytes", msg.len) });
                }
                let m = l.new_tensor(ty, &lens(&region))?;
                inputs.push((m, Input::Buffer(msg)));
                outs.extend(region_copies(&mut l, &region, m, &region, o, &need)?);
            }
        }
        self.run_in_place(&l, &outs, &inputs)?;
        Ok(self.dev_part(out))
    }

    /// [`Comm::reduce_scatter`](super::Comm::reduce_scatter) between device buffers: each rank sends
    /// every other rank that rank's part of its addend (`(N−1)·B` bytes in
    /// all, as the ring) and sums what it receives with its own.
    fn reduce_scatter_dev(&self, ty: GgmlType, ne: [i64; 4], to: &SplitState, addend: &BufSlice) -> Result<Arc<Part>> {
        let j = self.j;
        let full = boxes(ne, &SplitState::Mirrored, 0);
        if addend.len != box_bytes(ty, &full) {
            return Err(Error::Split { detail: format!("rank {j}: addend of {} bytes", addend.len) });
        }
        let mine = boxes(ne, to, j);
        let own = self.zeros(box_bytes(ty, &mine))?;
        // Pack this rank's own part and every other rank's message.
        let mut l = Context::new();
        let a = l.new_tensor(ty, &ne)?;
        let o = l.new_tensor(ty, &lens(&mine))?;
        let inputs = vec![(a, Input::Buffer(addend.clone())), (o, Input::Buffer(own.clone()))];
        let outs = region_copies(&mut l, &mine, a, &full, o, &mine)?;
        let got = self.pack_and_exchange(l, inputs, outs, (a, &full), &|i| boxes(ne, to, i))?;
        let msgs: Vec<BufSlice> = got.into_iter().flatten().collect();
        if msgs.is_empty() {
            return Ok(self.dev_part(own));
        }
        // The sum, in rank order after this rank's own addend.
        let mut l = Context::new();
        let shape = lens(&mine);
        let o = l.new_tensor(ty, &shape)?;
        let mut inputs = vec![(o, Input::Buffer(own))];
        let mut sum = o;
        for msg in msgs {
            if msg.len != box_bytes(ty, &mine) {
                return Err(Error::Split { detail: format!("reduce-scatter: message of {} bytes", msg.len) });
            }
            let m = l.new_tensor(ty, &shape)?;
            inputs.push((m, Input::Buffer(msg)));
            sum = l.add(sum, m)?;
        }
        Ok(self.run_local_parts(&l, &[sum], &inputs, Results::Device)?.remove(0))
    }

    /// [`Comm::all_reduce`](super::Comm::all_reduce) between device buffers: a reduce-scatter over N
    /// near-equal element ranges, then an all-gather (`2 (N−1) B` bytes).
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
