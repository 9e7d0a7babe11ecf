//! The planner: walks a graph in order, gives every tensor a split state,
//! and where a consumer needs its input in another state records an explicit
//! repartition (the cheapest candidate under the cost model wins). Leafs get
//! their state from the [`SplitPolicy`] or explicitly; graph inputs nothing
//! covers are mirrored (the executor writes them to every device); any other
//! uncovered leaf is an error — a state is never guessed.

use super::cost::{conversion, Collective, LinkModel, Traffic};
use super::policy::{LeafInfo, SplitPolicy};
use super::rules::candidates;
use super::state::SplitState;
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::TensorId;
use std::collections::HashMap;
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
}

/// A finished plan: a state per tensor of the graph and the repartitions
/// between them.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Number of devices.
    pub n_devices: usize,
    /// State of each graph tensor, indexed by [`TensorId::index`] (`None` for
    /// tensors outside the graph). Never `Unknown`.
    pub states: Vec<Option<SplitState>>,
    /// Repartitions in execution order.
    pub repartitions: Vec<Repartition>,
    /// The graph's structural hash.
    pub graph_hash: u64,
}

impl Plan {
    /// The state of `id` in this plan.
    pub fn state(&self, id: TensorId) -> Option<&SplitState> {
        self.states.get(id.index()).and_then(|s| s.as_ref())
    }

    /// Bytes received by all devices together per graph run.
    pub fn total_bytes(&self) -> u64 {
        self.repartitions.iter().map(|r| r.traffic.total_bytes).sum()
    }

    /// The repartitions of one kind.
    pub fn count(&self, kind: Collective) -> usize {
        self.repartitions.iter().filter(|r| r.traffic.kind == kind).count()
    }

    /// A text report: every repartition with its bytes, then the total.
    pub fn report(&self, ctx: &Context) -> String {
        let mut s = format!("plan over {} devices: {} repartitions\n", self.n_devices, self.repartitions.len());
        for r in &self.repartitions {
            let name = |id: TensorId| {
                ctx.tensor(id)
                    .map(|t| if t.name.is_empty() { format!("#{}", id.index()) } else { t.name.clone() })
                    .unwrap_or_default()
            };
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
        }
        let _ = writeln!(s, "total: {} bytes per graph run", self.total_bytes());
        s
    }
}

/// Plans graphs for N devices under a link model.
#[derive(Clone, Debug, Default)]
pub struct Planner {
    /// Communication cost model.
    pub link: LinkModel,
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
        if graph.context_id() != ctx.id() {
            return Err(Error::ForeignTensor { id: 0, ctx: ctx.id(), detail: "graph of another context".into() });
        }
        let n = policy.n_devices();
        let mut states: Vec<Option<SplitState>> = vec![None; ctx.len()];
        for &l in graph.leafs() {
            let t = ctx.tensor(l)?;
            let st = if let Some((_, s)) = explicit.iter().find(|(id, _)| *id == l) {
                if let SplitState::Split(sp) = s {
                    sp.validate(t.ne[sp.axis.min(3)], n)
                        .map_err(|e| Error::Split { detail: format!("explicit state of tensor {:?}: {e}", t.name) })?;
                }
                s.clone()
            } else {
                match policy.state_for(&LeafInfo { name: &t.name, ne: t.ne, ty: t.ty })? {
                    Some(s) => s,
                    None if t.flags.input => SplitState::Mirrored,
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
            states[l.index()] = Some(st);
        }
        let mut repartitions = Vec::new();
        // Conversions already done: (tensor, state) pairs available at no further cost.
        let mut have: HashMap<usize, Vec<SplitState>> = HashMap::new();
        for &node in graph.nodes() {
            let t = ctx.t(node);
            let cur: Vec<SplitState> =
                t.src.iter().map(|s| states[s.index()].clone().unwrap_or(SplitState::Mirrored)).collect();
            let cands = candidates(ctx, t, &cur, n);
            let mut best: Option<(f64, usize)> = None;
            for (ci, c) in cands.iter().enumerate() {
                let mut cost = 0.0;
                for (k, need) in c.inputs.iter().enumerate() {
                    let s = t.src[k];
                    if have.get(&s.index()).is_some_and(|v| v.contains(need)) || cur[k] == SplitState::Unknown {
                        continue;
                    }
                    if let Some(tr) = conversion(&cur[k], need, ctx.t(s).nbytes() as u64, n) {
                        cost += tr.time(&self.link) + 1e-12; // any conversion loses a tie
                    }
                }
                if let Some(b) = c.combine_bytes {
                    cost += combine_traffic(b, n).time(&self.link);
                }
                if best.is_none_or(|(bc, _)| cost < bc) {
                    best = Some((cost, ci));
                }
            }
            let Some((_, ci)) = best else {
                return Err(Error::Split { detail: format!("no strategy for {}", t.op.name()) });
            };
            let c = &cands[ci];
            for (k, need) in c.inputs.iter().enumerate() {
                let s = t.src[k];
                if cur[k] == SplitState::Unknown {
                    // Deferred destination: it simply is laid out as needed.
                    states[s.index()] = Some(need.clone());
                    have.entry(s.index()).or_default().push(need.clone());
                    continue;
                }
                let list = have.entry(s.index()).or_default();
                if list.contains(need) {
                    continue;
                }
                if let Some(tr) = conversion(&cur[k], need, ctx.t(s).nbytes() as u64, n) {
                    repartitions.push(Repartition {
                        tensor: s,
                        consumer: node,
                        from: cur[k].clone(),
                        to: need.clone(),
                        traffic: tr,
                    });
                }
                list.push(need.clone());
            }
            if let Some(b) = c.combine_bytes {
                repartitions.push(Repartition {
                    tensor: node,
                    consumer: node,
                    from: cur[0].clone(),
                    to: c.output.clone(),
                    traffic: combine_traffic(b, n),
                });
            }
            states[node.index()] = Some(c.output.clone());
            have.entry(node.index()).or_default().push(c.output.clone());
        }
        Ok(Plan { n_devices: n, states, repartitions, graph_hash: graph.hash() })
    }
}

/// A per-row combine: every device contributes `total / n` bytes and receives the rest.
fn combine_traffic(total: u64, n: usize) -> Traffic {
    let per = total / n.max(1) as u64;
    Traffic {
        kind: Collective::RowCombine,
        bytes_per_device: per * (n as u64).saturating_sub(1),
        total_bytes: per * (n as u64).saturating_sub(1) * n as u64,
        steps: 1,
    }
}

/// True if every reader of leaf `l` in `graph` is a `cpy` writing into it.
fn only_cpy_destination(ctx: &Context, graph: &Graph, l: TensorId) -> bool {
    let mut any = false;
    for &n in graph.nodes() {
        let t = ctx.t(n);
        for (k, &s) in t.src.iter().enumerate() {
            if s == l {
                if !(matches!(t.op, crate::ops::Op::Cpy) && k == 1) {
                    return false;
                }
                any = true;
            }
        }
    }
    any
}
