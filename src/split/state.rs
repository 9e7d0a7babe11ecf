//! Split states: how one logical tensor is laid out over N devices
//! (ggml's meta backend vocabulary: split axis, mirrored, partial).

use crate::error::{Error, Result};
use crate::tensor::GgmlType;

/// How partial addends combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The value is the sum of the devices' addends.
    Sum,
}

/// A split along one axis. Along `axis` the logical tensor is a sequence of
/// `segments`, the whole sequence repeated `repeat` times; within segment `s`,
/// device `j` holds the next `segments[s][j]` elements (ggml's
/// `n_segments`/`nr`). A plain split is one segment with `repeat = 1`; a fused
/// gate|up weight has two segments; flattening a head split (`[D, H, T]` →
/// `[D, H·T]`) gives one segment of `H` repeated `T` times.
///
/// Device `j` stores, along `axis`, `repeat · Σ_s segments[s][j]` elements,
/// in logical order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AxisSplit {
    /// Split axis, 0..=3 (`ne` index).
    pub axis: usize,
    /// Per segment, per device element counts (may be 0; segments may differ in size).
    pub segments: Vec<Vec<i64>>,
    /// How many times the segment sequence repeats along the axis (≥ 1).
    pub repeat: i64,
}

impl AxisSplit {
    /// One segment over `n` devices with the given extents.
    pub fn even(axis: usize, extents: Vec<i64>) -> Self {
        AxisSplit { axis, segments: vec![extents], repeat: 1 }
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        self.segments.first().map_or(0, |s| s.len())
    }

    /// Logical length along the axis (`repeat · Σ segments`; saturating, so
    /// a split that [`AxisSplit::validate`] rejects never overflows).
    pub fn axis_len(&self) -> i64 {
        let sum = self.segments.iter().flatten().fold(0i64, |a, &e| a.saturating_add(e));
        self.repeat.saturating_mul(sum)
    }

    /// Elements device `j` holds along the axis (saturating, as [`AxisSplit::axis_len`]).
    pub fn local_len(&self, j: usize) -> i64 {
        let sum = self.segments.iter().map(|s| s.get(j).copied().unwrap_or(0)).fold(0i64, |a, e| a.saturating_add(e));
        self.repeat.saturating_mul(sum)
    }

    /// For device `j`: the logical ranges `[start, end)` along the axis it
    /// holds, in the order it stores them (empty ranges omitted). Meant for
    /// a split that [`AxisSplit::validate`] accepts; on another one the
    /// arithmetic saturates rather than overflows, and an empty list is
    /// returned for one whose extents overflow `i64`.
    pub fn ranges(&self, j: usize) -> Vec<(i64, i64)> {
        fn sum<'a>(it: impl IntoIterator<Item = &'a i64>) -> Option<i64> {
            it.into_iter().try_fold(0i64, |a, &e| a.checked_add(e))
        }
        let Some(seg_total) = sum(self.segments.iter().flatten()) else { return Vec::new() };
        if seg_total.checked_mul(self.repeat).is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for r in 0..self.repeat {
            let mut base = r * seg_total;
            for seg in &self.segments {
                let before = sum(seg.iter().take(j)).unwrap_or(0);
                let n = seg.get(j).copied().unwrap_or(0);
                if n > 0 {
                    let start = base.saturating_add(before);
                    match out.last_mut() {
                        Some((_, e)) if *e == start => *e = start.saturating_add(n),
                        _ => out.push((start, start.saturating_add(n))),
                    }
                }
                base = base.saturating_add(sum(seg).unwrap_or(0));
            }
        }
        out
    }

    /// Checks internal consistency against a logical axis length and device count.
    ///
    /// # Errors
    /// [`Error::Split`] when the extents do not sum to `axis_len`, a count is
    /// negative, the axis is out of range, or the device counts disagree.
    pub fn validate(&self, axis_len: i64, n_devices: usize) -> Result<()> {
        let bad = |d: String| Err(Error::Split { detail: d });
        if self.axis > 3 {
            return bad(format!("split axis {} is not 0..=3", self.axis));
        }
        if self.repeat < 1 || self.segments.is_empty() {
            return bad(format!("split on axis {} needs ≥ 1 segment and repeat ≥ 1", self.axis));
        }
        if self.segments.iter().any(|s| s.len() != n_devices) {
            return bad(format!("split on axis {} has segments for a device count other than {n_devices}", self.axis));
        }
        if self.segments.iter().flatten().any(|&e| e < 0) {
            return bad(format!("split on axis {} has a negative extent", self.axis));
        }
        // Exact sums: extents that overflow i64 are never a valid split.
        let sum: i128 = self.segments.iter().flatten().map(|&e| e as i128).sum();
        if sum.checked_mul(self.repeat as i128).is_none_or(|t| t > i64::MAX as i128) {
            return bad(format!("split on axis {}: extents {:?} × {} overflow", self.axis, self.segments, self.repeat));
        }
        if self.repeat > 1 && self.repeat > axis_len {
            return bad(format!(
                "split on axis {}: repeat {} exceeds the axis length {axis_len}",
                self.axis, self.repeat
            ));
        }
        if self.axis_len() != axis_len {
            return bad(format!(
                "split on axis {}: extents {:?} × {} cover {} elements, the axis has {axis_len}",
                self.axis,
                self.segments,
                self.repeat,
                self.axis_len()
            ));
        }
        Ok(())
    }
}

