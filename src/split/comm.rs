//! The communication interface between devices and its generic fallback.
//!
//! Every device runs its own thread and calls the collectives of a [`Comm`]
//! in the same order, like ranks of an NCCL communicator. A backend with
//! native collectives (NCCL, RCCL) implements the provided methods directly;
//! any other gets them from two primitives, a ring shift and an all-to-all
//! exchange of byte messages, which [`HostComm`] implements with plain copies
//! between host buffers. The provided algorithms are the ring algorithms of
//! DESIGN.md section 4, so the bytes they move are the bytes the planner's
//! cost model charges:
//!
//! | collective | bytes received, all ranks together |
//! | --- | --- |
//! | all-reduce (ring reduce-scatter + ring all-gather) | `2 (N−1) B` |
//! | reduce-scatter (ring) | `(N−1) B` |
//! | all-gather, all-to-all, rebalance | what each rank lacks of its new part |
//! | broadcast | `(N−1) B` |

use super::layout::{add_into, box_bytes, boxes, copy_region, intersect, pack, Boxes};
use super::state::SplitState;
use crate::backend::Buffer;
use crate::error::{Error, Result};
use crate::tensor::GgmlType;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// `len` bytes at byte `offset` of a device buffer: a message of the
/// device-side collectives, or a tensor's local part kept on its device.
#[derive(Clone, Debug)]
pub struct BufSlice {
    /// The buffer (of any backend).
    pub buf: Arc<dyn Buffer>,
    /// Start, bytes.
    pub offset: usize,
    /// Length, bytes.
    pub len: usize,
}

impl BufSlice {
    /// The whole of `buf`.
    pub fn whole(buf: Arc<dyn Buffer>) -> Self {
        let len = buf.size();
        BufSlice { buf, offset: 0, len }
    }
}

/// Collectives among the `n_ranks()` devices of one executor. Each method is
/// called by every rank (with its own `rank`) in the same order; it returns
/// on a rank when that rank's part is done.
///
/// Implementors provide [`Comm::ring_shift`] and [`Comm::exchange`]; the
/// other methods have generic implementations over them.
pub trait Comm: Send + Sync {
    /// Number of ranks (devices).
    fn n_ranks(&self) -> usize;

    /// Sends `data` to rank `rank + 1 (mod N)` and returns what rank
    /// `rank − 1 (mod N)` sent.
    ///
    /// # Errors
    /// [`Error::Split`] if another rank failed (the collective is abandoned).
    fn ring_shift(&self, rank: usize, data: Vec<u8>) -> Result<Vec<u8>>;

