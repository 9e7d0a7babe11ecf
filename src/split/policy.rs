//! The split policy for leaf tensors (weights, caches, inputs), supplied by
//! the embedder: name-pattern rules and/or a callback over the tensor's name,
//! shape and type — like llama.cpp's `get_split_state` under
//! `--split-mode tensor`, with ratios as in `--tensor-split`.
//!
//! A policy only says *how* a tensor may be split (axis, granule, segments);
//! the concrete per-device extents come from the ratios and are checked
//! against the tensor: extents sum to the axis length, a block-quantized row
//! (axis 0) splits only on block boundaries, attention tensors split on whole
//! heads (granule = head size). A rule that cannot be honoured is an error
//! naming the tensor and the rule, never an abort.

use super::state::{split_extents, AxisSplit, DeviceSet, SplitState};
use crate::error::{Error, Result};
use crate::tensor::GgmlType;

/// What the policy sees of a leaf.
#[derive(Clone, Copy, Debug)]
pub struct LeafInfo<'a> {
    /// Tensor name (GGUF name for weights, e.g. `blk.3.attn_q.weight`).
    pub name: &'a str,
    /// Shape, ggml order.
    pub ne: [i64; 4],
    /// Element type.
    pub ty: GgmlType,
}

/// How a leaf is to be laid out.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitSpec {
    /// Every device holds the whole tensor.
    Mirrored,
    /// Split along `axis` by the policy's ratios.
    Axis {
        /// Axis 0..=3.
        axis: usize,
        /// Boundaries fall on multiples of this many elements (a head's
        /// size for attention weights, 1 for free splits). On axis 0 of a
        /// block-quantized tensor it must also be a multiple of the block size.
        granule: i64,
        /// Lengths of the fused parts along the axis (gate|up, Q|K|V), each
        /// split on its own; empty = one part (the whole axis).
        segments: Vec<i64>,
    },
    /// The whole tensor on device `j` (0-based, in the policy's device
    /// order) and nothing on the others: llama.cpp's `--split-mode layer`,
    /// which places each layer's weights and caches on one device. Resolves
    /// to [`SplitState::on_device`] (mirrored for a tensor with no elements).
    OnDevice(usize),
}

/// A name rule: `pattern` with `*` wildcards (any run of characters,
/// including dots), e.g. `blk.*.attn_q.weight`.
#[derive(Clone, Debug)]
pub struct SplitRule {
    /// Glob over the tensor name.
    pub pattern: String,
    /// The layout for matching tensors.
    pub spec: SplitSpec,
}

type Callback = Box<dyn Fn(&LeafInfo) -> Option<SplitSpec> + Send + Sync>;

/// Ratios plus rules and an optional callback. The callback is asked first;
/// then rules in the order added; a leaf nothing covers gets `None` (the
/// caller then states it explicitly, e.g. inputs written to every device are
/// mirrored).
pub struct SplitPolicy {
    ratios: Vec<f32>,
    rules: Vec<SplitRule>,
    callback: Option<Callback>,
    /// Memory first: the planner may not convert (gather) a split weight
    /// ([`SplitPolicy::keep_weights_split`]).
    keep_weights_split: bool,
    /// The layer count of a [`SplitPolicy::layer_split`] policy.
    layers: Option<usize>,
    /// The groups of a [`SplitPolicy::hybrid`] policy.
    hybrid: Option<Box<Hybrid>>,
    /// Process-unique, renewed by every change: what plan caches key the
    /// leaf states this policy gives by.
    id: u64,
}

static NEXT_POLICY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_policy_id() -> u64 {
    NEXT_POLICY.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl std::fmt::Debug for SplitPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitPolicy")
            .field("ratios", &self.ratios)
            .field("keep_weights_split", &self.keep_weights_split)
            .field("rules", &self.rules)
            .field("callback", &self.callback.is_some())
            .field("hybrid_groups", &self.hybrid_groups())
            .finish()
    }
}

