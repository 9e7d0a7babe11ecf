//! Tile kernels: `RM` weight rows × `RN` activation columns of dot products
//! in one pass over K, so each loaded weight vector serves `RN` columns and
//! each activation vector `RM` rows (register blocking, as ggml's
//! `tinyBLAS`). Formats ([`Fmt`]; see `decode.rs`, `acts.rs`, `packed.rs`):
//!
//! * `F32`, `F16`, `BF16`: rows of those values (read in place) × f32 columns.
//! * `Q8`: rows of u8 quants (offset-encoded) with an f32 scale per 32 ×
//!   Q8_0 columns (i8 quants, f32 scales, per-lane integer corrections).
//! * `Q8S`: as `Q8` with signed i8 row quants (Q8_0 weights without VNNI).
//! * `Q4K`: rows of u8 nibbles with per-super-block d, dmin, 8 scales and
//!   8 mins × Q8_K columns; portable only (SIMD builds take `GemvQ4K` or
//!   `Q4KI`).
//! * `Q6K`: rows of u8 six-bit quants with per-super-block d and 16 i8
//!   scales × Q8_K columns (with their 16 sums of 16 for the −32 offset);
//!   portable only (SIMD builds take `GemvQ6K` or `Q6KI`).
//! * `Q8I`, `Q8SI`, `Q4KI`, `Q6KI`: the same rows × groups of 8
//!   column-interleaved columns (`packed.rs`), 8 or 16 columns per tile.
//! * `GemvQ4_0`, `GemvQ5_0`, `GemvQ8_0`, `GemvQ4K`, `GemvQ6K`: one to four
//!   columns × raw weight blocks (Q4_0/Q5_0/Q8_0: 8
//!   blocks' dots reduced together and scaled with one FMA). The kernels of
//!   each format (one column, tiles, packed tiles) combine a column's block
//!   sums in one order, whatever the tile (batch invariance): Q4_0/Q5_0/Q8_0
//!   as `gemv_q8_body`, Q4_K as `q4k_fold`, Q6_K as `q6k_fold`.
//!
//! Every kernel exists as portable Rust and, on x86_64, as an AVX2+FMA+F16C
//! build and an AVX-512 VNNI build (`vpdpbusd`/`vpdpwssd` through `asm!`,
//! keeping the crate's minimum Rust version) of the same generic body, chosen
//! once at run time.

// Kernel bodies index several per-row / per-column register arrays with the
// same loop variable; iterator chains would obscure them.
#![allow(clippy::needless_range_loop)]

/// Largest row tile.
pub(super) const MR: usize = 8;
/// Largest column tile (packed kernels: two groups of 8).
pub(super) const NR: usize = 16;
/// Most columns per matrix for which AVX2 Q8_0 products read the weight
/// rows in place ([`Fmt::Q8SR`]) rather than decoding each row tile first
/// ([`Fmt::Q8SI`]). Kernel bench (4096², 2 threads, AVX2 EPYC): 8 columns
/// 1.73 → 1.47 ms in place; 16 equal (2.81 ms); 64 and 256 columns, whose
/// decoded tile is reused by 4-16 column tiles, 4-10 % faster decoded.
pub(super) const RAW_Q8_MAX_COLS: usize = 16;

/// One tile's operands and results. Pointers past the tile's `rm`/`rn` are
/// copies of the last valid one (the driver pads), so kernels never branch
/// on partial tiles.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    /// Elements per dot product (K).
    pub k: usize,
    /// Row data: f32/f16 values or u8/i8 quants, `k` elements.
    pub a: [*const u8; MR],
    /// Q8: row block scales (k/32); Q4K: super-block d (k/256).
    pub ad: [*const f32; MR],
    /// Q4K: super-block dmin (k/256).
    pub am: [*const f32; MR],
    /// Q4K: 8 scales per super-block, each duplicated into both halves of a u32.
    pub asc: [*const u32; MR],
    /// Q4K: 8 mins per super-block (i16).
    pub amn: [*const i16; MR],
    /// Q6K: 16 sub-block scales per super-block (i8).
    pub a6: [*const i8; MR],
    /// Column data: f32 values or i8 quants, `k` elements.
    pub b: [*const u8; NR],
    /// Column scales: per 32 (Q8) or per 256 (Q4K).
    pub bd: [*const f32; NR],
    /// Q8: per-block lane corrections.
    pub bc: [*const i32; NR],
    /// Q4K: 8 sums of 32 per super-block; Q6K: 16 sums of 16.
    pub bs: [*const i16; NR],
    /// Results `out[row][col]`.
    pub out: [[f32; NR]; MR],
    /// The decoded-row kernels' prefetch: `pf_bytes` of raw weights from `pf`
    /// (the next row tile), hinted into cache a slice per step of K so that
    /// they arrive while this tile computes (never read; may be null).
    pub pf: *const u8,
    /// Bytes of the span at `pf`.
    pub pf_bytes: usize,
}

impl Default for Tile {
    fn default() -> Self {
        Tile {
            k: 0,
            a: [std::ptr::null(); MR],
            ad: [std::ptr::null(); MR],
            am: [std::ptr::null(); MR],
            asc: [std::ptr::null(); MR],
            amn: [std::ptr::null(); MR],
            a6: [std::ptr::null(); MR],
            b: [std::ptr::null(); NR],
            bd: [std::ptr::null(); NR],
            bc: [std::ptr::null(); NR],
            bs: [std::ptr::null(); NR],
            out: [[0.0; NR]; MR],
            pf: std::ptr::null(),
            pf_bytes: 0,
        }
    }
}

/// A tile kernel.
///
/// # Safety
/// Every pointer of rows `0..rm` and columns `0..rn` of the kernel's tile
/// size must be valid for the reads its format implies for `k` elements.
pub(super) type KernFn = unsafe fn(&mut Tile);

/// A raw-row kernel of `RN` columns (1 to 4: decode, small verify
/// batches) over a run of rows: `out` holds `RN` columns of `out.len() /
/// RN` results each (column-major), row `i` of column `c` the dot of the
/// raw weight row at `a0 + i·stride` with the tile's column `c`, by the
/// one-row tile kernel's own arithmetic (so bit-identical to it), with no
/// call, tile set-up or result copy per row between them.
///
/// # Safety
/// As [`KernFn`] for each of the rows `a0 + i·stride`, `i < out.len() /
/// RN` (row 0 of the tile is overwritten), and columns `0..RN` of the tile
/// set.
pub(super) type RowRunFn = unsafe fn(&mut Tile, *const u8, usize, &mut [f32]);

/// The [`RowRunFn`] of a raw-row format with `rn` columns (1 to 4), if
/// `isa` has one.
pub(super) fn row_run(isa: Isa, fmt: Fmt, rn: usize) -> Option<RowRunFn> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::row_run_of::<x86::Avx2>(fmt, rn),
        #[cfg(target_arch = "x86_64")]
        Isa::Vnni => x86::row_run_of::<x86::Vnni>(fmt, rn),
        _ => {
            let _ = (fmt, rn);
            None
        }
    }
}

/// Formats with tile kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fmt {
    /// f32 rows.
    F32,
    /// f16 rows.
    F16,
    /// bf16 rows.
    BF16,
    /// Raw rows × raw `vec_dot_type` columns through `quant::vec_dot_fn`
    /// (types without a tile kernel); not a tile kernel: the driver loops.
    VecDot,
    /// u8 offset-encoded rows, Q8 columns.
    Q8,
    /// i8 rows, Q8 columns without corrections (needs no VNNI).
    Q8S,
    /// Q4_K rows, Q8_K columns.
    Q4K,
    /// Q6_K rows, Q8_K columns.
    Q6K,
    /// One to four columns: raw Q4_0 rows × Q8 columns (x86 only).
    GemvQ4_0,
    /// One to four columns: raw Q5_0 rows × Q8 columns (x86 only).
    GemvQ5_0,
    /// One to four columns: raw Q8_0 rows × Q8 columns (x86 only; offset-encoded with
    /// VNNI, signed without).
    GemvQ8_0,
    /// One to four columns: raw Q4_K rows × Q8_K columns (x86 only).
    GemvQ4K,
    /// One to four columns: raw Q6_K rows × Q8_K columns (x86 only).
    GemvQ6K,
    /// `Q8` rows × packed groups of 8 Q8 columns (x86 only; see `packed.rs`).
    Q8I,
    /// `Q8S` rows × packed groups of 8 Q8 columns (x86 only: Q8_0 weights
    /// without VNNI, where u8 rows of up to 255 would overflow `maddubs`'s
    /// i16 pair sums).
    Q8SI,
    /// Raw Q8_0 rows, read in place, × packed groups of 8 Q8 columns, as
    /// `Q8SI` (x86 only, without VNNI): for up to [`RAW_Q8_MAX_COLS`] columns, where a
    /// decode pass would cost more than the columns gain from it.
    Q8SR,
    /// Raw Q8_0 rows, read in place, × one group of 4 Q8 columns (x86
    /// only, without VNNI: products of 4 columns, [`x86::q8g4_avx2`]).
    Q8G4,
    /// `Q4K` rows × packed groups of 8 Q8_K columns (x86 only).
    Q4KI,
    /// `Q6K` rows × packed groups of 8 Q8_K columns (x86 only).
    Q6KI,
}

impl Fmt {
    /// True for the formats whose columns are packed groups (`packed.rs`).
    pub(super) fn packed(self) -> bool {
        matches!(self, Fmt::Q8I | Fmt::Q8SI | Fmt::Q8SR | Fmt::Q8G4 | Fmt::Q4KI | Fmt::Q6KI)
    }
}

