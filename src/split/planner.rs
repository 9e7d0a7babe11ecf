//! The planner: walks a graph in order, gives every tensor a split state,
//! and where a consumer needs its input in another state records an explicit
//! repartition (the cheapest candidate under the cost model wins). Leafs get
//! their state from the [`SplitPolicy`] or explicitly; graph inputs nothing
//! covers are mirrored (the executor writes them to every device); any other
//! uncovered leaf is an error — a state is never guessed.

use super::cost::{conversion, Collective, LinkClass, LinkModel, Links, Traffic};
use super::policy::{LeafInfo, SplitPolicy};
use super::rules::{candidates, packed_view};
use super::state::{DeviceSet, SplitState};
use super::writes::{destination_kept, owner_state_after_write, scratch_copy};
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::TensorId;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

/// One inserted repartition (or distributed-row combine).
#[derive(Clone, Debug, PartialEq)]
pub struct Repartition {
    /// The tensor converted (for a combine: the node whose rows are combined).
    pub tensor: TensorId,
    /// The first node that needed it in the new state.
    pub consumer: TensorId,
    /// State before.
    pub from: SplitState,
    /// State after.
    pub to: SplitState,
    /// Collective and bytes.
    pub traffic: Traffic,
    /// The slowest link its bytes cross, when the planner knew the
    /// devices' links ([`Planner::with_links`]); `None` otherwise, or when
    /// no bytes cross a link.
    pub link: Option<LinkClass>,
}

/// A finished plan: a state per tensor of the graph and the repartitions
/// between them. Its fields are public to read; a plan is not to be changed
/// after planning: [`super::MetaExecutor`] keeps the program it compiles
/// for a plan under the plan's identity (kept by clones), so a changed plan
/// (or a changed clone) would run the program of the plan it was.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Number of devices.
    pub n_devices: usize,
    /// State of each graph tensor, indexed by [`TensorId::index`] (`None` for
    /// tensors outside the graph). Never `Unknown`.
    pub states: Vec<Option<SplitState>>,
    /// Repartitions in execution order.
    pub repartitions: Vec<Repartition>,
    /// For each node (by [`TensorId::index`]): the state each of its
    /// sources is read in, aligned with the node's `src` list.
    pub input_states: Vec<Option<Vec<SplitState>>>,
    /// The graph's structural hash.
    pub graph_hash: u64,
    /// Process-unique: what executors key the program compiled from this
    /// plan by (a plan is not changed after planning; a clone keeps it).
    pub(crate) id: u64,
}

