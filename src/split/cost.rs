//! The communication cost model: bytes moved by each repartition and an
//! alpha-beta time (latency per step + bytes / link bandwidth), following the
//! table in docs/split-design.md, section 4 (ring collectives).

use super::state::SplitState;

/// The repartition (collective) that turns one split state into another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// `Mirrored` → `Split`: each device keeps its slice. No traffic.
    LocalSlice,
    /// `Split` → `Mirrored`.
    AllGather,
    /// `Split(a)` → `Split(b)`.
    AllToAll,
    /// `Split` → `Split` on the same axis with other extents: only moved rows travel.
    Rebalance,
    /// `Partial` → `Mirrored`.
    AllReduce,
    /// `Partial` → `Split`.
    ReduceScatter,
    /// `Mirrored` → `Partial`: one device keeps the values, the others zero. No traffic.
    MirroredToPartial,
    /// `MirroredOn(g)` → a state that needs the value outside the group:
    /// each device outside `g` that lacks it gets a copy from one member.
    Broadcast,
    /// The small combine of a distributed per-row op (argmax, top_k,
    /// soft_max, norms, sum_rows/mean over a split row): every device's
    /// few statistics per row (8 bytes, 8·k for top_k) are all-gathered in
    /// one step and each device finishes its own part, instead of gathering
    /// the row.
    RowCombine,
}

impl Collective {
    /// The name used in plan reports (the collective names everyone uses).
    pub fn name(self) -> &'static str {
        match self {
            Collective::LocalSlice => "local-slice",
            Collective::AllGather => "all-gather",
            Collective::Broadcast => "broadcast",
            Collective::AllToAll => "all-to-all",
            Collective::Rebalance => "rebalance",
            Collective::AllReduce => "all-reduce",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::MirroredToPartial => "mirrored-to-partial",
            Collective::RowCombine => "row-combine",
        }
    }
}

/// Link model: a collective of `s` steps moving `b` bytes per device costs
/// `s · latency_s + b / bandwidth`.
///
/// The planner picks the cheapest strategy by this model alone, so it may
/// all-gather a weight the policy split (its whole bytes then sit in every
/// device's compute memory for the step) when that moves fewer bytes than
/// reducing partial sums. A caller that split weights to fit memory turns
/// that off with [`super::SplitPolicy::keep_weights_split`] (memory first:
/// split weights are read where they lie wherever an op has such a
/// strategy).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkModel {
    /// Latency per collective step, seconds (default 10 µs).
    pub latency_s: f64,
    /// Per-device link bandwidth, bytes per second (default 20 GB/s, PCIe 4.0 x16-ish).
    pub bandwidth: f64,
    /// A device's own memory bandwidth for re-laying out a tensor, bytes per
    /// second (default 10 GB/s, a host copy). Every conversion but mirrored → partial
    /// writes the tensor's new layout locally, even one that moves nothing
    /// between devices (a split that leaves all of a tensor on one device
    /// converted to another axis), so the planner charges
    /// `tensor bytes / local_bandwidth` for it.
    pub local_bandwidth: f64,
}

impl LinkModel {
    /// Checks the model: latency ≥ 0, both bandwidths > 0, all finite.
    ///
    /// # Errors
    /// [`crate::Error::Split`] naming the values.
    pub fn validate(&self) -> crate::Result<()> {
        let ok = |x: f64, min_ok: bool| x.is_finite() && (x > 0.0 || (min_ok && x == 0.0));
        if ok(self.latency_s, true) && ok(self.bandwidth, false) && ok(self.local_bandwidth, false) {
            return Ok(());
        }
        Err(crate::Error::Split {
            detail: format!(
                "link model needs latency ≥ 0 and bandwidths > 0 (finite), got {} s, {} B/s and {} B/s local",
                self.latency_s, self.bandwidth, self.local_bandwidth
            ),
        })
    }

    /// The model's values as bits, for plan cache keys.
    pub(crate) fn key_bits(&self) -> [u64; 3] {
        [self.latency_s.to_bits(), self.bandwidth.to_bits(), self.local_bandwidth.to_bits()]
    }
}

