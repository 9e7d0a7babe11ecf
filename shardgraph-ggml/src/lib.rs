//! shardgraph as a ggml backend library: `libshardgraph_ggml.so` exports
//! ggml's dynamic-backend entry point `ggml_backend_init` (backend API
//! version 2, ggml 0.25.3), so llama.cpp, its tools and every engine built
//! on ggml load it at run time (`ggml_backend_load(path)`, or the
//! `GGML_BACKEND_PATH` environment variable read by
//! `ggml_backend_load_all`) and run their graphs through shardgraph, with no
//! change to their code.
//!
//! The registry `SG` has one device, `SG`. Its buffers are shardgraph CPU
//! buffers (host memory); its backend translates each `ggml_cgraph` it is
//! given into a shardgraph graph op by op (`translate.rs`, ops matched by
//! their ggml names) and computes it there, on the bytes where ggml's
//! allocator placed them. `supports_op` is true exactly where that
//! translation succeeds and the shardgraph backend runs the node, so ggml's
//! scheduler gives everything else to another backend.
//!
//! Translations are cached by a fingerprint of the graph (a decode step
//! replays the one of the step before). With `SHARDGRAPH_DEVICES` the
//! graphs run tensor-parallel over sub-devices (`meta.rs`, split by
//! `policy.rs`); the tensors that live in the sub-devices' store (weights,
//! caches) are read and written there by ggml's buffer functions.
//!
//! Environment: `SHARDGRAPH_THREADS` (worker threads; default the
//! machine's parallelism, and on one device llama.cpp's `--threads`
//! through `ggml_backend_set_n_threads`; sub-devices take their share of
//! `SHARDGRAPH_THREADS` when the backend is made), `SHARDGRAPH_DEVICES`,
//! `SHARDGRAPH_TENSOR_SPLIT`, `SHARDGRAPH_SPLIT_MODE=layer|tensor`
//! (llama.cpp's `--split-mode` over the sub-devices; default tensor),
//! `SHARDGRAPH_GGML_MAX_GRAPHS` (graphs translated over sub-devices before
//! the meta backend starts again, caches kept: bounds what new graph
//! shapes hold; default 64),
//! `SHARDGRAPH_GGML_VERBOSE=1` (translation
//! errors, cache hits, bytes exchanged, on standard error; `2` adds the
//! plan of each new graph over sub-devices: every repartition with its
//! bytes).
//!
//! SG computes synchronously; its asynchronous copies and events
//! (`events.rs`) are complete when their calls return, which lets ggml's
//! scheduler use SG in its parallel mode. What is not here yet: a step
//! that llama.cpp splits into several SG graphs over sub-devices (`-nkvo`)
//! is refused with an error.

mod events;
mod ffi;
mod ggml;
mod meta;
mod paths;
mod policy;
#[cfg(test)]
#[path = "../../tests/common/require.rs"]
mod require;
mod translate;

use ffi::*;
use shardgraph::backend::cpu::{CpuBuffer, CPU_ALIGNMENT};
use shardgraph::{Backend, CpuBackend, CpuConfig};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

/// The registry, device and buffer type: allocated once, never freed (ggml
/// keeps pointers to them for the life of the process).
struct State {
    reg: *mut ggml_backend_reg,
    dev: *mut ggml_backend_device,
    buft: *mut ggml_backend_buffer_type,
    name: CString,
    description: CString,
    /// Allocates the device's buffers.
    alloc: CpuBackend,
}

// SAFETY: the raw pointers point at leaked, never-mutated-after-init
// structures that ggml reads from any thread.
unsafe impl Send for State {}
// SAFETY: as above.
unsafe impl Sync for State {}

static STATE: OnceLock<Option<State>> = OnceLock::new();

/// `SHARDGRAPH_GGML_VERBOSE` is 1 or 2.
pub(crate) fn verbose() -> bool {
    verbosity() >= 1
}

