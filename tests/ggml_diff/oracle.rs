//! The ggml oracles: the real ggml, loaded with `libloading`, in two
//! releases that a process can hold side by side (each pair of libraries
//! resolves its own symbols):
//! - **0.25.3**, the `libggml-base.so`/`libggml-cpu.so` that
//!   llama-cpp-python 0.3.36 bundles (the set-up installs it), found through
//!   `GGML_0_25_LIB_DIR`, else `.venv/lib/python3*/site-packages/llama_cpp/lib`;
//! - **0.15.3**, built by `pip install ggml-python==0.0.45`, found through
//!   `GGML_LIB_DIR`, else `.venv/lib/python3*/site-packages/ggml/lib`
//!   (what it still covers that 0.25.3 does not: `docs/testing.md`).
//!
//! Each load is checked with `ggml_version()`, so a library of another
//! release is refused with a message. An oracle is a [`Ggml`] value that
//! knows its [`Version`].
//!
//! The two releases' C API is the same for every function called here (the
//! declarations in 0.25.3's `ggml.h`/`ggml-cpu.h` and those of 0.15.3, as
//! ggml-python 0.0.45 transcribes them, are equal, `GGML_CALL` aside), and
//! so are `struct ggml_init_params`, `struct ggml_cplan` and the first
//! fields of `struct ggml_tensor` (`type`, `buffer`, `ne[4]`, `nb[4]`),
//! which are the only struct layouts used. What differs is the type list:
//! `GGML_TYPE_COUNT` is 42 in 0.15.3 and 43 in 0.25.3, which adds Q2_0
//! ([`Version::has_type`]).
//!
//! [`GgmlCtx`] wraps each ggml function used in a safe method with the
//! function's exact C signature, so the unsafe calls live in this file.
#![allow(dead_code, clippy::missing_safety_doc, clippy::too_many_arguments)]

use shardgraph::{Context, GgmlType, GluOp, Op, RopeMode, SortOrder, Tensor, TensorId, UnaryOp};
use std::ffi::{c_char, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

/// `struct ggml_tensor *` / `struct ggml_context *` / `struct ggml_cgraph *`.
pub type P = *mut c_void;

/// A ggml release the suite can load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// ggml 0.15.3 (ggml-python 0.0.45).
    V0_15_3,
    /// ggml 0.25.3 (llama-cpp-python 0.3.36).
    V0_25_3,
}

impl Version {
    /// Every release, oldest first.
    pub const ALL: [Version; 2] = [Version::V0_15_3, Version::V0_25_3];

