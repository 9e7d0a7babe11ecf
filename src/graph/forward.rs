//! `build_forward`: the topological order of a graph (ggml's
//! `ggml_build_forward_expand`), leafs separated from nodes, use counts, and a
//! structural hash for caching plans and allocations.

use crate::error::{Error, Result};
use crate::graph::Context;
use crate::tensor::TensorId;
use std::hash::{Hash, Hasher};

/// A computation graph over one [`Context`]: nodes in execution order
/// (every source before its consumers), leafs (tensors with no op) and
/// per-tensor use counts. Read-only: only [`Context::build_forward`] makes one,
/// so a graph is always consistent with its context.
#[derive(Clone, Debug)]
pub struct Graph {
    pub(crate) ctx_id: u32,
    pub(crate) ctx_generation: u64,
    pub(crate) nodes: Vec<TensorId>,
    pub(crate) leafs: Vec<TensorId>,
    pub(crate) outputs: Vec<TensorId>,
    pub(crate) use_counts: Vec<u32>,
    pub(crate) hash: u64,
}

impl Graph {
    /// Id of the context the graph was built from.
    pub fn context_id(&self) -> u32 {
        self.ctx_id
    }

    /// True if the graph was built from `ctx` as it is now (same context,
    /// not truncated since).
    pub fn built_from(&self, ctx: &Context) -> bool {
        self.ctx_id == ctx.id() && self.ctx_generation == ctx.generation()
    }

    /// [`Graph::built_from`] as a `Result`: the one check every consumer of
    /// a graph (allocator, backends, planner) makes before reading it.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] naming the context the graph was built from,
    /// or saying the graph is stale (built before `ctx` was truncated).
    pub fn check_context(&self, ctx: &Context) -> Result<()> {
        if self.built_from(ctx) {
            return Ok(());
        }
        let detail = if self.ctx_id == ctx.id() {
            "the graph was built before the context was truncated; build it again".to_string()
        } else {
            format!("graph was built from context {}", self.ctx_id)
        };
        Err(Error::ForeignTensor { id: 0, ctx: ctx.id(), detail })
    }

    /// Op tensors in a valid execution order (every source first).
    pub fn nodes(&self) -> &[TensorId] {
        &self.nodes
    }

    /// Leaf tensors (weights, inputs, caches) reached from the outputs, in
    /// first-use order.
    pub fn leafs(&self) -> &[TensorId] {
        &self.leafs
    }

    /// The outputs `build_forward` was called with.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// Number of graph nodes that read each tensor, indexed by
    /// [`TensorId::index`] (length = context size at build time); outputs
    /// get one extra use.
    pub fn use_counts(&self) -> &[u32] {
        &self.use_counts
    }

    /// Structural hash: ops, parameters, types, shapes, strides, view
    /// offsets, wiring and leaf names; equal for two graphs built the same
    /// way (the key for cached plans and allocations).
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Number of op nodes.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// True if `id` is a node or leaf of this graph.
    pub fn contains(&self, id: TensorId) -> bool {
        id.ctx == self.ctx_id && (self.nodes.contains(&id) || self.leafs.contains(&id))
    }
}