/// `SHARDGRAPH_GGML_VERBOSE`'s level: 0 (unset or another value), 1, 2.
pub(crate) fn verbosity() -> u8 {
    match std::env::var("SHARDGRAPH_GGML_VERBOSE").as_deref() {
        Ok("1") => 1,
        Ok("2") => 2,
        _ => 0,
    }
}

fn default_threads() -> usize {
    std::env::var("SHARDGRAPH_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| (1..=shardgraph::backend::cpu::MAX_THREADS).contains(&n))
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

fn state() -> Option<&'static State> {
    STATE.get_or_init(init_state).as_ref()
}

fn init_state() -> Option<State> {
    let g = match ggml::ggml() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("shardgraph-ggml: {e}");
            return None;
        }
    };
    let alloc = match CpuBackend::new(CpuConfig { n_threads: 1, ..CpuConfig::default() }) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("shardgraph-ggml: {e}");
            return None;
        }
    };
    let reg = Box::into_raw(Box::new(ggml_backend_reg {
        api_version: GGML_BACKEND_API_VERSION,
        iface: ggml_backend_reg_i {
            get_name: Some(reg_get_name),
            get_device_count: Some(reg_get_device_count),
            get_device: Some(reg_get_device),
            get_proc_address: Some(reg_get_proc_address),
        },
        context: std::ptr::null_mut(),
    }));
    let dev = Box::into_raw(Box::new(ggml_backend_device {
        iface: ggml_backend_device_i {
            get_name: Some(dev_get_name),
            get_description: Some(dev_get_description),
            get_memory: Some(dev_get_memory),
            get_type: Some(dev_get_type),
            get_props: Some(dev_get_props),
            init_backend: Some(dev_init_backend),
            get_buffer_type: Some(dev_get_buffer_type),
            get_host_buffer_type: None,
            buffer_from_host_ptr: None,
            supports_op: Some(dev_supports_op),
            supports_buft: Some(dev_supports_buft),
            offload_op: None,
            event_new: Some(events::event_new),
            event_free: Some(events::event_free),
            event_synchronize: Some(events::event_synchronize),
        },
        reg,
        context: std::ptr::null_mut(),
    }));
    let buft = Box::into_raw(Box::new(ggml_backend_buffer_type {
        iface: ggml_backend_buffer_type_i {
            get_name: Some(buft_get_name),
            alloc_buffer: Some(buft_alloc_buffer),
            get_alignment: Some(buft_get_alignment),
            get_max_size: None,
            get_alloc_size: None,
            is_host: Some(buft_is_host),
        },
        device: dev,
        context: std::ptr::null_mut(),
    }));
    Some(State {
        reg,
        dev,
        buft,
        name: CString::new("SG").unwrap_or_default(),
        description: CString::new(format!("shardgraph: 1 CPU sub-device (on ggml {})", g.version)).unwrap_or_default(),
        alloc,
    })
}

/// ggml's dynamic-backend entry point: the registry, or null (with the
/// reason on standard error) where the process's ggml is not the 0.25
/// series this library is written for or cannot be found.
///
/// # Safety
/// Called by ggml's loader once the library is loaded.
#[no_mangle]
pub unsafe extern "C" fn ggml_backend_init() -> *mut ggml_backend_reg {
    catch_unwind(|| state().map_or(std::ptr::null_mut(), |s| s.reg)).unwrap_or(std::ptr::null_mut())
}

/// Runs `f`, turning a panic into `fallback` (a panic must not unwind
/// into ggml's C++).
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        eprintln!("shardgraph-ggml: internal panic caught at the ggml boundary");
        fallback
    })
}

// ---- registry ----

unsafe extern "C" fn reg_get_name(_: *mut ggml_backend_reg) -> *const c_char {
    c"SG".as_ptr()
}

unsafe extern "C" fn reg_get_device_count(_: *mut ggml_backend_reg) -> usize {
    1
}

