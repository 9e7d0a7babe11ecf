//! CPU kernel of `flash_attn_ext` (ggml's
//! `ggml_compute_forward_flash_attn_ext_f16_one_chunk` semantics).
//!
//! Each query row is first converted to the format K is dotted against
//! (ggml's `vec_dot_type`: F16 for F16 K, BF16 for BF16 K, Q8_0 for
//! Q4_0/Q5_0/Q8_0 K, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants, F32 for F32
//! K). Block-quantized K rows are dotted in place with
//! [`quant::vec_dot_fn`] (ggml's integer dot products); float K rows are
//! converted to f32 once per tile and dotted with the rounded query; F16 K
//! and V rows are read as they are (converted in the dot and in the
//! accumulation). Keys are visited in blocks of [`KV_BLOCK`] with an online
//! softmax (running maximum `M`, running sum `S`): per block its maximum,
//! one rescale of the accumulator by `exp(M_old − M_new)` if the maximum
//! grew, the block's weights by the vector exponential, then the weighted V
//! rows. Scores are `scale·q·k`, soft-capped as `c·tanh(s/c)` when a cap is
//! set, plus `slope_h·mask`; keys whose biased mask value is `-inf` are
//! skipped, and a row with no visible key is 0. Sinks (src4, one F32 logit
//! per query head) join each row's normaliser when the row is stored,
//! after all its keys (and chunks) are folded in.
//!
//! The V accumulator is f32 for every V type. (ggml accumulates F16 V in F16
//! on its row-at-a-time path and in f32 on its tiled path for ≥ 64 queries;
//! against the F16 path this gives NMSE ≈ 5e-6, far inside ggml's own 5e-4
//! tolerance for the op, and f32 is the more accurate of the two.)
//!
//! Parallelism: query rows that share one K head and one V head (a GQA
//! group, several positions) form tiles of up to [`TILE_ROWS`], so every K/V
//! row is loaded and converted once per tile. With F16 K and V (a KV cache)
//! a tile holds the rows of every head instead and reads each cell's row of
//! all heads in one stream (a cache row holds every head of its cell, so
//! one head's rows are 1/H of the memory they pull into the cache): long
//! contexts decode at the memory's bandwidth, not its latency. A prompt
//! (from [`HEAD_TILES_FROM`] queries) tiles F16 K/V by head again, and the
//! vector kernels convert each block of that head's K and V rows to f32
//! once for the tile's rows (register-blocked dots and accumulations, each
//! row's sums in the order a row read alone gets). When there are few tiles and
//! many keys (decoding), the keys are also split into chunks whose partial
//! `(M, S, acc)` are merged afterwards, as ggml does; the chunking depends on
//! the shapes only, never on the thread count, so results are reproducible.

#[path = "simd/attn_vec.rs"]
pub(crate) mod vec;

use super::{unsupported, TView};
use crate::error::{Error, Result};
use crate::ops::{ops_outside, Op};
use crate::tensor::quant::{self, VecDotFn};
use crate::tensor::GgmlType;
use half::{bf16, slice::HalfFloatSliceExt};
use rayon::prelude::*;
use vec::{BlockF16, VecOps};

/// Query rows per tile.
const TILE_ROWS: usize = 32;
/// Keys processed as one block (mask values, K rows, scores, V rows).
const KV_BLOCK: usize = 32;
/// Tasks to aim for before keys are split into chunks.
const TARGET_TASKS: usize = 64;
/// Smallest key chunk when keys are split.
const MIN_KV_CHUNK: usize = 256;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match *op {
        Op::FlashAttnExt { scale, max_bias, logit_softcap } => {
            flash_attn_ext(op, dst, src, Params { scale, max_bias, logit_softcap })
        }
        // Not an attention op: `kernels::compute` routes none here.
        ops_outside!(attn) => Err(unsupported(op, dst, src)),
    }
}

#[derive(Clone, Copy)]
struct Params {
    scale: f32,
    max_bias: f32,
    logit_softcap: f32,
}

/// How scores are computed for K's type.
#[derive(Clone, Copy)]
enum KDot {
    /// F32/F16/BF16 K: the K row is converted to f32; the query is rounded
    /// through `fmt` (K's type) and kept as f32.
    Float { fmt: GgmlType },
    /// Block K: the query is quantized to `vdt` (`qrb` bytes per row) and
    /// dotted with the packed K row by `dot`.
    Block { vdt: GgmlType, qrb: usize, dot: VecDotFn },
}

impl KDot {
    fn for_type(k: GgmlType, d: usize) -> Option<KDot> {
        match k {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Some(KDot::Float { fmt: k }),
            _ if k.is_quantized() => {
                let vdt = quant::vec_dot_type(k);
                let dot = quant::vec_dot_fn(k)?;
                let qrb = vdt.row_size(d as i64).ok()?;
                Some(KDot::Block { vdt, qrb, dot })
            }
            _ => None,
        }
    }
}

/// Read-only access to the packed rows of a K or V source, in place.
#[derive(Clone, Copy)]
struct Rows<'a> {
    ty: GgmlType,
    nb: [usize; 4],
    /// Bytes of one row.
    rb: usize,
    bytes: &'a [u8],
    f16_to_f32: fn(&[u8], &mut [f32]),
}

