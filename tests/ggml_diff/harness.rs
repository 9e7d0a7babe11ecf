//! Test cases in the manner of ggml's `test-backend-ops`: each case builds a
//! small graph through a [`Builder`], names itself with its variables, owns
//! its bounds (per backend kind), and is run in our backend and in every
//! loaded ggml release with the same input bytes.
//!
//! The [`Builder`] makes our graph with our constructors and records, for
//! each call, the ggml API call with the case's own arguments (view strides
//! and offsets, shapes, rope parameters, …): the oracle's graph is built
//! from those, never from the parameters our nodes store, so a constructor
//! that stores a wrong parameter is not mirrored into the reference. Every
//! recorded result's shape and strides are compared with our node's too.
#![allow(dead_code)]

use super::nmse::nmse_finite;
use super::oracle::{ggml_layout, glu_id, rope_mode_id, sort_id, unary_id, Ggml, GgmlCtx, RopeArgs, Version, P};
use shardgraph::graph::alloc::GraphAllocator;
use shardgraph::tensor::quant;
use shardgraph::{
    Backend, Context, GgmlType, GluOp, Result, RopeMode, RopeParams, SortOrder, Tensor, TensorId, TensorStorage,
    UnaryOp,
};
use std::collections::{BTreeMap, BTreeSet};

/// How a leaf is filled.
#[derive(Clone, Debug)]
pub enum Init {
    /// Uniform values in [lo, hi) (floats; quantized types are quantized by ggml).
    Uniform(f32, f32),
    /// Exact values, one per element (floats).
    Values(Vec<f32>),
    /// Exact integers, one per element (I32/I64 leafs: indices, positions).
    Ints(Vec<i64>),
}

/// What a case's build function returns: the outputs to compare, and how to
/// fill leafs (leafs not listed get `Uniform(-1, 1)`).
#[derive(Default)]
pub struct Built {
    /// Tensors compared between the two libraries.
    pub outputs: Vec<TensorId>,
    /// Leaf initialisers.
    pub inits: Vec<(TensorId, Init)>,
}

impl Built {
    /// Outputs with default inits.
    pub fn out(outputs: &[TensorId]) -> Self {
        Built { outputs: outputs.to_vec(), inits: vec![] }
    }
    /// Adds an initialiser.
    pub fn init(mut self, id: TensorId, init: Init) -> Self {
        self.inits.push((id, init));
        self
    }
}

/// What a case runs on; an NMSE bound depends on it ([`Tol`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Our CPU backend.
    Cpu,
    /// The GPU backend on the emulated GPU (`cuda-emu`: the kernels as host C++).
    EmulatedGpu,
    /// The GPU backend on a real GPU.
    Gpu,
}

impl Kind {
    /// `"cpu"`, `"emulated GPU"`, `"GPU"`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Cpu => "cpu",
            Kind::EmulatedGpu => "emulated GPU",
            Kind::Gpu => "GPU",
        }
    }
}

/// NMSE bounds (`Σ(a−b)²/Σb²` against ggml's CPU) per backend kind. The CPU
/// and the emulated GPU are held to what they measure (with some margin);
/// a real GPU, not measured here, to ggml's `test-backend-ops` tolerances
/// (1e-7, 5e-4 for products and attention), until `scripts/gpu-check.sh`
/// measures one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// Our CPU backend.
    pub cpu: f64,
    /// The emulated GPU (CUDA and HIP spellings alike).
    pub emu: f64,
    /// A real GPU.
    pub gpu: f64,
}

impl Tol {
    /// Bounds for the CPU, the emulated GPU and a real GPU.
    pub const fn new(cpu: f64, emu: f64, gpu: f64) -> Tol {
        Tol { cpu, emu, gpu }
    }

    /// The bound on `kind`.
    pub fn bound(self, kind: Kind) -> f64 {
        match kind {
            Kind::Cpu => self.cpu,
            Kind::EmulatedGpu => self.emu,
            Kind::Gpu => self.gpu,
        }
    }
}

/// Float ops that ggml and we compute in the same order with the same
/// roundings, up to the last bits of a long sum or a transcendental (the
/// CPU and the emulated GPU measure ≤ 1.1e-14 on every such case): 1e-9,
/// which a wrong element, a skipped rounding to F16 or a dropped term
/// exceeds; a real GPU at ggml's 1e-7.
pub const FLOAT: Tol = Tol::new(1e-9, 1e-9, 1e-7);

/// How outputs are compared.
#[derive(Clone, Copy, Debug)]
pub enum Compare {
    /// Normalised mean squared error `Σ(a−b)² / Σb²` at most the bound of the backend's kind.
    Nmse(Tol),
    /// Every value equal (integer outputs, data movement).
    Exact,
    /// Integer outputs equal after sorting each row (ops whose order within a row is unspecified).
    ExactSortedRows,
}

/// [`Compare::Nmse`] with [`FLOAT`].
pub const NMSE_FLOAT: Compare = Compare::Nmse(FLOAT);

type BuildFn = Box<dyn Fn(&mut Builder) -> Result<Built>>;

/// One differential case.
pub struct Case {
    /// ggml op name.
    pub op: &'static str,
    /// Variables, e.g. `type=f16,ne=[10,5,4,3]`.
    pub vars: String,
    /// Comparison.
    pub cmp: Compare,
    /// Graph builder.
    pub build: BuildFn,
}

impl Case {
    /// A case for `op` with `vars`, compared by `cmp`.
    pub fn new(
        op: &'static str,
        vars: impl Into<String>,
        cmp: Compare,
        build: impl Fn(&mut Builder) -> Result<Built> + 'static,
    ) -> Self {
        Case { op, vars: vars.into(), cmp, build: Box::new(build) }
    }
}

