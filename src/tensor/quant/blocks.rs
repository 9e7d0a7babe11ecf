//! ggml's quantized block layouts as `#[repr(C)]` structs.
//!
//! Each struct is byte-for-byte the C struct of the same name in ggml's
//! `ggml-common.h` (`block_q4_0`, …, `block_q8_K`, `block_iq2_xxs`, …,
//! `block_q2_0`; ggml 0.25.3): same field order, same sizes, little-endian
//! scalars. Multi-byte scalars (the f16 scales, Q8_K's f32 scale and i16
//! block sums, the u16/u32 words of the IQ formats) are stored as byte
//! arrays so every block has
//! alignment 1: a `&[u8]` taken at any offset of a tensor buffer casts to a
//! block slice with [`bytemuck::cast_slice`] without an alignment check
//! failing. Accessors decode the scalars.
//!
//! Sizes are checked at compile time against ggml's `static_assert`s.

use super::float::{fp16_bits_to_f32, fp32_to_fp16_bits};
use bytemuck::{Pod, Zeroable};

/// Elements per block of Q4_0 (`QK4_0`).
pub const QK4_0: usize = 32;
/// Elements per block of Q4_1 (`QK4_1`).
pub const QK4_1: usize = 32;
/// Elements per block of Q5_0 (`QK5_0`).
pub const QK5_0: usize = 32;
/// Elements per block of Q5_1 (`QK5_1`).
pub const QK5_1: usize = 32;
/// Elements per block of Q8_0 (`QK8_0`).
pub const QK8_0: usize = 32;
/// Elements per block of Q8_1 (`QK8_1`).
pub const QK8_1: usize = 32;
pub use crate::tensor::QK_K;
/// Bytes of packed 6-bit scales and mins in Q4_K/Q5_K (`K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;
/// Elements per block of IQ4_NL (`QK4_NL`).
pub const QK4_NL: usize = 32;
/// Elements per block of MXFP4 (`QK_MXFP4`).
pub const QK_MXFP4: usize = 32;
/// Elements per block of NVFP4 (`QK_NVFP4`).
pub const QK_NVFP4: usize = 64;
/// Elements per NVFP4 sub-block, each with its own UE4M3 scale (`QK_NVFP4_SUB`).
pub const QK_NVFP4_SUB: usize = 16;
/// Elements per block of Q1_0 (`QK1_0`).
pub const QK1_0: usize = 128;
/// Elements per block of Q2_0 (`QK2_0`).
pub const QK2_0: usize = 64;

/// Reads a little-endian f16 stored as two bytes, as f32.
#[inline(always)]
pub(crate) fn f16_le(b: [u8; 2]) -> f32 {
    fp16_bits_to_f32(u16::from_le_bytes(b))
}

/// Encodes an f32 as ggml's f16 (`GGML_FP32_TO_FP16`) in two little-endian bytes.
#[inline(always)]
pub(crate) fn f16_bytes(v: f32) -> [u8; 2] {
    fp32_to_fp16_bits(v).to_le_bytes()
}

/// `block_q4_0`: 32 weights `x = d·(q − 8)`, 18 bytes. `qs[j]` holds element
/// `j` in its low nibble and element `j + 16` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale `d` (f16, little-endian).
    pub d: [u8; 2],
    /// 4-bit quants, two per byte.
    pub qs: [u8; QK4_0 / 2],
}

/// `block_q4_1`: 32 weights `x = d·q + m`, 20 bytes; nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale `d` (f16).
    pub d: [u8; 2],
    /// Minimum `m` (f16).
    pub m: [u8; 2],
    /// 4-bit quants, two per byte.
    pub qs: [u8; QK4_1 / 2],
}

/// `block_q5_0`: 32 weights `x = d·(q − 16)`, 22 bytes. The low 4 bits are
/// packed as in Q4_0; bit `j` of the little-endian u32 `qh` is bit 4 of element `j`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale `d` (f16).
    pub d: [u8; 2],
    /// Fifth bits of the 32 quants (u32, little-endian).
    pub qh: [u8; 4],
    /// Low 4 bits, two per byte.
    pub qs: [u8; QK5_0 / 2],
}

