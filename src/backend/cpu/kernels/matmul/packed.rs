//! Column-interleaved activations for the packed tile kernels: the columns
//! of each job are grouped by 8, and a group stores, for every 4-element
//! step of K, the 4 i8 quants of each of its 8 columns side by side (32
//! bytes: one register). A kernel then broadcasts 4 weight quants of a row
//! and takes the dot with 8 columns in one `vpdpbusd` (the usual int8 GEMM
//! micro-kernel layout), and applies each block's scales once per 8 columns.
//!
//! Per group (columns past the job's end repeat its last column):
//! * `q`: `[K/4][8][4]` i8;
//! * `d`: Q8 `[K/32][8]` block scales; Q8K `[K/256][8]` super-block scales;
//! * `c`: Q8 `[K/32][8]` exact block corrections (`8 ·` the per-lane value
//!   in [`Acts::c`]); Q8K `[K/256][4][8]` pairs of 32-element sums packed as
//!   two i16 in an i32 (for `vpdpwssd` against pairs of mins), or with
//!   `sums16` (Q6_K) `[K/256][8][8]` pairs of 16-element sums (against
//!   pairs of −32·scale).

use super::acts::{ActKind, Acts};
use super::Job;
use rayon::prelude::*;

/// Columns per group.
pub(super) const G: usize = 8;

/// Columns per group of the four-column layout ([`Packed::new_g4`]).
pub(super) const G4: usize = 4;

/// Packed groups of all jobs.
#[derive(Default)]
pub(super) struct Packed {
    /// Columns per group: [`G`], or [`G4`].
    pub g: usize,
    /// Quants, `q_len` per group.
    pub q: Vec<i8>,
    /// Scales, `d_len` per group.
    pub d: Vec<f32>,
    /// Corrections or sum pairs, `c_len` per group.
    pub c: Vec<i32>,
    /// First group of each job.
    pub first: Vec<usize>,
    /// Lengths per group.
    pub q_len: usize,
    /// Scales per group.
    pub d_len: usize,
    /// Corrections per group.
    pub c_len: usize,
}

impl Packed {
    /// Packs the columns of every job (`kind` is Q8 or Q8K; Q8K's sums are
    /// of 16 quants with `sums16`, else of 32).
    pub(super) fn new(acts: &Acts, kind: ActKind, jobs: &[Job]) -> Packed {
        let k = acts.k;
        // Pairs of sums per super-block.
        let pairs = if matches!(kind, ActKind::Q8K { sums16: true }) { 8 } else { 4 };
        let (q_len, d_len, c_len) = match kind {
            ActKind::Q8K { .. } => (k * G, (k / 256) * G, (k / 256) * pairs * G),
            _ => (k * G, (k / 32) * G, (k / 32) * G),
        };
        let (first, groups) = groups_of(jobs, G);
        let n = groups.len();
        let mut p = Packed {
            g: G,
            q: vec![0; n * q_len],
            d: vec![0.0; n * d_len],
            c: vec![0; n * c_len],
            first,
            q_len,
            d_len,
            c_len,
        };
        if n == 0 || k == 0 {
            return p;
        }
        p.q.par_chunks_mut(q_len)
            .zip(p.d.par_chunks_mut(d_len))
            .zip(p.c.par_chunks_mut(c_len))
            .zip(groups.par_iter())
            .for_each(|(((q, d), c), &(ji, g))| {
                let cols = &jobs[ji].cols;
                let act = |j: usize| cols[(G * g + j).min(cols.len() - 1)].act;
                let src: [usize; G] = std::array::from_fn(act);
                for (j, &a) in src.iter().enumerate() {
                    let col = &acts.q[a * k..(a + 1) * k];
                    for (step, four) in col.chunks_exact(4).enumerate() {
                        q[(step * G + j) * 4..][..4].copy_from_slice(four);
                    }
                }
                match kind {
                    ActKind::Q8K { .. } => {
                        let ns = k / 256;
                        for (j, &a) in src.iter().enumerate() {
                            for sb in 0..ns {
                                d[sb * G + j] = acts.d[a * ns + sb];
                                let bs = &acts.bs[(a * ns + sb) * 2 * pairs..][..2 * pairs];
                                for pr in 0..pairs {
                                    c[(sb * pairs + pr) * G + j] =
                                        (bs[2 * pr] as u16 as u32 | ((bs[2 * pr + 1] as u16 as u32) << 16)) as i32;
                                }
                            }
                        }
                    }
                    _ => {
                        let nb = k / 32;
                        for (j, &a) in src.iter().enumerate() {
                            for blk in 0..nb {
                                d[blk * G + j] = acts.d[a * nb + blk];
                                c[blk * G + j] = 8 * acts.c[a * nb + blk];
                            }
                        }
                    }
                }
            });
        p
    }

    /// Packs the Q8 columns of every job in groups of 4 (signed Q8_0 rows
    /// of 4 columns without VNNI, `kern::Fmt::Q8G4`): per group `q`
    /// `[K/8][4][8]` i8 (each step of 8 elements holds the 8 quants of each
    /// column side by side: one register, against one broadcast of 8
    /// weight quants) and `d` `[K/32][8]`, each block's column scales in
    /// the kernel's lane order `c0 c1 c0 c1 c2 c3 c2 c3`; no corrections.
    pub(super) fn new_g4(acts: &Acts, jobs: &[Job]) -> Packed {
        let k = acts.k;
        let nb = k / 32;
        let (q_len, d_len) = (k * G4, nb * 8);
        let (first, groups) = groups_of(jobs, G4);
        let n = groups.len();
        let mut p = Packed {
            g: G4,
            q: vec![0; n * q_len],
            d: vec![0.0; n * d_len],
            c: Vec::new(),
            first,
            q_len,
            d_len,
            c_len: 0,
        };
        if n == 0 || nb == 0 {
            return p;
        }
        p.q.par_chunks_mut(q_len).zip(p.d.par_chunks_mut(d_len)).zip(groups.par_iter()).for_each(
            |((q, d), &(ji, g))| {
                let cols = &jobs[ji].cols;
                let src: [usize; G4] = std::array::from_fn(|j| cols[(G4 * g + j).min(cols.len() - 1)].act);
                for (j, &a) in src.iter().enumerate() {
                    let col = &acts.q[a * k..(a + 1) * k];
                    for (step, eight) in col.chunks_exact(8).enumerate() {
                        q[(step * G4 + j) * 8..][..8].copy_from_slice(eight);
                    }
                    for blk in 0..nb {
                        let v = acts.d[a * nb + blk];
                        // Lanes of column j: (j / 2) · 4 + j % 2 and 2 past it.
                        let l = (j / 2) * 4 + j % 2;
                        d[blk * 8 + l] = v;
                        d[blk * 8 + l + 2] = v;
                    }
                }
            },
        );
        p
    }
}

/// The first group of each job, and (job, group within the job) of every
/// group of `g` columns.
fn groups_of(jobs: &[Job], g: usize) -> (Vec<usize>, Vec<(usize, usize)>) {
    let mut first = Vec::with_capacity(jobs.len());
    let mut groups = Vec::new();
    for (ji, j) in jobs.iter().enumerate() {
        first.push(groups.len());
        groups.extend((0..j.cols.len().div_ceil(g)).map(|gi| (ji, gi)));
    }
    (first, groups)
}