impl Default for LinkModel {
    fn default() -> Self {
        LinkModel { latency_s: 10e-6, bandwidth: 20e9, local_bandwidth: 10e9 }
    }
}

/// Which kind of link joins two devices, as the cost model prices it: the
/// planner prices a world's collectives at its slowest class
/// ([`super::Devices::link_model`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LinkClass {
    /// Two devices of one process (memcpy between threads, a peer copy or
    /// NCCL between GPUs).
    SameProcess,
    /// Devices of two processes on one machine (MPI over loopback or
    /// shared memory).
    SameNode,
    /// Devices of processes on two machines (MPI or NCCL over the network).
    OtherNode,
}

impl LinkClass {
    /// Every class, fastest first (the order of their discriminants).
    pub const ALL: [LinkClass; 3] = [LinkClass::SameProcess, LinkClass::SameNode, LinkClass::OtherNode];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::SameProcess => "same process",
            LinkClass::SameNode => "same node",
            LinkClass::OtherNode => "other node",
        }
    }

    /// The environment variable that overrides its model
    /// (`latency_µs,bandwidth_GB/s`, e.g. `40,12.5`).
    pub fn env_var(self) -> &'static str {
        match self {
            LinkClass::SameProcess => "SHARDGRAPH_LINK_SAME_PROCESS",
            LinkClass::SameNode => "SHARDGRAPH_LINK_SAME_NODE",
            LinkClass::OtherNode => "SHARDGRAPH_LINK_OTHER_NODE",
        }
    }

    /// Its default model: same process [`LinkModel::default`]; same node 25 µs
    /// and 5 GB/s per step (an exchange between two processes over TCP on
    /// loopback measured ~12 µs more than between threads here, with its
    /// message staged through host memory); other node 40 µs and 12.5 GB/s
    /// (100 Gb/s; the figure of 23–60 µs per collective across
    /// nodes).
    pub fn default_model(self) -> LinkModel {
        let base = LinkModel::default();
        match self {
            LinkClass::SameProcess => base,
            LinkClass::SameNode => LinkModel { latency_s: 25e-6, bandwidth: 5e9, ..base },
            LinkClass::OtherNode => LinkModel { latency_s: 40e-6, bandwidth: 12.5e9, ..base },
        }
    }

    /// Its model: [`LinkClass::default_model`], or its environment
    /// variable's `latency_µs,bandwidth_GB/s`.
    ///
    /// # Errors
    /// [`crate::Error::Split`] naming the variable for a value that is not
    /// two numbers or that [`LinkModel::validate`] refuses.
    pub fn model(self) -> crate::Result<LinkModel> {
        self.model_for(std::env::var(self.env_var()).ok().as_deref())
    }

    /// The model a value of its variable gives (`None`: unset, the default).
    pub(crate) fn model_for(self, value: Option<&str>) -> crate::Result<LinkModel> {
        value.map_or_else(|| Ok(self.default_model()), |v| self.parse_model(v))
    }

    /// `v` (`latency_µs,bandwidth_GB/s`) as this class's model.
    fn parse_model(self, v: &str) -> crate::Result<LinkModel> {
        let bad = || crate::Error::Split {
            detail: format!(
                "{}={v:?}: give latency in µs (finite, ≥ 0) and bandwidth in GB/s (finite, > 0), e.g. 40,12.5",
                self.env_var()
            ),
        };
        let (a, b) = v.split_once(',').ok_or_else(bad)?;
        let (lat, bw): (f64, f64) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
        // Divided by 1e6 (exact), not times 1e-6 (not exact): `25,5` is then
        // the default's 25e-6 bit for bit, as processes compare them.
        let m = LinkModel { latency_s: lat / 1e6, bandwidth: bw * 1e9, ..self.default_model() };
        m.validate().map_err(|_| bad())?;
        Ok(m)
    }
}