impl<'a> Rows<'a> {
    /// The packed bytes of row (i1, i2, i3).
    fn row(&self, i1: usize, i2: usize, i3: usize) -> Result<&'a [u8]> {
        let o = i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3];
        self.bytes.get(o..o + self.rb).ok_or_else(|| Error::OutOfBounds {
            detail: format!(
                "flash_attn_ext: row ({i1}, {i2}, {i3}) of {} bytes at {o} outside the source span",
                self.rb
            ),
        })
    }

    /// Rows `i1 .. i1 + n` of heads `0 ..= last_head` of batch `i3` as one
    /// F16 block for the vector kernels: one slice from the first row's
    /// start to the last row's end (head `h` of row `j` at byte
    /// `j·nb[1] + h·nb[2]`), read by `offs.len()` query rows at the per-row
    /// byte offsets `offs`, skipping the rows not `live`. The rows are F16,
    /// so a row of `rb` bytes holds `rb / 2` values.
    fn f16_block<'b>(
        &self,
        i1: usize,
        n: usize,
        last_head: usize,
        i3: usize,
        offs: &'b [usize],
        live: &'b [bool],
    ) -> Result<BlockF16<'b>>
    where
        'a: 'b,
    {
        let o = i1 * self.nb[1] + i3 * self.nb[3];
        let len = if n > 0 { (n - 1) * self.nb[1] + last_head * self.nb[2] + self.rb } else { 0 };
        let rows = self.bytes.get(o..o + len).ok_or_else(|| Error::OutOfBounds {
            detail: format!(
                "flash_attn_ext: rows {i1}..{} of heads 0..={last_head}, batch {i3}, outside the source span",
                i1 + n
            ),
        })?;
        Ok(BlockF16 {
            rows,
            offs,
            max_off: last_head * self.nb[2],
            stride: self.nb[1],
            n,
            d: self.rb / 2,
            nt: offs.len(),
            live,
            p_stride: KV_BLOCK,
        })
    }

    /// Prefetch hint for rows `i1s` of head (i2, i3).
    fn prefetch(&self, i1s: std::ops::Range<usize>, i2: usize, i3: usize) {
        for i1 in i1s {
            if let Ok(row) = self.row(i1, i2, i3) {
                vec::prefetch(row);
            }
        }
    }

    /// Row (i1, i2, i3) converted to f32 into `out` (`out.len()` = `ne[0]`).
    fn row_f32(&self, i1: usize, i2: usize, i3: usize, out: &mut [f32]) -> Result<()> {
        let row = self.row(i1, i2, i3)?;
        match self.ty {
            GgmlType::F32 => match bytemuck::try_cast_slice::<u8, f32>(row) {
                Ok(x) => out.iter_mut().zip(x).for_each(|(o, &v)| *o = v),
                Err(_) => out.iter_mut().zip(row.chunks_exact(4)).for_each(|(o, b)| {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }),
            },
            GgmlType::F16 => (self.f16_to_f32)(row, out),
            GgmlType::BF16 => match bytemuck::try_cast_slice::<u8, bf16>(row) {
                Ok(x) => x.convert_to_f32_slice(out),
                Err(_) => out.iter_mut().zip(row.chunks_exact(2)).for_each(|(o, b)| {
                    *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }),
            },
            ty => quant::dequantize_row(ty, row, out)?,
        }
        Ok(())
    }
}

/// A block of query rows sharing K head and V head in batch `iq3`: heads
/// `h0..h0+nh`, rows `r0..r1` of the list of `(iq1, head)` pairs ordered
/// position-major (`r = iq1·nh + (head − h0)`), keys `ic0..ic1`.
#[derive(Clone, Copy, Debug)]
struct Task {
    iq3: usize,
    h0: usize,
    nh: usize,
    r0: usize,
    r1: usize,
    ic0: usize,
    ic1: usize,
}

impl Task {
    fn rows(&self) -> usize {
        self.r1 - self.r0
    }
    /// (iq1, iq2) of tile row `t`.
    fn row(&self, t: usize) -> (usize, usize) {
        let r = self.r0 + t;
        (r / self.nh, self.h0 + r % self.nh)
    }
}

/// Per-thread buffers.
struct Scratch {
    kf: Vec<f32>,
    koff: [usize; TILE_ROWS],
    voff: [usize; TILE_ROWS],
    qbytes: Vec<u8>,
    qf: Vec<f32>,
    acc: Vec<f32>,
    rows: [(usize, usize); TILE_ROWS],
    mraw: Vec<u16>,
    mblk: Vec<f32>,
    sblk: Vec<f32>,
    active: [bool; KV_BLOCK],
    vblk: Vec<f32>,
    /// A block of F16 K or V rows of one head converted to f32.
    conv: Vec<f32>,
    mx: [f32; TILE_ROWS],
    sum: [f32; TILE_ROWS],
    slope: [f32; TILE_ROWS],
}

/// The unnormalised result of one task: per row the maximum, the sum and
/// the accumulator (`rows × dv`).
struct Partial {
    mx: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

/// Everything a task needs besides its scratch.
struct Job<'a> {
    q: &'a TView,
    k: Rows<'a>,
    v: Rows<'a>,
    mask: Option<&'a TView>,
    /// F32 sink logits, one per query head (src[4]).
    sinks: Option<&'a TView>,
    kdot: KDot,
    /// F16 K and V with packed rows: tiles span heads of several K/V heads
    /// and read whole cell rows (`BlockF16`).
    f16: bool,
    ops: VecOps,
    norm: super::norm::simd::NormOps,
    d: usize,
    dv: usize,
    rk2: usize,
    rv2: usize,
    rk3: usize,
    rv3: usize,
    scale: f32,
    softcap: f32,
    max_bias: f32,
    n_head_log2: u64,
    m0: f32,
    m1: f32,
}

/// The checked sources of one flash_attn_ext.
struct Operands<'a> {
    q: &'a TView,
    k: &'a TView,
    v: &'a TView,
    mask: Option<&'a TView>,
    sinks: Option<&'a TView>,
    kdot: KDot,
}