/// `ggml_row_size`: the bytes of `n` elements of `ty` (whole blocks).
pub fn row_bytes(ty: GgmlType, n: i64) -> usize {
    ty.type_size() * n as usize / ty.block_size()
}

/// The strides ggml gives a new tensor of type `ty` and shape `ne`
/// (`ggml_new_tensor_impl`: `nb[0]` the type size, `nb[1]` one row of
/// blocks, `nb[i] = nb[i−1]·ne[i−1]`).
pub fn ggml_strides(ty: GgmlType, ne: [i64; 4]) -> [usize; 4] {
    let mut nb = [ty.type_size(), row_bytes(ty, ne[0]), 0, 0];
    for i in 2..4 {
        nb[i] = nb[i - 1] * ne[i - 1] as usize;
    }
    nb
}

/// `ne` padded with ones to four dimensions.
fn ne4(ne: &[i64]) -> [i64; 4] {
    let mut out = [1i64; 4];
    out[..ne.len()].copy_from_slice(ne);
    out
}

type Make = Box<dyn Fn(&GgmlCtx, &[P]) -> P>;

/// One recorded API call.
enum Call {
    /// A new tensor of this type and shape (its bytes are the harness's).
    Leaf { ty: GgmlType, ne: [i64; 4] },
    /// A ggml op constructor (`name`) on the results of `inputs`.
    Op { name: &'static str, inputs: Vec<TensorId>, make: Make },
}

/// Builds a case's graph twice from the same calls: ours, through
/// [`Context`], and ggml's, recorded with the arguments the case passed and
/// replayed on each oracle. Its methods are `Context`'s, named alike (each
/// names the ggml function it records).
pub struct Builder {
    ctx: Context,
    calls: Vec<(TensorId, Call)>,
}

/// `pub fn $m(&mut self, a) -> Result<TensorId>`: ours and ggml's `$g(ctx, a)`.
macro_rules! calls1 {
    ($($m:ident => $g:literal),* $(,)?) => {$(
        #[doc = concat!("`Context::", stringify!($m), "`; ggml's `", $g, "`.")]
        pub fn $m(&mut self, a: TensorId) -> Result<TensorId> {
            let out = self.ctx.$m(a)?;
            self.rec(out, $g, &[a], |g, s| g.f1($g, s[0]));
            Ok(out)
        }
    )*};
}

/// `pub fn $m(&mut self, a, b) -> Result<TensorId>`: ours and ggml's `$g(ctx, a, b)`.
macro_rules! calls2 {
    ($($m:ident => $g:literal),* $(,)?) => {$(
        #[doc = concat!("`Context::", stringify!($m), "`; ggml's `", $g, "`.")]
        pub fn $m(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
            let out = self.ctx.$m(a, b)?;
            self.rec(out, $g, &[a, b], |g, s| g.f2($g, s[0], s[1]));
            Ok(out)
        }
    )*};
}

/// `pub fn $m(&mut self, a, x: f32) -> Result<TensorId>`: ours and ggml's `$g(ctx, a, x)`.
macro_rules! calls1f {
    ($($m:ident => $g:literal),* $(,)?) => {$(
        #[doc = concat!("`Context::", stringify!($m), "`; ggml's `", $g, "`.")]
        pub fn $m(&mut self, a: TensorId, x: f32) -> Result<TensorId> {
            let out = self.ctx.$m(a, x)?;
            self.rec(out, $g, &[a], move |g, s| g.f1f($g, s[0], x));
            Ok(out)
        }
    )*};
}

impl Builder {
    /// An empty builder.
    pub fn new() -> Self {
        Builder { ctx: Context::new(), calls: Vec::new() }
    }

    fn rec(
        &mut self,
        out: TensorId,
        name: &'static str,
        inputs: &[TensorId],
        make: impl Fn(&GgmlCtx, &[P]) -> P + 'static,
    ) {
        self.calls.push((out, Call::Op { name, inputs: inputs.to_vec(), make: Box::new(make) }));
    }

    fn rec_leaf(&mut self, id: TensorId, ty: GgmlType, ne: &[i64]) {
        self.calls.push((id, Call::Leaf { ty, ne: ne4(ne) }));
    }

