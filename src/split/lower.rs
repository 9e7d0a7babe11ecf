//! Lowering a [`Plan`] to the steps every device runs: per-device subgraphs
//! (runs of nodes that need no communication) separated by collective steps.
//! The executor walks the same step list on every device, so the devices
//! call their collectives in the same order.

use super::cost::Collective;
use super::planner::Plan;
use super::state::SplitState;
use super::writes::{destination_kept, owner_state_after_write, scratch_copy};
use crate::error::{Error, Result};
use crate::graph::{Context, Graph};
use crate::tensor::TensorId;
use std::collections::HashMap;
use std::fmt::Write as _;

/// One step of a lowered plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nodes every device computes over its local parts, as one local graph
    /// per device (the per-device subgraph between two collectives).
    Compute(Vec<TensorId>),
    /// A repartition of `tensor` from state `from` into state `to` through
    /// the communicator (`kind` names the collective).
    Convert {
        /// The tensor moved.
        tensor: TensorId,
        /// Its state before.
        from: SplitState,
        /// Its state after (both stay available).
        to: SplitState,
        /// The collective.
        kind: Collective,
    },
    /// A distributed per-row op over a split row: local partial results, an
    /// all-gather of a few values per row, and the local finish.
    RowCombine(TensorId),
    /// Vocabulary-parallel `get_rows`: each device looks up the rows it
    /// owns and gives zeros for the others; the result is a partial sum.
    VocabGetRows(TensorId),
    /// A write (`cpy`, `set_rows`) into a destination's storage; the
    /// destination's owner holds the written values afterwards.
    Write(TensorId),
}

/// A plan lowered to steps.
#[derive(Clone, Debug)]
pub struct Lowered {
    /// Steps in execution order.
    pub steps: Vec<Step>,
}

impl Lowered {
    /// Number of per-device subgraphs.
    pub fn n_subgraphs(&self) -> usize {
        self.steps.iter().filter(|s| matches!(s, Step::Compute(_))).count()
    }

    /// One line per step; tensors named by [`Context::display_name`] (an
    /// unnamed node as its op and nearest named source,
    /// `mul_mat(blk.0.ffn_up.weight)#12`).
    pub fn describe(&self, ctx: &Context) -> String {
        let name = |id: TensorId| ctx.display_name(id);
        let op = |id: TensorId| ctx.tensor(id).map(|t| t.op.name()).unwrap_or("?");
        let mut s = String::new();
        for st in &self.steps {
            let _ = match st {
                Step::Compute(v) => match (v.first(), v.last()) {
                    (Some(&a), Some(&b)) => {
                        writeln!(s, "subgraph of {} nodes (first {}, last {})", v.len(), name(a), name(b))
                    }
                    _ => writeln!(s, "subgraph of 0 nodes"),
                },
                Step::Convert { tensor, from, to, kind } => {
                    writeln!(s, "{} {} {} -> {}", kind.name(), name(*tensor), from.label(), to.label())
                }
                Step::RowCombine(n) => writeln!(s, "row-combine {} ({})", name(*n), op(*n)),
                Step::VocabGetRows(n) => writeln!(s, "vocab-parallel get_rows {}", name(*n)),
                Step::Write(n) => writeln!(s, "write {} ({})", name(*n), op(*n)),
            };
        }
        s
    }
}

/// True if the conversion `from` → `to` of a `ty` tensor needs no
/// communication and is done inside a subgraph by local ops: a local slice
/// of a mirrored tensor (views of this device's ranges, or the whole on a
/// group's members), or a mirrored F32/F16 tensor as a partial sum (the
/// first holder keeps it, the others zeros).
pub(crate) fn folds(from: &SplitState, to: &SplitState, ty: crate::tensor::GgmlType) -> bool {
    use crate::tensor::GgmlType;
    match (from, to) {
        (SplitState::Mirrored, SplitState::Split(_) | SplitState::MirroredOn(_)) => true,
        (SplitState::Mirrored, SplitState::Partial(_) | SplitState::PartialOn(..)) => {
            matches!(ty, GgmlType::F32 | GgmlType::F16)
        }
        _ => false,
    }
}