impl<'a> Job<'a> {
    /// The job of one flash_attn_ext over checked operands.
    fn new(o: Operands<'a>, p: Params) -> Result<Job<'a>> {
        let Operands { q, k, v, mask, sinks, kdot } = o;
        let (d, dv) = (k.ne[0], v.ne[0]);
        let (n_head, n_batch) = (q.ne[2], q.ne[3]);
        let mut scale = p.scale;
        if p.logit_softcap != 0.0 {
            scale /= p.logit_softcap;
        }
        // ggml: 1 << floor(log2(n_head)), in 64 bits so no head count overflows.
        let n_head_log2 = 1u64 << ((n_head.max(1) as f64).log2().floor() as u32).min(63);
        // SAFETY: flash_attn_ext never computes in place (it is not in
        // `Op::can_inplace`), so its result never shares memory with K or V and
        // nothing writes their spans while this kernel runs.
        let (k_bytes, v_bytes) = unsafe { (k.src_bytes(), v.src_bytes()) };
        let ops = VecOps::detect();
        let cvt = ops.f16_to_f32;
        Ok(Job {
            q,
            k: Rows { ty: k.ty, nb: k.nb, rb: k.ty.row_size(d as i64)?, bytes: k_bytes, f16_to_f32: cvt },
            v: Rows { ty: v.ty, nb: v.nb, rb: v.ty.row_size(dv as i64)?, bytes: v_bytes, f16_to_f32: cvt },
            mask,
            sinks,
            kdot,
            f16: matches!(kdot, KDot::Float { fmt: GgmlType::F16 })
                && k.ty == GgmlType::F16
                && v.ty == GgmlType::F16
                && k.nb[0] == 2
                && v.nb[0] == 2,
            ops,
            norm: super::norm::simd::NormOps::detect(),
            d,
            dv,
            rk2: n_head / k.ne[2],
            rv2: n_head / v.ne[2],
            rk3: n_batch / k.ne[3],
            rv3: n_batch / v.ne[3],
            scale,
            softcap: p.logit_softcap,
            max_bias: p.max_bias,
            n_head_log2,
            m0: 2f32.powf(-p.max_bias / n_head_log2 as f32),
            m1: 2f32.powf(-(p.max_bias / 2.0) / n_head_log2 as f32),
        })
    }

    /// ALiBi slope of head `h` (1 without ALiBi).
    fn slope(&self, h: usize) -> f32 {
        if self.max_bias > 0.0 {
            let h = h as u64;
            if h < self.n_head_log2 {
                self.m0.powf(h as f32 + 1.0)
            } else {
                self.m1.powf((2 * (h - self.n_head_log2) + 1) as f32)
            }
        } else {
            1.0
        }
    }

    /// The K head and batch, then the V head and batch, of `task`'s first row.
    fn kv_heads(&self, task: &Task) -> (usize, usize, usize, usize) {
        (task.h0 / self.rk2, task.iq3 / self.rk3, task.h0 / self.rv2, task.iq3 / self.rv3)
    }

    /// Runs the online softmax of `task` over its keys, leaving `mx`, `sum`
    /// and `acc` of its rows in `sc` (unnormalised, sinks not yet counted).
    ///
    /// Keys go in blocks: mask values, then the K rows of the block (one
    /// stream of equally strided reads) and the scores, then the V rows and
    /// the online softmax updates in key order.
    fn run(&self, task: &Task, sc: &mut Scratch) -> Result<()> {
        let (kmax, vmax) = self.head_offsets(task, sc);
        self.load_queries(task, sc)?;
        let mut blk0 = task.ic0;
        while blk0 < task.ic1 {
            let blk1 = (blk0 + KV_BLOCK).min(task.ic1);
            self.mask_block(task, blk0, blk1 - blk0, sc);
            self.score_block(task, blk0, blk1, kmax, sc)?;
            self.value_block(task, blk0, blk1, vmax, sc)?;
            blk0 = blk1;
        }
        Ok(())
    }

    /// For the F16 path, which reads every head of a cell in one stream: per
    /// row the byte offset of its K and V head within a cell's row. Returns
    /// the largest K and V head of the task.
    fn head_offsets(&self, task: &Task, sc: &mut Scratch) -> (usize, usize) {
        let (mut kmax, mut vmax) = (0, 0);
        for t in 0..task.rows() {
            let (_, iq2) = task.row(t);
            let (kh, vh) = (iq2 / self.rk2, iq2 / self.rv2);
            sc.koff[t] = kh * self.k.nb[2];
            sc.voff[t] = vh * self.v.nb[2];
            (kmax, vmax) = (kmax.max(kh), vmax.max(vh));
        }
        (kmax, vmax)
    }

    /// Loads the task's query rows in the format K is dotted against, and
    /// resets the rows' maxima, sums, slopes and accumulators.
    fn load_queries(&self, task: &Task, sc: &mut Scratch) -> Result<()> {
        let (d, nt) = (self.d, task.rows());
        for t in 0..nt {
            let (iq1, iq2) = task.row(t);
            sc.rows[t] = (iq1, iq2);
            let qrow = &mut sc.qf[t * d..(t + 1) * d];
            self.q.load_row_f32(iq1, iq2, task.iq3, qrow)?;
            match self.kdot {
                KDot::Float { fmt: GgmlType::F16 } => {
                    qrow.iter_mut().for_each(|x| *x = quant::fp16_bits_to_f32(quant::fp32_to_fp16_bits(*x)))
                }
                KDot::Float { fmt: GgmlType::BF16 } => {
                    qrow.iter_mut().for_each(|x| *x = quant::bf16_bits_to_f32(quant::fp32_to_bf16_bits(*x)))
                }
                KDot::Float { .. } => {}
                KDot::Block { vdt, qrb, .. } => {
                    quant::quantize_chunk(vdt, qrow, &mut sc.qbytes[t * qrb..(t + 1) * qrb], 1, d)?;
                }
            }
            sc.mx[t] = f32::NEG_INFINITY;
            sc.sum[t] = 0.0;
            sc.slope[t] = self.slope(iq2);
        }
        sc.acc[..nt * self.dv].iter_mut().for_each(|x| *x = 0.0);
        Ok(())
    }

    /// A scaled score soft-capped (`softcap·tanh(s)`; unchanged without a
    /// cap).
    #[inline(always)]
    fn capped(&self, s: f32) -> f32 {
        if self.softcap != 0.0 {
            self.softcap * s.tanh()
        } else {
            s
        }
    }

    /// The biased mask values of keys `blk0 .. blk0 + nb` for every row
    /// (`slope·mask`, 0 without a mask), and which keys some row sees.
    fn mask_block(&self, task: &Task, blk0: usize, nb: usize, sc: &mut Scratch) {
        let nt = task.rows();
        let Some(m) = self.mask else {
            sc.mblk[..nt * KV_BLOCK].iter_mut().for_each(|x| *x = 0.0);
            sc.active[..nb].iter_mut().for_each(|x| *x = true);
            return;
        };
        for t in 0..nt {
            let (iq1, iq2) = sc.rows[t];
            let raw = &mut sc.mraw[..nb];
            m.load_run_bytes(blk0, iq1, iq2 % m.ne[2], task.iq3 % m.ne[3], bytemuck::cast_slice_mut(raw));
            let mrow = &mut sc.mblk[t * KV_BLOCK..t * KV_BLOCK + nb];
            (self.ops.f16_to_f32)(bytemuck::cast_slice(raw), mrow);
            let slope = sc.slope[t];
            if slope != 1.0 {
                mrow.iter_mut().for_each(|x| *x *= slope);
            }
        }
        // Row by row along the keys (contiguous): a key is active if some
        // row sees it.
        sc.active[..nb].iter_mut().for_each(|a| *a = false);
        for t in 0..nt {
            let mrow = &sc.mblk[t * KV_BLOCK..t * KV_BLOCK + nb];
            for (a, &mv) in sc.active[..nb].iter_mut().zip(mrow) {
                *a |= mv != f32::NEG_INFINITY;
            }
        }
    }

    /// The scores of keys `blk0..blk1` for every row: `scale·q·k`,
    /// soft-capped, plus the biased mask (`-inf` for skipped keys). The next
    /// block's K rows are fetched meanwhile (cache rows are far apart, so
    /// the hardware prefetchers do not see a stream). F16 rows are dotted
    /// as they are (converted in the dot).
    fn score_block(&self, task: &Task, blk0: usize, blk1: usize, kmax: usize, sc: &mut Scratch) -> Result<()> {
        let (d, nt, nb) = (self.d, task.rows(), blk1 - blk0);
        let (ik2, ik3, _, _) = self.kv_heads(task);
        if self.f16 {
            // The block's F16 rows (every head of each cell, one stream)
            // dotted with every query row at once.
            let blk = self.k.f16_block(blk0, nb, kmax, ik3, &sc.koff[..nt], &sc.active[..nb])?;
            (self.ops.scores_f16)(&blk, &sc.qf[..nt * d], &mut sc.sblk, &mut sc.conv);
            // Row by row along the keys (contiguous), each score as below:
            // a key no row sees is masked (-inf) in every row.
            for t in 0..nt {
                let row = t * KV_BLOCK..t * KV_BLOCK + nb;
                for (s, &mv) in sc.sblk[row.clone()].iter_mut().zip(&sc.mblk[row]) {
                    *s = if mv == f32::NEG_INFINITY { mv } else { self.capped(*s * self.scale) + mv };
                }
            }
            return Ok(());
        }
        self.k.prefetch(blk1..(blk1 + KV_BLOCK).min(task.ic1), ik2, ik3);
        for j in 0..nb {
            if !sc.active[j] {
                for t in 0..nt {
                    sc.sblk[t * KV_BLOCK + j] = f32::NEG_INFINITY;
                }
                continue;
            }
            let ic = blk0 + j;
            let krow = match self.kdot {
                KDot::Float { .. } => {
                    self.k.row_f32(ic, ik2, ik3, &mut sc.kf)?;
                    &[][..]
                }
                KDot::Block { .. } => self.k.row(ic, ik2, ik3)?,
            };
            for t in 0..nt {
                let mv = sc.mblk[t * KV_BLOCK + j];
                if mv == f32::NEG_INFINITY {
                    sc.sblk[t * KV_BLOCK + j] = f32::NEG_INFINITY;
                    continue;
                }
                let dot = match self.kdot {
                    KDot::Float { .. } => (self.ops.dot)(&sc.qf[t * d..(t + 1) * d], &sc.kf),
                    KDot::Block { qrb, dot, .. } => dot(d, krow, &sc.qbytes[t * qrb..(t + 1) * qrb]),
                };
                sc.sblk[t * KV_BLOCK + j] = self.capped(dot * self.scale) + mv;
            }
        }
        Ok(())
    }

    /// The V rows of keys `blk0..blk1` (and a prefetch of the next block's)
    /// folded into every row's online softmax: F16 rows are accumulated as
    /// they are, others converted once for all rows.
    fn value_block(&self, task: &Task, blk0: usize, blk1: usize, vmax: usize, sc: &mut Scratch) -> Result<()> {
        let (dv, nt, nb) = (self.dv, task.rows(), blk1 - blk0);
        let (_, _, iv2, iv3) = self.kv_heads(task);
        if !self.f16 {
            self.v.prefetch(blk1..(blk1 + KV_BLOCK).min(task.ic1), iv2, iv3);
            for j in (0..nb).filter(|&j| sc.active[j]) {
                self.v.row_f32(blk0 + j, iv2, iv3, &mut sc.vblk[j * dv..(j + 1) * dv])?;
            }
        }
        self.softmax_block(nt, nb, sc);
        if self.f16 {
            // Every query row's weighted V rows (every head of each cell, one stream).
            let blk = self.v.f16_block(blk0, nb, vmax, iv3, &sc.voff[..nt], &sc.active[..nb])?;
            (self.ops.accum_f16)(&blk, &sc.sblk, &mut sc.acc[..nt * dv], &mut sc.conv);
        }
        Ok(())
    }

    /// Online softmax, a block at a time: per row the block's maximum, one
    /// rescale of the accumulator if it grew, the block's weights by the
    /// vector exponential (left in `sblk`), then (not F16) the weighted V
    /// rows of `vblk`.
    fn softmax_block(&self, nt: usize, nb: usize, sc: &mut Scratch) {
        let dv = self.dv;
        for t in 0..nt {
            let srow = &mut sc.sblk[t * KV_BLOCK..t * KV_BLOCK + nb];
            let bmax = (self.norm.max)(srow);
            if bmax == f32::NEG_INFINITY {
                srow.iter_mut().for_each(|x| *x = 0.0);
                continue;
            }
            let acc = &mut sc.acc[t * dv..(t + 1) * dv];
            let mut m = sc.mx[t];
            if bmax > m || m.is_nan() {
                let ms = if m == f32::NEG_INFINITY { 0.0 } else { (m - bmax).exp() };
                (self.ops.scale)(acc, ms);
                sc.sum[t] *= ms;
                m = bmax;
            }
            let bsum = (self.norm.exp_sub_sum)(srow, m);
            sc.sum[t] += bsum as f32;
            sc.mx[t] = m;
            if !self.f16 {
                for (j, &p) in srow.iter().enumerate() {
                    if p != 0.0 {
                        (self.ops.axpy)(acc, &sc.vblk[j * dv..(j + 1) * dv], p);
                    }
                }
            }
        }
    }

    /// Finishes the rows of `task` from their maxima `mx`, sums `sum` and
    /// accumulators `acc` (`rows × dv`) and stores them. A sink logit `s` of
    /// the row's head joins the normaliser (ggml's
    /// `ggml_compute_forward_flash_attn_ext_f16`): with `M' = max(M, s)` the
    /// row is `acc·e^(M − M') / (S·e^(M − M') + e^(s − M'))`, so a row whose
    /// keys are all masked (`S = 0`, `M = -inf`) still gives 0.
    fn store(&self, dst: &TView, task: &Task, mx: &[f32], sum: &[f32], acc: &mut [f32]) -> Result<()> {
        for (t, row) in acc.chunks_exact_mut(self.dv).take(task.rows()).enumerate() {
            let (iq1, iq2) = task.row(t);
            let (mut s, mut ms) = (sum[t], 1.0f32);
            if let Some(sinks) = self.sinks {
                let (m, sk) = (mx[t], sinks.get_f32(iq2, 0, 0, 0));
                if sk > m {
                    ms = (m - sk).exp();
                    s = s * ms + 1.0;
                } else {
                    s += (sk - m).exp();
                }
            }
            let inv = if s == 0.0 { 0.0 } else { ms / s };
            (self.ops.scale)(row, inv);
            dst.store_row_f32(iq2, iq1, task.iq3, row)?;
        }
        Ok(())
    }
}

impl Scratch {
    /// Buffers for head sizes `d` (K) and `dv` (V), with `qb_len` bytes of
    /// quantized query rows.
    fn new(d: usize, dv: usize, qb_len: usize) -> Scratch {
        Scratch {
            kf: vec![0f32; d],
            koff: [0; TILE_ROWS],
            voff: [0; TILE_ROWS],
            qbytes: vec![0u8; qb_len],
            qf: vec![0f32; TILE_ROWS * d],
            acc: vec![0f32; TILE_ROWS * dv],
            rows: [(0, 0); TILE_ROWS],
            mraw: vec![0u16; KV_BLOCK],
            mblk: vec![0f32; TILE_ROWS * KV_BLOCK],
            sblk: vec![0f32; TILE_ROWS * KV_BLOCK],
            active: [false; KV_BLOCK],
            vblk: vec![0f32; KV_BLOCK * dv],
            conv: vec![0f32; KV_BLOCK * d.max(dv)],
            mx: [f32::NEG_INFINITY; TILE_ROWS],
            sum: [0.0; TILE_ROWS],
            slope: [1.0; TILE_ROWS],
        }
    }
}

fn flash_attn_ext(op: &Op, dst: &TView, src: &[TView], p: Params) -> Result<()> {
    let operands = check(op, dst, src)?;
    let (n_q, n_head, n_batch, n_kv) = (operands.q.ne[1], operands.q.ne[2], operands.q.ne[3], operands.k.ne[1]);
    let job = Job::new(operands, p)?;
    let tiles = tiles(&job, n_q, n_head, n_batch, n_kv);
    let n_chunks = (TARGET_TASKS / tiles.len().max(1)).min(n_kv / MIN_KV_CHUNK).max(1);
    if n_chunks == 1 {
        run_tiles(&job, dst, &tiles)
    } else {
        run_chunked(&job, dst, &tiles, n_chunks, n_kv)
    }
}

/// The kernel's operand rules (the constructor's, re-checked on the views).
fn check<'a>(op: &Op, dst: &TView, src: &'a [TView]) -> Result<Operands<'a>> {
    let bad = |why: &str| -> Error {
        match unsupported(op, dst, src) {
            Error::UnsupportedOp { backend, op, detail } => {
                Error::UnsupportedOp { backend, op, detail: format!("{why}: {detail}") }
            }
            other => other,
        }
    };
    let (q, k, v) = match src {
        [q, k, v, ..] => (q, k, v),
        _ => return Err(bad("needs q, k, v")),
    };
    let (mask, sinks) = (src.get(3), src.get(4));
    let (d, dv) = (k.ne[0], v.ne[0]);
    let (n_q, n_head, n_batch) = (q.ne[1], q.ne[2], q.ne[3]);
    let n_kv = k.ne[1];
    let kdot = KDot::for_type(k.ty, d).ok_or_else(|| bad("unsupported K type"))?;
    if q.ty != GgmlType::F32
        || dst.ty != GgmlType::F32
        || !(v.ty.is_quantized() || matches!(v.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16))
        || q.ne[0] != d
        || v.ne[1] != n_kv
        || dst.ne != [dv, n_head, n_q, n_batch]
        || [k.ne[2], v.ne[2], k.ne[3], v.ne[3]].contains(&0)
        || n_head % k.ne[2] != 0
        || n_head % v.ne[2] != 0
        || n_batch % k.ne[3] != 0
        || n_batch % v.ne[3] != 0
        || !q.rows_packed()
        || !k.rows_packed()
        || !v.rows_packed()
    {
        return Err(bad("operand shapes"));
    }
    if let Some(m) = mask {
        if m.ty != GgmlType::F16 || m.ne[0] < n_kv || m.ne[1] < n_q || m.ne[2] == 0 || m.ne[3] == 0 {
            return Err(bad("mask shape"));
        }
    }
    if let Some(s) = sinks {
        if s.ty != GgmlType::F32 || s.ne[0] < n_head {
            return Err(bad("sinks (F32, one per head)"));
        }
    }
    Ok(Operands { q, k, v, mask, sinks, kdot })
}