    /// The type and shape leaf `id` was made with.
    fn leaf_args(&self, id: TensorId) -> (GgmlType, [i64; 4]) {
        self.calls
            .iter()
            .find_map(|(i, c)| match c {
                Call::Leaf { ty, ne } if *i == id => Some((*ty, *ne)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{id:?} is not a leaf made by this builder"))
    }

    /// The strides ggml gives leaf `id` ([`ggml_strides`] of the type and
    /// shape it was made with), for views into it.
    pub fn nb(&self, id: TensorId) -> [usize; 4] {
        let (ty, ne) = self.leaf_args(id);
        ggml_strides(ty, ne)
    }

    /// `Context::new_tensor`; ggml's `ggml_new_tensor_4d`.
    pub fn new_tensor(&mut self, ty: GgmlType, ne: &[i64]) -> Result<TensorId> {
        let id = self.ctx.new_tensor(ty, ne)?;
        self.rec_leaf(id, ty, ne);
        Ok(id)
    }

    /// `Context::new_tensor_1d`; ggml's `ggml_new_tensor_4d`.
    pub fn new_tensor_1d(&mut self, ty: GgmlType, ne0: i64) -> Result<TensorId> {
        let id = self.ctx.new_tensor_1d(ty, ne0)?;
        self.rec_leaf(id, ty, &[ne0]);
        Ok(id)
    }

    /// `Context::new_tensor_2d`; ggml's `ggml_new_tensor_4d`.
    pub fn new_tensor_2d(&mut self, ty: GgmlType, ne0: i64, ne1: i64) -> Result<TensorId> {
        let id = self.ctx.new_tensor_2d(ty, ne0, ne1)?;
        self.rec_leaf(id, ty, &[ne0, ne1]);
        Ok(id)
    }

    /// `Context::new_tensor_3d`; ggml's `ggml_new_tensor_4d`.
    pub fn new_tensor_3d(&mut self, ty: GgmlType, ne0: i64, ne1: i64, ne2: i64) -> Result<TensorId> {
        let id = self.ctx.new_tensor_3d(ty, ne0, ne1, ne2)?;
        self.rec_leaf(id, ty, &[ne0, ne1, ne2]);
        Ok(id)
    }

    /// `Context::new_tensor_4d`; ggml's `ggml_new_tensor_4d`.
    pub fn new_tensor_4d(&mut self, ty: GgmlType, ne0: i64, ne1: i64, ne2: i64, ne3: i64) -> Result<TensorId> {
        let id = self.ctx.new_tensor_4d(ty, ne0, ne1, ne2, ne3)?;
        self.rec_leaf(id, ty, &[ne0, ne1, ne2, ne3]);
        Ok(id)
    }

    calls1! {
        dup => "ggml_dup",
        cont => "ggml_cont",
        transpose => "ggml_transpose",
        sqr => "ggml_sqr",
        sqrt => "ggml_sqrt",
        sum => "ggml_sum",
        sum_rows => "ggml_sum_rows",
        mean => "ggml_mean",
        argmax => "ggml_argmax",
        soft_max => "ggml_soft_max",
    }

    calls2! {
        cpy => "ggml_cpy",
        get_rows => "ggml_get_rows",
        add => "ggml_add",
        sub => "ggml_sub",
        mul => "ggml_mul",
        div => "ggml_div",
        add1 => "ggml_add1",
        mul_mat => "ggml_mul_mat",
        repeat => "ggml_repeat",
        ssm_conv => "ggml_ssm_conv",
        swiglu_split => "ggml_swiglu_split",
        geglu_split => "ggml_geglu_split",
    }

    calls1f! {
        rms_norm => "ggml_rms_norm",
        norm => "ggml_norm",
        l2_norm => "ggml_l2_norm",
        scale => "ggml_scale",
        fill => "ggml_fill",
    }

    /// `Context::set_rows(dst, rows, indices)`; ggml's `ggml_set_rows` with the same operands.
    pub fn set_rows(&mut self, dst: TensorId, rows: TensorId, idx: TensorId) -> Result<TensorId> {
        let out = self.ctx.set_rows(dst, rows, idx)?;
        self.rec(out, "ggml_set_rows", &[dst, rows, idx], |g, s| g.f3("ggml_set_rows", s[0], s[1], s[2]));
        Ok(out)
    }

    /// `Context::add_id`; ggml's `ggml_add_id`.
    pub fn add_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        let out = self.ctx.add_id(a, b, ids)?;
        self.rec(out, "ggml_add_id", &[a, b, ids], |g, s| g.f3("ggml_add_id", s[0], s[1], s[2]));
        Ok(out)
    }

    /// `Context::mul_mat_id`; ggml's `ggml_mul_mat_id`.
    pub fn mul_mat_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        let out = self.ctx.mul_mat_id(a, b, ids)?;
        self.rec(out, "ggml_mul_mat_id", &[a, b, ids], |g, s| g.f3("ggml_mul_mat_id", s[0], s[1], s[2]));
        Ok(out)
    }

    /// `Context::view_1d`; ggml's `ggml_view_1d`.
    pub fn view_1d(&mut self, a: TensorId, ne0: i64, offset: usize) -> Result<TensorId> {
        let out = self.ctx.view_1d(a, ne0, offset)?;
        self.rec(out, "ggml_view_1d", &[a], move |g, s| g.view(s[0], 1, [ne0, 1, 1, 1], [0; 3], offset));
        Ok(out)
    }

    /// `Context::view_2d`; ggml's `ggml_view_2d`.
    pub fn view_2d(&mut self, a: TensorId, ne0: i64, ne1: i64, nb1: usize, offset: usize) -> Result<TensorId> {
        let out = self.ctx.view_2d(a, ne0, ne1, nb1, offset)?;
        self.rec(out, "ggml_view_2d", &[a], move |g, s| g.view(s[0], 2, [ne0, ne1, 1, 1], [nb1, 0, 0], offset));
        Ok(out)
    }

    /// `Context::view_3d`; ggml's `ggml_view_3d`.
    #[allow(clippy::too_many_arguments)]
    pub fn view_3d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        ne2: i64,
        nb1: usize,
        nb2: usize,
        offset: usize,
    ) -> Result<TensorId> {
        let out = self.ctx.view_3d(a, ne0, ne1, ne2, nb1, nb2, offset)?;
        self.rec(out, "ggml_view_3d", &[a], move |g, s| g.view(s[0], 3, [ne0, ne1, ne2, 1], [nb1, nb2, 0], offset));
        Ok(out)
    }

    /// `Context::view_4d`; ggml's `ggml_view_4d`.
    #[allow(clippy::too_many_arguments)]
    pub fn view_4d(
        &mut self,
        a: TensorId,
        ne0: i64,
        ne1: i64,
        ne2: i64,
        ne3: i64,
        nb1: usize,
        nb2: usize,
        nb3: usize,
        offset: usize,
    ) -> Result<TensorId> {
        let out = self.ctx.view_4d(a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset)?;
        self.rec(out, "ggml_view_4d", &[a], move |g, s| g.view(s[0], 4, [ne0, ne1, ne2, ne3], [nb1, nb2, nb3], offset));
        Ok(out)
    }