unsafe extern "C" fn reg_get_device(_: *mut ggml_backend_reg, i: usize) -> *mut ggml_backend_device {
    match (i, state()) {
        (0, Some(s)) => s.dev,
        _ => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn reg_get_proc_address(_: *mut ggml_backend_reg, name: *const c_char) -> *mut c_void {
    if name.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: ggml passes a NUL-terminated name.
    match unsafe { CStr::from_ptr(name) }.to_bytes() {
        b"ggml_backend_set_n_threads" => backend_set_n_threads as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

// ---- device ----

unsafe extern "C" fn dev_get_name(_: *mut ggml_backend_device) -> *const c_char {
    state().map_or(c"SG".as_ptr(), |s| s.name.as_ptr())
}

unsafe extern "C" fn dev_get_description(_: *mut ggml_backend_device) -> *const c_char {
    state().map_or(c"shardgraph".as_ptr(), |s| s.description.as_ptr())
}

fn memory() -> (usize, usize) {
    let free = shardgraph::backend::cpu::host_memory_available().unwrap_or(0) as usize;
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
        })
        .map_or(free, |k| k.saturating_mul(1024));
    (free, total)
}

unsafe extern "C" fn dev_get_memory(_: *mut ggml_backend_device, free: *mut usize, total: *mut usize) {
    let (f, t) = memory();
    // SAFETY: ggml passes valid out-pointers.
    unsafe {
        if !free.is_null() {
            *free = f;
        }
        if !total.is_null() {
            *total = t;
        }
    }
}

unsafe extern "C" fn dev_get_type(_: *mut ggml_backend_device) -> c_int {
    GGML_BACKEND_DEVICE_TYPE_GPU
}

unsafe extern "C" fn dev_get_props(dev: *mut ggml_backend_device, props: *mut ggml_backend_dev_props) {
    if props.is_null() {
        return;
    }
    let (f, t) = memory();
    // SAFETY: ggml passes a valid out-pointer.
    unsafe {
        *props = ggml_backend_dev_props {
            name: dev_get_name(dev),
            description: dev_get_description(dev),
            memory_free: f,
            memory_total: t,
            type_: GGML_BACKEND_DEVICE_TYPE_GPU,
            device_id: std::ptr::null(),
            caps: ggml_backend_dev_caps {
                async_: true,
                host_buffer: false,
                buffer_from_host_ptr: false,
                events: true,
                mmap_support: false,
            },
        }
    };
}

unsafe extern "C" fn dev_get_buffer_type(_: *mut ggml_backend_device) -> *mut ggml_backend_buffer_type {
    state().map_or(std::ptr::null_mut(), |s| s.buft)
}

unsafe extern "C" fn dev_supports_buft(_: *mut ggml_backend_device, buft: *mut ggml_backend_buffer_type) -> bool {
    state().is_some_and(|s| s.buft == buft)
}

unsafe extern "C" fn dev_supports_op(_: *mut ggml_backend_device, op: *const ggml_tensor) -> bool {
    guard(false, || {
        let (Ok(g), Some(s)) = (ggml::ggml(), state()) else { return false };
        if op.is_null() {
            return false;
        }
        let mut tr = translate::Translator::new(g, &[op as *mut ggml_tensor], None);
        // SAFETY: ggml passes a live tensor whose sources are live.
        match unsafe { tr.tensor(op) } {
            Ok(id) => s.alloc.supports_op(tr.context(), id),
            Err(e) => {
                if verbose() {
                    eprintln!("shardgraph-ggml: supports_op: {e}");
                }
                false
            }
        }
    })
}

unsafe extern "C" fn dev_init_backend(dev: *mut ggml_backend_device, _params: *const c_char) -> *mut ggml_backend {
    guard(std::ptr::null_mut(), || {
        let n = default_threads();
        let cpu = match CpuBackend::new(CpuConfig { n_threads: n, ..CpuConfig::default() }) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("shardgraph-ggml: {e}");
                return std::ptr::null_mut();
            }
        };
        let meta = match meta::Meta::from_env(n) {
            Ok(m) => m.map(|m| Arc::new(Mutex::new(m))),
            Err(e) => {
                eprintln!("shardgraph-ggml: {e}");
                return std::ptr::null_mut();
            }
        };
        let ctx = Box::into_raw(Box::new(BackendCtx {
            meta,
            cpu: Mutex::new((n, cpu)),
            cache: Mutex::new(Vec::new()),
            hits: Default::default(),
            misses: Default::default(),
        }));
        Box::into_raw(Box::new(ggml_backend {
            guid: &GUID as *const [u8; 16] as *mut [u8; 16],
            iface: ggml_backend_i {
                get_name: Some(backend_get_name),
                free: Some(backend_free),
                set_tensor_async: Some(events::set_tensor_async),
                get_tensor_async: Some(events::get_tensor_async),
                set_tensor_2d_async: None,
                get_tensor_2d_async: None,
                cpy_tensor_async: None,
                synchronize: Some(events::synchronize),
                graph_plan_create: None,
                graph_plan_free: None,
                graph_plan_update: None,
                graph_plan_compute: None,
                graph_compute: Some(backend_graph_compute),
                event_record: Some(events::event_record),
                event_wait: Some(events::event_wait),
                graph_optimize: None,
            },
            device: dev,
            context: ctx as *mut c_void,
        }))
    })
}