/// The links between a world's devices: each pair's [`LinkClass`] and each
/// class's [`LinkModel`]. With them the planner prices each collective at
/// the slowest link it crosses ([`Links::crossed`]) instead of the world's
/// slowest, and the plan report names that link ([`super::Plan::report`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Links {
    n: usize,
    /// Row-major `n × n`.
    class: Vec<LinkClass>,
    /// By class: same process, same node, other node.
    models: [LinkModel; 3],
}

impl Links {
    /// The links among `n` devices, pair `(i, j)`'s class by `class(i, j)`,
    /// each class priced by `models` (same process, same node, other node).
    ///
    /// # Errors
    /// [`crate::Error::Split`] for a model [`LinkModel::validate`] refuses.
    pub fn new(n: usize, class: impl Fn(usize, usize) -> LinkClass, models: [LinkModel; 3]) -> crate::Result<Self> {
        for m in &models {
            m.validate()?;
        }
        let class = (0..n).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| class(i, j)).collect();
        Ok(Links { n, class, models })
    }

    /// The class of the link from device `i` to device `j`
    /// ([`LinkClass::SameProcess`] out of range).
    pub fn class(&self, i: usize, j: usize) -> LinkClass {
        if i >= self.n || j >= self.n {
            return LinkClass::SameProcess;
        }
        self.class[i * self.n + j]
    }

    /// The model a class is priced with.
    pub fn model(&self, class: LinkClass) -> &LinkModel {
        &self.models[class as usize]
    }

    /// The slowest link bytes cross when a tensor goes from state `from` to
    /// `to` on these devices: over every pair for a reduction (every device
    /// takes part in the ring; a group's reduction over its members' pairs),
    /// else over the pairs where the sender holds part of what the receiver
    /// needs and lacks (a group's member serving a device outside it). `None` when nothing
    /// crosses a link (a local slice, a split that already lies where it is
    /// wanted).
    pub fn crossed(&self, from: &SplitState, to: &SplitState) -> Option<LinkClass> {
        let n = self.n;
        let pairs = (0..n).flat_map(|i| (0..n).map(move |j| (i, j))).filter(|(i, j)| i != j);
        let sends = |i: usize, j: usize| -> bool {
            match (from, to) {
                (SplitState::Mirrored, _) | (_, SplitState::Unknown) => false,
                (SplitState::Partial(_), _) | (SplitState::Unknown, _) => true,
                // Reduced among the group, then moved from a member to
                // devices outside it that need the value.
                (SplitState::PartialOn(g, _), _) => {
                    g.contains(i) && (g.contains(j) || g.server(j) == Some(i) && part(1 << 20, to, j) > 0)
                }
                // Each device outside the group is served by one member.
                (SplitState::MirroredOn(g), _) => g.server(j) == Some(i) && part(1 << 20, to, j) > 0,
                // A split holds each element on one device: what i holds of
                // j's new part, j lacks.
                (SplitState::Split(a), SplitState::Split(c)) if a.axis == c.axis => {
                    overlap(&c.ranges(j), &a.ranges(i)) > 0
                }
                (SplitState::Split(a), _) => a.local_len(i) > 0 && part(1 << 20, to, j) > 0,
            }
        };
        pairs.filter(|&(i, j)| sends(i, j)).map(|(i, j)| self.class(i, j)).max()
    }

    /// Alpha-beta time of `traffic` taking a tensor from `from` to `to`:
    /// at the model of the slowest link it crosses (none: no time).
    pub fn time(&self, traffic: &Traffic, from: &SplitState, to: &SplitState) -> f64 {
        self.crossed(from, to).map_or(0.0, |c| traffic.time(self.model(c)))
    }

    /// The values as bits, for plan cache keys.
    pub(crate) fn key(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&self.class, &mut h);
        for m in &self.models {
            std::hash::Hash::hash(&m.key_bits(), &mut h);
        }
        std::hash::Hasher::finish(&h)
    }
}

/// Traffic of one repartition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traffic {
    /// Which collective.
    pub kind: Collective,
    /// Bytes received by the busiest device.
    pub bytes_per_device: u64,
    /// Bytes received by all devices together.
    pub total_bytes: u64,
    /// Sequential steps (ring: N−1 or 2(N−1)).
    pub steps: u32,
}

