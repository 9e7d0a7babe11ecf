//! Host-side layout of split tensors: the per-device local shape of a
//! logical tensor, slicing a full tensor into device-local parts, and
//! assembling the parts back. These are the reference semantics of every
//! split state (what device `j` holds), used to place leafs on devices, to
//! implement collectives over plain copies, and for host `set`/`get` of split
//! tensors. Tensors are contiguous in ggml order; local parts are contiguous
//! too.

use super::state::SplitState;
use crate::error::{Error, Result};
use crate::tensor::GgmlType;
use half::{bf16, f16};

/// The shape device `j` holds of a tensor of shape `ne` in `state`.
/// A device outside a group state's group holds an empty part (axis 3
/// of extent 0, as [`SplitState::on_device`]'s zero extents).
pub fn local_ne(ne: [i64; 4], state: &SplitState, j: usize) -> [i64; 4] {
    let mut out = ne;
    if let SplitState::Split(s) = state {
        out[s.axis.min(3)] = s.local_len(j);
    }
    if state.outside(j) {
        out[3] = 0;
    }
    out
}

/// Bytes per index step along `axis` of a contiguous tensor, the number of
/// such steps, and the number of outer repetitions; for axis 0 of a
/// block-quantized type a step is one block.
fn axis_geometry(ty: GgmlType, ne: [i64; 4], axis: usize) -> Result<(usize, usize, usize, usize)> {
    let bs = ty.block_size();
    let (unit, steps, div) = if axis == 0 {
        (ty.type_size(), ne[0].max(0) as usize / bs, bs)
    } else {
        (checked_bytes(ty, ne[0], &ne[1..axis])?, ne[axis].max(0) as usize, 1)
    };
    Ok((unit, steps, count(&ne[axis + 1..])?, div))
}

/// The product of `dims` (negative dimensions rejected), or an error where
/// it overflows.
fn count(dims: &[i64]) -> Result<usize> {
    let overflow = || Error::Split { detail: format!("shape {dims:?} is negative or overflows") };
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).map_err(|_| overflow())?).ok_or_else(overflow))
}

/// Bytes of `rows` rows (the product of the given dimensions) of `ne0` elements.
fn checked_bytes(ty: GgmlType, ne0: i64, rows: &[i64]) -> Result<usize> {
    ty.row_size(ne0)?
        .checked_mul(count(rows)?)
        .ok_or_else(|| Error::Split { detail: format!("{ty} tensor of {ne0} x {rows:?} overflows") })
}

fn full_bytes(ty: GgmlType, ne: [i64; 4]) -> Result<usize> {
    checked_bytes(ty, ne[0], &ne[1..])
}

/// Device `j`'s contiguous local bytes of the contiguous tensor `full` (type
/// `ty`, shape `ne`) in `state`: mirrored → all of it; partial → all of it on
/// device 0 and zeros elsewhere (a mirrored value as a partial sum); split →
/// its ranges along the axis, in logical order; the group states as
/// mirrored and partial among the group's members (the first member holds a
/// partial value) and nothing on the other devices.
///
/// # Errors
/// [`Error::DataMismatch`] if `full` is not `ne`'s size; [`Error::Split`] if
/// the state does not fit the shape (or splits a quantized row off block
/// boundaries) or names an empty device group; `Unknown` is an error.
pub fn slice_local(ty: GgmlType, ne: [i64; 4], full: &[u8], state: &SplitState, j: usize) -> Result<Vec<u8>> {
    state.check_group(64)?;
    let n = full_bytes(ty, ne)?;
    if full.len() != n {
        return Err(Error::DataMismatch {
            name: String::new(),
            detail: format!("{} bytes for {ty}{ne:?} ({n})", full.len()),
        });
    }
    match state {
        SplitState::MirroredOn(_) | SplitState::PartialOn(..) if state.outside(j) => Ok(Vec::new()),
        SplitState::Mirrored | SplitState::MirroredOn(_) => Ok(full.to_vec()),
        SplitState::Partial(_) => Ok(if j == 0 { full.to_vec() } else { vec![0; n] }),
        SplitState::PartialOn(g, _) => Ok(if g.iter().next() == Some(j) { full.to_vec() } else { vec![0; n] }),
        SplitState::Unknown => Err(Error::Split { detail: "cannot lay out a tensor in the Unknown state".into() }),
        SplitState::Split(s) => {
            s.validate(ne[s.axis.min(3)], s.n_devices().max(j + 1))?;
            let (unit, steps, outer, div) = axis_geometry(ty, ne, s.axis)?;
            let ranges = s.ranges(j);
            if ranges.iter().any(|&(a, b)| a as usize % div != 0 || b as usize % div != 0) {
                return Err(Error::Split {
                    detail: format!("{ty} rows split at {ranges:?}, not on {div}-element blocks"),
                });
            }
            let mut out = Vec::with_capacity(n / steps.max(1) * (s.local_len(j) as usize / div));
            for o in 0..outer {
                let base = o * steps * unit;
                for &(a, b) in &ranges {
                    out.extend_from_slice(&full[base + a as usize / div * unit..base + b as usize / div * unit]);
                }
            }
            Ok(out)
        }
    }
}

