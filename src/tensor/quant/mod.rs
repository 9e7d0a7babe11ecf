//! Block quantization in ggml's formats, bit-identical to ggml's reference
//! quantizer (`quantize_row_*_ref` in `ggml-quants.c`), dequantization, and
//! the dot products the matrix kernels use (a weight row of type `T` against
//! an activation row of `T`'s [`vec_dot_type`]).
//!
//! Layout of the module:
//! - [`blocks`]: the `#[repr(C)]` block structs (`block_q4_0` … `block_q2_0`);
//! - `legacy`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (32-element blocks);
//! - `kquants`: Q2_K … Q6_K and Q8_K (256-element super-blocks);
//! - `lowbit`: Q1_0, Q2_0, TQ1_0, TQ2_0; `fp4`: MXFP4, NVFP4;
//! - `iquants`: the IQ formats' decoding and dequantizers, `grids` their
//!   codebooks, `iq_quantize` the IQ4 quantizers and the codebook index,
//!   `iq_search` the codebook-search quantizers (IQ3_XXS, IQ3_S, IQ2_S,
//!   IQ1_M);
//! - `float`: f16/bf16 conversions with ggml's rounding;
//! - `dot`: scalar dot products (the reference);
//! - `simd`: AVX2 dot products chosen at run time (`is_x86_feature_detected!`).
//!
//! How a matrix product uses this (ggml's `mul_mat` on the CPU): quantize
//! each activation row with [`quantize_chunk`]`(vec_dot_type(w), …)`, then
//! for each weight row call the [`vec_dot_fn`] kernel on the packed bytes.

pub mod blocks;
mod dot;
mod dot_iq;
mod float;
mod fp4;
mod grids;
mod iq_quantize;
mod iq_search;
mod iquants;
mod kquants;
mod legacy;
mod lowbit;
mod simd;

#[cfg(test)]
mod tests;

pub use float::{bf16_bits_to_f32, fp16_bits_to_f32, fp32_to_bf16_bits, fp32_to_fp16_bits};

use crate::error::{Error, Result};
use crate::tensor::GgmlType;

/// A row dot product: `n` elements of a packed weight row `x` (type `T`)
/// against `n` elements of a packed activation row `y` (type
/// [`vec_dot_type`]`(T)`), both as raw bytes (little-endian, ggml layout).
///
/// `n` must be a multiple of `T`'s block size and each slice must hold at
/// least its row's bytes (`row_size(n)`); extra bytes are ignored. On a
/// violation the function returns NaN (a `fn` pointer cannot return a
/// `Result`, and must not panic); [`vec_dot`] is the checked form.
pub type VecDotFn = fn(n: usize, x: &[u8], y: &[u8]) -> f32;

/// The activation type that weights of type `ty` are dotted against (ggml
/// 0.25.3's CPU `type_traits_cpu[ty].vec_dot_type`): Q4_0, Q5_0, Q8_0,
/// IQ4_NL, MXFP4, NVFP4, Q1_0, Q2_0 → Q8_0; Q4_1/Q5_1 → Q8_1; the k-quants,
/// the 256-element IQ formats and TQ1_0/TQ2_0 → Q8_K; F16 → F16, BF16 →
/// BF16, F32 → F32. Types without a dot product (Q8_1, Q8_K, integers, F64)
/// map to themselves and have no [`vec_dot_fn`].
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 | NVFP4 | Q1_0 | Q2_0 => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => Q8_K,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | IQ4_XS | TQ1_0 | TQ2_0 => Q8_K,
        other => other,
    }
}

/// The dot-product kernel for weight type `ty`, using the fastest
/// instruction set this CPU supports (AVX2+FMA+F16C where present, detected
/// at run time; scalar otherwise). Resolve it once per matrix product.
/// `None` for types without a dot product (see [`vec_dot_type`]).
pub fn vec_dot_fn(ty: GgmlType) -> Option<VecDotFn> {
    vec_dot_fn_scalar(ty)?;
    simd::best(ty).or_else(|| vec_dot_fn_scalar(ty))
}