// ---- buffer type and buffers ----

/// What a ggml buffer of this library holds: a shardgraph CPU buffer and
/// its base address.
struct BufCtx {
    buf: Arc<dyn shardgraph::backend::Buffer>,
    base: *mut u8,
}

unsafe extern "C" fn buft_get_name(_: *mut ggml_backend_buffer_type) -> *const c_char {
    c"SG".as_ptr()
}

unsafe extern "C" fn buft_get_alignment(_: *mut ggml_backend_buffer_type) -> usize {
    CPU_ALIGNMENT
}

unsafe extern "C" fn buft_is_host(_: *mut ggml_backend_buffer_type) -> bool {
    false
}

unsafe extern "C" fn buft_alloc_buffer(buft: *mut ggml_backend_buffer_type, size: usize) -> *mut ggml_backend_buffer {
    guard(std::ptr::null_mut(), || {
        let (Ok(g), Some(s)) = (ggml::ggml(), state()) else { return std::ptr::null_mut() };
        let buf = match s.alloc.alloc_buffer(size.max(1)) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("shardgraph-ggml: {e}");
                return std::ptr::null_mut();
            }
        };
        let Some(base) = buf.as_any().downcast_ref::<CpuBuffer>().map(|c| c.as_mut_ptr()) else {
            return std::ptr::null_mut();
        };
        let ctx = Box::into_raw(Box::new(BufCtx { buf, base }));
        let iface = ggml_backend_buffer_i {
            free_buffer: Some(buffer_free),
            get_base: Some(buffer_get_base),
            init_tensor: None,
            memset_tensor: Some(buffer_memset_tensor),
            set_tensor: Some(buffer_set_tensor),
            get_tensor: Some(buffer_get_tensor),
            set_tensor_2d: None,
            get_tensor_2d: None,
            cpy_tensor: None,
            clear: Some(buffer_clear),
            reset: None,
        };
        // SAFETY: ggml_backend_buffer_init copies the interface and keeps
        // `ctx`, which `buffer_free` releases.
        let b = unsafe { (g.buffer_init)(buft, iface, ctx as *mut c_void, size) };
        if b.is_null() {
            // SAFETY: not handed to ggml.
            drop(unsafe { Box::from_raw(ctx) });
        }
        b
    })
}

/// The buffer context of `b`.
///
/// # Safety
/// `b` is a live buffer made by [`buft_alloc_buffer`].
unsafe fn buf_ctx<'a>(b: *mut ggml_backend_buffer) -> &'a BufCtx {
    // SAFETY: the caller's promise: context is the BufCtx set at allocation.
    unsafe { &*((*b).context as *const BufCtx) }
}

