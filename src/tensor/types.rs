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
    /// 256 elements, 66 bytes: f16 `d`, 32 × u16 of grid indices (8 × 8-element points of
    /// `iq2xxs_grid`), 7-bit sign patterns and 4-bit group scales. Quantized only with an
    /// importance matrix.
    IQ2_XXS = 16,
    /// 256 elements, 74 bytes: f16 `d`, 32 × u16 (9-bit `iq2xs_grid` index + 7 sign bits),
    /// 8 bytes of 4-bit scales. Quantized only with an importance matrix.
    IQ2_XS = 17,
    /// 256 elements, 98 bytes: f16 `d`, 64 bytes of `iq3xxs_grid` indices (4-element
    /// points), 8 × u32 of signs and 4-bit group scales.
    IQ3_XXS = 18,
    /// 256 elements, 50 bytes: f16 `d`, 32 bytes + 8 × u16 of 11-bit `iq1s_grid` indices,
    /// 3-bit group scales and a ±1/8 shift. Quantized only with an importance matrix.
    IQ1_S = 19,
    /// 32 elements, 18 bytes: f16 `d`, 16 bytes of 4-bit indices into the non-linear
    /// `kvalues_iq4nl` table (`x = d·kvalues[q]`).
    IQ4_NL = 20,
    /// 256 elements, 110 bytes: f16 `d`, 9-bit `iq3s_grid` indices (64 + 8 bytes), 32 bytes of
    /// signs, 4 bytes of 4-bit scales.
    IQ3_S = 21,
    /// 256 elements, 82 bytes: f16 `d`, 10-bit `iq2s_grid` indices (32 + 8 bytes), 32 bytes of
    /// signs, 8 bytes of 4-bit scales.
    IQ2_S = 22,
    /// 256 elements, 136 bytes: f16 `d`, 6-bit scales of the 8 groups of 32 (u16 high bits +
    /// 4 bytes low nibbles), 128 bytes of 4-bit `kvalues_iq4nl` indices.
    IQ4_XS = 23,
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
    /// 256 elements, 56 bytes: 11-bit `iq1s_grid` indices with per-8 shifts, 3-bit group
    /// scales, and the f16 super-block scale spread over the scales' top nibbles.
    IQ1_M = 29,
    /// bfloat16 (upper half of an f32).
    BF16 = 30,
    /// 256 elements, 54 bytes: ternary (−1, 0, 1)·d, five trits per byte (base 3) in 48
    /// bytes and four per byte in 4 more, then f16 `d`.
    TQ1_0 = 34,
    /// 256 elements, 66 bytes: ternary (−1, 0, 1)·d in 2 bits each (64 bytes), then f16 `d`.
    TQ2_0 = 35,
    /// 32 elements, 17 bytes: an E8M0 shared exponent and 16 bytes of 4-bit E2M1 values
    /// (OCP microscaling MXFP4).
    MXFP4 = 39,
    /// 64 elements, 36 bytes: four UE4M3 scales (one per 16 elements) and 32 bytes of 4-bit
    /// E2M1 values (NVIDIA NVFP4).
    NVFP4 = 40,
    /// 128 elements, 18 bytes: f16 `d` and one sign bit per element (x = ±d).
    Q1_0 = 41,
    /// 64 elements, 18 bytes: f16 `d` and 2 bits per element (x = d·(q − 1), q in 0..=3).
    Q2_0 = 42,
}

/// All types this crate knows, in id order: every type of ggml 0.25.3's
/// `enum ggml_type` except the removed ids 4, 5, 31..=33 and 36..=38.
pub const ALL_TYPES: [GgmlType; 35] = [
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
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ3_S,
    GgmlType::IQ2_S,
    GgmlType::IQ4_XS,
    GgmlType::I8,
    GgmlType::I16,
    GgmlType::I32,
    GgmlType::I64,
    GgmlType::F64,
    GgmlType::IQ1_M,
    GgmlType::BF16,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
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
    /// [`Error::UnsupportedType`] for ids ggml removed (4, 5, 31..=33, 36..=38) and
    /// ids past ggml 0.25.3's last type (42).
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
            IQ2_XXS => "iq2_xxs",
            IQ2_XS => "iq2_xs",
            IQ3_XXS => "iq3_xxs",
            IQ1_S => "iq1_s",
            IQ4_NL => "iq4_nl",
            IQ3_S => "iq3_s",
            IQ2_S => "iq2_s",
            IQ4_XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            IQ1_M => "iq1_m",
            BF16 => "bf16",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
            MXFP4 => "mxfp4",
            NVFP4 => "nvfp4",
            Q1_0 => "q1_0",
            Q2_0 => "q2_0",
        }
    }

    /// Elements per block (1 for non-quantized types; 32, 64, 128 or 256 otherwise).
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            NVFP4 | Q2_0 => 64,
            Q1_0 => 128,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => QK_K,
            IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => QK_K,
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
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
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ3_XXS => 98,
            IQ1_S => 50,
            IQ4_NL => 18,
            IQ3_S => 110,
            IQ2_S => 82,
            IQ4_XS => 136,
            IQ1_M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
            NVFP4 => 36,
            Q1_0 => 18,
            Q2_0 => 18,
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
        for removed in [5, 31, 32, 33, 36, 37, 38, 43, 1000] {
            assert!(GgmlType::from_id(removed).is_err(), "id {removed}");
        }
    }

    /// Ids, names, block sizes and type sizes of the types ggml 0.15.3 lacked,
    /// as ggml 0.25.3's `ggml_get_type_traits` reports them (`tests/quant_bytes.rs`
    /// compares every type with the built library at run time).
    #[test]
    fn ggml_0_25_3_type_traits() {
        use GgmlType::*;
        let want: [(GgmlType, u32, &str, usize, usize); 15] = [
            (IQ2_XXS, 16, "iq2_xxs", 256, 66),
            (IQ2_XS, 17, "iq2_xs", 256, 74),
            (IQ3_XXS, 18, "iq3_xxs", 256, 98),
            (IQ1_S, 19, "iq1_s", 256, 50),
            (IQ4_NL, 20, "iq4_nl", 32, 18),
            (IQ3_S, 21, "iq3_s", 256, 110),
            (IQ2_S, 22, "iq2_s", 256, 82),
            (IQ4_XS, 23, "iq4_xs", 256, 136),
            (IQ1_M, 29, "iq1_m", 256, 56),
            (TQ1_0, 34, "tq1_0", 256, 54),
            (TQ2_0, 35, "tq2_0", 256, 66),
            (MXFP4, 39, "mxfp4", 32, 17),
            (NVFP4, 40, "nvfp4", 64, 36),
            (Q1_0, 41, "q1_0", 128, 18),
            (Q2_0, 42, "q2_0", 64, 18),
        ];
        for (t, id, name, bs, ts) in want {
            assert_eq!((t.id(), t.name(), t.block_size(), t.type_size()), (id, name, bs, ts));
            assert_eq!(GgmlType::from_id(id).unwrap(), t);
            assert!(t.is_quantized());
        }
        let mut ids: Vec<u32> = ALL_TYPES.iter().map(|t| t.id()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ALL_TYPES is in id order");
        ids.dedup();
        assert_eq!(ids.len(), ALL_TYPES.len());
    }
}
