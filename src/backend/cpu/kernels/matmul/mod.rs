//! CPU kernels of the matrix-product family: `mul_mat`, `mul_mat_id`,
//! `add_id` (ggml's `ggml_compute_forward_mul_mat`, `..._mul_mat_id` in
//! `ggml-cpu.c` and `ggml_compute_forward_add_id` in `ops.cpp`).
//!
//! Strategy, as ggml's CPU backend:
//! 1. every column of `b` (a row of `src1`, any strides) is converted once
//!    to the weights' dot type (`acts.rs`: F32; F16/BF16-rounded f32; Q8_0,
//!    Q8_1, Q8_K with ggml's x86 quantizers), so results match ggml's up to
//!    summation order;
//! 2. the product is split into tasks of (weight matrix, block of rows,
//!    chunk of columns) run in parallel on the backend's rayon pool; columns
//!    that share a weight matrix (broadcast over dims 2/3, or the tokens
//!    routed to one expert) form one job, so each weight row is read once
//!    per chunk of columns;
//! 3. inside a task, per weight type and column count:
//!    * one to four columns (decode, small verify batches): fused kernels
//!      reading raw Q4_0 / Q5_0 / Q8_0 / Q4_K / Q6_K blocks, each weight
//!      row read from memory once for every column; a task's rows run in
//!      one kernel loop (`RowRunFn`: no call, tile set-up or result copy
//!      per row, which cost 6-8 % of a small model's decode step, and made
//!      two Q4_K columns cost 2.4 one-column products); one column of dense F32/F16/BF16: 8-row kernels (`kern.rs`);
//!    * several columns: a tile of weight rows is decoded once
//!      (`decode.rs`: u8 quants + f32 scales) and multiplied with
//!      column-interleaved activations (`packed.rs`: one `vpdpbusd` per 4
//!      elements × 8 columns; without VNNI `maddubs`, and for Q8_0 rows,
//!      whose u8 form would overflow its i16 pair sums, signed rows with
//!      the sign trick: `Q8SI`, 1.5× the register-blocked tiles it
//!      replaced on an AVX2 EPYC; up to 16 columns those Q8_0 rows are read
//!      in place, `Q8SR`, as the decode pass cost more than its reuse saves;
//!      a last column tile of one group runs the one-group kernel; 4
//!      columns of Q8_0 without VNNI: one group of 4, `Q8G4`) or
//!      register-blocked tiles (2-3 columns of
//!      Q4_0/Q5_0/Q8_0/Q4_K; dense rows; the `gemm` crate for F32 only on
//!      request: `gemm_min_cols`);
//!    * batch invariance: every path of a weight type sums a column's block
//!      products in one fixed order (Q4_0/Q5_0/Q8_0: 8 exact block dots per
//!      step, one accumulator per block index mod 8, then the remaining
//!      blocks; Q4_K: each super-block's exact integer dot and min
//!      correction, scaled, into two running sums; Q6_K: each super-block's
//!      exact integer dot, −32 offset included, scaled by `d·d_col` into one
//!      running sum; dense: 8 lanes along K;
//!      the row-dot types: one dot per row and column), so column j of
//!      `mul_mat(W, X)` is bit-identical to `mul_mat(W, X[:, j])` whatever
//!      the column count, tile or thread split (speculative decoding checks
//!      drafts in a batch against one-token decoding; ggml's CPU products are
//!      batch-invariant too);
//!    * Q4_1, Q5_1, Q2_K, Q3_K, Q5_K and the formats of ggml 0.25.3
//!      (IQ*, TQ*, MXFP4, NVFP4, Q1_0, Q2_0): `quant::vec_dot_fn` per (row,
//!      column) on ggml's own activation blocks.
//!
//! SIMD paths are chosen at run time (AVX2+FMA+F16C, plus AVX-512 VNNI);
//! every path has a portable fallback, and `SHARDGRAPH_MATMUL_ISA=avx2|scalar`
//! forces a lower one (tests and measurements). The raw-row kernels
//! prefetch each weight row 4 KiB ahead of where they read
//! (`SHARDGRAPH_MM_PREFETCH=N` bytes, 0 none): decode streams the weights
//! from memory, and one row's stream alone left the hardware prefetcher
//! short of lines in flight (a 1.7B-shaped Q4_K_M decode step: 0.77x
//! llama.cpp's without, ≥ 1.0x with).
//!
//! Errors, never panics: shapes or types a constructor would reject, and
//! expert ids outside `0..n_expert` (`mul_mat_id`, `add_id`), return
//! [`Error::Compute`] naming the op and the operand shapes.

mod acts;
mod decode;
mod kern;
mod packed;

use super::{unsupported, TView};
use crate::error::{Error, Result};
use crate::ops::{ops_outside, Op};
use crate::tensor::{quant, GgmlType};
use acts::{ActKind, Acts, SrcRow};
use kern::{Fmt, Isa, KernFn, RowRunFn, Tile, MR, NR};
use packed::Packed;
use rayon::prelude::*;