    /// `Context::cont_2d`; ggml's `ggml_cont_2d`.
    pub fn cont_2d(&mut self, a: TensorId, ne0: i64, ne1: i64) -> Result<TensorId> {
        let out = self.ctx.cont_2d(a, ne0, ne1)?;
        self.rec(out, "ggml_cont_2d", &[a], move |g, s| g.nd("ggml_cont_2d", s[0], 2, [ne0, ne1, 1, 1]));
        Ok(out)
    }

    /// `Context::cont_3d`; ggml's `ggml_cont_3d`.
    pub fn cont_3d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64) -> Result<TensorId> {
        let out = self.ctx.cont_3d(a, ne0, ne1, ne2)?;
        self.rec(out, "ggml_cont_3d", &[a], move |g, s| g.nd("ggml_cont_3d", s[0], 3, [ne0, ne1, ne2, 1]));
        Ok(out)
    }

    /// `Context::reshape_3d`; ggml's `ggml_reshape_3d`.
    pub fn reshape_3d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64) -> Result<TensorId> {
        let out = self.ctx.reshape_3d(a, ne0, ne1, ne2)?;
        self.rec(out, "ggml_reshape_3d", &[a], move |g, s| g.nd("ggml_reshape_3d", s[0], 3, [ne0, ne1, ne2, 1]));
        Ok(out)
    }

    /// `Context::reshape_4d`; ggml's `ggml_reshape_4d`.
    pub fn reshape_4d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64, ne3: i64) -> Result<TensorId> {
        let out = self.ctx.reshape_4d(a, ne0, ne1, ne2, ne3)?;
        self.rec(out, "ggml_reshape_4d", &[a], move |g, s| g.nd("ggml_reshape_4d", s[0], 4, [ne0, ne1, ne2, ne3]));
        Ok(out)
    }

    /// `Context::repeat_4d`; ggml's `ggml_repeat_4d`.
    pub fn repeat_4d(&mut self, a: TensorId, ne0: i64, ne1: i64, ne2: i64, ne3: i64) -> Result<TensorId> {
        let out = self.ctx.repeat_4d(a, ne0, ne1, ne2, ne3)?;
        self.rec(out, "ggml_repeat_4d", &[a], move |g, s| g.nd("ggml_repeat_4d", s[0], 4, [ne0, ne1, ne2, ne3]));
        Ok(out)
    }

    /// `Context::permute`; ggml's `ggml_permute`.
    pub fn permute(&mut self, a: TensorId, axes: [usize; 4]) -> Result<TensorId> {
        let out = self.ctx.permute(a, axes)?;
        self.rec(out, "ggml_permute", &[a], move |g, s| g.permute(s[0], axes.map(|x| x as i32)));
        Ok(out)
    }

    /// `Context::concat`; ggml's `ggml_concat`.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        let out = self.ctx.concat(a, b, dim)?;
        self.rec(out, "ggml_concat", &[a, b], move |g, s| g.concat(s[0], s[1], dim as i32));
        Ok(out)
    }

    /// `Context::cast`; ggml's `ggml_cast`.
    pub fn cast(&mut self, a: TensorId, ty: GgmlType) -> Result<TensorId> {
        let out = self.ctx.cast(a, ty)?;
        self.rec(out, "ggml_cast", &[a], move |g, s| g.cast(s[0], ty));
        Ok(out)
    }

    /// `Context::scale_bias`; ggml's `ggml_scale_bias`.
    pub fn scale_bias(&mut self, a: TensorId, sc: f32, b: f32) -> Result<TensorId> {
        let out = self.ctx.scale_bias(a, sc, b)?;
        self.rec(out, "ggml_scale_bias", &[a], move |g, s| g.scale_bias(s[0], sc, b));
        Ok(out)
    }

    /// `Context::clamp`; ggml's `ggml_clamp` of a `ggml_cont` copy (ggml's
    /// clamp works in place: its result is a view of its input, and
    /// clamping a copy keeps the input's other readers and gives ours'
    /// layout).
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId> {
        let out = self.ctx.clamp(a, min, max)?;
        self.rec(out, "ggml_clamp", &[a], move |g, s| g.clamp(g.f1("ggml_cont", s[0]), min, max));
        Ok(out)
    }

    /// `Context::unary`; ggml's `ggml_unary` with ggml's op id.
    pub fn unary(&mut self, a: TensorId, u: UnaryOp) -> Result<TensorId> {
        let out = self.ctx.unary(a, u)?;
        self.rec(out, "ggml_unary", &[a], move |g, s| g.unary(s[0], unary_id(u)));
        Ok(out)
    }

    /// `Context::glu`; ggml's `ggml_glu`.
    pub fn glu(&mut self, a: TensorId, op: GluOp, swapped: bool) -> Result<TensorId> {
        let out = self.ctx.glu(a, op, swapped)?;
        self.rec(out, "ggml_glu", &[a], move |g, s| g.glu(s[0], glu_id(op), swapped));
        Ok(out)
    }

    /// `Context::glu_split`; ggml's `ggml_glu_split`.
    pub fn glu_split(&mut self, a: TensorId, b: TensorId, op: GluOp) -> Result<TensorId> {
        let out = self.ctx.glu_split(a, b, op)?;
        self.rec(out, "ggml_glu_split", &[a, b], move |g, s| g.glu_split(s[0], s[1], glu_id(op)));
        Ok(out)
    }

    /// `Context::top_k`; ggml's `ggml_top_k`.
    pub fn top_k(&mut self, a: TensorId, k: i32) -> Result<TensorId> {
        let out = self.ctx.top_k(a, k)?;
        self.rec(out, "ggml_top_k", &[a], move |g, s| g.top_k(s[0], k));
        Ok(out)
    }

    /// `Context::argsort`; ggml's `ggml_argsort`.
    pub fn argsort(&mut self, a: TensorId, order: SortOrder) -> Result<TensorId> {
        let out = self.ctx.argsort(a, order)?;
        self.rec(out, "ggml_argsort", &[a], move |g, s| g.argsort(s[0], sort_id(order)));
        Ok(out)
    }

    /// `Context::soft_max_ext`; ggml's `ggml_soft_max_ext`.
    pub fn soft_max_ext(&mut self, a: TensorId, mask: Option<TensorId>, scale: f32, max_bias: f32) -> Result<TensorId> {
        let out = self.ctx.soft_max_ext(a, mask, scale, max_bias)?;
        let inputs: Vec<TensorId> = std::iter::once(a).chain(mask).collect();
        self.rec(out, "ggml_soft_max_ext", &inputs, move |g, s| {
            g.soft_max_ext(s[0], s.get(1).copied(), scale, max_bias)
        });
        Ok(out)
    }

    /// `Context::soft_max_add_sinks`; ggml's `ggml_soft_max_add_sinks`
    /// (which sets the sinks on the soft_max node itself).
    pub fn soft_max_add_sinks(&mut self, a: TensorId, sinks: TensorId) -> Result<TensorId> {
        let out = self.ctx.soft_max_add_sinks(a, sinks)?;
        self.rec(out, "ggml_soft_max_add_sinks", &[a, sinks], |g, s| {
            g.add_sinks("ggml_soft_max_add_sinks", s[0], s[1])
        });
        Ok(out)
    }

    /// `Context::rope` (the shorthand with ggml's defaults); ggml's `ggml_rope`.
    pub fn rope(&mut self, a: TensorId, pos: TensorId, n_dims: i32, mode: RopeMode) -> Result<TensorId> {
        let out = self.ctx.rope(a, pos, n_dims, mode)?;
        self.rec(out, "ggml_rope", &[a, pos], move |g, s| g.rope(s[0], s[1], n_dims, rope_mode_id(mode)));
        Ok(out)
    }

    /// `Context::rope_ext`; ggml's `ggml_rope_ext` with the case's parameters.
    pub fn rope_ext(&mut self, a: TensorId, pos: TensorId, ff: Option<TensorId>, p: RopeParams) -> Result<TensorId> {
        let out = self.ctx.rope_ext(a, pos, ff, p)?;
        let inputs: Vec<TensorId> = [a, pos].into_iter().chain(ff).collect();
        self.rec(out, "ggml_rope_ext", &inputs, move |g, s| g.rope_ext(s[0], s[1], s.get(2).copied(), rope_args(&p)));
        Ok(out)
    }

    /// `Context::rope_multi`; ggml's `ggml_rope_multi` with the case's parameters.
    pub fn rope_multi(&mut self, a: TensorId, pos: TensorId, ff: Option<TensorId>, p: RopeParams) -> Result<TensorId> {
        let out = self.ctx.rope_multi(a, pos, ff, p)?;
        let inputs: Vec<TensorId> = [a, pos].into_iter().chain(ff).collect();
        self.rec(out, "ggml_rope_multi", &inputs, move |g, s| {
            g.rope_multi(s[0], s[1], s.get(2).copied(), p.sections, rope_args(&p))
        });
        Ok(out)
    }

    /// `Context::flash_attn_ext`; ggml's `ggml_flash_attn_ext`.
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
        softcap: f32,
    ) -> Result<TensorId> {
        let out = self.ctx.flash_attn_ext(q, k, v, mask, scale, max_bias, softcap)?;
        let inputs: Vec<TensorId> = [q, k, v].into_iter().chain(mask).collect();
        self.rec(out, "ggml_flash_attn_ext", &inputs, move |g, s| {
            g.flash_attn_ext(s[0], s[1], s[2], s.get(3).copied(), scale, max_bias, softcap)
        });
        Ok(out)
    }

    /// `Context::flash_attn_ext_add_sinks`; ggml's `ggml_flash_attn_ext_add_sinks`.
    pub fn flash_attn_ext_add_sinks(&mut self, a: TensorId, sinks: TensorId) -> Result<TensorId> {
        let out = self.ctx.flash_attn_ext_add_sinks(a, sinks)?;
        self.rec(out, "ggml_flash_attn_ext_add_sinks", &[a, sinks], |g, s| {
            g.add_sinks("ggml_flash_attn_ext_add_sinks", s[0], s[1])
        });
        Ok(out)
    }

    /// `Context::gated_delta_net`; ggml's `ggml_gated_delta_net`.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_net(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        gate: TensorId,
        beta: TensorId,
        state: TensorId,
        k_snapshots: i64,
    ) -> Result<TensorId> {
        let out = self.ctx.gated_delta_net(q, k, v, gate, beta, state, k_snapshots)?;
        self.rec(out, "ggml_gated_delta_net", &[q, k, v, gate, beta, state], move |g, s| {
            g.gated_delta_net([s[0], s[1], s[2], s[3], s[4], s[5]], k_snapshots)
        });
        Ok(out)
    }

    /// `Context::pad`; ggml's `ggml_pad`.
    pub fn pad(&mut self, a: TensorId, p0: i32, p1: i32, p2: i32, p3: i32) -> Result<TensorId> {
        let out = self.ctx.pad(a, p0, p1, p2, p3)?;
        self.rec(out, "ggml_pad", &[a], move |g, s| g.pad(s[0], [p0, p1, p2, p3]));
        Ok(out)
    }

    /// `Context::pad_ext`; ggml's `ggml_pad_ext`.
    #[allow(clippy::too_many_arguments)]
    pub fn pad_ext(
        &mut self,
        a: TensorId,
        lp0: i32,
        rp0: i32,
        lp1: i32,
        rp1: i32,
        lp2: i32,
        rp2: i32,
        lp3: i32,
        rp3: i32,
    ) -> Result<TensorId> {
        let out = self.ctx.pad_ext(a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)?;
        self.rec(out, "ggml_pad_ext", &[a], move |g, s| g.pad_ext(s[0], [lp0, lp1, lp2, lp3], [rp0, rp1, rp2, rp3]));
        Ok(out)
    }

    /// Rebuilds the recorded calls in ggml context `gc`: leafs get the
    /// bytes in `leaf_bytes` (by our leaf id), every result's shape and
    /// strides must equal our node's. Returns the ggml tensor of each of our
    /// ids (null where no call made it).
    pub fn replay(&self, gc: &GgmlCtx, leaf_bytes: &[(TensorId, Vec<u8>)]) -> std::result::Result<Vec<P>, String> {
        let mut map: Vec<P> = vec![std::ptr::null_mut(); self.ctx.len()];
        for (id, call) in &self.calls {
            let (p, name) = match call {
                Call::Leaf { ty, ne } => {
                    let p = gc.new_tensor(ty.id(), *ne);
                    if let Some((_, bytes)) = leaf_bytes.iter().find(|(l, _)| l == id) {
                        let data = gc.data(p);
                        if data.len() != bytes.len() {
                            return Err(format!("leaf {ty}{ne:?}: ggml {} bytes, ours {}", data.len(), bytes.len()));
                        }
                        data.copy_from_slice(bytes);
                    }
                    (p, "ggml_new_tensor_4d")
                }
                Call::Op { name, inputs, make } => {
                    let srcs: Vec<P> = inputs.iter().map(|i| map[i.index()]).collect();
                    (make(gc, &srcs), *name)
                }
            };
            let t = self.ctx.tensor(*id).map_err(|e| e.to_string())?;
            let (gne, gnb) = ggml_layout(p);
            if (gne, gnb) != (t.ne, t.nb) {
                return Err(format!(
                    "{name}: ours ne {:?} nb {:?}, ggml ne {gne:?} nb {gnb:?} ({})",
                    t.ne,
                    t.nb,
                    t.describe()
                ));
            }
            map[id.index()] = p;
        }
        Ok(map)
    }

    /// Our context (the graph the case built).
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

