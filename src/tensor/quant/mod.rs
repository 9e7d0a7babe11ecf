//! Block quantization in ggml's formats, bit-identical to ggml's reference
//! quantizer (`quantize_row_*_ref` in `ggml-quants.c`), dequantization, and
//! the dot products the matrix kernels use (a weight row of type `T` against
//! an activation row of `T`'s `vec_dot_type`).

use crate::error::{Error, Result};
use crate::tensor::GgmlType;

/// Dequantizes one packed run of `ty` (whole blocks) into `out`
/// (`out.len()` = elements). Also accepts F32/F16/BF16.
///
/// # Errors
/// [`Error::UnsupportedType`] for types without a dequantizer;
/// [`Error::DataMismatch`] if the byte length does not match `out.len()`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<()> {
    let _ = (src, out);
    Err(Error::unsupported_type(ty, "dequantize not yet implemented"))
}

/// Quantizes `nrows` rows of `n_per_row` values from `src` into `dst` with
/// ggml's reference quantizer (`ggml_quantize_chunk` without an importance
/// matrix). `dst.len()` must be `nrows · row_size(n_per_row)`.
///
/// # Errors
/// [`Error::UnsupportedType`] for types without a quantizer;
/// [`Error::DataMismatch`] on wrong lengths or a row not made of whole blocks.
pub fn quantize_chunk(ty: GgmlType, src: &[f32], dst: &mut [u8], nrows: usize, n_per_row: usize) -> Result<()> {
    let _ = (src, dst, nrows, n_per_row);
    Err(Error::unsupported_type(ty, "quantize not yet implemented"))
}