/// A set of devices of one world (bit `j` is device `j`; at most 64
/// devices, as [`split_extents`]' ratios allow): the **device group** a
/// [`SplitState::MirroredOn`] or [`SplitState::PartialOn`] tensor lives on
/// (`docs/split-design.md`, section 4b).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DeviceSet(pub u64);

impl DeviceSet {
    /// Devices `0..n` (`n` ≤ 64; more are cut to 64).
    pub fn all(n: usize) -> Self {
        DeviceSet(if n >= 64 { u64::MAX } else { (1u64 << n) - 1 })
    }

    /// The set of the given devices (indices ≥ 64 are ignored).
    pub fn of(devices: impl IntoIterator<Item = usize>) -> Self {
        DeviceSet(devices.into_iter().filter(|&j| j < 64).fold(0, |m, j| m | 1 << j))
    }

    /// Whether device `j` is in the set.
    pub fn contains(self, j: usize) -> bool {
        j < 64 && self.0 >> j & 1 == 1
    }

    /// Number of devices in the set.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// True for the empty set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The devices, ascending.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..64).filter(move |&j| self.contains(j))
    }

    /// Whether every device is below `n` (the set belongs to a world of `n`).
    pub fn within(self, n: usize) -> bool {
        self.0 & !DeviceSet::all(n).0 == 0
    }

    /// Whether every device of `self` is in `other`.
    pub fn subset_of(self, other: DeviceSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// The device of the set that serves device `j`: `j` itself when it is a
    /// member, else one member chosen by `j` (spreading the non-members
    /// over the members). `None` for the empty set.
    pub fn server(self, j: usize) -> Option<usize> {
        if self.contains(j) {
            return Some(j);
        }
        let len = self.len();
        // The k-th device outside the set goes to member k mod len.
        let k = (0..j).filter(|&i| !self.contains(i)).count();
        (len > 0).then(|| self.iter().nth(k % len)).flatten()
    }

    /// `{0,2,3}`.
    pub fn label(self) -> String {
        let v: Vec<String> = self.iter().map(|j| j.to_string()).collect();
        format!("{{{}}}", v.join(","))
    }
}

/// The split state of one logical tensor over N devices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SplitState {
    /// Every device holds all values.
    Mirrored,
    /// Every device holds a full-shape addend; the value is their reduction.
    Partial(ReduceOp),
    /// Every device of a group holds all values; the others hold nothing
    /// (an empty part, as a zero extent). The planner makes groups of 2 or
    /// more devices, not all (one device's is [`SplitState::on_device`],
    /// all devices' [`SplitState::Mirrored`]); others are valid too.
    /// What a tensor split over some devices only computes its replicated
    /// ops in: a `--tensor-split` with zero shares, or one machine's devices
    /// under the hybrid split.
    MirroredOn(DeviceSet),
    /// Every device of a group (as [`SplitState::MirroredOn`]) holds a
    /// full-shape addend; the value is their reduction; the others hold
    /// nothing. Reduced among the group only.
    PartialOn(DeviceSet, ReduceOp),
    /// Each device holds a slice along one axis.
    Split(AxisSplit),
    /// Not decided yet: exists only while planning, never in a finished plan.
    Unknown,
}

impl SplitState {
    /// A single-segment split of `axis` with per-device `extents`.
    pub fn split(axis: usize, extents: Vec<i64>) -> Self {
        SplitState::Split(AxisSplit::even(axis, extents))
    }

