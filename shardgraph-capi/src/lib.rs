//! The C ABI of shardgraph (`include/shardgraph.h`), for C and C++ engines
//! (llama.cpp-like) that build ggml-style graphs and run them
//! tensor-parallel on N devices, or load a model and generate.
//!
//! Every entry point is `extern "C"`, `#[no_mangle]`, prefixed `sg_`, and
//! returns an [`status::sg_status`] (except `sg_last_error`, `sg_version`
//! and `sg_build_features`, which return strings). Its body runs inside
//! `status::run`: errors become status codes with a per-thread message
//! (`sg_last_error`), and a panic is contained (`SG_ERR_PANIC`), never
//! unwinding into C. Pointers from C become references only in [`ptr`],
//! the crate's one module with `unsafe` code, after NULL, alignment,
//! length and UTF-8 checks.
//!
//! Handles (`sg_context *`, `sg_devices *`, …) are boxed Rust values
//! ([`graph::SgContext`], [`split::SgDevices`], …) freed by their
//! `sg_*_free`. Tensors are `sg_tensor` values ([`graph::sg_tensor`]):
//! the context id and the tensor's index, so a tensor of another context is
//! an error rather than another tensor.
//!
//! Modules: [`status`] (codes, last error, the guard), [`ptr`] (pointer
//! helpers), [`graph`] (contexts, tensors, ops, graphs, types),
//! [`op_table`] (which `sg_*` functions build each op),
//! [`split`] (devices, policies, plans, stores, execution), [`engine`]
//! (the speculative-decoding engine).

#![deny(missing_docs)]

pub mod engine;
pub mod graph;
pub mod op_table;
pub mod ptr;
pub mod split;
pub mod status;

use std::ffi::c_char;

/// The crate version, NUL-terminated for C.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// `sg_version`: the library version (`"0.1.0"`), a static string.
#[no_mangle]
pub extern "C" fn sg_version() -> *const c_char {
    VERSION.as_ptr().cast()
}

/// `sg_build_features`: the cargo features this library was built with, a
/// static comma-separated list of `cuda`, `hip`, `cuda-emu` (empty: CPU
/// devices only), which say which device names `sg_devices_open` can open.
#[no_mangle]
pub extern "C" fn sg_build_features() -> *const c_char {
    build_features().as_ptr()
}

/// The features as a C string (`cuda-emu` implies `cuda`).
fn build_features() -> &'static std::ffi::CStr {
    match (cfg!(feature = "cuda"), cfg!(feature = "hip"), cfg!(feature = "cuda-emu")) {
        (_, false, true) => c"cuda,cuda-emu",
        (_, true, true) => c"cuda,hip,cuda-emu",
        (true, true, false) => c"cuda,hip",
        (true, false, false) => c"cuda",
        (false, true, false) => c"hip",
        (false, false, false) => c"",
    }
}

/// `sg_last_error`: the message of the last failed `sg_*` call on this
/// thread (empty before the first failure); valid until the next failing
/// call on this thread. Never NULL.
#[no_mangle]
pub extern "C" fn sg_last_error() -> *const c_char {
    // Nothing here can panic (the slot is read with `try_with`); the guard
    // is not used because it would itself write the message slot.
    status::last_error_ptr()
}

/// `sg_type_name`: ggml's name of type id `type` (`"q8_0"`), a static
/// string in `*out`.
#[no_mangle]
pub extern "C" fn sg_type_name(ty: i32, out: *mut *const c_char) -> sg_status {
    status::run("sg_type_name", || {
        let t = graph::ggml_type(ty)?;
        let out = ptr::slot(out, "out")?;
        out.write(type_name_c(t).as_ptr());
        Ok(())
    })
}

pub use status::sg_status;

/// ggml's type names as C strings.
fn type_name_c(t: shardgraph::GgmlType) -> &'static std::ffi::CStr {
    use shardgraph::GgmlType::*;
    match t {
        F32 => c"f32",
        F16 => c"f16",
        Q4_0 => c"q4_0",
        Q4_1 => c"q4_1",
        Q5_0 => c"q5_0",
        Q5_1 => c"q5_1",
        Q8_0 => c"q8_0",
        Q8_1 => c"q8_1",
        Q2_K => c"q2_K",
        Q3_K => c"q3_K",
        Q4_K => c"q4_K",
        Q5_K => c"q5_K",
        Q6_K => c"q6_K",
        Q8_K => c"q8_K",
        IQ2_XXS => c"iq2_xxs",
        IQ2_XS => c"iq2_xs",
        IQ3_XXS => c"iq3_xxs",
        IQ1_S => c"iq1_s",
        IQ4_NL => c"iq4_nl",
        IQ3_S => c"iq3_s",
        IQ2_S => c"iq2_s",
        IQ4_XS => c"iq4_xs",
        I8 => c"i8",
        I16 => c"i16",
        I32 => c"i32",
        I64 => c"i64",
        F64 => c"f64",
        IQ1_M => c"iq1_m",
        BF16 => c"bf16",
        TQ1_0 => c"tq1_0",
        TQ2_0 => c"tq2_0",
        MXFP4 => c"mxfp4",
        NVFP4 => c"nvfp4",
        Q1_0 => c"q1_0",
        Q2_0 => c"q2_0",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header's thread rules: any handle may move between threads, and
    /// `const` calls on one handle may run concurrently.
    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<graph::SgContext>();
        check::<graph::SgGraph>();
        check::<split::SgDevices>();
        check::<split::SgPolicy>();
        check::<split::SgPlan>();
        check::<split::SgStore>();
        check::<split::SgExecutor>();
        check::<split::SgReport>();
        check::<engine::SgEngine>();
    }

    #[test]
    fn type_names_are_ggmls() {
        for t in shardgraph::tensor::ALL_TYPES {
            assert_eq!(type_name_c(t).to_str().unwrap(), t.name());
        }
        let f = ptr::string(sg_build_features(), "features").unwrap();
        assert_eq!(f.split(',').any(|x| x == "cuda-emu"), cfg!(feature = "cuda-emu"), "{f}");
        assert_eq!(f.split(',').any(|x| x == "hip"), cfg!(feature = "hip"), "{f}");
        let v = ptr::string(sg_version(), "version").unwrap();
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
    }
}