impl SplitPolicy {
    /// A policy over `ratios.len()` devices (llama.cpp's `--tensor-split`,
    /// e.g. `[1.0, 1.0]` or `[3.0, 1.0]`).
    ///
    /// # Errors
    /// [`Error::Split`] for no ratios, more than 64 devices, negative or
    /// non-finite ratios, or all zero.
    pub fn new(ratios: &[f32]) -> Result<Self> {
        let why = if ratios.is_empty() || ratios.len() > 64 {
            Some("1 to 64 devices")
        } else if ratios.iter().any(|r| !r.is_finite()) {
            Some("a ratio is not finite")
        } else if ratios.iter().any(|r| *r < 0.0) {
            Some("a ratio is negative")
        } else if ratios.iter().all(|r| *r == 0.0) {
            Some("all ratios are zero")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(Error::Split { detail: format!("invalid tensor split ratios {ratios:?}: {why}") });
        }
        Ok(SplitPolicy {
            ratios: ratios.to_vec(),
            rules: Vec::new(),
            callback: None,
            layers: None,
            hybrid: None,
            keep_weights_split: false,
            id: next_policy_id(),
        })
    }

    /// Memory first (`keep = true`): a weight this policy splits — a leaf
    /// it gives a split state to that is not a graph input — stays split.
    /// The planner does not convert it to another state (an all-gather
    /// would hold the whole weight, or another layout of it, in every
    /// device's compute memory for the step), and chooses the strategies
    /// that read it where it lies (partial sums, row-split outputs) even
    /// when the link model ([`super::LinkModel`]) prices a gather cheaper.
    /// Only where no strategy of the op reads it in place is it still
    /// converted (correctness first); [`super::Plan::report`] lists every
    /// conversion. Off by default: the cost model alone decides.
    pub fn keep_weights_split(mut self, keep: bool) -> Self {
        self.keep_weights_split = keep;
        self.id = next_policy_id();
        self
    }

    /// Whether [`SplitPolicy::keep_weights_split`] is on.
    pub fn keeps_weights_split(&self) -> bool {
        self.keep_weights_split
    }

    /// Number of devices.
    pub fn n_devices(&self) -> usize {
        self.ratios.len()
    }

    /// The ratios.
    pub fn ratios(&self) -> &[f32] {
        &self.ratios
    }

    /// Adds a name rule (checked after the callback and earlier rules).
    pub fn rule(mut self, pattern: &str, spec: SplitSpec) -> Self {
        self.rules.push(SplitRule { pattern: pattern.to_string(), spec });
        self.id = next_policy_id();
        self
    }

    /// Sets the callback, asked before the rules; `None` from it falls through to the rules.
    pub fn with_callback(mut self, f: impl Fn(&LeafInfo) -> Option<SplitSpec> + Send + Sync + 'static) -> Self {
        self.callback = Some(Box::new(f));
        self.id = next_policy_id();
        self
    }

    /// Process-unique, renewed by every change to the policy.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The spec that covers `leaf` and where it came from (`"callback"` or the rule's pattern).
    pub fn spec_for(&self, leaf: &LeafInfo) -> Option<(SplitSpec, String)> {
        if let Some(s) = self.callback.as_ref().and_then(|f| f(leaf)) {
            return Some((s, "callback".into()));
        }
        self.rules.iter().find(|r| glob_match(&r.pattern, leaf.name)).map(|r| (r.spec.clone(), r.pattern.clone()))
    }

    /// The concrete split state of `leaf`, or `None` if nothing covers it.
    ///
    /// # Errors
    /// [`Error::Split`] naming the tensor and the rule when the rule cannot
    /// be honoured: axis out of range, granule < 1 or not dividing the
    /// axis/segments, a quantized row split off block boundaries, segments
    /// that do not sum to the axis length; for a layer or hybrid split
    /// ([`SplitPolicy::layer_split`], [`SplitPolicy::hybrid`]), a tensor of
    /// a layer numbered above the policy's `n_layer`.
    pub fn state_for(&self, leaf: &LeafInfo) -> Result<Option<SplitState>> {
        if let (Some(n), Some(il)) = (self.layers, layer_of(leaf.name)) {
            if il > n {
                return Err(Error::Split {
                    detail: format!(
                        "tensor {:?} is in layer {il}, but the layer split was made for {n} layers (0..{n}, and \
                         {n} for a next-token layer, which goes with the output): give the model's layer count",
                        leaf.name
                    ),
                });
            }
        }
        if let Some(h) = &self.hybrid {
            if let Some(st) = h.state_for(leaf, self.ratios.len())? {
                return Ok(Some(st));
            }
        }
        let Some((spec, origin)) = self.spec_for(leaf) else {
            return Ok(None);
        };
        self.resolve(leaf, &spec).map(Some).map_err(|e| Error::Split {
            detail: format!("tensor {:?} {}{:?}, rule {origin:?}: {e}", leaf.name, leaf.ty, leaf.ne),
        })
    }