/// `block_q5_1`: 32 weights `x = d·q + m`, 24 bytes; bits as Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale `d` (f16).
    pub d: [u8; 2],
    /// Minimum `m` (f16).
    pub m: [u8; 2],
    /// Fifth bits of the 32 quants (u32, little-endian).
    pub qh: [u8; 4],
    /// Low 4 bits, two per byte.
    pub qs: [u8; QK5_1 / 2],
}

/// `block_q8_0`: 32 values `x = d·q`, 34 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale `d` (f16).
    pub d: [u8; 2],
    /// Signed 8-bit quants.
    pub qs: [i8; QK8_0],
}

/// `block_q8_1`: 32 values `x = d·q` plus `s = d·Σq`, 36 bytes. The
/// activation format that Q4_1/Q5_1 weights dot against.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale `d` (f16).
    pub d: [u8; 2],
    /// `d · Σ qs` (f16).
    pub s: [u8; 2],
    /// Signed 8-bit quants.
    pub qs: [i8; QK8_1],
}

/// `block_q2_K`: 256 weights in 16 groups of 16, 84 bytes.
/// `x = d·(scales[g] & 15)·q − dmin·(scales[g] >> 4)`, `q` in 0..=3.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Per-group 4-bit scale (low nibble) and 4-bit min (high nibble).
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the scales (f16).
    pub d: [u8; 2],
    /// Super-block scale for the mins (f16).
    pub dmin: [u8; 2],
}

/// `block_q3_K`: 256 weights in 16 groups of 16, 110 bytes.
/// `x = d·(s_g − 32)·(q − 4·!hbit)`, 6-bit signed group scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bit of each quant (set means "no −4").
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants, four per byte.
    pub qs: [u8; QK_K / 4],
    /// 16 six-bit scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale (f16).
    pub d: [u8; 2],
}

/// `block_q4_K`: 256 weights in 8 groups of 32, 144 bytes.
/// `x = d·sc_g·q − dmin·m_g` with 6-bit `sc_g`, `m_g` packed in `scales`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale for the scales (f16).
    pub d: [u8; 2],
    /// Super-block scale for the mins (f16).
    pub dmin: [u8; 2],
    /// 8 six-bit scales and 8 six-bit mins, packed (see `get_scale_min_k4`).
    pub scales: [u8; K_SCALE_SIZE],
    /// 4-bit quants: byte `32·c + l` holds element `64·c + l` (low nibble)
    /// and `64·c + 32 + l` (high nibble).
    pub qs: [u8; QK_K / 2],
}

/// `block_q5_K`: as Q4_K plus a fifth bit per weight, 176 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale for the scales (f16).
    pub d: [u8; 2],
    /// Super-block scale for the mins (f16).
    pub dmin: [u8; 2],
    /// 8 six-bit scales and 8 six-bit mins, packed as Q4_K.
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits: bit `2c` of `qh[l]` belongs to element `64c + l`,
    /// bit `2c + 1` to element `64c + 32 + l`.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits, packed as Q4_K.
    pub qs: [u8; QK_K / 2],
}

/// `block_q6_K`: 256 weights in 16 groups of 16, 210 bytes.
/// `x = d·scales[g]·(q − 32)`, `q` 6-bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Signed 8-bit group scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale (f16).
    pub d: [u8; 2],
}

/// `block_q8_K`: 256 values `x = d·q` with f32 `d` and the sums of each 16
/// quants, 292 bytes. The activation format that k-quant weights dot against.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale (f32, little-endian).
    pub d: [u8; 4],
    /// Signed 8-bit quants.
    pub qs: [i8; QK_K],
    /// Σ of each 16 consecutive quants (i16, little-endian).
    pub bsums: [[u8; 2]; QK_K / 16],
}

/// `block_iq2_xxs`: 256 weights, 66 bytes. Each group of 32 is two
/// little-endian u32: the first holds four 8-bit indices into `iq2xxs_grid`
/// (8 magnitudes each), the second four 7-bit sign patterns (bits 0..28) and
/// a 4-bit scale (bits 28..32): `x = d·(0.5 + s)/4 · grid · sign`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2XXS {
    /// Super-block scale (f16).
    pub d: [u8; 2],
    /// 32 little-endian u16 (read as 16 u32: index word, sign/scale word).
    pub qs: [u8; QK_K / 4],
}