unsafe extern "C" fn buffer_free(b: *mut ggml_backend_buffer) {
    BUFFER_GENERATION.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    guard((), || {
        // The meta backends that hold tensors of this buffer start again
        // (its tensors' addresses may later name others); the others keep
        // their state (freeing one llama.cpp context must not reset
        // another's caches).
        let holders: Vec<std::sync::Weak<Mutex<meta::Meta>>> = {
            let mut reg = RESIDENT.lock().unwrap_or_else(|p| p.into_inner());
            let held: Vec<usize> = reg.iter().filter(|(_, e)| e.0 == b as usize).map(|(&t, _)| t).collect();
            held.iter().filter_map(|t| reg.remove(t)).map(|e| e.2).collect()
        };
        for m in holders.iter().filter_map(std::sync::Weak::upgrade) {
            m.lock().unwrap_or_else(|p| p.into_inner()).stale = true;
        }
    });
    // SAFETY: ggml calls this once, on a buffer of ours.
    drop(unsafe { Box::from_raw((*b).context as *mut BufCtx) });
}

unsafe extern "C" fn buffer_get_base(b: *mut ggml_backend_buffer) -> *mut c_void {
    // SAFETY: a buffer of ours.
    unsafe { buf_ctx(b) }.base as *mut c_void
}

/// The byte offset in `b` of byte `offset` of `t`.
///
/// # Safety
/// `b` is ours and `t` a live tensor.
unsafe fn offset_of(b: *mut ggml_backend_buffer, t: *const ggml_tensor, offset: usize) -> usize {
    // SAFETY: the caller's promise.
    let (base, data) = unsafe { (buf_ctx(b).base as usize, (*t).data as usize) };
    data.wrapping_sub(base).wrapping_add(offset)
}

unsafe extern "C" fn buffer_set_tensor(
    b: *mut ggml_backend_buffer,
    t: *mut ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    guard((), || {
        // SAFETY: ggml passes its buffer, a tensor in it and `size` readable bytes.
        let (ctx, off, src) =
            unsafe { (buf_ctx(b), offset_of(b, t, offset), std::slice::from_raw_parts(data as *const u8, size)) };
        if let Err(e) = ctx.buf.set(off, src) {
            eprintln!("shardgraph-ggml: set_tensor: {e}");
        }
        // SAFETY: as above.
        if let Some((meta, owner, at)) = unsafe { resident_of(t, offset) } {
            let r = meta.lock().unwrap_or_else(|p| p.into_inner()).write_resident(owner, at, src);
            if let Err(e) = r {
                eprintln!("shardgraph-ggml: set_tensor of a resident tensor: {e}");
            }
        }
    })
}

unsafe extern "C" fn buffer_get_tensor(
    b: *mut ggml_backend_buffer,
    t: *const ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    guard((), || {
        // SAFETY: ggml passes its buffer, a tensor in it and `size` writable bytes.
        let (ctx, off, dst) =
            unsafe { (buf_ctx(b), offset_of(b, t, offset), std::slice::from_raw_parts_mut(data as *mut u8, size)) };
        // SAFETY: as above.
        if let Some((meta, owner, at)) = unsafe { resident_of(t, offset) } {
            match meta.lock().unwrap_or_else(|p| p.into_inner()).read_resident(owner, at, dst) {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => eprintln!("shardgraph-ggml: get_tensor of a resident tensor: {e}"),
            }
        }
        if let Err(e) = ctx.buf.get(off, dst) {
            eprintln!("shardgraph-ggml: get_tensor: {e}");
        }
    })
}