static NEXT_PLAN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Plan {
    /// The states `node` reads its sources in (aligned with its `src` list).
    pub fn inputs_of(&self, node: TensorId) -> Option<&[SplitState]> {
        self.input_states.get(node.index()).and_then(|s| s.as_deref())
    }

    /// The state of `id` in this plan.
    pub fn state(&self, id: TensorId) -> Option<&SplitState> {
        self.states.get(id.index()).and_then(|s| s.as_ref())
    }

    /// A hash of what the plan does — the graph's structural hash, every
    /// tensor's state and the states every node reads its sources in —
    /// with the tensor split `ratios`: equal in every process that planned
    /// the same graph for the same devices (std's `DefaultHasher::new`: fixed
    /// keys, the same within one build). Processes compare it before they run a
    /// plan together.
    pub fn fingerprint(&self, ratios: &[f32]) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        (self.graph_hash, self.n_devices, &self.states, &self.input_states).hash(&mut h);
        ratios.iter().map(|r| r.to_bits()).collect::<Vec<_>>().hash(&mut h);
        h.finish()
    }

    /// Bytes received by all devices together per graph run.
    pub fn total_bytes(&self) -> u64 {
        self.repartitions.iter().map(|r| r.traffic.total_bytes).sum()
    }

    /// Per link class ([`LinkClass::ALL`] order: same process, same node,
    /// other node), the repartitions whose bytes cross it as their slowest
    /// link and their bytes. All zero for a plan made without
    /// [`Planner::with_links`]; a repartition that crosses no link is in none.
    pub fn by_link(&self) -> [(u64, u64); 3] {
        let mut out = [(0, 0); 3];
        for r in &self.repartitions {
            if let Some(c) = r.link {
                out[c as usize].0 += 1;
                out[c as usize].1 += r.traffic.total_bytes;
            }
        }
        out
    }

    /// The repartitions of one kind.
    pub fn count(&self, kind: Collective) -> usize {
        self.repartitions.iter().filter(|r| r.traffic.kind == kind).count()
    }

    /// Bytes each device holds for the graph's leafs (weights, caches,
    /// inputs) under this plan: the local slice of split leafs, all of
    /// mirrored and partial ones. Known before anything is allocated.
    ///
    /// # Errors
    /// [`Error::Split`] if the plan was made for another graph (or `graph`
    /// for another context).
    pub fn leaf_bytes_per_device(&self, ctx: &Context, graph: &Graph) -> Result<Vec<u64>> {
        self.check_graph(ctx, graph)?;
        let mut out = vec![0u64; self.n_devices];
        for &l in graph.leafs() {
            let (Ok(t), Some(st)) = (ctx.tensor(l), self.state(l)) else { continue };
            for (j, o) in out.iter_mut().enumerate() {
                *o += super::cost::part(t.data_bytes() as u64, st, j);
            }
        }
        Ok(out)
    }

    /// Checks that this plan was made for `graph` of `ctx` as it is now.
    ///
    /// # Errors
    /// [`Error::Split`] otherwise.
    pub fn check_graph(&self, ctx: &Context, graph: &Graph) -> Result<()> {
        if !graph.built_from(ctx) || self.graph_hash != graph.hash() || self.states.len() > ctx.len() {
            return Err(Error::Split { detail: "the plan was made for another graph or context".into() });
        }
        Ok(())
    }

    /// Graphviz DOT of the plan: tensors coloured by state (mirrored grey,
    /// split blue, partial orange), repartitions as red boxes on the edges
    /// they sit on. Tensors are labelled by [`Context::display_name`].
    ///
    /// # Errors
    /// As [`Plan::check_graph`].
    pub fn to_dot(&self, ctx: &Context, graph: &Graph) -> Result<String> {
        self.check_graph(ctx, graph)?;
        let mut s = String::from("digraph plan {\n  rankdir=TB;\n  node [shape=ellipse, style=filled, fontsize=10];\n");
        let label = |id: TensorId| {
            let t = ctx.t(id);
            let name = ctx.display_name(id);
            let st = self.state(id).map(|s| s.label()).unwrap_or_default();
            format!("{name}\\n{} {}\\n{st}", t.op.name(), t.describe()).replace('"', "'")
        };
        let colour = |id: TensorId| match self.state(id) {
            Some(SplitState::Split(_)) => "lightblue",
            Some(SplitState::Partial(_) | SplitState::PartialOn(..)) => "orange",
            _ => "lightgrey",
        };
        for &id in graph.leafs().iter().chain(graph.nodes()) {
            let _ = writeln!(s, "  t{} [label=\"{}\", fillcolor={}];", id.index(), label(id), colour(id));
        }
        for &n in graph.nodes() {
            for &src in &ctx.t(n).src {
                let rep =
                    self.repartitions.iter().position(|r| r.tensor == src && r.consumer == n && r.tensor != r.consumer);
                match rep {
                    Some(k) => {
                        let r = &self.repartitions[k];
                        let _ = writeln!(
                            s,
                            "  r{k} [shape=box, fillcolor=salmon, label=\"{}\\n{} B\"];\n  t{} -> r{k};\n  r{k} -> t{};",
                            r.traffic.kind.name(),
                            r.traffic.total_bytes,
                            src.index(),
                            n.index()
                        );
                    }
                    None => {
                        let _ = writeln!(s, "  t{} -> t{};", src.index(), n.index());
                    }
                }
            }
        }
        s.push_str("}\n");
        Ok(s)
    }

    /// A text report: every repartition with its bytes (and the slowest
    /// link it crosses, for a plan made with [`Planner::with_links`]), then
    /// the total (and the collectives and bytes per link class).
    /// Tensors are named by [`Context::display_name`] (an unnamed node as
    /// its op and nearest named source, `mul_mat(blk.0.ffn_up.weight)#12`).
    pub fn report(&self, ctx: &Context) -> String {
        let mut s = format!("plan over {} devices: {} repartitions\n", self.n_devices, self.repartitions.len());
        for r in &self.repartitions {
            let name = |id: TensorId| ctx.display_name(id);
            let _ = writeln!(
                s,
                "  {:<14} {:>12} B  {} {} -> {} (for {})",
                r.traffic.kind.name(),
                r.traffic.total_bytes,
                name(r.tensor),
                r.from.label(),
                r.to.label(),
                name(r.consumer)
            );
            if let Some(l) = r.link {
                s.pop();
                let _ = writeln!(s, " over {}", l.name());
            }
        }
        let _ = writeln!(s, "total: {} bytes per graph run", self.total_bytes());
        let parts: Vec<String> = LinkClass::ALL
            .iter()
            .zip(self.by_link())
            .filter(|(_, (k, _))| *k > 0)
            .map(|(c, (k, b))| format!("{}: {k} collective(s), {b} B", c.name()))
            .collect();
        if !parts.is_empty() {
            let _ = writeln!(s, "by link: {}", parts.join("; "));
        }
        s
    }
}