    /// Turns `spec` into a state for `leaf` using the ratios.
    fn resolve(&self, leaf: &LeafInfo, spec: &SplitSpec) -> std::result::Result<SplitState, String> {
        let (axis, granule, segments) = match spec {
            SplitSpec::Mirrored => return Ok(SplitState::Mirrored),
            SplitSpec::OnDevice(j) if *j >= self.ratios.len() => {
                return Err(format!("device {j} is not one of the policy's {} devices", self.ratios.len()))
            }
            SplitSpec::OnDevice(_) if leaf.ne.contains(&0) => return Ok(SplitState::Mirrored),
            SplitSpec::OnDevice(j) => {
                return SplitState::on_device(*j, self.ratios.len(), &leaf.ne).ok_or_else(|| "no device".into())
            }
            SplitSpec::Axis { axis, granule, segments } => (*axis, *granule, segments),
        };
        if axis > 3 {
            return Err(format!("axis {axis} is not 0..=3"));
        }
        if granule < 1 {
            return Err(format!("granule {granule} must be ≥ 1"));
        }
        let bs = leaf.ty.block_size() as i64;
        if axis == 0 && granule % bs != 0 {
            return Err(format!(
                "a {} row splits only on {bs}-element block boundaries; granule {granule} is not",
                leaf.ty
            ));
        }
        let len = leaf.ne[axis];
        let parts: Vec<i64> = if segments.is_empty() { vec![len] } else { segments.clone() };
        if parts.iter().map(|&p| p as i128).sum::<i128>() != len as i128 || parts.iter().any(|&p| p < 0) {
            return Err(format!("segments {parts:?} do not sum to the axis length {len}"));
        }
        let mut segs = Vec::with_capacity(parts.len());
        for &p in &parts {
            if p % granule != 0 {
                return Err(format!("segment of {p} elements is not a whole number of granules of {granule}"));
            }
            segs.push(split_extents(p, &self.ratios, granule).map_err(|e| e.to_string())?);
        }
        let s = AxisSplit { axis, segments: segs, repeat: 1 };
        s.validate(len, self.ratios.len()).map_err(|e| e.to_string())?;
        Ok(SplitState::Split(s))
    }
}

/// How a model is spread over the devices (llama.cpp's `--split-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SplitMode {
    /// Every layer's weights split over the devices by the model's policy
    /// (`--split-mode tensor`; the default).
    #[default]
    Tensor,
    /// Each layer's weights and caches whole on one device, the devices'
    /// shares of the layers set by the tensor-split ratios
    /// ([`SplitPolicy::layer_split`]; `--split-mode layer`, llama.cpp's
    /// default multi-GPU mode).
    Layer,
    /// Tensor split inside each device group (a machine's devices), the
    /// layers shared among the groups ([`SplitPolicy::hybrid`]).
    Hybrid,
}

impl SplitMode {
    /// `tensor`, `layer` (llama.cpp's spelling of the flag's value) or `hybrid`.
    pub fn name(self) -> &'static str {
        match self {
            SplitMode::Tensor => "tensor",
            SplitMode::Layer => "layer",
            SplitMode::Hybrid => "hybrid",
        }
    }
}

