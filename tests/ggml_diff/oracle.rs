//! The ggml oracle: loads the real ggml (0.15.3, built by
//! `pip install ggml-python==0.0.45`) with `libloading` and rebuilds one of
//! our graphs in it, op by op, so both libraries compute the same thing.
//!
//! Only functions are called (no struct layout is needed) except
//! `ggml_init_params` (passed by value) and the first fields of
//! `struct ggml_tensor` (`type`, `buffer`, `ne[4]`, `nb[4]`), read to check
//! that ggml gave the same shape we did.
#![allow(dead_code, clippy::missing_safety_doc)]

use shardgraph::{Context, GluOp, Op, RopeMode, SortOrder, Tensor, TensorId, UnaryOp};
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::OnceLock;

/// `struct ggml_tensor *` / `struct ggml_context *` / `struct ggml_cgraph *`.
pub type P = *mut c_void;

#[repr(C)]
struct InitParams {
    mem_size: usize,
    mem_buffer: *mut c_void,
    no_alloc: bool,
}

/// The loaded libraries.
pub struct Ggml {
    base: libloading::Library,
    cpu: libloading::Library,
    /// Folder the libraries were loaded from.
    pub dir: PathBuf,
}

static GGML: OnceLock<Result<Ggml, String>> = OnceLock::new();

/// Where the ggml shared libraries are: `GGML_LIB_DIR`, else the repo's
/// `.venv/lib/python3*/site-packages/ggml/lib`.
pub fn lib_dir() -> Result<PathBuf, String> {
    if let Ok(d) = std::env::var("GGML_LIB_DIR") {
        return Ok(PathBuf::from(d));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = root.join(".venv").join("lib");
    let entries = std::fs::read_dir(&lib).map_err(|e| format!("{}: {e} (run the README set-up)", lib.display()))?;
    for e in entries.flatten() {
        let d = e.path().join("site-packages").join("ggml").join("lib");
        if d.join("libggml-base.so").exists() {
            return Ok(d);
        }
    }
    Err(format!("no ggml/lib under {} (run the README set-up)", lib.display()))
}

impl Ggml {
    /// The process-wide oracle, loaded once; `Err` says why it is missing.
    pub fn get() -> Result<&'static Ggml, String> {
        GGML.get_or_init(|| {
            let dir = lib_dir()?;
            // SAFETY: loading ggml runs its (trivial) constructors only.
            unsafe {
                let base = libloading::Library::new(dir.join("libggml-base.so")).map_err(|e| e.to_string())?;
                let cpu = libloading::Library::new(dir.join("libggml-cpu.so")).map_err(|e| e.to_string())?;
                Ok(Ggml { base, cpu, dir })
            }
        })
        .as_ref()
        .map_err(|e| e.clone())
    }

    /// Looks a function up by name in libggml-base or libggml-cpu.
    ///
    /// # Safety
    /// `F` must be the function's exact C signature.
    pub unsafe fn sym<F: Copy>(&self, name: &str) -> F {
        let n = format!("{name}\0");
        // SAFETY: the caller guarantees `F` is the symbol's exact C signature
        // (this fn's `# Safety`); `n` is NUL-terminated, and the copied
        // function pointer stays valid while `self` (the static oracle) keeps
        // both libraries loaded.
        unsafe {
            if let Ok(s) = self.base.get::<F>(n.as_bytes()) {
                return *s;
            }
            match self.cpu.get::<F>(n.as_bytes()) {
                Ok(s) => *s,
                Err(e) => panic!("ggml oracle: symbol {name} not found: {e}"),
            }
        }
    }

    /// A ggml context with `mem` bytes (tensor data allocated inside).
    pub fn init(&self, mem: usize) -> GgmlCtx<'_> {
        // SAFETY: exact signature of ggml_init.
        let ctx = unsafe {
            let f: unsafe extern "C" fn(InitParams) -> P = self.sym("ggml_init");
            f(InitParams { mem_size: mem, mem_buffer: std::ptr::null_mut(), no_alloc: false })
        };
        assert!(!ctx.is_null(), "ggml_init failed for {mem} bytes");
        GgmlCtx { g: self, ctx }
    }

    /// A ggml context that holds descriptors only (`no_alloc = true`): for
    /// shape checks without computing.
    pub fn init_no_alloc(&self, mem: usize) -> GgmlCtx<'_> {
        // SAFETY: exact signature of ggml_init.
        let ctx = unsafe {
            let f: unsafe extern "C" fn(InitParams) -> P = self.sym("ggml_init");
            f(InitParams { mem_size: mem, mem_buffer: std::ptr::null_mut(), no_alloc: true })
        };
        assert!(!ctx.is_null(), "ggml_init failed for {mem} bytes");
        GgmlCtx { g: self, ctx }
    }

    /// ggml's reference quantization of `nrows` rows (`ggml_quantize_chunk`, no imatrix).
    pub fn quantize_chunk(&self, type_id: u32, src: &[f32], nrows: usize, n_per_row: usize) -> Vec<u8> {
        // SAFETY: every `sym` type is the C signature of `ggml_row_size` / `ggml_quantize_chunk`
        // (ggml.h); `src` holds nrows·n_per_row floats (the caller's rows) and `out` is sized by
        // ggml's own row size for nrows rows, so the quantizer writes inside it.
        unsafe {
            let row_size: unsafe extern "C" fn(i32, i64) -> usize = self.sym("ggml_row_size");
            let q: unsafe extern "C" fn(i32, *const f32, *mut c_void, i64, i64, i64, *const f32) -> usize =
                self.sym("ggml_quantize_chunk");
            let rs = row_size(type_id as i32, n_per_row as i64);
            let mut out = vec![0u8; rs * nrows];
            q(type_id as i32, src.as_ptr(), out.as_mut_ptr() as P, 0, nrows as i64, n_per_row as i64, std::ptr::null());
            out
        }
    }
}

