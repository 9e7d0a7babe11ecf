//! Status codes, the per-thread last error message and `run`, the guard
//! every entry point's body runs in: it maps `Err` values to status codes
//! and contains panics, so no panic crosses the C boundary.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Status of every `sg_*` call (`sg_status` in `include/shardgraph.h`).
/// `SG_OK` is 0; every other value is a failure whose message
/// `sg_last_error()` returns. One code per family of
/// [`shardgraph::Error`], plus the C-side failures (arguments, panics).
/// The numbers are part of the ABI: new codes are only ever appended.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum sg_status {
    /// Success.
    SG_OK = 0,
    /// A C-side argument error: a NULL pointer where one is needed, a bad
    /// length or count, an enum value outside its range, a string that is
    /// not UTF-8, a tensor handle of another context or one out of range,
    /// handles that do not belong together.
    SG_ERR_INVALID_ARGUMENT = 1,
    /// An op rejected its operands ([`shardgraph::Error::InvalidOperand`]):
    /// the message names the op, the operand and the shapes.
    SG_ERR_INVALID_OPERAND = 2,
    /// A tensor id the context does not have
    /// ([`shardgraph::Error::ForeignTensor`]).
    SG_ERR_FOREIGN_TENSOR = 3,
    /// A shape that is not valid for a tensor
    /// ([`shardgraph::Error::InvalidShape`]).
    SG_ERR_SHAPE = 4,
    /// A ggml type id or op that is not implemented
    /// ([`shardgraph::Error::UnsupportedType`],
    /// [`shardgraph::Error::UnsupportedOp`]).
    SG_ERR_UNSUPPORTED = 5,
    /// A view or byte range outside its storage
    /// ([`shardgraph::Error::OutOfBounds`]).
    SG_ERR_OUT_OF_BOUNDS = 6,
    /// Data access to a tensor without storage
    /// ([`shardgraph::Error::NoStorage`]).
    SG_ERR_NO_STORAGE = 7,
    /// Data of the wrong length or type for a tensor
    /// ([`shardgraph::Error::DataMismatch`]).
    SG_ERR_DATA_MISMATCH = 8,
    /// An allocation a backend cannot satisfy ([`shardgraph::Error::Alloc`]).
    SG_ERR_ALLOC = 9,
    /// A graph that cannot be built ([`shardgraph::Error::Graph`]).
    SG_ERR_GRAPH = 10,
    /// A split policy, plan or store that cannot be honoured, devices that
    /// cannot be opened by name ([`shardgraph::Error::Split`]).
    SG_ERR_SPLIT = 11,
    /// A GGUF file that cannot be read ([`shardgraph::Error::Gguf`]).
    SG_ERR_GGUF = 12,
    /// A model that cannot be built or run as asked
    /// ([`shardgraph::Error::Model`]).
    SG_ERR_MODEL = 13,
    /// The CUDA or HIP backend failed ([`shardgraph::Error::Cuda`],
    /// [`shardgraph::Error::Hip`]).
    SG_ERR_BACKEND = 14,
    /// A device lacks the memory asked for
    /// ([`shardgraph::Error::OutOfMemory`]).
    SG_ERR_OUT_OF_MEMORY = 15,
    /// A backend failed during compute ([`shardgraph::Error::Compute`]).
    SG_ERR_COMPUTE = 16,
    /// A panic inside the library, contained at the boundary. The handles
    /// the call was given may be left in an inconsistent state: free them.
    SG_ERR_PANIC = 17,
}

impl sg_status {
    /// Every code, in numeric order (code `i` at index `i`).
    pub const ALL: [sg_status; 18] = [
        sg_status::SG_OK,
        sg_status::SG_ERR_INVALID_ARGUMENT,
        sg_status::SG_ERR_INVALID_OPERAND,
        sg_status::SG_ERR_FOREIGN_TENSOR,
        sg_status::SG_ERR_SHAPE,
        sg_status::SG_ERR_UNSUPPORTED,
        sg_status::SG_ERR_OUT_OF_BOUNDS,
        sg_status::SG_ERR_NO_STORAGE,
        sg_status::SG_ERR_DATA_MISMATCH,
        sg_status::SG_ERR_ALLOC,
        sg_status::SG_ERR_GRAPH,
        sg_status::SG_ERR_SPLIT,
        sg_status::SG_ERR_GGUF,
        sg_status::SG_ERR_MODEL,
        sg_status::SG_ERR_BACKEND,
        sg_status::SG_ERR_OUT_OF_MEMORY,
        sg_status::SG_ERR_COMPUTE,
        sg_status::SG_ERR_PANIC,
    ];
}