impl Traffic {
    /// Alpha-beta time of this traffic under `link`, seconds.
    pub fn time(&self, link: &LinkModel) -> f64 {
        self.steps as f64 * link.latency_s + self.bytes_per_device as f64 / link.bandwidth
    }
}

/// Bytes of a `bytes`-byte tensor device `j` holds under `state` (exact:
/// the split axis divides the byte count).
pub(crate) fn part(bytes: u64, state: &SplitState, j: usize) -> u64 {
    match state {
        SplitState::Split(s) if s.axis_len() > 0 => {
            (bytes as u128 * s.local_len(j).max(0) as u128 / s.axis_len() as u128) as u64
        }
        SplitState::Split(_) => 0,
        s if s.outside(j) => 0,
        _ => bytes,
    }
}

/// Bytes of device `j`'s part under `to` that it already holds under `from`.
fn held(bytes: u64, from: &SplitState, to: &SplitState, j: usize) -> u64 {
    match (from, to) {
        (SplitState::Split(a), SplitState::Split(c)) if a.axis == c.axis => {
            let len = a.axis_len();
            if len <= 0 {
                return 0;
            }
            (bytes as u128 * overlap(&a.ranges(j), &c.ranges(j)) as u128 / len as u128) as u64
        }
        (SplitState::Split(a), SplitState::Split(c)) => {
            let (la, lc) = (a.axis_len(), c.axis_len());
            if la <= 0 || lc <= 0 {
                return 0;
            }
            (bytes as u128 * a.local_len(j) as u128 * c.local_len(j) as u128 / (la as u128 * lc as u128)) as u64
        }
        (SplitState::Split(_), _) => part(bytes, from, j),
        (SplitState::MirroredOn(_), _) if from.outside(j) => 0,
        (_, _) => part(bytes, to, j),
    }
}