/// How far ahead, in bytes, the raw-row kernels (one to four columns)
/// prefetch their weight rows: 4096, or `SHARDGRAPH_MM_PREFETCH=N` (0: no
/// software prefetch; for measurements), read once.
pub(super) fn prefetch_distance() -> usize {
    use std::sync::OnceLock;
    static DIST: OnceLock<usize> = OnceLock::new();
    *DIST.get_or_init(|| std::env::var("SHARDGRAPH_MM_PREFETCH").ok().and_then(|v| v.parse().ok()).unwrap_or(4096))
}

/// The instruction set used by the kernels, detected once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Portable Rust.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 + AVX-512 (F, BW, VL) with VNNI.
    Vnni,
}

/// The best instruction set of this CPU (`SHARDGRAPH_MATMUL_ISA=scalar|avx2`
/// lowers it, for tests and measurements).
pub(crate) fn isa() -> Isa {
    use std::sync::OnceLock;
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detect();
        match std::env::var("SHARDGRAPH_MATMUL_ISA").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") if best != Isa::Scalar => Isa::Avx2,
            _ => best,
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
    let vnni = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    if vnni {
        Isa::Vnni
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::Scalar
}

/// Instantiates the dense tile kernel `$f` for the tile `$rm × $rn`.
macro_rules! pick {
    ($f:ident, $rm:expr, $rn:expr) => {
        match ($rm, $rn) {
            (1, 1) => $f::<1, 1> as KernFn,
            (4, 1) => $f::<4, 1> as KernFn,
            (8, 1) => $f::<8, 1> as KernFn,
            (2, 4) => $f::<2, 4> as KernFn,
            (4, 2) => $f::<4, 2> as KernFn,
            (3, 4) => $f::<3, 4> as KernFn,
            (4, 3) => $f::<4, 3> as KernFn,
            _ => $f::<4, 4> as KernFn,
        }
    };
}

/// The kernel for `fmt` with a tile of `rm × rn` (both must be one of the
/// sizes instantiated below: see [`tile_shape`]).
pub(super) fn kernel(isa: Isa, fmt: Fmt, rm: usize, rn: usize) -> KernFn {
    #[cfg(target_arch = "x86_64")]
    macro_rules! pick2 {
        ($f:ident) => {
            match (rm, rn) {
                (2, 16) => $f::<2, 2> as KernFn,
                (2, 8) => $f::<2, 1> as KernFn,
                (6, 16) => $f::<6, 2> as KernFn,
                (6, 8) => $f::<6, 1> as KernFn,
                _ => $f::<4, 2> as KernFn,
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    macro_rules! pick_raw {
        ($f:ident) => {
            match rn {
                2 => $f::<1, 2> as KernFn,
                3 => $f::<1, 3> as KernFn,
                4 => $f::<1, 4> as KernFn,
                _ => $f::<1, 1> as KernFn,
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    macro_rules! pick1 {
        ($f:ident) => {
            match (rm, rn) {
                (1, 2) => $f::<1, 2> as KernFn,
                (1, 3) => $f::<1, 3> as KernFn,
                (1, 4) => $f::<1, 4> as KernFn,
                (1, _) => $f::<1, 1> as KernFn,
                (2, _) => $f::<2, 1> as KernFn,
                (8, _) => $f::<8, 1> as KernFn,
                _ => $f::<4, 1> as KernFn,
            }
        };
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            use x86::*;
            match fmt {
                Fmt::F32 => pick!(f32_avx2, rm, rn),
                Fmt::F16 => pick!(f16_avx2, rm, rn),
                Fmt::BF16 => pick!(bf16_avx2, rm, rn),
                Fmt::Q8 => pick!(q8_avx2, rm, rn),
                Fmt::Q8S => pick!(q8s_avx2, rm, rn),
                // Decoded K-quant rows only go to packed tiles with SIMD (one
                // to four columns read raw rows: `GemvQ4K`, `GemvQ6K`).
                Fmt::Q4K | Fmt::Q6K => unreachable_kernel,
                Fmt::GemvQ4_0 => pick1!(gemv_q4_0_avx2),
                Fmt::GemvQ8_0 => pick1!(gemv_q8_0_avx2),
                Fmt::GemvQ5_0 => pick1!(gemv_q5_0_avx2),
                Fmt::GemvQ4K => pick_raw!(gemv_q4k_avx2),
                Fmt::GemvQ6K => pick_raw!(gemv_q6k_avx2),
                Fmt::Q8I => pick2!(q8i_avx2),
                Fmt::Q8SI => pick2!(q8si_avx2),
                Fmt::Q8SR => pick2!(q8sr_avx2),
                Fmt::Q8G4 => q8g4_avx2::<4> as KernFn,
                Fmt::Q4KI => pick2!(q4ki_avx2),
                Fmt::Q6KI => pick2!(q6ki_avx2),
                Fmt::VecDot => unreachable_kernel,
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Vnni => {
            use x86::*;
            match fmt {
                Fmt::F32 => pick!(f32_vnni, rm, rn),
                Fmt::F16 => pick!(f16_vnni, rm, rn),
                Fmt::BF16 => pick!(bf16_vnni, rm, rn),
                Fmt::Q8 => pick!(q8_vnni, rm, rn),
                Fmt::Q8S => pick!(q8s_vnni, rm, rn),
                // As for AVX2.
                Fmt::Q4K | Fmt::Q6K => unreachable_kernel,
                Fmt::GemvQ4_0 => pick1!(gemv_q4_0_vnni),
                Fmt::GemvQ8_0 => pick1!(gemv_q8_0_vnni),
                Fmt::GemvQ5_0 => pick1!(gemv_q5_0_vnni),
                Fmt::GemvQ4K => pick_raw!(gemv_q4k_vnni),
                Fmt::GemvQ6K => pick_raw!(gemv_q6k_vnni),
                Fmt::Q8I => pick2!(q8i_vnni),
                Fmt::Q8SI => pick2!(q8si_vnni),
                Fmt::Q8SR => pick2!(q8sr_vnni),
                Fmt::Q8G4 => q8g4_avx2::<4> as KernFn,
                Fmt::Q4KI => pick2!(q4ki_vnni),
                Fmt::Q6KI => pick2!(q6ki_vnni),
                Fmt::VecDot => unreachable_kernel,
            }
        }
        _ => scalar_kernel(fmt, rm, rn),
    }
}

/// The portable kernel for `fmt` (no SIMD) with a tile of `rm × rn`.
fn scalar_kernel(fmt: Fmt, rm: usize, rn: usize) -> KernFn {
    match fmt {
        Fmt::F32 => pick!(dense_scalar_f32, rm, rn),
        Fmt::F16 => pick!(dense_scalar_f16, rm, rn),
        Fmt::BF16 => pick!(dense_scalar_bf16, rm, rn),
        Fmt::Q8 | Fmt::Q8S => pick!(q8_scalar, rm, rn),
        Fmt::Q4K => pick!(q4k_scalar, rm, rn),
        Fmt::Q6K => pick!(q6k_scalar, rm, rn),
        // The driver never selects these without SIMD (nor `VecDot` as a tile).
        Fmt::GemvQ4_0
        | Fmt::GemvQ5_0
        | Fmt::GemvQ8_0
        | Fmt::GemvQ4K
        | Fmt::GemvQ6K
        | Fmt::Q8I
        | Fmt::Q8SI
        | Fmt::Q8SR
        | Fmt::Q8G4
        | Fmt::Q4KI
        | Fmt::Q6KI
        | Fmt::VecDot => unreachable_kernel,
    }
}

/// Tile shape (rows, columns) for `fmt` when a job has `ncols` columns.
pub(super) fn tile_shape(isa: Isa, fmt: Fmt, ncols: usize) -> (usize, usize) {
    if fmt == Fmt::VecDot {
        return (1, 1);
    }
    if ncols == 1 {
        // Dense rows stream from memory: more rows in flight keep more
        // prefetch streams busy.
        let rm = match fmt {
            Fmt::F32 | Fmt::F16 | Fmt::BF16 => 8,
            // Fused quantized kernels: one row at a time streams best and
            // keeps every accumulator in a register.
            Fmt::GemvQ4_0 | Fmt::GemvQ5_0 | Fmt::GemvQ8_0 | Fmt::GemvQ4K | Fmt::GemvQ6K => 1,
            _ => 4,
        };
        return (rm, 1);
    }
    if matches!(fmt, Fmt::GemvQ4_0 | Fmt::GemvQ5_0 | Fmt::GemvQ8_0 | Fmt::GemvQ4K | Fmt::GemvQ6K) {
        return (1, ncols.min(4));
    }
    if fmt == Fmt::Q8G4 {
        // 4 rows (kernel bench, 4 columns: 0.93 ms at 2, 0.83 at 4, 0.95 at 6, 0.89 at 8).
        return (4, 4);
    }
    if ncols == 2 {
        return (4, 2);
    }
    if ncols == 3 {
        return (4, 3);
    }
    match (isa, fmt) {
        // One group of 8 columns: a tile of 16 would compute it twice.
        (_, f) if f.packed() && ncols <= 8 => (6, 8),
        (Isa::Avx2, f) if f.packed() => (2, 16),
        (_, Fmt::Q8I | Fmt::Q8SI | Fmt::Q8SR) => (6, 16),
        (_, Fmt::Q4KI | Fmt::Q6KI) => (4, 16),
        (Isa::Scalar, _) => (4, 4),
        _ => (3, 4),
    }
}

// ---------------------------------------------------------------------------
// Portable kernels
// ---------------------------------------------------------------------------

/// Stands in for format/ISA pairs the driver never selects: reads nothing
/// and yields NaN, so a selection bug shows in results instead of reading
/// memory in the wrong format.
unsafe fn unreachable_kernel(t: &mut Tile) {
    t.out = [[f32::NAN; NR]; MR];
}

#[inline(always)]
unsafe fn rd<T: Copy>(p: *const u8, i: usize) -> T {
    // SAFETY: caller keeps `p + i·size_of::<T>()` inside the row/column (KernFn contract).
    unsafe { std::ptr::read_unaligned((p as *const T).add(i)) }
}

unsafe fn dense_scalar_f32<const RM: usize, const RN: usize>(t: &mut Tile) {
    for r in 0..RM {
        for c in 0..RN {
            let mut s = 0f32;
            for e in 0..t.k {
                // SAFETY: e < k (KernFn contract).
                unsafe { s += rd::<f32>(t.a[r], e) * rd::<f32>(t.b[c], e) };
            }
            t.out[r][c] = s;
        }
    }
}

unsafe fn dense_scalar_bf16<const RM: usize, const RN: usize>(t: &mut Tile) {
    for r in 0..RM {
        for c in 0..RN {
            let mut s = 0f32;
            for e in 0..t.k {
                // SAFETY: e < k (KernFn contract).
                unsafe { s += f32::from_bits((rd::<u16>(t.a[r], e) as u32) << 16) * rd::<f32>(t.b[c], e) };
            }
            t.out[r][c] = s;
        }
    }
}

unsafe fn dense_scalar_f16<const RM: usize, const RN: usize>(t: &mut Tile) {
    for r in 0..RM {
        for c in 0..RN {
            let mut s = 0f32;
            for e in 0..t.k {
                // SAFETY: e < k (KernFn contract).
                unsafe { s += half::f16::from_bits(rd::<u16>(t.a[r], e)).to_f32() * rd::<f32>(t.b[c], e) };
            }
            t.out[r][c] = s;
        }
    }
}

/// Portable Q8/Q8S: the row quants are u8 offset-encoded (`Q8`, corrected by
/// the column's lane corrections) or signed (`Q8S`, corrections are zero);
/// the driver encodes both so that `Σ a_enc·b + 8·c` is the exact block dot.
unsafe fn q8_scalar<const RM: usize, const RN: usize>(t: &mut Tile) {
    let nb = t.k / 32;
    for r in 0..RM {
        for c in 0..RN {
            let mut s = 0f32;
            for blk in 0..nb {
                // SAFETY: blk < k/32 and e < k (KernFn contract).
                unsafe {
                    let mut acc = 8 * rd::<i32>(t.bc[c] as *const u8, blk);
                    for e in 32 * blk..32 * blk + 32 {
                        acc += rd::<u8>(t.a[r], e) as i32 * rd::<i8>(t.b[c], e) as i32;
                    }
                    s += acc as f32 * (rd::<f32>(t.ad[r] as *const u8, blk) * rd::<f32>(t.bd[c] as *const u8, blk));
                }
            }
            t.out[r][c] = s;
        }
    }
}

unsafe fn q4k_scalar<const RM: usize, const RN: usize>(t: &mut Tile) {
    let nsb = t.k / 256;
    for r in 0..RM {
        for c in 0..RN {
            let mut s = 0f32;
            for sb in 0..nsb {
                // SAFETY: indices inside the super-block arrays (KernFn contract).
                unsafe {
                    let mut isum = 0i32;
                    let mut imin = 0i32;
                    for j in 0..8 {
                        let sc = (rd::<u32>(t.asc[r] as *const u8, 8 * sb + j) & 0xffff) as i32;
                        let mut dot = 0i32;
                        for e in 256 * sb + 32 * j..256 * sb + 32 * j + 32 {
                            dot += rd::<u8>(t.a[r], e) as i32 * rd::<i8>(t.b[c], e) as i32;
                        }
                        isum += sc * dot;
                        imin += rd::<i16>(t.amn[r] as *const u8, 8 * sb + j) as i32
                            * rd::<i16>(t.bs[c] as *const u8, 8 * sb + j) as i32;
                    }
                    let bd = rd::<f32>(t.bd[c] as *const u8, sb);
                    s += bd
                        * (rd::<f32>(t.ad[r] as *const u8, sb) * isum as f32
                            - rd::<f32>(t.am[r] as *const u8, sb) * imin as f32);
                }
            }
            t.out[r][c] = s;
        }
    }
}

/// Portable Q6K: per super-block the exact integer dot `I = Σ_j sc_j·(Σ q·b
/// − 32·Σ b)` over its 16 sub-blocks, added scaled by `d·d_col` to one
/// running sum (the order of `q6k_fold`).
unsafe fn q6k_scalar<const RM: usize, const RN: usize>(t: &mut Tile) {
    let nsb = t.k / 256;
    for r in 0..RM {
        for c in 0..RN {
            let mut s = 0f32;
            for sb in 0..nsb {
                // SAFETY: indices inside the super-block arrays (KernFn contract).
                unsafe {
                    let mut isum = 0i32;
                    for j in 0..16 {
                        let sc = rd::<i8>(t.a6[r] as *const u8, 16 * sb + j) as i32;
                        let mut dot = -32 * rd::<i16>(t.bs[c] as *const u8, 16 * sb + j) as i32;
                        for e in 256 * sb + 16 * j..256 * sb + 16 * j + 16 {
                            dot += rd::<u8>(t.a[r], e) as i32 * rd::<i8>(t.b[c], e) as i32;
                        }
                        isum += sc * dot;
                    }
                    s += isum as f32 * (rd::<f32>(t.ad[r] as *const u8, sb) * rd::<f32>(t.bd[c] as *const u8, sb));
                }
            }
            t.out[r][c] = s;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{q4k_scales_mins, q6k_unpack};

// ---------------------------------------------------------------------------
// x86_64 kernels
// ---------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Tile;
    use core::arch::x86_64::*;

    /// Integer dot-product steps that differ between AVX2 and VNNI.
    pub(super) trait Dot {
        /// True for the VNNI build (Q8_0 rows are offset-encoded, not signed).
        const VNNI: bool;
        /// `acc + Σ₄ a_u8·b_i8` per i32 lane (AVX2: `a` must keep pair sums in i16).
        unsafe fn ub(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
        /// `acc + Σ₂ a_i16·b_i16` per i32 lane.
        unsafe fn w(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    }
    pub(super) struct Avx2;
    pub(super) struct Vnni;
    impl Dot for Avx2 {
        const VNNI: bool = false;
        #[inline(always)]
        unsafe fn ub(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: only inlined into functions compiled with AVX2.
            unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))) }
        }
        #[inline(always)]
        unsafe fn w(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: as above.
            unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
        }
    }
    // The VNNI instructions are emitted with `asm!` (EVEX-encoded, AVX-512 VL
    // + VNNI) so the crate keeps its minimum Rust version: the AVX-512
    // intrinsics and target features are stable only since Rust 1.89. The
    // kernels that use them are selected only after run-time detection.
    impl Dot for Vnni {
        const VNNI: bool = true;
        #[inline(always)]
        unsafe fn ub(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: the CPU has AVX-512 VL + VNNI (`detect`); AVX2 callers.
            unsafe { vpdpbusd(acc, a, b) }
        }
        #[inline(always)]
        unsafe fn w(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: as above.
            unsafe { vpdpwssd(acc, a, b) }
        }
    }

    /// `acc + Σ₄ a_u8·b_i8` per lane (`vpdpbusd`, EVEX: AVX-512 VL + VNNI).
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn vpdpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        let mut r = acc;
        // SAFETY: register-only instruction; callers check the CPU has it.
        unsafe {
            std::arch::asm!(
                "{{evex}} vpdpbusd {r}, {a}, {b}",
                r = inout(ymm_reg) r,
                a = in(ymm_reg) a,
                b = in(ymm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
        r
    }

    /// `acc + Σ₂ a_i16·b_i16` per lane (`vpdpwssd`, EVEX: AVX-512 VL + VNNI).
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn vpdpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        let mut r = acc;
        // SAFETY: as above.
        unsafe {
            std::arch::asm!(
                "{{evex}} vpdpwssd {r}, {a}, {b}",
                r = inout(ymm_reg) r,
                a = in(ymm_reg) a,
                b = in(ymm_reg) b,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
        r
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: AVX (implied by every caller's features).
        unsafe {
            let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
            let x = _mm_add_ss(x, _mm_movehdup_ps(x));
            _mm_cvtss_f32(x)
        }
    }

    /// f32 (`E = 0`), f16 (`E = 1`) or bf16 (`E = 2`) rows × f32 columns,
    /// 8 lanes per step.
    #[inline(always)]
    unsafe fn dense_body<const RM: usize, const RN: usize, const E: u8>(t: &mut Tile) {
        // SAFETY: KernFn contract: rows and columns hold k elements.
        unsafe {
            let k = t.k;
            let mut acc = [[_mm256_setzero_ps(); RN]; RM];
            let mut i = 0;
            while i + 8 <= k {
                let mut av = [_mm256_setzero_ps(); RM];
                for r in 0..RM {
                    av[r] = match E {
                        1 => _mm256_cvtph_ps(_mm_loadu_si128(t.a[r].add(2 * i) as *const __m128i)),
                        2 => _mm256_castsi256_ps(_mm256_slli_epi32(
                            _mm256_cvtepu16_epi32(_mm_loadu_si128(t.a[r].add(2 * i) as *const __m128i)),
                            16,
                        )),
                        _ => _mm256_loadu_ps(t.a[r].add(4 * i) as *const f32),
                    };
                }
                for c in 0..RN {
                    let bv = _mm256_loadu_ps((t.b[c] as *const f32).add(i));
                    for r in 0..RM {
                        acc[r][c] = _mm256_fmadd_ps(av[r], bv, acc[r][c]);
                    }
                }
                i += 8;
            }
            for r in 0..RM {
                for c in 0..RN {
                    let mut s = hsum(acc[r][c]);
                    for e in i..k {
                        let a = match E {
                            1 => half::f16::from_bits(std::ptr::read_unaligned((t.a[r] as *const u16).add(e))).to_f32(),
                            2 => f32::from_bits((std::ptr::read_unaligned((t.a[r] as *const u16).add(e)) as u32) << 16),
                            _ => std::ptr::read_unaligned((t.a[r] as *const f32).add(e)),
                        };
                        s += a * std::ptr::read_unaligned((t.b[c] as *const f32).add(e));
                    }
                    t.out[r][c] = s;
                }
            }
        }
    }

    /// u8 (offset-encoded, `SIGNED = false`) or signed i8 rows (`SIGNED`:
    /// the `maddubs` sign trick, no VNNI) × i8 columns in blocks of 32 with
    /// f32 scales. Block sums are combined in the order of [`gemv_q8_body`]
    /// (batch invariance): 8 blocks' exact integer dots at a time, reduced to
    /// one vector (lane = block mod 8) and scaled with one FMA; the blocks past
    /// the last whole 8 one by one, summed apart.
    #[inline(always)]
    unsafe fn q8_body<D: Dot, const RM: usize, const RN: usize, const SIGNED: bool>(t: &mut Tile) {
        // SAFETY: KernFn contract.
        unsafe {
            let nb = t.k / 32;
            let full = nb - nb % 8;
            let ones = _mm256_set1_epi16(1);
            let mut acc = [[_mm256_setzero_ps(); RN]; RM];
            let mut tail = [[0f32; RN]; RM];
            // Each (row, column)'s integer lanes of up to 8 blocks.
            let mut s = [[[_mm256_setzero_si256(); 8]; RN]; RM];
            let mut blk = 0;
            while blk < nb {
                let n = if blk < full { 8 } else { 1 };
                for j in 0..n {
                    prefetch_slice(t, blk + j, nb);
                    let mut av = [_mm256_setzero_si256(); RM];
                    let mut aa = [_mm256_setzero_si256(); RM];
                    for r in 0..RM {
                        av[r] = _mm256_loadu_si256(t.a[r].add(32 * (blk + j)) as *const __m256i);
                        if SIGNED {
                            aa[r] = _mm256_sign_epi8(av[r], av[r]);
                        }
                    }
                    for c in 0..RN {
                        let bv = _mm256_loadu_si256(t.b[c].add(32 * (blk + j)) as *const __m256i);
                        for r in 0..RM {
                            s[r][c][j] = if SIGNED {
                                _mm256_madd_epi16(_mm256_maddubs_epi16(aa[r], _mm256_sign_epi8(bv, av[r])), ones)
                            } else {
                                D::ub(_mm256_set1_epi32(*t.bc[c].add(blk + j)), av[r], bv)
                            };
                        }
                    }
                }
                for r in 0..RM {
                    for c in 0..RN {
                        if n == 8 {
                            let tot = reduce8(&s[r][c]);
                            let sc =
                                _mm256_mul_ps(_mm256_loadu_ps(t.ad[r].add(blk)), _mm256_loadu_ps(t.bd[c].add(blk)));
                            acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), sc, acc[r][c]);
                        } else {
                            let tot = hsum_i32(s[r][c][0]);
                            tail[r][c] += tot as f32 * (*t.ad[r].add(blk) * *t.bd[c].add(blk));
                        }
                    }
                }
                blk += n;
            }
            for r in 0..RM {
                for c in 0..RN {
                    t.out[r][c] = hsum(acc[r][c]) + tail[r][c];
                }
            }
        }
    }

    /// Sums of each of 8 i32x8 vectors, as the 8 lanes of one vector.
    #[inline(always)]
    unsafe fn reduce8(s: &[__m256i; 8]) -> __m256i {
        // SAFETY: AVX2 (every caller's features).
        unsafe {
            let h01 = _mm256_hadd_epi32(s[0], s[1]);
            let h23 = _mm256_hadd_epi32(s[2], s[3]);
            let h45 = _mm256_hadd_epi32(s[4], s[5]);
            let h67 = _mm256_hadd_epi32(s[6], s[7]);
            let g0 = _mm256_hadd_epi32(h01, h23);
            let g1 = _mm256_hadd_epi32(h45, h67);
            _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31))
        }
    }

    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        // SAFETY: AVX2.
        unsafe {
            let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b01_00_11_10));
            let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b10_11_00_01));
            _mm_cvtsi128_si32(x)
        }
    }

    /// Per lane, the 8 accumulators (lane j: blocks j mod 8) summed in the
    /// order of [`hsum`] (`(a0 + a4) + (a2 + a6)`, `(a1 + a5) + (a3 + a7)`,
    /// then those two), plus `tail`: the tile kernels' counterpart of the
    /// one-column kernels' final reduction.
    #[inline(always)]
    unsafe fn lanes_sum(l: &[__m256; 8], tail: __m256) -> __m256 {
        // SAFETY: AVX (every caller's features).
        unsafe {
            let x: [__m256; 4] = std::array::from_fn(|j| _mm256_add_ps(l[j], l[j + 4]));
            _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x[0], x[2]), _mm256_add_ps(x[1], x[3])), tail)
        }
    }

    /// The f16 scales at the start of 8 blocks `stride` bytes apart, as f32.
    #[inline(always)]
    unsafe fn scales8(p: *const u8, stride: usize) -> __m256 {
        // SAFETY: the 8 blocks are inside the row (caller); F16C.
        unsafe {
            let h = |j: usize| std::ptr::read_unaligned(p.add(j * stride) as *const i16);
            _mm256_cvtph_ps(_mm_set_epi16(h(7), h(6), h(5), h(4), h(3), h(2), h(1), h(0)))
        }
    }

    /// One f16 at `p` as f32.
    #[inline(always)]
    unsafe fn f16_one(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes at `p`; F16C.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const u16) as i32))) }
    }

    /// Raw block formats of the one-column kernels (`gemv_q8_body`'s `F`).
    const RAW_Q4_0: u8 = 0;
    const RAW_Q8_0: u8 = 1;
    const RAW_Q5_0: u8 = 2;

    /// The quants of a raw Q4_0, Q8_0 or Q5_0 block (`F`; `p` just past
    /// its f16 scale) as 32 bytes in the encoding the dot uses (Q4_0:
    /// nibbles; Q5_0: nibble + 16·high bit; Q8_0: `q + 128` with VNNI,
    /// signed without).
    #[inline(always)]
    unsafe fn raw_block<D: Dot, const F: u8>(p: *const u8) -> __m256i {
        // SAFETY: the block's quants (and Q5_0's high bits) are readable at `p`.
        unsafe {
            let nibbles = |q: *const u8| {
                let v = _mm_loadu_si128(q as *const __m128i);
                _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0f))
            };
            match F {
                RAW_Q8_0 => {
                    let v = _mm256_loadu_si256(p as *const __m256i);
                    if D::VNNI {
                        _mm256_xor_si256(v, _mm256_set1_epi8(-128))
                    } else {
                        v
                    }
                }
                RAW_Q5_0 => {
                    // Byte i of the result takes bit i of the 32 high bits:
                    // byte i/8 of them, masked by 1 << (i mod 8).
                    let qh = _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32));
                    let pick = _mm256_setr_epi8(
                        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                    );
                    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, pick), bit), bit);
                    _mm256_or_si256(nibbles(p.add(4)), _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
                }
                _ => nibbles(p),
            }
        }
    }

    /// Integer dot of one encoded row block with an i8 column block.
    #[inline(always)]
    unsafe fn block_dot<D: Dot, const F: u8>(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: features of the caller.
        unsafe {
            if F == RAW_Q8_0 && !D::VNNI {
                let p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
                _mm256_madd_epi16(p, _mm256_set1_epi16(1))
            } else {
                D::ub(_mm256_setzero_si256(), a, b)
            }
        }
    }

    /// `RN` columns × `RM` raw Q4_0 / Q8_0 / Q5_0 rows (`F`), 8 blocks per
    /// step: the 8 block dots of a column are reduced to one vector and
    /// scaled with one FMA (one accumulator lane per block index mod 8), the
    /// blocks past the last whole 8 summed apart. Each column is computed
    /// exactly as alone (its weight blocks are re-read from L1 for the next
    /// column), so the tile kernels of these formats (`q8_body`, `q8i_body`)
    /// and every column count combine blocks in this same order.
    #[inline(always)]
    unsafe fn gemv_q8_body<D: Dot, const RM: usize, const RN: usize, const F: u8>(t: &mut Tile) {
        // SAFETY: KernFn contract (raw rows of k/32 blocks, RN Q8 columns).
        unsafe {
            let bsz = match F {
                RAW_Q8_0 => 34,
                RAW_Q5_0 => 22,
                _ => 18,
            };
            let nb = t.k / 32;
            let pf = super::prefetch_distance();
            let mut acc = [[_mm256_setzero_ps(); RN]; RM];
            let mut tail = [[0f32; RN]; RM];
            let mut blk = 0;
            while blk + 8 <= nb {
                for r in 0..RM {
                    let base = t.a[r].add(blk * bsz);
                    if pf > 0 {
                        prefetch_ahead(base, 8 * bsz, pf);
                    }
                    let sa = scales8(base, bsz);
                    for c in 0..RN {
                        let bd8 = _mm256_loadu_ps(t.bd[c].add(blk));
                        let corr = _mm256_slli_epi32(_mm256_loadu_si256(t.bc[c].add(blk) as *const __m256i), 3);
                        let mut s = [_mm256_setzero_si256(); 8];
                        for (j, sj) in s.iter_mut().enumerate() {
                            let av = raw_block::<D, F>(base.add(j * bsz + 2));
                            let bv = _mm256_loadu_si256(t.b[c].add(32 * (blk + j)) as *const __m256i);
                            *sj = block_dot::<D, F>(av, bv);
                        }
                        let tot = _mm256_add_epi32(reduce8(&s), corr);
                        let sc = _mm256_mul_ps(sa, bd8);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), sc, acc[r][c]);
                    }
                }
                blk += 8;
            }
            while blk < nb {
                for r in 0..RM {
                    let p = t.a[r].add(blk * bsz);
                    for c in 0..RN {
                        let av = raw_block::<D, F>(p.add(2));
                        let bv = _mm256_loadu_si256(t.b[c].add(32 * blk) as *const __m256i);
                        let tot = hsum_i32(block_dot::<D, F>(av, bv)) + 8 * *t.bc[c].add(blk);
                        tail[r][c] += tot as f32 * (f16_one(p) * *t.bd[c].add(blk));
                    }
                }
                blk += 1;
            }
            for r in 0..RM {
                for c in 0..RN {
                    t.out[r][c] = hsum(acc[r][c]) + tail[r][c];
                }
            }
        }
    }

    /// Hints the lines of `p + d .. p + d + bytes` into L1, `d` bytes ahead
    /// ([`super::prefetch_distance`]): the raw-row kernels' weight stream.
    /// One row's stream alone does not keep enough lines in flight for the
    /// hardware prefetcher on every CPU: measured on a 2-core Xeon (VNNI),
    /// a Qwen3-1.7B-shaped Q4_K_M decode step went from 0.77x to ≥ 1.0x
    /// llama.cpp's with 4 KiB ahead (1 KiB: 0.95x; 8-32 KiB: the same).
    #[inline(always)]
    unsafe fn prefetch_ahead(p: *const u8, bytes: usize, dist: usize) {
        let mut o = 0;
        while o < bytes {
            // SAFETY: a prefetch hint never faults (any address) and
            // changes no memory; the address is only computed, never read.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(dist + o) as *const i8) };
            o += 64;
        }
    }

    /// Step `i` of `n` of the tile's spread prefetch ([`Tile::pf`]): the
    /// `i`-th of `n` equal slices of the next tile's raw rows.
    #[inline(always)]
    unsafe fn prefetch_slice(t: &Tile, i: usize, n: usize) {
        if t.pf_bytes == 0 {
            return;
        }
        let per = t.pf_bytes.div_ceil(n.max(1)).next_multiple_of(64);
        let start = i * per;
        // SAFETY: prefetch hints only (never fault, read nothing).
        unsafe { prefetch_ahead(t.pf.wrapping_add(start), per.min(t.pf_bytes.saturating_sub(start)), 0) };
    }

    /// `RN` (one to four) columns × `RM` raw Q4_K rows (scales unpacked in
    /// registers once per super-block for every column, as ggml's
    /// `ggml_vec_dot_q4_K_q8_K` does for one), super-blocks folded with
    /// [`q4k_fold`].
    #[inline(always)]
    unsafe fn gemv_q4k_body<D: Dot, const RM: usize, const RN: usize>(t: &mut Tile) {
        // SAFETY: KernFn contract (raw rows of k/256 super-blocks, RN Q8_K columns).
        unsafe {
            let nsb = t.k / 256;
            let pf = super::prefetch_distance();
            let mask = _mm256_set1_epi8(0x0f);
            let mut shuf = [_mm256_setzero_si256(); 8];
            for (k, s) in shuf.iter_mut().enumerate() {
                *s = _mm256_set1_epi16(((2 * k as i16 + 1) << 8) | (2 * k as i16));
            }
            let mut acc = [[_mm_setzero_ps(); RN]; RM];
            for sb in 0..nsb {
                for r in 0..RM {
                    let blk = t.a[r].add(144 * sb);
                    if pf > 0 {
                        prefetch_ahead(blk, 144, pf);
                    }
                    // [d, dmin, 0, 0].
                    let dd = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                    let (sc8, mn8) = q4k_scales_mins(blk);
                    let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc8 as i64));
                    let mn16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn8 as i64));
                    let scales = _mm256_broadcastsi128_si256(sc16);
                    let mut isum = [_mm256_setzero_si256(); RN];
                    for g in 0..4 {
                        let v = _mm256_loadu_si256(blk.add(16 + 32 * g) as *const __m256i);
                        let lo = _mm256_and_si256(v, mask);
                        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                        let (s0, s1) =
                            (_mm256_shuffle_epi8(scales, shuf[2 * g]), _mm256_shuffle_epi8(scales, shuf[2 * g + 1]));
                        for c in 0..RN {
                            let bq = t.b[c].add(256 * sb + 64 * g);
                            let b0 = _mm256_loadu_si256(bq as *const __m256i);
                            let b1 = _mm256_loadu_si256(bq.add(32) as *const __m256i);
                            isum[c] = D::w(isum[c], _mm256_maddubs_epi16(lo, b0), s0);
                            isum[c] = D::w(isum[c], _mm256_maddubs_epi16(hi, b1), s1);
                        }
                    }
                    for c in 0..RN {
                        let bsum = _mm_loadu_si128(t.bs[c].add(8 * sb) as *const __m128i);
                        let sc = _mm_mul_ps(dd, _mm_set1_ps(*t.bd[c].add(sb)));
                        acc[r][c] = q4k_fold(acc[r][c], isum[c], _mm_madd_epi16(mn16, bsum), sc);
                    }
                }
            }
            for r in 0..RM {
                for c in 0..RN {
                    t.out[r][c] = q4k_result(acc[r][c]);
                }
            }
        }
    }

    /// The 8 six-bit scales and the 8 mins of the raw Q4_K super-block at
    /// `blk`, each 8 bytes in a u64 (byte `j`: sub-block `j`), unpacked
    /// from their 12 bytes four at a time with 32-bit masks (ggml's
    /// `get_scale_min_k4`).
    ///
    /// # Safety
    /// `blk` must be valid for reading the super-block's first 16 bytes.
    #[inline(always)]
    pub(in super::super) unsafe fn q4k_scales_mins(blk: *const u8) -> (u64, u64) {
        const KM1: u32 = 0x3f3f_3f3f;
        const KM2: u32 = 0x0f0f_0f0f;
        const KM3: u32 = 0x0303_0303;
        // SAFETY: bytes 4..16 of the super-block (the caller's contract).
        let u = |i: usize| unsafe { std::ptr::read_unaligned(blk.add(4 + 4 * i) as *const u32) };
        let (u0, u1, u2) = (u(0), u(1), u(2));
        let sc = (u0 & KM1) as u64 | ((((u2 & KM2) | (((u0 >> 6) & KM3) << 4)) as u64) << 32);
        let mn = (u1 & KM1) as u64 | (((((u2 >> 4) & KM2) | (((u1 >> 6) & KM3) << 4)) as u64) << 32);
        (sc, mn)
    }

    /// Q4_K's super-block step, the one order of every Q4_K kernel (batch
    /// invariance): the super-block's exact integer dot `I` (the sum of the
    /// 8 lanes of `isum`, scales applied) and min correction `M` (the 4
    /// lanes of `m`) each scaled by their factor (`sc = [d·d_col,
    /// dmin·d_col, ..]`) and added with one FMA to their own running sum
    /// (`acc = [ΣI·d·d_col, ΣM·dmin·d_col, ..]`, super-blocks in order).
    #[inline(always)]
    unsafe fn q4k_fold(acc: __m128, isum: __m256i, m: __m128i, sc: __m128) -> __m128 {
        // SAFETY: AVX2 (every caller's features).
        unsafe {
            let x = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
            // [x0 + x2, x1 + x3, m0 + m2, m1 + m3], with unpacks: `phaddd`
            // takes two cycles on Zen 3.
            let s = _mm_add_epi32(_mm_unpacklo_epi64(x, m), _mm_unpackhi_epi64(x, m));
            // [I, M, I, M]: integer sums are exact in any order.
            let tot = _mm_add_epi32(_mm_shuffle_epi32(s, 0b10_00_10_00), _mm_shuffle_epi32(s, 0b11_01_11_01));
            _mm_fmadd_ps(_mm_cvtepi32_ps(tot), sc, acc)
        }
    }

    /// A Q4_K dot from its [`q4k_fold`] sums: `ΣI·d·d_col − ΣM·dmin·d_col`.
    #[inline(always)]
    unsafe fn q4k_result(acc: __m128) -> f32 {
        // SAFETY: SSE3 (every caller's features).
        unsafe { _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc)) }
    }

    /// `Q8` rows (`SIGNED`: signed `Q8S` rows, with the `maddubs` sign
    /// trick of [`q8_body`]; `RAW`: raw Q8_0 rows read in place, no decode
    /// pass, the block's F16 scale converted where it is used) × `NCV`
    /// packed groups of 8 columns: per 4-element step one broadcast of each row's 4 quants and
    /// one dot per group. Block sums are combined in the order of
    /// [`gemv_q8_body`] (batch invariance): one accumulator per block index
    /// mod 8 (kept in memory: touched once per block), the blocks past the
    /// last whole 8 summed apart.
    #[inline(always)]
    unsafe fn q8i_body<D: Dot, const RM: usize, const NCV: usize, const SIGNED: bool, const RAW: bool>(t: &mut Tile) {
        // SAFETY: KernFn contract (rows of k u8 + k/32 scales, or raw Q8_0
        // rows of k/32 34-byte blocks when RAW; groups as in packed.rs).
        unsafe {
            // Bytes per block of a row, and where its quants start.
            let (bsz, q0) = if RAW { (34, 2) } else { (32, 0) };
            let nb = t.k / 32;
            let full = nb - nb % 8;
            let ones = _mm256_set1_epi16(1);
            let mut lane = [[[_mm256_setzero_ps(); 8]; NCV]; RM];
            let mut tail = [[_mm256_setzero_ps(); NCV]; RM];
            for blk in 0..nb {
                prefetch_slice(t, blk, nb);
                let mut acc = [[_mm256_setzero_si256(); NCV]; RM];
                for cv in 0..NCV {
                    let c = _mm256_loadu_si256(t.bc[cv].add(8 * blk) as *const __m256i);
                    for row in acc.iter_mut() {
                        row[cv] = c;
                    }
                }
                for s in 0..8 {
                    let step = 8 * blk + s;
                    let mut bv = [_mm256_setzero_si256(); NCV];
                    for (cv, b) in bv.iter_mut().enumerate() {
                        *b = _mm256_loadu_si256(t.b[cv].add(32 * step) as *const __m256i);
                    }
                    for r in 0..RM {
                        let av = _mm256_set1_epi32(std::ptr::read_unaligned(
                            t.a[r].add(bsz * blk + q0 + 4 * s) as *const i32
                        ));
                        if SIGNED {
                            // |a|·(b with a's sign): the exact products, with
                            // an unsigned first operand (|a| ≤ 128).
                            let aa = _mm256_sign_epi8(av, av);
                            for cv in 0..NCV {
                                let p = _mm256_maddubs_epi16(aa, _mm256_sign_epi8(bv[cv], av));
                                acc[r][cv] = _mm256_add_epi32(acc[r][cv], _mm256_madd_epi16(p, ones));
                            }
                        } else {
                            for cv in 0..NCV {
                                acc[r][cv] = D::ub(acc[r][cv], av, bv[cv]);
                            }
                        }
                    }
                }
                for r in 0..RM {
                    let da = if RAW {
                        _mm256_set1_ps(f16_one(t.a[r].add(bsz * blk)))
                    } else {
                        _mm256_broadcast_ss(&*t.ad[r].add(blk))
                    };
                    for cv in 0..NCV {
                        let sc = _mm256_mul_ps(da, _mm256_loadu_ps(t.bd[cv].add(8 * blk)));
                        let v = _mm256_cvtepi32_ps(acc[r][cv]);
                        if blk < full {
                            let l = &mut lane[r][cv][blk % 8];
                            *l = _mm256_fmadd_ps(v, sc, *l);
                        } else {
                            tail[r][cv] = _mm256_add_ps(tail[r][cv], _mm256_mul_ps(v, sc));
                        }
                    }
                }
            }
            for r in 0..RM {
                for cv in 0..NCV {
                    _mm256_storeu_ps(t.out[r][8 * cv..].as_mut_ptr(), lanes_sum(&lane[r][cv], tail[r][cv]));
                }
            }
        }
    }

    /// Raw Q8_0 rows, read in place, × one group of 4 Q8 columns in the
    /// [`super::packed::Packed::new_g4`] layout, without VNNI (a verify
    /// batch of 4 tokens): per step of 8 elements one broadcast of each
    /// row's 8 quants against the 4 columns' 8 quants, the sign trick's
    /// exact products, as a packed group of 8 columns does per step of 4
    /// (the one-column kernels re-read a block per column and reduce 8
    /// block dots per column with `vphaddd`). At a block's end the two
    /// partial sums of each column of two rows fold with one `vphaddd` into
    /// the lanes `r0c0 r0c1 r1c0 r1c1 r0c2 r0c3 r1c2 r1c3`, scaled and
    /// summed as [`q8i_body`] does (bit-identical to one column). `RM` is
    /// even.
    #[inline(always)]
    unsafe fn q8g4_body<const RM: usize>(t: &mut Tile) {
        // SAFETY: KernFn contract (raw rows of k/32 34-byte Q8_0 blocks; one
        // group as in `Packed::new_g4` at `b[0]`, its scales at `bd[0]`).
        unsafe {
            let nb = t.k / 32;
            let full = nb - nb % 8;
            let ones = _mm256_set1_epi16(1);
            let spread = _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);
            let mut lane = [[_mm256_setzero_ps(); 8]; RM];
            let mut tail = [_mm256_setzero_ps(); RM];
            for blk in 0..nb {
                prefetch_slice(t, blk, nb);
                let mut acc = [_mm256_setzero_si256(); RM];
                for s in 0..4 {
                    let bv = _mm256_loadu_si256(t.b[0].add(32 * (4 * blk + s)) as *const __m256i);
                    for (r, a) in acc.iter_mut().enumerate() {
                        let av = _mm256_set1_epi64x(std::ptr::read_unaligned(
                            t.a[r].add(34 * blk + 2 + 8 * s) as *const i64
                        ));
                        let p = _mm256_maddubs_epi16(_mm256_sign_epi8(av, av), _mm256_sign_epi8(bv, av));
                        *a = _mm256_add_epi32(*a, _mm256_madd_epi16(p, ones));
                    }
                }
                let db = _mm256_loadu_ps(t.bd[0].add(8 * blk));
                for pr in 0..RM / 2 {
                    let (r0, r1) = (2 * pr, 2 * pr + 1);
                    let v = _mm256_cvtepi32_ps(_mm256_hadd_epi32(acc[r0], acc[r1]));
                    let h = |r: usize| std::ptr::read_unaligned(t.a[r].add(34 * blk) as *const i16);
                    let d2 = _mm_cvtph_ps(_mm_setr_epi16(h(r0), h(r1), 0, 0, 0, 0, 0, 0));
                    let sc = _mm256_mul_ps(_mm256_permutevar8x32_ps(_mm256_castps128_ps256(d2), spread), db);
                    if blk < full {
                        let l = &mut lane[pr][blk % 8];
                        *l = _mm256_fmadd_ps(v, sc, *l);
                    } else {
                        tail[pr] = _mm256_add_ps(tail[pr], _mm256_mul_ps(v, sc));
                    }
                }
            }
            for pr in 0..RM / 2 {
                let mut o = [0f32; 8];
                _mm256_storeu_ps(o.as_mut_ptr(), lanes_sum(&lane[pr], tail[pr]));
                t.out[2 * pr][..4].copy_from_slice(&[o[0], o[1], o[4], o[5]]);
                t.out[2 * pr + 1][..4].copy_from_slice(&[o[2], o[3], o[6], o[7]]);
            }
        }
    }

    /// [`q8g4_body`] for CPUs with AVX2 (selected without VNNI).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8g4_avx2<const RM: usize>(t: &mut Tile) {
        // SAFETY: selected only when the CPU has these features; KernFn contract.
        unsafe { q8g4_body::<RM>(t) }
    }

    /// `Q4K` rows × `NCV` packed groups of 8 Q8_K columns (lane = column),
    /// super-blocks combined as in [`q4k_fold`]: the exact integer dot and
    /// min correction of each, scaled, into two running sums per column.
    #[inline(always)]
    unsafe fn q4ki_body<D: Dot, const RM: usize, const NCV: usize>(t: &mut Tile) {
        // SAFETY: KernFn contract (decoded Q4_K rows; groups as in packed.rs).
        unsafe {
            let nsb = t.k / 256;
            let mut accf = [[_mm256_setzero_ps(); NCV]; RM];
            let mut accm = [[_mm256_setzero_ps(); NCV]; RM];
            for sb in 0..nsb {
                prefetch_slice(t, sb, nsb);
                let mut acc = [[_mm256_setzero_si256(); NCV]; RM];
                for k in 0..8 {
                    // A sub-block's 8 steps: VNNI sums them in i32
                    // (`vpdpbusd`), then `mullo` by the scale. Without VNNI
                    // the pair sums stay in i16 (each at most 2·15·128, the
                    // 8 steps' sum 30 720 < 2¹⁵: exact) and one `madd` with
                    // the scale pair (the u32 holds it in both halves)
                    // widens and scales them: one multiply per 32 products
                    // instead of two. The same integers either way.
                    let mut ak = [[_mm256_setzero_si256(); NCV]; RM];
                    for s in 0..8 {
                        let step = 64 * sb + 8 * k + s;
                        let mut bv = [_mm256_setzero_si256(); NCV];
                        for (cv, b) in bv.iter_mut().enumerate() {
                            *b = _mm256_loadu_si256(t.b[cv].add(32 * step) as *const __m256i);
                        }
                        for r in 0..RM {
                            let av = _mm256_set1_epi32(std::ptr::read_unaligned(t.a[r].add(4 * step) as *const i32));
                            for cv in 0..NCV {
                                ak[r][cv] = if D::VNNI {
                                    D::ub(ak[r][cv], av, bv[cv])
                                } else {
                                    _mm256_add_epi16(ak[r][cv], _mm256_maddubs_epi16(av, bv[cv]))
                                };
                            }
                        }
                    }
                    for r in 0..RM {
                        let sc = *t.asc[r].add(8 * sb + k);
                        for cv in 0..NCV {
                            acc[r][cv] = if D::VNNI {
                                let s1 = _mm256_set1_epi32((sc & 0xffff) as i32);
                                _mm256_add_epi32(acc[r][cv], _mm256_mullo_epi32(ak[r][cv], s1))
                            } else {
                                D::w(acc[r][cv], ak[r][cv], _mm256_set1_epi32(sc as i32))
                            };
                        }
                    }
                }
                for r in 0..RM {
                    let d = _mm256_broadcast_ss(&*t.ad[r].add(sb));
                    let dm = _mm256_broadcast_ss(&*t.am[r].add(sb));
                    for cv in 0..NCV {
                        let mut m = _mm256_setzero_si256();
                        for pr in 0..4 {
                            let mp = _mm256_set1_epi32(std::ptr::read_unaligned(
                                t.amn[r].add(8 * sb + 2 * pr) as *const i32
                            ));
                            let bp = _mm256_loadu_si256(t.bc[cv].add(32 * sb + 8 * pr) as *const __m256i);
                            m = D::w(m, mp, bp);
                        }
                        let bd = _mm256_loadu_ps(t.bd[cv].add(8 * sb));
                        accf[r][cv] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][cv]), _mm256_mul_ps(d, bd), accf[r][cv]);
                        accm[r][cv] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dm, bd), accm[r][cv]);
                    }
                }
            }
            for r in 0..RM {
                for cv in 0..NCV {
                    _mm256_storeu_ps(t.out[r][8 * cv..].as_mut_ptr(), _mm256_sub_ps(accf[r][cv], accm[r][cv]));
                }
            }
        }
    }

    /// The 128 six-bit quants of one half of a raw Q6_K super-block (`ql`:
    /// its 64 low-nibble bytes, `qh`: its 32 high-bit bytes) as 4 × 32 u8
    /// in element order: vector `j` holds elements `32·j .. 32·j + 32`
    /// (low nibbles of `ql[0..32]`, of `ql[32..64]`, then their high
    /// nibbles; bits `2j, 2j + 1` of `qh` on top).
    #[inline(always)]
    pub(in super::super) unsafe fn q6k_unpack(ql: *const u8, qh: *const u8) -> [__m256i; 4] {
        // SAFETY: 64 bytes at `ql` and 32 at `qh` are readable (caller); AVX2.
        unsafe {
            let m4 = _mm256_set1_epi8(0x0f);
            let m30 = _mm256_set1_epi8(0x30);
            let l0 = _mm256_loadu_si256(ql as *const __m256i);
            let l1 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
            let h = _mm256_loadu_si256(qh as *const __m256i);
            // 16-bit shifts move bits across bytes; the masks keep only each
            // byte's own nibble and its own two high bits (at bits 4, 5).
            [
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(h, 2), m30),
                ),
            ]
        }
    }

    /// `vpshufb` controls for 32-element step `s mod 4` of a super-block
    /// half: the i16 scale `2s` (of the half's 8) broadcast in the low 128
    /// bits, scale `2s + 1` in the high 128 bits.
    #[inline(always)]
    unsafe fn q6k_pair_ctl() -> [__m256i; 4] {
        // SAFETY: AVX (every caller's features).
        unsafe {
            std::array::from_fn(|s| {
                let pick = |i: usize| (((2 * i + 1) << 8) | (2 * i)) as i64 * 0x0001_0001_0001_0001;
                let (a, b) = (pick(2 * s), pick(2 * s + 1));
                _mm256_set_epi64x(b, b, a, a)
            })
        }
    }

    /// A super-block's 16 i8 scales as i16, split by half: `[0]` holds
    /// scales 0..8 in both 128-bit lanes, `[1]` scales 8..16 (for
    /// [`q6k_pair`]), `[2]` all 16 times −32 (multiplied with the column's
    /// 16 sums of 16 they give the offset term of the integer dot).
    #[inline(always)]
    unsafe fn q6k_scales(sc: __m128i) -> [__m256i; 3] {
        // SAFETY: AVX2 (every caller's features).
        unsafe {
            let s16 = _mm256_cvtepi8_epi16(sc);
            [
                _mm256_permute2x128_si256(s16, s16, 0x00),
                _mm256_permute2x128_si256(s16, s16, 0x11),
                _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5)),
            ]
        }
    }

    /// The i16 multipliers of 32-element step `s` of a super-block: the 8
    /// pair sums of its first 16 elements take scale `2s`, the next 8 scale
    /// `2s + 1` (`sc` from [`q6k_scales`], `ctl` from [`q6k_pair_ctl`]).
    #[inline(always)]
    unsafe fn q6k_pair(sc: &[__m256i; 3], ctl: &[__m256i; 4], s: usize) -> __m256i {
        // SAFETY: AVX2 (every caller's features).
        unsafe { _mm256_shuffle_epi8(sc[s / 4], ctl[s % 4]) }
    }

    /// Q6_K's super-block step, the one order of every Q6_K kernel (batch
    /// invariance): the super-block's exact integer dot (the sum of the 8
    /// lanes of `isum`: scales and the −32 offset applied) scaled by `sc =
    /// d·d_col` (lane 0) and added with one FMA to the running sum (lane 0
    /// of `acc`), super-blocks in order.
    #[inline(always)]
    unsafe fn q6k_fold(acc: __m128, isum: __m256i, sc: __m128) -> __m128 {
        // SAFETY: AVX2 + FMA (every caller's features).
        unsafe {
            let x = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
            let x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b01_00_11_10));
            let tot = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0b10_11_00_01));
            _mm_fmadd_ss(_mm_cvtepi32_ps(tot), sc, acc)
        }
    }

    /// `RN` columns (1 to 4) × `RM` raw Q6_K rows: each super-block's quants
    /// unpacked in registers once, dotted with `maddubs` (u8 0..63 × i8: pair
    /// sums fit i16) and scaled per 16 elements with `madd`/`vpdpwssd` for
    /// every column, folded by [`q6k_fold`].
    #[inline(always)]
    unsafe fn gemv_q6k_body<D: Dot, const RM: usize, const RN: usize>(t: &mut Tile) {
        // SAFETY: KernFn contract (raw rows of k/256 super-blocks of 210
        // bytes, Q8_K columns with their sums of 16).
        unsafe {
            let nsb = t.k / 256;
            let pf = super::prefetch_distance();
            let ctl = q6k_pair_ctl();
            let mut acc = [[_mm_setzero_ps(); RN]; RM];
            for sb in 0..nsb {
                for r in 0..RM {
                    let blk = t.a[r].add(210 * sb);
                    if pf > 0 {
                        prefetch_ahead(blk, 210, pf);
                    }
                    let sc = q6k_scales(_mm_loadu_si128(blk.add(192) as *const __m128i));
                    let d =
                        _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk.add(208) as *const u16) as i32));
                    let mut isum = [_mm256_setzero_si256(); RN];
                    for c in 0..RN {
                        let bsum = _mm256_loadu_si256(t.bs[c].add(16 * sb) as *const __m256i);
                        isum[c] = D::w(isum[c], sc[2], bsum);
                    }
                    for h in 0..2 {
                        let q = q6k_unpack(blk.add(64 * h), blk.add(128 + 32 * h));
                        for (j, qj) in q.iter().enumerate() {
                            let sp = q6k_pair(&sc, &ctl, 4 * h + j);
                            for c in 0..RN {
                                let off = 256 * sb + 128 * h + 32 * j;
                                let bv = _mm256_loadu_si256(t.b[c].add(off) as *const __m256i);
                                isum[c] = D::w(isum[c], _mm256_maddubs_epi16(*qj, bv), sp);
                            }
                        }
                    }
                    for c in 0..RN {
                        let scale = _mm_mul_ss(d, _mm_set_ss(*t.bd[c].add(sb)));
                        acc[r][c] = q6k_fold(acc[r][c], isum[c], scale);
                    }
                }
            }
            for r in 0..RM {
                for c in 0..RN {
                    t.out[r][c] = _mm_cvtss_f32(acc[r][c]);
                }
            }
        }
    }

    /// `Q6K` rows × `NCV` packed groups of 8 Q8_K columns (lane = column),
    /// super-blocks combined as in [`q6k_fold`]: each super-block's exact
    /// integer dot per column, scaled, into one running sum per column.
    /// Per 16-element sub-block: VNNI sums 4 `vpdpbusd` steps and scales
    /// them with one multiply; AVX2 scales each step's pair sums in `madd`.
    #[inline(always)]
    unsafe fn q6ki_body<D: Dot, const RM: usize, const NCV: usize>(t: &mut Tile) {
        // SAFETY: KernFn contract (decoded Q6_K rows; groups as in packed.rs).
        unsafe {
            let nsb = t.k / 256;
            let mut accf = [[_mm256_setzero_ps(); NCV]; RM];
            for sb in 0..nsb {
                prefetch_slice(t, sb, nsb);
                let mut acc = [[_mm256_setzero_si256(); NCV]; RM];
                for r in 0..RM {
                    // −32·scale pairs against the columns' pairs of sums of 16.
                    let mut off = [0i32; 8];
                    let o = q6k_scales(_mm_loadu_si128(t.a6[r].add(16 * sb) as *const __m128i));
                    _mm256_storeu_si256(off.as_mut_ptr() as *mut __m256i, o[2]);
                    for (p, &op) in off.iter().enumerate() {
                        let mp = _mm256_set1_epi32(op);
                        for cv in 0..NCV {
                            let bp = _mm256_loadu_si256(t.bc[cv].add(64 * sb + 8 * p) as *const __m256i);
                            acc[r][cv] = D::w(acc[r][cv], mp, bp);
                        }
                    }
                }
                for j in 0..16 {
                    let mut ak = [[_mm256_setzero_si256(); NCV]; RM];
                    // Without VNNI two steps' pair sums are added in i16
                    // (each at most 2·63·128, two 32 256 < 2¹⁵: exact) before
                    // the `madd` with the scale: 3 multiplies per 64 products.
                    let mut p16 = [[_mm256_setzero_si256(); NCV]; RM];
                    for s in 0..4 {
                        let step = 64 * sb + 4 * j + s;
                        let mut bv = [_mm256_setzero_si256(); NCV];
                        for (cv, b) in bv.iter_mut().enumerate() {
                            *b = _mm256_loadu_si256(t.b[cv].add(32 * step) as *const __m256i);
                        }
                        for r in 0..RM {
                            let av = _mm256_set1_epi32(std::ptr::read_unaligned(t.a[r].add(4 * step) as *const i32));
                            let sc = *t.a6[r].add(16 * sb + j) as i16;
                            for cv in 0..NCV {
                                if D::VNNI {
                                    ak[r][cv] = D::ub(ak[r][cv], av, bv[cv]);
                                } else if s % 2 == 0 {
                                    p16[r][cv] = _mm256_maddubs_epi16(av, bv[cv]);
                                } else {
                                    let p = _mm256_add_epi16(p16[r][cv], _mm256_maddubs_epi16(av, bv[cv]));
                                    acc[r][cv] = D::w(acc[r][cv], p, _mm256_set1_epi16(sc));
                                }
                            }
                        }
                    }
                    if D::VNNI {
                        for r in 0..RM {
                            let sc = _mm256_set1_epi32(*t.a6[r].add(16 * sb + j) as i32);
                            for cv in 0..NCV {
                                acc[r][cv] = _mm256_add_epi32(acc[r][cv], _mm256_mullo_epi32(ak[r][cv], sc));
                            }
                        }
                    }
                }
                for r in 0..RM {
                    let d = _mm256_broadcast_ss(&*t.ad[r].add(sb));
                    for cv in 0..NCV {
                        let bd = _mm256_loadu_ps(t.bd[cv].add(8 * sb));
                        accf[r][cv] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][cv]), _mm256_mul_ps(d, bd), accf[r][cv]);
                    }
                }
            }
            for r in 0..RM {
                for cv in 0..NCV {
                    _mm256_storeu_ps(t.out[r][8 * cv..].as_mut_ptr(), accf[r][cv]);
                }
            }
        }
    }

    macro_rules! build {
        ($feat:literal, $f32:ident, $f16:ident, $bf16:ident, $q8:ident, $q8s:ident, $g40:ident, $g80:ident, $g50:ident, $g4k:ident, $g6k:ident, $q8i:ident, $q8si:ident, $q8sr:ident, $q4ki:ident, $q6ki:ident, $dot:ty) => {
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $q6ki<const RM: usize, const NCV: usize>(t: &mut Tile) {
                // SAFETY: selected only when the CPU has these features; KernFn contract.
                unsafe { q6ki_body::<$dot, RM, NCV>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $g6k<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: selected only when the CPU has these features; KernFn contract.
                unsafe { gemv_q6k_body::<$dot, RM, RN>(t) }
            }

            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $q8i<const RM: usize, const NCV: usize>(t: &mut Tile) {
                // SAFETY: selected only when the CPU has these features; KernFn contract.
                unsafe { q8i_body::<$dot, RM, NCV, false, false>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $q8si<const RM: usize, const NCV: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { q8i_body::<$dot, RM, NCV, true, false>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $q8sr<const RM: usize, const NCV: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { q8i_body::<$dot, RM, NCV, true, true>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $q4ki<const RM: usize, const NCV: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { q4ki_body::<$dot, RM, NCV>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $g40<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: selected only when the CPU has these features; KernFn contract.
                unsafe { gemv_q8_body::<$dot, RM, RN, RAW_Q4_0>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $g80<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { gemv_q8_body::<$dot, RM, RN, RAW_Q8_0>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $g50<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { gemv_q8_body::<$dot, RM, RN, RAW_Q5_0>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $g4k<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { gemv_q4k_body::<$dot, RM, RN>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $f32<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: selected only when the CPU has these features; KernFn contract.
                unsafe { dense_body::<RM, RN, 0>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $f16<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { dense_body::<RM, RN, 1>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $bf16<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { dense_body::<RM, RN, 2>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $q8<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { q8_body::<$dot, RM, RN, false>(t) }
            }
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn $q8s<const RM: usize, const RN: usize>(t: &mut Tile) {
                // SAFETY: as above.
                unsafe { q8_body::<$dot, RM, RN, true>(t) }
            }
        };
    }

    /// Q4_K and Q6_K raw rows, numbered beside [`RAW_Q4_0`] .. for
    /// [`run_rows`].
    const RAW_Q4K: u8 = 3;
    const RAW_Q6K: u8 = 4;

    /// The [`RowRunFn`](super::RowRunFn) of raw format `F` with dot `D`
    /// and `RN` columns: each row through the one-row body, inlined into
    /// one loop. (VNNI's dot is `asm!`, so both dots build with these
    /// features.)
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_rows<D: Dot, const F: u8, const RN: usize>(
        t: &mut Tile,
        a0: *const u8,
        stride: usize,
        out: &mut [f32],
    ) {
        let nrow = out.len() / RN;
        for i in 0..nrow {
            t.a[0] = a0.wrapping_add(i * stride);
            // SAFETY: selected only when the CPU has these features;
            // RowRunFn contract (row i and columns 0..RN are valid).
            unsafe {
                match F {
                    // Two K-quant columns one after the other: the row is
                    // read again from L1, and the one-column body keeps its
                    // constants in registers (the two-column body spills).
                    RAW_Q4K | RAW_Q6K if RN == 2 => {
                        let b = t.b;
                        let (bd, bs) = (t.bd, t.bs);
                        for c in 0..2 {
                            (t.b[0], t.bd[0], t.bs[0]) = (b[c], bd[c], bs[c]);
                            if F == RAW_Q4K {
                                gemv_q4k_body::<D, 1, 1>(t)
                            } else {
                                gemv_q6k_body::<D, 1, 1>(t)
                            }
                            out[c * nrow + i] = t.out[0][0];
                        }
                        (t.b[0], t.bd[0], t.bs[0]) = (b[0], bd[0], bs[0]);
                        continue;
                    }
                    RAW_Q4K => gemv_q4k_body::<D, 1, RN>(t),
                    RAW_Q6K => gemv_q6k_body::<D, 1, RN>(t),
                    _ => gemv_q8_body::<D, 1, RN, F>(t),
                }
            }
            for c in 0..RN {
                out[c * nrow + i] = t.out[0][c];
            }
        }
    }

    /// The [`RowRunFn`](super::RowRunFn) of `fmt` with dot `D` and `rn`
    /// columns, if `fmt` reads raw rows and `rn` is 1 to 4.
    pub(super) fn row_run_of<D: Dot>(fmt: super::Fmt, rn: usize) -> Option<super::RowRunFn> {
        use super::Fmt;
        macro_rules! by_cols {
            ($f:expr) => {
                match rn {
                    1 => run_rows::<D, $f, 1>,
                    2 => run_rows::<D, $f, 2>,
                    3 => run_rows::<D, $f, 3>,
                    4 => run_rows::<D, $f, 4>,
                    _ => return None,
                }
            };
        }
        Some(match fmt {
            Fmt::GemvQ4_0 => by_cols!(RAW_Q4_0),
            Fmt::GemvQ5_0 => by_cols!(RAW_Q5_0),
            Fmt::GemvQ8_0 => by_cols!(RAW_Q8_0),
            Fmt::GemvQ4K => by_cols!(RAW_Q4K),
            Fmt::GemvQ6K => by_cols!(RAW_Q6K),
            _ => return None,
        })
    }

    build!(
        "avx2,fma,f16c",
        f32_avx2,
        f16_avx2,
        bf16_avx2,
        q8_avx2,
        q8s_avx2,
        gemv_q4_0_avx2,
        gemv_q8_0_avx2,
        gemv_q5_0_avx2,
        gemv_q4k_avx2,
        gemv_q6k_avx2,
        q8i_avx2,
        q8si_avx2,
        q8sr_avx2,
        q4ki_avx2,
        q6ki_avx2,
        Avx2
    );
    build!(
        "avx2,fma,f16c",
        f32_vnni,
        f16_vnni,
        bf16_vnni,
        q8_vnni,
        q8s_vnni,
        gemv_q4_0_vnni,
        gemv_q8_0_vnni,
        gemv_q5_0_vnni,
        gemv_q4k_vnni,
        gemv_q6k_vnni,
        q8i_vnni,
        q8si_vnni,
        q8sr_vnni,
        q4ki_vnni,
        q6ki_vnni,
        Vnni
    );
}