/// Plans graphs for N devices under a link model, caching plans by the
/// graph's structural hash and the leaf states, so a repeated decode step
/// does not re-plan.
#[derive(Debug, Default)]
pub struct Planner {
    /// Communication cost model (with [`Planner::with_links`]: for local
    /// copies and row combines; collectives are priced by their links).
    pub link: LinkModel,
    /// Each pair of devices' link ([`Planner::with_links`]).
    links: Option<Links>,
    cache: HashMap<(u64, u64), Plan>,
    /// (graph hash, policy id) → key in `cache`: a graph's hash covers its
    /// leafs' names, types and shapes, which is all a policy reads, so a
    /// step graph seen before finds its plan without asking the policy.
    known: HashMap<(u64, u64), (u64, u64)>,
}

/// Plans kept per planner; beyond it the cache starts afresh.
const MAX_PLANS: usize = 512;

impl Planner {
    /// A planner with link model `link` and an empty cache.
    pub fn new(link: LinkModel) -> Self {
        Planner { link, links: None, cache: HashMap::new(), known: HashMap::new() }
    }

    /// Prices each collective at the slowest link it crosses (`links`:
    /// every pair's class and each class's model, e.g. from
    /// [`super::Devices::links`]) rather than at [`Planner::link`], and
    /// names that link in each repartition ([`Repartition::link`]). For
    /// devices across processes and machines, where a layer boundary
    /// inside one machine costs less than one between two.
    pub fn with_links(mut self, links: Links) -> Self {
        self.links = Some(links);
        self.cache.clear();
        self.known.clear();
        self
    }

    /// The links set by [`Planner::with_links`].
    pub fn links(&self) -> Option<&Links> {
        self.links.as_ref()
    }

    /// Number of cached plans.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Like [`Planner::plan`], but returns the cached plan when a graph with
    /// the same structure and leaf states was planned before.
    ///
    /// # Errors
    /// As [`Planner::plan`].
    pub fn plan_cached(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        policy: &SplitPolicy,
        explicit: &[(TensorId, SplitState)],
    ) -> Result<&Plan> {
        let key = self.cached_key(ctx, graph, policy, explicit)?;
        self.cache.get(&key).ok_or_else(|| Error::Split { detail: "plan cache".into() })
    }

    /// [`Planner::plan_cached`] for a graph whose leafs all get their states
    /// from `policy`, found without resolving the policy again when the
    /// same graph (same structure, leaf names and shapes) was planned with
    /// the same policy before: the per-step lookup of a decode loop.
    ///
    /// # Errors
    /// As [`Planner::plan`].
    pub fn plan_for(&mut self, ctx: &Context, graph: &Graph, policy: &SplitPolicy) -> Result<&Plan> {
        let fast = (graph.hash(), {
            let [a, b, c] = self.link.key_bits();
            let l = self.links.as_ref().map_or(0, Links::key);
            policy.id() ^ a.rotate_left(17) ^ b ^ c.rotate_left(41) ^ l.rotate_left(7)
        });
        let key = match self.known.get(&fast) {
            Some(k) if self.cache.get(k).is_some_and(|p| p.check_graph(ctx, graph).is_ok()) => *k,
            _ => {
                let k = self.cached_key(ctx, graph, policy, &[])?;
                self.known.insert(fast, k);
                k
            }
        };
        self.cache.get(&key).ok_or_else(|| Error::Split { detail: "plan cache".into() })
    }

    /// Plans `graph` unless a plan with its key is cached; returns the key.
    fn cached_key(
        &mut self,
        ctx: &Context,
        graph: &Graph,
        policy: &SplitPolicy,
        explicit: &[(TensorId, SplitState)],
    ) -> Result<(u64, u64)> {
        let leaf_states = leaf_states(ctx, graph, policy, explicit)?;
        let pinned = pinned_weights(ctx, graph, policy, explicit, &leaf_states);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&leaf_states, &mut h);
        let mut pinned_sorted: Vec<usize> = pinned.iter().copied().collect();
        pinned_sorted.sort_unstable();
        std::hash::Hash::hash(&pinned_sorted, &mut h);
        std::hash::Hash::hash(&policy.n_devices(), &mut h);
        std::hash::Hash::hash(&self.link.key_bits(), &mut h);
        std::hash::Hash::hash(&self.links.as_ref().map(Links::key), &mut h);
        let key = (graph.hash(), std::hash::Hasher::finish(&h));
        if !self.cache.contains_key(&key) {
            let plan = self.plan_with_leafs(ctx, graph, policy.n_devices(), leaf_states, pinned)?;
            if self.cache.len() >= MAX_PLANS {
                self.cache.clear();
                self.known.clear();
            }
            self.cache.insert(key, plan);
        }
        Ok(key)
    }
}