/// Where device `j`'s local bytes (as [`slice_local`] lays them out) come
/// from in the full contiguous bytes of a tensor: [`local_run`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LocalRun {
    /// One contiguous run of them: mirrored; partial on device 0; a split
    /// whose axis has only dimensions of 1 outside it (the rows of a
    /// matrix), or that gives the device the whole axis.
    Run(std::ops::Range<usize>),
    /// Zeros (a partial tensor's devices past 0).
    Zeros,
    /// Gathered from several runs (a split along a matrix's rows).
    Gathered,
}

/// Device `j`'s [`LocalRun`] of a tensor of type `ty` and shape `ne` in
/// `state`.
///
/// # Errors
/// As [`slice_local`] for a state that does not fit the shape.
pub(crate) fn local_run(ty: GgmlType, ne: [i64; 4], state: &SplitState, j: usize) -> Result<LocalRun> {
    state.check_group(64)?;
    let n = full_bytes(ty, ne)?;
    match state {
        SplitState::MirroredOn(_) | SplitState::PartialOn(..) if state.outside(j) => Ok(LocalRun::Run(0..0)),
        SplitState::Mirrored | SplitState::MirroredOn(_) => Ok(LocalRun::Run(0..n)),
        SplitState::Partial(_) if j == 0 => Ok(LocalRun::Run(0..n)),
        SplitState::PartialOn(g, _) if g.iter().next() == Some(j) => Ok(LocalRun::Run(0..n)),
        SplitState::Partial(_) | SplitState::PartialOn(..) => Ok(LocalRun::Zeros),
        SplitState::Unknown => Err(Error::Split { detail: "cannot lay out a tensor in the Unknown state".into() }),
        SplitState::Split(s) => {
            s.validate(ne[s.axis.min(3)], s.n_devices().max(j + 1))?;
            let (unit, _, outer, div) = axis_geometry(ty, ne, s.axis)?;
            match s.ranges(j).as_slice() {
                [] => Ok(LocalRun::Run(0..0)),
                // The whole axis (one device): all of it.
                &[(0, b)] if b == ne[s.axis.min(3)] => Ok(LocalRun::Run(0..n)),
                &[(a, b)] if outer == 1 && a as usize % div == 0 && b as usize % div == 0 => {
                    Ok(LocalRun::Run(a as usize / div * unit..b as usize / div * unit))
                }
                _ => Ok(LocalRun::Gathered),
            }
        }
    }
}

