//! Per-device memory of a plan, known before anything is allocated (what
//! llama.cpp cannot tell for `--split-mode tensor`: "llama_params_fit is not
//! implemented for SPLIT_MODE_TENSOR").

use super::compile::Program;
use super::layout::{box_bytes, boxes};
use super::planner::Plan;
use super::state::SplitState;
use crate::backend::BufferType;
use crate::error::Result;
use crate::graph::{Context, Graph};

/// Bytes one device needs for a plan: what the executor allocates on it
/// (the store's parts of the graph's leafs and the compute arena), to
/// the byte but for the executor's 1-byte minimum per empty part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Leafs that are neither inputs nor written by the graph (weights):
    /// this device's parts, bytes.
    pub weights: u64,
    /// Leafs the graph writes through views (`cpy`, `set_rows`: KV and
    /// recurrent caches, any stored tensor a copy writes): this device's
    /// parts, bytes (counted once, however many steps read them).
    pub caches: u64,
    /// Graph inputs (`set_input` leafs: tokens, positions, masks): this
    /// device's parts, bytes.
    pub inputs: u64,
    /// The compiled program's intermediates (every local tensor that is not
    /// a stored part: activations, exchange and collective buffers, row
    /// statistics, the fresh destinations of `cast`'s scratch copies), as
    /// the graph allocator ([`crate::graph::alloc::GraphAllocator::measure`])
    /// places them with 64-byte alignment, bytes: the executor's compute
    /// arena for this graph.
    pub compute: u64,
}

impl DeviceMemory {
    /// Everything together, bytes (saturating: figures that do not fit a
    /// `u64` fit no device).
    pub fn total(&self) -> u64 {
        self.weights.saturating_add(self.caches).saturating_add(self.inputs).saturating_add(self.compute)
    }
}

impl Plan {
    /// Per-device memory of this plan for `graph` of `ctx`: weights, caches
    /// and inputs from the leafs' states, and the compute peak of the
    /// compiled per-device program (what an executor's arena holds).
    ///
    /// # Errors
    /// [`crate::Error::Split`] if the plan is for another graph; allocator
    /// errors for a subgraph that cannot be planned.
    pub fn memory(&self, ctx: &Context, graph: &Graph) -> Result<Vec<DeviceMemory>> {
        let n = self.n_devices;
        let mut out = vec![DeviceMemory::default(); n];
        let written: std::collections::HashSet<usize> = graph
            .nodes()
            .iter()
            .filter(|&&id| ctx.t(id).op.writes_through_view())
            .filter_map(|&id| ctx.t(id).view_src.map(|o| o.index()))
            .collect();
        for &l in graph.leafs() {
            let t = ctx.tensor(l)?;
            // Views share their owner's bytes; a scratch destination (`cast`)
            // is an intermediate of the program, counted with compute.
            if t.view_src.is_some() || t.flags.scratch {
                continue;
            }
            let st = self.state(l).cloned().unwrap_or(SplitState::Mirrored);
            for (j, m) in out.iter_mut().enumerate() {
                // Exactly the part the store places (granules, blocks,
                // segments); the executor allocates at least one byte for a
                // part, an empty one (a layer on another device) too.
                let b = box_bytes(t.ty, &boxes(t.ne, &st, j)).max(1) as u64;
                if t.flags.input {
                    m.inputs += b;
                } else if written.contains(&l.index()) {
                    m.caches += b;
                } else {
                    m.weights += b;
                }
            }
        }
        let bt = BufferType { name: "plan".into(), alignment: 64, max_size: usize::MAX };
        let program = Program::compile(ctx, graph, self, graph.outputs(), &vec![bt; n])?;
        for (m, c) in out.iter_mut().zip(program.compute_bytes()) {
            m.compute += c;
        }
        Ok(out)
    }
}

impl Plan {
    /// The full text report: every tensor of `graph` with its state and
    /// per-device extents along its split axis, every repartition with its
    /// bytes, per-device memory, and the bytes moved per graph run.
    ///
    /// # Errors
    /// As [`Plan::memory`].
    pub fn describe(&self, ctx: &Context, graph: &Graph) -> Result<String> {
        use std::fmt::Write as _;
        let mut s = String::from("tensors:\n");
        for &id in graph.leafs().iter().chain(graph.nodes()) {
            let t = ctx.tensor(id)?;
            let name = ctx.display_name(id);
            let st = self.state(id).cloned().unwrap_or(SplitState::Mirrored);
            let ext = match &st {
                SplitState::Split(a) => {
                    format!(" per device {:?}", (0..self.n_devices).map(|j| a.local_len(j)).collect::<Vec<_>>())
                }
                _ => String::new(),
            };
            let _ = writeln!(s, "  {:<28} {:<10} {:<24} {}{}", name, t.op.name(), t.describe(), st.label(), ext);
        }
        s.push_str(&self.report(ctx));
        s.push_str("memory per device (bytes): weights, caches, inputs, compute, total\n");
        for (j, m) in self.memory(ctx, graph)?.iter().enumerate() {
            let _ = writeln!(s, "  device {j}: {} {} {} {} {}", m.weights, m.caches, m.inputs, m.compute, m.total());
        }
        Ok(s)
    }
}