/// The device llama.cpp's `--split-mode layer` gives layer `il` of a model
/// of `n_layer` repeating layers (`il == n_layer`: the output layer) under
/// the tensor-split `ratios` (llama.cpp's `llama_model::load_tensors`: the
/// first device whose cumulative share exceeds `il / (n_layer + 1)`; a
/// device with a zero ratio gets no layer).
pub fn layer_device(il: usize, n_layer: usize, ratios: &[f32]) -> usize {
    let total: f64 = ratios.iter().map(|&r| f64::from(r.max(0.0))).sum();
    let at = il as f64 / (n_layer as f64 + 1.0);
    let mut acc = 0.0;
    for (j, &r) in ratios.iter().enumerate() {
        acc += f64::from(r.max(0.0));
        if total > 0.0 && acc / total > at {
            return j;
        }
    }
    ratios.len().saturating_sub(1)
}

/// The layer a tensor named as llama.cpp names them belongs to: `blk.<il>.`
/// anywhere in the name (a weight, with any prefix), or a per-layer cache
/// `<cache>_l<il>` with an optional `_<suffix>` (`cache_k_l3`,
/// `cache_r_l3_1`); `None` otherwise. [`SplitPolicy::layer_split`] places
/// tensors by it.
pub fn layer_of(name: &str) -> Option<usize> {
    let digits = |s: &str| -> Option<(usize, usize)> {
        let n = s.bytes().take_while(u8::is_ascii_digit).count();
        (n > 0).then(|| s[..n].parse().ok().map(|v| (v, n))).flatten()
    };
    if let Some(at) = name.find("blk.") {
        let rest = &name[at + 4..];
        if let Some((il, n)) = digits(rest) {
            if rest[n..].starts_with('.') {
                return Some(il);
            }
        }
    }
    let base = name.rsplit('.').next().unwrap_or(name);
    if !base.starts_with("cache_") {
        return None;
    }
    // `cache_k_l3`, `cache_r_l3_1`: the `_`-separated part `l<digits>`.
    base.split('_')
        .skip(1)
        .find_map(|p| p.strip_prefix('l').and_then(|d| digits(d).filter(|&(_, n)| n == d.len())).map(|(il, _)| il))
}

impl SplitPolicy {
    /// llama.cpp's `--split-mode layer` over the devices of `ratios`, for a
    /// model of `n_layer` repeating layers whose tensors have llama.cpp's
    /// names: each layer's weights (`blk.<il>.*`) and caches
    /// (`cache_*_l<il>`) whole on [`layer_device`]'s device for it, the
    /// output head and final norm (`output.weight`, `output_norm.weight`) on
    /// the output layer's, the token embeddings (`token_embd.weight`) on the
    /// first device with a share ([`SplitSpec::OnDevice`]); everything else
    /// mirrored. The planner then runs each layer where its weights are and
    /// moves the activations between devices at layer boundaries. A layer
    /// numbered `n_layer` (a next-token layer, as qwen35's MTP layer) goes
    /// with the output layer; one numbered above it is an error when its
    /// state is asked ([`SplitPolicy::state_for`]: a wrong `n_layer` would
    /// otherwise pile the layers past it onto the output layer's device).
    ///
    /// # Errors
    /// [`Error::Split`] for ratios [`SplitPolicy::new`] refuses.
    pub fn layer_split(ratios: &[f32], n_layer: usize) -> Result<SplitPolicy> {
        let r = ratios.to_vec();
        let first = r.iter().position(|&x| x > 0.0).unwrap_or(0);
        let policy = SplitPolicy::new(ratios)?.with_callback(move |leaf| {
            if let Some(il) = layer_of(leaf.name) {
                return Some(SplitSpec::OnDevice(layer_device(il.min(n_layer), n_layer, &r)));
            }
            match leaf.name {
                "output.weight" | "output_norm.weight" => Some(SplitSpec::OnDevice(layer_device(n_layer, n_layer, &r))),
                "token_embd.weight" => Some(SplitSpec::OnDevice(first)),
                _ => None,
            }
        });
        let mut policy = policy.rule("*", SplitSpec::Mirrored);
        policy.layers = Some(n_layer);
        Ok(policy)
    }

    /// The layer count a [`SplitPolicy::layer_split`] policy was made for
    /// (`None` for any other policy).
    pub fn layer_split_of(&self) -> Option<usize> {
        self.layers
    }