unsafe extern "C" fn buffer_memset_tensor(
    b: *mut ggml_backend_buffer,
    t: *mut ggml_tensor,
    value: u8,
    offset: usize,
    size: usize,
) {
    guard((), || {
        // SAFETY: ggml passes its buffer and a tensor in it.
        let (ctx, off) = unsafe { (buf_ctx(b), offset_of(b, t, offset)) };
        let bytes = vec![value; size];
        if let Err(e) = ctx.buf.set(off, &bytes) {
            eprintln!("shardgraph-ggml: memset_tensor: {e}");
        }
        // SAFETY: as above.
        if let Some((meta, owner, at)) = unsafe { resident_of(t, offset) } {
            if let Err(e) = meta.lock().unwrap_or_else(|p| p.into_inner()).write_resident(owner, at, &bytes) {
                eprintln!("shardgraph-ggml: memset_tensor of a resident tensor: {e}");
            }
        }
    })
}

unsafe extern "C" fn buffer_clear(b: *mut ggml_backend_buffer, value: u8) {
    guard((), || {
        // SAFETY: a buffer of ours.
        unsafe { buf_ctx(b) }.buf.clear(value);
        // Its resident tensors (llama.cpp clears its caches this way).
        let held: Vec<(usize, usize, std::sync::Weak<Mutex<meta::Meta>>)> = {
            let reg = RESIDENT.lock().unwrap_or_else(|p| p.into_inner());
            reg.iter().filter(|(_, e)| e.0 == b as usize).map(|(&t, e)| (t, e.1, e.2.clone())).collect()
        };
        for (t, n, meta) in held {
            let Some(meta) = meta.upgrade() else { continue };
            let r = meta.lock().unwrap_or_else(|p| p.into_inner()).write_resident(
                t as *const ggml_tensor,
                0,
                &vec![value; n],
            );
            if let Err(e) = r {
                eprintln!("shardgraph-ggml: clear of a resident tensor: {e}");
            }
        }
    })
}

// ---- backend ----

static GUID: [u8; 16] = *b"shardgraph-ggml\0";

/// A backend instance: its CPU device and that device's thread count.
struct BackendCtx {
    cpu: Mutex<(usize, CpuBackend)>,
    /// The last [`CACHED`] translations, most recent first, by
    /// [`translate::fingerprint`], each with the buffer generation it was
    /// made in (entries of older generations are dropped: they may hold
    /// freed buffers).
    cache: Mutex<Vec<(u128, u64, Arc<translate::Translated>)>>,
    /// The meta backend over `SHARDGRAPH_DEVICES`' sub-devices (`None`:
    /// one CPU device, `cpu`).
    meta: Option<Arc<Mutex<meta::Meta>>>,
    /// Graphs computed from a cached translation, and translated anew.
    hits: std::sync::atomic::AtomicU64,
    misses: std::sync::atomic::AtomicU64,
}

/// Translations a backend keeps.
pub(crate) const CACHED: usize = 8;

/// Bumped whenever a buffer is freed: cached translations that may hold it
/// no longer match, and are dropped as new ones come.
static BUFFER_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bumped whenever a buffer that is not a compute buffer (weights, caches)
/// is freed: the meta backend's resident tensors may be gone.
/// Resident tensors of the meta backends (SG over sub-devices), by ggml
/// tensor: (its buffer, its bytes, the meta backend whose store holds its
/// bytes). Their ggml memory is what was uploaded once; the buffer
/// functions below read and write them in the store instead.
type Registry = std::collections::HashMap<usize, (usize, usize, std::sync::Weak<Mutex<meta::Meta>>)>;
static RESIDENT: std::sync::LazyLock<Mutex<Registry>> = std::sync::LazyLock::new(|| Mutex::new(Registry::new()));