impl Planner {
    /// Plans `graph` of `ctx` for `policy.n_devices()` devices. `explicit`
    /// states win over the policy for the tensors they name.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] for a graph of another context;
    /// [`Error::Split`] for a leaf no rule covers (and not an input), or a
    /// policy/explicit state that does not fit its tensor (message names the
    /// tensor and the rule).
    pub fn plan(
        &self,
        ctx: &Context,
        graph: &Graph,
        policy: &SplitPolicy,
        explicit: &[(TensorId, SplitState)],
    ) -> Result<Plan> {
        let leafs = leaf_states(ctx, graph, policy, explicit)?;
        let pinned = pinned_weights(ctx, graph, policy, explicit, &leafs);
        self.plan_with_leafs(ctx, graph, policy.n_devices(), leafs, pinned)
    }

    /// The planning walk: for each node in order, the inputs' current
    /// states, the rule's candidates (filtered), each priced, the cheapest
    /// recorded with its repartitions.
    fn plan_with_leafs(
        &self,
        ctx: &Context,
        graph: &Graph,
        n: usize,
        leafs: Vec<SplitState>,
        pinned: HashSet<usize>,
    ) -> Result<Plan> {
        self.link.validate()?;
        let mut w = Walk {
            ctx,
            graph,
            n,
            link: &self.link,
            links: self.links.as_ref(),
            states: vec![None; ctx.len()],
            input_states: vec![None; ctx.len()],
            repartitions: Vec::new(),
            have: HashMap::new(),
            written: HashMap::new(),
            readers: None,
            packed: HashSet::new(),
            pinned,
            runs_at: HashMap::new(),
            wanted: HashMap::new(),
        };
        for (&l, st) in graph.leafs().iter().zip(leafs) {
            w.states[l.index()] = Some(st);
        }
        (w.runs_at, w.wanted) = homes(ctx, graph, &w.states, n);
        for &node in graph.nodes() {
            let t = ctx.t(node);
            let cur = w.current(t);
            let scratch = scratch_copy(ctx, node);
            let cands = w.candidates(node, &cur, scratch);
            let best = cands
                .iter()
                .enumerate()
                .map(|(ci, c)| (w.price(node, c, &cur, scratch), ci))
                .filter(|(cost, _)| cost.is_finite())
                .fold(None, |best: Option<(f64, usize)>, (cost, ci)| match best {
                    Some((bc, _)) if cost >= bc => best,
                    _ => Some((cost, ci)),
                });
            let Some((_, ci)) = best else {
                return Err(Error::Split { detail: format!("no strategy for {}", t.op.name()) });
            };
            w.record(node, &cands[ci], &cur, scratch);
        }
        if let Some(i) = w.states.iter().position(|s| *s == Some(SplitState::Unknown)) {
            return Err(Error::Split { detail: format!("tensor #{i} has no state after planning") });
        }
        let id = NEXT_PLAN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Walk { states, repartitions, input_states, .. } = w;
        Ok(Plan { n_devices: n, states, repartitions, input_states, graph_hash: graph.hash(), id })
    }
}

/// The planner's state while it walks a graph's nodes.
struct Walk<'a> {
    ctx: &'a Context,
    graph: &'a Graph,
    n: usize,
    link: &'a LinkModel,
    links: Option<&'a Links>,
    /// Each tensor's state (by index) once decided.
    states: Vec<Option<SplitState>>,
    /// Each node's chosen input states.
    input_states: Vec<Option<Vec<SplitState>>>,
    repartitions: Vec<Repartition>,
    /// Conversions already done: (tensor, state) pairs available at no further cost.
    have: HashMap<usize, Vec<SplitState>>,
    /// Owners written through a view (cpy/set_rows) are in a new state afterwards.
    written: HashMap<usize, SplitState>,
    /// Readers of each node, built the first time a rule offers a packed
    /// result (only the views its rule accepts may read one).
    readers: Option<HashMap<usize, Vec<TensorId>>>,
    /// Nodes whose result is held in a device-local packing: never converted.
    packed: HashSet<usize>,
    /// Split weights the policy keeps split ([`SplitPolicy::keep_weights_split`]):
    /// converting one costs [`KEEP_SPLIT_PENALTY`] on top of its traffic.
    pinned: HashSet<usize>,
    /// Where each node runs, by the stored leafs it reads ([`homes`]).
    runs_at: HashMap<usize, Home>,
    /// Where each node's result is wanted: where its reader runs ([`homes`]).
    wanted: HashMap<usize, Home>,
}

/// Where the weights a node's result meets want it: whole on one device
/// (weights that lie whole there: a layer of `--split-mode layer`), on a
/// device group (weights split over some devices only: a layer of the
/// hybrid split, a tensor split with zero shares), or spread over all the
/// devices (weights split across them).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Home {
    On(usize),
    Group(DeviceSet),
    Spread,
}

