//! ggml 0.25.3's structures and interfaces as Rust sees them: the tensor
//! (`include/ggml.h`) and the backend, device, registry, buffer type and
//! buffer interfaces of backend API version 2 (`src/ggml-backend-impl.h`).
//!
//! Written from those headers of the llama.cpp tree in the llama-cpp-python
//! 0.3.36 source distribution (`vendor/llama.cpp/ggml`, ggml 0.25.3), which is
//! what the set-up installs and what the tests build llama.cpp's tools from.
//! `tests/layout.rs` compiles a C program against those headers and checks
//! every size and field offset here against the C compiler's.
//!
//! Pointers to ggml's own objects stay raw: ggml owns them and hands them to
//! the interface functions, which are the only place they are read.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// `GGML_BACKEND_API_VERSION` of the headers this library is written
/// against; ggml's loader refuses a library whose registry says otherwise.
pub const GGML_BACKEND_API_VERSION: c_int = 2;
/// `GGML_MAX_DIMS`.
pub const GGML_MAX_DIMS: usize = 4;
/// `GGML_MAX_SRC`.
pub const GGML_MAX_SRC: usize = 10;
/// `GGML_MAX_OP_PARAMS` in bytes.
pub const GGML_MAX_OP_PARAMS: usize = 64;
/// `GGML_MAX_NAME`.
pub const GGML_MAX_NAME: usize = 64;

/// `enum ggml_status`: success.
pub const GGML_STATUS_SUCCESS: c_int = 0;
/// `enum ggml_status`: failure.
pub const GGML_STATUS_FAILED: c_int = -1;

/// `enum ggml_backend_dev_type`: `GGML_BACKEND_DEVICE_TYPE_GPU` (a device
/// with memory of its own; llama.cpp offloads layers to it).
pub const GGML_BACKEND_DEVICE_TYPE_GPU: c_int = 1;

/// `struct ggml_tensor` (ggml.h).
#[repr(C)]
pub struct ggml_tensor {
    /// `enum ggml_type` (ggml's type id).
    pub type_: c_int,
    /// The buffer holding the data (null before allocation).
    pub buffer: *mut ggml_backend_buffer,
    /// Elements per dimension.
    pub ne: [i64; GGML_MAX_DIMS],
    /// Stride per dimension in bytes.
    pub nb: [usize; GGML_MAX_DIMS],
    /// `enum ggml_op`.
    pub op: c_int,
    /// The op's parameters, as ggml packs them.
    pub op_params: [i32; GGML_MAX_OP_PARAMS / 4],
    /// `GGML_TENSOR_FLAG_*`.
    pub flags: i32,
    /// Operands (null-terminated by position).
    pub src: [*mut ggml_tensor; GGML_MAX_SRC],
    /// The tensor a view looks into.
    pub view_src: *mut ggml_tensor,
    /// Byte offset of a view in `view_src`.
    pub view_offs: usize,
    /// First byte (an address in the buffer's address space).
    pub data: *mut c_void,
    /// Name, NUL-terminated.
    pub name: [c_char; GGML_MAX_NAME],
    /// Backend-private data.
    pub extra: *mut c_void,
    /// Padding.
    pub padding: [c_char; 8],
}

/// `struct ggml_cgraph` is opaque here: its nodes are read through
/// `ggml_graph_n_nodes`/`ggml_graph_node` of the loaded libggml-base.
#[repr(C)]
pub struct ggml_cgraph {
    _opaque: [u8; 0],
}

/// `struct ggml_backend_buffer_type_i`.
#[repr(C)]
pub struct ggml_backend_buffer_type_i {
    pub get_name: Option<unsafe extern "C" fn(*mut ggml_backend_buffer_type) -> *const c_char>,
    pub alloc_buffer: Option<unsafe extern "C" fn(*mut ggml_backend_buffer_type, usize) -> *mut ggml_backend_buffer>,
    pub get_alignment: Option<unsafe extern "C" fn(*mut ggml_backend_buffer_type) -> usize>,
    pub get_max_size: Option<unsafe extern "C" fn(*mut ggml_backend_buffer_type) -> usize>,
    pub get_alloc_size: Option<unsafe extern "C" fn(*mut ggml_backend_buffer_type, *const ggml_tensor) -> usize>,
    pub is_host: Option<unsafe extern "C" fn(*mut ggml_backend_buffer_type) -> bool>,
}

