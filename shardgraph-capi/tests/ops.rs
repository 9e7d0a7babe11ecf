//! Every op function of the C ABI against the Rust constructor it wraps:
//! one sequence of tensors and ops is built twice, through the `sg_*`
//! functions (called from Rust, on an `SgContext` this test owns) and
//! through `shardgraph::Context` directly, and every tensor of the two
//! contexts must agree — type, `ne`, `nb`, the op with its parameters, the
//! sources and view source (by index), the view offset, name and flags.
//! That checks each wrapper's argument order and conversions (ggml enum
//! ids, rope parameters, optional operands, counts). Also: optional
//! operands given as `SG_TENSOR_NONE`, and the wrappers' own argument
//! errors; and that the sequence builds every op of the C ABI's op table.

use shardgraph::{Context, GgmlType, GluOp, RopeMode, RopeParams, SortOrder, TensorId, UnaryOp};
use shardgraph_capi::graph::*;
use shardgraph_capi::sg_status;

type Op1 = extern "C" fn(*mut SgContext, sg_tensor, *mut sg_tensor) -> sg_status;
type Op2 = extern "C" fn(*mut SgContext, sg_tensor, sg_tensor, *mut sg_tensor) -> sg_status;
type OpF = extern "C" fn(*mut SgContext, sg_tensor, f32, *mut sg_tensor) -> sg_status;

/// The C side: a context and the status of every call checked.
struct C {
    ctx: SgContext,
}

fn ok(st: sg_status, what: &str) {
    let msg = shardgraph_capi::status::last_error();
    assert_eq!(st, sg_status::SG_OK, "{what}: {msg}");
}

impl C {
    fn new_tensor(&mut self, ty: GgmlType, ne: &[i64], name: &str) -> sg_tensor {
        let mut t = 0;
        let cname = std::ffi::CString::new(name).unwrap();
        let name_ptr = if name.is_empty() { std::ptr::null() } else { cname.as_ptr() };
        ok(sg_new_tensor(&mut self.ctx, ty.id() as i32, ne.len() as i32, ne.as_ptr(), name_ptr, &mut t), name);
        t
    }
    fn op1(&mut self, f: Op1, a: sg_tensor) -> sg_tensor {
        let mut t = 0;
        ok(f(&mut self.ctx, a, &mut t), "op1");
        t
    }
    fn op2(&mut self, f: Op2, a: sg_tensor, b: sg_tensor) -> sg_tensor {
        let mut t = 0;
        ok(f(&mut self.ctx, a, b, &mut t), "op2");
        t
    }
    fn opf(&mut self, f: OpF, a: sg_tensor, v: f32) -> sg_tensor {
        let mut t = 0;
        ok(f(&mut self.ctx, a, v, &mut t), "opf");
        t
    }
    /// `f(ctx, &mut out)` for the ops with other parameters.
    fn with(&mut self, what: &str, f: impl FnOnce(*mut SgContext, *mut sg_tensor) -> sg_status) -> sg_tensor {
        let mut t = 0;
        ok(f(&mut self.ctx, &mut t), what);
        t
    }
}

fn rope_params(mode: RopeMode) -> RopeParams {
    RopeParams {
        n_dims: 16,
        mode,
        n_ctx_orig: 4096,
        freq_base: 5e5,
        freq_scale: 0.5,
        ext_factor: 0.25,
        attn_factor: 1.5,
        beta_fast: 16.0,
        beta_slow: 2.0,
        sections: if matches!(mode, RopeMode::Mrope | RopeMode::Imrope) { [2, 3, 3, 0] } else { [0; 4] },
    }
}

fn c_rope(p: RopeParams) -> SgRopeParams {
    let mut c = SgRopeParams {
        n_dims: 0,
        mode: 0,
        n_ctx_orig: 0,
        freq_base: 0.0,
        freq_scale: 0.0,
        ext_factor: 0.0,
        attn_factor: 0.0,
        beta_fast: 0.0,
        beta_slow: 0.0,
        sections: [0; 4],
    };
    ok(sg_rope_params_default(&mut c), "rope defaults");
    assert_eq!((c.freq_base, c.freq_scale, c.attn_factor, c.beta_fast, c.beta_slow), (10000.0, 1.0, 1.0, 32.0, 1.0));
    c.n_dims = p.n_dims;
    c.mode = p.mode.ggml_mode();
    c.n_ctx_orig = p.n_ctx_orig;
    c.freq_base = p.freq_base;
    c.freq_scale = p.freq_scale;
    c.ext_factor = p.ext_factor;
    c.attn_factor = p.attn_factor;
    c.beta_fast = p.beta_fast;
    c.beta_slow = p.beta_slow;
    c.sections = p.sections;
    c
}