    /// All-to-all with variable sizes: `send[i]` goes to rank `i` (the entry
    /// for `rank` itself is returned unmoved); returns what every rank sent
    /// to this one, indexed by sender.
    ///
    /// # Errors
    /// [`Error::Split`] if `send.len() != n_ranks()` or another rank failed.
    fn exchange(&self, rank: usize, send: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>>;

    /// Marks the communicator failed: every rank waiting in a collective, and
    /// every later call, returns an error instead of waiting for a rank that
    /// will not come.
    fn abort(&self);

    /// True once [`Comm::abort`] was called (every later collective fails).
    fn is_aborted(&self) -> bool {
        false
    }

    /// Bytes received by each rank so far (for checking plans against what moved).
    fn bytes_received(&self) -> Vec<u64>;

    /// True if [`Comm::exchange_buffers`] moves device buffers (the same
    /// answer on every rank). The executor then keeps activations on the
    /// devices and runs the collectives' packing and sums there.
    fn moves_buffers(&self) -> bool {
        false
    }

    /// All-to-all of device buffers: `send[i]`, if any, goes to rank `i`
    /// (the entry for `rank` itself is ignored); returns what each rank sent
    /// to this one, in buffers this rank's `alloc(bytes)` gives (its own
    /// device's). The bytes count as received, as [`Comm::exchange`]'s.
    ///
    /// # Errors
    /// [`Error::Split`] if `send.len() != n_ranks()`, this communicator does
    /// not move buffers, or another rank failed; copy and allocation errors.
    fn exchange_buffers(
        &self,
        rank: usize,
        send: Vec<Option<BufSlice>>,
        alloc: &dyn Fn(usize) -> Result<Arc<dyn Buffer>>,
    ) -> Result<Vec<Option<BufSlice>>> {
        let _ = (rank, send, alloc);
        Err(Error::Split { detail: "this communicator does not move device buffers".into() })
    }

    /// All-gather of one small message per rank: returns every rank's
    /// `mine`, indexed by rank. Each rank receives `(N−1)·len` bytes.
    ///
    /// # Errors
    /// As [`Comm::exchange`].
    fn all_gather_bytes(&self, rank: usize, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.exchange(rank, vec![mine.to_vec(); self.n_ranks()])
    }

    /// Moves a tensor of type `ty` and shape `ne` (ggml order) from state
    /// `from` to state `to`, where `from` is split or mirrored and `to` is
    /// split or mirrored: `local` is this rank's part under `from`; returns
    /// its part under `to`. Every rank receives exactly the elements of its
    /// new part it does not hold (all-gather, all-to-all and rebalance are
    /// this one operation; mirrored → split is a local slice, no traffic).
    ///
    /// # Errors
    /// [`Error::Split`] for a partial or unknown state, a part of the wrong
    /// size, or a failed rank.
    fn redistribute(
        &self,
        rank: usize,
        ty: GgmlType,
        ne: [i64; 4],
        from: &SplitState,
        to: &SplitState,
        local: &[u8],
    ) -> Result<Vec<u8>> {
        let n = self.n_ranks();
        for s in [from, to] {
            if matches!(s, SplitState::Partial(_) | SplitState::Unknown) {
                return Err(Error::Split { detail: format!("redistribute cannot move a {} tensor", s.label()) });
            }
        }
        let have = boxes(ne, from, rank);
        if local.len() != box_bytes(ty, &have) {
            return Err(Error::Split {
                detail: format!("rank {rank}: part of {} bytes for {}", local.len(), from.label()),
            });
        }
        let need = boxes(ne, to, rank);
        let mut out = vec![0u8; box_bytes(ty, &need)];
        let copy = &mut |d: &mut [u8], s: &[u8]| {
            d.copy_from_slice(s);
            Ok(())
        };
        // What this rank already holds of its new part.
        let own = intersect(&have, &need);
        copy_region(ty, &own, &have, local, &need, &mut out, copy)?;
        if *from == SplitState::Mirrored {
            return Ok(out);
        }
        // Every other rank's new part, less what that rank holds itself.
        let mut send = Vec::with_capacity(n);
        for i in 0..n {
            if i == rank {
                send.push(Vec::new());
                continue;
            }
            let region = owed(ne, from, to, rank, i);
            send.push(pack(ty, &region, &have, local)?);
        }
        let got = self.exchange(rank, send)?;
        for (src, msg) in got.iter().enumerate() {
            if src == rank {
                continue;
            }
            let region = owed(ne, from, to, src, rank);
            copy_region(ty, &region, &region, msg, &need, &mut out, copy)?;
        }
        Ok(out)
    }

    /// Ring reduce-scatter of a partial sum: `addend` is this rank's
    /// full-shape addend of a `ty` tensor of shape `ne`; returns the sum over
    /// ranks of this rank's part under `to` (a split state). Each of the N
    /// parts travels N−1 hops.
    ///
    /// # Errors
    /// As [`Comm::exchange`]; [`Error::UnsupportedType`] for a type that
    /// cannot be summed.
    fn reduce_scatter(
        &self,
        rank: usize,
        ty: GgmlType,
        ne: [i64; 4],
        to: &SplitState,
        addend: &[u8],
    ) -> Result<Vec<u8>> {
        let n = self.n_ranks();
        let full = boxes(ne, &SplitState::Mirrored, 0);
        if addend.len() != box_bytes(ty, &full) {
            return Err(Error::Split { detail: format!("rank {rank}: addend of {} bytes", addend.len()) });
        }
        let part = |i: usize| boxes(ne, to, i % n);
        // Step s: send the running sum of part (rank − s − 1), add the received part (rank − s − 2).
        let mut acc = pack(ty, &part(rank + n - 1), &full, addend)?;
        for s in 0..n.saturating_sub(1) {
            let recv = self.ring_shift(rank, acc)?;
            let idx = (rank + 2 * n - s - 2) % n;
            let b = part(idx);
            let mut mine = pack(ty, &b, &full, addend)?;
            if recv.len() != mine.len() {
                return Err(Error::Split { detail: format!("reduce-scatter: message of {} bytes", recv.len()) });
            }
            add_into(ty, &mut mine, &recv)?;
            acc = mine;
        }
        Ok(acc)
    }

    /// Ring all-reduce (sum) of a partial `ty` tensor of shape `ne`: a ring
    /// reduce-scatter over N element ranges, then a ring all-gather.
    ///
    /// # Errors
    /// As [`Comm::reduce_scatter`].
    fn all_reduce(&self, rank: usize, ty: GgmlType, ne: [i64; 4], addend: &[u8]) -> Result<Vec<u8>> {
        let n = self.n_ranks();
        let total: i64 = ne.iter().product();
        if n == 1 || total == 0 || ty.is_quantized() {
            return if ty.is_quantized() {
                Err(Error::unsupported_type(ty, "a partial sum needs F32, F16, BF16, I32 or I64"))
            } else {
                Ok(addend.to_vec())
            };
        }
        // The tensor as a flat row split in N near-equal element ranges.
        let flat = [total, 1, 1, 1];
        let ext: Vec<i64> = (0..n as i64).map(|j| total * (j + 1) / n as i64 - total * j / n as i64).collect();
        let chunks = SplitState::split(0, ext);
        let mine = self.reduce_scatter(rank, ty, flat, &chunks, addend)?;
        // Ring all-gather: step s passes on part (rank − s).
        let full = boxes(flat, &SplitState::Mirrored, 0);
        let mut out = vec![0u8; addend.len()];
        let put = |out: &mut Vec<u8>, i: usize, msg: &[u8]| {
            let b = boxes(flat, &chunks, i);
            copy_region(ty, &b, &b, msg, &full, out, &mut |d, s| {
                d.copy_from_slice(s);
                Ok(())
            })
        };
        put(&mut out, rank, &mine)?;
        let mut cur = mine;
        for s in 0..n - 1 {
            cur = self.ring_shift(rank, cur)?;
            put(&mut out, (rank + 2 * n - s - 1) % n, &cur)?;
        }
        Ok(out)
    }

    /// Broadcast from `root`: every rank returns `root`'s `data`.
    ///
    /// # Errors
    /// As [`Comm::exchange`].
    fn broadcast(&self, rank: usize, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        let n = self.n_ranks();
        let send = (0..n).map(|i| if rank == root && i != rank { data.to_vec() } else { Vec::new() }).collect();
        let mut got = self.exchange(rank, send)?;
        Ok(if rank == root { data.to_vec() } else { std::mem::take(&mut got[root]) })
    }
}

/// The elements rank `dst` needs under `to` that rank `src` holds under
/// `from` (and `dst` does not).
pub(crate) fn owed(ne: [i64; 4], from: &SplitState, to: &SplitState, src: usize, dst: usize) -> Boxes {
    intersect(&boxes(ne, from, src), &boxes(ne, to, dst))
}

/// A barrier that can be broken: waiting ranks are released with an error
/// when one rank fails, instead of waiting forever.
#[derive(Debug)]
struct Barrier {
    n: usize,
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
}

impl Barrier {
    fn wait(&self) -> Result<()> {
        let failed = || Error::Split { detail: "another device failed during a collective".into() };
        let mut g = self.state.lock().map_err(|_| failed())?;
        if g.2 {
            return Err(failed());
        }
        let gen = g.1;
        g.0 += 1;
        if g.0 == self.n {
            g.0 = 0;
            g.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while g.1 == gen && !g.2 {
            g = self.cv.wait(g).map_err(|_| failed())?;
        }
        if g.1 == gen {
            return Err(failed());
        }
        Ok(())
    }

    fn abort(&self) {
        if let Ok(mut g) = self.state.lock() {
            g.2 = true;
        }
        self.cv.notify_all();
    }

    fn is_aborted(&self) -> bool {
        self.state.lock().map_or(true, |g| g.2)
    }
}

/// The generic communicator, for any devices: host messages are host
/// buffers handed over between barrier phases; device messages
/// ([`Comm::exchange_buffers`]) are copied by the receiver straight from the
/// sender's buffer with [`Buffer::copy_from`] (a device-to-device or peer
/// copy between CUDA devices, stream-ordered by events; through host memory
/// for any other pair). It is the fallback where NCCL is missing, and the
/// only choice for virtual devices on one GPU (NCCL refuses two ranks on
/// one GPU).
#[derive(Debug)]
pub struct HostComm {
    n: usize,
    barrier: Barrier,
    /// Per sender, per receiver: the message in flight.
    slots: Vec<Mutex<Vec<Vec<u8>>>>,
    /// Per sender, per receiver: the device message in flight.
    buf_slots: Vec<Mutex<Vec<Option<BufSlice>>>>,
    received: Vec<AtomicU64>,
}

impl HostComm {
    /// A communicator for `n` ranks (`n ≥ 1`).
    pub fn new(n: usize) -> Self {
        let n = n.max(1);
        HostComm {
            n,
            barrier: Barrier { n, state: Mutex::new((0, 0, false)), cv: Condvar::new() },
            slots: (0..n).map(|_| Mutex::new(vec![Vec::new(); n])).collect(),
            buf_slots: (0..n).map(|_| Mutex::new(vec![None; n])).collect(),
            received: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(&self, i: usize) -> Result<std::sync::MutexGuard<'_, Vec<Vec<u8>>>> {
        self.slots[i].lock().map_err(|_| Error::Split { detail: "communicator poisoned".into() })
    }
}

impl Comm for HostComm {
    fn n_ranks(&self) -> usize {
        self.n
    }