/// Queries from which an F16 tile holds one K/V head's rows, not every
/// head's: with many queries a converted K/V block is then shared by
/// [`TILE_ROWS`] rows (a prompt), where a few queries (decoding, a verify
/// batch) read each cell's row of every head in one stream.
const HEAD_TILES_FROM: usize = 16;

/// Tiles: runs of heads with one K head and one V head (or, F16 with fewer
/// than [`HEAD_TILES_FROM`] queries, as many heads as there are), cut into
/// blocks of [`TILE_ROWS`] rows; every key.
fn tiles(job: &Job, n_q: usize, n_head: usize, n_batch: usize, n_kv: usize) -> Vec<Task> {
    let mut tiles = Vec::new();
    for iq3 in 0..n_batch {
        let mut h0 = 0;
        while h0 < n_head {
            let h1 = if job.f16 && n_q < HEAD_TILES_FROM {
                n_head
            } else {
                ((h0 / job.rk2 + 1) * job.rk2).min((h0 / job.rv2 + 1) * job.rv2).min(n_head)
            };
            let nh = h1 - h0;
            let rows = nh * n_q;
            let mut r0 = 0;
            while r0 < rows {
                let r1 = (r0 + TILE_ROWS).min(rows);
                tiles.push(Task { iq3, h0, nh, r0, r1, ic0: 0, ic1: n_kv });
                r0 = r1;
            }
            h0 = h1;
        }
    }
    tiles
}

