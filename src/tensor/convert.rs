//! Host conversion between f32 values and a tensor's bytes, the one place
//! it is done: writes ([`crate::TensorStorage::set_f32`],
//! [`crate::split::SplitStore::set_f32`]) encode rows of f32 into any float
//! or block-quantized type ([`encode_rows`]); reads (their `get_f32`, a
//! split run's outputs) decode packed runs ([`decode_run`]) and walk a
//! tensor's strides to its logical elements ([`read_elements`],
//! [`read_contiguous`]).
//!
//! The conversions are ggml's: F16/BF16 and the block types through
//! [`quant::quantize_chunk`] (`ggml_quantize_chunk`: F16/BF16 rounding, a
//! NaN as the canonical quiet NaN, the reference quantizers) and
//! [`quant::dequantize_row`] (`dequantize_row_*`); F64 is widened and
//! narrowed. Every byte range is checked before it is read: a range
//! outside the given bytes is [`Error::OutOfBounds`], never a panic.

use super::{contiguous_strides, quant, GgmlType, Tensor};
use crate::error::{Error, Result};

/// `values` as bytes of `ty` in rows of `ne0` elements (whole blocks per
/// row for block types): F32, F16, BF16 and the block-quantized types
/// through ggml's reference conversion ([`quant::quantize_chunk`]), F64
/// widened.
///
/// # Errors
/// [`Error::UnsupportedType`] for integer types; [`Error::DataMismatch`] if
/// `values` is not whole rows of `ne0`, or a row is not whole blocks.
pub(crate) fn encode_rows(ty: GgmlType, values: &[f32], ne0: usize) -> Result<Vec<u8>> {
    if ty == GgmlType::F64 {
        return Ok(values.iter().flat_map(|&x| f64::from(x).to_le_bytes()).collect());
    }
    if !(ty.is_float() || ty.is_quantized()) {
        return Err(Error::unsupported_type(ty, "no conversion from f32"));
    }
    if values.is_empty() {
        return Ok(Vec::new());
    }
    if ne0 == 0 || values.len() % ne0 != 0 {
        return Err(Error::DataMismatch {
            name: String::new(),
            detail: format!("{} values are not whole rows of {ne0}", values.len()),
        });
    }
    let nrows = values.len() / ne0;
    let mut out = vec![0u8; ty.row_size(ne0 as i64)? * nrows];
    quant::quantize_chunk(ty, values, &mut out, nrows, ne0)?;
    Ok(out)
}

/// Decodes a packed run of `ty` values (whole blocks for block-quantized
/// types) into `out`: ggml's `dequantize_row_*`
/// ([`quant::dequantize_row`]), F64 narrowed.
///
/// # Errors
/// [`Error::UnsupportedType`] for integer types; [`Error::DataMismatch`] if
/// `raw` is not the bytes of `out.len()` values.
pub(crate) fn decode_run(ty: GgmlType, raw: &[u8], out: &mut [f32]) -> Result<()> {
    if ty == GgmlType::F64 {
        if raw.len() != out.len() * 8 {
            return Err(Error::DataMismatch {
                name: String::new(),
                detail: format!("{} bytes for {} f64 values", raw.len(), out.len()),
            });
        }
        for (o, c) in out.iter_mut().zip(raw.chunks_exact(8)) {
            *o = f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32;
        }
        return Ok(());
    }
    quant::dequantize_row(ty, raw, out)
}

/// The logical elements of tensor `t` (ggml order, `ne[0]` fastest) as
/// f32, from `bytes`, its storage span (`bytes[0]` is its first byte, as
/// [`Tensor::nbytes`] counts them): its strides are followed, so a view,
/// a permuted or a transposed tensor reads its own elements.
///
/// # Errors
/// [`Error::UnsupportedType`] for an integer tensor;
/// [`Error::DataMismatch`] for a block-quantized tensor whose rows are not
/// packed (`nb[0]` other than the block size); [`Error::OutOfBounds`] if
/// an element lies outside `bytes`.
pub(crate) fn read_elements(t: &Tensor, bytes: &[u8]) -> Result<Vec<f32>> {
    read_strided(t.ty, t.ne, t.nb, bytes, &t.name)
}

/// The f32 values of a contiguous tensor of type `ty` and shape `ne` held
/// in `bytes` (a run's output), in ggml order. `what` names it in errors.
///
/// # Errors
/// [`Error::UnsupportedType`] for integer types; [`Error::DataMismatch`] if
/// `bytes` is not the tensor's size.
pub(crate) fn read_contiguous(ty: GgmlType, ne: [i64; 4], bytes: &[u8], what: &str) -> Result<Vec<f32>> {
    if !(ty.is_float() || ty.is_quantized()) {
        return Err(Error::unsupported_type(ty, format!("{what}: not a float or quantized tensor (read it as i32)")));
    }
    let ne = ne.map(|x| x.max(0));
    let rows = (ne[1] * ne[2] * ne[3]) as usize;
    let rs = ty.row_size(ne[0])?;
    if bytes.len() != rs * rows {
        return Err(Error::DataMismatch {
            name: what.to_string(),
            detail: format!("{} bytes for {ty} {ne:?}, which needs {}", bytes.len(), rs * rows),
        });
    }
    read_strided(ty, ne, contiguous_strides(ty, &ne), bytes, what)
}