/// Lowers `plan` for `graph` of `ctx` to steps.
///
/// # Errors
/// [`Error::Split`] if the plan was made for another graph or lacks a node's
/// states.
pub fn lower(ctx: &Context, graph: &Graph, plan: &Plan) -> Result<Lowered> {
    if plan.graph_hash != graph.hash() || !graph.built_from(ctx) {
        return Err(Error::Split { detail: "plan was made for another graph".into() });
    }
    // A plan's fields are public: check every state fits its tensor.
    let fits = |id: TensorId, st: &SplitState| -> Result<()> {
        let t = ctx.tensor(id)?;
        match st {
            SplitState::Unknown => {
                Err(Error::Split { detail: format!("tensor #{} is Unknown in the plan", id.index()) })
            }
            SplitState::Split(s) => s.validate(t.ne[s.axis.min(3)], plan.n_devices).map_err(|e| Error::Split {
                detail: format!("plan state of tensor #{} {}: {e}", id.index(), t.describe()),
            }),
            _ => st.check_group(plan.n_devices).map_err(|e| Error::Split {
                detail: format!("plan state of tensor #{} {}: {e}", id.index(), t.describe()),
            }),
        }
    };
    for &id in graph.leafs().iter().chain(graph.nodes()) {
        let st = plan
            .state(id)
            .ok_or_else(|| Error::Split { detail: format!("tensor #{} has no planned state", id.index()) })?;
        fits(id, st)?;
    }
    for &node in graph.nodes() {
        let srcs = &ctx.t(node).src;
        match plan.inputs_of(node) {
            Some(v) if v.len() == srcs.len() => {
                for (k, st) in v.iter().enumerate() {
                    fits(srcs[k], st)?;
                }
            }
            _ => return Err(Error::Split { detail: format!("node #{} has no planned input states", node.index()) }),
        }
    }
    let state = |id: TensorId| {
        plan.state(id)
            .cloned()
            .ok_or_else(|| Error::Split { detail: format!("tensor #{} has no planned state", id.index()) })
    };
    // States each tensor is available in, the first being its current one.
    let mut avail: HashMap<usize, Vec<SplitState>> = HashMap::new();
    for &l in graph.leafs() {
        avail.insert(l.index(), vec![state(l)?]);
    }
    let combines: std::collections::HashSet<usize> = plan
        .repartitions
        .iter()
        .filter(|r| r.traffic.kind == Collective::RowCombine)
        .map(|r| r.consumer.index())
        .collect();
    let mut steps = Vec::new();
    let mut seg: Vec<TensorId> = Vec::new();
    for &node in graph.nodes() {
        let t = ctx.t(node);
        let out = state(node)?;
        let needs: Vec<SplitState> = match plan.inputs_of(node) {
            Some(v) if v.len() == t.src.len() => v.to_vec(),
            _ => return Err(Error::Split { detail: format!("node #{} has no planned input states", node.index()) }),
        };
        let scratch = scratch_copy(ctx, node);
        for (k, need) in needs.iter().enumerate() {
            let s = t.src[k];
            if scratch && k == 1 {
                // A scratch destination holds no data to convert.
                continue;
            }
            let list = avail.entry(s.index()).or_default();
            if list.contains(need) {
                continue;
            }
            let from = list.first().cloned().ok_or_else(|| Error::Split {
                detail: format!("tensor #{} is read before it is computed", s.index()),
            })?;
            list.push(need.clone());
            if folds(&from, need, ctx.t(s).ty) {
                // Done by local ops in the subgraph (or on the fly), no step.
                continue;
            }
            let kind =
                super::cost::conversion(&from, need, 1, plan.n_devices).map_or(Collective::LocalSlice, |c| c.kind);
            if !seg.is_empty() {
                steps.push(Step::Compute(std::mem::take(&mut seg)));
            }
            steps.push(Step::Convert { tensor: s, from, to: need.clone(), kind });
        }
        let special = if combines.contains(&node.index()) {
            Some(Step::RowCombine(node))
        } else if super::rules::partial_lookup(t, &needs, &out) {
            Some(Step::VocabGetRows(node))
        } else if t.op.writes_through_view() && !scratch {
            Some(Step::Write(node))
        } else {
            None
        };
        match special {
            Some(st) => {
                if !seg.is_empty() {
                    steps.push(Step::Compute(std::mem::take(&mut seg)));
                }
                steps.push(st);
            }
            None => seg.push(node),
        }
        if t.op.writes_through_view() {
            let before = t.view_src.filter(|_| destination_kept(t, &needs, |id| plan.state(id).cloned()));
            let before = before.and_then(|o| avail.get(&o.index())?.first().cloned());
            if let Some((o, after)) = t.view_src.zip(owner_state_after_write(ctx, t, &out, before.as_ref())) {
                avail.insert(o.index(), vec![after]);
            }
        }
        avail.insert(node.index(), vec![out]);
    }
    if !seg.is_empty() {
        steps.push(Step::Compute(seg));
    }
    Ok(Lowered { steps })
}