/// `struct ggml_backend_buffer_type`.
#[repr(C)]
pub struct ggml_backend_buffer_type {
    pub iface: ggml_backend_buffer_type_i,
    pub device: *mut ggml_backend_device,
    pub context: *mut c_void,
}

/// `struct ggml_backend_buffer_i`.
#[repr(C)]
pub struct ggml_backend_buffer_i {
    pub free_buffer: Option<unsafe extern "C" fn(*mut ggml_backend_buffer)>,
    pub get_base: Option<unsafe extern "C" fn(*mut ggml_backend_buffer) -> *mut c_void>,
    pub init_tensor: Option<unsafe extern "C" fn(*mut ggml_backend_buffer, *mut ggml_tensor) -> c_int>,
    pub memset_tensor: Option<unsafe extern "C" fn(*mut ggml_backend_buffer, *mut ggml_tensor, u8, usize, usize)>,
    pub set_tensor:
        Option<unsafe extern "C" fn(*mut ggml_backend_buffer, *mut ggml_tensor, *const c_void, usize, usize)>,
    pub get_tensor:
        Option<unsafe extern "C" fn(*mut ggml_backend_buffer, *const ggml_tensor, *mut c_void, usize, usize)>,
    #[allow(clippy::type_complexity)]
    pub set_tensor_2d: Option<
        unsafe extern "C" fn(
            *mut ggml_backend_buffer,
            *mut ggml_tensor,
            *const c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    #[allow(clippy::type_complexity)]
    pub get_tensor_2d: Option<
        unsafe extern "C" fn(
            *mut ggml_backend_buffer,
            *const ggml_tensor,
            *mut c_void,
            usize,
            usize,
            usize,
            usize,
            usize,
        ),
    >,
    pub cpy_tensor:
        Option<unsafe extern "C" fn(*mut ggml_backend_buffer, *const ggml_tensor, *mut ggml_tensor) -> bool>,
    pub clear: Option<unsafe extern "C" fn(*mut ggml_backend_buffer, u8)>,
    pub reset: Option<unsafe extern "C" fn(*mut ggml_backend_buffer)>,
}

/// `struct ggml_backend_buffer` (allocated by ggml's
/// `ggml_backend_buffer_init`, freed by ggml).
#[repr(C)]
pub struct ggml_backend_buffer {
    pub iface: ggml_backend_buffer_i,
    pub buft: *mut ggml_backend_buffer_type,
    pub context: *mut c_void,
    pub size: usize,
    /// `enum ggml_backend_buffer_usage`.
    pub usage: c_int,
}

/// `struct ggml_backend_i`.
#[repr(C)]
pub struct ggml_backend_i {
    pub get_name: Option<unsafe extern "C" fn(*mut ggml_backend) -> *const c_char>,
    pub free: Option<unsafe extern "C" fn(*mut ggml_backend)>,
    pub set_tensor_async:
        Option<unsafe extern "C" fn(*mut ggml_backend, *mut ggml_tensor, *const c_void, usize, usize)>,
    pub get_tensor_async:
        Option<unsafe extern "C" fn(*mut ggml_backend, *const ggml_tensor, *mut c_void, usize, usize)>,
    pub set_tensor_2d_async: Option<unsafe extern "C" fn()>,
    pub get_tensor_2d_async: Option<unsafe extern "C" fn()>,
    pub cpy_tensor_async: Option<
        unsafe extern "C" fn(*mut ggml_backend, *mut ggml_backend, *const ggml_tensor, *mut ggml_tensor) -> bool,
    >,
    pub synchronize: Option<unsafe extern "C" fn(*mut ggml_backend)>,
    pub graph_plan_create: Option<unsafe extern "C" fn()>,
    pub graph_plan_free: Option<unsafe extern "C" fn()>,
    pub graph_plan_update: Option<unsafe extern "C" fn()>,
    pub graph_plan_compute: Option<unsafe extern "C" fn()>,
    pub graph_compute: Option<unsafe extern "C" fn(*mut ggml_backend, *mut ggml_cgraph) -> c_int>,
    pub event_record: Option<unsafe extern "C" fn(*mut ggml_backend, *mut ggml_backend_event)>,
    pub event_wait: Option<unsafe extern "C" fn(*mut ggml_backend, *mut ggml_backend_event)>,
    pub graph_optimize: Option<unsafe extern "C" fn()>,
}

/// `struct ggml_backend`.
#[repr(C)]
pub struct ggml_backend {
    /// `ggml_guid_t`: a pointer to 16 bytes.
    pub guid: *mut [u8; 16],
    pub iface: ggml_backend_i,
    pub device: *mut ggml_backend_device,
    pub context: *mut c_void,
}

/// `struct ggml_backend_event` (made and freed by the device that owns it).
#[repr(C)]
pub struct ggml_backend_event {
    pub device: *mut ggml_backend_device,
    pub context: *mut c_void,
}

/// `struct ggml_backend_dev_caps`.
#[repr(C)]
pub struct ggml_backend_dev_caps {
    pub async_: bool,
    pub host_buffer: bool,
    pub buffer_from_host_ptr: bool,
    pub events: bool,
    pub mmap_support: bool,
}

/// `struct ggml_backend_dev_props`.
#[repr(C)]
pub struct ggml_backend_dev_props {
    pub name: *const c_char,
    pub description: *const c_char,
    pub memory_free: usize,
    pub memory_total: usize,
    /// `enum ggml_backend_dev_type`.
    pub type_: c_int,
    pub device_id: *const c_char,
    pub caps: ggml_backend_dev_caps,
}

/// `struct ggml_backend_device_i`.
#[repr(C)]
pub struct ggml_backend_device_i {
    pub get_name: Option<unsafe extern "C" fn(*mut ggml_backend_device) -> *const c_char>,
    pub get_description: Option<unsafe extern "C" fn(*mut ggml_backend_device) -> *const c_char>,
    pub get_memory: Option<unsafe extern "C" fn(*mut ggml_backend_device, *mut usize, *mut usize)>,
    pub get_type: Option<unsafe extern "C" fn(*mut ggml_backend_device) -> c_int>,
    pub get_props: Option<unsafe extern "C" fn(*mut ggml_backend_device, *mut ggml_backend_dev_props)>,
    pub init_backend: Option<unsafe extern "C" fn(*mut ggml_backend_device, *const c_char) -> *mut ggml_backend>,
    pub get_buffer_type: Option<unsafe extern "C" fn(*mut ggml_backend_device) -> *mut ggml_backend_buffer_type>,
    pub get_host_buffer_type: Option<unsafe extern "C" fn(*mut ggml_backend_device) -> *mut ggml_backend_buffer_type>,
    pub buffer_from_host_ptr: Option<unsafe extern "C" fn()>,
    pub supports_op: Option<unsafe extern "C" fn(*mut ggml_backend_device, *const ggml_tensor) -> bool>,
    pub supports_buft: Option<unsafe extern "C" fn(*mut ggml_backend_device, *mut ggml_backend_buffer_type) -> bool>,
    pub offload_op: Option<unsafe extern "C" fn(*mut ggml_backend_device, *const ggml_tensor) -> bool>,
    pub event_new: Option<unsafe extern "C" fn(*mut ggml_backend_device) -> *mut ggml_backend_event>,
    pub event_free: Option<unsafe extern "C" fn(*mut ggml_backend_device, *mut ggml_backend_event)>,
    pub event_synchronize: Option<unsafe extern "C" fn(*mut ggml_backend_device, *mut ggml_backend_event)>,
}

/// `struct ggml_backend_device`.
#[repr(C)]
pub struct ggml_backend_device {
    pub iface: ggml_backend_device_i,
    pub reg: *mut ggml_backend_reg,
    pub context: *mut c_void,
}

/// `struct ggml_backend_reg_i`.
#[repr(C)]
pub struct ggml_backend_reg_i {
    pub get_name: Option<unsafe extern "C" fn(*mut ggml_backend_reg) -> *const c_char>,
    pub get_device_count: Option<unsafe extern "C" fn(*mut ggml_backend_reg) -> usize>,
    pub get_device: Option<unsafe extern "C" fn(*mut ggml_backend_reg, usize) -> *mut ggml_backend_device>,
    pub get_proc_address: Option<unsafe extern "C" fn(*mut ggml_backend_reg, *const c_char) -> *mut c_void>,
}

/// `struct ggml_backend_reg`.
#[repr(C)]
pub struct ggml_backend_reg {
    /// [`GGML_BACKEND_API_VERSION`].
    pub api_version: c_int,
    pub iface: ggml_backend_reg_i,
    pub context: *mut c_void,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    use crate::require;

