//! ggml's type enum: numeric ids, block sizes and type sizes exactly as
//! `ggml.h` / `ggml.c` (`type_traits`) define them, so GGUF files and
//! embedders agree on layouts.

use crate::error::{Error, Result};

/// A ggml tensor element type. The discriminant is ggml's `enum ggml_type` id.
///
/// Block-quantized types store `block_size()` elements in `type_size()` bytes;
/// a row of `ne0` elements takes `ne0 / block_size * type_size` bytes and
/// `ne0` must be a multiple of the block size.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    /// IEEE binary32.
    F32 = 0,
    /// IEEE binary16.
    F16 = 1,
    /// 32 elements: f16 scale `d`, 16 bytes of 4-bit quants (x = d·(q−8)).
    Q4_0 = 2,
    /// 32 elements: f16 `d`, f16 `m`, 16 bytes of 4-bit quants (x = d·q + m).
    Q4_1 = 3,
    /// 32 elements: f16 `d`, 4 bytes high bits, 16 bytes low nibbles (x = d·(q−16)).
    Q5_0 = 6,
    /// 32 elements: f16 `d`, f16 `m`, 4 bytes high bits, 16 bytes low nibbles.
    Q5_1 = 7,
    /// 32 elements: f16 `d`, 32 × i8 (x = d·q).
    Q8_0 = 8,
    /// 32 elements: f16 `d`, f16 `s` (= d·Σq), 32 × i8. Activation format for Q4_1/Q5_1 dots.
    Q8_1 = 9,
    /// 256-element k-quant, 2 bits.
    Q2_K = 10,
    /// 256-element k-quant, 3 bits.
    Q3_K = 11,
    /// 256-element k-quant, 4 bits: f16 `d`, f16 `dmin`, 12 bytes 6-bit scales/mins, 128 bytes quants.
    Q4_K = 12,
    /// 256-element k-quant, 5 bits.
    Q5_K = 13,
    /// 256-element k-quant, 6 bits.
    Q6_K = 14,
    /// 256-element: f32 `d`, 256 × i8, 16 × i16 block sums. Activation format for k-quant dots.
    Q8_K = 15,
    /// Signed 8-bit integer.
    I8 = 24,
    /// Signed 16-bit integer.
    I16 = 25,
    /// Signed 32-bit integer.
    I32 = 26,
    /// Signed 64-bit integer.
    I64 = 27,
    /// IEEE binary64.
    F64 = 28,
    /// bfloat16 (upper half of an f32).
    BF16 = 30,
}

/// All types this crate knows, in id order.
pub const ALL_TYPES: [GgmlType; 20] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::I8,
    GgmlType::I16,
    GgmlType::I32,
    GgmlType::I64,
    GgmlType::F64,
    GgmlType::BF16,
];

/// Elements per super-block of the k-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;

impl GgmlType {
    /// ggml's numeric id (`enum ggml_type`).
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The type with ggml id `id`.
    ///
    /// # Errors
    /// [`Error::UnsupportedType`] for ids ggml removed or this crate does not implement
    /// (IQ*, TQ*, MXFP4, …).
    pub fn from_id(id: u32) -> Result<Self> {
        ALL_TYPES.iter().copied().find(|t| t.id() == id).ok_or_else(|| Error::UnsupportedType {
            ty: format!("id {id}"),
            detail: "not a ggml type this crate implements".into(),
        })
    }

    /// ggml's type name (`ggml_type_name`): "f32", "q4_0", "q4_K", …
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2_K => "q2_K",
            Q3_K => "q3_K",
            Q4_K => "q4_K",
            Q5_K => "q5_K",
            Q6_K => "q6_K",
            Q8_K => "q8_K",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            BF16 => "bf16",
        }
    }

    /// Elements per block (1 for non-quantized types; 32 or 256 otherwise).
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => QK_K,
            _ => 1,
        }
    }

    /// Bytes per block (bytes per element for non-quantized types).
    pub fn type_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            I8 => 1,
            I64 | F64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
        }
    }

    /// True for the block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// True for F32, F16, BF16 and F64.
    pub fn is_float(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::F64)
    }

    /// True for I8/I16/I32/I64.
    pub fn is_int(self) -> bool {
        matches!(self, GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64)
    }

    /// Bytes of a row of `ne0` elements (`ggml_row_size`).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] if `ne0` is negative or not a multiple of the block size.
    pub fn row_size(self, ne0: i64) -> Result<usize> {
        let bs = self.block_size() as i64;
        if ne0 < 0 || ne0 % bs != 0 {
            return Err(Error::InvalidShape {
                ne: vec![ne0],
                detail: format!("row of {ne0} elements is not a whole number of {} blocks of {bs}", self.name()),
            });
        }
        ((ne0 / bs) as usize).checked_mul(self.type_size()).ok_or_else(|| Error::InvalidShape {
            ne: vec![ne0],
            detail: format!("a row of {ne0} {} elements overflows usize bytes", self.name()),
        })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_roundtrip_and_sizes_match_ggml() {
        for t in ALL_TYPES {
            assert_eq!(GgmlType::from_id(t.id()).unwrap(), t);
        }
        assert_eq!(GgmlType::BF16.id(), 30);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q4_K.row_size(4096).unwrap(), 16 * 144);
        assert!(GgmlType::Q4_0.row_size(33).is_err());
        assert!(GgmlType::from_id(4).is_err());
    }
}