/// The same sequence through the Rust constructors.
fn build_rust() -> shardgraph::Result<Context> {
    use GgmlType::*;
    let mut r = Context::new();
    let named = |r: &mut Context, ty, ne: &[i64], name: &str| -> shardgraph::Result<TensorId> {
        let id = r.new_tensor(ty, ne)?;
        if !name.is_empty() {
            r.set_name(id, name)?;
        }
        Ok(id)
    };
    let x = named(&mut r, F32, &[64, 4], "x")?;
    r.set_input(x)?;
    let y = named(&mut r, F32, &[64, 4], "y")?;
    let w = named(&mut r, Q8_0, &[64, 32], "w")?;
    let nw = named(&mut r, F32, &[64], "")?;
    let s1 = named(&mut r, F32, &[1], "s1")?;
    let rows = named(&mut r, I32, &[3], "rows")?;
    let dst = named(&mut r, F32, &[64, 8], "dst")?;
    let idx = named(&mut r, I64, &[4], "idx")?;
    let wide = named(&mut r, F32, &[128, 4], "wide")?;
    // Element-wise, one operand.
    for f in [
        Context::dup,
        Context::cont,
        Context::transpose,
        Context::sqr,
        Context::sqrt,
        Context::abs,
        Context::neg,
        Context::tanh,
        Context::relu,
        Context::sigmoid,
        Context::gelu,
        Context::gelu_quick,
        Context::silu,
        Context::exp,
        Context::softplus,
        Context::soft_max,
        Context::sum,
        Context::sum_rows,
        Context::mean,
        Context::argmax,
    ] {
        f(&mut r, x)?;
    }
    r.swiglu(wide)?;
    r.geglu(wide)?;
    // Two operands.
    for f in [Context::add, Context::sub, Context::mul, Context::div, Context::swiglu_split, Context::geglu_split] {
        f(&mut r, x, y)?;
    }
    r.add(x, nw)?;
    r.add1(x, s1)?;
    r.mul_mat(w, x)?;
    r.cpy(x, y)?;
    r.get_rows(dst, rows)?;
    r.reshape(wide, dst)?;
    r.repeat(nw, x)?;
    r.set_rows(dst, y, idx)?;
    // One operand and a float.
    for (f, v) in [
        (Context::scale as fn(&mut Context, TensorId, f32) -> shardgraph::Result<TensorId>, 0.5),
        (Context::fill, 3.0),
        (Context::rms_norm, 1e-6),
        (Context::norm, 1e-5),
        (Context::l2_norm, 1e-12),
    ] {
        f(&mut r, x, v)?;
    }
    r.scale_bias(x, 2.0, -1.0)?;
    r.clamp(x, -0.5, 0.5)?;
    for u in [UnaryOp::Abs, UnaryOp::Neg, UnaryOp::Tanh, UnaryOp::Relu, UnaryOp::Sigmoid] {
        r.unary(x, u)?;
    }
    for u in [UnaryOp::Gelu, UnaryOp::GeluQuick, UnaryOp::Silu, UnaryOp::Exp, UnaryOp::Softplus] {
        r.unary(x, u)?;
    }
    r.glu(wide, GluOp::Swiglu, false)?;
    r.glu(wide, GluOp::Geglu, true)?;
    r.glu_split(x, y, GluOp::Geglu)?;
    // soft_max_ext with and without a mask, sinks.
    let sx = named(&mut r, F32, &[8, 4, 2], "sx")?;
    let mask = named(&mut r, F16, &[8, 4], "mask")?;
    let sinks = named(&mut r, F32, &[2], "sinks")?;
    let sm = r.soft_max_ext(sx, Some(mask), 0.125, 0.0)?;
    r.soft_max_ext(sx, None, 1.0, 0.0)?;
    r.soft_max_add_sinks(sm, sinks)?;
    // Rope.
    let qr = named(&mut r, F32, &[32, 2, 4], "qr")?;
    let pos = named(&mut r, I32, &[4], "pos")?;
    let pos4 = named(&mut r, I32, &[16], "pos4")?;
    let ff = named(&mut r, F32, &[8], "ff")?;
    r.rope_ext(qr, pos, None, rope_params(RopeMode::Neox))?;
    r.rope_ext(qr, pos, Some(ff), rope_params(RopeMode::Normal))?;
    r.rope_multi(qr, pos4, None, rope_params(RopeMode::Imrope))?;
    // Reductions with parameters.
    r.top_k(x, 5)?;
    r.argsort(x, SortOrder::Desc)?;
    r.argsort(x, SortOrder::Asc)?;
    // Data movement and views.
    r.concat(x, y, 1)?;
    r.permute(sx, [1, 2, 0, 3])?;
    r.cast(x, F16)?;
    r.reshape_1d(x, 256)?;
    r.reshape_2d(x, 32, 8)?;
    r.reshape_3d(x, 32, 2, 4)?;
    r.reshape_4d(x, 16, 2, 2, 4)?;
    let t = r.transpose(x)?;
    r.cont_1d(t, 256)?;
    r.cont_2d(t, 8, 32)?;
    r.cont_3d(t, 4, 8, 8)?;
    r.cont_4d(t, 4, 4, 4, 4)?;
    r.view_1d(x, 32, 16)?;
    r.view_2d(x, 16, 4, 256, 8)?;
    r.view_3d(x, 16, 2, 2, 256, 512, 4)?;
    r.view_4d(x, 8, 2, 2, 1, 256, 512, 1024, 0)?;
    r.repeat_4d(nw, 64, 2, 3, 1)?;
    r.pad(x, 1, 2, 3, 0)?;
    // Matrix products of experts.
    let experts = named(&mut r, F32, &[64, 16, 3], "experts")?;
    let xb = named(&mut r, F32, &[64, 2, 4], "xb")?;
    let eids = named(&mut r, I32, &[2, 4], "eids")?;
    let bias = named(&mut r, F32, &[16, 3], "bias")?;
    let mm = r.mul_mat_id(experts, xb, eids)?;
    r.add_id(mm, bias, eids)?;
    // Attention.
    let q = named(&mut r, F32, &[32, 4, 2, 1], "q")?;
    let k = named(&mut r, F16, &[32, 8, 2, 1], "k")?;
    let v = named(&mut r, F16, &[32, 8, 2, 1], "v")?;
    let fa = r.flash_attn_ext(q, k, v, Some(mask), 0.176, 0.0, 30.0)?;
    r.flash_attn_ext(q, k, v, None, 1.0, 0.0, 0.0)?;
    r.flash_attn_ext_add_sinks(fa, sinks)?;
    // Recurrent.
    let sxc = named(&mut r, F32, &[7, 16, 1], "sxc")?;
    let cw = named(&mut r, F32, &[4, 16], "cw")?;
    r.ssm_conv(sxc, cw)?;
    let gq = named(&mut r, F32, &[8, 2, 3, 1], "gq")?;
    let gk = named(&mut r, F32, &[8, 2, 3, 1], "gk")?;
    let gv = named(&mut r, F32, &[8, 2, 3, 1], "gv")?;
    let gg = named(&mut r, F32, &[1, 2, 3, 1], "gg")?;
    let gb = named(&mut r, F32, &[1, 2, 3, 1], "gb")?;
    let gs = named(&mut r, F32, &[8, 8, 2, 1], "gs")?;
    r.gated_delta_net(gq, gk, gv, gg, gb, gs, 2)?;
    r.set_output(x)?;
    Ok(r)
}