/// The traffic that turns `from` into `to` for a tensor of `bytes` logical
/// bytes on `n` devices, or `None` if no conversion is needed (equal states).
/// `Unknown` on either side is treated as needing a full all-gather (it never
/// reaches a finished plan).
pub fn conversion(from: &SplitState, to: &SplitState, bytes: u64, n: usize) -> Option<Traffic> {
    if from == to || n <= 1 {
        return None;
    }
    let b = bytes as f64;
    let nn = n as f64;
    let steps = (n - 1) as u32;
    let t = |kind, per_dev: f64, total: f64, steps| Traffic {
        kind,
        bytes_per_device: per_dev.ceil() as u64,
        total_bytes: total.ceil() as u64,
        steps,
    };
    // Split/mirrored → split/mirrored: every device receives exactly the
    // elements of its new part it does not hold (exact integer bytes).
    let moved = |to: &SplitState| -> Traffic {
        let mut per = 0u64;
        let mut total = 0u64;
        for j in 0..n {
            let m = part(bytes, to, j).saturating_sub(held(bytes, from, to, j));
            per = per.max(m);
            total += m;
        }
        let kind = match (from, to) {
            (SplitState::Split(a), SplitState::Split(c)) if a.axis == c.axis => Collective::Rebalance,
            (SplitState::Split(_), SplitState::Split(_)) => Collective::AllToAll,
            (SplitState::MirroredOn(_), _) => Collective::Broadcast,
            _ => Collective::AllGather,
        };
        // Nothing to receive (a split that already leaves every element where
        // the new state wants it, e.g. all of it on one device): no link steps.
        let steps = if total == 0 {
            0
        } else if matches!(kind, Collective::Rebalance | Collective::Broadcast) {
            // Every receiver gets its copy in one step (from its own sender).
            1
        } else {
            steps
        };
        Traffic { kind, bytes_per_device: per, total_bytes: total, steps }
    };
    // An all-reduce among `m` devices: one-shot on two, else two-shot.
    let all_reduce = |m: usize| {
        let mm = m as f64;
        if m == 2 {
            t(Collective::AllReduce, b, 2.0 * b, 1)
        } else {
            t(Collective::AllReduce, 2.0 * b * (mm - 1.0) / mm, 2.0 * b * (mm - 1.0), 2 * (m as u32 - 1))
        }
    };
    let reduce_scatter = |m: usize| {
        let mm = m as f64;
        t(Collective::ReduceScatter, b * (mm - 1.0) / mm, b * (mm - 1.0), m as u32 - 1)
    };
    // One conversion after another (a group's reduction, then a move).
    let then = |a: Traffic, c: Option<Traffic>| match c {
        Some(c) => Traffic {
            kind: a.kind,
            bytes_per_device: a.bytes_per_device + c.bytes_per_device,
            total_bytes: a.total_bytes + c.total_bytes,
            steps: a.steps + c.steps,
        },
        None => a,
    };
    // The state a target is reached through from a value: a partial
    // target's mirrored form, any other target itself.
    let mirrored_form = |s: &SplitState| match s {
        SplitState::PartialOn(g, _) => SplitState::MirroredOn(*g),
        SplitState::Partial(_) => SplitState::Mirrored,
        s => s.clone(),
    };
    Some(match (from, to) {
        (SplitState::Mirrored, SplitState::Split(_) | SplitState::MirroredOn(_)) => {
            t(Collective::LocalSlice, 0.0, 0.0, 0)
        }
        (SplitState::Mirrored, SplitState::Partial(_) | SplitState::PartialOn(..)) => {
            t(Collective::MirroredToPartial, 0.0, 0.0, 0)
        }
        // A group's members already hold the value: the first keeps it.
        (SplitState::MirroredOn(g), SplitState::PartialOn(h, _)) if h.subset_of(*g) => {
            t(Collective::MirroredToPartial, 0.0, 0.0, 0)
        }
        (
            SplitState::Split(_) | SplitState::MirroredOn(_),
            SplitState::Mirrored | SplitState::Split(_) | SplitState::MirroredOn(_),
        ) => moved(to),
        (SplitState::Partial(_), SplitState::Mirrored) => all_reduce(n),
        (SplitState::Partial(_), SplitState::Split(_)) => reduce_scatter(n),
        // Reduced over every device, then kept on the group.
        (SplitState::Partial(_), SplitState::MirroredOn(_) | SplitState::PartialOn(..)) => all_reduce(n),
        (SplitState::PartialOn(g, _), SplitState::MirroredOn(h)) if g == h => all_reduce(g.len()),
        (SplitState::PartialOn(g, _), SplitState::Split(_)) if to.holders(n).subset_of(*g) => reduce_scatter(g.len()),
        // Reduced among the group, then moved from there.
        (SplitState::PartialOn(g, _), _) => {
            let on = SplitState::MirroredOn(*g);
            then(all_reduce(g.len()), conversion(&on, &mirrored_form(to), bytes, n))
        }
        // Split → Partial: gather, then keep on one device (never cheaper than the gather).
        (SplitState::Split(_) | SplitState::MirroredOn(_), SplitState::Partial(_) | SplitState::PartialOn(..)) => {
            moved(&mirrored_form(to))
        }
        // Partial → Partial of another op does not occur (one reduce op); Unknown is gathered.
        _ => t(Collective::AllGather, b * (nn - 1.0) / nn, b * (nn - 1.0), steps),
    })
}