/// Runs one op of this family.
pub(crate) fn compute(op: &Op, dst: &TView, src: &[TView]) -> Result<()> {
    match (op, src) {
        (Op::MulMat, [a, b, ..]) => mul_mat(dst, a, b).map_err(|e| annotate(e, op, dst, src)),
        (Op::MulMatId, [a, b, ids, ..]) => mul_mat_id(dst, a, b, ids).map_err(|e| annotate(e, op, dst, src)),
        (Op::AddId, [a, b, ids, ..]) => add_id(dst, a, b, ids).map_err(|e| annotate(e, op, dst, src)),
        // Too few sources; no other family is routed here (`kernels::compute`).
        (Op::MulMat | Op::MulMatId | Op::AddId | ops_outside!(matmul), _) => Err(unsupported(op, dst, src)),
    }
}

/// Adds the operand shapes to a compute error.
fn annotate(e: Error, op: &Op, dst: &TView, src: &[TView]) -> Error {
    match e {
        Error::Compute { detail } => Error::Compute {
            detail: format!(
                "{}: {detail} (dst {}{:?}, src {:?})",
                op.name(),
                dst.ty,
                dst.ne,
                src.iter().map(|s| format!("{}{:?}", s.ty, s.ne)).collect::<Vec<_>>()
            ),
        },
        other => other,
    }
}

fn bad(detail: impl Into<String>) -> Error {
    Error::Compute { detail: detail.into() }
}

// ---------------------------------------------------------------------------
// Plans
// ---------------------------------------------------------------------------

/// How rows of a weight type are fed to the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowMode {
    /// F32/F16 rows read in place.
    Direct,
    /// Q4_0 → u8 quants.
    Q4_0,
    /// Q5_0 → u8 quants.
    Q5_0,
    /// Q8_0 → u8 (`q + 128`) or signed quants.
    Q8_0 { signed: bool },
    /// Q4_K → nibbles and metadata.
    Q4K,
    /// Q6_K → six-bit quants, d and 16 scales.
    Q6K,
}

/// Everything fixed by the weight type and the CPU.
#[derive(Clone, Copy, Debug)]
struct Plan {
    wt: GgmlType,
    rows: RowMode,
    act: ActKind,
    fmt: Fmt,
    isa: Isa,
}

fn plan(wt: GgmlType, isa: Isa) -> Result<Plan> {
    use GgmlType::*;
    let simd = isa != Isa::Scalar;
    let (rows, act, fmt) = match wt {
        F32 => (RowMode::Direct, ActKind::F32, Fmt::F32),
        F16 => (RowMode::Direct, ActKind::Round(F16), Fmt::F16),
        BF16 => (RowMode::Direct, ActKind::Round(BF16), Fmt::BF16),
        Q4_0 => (RowMode::Q4_0, ActKind::Q8 { corr_mul: 1 }, Fmt::Q8),
        Q5_0 => (RowMode::Q5_0, ActKind::Q8 { corr_mul: 2 }, Fmt::Q8),
        Q8_0 if simd && isa == Isa::Avx2 => (RowMode::Q8_0 { signed: true }, ActKind::Q8 { corr_mul: 0 }, Fmt::Q8S),
        Q8_0 => (RowMode::Q8_0 { signed: false }, ActKind::Q8 { corr_mul: 16 }, Fmt::Q8),
        Q4_K => (RowMode::Q4K, ActKind::Q8K { sums16: false }, Fmt::Q4K),
        Q6_K => (RowMode::Q6K, ActKind::Q8K { sums16: true }, Fmt::Q6K),
        Q4_1 | Q5_1 => (RowMode::Direct, ActKind::Raw(Q8_1), Fmt::VecDot),
        Q2_K | Q3_K | Q5_K => (RowMode::Direct, ActKind::Raw(Q8_K), Fmt::VecDot),
        // The IQ, TQ and FP4 formats, Q1_0, Q2_0: ggml's own activation
        // blocks (Q8_0 or Q8_K) and the row dot products.
        other if quant::vec_dot_fn_scalar(other).is_some() => {
            (RowMode::Direct, ActKind::Raw(quant::vec_dot_type(other)), Fmt::VecDot)
        }
        other => return Err(Error::unsupported_type(other, "mul_mat weights")),
    };
    Ok(Plan { wt, rows, act, fmt, isa })
}

/// For one column per matrix: the fused kernels that read raw weight blocks
/// (no decode pass), where they exist. The activation format is unchanged.
fn gemv_plan(p: Plan) -> Plan {
    if p.isa == Isa::Scalar {
        return p;
    }
    let fmt = match p.wt {
        GgmlType::Q4_0 => Fmt::GemvQ4_0,
        GgmlType::Q5_0 => Fmt::GemvQ5_0,
        GgmlType::Q8_0 => Fmt::GemvQ8_0,
        GgmlType::Q4_K => Fmt::GemvQ4K,
        GgmlType::Q6_K => Fmt::GemvQ6K,
        _ => return p,
    };
    Plan { rows: RowMode::Direct, fmt, ..p }
}

