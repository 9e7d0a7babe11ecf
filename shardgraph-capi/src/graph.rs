//! Contexts, tensors, op constructors and graphs: `sg_context_*`,
//! `sg_new_tensor`, `sg_tensor_*`, one `sg_<op>` per op of
//! [`shardgraph::Context`] an inference engine builds graphs from, and
//! `sg_graph_*`. Shapes are ggml's (`ne[0]` innermost), type ids ggml's
//! `enum ggml_type`, semantics those of the Rust constructors (ggml's).

use crate::ptr;
use crate::status::{arg, run, sg_status, Fail, R};
use shardgraph::{Context, GgmlType, GluOp, Graph, RopeMode, RopeParams, SortOrder, TensorId, UnaryOp};
use std::ffi::c_char;

/// A tensor handle (`sg_tensor`): the context's id in the high 32 bits,
/// the tensor's index in the context (creation order) in the low 32 bits,
/// so a handle from another context is detected. 0 is `SG_TENSOR_NONE`
/// (no context has id 0), the "no tensor" of optional operands.
#[allow(non_camel_case_types)]
pub type sg_tensor = u64;

/// `SG_TENSOR_NONE`: no tensor (optional operands).
pub const SG_TENSOR_NONE: sg_tensor = 0;

/// ggml's `GGML_TYPE_COUNT` (ggml 0.15.3 and 0.25.3 alike): type ids at or past it, or
/// negative, are argument errors; ids below it that this crate does not
/// implement are `SG_ERR_UNSUPPORTED`.
pub const GGML_TYPE_COUNT: i32 = 43;

/// A graph arena (`sg_context`): a [`Context`] and its tensor ids by index.
#[derive(Debug, Default)]
pub struct SgContext {
    /// The context.
    pub(crate) ctx: Context,
    /// Every tensor id of `ctx`, by index ([`TensorId`] has no public
    /// constructor; ids are taken from [`Context::ids`] as tensors appear).
    ids: Vec<TensorId>,
}

impl SgContext {
    /// The id of handle `h` (operand `what` in messages).
    ///
    /// # Errors
    /// `SG_ERR_INVALID_ARGUMENT` for `SG_TENSOR_NONE`;
    /// [`shardgraph::Error::ForeignTensor`] for a handle of another context
    /// or an index this context does not have.
    pub(crate) fn id(&self, h: sg_tensor, what: &str) -> R<TensorId> {
        if h == SG_TENSOR_NONE {
            return arg(format!("{what} is SG_TENSOR_NONE"));
        }
        let (ctx, idx) = ((h >> 32) as u32, (h & 0xffff_ffff) as u32);
        let foreign =
            |detail: String| Fail::Core(shardgraph::Error::ForeignTensor { id: idx, ctx: self.ctx.id(), detail });
        if ctx != self.ctx.id() {
            return Err(foreign(format!("{what}: a handle of context {ctx}")));
        }
        self.ids
            .get(idx as usize)
            .copied()
            .ok_or_else(|| foreign(format!("{what}: index out of range (the context has {} tensors)", self.ids.len())))
    }

    /// [`SgContext::id`], with `SG_TENSOR_NONE` meaning "none".
    ///
    /// # Errors
    /// As [`SgContext::id`] for other handles.
    pub(crate) fn opt_id(&self, h: sg_tensor, what: &str) -> R<Option<TensorId>> {
        if h == SG_TENSOR_NONE {
            return Ok(None);
        }
        self.id(h, what).map(Some)
    }

    /// The handle of `id` (a tensor of this context), after taking the ids
    /// of the tensors created since the last call.
    pub(crate) fn handle(&mut self, id: TensorId) -> sg_tensor {
        let have = self.ids.len();
        if self.ctx.len() > have {
            self.ids.extend(self.ctx.ids().skip(have));
        }
        ((id.context_id() as u64) << 32) | id.index() as u64
    }