/// A ggml context; freed on drop.
pub struct GgmlCtx<'a> {
    /// The library.
    pub g: &'a Ggml,
    /// The `ggml_context *`.
    pub ctx: P,
}

impl Drop for GgmlCtx<'_> {
    fn drop(&mut self) {
        // SAFETY: `ggml_free(struct ggml_context *)` is the exact signature, and `self.ctx` is the
        // non-null context from `ggml_init`, freed only here, once.
        unsafe {
            let f: unsafe extern "C" fn(P) = self.g.sym("ggml_free");
            f(self.ctx)
        }
    }
}

/// Reads `ne`/`nb` of a ggml tensor (fields 3 and 4 of `struct ggml_tensor`).
pub fn ggml_layout(t: P) -> ([i64; 4], [usize; 4]) {
    // SAFETY: `struct ggml_tensor` starts with `enum ggml_type type; struct
    // ggml_backend_buffer * buffer; int64_t ne[4]; size_t nb[4];` (ggml.h).
    unsafe {
        let base = t as *const u8;
        let ne = std::ptr::read_unaligned(base.add(16) as *const [i64; 4]);
        let nb = std::ptr::read_unaligned(base.add(48) as *const [usize; 4]);
        (ne, nb)
    }
}

impl GgmlCtx<'_> {
    /// `ggml_new_tensor_4d`.
    pub fn new_tensor(&self, type_id: u32, ne: [i64; 4]) -> P {
        // SAFETY: `ggml_new_tensor_4d(ctx, type, ne0..ne3)` is the exact C signature and `self.ctx`
        // is a live context (freed only on drop).
        unsafe {
            let f: unsafe extern "C" fn(P, i32, i64, i64, i64, i64) -> P = self.g.sym("ggml_new_tensor_4d");
            f(self.ctx, type_id as i32, ne[0], ne[1], ne[2], ne[3])
        }
    }

    /// The tensor's data bytes (`ggml_get_data`, `ggml_nbytes`). The memory
    /// belongs to the ggml context; callers hold one tensor's bytes at a time.
    #[allow(clippy::mut_from_ref)]
    pub fn data(&self, t: P) -> &mut [u8] {
        // SAFETY: exact C signatures of `ggml_get_data` / `ggml_nbytes`; `t` is a tensor of this
        // live context, whose data is `len` bytes inside the context's memory (checked non-null and
        // non-empty before building the slice), and callers hold one tensor's bytes at a time, so
        // the `&mut` is not aliased.
        unsafe {
            let d: unsafe extern "C" fn(P) -> *mut c_void = self.g.sym("ggml_get_data");
            let n: unsafe extern "C" fn(P) -> usize = self.g.sym("ggml_nbytes");
            let (ptr, len) = (d(t) as *mut u8, n(t));
            // An empty tensor may have no data pointer; a slice needs a non-null one.
            if ptr.is_null() || len == 0 {
                return &mut [];
            }
            std::slice::from_raw_parts_mut(ptr, len)
        }
    }

    /// Builds the graph of `outputs` and computes it with `n_threads`.
    pub fn compute(&self, outputs: &[P], n_threads: i32) {
        // SAFETY: exact C signatures of the three graph functions; `self.ctx` is live and every
        // output is a tensor of it.
        unsafe {
            let ng: unsafe extern "C" fn(P, usize, bool) -> P = self.g.sym("ggml_new_graph_custom");
            let fe: unsafe extern "C" fn(P, P) = self.g.sym("ggml_build_forward_expand");
            let cp: unsafe extern "C" fn(P, P, i32) -> i32 = self.g.sym("ggml_graph_compute_with_ctx");
            let gf = ng(self.ctx, 8192, false);
            for &o in outputs {
                fe(gf, o);
            }
            let st = cp(self.ctx, gf, n_threads);
            assert_eq!(st, 0, "ggml_graph_compute_with_ctx failed with status {st}");
        }
    }

    /// Builds the graph of `outputs` once, with a persistent ggml thread pool
    /// of `n_threads`, to be computed many times ([`GgmlGraph::compute`]);
    /// for benchmarks.
    pub fn graph(&self, outputs: &[P], n_threads: i32) -> GgmlGraph<'_> {
        // SAFETY: exact C signatures (ggml.h / ggml-cpu.h); `self.ctx` is live and the outputs are
        // its tensors; `params` is a 4 KiB zeroed buffer, larger than the ~530-byte `struct
        // ggml_threadpool_params` that ggml fills; the threadpool is checked non-null before
        // planning.
        unsafe {
            let ng: unsafe extern "C" fn(P, usize, bool) -> P = self.g.sym("ggml_new_graph_custom");
            let fe: unsafe extern "C" fn(P, P) = self.g.sym("ggml_build_forward_expand");
            let gf = ng(self.ctx, 8192, false);
            for &o in outputs {
                fe(gf, o);
            }
            // `struct ggml_threadpool_params` is about 530 bytes; let ggml fill
            // a larger zeroed buffer with its defaults.
            let mut params = vec![0u64; 512];
            let init: unsafe extern "C" fn(P, i32) = self.g.sym("ggml_threadpool_params_init");
            init(params.as_mut_ptr() as P, n_threads);
            let new_tp: unsafe extern "C" fn(P) -> P = self.g.sym("ggml_threadpool_new");
            let tp = new_tp(params.as_mut_ptr() as P);
            assert!(!tp.is_null(), "ggml_threadpool_new failed");
            let plan: unsafe extern "C" fn(P, i32, P) -> CPlan = self.g.sym("ggml_graph_plan");
            let cplan = plan(gf, n_threads, tp);
            let work = vec![0u8; cplan.work_size.max(1)];
            GgmlGraph { g: self.g, gf, tp, cplan, work }
        }
    }

    /// Rebuilds node `t` of our graph in ggml from the already translated
    /// sources `s` (same order as `t.src`). `base` is our tensor's first
    /// source (for views, to turn our absolute view offset into ggml's relative one).
    pub fn translate(&self, ctx: &Context, t: &Tensor, s: &[P]) -> P {
        let c = self.ctx;
        let g = self.g;
        let src_t = |i: usize| -> &Tensor { ctx.tensor(t.src[i]).expect("source") };
        let opt = |i: usize| -> P { s.get(i).copied().unwrap_or(std::ptr::null_mut()) };
        type F1 = unsafe extern "C" fn(P, P) -> P;
        type F2 = unsafe extern "C" fn(P, P, P) -> P;
        type F3 = unsafe extern "C" fn(P, P, P, P) -> P;
        // SAFETY: each `sym` type below is the exact C signature of the named ggml op builder; `c`
        // is this live context, and the `s` entries are tensors of it translated from `t`'s sources
        // (the caller passes one per source).
        unsafe {
            let f1 = |name: &str| -> P { g.sym::<F1>(name)(c, s[0]) };
            let f2 = |name: &str| -> P { g.sym::<F2>(name)(c, s[0], s[1]) };
            let f3 = |name: &str| -> P { g.sym::<F3>(name)(c, s[0], s[1], s[2]) };
            let ne = t.ne;
            match &t.op {
                Op::None => unreachable!("leafs are created by the harness"),
                Op::Dup => f1("ggml_dup"),
                Op::Cpy => f2("ggml_cpy"),
                Op::Cont => g.sym::<unsafe extern "C" fn(P, P, i64, i64, i64, i64) -> P>("ggml_cont_4d")(
                    c, s[0], ne[0], ne[1], ne[2], ne[3],
                ),
                Op::Reshape => g.sym::<unsafe extern "C" fn(P, P, i64, i64, i64, i64) -> P>("ggml_reshape_4d")(
                    c, s[0], ne[0], ne[1], ne[2], ne[3],
                ),
                Op::View => {
                    let b = src_t(0);
                    let rel = t.view_offs - if b.view_src.is_some() { b.view_offs } else { 0 };
                    g.sym::<unsafe extern "C" fn(P, P, i64, i64, i64, i64, usize, usize, usize, usize) -> P>(
                        "ggml_view_4d",
                    )(c, s[0], ne[0], ne[1], ne[2], ne[3], t.nb[1], t.nb[2], t.nb[3], rel)
                }
                Op::Permute { axes } => g.sym::<unsafe extern "C" fn(P, P, i32, i32, i32, i32) -> P>("ggml_permute")(
                    c,
                    s[0],
                    axes[0] as i32,
                    axes[1] as i32,
                    axes[2] as i32,
                    axes[3] as i32,
                ),
                Op::Transpose => f1("ggml_transpose"),
                Op::GetRows => f2("ggml_get_rows"),
                // Ours: src = [rows, indices, destination]; ggml_set_rows(dst, rows, indices).
                Op::SetRows => g.sym::<F3>("ggml_set_rows")(c, s[2], s[0], s[1]),
                Op::Concat { dim } => {
                    g.sym::<unsafe extern "C" fn(P, P, P, i32) -> P>("ggml_concat")(c, s[0], s[1], *dim as i32)
                }
                Op::Add => f2("ggml_add"),
                Op::Sub => f2("ggml_sub"),
                Op::Mul => f2("ggml_mul"),
                Op::Div => f2("ggml_div"),
                Op::Add1 => f2("ggml_add1"),
                Op::AddId => f3("ggml_add_id"),
                Op::Scale { s: k, b } => {
                    g.sym::<unsafe extern "C" fn(P, P, f32, f32) -> P>("ggml_scale_bias")(c, s[0], *k, *b)
                }
                // ggml_clamp works in place (its result is a view of its
                // input); clamp a copy so the input's other readers and the
                // result's layout match ours (a new contiguous tensor).
                Op::Clamp { min, max } => {
                    let copy = g.sym::<F1>("ggml_cont")(c, s[0]);
                    g.sym::<unsafe extern "C" fn(P, P, f32, f32) -> P>("ggml_clamp")(c, copy, *min, *max)
                }
                Op::Sqr => f1("ggml_sqr"),
                Op::Sqrt => f1("ggml_sqrt"),
                Op::Sum => f1("ggml_sum"),
                Op::SumRows => f1("ggml_sum_rows"),
                Op::Mean => f1("ggml_mean"),
                Op::RmsNorm { eps } => g.sym::<unsafe extern "C" fn(P, P, f32) -> P>("ggml_rms_norm")(c, s[0], *eps),
                Op::Norm { eps } => g.sym::<unsafe extern "C" fn(P, P, f32) -> P>("ggml_norm")(c, s[0], *eps),
                Op::L2Norm { eps } => g.sym::<unsafe extern "C" fn(P, P, f32) -> P>("ggml_l2_norm")(c, s[0], *eps),
                Op::MulMat => f2("ggml_mul_mat"),
                Op::MulMatId => f3("ggml_mul_mat_id"),
                Op::Rope(p) => match p.mode {
                    RopeMode::Mrope | RopeMode::Imrope => {
                        let mut sections = p.sections;
                        g.sym::<unsafe extern "C" fn(
                            P,
                            P,
                            P,
                            P,
                            i32,
                            *mut i32,
                            i32,
                            i32,
                            f32,
                            f32,
                            f32,
                            f32,
                            f32,
                            f32,
                        ) -> P>("ggml_rope_multi")(
                            c,
                            s[0],
                            s[1],
                            opt(2),
                            p.n_dims,
                            sections.as_mut_ptr(),
                            p.mode.ggml_mode(),
                            p.n_ctx_orig,
                            p.freq_base,
                            p.freq_scale,
                            p.ext_factor,
                            p.attn_factor,
                            p.beta_fast,
                            p.beta_slow,
                        )
                    }
                    _ => g.sym::<unsafe extern "C" fn(P, P, P, P, i32, i32, i32, f32, f32, f32, f32, f32, f32) -> P>(
                        "ggml_rope_ext",
                    )(
                        c,
                        s[0],
                        s[1],
                        opt(2),
                        p.n_dims,
                        p.mode.ggml_mode(),
                        p.n_ctx_orig,
                        p.freq_base,
                        p.freq_scale,
                        p.ext_factor,
                        p.attn_factor,
                        p.beta_fast,
                        p.beta_slow,
                    ),
                },
                // Sources [x, mask, sinks]: ggml sets the sinks on the node it built.
                Op::SoftMax { scale, max_bias } => {
                    let r = g.sym::<unsafe extern "C" fn(P, P, P, f32, f32) -> P>("ggml_soft_max_ext")(
                        c,
                        s[0],
                        opt(1),
                        *scale,
                        *max_bias,
                    );
                    if let Some(&sinks) = s.get(2) {
                        g.sym::<unsafe extern "C" fn(P, P)>("ggml_soft_max_add_sinks")(r, sinks);
                    }
                    r
                }
                // Sources [q, k, v, mask, sinks], likewise.
                Op::FlashAttnExt { scale, max_bias, logit_softcap } => {
                    let r = g.sym::<unsafe extern "C" fn(P, P, P, P, P, f32, f32, f32) -> P>("ggml_flash_attn_ext")(
                        c,
                        s[0],
                        s[1],
                        s[2],
                        opt(3),
                        *scale,
                        *max_bias,
                        *logit_softcap,
                    );
                    if let Some(&sinks) = s.get(4) {
                        g.sym::<unsafe extern "C" fn(P, P)>("ggml_flash_attn_ext_add_sinks")(r, sinks);
                    }
                    r
                }
                Op::Glu { op, swapped } => {
                    let id = match op {
                        GluOp::Geglu => 1,
                        GluOp::Swiglu => 2,
                    };
                    if s.len() == 2 {
                        g.sym::<unsafe extern "C" fn(P, P, P, i32) -> P>("ggml_glu_split")(c, s[0], s[1], id)
                    } else {
                        g.sym::<unsafe extern "C" fn(P, P, i32, bool) -> P>("ggml_glu")(c, s[0], id, *swapped)
                    }
                }
                Op::Unary(u) => {
                    let id = match u {
                        UnaryOp::Abs => 0,
                        UnaryOp::Neg => 2,
                        UnaryOp::Tanh => 4,
                        UnaryOp::Relu => 6,
                        UnaryOp::Sigmoid => 7,
                        UnaryOp::Gelu => 8,
                        UnaryOp::GeluQuick => 9,
                        UnaryOp::Silu => 10,
                        UnaryOp::Exp => 13,
                        UnaryOp::Softplus => 15,
                    };
                    g.sym::<unsafe extern "C" fn(P, P, i32) -> P>("ggml_unary")(c, s[0], id)
                }
                Op::Argmax => f1("ggml_argmax"),
                Op::TopK { k } => g.sym::<unsafe extern "C" fn(P, P, i32) -> P>("ggml_top_k")(c, s[0], *k),
                Op::Argsort { order } => g.sym::<unsafe extern "C" fn(P, P, i32) -> P>("ggml_argsort")(
                    c,
                    s[0],
                    match order {
                        SortOrder::Asc => 0,
                        SortOrder::Desc => 1,
                    },
                ),
                Op::SsmConv => f2("ggml_ssm_conv"),
                Op::GatedDeltaNet { k_snapshots } => g
                    .sym::<unsafe extern "C" fn(P, P, P, P, P, P, P, i64) -> P>("ggml_gated_delta_net")(
                    c,
                    s[0],
                    s[1],
                    s[2],
                    s[3],
                    s[4],
                    s[5],
                    *k_snapshots,
                ),
                Op::Repeat => g.sym::<unsafe extern "C" fn(P, P, i64, i64, i64, i64) -> P>("ggml_repeat_4d")(
                    c, s[0], ne[0], ne[1], ne[2], ne[3],
                ),
                Op::Pad { lp, rp } => g
                    .sym::<unsafe extern "C" fn(P, P, i32, i32, i32, i32, i32, i32, i32, i32) -> P>("ggml_pad_ext")(
                    c, s[0], lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3],
                ),
                Op::Fill { c: v } => g.sym::<unsafe extern "C" fn(P, P, f32) -> P>("ggml_fill")(c, s[0], *v),
                // The meta backend's own ops have no ggml counterpart (no public
                // constructor makes them, so no case reaches here).
                Op::Exchange | Op::RowStats { .. } | Op::RowFinish { .. } | Op::AddN | Op::GetRowsPart { .. } => {
                    panic!("{} has no ggml counterpart", t.op.name())
                }
            }
        }
    }
}