/// The full contiguous bytes of a tensor from every device's local part
/// (`locals[j]` as [`slice_local`] lays it out): mirrored → device 0's copy
/// (on a group: its first member's); partial → the element-wise sum (of
/// the group's members' addends) (F32, F16, BF16 summed in f32; I32, I64
/// exactly); split →
/// the ranges put back in place.
///
/// # Errors
/// [`Error::DataMismatch`] on a part of the wrong size or count (a device
/// outside a group state's group holds an empty part);
/// [`Error::UnsupportedType`] for a partial sum of a non-float type;
/// [`Error::Split`] as [`slice_local`].
pub fn assemble(ty: GgmlType, ne: [i64; 4], locals: &[Vec<u8>], state: &SplitState) -> Result<Vec<u8>> {
    let n = full_bytes(ty, ne)?;
    let bad = |d: String| Error::DataMismatch { name: String::new(), detail: d };
    if locals.is_empty() {
        return Err(bad("no device parts".into()));
    }
    state.check_group(locals.len())?;
    if let Some(j) = (0..locals.len()).find(|&j| state.outside(j) && !locals[j].is_empty()) {
        return Err(bad(format!("device {j} is outside {} but holds {} bytes", state.label(), locals[j].len())));
    }
    match state {
        SplitState::Mirrored => {
            let first = locals.first().ok_or_else(|| bad("no device parts".into()))?;
            if first.len() != n {
                return Err(bad(format!("mirrored part of {} bytes for {n}", first.len())));
            }
            Ok(first.clone())
        }
        SplitState::MirroredOn(g) => {
            // The first member's copy; the others' may be left out (empty).
            if let Some(p) = g.iter().skip(1).filter_map(|j| locals.get(j)).find(|p| !p.is_empty() && p.len() != n) {
                return Err(bad(format!("mirrored part of {} bytes for {n}", p.len())));
            }
            let first = g.iter().next().and_then(|j| locals.get(j)).ok_or_else(|| bad("no member's part".into()))?;
            if first.len() != n {
                return Err(bad(format!("mirrored part of {} bytes for {n}", first.len())));
            }
            Ok(first.clone())
        }
        SplitState::Partial(_) | SplitState::PartialOn(..) => {
            let members: Vec<&Vec<u8>> =
                locals.iter().enumerate().filter(|(j, _)| !state.outside(*j)).map(|(_, l)| l).collect();
            if members.is_empty() || members.iter().any(|l| l.len() != n) {
                return Err(bad(format!("partial parts must all be {n} bytes")));
            }
            let parts: Vec<&[u8]> = members.iter().map(|l| l.as_slice()).collect();
            sum_addends(ty, &parts)
        }
        SplitState::Unknown => Err(Error::Split { detail: "cannot assemble a tensor in the Unknown state".into() }),
        SplitState::Split(s) => {
            s.validate(ne[s.axis.min(3)], locals.len())?;
            let (unit, steps, outer, div) = axis_geometry(ty, ne, s.axis)?;
            let mut full = vec![0u8; n];
            for (j, l) in locals.iter().enumerate() {
                let ranges = s.ranges(j);
                let want: usize = outer * ranges.iter().map(|&(a, b)| (b - a) as usize / div * unit).sum::<usize>();
                if l.len() != want {
                    return Err(bad(format!("device {j} part of {} bytes, expected {want}", l.len())));
                }
                let mut pos = 0;
                for o in 0..outer {
                    let base = o * steps * unit;
                    for &(a, b) in &ranges {
                        let len = (b - a) as usize / div * unit;
                        let dst = base + a as usize / div * unit;
                        full[dst..dst + len].copy_from_slice(&l[pos..pos + len]);
                        pos += len;
                    }
                }
            }
            Ok(full)
        }
    }
}

/// Per axis, the logical ranges `[start, end)` a local buffer holds, in the
/// order it stores them (a device's part under a state, or a packed region).
/// Along axis 0 of a block-quantized type ranges are in elements and fall on
/// block boundaries.
pub(crate) type Boxes = [Vec<(i64, i64)>; 4];

/// The ranges device `j` holds of a tensor of shape `ne` in `state`
/// (everything for mirrored and partial, nothing outside a group).
pub(crate) fn boxes(ne: [i64; 4], state: &SplitState, j: usize) -> Boxes {
    let mut b: Boxes = std::array::from_fn(|k| if ne[k] > 0 { vec![(0, ne[k])] } else { Vec::new() });
    if let SplitState::Split(s) = state {
        b[s.axis.min(3)] = s.ranges(j);
    }
    if state.outside(j) {
        b[3] = Vec::new();
    }
    b
}

/// The part of `a` that lies in `b`, per axis, in ascending logical order.
pub(crate) fn intersect(a: &Boxes, b: &Boxes) -> Boxes {
    std::array::from_fn(|k| {
        let mut out = Vec::new();
        for &(s0, e0) in &a[k] {
            for &(s1, e1) in &b[k] {
                let (s, e) = (s0.max(s1), e0.min(e1));
                if s < e {
                    out.push((s, e));
                }
            }
        }
        out.sort_unstable();
        out
    })
}