fn rope_args(p: &RopeParams) -> RopeArgs {
    RopeArgs {
        n_dims: p.n_dims,
        mode: rope_mode_id(p.mode),
        n_ctx_orig: p.n_ctx_orig,
        freq_base: p.freq_base,
        freq_scale: p.freq_scale,
        ext_factor: p.ext_factor,
        attn_factor: p.attn_factor,
        beta_fast: p.beta_fast,
        beta_slow: p.beta_slow,
    }
}

/// Builds `case`'s graphs ([`Builder`]); `Err` if one of our constructors refused.
pub fn build(case: &Case) -> Result<(Builder, Built)> {
    let mut b = Builder::new();
    let built = (case.build)(&mut b)?;
    Ok((b, built))
}

/// Tiny deterministic RNG (xorshift64*), so runs are reproducible.
pub struct Rng(u64);
impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Next u64.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

fn seed_of(s: &str) -> u64 {
    s.bytes().fold(1469598103934665603u64, |h, b| (h ^ b as u64).wrapping_mul(1099511628211))
}

/// An importance matrix for the types ggml quantizes only with one (IQ2_XXS,
/// IQ2_XS, IQ1_S): varied positive weights, the rule `quant_bytes` uses.
fn made_up_imatrix(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.5 + ((i * 37) % 11) as f32 * 0.3).collect()
}

