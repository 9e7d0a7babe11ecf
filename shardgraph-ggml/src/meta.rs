//! SG over several sub-devices: the graphs ggml gives the backend run
//! tensor-parallel through shardgraph's meta backend (planner, store,
//! executor), with results equal to one device's.
//!
//! `SHARDGRAPH_DEVICES` names the sub-devices (`CPU,CPU`; the names and
//! checks of [`Devices::parse`]) and `SHARDGRAPH_TENSOR_SPLIT` their ratios
//! (`3,2,1`, [`Devices::with_tensor_split`]); bad values are an error when
//! the backend is made.
//!
//! One persistent context per backend holds the resident tensors: weights
//! (ggml buffers of usage WEIGHTS) and caches (leaves a graph writes with
//! `set_rows`/`cpy`: after their first upload they live in the store alone,
//! so ggml's `get_tensor` of a cache reads stale bytes). Each
//! new graph is translated into that context (cached by the same
//! fingerprint as the one-device path), planned (the planner caches plans
//! by structure), and run by the executor. Every other leaf (the step's
//! inputs, results of other backends' splits) is uploaded each run; the graph's outputs (nodes flagged OUTPUT, and the last node) are
//! written back where ggml's allocator put them.
//!
//! The split policy is [`crate::policy`]'s, by tensor name: feed-forward
//! and attention split as Megatron-LM (and llama.cpp) split them, the rest
//! mirrored.