/// The meta backend holding `t` (or the storage owner of view `t`) and the
/// byte offset in it of byte `offset` of `t`.
///
/// # Safety
/// `t` is a live tensor.
unsafe fn resident_of(
    t: *const ggml_tensor,
    offset: usize,
) -> Option<(Arc<Mutex<meta::Meta>>, *const ggml_tensor, usize)> {
    // SAFETY: the caller's promise.
    let tr = unsafe { &*t };
    let (owner, extra) = if tr.view_src.is_null() {
        (t, 0)
    } else {
        // SAFETY: a view's owner is live while the view is.
        (tr.view_src as *const ggml_tensor, (tr.data as usize).wrapping_sub(unsafe { (*tr.view_src).data } as usize))
    };
    let reg = RESIDENT.lock().unwrap_or_else(|p| p.into_inner());
    let meta = reg.get(&(owner as usize))?.2.upgrade()?;
    Some((meta, owner, extra.wrapping_add(offset)))
}

unsafe extern "C" fn backend_get_name(_: *mut ggml_backend) -> *const c_char {
    c"SG".as_ptr()
}

unsafe extern "C" fn backend_free(be: *mut ggml_backend) {
    if verbose() {
        // SAFETY: a backend of ours, not yet freed.
        let c = unsafe { &*((*be).context as *const BackendCtx) };
        let (h, m) =
            (c.hits.load(std::sync::atomic::Ordering::Relaxed), c.misses.load(std::sync::atomic::Ordering::Relaxed));
        eprintln!("shardgraph-ggml: graphs computed from a cached translation {h}, translated {m}");
        if let Some(meta) = &c.meta {
            let meta = meta.lock().unwrap_or_else(|p| p.into_inner());
            eprintln!(
                "shardgraph-ggml: {}: {} runs, {} bytes exchanged between sub-devices",
                meta.description, meta.runs, meta.bytes_moved
            );
        }
    }
    // SAFETY: ggml frees each backend of ours once.
    unsafe {
        drop(Box::from_raw((*be).context as *mut BackendCtx));
        drop(Box::from_raw(be));
    }
}

/// `ggml_backend_set_n_threads` for this backend (llama.cpp's `--threads`).
unsafe extern "C" fn backend_set_n_threads(be: *mut ggml_backend, n: c_int) {
    guard((), || {
        let Ok(n) = usize::try_from(n) else { return };
        if be.is_null() || n == 0 {
            return;
        }
        // SAFETY: a backend of ours.
        let ctx = unsafe { &*((*be).context as *const BackendCtx) };
        let mut cpu = ctx.cpu.lock().unwrap_or_else(|p| p.into_inner());
        if cpu.0 != n {
            if let Ok(c) = CpuBackend::new(CpuConfig { n_threads: n, ..CpuConfig::default() }) {
                *cpu = (n, c);
            }
        }
    })
}

unsafe extern "C" fn backend_graph_compute(be: *mut ggml_backend, cgraph: *mut ggml_cgraph) -> c_int {
    guard(GGML_STATUS_FAILED, || {
        // SAFETY: a backend of ours and ggml's live graph.
        match unsafe { compute(&*((*be).context as *const BackendCtx), cgraph) } {
            Ok(()) => GGML_STATUS_SUCCESS,
            Err(e) => {
                eprintln!("shardgraph-ggml: graph_compute: {e}");
                GGML_STATUS_FAILED
            }
        }
    })
}

/// The SG buffer holding `t` and the byte offset of its first byte.
///
/// # Safety
/// `t` is a live tensor.
pub(crate) unsafe fn host_place(t: &ggml_tensor) -> Result<(Arc<dyn shardgraph::backend::Buffer>, usize), String> {
    let s = state().ok_or("not initialised")?;
    let b = t.buffer;
    // SAFETY: a non-null buffer of a live tensor is live.
    if b.is_null() || unsafe { (*b).buft } != s.buft {
        return Err(format!(
            "{:?} lies outside the SG device's buffers ({})",
            translate::tensor_name(t),
            if b.is_null() { "in no buffer" } else { "in another backend's buffer" }
        ));
    }
    // SAFETY: ours (checked above).
    let bc = unsafe { buf_ctx(b) };
    Ok((bc.buf.clone(), (t.data as usize).wrapping_sub(bc.base as usize)))
}