/// `block_iq2_xs`: 256 weights, 74 bytes. Each u16 of `qs` is a 9-bit
/// `iq2xs_grid` index and a 7-bit sign pattern for 8 weights; each byte of
/// `scales` holds the 4-bit scales of two groups of 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2XS {
    /// Super-block scale (f16).
    pub d: [u8; 2],
    /// 32 little-endian u16: index (bits 0..9) and signs (bits 9..16).
    pub qs: [u8; QK_K / 4],
    /// 4-bit scales, two per byte (low nibble first).
    pub scales: [u8; QK_K / 32],
}

/// `block_iq2_s`: 256 weights, 82 bytes. 10-bit `iq2s_grid` indices (low 8
/// bits in `qs[0..32]`, top 2 bits in `qh`), 8 explicit sign bits per 8
/// weights (`qs[32..64]`), 4-bit scales per 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ2S {
    /// Super-block scale (f16).
    pub d: [u8; 2],
    /// 32 low index bytes, then 32 sign bytes.
    pub qs: [u8; QK_K / 4],
    /// Index bits 8..10, four indices per byte.
    pub qh: [u8; QK_K / 32],
    /// 4-bit scales, two per byte.
    pub scales: [u8; QK_K / 32],
}

/// `block_iq3_xxs`: 256 weights, 98 bytes. 64 indices into `iq3xxs_grid`
/// (4 magnitudes each), then per group of 32 a little-endian u32 with four
/// 7-bit sign patterns and a 4-bit scale: `x = d·(0.5 + s)/2 · grid · sign`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ3XXS {
    /// Super-block scale (f16).
    pub d: [u8; 2],
    /// 64 grid indices, then 8 little-endian u32 of signs and scales.
    pub qs: [u8; 3 * QK_K / 8],
}

/// `block_iq3_s`: 256 weights, 110 bytes. 9-bit `iq3s_grid` indices (low 8
/// bits in `qs`, bit 8 in `qh`), one sign bit per weight, 4-bit scales per
/// group of 32: `x = d·(1 + 2s) · grid · sign`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ3S {
    /// Super-block scale (f16).
    pub d: [u8; 2],
    /// Low 8 bits of the 64 grid indices.
    pub qs: [u8; QK_K / 4],
    /// Bit 8 of the grid indices, eight per byte.
    pub qh: [u8; QK_K / 32],
    /// One sign bit per weight.
    pub signs: [u8; QK_K / 8],
    /// 4-bit scales, two per byte.
    pub scales: [u8; QK_K / 64],
}

/// `block_iq1_s`: 256 weights, 50 bytes. 11-bit `iq1s_grid` indices (8
/// ternary values each; low 8 bits in `qs`, 3 bits per index in `qh`), and
/// per group of 32 a 3-bit scale and a sign for the ±1/8 shift (`qh` bits
/// 12..15 and 15): `x = d·(2s + 1)·(grid ± 1/8)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ1S {
    /// Super-block scale (f16).
    pub d: [u8; 2],
    /// Low 8 bits of the 32 grid indices.
    pub qs: [u8; QK_K / 8],
    /// 8 little-endian u16: index bits, scale, shift sign.
    pub qh: [u8; QK_K / 16],
}

/// `block_iq1_m`: 256 weights, 56 bytes. 11-bit `iq1s_grid` indices (low 8
/// bits in `qs`, 3 bits + a shift-sign bit per index in `qh` nibbles), 3-bit
/// scales per 16 weights, and the f16 super-block scale split over the top
/// nibbles of the four little-endian u16 of `scales`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ1M {
    /// Low 8 bits of the 32 grid indices.
    pub qs: [u8; QK_K / 8],
    /// Per index a nibble: 3 high index bits and the shift sign (bit 3).
    pub qh: [u8; QK_K / 16],
    /// 4 little-endian u16: four 3-bit scales each (bits 0..12) and a nibble
    /// of the super-block scale (bits 12..16).
    pub scales: [u8; QK_K / 32],
}

/// `block_iq4_nl`: 32 weights, 18 bytes: `x = d·kvalues_iq4nl[q]`; nibble
/// order as Q4_0 (element `j` low, `j + 16` high).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ4NL {
    /// Scale (f16).
    pub d: [u8; 2],
    /// 4-bit indices into `kvalues_iq4nl`, two per byte.
    pub qs: [u8; QK4_NL / 2],
}