    /// The context (read-only; for Rust code that made this value itself
    /// and passes `&mut` of it to the `sg_*` functions, as the tests do).
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

/// A built graph (`sg_graph`): [`Graph`] of one context.
#[derive(Debug)]
pub struct SgGraph {
    /// The graph.
    pub(crate) graph: Graph,
}

impl SgGraph {
    /// Checks that the graph was built from `ctx` as it is.
    ///
    /// # Errors
    /// `SG_ERR_INVALID_ARGUMENT` otherwise.
    pub(crate) fn check(&self, ctx: &SgContext) -> R {
        if !self.graph.built_from(&ctx.ctx) {
            return arg("the graph was built from another context");
        }
        Ok(())
    }
}

/// The ggml type of id `ty`.
///
/// # Errors
/// `SG_ERR_INVALID_ARGUMENT` for ids outside `0..GGML_TYPE_COUNT`;
/// `SG_ERR_UNSUPPORTED` for ggml types this crate does not implement.
pub(crate) fn ggml_type(ty: i32) -> R<GgmlType> {
    if !(0..GGML_TYPE_COUNT).contains(&ty) {
        return arg(format!("type id {ty} is not a ggml type (0..{GGML_TYPE_COUNT})"));
    }
    Ok(GgmlType::from_id(ty as u32)?)
}

/// A count from C as `usize`.
fn count(n: i64, what: &str) -> R<usize> {
    usize::try_from(n).or_else(|_| arg(format!("{what} = {n} is negative")))
}

/// Runs an op constructor: `f` gets the context, and the result's handle
/// goes to `*out` (checked for NULL before the op runs).
fn op(
    name: &str,
    ctx: *mut SgContext,
    out: *mut sg_tensor,
    f: impl FnOnce(&mut SgContext) -> R<TensorId>,
) -> sg_status {
    run(name, || {
        let c = ptr::obj_mut(ctx, "ctx")?;
        let out = ptr::slot(out, "out")?;
        let r = f(c)?;
        out.write(c.handle(r));
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Contexts and tensors
// ---------------------------------------------------------------------------

/// `sg_context_new`: a new empty context in `*out` (free with
/// `sg_context_free`).
#[no_mangle]
pub extern "C" fn sg_context_new(out: *mut *mut SgContext) -> sg_status {
    run("sg_context_new", || {
        ptr::slot(out, "ctx")?.write(ptr::into_handle(SgContext::default()));
        Ok(())
    })
}

/// `sg_context_free`: frees a context (NULL: nothing). Graphs, plans and
/// stores made with it stay valid handles but are useless without it.
#[no_mangle]
pub extern "C" fn sg_context_free(ctx: *mut SgContext) -> sg_status {
    run("sg_context_free", || {
        ptr::free(ctx);
        Ok(())
    })
}

/// `sg_context_n_tensors`: the number of tensors created in `ctx`.
#[no_mangle]
pub extern "C" fn sg_context_n_tensors(ctx: *const SgContext, out: *mut usize) -> sg_status {
    run("sg_context_n_tensors", || {
        let c = ptr::obj(ctx, "ctx")?;
        ptr::slot(out, "n")?.write(c.ctx.len());
        Ok(())
    })
}

/// `sg_new_tensor`: a new leaf of ggml type `type` with `n_dims` (1..=4)
/// extents `ne` (ggml order), named `name` (NULL: unnamed).
#[no_mangle]
pub extern "C" fn sg_new_tensor(
    ctx: *mut SgContext,
    ty: i32,
    n_dims: i32,
    ne: *const i64,
    name: *const c_char,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_new_tensor", ctx, out, |c| {
        let ty = ggml_type(ty)?;
        if !(1..=4).contains(&n_dims) {
            return arg(format!("n_dims = {n_dims} (1 to 4)"));
        }
        let ne = ptr::slice(ne, n_dims as usize, "ne")?;
        let name = ptr::opt_string(name, "name")?;
        let id = c.ctx.new_tensor(ty, ne)?;
        if let Some(n) = name {
            c.ctx.set_name(id, n)?;
        }
        Ok(id)
    })
}

/// `sg_set_name`: sets tensor `t`'s name (GGUF names for weights; the split
/// policy's rules match it).
#[no_mangle]
pub extern "C" fn sg_set_name(ctx: *mut SgContext, t: sg_tensor, name: *const c_char) -> sg_status {
    run("sg_set_name", || {
        let c = ptr::obj_mut(ctx, "ctx")?;
        let id = c.id(t, "t")?;
        let name = ptr::string(name, "name")?;
        Ok(c.ctx.set_name(id, name)?)
    })
}

/// `sg_set_input`: marks `t` as a graph input (`ggml_set_input`).
#[no_mangle]
pub extern "C" fn sg_set_input(ctx: *mut SgContext, t: sg_tensor) -> sg_status {
    run("sg_set_input", || {
        let c = ptr::obj_mut(ctx, "ctx")?;
        let id = c.id(t, "t")?;
        Ok(c.ctx.set_input(id)?)
    })
}

/// `sg_set_output`: marks `t` as a graph output (`ggml_set_output`).
#[no_mangle]
pub extern "C" fn sg_set_output(ctx: *mut SgContext, t: sg_tensor) -> sg_status {
    run("sg_set_output", || {
        let c = ptr::obj_mut(ctx, "ctx")?;
        let id = c.id(t, "t")?;
        Ok(c.ctx.set_output(id)?)
    })
}

/// `sg_tensor_ne`: `t`'s four extents into `ne[4]`.
#[no_mangle]
pub extern "C" fn sg_tensor_ne(ctx: *const SgContext, t: sg_tensor, ne: *mut i64) -> sg_status {
    run("sg_tensor_ne", || {
        let c = ptr::obj(ctx, "ctx")?;
        let id = c.id(t, "t")?;
        ptr::slice_mut(ne, 4, "ne")?.copy_from_slice(&c.ctx.tensor(id)?.ne);
        Ok(())
    })
}

/// `sg_tensor_nb`: `t`'s four byte strides into `nb[4]`.
#[no_mangle]
pub extern "C" fn sg_tensor_nb(ctx: *const SgContext, t: sg_tensor, nb: *mut usize) -> sg_status {
    run("sg_tensor_nb", || {
        let c = ptr::obj(ctx, "ctx")?;
        let id = c.id(t, "t")?;
        ptr::slice_mut(nb, 4, "nb")?.copy_from_slice(&c.ctx.tensor(id)?.nb);
        Ok(())
    })
}

/// `sg_tensor_type`: `t`'s ggml type id.
#[no_mangle]
pub extern "C" fn sg_tensor_type(ctx: *const SgContext, t: sg_tensor, ty: *mut i32) -> sg_status {
    run("sg_tensor_type", || {
        let c = ptr::obj(ctx, "ctx")?;
        let id = c.id(t, "t")?;
        ptr::slot(ty, "type")?.write(c.ctx.tensor(id)?.ty.id() as i32);
        Ok(())
    })
}

/// `sg_tensor_nbytes`: bytes `t` spans in its storage (`ggml_nbytes`).
#[no_mangle]
pub extern "C" fn sg_tensor_nbytes(ctx: *const SgContext, t: sg_tensor, out: *mut usize) -> sg_status {
    run("sg_tensor_nbytes", || {
        let c = ptr::obj(ctx, "ctx")?;
        let id = c.id(t, "t")?;
        ptr::slot(out, "bytes")?.write(c.ctx.tensor(id)?.nbytes());
        Ok(())
    })
}

/// `sg_tensor_name`: `t`'s name, `snprintf`-like into `buf`.
#[no_mangle]
pub extern "C" fn sg_tensor_name(
    ctx: *const SgContext,
    t: sg_tensor,
    buf: *mut c_char,
    buf_len: usize,
    needed: *mut usize,
) -> sg_status {
    run("sg_tensor_name", || {
        let c = ptr::obj(ctx, "ctx")?;
        let id = c.id(t, "t")?;
        let n = ptr::write_text(&c.ctx.tensor(id)?.name, buf, buf_len, "buf")?;
        if !needed.is_null() {
            ptr::slot(needed, "needed")?.write(n);
        }
        Ok(())
    })
}

/// `sg_find_tensor`: the first tensor named `name`.
#[no_mangle]
pub extern "C" fn sg_find_tensor(ctx: *mut SgContext, name: *const c_char, out: *mut sg_tensor) -> sg_status {
    op("sg_find_tensor", ctx, out, |c| {
        let name = ptr::string(name, "name")?;
        match c.ctx.find(name) {
            Some(id) => Ok(id),
            None => arg(format!("no tensor is named {name:?}")),
        }
    })
}

// ---------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------

/// Ops of one tensor: `sg_<op>(ctx, a, &out)`.
macro_rules! unary_ops {
    ($($cname:ident => $method:ident;)*) => {$(
        #[doc = concat!("`", stringify!($cname), "(ctx, a, &out)`: [`Context::", stringify!($method), "`].")]
        #[no_mangle]
        pub extern "C" fn $cname(ctx: *mut SgContext, a: sg_tensor, out: *mut sg_tensor) -> sg_status {
            op(stringify!($cname), ctx, out, |c| {
                let a = c.id(a, "a")?;
                Ok(c.ctx.$method(a)?)
            })
        }
    )*};
}

/// Ops of two tensors: `sg_<op>(ctx, a, b, &out)`.
macro_rules! binary_ops {
    ($($cname:ident => $method:ident;)*) => {$(
        #[doc = concat!("`", stringify!($cname), "(ctx, a, b, &out)`: [`Context::", stringify!($method), "`].")]
        #[no_mangle]
        pub extern "C" fn $cname(ctx: *mut SgContext, a: sg_tensor, b: sg_tensor, out: *mut sg_tensor) -> sg_status {
            op(stringify!($cname), ctx, out, |c| {
                let (a, b) = (c.id(a, "a")?, c.id(b, "b")?);
                Ok(c.ctx.$method(a, b)?)
            })
        }
    )*};
}

/// Ops of three tensors: `sg_<op>(ctx, a, b, c, &out)`.
macro_rules! ternary_ops {
    ($($cname:ident => $method:ident;)*) => {$(
        #[doc = concat!("`", stringify!($cname), "(ctx, a, b, c, &out)`: [`Context::", stringify!($method), "`].")]
        #[no_mangle]
        pub extern "C" fn $cname(
            ctx: *mut SgContext,
            a: sg_tensor,
            b: sg_tensor,
            c: sg_tensor,
            out: *mut sg_tensor,
        ) -> sg_status {
            op(stringify!($cname), ctx, out, |x| {
                let (a, b, c) = (x.id(a, "a")?, x.id(b, "b")?, x.id(c, "c")?);
                Ok(x.ctx.$method(a, b, c)?)
            })
        }
    )*};
}

/// Ops of one tensor and one float: `sg_<op>(ctx, a, v, &out)`.
macro_rules! unary_f32_ops {
    ($($cname:ident => $method:ident;)*) => {$(
        #[doc = concat!("`", stringify!($cname), "(ctx, a, v, &out)`: [`Context::", stringify!($method), "`].")]
        #[no_mangle]
        pub extern "C" fn $cname(ctx: *mut SgContext, a: sg_tensor, v: f32, out: *mut sg_tensor) -> sg_status {
            op(stringify!($cname), ctx, out, |c| {
                let a = c.id(a, "a")?;
                Ok(c.ctx.$method(a, v)?)
            })
        }
    )*};
}

unary_ops! {
    sg_dup => dup;
    sg_cont => cont;
    sg_transpose => transpose;
    sg_sqr => sqr;
    sg_sqrt => sqrt;
    sg_abs => abs;
    sg_neg => neg;
    sg_tanh => tanh;
    sg_relu => relu;
    sg_sigmoid => sigmoid;
    sg_gelu => gelu;
    sg_gelu_quick => gelu_quick;
    sg_silu => silu;
    sg_exp => exp;
    sg_softplus => softplus;
    sg_swiglu => swiglu;
    sg_geglu => geglu;
    sg_soft_max => soft_max;
    sg_sum => sum;
    sg_sum_rows => sum_rows;
    sg_mean => mean;
    sg_argmax => argmax;
}

binary_ops! {
    sg_add => add;
    sg_sub => sub;
    sg_mul => mul;
    sg_div => div;
    sg_add1 => add1;
    sg_mul_mat => mul_mat;
    sg_cpy => cpy;
    sg_get_rows => get_rows;
    sg_reshape => reshape;
    sg_repeat => repeat;
    sg_swiglu_split => swiglu_split;
    sg_geglu_split => geglu_split;
    sg_soft_max_add_sinks => soft_max_add_sinks;
    sg_flash_attn_ext_add_sinks => flash_attn_ext_add_sinks;
    sg_ssm_conv => ssm_conv;
}

ternary_ops! {
    sg_set_rows => set_rows;
    sg_mul_mat_id => mul_mat_id;
    sg_add_id => add_id;
}

unary_f32_ops! {
    sg_scale => scale;
    sg_fill => fill;
    sg_rms_norm => rms_norm;
    sg_norm => norm;
    sg_l2_norm => l2_norm;
}

/// `sg_scale_bias`: `a·s + b` ([`Context::scale_bias`]).
#[no_mangle]
pub extern "C" fn sg_scale_bias(ctx: *mut SgContext, a: sg_tensor, s: f32, b: f32, out: *mut sg_tensor) -> sg_status {
    op("sg_scale_bias", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.scale_bias(a, s, b)?)
    })
}