/// Per-thread scratch for `job`.
fn scratch(job: &Job) -> Scratch {
    let qb_len = match job.kdot {
        KDot::Block { qrb, .. } => qrb * TILE_ROWS,
        KDot::Float { .. } => 0,
    };
    Scratch::new(job.d, job.dv, qb_len)
}

/// Every tile over all its keys, each finished and stored by its thread.
fn run_tiles(job: &Job, dst: &TView, tiles: &[Task]) -> Result<()> {
    tiles.par_iter().try_for_each_init(
        || scratch(job),
        |sc, task| {
            job.run(task, sc)?;
            let nt = task.rows();
            job.store(dst, task, &sc.mx[..nt], &sc.sum[..nt], &mut sc.acc[..nt * job.dv])
        },
    )
}

/// Keys split into `n_chunks`: partials per (tile, chunk), then merged per
/// tile (in chunk order, so the result does not depend on the threads).
fn run_chunked(job: &Job, dst: &TView, tiles: &[Task], n_chunks: usize, n_kv: usize) -> Result<()> {
    let dv = job.dv;
    let chunk = n_kv.div_ceil(n_chunks);
    let tasks: Vec<Task> = tiles
        .iter()
        .flat_map(|t| {
            (0..n_chunks).map(move |c| Task { ic0: (c * chunk).min(n_kv), ic1: ((c + 1) * chunk).min(n_kv), ..*t })
        })
        .collect();
    let partials: Vec<Partial> = tasks
        .par_iter()
        .map_init(
            || scratch(job),
            |sc, task| -> Result<Partial> {
                job.run(task, sc)?;
                let nt = task.rows();
                Ok(Partial { mx: sc.mx[..nt].to_vec(), sum: sc.sum[..nt].to_vec(), acc: sc.acc[..nt * dv].to_vec() })
            },
        )
        .collect::<Result<_>>()?;
    tiles.par_iter().zip(partials.par_chunks(n_chunks)).try_for_each(|(task, parts)| {
        let nt = task.rows();
        let mut mx = vec![f32::NEG_INFINITY; nt];
        let mut sum = vec![0f32; nt];
        let mut acc = vec![0f32; nt * dv];
        for part in parts {
            for t in 0..nt {
                if part.sum[t] == 0.0 {
                    continue;
                }
                let m_new = mx[t].max(part.mx[t]);
                let s_old = (mx[t] - m_new).exp();
                let s_new = (part.mx[t] - m_new).exp();
                let row = &mut acc[t * dv..(t + 1) * dv];
                (job.ops.scale)(row, s_old);
                (job.ops.axpy)(row, &part.acc[t * dv..(t + 1) * dv], s_new);
                sum[t] = sum[t] * s_old + part.sum[t] * s_new;
                mx[t] = m_new;
            }
        }
        job.store(dst, task, &mx, &sum, &mut acc)
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::backend::Backend;
    use crate::{Context, CpuBackend, GgmlType, Result, TensorId, TensorStorage};

    /// Runs the graph of `out` with every tensor in its own storage; leafs
    /// get `vals` (one vector per leaf, in `leafs` order).
    pub(crate) fn run(
        ctx: &Context,
        leafs: &[(TensorId, Vec<f32>)],
        out: TensorId,
        threads: usize,
    ) -> Result<Vec<f32>> {
        let backend = CpuBackend::with_threads(threads)?;
        let graph = ctx.build_forward(&[out])?;
        let mut storage = TensorStorage::new();
        let all: Vec<TensorId> = ctx.ids().collect();
        storage.alloc_tensors(&backend, ctx, &all)?;
        for (id, vals) in leafs {
            storage.set_f32(ctx, *id, vals)?;
        }
        backend.compute(ctx, &graph, &storage)?;
        storage.get_f32(ctx, out)
    }

    fn rand_vec(seed: &mut u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                lo + (hi - lo) * ((*seed >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect()
    }

    fn round(ty: GgmlType, x: &[f32]) -> Vec<f32> {
        match ty {
            GgmlType::F16 => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
            _ => x.to_vec(),
        }
    }

    struct Case {
        d: usize,
        n_q: usize,
        n_kv: usize,
        h: usize,
        h_kv: usize,
        ty: GgmlType,
        mask: bool,
        max_bias: f32,
        softcap: f32,
        /// Sink logits per head (needs `mask`).
        sinks: bool,
    }

    /// Our kernel against a straightforward f64 softmax(q·kᵀ)·v on the same
    /// (type-rounded) values; a head's sink logit joins the normaliser.
    fn check(c: Case) {
        let mut seed = 0x1234_5678_9abc_def1u64 ^ (c.n_kv * 7 + c.n_q) as u64;
        let mut ctx = Context::new();
        let q = ctx.new_tensor_4d(GgmlType::F32, c.d as i64, c.n_q as i64, c.h as i64, 1).unwrap();
        let k = ctx.new_tensor_4d(c.ty, c.d as i64, c.n_kv as i64, c.h_kv as i64, 1).unwrap();
        let v = ctx.new_tensor_4d(c.ty, c.d as i64, c.n_kv as i64, c.h_kv as i64, 1).unwrap();
        let qv = rand_vec(&mut seed, c.d * c.n_q * c.h, -1.0, 1.0);
        let kv = rand_vec(&mut seed, c.d * c.n_kv * c.h_kv, -1.0, 1.0);
        let vv = rand_vec(&mut seed, c.d * c.n_kv * c.h_kv, -1.0, 1.0);
        let mut leafs = vec![(q, qv.clone()), (k, kv.clone()), (v, vv.clone())];
        let mut mvals = vec![0f32; c.n_kv * c.n_q];
        let m = if c.mask {
            let m = ctx.new_tensor_2d(GgmlType::F16, c.n_kv as i64, c.n_q as i64).unwrap();
            for i in 0..c.n_q {
                for j in 0..c.n_kv {
                    // Causal, a window of 700, the second row fully masked, ALiBi-style distance.
                    let pos = c.n_kv - c.n_q + i;
                    let ok = j <= pos && pos - j < 700 && i != 1;
                    mvals[i * c.n_kv + j] = if ok { -((pos - j) as f32) * 0.01 } else { f32::NEG_INFINITY };
                }
            }
            mvals = round(GgmlType::F16, &mvals);
            leafs.push((m, mvals.clone()));
            Some(m)
        } else {
            None
        };
        let scale = 1.0 / (c.d as f32).sqrt();
        let mut out = ctx.flash_attn_ext(q, k, v, m, scale, c.max_bias, c.softcap).unwrap();
        // Sinks from below every score to above them (head 0 dominates its rows).
        let svals: Vec<f32> =
            (0..c.h).map(|h| if h == 0 { 6.0 } else { rand_vec(&mut seed, 1, -3.0, 1.0)[0] }).collect();
        if c.sinks {
            let s = ctx.new_tensor_1d(GgmlType::F32, c.h as i64).unwrap();
            leafs.push((s, svals.clone()));
            out = ctx.flash_attn_ext_add_sinks(out, s).unwrap();
        }
        let ours = run(&ctx, &leafs, out, 3).unwrap();

        let (qr, kr, vr) = (round(c.ty, &qv), round(c.ty, &kv), round(c.ty, &vv));
        let n_head_log2 = 1usize << (c.h as f64).log2().floor() as u32;
        let (m0, m1) = (
            2f64.powf(-c.max_bias as f64 / n_head_log2 as f64),
            2f64.powf(-(c.max_bias as f64 / 2.0) / n_head_log2 as f64),
        );
        let (mut num, mut den) = (0f64, 0f64);
        for h in 0..c.h {
            let slope = if c.max_bias > 0.0 {
                if h < n_head_log2 {
                    m0.powi(h as i32 + 1)
                } else {
                    m1.powi(2 * (h - n_head_log2) as i32 + 1)
                }
            } else {
                1.0
            };
            let hk = h / (c.h / c.h_kv);
            for i in 0..c.n_q {
                let qrow = &qr[(h * c.n_q + i) * c.d..][..c.d];
                let mut scores = vec![f64::NEG_INFINITY; c.n_kv];
                for (j, sj) in scores.iter_mut().enumerate() {
                    let mv = if c.mask { mvals[i * c.n_kv + j] as f64 * slope } else { 0.0 };
                    if mv == f64::NEG_INFINITY {
                        continue;
                    }
                    let krow = &kr[(hk * c.n_kv + j) * c.d..][..c.d];
                    let mut s: f64 =
                        qrow.iter().zip(krow).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64;
                    if c.softcap != 0.0 {
                        s = c.softcap as f64 * (s / c.softcap as f64).tanh();
                    }
                    *sj = s + mv;
                }
                let sink = c.sinks.then(|| svals[h] as f64);
                let mx = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> =
                    scores.iter().map(|s| if mx == f64::NEG_INFINITY { 0.0 } else { (s - mx).exp() }).collect();
                let z: f64 = w.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - mx).exp());
                for e in 0..c.d {
                    let mut o = 0f64;
                    for j in 0..c.n_kv {
                        o += w[j] * vr[(hk * c.n_kv + j) * c.d + e] as f64;
                    }
                    let o = if z == 0.0 { 0.0 } else { o / z };
                    let got = ours[(i * c.h + h) * c.d + e] as f64;
                    num += (got - o) * (got - o);
                    den += o * o;
                    if c.mask && i == 1 {
                        assert_eq!(got, 0.0, "fully masked row must be 0");
                    }
                }
            }
        }
        let nmse = num / den;
        assert!(nmse < 1e-11, "nmse {nmse:e}");
    }

    #[test]
    fn flash_attn_ext_matches_f64_reference() {
        use GgmlType::*;
        let base = Case {
            d: 64,
            n_q: 5,
            n_kv: 300,
            h: 4,
            h_kv: 2,
            ty: F32,
            mask: true,
            max_bias: 0.0,
            softcap: 0.0,
            sinks: false,
        };
        check(Case { ..base });
        check(Case { ty: F16, ..base });
        check(Case { mask: false, h_kv: 4, ..base });
        check(Case { max_bias: 8.0, h: 6, h_kv: 3, ..base });
        check(Case { softcap: 2.0, ..base });
        // Decoding with many keys: the keys are split into chunks and merged.
        check(Case { n_q: 1, n_kv: 3000, h: 2, h_kv: 1, mask: false, ..base });
        check(Case { n_q: 2, n_kv: 2600, h: 2, h_kv: 1, ty: F16, ..base });
        // More rows than one tile.
        check(Case { n_q: 40, n_kv: 64, h: 2, h_kv: 2, d: 32, ..base });
    }

    #[test]
    fn flash_attn_ext_sinks_match_f64_reference() {
        use GgmlType::*;
        let base = Case {
            d: 64,
            n_q: 5,
            n_kv: 300,
            h: 4,
            h_kv: 2,
            ty: F16,
            mask: true,
            max_bias: 0.0,
            softcap: 0.0,
            sinks: true,
        };
        check(Case { ..base });
        check(Case { ty: F32, ..base });
        check(Case { softcap: 2.0, ..base });
        check(Case { max_bias: 8.0, h: 6, h_kv: 3, ..base });
        // F16 tiles of every head; the chunked (decoding) path, sinks after the merge.
        check(Case { h: 8, h_kv: 2, ..base });
        check(Case { n_q: 2, n_kv: 2600, h: 2, h_kv: 1, ..base });
        check(Case { n_q: 1, n_kv: 3000, h: 4, h_kv: 2, ty: F32, ..base });
        check(Case { n_q: 40, n_kv: 64, h: 2, h_kv: 2, d: 32, ..base });
    }

    /// K/V of the block types of ggml 0.25.3 (IQ4_NL, llama.cpp's
    /// non-linear cache type, and others): the same as F32 K/V holding the
    /// dequantized values with Q rounded through K's dot type, as the kernel
    /// dots Q's activation blocks against K's rows.
    #[test]
    fn flash_attn_ext_reads_the_new_kv_types() {
        use crate::tensor::quant::{dequantize_row, quantize_chunk, vec_dot_type};
        use GgmlType::*;
        let round = |ty: GgmlType, x: &[f32], d: usize| {
            let mut q = vec![0u8; x.len() / d * ty.row_size(d as i64).unwrap()];
            quantize_chunk(ty, x, &mut q, x.len() / d, d).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y).unwrap();
            y
        };
        for ty in [IQ4_NL, IQ4_XS, MXFP4, NVFP4, IQ3_S, TQ2_0, Q1_0] {
            let (d, n_q, n_kv, h, h_kv) = (256usize, 3usize, 40usize, 4usize, 2usize);
            let mut seed = 0x0123_4567_89ab_cdefu64 ^ ty.id() as u64;
            let qv = rand_vec(&mut seed, d * n_q * h, -1.0, 1.0);
            let kv = rand_vec(&mut seed, d * n_kv * h_kv, -1.0, 1.0);
            let vv = rand_vec(&mut seed, d * n_kv * h_kv, -1.0, 1.0);
            let attn = |kty: GgmlType, qv: &[f32], kv: &[f32], vv: &[f32]| {
                let mut ctx = Context::new();
                let q = ctx.new_tensor_4d(F32, d as i64, n_q as i64, h as i64, 1).unwrap();
                let k = ctx.new_tensor_4d(kty, d as i64, n_kv as i64, h_kv as i64, 1).unwrap();
                let v = ctx.new_tensor_4d(kty, d as i64, n_kv as i64, h_kv as i64, 1).unwrap();
                let out = ctx.flash_attn_ext(q, k, v, None, 0.0625, 0.0, 0.0).unwrap();
                let leafs = [(q, qv.to_vec()), (k, kv.to_vec()), (v, vv.to_vec())];
                run(&ctx, &leafs, out, 2).unwrap()
            };
            let ours = attn(ty, &qv, &kv, &vv);
            let want = attn(F32, &round(vec_dot_type(ty), &qv, d), &round(ty, &kv, d), &round(ty, &vv, d));
            let num: f64 = ours.iter().zip(&want).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
            let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
            assert!(num / den < 1e-10, "{ty}: nmse {:e}", num / den);
        }
    }

    #[test]
    fn flash_attn_ext_result_does_not_depend_on_threads() {
        let mut ctx = Context::new();
        let q = ctx.new_tensor_4d(GgmlType::F32, 64, 1, 8, 1).unwrap();
        let k = ctx.new_tensor_4d(GgmlType::F16, 64, 2048, 2, 1).unwrap();
        let v = ctx.new_tensor_4d(GgmlType::F16, 64, 2048, 2, 1).unwrap();
        let mut seed = 99;
        let leafs = vec![
            (q, rand_vec(&mut seed, 64 * 8, -1.0, 1.0)),
            (k, rand_vec(&mut seed, 64 * 2048 * 2, -1.0, 1.0)),
            (v, rand_vec(&mut seed, 64 * 2048 * 2, -1.0, 1.0)),
        ];
        let out = ctx.flash_attn_ext(q, k, v, None, 0.125, 0.0, 0.0).unwrap();
        let a = run(&ctx, &leafs, out, 1).unwrap();
        let b = run(&ctx, &leafs, out, 4).unwrap();
        assert_eq!(a, b);
    }
}