    /// `Partial(Sum)`.
    pub fn partial() -> Self {
        SplitState::Partial(ReduceOp::Sum)
    }

    /// Mirrored on `group` of `n` devices: [`SplitState::Mirrored`] when the
    /// group is every device, else [`SplitState::MirroredOn`].
    pub fn mirrored_on(group: DeviceSet, n: usize) -> Self {
        if DeviceSet::all(n).subset_of(group) {
            SplitState::Mirrored
        } else {
            SplitState::MirroredOn(group)
        }
    }

    /// A partial sum on `group` of `n` devices: [`SplitState::Partial`] when
    /// the group is every device, else [`SplitState::PartialOn`].
    pub fn partial_on(group: DeviceSet, n: usize) -> Self {
        if DeviceSet::all(n).subset_of(group) {
            SplitState::partial()
        } else {
            SplitState::PartialOn(group, ReduceOp::Sum)
        }
    }

    /// The group of a [`SplitState::MirroredOn`] or [`SplitState::PartialOn`] state.
    pub fn group(&self) -> Option<DeviceSet> {
        match self {
            SplitState::MirroredOn(g) | SplitState::PartialOn(g, _) => Some(*g),
            _ => None,
        }
    }

    /// The devices of `n` that hold any of the tensor: every device for the
    /// whole-world states, a group's members, a split's devices with a
    /// non-zero extent.
    pub fn holders(&self, n: usize) -> DeviceSet {
        match self {
            SplitState::MirroredOn(g) | SplitState::PartialOn(g, _) => *g,
            SplitState::Split(s) => DeviceSet::of((0..n).filter(|&j| s.local_len(j) > 0)),
            _ => DeviceSet::all(n),
        }
    }

    /// True for a partial sum, over every device or over a group.
    pub fn is_partial(&self) -> bool {
        matches!(self, SplitState::Partial(_) | SplitState::PartialOn(..))
    }

    /// Whether device `j` holds nothing of a tensor in this state because it
    /// is outside the state's group.
    pub fn outside(&self, j: usize) -> bool {
        self.group().is_some_and(|g| !g.contains(j))
    }

    /// Checks that a group state's group is one of `n` devices' (members
    /// below `n`, at least one); every other state passes.
    ///
    /// # Errors
    /// [`Error::Split`] naming the group.
    pub fn check_group(&self, n: usize) -> Result<()> {
        match self.group() {
            Some(g) if g.is_empty() || !g.within(n) => {
                Err(Error::Split { detail: format!("{}: a device group outside devices 0..{n}", self.label()) })
            }
            _ => Ok(()),
        }
    }

    /// The split, if this is one.
    pub fn as_split(&self) -> Option<&AxisSplit> {
        match self {
            SplitState::Split(s) => Some(s),
            _ => None,
        }
    }

    /// The one device that holds all of this tensor, if it lies whole on
    /// one device: a split of a non-empty axis whose every other extent is
    /// zero (llama.cpp's `--split-mode layer` places each layer so, and
    /// `--tensor-split 1,0` any tensor). `None` for every other state.
    pub fn sole_holder(&self) -> Option<usize> {
        let SplitState::Split(s) = self else { return None };
        let len = s.axis_len();
        if len <= 0 {
            return None;
        }
        (0..s.n_devices()).find(|&j| s.local_len(j) == len)
    }

    /// The state of a tensor of extents `ne` (ggml order) that lies whole on
    /// device `j` of `n`, in the one form the planner gives such tensors:
    /// split on axis 3, all of it on `j` (`[0, .., ne[3], .., 0]`). `None`
    /// when `j ≥ n` or the tensor has no elements (nothing to hold).
    pub fn on_device(j: usize, n: usize, ne: &[i64; 4]) -> Option<SplitState> {
        if j >= n || ne.iter().any(|&e| e <= 0) {
            return None;
        }
        let mut extents = vec![0; n];
        extents[j] = ne[3];
        Some(SplitState::split(3, extents))
    }