/// `sg_clamp`: [`Context::clamp`].
#[no_mangle]
pub extern "C" fn sg_clamp(ctx: *mut SgContext, a: sg_tensor, min: f32, max: f32, out: *mut sg_tensor) -> sg_status {
    op("sg_clamp", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.clamp(a, min, max)?)
    })
}

/// The unary op of ggml's `enum ggml_unary_op` id `id`.
fn unary_op(id: i32) -> R<UnaryOp> {
    Ok(match id {
        0 => UnaryOp::Abs,
        2 => UnaryOp::Neg,
        4 => UnaryOp::Tanh,
        6 => UnaryOp::Relu,
        7 => UnaryOp::Sigmoid,
        8 => UnaryOp::Gelu,
        9 => UnaryOp::GeluQuick,
        10 => UnaryOp::Silu,
        13 => UnaryOp::Exp,
        15 => UnaryOp::Softplus,
        _ => return arg(format!("unary op {id} is not one of the SG_UNARY_* values")),
    })
}

/// The GLU of ggml's `enum ggml_glu_op` id `id`.
fn glu_op(id: i32) -> R<GluOp> {
    Ok(match id {
        1 => GluOp::Geglu,
        2 => GluOp::Swiglu,
        _ => return arg(format!("glu op {id} is not SG_GLU_GEGLU (1) or SG_GLU_SWIGLU (2)")),
    })
}