/// The portable scalar kernel for `ty` (the reference the SIMD kernels are
/// tested against; useful for benchmarks). `None` as for [`vec_dot_fn`].
pub fn vec_dot_fn_scalar(ty: GgmlType) -> Option<VecDotFn> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => dot::q4_0_row,
        Q4_1 => dot::q4_1_row,
        Q5_0 => dot::q5_0_row,
        Q5_1 => dot::q5_1_row,
        Q8_0 => dot::q8_0_row,
        Q2_K => dot::q2_k_row,
        Q3_K => dot::q3_k_row,
        Q4_K => dot::q4_k_row,
        Q5_K => dot::q5_k_row,
        Q6_K => dot::q6_k_row,
        IQ2_XXS => dot_iq::iq2_xxs_row,
        IQ2_XS => dot_iq::iq2_xs_row,
        IQ2_S => dot_iq::iq2_s_row,
        IQ3_XXS => dot_iq::iq3_xxs_row,
        IQ3_S => dot_iq::iq3_s_row,
        IQ1_S => dot_iq::iq1_s_row,
        IQ1_M => dot_iq::iq1_m_row,
        IQ4_NL => dot_iq::iq4_nl_row,
        IQ4_XS => dot_iq::iq4_xs_row,
        TQ1_0 => dot_iq::tq1_0_row,
        TQ2_0 => dot_iq::tq2_0_row,
        MXFP4 => dot_iq::mxfp4_row,
        NVFP4 => dot_iq::nvfp4_row,
        Q1_0 => dot_iq::q1_0_row,
        Q2_0 => dot_iq::q2_0_row,
        F32 => dot::f32_row,
        F16 => dot::f16_row,
        BF16 => dot::bf16_row,
        _ => return None,
    })
}

/// Name of the instruction set [`vec_dot_fn`] uses on this machine
/// (`"avx2+fma+f16c"` or `"scalar"`), for logs and reports.
pub fn simd_isa() -> &'static str {
    simd::isa_name()
}

/// Checked dot product: `n` elements of weight row `x` (type `ty`, exactly
/// `ty.row_size(n)` bytes) with activation row `y` (type
/// [`vec_dot_type`]`(ty)`, exactly its row size in bytes).
///
/// # Errors
/// [`Error::UnsupportedType`] if `ty` has no dot product;
/// [`Error::DataMismatch`] if `n` is not whole blocks or a length is wrong.
pub fn vec_dot(ty: GgmlType, n: usize, x: &[u8], y: &[u8]) -> Result<f32> {
    let f = vec_dot_fn(ty).ok_or_else(|| Error::unsupported_type(ty, "no dot product for this type"))?;
    let xb = row_bytes(ty, n)?;
    let yb = row_bytes(vec_dot_type(ty), n)?;
    if x.len() != xb || y.len() != yb {
        return Err(mismatch(format!(
            "vec_dot {ty}: {n} elements need {xb} + {yb} bytes, got {} + {}",
            x.len(),
            y.len()
        )));
    }
    Ok(f(n, x, y))
}

fn mismatch(detail: String) -> Error {
    Error::DataMismatch { name: String::new(), detail }
}

/// Bytes of `n` elements of `ty`, or an error if `n` is not whole blocks.
fn row_bytes(ty: GgmlType, n: usize) -> Result<usize> {
    let bs = ty.block_size();
    if n % bs != 0 {
        return Err(mismatch(format!("{n} elements of {ty} are not a whole number of {bs}-element blocks")));
    }
    (n / bs).checked_mul(ty.type_size()).ok_or_else(|| mismatch(format!("{n} elements of {ty}: byte size overflows")))
}