/// Fewest columns per matrix for the column-interleaved kernels.
const PACKED_MIN_COLS: usize = 4;

/// For several columns per matrix: the column-interleaved kernels where they
/// exist.
fn packed_plan(p: Plan, max_cols: usize) -> Plan {
    if p.isa == Isa::Scalar || max_cols < PACKED_MIN_COLS {
        return p;
    }
    match p.fmt {
        Fmt::Q8 => Plan { fmt: Fmt::Q8I, ..p },
        // 4 columns as one group of 4 (kernel bench, 4096², AVX2 EPYC: 1.13
        // → 0.83 ms against the raw-row kernel; 3 columns stay there, 0.74-0.76
        // ms against 0.74-0.93 as a group).
        Fmt::Q8S if max_cols == 4 => Plan { fmt: Fmt::Q8G4, rows: RowMode::Direct, ..p },
        Fmt::Q8S if max_cols <= kern::RAW_Q8_MAX_COLS => Plan { fmt: Fmt::Q8SR, rows: RowMode::Direct, ..p },
        Fmt::Q8S => Plan { fmt: Fmt::Q8SI, ..p },
        Fmt::Q4K => Plan { fmt: Fmt::Q4KI, ..p },
        Fmt::Q6K => Plan { fmt: Fmt::Q6KI, ..p },
        _ => p,
    }
}

// ---------------------------------------------------------------------------
// Jobs and tasks
// ---------------------------------------------------------------------------

/// One activation column to multiply and where its results go.
#[derive(Clone, Copy, Debug)]
struct Col {
    /// Index into the prepared activations.
    act: usize,
    /// Destination row (i1, i2, i3) of `dst` (its elements are the weight rows).
    dst: (usize, usize, usize),
}

/// A weight matrix and the columns multiplied with it.
struct Job {
    /// Byte offset of the matrix in `a`.
    a_off: usize,
    cols: Vec<Col>,
}

/// A block of rows × a chunk of columns of one job.
#[derive(Clone, Copy, Debug)]
struct Task {
    job: usize,
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
}

/// Shared state of one product.
struct Run<'a> {
    plan: Plan,
    /// The weights' bytes (whole span of `a`).
    a: &'a [u8],
    /// Byte stride between rows of a matrix.
    nb01: usize,
    /// Bytes of one packed row.
    row_bytes: usize,
    /// Rows per matrix (M) and K.
    m: usize,
    k: usize,
    acts: &'a Acts,
    /// Column-interleaved activations (packed formats only).
    packed: &'a Packed,
    jobs: &'a [Job],
    dst: &'a TView,
    kern: KernFn,
    /// For packed tiles of two groups: the one-group kernel of the same
    /// rows, for a last column tile of at most one group.
    kern_tail: Option<KernFn>,
    /// The raw-row kernel of `rn` (1 to 4) columns over a task's whole run
    /// of rows (decode, small verify batches), where the format has one.
    row_run: Option<RowRunFn>,
    rm: usize,
    rn: usize,
    /// F32 rows and columns through the `gemm` crate instead of tile kernels.
    gemm: bool,
}

/// Per-thread scratch.
#[derive(Default)]
struct Scratch {
    q: Vec<u8>,
    d: Vec<f32>,
    dmin: Vec<f32>,
    sc: Vec<u32>,
    mn: Vec<i16>,
    sc6: Vec<i8>,
    out: Vec<f32>,
}

/// Most columns multiplied with one weight matrix.
fn max_cols(jobs: &[Job]) -> usize {
    jobs.iter().map(|j| j.cols.len()).max().unwrap_or(1)
}

/// The plan refined for the column count (fused one-column kernels, or
/// column-interleaved ones); decides the activation format, so it is applied
/// before the activations are prepared.
fn refine(plan: Plan, jobs: &[Job]) -> Plan {
    match max_cols(jobs) {
        1 => gemv_plan(plan),
        // The raw-row kernels take up to 4 columns (the weights read from
        // memory once for all of them; K-quant super-blocks unpacked once in
        // registers, Q4_0/Q5_0/Q8_0 blocks re-read from L1 per column):
        // measured faster than tiles up to 4 columns (Q8_0, 1.7B shape: a
        // batch of 4 tokens 2.0 → 1.5 single steps), slower from 5.
        // Signed Q8_0 (no VNNI): 4 columns as one packed group of 4.
        4 if plan.fmt == Fmt::Q8S => packed_plan(plan, 4),
        2..=4
            if matches!(
                plan.wt,
                GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0
            ) =>
        {
            gemv_plan(plan)
        }
        n => packed_plan(plan, n),
    }
}