    fn ring_shift(&self, rank: usize, data: Vec<u8>) -> Result<Vec<u8>> {
        let n = self.n;
        let mut send = vec![Vec::new(); n];
        send[(rank + 1) % n] = data;
        let mut got = self.exchange(rank, send)?;
        Ok(std::mem::take(&mut got[(rank + n - 1) % n]))
    }

    fn exchange(&self, rank: usize, mut send: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        if send.len() != self.n || rank >= self.n {
            self.abort();
            return Err(Error::Split { detail: format!("exchange from rank {rank} with {} messages", send.len()) });
        }
        let own = std::mem::take(&mut send[rank]);
        *self.slot(rank)? = send;
        self.barrier.wait()?;
        let mut out = Vec::with_capacity(self.n);
        let mut bytes = 0u64;
        for src in 0..self.n {
            if src == rank {
                out.push(own.clone());
            } else {
                let m = std::mem::take(&mut self.slot(src)?[rank]);
                bytes += m.len() as u64;
                out.push(m);
            }
        }
        self.received[rank].fetch_add(bytes, Ordering::Relaxed);
        self.barrier.wait()?;
        Ok(out)
    }

    fn abort(&self) {
        self.barrier.abort();
    }

    fn is_aborted(&self) -> bool {
        self.barrier.is_aborted()
    }