    /// Every size and field offset above, as (name, bytes), in the C
    /// program's order.
    fn ours() -> Vec<(String, usize)> {
        macro_rules! rows {
            ($($t:ident { $($f:ident $(as $c:ident)?),* })*) => {{
                let mut v = Vec::new();
                $(
                    v.push((stringify!($t).to_string(), size_of::<$t>()));
                    $(v.push((format!("{}.{}", stringify!($t), rows!(@c $f $($c)?)), offset_of!($t, $f)));)*
                )*
                v
            }};
            (@c $f:ident $c:ident) => { stringify!($c) };
            (@c $f:ident) => { stringify!($f) };
        }
        rows! {
            ggml_tensor { type_ as type, buffer, ne, nb, op, op_params, flags, src, view_src, view_offs, data, name, extra, padding }
            ggml_backend_buffer_type_i { get_name, alloc_buffer, get_alignment, get_max_size, get_alloc_size, is_host }
            ggml_backend_buffer_type { iface, device, context }
            ggml_backend_buffer_i { free_buffer, get_base, init_tensor, memset_tensor, set_tensor, get_tensor, set_tensor_2d, get_tensor_2d, cpy_tensor, clear, reset }
            ggml_backend_buffer { iface, buft, context, size, usage }
            ggml_backend_i { get_name, free, set_tensor_async, get_tensor_async, set_tensor_2d_async, get_tensor_2d_async, cpy_tensor_async, synchronize, graph_plan_create, graph_plan_free, graph_plan_update, graph_plan_compute, graph_compute, event_record, event_wait, graph_optimize }
            ggml_backend { guid, iface, device, context }
            ggml_backend_event { device, context }
            ggml_backend_dev_caps { async_ as async, host_buffer, buffer_from_host_ptr, events, mmap_support }
            ggml_backend_dev_props { name, description, memory_free, memory_total, type_ as type, device_id, caps }
            ggml_backend_device_i { get_name, get_description, get_memory, get_type, get_props, init_backend, get_buffer_type, get_host_buffer_type, buffer_from_host_ptr, supports_op, supports_buft, offload_op, event_new, event_free, event_synchronize }
            ggml_backend_device { iface, reg, context }
            ggml_backend_reg_i { get_name, get_device_count, get_device, get_proc_address }
            ggml_backend_reg { api_version, iface, context }
        }
    }