/// The same sequence through the C ABI.
fn build_c() -> SgContext {
    use GgmlType::*;
    let mut c = C { ctx: SgContext::default() };
    let x = c.new_tensor(F32, &[64, 4], "x");
    ok(sg_set_input(&mut c.ctx, x), "set_input");
    let y = c.new_tensor(F32, &[64, 4], "y");
    let w = c.new_tensor(Q8_0, &[64, 32], "w");
    let nw = c.new_tensor(F32, &[64], "");
    let s1 = c.new_tensor(F32, &[1], "s1");
    let rows = c.new_tensor(I32, &[3], "rows");
    let dst = c.new_tensor(F32, &[64, 8], "dst");
    let idx = c.new_tensor(I64, &[4], "idx");
    let wide = c.new_tensor(F32, &[128, 4], "wide");
    for f in [
        sg_dup as Op1,
        sg_cont,
        sg_transpose,
        sg_sqr,
        sg_sqrt,
        sg_abs,
        sg_neg,
        sg_tanh,
        sg_relu,
        sg_sigmoid,
        sg_gelu,
        sg_gelu_quick,
        sg_silu,
        sg_exp,
        sg_softplus,
        sg_soft_max,
        sg_sum,
        sg_sum_rows,
        sg_mean,
        sg_argmax,
    ] {
        c.op1(f, x);
    }
    c.op1(sg_swiglu, wide);
    c.op1(sg_geglu, wide);
    for f in [sg_add as Op2, sg_sub, sg_mul, sg_div, sg_swiglu_split, sg_geglu_split] {
        c.op2(f, x, y);
    }
    c.op2(sg_add, x, nw);
    c.op2(sg_add1, x, s1);
    c.op2(sg_mul_mat, w, x);
    c.op2(sg_cpy, x, y);
    c.op2(sg_get_rows, dst, rows);
    c.op2(sg_reshape, wide, dst);
    c.op2(sg_repeat, nw, x);
    c.with("set_rows", |p, o| sg_set_rows(p, dst, y, idx, o));
    for (f, v) in [(sg_scale as OpF, 0.5), (sg_fill, 3.0), (sg_rms_norm, 1e-6), (sg_norm, 1e-5), (sg_l2_norm, 1e-12)] {
        c.opf(f, x, v);
    }
    c.with("scale_bias", |p, o| sg_scale_bias(p, x, 2.0, -1.0, o));
    c.with("clamp", |p, o| sg_clamp(p, x, -0.5, 0.5, o));
    // ggml's enum ggml_unary_op ids.
    for u in [0, 2, 4, 6, 7, 8, 9, 10, 13, 15] {
        c.with("unary", |p, o| sg_unary(p, x, u, o));
    }
    c.with("glu", |p, o| sg_glu(p, wide, 2, 0, o));
    c.with("glu", |p, o| sg_glu(p, wide, 1, 7, o));
    c.with("glu_split", |p, o| sg_glu_split(p, x, y, 1, o));
    let sx = c.new_tensor(F32, &[8, 4, 2], "sx");
    let mask = c.new_tensor(F16, &[8, 4], "mask");
    let sinks = c.new_tensor(F32, &[2], "sinks");
    let sm = c.with("soft_max_ext", |p, o| sg_soft_max_ext(p, sx, mask, 0.125, 0.0, o));
    c.with("soft_max_ext", |p, o| sg_soft_max_ext(p, sx, SG_TENSOR_NONE, 1.0, 0.0, o));
    c.op2(sg_soft_max_add_sinks, sm, sinks);
    let qr = c.new_tensor(F32, &[32, 2, 4], "qr");
    let pos = c.new_tensor(I32, &[4], "pos");
    let pos4 = c.new_tensor(I32, &[16], "pos4");
    let ff = c.new_tensor(F32, &[8], "ff");
    let neox = c_rope(rope_params(RopeMode::Neox));
    let normal = c_rope(rope_params(RopeMode::Normal));
    let imrope = c_rope(rope_params(RopeMode::Imrope));
    c.with("rope_ext", |p, o| sg_rope_ext(p, qr, pos, SG_TENSOR_NONE, &neox, o));
    c.with("rope_ext", |p, o| sg_rope_ext(p, qr, pos, ff, &normal, o));
    c.with("rope_multi", |p, o| sg_rope_multi(p, qr, pos4, SG_TENSOR_NONE, &imrope, o));
    c.with("top_k", |p, o| sg_top_k(p, x, 5, o));
    c.with("argsort", |p, o| sg_argsort(p, x, 1, o));
    c.with("argsort", |p, o| sg_argsort(p, x, 0, o));
    c.with("concat", |p, o| sg_concat(p, x, y, 1, o));
    c.with("permute", |p, o| sg_permute(p, sx, 1, 2, 0, 3, o));
    c.with("cast", |p, o| sg_cast(p, x, F16.id() as i32, o));
    c.with("reshape_1d", |p, o| sg_reshape_1d(p, x, 256, o));
    c.with("reshape_2d", |p, o| sg_reshape_2d(p, x, 32, 8, o));
    c.with("reshape_3d", |p, o| sg_reshape_3d(p, x, 32, 2, 4, o));
    c.with("reshape_4d", |p, o| sg_reshape_4d(p, x, 16, 2, 2, 4, o));
    let t = c.op1(sg_transpose, x);
    c.with("cont_1d", |p, o| sg_cont_1d(p, t, 256, o));
    c.with("cont_2d", |p, o| sg_cont_2d(p, t, 8, 32, o));
    c.with("cont_3d", |p, o| sg_cont_3d(p, t, 4, 8, 8, o));
    c.with("cont_4d", |p, o| sg_cont_4d(p, t, 4, 4, 4, 4, o));
    c.with("view_1d", |p, o| sg_view_1d(p, x, 32, 16, o));
    c.with("view_2d", |p, o| sg_view_2d(p, x, 16, 4, 256, 8, o));
    c.with("view_3d", |p, o| sg_view_3d(p, x, 16, 2, 2, 256, 512, 4, o));
    c.with("view_4d", |p, o| sg_view_4d(p, x, 8, 2, 2, 1, 256, 512, 1024, 0, o));
    c.with("repeat_4d", |p, o| sg_repeat_4d(p, nw, 64, 2, 3, 1, o));
    c.with("pad", |p, o| sg_pad(p, x, 1, 2, 3, 0, o));
    let experts = c.new_tensor(F32, &[64, 16, 3], "experts");
    let xb = c.new_tensor(F32, &[64, 2, 4], "xb");
    let eids = c.new_tensor(I32, &[2, 4], "eids");
    let bias = c.new_tensor(F32, &[16, 3], "bias");
    let mm = c.with("mul_mat_id", |p, o| sg_mul_mat_id(p, experts, xb, eids, o));
    c.with("add_id", |p, o| sg_add_id(p, mm, bias, eids, o));
    let q = c.new_tensor(F32, &[32, 4, 2, 1], "q");
    let k = c.new_tensor(F16, &[32, 8, 2, 1], "k");
    let v = c.new_tensor(F16, &[32, 8, 2, 1], "v");
    let fa = c.with("flash_attn_ext", |p, o| sg_flash_attn_ext(p, q, k, v, mask, 0.176, 0.0, 30.0, o));
    c.with("flash_attn_ext", |p, o| sg_flash_attn_ext(p, q, k, v, SG_TENSOR_NONE, 1.0, 0.0, 0.0, o));
    c.op2(sg_flash_attn_ext_add_sinks, fa, sinks);
    let sxc = c.new_tensor(F32, &[7, 16, 1], "sxc");
    let cw = c.new_tensor(F32, &[4, 16], "cw");
    c.op2(sg_ssm_conv, sxc, cw);
    let gq = c.new_tensor(F32, &[8, 2, 3, 1], "gq");
    let gk = c.new_tensor(F32, &[8, 2, 3, 1], "gk");
    let gv = c.new_tensor(F32, &[8, 2, 3, 1], "gv");
    let gg = c.new_tensor(F32, &[1, 2, 3, 1], "gg");
    let gb = c.new_tensor(F32, &[1, 2, 3, 1], "gb");
    let gs = c.new_tensor(F32, &[8, 8, 2, 1], "gs");
    c.with("gated_delta_net", |p, o| sg_gated_delta_net(p, gq, gk, gv, gg, gb, gs, 2, o));
    ok(sg_set_output(&mut c.ctx, x), "set_output");
    c.ctx
}