    /// `"0.15.3"`, as `ggml_version()` says it.
    pub fn name(self) -> &'static str {
        match self {
            Version::V0_15_3 => "0.15.3",
            Version::V0_25_3 => "0.25.3",
        }
    }

    /// `GGML_TYPE_COUNT` of the release's `ggml.h`.
    pub fn type_count(self) -> u32 {
        match self {
            Version::V0_15_3 => 42,
            Version::V0_25_3 => 43,
        }
    }

    /// Whether the release has type `ty` (ids are stable across releases;
    /// later releases append types).
    pub fn has_type(self, ty: GgmlType) -> bool {
        ty.id() < self.type_count()
    }

    /// The variable that points at the release's libraries.
    pub fn env(self) -> &'static str {
        match self {
            Version::V0_15_3 => "GGML_LIB_DIR",
            Version::V0_25_3 => "GGML_0_25_LIB_DIR",
        }
    }

    /// The Python package folder (under `site-packages`) that holds its libraries.
    fn package_lib(self) -> &'static str {
        match self {
            Version::V0_15_3 => "ggml/lib",
            Version::V0_25_3 => "llama_cpp/lib",
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[repr(C)]
struct InitParams {
    mem_size: usize,
    mem_buffer: *mut c_void,
    no_alloc: bool,
}

/// One loaded release.
pub struct Ggml {
    /// Which release.
    pub version: Version,
    base: libloading::Library,
    cpu: libloading::Library,
    /// Folder the libraries were loaded from.
    pub dir: PathBuf,
}

static ORACLES: [OnceLock<Result<Ggml, String>>; 2] = [OnceLock::new(), OnceLock::new()];

/// Where release `v`'s shared libraries are: its variable
/// ([`Version::env`]), else the repo's `.venv`.
pub fn lib_dir(v: Version) -> Result<PathBuf, String> {
    if let Ok(d) = std::env::var(v.env()) {
        return Ok(PathBuf::from(d));
    }
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv").join("lib");
    let entries = std::fs::read_dir(&lib).map_err(|e| format!("{}: {e} (run the README set-up)", lib.display()))?;
    for e in entries.flatten() {
        let d = e.path().join("site-packages").join(v.package_lib());
        if d.join("libggml-base.so").exists() {
            return Ok(d);
        }
    }
    Err(format!("no {} under {}/python3*/site-packages (set {})", v.package_lib(), lib.display(), v.env()))
}

impl Ggml {
    /// Release `v`, loaded once per process; `Err` says why it is missing
    /// (no library, or a library of another release).
    pub fn load(v: Version) -> Result<&'static Ggml, String> {
        ORACLES[v.slot()]
            .get_or_init(|| {
                let dir = lib_dir(v)?;
                // SAFETY: loading ggml runs its (trivial) constructors only; `ggml_version` is
                // `const char * ggml_version(void)` in both releases and returns a static string.
                unsafe {
                    let base = libloading::Library::new(dir.join("libggml-base.so")).map_err(|e| e.to_string())?;
                    let cpu = libloading::Library::new(dir.join("libggml-cpu.so")).map_err(|e| e.to_string())?;
                    let version: libloading::Symbol<unsafe extern "C" fn() -> *const c_char> =
                        base.get(b"ggml_version\0").map_err(|e| format!("{}: {e}", dir.display()))?;
                    let got = CStr::from_ptr(version()).to_string_lossy().into_owned();
                    if got != v.name() {
                        return Err(format!("{} holds ggml {got}, not {v}", dir.display()));
                    }
                    Ok(Ggml { version: v, base, cpu, dir })
                }
            })
            .as_ref()
            .map_err(|e| e.clone())
    }

    /// The oracle of the tests that use one release (shapes in `props`,
    /// the ops bench): ggml 0.15.3, as before the suite loaded two.
    pub fn get() -> Result<&'static Ggml, String> {
        Ggml::load(Version::V0_15_3)
    }

    /// Looks a function up by name in libggml-base or libggml-cpu.
    ///
    /// # Safety
    /// `F` must be the function's exact C signature.
    pub unsafe fn sym<F: Copy>(&self, name: &str) -> F {
        let n = format!("{name}\0");
        // SAFETY: the caller guarantees `F` is the symbol's exact C signature
        // (this fn's `# Safety`); `n` is NUL-terminated, and the copied
        // function pointer stays valid while `self` (a static oracle) keeps
        // both libraries loaded.
        unsafe {
            if let Ok(s) = self.base.get::<F>(n.as_bytes()) {
                return *s;
            }
            match self.cpu.get::<F>(n.as_bytes()) {
                Ok(s) => *s,
                Err(e) => panic!("ggml {} oracle: symbol {name} not found: {e}", self.version),
            }
        }
    }

    /// A ggml context with `mem` bytes (tensor data allocated inside).
    pub fn init(&self, mem: usize) -> GgmlCtx<'_> {
        self.init_with(mem, false)
    }

    /// A ggml context that holds descriptors only (`no_alloc = true`): for
    /// shape checks without computing.
    pub fn init_no_alloc(&self, mem: usize) -> GgmlCtx<'_> {
        self.init_with(mem, true)
    }

    fn init_with(&self, mem: usize, no_alloc: bool) -> GgmlCtx<'_> {
        // SAFETY: exact signature of ggml_init (struct passed by value, same layout in both releases).
        let ctx = unsafe {
            let f: unsafe extern "C" fn(InitParams) -> P = self.sym("ggml_init");
            f(InitParams { mem_size: mem, mem_buffer: std::ptr::null_mut(), no_alloc })
        };
        assert!(!ctx.is_null(), "ggml_init failed for {mem} bytes");
        GgmlCtx { g: self, ctx }
    }

    /// `ggml_quantize_requires_imatrix(type)`.
    pub fn requires_imatrix(&self, ty: GgmlType) -> bool {
        // SAFETY: `bool ggml_quantize_requires_imatrix(enum ggml_type)`, a plain function of the id.
        unsafe { self.sym::<unsafe extern "C" fn(i32) -> bool>("ggml_quantize_requires_imatrix")(ty.id() as i32) }
    }

    /// ggml's reference quantization of `nrows` rows (`ggml_quantize_chunk`),
    /// with importance matrix `imatrix` (`n_per_row` weights) or none.
    pub fn quantize_chunk(
        &self,
        ty: GgmlType,
        src: &[f32],
        nrows: usize,
        n_per_row: usize,
        imatrix: Option<&[f32]>,
    ) -> Vec<u8> {
        assert!(self.version.has_type(ty), "ggml {} has no {ty}", self.version);
        assert_eq!(src.len(), nrows * n_per_row);
        assert!(imatrix.is_none_or(|w| w.len() == n_per_row));
        // SAFETY: every `sym` type is the C signature of `ggml_row_size` / `ggml_quantize_chunk`
        // (ggml.h); `src` holds nrows·n_per_row floats, `imatrix` (if any) n_per_row, and `out` is
        // sized by ggml's own row size for nrows rows, so the quantizer writes inside it.
        unsafe {
            let row_size: unsafe extern "C" fn(i32, i64) -> usize = self.sym("ggml_row_size");
            let q: unsafe extern "C" fn(i32, *const f32, *mut c_void, i64, i64, i64, *const f32) -> usize =
                self.sym("ggml_quantize_chunk");
            let rs = row_size(ty.id() as i32, n_per_row as i64);
            let mut out = vec![0u8; rs * nrows];
            q(
                ty.id() as i32,
                src.as_ptr(),
                out.as_mut_ptr() as P,
                0,
                nrows as i64,
                n_per_row as i64,
                imatrix.map_or(std::ptr::null(), |w| w.as_ptr()),
            );
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
    // ggml_backend_buffer * buffer; int64_t ne[4]; size_t nb[4];` (ggml.h of both releases).
    unsafe {
        let base = t as *const u8;
        let ne = std::ptr::read_unaligned(base.add(16) as *const [i64; 4]);
        let nb = std::ptr::read_unaligned(base.add(48) as *const [usize; 4]);
        (ne, nb)
    }
}

/// ggml's functions `f(ctx, a)` called through [`GgmlCtx::f1`].
const F1: &[&str] = &[
    "ggml_dup",
    "ggml_cont",
    "ggml_transpose",
    "ggml_sqr",
    "ggml_sqrt",
    "ggml_sum",
    "ggml_sum_rows",
    "ggml_mean",
    "ggml_argmax",
    "ggml_soft_max",
];
/// ggml's functions `f(ctx, a, b)` called through [`GgmlCtx::f2`].
const F2: &[&str] = &[
    "ggml_cpy",
    "ggml_get_rows",
    "ggml_add",
    "ggml_sub",
    "ggml_mul",
    "ggml_div",
    "ggml_add1",
    "ggml_mul_mat",
    "ggml_repeat",
    "ggml_ssm_conv",
    "ggml_swiglu_split",
    "ggml_geglu_split",
];
/// ggml's functions `f(ctx, a, b, c)` called through [`GgmlCtx::f3`].
const F3: &[&str] = &["ggml_set_rows", "ggml_add_id", "ggml_mul_mat_id"];
/// ggml's functions `f(ctx, a, float)` called through [`GgmlCtx::f1f`].
const F1F: &[&str] = &["ggml_rms_norm", "ggml_norm", "ggml_l2_norm", "ggml_scale", "ggml_fill"];

/// ggml's `enum ggml_unary_op` id of `u` (ggml.h).
pub fn unary_id(u: UnaryOp) -> i32 {
    match u {
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
    }
}

/// ggml's `enum ggml_glu_op` id of `g` (ggml.h).
pub fn glu_id(g: GluOp) -> i32 {
    match g {
        GluOp::Geglu => 1,
        GluOp::Swiglu => 2,
    }
}

/// ggml's `enum ggml_sort_order` of `o` (ggml.h).
pub fn sort_id(o: SortOrder) -> i32 {
    match o {
        SortOrder::Asc => 0,
        SortOrder::Desc => 1,
    }
}

/// ggml's rope mode of `m` (`GGML_ROPE_TYPE_*` in ggml.h: normal 0, NeoX 2,
/// multi-section 8, interleaved multi-section 40).
pub fn rope_mode_id(m: RopeMode) -> i32 {
    match m {
        RopeMode::Normal => 0,
        RopeMode::Neox => 2,
        RopeMode::Mrope => 8,
        RopeMode::Imrope => 40,
    }
}

/// The arguments of `ggml_rope_ext` / `ggml_rope_multi` after the tensors.
#[derive(Clone, Copy, Debug)]
pub struct RopeArgs {
    /// Rotated dimensions.
    pub n_dims: i32,
    /// ggml's mode ([`rope_mode_id`]).
    pub mode: i32,
    /// Original context of YaRN.
    pub n_ctx_orig: i32,
    /// Frequency base.
    pub freq_base: f32,
    /// Frequency scale.
    pub freq_scale: f32,
    /// YaRN extrapolation mix.
    pub ext_factor: f32,
    /// Magnitude scale.
    pub attn_factor: f32,
    /// YaRN β fast.
    pub beta_fast: f32,
    /// YaRN β slow.
    pub beta_slow: f32,
}

type Nd4 = unsafe extern "C" fn(P, P, i64, i64, i64, i64) -> P;

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

    // ------------------------------------------------------------------
    // ggml's op constructors, one safe method per C signature
    // ------------------------------------------------------------------

    /// `name(ctx, a)`, for the functions in [`F1`].
    pub fn f1(&self, name: &str, a: P) -> P {
        assert!(F1.contains(&name), "{name} is not a ggml function of (ctx, a)");
        // SAFETY: every function in F1 is `struct ggml_tensor * f(struct ggml_context *, struct
        // ggml_tensor *)` (ggml.h); `a` is a tensor of this live context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P) -> P>(name)(self.ctx, a) }
    }

    /// `name(ctx, a, b)`, for the functions in [`F2`].
    pub fn f2(&self, name: &str, a: P, b: P) -> P {
        assert!(F2.contains(&name), "{name} is not a ggml function of (ctx, a, b)");
        // SAFETY: every function in F2 takes (ctx, tensor, tensor) and returns a tensor (ggml.h);
        // the operands are tensors of this live context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, P) -> P>(name)(self.ctx, a, b) }
    }

    /// `name(ctx, a, b, c)`, for the functions in [`F3`].
    pub fn f3(&self, name: &str, a: P, b: P, c: P) -> P {
        assert!(F3.contains(&name), "{name} is not a ggml function of (ctx, a, b, c)");
        // SAFETY: every function in F3 takes (ctx, tensor, tensor, tensor) and returns a tensor
        // (ggml.h); the operands are tensors of this live context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, P, P) -> P>(name)(self.ctx, a, b, c) }
    }

    /// `name(ctx, a, x)` with a float `x`, for the functions in [`F1F`].
    pub fn f1f(&self, name: &str, a: P, x: f32) -> P {
        assert!(F1F.contains(&name), "{name} is not a ggml function of (ctx, a, float)");
        // SAFETY: every function in F1F is `tensor * f(ctx, tensor *, float)` (ggml.h); `a` is a
        // tensor of this live context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, f32) -> P>(name)(self.ctx, a, x) }
    }

    /// `ggml_view_{1,2,3,4}d(a, ne[..dims], nb[1..dims], offset)`, `dims` = 1..=4.
    pub fn view(&self, a: P, dims: usize, ne: [i64; 4], nb: [usize; 3], offset: usize) -> P {
        let c = self.ctx;
        // SAFETY: the exact C signatures of ggml_view_1d … ggml_view_4d (ggml.h); `a` is a tensor of
        // this live context.
        unsafe {
            match dims {
                1 => self.g.sym::<unsafe extern "C" fn(P, P, i64, usize) -> P>("ggml_view_1d")(c, a, ne[0], offset),
                2 => self.g.sym::<unsafe extern "C" fn(P, P, i64, i64, usize, usize) -> P>("ggml_view_2d")(
                    c, a, ne[0], ne[1], nb[0], offset,
                ),
                3 => self.g.sym::<unsafe extern "C" fn(P, P, i64, i64, i64, usize, usize, usize) -> P>("ggml_view_3d")(
                    c, a, ne[0], ne[1], ne[2], nb[0], nb[1], offset,
                ),
                4 => self.g.sym::<unsafe extern "C" fn(P, P, i64, i64, i64, i64, usize, usize, usize, usize) -> P>(
                    "ggml_view_4d",
                )(c, a, ne[0], ne[1], ne[2], ne[3], nb[0], nb[1], nb[2], offset),
                _ => panic!("ggml has no {dims}-d view"),
            }
        }
    }

    /// `ggml_cont_{2,3,4}d`, `ggml_reshape_{2,3,4}d` or `ggml_repeat_4d`
    /// (`name`) with the shape `ne` (its first `dims` extents).
    pub fn nd(&self, name: &str, a: P, dims: usize, ne: [i64; 4]) -> P {
        let c = self.ctx;
        // SAFETY: the exact C signatures (ggml.h): the 2-d forms take (ctx, a, ne0, ne1), the 3-d
        // forms (ctx, a, ne0, ne1, ne2), the 4-d forms (ctx, a, ne0 … ne3), all int64_t; `a` is a
        // tensor of this live context.
        unsafe {
            match (name, dims) {
                ("ggml_cont_2d" | "ggml_reshape_2d", 2) => {
                    self.g.sym::<unsafe extern "C" fn(P, P, i64, i64) -> P>(name)(c, a, ne[0], ne[1])
                }
                ("ggml_cont_3d" | "ggml_reshape_3d", 3) => {
                    self.g.sym::<unsafe extern "C" fn(P, P, i64, i64, i64) -> P>(name)(c, a, ne[0], ne[1], ne[2])
                }
                ("ggml_cont_4d" | "ggml_reshape_4d" | "ggml_repeat_4d", 4) => {
                    self.g.sym::<Nd4>(name)(c, a, ne[0], ne[1], ne[2], ne[3])
                }
                _ => panic!("{name} with {dims} dims is not a ggml shape function"),
            }
        }
    }

    /// `ggml_permute(a, axes)`.
    pub fn permute(&self, a: P, axes: [i32; 4]) -> P {
        // SAFETY: `ggml_permute(ctx, a, int, int, int, int)` (ggml.h); `a` is a tensor of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, i32, i32, i32, i32) -> P>("ggml_permute")(
                self.ctx, a, axes[0], axes[1], axes[2], axes[3],
            )
        }
    }

    /// `ggml_concat(a, b, dim)`.
    pub fn concat(&self, a: P, b: P, dim: i32) -> P {
        // SAFETY: `ggml_concat(ctx, a, b, int dim)` (ggml.h); operands of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, P, i32) -> P>("ggml_concat")(self.ctx, a, b, dim) }
    }

    /// `ggml_cast(a, type)`.
    pub fn cast(&self, a: P, ty: GgmlType) -> P {
        // SAFETY: `ggml_cast(ctx, a, enum ggml_type)` (ggml.h); `a` is a tensor of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, i32) -> P>("ggml_cast")(self.ctx, a, ty.id() as i32) }
    }

    /// `ggml_scale_bias(a, s, b)`.
    pub fn scale_bias(&self, a: P, s: f32, b: f32) -> P {
        // SAFETY: `ggml_scale_bias(ctx, a, float, float)` (ggml.h); `a` is a tensor of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, f32, f32) -> P>("ggml_scale_bias")(self.ctx, a, s, b) }
    }

    /// `ggml_clamp(a, min, max)`. ggml's clamp works in place (its result
    /// is a view of its input).
    pub fn clamp(&self, a: P, min: f32, max: f32) -> P {
        // SAFETY: `ggml_clamp(ctx, a, float, float)` (ggml.h); `a` is a tensor of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, f32, f32) -> P>("ggml_clamp")(self.ctx, a, min, max) }
    }

    /// `ggml_unary(a, op)` with ggml's op id ([`unary_id`]).
    pub fn unary(&self, a: P, id: i32) -> P {
        // SAFETY: `ggml_unary(ctx, a, enum ggml_unary_op)` (ggml.h); `a` is a tensor of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, i32) -> P>("ggml_unary")(self.ctx, a, id) }
    }

    /// `ggml_glu(a, op, swapped)` with ggml's op id ([`glu_id`]).
    pub fn glu(&self, a: P, id: i32, swapped: bool) -> P {
        // SAFETY: `ggml_glu(ctx, a, enum ggml_glu_op, bool)` (ggml.h); `a` is a tensor of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, i32, bool) -> P>("ggml_glu")(self.ctx, a, id, swapped) }
    }

    /// `ggml_glu_split(a, b, op)` with ggml's op id ([`glu_id`]).
    pub fn glu_split(&self, a: P, b: P, id: i32) -> P {
        // SAFETY: `ggml_glu_split(ctx, a, b, enum ggml_glu_op)` (ggml.h); operands of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, P, i32) -> P>("ggml_glu_split")(self.ctx, a, b, id) }
    }

    /// `ggml_top_k(a, k)`.
    pub fn top_k(&self, a: P, k: i32) -> P {
        // SAFETY: `ggml_top_k(ctx, a, int)` (ggml.h); `a` is a tensor of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, i32) -> P>("ggml_top_k")(self.ctx, a, k) }
    }

    /// `ggml_argsort(a, order)` with ggml's order ([`sort_id`]).
    pub fn argsort(&self, a: P, order: i32) -> P {
        // SAFETY: `ggml_argsort(ctx, a, enum ggml_sort_order)` (ggml.h); `a` is a tensor of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P, i32) -> P>("ggml_argsort")(self.ctx, a, order) }
    }

    /// `ggml_soft_max_ext(a, mask or NULL, scale, max_bias)`.
    pub fn soft_max_ext(&self, a: P, mask: Option<P>, scale: f32, max_bias: f32) -> P {
        // SAFETY: `ggml_soft_max_ext(ctx, a, mask, float, float)` (ggml.h; the mask may be NULL);
        // operands of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, P, f32, f32) -> P>("ggml_soft_max_ext")(
                self.ctx,
                a,
                mask.unwrap_or(std::ptr::null_mut()),
                scale,
                max_bias,
            )
        }
    }

    /// `ggml_soft_max_add_sinks(a, sinks)` or `ggml_flash_attn_ext_add_sinks`
    /// (`name`): sets the sinks on node `a`, which it returns.
    pub fn add_sinks(&self, name: &str, a: P, sinks: P) -> P {
        assert!(
            matches!(name, "ggml_soft_max_add_sinks" | "ggml_flash_attn_ext_add_sinks"),
            "{name} is not a ggml sinks setter"
        );
        // SAFETY: both are `void f(struct ggml_tensor * a, struct ggml_tensor * sinks)` (ggml.h);
        // tensors of this context.
        unsafe { self.g.sym::<unsafe extern "C" fn(P, P)>(name)(a, sinks) };
        a
    }

    /// `ggml_rope(a, pos, n_dims, mode)`.
    pub fn rope(&self, a: P, pos: P, n_dims: i32, mode: i32) -> P {
        // SAFETY: `ggml_rope(ctx, a, b, int n_dims, int mode)` (ggml.h); operands of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, P, i32, i32) -> P>("ggml_rope")(self.ctx, a, pos, n_dims, mode)
        }
    }

    /// `ggml_rope_ext(a, pos, freq_factors or NULL, args…)`.
    pub fn rope_ext(&self, a: P, pos: P, ff: Option<P>, r: RopeArgs) -> P {
        // SAFETY: `ggml_rope_ext(ctx, a, b, c, int, int, int, float × 6)` (ggml.h; c may be NULL);
        // operands of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, P, P, i32, i32, i32, f32, f32, f32, f32, f32, f32) -> P>(
                "ggml_rope_ext",
            )(
                self.ctx,
                a,
                pos,
                ff.unwrap_or(std::ptr::null_mut()),
                r.n_dims,
                r.mode,
                r.n_ctx_orig,
                r.freq_base,
                r.freq_scale,
                r.ext_factor,
                r.attn_factor,
                r.beta_fast,
                r.beta_slow,
            )
        }
    }

    /// `ggml_rope_multi(a, pos, freq_factors or NULL, n_dims, sections, args…)`.
    pub fn rope_multi(&self, a: P, pos: P, ff: Option<P>, sections: [i32; 4], r: RopeArgs) -> P {
        let mut sections = sections;
        // SAFETY: `ggml_rope_multi(ctx, a, b, c, int n_dims, int sections[4], int mode, int
        // n_ctx_orig, float × 6)` (ggml.h; c may be NULL); ggml copies the four sections, which live
        // on this stack frame during the call; operands of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, P, P, i32, *mut i32, i32, i32, f32, f32, f32, f32, f32, f32) -> P>(
                "ggml_rope_multi",
            )(
                self.ctx,
                a,
                pos,
                ff.unwrap_or(std::ptr::null_mut()),
                r.n_dims,
                sections.as_mut_ptr(),
                r.mode,
                r.n_ctx_orig,
                r.freq_base,
                r.freq_scale,
                r.ext_factor,
                r.attn_factor,
                r.beta_fast,
                r.beta_slow,
            )
        }
    }

    /// `ggml_flash_attn_ext(q, k, v, mask or NULL, scale, max_bias, logit_softcap)`.
    pub fn flash_attn_ext(&self, q: P, k: P, v: P, mask: Option<P>, scale: f32, max_bias: f32, softcap: f32) -> P {
        // SAFETY: `ggml_flash_attn_ext(ctx, q, k, v, mask, float, float, float)` (ggml.h; the mask may
        // be NULL); operands of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, P, P, P, f32, f32, f32) -> P>("ggml_flash_attn_ext")(
                self.ctx,
                q,
                k,
                v,
                mask.unwrap_or(std::ptr::null_mut()),
                scale,
                max_bias,
                softcap,
            )
        }
    }

    /// `ggml_gated_delta_net(q, k, v, g, beta, state, K)`.
    pub fn gated_delta_net(&self, s: [P; 6], k_snapshots: i64) -> P {
        // SAFETY: `ggml_gated_delta_net(ctx, q, k, v, g, beta, state, int64_t K)` (ggml.h); operands
        // of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, P, P, P, P, P, i64) -> P>("ggml_gated_delta_net")(
                self.ctx,
                s[0],
                s[1],
                s[2],
                s[3],
                s[4],
                s[5],
                k_snapshots,
            )
        }
    }

    /// `ggml_pad(a, p0, p1, p2, p3)`.
    pub fn pad(&self, a: P, p: [i32; 4]) -> P {
        // SAFETY: `ggml_pad(ctx, a, int × 4)` (ggml.h); `a` is a tensor of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, i32, i32, i32, i32) -> P>("ggml_pad")(
                self.ctx, a, p[0], p[1], p[2], p[3],
            )
        }
    }

    /// `ggml_pad_ext(a, lp0, rp0, …, lp3, rp3)`.
    pub fn pad_ext(&self, a: P, lp: [i32; 4], rp: [i32; 4]) -> P {
        // SAFETY: `ggml_pad_ext(ctx, a, int × 8)` (ggml.h); `a` is a tensor of this context.
        unsafe {
            self.g.sym::<unsafe extern "C" fn(P, P, i32, i32, i32, i32, i32, i32, i32, i32) -> P>("ggml_pad_ext")(
                self.ctx, a, lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3],
            )
        }
    }

    /// Rebuilds node `t` of our graph in ggml from the already translated
    /// sources `s` (same order as `t.src`), with the parameters our node
    /// stores. For graphs with no description but their nodes (`props`'s
    /// random graphs); the differential suite builds its ggml graph from
    /// each case's own calls instead (`harness::Builder`).
    pub fn translate(&self, ctx: &Context, t: &Tensor, s: &[P]) -> P {
        let src_t = |i: usize| -> &Tensor { ctx.tensor(t.src[i]).expect("source") };
        let opt = |i: usize| -> Option<P> { s.get(i).copied() };
        let ne = t.ne;
        let rope_args = |p: &shardgraph::RopeParams| RopeArgs {
            n_dims: p.n_dims,
            mode: rope_mode_id(p.mode),
            n_ctx_orig: p.n_ctx_orig,
            freq_base: p.freq_base,
            freq_scale: p.freq_scale,
            ext_factor: p.ext_factor,
            attn_factor: p.attn_factor,
            beta_fast: p.beta_fast,
            beta_slow: p.beta_slow,
        };
        match &t.op {
            Op::None => unreachable!("leafs are created by the caller"),
            Op::Dup => self.f1("ggml_dup", s[0]),
            Op::Cpy => self.f2("ggml_cpy", s[0], s[1]),
            Op::Cont => self.nd("ggml_cont_4d", s[0], 4, ne),
            Op::Reshape => self.nd("ggml_reshape_4d", s[0], 4, ne),
            Op::View => {
                let b = src_t(0);
                let rel = t.view_offs - if b.view_src.is_some() { b.view_offs } else { 0 };
                self.view(s[0], 4, ne, [t.nb[1], t.nb[2], t.nb[3]], rel)
            }
            Op::Permute { axes } => self.permute(s[0], axes.map(|a| a as i32)),
            Op::Transpose => self.f1("ggml_transpose", s[0]),
            Op::GetRows => self.f2("ggml_get_rows", s[0], s[1]),
            // Ours: src = [rows, indices, destination]; ggml_set_rows(dst, rows, indices).
            Op::SetRows => self.f3("ggml_set_rows", s[2], s[0], s[1]),
            Op::Concat { dim } => self.concat(s[0], s[1], *dim as i32),
            Op::Add => self.f2("ggml_add", s[0], s[1]),
            Op::Sub => self.f2("ggml_sub", s[0], s[1]),
            Op::Mul => self.f2("ggml_mul", s[0], s[1]),
            Op::Div => self.f2("ggml_div", s[0], s[1]),
            Op::Add1 => self.f2("ggml_add1", s[0], s[1]),
            Op::AddId => self.f3("ggml_add_id", s[0], s[1], s[2]),
            Op::Scale { s: k, b } => self.scale_bias(s[0], *k, *b),
            // ggml_clamp works in place; clamp a copy so the input's other
            // readers and the result's layout match ours.
            Op::Clamp { min, max } => self.clamp(self.f1("ggml_cont", s[0]), *min, *max),
            Op::Sqr => self.f1("ggml_sqr", s[0]),
            Op::Sqrt => self.f1("ggml_sqrt", s[0]),
            Op::Sum => self.f1("ggml_sum", s[0]),
            Op::SumRows => self.f1("ggml_sum_rows", s[0]),
            Op::Mean => self.f1("ggml_mean", s[0]),
            Op::RmsNorm { eps } => self.f1f("ggml_rms_norm", s[0], *eps),
            Op::Norm { eps } => self.f1f("ggml_norm", s[0], *eps),
            Op::L2Norm { eps } => self.f1f("ggml_l2_norm", s[0], *eps),
            Op::MulMat => self.f2("ggml_mul_mat", s[0], s[1]),
            Op::MulMatId => self.f3("ggml_mul_mat_id", s[0], s[1], s[2]),
            Op::Rope(p) => match p.mode {
                RopeMode::Mrope | RopeMode::Imrope => self.rope_multi(s[0], s[1], opt(2), p.sections, rope_args(p)),
                _ => self.rope_ext(s[0], s[1], opt(2), rope_args(p)),
            },
            // Sources [x, mask, sinks]: ggml sets the sinks on the node it built.
            Op::SoftMax { scale, max_bias } => {
                let r = self.soft_max_ext(s[0], opt(1), *scale, *max_bias);
                match s.get(2) {
                    Some(&sinks) => self.add_sinks("ggml_soft_max_add_sinks", r, sinks),
                    None => r,
                }
            }
            // Sources [q, k, v, mask, sinks], likewise.
            Op::FlashAttnExt { scale, max_bias, logit_softcap } => {
                let r = self.flash_attn_ext(s[0], s[1], s[2], opt(3), *scale, *max_bias, *logit_softcap);
                match s.get(4) {
                    Some(&sinks) => self.add_sinks("ggml_flash_attn_ext_add_sinks", r, sinks),
                    None => r,
                }
            }
            Op::Glu { op, swapped } => {
                if s.len() == 2 {
                    self.glu_split(s[0], s[1], glu_id(*op))
                } else {
                    self.glu(s[0], glu_id(*op), *swapped)
                }
            }
            Op::Unary(u) => self.unary(s[0], unary_id(*u)),
            Op::Argmax => self.f1("ggml_argmax", s[0]),
            Op::TopK { k } => self.top_k(s[0], *k),
            Op::Argsort { order } => self.argsort(s[0], sort_id(*order)),
            Op::SsmConv => self.f2("ggml_ssm_conv", s[0], s[1]),
            Op::GatedDeltaNet { k_snapshots } => {
                self.gated_delta_net([s[0], s[1], s[2], s[3], s[4], s[5]], *k_snapshots)
            }
            Op::Repeat => self.nd("ggml_repeat_4d", s[0], 4, ne),
            Op::Pad { lp, rp } => self.pad_ext(s[0], *lp, *rp),
            Op::Fill { c } => self.f1f("ggml_fill", s[0], *c),
            // The meta backend's own ops have no ggml counterpart (no public
            // constructor makes them, so no graph reaches here).
            Op::Exchange | Op::RowStats { .. } | Op::RowFinish { .. } | Op::AddN | Op::GetRowsPart { .. } => {
                panic!("{} has no ggml counterpart", t.op.name())
            }
        }
    }
}

/// `struct ggml_cplan` (ggml-cpu.h, both releases).
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