    /// The hybrid split over device groups (tensor split inside a group,
    /// layers across groups; `--split-mode hybrid`): each group takes a
    /// share of the layers as [`layer_device`] gives them to devices, by
    /// the sum of its devices' ratios; a layer's tensors (`blk.<il>.*`,
    /// `cache_*_l<il>`) get the states `tensor` (the model's tensor-split
    /// policy) gives them over the group's devices alone (the ratios of the
    /// devices outside it set to 0), a tensor it mirrors mirrored on the
    /// group only ([`SplitState::MirroredOn`]; on a group of one device,
    /// whole there). The output head and final norm follow the output
    /// layer's group, the token embeddings the first group with a share;
    /// any other tensor is as `tensor` over all the devices says. Groups are
    /// typically one machine's devices each ([`super::Devices::groups`]), so
    /// only the hidden state crosses machines, once per group boundary. A
    /// device with a zero ratio holds nothing (as under the tensor split).
    /// Layers are named as llama.cpp names them ([`layer_of`]); one numbered
    /// `n_layer` (a next-token layer after the repeating ones, as qwen35's
    /// MTP layer) goes with the output layer's group (as
    /// [`SplitPolicy::layer_split`] places it); one numbered above it is an
    /// error when its state is asked ([`SplitPolicy::state_for`]).
    ///
    /// # Errors
    /// [`Error::Split`] for ratios [`SplitPolicy::new`] refuses, groups
    /// that are not a partition of the devices into non-empty sets, a
    /// policy from `tensor` over another device count, or what `tensor`
    /// returns.
    pub fn hybrid(
        ratios: &[f32],
        groups: &[DeviceSet],
        n_layer: usize,
        tensor: &dyn Fn(&[f32]) -> Result<SplitPolicy>,
    ) -> Result<SplitPolicy> {
        let n = ratios.len();
        let mut policy = tensor(ratios)?;
        policy.check_ratios_len(n)?;
        check_partition(groups, n)?;
        let mut parts = Vec::with_capacity(groups.len());
        for &g in groups {
            let masked: Vec<f32> = (0..n).map(|j| if g.contains(j) { ratios[j] } else { 0.0 }).collect();
            // A group with no share gets no layer; its policy is never asked.
            let p = if masked.iter().any(|&r| r > 0.0) { Some(tensor(&masked)?) } else { None };
            if let Some(p) = &p {
                p.check_ratios_len(n)?;
            }
            // Its devices with a share hold its layers; the others none.
            parts.push((g, DeviceSet::of((0..n).filter(|&j| masked[j] > 0.0)), p));
        }
        let shares: Vec<f32> = groups.iter().map(|g| g.iter().map(|j| ratios[j]).sum()).collect();
        policy.hybrid = Some(Box::new(Hybrid { parts, shares, n_layer }));
        policy.layers = Some(n_layer);
        policy.id = next_policy_id();
        Ok(policy)
    }

    /// The device groups of a [`SplitPolicy::hybrid`] policy (`None` for
    /// any other policy).
    pub fn hybrid_groups(&self) -> Option<Vec<DeviceSet>> {
        self.hybrid.as_ref().map(|h| h.parts.iter().map(|p| p.0).collect())
    }

    fn check_ratios_len(&self, n: usize) -> Result<()> {
        if self.ratios.len() != n {
            return Err(Error::Split {
                detail: format!("the tensor policy is over {} devices, the hybrid split over {n}", self.ratios.len()),
            });
        }
        Ok(())
    }
}

/// The groups of a hybrid policy: each group's device set, its devices with
/// a share, and its tensor policy (over all the devices, ratios 0 outside
/// the group; none for a group with no share), the groups' shares, the
/// layer count.
struct Hybrid {
    parts: Vec<(DeviceSet, DeviceSet, Option<SplitPolicy>)>,
    shares: Vec<f32>,
    n_layer: usize,
}