/// The leaf's bytes in its type; block types are quantized by `quantizer`
/// (the newest loaded ggml that has the type).
fn leaf_bytes(quantizer: &Ggml, t: &Tensor, init: &Init, rng: &mut Rng) -> Vec<u8> {
    let n = t.nelements() as usize;
    match init {
        Init::Ints(v) => {
            assert_eq!(v.len(), n, "Init::Ints length for {}", t.describe());
            match t.ty {
                GgmlType::I32 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
                GgmlType::I64 => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
                other => panic!("Init::Ints on a {other} tensor"),
            }
        }
        _ => {
            let vals: Vec<f32> = match init {
                Init::Values(v) => {
                    assert_eq!(v.len(), n, "Init::Values length for {}", t.describe());
                    v.clone()
                }
                Init::Uniform(lo, hi) => (0..n).map(|_| rng.uniform(*lo, *hi)).collect(),
                Init::Ints(_) => unreachable!(),
            };
            match t.ty {
                GgmlType::F32 => vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
                GgmlType::F16 => vals.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect(),
                GgmlType::BF16 => vals.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
                GgmlType::I32 => vals.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
                GgmlType::I64 => vals.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect(),
                q if q.is_quantized() => {
                    let ne0 = t.ne[0] as usize;
                    let imatrix = quantizer.requires_imatrix(q).then(|| made_up_imatrix(ne0));
                    quantizer.quantize_chunk(q, &vals, n / ne0.max(1), ne0, imatrix.as_deref())
                }
                other => panic!("no initialiser for {other}"),
            }
        }
    }
}