/// `block_iq4_xs`: 256 weights in 8 groups of 32, 136 bytes:
/// `x = d·(ls − 32)·kvalues_iq4nl[q]` with a 6-bit `ls` per group.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIQ4XS {
    /// Super-block scale (f16).
    pub d: [u8; 2],
    /// High 2 bits of the 8 group scales (u16, little-endian).
    pub scales_h: [u8; 2],
    /// Low 4 bits of the 8 group scales, two per byte.
    pub scales_l: [u8; QK_K / 64],
    /// 4-bit indices: byte `16·g + j` holds elements `32·g + j` (low) and `32·g + 16 + j` (high).
    pub qs: [u8; QK_K / 2],
}

/// `block_tq1_0`: 256 ternary weights `x = d·(t − 1)`, 54 bytes. Bytes hold
/// 5 (`qs`) or 4 (`qh`) trits as a fixed-point fraction of 3⁵ (`q·3ᵏ`'s
/// top trit is trit `k`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockTQ1_0 {
    /// 240 trits, five per byte.
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    /// 16 trits, four per byte.
    pub qh: [u8; QK_K / 64],
    /// Scale (f16).
    pub d: [u8; 2],
}

/// `block_tq2_0`: 256 ternary weights `x = d·(q − 1)`, 2 bits each, 66 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockTQ2_0 {
    /// Byte `32·c + m` holds elements `128·c + 32·l + m` at bits `2l`.
    pub qs: [u8; QK_K / 4],
    /// Scale (f16).
    pub d: [u8; 2],
}

/// `block_mxfp4`: 32 weights, 17 bytes: `x = 2^(e − 128) · kvalues_fp4[q]`
/// (E2M1 values doubled, E8M0 exponent halved); nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockMXFP4 {
    /// Shared exponent (E8M0).
    pub e: u8,
    /// 4-bit E2M1 codes, two per byte.
    pub qs: [u8; QK_MXFP4 / 2],
}

/// `block_nvfp4`: 64 weights in 4 sub-blocks of 16, 36 bytes: `x = s_k/2 ·
/// kvalues_fp4[q]` with a UE4M3 scale `s_k` per sub-block; within a
/// sub-block, nibble order as Q4_0 (element `j` low, `j + 8` high).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockNVFP4 {
    /// One UE4M3 scale per 16 elements.
    pub d: [u8; QK_NVFP4 / QK_NVFP4_SUB],
    /// 4-bit E2M1 codes, 8 bytes per sub-block.
    pub qs: [u8; QK_NVFP4 / 2],
}

/// `block_q1_0`: 128 weights `x = ±d`, 18 bytes; bit `j % 8` of byte `j / 8`
/// set means `+d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ1_0 {
    /// Scale (f16).
    pub d: [u8; 2],
    /// Sign bits.
    pub qs: [u8; QK1_0 / 8],
}

/// `block_q2_0`: 64 weights `x = d·(q − 1)`, `q` in 0..=3 at bits
/// `2·(j % 4)` of byte `j / 4`, 18 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ2_0 {
    /// Scale (f16).
    pub d: [u8; 2],
    /// 2-bit quants, four per byte.
    pub qs: [u8; QK2_0 / 4],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18 && std::mem::align_of::<BlockQ4_0>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20 && std::mem::align_of::<BlockQ4_1>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22 && std::mem::align_of::<BlockQ5_0>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24 && std::mem::align_of::<BlockQ5_1>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34 && std::mem::align_of::<BlockQ8_0>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36 && std::mem::align_of::<BlockQ8_1>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84 && std::mem::align_of::<BlockQ2K>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110 && std::mem::align_of::<BlockQ3K>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144 && std::mem::align_of::<BlockQ4K>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176 && std::mem::align_of::<BlockQ5K>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210 && std::mem::align_of::<BlockQ6K>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292 && std::mem::align_of::<BlockQ8K>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ2XXS>() == 66 && std::mem::align_of::<BlockIQ2XXS>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ2XS>() == 74 && std::mem::align_of::<BlockIQ2XS>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ2S>() == 82 && std::mem::align_of::<BlockIQ2S>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ3XXS>() == 98 && std::mem::align_of::<BlockIQ3XXS>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ3S>() == 110 && std::mem::align_of::<BlockIQ3S>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ1S>() == 50 && std::mem::align_of::<BlockIQ1S>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ1M>() == 56 && std::mem::align_of::<BlockIQ1M>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18 && std::mem::align_of::<BlockIQ4NL>() == 1);