    /// The C program printing the same rows from ggml's headers.
    fn c_program(rows: &[(String, usize)]) -> String {
        let mut s = String::from(
            "#include <stddef.h>\n#include <stdio.h>\n#include \"ggml.h\"\n#include \"ggml-backend-impl.h\"\nint main(void) {\n",
        );
        s += "    printf(\"API %d\\n\", GGML_BACKEND_API_VERSION);\n";
        for (name, _) in rows {
            match name.split_once('.') {
                Some((t, f)) => s += &format!("    printf(\"{name} %zu\\n\", offsetof(struct {t}, {f}));\n"),
                None => s += &format!("    printf(\"{name} %zu\\n\", sizeof(struct {name}));\n"),
            }
        }
        s + "    return 0;\n}\n"
    }

    /// The Rust mirrors match ggml 0.25.3's headers byte for byte: a C
    /// program compiled against the headers of the llama.cpp tree the
    /// set-up unpacks prints every size and offset, and each equals Rust's.
    #[test]
    fn layouts_match_ggml_headers() {
        let Some(src) = require::or_skip(
            require::Tool::LlamaTools,
            "layouts_match_ggml_headers",
            crate::paths::llama_src().ok_or("no llama.cpp source tree (scripts/setup.sh unpacks it)"),
        ) else {
            return;
        };
        let rows = ours();
        let dir = std::env::temp_dir().join(format!("sg-ggml-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("layout.c"), c_program(&rows)).unwrap();
        let out = std::process::Command::new("cc")
            .arg("-I")
            .arg(src.join("ggml/include"))
            .arg("-I")
            .arg(src.join("ggml/src"))
            .arg(dir.join("layout.c"))
            .arg("-o")
            .arg(dir.join("layout"))
            .output()
            .expect("cc runs");
        assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
        let run = std::process::Command::new(dir.join("layout")).output().expect("the program runs");
        let text = String::from_utf8(run.stdout).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(format!("API {GGML_BACKEND_API_VERSION}").as_str()));
        let c: Vec<(String, usize)> = lines
            .map(|l| {
                let (n, v) = l.split_once(' ').unwrap();
                (n.to_string(), v.parse().unwrap())
            })
            .collect();
        assert_eq!(c.len(), rows.len());
        for (r, c) in rows.iter().zip(&c) {
            assert_eq!(r, c, "Rust (left) and C (right) disagree");
        }
        assert!(rows.iter().any(|(n, v)| n == "ggml_tensor" && *v == 336), "ggml_tensor is 336 bytes on 64-bit");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