/// Multiplies every job's matrix with its columns into `dst` (`plan` as
/// refined by [`refine`] for these jobs, `acts` prepared for it).
fn execute(dst: &TView, a: &TView, plan: Plan, acts: &Acts, jobs: &[Job]) -> Result<()> {
    let k = a.ne[0];
    let m = a.ne[1];
    if m == 0 || jobs.iter().all(|j| j.cols.is_empty()) {
        return Ok(());
    }
    let row_bytes = (k / a.ty.block_size()) * a.ty.type_size();
    // SAFETY: `a` is a source of mul_mat / mul_mat_id, which never run in
    // place (not `Op::can_inplace`), so no byte of its span is written while
    // this node computes.
    let bytes = unsafe { a.src_bytes() };
    for j in jobs {
        let end = j.a_off.checked_add((m - 1).saturating_mul(a.nb[1])).and_then(|e| e.checked_add(row_bytes));
        if end.is_none_or(|e| e > bytes.len()) {
            return Err(bad(format!("weight matrix at byte {} leaves the {}-byte tensor", j.a_off, bytes.len())));
        }
    }
    for j in jobs {
        if let Some(c) = j.cols.iter().find(|c| act_len(acts, plan.act, c.act).is_none()) {
            return Err(bad(format!("activation column {} was not prepared", c.act)));
        }
    }
    let max_cols = max_cols(jobs);
    let (rm, rn) = kern::tile_shape(plan.isa, plan.fmt, max_cols);
    let packed = match plan.fmt {
        Fmt::Q8G4 => Packed::new_g4(acts, jobs),
        f if f.packed() => Packed::new(acts, plan.act, jobs),
        _ => Packed::default(),
    };
    let kern = kern::kernel(plan.isa, plan.fmt, rm, rn);
    // A last column tile of at most one packed group (17 columns: 16 + 1)
    // runs the one-group kernel instead of computing a second, empty group.
    let kern_tail = (plan.fmt.packed() && rn == 2 * packed::G).then(|| kern::kernel(plan.isa, plan.fmt, rm, packed::G));
    let row_run = if rm == 1 && plan.rows == RowMode::Direct { kern::row_run(plan.isa, plan.fmt, rn) } else { None };
    let gemm = plan.fmt == Fmt::F32
        && plan.rows == RowMode::Direct
        && max_cols >= gemm_min_cols()
        && a.nb[1] % 4 == 0
        && jobs.iter().all(|j| (bytes.as_ptr() as usize).wrapping_add(j.a_off) % 4 == 0);
    let run = Run {
        plan,
        a: bytes,
        nb01: a.nb[1],
        row_bytes,
        m,
        k,
        acts,
        packed: &packed,
        jobs,
        dst,
        kern,
        kern_tail,
        row_run,
        rm,
        rn,
        gemm,
    };
    let tasks = make_tasks(&run);
    tasks.par_iter().try_for_each_init(Scratch::default, |scr, t| run.task(t, scr))
}

/// Fewest columns per matrix for which F32 products go through `gemm`:
/// never by default, because `gemm`'s summation order depends on the shape,
/// so a column's result would depend on the column count (not batch
/// invariant); `SHARDGRAPH_MM_GEMM_MIN_COLS` sets one, for measurements.
fn gemm_min_cols() -> usize {
    use std::sync::OnceLock;
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("SHARDGRAPH_MM_GEMM_MIN_COLS").ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX)
    })
}

/// Checks that activation column `i` exists (returns its element offset).
fn act_len(acts: &Acts, kind: ActKind, i: usize) -> Option<usize> {
    if let ActKind::Raw(_) = kind {
        let end = i.checked_add(1)?.checked_mul(acts.raw_row)?;
        return (end <= acts.raw.len() || acts.k == 0).then_some(i * acts.raw_row);
    }
    let end = i.checked_add(1)?.checked_mul(acts.k)?;
    let have = match kind {
        ActKind::F32 | ActKind::Round(_) => acts.f.len(),
        _ => acts.q.len(),
    };
    (end <= have || acts.k == 0).then_some(i * acts.k)
}

/// Splits the jobs into tasks: column chunks sized to keep their activations
/// in L2, row blocks sized for about sixteen tasks per thread (small tasks
/// let work stealing even out threads slowed by other load).
fn make_tasks(run: &Run<'_>) -> Vec<Task> {
    let threads = rayon::current_num_threads().max(1);
    let col_bytes = match run.plan.act {
        ActKind::F32 | ActKind::Round(_) => 4 * run.k,
        ActKind::Q8 { .. } => run.k + run.k / 4,
        ActKind::Q8K { .. } => run.k + run.k / 16,
        ActKind::Raw(_) => run.acts.raw_row,
    }
    .max(1);
    let cb_max = if run.gemm { 512 } else { ((384 * 1024 / col_bytes) / run.rn * run.rn).max(run.rn) };
    let chunks = |n: usize| n.div_ceil(cb_max.min(n).max(1));
    let units: usize = run.jobs.iter().map(|j| chunks(j.cols.len()) * run.m).sum();
    let target = threads * 16;
    let avg_cols = (run.jobs.iter().map(|j| j.cols.len()).sum::<usize>() / run.jobs.len().max(1)).clamp(1, cb_max);
    let min_rows = (65536 / (run.k.max(1) * avg_cols)).max(1);
    let mut rb = units.div_ceil(target).max(min_rows).clamp(1, 256);
    rb = rb.div_ceil(run.rm) * run.rm;
    let mut tasks = Vec::new();
    for (ji, j) in run.jobs.iter().enumerate() {
        let n = j.cols.len();
        if n == 0 {
            continue;
        }
        let cb = cb_max.min(n);
        let mut c0 = 0;
        while c0 < n {
            let c1 = (c0 + cb).min(n);
            let mut r0 = 0;
            while r0 < run.m {
                let r1 = (r0 + rb).min(run.m);
                tasks.push(Task { job: ji, r0, r1, c0, c1 });
                r0 = r1;
            }
            c0 = c1;
        }
    }
    tasks
}

