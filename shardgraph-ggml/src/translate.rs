//! A ggml graph as a shardgraph graph: every ggml node becomes the
//! shardgraph op of the same ggml name, built with the core's checked
//! constructors from the node's operands and `op_params` (laid out as
//! ggml 0.25.3's `ggml.c` packs them), and then compared with the node:
//! type, shape and, where memory is bound, the very address ggml gave it.
//! Whatever does not translate exactly is an error naming the node, which
//! `supports_op` turns into "not supported" (ggml's scheduler then gives
//! the node to another backend).
//!
//! Leaves (weights, caches, inputs, results of earlier graphs) become
//! tensors placed where their bytes are: the ggml buffer they lie in and the
//! offset from its base. Shape-only ops (VIEW, RESHAPE, PERMUTE, TRANSPOSE)
//! are rebuilt from their sources wherever they appear, so a strided view of
//! a cache costs nothing and lands on the same bytes.

use crate::ffi::{ggml_tensor, GGML_MAX_SRC};
use crate::ggml::{name, Ggml};
use shardgraph::{
    Context, GgmlType, GluOp, Graph, Op, RopeMode, RopeParams, SortOrder, TensorId, TensorStorage, UnaryOp,
};
use std::collections::{HashMap, HashSet};

/// Where a ggml tensor's bytes are, in shardgraph's terms: a buffer of
/// this library and the byte offset of the tensor's first byte.
pub(crate) type Locate<'a> =
    dyn Fn(&ggml_tensor) -> Result<(std::sync::Arc<dyn shardgraph::backend::Buffer>, usize), String> + 'a;

/// A translated graph, ready to compute.
pub(crate) struct Translated {
    pub(crate) ctx: Context,
    pub(crate) graph: Graph,
    pub(crate) storage: TensorStorage,
}

/// Translates ggml tensors into one shardgraph context.
pub(crate) struct Translator<'a> {
    g: &'a Ggml,
    ctx: Context,
    map: HashMap<*const ggml_tensor, TensorId>,
    /// The nodes of the graph being translated (others are leaves).
    nodes: HashSet<*const ggml_tensor>,
    /// Binds leaves and results to their bytes; `None` for `supports_op`.
    locate: Option<&'a Locate<'a>>,
    storage: TensorStorage,
    /// Each translated tensor that is not a view in our context, with the
    /// ggml tensor it stands for (placed after translation).
    owners: Vec<(TensorId, *const ggml_tensor)>,
    /// The packed leaves that stand for strided ggml leaves (their bytes
    /// start at the ggml tensor's `data`), see [`Translator::leaf`].
    spans: Vec<(TensorId, *const ggml_tensor)>,
    /// An op ggml computes in place is the op and a copy into its source
    /// ([`Translator::in_place`]; over sub-devices, where nothing is bound
    /// to ggml's memory).
    writes_in_place: bool,
}

fn f32_param(t: &ggml_tensor, i: usize) -> f32 {
    f32::from_bits(t.op_params[i] as u32)
}