/// `sg_unary`: [`Context::unary`] with a `SG_UNARY_*` (ggml) op id.
#[no_mangle]
pub extern "C" fn sg_unary(ctx: *mut SgContext, a: sg_tensor, unary: i32, out: *mut sg_tensor) -> sg_status {
    op("sg_unary", ctx, out, |c| {
        let a = c.id(a, "a")?;
        let f = unary_op(unary)?;
        Ok(c.ctx.unary(a, f)?)
    })
}

/// `sg_glu`: [`Context::glu`] with a `SG_GLU_*` (ggml) op id; `swapped`
/// non-zero swaps the halves.
#[no_mangle]
pub extern "C" fn sg_glu(ctx: *mut SgContext, a: sg_tensor, glu: i32, swapped: i32, out: *mut sg_tensor) -> sg_status {
    op("sg_glu", ctx, out, |c| {
        let a = c.id(a, "a")?;
        let g = glu_op(glu)?;
        Ok(c.ctx.glu(a, g, swapped != 0)?)
    })
}

/// `sg_glu_split`: [`Context::glu_split`] with a `SG_GLU_*` op id.
#[no_mangle]
pub extern "C" fn sg_glu_split(
    ctx: *mut SgContext,
    a: sg_tensor,
    b: sg_tensor,
    glu: i32,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_glu_split", ctx, out, |c| {
        let (a, b) = (c.id(a, "a")?, c.id(b, "b")?);
        let g = glu_op(glu)?;
        Ok(c.ctx.glu_split(a, b, g)?)
    })
}