impl Hybrid {
    /// The state of a leaf that belongs to a group (a layer's, the head's,
    /// the embeddings'), `None` for any other.
    fn state_for(&self, leaf: &LeafInfo, n: usize) -> Result<Option<SplitState>> {
        let k = if let Some(il) = layer_of(leaf.name) {
            layer_device(il.min(self.n_layer), self.n_layer, &self.shares)
        } else {
            match leaf.name {
                "output.weight" | "output_norm.weight" => layer_device(self.n_layer, self.n_layer, &self.shares),
                "token_embd.weight" => self.shares.iter().position(|&s| s > 0.0).unwrap_or(0),
                _ => return Ok(None),
            }
        };
        let Some((_, g, Some(p))) = self.parts.get(k) else { return Ok(None) };
        Ok(p.state_for(leaf)?.map(|st| match st {
            SplitState::Mirrored if g.len() == 1 => {
                g.iter().next().and_then(|j| SplitState::on_device(j, n, &leaf.ne)).unwrap_or(SplitState::Mirrored)
            }
            SplitState::Mirrored => SplitState::mirrored_on(*g, n),
            st => st,
        }))
    }
}

/// Checks that `groups` split devices `0..n` into non-empty disjoint sets.
///
/// # Errors
/// [`Error::Split`] naming what is wrong.
pub(crate) fn check_partition(groups: &[DeviceSet], n: usize) -> Result<()> {
    let mut seen = DeviceSet::default();
    for g in groups {
        if g.is_empty() || !g.within(n) || g.0 & seen.0 != 0 {
            return Err(Error::Split {
                detail: format!(
                    "device groups {:?} are not a partition of devices 0..{n} (empty, out of range or overlapping)",
                    groups.iter().map(|g| g.label()).collect::<Vec<_>>()
                ),
            });
        }
        seen.0 |= g.0;
    }
    if seen != DeviceSet::all(n) {
        return Err(Error::Split { detail: format!("device groups {} leave devices of 0..{n} out", seen.label()) });
    }
    Ok(())
}