/// `t`'s name (up to its NUL).
pub(crate) fn tensor_name(t: &ggml_tensor) -> String {
    let bytes: Vec<u8> = t.name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// ggml's name of `t`'s op ("MUL_MAT", "UNARY", …).
pub(crate) fn op_name(g: &Ggml, t: &ggml_tensor) -> String {
    // SAFETY: ggml_op_name accepts any op value of a tensor ggml made.
    name(unsafe { (g.op_name)(t.op) })
}

/// A fingerprint of everything translating `nodes` reads: each node's and
/// each source's (and view chain's) address, type, op, parameters, shape,
/// strides, data address and buffer (with `base_of` its base address), and
/// `generation` (bumped whenever a buffer is freed). Two graphs with the
/// same fingerprint translate to the same program on the same bytes, so a
/// decode step replays the translation of the step before it (llama.cpp
/// reuses its graph objects between steps of one shape).
///
/// # Safety
/// Every node and every tensor it reaches are live.
pub(crate) unsafe fn fingerprint(
    nodes: &[*mut ggml_tensor],
    generation: u64,
    base_of: &dyn Fn(*mut crate::ffi::ggml_backend_buffer) -> usize,
) -> u128 {
    use std::hash::{Hash, Hasher};
    // Two differently seeded 64-bit hashes: 128 bits against collisions.
    let (mut h, mut h2) =
        (std::collections::hash_map::DefaultHasher::new(), std::collections::hash_map::DefaultHasher::new());
    0x5347_u64.hash(&mut h2);
    generation.hash(&mut h);
    let one = |h: &mut std::collections::hash_map::DefaultHasher, t: *const ggml_tensor| {
        // SAFETY: the caller's promise.
        let r = unsafe { &*t };
        (t as usize, r.type_, r.op, r.op_params, r.ne, r.nb, r.data as usize).hash(h);
        (r.view_src as usize, r.view_offs, r.buffer as usize, base_of(r.buffer)).hash(h);
    };
    let mut material = Vec::new();
    for &n in nodes {
        material.push(n as *const ggml_tensor);
        // SAFETY: as above.
        for &s in unsafe { &(*n).src } {
            let mut v = s as *const ggml_tensor;
            let mut depth = 0;
            while !v.is_null() && depth < 8 {
                material.push(v);
                // SAFETY: as above.
                v = unsafe { (*v).view_src };
                depth += 1;
            }
            material.push(std::ptr::null());
        }
    }
    for &t in &material {
        for h in [&mut h, &mut h2] {
            if t.is_null() {
                usize::MAX.hash(h);
            } else {
                one(h, t);
            }
        }
    }
    (h.finish() as u128) << 64 | h2.finish() as u128
}

/// True for ggml's shape-only ops (VIEW, RESHAPE, PERMUTE, TRANSPOSE),
/// which compute nothing.
pub(crate) fn is_shape_only(g: &Ggml, t: &ggml_tensor) -> bool {
    matches!(op_name(g, t).as_str(), "VIEW" | "RESHAPE" | "PERMUTE" | "TRANSPOSE")
}

/// The strides of a packed tensor of type `ty` and shape `ne` (ggml's
/// `ggml_new_tensor`); `None` on overflow or a negative extent.
pub(crate) fn packed_nb(ty: GgmlType, ne: &[i64; 4]) -> Option<[usize; 4]> {
    let n = |i: usize| usize::try_from(ne[i]).ok();
    let mut nb = [ty.type_size(), ty.row_size(ne[0]).ok()?, 0, 0];
    nb[2] = nb[1].checked_mul(n(1)?)?;
    nb[3] = nb[2].checked_mul(n(2)?)?;
    Some(nb)
}

/// What [`Translator::into_parts`] returns: the context, every ggml tensor
/// translated with its id, and the leaves that stand for strided ggml
/// leaves' bytes ([`Translator::leaf`]).
pub(crate) type Parts = (Context, HashMap<*const ggml_tensor, TensorId>, Vec<(TensorId, *const ggml_tensor)>);

impl<'a> Translator<'a> {
    /// A translator of the graph whose nodes are `nodes`; with `locate`,
    /// every tensor is bound to its bytes.
    pub(crate) fn new(g: &'a Ggml, nodes: &[*mut ggml_tensor], locate: Option<&'a Locate<'a>>) -> Self {
        Translator {
            g,
            ctx: Context::new(),
            map: HashMap::new(),
            nodes: nodes.iter().map(|&p| p as *const ggml_tensor).collect(),
            locate,
            storage: TensorStorage::new(),
            owners: Vec::new(),
            spans: Vec::new(),
            writes_in_place: false,
        }
    }

    /// A translator that adds the graph to `ctx`, where the tensors of
    /// `known` already stand for those ggml tensors (the meta backend's
    /// resident weights and caches); nothing is bound to memory.
    pub(crate) fn within(
        g: &'a Ggml,
        ctx: Context,
        known: HashMap<*const ggml_tensor, TensorId>,
        nodes: &[*mut ggml_tensor],
    ) -> Self {
        Translator { ctx, map: known, writes_in_place: true, ..Translator::new(g, nodes, None) }
    }

    /// The context and every ggml tensor translated (with its id), ending a
    /// [`Translator::within`].
    pub(crate) fn into_parts(self) -> Parts {
        (self.ctx, self.map, self.spans)
    }

    /// Translates `t` (and what it reads), once.
    ///
    /// Sources are visited depth-first, in ggml's source order, with an
    /// explicit stack (no depth limit of the caller's thread stack); a
    /// tensor that reaches itself through its sources is an error, except
    /// `ggml_cast`'s self-reference (a CPY whose destination is the node:
    /// the recursive walk this replaced followed it until the stack
    /// overflowed, on llama.cpp's DFlash2 drafter).
    ///
    /// # Safety
    /// `t` and every tensor it reaches through `src` and `view_src` are
    /// live ggml tensors.
    pub(crate) unsafe fn tensor(&mut self, t: *const ggml_tensor) -> Result<TensorId, String> {
        let mut stack = vec![(t, false)];
        let mut open = HashSet::new();
        while let Some((u, expanded)) = stack.pop() {
            if self.map.contains_key(&u) {
                continue;
            }
            // SAFETY: the caller's promise.
            let ur = unsafe { &*u };
            if !expanded && self.is_node(ur, u) {
                // A tensor met again before its sources are done reads
                // itself through them: not a graph ggml can build.
                if !open.insert(u) {
                    return Err(format!("{:?} depends on itself", tensor_name(ur)));
                }
                stack.push((u, true));
                // `ggml_cast` names its own result as the copy's
                // destination (src[1] = itself): not a source to visit.
                let pending = ur.src.iter().rev().map(|&s| s as *const ggml_tensor);
                stack.extend(
                    pending.filter(|&s| !s.is_null() && s != u && !self.map.contains_key(&s)).map(|s| (s, false)),
                );
                continue;
            }
            // SAFETY: the caller's promise; its sources are translated.
            unsafe { self.translate_one(u) }?;
        }
        self.map.get(&t).copied().ok_or_else(|| "a tensor was not translated".to_string())
    }

    /// True if `t` is computed by this graph (an op node of it, or a view
    /// or reshape of something), false for a leaf whose bytes exist.
    fn is_node(&self, tr: &ggml_tensor, t: *const ggml_tensor) -> bool {
        is_shape_only(self.g, tr) || (op_name(self.g, tr) != "NONE" && self.nodes.contains(&t))
    }

    /// Translates `t`, whose sources are translated already.
    ///
    /// # Safety
    /// `t` and its sources are live ggml tensors.
    unsafe fn translate_one(&mut self, t: *const ggml_tensor) -> Result<TensorId, String> {
        // SAFETY: the caller's promise.
        let tr = unsafe { &*t };
        let id = if self.is_node(tr, t) {
            let op = op_name(self.g, tr);
            let mut srcs = [None; GGML_MAX_SRC];
            for (i, s) in tr.src.iter().enumerate() {
                if !s.is_null() && !std::ptr::eq(*s, t) {
                    let src = self.map.get(&(*s as *const ggml_tensor)).copied();
                    srcs[i] = Some(src.ok_or_else(|| format!("{op}: source {i} not translated first"))?);
                }
            }
            let cast = op == "CPY" && std::ptr::eq(tr.src[1], t);
            let id = if cast { self.cast(tr, t, srcs[0]) } else { self.op(tr, &op, &srcs) };
            let id = id.map_err(|e| format!("{op} {:?}: {e}", tensor_name(tr)))?;
            if cast {
                // The self-reference stands for the destination we made.
                srcs[1] = self.ctx.tensor(id).ok().and_then(|x| x.src.get(1).copied());
            }
            self.check(tr, id, &op, &srcs)?;
            if self.writes_in_place && !tr.view_src.is_null() {
                self.in_place(id).map_err(|e| format!("{op} {:?} in place: {e}", tensor_name(tr)))?
            } else {
                id
            }
        } else {
            self.leaf(tr, t)?
        };
        if self.ctx.tensor(id).map_err(|e| e.to_string())?.view_src.is_none() {
            self.owners.push((id, t));
        }
        self.map.insert(t, id);
        Ok(id)
    }

    /// For op `id`, which ggml computes in its first source's memory
    /// (`ggml_scale_inplace`, `ggml_add_inplace`: the node is a view of
    /// that source): the op and a copy of its result into that source,
    /// standing for the node, when the source's storage exists before the
    /// graph (a leaf: llama.cpp's caches, an input). Each sub-device then
    /// writes its part of the storage, where later graphs (and ggml's
    /// `get_tensor`, through the store) read it, and a chain of in-place ops
    /// writes into it one after the other, as ggml does (llama.cpp's
    /// `build_rs` zeroes a reused recurrent cell this way: as an ordinary
    /// result the zeros went to ggml's memory, which the store no longer
    /// reads, and the new sequence began from the old one's state). An op
    /// in place on an intermediate stays as it is (its readers read it).
    fn in_place(&mut self, id: TensorId) -> shardgraph::Result<TensorId> {
        let t = self.ctx.tensor(id)?;
        if matches!(t.op, Op::None) || t.op.is_view_op() || t.view_src.is_some() {
            return Ok(id);
        }
        let Some(&src) = t.src.first() else { return Ok(id) };
        let owner = self.ctx.tensor(src)?.view_src.unwrap_or(src);
        if !matches!(self.ctx.tensor(owner)?.op, Op::None) {
            return Ok(id);
        }
        self.ctx.cpy(id, src)
    }

    /// `ggml_cast` (a CPY whose destination is the node itself): a copy of
    /// `a` converted to the node's type, into a destination of our own,
    /// bound to the node's bytes when this translation binds memory.
    fn cast(&mut self, t: &ggml_tensor, tp: *const ggml_tensor, a: Option<TensorId>) -> shardgraph::Result<TensorId> {
        let a = a.ok_or_else(|| bad("cpy", "src0", "missing".into()))?;
        let ty = GgmlType::from_id(t.type_ as u32)?;
        if ty.is_quantized() && self.ctx.tensor(a)?.ty != GgmlType::F32 {
            return Err(bad("cpy", "src0", "a quantized destination takes F32 sources only".into()));
        }
        if self.locate.is_none() {
            return self.ctx.cast(a, ty);
        }
        let dst = self.ctx.new_tensor(ty, &t.ne)?;
        self.owners.push((dst, tp));
        self.ctx.cpy(a, dst)
    }

    /// A tensor whose bytes exist before the graph runs.
    ///
    /// A strided one (ggml's scheduler copies a view input into a tensor of
    /// the view's strides, `ggml_dup_tensor_layout`) becomes a packed 1-D
    /// leaf over the bytes it spans, with a view of it in ggml's strides;
    /// that leaf stands for the ggml tensor's memory ([`Translator::spans`]).
    fn leaf(&mut self, t: &ggml_tensor, tp: *const ggml_tensor) -> Result<TensorId, String> {
        let ty = GgmlType::from_id(t.type_ as u32).map_err(|e| e.to_string())?;
        let n = tensor_name(t);
        if Some(t.nb) == packed_nb(ty, &t.ne) {
            let id = self.ctx.new_tensor(ty, &t.ne).map_err(|e| e.to_string())?;
            if !n.is_empty() {
                self.ctx.set_name(id, &n).map_err(|e| e.to_string())?;
            }
            return Ok(id);
        }
        let ts = ty.type_size();
        let not_packed =
            || format!("leaf {n:?} is not packed (nb {:?}) and not a strided view of whole elements", t.nb);
        if ty.block_size() != 1 || t.nb[0] != ts || t.nb.iter().any(|b| b % ts != 0) || t.ne.iter().any(|&e| e < 1) {
            return Err(not_packed());
        }
        // The last byte it reaches, past the first: Σ (ne_i - 1)·nb_i.
        let reach =
            (0..4).try_fold(0usize, |acc, i| usize::try_from(t.ne[i] - 1).ok()?.checked_mul(t.nb[i])?.checked_add(acc));
        let elems = reach.ok_or_else(not_packed)? / ts + 1;
        let owner = self.ctx.new_tensor(ty, &[elems as i64]).map_err(|e| e.to_string())?;
        self.ctx.set_name(owner, &format!("{n} (span)")).map_err(|e| e.to_string())?;
        self.spans.push((owner, tp));
        self.owners.push((owner, tp));
        let [n0, n1, n2, n3] = t.ne;
        self.ctx.view_4d(owner, n0, n1, n2, n3, t.nb[1], t.nb[2], t.nb[3], 0).map_err(|e| e.to_string())
    }

    /// Our op for ggml node `t` with operands `s`.
    fn op(&mut self, t: &ggml_tensor, op: &str, s: &[Option<TensorId>; GGML_MAX_SRC]) -> shardgraph::Result<TensorId> {
        // A quantized destination from another float type: ggml's CPU
        // backend rounds through its own path (BF16 → Q8_0 differs in the
        // last bit of some blocks), so only F32 sources are taken.
        if op == "CPY" && self.quantized_from_non_f32(s) {
            return Err(bad("cpy", "src0", "a quantized destination takes F32 sources only".into()));
        }
        let c = &mut self.ctx;
        let need = |i: usize| s[i].ok_or_else(|| bad("ggml", "src", format!("src{i} missing")));
        let p = &t.op_params;
        let a = need(0)?;
        let id = match op {
            "DUP" => c.dup(a)?,
            "CPY" => c.cpy(a, need(1)?)?,
            "CONT" => c.cont_4d(a, t.ne[0], t.ne[1], t.ne[2], t.ne[3])?,
            "RESHAPE" => c.reshape_4d(a, t.ne[0], t.ne[1], t.ne[2], t.ne[3])?,
            "VIEW" => {
                // The offset from the source is the op's parameter (a
                // size_t); `view_offs` counts from the storage owner.
                let offs = (p[0] as u32 as u64 | (p[1] as u32 as u64) << 32) as usize;
                c.view_4d(a, t.ne[0], t.ne[1], t.ne[2], t.ne[3], t.nb[1], t.nb[2], t.nb[3], offs)?
            }
            "PERMUTE" => c.permute(a, [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize])?,
            "TRANSPOSE" => c.transpose(a)?,
            "GET_ROWS" => c.get_rows(a, need(1)?)?,
            // ggml's sources are [rows, indices, destination].
            "SET_ROWS" => c.set_rows(need(2)?, a, need(1)?)?,
            "CONCAT" => c.concat(a, need(1)?, p[0] as usize)?,
            "REPEAT" => c.repeat_4d(a, t.ne[0], t.ne[1], t.ne[2], t.ne[3])?,
            "PAD" if p[8] == 0 => c.pad_ext(a, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])?,
            "ADD" => c.add(a, need(1)?)?,
            "SUB" => c.sub(a, need(1)?)?,
            "MUL" => c.mul(a, need(1)?)?,
            "DIV" => c.div(a, need(1)?)?,
            "ADD1" => c.add1(a, need(1)?)?,
            "ADD_ID" => c.add_id(a, need(1)?, need(2)?)?,
            "SCALE" => c.scale_bias(a, f32_param(t, 0), f32_param(t, 1))?,
            "CLAMP" => c.clamp(a, f32_param(t, 0), f32_param(t, 1))?,
            "SQR" => c.sqr(a)?,
            "SQRT" => c.sqrt(a)?,
            "UNARY" => {
                // SAFETY: ggml_unary_op_name accepts any value (out of range: null).
                let u = name(unsafe { (self.g.unary_op_name)(p[0]) }).to_ascii_lowercase();
                let f = UnaryOp::ALL
                    .iter()
                    .find(|f| f.name() == u)
                    .ok_or_else(|| bad("unary", "op", format!("{u} is not supported")))?;
                c.unary(a, *f)?
            }
            "GLU" => {
                // SAFETY: as above.
                let u = name(unsafe { (self.g.glu_op_name)(p[0]) }).to_ascii_lowercase();
                let f = match u.as_str() {
                    "swiglu" => GluOp::Swiglu,
                    "geglu" => GluOp::Geglu,
                    _ => return Err(bad("glu", "op", format!("{u} is not supported"))),
                };
                match s[1] {
                    Some(b) => c.glu_split(a, b, f)?,
                    None => c.glu(a, f, p[1] != 0)?,
                }
            }
            "FILL" => c.fill(a, f32_param(t, 0))?,
            "SUM" => c.sum(a)?,
            "SUM_ROWS" => c.sum_rows(a)?,
            "MEAN" => c.mean(a)?,
            "ARGMAX" => c.argmax(a)?,
            "TOP_K" => c.top_k(a, t.ne[0] as i32)?,
            "ARGSORT" => c.argsort(a, if p[0] == 0 { SortOrder::Asc } else { SortOrder::Desc })?,
            "RMS_NORM" => c.rms_norm(a, f32_param(t, 0))?,
            "NORM" => c.norm(a, f32_param(t, 0))?,
            "L2_NORM" => c.l2_norm(a, f32_param(t, 0))?,
            "SOFT_MAX" => {
                let r = c.soft_max_ext(a, s[1], f32_param(t, 0), f32_param(t, 1))?;
                match s[2] {
                    Some(sinks) => c.soft_max_add_sinks(r, sinks)?,
                    None => r,
                }
            }
            "ROPE" if p[15] == 0 => {
                let params = rope_params(t)?;
                match params.mode {
                    RopeMode::Normal | RopeMode::Neox => c.rope_ext(a, need(1)?, s[2], params)?,
                    _ => c.rope_multi(a, need(1)?, s[2], params)?,
                }
            }
            "MUL_MAT" => c.mul_mat(a, need(1)?)?,
            "MUL_MAT_ID" => c.mul_mat_id(a, need(1)?, need(2)?)?,
            "FLASH_ATTN_EXT" => {
                let r =
                    c.flash_attn_ext(a, need(1)?, need(2)?, s[3], f32_param(t, 0), f32_param(t, 1), f32_param(t, 2))?;
                match s[4] {
                    Some(sinks) => c.flash_attn_ext_add_sinks(r, sinks)?,
                    None => r,
                }
            }
            "SSM_CONV" => c.ssm_conv(a, need(1)?)?,
            "GATED_DELTA_NET" => c.gated_delta_net(a, need(1)?, need(2)?, need(3)?, need(4)?, need(5)?, p[0] as i64)?,
            _ => return Err(bad("ggml", "op", format!("{op} is not supported"))),
        };
        let n = tensor_name(t);
        if !n.is_empty() {
            c.set_name(id, &n)?;
        }
        Ok(id)
    }

    /// True when a copy's destination (`s[1]`) is quantized and its source
    /// (`s[0]`) is not F32.
    fn quantized_from_non_f32(&self, s: &[Option<TensorId>; GGML_MAX_SRC]) -> bool {
        let ty = |i: usize| s[i].and_then(|id| self.ctx.tensor(id).ok()).map(|t| t.ty);
        ty(1).is_some_and(|d| d.is_quantized()) && ty(0).is_some_and(|t| t != GgmlType::F32)
    }

    /// Checks our tensor against ggml's: type, shape, strides, and each
    /// source in ggml's position.
    fn check(
        &self,
        t: &ggml_tensor,
        id: TensorId,
        op: &str,
        srcs: &[Option<TensorId>; GGML_MAX_SRC],
    ) -> Result<(), String> {
        let ours = self.ctx.tensor(id).map_err(|e| e.to_string())?;
        let theirs: Vec<TensorId> = srcs.iter().map_while(|s| *s).collect();
        // A gap (sinks without a mask) would hide a source from the check.
        if ours.src.as_slice() != theirs.as_slice() || srcs[theirs.len()..].iter().any(Option::is_some) {
            return Err(format!("{op} {:?}: shardgraph's sources are not ggml's, in ggml's order", tensor_name(t)));
        }
        if ours.ty.id() != t.type_ as u32 || ours.ne != t.ne || ours.nb != t.nb {
            return Err(format!(
                "{op} {:?}: ggml has type {} ne {:?} nb {:?}, shardgraph {} ne {:?} nb {:?}",
                tensor_name(t),
                // SAFETY: ggml_type_name accepts any type id (unknown: null).
                name(unsafe { (self.g.type_name)(t.type_) }),
                t.ne,
                t.nb,
                ours.ty.name(),
                ours.ne,
                ours.nb
            ));
        }
        if !matches!(ours.op, Op::None) && ours.view_src.is_none() && !t.view_src.is_null() && !ours.op.can_inplace() {
            return Err(format!(
                "{op} {:?} writes into its source, which shardgraph does not do for it",
                tensor_name(t)
            ));
        }
        Ok(())
    }

    /// Binds every tensor to its bytes and checks each lands where ggml put
    /// it; builds the graph of `outputs`.
    ///
    /// # Safety
    /// Every translated ggml tensor is still live.
    pub(crate) unsafe fn finish(mut self, outputs: &[TensorId]) -> Result<Translated, String> {
        let locate = self.locate.ok_or("no memory to bind")?;
        for &(id, t) in &self.owners {
            // SAFETY: the caller's promise.
            let (buf, off) = locate(unsafe { &*t })?;
            self.storage.place_in(&self.ctx, id, &buf, off).map_err(|e| e.to_string())?;
        }
        for (&t, &id) in &self.map {
            // SAFETY: as above.
            let (buf, off) = locate(unsafe { &*t })?;
            let (b, o) = self.storage.locate(&self.ctx, id).map_err(|e| e.to_string())?;
            if !std::sync::Arc::ptr_eq(b, &buf) || o != off {
                // SAFETY: as above.
                let n = tensor_name(unsafe { &*t });
                return Err(format!("{n:?} is at byte {off} for ggml but at {o} for shardgraph"));
            }
        }
        let graph = self.ctx.build_forward(outputs).map_err(|e| e.to_string())?;
        Ok(Translated { ctx: self.ctx, graph, storage: self.storage })
    }

    /// The context (for `supports_op`'s backend check).
    pub(crate) fn context(&self) -> &Context {
        &self.ctx
    }
}

/// A ROPE node's parameters (`ggml_rope_impl`'s layout: n_dims at 1, mode
/// at 2, n_ctx_orig at 4, the six floats at 5-10, the sections at 11-14).
fn rope_params(t: &ggml_tensor) -> shardgraph::Result<RopeParams> {
    let p = &t.op_params;
    let mode = [RopeMode::Normal, RopeMode::Neox, RopeMode::Mrope, RopeMode::Imrope]
        .into_iter()
        .find(|m| m.ggml_mode() == p[2])
        .ok_or_else(|| bad("rope", "mode", format!("mode {} is not supported", p[2])))?;
    Ok(RopeParams {
        n_dims: p[1],
        mode,
        n_ctx_orig: p[4],
        freq_base: f32_param(t, 5),
        freq_scale: f32_param(t, 6),
        ext_factor: f32_param(t, 7),
        attn_factor: f32_param(t, 8),
        beta_fast: f32_param(t, 9),
        beta_slow: f32_param(t, 10),
        sections: [p[11], p[12], p[13], p[14]],
    })
}

/// An operand shardgraph does not take from ggml.
fn bad(op: &'static str, operand: &'static str, detail: String) -> shardgraph::Error {
    shardgraph::Error::InvalidOperand { op, operand, detail }
}