impl Run<'_> {
    fn task(&self, t: &Task, scr: &mut Scratch) -> Result<()> {
        let job = &self.jobs[t.job];
        let nrow = t.r1 - t.r0;
        let ncol = t.c1 - t.c0;
        scr.out.clear();
        scr.out.resize(nrow * ncol, 0.0);
        if self.gemm && self.task_gemm(t, &mut scr.out) {
            return self.store(t, &scr.out);
        }
        if self.plan.fmt == Fmt::VecDot {
            self.task_vec_dot(t, &mut scr.out)?;
            return self.store(t, &scr.out);
        }
        let mut tile = Tile { k: self.k, ..Tile::default() };
        // One column tile (decode, small batches): its columns are set once
        // for every row tile.
        let one_col_tile = t.c1 - t.c0 <= self.rn;
        if one_col_tile {
            self.set_cols(&mut tile, t, t.c0);
            if let (Some(run), true) = (self.row_run, ncol == self.rn) {
                let a0 = self.a[job.a_off + t.r0 * self.nb01..].as_ptr();
                // SAFETY: rows r0..r1 of this matrix were bounds-checked
                // against the weights in `execute` (raw rows: `Direct`);
                // the column was checked by `act_len` and set above.
                unsafe { run(&mut tile, a0, self.nb01, &mut scr.out[..nrow * ncol]) };
                return self.store(t, &scr.out);
            }
        }
        let mut r = t.r0;
        while r < t.r1 {
            let rows = self.rm.min(t.r1 - r);
            self.load_rows(job.a_off, r, rows, scr, &mut tile)?;
            let next = self.rm.min(t.r1.saturating_sub(r + rows));
            if (self.plan.rows != RowMode::Direct || self.plan.fmt.packed()) && self.plan.isa != Isa::Scalar {
                // The next tile's rows stream in while this one computes,
                // a slice per step of K inside the SIMD kernels (a burst
                // of hints at once stalls the core once its line fill
                // buffers are full).
                tile.pf = self.a[(job.a_off + (r + rows) * self.nb01).min(self.a.len())..].as_ptr();
                tile.pf_bytes = if next == 0 { 0 } else { (next - 1) * self.nb01 + self.row_bytes };
            }
            let mut c = t.c0;
            while c < t.c1 {
                let cols = self.rn.min(t.c1 - c);
                if !one_col_tile {
                    self.set_cols(&mut tile, t, c);
                }
                let kern = match self.kern_tail {
                    Some(k) if cols <= packed::G => k,
                    _ => self.kern,
                };
                // SAFETY: rows were bounds-checked against the weights in
                // `execute` or point into `scr` (decoded above, not resized
                // until the next row tile); columns were checked by
                // `act_len`; padding repeats valid pointers (the one-group
                // kernel reads only the first group).
                unsafe { kern(&mut tile) };
                for jj in 0..cols {
                    let o = &mut scr.out[(c - t.c0 + jj) * nrow + (r - t.r0)..][..rows];
                    for (ii, v) in o.iter_mut().enumerate() {
                        *v = tile.out[ii][jj];
                    }
                }
                c += cols;
            }
            r += rows;
        }
        self.store(t, &scr.out)
    }

    /// Writes a task's results (column-major, `r1 - r0` per column) to `dst`.
    fn store(&self, t: &Task, out: &[f32]) -> Result<()> {
        let nrow = t.r1 - t.r0;
        for (jj, col) in self.jobs[t.job].cols[t.c0..t.c1].iter().enumerate() {
            let (d1, d2, d3) = col.dst;
            self.dst.store_f32_run(t.r0, d1, d2, d3, &out[jj * nrow..(jj + 1) * nrow]);
        }
        Ok(())
    }

    /// The task through `quant::vec_dot_fn` (raw weight rows × raw ggml
    /// activation rows), row by row.
    fn task_vec_dot(&self, t: &Task, out: &mut [f32]) -> Result<()> {
        let dot = quant::vec_dot_fn(self.plan.wt)
            .ok_or_else(|| bad(format!("no dot product for {} weights", self.plan.wt)))?;
        let (nrow, rs) = (t.r1 - t.r0, self.acts.raw_row);
        let a_off = self.jobs[t.job].a_off;
        for r in t.r0..t.r1 {
            let o = a_off + r * self.nb01;
            let row = &self.a[o..o + self.row_bytes];
            for (jj, col) in self.jobs[t.job].cols[t.c0..t.c1].iter().enumerate() {
                out[jj * nrow + (r - t.r0)] = dot(self.k, row, &self.acts.raw[col.act * rs..(col.act + 1) * rs]);
            }
        }
        Ok(())
    }

    /// The task through `gemm` (F32 rows read in place): false, and nothing
    /// computed, if its columns are not consecutive prepared columns.
    fn task_gemm(&self, t: &Task, out: &mut [f32]) -> bool {
        let cols = &self.jobs[t.job].cols[t.c0..t.c1];
        let act0 = cols[0].act;
        if cols.iter().enumerate().any(|(i, c)| c.act != act0 + i) {
            return false;
        }
        let (nrow, ncol, k) = (t.r1 - t.r0, t.c1 - t.c0, self.k);
        let lhs = &self.a[self.jobs[t.job].a_off + t.r0 * self.nb01..];
        let rhs = &self.acts.f[act0 * k..];
        debug_assert!(out.len() >= nrow * ncol && rhs.len() >= ncol * k);
        // SAFETY: rows r0..r1 of the matrix (k f32 each, `nb01` apart, 4-byte
        // aligned: checked in `execute`) lie in `self.a`; columns act0.. hold
        // `ncol·k` prepared values (`act_len`); `out` holds nrow·ncol.
        unsafe {
            gemm::gemm(
                nrow,
                ncol,
                k,
                out.as_mut_ptr(),
                nrow as isize,
                1,
                false,
                lhs.as_ptr() as *const f32,
                1,
                (self.nb01 / 4) as isize,
                rhs.as_ptr(),
                k as isize,
                1,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        true
    }

    /// Points the tile's rows at weight rows `r .. r + rows` (decoding them
    /// into `scr` first where the format needs it); rows past `rows` repeat
    /// the last one.
    fn load_rows(&self, a_off: usize, r: usize, rows: usize, scr: &mut Scratch, t: &mut Tile) -> Result<()> {
        let k = self.k;
        let row = |i: usize| -> &[u8] {
            let o = a_off + (r + i) * self.nb01;
            &self.a[o..o + self.row_bytes]
        };
        let simd = self.plan.isa != Isa::Scalar;
        match self.plan.rows {
            RowMode::Direct => {
                for i in 0..rows {
                    t.a[i] = row(i).as_ptr();
                }
            }
            RowMode::Q4_0 | RowMode::Q5_0 | RowMode::Q8_0 { .. } => {
                let nb = k / 32;
                scr.q.resize(MR * k, 0);
                scr.d.resize(MR * nb, 0.0);
                for i in 0..rows {
                    let (q, d) = (&mut scr.q[i * k..(i + 1) * k], &mut scr.d[i * nb..(i + 1) * nb]);
                    match self.plan.rows {
                        RowMode::Q4_0 => decode::q4_0(row(i), q, d, simd),
                        RowMode::Q5_0 => decode::q5_0(row(i), q, d),
                        RowMode::Q8_0 { signed } => decode::q8_0(row(i), q, d, signed, simd),
                        _ => {}
                    }
                }
                for i in 0..rows {
                    t.a[i] = scr.q[i * k..].as_ptr();
                    t.ad[i] = scr.d[i * nb..].as_ptr();
                }
            }
            RowMode::Q4K => {
                let ns = k / 256;
                scr.q.resize(MR * k, 0);
                scr.d.resize(MR * ns, 0.0);
                scr.dmin.resize(MR * ns, 0.0);
                scr.sc.resize(MR * ns * 8, 0);
                scr.mn.resize(MR * ns * 8, 0);
                for i in 0..rows {
                    let meta = decode::Q4kMeta {
                        d: &mut scr.d[i * ns..(i + 1) * ns],
                        dmin: &mut scr.dmin[i * ns..(i + 1) * ns],
                        sc: &mut scr.sc[i * ns * 8..(i + 1) * ns * 8],
                        mn: &mut scr.mn[i * ns * 8..(i + 1) * ns * 8],
                    };
                    decode::q4_k(row(i), &mut scr.q[i * k..(i + 1) * k], meta, simd);
                }
                for i in 0..rows {
                    t.a[i] = scr.q[i * k..].as_ptr();
                    t.ad[i] = scr.d[i * ns..].as_ptr();
                    t.am[i] = scr.dmin[i * ns..].as_ptr();
                    t.asc[i] = scr.sc[i * ns * 8..].as_ptr();
                    t.amn[i] = scr.mn[i * ns * 8..].as_ptr();
                }
            }
            RowMode::Q6K => {
                let ns = k / 256;
                scr.q.resize(MR * k, 0);
                scr.d.resize(MR * ns, 0.0);
                scr.sc6.resize(MR * ns * 16, 0);
                for i in 0..rows {
                    let (q, d) = (&mut scr.q[i * k..(i + 1) * k], &mut scr.d[i * ns..(i + 1) * ns]);
                    decode::q6_k(row(i), q, d, &mut scr.sc6[i * ns * 16..(i + 1) * ns * 16], simd);
                }
                for i in 0..rows {
                    t.a[i] = scr.q[i * k..].as_ptr();
                    t.ad[i] = scr.d[i * ns..].as_ptr();
                    t.a6[i] = scr.sc6[i * ns * 16..].as_ptr();
                }
            }
        }
        for i in rows..self.rm {
            t.a[i] = t.a[rows - 1];
            t.ad[i] = t.ad[rows - 1];
            t.am[i] = t.am[rows - 1];
            t.asc[i] = t.asc[rows - 1];
            t.amn[i] = t.amn[rows - 1];
            t.a6[i] = t.a6[rows - 1];
        }
        Ok(())
    }

    /// Points tile column `j` at activation column `act`.
    /// Points the tile's columns at the column tile starting at column `c`
    /// of task `t` (packed groups, or each column's prepared activations;
    /// columns past the task's last repeat it).
    fn set_cols(&self, tile: &mut Tile, t: &Task, c: usize) {
        let job = &self.jobs[t.job];
        if self.plan.fmt.packed() {
            let pg = self.packed.g;
            let (first, last) = (self.packed.first[t.job], (job.cols.len() - 1) / pg);
            for jj in 0..self.rn / pg {
                let g = first + (c / pg + jj).min(last);
                tile.b[jj] = self.packed.q[g * self.packed.q_len..].as_ptr() as *const u8;
                tile.bd[jj] = self.packed.d[g * self.packed.d_len..].as_ptr();
                tile.bc[jj] = self.packed.c[g * self.packed.c_len..].as_ptr();
            }
        } else {
            let cols = self.rn.min(t.c1 - c);
            for jj in 0..self.rn {
                self.set_col(tile, jj, job.cols[c + jj.min(cols - 1)].act);
            }
        }
    }

    fn set_col(&self, t: &mut Tile, j: usize, act: usize) {
        let (k, a) = (self.k, self.acts);
        debug_assert!(j < NR);
        match self.plan.act {
            ActKind::F32 | ActKind::Round(_) => t.b[j] = a.f[act * k..].as_ptr() as *const u8,
            ActKind::Q8 { .. } => {
                let nb = k / 32;
                t.b[j] = a.q[act * k..].as_ptr() as *const u8;
                t.bd[j] = a.d[act * nb..].as_ptr();
                t.bc[j] = a.c[act * nb..].as_ptr();
            }
            ActKind::Q8K { sums16 } => {
                let ns = k / 256;
                let per = if sums16 { 16 } else { 8 };
                t.b[j] = a.q[act * k..].as_ptr() as *const u8;
                t.bd[j] = a.d[act * ns..].as_ptr();
                t.bs[j] = a.bs[act * ns * per..].as_ptr();
            }
            // Not a tile format (the driver loops over rows itself).
            ActKind::Raw(_) => {}
        }
    }
}

// ---------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------

/// Checks the layouts the kernels rely on (the constructors enforce them;
/// this keeps a hand-built graph from reaching memory it should not).
fn check_operands(op: &str, dst: &TView, a: &TView, b: &TView, isa: Isa) -> Result<Plan> {
    let plan = plan(a.ty, isa)?;
    let act_ok = b.ty == GgmlType::F32 || (matches!(b.ty, GgmlType::F16 | GgmlType::BF16) && b.ty == a.ty);
    if !act_ok {
        return Err(bad(format!("{op}: unsupported types {} × {}", a.ty, b.ty)));
    }
    if !a.rows_packed() {
        return Err(bad(format!("{op}: weight rows are not packed (nb {:?})", a.nb)));
    }
    if dst.ty != GgmlType::F32 {
        return Err(bad(format!("{op}: result must be f32, not {}", dst.ty)));
    }
    if a.ne[0] != b.ne[0] || a.ne[0] % a.ty.block_size() != 0 {
        return Err(bad(format!("{op}: K differs ({} vs {})", a.ne[0], b.ne[0])));
    }
    Ok(plan)
}

/// An empty dot product (K = 0) is 0: every row of `dst` becomes zeros.
fn zero_rows(dst: &TView) -> Result<()> {
    let zeros = vec![0f32; dst.ne[0]];
    for r in 0..dst.nrows() {
        let (i1, i2, i3) = dst.row_index(r);
        dst.store_row_f32(i1, i2, i3, &zeros)?;
    }
    Ok(())
}

fn mul_mat(dst: &TView, a: &TView, b: &TView) -> Result<()> {
    mul_mat_isa(dst, a, b, kern::isa())
}

fn mul_mat_isa(dst: &TView, a: &TView, b: &TView, isa: Isa) -> Result<()> {
    let plan = check_operands("mul_mat", dst, a, b, isa)?;
    let bcast_ok = (2..4).all(|d| if a.ne[d] == 0 { b.ne[d] == 0 } else { b.ne[d] % a.ne[d] == 0 });
    if !bcast_ok || dst.ne != [a.ne[1], b.ne[1], b.ne[2], b.ne[3]] {
        return Err(bad("shapes do not match ggml_mul_mat's rules"));
    }
    if dst.nelements() == 0 {
        return Ok(());
    }
    if a.ne[0] == 0 {
        return zero_rows(dst);
    }
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    let mut rows: Vec<SrcRow> = Vec::with_capacity(b.nrows());
    let mut jobs = Vec::with_capacity(a.ne[2] * a.ne[3]);
    for i03 in 0..a.ne[3] {
        for i02 in 0..a.ne[2] {
            let mut cols = Vec::with_capacity(b.ne[1] * r2 * r3);
            for i13 in i03 * r3..(i03 + 1) * r3 {
                for i12 in i02 * r2..(i02 + 1) * r2 {
                    for i11 in 0..b.ne[1] {
                        cols.push(Col { act: rows.len(), dst: (i11, i12, i13) });
                        rows.push((i11, i12, i13));
                    }
                }
            }
            jobs.push(Job { a_off: i02 * a.nb[2] + i03 * a.nb[3], cols });
        }
    }
    let plan = refine(plan, &jobs);
    let acts = Acts::prepare(b, &rows, plan.act)?;
    execute(dst, a, plan, &acts, &jobs)
}

fn mul_mat_id(dst: &TView, a: &TView, b: &TView, ids: &TView) -> Result<()> {
    mul_mat_id_isa(dst, a, b, ids, kern::isa())
}

fn mul_mat_id_isa(dst: &TView, a: &TView, b: &TView, ids: &TView, isa: Isa) -> Result<()> {
    let plan = check_operands("mul_mat_id", dst, a, b, isa)?;
    let (n_expert, n_b, n_tok) = (a.ne[2], b.ne[1], b.ne[2]);
    let n_used = ids.ne[0];
    let shapes_ok = a.ne[3] == 1
        && b.ne[3] == 1
        && ids.ne[1] == n_tok
        && ids.ne[2] == 1
        && ids.ne[3] == 1
        && (if n_b == 0 { n_used == 0 } else { n_used % n_b == 0 })
        && dst.ne == [a.ne[1], n_used, n_tok, 1]
        && matches!(ids.ty, GgmlType::I32);
    if !shapes_ok {
        return Err(bad("shapes do not match ggml_mul_mat_id's rules"));
    }
    if dst.nelements() == 0 {
        return Ok(());
    }
    if a.ne[0] == 0 {
        return zero_rows(dst);
    }
    let mut per_expert: Vec<Vec<Col>> = (0..n_expert).map(|_| Vec::new()).collect();
    for t in 0..n_tok {
        for slot in 0..n_used {
            let e = ids.get_i64(slot, t, 0, 0);
            let cols = usize::try_from(e)
                .ok()
                .and_then(|e| per_expert.get_mut(e))
                .ok_or_else(|| bad(format!("expert id {e} at ids[{slot}, {t}] is outside 0..{n_expert}")))?;
            cols.push(Col { act: slot % n_b + n_b * t, dst: (slot, t, 0) });
        }
    }
    let rows: Vec<SrcRow> = (0..n_tok).flat_map(|t| (0..n_b).map(move |i| (i, t, 0))).collect();
    let jobs: Vec<Job> = per_expert
        .into_iter()
        .enumerate()
        .filter(|(_, c)| !c.is_empty())
        .map(|(e, cols)| Job { a_off: e * a.nb[2], cols })
        .collect();
    let plan = refine(plan, &jobs);
    let acts = Acts::prepare(b, &rows, plan.act)?;
    execute(dst, a, plan, &acts, &jobs)
}

fn add_id(dst: &TView, a: &TView, b: &TView, ids: &TView) -> Result<()> {
    let ok = a.ty == GgmlType::F32
        && b.ty == GgmlType::F32
        && dst.ty == GgmlType::F32
        && ids.ty == GgmlType::I32
        && a.ne[0] == b.ne[0]
        && ids.ne[0] == a.ne[1]
        && ids.ne[1] == a.ne[2]
        && dst.ne == a.ne
        && (a.nelements() == 0 || b.nelements() > 0);
    if !ok {
        return Err(bad("shapes or types do not match ggml_add_id's rules"));
    }
    let n_expert = b.ne[1];
    let ne0 = a.ne[0];
    (0..a.nrows()).into_par_iter().try_for_each_init(
        || (vec![0f32; ne0], vec![0f32; ne0]),
        |(row, bias), r| -> Result<()> {
            let (i1, i2, i3) = a.row_index(r);
            let e = ids.get_i64(i1, i2, 0, 0);
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < n_expert)
                .ok_or_else(|| bad(format!("expert id {e} at ids[{i1}, {i2}] is outside 0..{n_expert}")))?;
            a.load_row_f32(i1, i2, i3, row)?;
            b.load_row_f32(e, 0, 0, bias)?;
            for (x, y) in row.iter_mut().zip(bias.iter()) {
                *x += *y;
            }
            dst.store_row_f32(i1, i2, i3, row)
        },
    )
}

#[cfg(test)]
mod tests;