/// The elements of a `ty` tensor of shape `ne` and byte strides `nb` whose
/// first byte is `bytes[0]`, in ggml order; `name` names it in errors.
fn read_strided(ty: GgmlType, ne: [i64; 4], nb: [usize; 4], bytes: &[u8], name: &str) -> Result<Vec<f32>> {
    if !(ty.is_float() || ty.is_quantized()) {
        return Err(Error::unsupported_type(ty, format!("f32 values of {name:?}: not a float or quantized tensor")));
    }
    if ne.iter().any(|&n| n <= 0) {
        return Ok(Vec::new());
    }
    let ts = ty.type_size();
    if ty.is_quantized() && ne[0] > 1 && nb[0] != ts {
        return Err(Error::DataMismatch {
            name: name.to_string(),
            detail: format!("a {ty} tensor {ne:?} whose rows are not packed (nb {nb:?})"),
        });
    }
    let ne = ne.map(|x| x as usize);
    let rb = ty.row_size(ne[0] as i64)?;
    // The bytes at `at..at + len`, or where they would lie outside `bytes`.
    let span = |at: Option<usize>, len: usize| -> Result<&[u8]> {
        at.and_then(|a| bytes.get(a..a.checked_add(len)?)).ok_or_else(|| Error::OutOfBounds {
            detail: format!(
                "f32 values of {name:?}: element bytes past its {} bytes (ne {ne:?}, nb {nb:?})",
                bytes.len()
            ),
        })
    };
    let at = |i: [usize; 4]| -> Option<usize> {
        (0..4).try_fold(0usize, |acc, k| i[k].checked_mul(nb[k]).and_then(|o| acc.checked_add(o)))
    };
    let n = ne.iter().try_fold(1usize, |acc, &x| acc.checked_mul(x));
    let mut out = Vec::with_capacity(n.unwrap_or(0));
    let mut row = vec![0f32; ne[0]];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                if ty.is_quantized() || nb[0] == ts {
                    decode_run(ty, span(at([0, i1, i2, i3]), rb)?, &mut row)?;
                } else {
                    for (i0, r) in row.iter_mut().enumerate() {
                        decode_run(ty, span(at([i0, i1, i2, i3]), ts)?, std::slice::from_mut(r))?;
                    }
                }
                out.extend_from_slice(&row);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transposed F16 view reads its logical elements; F64 round-trips
    /// through f32; a Q8_0 row decodes to what was encoded (within its
    /// step); a span too short is an error, not a panic.
    #[test]
    fn strided_reads_and_bounds() {
        let vals: Vec<f32> = (0..6).map(|i| i as f32 - 2.5).collect();
        let bytes = encode_rows(GgmlType::F16, &vals, 3).unwrap();
        // [3, 2] contiguous seen as its transpose [2, 3]: nb = [6, 2].
        let t = Tensor {
            ty: GgmlType::F16,
            ne: [2, 3, 1, 1],
            nb: [6, 2, 6, 6],
            op: crate::ops::Op::None,
            src: Default::default(),
            view_src: None,
            view_offs: 0,
            name: "t".into(),
            flags: Default::default(),
        };
        assert_eq!(read_elements(&t, &bytes).unwrap(), vec![-2.5, 0.5, -1.5, 1.5, -0.5, 2.5]);
        let b64 = encode_rows(GgmlType::F64, &vals, 3).unwrap();
        assert_eq!(read_contiguous(GgmlType::F64, [3, 2, 1, 1], &b64, "x").unwrap(), vals);
        let q: Vec<f32> = (0..32).map(|i| i as f32 / 8.0).collect();
        let qb = encode_rows(GgmlType::Q8_0, &q, 32).unwrap();
        let back = read_contiguous(GgmlType::Q8_0, [32, 1, 1, 1], &qb, "q").unwrap();
        assert!(back.iter().zip(&q).all(|(a, b)| (a - b).abs() < 0.02), "{back:?}");
        assert!(matches!(read_elements(&t, &bytes[..8]), Err(Error::OutOfBounds { .. })));
        assert!(matches!(
            read_contiguous(GgmlType::F16, [3, 2, 1, 1], &bytes[..8], "x"),
            Err(Error::DataMismatch { .. })
        ));
        assert!(matches!(encode_rows(GgmlType::I32, &vals, 3), Err(Error::UnsupportedType { .. })));
    }
}