fn overlap(a: &[(i64, i64)], b: &[(i64, i64)]) -> i64 {
    let mut n = 0;
    for &(s0, e0) in a {
        for &(s1, e1) in b {
            n += (e0.min(e1) - s0.max(s1)).max(0);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_bytes_follow_the_design_table() {
        let b = 1000u64;
        let sp = SplitState::split(0, vec![5, 5]);
        let ar = conversion(&SplitState::partial(), &SplitState::Mirrored, b, 2).unwrap();
        assert_eq!((ar.kind, ar.bytes_per_device, ar.total_bytes), (Collective::AllReduce, 1000, 2000));
        // Two devices: one-shot, one step (two-shot's bytes in half its steps);
        // more: two-shot, 2 (N−1) steps.
        assert_eq!(ar.steps, 1);
        let ar4 = conversion(&SplitState::partial(), &SplitState::Mirrored, b, 4).unwrap();
        assert_eq!((ar4.bytes_per_device, ar4.total_bytes, ar4.steps), (1500, 6000, 6));
        let ag = conversion(&sp, &SplitState::Mirrored, b, 2).unwrap();
        assert_eq!((ag.kind, ag.bytes_per_device, ag.total_bytes), (Collective::AllGather, 500, 1000));
        let rs = conversion(&SplitState::partial(), &sp, b, 4).unwrap();
        assert_eq!((rs.kind, rs.total_bytes), (Collective::ReduceScatter, 3000));
        assert_eq!(conversion(&SplitState::Mirrored, &sp, b, 2).unwrap().total_bytes, 0);
        assert!(conversion(&sp, &sp, b, 2).is_none());
        // Rebalance 5/5 → 8/2: device 0 receives 3 of 10 rows.
        let rb = conversion(&sp, &SplitState::split(0, vec![8, 2]), b, 2).unwrap();
        assert_eq!((rb.kind, rb.bytes_per_device, rb.total_bytes), (Collective::Rebalance, 300, 300));
        // Uneven gather 3:1: the small device receives 3/4.
        let ag = conversion(&SplitState::split(1, vec![6, 2]), &SplitState::Mirrored, 800, 2).unwrap();
        assert_eq!((ag.bytes_per_device, ag.total_bytes), (600, 800));
        assert!(ar.time(&LinkModel::default()) > ag.time(&LinkModel::default()) / 2.0);
    }

    #[test]
    fn a_group_reduces_among_its_members_and_serves_the_others_once() {
        use crate::split::{DeviceSet, ReduceOp};
        let (b, n) = (1000u64, 4);
        let g = DeviceSet::of([0, 2]);
        let (p, m) = (SplitState::PartialOn(g, ReduceOp::Sum), SplitState::MirroredOn(g));
        // Two members: one-shot, as two devices.
        let ar = conversion(&p, &m, b, n).unwrap();
        assert_eq!((ar.kind, ar.bytes_per_device, ar.total_bytes, ar.steps), (Collective::AllReduce, 1000, 2000, 1));
        // Reduce-scatter to a split over the members only.
        let rs = conversion(&p, &SplitState::split(0, vec![5, 0, 5, 0]), b, n).unwrap();
        assert_eq!((rs.kind, rs.total_bytes, rs.steps), (Collective::ReduceScatter, 1000, 1));
        // From the group to all: the two others receive a copy each, in one step.
        let bc = conversion(&m, &SplitState::Mirrored, b, n).unwrap();
        assert_eq!((bc.kind, bc.bytes_per_device, bc.total_bytes, bc.steps), (Collective::Broadcast, 1000, 2000, 1));
        // Reduced, then served: both.
        let both = conversion(&p, &SplitState::Mirrored, b, n).unwrap();
        assert_eq!((both.total_bytes, both.steps), (4000, 2));
        // Mirrored everywhere, read on the group: free; the whole world's sum: every device.
        assert_eq!(conversion(&SplitState::Mirrored, &m, b, n).unwrap().total_bytes, 0);
        assert_eq!(conversion(&SplitState::partial(), &m, b, n).unwrap().total_bytes, 6000);
        // Links: the group's reduction crosses only its members' pairs.
        let links = Links::new(
            4,
            |i, j| if i / 2 == j / 2 { LinkClass::SameNode } else { LinkClass::OtherNode },
            [LinkModel::default(); 3],
        )
        .unwrap();
        let near = SplitState::PartialOn(DeviceSet::of([0, 1]), ReduceOp::Sum);
        assert_eq!(links.crossed(&near, &SplitState::MirroredOn(DeviceSet::of([0, 1]))), Some(LinkClass::SameNode));
        assert_eq!(links.crossed(&p, &m), Some(LinkClass::OtherNode));
        let on = SplitState::MirroredOn(DeviceSet::of([0, 1]));
        assert_eq!(links.crossed(&on, &SplitState::MirroredOn(DeviceSet::of([2, 3]))), Some(LinkClass::OtherNode));
    }

    #[test]
    fn link_classes_are_ordered_and_their_models_parse() {
        assert!(LinkClass::SameProcess < LinkClass::SameNode && LinkClass::SameNode < LinkClass::OtherNode);
        let t = |c: LinkClass| {
            Traffic { kind: Collective::AllReduce, bytes_per_device: 8192, total_bytes: 16384, steps: 2 }
                .time(&c.default_model())
        };
        assert!(t(LinkClass::SameProcess) < t(LinkClass::SameNode) && t(LinkClass::SameNode) < t(LinkClass::OtherNode));
        let m = LinkClass::OtherNode.parse_model(" 30 , 25 ").unwrap();
        assert!((m.latency_s - 30e-6).abs() < 1e-12 && m.bandwidth == 25e9, "{m:?}");
        // The defaults written out parse to the defaults bit for bit.
        for (c, v) in [(LinkClass::SameNode, "25,5"), (LinkClass::OtherNode, "40,12.5")] {
            assert_eq!(c.parse_model(v).unwrap().key_bits(), c.default_model().key_bits(), "{v}");
        }
        for bad in ["", "30", "30,", "x,1", "1,0", "-1,1", "1,inf"] {
            let e = LinkClass::SameNode.parse_model(bad).unwrap_err().to_string();
            assert!(e.contains("SHARDGRAPH_LINK_SAME_NODE"), "{bad:?}: {e}");
        }
    }

    /// Four devices, two processes of two on two machines: 0,1 | 2,3.
    fn two_by_two() -> Links {
        let node = |j: usize| j / 2;
        let class = |i, j| if node(i) == node(j) { LinkClass::SameProcess } else { LinkClass::OtherNode };
        Links::new(4, class, LinkClass::ALL.map(LinkClass::default_model)).unwrap()
    }

    #[test]
    fn a_collective_crosses_the_slowest_link_between_the_devices_it_moves_bytes_between() {
        let l = two_by_two();
        let on = |j| SplitState::on_device(j, 4, &[8, 1, 1, 4]).unwrap();
        // Layer boundaries: inside a machine, then across.
        assert_eq!(l.crossed(&on(0), &on(1)), Some(LinkClass::SameProcess));
        assert_eq!(l.crossed(&on(1), &on(2)), Some(LinkClass::OtherNode));
        assert_eq!(l.crossed(&on(3), &on(3)), None);
        // A reduction's ring spans every device; a local slice moves nothing.
        assert_eq!(l.crossed(&SplitState::partial(), &SplitState::Mirrored), Some(LinkClass::OtherNode));
        assert_eq!(l.crossed(&SplitState::Mirrored, &SplitState::split(0, vec![2, 2, 2, 2])), None);
        // A rebalance inside the first machine's devices only.
        let (a, b) = (SplitState::split(0, vec![6, 2, 0, 0]), SplitState::split(0, vec![4, 4, 0, 0]));
        assert_eq!(l.crossed(&a, &b), Some(LinkClass::SameProcess));
        // Gathering a tensor spread over both machines crosses between them.
        assert_eq!(
            l.crossed(&SplitState::split(0, vec![2, 2, 2, 2]), &SplitState::Mirrored),
            Some(LinkClass::OtherNode)
        );
        // Priced at the crossed link's model: the same bytes cost more across machines.
        let tr = conversion(&on(0), &on(1), 4096, 4).unwrap();
        assert_eq!(l.time(&tr, &on(0), &on(1)), tr.time(&LinkClass::SameProcess.default_model()));
        let across = l.time(&tr, &on(1), &on(2));
        assert_eq!(across, tr.time(&LinkClass::OtherNode.default_model()));
        assert!(across > l.time(&tr, &on(0), &on(1)));
        assert!(Links::new(
            2,
            |_, _| LinkClass::SameProcess,
            [LinkModel { bandwidth: 0.0, ..LinkModel::default() }; 3]
        )
        .is_err());
        assert_ne!(
            l.key(),
            Links::new(4, |_, _| LinkClass::SameProcess, LinkClass::ALL.map(LinkClass::default_model)).unwrap().key()
        );
    }
}