/// Translates `nodes` (`None`: nothing to compute).
///
/// # Safety
/// The nodes are live.
unsafe fn translate_graph(
    g: &ggml::Ggml,
    nodes: &[*mut ggml_tensor],
    locate: &translate::Locate<'_>,
) -> Result<Option<translate::Translated>, String> {
    let mut tr = translate::Translator::new(g, nodes, Some(locate));
    let mut outputs = Vec::with_capacity(nodes.len());
    for &t in nodes {
        // A shape-only node computes nothing: it is translated where a node
        // reads it (ggml's scheduler may list one whose source lies in
        // another backend's memory, which it copies for the readers).
        // SAFETY: ggml's live nodes.
        if !translate::is_shape_only(g, unsafe { &*t }) {
            // SAFETY: as above.
            outputs.push(unsafe { tr.tensor(t) }?);
        }
    }
    if outputs.is_empty() {
        return Ok(None);
    }
    // SAFETY: the nodes are still live.
    unsafe { tr.finish(&outputs) }.map(Some)
}

/// Translates (or finds the translation of) and computes `cgraph`.
///
/// # Safety
/// `cgraph` is a live graph whose tensors lie in buffers of this library.
unsafe fn compute(ctx: &BackendCtx, cgraph: *mut ggml_cgraph) -> Result<(), String> {
    let g = ggml::ggml()?;
    let s = state().ok_or("not initialised")?;
    // SAFETY: ggml's own accessors on its live graph.
    let n = unsafe { (g.graph_n_nodes)(cgraph) }.max(0);
    // SAFETY: as above, 0 <= i < n.
    let nodes: Vec<*mut ggml_tensor> = (0..n).map(|i| unsafe { (g.graph_node)(cgraph, i) }).collect();
    // SAFETY: the tensors of a live graph are live.
    let locate = |t: &ggml_tensor| unsafe { host_place(t) };
    let base_of = |b: *mut ggml_backend_buffer| {
        // SAFETY: a non-null buffer of a live tensor is live; ours have a BufCtx.
        if !b.is_null() && unsafe { (*b).buft } == s.buft {
            // SAFETY: as above.
            unsafe { buf_ctx(b) }.base as usize
        } else {
            0
        }
    };
    let generation = BUFFER_GENERATION.load(std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the nodes are live.
    let key = unsafe { translate::fingerprint(&nodes, generation, &base_of) };
    if let Some(arc) = &ctx.meta {
        let (result, new) = {
            let mut m = arc.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the nodes are live, in SG buffers.
            let r = unsafe { m.compute(g, &nodes, key) };
            (r, m.take_new_resident())
        };
        let mut reg = RESIDENT.lock().unwrap_or_else(|p| p.into_inner());
        for (t, b, n) in new {
            reg.insert(t as usize, (b as usize, n, Arc::downgrade(arc)));
        }
        return result;
    }
    let hit = {
        let mut cache = ctx.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(_, gen, _)| *gen == generation);
        cache.iter().position(|(k, _, _)| *k == key).map(|i| {
            let e = cache.remove(i);
            let t = e.2.clone();
            cache.insert(0, e);
            t
        })
    };
    let counter = if hit.is_some() { &ctx.hits } else { &ctx.misses };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let t = match hit {
        Some(t) => t,
        None => {
            // SAFETY: the nodes are live.
            let Some(t) = (unsafe { translate_graph(g, &nodes, &locate) })? else { return Ok(()) };
            let t = Arc::new(t);
            let mut cache = ctx.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.retain(|(k, gen, _)| *k != key && *gen == generation);
            cache.insert(0, (key, generation, t.clone()));
            cache.truncate(CACHED);
            t
        }
    };
    let cpu = ctx.cpu.lock().unwrap_or_else(|p| p.into_inner());
    cpu.1.compute(&t.ctx, &t.graph, &t.storage).map_err(|e| e.to_string())
}