/// Dequantizes one packed run of `ty` into `out`: `out.len()` elements from
/// exactly `row_size(out.len())` bytes of `src` (whole blocks). Accepts every
/// block type of ggml 0.25.3 (the legacy quants, the k-quants, the IQ, TQ,
/// FP4, Q1_0 and Q2_0 formats, and the activation formats Q8_1, Q8_K) and
/// F32/F16/BF16. Bit-identical to ggml's `dequantize_row_*`
/// (`ggml-quants.c`) for every bit pattern; Q8_1, which ggml cannot
/// dequantize, decodes as `d·q`.
///
/// # Errors
/// [`Error::UnsupportedType`] for types without a dequantizer (integers,
/// F64); [`Error::DataMismatch`] if `out.len()` is not whole blocks or
/// `src.len()` does not match it.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<()> {
    use GgmlType::*;
    if !(ty.is_quantized() || matches!(ty, F32 | F16 | BF16)) {
        return Err(Error::unsupported_type(ty, "dequantize_row needs a float or block-quantized type"));
    }
    let want = row_bytes(ty, out.len())?;
    if src.len() != want {
        return Err(mismatch(format!("dequantize {ty}: {} elements need {want} bytes, got {}", out.len(), src.len())));
    }
    let y = out;
    match ty {
        F32 => {
            for (o, b) in y.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        F16 => {
            for (o, b) in y.iter_mut().zip(src.chunks_exact(2)) {
                *o = fp16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        BF16 => {
            for (o, b) in y.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Q4_0 => legacy::dequantize_q4_0(bytemuck::cast_slice(src), y),
        Q4_1 => legacy::dequantize_q4_1(bytemuck::cast_slice(src), y),
        Q5_0 => legacy::dequantize_q5_0(bytemuck::cast_slice(src), y),
        Q5_1 => legacy::dequantize_q5_1(bytemuck::cast_slice(src), y),
        Q8_0 => legacy::dequantize_q8_0(bytemuck::cast_slice(src), y),
        Q8_1 => legacy::dequantize_q8_1(bytemuck::cast_slice(src), y),
        Q2_K => kquants::dequantize_q2_k(bytemuck::cast_slice(src), y),
        Q3_K => kquants::dequantize_q3_k(bytemuck::cast_slice(src), y),
        Q4_K => kquants::dequantize_q4_k(bytemuck::cast_slice(src), y),
        Q5_K => kquants::dequantize_q5_k(bytemuck::cast_slice(src), y),
        Q6_K => kquants::dequantize_q6_k(bytemuck::cast_slice(src), y),
        Q8_K => kquants::dequantize_q8_k(bytemuck::cast_slice(src), y),
        IQ2_XXS => iquants::dequantize_iq2_xxs(bytemuck::cast_slice(src), y),
        IQ2_XS => iquants::dequantize_iq2_xs(bytemuck::cast_slice(src), y),
        IQ2_S => iquants::dequantize_iq2_s(bytemuck::cast_slice(src), y),
        IQ3_XXS => iquants::dequantize_iq3_xxs(bytemuck::cast_slice(src), y),
        IQ3_S => iquants::dequantize_iq3_s(bytemuck::cast_slice(src), y),
        IQ1_S => iquants::dequantize_iq1_s(bytemuck::cast_slice(src), y),
        IQ1_M => iquants::dequantize_iq1_m(bytemuck::cast_slice(src), y),
        IQ4_NL => iquants::dequantize_iq4_nl(bytemuck::cast_slice(src), y),
        IQ4_XS => iquants::dequantize_iq4_xs(bytemuck::cast_slice(src), y),
        TQ1_0 => lowbit::dequantize_tq1_0(bytemuck::cast_slice(src), y),
        TQ2_0 => lowbit::dequantize_tq2_0(bytemuck::cast_slice(src), y),
        Q1_0 => lowbit::dequantize_q1_0(bytemuck::cast_slice(src), y),
        Q2_0 => lowbit::dequantize_q2_0(bytemuck::cast_slice(src), y),
        MXFP4 => fp4::dequantize_mxfp4(bytemuck::cast_slice(src), y),
        NVFP4 => fp4::dequantize_nvfp4(bytemuck::cast_slice(src), y),
        _ => return Err(Error::unsupported_type(ty, "dequantize_row has no decoder for it")),
    }
    Ok(())
}

/// True for the types ggml quantizes only with an importance matrix
/// (`ggml_quantize_requires_imatrix`: IQ2_XXS, IQ2_XS, IQ1_S);
/// [`quantize_chunk`] refuses them.
pub fn quantize_requires_imatrix(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ1_S)
}

/// Work (elements) above which [`quantize_chunk`] spreads rows over the
/// current rayon pool.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 16;

/// Quantizes `nrows` rows of `n_per_row` values from `src` into `dst`,
/// exactly as ggml 0.25.3's `ggml_quantize_chunk(ty, src, dst, 0, nrows,
/// n_per_row, NULL)` (no importance matrix): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_S,
/// IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0, Q2_0; also the activation formats
/// Q8_1 and Q8_K (ggml's `quantize_row_q8_1_ref`, `quantize_row_q8_K_ref`,
/// which `ggml_quantize_chunk` itself does not accept), and F32 (copy), F16
/// (round to nearest even, ggml's NaN) and BF16
/// (`ggml_fp32_to_bf16_row_ref`). Output bytes are little-endian. Any input,
/// NaN and infinities included, gives some bytes (where ggml's codebook
/// searches abort on them, the bytes are this crate's own).
///
/// `src.len()` must be `nrows · n_per_row` elements and `dst.len()` must be
/// `nrows · row_size(n_per_row)` bytes. Large chunks are split by rows over
/// the current rayon pool; the result does not depend on it.
///
/// # Errors
/// [`Error::UnsupportedType`] for types without a quantizer (integers, F64)
/// and for IQ2_XXS, IQ2_XS and IQ1_S, which ggml quantizes only with an
/// importance matrix ([`quantize_requires_imatrix`]); [`Error::DataMismatch`]
/// on wrong lengths or a row not made of whole blocks.
pub fn quantize_chunk(ty: GgmlType, src: &[f32], dst: &mut [u8], nrows: usize, n_per_row: usize) -> Result<()> {
    use GgmlType::*;
    if !(ty.is_quantized() || matches!(ty, F32 | F16 | BF16)) {
        return Err(Error::unsupported_type(ty, "quantize_chunk needs a float or block-quantized type"));
    }
    if quantize_requires_imatrix(ty) {
        return Err(Error::unsupported_type(
            ty,
            "ggml quantizes this type only with an importance matrix, which quantize_chunk does not take",
        ));
    }
    let row = row_bytes(ty, n_per_row)?;
    let n = nrows.checked_mul(n_per_row).ok_or_else(|| mismatch("nrows · n_per_row overflows".into()))?;
    let bytes = nrows.checked_mul(row).ok_or_else(|| mismatch("nrows · row_size overflows".into()))?;
    if src.len() != n || dst.len() != bytes {
        return Err(mismatch(format!(
            "quantize {ty}: {nrows} rows of {n_per_row} need {n} values and {bytes} bytes, got {} and {}",
            src.len(),
            dst.len()
        )));
    }
    if n >= PARALLEL_MIN_ELEMENTS && nrows > 1 && ty.is_quantized() {
        use rayon::prelude::*;
        // Rows are independent; split into a few rows per task.
        let rows_per_task = (PARALLEL_MIN_ELEMENTS / 4 / n_per_row.max(1)).max(1);
        src.par_chunks(rows_per_task * n_per_row)
            .zip(dst.par_chunks_mut(rows_per_task * row))
            .try_for_each(|(s, d)| quantize_run(ty, s, d))
    } else {
        quantize_run(ty, src, dst)
    }
}

/// Converts one row of `src` (whole blocks) to `ty` in `dst`, as ggml
/// 0.25.3's CPU backend does when an op writes a tensor of that type
/// (`cpy`, `set_rows`: `type_traits_cpu[ty].from_float`): as
/// [`quantize_chunk`] for every type except IQ4_NL, which ggml's CPU
/// converts with `quantize_row_iq4_nl_ref` (one scale fitted to the codes
/// at the block maximum, without the ±7 scale search of
/// `ggml_quantize_chunk`; a block of zeros gets codes 8, where ggml keeps
/// stale codes that decode to zero too).
///
/// # Errors
/// As [`quantize_chunk`] with one row of `src.len()` values.
pub fn from_float(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    if ty != GgmlType::IQ4_NL {
        return quantize_chunk(ty, src, dst, 1, src.len());
    }
    let want = row_bytes(ty, src.len())?;
    if dst.len() != want {
        return Err(mismatch(format!("from_float {ty}: {} values need {want} bytes, got {}", src.len(), dst.len())));
    }
    iq_quantize::quantize_iq4_nl_ref(src, bytemuck::cast_slice_mut(dst));
    Ok(())
}

/// Quantizes a run of whole blocks (lengths already checked).
///
/// # Errors
/// [`Error::UnsupportedType`] for a type without a quantizer.
fn quantize_run(ty: GgmlType, x: &[f32], dst: &mut [u8]) -> Result<()> {
    use GgmlType::*;
    match ty {
        F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(x) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        F16 => {
            for (d, &v) in dst.chunks_exact_mut(2).zip(x) {
                d.copy_from_slice(&fp32_to_fp16_bits(v).to_le_bytes());
            }
        }
        BF16 => {
            for (d, &v) in dst.chunks_exact_mut(2).zip(x) {
                d.copy_from_slice(&fp32_to_bf16_bits(v).to_le_bytes());
            }
        }
        Q4_0 => legacy::quantize_q4_0(x, bytemuck::cast_slice_mut(dst)),
        Q4_1 => legacy::quantize_q4_1(x, bytemuck::cast_slice_mut(dst)),
        Q5_0 => legacy::quantize_q5_0(x, bytemuck::cast_slice_mut(dst)),
        Q5_1 => legacy::quantize_q5_1(x, bytemuck::cast_slice_mut(dst)),
        Q8_0 => legacy::quantize_q8_0(x, bytemuck::cast_slice_mut(dst)),
        Q8_1 => legacy::quantize_q8_1(x, bytemuck::cast_slice_mut(dst)),
        Q2_K => kquants::quantize_q2_k(x, bytemuck::cast_slice_mut(dst)),
        Q3_K => kquants::quantize_q3_k(x, bytemuck::cast_slice_mut(dst)),
        Q4_K => kquants::quantize_q4_k(x, bytemuck::cast_slice_mut(dst)),
        Q5_K => kquants::quantize_q5_k(x, bytemuck::cast_slice_mut(dst)),
        Q6_K => kquants::quantize_q6_k(x, bytemuck::cast_slice_mut(dst)),
        Q8_K => kquants::quantize_q8_k(x, bytemuck::cast_slice_mut(dst)),
        IQ4_NL => iq_quantize::quantize_iq4_nl(x, bytemuck::cast_slice_mut(dst)),
        IQ4_XS => iq_quantize::quantize_iq4_xs(x, bytemuck::cast_slice_mut(dst)),
        IQ3_XXS => iq_search::quantize_iq3_xxs(x, bytemuck::cast_slice_mut(dst)),
        IQ3_S => iq_search::quantize_iq3_s(x, bytemuck::cast_slice_mut(dst)),
        IQ2_S => iq_search::quantize_iq2_s(x, bytemuck::cast_slice_mut(dst)),
        IQ1_M => iq_search::quantize_iq1_m(x, bytemuck::cast_slice_mut(dst)),
        TQ1_0 => lowbit::quantize_tq1_0(x, bytemuck::cast_slice_mut(dst)),
        TQ2_0 => lowbit::quantize_tq2_0(x, bytemuck::cast_slice_mut(dst)),
        Q1_0 => lowbit::quantize_q1_0(x, bytemuck::cast_slice_mut(dst)),
        Q2_0 => lowbit::quantize_q2_0(x, bytemuck::cast_slice_mut(dst)),
        MXFP4 => fp4::quantize_mxfp4(x, bytemuck::cast_slice_mut(dst)),
        NVFP4 => fp4::quantize_nvfp4(x, bytemuck::cast_slice_mut(dst)),
        _ => return Err(Error::unsupported_type(ty, "quantize_chunk has no quantizer for it")),
    }
    Ok(())
}