#[test]
fn every_op_function_builds_what_its_constructor_builds() {
    let r = build_rust().expect("the Rust sequence");
    let c = build_c();
    let c = c.context();
    assert_eq!(c.len(), r.len(), "tensor counts");
    let idx = |ids: &[TensorId]| ids.iter().map(|i| i.index()).collect::<Vec<_>>();
    for (a, b) in c.ids().zip(r.ids()) {
        let (ta, tb) = (c.tensor(a).unwrap(), r.tensor(b).unwrap());
        let what = format!("tensor {} ({} {:?} / {:?})", a.index(), tb.describe(), tb.op, tb.name);
        assert_eq!((ta.ty, ta.ne, ta.nb), (tb.ty, tb.ne, tb.nb), "{what}");
        assert_eq!(ta.op, tb.op, "{what}");
        assert_eq!(idx(&ta.src), idx(&tb.src), "{what}");
        assert_eq!(ta.view_src.map(|v| v.index()), tb.view_src.map(|v| v.index()), "{what}");
        assert_eq!(ta.view_offs, tb.view_offs, "{what}");
        assert_eq!(ta.name, tb.name, "{what}");
        assert_eq!(ta.flags, tb.flags, "{what}");
    }
    eprintln!("{} tensors built alike through the C ABI and the Rust constructors", c.len());
}