/// Bytes of a contiguous buffer laid out as `b` for type `ty`.
pub(crate) fn box_bytes(ty: GgmlType, b: &Boxes) -> usize {
    let n0: i64 = b[0].iter().map(|&(s, e)| e - s).sum();
    let rows: i64 = b[1..].iter().map(|r| r.iter().map(|&(s, e)| e - s).sum::<i64>()).product();
    (n0.max(0) as usize / ty.block_size()) * ty.type_size() * rows.max(0) as usize
}

/// Per axis, the number of elements a buffer laid out as `b` holds.
pub(crate) fn lens(b: &Boxes) -> [i64; 4] {
    std::array::from_fn(|k| b[k].iter().map(|&(s, e)| e - s).sum())
}

/// The element-wise sum of partial addends of type `ty` (equal lengths):
/// floats summed in f32 and rounded once, integers exactly (wrapping).
/// Addends that are exactly +0 are skipped, so a single non-zero addend
/// comes back bit for bit (−0.0 and NaN payloads included).
///
/// # Errors
/// [`Error::UnsupportedType`] for a type that cannot be summed.
pub(crate) fn sum_addends(ty: GgmlType, parts: &[&[u8]]) -> Result<Vec<u8>> {
    let Some(first) = parts.first() else { return Ok(Vec::new()) };
    let w = ty.type_size();
    if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::I32 | GgmlType::I64) {
        return Err(Error::unsupported_type(ty, "a partial sum needs F32, F16, BF16, I32 or I64"));
    }
    let mut out = first.to_vec();
    for (e, o) in out.chunks_exact_mut(w).enumerate() {
        let others: Vec<&[u8]> =
            parts[1..].iter().map(|p| &p[e * w..(e + 1) * w]).filter(|c| c.iter().any(|&b| b != 0)).collect();
        if others.is_empty() {
            continue;
        }
        let start: Vec<&[u8]> = if o.iter().all(|&b| b == 0) { Vec::new() } else { vec![&o[..]] };
        let all: Vec<&[u8]> = start.into_iter().chain(others).collect();
        let bytes: Vec<u8> = match ty {
            GgmlType::F32 => {
                all.iter().map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).sum::<f32>().to_le_bytes().to_vec()
            }
            GgmlType::F16 => f16::from_f32(all.iter().map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).sum())
                .to_le_bytes()
                .to_vec(),
            GgmlType::BF16 => bf16::from_f32(all.iter().map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).sum())
                .to_le_bytes()
                .to_vec(),
            GgmlType::I32 => all
                .iter()
                .fold(0i32, |a, c| a.wrapping_add(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .to_le_bytes()
                .to_vec(),
            _ => all
                .iter()
                .fold(0i64, |a, c| a.wrapping_add(i64::from_le_bytes(c[..8].try_into().unwrap_or([0; 8]))))
                .to_le_bytes()
                .to_vec(),
        };
        o.copy_from_slice(&bytes);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::AxisSplit;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn split_round_trips_over_axes_segments_repeats_and_empty_devices() {
        let ne = [4, 6, 3, 2];
        let full = bytes(4 * 6 * 3 * 2 * 4);
        let states = [
            SplitState::split(0, vec![1, 3]),
            SplitState::split(1, vec![0, 6, 0]),
            SplitState::split(2, vec![2, 1]),
            SplitState::split(3, vec![1, 0, 1]),
            SplitState::Split(AxisSplit { axis: 1, segments: vec![vec![1, 2], vec![2, 1]], repeat: 1 }),
            SplitState::Split(AxisSplit { axis: 1, segments: vec![vec![1, 1]], repeat: 3 }),
        ];
        for st in states {
            let n = st.as_split().unwrap().n_devices();
            let locals: Vec<Vec<u8>> = (0..n).map(|j| slice_local(GgmlType::F32, ne, &full, &st, j).unwrap()).collect();
            for (j, l) in locals.iter().enumerate() {
                let lne = local_ne(ne, &st, j);
                assert_eq!(l.len(), (lne.iter().product::<i64>() * 4) as usize);
            }
            assert_eq!(assemble(GgmlType::F32, ne, &locals, &st).unwrap(), full, "{}", st.label());
        }
        // Device 1 of a [1,1]×3 repeat holds rows 1, 3, 5 of each outer block.
        let st = SplitState::Split(AxisSplit { axis: 1, segments: vec![vec![1, 1]], repeat: 3 });
        let l = slice_local(GgmlType::F32, [4, 6, 1, 1], &full[..96], &st, 1).unwrap();
        assert_eq!(l, [&full[16..32], &full[48..64], &full[80..96]].concat());
    }

    #[test]
    fn quantized_rows_split_on_blocks_only() {
        let ne = [64, 3, 1, 1];
        let full = bytes(2 * 34 * 3);
        let ok = SplitState::split(0, vec![32, 32]);
        let l0 = slice_local(GgmlType::Q8_0, ne, &full, &ok, 0).unwrap();
        assert_eq!(l0.len(), 34 * 3);
        let l1 = slice_local(GgmlType::Q8_0, ne, &full, &ok, 1).unwrap();
        assert_eq!(assemble(GgmlType::Q8_0, ne, &[l0, l1], &ok).unwrap(), full);
        assert!(slice_local(GgmlType::Q8_0, ne, &full, &SplitState::split(0, vec![16, 48]), 0).is_err());
    }

    #[test]
    fn partials_sum_and_mirrored_keeps_one_copy() {
        let ne = [3, 1, 1, 1];
        let a: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [0.5f32, -2.0, 10.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let s = assemble(GgmlType::F32, ne, &[a.clone(), b], &SplitState::partial()).unwrap();
        let v: Vec<f32> = s.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(v, [1.5, 0.0, 13.0]);
        // A mirrored value as a partial sum: device 0 holds it, the rest zeros.
        let parts: Vec<Vec<u8>> =
            (0..3).map(|j| slice_local(GgmlType::F32, ne, &a, &SplitState::partial(), j).unwrap()).collect();
        assert_eq!(assemble(GgmlType::F32, ne, &parts, &SplitState::partial()).unwrap(), a);
        assert!(assemble(GgmlType::Q8_0, [32, 1, 1, 1], &[vec![0; 34], vec![0; 34]], &SplitState::partial()).is_err());
        assert!(slice_local(GgmlType::F32, ne, &a[..8], &SplitState::Mirrored, 0).is_err());
        assert!(slice_local(GgmlType::F32, ne, &a, &SplitState::Unknown, 0).is_err());
    }

    #[test]
    fn a_group_state_lives_on_its_members_only() {
        use crate::split::DeviceSet;
        let ne = [3, 2, 1, 1];
        let a: Vec<u8> = (0..6).flat_map(|x| (x as f32).to_le_bytes()).collect();
        let g = DeviceSet::of([1, 3]);
        let m = SplitState::MirroredOn(g);
        let parts: Vec<Vec<u8>> = (0..4).map(|j| slice_local(GgmlType::F32, ne, &a, &m, j).unwrap()).collect();
        assert_eq!(parts.iter().map(Vec::len).collect::<Vec<_>>(), [0, 24, 0, 24]);
        assert_eq!(local_ne(ne, &m, 0), [3, 2, 1, 0]);
        assert_eq!(local_ne(ne, &m, 1), ne);
        assert_eq!(box_bytes(GgmlType::F32, &boxes(ne, &m, 2)), 0);
        assert_eq!(assemble(GgmlType::F32, ne, &parts, &m).unwrap(), a);
        // A partial sum on the group: its first member holds the value.
        let p = SplitState::PartialOn(g, crate::split::ReduceOp::Sum);
        let parts: Vec<Vec<u8>> = (0..4).map(|j| slice_local(GgmlType::F32, ne, &a, &p, j).unwrap()).collect();
        assert_eq!(parts[1], a);
        assert!(parts[3].iter().all(|&b| b == 0) && parts[3].len() == 24);
        assert!(parts[0].is_empty() && parts[2].is_empty());
        assert_eq!(assemble(GgmlType::F32, ne, &parts, &p).unwrap(), a);
        assert_eq!(local_run(GgmlType::F32, ne, &p, 3).unwrap(), LocalRun::Zeros);
        assert_eq!(local_run(GgmlType::F32, ne, &p, 2).unwrap(), LocalRun::Run(0..0));
    }
}