    fn moves_buffers(&self) -> bool {
        true
    }

    fn exchange_buffers(
        &self,
        rank: usize,
        mut send: Vec<Option<BufSlice>>,
        alloc: &dyn Fn(usize) -> Result<Arc<dyn Buffer>>,
    ) -> Result<Vec<Option<BufSlice>>> {
        let poisoned = || Error::Split { detail: "communicator poisoned".into() };
        if send.len() != self.n || rank >= self.n {
            self.abort();
            return Err(Error::Split { detail: format!("exchange from rank {rank} with {} messages", send.len()) });
        }
        send[rank] = None;
        *self.buf_slots[rank].lock().map_err(|_| poisoned())? = send;
        self.barrier.wait()?;
        let mut out = vec![None; self.n];
        let mut bytes = 0u64;
        for (src, slot) in out.iter_mut().enumerate() {
            if src == rank {
                continue;
            }
            let m = self.buf_slots[src].lock().map_err(|_| poisoned())?[rank].take();
            if let Some(m) = m {
                let buf = alloc(m.len)?;
                buf.copy_from(0, &*m.buf, m.offset, m.len)?;
                bytes += m.len as u64;
                *slot = Some(BufSlice { buf, offset: 0, len: m.len });
            }
        }
        self.received[rank].fetch_add(bytes, Ordering::Relaxed);
        // The senders' buffers are not reused before every copy is queued.
        self.barrier.wait()?;
        Ok(out)
    }