/// `struct ggml_cplan` (ggml-cpu.h).
#[repr(C)]
struct CPlan {
    work_size: usize,
    work_data: *mut u8,
    n_threads: i32,
    threadpool: P,
    abort_callback: P,
    abort_callback_data: P,
    use_ref: bool,
}

/// A ggml graph built once, computed many times with its own thread pool
/// (see [`GgmlCtx::graph`]); the pool is freed on drop.
pub struct GgmlGraph<'a> {
    g: &'a Ggml,
    gf: P,
    tp: P,
    cplan: CPlan,
    work: Vec<u8>,
}

impl GgmlGraph<'_> {
    /// Runs `ggml_graph_compute` once.
    pub fn compute(&mut self) {
        // SAFETY: `ggml_graph_compute(struct ggml_cgraph *, struct ggml_cplan *)` is the exact
        // signature; `work_data` points into `self.work`, sized `cplan.work_size` by
        // `ggml_graph_plan`, and lives as long as `self`.
        unsafe {
            self.cplan.work_data = self.work.as_mut_ptr();
            let cp: unsafe extern "C" fn(P, *mut CPlan) -> i32 = self.g.sym("ggml_graph_compute");
            let st = cp(self.gf, &mut self.cplan);
            assert_eq!(st, 0, "ggml_graph_compute failed with status {st}");
        }
    }
}

impl Drop for GgmlGraph<'_> {
    fn drop(&mut self) {
        // SAFETY: `ggml_threadpool_free` is the exact signature, and `self.tp` is the non-null pool
        // from `ggml_threadpool_new`, freed only here, once.
        unsafe {
            let free: unsafe extern "C" fn(P) = self.g.sym("ggml_threadpool_free");
            free(self.tp)
        }
    }
}

/// Unused-import guard for the tensor id type in docs.
pub fn _id(_: TensorId) {}