/// Where each node runs and where its result is wanted, by index, from the
/// states of the stored leafs (`states`; graph inputs and scratch
/// destinations have none): a node reading such a leaf, directly or
/// through views of it, runs at that leaf's [`Home`] (the first map); a
/// node's result is wanted where its first reader runs, or, for a reader
/// that reads no such leaf, where that reader's result is wanted (the
/// second map; a graph output with no reader is wanted nowhere). The greedy
/// walk prices a candidate whose result is not where it is wanted with the
/// move there ([`Walk::price`]) and offers running where a node runs or is
/// wanted: without it a node whose sources lie on another device than its
/// consumers' weights would run where its sources are and move its result,
/// and the next node again.
fn homes(
    ctx: &Context,
    graph: &Graph,
    states: &[Option<SplitState>],
    n: usize,
) -> (HashMap<usize, Home>, HashMap<usize, Home>) {
    let mut home: HashMap<usize, Home> = HashMap::new();
    for &l in graph.leafs() {
        let t = ctx.t(l);
        if t.flags.input || t.flags.scratch {
            continue;
        }
        let h = match &states[l.index()] {
            Some(s) if s.sole_holder().is_some() => s.sole_holder().map(Home::On),
            Some(s) if n > 2 && s.holders(n).len() >= 2 && s.holders(n) != DeviceSet::all(n) => {
                Some(Home::Group(s.holders(n)))
            }
            Some(
                SplitState::Split(_) | SplitState::Partial(_) | SplitState::MirroredOn(_) | SplitState::PartialOn(..),
            ) => Some(Home::Spread),
            _ => None,
        };
        if let Some(h) = h {
            home.insert(l.index(), h);
        }
    }
    // Forward: a node takes the home of a stored leaf it reads, through
    // views (a shape-only node is where its parent is).
    let mut anchored: HashMap<usize, Home> = home;
    for &n in graph.nodes() {
        let t = ctx.t(n);
        let h = if t.op.is_shape_only() {
            t.src.first().and_then(|s| anchored.get(&s.index()).copied())
        } else {
            // Stored leafs and views of them (not other computed nodes).
            t.src.iter().find_map(|s| {
                let st = ctx.t(*s);
                (st.op.is_leaf() || st.op.is_shape_only()).then(|| anchored.get(&s.index()).copied()).flatten()
            })
        };
        if let Some(h) = h {
            anchored.insert(n.index(), h);
        }
    }
    // Backward: a result is wanted where its first reader runs, else where
    // that reader's result is wanted.
    let mut first_reader: HashMap<usize, TensorId> = HashMap::new();
    for &n in graph.nodes() {
        for s in &ctx.t(n).src {
            first_reader.entry(s.index()).or_insert(n);
        }
    }
    let mut wanted: HashMap<usize, Home> = HashMap::new();
    for &n in graph.nodes().iter().rev() {
        let r = first_reader.get(&n.index()).map(|r| r.index());
        if let Some(h) = r.and_then(|r| anchored.get(&r).or_else(|| wanted.get(&r)).copied()) {
            wanted.insert(n.index(), h);
        }
    }
    (anchored, wanted)
}

/// What converting a weight the policy keeps split costs the walk, in
/// seconds: more than any strategy's traffic, so every candidate that reads
/// the weight where it lies wins, yet finite, so an op with no such
/// strategy still gets a plan (the gather it needs).
const KEEP_SPLIT_PENALTY: f64 = 1e9;