/// Why a call failed: a C-side argument error or a core error.
#[derive(Debug)]
pub(crate) enum Fail {
    /// A C-side argument error (`SG_ERR_INVALID_ARGUMENT`), with its message.
    Arg(String),
    /// An error of the core crate.
    Core(shardgraph::Error),
}

impl From<shardgraph::Error> for Fail {
    fn from(e: shardgraph::Error) -> Self {
        Fail::Core(e)
    }
}

/// Result of an entry point's body.
pub(crate) type R<T = ()> = std::result::Result<T, Fail>;

/// An argument error with `msg`.
pub(crate) fn arg<T>(msg: impl Into<String>) -> R<T> {
    Err(Fail::Arg(msg.into()))
}

/// The status code of a core error (one per family of
/// [`shardgraph::Error`]; an exhaustive match, so a new variant cannot be
/// forgotten here).
pub(crate) fn code_of(e: &shardgraph::Error) -> sg_status {
    use shardgraph::Error as E;
    match e {
        E::InvalidOperand { .. } => sg_status::SG_ERR_INVALID_OPERAND,
        E::ForeignTensor { .. } => sg_status::SG_ERR_FOREIGN_TENSOR,
        E::InvalidShape { .. } => sg_status::SG_ERR_SHAPE,
        E::UnsupportedType { .. } | E::UnsupportedOp { .. } => sg_status::SG_ERR_UNSUPPORTED,
        E::OutOfBounds { .. } => sg_status::SG_ERR_OUT_OF_BOUNDS,
        E::NoStorage { .. } => sg_status::SG_ERR_NO_STORAGE,
        E::DataMismatch { .. } => sg_status::SG_ERR_DATA_MISMATCH,
        E::Alloc { .. } => sg_status::SG_ERR_ALLOC,
        E::Graph { .. } => sg_status::SG_ERR_GRAPH,
        E::Split { .. } => sg_status::SG_ERR_SPLIT,
        E::Gguf { .. } => sg_status::SG_ERR_GGUF,
        E::Model { .. } => sg_status::SG_ERR_MODEL,
        E::Cuda { .. } | E::Hip { .. } => sg_status::SG_ERR_BACKEND,
        E::OutOfMemory { .. } => sg_status::SG_ERR_OUT_OF_MEMORY,
        E::Compute { .. } => sg_status::SG_ERR_COMPUTE,
    }
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Stores `msg` as this thread's last error (NUL bytes replaced, so the
/// whole message survives as a C string).
fn set_last_error(msg: String) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // During thread teardown the slot may be gone: the message is dropped.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = c);
}