/// The sequence builds every op that the C ABI's op table
/// (`shardgraph_capi::op_table`) gives C constructors, so an op added to
/// the table is added to this test too.
#[test]
fn the_sequence_builds_every_op_the_table_gives_c_constructors() {
    use shardgraph_capi::op_table::{op_row, CAbi, OP_ROWS};
    use std::collections::BTreeSet;
    let c = build_c();
    let c = c.context();
    let built: BTreeSet<&str> = c.ids().map(|i| op_row(&c.tensor(i).unwrap().op).pattern).collect();
    let want: BTreeSet<&str> = OP_ROWS.iter().filter(|r| r.c != CAbi::MetaBackendOnly).map(|r| r.pattern).collect();
    let missing: Vec<&&str> = want.difference(&built).collect();
    let unlisted: Vec<&&str> = built.difference(&want).collect();
    assert!(
        missing.is_empty() && unlisted.is_empty(),
        "rows with C constructors the sequence does not build: {missing:?}; ops it builds without such a row: {unlisted:?}"
    );
}

#[test]
fn wrapper_argument_errors() {
    let mut c = C { ctx: SgContext::default() };
    let x = c.new_tensor(GgmlType::F32, &[64, 4], "x");
    let mut out = 0;
    let status = |st: sg_status, want: sg_status, needle: &str| {
        let msg = shardgraph_capi::status::last_error();
        assert_eq!(st, want, "{msg}");
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    };
    let ctx: *mut SgContext = &mut c.ctx;
    use sg_status::*;
    status(sg_glu(ctx, x, 0, 0, &mut out), SG_ERR_INVALID_ARGUMENT, "glu op 0");
    status(sg_concat(ctx, x, x, -1, &mut out), SG_ERR_INVALID_ARGUMENT, "dim = -1");
    status(sg_permute(ctx, x, 0, 1, -2, 3, &mut out), SG_ERR_INVALID_ARGUMENT, "axis = -2");
    status(sg_permute(ctx, x, 0, 1, 1, 3, &mut out), SG_ERR_INVALID_OPERAND, "permutation");
    status(sg_cast(ctx, x, 43, &mut out), SG_ERR_INVALID_ARGUMENT, "type id 43");
    status(sg_top_k(ctx, x, 65, &mut out), SG_ERR_INVALID_OPERAND, "top_k");
    status(sg_view_1d(ctx, x, 64, 1024, &mut out), SG_ERR_OUT_OF_BOUNDS, "view");
    status(sg_reshape_2d(ctx, x, 7, 7, &mut out), SG_ERR_INVALID_OPERAND, "reshape");
    status(sg_soft_max_ext(ctx, x, SG_TENSOR_NONE, 1.0, 1.0, &mut out), SG_ERR_INVALID_OPERAND, "max_bias");
    status(sg_rope_ext(ctx, x, x, SG_TENSOR_NONE, std::ptr::null(), &mut out), SG_ERR_INVALID_ARGUMENT, "params");
    let mut ne = [0i64; 4];
    status(sg_tensor_ne(ctx, x + 5, ne.as_mut_ptr()), SG_ERR_FOREIGN_TENSOR, "index out of range");
    ok(sg_tensor_ne(ctx, x, ne.as_mut_ptr()), "tensor_ne");
    assert_eq!(ne, [64, 4, 1, 1]);
    let mut n = 0usize;
    ok(sg_context_n_tensors(ctx, &mut n), "n_tensors");
    assert_eq!(n, 1, "failed calls create nothing");
    let mut found = 0;
    ok(sg_find_tensor(ctx, c"x".as_ptr(), &mut found), "find");
    assert_eq!(found, x);
    let mut name = [0 as std::ffi::c_char; 4];
    let mut needed = 0usize;
    ok(sg_tensor_name(ctx, x, name.as_mut_ptr(), name.len(), &mut needed), "name");
    assert_eq!((name[0] as u8, name[1], needed), (b'x', 0, 2));
}