/// `sg_soft_max_ext`: [`Context::soft_max_ext`] (`mask` may be
/// `SG_TENSOR_NONE`).
#[no_mangle]
pub extern "C" fn sg_soft_max_ext(
    ctx: *mut SgContext,
    a: sg_tensor,
    mask: sg_tensor,
    scale: f32,
    max_bias: f32,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_soft_max_ext", ctx, out, |c| {
        let a = c.id(a, "a")?;
        let mask = c.opt_id(mask, "mask")?;
        Ok(c.ctx.soft_max_ext(a, mask, scale, max_bias)?)
    })
}

/// `sg_rope_params` (C layout): [`RopeParams`] with ggml's integer mode.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgRopeParams {
    /// Rotated dims from the start of each row.
    pub n_dims: i32,
    /// ggml's rope mode: 0 normal, 2 NEOX, 8 MROPE, 40 IMROPE.
    pub mode: i32,
    /// Original training context (YaRN).
    pub n_ctx_orig: i32,
    /// θ base.
    pub freq_base: f32,
    /// Position scale.
    pub freq_scale: f32,
    /// YaRN extrapolation mix factor.
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN β_fast.
    pub beta_fast: f32,
    /// YaRN β_slow.
    pub beta_slow: f32,
    /// Multi-section sizes (MROPE/IMROPE only).
    pub sections: [i32; 4],
}

impl From<RopeParams> for SgRopeParams {
    fn from(p: RopeParams) -> Self {
        SgRopeParams {
            n_dims: p.n_dims,
            mode: p.mode.ggml_mode(),
            n_ctx_orig: p.n_ctx_orig,
            freq_base: p.freq_base,
            freq_scale: p.freq_scale,
            ext_factor: p.ext_factor,
            attn_factor: p.attn_factor,
            beta_fast: p.beta_fast,
            beta_slow: p.beta_slow,
            sections: p.sections,
        }
    }
}

impl SgRopeParams {
    /// The Rust parameters.
    ///
    /// # Errors
    /// `SG_ERR_INVALID_ARGUMENT` for a mode other than 0, 2, 8, 40.
    fn to_rust(self) -> R<RopeParams> {
        let mode = match self.mode {
            0 => RopeMode::Normal,
            2 => RopeMode::Neox,
            8 => RopeMode::Mrope,
            40 => RopeMode::Imrope,
            m => return arg(format!("rope mode {m} (0 normal, 2 NEOX, 8 MROPE, 40 IMROPE)")),
        };
        Ok(RopeParams {
            n_dims: self.n_dims,
            mode,
            n_ctx_orig: self.n_ctx_orig,
            freq_base: self.freq_base,
            freq_scale: self.freq_scale,
            ext_factor: self.ext_factor,
            attn_factor: self.attn_factor,
            beta_fast: self.beta_fast,
            beta_slow: self.beta_slow,
            sections: self.sections,
        })
    }
}

/// `sg_rope_params_default`: ggml's defaults (θ base 10000, no scaling,
/// no YaRN, mode 0, `n_dims` 0: set it).
#[no_mangle]
pub extern "C" fn sg_rope_params_default(out: *mut SgRopeParams) -> sg_status {
    run("sg_rope_params_default", || {
        ptr::slot(out, "p")?.write(RopeParams::default().into());
        Ok(())
    })
}

/// `sg_rope_ext`: [`Context::rope_ext`] (`freq_factors` may be
/// `SG_TENSOR_NONE`).
#[no_mangle]
pub extern "C" fn sg_rope_ext(
    ctx: *mut SgContext,
    a: sg_tensor,
    pos: sg_tensor,
    freq_factors: sg_tensor,
    params: *const SgRopeParams,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_rope_ext", ctx, out, |c| {
        let (a, pos) = (c.id(a, "a")?, c.id(pos, "pos")?);
        let ff = c.opt_id(freq_factors, "freq_factors")?;
        let p = ptr::obj(params, "params")?.to_rust()?;
        Ok(c.ctx.rope_ext(a, pos, ff, p)?)
    })
}