use crate::ffi::ggml_tensor;
use crate::ggml::Ggml;
use crate::translate::{self, Translator};
use shardgraph::split::{Devices, MetaExecutor, Planner, SplitPolicy, SplitStore};
use shardgraph::{Context, Graph, Op, TensorId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// `GGML_BACKEND_BUFFER_USAGE_WEIGHTS`.
const USAGE_WEIGHTS: i32 = 1;
/// `GGML_TENSOR_FLAG_OUTPUT`.
const FLAG_OUTPUT: i32 = 2;

/// One translated graph of the persistent context.
struct MetaGraph {
    graph: Graph,
    /// Every leaf of the graph with its ggml tensor.
    leaves: Vec<(TensorId, *const ggml_tensor)>,
    /// What is written back to ggml's memory after a run.
    outputs: Vec<(TensorId, *const ggml_tensor)>,
}

// SAFETY: the raw ggml pointers are only read while the graph they came
// from is being computed (a cache hit means the same live tensors).
unsafe impl Send for MetaGraph {}
// SAFETY: as above.
unsafe impl Sync for MetaGraph {}

/// The meta backend behind one SG backend.
pub(crate) struct Meta {
    devices: Devices,
    /// Set when a buffer holding one of its resident tensors was freed:
    /// their addresses may now name other tensors, so the whole state
    /// starts again at the next compute (weights are uploaded anew).
    pub(crate) stale: bool,
    policy: SplitPolicy,
    /// The policy's attention rules come from the first graph translated
    /// (its layers' shapes); later graphs keep them (their weights live
    /// in the store as that policy placed them).
    policy_fixed: bool,
    planner: Planner,
    exec: MetaExecutor,
    store: SplitStore,
    ctx: Context,
    /// Resident tensors by their ggml tensor.
    resident: HashMap<*const ggml_tensor, TensorId>,
    /// Resident tensors whose bytes are in the store.
    uploaded: HashSet<TensorId>,
    /// Resident tensors not yet announced to the buffers' registry (see
    /// [`Meta::take_new_resident`]): ggml tensor, its buffer, its size.
    new_resident: Vec<(*const ggml_tensor, *const crate::ffi::ggml_backend_buffer, usize)>,
    graphs: Vec<(u128, Arc<MetaGraph>)>,
    /// The ggml tensors earlier graphs wrote back: the only results of
    /// another SG graph a graph may read (see [`Meta::translate`]).
    written_back: HashSet<*const ggml_tensor>,
    /// A description for the device ("2 sub-devices: CPU0, CPU1").
    pub(crate) description: String,
    /// Runs, and bytes the sub-devices exchanged over them.
    pub(crate) runs: u64,
    pub(crate) bytes_moved: u64,
    /// Graphs translated into `ctx` since it started, and how many it
    /// takes before it starts again ([`Meta::restart_keeping_caches`]).
    translations: usize,
    max_translations: usize,
}

/// Graphs translated into one context before it starts again (each new
/// shape adds its tensors to it, and its plan and program): llama.cpp's
/// graphs change shape with the prompt's last chunk and every 256 cache
/// cells, so a long run would otherwise grow without bound (a newcomer saw
/// 491 → 975 MB over 120 prompts of different lengths).
/// `SHARDGRAPH_GGML_MAX_GRAPHS` sets it.
const MAX_TRANSLATIONS: usize = 64;

// SAFETY: the raw pointers are keys only (compared, never dereferenced
// outside a compute of the graph they came from).
unsafe impl Send for Meta {}

impl Meta {
    /// The sub-devices from the environment, or `None` for one device.
    ///
    /// # Errors
    /// A bad `SHARDGRAPH_DEVICES`, `SHARDGRAPH_TENSOR_SPLIT` or
    /// `SHARDGRAPH_SPLIT_MODE`, or the ratios without the devices.
    pub(crate) fn from_env(threads: usize) -> Result<Option<Meta>, String> {
        let Ok(list) = std::env::var("SHARDGRAPH_DEVICES") else {
            // Ratios or a graph bound without devices would be ignored:
            // say so instead.
            for var in ["SHARDGRAPH_TENSOR_SPLIT", "SHARDGRAPH_GGML_MAX_GRAPHS"] {
                if let Ok(r) = std::env::var(var) {
                    return Err(format!("{var}={r:?} needs SHARDGRAPH_DEVICES (e.g. CPU,CPU)"));
                }
            }
            return Ok(None);
        };
        let n = list.split(',').count().max(1);
        let mut devices =
            Devices::parse(&list, (threads / n).max(1)).map_err(|e| format!("SHARDGRAPH_DEVICES: {e}"))?;
        if let Ok(r) = std::env::var("SHARDGRAPH_TENSOR_SPLIT") {
            let ratios = r
                .split(',')
                .map(|x| x.trim().parse::<f32>().map_err(|e| format!("SHARDGRAPH_TENSOR_SPLIT {r:?}: {e}")))
                .collect::<Result<Vec<f32>, String>>()?;
            devices = devices.with_tensor_split(&ratios).map_err(|e| format!("SHARDGRAPH_TENSOR_SPLIT: {e}"))?;
        }
        // llama.cpp's --split-mode values (`none` is one device: no SHARDGRAPH_DEVICES).
        match std::env::var("SHARDGRAPH_SPLIT_MODE").as_deref() {
            Err(_) | Ok("tensor") => {}
            Ok("layer") => devices = devices.with_split_mode(shardgraph::split::SplitMode::Layer),
            Ok("hybrid") => devices = devices.with_split_mode(shardgraph::split::SplitMode::Hybrid),
            Ok(other) => return Err(format!("SHARDGRAPH_SPLIT_MODE={other:?}: use layer, tensor or hybrid")),
        }
        let max_translations = match std::env::var("SHARDGRAPH_GGML_MAX_GRAPHS") {
            Err(_) => MAX_TRANSLATIONS,
            Ok(v) => v.trim().parse::<usize>().ok().filter(|&n| n >= 1).ok_or_else(|| {
                format!("SHARDGRAPH_GGML_MAX_GRAPHS={v:?}: give a whole number of graphs from 1 to {}", usize::MAX)
            })?,
        };
        let policy = crate::policy::llama_policy(&devices, &Context::new())?;
        let description = format!("{} sub-devices: {}", devices.n_devices(), devices.names().join(", "));
        Ok(Some(Meta {
            stale: false,
            store: devices.store(),
            policy,
            policy_fixed: false,
            planner: Planner::default(),
            exec: devices.executor().map_err(|e| e.to_string())?,
            devices,
            ctx: Context::new(),
            resident: HashMap::new(),
            uploaded: HashSet::new(),
            new_resident: Vec::new(),
            graphs: Vec::new(),
            written_back: HashSet::new(),
            description,
            runs: 0,
            bytes_moved: 0,
            translations: 0,
            max_translations,
        }))
    }

    /// Computes `nodes` tensor-parallel; `key` is their fingerprint.
    ///
    /// # Safety
    /// The nodes and what they reach are live ggml tensors in SG buffers.
    pub(crate) unsafe fn compute(&mut self, g: &Ggml, nodes: &[*mut ggml_tensor], key: u128) -> Result<(), String> {
        if self.stale {
            // A buffer of a resident tensor was freed: its tensors'
            // addresses may now name others. Start again (weights are
            // uploaded anew).
            self.restart()?;
        }
        let known = self.graphs.iter().any(|(k, _)| *k == key);
        if !known && self.translations >= self.max_translations {
            // SAFETY: not stale, so every resident tensor's buffer is live.
            unsafe { self.restart_keeping_caches() }?;
        }
        let mut fresh = false;
        let mg = match self.graphs.iter().find(|(k, _)| *k == key) {
            Some((_, m)) => m.clone(),
            None => {
                fresh = true;
                self.translations += 1;
                // SAFETY: the caller's promise.
                let Some(m) = (unsafe { self.translate(g, nodes) })? else { return Ok(()) };
                if !self.policy_fixed {
                    self.policy = crate::policy::llama_policy(&self.devices, &self.ctx)?;
                    self.policy_fixed = true;
                    if crate::verbose() {
                        let n = crate::policy::attention_rules(&self.ctx)
                            .iter()
                            .filter(|r| r.0.ends_with("attn_q.weight"))
                            .count();
                        eprintln!("shardgraph-ggml: attention split by KV-head groups in {n} layers");
                        let n = crate::policy::delta_rules(&self.ctx)
                            .iter()
                            .filter(|r| r.0.ends_with("ssm_out.weight"))
                            .count();
                        if n > 0 {
                            eprintln!("shardgraph-ggml: gated delta-net split by key heads in {n} layers");
                        }
                    }
                }
                let m = Arc::new(m);
                self.graphs.insert(0, (key, m.clone()));
                self.graphs.truncate(crate::CACHED);
                m
            }
        };
        let plan = self.planner.plan_for(&self.ctx, &mg.graph, &self.policy).map_err(|e| e.to_string())?;
        if fresh && crate::verbosity() >= 2 {
            eprint!("shardgraph-ggml: {}", plan.report(&self.ctx));
        }
        self.store.place_leafs(&self.ctx, &mg.graph, plan).map_err(|e| e.to_string())?;
        for &(id, t) in &mg.leaves {
            let resident = self.resident.get(&t) == Some(&id);
            if resident && self.uploaded.contains(&id) {
                continue;
            }
            let n = self.ctx.tensor(id).map_err(|e| e.to_string())?.nbytes();
            // SAFETY: live (the caller's promise).
            let bytes = unsafe { host_bytes(&*t, n) }?;
            self.store.set_tensor(&self.ctx, id, 0, &bytes).map_err(|e| e.to_string())?;
            if resident {
                self.uploaded.insert(id);
            }
        }
        let ids: Vec<TensorId> = mg.outputs.iter().map(|o| o.0).collect();
        let report = self.exec.execute(&self.ctx, &mg.graph, plan, &mut self.store, &ids).map_err(|e| e.to_string())?;
        self.runs += 1;
        self.bytes_moved += report.bytes_moved;
        for (out, &(_, t)) in report.outputs.iter().zip(&mg.outputs) {
            // SAFETY: live.
            unsafe { write_host(&*t, &out.bytes) }?;
        }
        Ok(())
    }

    /// Starts again with nothing resident: a new store and context, every
    /// graph translated and planned anew, weights and caches uploaded from
    /// ggml's memory at their next use.
    ///
    /// # Errors
    /// The executor's (a device that cannot be opened again).
    fn restart(&mut self) -> Result<(), String> {
        // The programs of the old context's graphs are never run again.
        self.exec = self.devices.executor().map_err(|e| e.to_string())?;
        self.store = self.devices.store();
        self.ctx = Context::new();
        self.resident.clear();
        self.uploaded.clear();
        self.graphs.clear();
        self.written_back.clear();
        self.planner = Planner::default();
        self.policy_fixed = false;
        self.stale = false;
        self.translations = 0;
        Ok(())
    }

    /// [`Meta::restart`] after writing every cache the graphs wrote (a
    /// resident tensor outside a weights buffer) from the store back to
    /// ggml's memory, whence the next graph uploads it: what the context
    /// held is dropped, what the caches hold is kept.
    ///
    /// # Safety
    /// Not stale: the resident tensors and their buffers are live.
    ///
    /// # Errors
    /// The store's or the buffer's (nothing is restarted then).
    unsafe fn restart_keeping_caches(&mut self) -> Result<(), String> {
        for (&t, &id) in &self.resident {
            // SAFETY: the caller's promise.
            let b = unsafe { (*t).buffer };
            // SAFETY: a live tensor's buffer.
            if !self.uploaded.contains(&id) || b.is_null() || unsafe { (*b).usage } == USAGE_WEIGHTS {
                continue;
            }
            let n = self.ctx.tensor(id).map_err(|e| e.to_string())?.nbytes();
            let mut bytes = vec![0u8; n];
            self.store.get_tensor(&self.ctx, id, 0, &mut bytes).map_err(|e| e.to_string())?;
            // SAFETY: live (the caller's promise).
            unsafe { write_host(&*t, &bytes) }?;
        }
        if crate::verbose() {
            eprintln!(
                "shardgraph-ggml: {} graphs translated: the context starts again (caches kept)",
                self.translations
            );
        }
        self.restart()
    }

    /// The resident tensors made since the last call (ggml tensor, its
    /// buffer, its bytes), for the buffers' registry: ggml's `set_tensor`,
    /// `get_tensor`, `memset_tensor` and `clear` of one of them go to the
    /// store, where its bytes live (llama.cpp saves and restores its
    /// caches through them).
    pub(crate) fn take_new_resident(
        &mut self,
    ) -> Vec<(*const ggml_tensor, *const crate::ffi::ggml_backend_buffer, usize)> {
        std::mem::take(&mut self.new_resident)
    }

    /// Writes `data` at byte `offset` of resident tensor `t` in the store;
    /// false if `t`'s bytes are not there (not resident, or not uploaded
    /// yet: its ggml memory is uploaded at its first use).
    ///
    /// # Errors
    /// The store's (a range outside the tensor).
    pub(crate) fn write_resident(&mut self, t: *const ggml_tensor, offset: usize, data: &[u8]) -> Result<bool, String> {
        let Some(&id) = self.resident.get(&t).filter(|id| self.uploaded.contains(id)) else { return Ok(false) };
        self.store.set_tensor(&self.ctx, id, offset, data).map_err(|e| e.to_string())?;
        Ok(true)
    }

    /// Reads byte `offset..` of resident tensor `t` from the store into
    /// `out`; false as [`Meta::write_resident`].
    ///
    /// # Errors
    /// The store's.
    pub(crate) fn read_resident(&self, t: *const ggml_tensor, offset: usize, out: &mut [u8]) -> Result<bool, String> {
        let Some(&id) = self.resident.get(&t).filter(|id| self.uploaded.contains(id)) else { return Ok(false) };
        self.store.get_tensor(&self.ctx, id, offset, out).map_err(|e| e.to_string())?;
        Ok(true)
    }

    /// Translates `nodes` into the persistent context.
    ///
    /// # Safety
    /// As [`Meta::compute`].
    unsafe fn translate(&mut self, g: &Ggml, nodes: &[*mut ggml_tensor]) -> Result<Option<MetaGraph>, String> {
        let ctx = std::mem::take(&mut self.ctx);
        let mut tr = Translator::within(g, ctx, self.resident.clone(), nodes);
        let mut outputs = Vec::new();
        // Every node, in ggml's order (a cache write is no ancestor of the
        // attention that reads the cache after it: build from all of them).
        let mut all = Vec::new();
        let mut last = None;
        let mut result = Ok(());
        let mut flagged_views = Vec::new();
        for &t in nodes {
            // SAFETY: live.
            let tr_ref = unsafe { &*t };
            if translate::is_shape_only(g, tr_ref) {
                if tr_ref.flags & FLAG_OUTPUT != 0 {
                    flagged_views.push(tr_ref.view_src as *const ggml_tensor);
                }
                continue;
            }
            // SAFETY: live.
            match unsafe { tr.tensor(t) } {
                Ok(id) => {
                    all.push(id);
                    if tr_ref.flags & FLAG_OUTPUT != 0 {
                        outputs.push((id, t as *const ggml_tensor));
                    }
                    last = Some((id, t as *const ggml_tensor));
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let known = self.resident.clone();
        let (ctx, map, spans) = tr.into_parts();
        self.ctx = ctx;
        result?;
        let Some(last) = last else { return Ok(None) };
        // SAFETY: live.
        unsafe { self.unread_results(g, nodes, &map, &mut outputs) }?;
        // A view or reshape the caller reads (flagged OUTPUT): its storage
        // owner, when this graph computes it (not a cache write).
        for v in flagged_views {
            let Some(&id) = map.get(&v) else { continue };
            let op = &self.ctx.tensor(id).map_err(|e| e.to_string())?.op;
            if !matches!(op, Op::None) && !op.writes_through_view() && !outputs.iter().any(|o| o.1 == v) {
                outputs.push((id, v));
            }
        }
        if !outputs.contains(&last) {
            outputs.push(last);
        }
        self.written_back.extend(outputs.iter().map(|o| o.1));
        // Leaves the graph writes (caches: `set_rows`/`cpy` destinations)
        // live in the store from their first upload on; so do weights.
        // Other leaves (inputs, results of other backends, any buffer the
        // caller fills) are uploaded every run.
        let written = written_leaves(&self.ctx, &all)?;
        let mut leaves = Vec::new();
        for (&t, &id) in &map {
            let tensor = self.ctx.tensor(id).map_err(|e| e.to_string())?;
            if !matches!(tensor.op, Op::None) {
                continue;
            }
            if known.contains_key(&t) {
                // Resident from an earlier graph (its ggml tensor need not
                // be in this one: not dereferenced).
                leaves.push((id, t));
                continue;
            }
            // SAFETY: live.
            let b = unsafe { (*t).buffer };
            // SAFETY: a live tensor's buffer.
            if !b.is_null() && (unsafe { (*b).usage } == USAGE_WEIGHTS || written.contains(&id)) {
                self.resident.insert(t, id);
                self.new_resident.push((t, b, tensor.nbytes()));
            }
            leaves.push((id, t));
        }
        // SAFETY: live.
        unsafe { self.check_earlier_results(g, &leaves) }?;
        // Strided inputs: the bytes they span, uploaded every run.
        if let Some(&(id, _)) = spans.iter().find(|s| written.contains(&s.0)) {
            return Err(format!("{:?}: a strided leaf the graph writes", self.ctx.display_name(id)));
        }
        leaves.extend(spans);
        if crate::verbose() {
            let names: Vec<String> = outputs.iter().map(|o| self.ctx.display_name(o.0)).collect();
            let n_in = leaves.iter().filter(|(id, _)| !self.resident.values().any(|r| r == id)).count();
            eprintln!(
                "shardgraph-ggml: meta graph of {} nodes, outputs {names:?}, {} leaves ({n_in} inputs)",
                nodes.len(),
                leaves.len()
            );
        }
        let graph = self.ctx.build_forward(&all).map_err(|e| e.to_string())?;
        let in_graph: HashSet<TensorId> = graph.leafs().iter().copied().collect();
        leaves.retain(|(id, _)| in_graph.contains(id));
        Ok(Some(MetaGraph { graph, leaves, outputs }))
    }
}

impl Meta {
    /// Refuses a leaf that is a node of ggml's graph (not an input, not the
    /// scheduler's copy of another backend's result): a result of an
    /// earlier SG graph of the step (llama.cpp split the step into several
    /// SG graphs: `-nkvo`, or an op SG does not take), of which only what
    /// that graph wrote back is in ggml's memory.
    ///
    /// # Safety
    /// As [`Meta::compute`]; the leaves not resident from an earlier graph
    /// are live.
    unsafe fn check_earlier_results(&self, g: &Ggml, leaves: &[(TensorId, *const ggml_tensor)]) -> Result<(), String> {
        for &(id, t) in leaves {
            if self.resident.get(&t) == Some(&id) || self.written_back.contains(&t) {
                continue;
            }
            // SAFETY: live (not a resident of an earlier graph: a leaf of this one).
            if unsafe { translate::op_name(g, &*t) != "NONE" } {
                return Err(format!(
                    "{:?} is a result of an earlier SG graph that stays on the sub-devices: over sub-devices \
                     a step must be one SG graph (llama.cpp splits it with -nkvo, or around an op SG does \
                     not take)",
                    self.ctx.display_name(id)
                ));
            }
        }
        Ok(())
    }

    /// Adds to `outputs` the results ggml's caller may read besides the
    /// nodes flagged OUTPUT and the last node: every node no other node
    /// reads (ggml's test harness reads those). Writes into a cache
    /// (`set_rows`/`cpy` results) are not copied back: the cache lives in
    /// the store. Nothing else is: ggml's allocator may have given a node's
    /// memory to a later one once its readers ran (a result another SG
    /// graph of the step reads is refused by [`Meta::translate`]).
    ///
    /// # Safety
    /// As [`Meta::compute`].
    unsafe fn unread_results(
        &self,
        g: &Ggml,
        nodes: &[*mut ggml_tensor],
        map: &HashMap<*const ggml_tensor, TensorId>,
        outputs: &mut Vec<(TensorId, *const ggml_tensor)>,
    ) -> Result<(), String> {
        let mut read = HashSet::new();
        for &n in nodes {
            // SAFETY: live.
            for &src in unsafe { &(*n).src } {
                let mut v = src as *const ggml_tensor;
                while !v.is_null() && read.insert(v) {
                    // SAFETY: live.
                    v = unsafe { (*v).view_src };
                }
            }
        }
        for &n in nodes {
            let t = n as *const ggml_tensor;
            // SAFETY: live.
            if read.contains(&t) || translate::is_shape_only(g, unsafe { &*n }) {
                continue;
            }
            let Some(&id) = map.get(&t) else { continue };
            let op = &self.ctx.tensor(id).map_err(|e| e.to_string())?.op;
            // A cast's copy writes a tensor of its own (`ggml_cast`: the
            // node is its destination), which the caller may read.
            // SAFETY: live.
            let cast = unsafe { std::ptr::eq((*t).src[1], t) };
            if (!op.writes_through_view() || cast) && !outputs.iter().any(|o| o.1 == t) {
                outputs.push((id, t));
            }
        }
        Ok(())
    }
}

/// The leaves that the nodes `all` write through views (`set_rows`/`cpy`
/// destinations: caches).
fn written_leaves(ctx: &Context, all: &[TensorId]) -> Result<HashSet<TensorId>, String> {
    let mut written = HashSet::new();
    for &id in all {
        let t = ctx.tensor(id).map_err(|e| e.to_string())?;
        if let Some(k) = t.op.written_src() {
            let mut d = t.src.get(k).copied();
            while let Some(v) = d {
                let vt = ctx.tensor(v).map_err(|e| e.to_string())?;
                if vt.view_src.is_none() {
                    written.insert(v);
                }
                d = vt.view_src;
            }
        }
    }
    Ok(written)
}

/// The `n` bytes of `t` in its SG buffer.
///
/// # Safety
/// `t` is a live tensor.
unsafe fn host_bytes(t: &ggml_tensor, n: usize) -> Result<Vec<u8>, String> {
    // SAFETY: the caller's promise.
    let (buf, off) = unsafe { crate::host_place(t) }?;
    let mut v = vec![0u8; n];
    buf.get(off, &mut v).map_err(|e| e.to_string())?;
    Ok(v)
}

/// Writes `bytes` where `t` lies in its SG buffer.
///
/// # Safety
/// `t` is a live tensor.
unsafe fn write_host(t: &ggml_tensor, bytes: &[u8]) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: the caller's promise.
    let (buf, off) = unsafe { crate::host_place(t) }?;
    buf.set(off, bytes).map_err(|e| e.to_string())
}