impl Walk<'_> {
    /// The current state of each of `t`'s sources (a written owner's state
    /// after the write; mirrored for a tensor the walk has not seen).
    fn current(&self, t: &crate::tensor::Tensor) -> Vec<SplitState> {
        t.src
            .iter()
            .map(|s| {
                self.written
                    .get(&s.index())
                    .cloned()
                    .or_else(|| self.states[s.index()].clone())
                    .unwrap_or(SplitState::Mirrored)
            })
            .collect()
    }

    /// The rule's candidates for `node`, less those the graph around it rules
    /// out: a packed result some reader cannot read, and a partial sum
    /// written into stored state.
    fn candidates(&mut self, node: TensorId, cur: &[SplitState], scratch: bool) -> Vec<super::rules::Candidate> {
        let (ctx, t) = (self.ctx, self.ctx.t(node));
        let mut cands = candidates(ctx, t, cur, self.n);
        // Where its own or its consumer's weights lie whole on one device,
        // running there is a strategy too (first: it wins a tie).
        // The same for a device group.
        for map in [&self.wanted, &self.runs_at] {
            match map.get(&node.index()) {
                Some(&Home::On(h)) if !cands.iter().any(|c| c.output.sole_holder() == Some(h)) => {
                    if let Some(c) = super::rules::on_device(ctx, t, cur, self.n, h) {
                        cands.insert(0, c);
                    }
                }
                Some(&Home::Group(g)) => {
                    for c in super::rules::on_device_group(ctx, t, cur, self.n, g).into_iter().rev() {
                        if !cands.contains(&c) {
                            cands.insert(0, c);
                        }
                    }
                }
                _ => {}
            }
        }
        if cands.iter().any(|c| c.packed) {
            let graph = self.graph;
            let readers = self.readers.get_or_insert_with(|| readers_of(ctx, graph));
            let mine = readers.get(&node.index()).map_or(&[][..], |v| &v[..]);
            cands.retain(|c| match &c.output {
                SplitState::Split(sp) if c.packed => {
                    !mine.is_empty() && mine.iter().all(|&r| packed_view(ctx, t, ctx.t(r), sp).is_some())
                }
                _ => true,
            });
        }
        // A write into stored state does not turn its destination into a
        // partial sum (every device would write an addend into its own
        // copy of the stored tensor): the sum is reduced first. A scratch
        // destination (what `cast` makes) holds no data: it is never
        // converted, whatever state it has.
        if let Some(d) = t.op.written_src().filter(|_| !scratch) {
            if !cur.get(d).is_some_and(|c| c.is_partial() || *c == SplitState::Unknown) {
                cands.retain(|c| !c.inputs.get(d).is_some_and(SplitState::is_partial));
            }
            // A write into a mirrored stored tensor (a cache no split fits)
            // writes every device's copy: one that wrote only some devices'
            // would leave the copies apart, and the run would write the
            // whole tensor back afterwards (an all-gather of all of it, where
            // mirroring the written rows costs at most as much).
            let stored = t.view_src.is_some_and(|o| ctx.t(o).op.is_leaf());
            let here = cur.get(d).filter(|c| matches!(c, SplitState::Mirrored | SplitState::MirroredOn(_)));
            let mirrored = |c: &super::rules::Candidate| here.is_some() && c.inputs.get(d) == here;
            if stored && here.is_some() && cands.iter().any(mirrored) {
                cands.retain(mirrored);
            }
        }
        cands
    }

    /// The cost (seconds, by the link model) of candidate `c` for node `t`:
    /// its input conversions (each also losing a tie and paying a local
    /// copy), its row combine, and the later reduction of a partial result.
    /// Infinite when it would convert a packed result.
    fn price(&self, node: TensorId, c: &super::rules::Candidate, cur: &[SplitState], scratch: bool) -> f64 {
        let (n, link, t) = (self.n, self.link, self.ctx.t(node));
        let mut cost = 0.0;
        for (k, need) in c.inputs.iter().enumerate() {
            let s = t.src[k];
            if self.have.get(&s.index()).is_some_and(|v| v.contains(need))
                || cur[k] == SplitState::Unknown
                || (scratch && k == 1)
            {
                continue;
            }
            // A packed result is read only by the views its rule accepts.
            if self.packed.contains(&s.index()) && need != &cur[k] {
                return f64::INFINITY;
            }
            let bytes = self.ctx.t(s).data_bytes() as u64;
            if let Some(tr) = conversion(&cur[k], need, bytes, n) {
                if self.pinned.contains(&s.index()) {
                    cost += KEEP_SPLIT_PENALTY;
                }
                cost += self.time(&tr, &cur[k], need) + 1e-12; // any conversion loses a tie
                if tr.kind != Collective::MirroredToPartial {
                    cost += bytes as f64 / link.local_bandwidth;
                }
            }
        }
        if let Some(b) = c.combine_bytes {
            let (tr, from, to) = combine(c, b, n);
            cost += self.time(&tr, &from, &to);
        }
        // A result that lies whole on one device where its home is
        // elsewhere, or elsewhere than its home device, will be moved.
        let wanted = match self.wanted.get(&node.index()) {
            Some(Home::On(h)) if c.output.sole_holder() != Some(*h) && !c.output.is_partial() => {
                SplitState::on_device(*h, n, &t.ne)
            }
            Some(Home::Group(g)) if !on_group(&c.output, *g, n) => Some(SplitState::MirroredOn(*g)),
            Some(Home::Spread) if c.output.sole_holder().is_some() || c.output.group().is_some() => {
                Some(SplitState::Mirrored).filter(|_| !c.output.is_partial())
            }
            _ => None,
        };
        if let Some((w, tr)) =
            wanted.and_then(|w| conversion(&c.output, &w, t.data_bytes() as u64, n).map(|tr| (w, tr)))
        {
            // As an input conversion costs, and a little more: between
            // moving the sources to the home and the result from elsewhere
            // (the same bytes), the node runs at its home.
            cost += self.time(&tr, &c.output, &w) + 2e-12 + t.data_bytes() as f64 / link.local_bandwidth;
        }
        // A partial result is reduced later (an all-reduce, or the
        // reduce-scatter/all-reduce of whatever linear consumers carry
        // it to): charge that reduction now, so a greedy choice does
        // not buy a cheap gather that forces a dearer all-reduce
        // downstream (a vocabulary-split head gathered so that its
        // logits stay partial).
        if let Some(value) = match &c.output {
            SplitState::Partial(_) => Some(SplitState::Mirrored),
            SplitState::PartialOn(g, _) => Some(SplitState::MirroredOn(*g)),
            _ => None,
        } {
            if let Some(tr) = conversion(&c.output, &value, t.data_bytes() as u64, n) {
                cost += self.time(&tr, &c.output, &value);
            }
        }
        cost
    }

    /// The time of `tr` taking a tensor from `from` to `to`: at the slowest
    /// link it crosses when the links are known, else at the link model.
    fn time(&self, tr: &Traffic, from: &SplitState, to: &SplitState) -> f64 {
        match self.links {
            Some(l) => l.time(tr, from, to),
            None => tr.time(self.link),
        }
    }

    /// Records the chosen candidate `c` for `node`: the repartitions of its
    /// inputs (a deferred destination simply takes the needed state), its
    /// row combine, the written owner's state, and the node's state.
    fn record(&mut self, node: TensorId, c: &super::rules::Candidate, cur: &[SplitState], scratch: bool) {
        let (ctx, n) = (self.ctx, self.n);
        let t = ctx.t(node);
        for (k, need) in c.inputs.iter().enumerate() {
            let s = t.src[k];
            if scratch && k == 1 && cur[k] != SplitState::Unknown {
                continue;
            }
            if cur[k] == SplitState::Unknown {
                // Deferred destination: it simply is laid out as needed.
                self.states[s.index()] = Some(need.clone());
                self.have.entry(s.index()).or_default().push(need.clone());
                continue;
            }
            let list = self.have.entry(s.index()).or_default();
            if list.contains(need) {
                continue;
            }
            // A mirrored tensor read on a group only: nothing to do (the
            // other devices' copies are simply not read), nothing to report.
            let restricts = matches!((&cur[k], need), (SplitState::Mirrored, SplitState::MirroredOn(_)));
            if let Some(tr) = conversion(&cur[k], need, ctx.t(s).data_bytes() as u64, n).filter(|_| !restricts) {
                let (from, to) = (cur[k].clone(), need.clone());
                let link = self.links.and_then(|l| l.crossed(&from, &to));
                self.repartitions.push(Repartition { tensor: s, consumer: node, from, to, traffic: tr, link });
            }
            list.push(need.clone());
        }
        if let Some(b) = c.combine_bytes {
            let (traffic, from, to) = combine(c, b, n);
            self.repartitions.push(Repartition {
                tensor: node,
                consumer: node,
                from: cur[0].clone(),
                to: c.output.clone(),
                traffic,
                link: self.links.and_then(|l| l.crossed(&from, &to)),
            });
        }
        if t.op.writes_through_view() {
            let before = t.view_src.filter(|_| destination_kept(t, &c.inputs, |id| self.states[id.index()].clone()));
            let before = before.and_then(|o| self.written.get(&o.index()).or(self.states[o.index()].as_ref()).cloned());
            if let Some((o, after)) = t.view_src.zip(owner_state_after_write(ctx, t, &c.output, before.as_ref())) {
                self.have.insert(o.index(), vec![after.clone()]);
                self.written.insert(o.index(), after);
            }
        }
        if c.packed {
            self.packed.insert(node.index());
        }
        self.states[node.index()] = Some(c.output.clone());
        self.input_states[node.index()] = Some(c.inputs.clone());
        self.have.entry(node.index()).or_default().push(c.output.clone());
    }
}