    /// Whether a tensor of `ty` can be laid out in this state: a block type
    /// (Q8_0, Q4_K, IQ4_XS, …) holds no partial sum (no device can add
    /// blocks) and is cut on axis 0 only at block boundaries (every extent a
    /// multiple of [`GgmlType::block_size`]); any state suits a type with
    /// one element per block.
    pub fn suits(&self, ty: GgmlType) -> bool {
        let bs = ty.block_size() as i64;
        if bs <= 1 {
            return true;
        }
        match self {
            SplitState::Partial(_) | SplitState::PartialOn(..) => false,
            SplitState::Split(s) if s.axis == 0 => s.segments.iter().flatten().all(|&e| e % bs == 0),
            SplitState::Split(_) | SplitState::Mirrored | SplitState::MirroredOn(_) | SplitState::Unknown => true,
        }
    }

    /// Short label: `mirrored`, `partial(sum)`, `mirrored on {0,1}`,
    /// `partial(sum) on {2,3}`, `split(axis=1, [4,4])`, `unknown`.
    pub fn label(&self) -> String {
        match self {
            SplitState::Mirrored => "mirrored".into(),
            SplitState::Partial(ReduceOp::Sum) => "partial(sum)".into(),
            SplitState::MirroredOn(g) => format!("mirrored on {}", g.label()),
            SplitState::PartialOn(g, ReduceOp::Sum) => format!("partial(sum) on {}", g.label()),
            SplitState::Unknown => "unknown".into(),
            SplitState::Split(s) if s.segments.len() == 1 && s.repeat == 1 => {
                format!("split(axis={}, {:?})", s.axis, s.segments[0])
            }
            SplitState::Split(s) => format!("split(axis={}, segments={:?}, repeat={})", s.axis, s.segments, s.repeat),
        }
    }
}