/// `sg_rope_multi`: [`Context::rope_multi`] (`freq_factors` may be
/// `SG_TENSOR_NONE`).
#[no_mangle]
pub extern "C" fn sg_rope_multi(
    ctx: *mut SgContext,
    a: sg_tensor,
    pos: sg_tensor,
    freq_factors: sg_tensor,
    params: *const SgRopeParams,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_rope_multi", ctx, out, |c| {
        let (a, pos) = (c.id(a, "a")?, c.id(pos, "pos")?);
        let ff = c.opt_id(freq_factors, "freq_factors")?;
        let p = ptr::obj(params, "params")?.to_rust()?;
        Ok(c.ctx.rope_multi(a, pos, ff, p)?)
    })
}

/// `sg_top_k`: [`Context::top_k`].
#[no_mangle]
pub extern "C" fn sg_top_k(ctx: *mut SgContext, a: sg_tensor, k: i32, out: *mut sg_tensor) -> sg_status {
    op("sg_top_k", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.top_k(a, k)?)
    })
}

/// `sg_argsort`: [`Context::argsort`], `order` 0 ascending, 1 descending
/// (ggml's `enum ggml_sort_order`).
#[no_mangle]
pub extern "C" fn sg_argsort(ctx: *mut SgContext, a: sg_tensor, order: i32, out: *mut sg_tensor) -> sg_status {
    op("sg_argsort", ctx, out, |c| {
        let a = c.id(a, "a")?;
        let order = match order {
            0 => SortOrder::Asc,
            1 => SortOrder::Desc,
            o => return arg(format!("sort order {o} (0 ascending, 1 descending)")),
        };
        Ok(c.ctx.argsort(a, order)?)
    })
}

/// `sg_concat`: [`Context::concat`] along `dim` (0..=3).
#[no_mangle]
pub extern "C" fn sg_concat(
    ctx: *mut SgContext,
    a: sg_tensor,
    b: sg_tensor,
    dim: i32,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_concat", ctx, out, |c| {
        let (a, b) = (c.id(a, "a")?, c.id(b, "b")?);
        let dim = count(dim.into(), "dim")?;
        Ok(c.ctx.concat(a, b, dim)?)
    })
}

/// `sg_permute`: [`Context::permute`] (`ggml_permute`: source dim `i` goes
/// to position `axis_i`).
#[no_mangle]
pub extern "C" fn sg_permute(
    ctx: *mut SgContext,
    a: sg_tensor,
    axis0: i32,
    axis1: i32,
    axis2: i32,
    axis3: i32,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_permute", ctx, out, |c| {
        let a = c.id(a, "a")?;
        let mut axes = [0usize; 4];
        for (slot, v) in axes.iter_mut().zip([axis0, axis1, axis2, axis3]) {
            *slot = count(v.into(), "axis")?;
        }
        Ok(c.ctx.permute(a, axes)?)
    })
}

/// `sg_cast`: [`Context::cast`] to ggml type id `type`.
#[no_mangle]
pub extern "C" fn sg_cast(ctx: *mut SgContext, a: sg_tensor, ty: i32, out: *mut sg_tensor) -> sg_status {
    op("sg_cast", ctx, out, |c| {
        let a = c.id(a, "a")?;
        let ty = ggml_type(ty)?;
        Ok(c.ctx.cast(a, ty)?)
    })
}

/// `sg_reshape_1d`: [`Context::reshape_1d`].
#[no_mangle]
pub extern "C" fn sg_reshape_1d(ctx: *mut SgContext, a: sg_tensor, ne0: i64, out: *mut sg_tensor) -> sg_status {
    op("sg_reshape_1d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.reshape_1d(a, ne0)?)
    })
}

/// `sg_reshape_2d`: [`Context::reshape_2d`].
#[no_mangle]
pub extern "C" fn sg_reshape_2d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_reshape_2d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.reshape_2d(a, ne0, ne1)?)
    })
}

/// `sg_reshape_3d`: [`Context::reshape_3d`].
#[no_mangle]
pub extern "C" fn sg_reshape_3d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    ne2: i64,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_reshape_3d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.reshape_3d(a, ne0, ne1, ne2)?)
    })
}

/// `sg_reshape_4d`: [`Context::reshape_4d`].
#[no_mangle]
pub extern "C" fn sg_reshape_4d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    ne2: i64,
    ne3: i64,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_reshape_4d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.reshape_4d(a, ne0, ne1, ne2, ne3)?)
    })
}

/// `sg_cont_1d`: [`Context::cont_1d`].
#[no_mangle]
pub extern "C" fn sg_cont_1d(ctx: *mut SgContext, a: sg_tensor, ne0: i64, out: *mut sg_tensor) -> sg_status {
    op("sg_cont_1d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.cont_1d(a, ne0)?)
    })
}

/// `sg_cont_2d`: [`Context::cont_2d`].
#[no_mangle]
pub extern "C" fn sg_cont_2d(ctx: *mut SgContext, a: sg_tensor, ne0: i64, ne1: i64, out: *mut sg_tensor) -> sg_status {
    op("sg_cont_2d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.cont_2d(a, ne0, ne1)?)
    })
}

/// `sg_cont_3d`: [`Context::cont_3d`].
#[no_mangle]
pub extern "C" fn sg_cont_3d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    ne2: i64,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_cont_3d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.cont_3d(a, ne0, ne1, ne2)?)
    })
}