/// Whether a result in state `s` is where nodes running on group `g` read
/// it without a move: mirrored everywhere or on `g`, a partial sum on `g`,
/// or a split over exactly `g`'s devices.
fn on_group(s: &SplitState, g: DeviceSet, n: usize) -> bool {
    match s {
        SplitState::Mirrored => true,
        SplitState::Split(_) => s.holders(n) == g,
        _ => s.group() == Some(g),
    }
}

/// The traffic of candidate `c`'s row combine of `total` bytes (as the
/// rules price it: `total / n` bytes of statistics per device), and the
/// states whose links it crosses: the devices holding part of the rows
/// send their statistics to those holding part of the result (every
/// device for a mirrored result, a group's for one on a group).
fn combine(c: &super::rules::Candidate, total: u64, n: usize) -> (Traffic, SplitState, SplitState) {
    let per = total / n.max(1) as u64;
    let from = c.inputs.first().cloned().unwrap_or(SplitState::Mirrored);
    let (senders, receivers) = (from.holders(n), c.output.holders(n));
    let got = |j: usize| per * (senders.len() - usize::from(senders.contains(j))) as u64;
    let traffic = Traffic {
        kind: Collective::RowCombine,
        bytes_per_device: receivers.iter().map(got).max().unwrap_or(0),
        total_bytes: receivers.iter().map(got).sum(),
        steps: 1,
    };
    (traffic, from, SplitState::mirrored_on(receivers, n))
}