/// Per-device extents of `len` elements split by `ratios` (llama.cpp's
/// `--tensor-split`), in multiples of `granule` (a quant block, a head):
/// cumulative boundaries are rounded down to the granule, the last device
/// takes the rest. Zero extents are allowed.
///
/// # Errors
/// [`Error::Split`] if `len` is not a multiple of `granule`, `granule < 1`,
/// no ratios are given, or a ratio is negative/non-finite or all are zero.
pub fn split_extents(len: i64, ratios: &[f32], granule: i64) -> Result<Vec<i64>> {
    if granule < 1 || len < 0 || len % granule != 0 {
        return Err(Error::Split { detail: format!("cannot split {len} elements in granules of {granule}") });
    }
    if ratios.is_empty() || ratios.iter().any(|r| !r.is_finite() || *r < 0.0) || ratios.iter().all(|r| *r == 0.0) {
        return Err(Error::Split { detail: format!("invalid tensor split ratios {ratios:?}") });
    }
    let total: f64 = ratios.iter().map(|&r| r as f64).sum();
    let units = len / granule;
    let mut out = Vec::with_capacity(ratios.len());
    let mut acc = 0.0f64;
    let mut prev = 0i64;
    for (j, &r) in ratios.iter().enumerate() {
        acc += r as f64;
        let bound = if j + 1 == ratios.len() { units } else { ((acc / total) * units as f64 + 1e-9).floor() as i64 };
        let bound = bound.clamp(prev, units);
        out.push((bound - prev) * granule);
        prev = bound;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {

    #[test]
    fn block_types_are_never_partial_nor_cut_inside_a_block() {
        use crate::tensor::GgmlType;
        let split = |e: Vec<i64>| SplitState::split(0, e);
        assert!(split(vec![256, 512]).suits(GgmlType::Q4_K));
        assert!(!split(vec![144, 112]).suits(GgmlType::Q4_K));
        assert!(split(vec![32, 0, 96]).suits(GgmlType::Q8_0));
        assert!(!split(vec![16, 48]).suits(GgmlType::Q8_0));
        assert!(SplitState::split(1, vec![3, 4]).suits(GgmlType::Q8_0));
        assert!(!SplitState::partial().suits(GgmlType::IQ4_XS));
        assert!(SplitState::partial().suits(GgmlType::F16));
        assert!(split(vec![3, 5]).suits(GgmlType::F32));
        // Segments: every extent, so every boundary, on a block.
        let seg = SplitState::Split(AxisSplit { axis: 0, segments: vec![vec![32, 32], vec![16, 48]], repeat: 1 });
        assert!(!seg.suits(GgmlType::Q8_0));
    }
    use super::*;

    #[test]
    fn ranges_follow_segments_and_repeats() {
        // Fused gate|up: two segments of 6, split 4:2 on two devices.
        let s = AxisSplit { axis: 1, segments: vec![vec![4, 2], vec![4, 2]], repeat: 1 };
        assert_eq!(s.ranges(0), vec![(0, 4), (6, 10)]);
        assert_eq!(s.ranges(1), vec![(4, 6), (10, 12)]);
        assert_eq!(s.local_len(0), 8);
        s.validate(12, 2).unwrap();
        assert!(s.validate(13, 2).is_err());
        // Flattened head split: 8 heads (4/4) repeated 3 times.
        let f = AxisSplit { axis: 1, segments: vec![vec![4, 4]], repeat: 3 };
        assert_eq!(f.ranges(1), vec![(4, 8), (12, 16), (20, 24)]);
        // Zero extent.
        let z = AxisSplit::even(0, vec![3, 0, 1]);
        assert!(z.ranges(1).is_empty());
        assert_eq!(z.ranges(2), vec![(3, 4)]);
    }

    #[test]
    fn a_split_with_one_nonzero_extent_lies_whole_on_that_device() {
        assert_eq!(SplitState::split(1, vec![0, 7, 0]).sole_holder(), Some(1));
        assert_eq!(
            SplitState::Split(AxisSplit { axis: 0, segments: vec![vec![3, 0], vec![2, 0]], repeat: 2 }).sole_holder(),
            Some(0)
        );
        assert_eq!(SplitState::split(1, vec![3, 4]).sole_holder(), None);
        assert_eq!(SplitState::split(1, vec![0, 0]).sole_holder(), None);
        assert_eq!(SplitState::Mirrored.sole_holder(), None);
        assert_eq!(SplitState::partial().sole_holder(), None);
        let on = SplitState::on_device(2, 3, &[4, 5, 1, 6]).unwrap();
        assert_eq!(on, SplitState::split(3, vec![0, 0, 6]));
        assert_eq!(on.sole_holder(), Some(2));
        assert!(SplitState::on_device(3, 3, &[4, 5, 1, 6]).is_none());
        assert!(SplitState::on_device(0, 2, &[4, 5, 1, 0]).is_none());
    }

    #[test]
    fn device_sets_and_group_states() {
        let g = DeviceSet::of([1, 3]);
        assert_eq!((g.len(), g.contains(1), g.contains(2), g.label()), (2, true, false, "{1,3}".to_string()));
        assert!(g.within(4) && !g.within(3) && g.subset_of(DeviceSet::all(4)));
        // Members serve themselves; the others are spread over the members.
        assert_eq!((0..4).map(|j| g.server(j)).collect::<Vec<_>>(), [Some(1), Some(1), Some(3), Some(3)]);
        assert_eq!(DeviceSet::default().server(0), None);
        assert_eq!(DeviceSet::all(64).len(), 64);
        // Every device is the whole-world state.
        assert_eq!(SplitState::mirrored_on(DeviceSet::all(3), 3), SplitState::Mirrored);
        assert_eq!(
            SplitState::partial_on(DeviceSet::of([0, 2]), 3),
            SplitState::PartialOn(DeviceSet(5), ReduceOp::Sum)
        );
        assert_eq!(SplitState::split(0, vec![2, 0, 3]).holders(3), DeviceSet::of([0, 2]));
        assert_eq!(SplitState::MirroredOn(g).holders(4), g);
        assert!(SplitState::MirroredOn(g).outside(0) && !SplitState::MirroredOn(g).outside(3));
        assert!(SplitState::PartialOn(g, ReduceOp::Sum).is_partial());
        assert!(!SplitState::PartialOn(g, ReduceOp::Sum).suits(GgmlType::Q8_0));
        assert!(SplitState::MirroredOn(g).check_group(4).is_ok());
        assert!(SplitState::MirroredOn(g).check_group(3).is_err());
        assert!(SplitState::MirroredOn(DeviceSet::default()).check_group(3).is_err());
    }

    #[test]
    fn tensor_split_rounds_to_granules() {
        assert_eq!(split_extents(10240, &[1.0, 1.0, 1.0], 32).unwrap(), vec![3392, 3424, 3424]);
        assert_eq!(split_extents(8, &[3.0, 1.0], 1).unwrap(), vec![6, 2]);
        assert_eq!(split_extents(2, &[1.0, 1.0, 1.0, 1.0], 1).unwrap(), vec![0, 1, 0, 1]);
        assert!(split_extents(10, &[1.0], 4).is_err());
        assert!(split_extents(8, &[0.0, 0.0], 1).is_err());
        assert!(split_extents(8, &[f32::NAN], 1).is_err());
    }
}