impl Context {
    /// Builds the graph that computes `outputs` (ggml's
    /// `ggml_build_forward_expand` called on each output in turn): a
    /// depth-first post-order, sources in order, each tensor once.
    /// A view's storage owner (`view_src`) counts as a dependency.
    ///
    /// # Errors
    /// [`Error::ForeignTensor`] if an output belongs to another context;
    /// [`Error::Graph`] if `outputs` is empty.
    pub fn build_forward(&self, outputs: &[TensorId]) -> Result<Graph> {
        if outputs.is_empty() {
            return Err(Error::Graph { detail: "build_forward needs at least one output".into() });
        }
        for &o in outputs {
            self.tensor(o)?;
        }
        let n = self.len();
        let mut visited = vec![false; n];
        let mut nodes = Vec::new();
        let mut leafs = Vec::new();
        let mut use_counts = vec![0u32; n];
        // Iterative DFS (graphs of real models are deep; no recursion limits).
        for &out in outputs {
            let mut stack: Vec<(TensorId, usize)> = vec![(out, 0)];
            while let Some((id, next)) = stack.pop() {
                let i = id.index();
                if next == 0 && visited[i] {
                    continue;
                }
                let t = self.t(id);
                let deps: smallvec::SmallVec<[TensorId; 6]> =
                    t.src.iter().copied().chain(t.view_src.filter(|v| !t.src.contains(v))).collect();
                if next < deps.len() {
                    stack.push((id, next + 1));
                    let d = deps[next];
                    if !visited[d.index()] {
                        stack.push((d, 0));
                    }
                    continue;
                }
                if visited[i] {
                    continue;
                }
                visited[i] = true;
                if t.op.is_leaf() {
                    leafs.push(id);
                } else {
                    for s in t.src.iter() {
                        use_counts[s.index()] += 1;
                    }
                    nodes.push(id);
                }
            }
        }
        for &o in outputs {
            use_counts[o.index()] += 1;
        }
        let hash = self.structural_hash(&nodes, &leafs);
        Ok(Graph {
            ctx_id: self.id(),
            ctx_generation: self.generation(),
            nodes,
            leafs,
            outputs: outputs.to_vec(),
            use_counts,
            hash,
        })
    }

    /// A graph over `nodes` in the given order (the caller guarantees every
    /// source of a node is a leaf or an earlier node): leafs are the
    /// no-op sources and view owners the nodes reach, `outputs` are kept
    /// alive by an allocator. For graphs the crate builds itself (the meta
    /// backend's per-device programs, one per stage, many kept): not hashed
    /// (hash 0) and without use counts (empty; nothing reads them there).
    pub(crate) fn graph_of(&self, nodes: Vec<TensorId>, outputs: Vec<TensorId>) -> Graph {
        let mut seen = vec![false; self.len()];
        let mut leafs = Vec::new();
        for &id in &nodes {
            let t = self.t(id);
            for &s in t.src.iter().chain(t.view_src.iter()) {
                if self.t(s).op.is_leaf() && !seen[s.index()] {
                    seen[s.index()] = true;
                    leafs.push(s);
                }
            }
        }
        Graph {
            ctx_id: self.id(),
            ctx_generation: self.generation(),
            nodes,
            leafs,
            outputs,
            use_counts: Vec::new(),
            hash: 0,
        }
    }

    fn structural_hash(&self, nodes: &[TensorId], leafs: &[TensorId]) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let hash_tensor = |id: TensorId, h: &mut std::collections::hash_map::DefaultHasher| {
            let t = self.t(id);
            id.index().hash(h);
            t.ty.hash(h);
            t.ne.hash(h);
            t.nb.hash(h);
            t.op.hash_into(h);
            t.src.len().hash(h);
            for s in &t.src {
                s.index().hash(h);
            }
            t.view_src.map(|s| s.index()).hash(h);
            t.view_offs.hash(h);
        };
        for &l in leafs {
            hash_tensor(l, &mut h);
            // Split policies pick leaf states by name.
            self.t(l).name.hash(&mut h);
        }
        for &n in nodes {
            hash_tensor(n, &mut h);
        }
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::graph::Context;
    use crate::tensor::GgmlType;

    #[test]
    fn check_context_names_another_context_and_a_stale_graph() {
        let (mut a, mut b) = (Context::new(), Context::new());
        let x = a.new_tensor_1d(GgmlType::F32, 4).unwrap();
        let y = a.add(x, x).unwrap();
        let g = a.build_forward(&[y]).unwrap();
        assert!(g.check_context(&a).is_ok());
        let other = g.check_context(&b).unwrap_err();
        assert!(
            matches!(&other, Error::ForeignTensor { detail, .. } if detail == &format!("graph was built from context {}", a.id()))
        );
        b.new_tensor_1d(GgmlType::F32, 1).unwrap();
        a.truncate(1);
        let stale = g.check_context(&a).unwrap_err().to_string();
        assert!(stale.contains("built before the context was truncated"), "{stale}");
    }
}