/// `sg_cont_4d`: [`Context::cont_4d`].
#[no_mangle]
pub extern "C" fn sg_cont_4d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    ne2: i64,
    ne3: i64,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_cont_4d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.cont_4d(a, ne0, ne1, ne2, ne3)?)
    })
}

/// `sg_view_1d`: [`Context::view_1d`].
#[no_mangle]
pub extern "C" fn sg_view_1d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    offset: usize,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_view_1d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.view_1d(a, ne0, offset)?)
    })
}

/// `sg_view_2d`: [`Context::view_2d`].
#[no_mangle]
pub extern "C" fn sg_view_2d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    nb1: usize,
    offset: usize,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_view_2d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.view_2d(a, ne0, ne1, nb1, offset)?)
    })
}

/// `sg_view_3d`: [`Context::view_3d`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_view_3d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    ne2: i64,
    nb1: usize,
    nb2: usize,
    offset: usize,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_view_3d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.view_3d(a, ne0, ne1, ne2, nb1, nb2, offset)?)
    })
}

/// `sg_view_4d`: [`Context::view_4d`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_view_4d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    ne2: i64,
    ne3: i64,
    nb1: usize,
    nb2: usize,
    nb3: usize,
    offset: usize,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_view_4d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.view_4d(a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset)?)
    })
}

/// `sg_repeat_4d`: [`Context::repeat_4d`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_repeat_4d(
    ctx: *mut SgContext,
    a: sg_tensor,
    ne0: i64,
    ne1: i64,
    ne2: i64,
    ne3: i64,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_repeat_4d", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.repeat_4d(a, ne0, ne1, ne2, ne3)?)
    })
}

/// `sg_pad`: [`Context::pad`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_pad(
    ctx: *mut SgContext,
    a: sg_tensor,
    p0: i32,
    p1: i32,
    p2: i32,
    p3: i32,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_pad", ctx, out, |c| {
        let a = c.id(a, "a")?;
        Ok(c.ctx.pad(a, p0, p1, p2, p3)?)
    })
}

/// `sg_flash_attn_ext`: [`Context::flash_attn_ext`] (`mask` may be
/// `SG_TENSOR_NONE`).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_flash_attn_ext(
    ctx: *mut SgContext,
    q: sg_tensor,
    k: sg_tensor,
    v: sg_tensor,
    mask: sg_tensor,
    scale: f32,
    max_bias: f32,
    logit_softcap: f32,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_flash_attn_ext", ctx, out, |c| {
        let (q, k, v) = (c.id(q, "q")?, c.id(k, "k")?, c.id(v, "v")?);
        let mask = c.opt_id(mask, "mask")?;
        Ok(c.ctx.flash_attn_ext(q, k, v, mask, scale, max_bias, logit_softcap)?)
    })
}

/// `sg_gated_delta_net`: [`Context::gated_delta_net`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn sg_gated_delta_net(
    ctx: *mut SgContext,
    q: sg_tensor,
    k: sg_tensor,
    v: sg_tensor,
    g: sg_tensor,
    beta: sg_tensor,
    state: sg_tensor,
    k_snapshots: i64,
    out: *mut sg_tensor,
) -> sg_status {
    op("sg_gated_delta_net", ctx, out, |c| {
        let (q, k, v) = (c.id(q, "q")?, c.id(k, "k")?, c.id(v, "v")?);
        let (g, beta, state) = (c.id(g, "g")?, c.id(beta, "beta")?, c.id(state, "state")?);
        Ok(c.ctx.gated_delta_net(q, k, v, g, beta, state, k_snapshots)?)
    })
}

// ---------------------------------------------------------------------------
// Graphs
// ---------------------------------------------------------------------------

/// `sg_graph_build`: the graph computing `outputs[0..n_outputs]`
/// ([`Context::build_forward`]) in `*out` (free with `sg_graph_free`).
#[no_mangle]
pub extern "C" fn sg_graph_build(
    ctx: *const SgContext,
    outputs: *const sg_tensor,
    n_outputs: usize,
    out: *mut *mut SgGraph,
) -> sg_status {
    run("sg_graph_build", || {
        let c = ptr::obj(ctx, "ctx")?;
        let out = ptr::slot(out, "graph")?;
        let ids =
            ptr::slice(outputs, n_outputs, "outputs")?.iter().map(|&h| c.id(h, "outputs[]")).collect::<R<Vec<_>>>()?;
        let graph = c.ctx.build_forward(&ids)?;
        out.write(ptr::into_handle(SgGraph { graph }));
        Ok(())
    })
}

/// `sg_graph_free`: frees a graph (NULL: nothing).
#[no_mangle]
pub extern "C" fn sg_graph_free(graph: *mut SgGraph) -> sg_status {
    run("sg_graph_free", || {
        ptr::free(graph);
        Ok(())
    })
}