/// Decodes the logical elements of a tensor with layout (ty, ne, nb) from
/// its storage bytes, as f64 (integers exactly).
pub fn decode(ty: GgmlType, ne: [i64; 4], nb: [usize; 4], bytes: &[u8]) -> Vec<f64> {
    let mut out = Vec::with_capacity(ne.iter().product::<i64>().max(0) as usize);
    let ne0 = ne[0] as usize;
    let mut row = vec![0f32; ne0];
    for i3 in 0..ne[3] as usize {
        for i2 in 0..ne[2] as usize {
            for i1 in 0..ne[1] as usize {
                let base = i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                if ty.is_quantized() {
                    let rb = ne0 / ty.block_size() * ty.type_size();
                    quant::dequantize_row(ty, &bytes[base..base + rb], &mut row).expect("dequantize");
                    out.extend(row.iter().map(|&x| x as f64));
                    continue;
                }
                for i0 in 0..ne0 {
                    let o = base + i0 * nb[0];
                    let b = &bytes[o..o + ty.type_size()];
                    out.push(match ty {
                        GgmlType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
                        GgmlType::F16 => half::f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
                        GgmlType::BF16 => half::bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
                        GgmlType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
                        GgmlType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
                        GgmlType::I16 => i16::from_le_bytes(b.try_into().unwrap()) as f64,
                        GgmlType::I8 => b[0] as i8 as f64,
                        other => panic!("decode: {other}"),
                    });
                }
            }
        }
    }
    out
}

/// The NMSE of `a` against reference `b` (`common/nmse.rs`) with the
/// suite's rule for non-finite values: positions where both are the same
/// non-finite value count as equal; any other non-finite value gives
/// infinity.
pub fn nmse(a: &[f64], b: &[f64]) -> f64 {
    let agree = |(&x, &y): (&f64, &f64)| {
        (x.is_finite() && y.is_finite()) || x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
    };
    if a.iter().zip(b).all(agree) {
        nmse_finite(a, b)
    } else {
        f64::INFINITY
    }
}

/// One oracle's verdict on a case.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Passed, with the measured error (0 for exact comparisons) and the bound.
    Pass(f64, f64),
    /// Failed: why.
    Fail(String),
    /// Not run on this oracle: the release lacks the type.
    Lacks(GgmlType),
}

/// A node our backend computed on the host (a GPU backend with no kernel
/// for its types), as its `supports_op` says.
#[derive(Clone, Debug)]
pub struct HostNode {
    /// ggml op name.
    pub op: &'static str,
    /// The node's type, then its sources' types.
    pub types: Vec<GgmlType>,
    /// The node and its sources, described.
    pub desc: String,
}

/// A case's run: one outcome per oracle given, and our host nodes.
pub struct Run {
    /// (release, verdict), in the order the oracles were given.
    pub outcomes: Vec<(Version, Outcome)>,
    /// Nodes `backend` computed on the host.
    pub host: Vec<HostNode>,
}

/// The message of a caught panic.
fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// Runs `case` on our `backend` (of kind `kind`) once and compares it with
/// each oracle in `oracles` (ggml's CPU with `threads` threads) that has
/// every type the case uses.
pub fn run_case(oracles: &[&Ggml], case: &Case, backend: &dyn Backend, kind: Kind, threads: i32) -> Run {
    let fail_all = |why: String| Run {
        outcomes: oracles.iter().map(|g| (g.version, Outcome::Fail(why.clone()))).collect(),
        host: Vec::new(),
    };
    let ours = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_ours(oracles, case, backend)));
    let ours = match ours {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return fail_all(format!("error: {e}")),
        Err(p) => return fail_all(format!("panic: {}", panic_message(p))),
    };
    let ours = match ours {
        Ok(o) => o,
        // No loaded release has this leaf type: nothing could quantize the leaf.
        Err(ty) => {
            return Run {
                outcomes: oracles.iter().map(|g| (g.version, Outcome::Lacks(ty))).collect(),
                host: Vec::new(),
            }
        }
    };
    let outcomes = oracles
        .iter()
        .map(|g| {
            let v = g.version;
            if let Some(&ty) = ours.types.iter().find(|t| !v.has_type(**t)) {
                return (v, Outcome::Lacks(ty));
            }
            let o = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compare(g, case, &ours, kind, threads)));
            (v, o.unwrap_or_else(|p| Outcome::Fail(format!("panic in ggml {v}: {}", panic_message(p)))))
        })
        .collect();
    Run { outcomes, host: ours.host }
}

/// Our side of a case: the recorded graph, the leafs' bytes, our outputs.
struct Ours {
    b: Builder,
    built: Built,
    leaf_data: Vec<(TensorId, Vec<u8>)>,
    /// Our outputs, decoded, with each output's shape.
    outputs: Vec<(Tensor, Vec<f64>)>,
    /// Every type the case's tensors have.
    types: BTreeSet<GgmlType>,
    host: Vec<HostNode>,
}