/// Every node's readers in `graph` (by the reader's sources).
fn readers_of(ctx: &Context, graph: &Graph) -> HashMap<usize, Vec<TensorId>> {
    let mut r: HashMap<usize, Vec<TensorId>> = HashMap::new();
    for &node in graph.nodes() {
        for &src in &ctx.t(node).src {
            r.entry(src.index()).or_default().push(node);
        }
    }
    r
}

/// True if every reader of leaf `l` in `graph` writes into it (a `cpy` or
/// `set_rows` destination).
fn only_cpy_destination(ctx: &Context, graph: &Graph, l: TensorId) -> bool {
    let mut any = false;
    for &n in graph.nodes() {
        let t = ctx.t(n);
        for (k, &s) in t.src.iter().enumerate() {
            if s == l {
                if t.op.written_src() != Some(k) {
                    return false;
                }
                any = true;
            }
        }
    }
    any
}

/// The leafs (by index) that [`SplitPolicy::keep_weights_split`] keeps
/// split: with the option on, every leaf whose state (`states`, in
/// `graph.leafs()` order) the policy made a split, that is not a graph
/// input; none with the option off.
fn pinned_weights(
    ctx: &Context,
    graph: &Graph,
    policy: &SplitPolicy,
    explicit: &[(TensorId, SplitState)],
    states: &[SplitState],
) -> HashSet<usize> {
    if !policy.keeps_weights_split() {
        return HashSet::new();
    }
    graph
        .leafs()
        .iter()
        .zip(states)
        .filter(|(l, s)| {
            let t = ctx.t(**l);
            matches!(s, SplitState::Split(_)) && !t.flags.input && !explicit.iter().any(|(id, _)| id == *l)
        })
        .map(|(l, _)| l.index())
        .collect()
}

/// The state of every leaf of `graph` (in `graph.leafs()` order): explicit,
/// else deferred for scratch destinations (`cast`), else from the policy,
/// else mirrored for inputs, else deferred for `cpy` destinations; anything
/// else is an error.
fn leaf_states(
    ctx: &Context,
    graph: &Graph,
    policy: &SplitPolicy,
    explicit: &[(TensorId, SplitState)],
) -> Result<Vec<SplitState>> {
    graph.check_context(ctx)?;
    let n = policy.n_devices();
    for (k, (id, _)) in explicit.iter().enumerate() {
        let t = ctx.tensor(*id)?;
        if !graph.leafs().contains(id) {
            return Err(Error::Split {
                detail: format!("explicit state for {:?} {}: not a leaf of this graph", t.name, t.describe()),
            });
        }
        if explicit[..k].iter().any(|(o, _)| o == id) {
            return Err(Error::Split { detail: format!("two explicit states for {:?}", t.name) });
        }
    }
    let mut out = Vec::with_capacity(graph.leafs().len());
    for &l in graph.leafs() {
        let t = ctx.tensor(l)?;
        let st = if let Some((_, s)) = explicit.iter().find(|(id, _)| *id == l) {
            if *s == SplitState::Unknown {
                return Err(Error::Split { detail: format!("explicit state of tensor {:?} is Unknown", t.name) });
            }
            s.check_group(n)
                .map_err(|e| Error::Split { detail: format!("explicit state of tensor {:?}: {e}", t.name) })?;
            if let SplitState::Split(sp) = s {
                sp.validate(t.ne[sp.axis.min(3)], n)
                    .map_err(|e| Error::Split { detail: format!("explicit state of tensor {:?}: {e}", t.name) })?;
            }
            s.clone()
        } else {
            let from_policy = if t.flags.scratch {
                None
            } else {
                policy.state_for(&LeafInfo { name: &t.name, ne: t.ne, ty: t.ty })?
            };
            match from_policy {
                    Some(s) => s,
                    None if t.flags.input => SplitState::Mirrored,
                    // A scratch destination takes whatever layout its copy needs.
                    None if t.flags.scratch => SplitState::Unknown,
                    // A destination that only `cpy` writes (e.g. made by `cast`)
                    // takes whatever layout its copy needs.
                    None if only_cpy_destination(ctx, graph, l) => SplitState::Unknown,
                    None => {
                        return Err(Error::Split {
                            detail: format!(
                                "leaf {:?} {} is not covered by the split policy and is not an input; give it a rule or an explicit state",
                                t.name,
                                t.describe()
                            ),
                        })
                    }
                }
        };
        out.push(st);
    }
    Ok(out)
}