/// `sg_graph_size`: the graph's node (op) and leaf counts.
#[no_mangle]
pub extern "C" fn sg_graph_size(graph: *const SgGraph, n_nodes: *mut usize, n_leafs: *mut usize) -> sg_status {
    run("sg_graph_size", || {
        let g = ptr::obj(graph, "graph")?;
        let (nodes, leafs) = (ptr::slot(n_nodes, "n_nodes")?, ptr::slot(n_leafs, "n_leafs")?);
        nodes.write(g.graph.nodes().len());
        leafs.write(g.graph.leafs().len());
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Types and quantization
// ---------------------------------------------------------------------------

/// `sg_row_size`: bytes of a row of `ne0` elements of ggml type `type`
/// (`ggml_row_size`).
#[no_mangle]
pub extern "C" fn sg_row_size(ty: i32, ne0: i64, out: *mut usize) -> sg_status {
    run("sg_row_size", || {
        let ty = ggml_type(ty)?;
        let out = ptr::slot(out, "bytes")?;
        out.write(ty.row_size(ne0)?);
        Ok(())
    })
}

/// `sg_quantize`: `nrows` rows of `n_per_row` F32 values converted to
/// ggml type `type` (`ggml_quantize_chunk`).
#[no_mangle]
pub extern "C" fn sg_quantize(
    ty: i32,
    src: *const f32,
    nrows: i64,
    n_per_row: i64,
    dst: *mut std::ffi::c_void,
    dst_size: usize,
) -> sg_status {
    run("sg_quantize", || {
        let ty = ggml_type(ty)?;
        let (rows, per_row) = (count(nrows, "nrows")?, count(n_per_row, "n_per_row")?);
        let n = rows.checked_mul(per_row).map_or_else(|| arg("nrows · n_per_row overflows"), Ok)?;
        let src = ptr::slice(src, n, "src")?;
        let dst = ptr::slice_mut(dst.cast::<u8>(), dst_size, "dst")?;
        Ok(shardgraph::tensor::quant::quantize_chunk(ty, src, dst, rows, per_row)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_carry_their_context() {
        let mut a = SgContext::default();
        let mut b = SgContext::default();
        let x = a.ctx.new_tensor_1d(GgmlType::F32, 4).unwrap();
        let y = b.ctx.new_tensor_1d(GgmlType::F32, 4).unwrap();
        let hx = a.handle(x);
        let hy = b.handle(y);
        assert_eq!(hx & 0xffff_ffff, 0);
        assert_eq!(hx >> 32, a.ctx.id() as u64);
        assert_eq!(a.id(hx, "a").unwrap(), x);
        assert!(matches!(a.id(hy, "a"), Err(Fail::Core(shardgraph::Error::ForeignTensor { .. }))));
        assert!(matches!(a.id(hx + 1, "a"), Err(Fail::Core(shardgraph::Error::ForeignTensor { .. }))));
        assert!(matches!(a.id(SG_TENSOR_NONE, "a"), Err(Fail::Arg(_))));
        assert_eq!(a.opt_id(SG_TENSOR_NONE, "mask").unwrap(), None);
        // `cast` adds two tensors; both become addressable.
        let c = a.ctx.cast(x, GgmlType::F16).unwrap();
        let hc = a.handle(c);
        assert_eq!(hc & 0xffff_ffff, 2);
        assert_eq!(a.id(hc - 1, "leaf").unwrap().index(), 1);
    }

    #[test]
    fn type_ids() {
        assert_eq!(ggml_type(8).unwrap(), GgmlType::Q8_0);
        assert!(matches!(ggml_type(-1), Err(Fail::Arg(_))));
        assert!(matches!(ggml_type(GGML_TYPE_COUNT), Err(Fail::Arg(_))));
        // Q4_2 (4) and Q4_0_4_4 (31) were removed from ggml; MXFP4 (39) and
        // Q2_0 (42), ggml 0.25.3's, are implemented.
        for id in [4, 31] {
            assert!(matches!(ggml_type(id), Err(Fail::Core(shardgraph::Error::UnsupportedType { .. }))));
        }
        assert_eq!(ggml_type(39).unwrap(), GgmlType::MXFP4);
        assert_eq!(ggml_type(42).unwrap(), GgmlType::Q2_0);
    }

    #[test]
    fn enum_ids_are_ggmls() {
        assert_eq!(unary_op(10).unwrap(), UnaryOp::Silu);
        assert_eq!(unary_op(15).unwrap(), UnaryOp::Softplus);
        assert!(unary_op(1).is_err()); // SGN: not implemented
        assert_eq!(glu_op(2).unwrap(), GluOp::Swiglu);
        assert!(glu_op(0).is_err());
        let d = SgRopeParams::from(RopeParams { mode: RopeMode::Imrope, ..RopeParams::default() });
        assert_eq!(d.mode, 40);
        assert_eq!(d.to_rust().unwrap().mode, RopeMode::Imrope);
        assert!(SgRopeParams { mode: 1, ..d }.to_rust().is_err());
    }
}