    fn bytes_received(&self) -> Vec<u64> {
        self.received.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::layout::{assemble, slice_local};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Runs `f(rank)` on every rank concurrently.
    fn spmd<T: Send>(n: usize, f: impl Fn(usize) -> Result<T> + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let f = &f;
            let hs: Vec<_> = (0..n).map(|r| s.spawn(move || f(r))).collect();
            hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
        })
    }

    #[test]
    fn ring_collectives_move_the_modelled_bytes_and_sum_exactly() {
        for n in 1..=5usize {
            let ne = [6, 5, 1, 1];
            let addends: Vec<Vec<f32>> = (0..n).map(|r| (0..30).map(|i| (i * (r + 1)) as f32).collect()).collect();
            let want: Vec<f32> = (0..30).map(|i| (0..n).map(|r| (i * (r + 1)) as f32).sum()).collect();
            let c = HostComm::new(n);
            let got = spmd(n, |r| c.all_reduce(r, GgmlType::F32, ne, &f32s(&addends[r])));
            for g in &got {
                assert_eq!(*g, f32s(&want));
            }
            let b = 30 * 4u64;
            assert_eq!(c.bytes_received().iter().sum::<u64>(), 2 * (n as u64 - 1) * b, "all-reduce on {n}");
            // Reduce-scatter into an uneven split of axis 1.
            let to = SplitState::split(1, crate::split::split_extents(5, &vec![1.0; n], 1).unwrap());
            let c = HostComm::new(n);
            let parts = spmd(n, |r| c.reduce_scatter(r, GgmlType::F32, ne, &to, &f32s(&addends[r])));
            assert_eq!(assemble(GgmlType::F32, ne, &parts, &to).unwrap(), f32s(&want));
            assert_eq!(c.bytes_received().iter().sum::<u64>(), (n as u64 - 1) * b);
        }
    }

    #[test]
    fn redistribute_moves_only_missing_elements() {
        let ne = [8, 6, 2, 1];
        let full: Vec<u8> = (0..96u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let cases = [
            (SplitState::split(0, vec![2, 6]), SplitState::Mirrored),
            (SplitState::split(0, vec![4, 4]), SplitState::split(1, vec![1, 5])),
            (SplitState::split(1, vec![3, 3]), SplitState::split(1, vec![6, 0])),
            (SplitState::Mirrored, SplitState::split(2, vec![1, 1])),
            (
                SplitState::Split(crate::split::AxisSplit {
                    axis: 1,
                    segments: vec![vec![1, 2], vec![2, 1]],
                    repeat: 1,
                }),
                SplitState::split(0, vec![8, 0]),
            ),
        ];
        for (from, to) in cases {
            let c = HostComm::new(2);
            let parts = spmd(2, |r| {
                let l = slice_local(GgmlType::F32, ne, &full, &from, r)?;
                c.redistribute(r, GgmlType::F32, ne, &from, &to, &l)
            });
            assert_eq!(assemble(GgmlType::F32, ne, &parts, &to).unwrap(), full, "{} -> {}", from.label(), to.label());
            let t = crate::split::conversion(&from, &to, 384, 2).map_or(0, |t| t.total_bytes);
            assert_eq!(c.bytes_received().iter().sum::<u64>(), t, "{} -> {}", from.label(), to.label());
        }
    }

    #[test]
    fn a_failed_rank_releases_the_others() {
        let c = HostComm::new(3);
        let r: Vec<bool> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let c = &c;
                    s.spawn(move || {
                        if r == 2 {
                            c.abort();
                            false
                        } else {
                            c.all_gather_bytes(r, &[1, 2]).is_err()
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(r, [true, true, false]);
    }
}