/// This thread's last error message (empty before the first failure). The
/// pointer stays valid until the next failing call on this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    // The CString lives in the thread-local slot until a later failure
    // replaces it; outside a thread's lifetime there is no message.
    LAST_ERROR.try_with(|slot| slot.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

/// This thread's last error message, for Rust callers of the `sg_*`
/// functions (what `sg_last_error()` points to, copied).
pub fn last_error() -> String {
    LAST_ERROR.try_with(|slot| slot.borrow().to_string_lossy().into_owned()).unwrap_or_default()
}

/// The text of a panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Runs the body of entry point `name`: `Ok` is `SG_OK`; an `Err` is its
/// code with `"{name}: {message}"` as this thread's last error; a panic is
/// contained and reported as `SG_ERR_PANIC`.
pub(crate) fn run(name: &str, body: impl FnOnce() -> R) -> sg_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => sg_status::SG_OK,
        Ok(Err(Fail::Arg(msg))) => {
            set_last_error(format!("{name}: invalid argument: {msg}"));
            sg_status::SG_ERR_INVALID_ARGUMENT
        }
        Ok(Err(Fail::Core(e))) => {
            set_last_error(format!("{name}: {e}"));
            code_of(&e)
        }
        Err(payload) => {
            // Formatting the message cannot panic again in practice; if it
            // did, the status is still returned.
            let text = catch_unwind(AssertUnwindSafe(|| panic_text(&*payload))).unwrap_or_default();
            set_last_error(format!("{name}: panic in shardgraph: {text}"));
            sg_status::SG_ERR_PANIC
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        crate::ptr::string(last_error_ptr(), "last error").unwrap().to_string()
    }

    #[test]
    fn errors_panics_and_messages() {
        assert_eq!(run("sg_ok", || Ok(())), sg_status::SG_OK);
        assert_eq!(run("sg_a", || arg("ne is NULL")), sg_status::SG_ERR_INVALID_ARGUMENT);
        assert_eq!(last(), "sg_a: invalid argument: ne is NULL");
        let e = shardgraph::Error::Split { detail: "ratios".into() };
        assert_eq!(run("sg_b", || Err(e.clone().into())), sg_status::SG_ERR_SPLIT);
        assert_eq!(last(), "sg_b: split: ratios");
        // A success leaves the last message alone.
        assert_eq!(run("sg_ok", || Ok(())), sg_status::SG_OK);
        assert_eq!(last(), "sg_b: split: ratios");
        let st = run("sg_c", || {
            let v: Vec<u8> = Vec::new();
            let i = v.len() + 3;
            if i > 2 {
                panic!("index {i} out of range");
            }
            Ok(())
        });
        assert_eq!(st, sg_status::SG_ERR_PANIC);
        assert_eq!(last(), "sg_c: panic in shardgraph: index 3 out of range");
        assert_eq!(run("sg_d", || arg("a\0b")), sg_status::SG_ERR_INVALID_ARGUMENT);
        assert_eq!(last(), "sg_d: invalid argument: a\\0b");
    }

    #[test]
    fn the_last_error_is_per_thread() {
        assert_eq!(run("sg_main", || arg("main thread")), sg_status::SG_ERR_INVALID_ARGUMENT);
        let other = std::thread::spawn(|| {
            let before = last();
            run("sg_other", || arg("other thread"));
            (before, last())
        })
        .join()
        .unwrap();
        assert_eq!(other, (String::new(), "sg_other: invalid argument: other thread".to_string()));
        assert_eq!(last(), "sg_main: invalid argument: main thread");
    }

    #[test]
    fn all_lists_every_code_in_order() {
        for (i, s) in sg_status::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
        }
        // An exhaustive match: a new code fails to compile here until it is
        // added, and then must be in ALL.
        let listed = |s: sg_status| match s {
            sg_status::SG_OK
            | sg_status::SG_ERR_INVALID_ARGUMENT
            | sg_status::SG_ERR_INVALID_OPERAND
            | sg_status::SG_ERR_FOREIGN_TENSOR
            | sg_status::SG_ERR_SHAPE
            | sg_status::SG_ERR_UNSUPPORTED
            | sg_status::SG_ERR_OUT_OF_BOUNDS
            | sg_status::SG_ERR_NO_STORAGE
            | sg_status::SG_ERR_DATA_MISMATCH
            | sg_status::SG_ERR_ALLOC
            | sg_status::SG_ERR_GRAPH
            | sg_status::SG_ERR_SPLIT
            | sg_status::SG_ERR_GGUF
            | sg_status::SG_ERR_MODEL
            | sg_status::SG_ERR_BACKEND
            | sg_status::SG_ERR_OUT_OF_MEMORY
            | sg_status::SG_ERR_COMPUTE
            | sg_status::SG_ERR_PANIC => sg_status::ALL.contains(&s),
        };
        assert!(sg_status::ALL.iter().all(|&s| listed(s)));
    }

    #[test]
    fn every_core_family_has_its_code() {
        use shardgraph::Error as E;
        let s = || String::from("x");
        let cases = [
            (E::InvalidOperand { op: "mul_mat", operand: "src1", detail: s() }, 2),
            (E::ForeignTensor { id: 1, ctx: 2, detail: s() }, 3),
            (E::InvalidShape { ne: vec![1], detail: s() }, 4),
            (E::UnsupportedType { ty: s(), detail: s() }, 5),
            (E::UnsupportedOp { backend: s(), op: "x", detail: s() }, 5),
            (E::OutOfBounds { detail: s() }, 6),
            (E::NoStorage { name: s(), detail: s() }, 7),
            (E::DataMismatch { name: s(), detail: s() }, 8),
            (E::Alloc { detail: s() }, 9),
            (E::Graph { detail: s() }, 10),
            (E::Split { detail: s() }, 11),
            (E::Gguf { file: s(), detail: s() }, 12),
            (E::Model { detail: s() }, 13),
            (E::Cuda { detail: s() }, 14),
            (E::Hip { detail: s() }, 14),
            (E::OutOfMemory { device: s(), detail: s(), needed: 2, available: 1 }, 15),
            (E::Compute { detail: s() }, 16),
        ];
        for (e, code) in cases {
            assert_eq!(code_of(&e) as i32, code, "{e}");
        }
    }
}
