//! The IQ4_NL and IQ4_XS quantizers, bit-identical to ggml 0.25.3's
//! `ggml_quantize_chunk(type, …, imatrix = NULL)` (`quantize_iq4_nl`,
//! `quantize_iq4_xs` in `ggml-quants.c`: a scale search over the non-linear
//! 4-bit table), and the codebook index the other IQ quantizers
//! (`iq_search.rs`) search: per off-grid code its nearest codebook points
//! ("neighbours"), computed once per process as ggml's
//! `iq2xs_init_impl`/`iq3xs_init_impl` compute them.
//!
//! To reproduce ggml's bytes, every float expression is evaluated in the
//! same order and precision as the C code (single precision, no fused
//! multiply-add).

// The block layouts are index formulas; indexed loops state them most directly.
#![allow(clippy::needless_range_loop)]

use super::blocks::*;
use super::grids::*;
use super::kquants::nearest_int;
use std::sync::OnceLock;

/// ggml's `GROUP_MAX_EPS`.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `MAX(a, b)` macro, `a > b ? a : b` (so a NaN `a` yields `b`).
#[inline(always)]
pub(crate) fn cmax(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

// ---------------------------------------------------------------------------
// IQ4_NL, IQ4_XS
// ---------------------------------------------------------------------------

/// Index of the table value nearest to `x`, the lower one on ties, the ends
/// for values beyond them, the top for NaN (ggml's `best_index_int8`).
#[inline(always)]
fn best_index_int8(values: &[i8; 16], x: f32) -> u8 {
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < values[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (values[mu - 1] as f32) < values[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// `Σ w·q·x` and `Σ w·q²` (w = x²) of a group quantized with inverse scale `id`.
#[inline(always)]
fn iq4_sums(xb: &[f32], id: f32) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for &x in xb {
        let q = KVALUES_IQ4NL[best_index_int8(&KVALUES_IQ4NL, id * x) as usize] as f32;
        let w = x * x;
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The scale of one group of 32 (ggml's `quantize_row_iq4_nl_impl` search
/// with `ntry = 7`, no importance matrix): 0 for an all-(near-)zero group.
fn iq4_group_scale(xb: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &x in xb {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0];
    let (sumqx, sumq2) = iq4_sums(xb, 1.0 / (-max / v0 as f32));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -7i32..=7 {
        let (sumqx, sumq2) = iq4_sums(xb, (itry + v0 as i32) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 4-bit codes of `xb` quantized with inverse scale `id` (element
/// `j` in the low nibble of byte `j`, `j + 16` in the high one).
#[inline(always)]
fn iq4_pack(xb: &[f32], id: f32, qs: &mut [u8]) {
    for j in 0..16 {
        let lo = best_index_int8(&KVALUES_IQ4NL, id * xb[j]);
        let hi = best_index_int8(&KVALUES_IQ4NL, id * xb[j + 16]);
        qs[j] = lo | (hi << 4);
    }
}

/// `quantize_iq4_nl` without an importance matrix.
pub(crate) fn quantize_iq4_nl(x: &[f32], y: &mut [BlockIQ4NL]) {
    for (xb, yb) in x.chunks_exact(QK4_NL).zip(y.iter_mut()) {
        let d = iq4_group_scale(xb);
        yb.d = f16_bytes(d);
        iq4_pack(xb, if d != 0.0 { 1.0 / d } else { 0.0 }, &mut yb.qs);
    }
}

/// `quantize_row_iq4_nl_ref` (ggml's CPU `from_float` for IQ4_NL, what its
/// `cpy` and `set_rows` write): per block one least-squares scale for the
/// codes chosen at scale `max / −127`, without `quantize_iq4_nl`'s ±7 scale
/// search. An all-(near-)zero block gets scale 0 and codes 8 (ggml leaves
/// that block's codes as they were in its scratch, which only changes bytes
/// that decode to zero).
pub(crate) fn quantize_iq4_nl_ref(x: &[f32], y: &mut [BlockIQ4NL]) {
    for (xb, yb) in x.chunks_exact(QK4_NL).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            *yb = BlockIQ4NL { d: f16_bytes(0.0), qs: [0x88; QK4_NL / 2] };
            continue;
        }
        let id = 1.0 / (max / KVALUES_IQ4NL[0] as f32);
        let (sumqx, sumq2) = iq4_sums(xb, id);
        yb.d = f16_bytes(if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 });
        iq4_pack(xb, id, &mut yb.qs);
    }
}

/// `quantize_iq4_xs` without an importance matrix.
pub(crate) fn quantize_iq4_xs(x: &[f32], y: &mut [BlockIQ4XS]) {
    for (xbl, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut scales = [0f32; 8];
        let (mut amax_scale, mut max_scale) = (0f32, 0f32);
        for (g, xb) in xbl.chunks_exact(32).enumerate() {
            scales[g] = iq4_group_scale(xb);
            if scales[g].abs() > amax_scale {
                amax_scale = scales[g].abs();
                max_scale = scales[g];
            }
        }
        let d = -max_scale / 32.0;
        yb.d = f16_bytes(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut scales_h = 0u16;
        yb.scales_l = [0; 4];
        for (g, xb) in xbl.chunks_exact(32).enumerate() {
            let l = nearest_int(id * scales[g]).clamp(-32, 31);
            let dl = d * l as f32;
            iq4_pack(xb, if dl != 0.0 { 1.0 / dl } else { 0.0 }, &mut yb.qs[16 * g..16 * g + 16]);
            let l = (l + 32) as u8;
            yb.scales_l[g / 2] |= (l & 0xf) << (4 * (g % 2));
            scales_h |= ((l >> 4) as u16) << (2 * g);
        }
        yb.scales_h = scales_h.to_le_bytes();
    }
}

// ---------------------------------------------------------------------------
// Codebook neighbours
// ---------------------------------------------------------------------------

/// A codebook as the quantizers see it: each point's coordinates as odd
/// positions `2·rank + 1` (rank of the coordinate among the grid's levels),
/// the map from a code (ranks packed `bits` per coordinate) to its point,
/// and for off-grid codes the list of nearest points.
pub(crate) struct GridIndex<const D: usize> {
    /// The points' positions.
    pub(crate) points: Vec<[i8; D]>,
    /// Per code: the point (≥ 0), or −(1 + start of its list in `lists`).
    map: Vec<i32>,
    /// Neighbour lists: a count, then that many point indices.
    lists: Vec<u16>,
}

/// Where a code lies.
pub(crate) enum Lookup<'a> {
    /// On the grid: this point.
    On(usize),
    /// Off the grid: its nearest points.
    Near(&'a [u16]),
}

impl<const D: usize> GridIndex<D> {
    /// Builds the index of `grid` (coordinates as little-endian bytes whose
    /// values are `levels`), codes of `bits` per coordinate below
    /// `map_size`, neighbours of the `nwant` nearest distinct squared
    /// distances, for the codes whose ranks are all at most `lmax` (the
    /// only ones the quantizers form). Neighbours are ordered by
    /// (distance, index), as ggml's sort orders them.
    fn build(grid: &[u64], levels: &[u8], bits: u32, map_size: usize, nwant: usize, lmax: usize) -> Self {
        let rank = |c: u8| levels.iter().position(|&l| l == c).unwrap_or(0);
        let points: Vec<[i8; D]> =
            grid.iter().map(|&g| std::array::from_fn(|k| (2 * rank((g >> (8 * k)) as u8) + 1) as i8)).collect();
        let mut map = vec![i32::MIN; map_size];
        for (i, p) in points.iter().enumerate() {
            let u: usize = p.iter().enumerate().map(|(k, &c)| ((c as usize - 1) / 2) << (bits as usize * k)).sum();
            map[u] = i as i32;
        }
        let mask = (1usize << bits) - 1;
        let mut lists = Vec::new();
        let mut d2 = vec![0i32; points.len()];
        for u in 0..map_size {
            let pos: [i32; D] = std::array::from_fn(|k| 2 * ((u >> (bits as usize * k)) & mask) as i32 + 1);
            if map[u] >= 0 || pos.iter().any(|&p| p > 2 * lmax as i32 + 1) {
                continue;
            }
            // The nwant smallest distinct distances, ascending.
            let mut nearest: Vec<i32> = Vec::with_capacity(nwant + 1);
            for (dj, p) in d2.iter_mut().zip(&points) {
                *dj = p.iter().zip(&pos).map(|(&a, &b)| (a as i32 - b) * (a as i32 - b)).sum();
                if let Err(at) = nearest.binary_search(dj) {
                    nearest.insert(at, *dj);
                    nearest.truncate(nwant);
                }
            }
            let cut = *nearest.last().unwrap_or(&i32::MAX);
            let mut near: Vec<(i32, u16)> =
                d2.iter().enumerate().filter(|(_, &d)| d <= cut).map(|(j, &d)| (d, j as u16)).collect();
            near.sort_unstable();
            map[u] = -(lists.len() as i32 + 1);
            lists.push(near.len() as u16);
            lists.extend(near.iter().map(|&(_, j)| j));
        }
        GridIndex { points, map, lists }
    }

    /// Where code `u` lies (an unformed code looks like an empty list).
    #[inline(always)]
    pub(crate) fn lookup(&self, u: usize) -> Lookup<'_> {
        match self.map.get(u) {
            Some(&i) if i >= 0 => Lookup::On(i as usize),
            Some(&i) if i != i32::MIN => {
                let start = (-(i + 1)) as usize;
                let n = self.lists[start] as usize;
                Lookup::Near(&self.lists[start + 1..start + 1 + n])
            }
            _ => Lookup::Near(&[]),
        }
    }

    /// The point of `list` nearest to `xval` at `scale` in `w`-weighted
    /// squared distance, the first on ties (ggml's
    /// `iq2_find_best_neighbour`/`iq3_find_best_neighbour`); the first of
    /// the list (or point 0) when no distance is below `f32::MAX`.
    pub(crate) fn best_neighbour(&self, list: &[u16], xval: &[f32], w: &[f32], scale: f32) -> usize {
        let mut best_d2 = f32::MAX;
        let mut best = None;
        for &j in list {
            let mut d2 = 0f32;
            for (i, &p) in self.points[j as usize].iter().enumerate() {
                let diff = scale * p as f32 - xval[i];
                d2 += w[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                best = Some(j as usize);
            }
        }
        best.unwrap_or(list.first().map_or(0, |&j| j as usize))
    }

    /// The point for code `u`, and the ranks of its coordinates into `l`:
    /// the code's own point, or the best neighbour.
    #[inline(always)]
    pub(crate) fn snap(&self, u: usize, xval: &[f32], w: &[f32], scale: f32, l: &mut [i8]) -> (usize, bool) {
        let (gi, on) = match self.lookup(u) {
            Lookup::On(i) => (i, true),
            Lookup::Near(list) => (self.best_neighbour(list, xval, w, scale), false),
        };
        for (li, &p) in l.iter_mut().zip(&self.points[gi]) {
            *li = (p - 1) / 2;
        }
        (gi, on)
    }

    /// The point of an on-grid code (point 0 for an off-grid one, where
    /// ggml aborts).
    #[inline(always)]
    pub(crate) fn point_of(&self, l: &[i8], bits: u32) -> usize {
        let u: usize = l.iter().enumerate().map(|(i, &v)| (v as usize) << (bits as usize * i)).sum();
        match self.lookup(u) {
            Lookup::On(i) => i,
            Lookup::Near(_) => 0,
        }
    }
}

fn widen(g: &[u32]) -> Vec<u64> {
    g.iter().map(|&v| v as u64).collect()
}

/// IQ3_XXS's codebook index (ggml's `iq3xs_init_impl(256)`).
pub(crate) fn iq3xxs_index() -> &'static GridIndex<4> {
    static I: OnceLock<GridIndex<4>> = OnceLock::new();
    I.get_or_init(|| GridIndex::build(&widen(&IQ3XXS_GRID), &[4, 12, 20, 28, 36, 44, 52, 62], 3, 4096, 2, 7))
}

/// IQ3_S's codebook index (ggml's `iq3xs_init_impl(512)`).
pub(crate) fn iq3s_index() -> &'static GridIndex<4> {
    static I: OnceLock<GridIndex<4>> = OnceLock::new();
    I.get_or_init(|| GridIndex::build(&widen(&IQ3S_GRID), &[1, 3, 5, 7, 9, 11, 13, 15], 3, 4096, 3, 7))
}

/// IQ2_S's codebook index (ggml's `iq2xs_init_impl(GGML_TYPE_IQ2_S)`).
pub(crate) fn iq2s_index() -> &'static GridIndex<8> {
    static I: OnceLock<GridIndex<8>> = OnceLock::new();
    I.get_or_init(|| GridIndex::build(&IQ2S_GRID, &[8, 25, 43], 2, 43692, 1, 2))
}

/// IQ1_M's codebook index (ggml's `iq2xs_init_impl(GGML_TYPE_IQ1_M)`).
pub(crate) fn iq1_index() -> &'static GridIndex<8> {
    static I: OnceLock<GridIndex<8>> = OnceLock::new();
    I.get_or_init(|| GridIndex::build(&IQ1S_GRID, &[0xff, 0, 1], 2, 43692, 3, 2))
}
