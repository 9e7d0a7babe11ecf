//! ggml's quantized block layouts as `#[repr(C)]` structs.
//!
//! Each struct is byte-for-byte the C struct of the same name in ggml's
//! `ggml-common.h` (`block_q4_0`, …, `block_q8_K`): same field order, same
//! sizes, little-endian scalars. Multi-byte scalars (the f16 scales, Q8_K's
//! f32 scale and i16 block sums) are stored as byte arrays so every block has
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
