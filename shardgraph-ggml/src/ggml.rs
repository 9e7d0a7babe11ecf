//! The functions this library takes from the libggml-base that loaded it.
//!
//! The library links against no ggml of its own: it finds the process's
//! `libggml-base` among the loaded objects (`dl_iterate_phdr`), opens it
//! without loading anything (`RTLD_NOLOAD`) and looks up the few functions
//! it needs. Op names come from there (`ggml_op_name`, …), so a change of
//! numbering between ggml versions cannot silently map one op onto another;
//! `ggml_backend_buffer_init` allocates the buffer objects ggml frees.

use crate::ffi::{ggml_backend_buffer, ggml_backend_buffer_i, ggml_backend_buffer_type, ggml_cgraph, ggml_tensor};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

/// ggml's functions, resolved once.
pub(crate) struct Ggml {
    pub(crate) op_name: unsafe extern "C" fn(c_int) -> *const c_char,
    pub(crate) unary_op_name: unsafe extern "C" fn(c_int) -> *const c_char,
    pub(crate) glu_op_name: unsafe extern "C" fn(c_int) -> *const c_char,
    pub(crate) type_name: unsafe extern "C" fn(c_int) -> *const c_char,
    pub(crate) graph_n_nodes: unsafe extern "C" fn(*mut ggml_cgraph) -> c_int,
    pub(crate) graph_node: unsafe extern "C" fn(*mut ggml_cgraph, c_int) -> *mut ggml_tensor,
    pub(crate) buffer_init: unsafe extern "C" fn(
        *mut ggml_backend_buffer_type,
        ggml_backend_buffer_i,
        *mut c_void,
        usize,
    ) -> *mut ggml_backend_buffer,
    /// `ggml_version()`, e.g. "0.25.3".
    pub(crate) version: String,
}

static GGML: OnceLock<Result<Ggml, String>> = OnceLock::new();

/// The loaded ggml's functions, or why they could not be found.
pub(crate) fn ggml() -> Result<&'static Ggml, String> {
    GGML.get_or_init(resolve).as_ref().map_err(|e| e.clone())
}

/// The path of the first loaded object whose file name starts with
/// `libggml-base`.
fn find_loaded(prefix: &str) -> Option<CString> {
    struct Found {
        prefix: Vec<u8>,
        path: Option<CString>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `Found` passed to dl_iterate_phdr below, and
        // the loader passes a valid `info` whose name is NUL-terminated or null.
        let (found, name) = unsafe { (&mut *(data as *mut Found), (*info).dlpi_name) };
        if name.is_null() {
            return 0;
        }
        // SAFETY: non-null, NUL-terminated (the loader's own string).
        let path = unsafe { CStr::from_ptr(name) };
        let file = path.to_bytes().rsplit(|&b| b == b'/').next().unwrap_or(&[]);
        if file.starts_with(&found.prefix) {
            found.path = Some(path.to_owned());
            return 1;
        }
        0
    }
    let mut found = Found { prefix: prefix.as_bytes().to_vec(), path: None };
    // SAFETY: `visit` only reads the loader's records and writes `found`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut found as *mut Found as *mut c_void) };
    found.path
}

fn resolve() -> Result<Ggml, String> {
    let path = find_loaded("libggml-base").ok_or_else(|| {
        "no libggml-base is loaded in this process: load this library with ggml_backend_load".to_string()
    })?;
    // SAFETY: RTLD_NOLOAD opens an object that is already loaded (it loads
    // nothing and runs no initialiser); the handle is kept for the process.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return Err(format!("dlopen({path:?}, RTLD_NOLOAD) failed"));
    }
    let sym = |name: &str| -> Result<*mut c_void, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: a valid handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        if p.is_null() {
            Err(format!("{path:?} does not export {name}"))
        } else {
            Ok(p)
        }
    };
    let version = sym("ggml_version")?;
    // Each symbol below is the ggml 0.25.3 function of that name, whose C
    // signature is the Rust type it is transmuted to (ggml.h,
    // ggml-backend-impl.h); the version is checked right after this one.
    // SAFETY: as said above.
    let version: unsafe extern "C" fn() -> *const c_char = unsafe { std::mem::transmute(version) };
    // SAFETY: ggml_version returns a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr(version()) }.to_string_lossy().into_owned();
    if !version.starts_with("0.25.") {
        return Err(format!(
            "the loaded ggml is {version}; this library is built for ggml 0.25 (backend API version {})",
            crate::ffi::GGML_BACKEND_API_VERSION
        ));
    }
    // SAFETY: as above.
    unsafe {
        Ok(Ggml {
            op_name: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> *const c_char>(sym(
                "ggml_op_name",
            )?),
            unary_op_name: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> *const c_char>(sym(
                "ggml_unary_op_name",
            )?),
            glu_op_name: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> *const c_char>(sym(
                "ggml_glu_op_name",
            )?),
            type_name: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> *const c_char>(sym(
                "ggml_type_name",
            )?),
            graph_n_nodes: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut ggml_cgraph) -> c_int>(sym(
                "ggml_graph_n_nodes",
            )?),
            graph_node: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut ggml_cgraph, c_int) -> *mut ggml_tensor,
            >(sym("ggml_graph_node")?),
            buffer_init: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(
                    *mut ggml_backend_buffer_type,
                    ggml_backend_buffer_i,
                    *mut c_void,
                    usize,
                ) -> *mut ggml_backend_buffer,
            >(sym("ggml_backend_buffer_init")?),
            version,
        })
    }
}

/// A name ggml returned (null becomes "?").
pub(crate) fn name(p: *const c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: ggml's name functions return static NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