const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136 && std::mem::align_of::<BlockIQ4XS>() == 1);
const _: () = assert!(std::mem::size_of::<BlockTQ1_0>() == 54 && std::mem::align_of::<BlockTQ1_0>() == 1);
const _: () = assert!(std::mem::size_of::<BlockTQ2_0>() == 66 && std::mem::align_of::<BlockTQ2_0>() == 1);
const _: () = assert!(std::mem::size_of::<BlockMXFP4>() == 17 && std::mem::align_of::<BlockMXFP4>() == 1);
const _: () = assert!(std::mem::size_of::<BlockNVFP4>() == 36 && std::mem::align_of::<BlockNVFP4>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ1_0>() == 18 && std::mem::align_of::<BlockQ1_0>() == 1);
const _: () = assert!(std::mem::size_of::<BlockQ2_0>() == 18 && std::mem::align_of::<BlockQ2_0>() == 1);

/// A ggml block format (implemented by every block struct here).
pub trait Block: Pod {
    /// Elements per block.
    const QK: usize;
}

macro_rules! impl_block {
    ($($t:ty => $qk:expr),* $(,)?) => { $(impl Block for $t { const QK: usize = $qk; })* };
}
impl_block!(
    BlockQ4_0 => QK4_0, BlockQ4_1 => QK4_1, BlockQ5_0 => QK5_0, BlockQ5_1 => QK5_1,
    BlockQ8_0 => QK8_0, BlockQ8_1 => QK8_1, BlockQ2K => QK_K, BlockQ3K => QK_K,
    BlockQ4K => QK_K, BlockQ5K => QK_K, BlockQ6K => QK_K, BlockQ8K => QK_K,
    BlockIQ2XXS => QK_K, BlockIQ2XS => QK_K, BlockIQ2S => QK_K, BlockIQ3XXS => QK_K,
    BlockIQ3S => QK_K, BlockIQ1S => QK_K, BlockIQ1M => QK_K, BlockIQ4NL => QK4_NL,
    BlockIQ4XS => QK_K, BlockTQ1_0 => QK_K, BlockTQ2_0 => QK_K, BlockMXFP4 => QK_MXFP4,
    BlockNVFP4 => QK_NVFP4, BlockQ1_0 => QK1_0, BlockQ2_0 => QK2_0,
);

impl BlockQ8K {
    /// The f32 scale.
    #[inline(always)]
    pub fn scale(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }
    /// Sum of quants `16·j .. 16·j + 16`.
    #[inline(always)]
    pub fn bsum(&self, j: usize) -> i16 {
        i16::from_le_bytes(self.bsums[j])
    }
}

/// Scale and min of group `j` (0..8) of a Q4_K/Q5_K block's packed 6-bit
/// `scales` (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 16 signed 6-bit group scales of a Q3_K block, already minus 32.
///
/// Scale `j` has its low 4 bits in `s[j % 8]` (low nibble for `j < 8`, high
/// nibble otherwise) and its high 2 bits in `s[8 + j % 4]` at bit `2·(j / 4)`.
/// Unpacked four at a time in u32 words (branch-free).
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a0, a1, hi) = (word(0), word(4), word(8));
    const LO4: u32 = 0x0f0f_0f0f;
    const HI2: u32 = 0x0303_0303;
    let w = [
        (a0 & LO4) | ((hi & HI2) << 4),
        (a1 & LO4) | (((hi >> 2) & HI2) << 4),
        ((a0 >> 4) & LO4) | (((hi >> 4) & HI2) << 4),
        ((a1 >> 4) & LO4) | (((hi >> 6) & HI2) << 4),
    ];
    let mut out = [0i8; 16];
    for (k, wk) in w.iter().enumerate() {
        for (b, byte) in wk.to_le_bytes().iter().enumerate() {
            out[4 * k + b] = *byte as i8 - 32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quant_q3k_scale_unpack_matches_bit_layout() {
        let mut st = 0x1234_5678_9abc_def1u64;
        for _ in 0..200 {
            let mut s = [0u8; 12];
            for b in s.iter_mut() {
                st ^= st << 13;
                st ^= st >> 7;
                st ^= st << 17;
                *b = st as u8;
            }
            let got = q3k_scales(&s);
            for (j, &g) in got.iter().enumerate() {
                let lo = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
                let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                assert_eq!(g, (lo | (hi << 4)) as i8 - 32, "scale {j} of {s:?}");
            }
        }
    }
}