/// Builds the case, fills its leafs, computes it on `backend`; `Ok(Err(ty))`
/// when no release in `oracles` has leaf type `ty` (nothing to quantize with).
fn run_ours(oracles: &[&Ggml], case: &Case, backend: &dyn Backend) -> Result<std::result::Result<Ours, GgmlType>> {
    let (b, built) = build(case)?;
    let ctx = &b.ctx;
    let graph = ctx.build_forward(&built.outputs)?;
    let types: BTreeSet<GgmlType> = ctx.ids().filter_map(|id| ctx.tensor(id).ok().map(|t| t.ty)).collect();
    let mut rng = Rng::new(seed_of(&format!("{}:{}", case.op, case.vars)));

    // Leaf bytes, shared by both sides.
    let mut storage = TensorStorage::new();
    storage.alloc_tensors(backend, ctx, graph.leafs())?;
    let mut leaf_data = Vec::new();
    for &l in graph.leafs() {
        let t = ctx.tensor(l)?;
        let Some(quantizer) = oracles.iter().rev().find(|g| g.version.has_type(t.ty)) else { return Ok(Err(t.ty)) };
        let init =
            built.inits.iter().find(|(id, _)| *id == l).map(|(_, i)| i.clone()).unwrap_or(Init::Uniform(-1.0, 1.0));
        let bytes = leaf_bytes(quantizer, t, &init, &mut rng);
        storage.set_bytes(ctx, l, 0, &bytes)?;
        leaf_data.push((l, bytes));
    }
    let mut galloc = GraphAllocator::new(backend.buffer_type());
    galloc.alloc_graph(backend, ctx, &graph, &mut storage)?;
    let mut host = Vec::new();
    for &n in graph.nodes() {
        let t = ctx.tensor(n)?;
        if t.op.is_shape_only() || t.nelements() == 0 || backend.supports_op(ctx, n) {
            continue;
        }
        let srcs: Vec<&Tensor> = t.src.iter().map(|&s| ctx.tensor(s)).collect::<Result<_>>()?;
        host.push(HostNode {
            op: t.op.name(),
            types: std::iter::once(t.ty).chain(srcs.iter().map(|s| s.ty)).collect(),
            desc: format!("{} of {:?}", t.describe(), srcs.iter().map(|s| s.describe()).collect::<Vec<_>>()),
        });
    }
    backend.compute(ctx, &graph, &storage)?;
    let mut outputs = Vec::new();
    for &o in &built.outputs {
        let t = ctx.tensor(o)?.clone();
        let mut raw = vec![0u8; t.nbytes()];
        storage.get_bytes(ctx, o, 0, &mut raw)?;
        let vals = decode(t.ty, t.ne, t.nb, &raw);
        outputs.push((t, vals));
    }
    Ok(Ok(Ours { b, built, leaf_data, outputs, types, host }))
}

/// ggml's outputs of each case per release, decoded, computed once per
/// process: every backend's run of a case gives ggml the same leaf bytes
/// (the same seed, the same quantizer), so `cuda_diff` and `hip_diff`
/// reuse what `ggml_diff` (or the first of them) computed. `Err`: the
/// recorded calls do not replay (a shape or stride differs from ours).
type GgmlOutputs = std::sync::Arc<std::result::Result<Vec<Vec<f64>>, String>>;

static GGML_OUTPUTS: std::sync::Mutex<BTreeMap<(Version, String), GgmlOutputs>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Rebuilds the case in ggml release `g` from its recorded calls and
/// computes it (or takes the outputs computed before).
fn ggml_outputs(g: &Ggml, case: &Case, ours: &Ours, threads: i32) -> std::result::Result<Vec<Vec<f64>>, String> {
    let key = (g.version, format!("{}:{}", case.op, case.vars));
    let cached = GGML_OUTPUTS.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
    if let Some(c) = cached {
        return (*c).clone();
    }
    let ctx = &ours.b.ctx;
    let total: usize =
        2 * ctx.ids().map(|id| ctx.tensor(id).map(|t| t.nbytes()).unwrap_or(0) + 1024).sum::<usize>() + (8 << 20);
    let gc = g.init(total);
    let out = ours.b.replay(&gc, &ours.leaf_data).map(|map| {
        let gouts: Vec<P> = ours.built.outputs.iter().map(|o| map[o.index()]).collect();
        gc.compute(&gouts, threads);
        ours.outputs
            .iter()
            .zip(&gouts)
            .map(|((t, _), &p)| {
                let (gne, gnb) = ggml_layout(p);
                decode(t.ty, gne, gnb, gc.data(p))
            })
            .collect::<Vec<_>>()
    });
    GGML_OUTPUTS.lock().unwrap_or_else(|p| p.into_inner()).insert(key, std::sync::Arc::new(out.clone()));
    out
}

/// Compares our outputs of `case` with ggml release `g`'s.
fn compare(g: &Ggml, case: &Case, ours: &Ours, kind: Kind, threads: i32) -> Outcome {
    let theirs = match ggml_outputs(g, case, ours, threads) {
        Ok(t) => t,
        Err(why) => return Outcome::Fail(why),
    };
    let mut worst = 0.0f64;
    let mut bound = 0.0f64;
    for (i, ((t, vals), theirs)) in ours.outputs.iter().zip(&theirs).enumerate() {
        let theirs: &[f64] = theirs;
        match case.cmp {
            Compare::Nmse(tol) => {
                let max = tol.bound(kind);
                bound = max;
                let e = nmse(vals, theirs);
                worst = worst.max(e);
                if e.is_nan() || e > max {
                    return Outcome::Fail(format!(
                        "output {i}: nmse {e:.3e} > {max:.1e} ({}){}",
                        kind.name(),
                        first_diff(vals, theirs)
                    ));
                }
            }
            Compare::Exact => {
                if vals.iter().zip(theirs).any(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())) {
                    return Outcome::Fail(format!("output {i}: not exact{}", first_diff(vals, theirs)));
                }
            }
            Compare::ExactSortedRows => {
                let n0 = t.ne[0].max(1) as usize;
                let sort = |v: &[f64]| -> Vec<f64> {
                    v.chunks(n0)
                        .flat_map(|r| {
                            let mut r = r.to_vec();
                            r.sort_by(|a, b| a.total_cmp(b));
                            r
                        })
                        .collect()
                };
                let (a, b) = (sort(vals), sort(theirs));
                if a != b {
                    return Outcome::Fail(format!("output {i}: rows differ as sets{}", first_diff(&a, &b)));
                }
            }
        }
    }
    Outcome::Pass(worst, bound)
}

fn first_diff(a: &[f64], b: &[f64]) -> String {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| (*x - *y).abs() > 1e-6 * y.abs().max(1.0) || x.is_nan() != y.is_nan())
        .map(|(i, (x, y))| format!(" (first difference at element {i}: ours {x} vs ggml {y})"))
        .unwrap_or_default()
}