/// `*` matches any run of characters (including none and dots); everything
/// else matches itself.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = name.chars().collect();
    // Iterative wildcard matching with backtracking to the last star.
    let (mut pi, mut si) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while si < s.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            pi += 1;
            mark = si;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(name: &str, ty: GgmlType, ne: [i64; 4]) -> LeafInfo<'_> {
        LeafInfo { name, ne, ty }
    }

    #[test]
    fn hybrid_split_places_each_layer_on_a_group_and_splits_it_there() {
        // Groups {0,1} and {2}: 4 layers + output by the groups' shares 1:1.
        let tensor = |r: &[f32]| {
            Ok(SplitPolicy::new(r)?
                .rule("blk.*.ffn_up.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![] })
                .rule("*", SplitSpec::Mirrored))
        };
        let groups = [DeviceSet::of([0, 1]), DeviceSet::of([2])];
        let pol = SplitPolicy::hybrid(&[0.5, 0.5, 1.0], &groups, 4, &tensor).unwrap();
        assert_eq!(pol.hybrid_groups(), Some(groups.to_vec()));
        let st = |name: &str| pol.state_for(&leaf(name, GgmlType::F32, [4, 6, 1, 1])).unwrap().unwrap();
        let on: Vec<usize> = (0..=4).map(|il| layer_device(il, 4, &[1.0, 1.0])).collect();
        assert_eq!(on, [0, 0, 0, 1, 1]);
        // Inside group {0,1}: split by its ratios, device 2 none; mirrored on the group.
        assert_eq!(st("blk.0.ffn_up.weight"), SplitState::split(1, vec![3, 3, 0]));
        assert_eq!(st("blk.1.attn_norm.weight"), SplitState::MirroredOn(groups[0]));
        assert_eq!(st("cache_k_l2"), SplitState::MirroredOn(groups[0]));
        // A group of one device: whole there.
        assert_eq!(st("blk.3.ffn_up.weight"), SplitState::split(1, vec![0, 0, 6]));
        assert_eq!(st("blk.3.attn_norm.weight").sole_holder(), Some(2));
        assert_eq!(st("output.weight").sole_holder(), Some(2));
        assert_eq!(st("token_embd.weight"), SplitState::MirroredOn(groups[0]));
        assert_eq!(st("rope_freqs.weight"), SplitState::Mirrored);
        // A device with a zero ratio holds nothing: group {0,1} at 1:0 is device 0's.
        let zero = SplitPolicy::hybrid(&[1.0, 0.0, 1.0], &groups, 4, &tensor).unwrap();
        let z = |name: &str| zero.state_for(&leaf(name, GgmlType::F32, [4, 6, 1, 1])).unwrap().unwrap();
        assert_eq!(z("blk.0.ffn_up.weight"), SplitState::split(1, vec![6, 0, 0]));
        assert_eq!(z("blk.0.attn_norm.weight").sole_holder(), Some(0));
        // A tensor policy over another device count.
        let three = |_: &[f32]| SplitPolicy::new(&[1.0, 1.0]);
        assert!(SplitPolicy::hybrid(&[1.0, 1.0, 1.0], &groups, 4, &three).is_err());
        // Groups that are not a partition of the devices.
        for bad in [
            vec![DeviceSet::of([0, 1])],
            vec![DeviceSet::of([0, 1]), DeviceSet::of([1, 2])],
            vec![DeviceSet::of([0, 1, 2]), DeviceSet::default()],
            vec![DeviceSet::of([0, 1, 2, 3])],
        ] {
            assert!(SplitPolicy::hybrid(&[1.0, 1.0, 1.0], &bad, 4, &tensor).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn layer_split_places_each_layer_whole_as_llama_cpp_does() {
        // llama.cpp: upper_bound of il / (n_layer + 1) in the cumulative
        // shares [0.5, 1.0]: 28 layers + output over 2 devices.
        let on: Vec<usize> = (0..=28).map(|il| layer_device(il, 28, &[1.0, 1.0])).collect();
        assert_eq!(on.iter().filter(|&&d| d == 0).count(), 15);
        assert_eq!((on[14], on[15], on[28]), (0, 1, 1));
        // A zero share gets no layer; 3:1 gives the first device 3/4.
        assert!((0..=28).all(|il| layer_device(il, 28, &[1.0, 0.0, 1.0]) != 1));
        assert_eq!((0..=28).filter(|&il| layer_device(il, 28, &[3.0, 1.0]) == 0).count(), 22);
        assert_eq!(layer_of("blk.12.attn_q.weight"), Some(12));
        assert_eq!(layer_of("dflash.blk.3.ffn_up.weight"), Some(3));
        assert_eq!(layer_of("cache_k_l7"), Some(7));
        assert_eq!(layer_of("cache_r_l3_1"), Some(3));
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
        assert_eq!(layer_of("output.weight"), None);
        assert_eq!(layer_of("cache_k"), None);
        let p = SplitPolicy::layer_split(&[1.0, 1.0], 4).unwrap();
        assert_eq!(p.layer_split_of(), Some(4));
        let st = |name: &str| p.state_for(&leaf(name, GgmlType::Q4_K, [256, 8, 1, 1])).unwrap().unwrap();
        // Layers 0-2 on device 0 (2.5 of 5), layer 3 and the output on 1.
        assert_eq!(st("blk.2.attn_q.weight").sole_holder(), Some(0));
        assert_eq!(st("blk.3.attn_q.weight").sole_holder(), Some(1));
        assert_eq!(st("cache_v_l3").sole_holder(), Some(1));
        assert_eq!(st("output.weight").sole_holder(), Some(1));
        assert_eq!(st("token_embd.weight").sole_holder(), Some(0));
        assert_eq!(st("rope_freqs.weight"), SplitState::Mirrored);
        assert!(SplitPolicy::new(&[1.0]).unwrap().layer_split_of().is_none());
        // Layer n_layer (a next-token layer) goes with the output; one past
        // it is an error naming the tensor and the layer count.
        assert_eq!(st("blk.4.nextn.eh_proj.weight").sole_holder(), Some(1));
        let e = p.state_for(&leaf("blk.5.attn_q.weight", GgmlType::Q4_K, [256, 8, 1, 1])).unwrap_err().to_string();
        assert!(e.contains("blk.5.attn_q.weight") && e.contains("made for 4 layers"), "{e}");
        let groups = [DeviceSet::of([0]), DeviceSet::of([1])];
        let h = SplitPolicy::hybrid(&[1.0, 1.0], &groups, 4, &|r| SplitPolicy::new(r)).unwrap();
        assert!(h.state_for(&leaf("cache_k_l9", GgmlType::F16, [256, 8, 1, 1])).is_err());
        // A device outside the policy is an error naming the tensor.
        let bad = SplitPolicy::new(&[1.0, 1.0]).unwrap().rule("w", SplitSpec::OnDevice(2));
        assert!(bad.state_for(&leaf("w", GgmlType::F32, [4, 1, 1, 1])).is_err());
    }

    #[test]
    fn globs() {
        assert!(glob_match("blk.*.attn_q.weight", "blk.12.attn_q.weight"));
        assert!(!glob_match("blk.*.attn_q.weight", "blk.12.attn_qkv.weight"));
        assert!(glob_match("*", ""));
        assert!(glob_match("output*", "output.weight"));
        assert!(!glob_match("a*b", "acbd"));
    }

    #[test]
    fn heads_and_segments_resolve_to_extents() {
        let pol = SplitPolicy::new(&[1.0, 1.0])
            .unwrap()
            .rule("blk.*.attn_q.weight", SplitSpec::Axis { axis: 1, granule: 128, segments: vec![] })
            .rule("blk.*.ffn_up_gate.weight", SplitSpec::Axis { axis: 1, granule: 1, segments: vec![6, 6] })
            .rule("blk.*.attn_output.weight", SplitSpec::Axis { axis: 0, granule: 128, segments: vec![] })
            .rule("*norm*", SplitSpec::Mirrored);
        let q = pol.state_for(&leaf("blk.0.attn_q.weight", GgmlType::Q4_K, [5120, 8192, 1, 1])).unwrap().unwrap();
        assert_eq!(q, SplitState::split(1, vec![4096, 4096]));
        let gu = pol.state_for(&leaf("blk.0.ffn_up_gate.weight", GgmlType::F32, [8, 12, 1, 1])).unwrap().unwrap();
        assert_eq!(gu.as_split().unwrap().segments, vec![vec![3, 3], vec![3, 3]]);
        assert_eq!(
            pol.state_for(&leaf("output_norm.weight", GgmlType::F32, [8, 1, 1, 1])).unwrap(),
            Some(SplitState::Mirrored)
        );
        assert_eq!(pol.state_for(&leaf("inp_tokens", GgmlType::I32, [8, 1, 1, 1])).unwrap(), None);
        // Q4_K rows split on 128 elements: not a 256 block boundary.
        let e = pol.state_for(&leaf("blk.0.attn_output.weight", GgmlType::Q4_K, [8192, 5120, 1, 1])).unwrap_err();
        assert!(e.to_string().contains("blk.0.attn_output.weight") && e.to_string().contains("block"), "{e}");
        // 3 heads of 128 do not divide 8192.
        let e = pol.state_for(&leaf("blk.1.attn_q.weight", GgmlType::F16, [64, 100, 1, 1])).unwrap_err();
        assert!(e.to_string().contains("granules"), "{e}");
    }

    #[test]
    fn callback_first_and_bad_ratios() {
        let pol = SplitPolicy::new(&[3.0, 1.0])
            .unwrap()
            .with_callback(|l| (l.name == "x").then_some(SplitSpec::Axis { axis: 0, granule: 1, segments: vec![] }))
            .rule("*", SplitSpec::Mirrored);
        assert_eq!(
            pol.state_for(&leaf("x", GgmlType::F32, [8, 1, 1, 1])).unwrap(),
            Some(SplitState::split(0, vec![6, 2]))
        );
        assert_eq!(pol.state_for(&leaf("y", GgmlType::F32, [8, 1, 1, 1])).unwrap(), Some(SplitState::Mirrored));
        assert!(SplitPolicy::new(&[]).is_err());
        assert!(SplitPolicy::new(&[-1.0, 2.0]).is_err());
        let bad =
            SplitPolicy::new(&[1.0]).unwrap().rule("*", SplitSpec::Axis { axis: 7, granule: 1, segments: vec![] });
        assert!(bad.state_for(&leaf("z", GgmlType::F32, [8, 1, 1, 1])).is_err());
    }
}
