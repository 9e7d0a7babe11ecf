//! Asynchronous copies and events (ggml's `set_tensor_async`,
//! `get_tensor_async`, `synchronize`, `event_*`).
//!
//! SG computes synchronously: `graph_compute` returns once the graph (on
//! every sub-device) is computed, and every copy is done when its call
//! returns. So an "asynchronous" copy is the buffer's own copy (a resident
//! tensor's bytes go to and come from the store, as with `set_tensor`),
//! `synchronize` has nothing to wait for, and an event is complete as soon
//! as it is recorded. Reporting them (the device's `async` and `events`
//! caps) is what lets ggml's scheduler run SG in its parallel mode, which
//! llama.cpp turns on (pipeline parallelism over `--split-mode layer`)
//! only when every non-CPU device has both.

use crate::ffi::{ggml_backend, ggml_backend_buffer, ggml_backend_device, ggml_backend_event, ggml_tensor};
use crate::guard;
use std::ffi::c_void;

/// The buffer that holds `t`'s bytes (its view source's, for a view), as
/// `ggml_backend_tensor_set` finds it; null before allocation.
///
/// # Safety
/// `t` is a live tensor.
unsafe fn buffer_of(t: *const ggml_tensor) -> *mut ggml_backend_buffer {
    // SAFETY: the caller's promise (a view's source is live while it is).
    unsafe {
        if (*t).view_src.is_null() {
            (*t).buffer
        } else {
            (*(*t).view_src).buffer
        }
    }
}

/// `set_tensor_async`: writes `size` bytes at byte `offset` of `t` now,
/// through its buffer's `set_tensor` (ggml has checked the range).
pub(crate) unsafe extern "C" fn set_tensor_async(
    _: *mut ggml_backend,
    t: *mut ggml_tensor,
    data: *const c_void,
    offset: usize,
    size: usize,
) {
    guard((), || {
        // SAFETY: ggml passes a live tensor.
        let b = unsafe { buffer_of(t) };
        // SAFETY: a non-null buffer of a live tensor; its interface is ggml's.
        match (!b.is_null()).then(|| unsafe { (*b).iface.set_tensor }).flatten() {
            // SAFETY: ggml passes `size` readable bytes within the tensor.
            Some(f) => unsafe { f(b, t, data, offset, size) },
            None => eprintln!("shardgraph-ggml: set_tensor_async: the tensor has no buffer that takes writes"),
        }
    })
}

/// `get_tensor_async`: reads `size` bytes at byte `offset` of `t` now,
/// through its buffer's `get_tensor`.
pub(crate) unsafe extern "C" fn get_tensor_async(
    _: *mut ggml_backend,
    t: *const ggml_tensor,
    data: *mut c_void,
    offset: usize,
    size: usize,
) {
    guard((), || {
        // SAFETY: ggml passes a live tensor.
        let b = unsafe { buffer_of(t) };
        // SAFETY: as in set_tensor_async.
        match (!b.is_null()).then(|| unsafe { (*b).iface.get_tensor }).flatten() {
            // SAFETY: ggml passes `size` writable bytes within the tensor.
            Some(f) => unsafe { f(b, t, data, offset, size) },
            None => eprintln!("shardgraph-ggml: get_tensor_async: the tensor has no buffer that takes reads"),
        }
    })
}

/// `synchronize`: nothing is pending when a call returns.
pub(crate) unsafe extern "C" fn synchronize(_: *mut ggml_backend) {}

/// `event_new`: an event of `dev` (freed by [`event_free`]).
pub(crate) unsafe extern "C" fn event_new(dev: *mut ggml_backend_device) -> *mut ggml_backend_event {
    Box::into_raw(Box::new(ggml_backend_event { device: dev, context: std::ptr::null_mut() }))
}

/// `event_free`: frees an event made by [`event_new`].
pub(crate) unsafe extern "C" fn event_free(_: *mut ggml_backend_device, event: *mut ggml_backend_event) {
    if !event.is_null() {
        // SAFETY: ggml frees through the device that made it: ours, by
        // `event_new`'s Box, once.
        drop(unsafe { Box::from_raw(event) });
    }
}

/// `event_record`, `event_wait`, `event_synchronize`: the work before an
/// event is done when the call that queued it returned.
pub(crate) unsafe extern "C" fn event_record(_: *mut ggml_backend, _: *mut ggml_backend_event) {}

/// See [`event_record`].
pub(crate) unsafe extern "C" fn event_wait(_: *mut ggml_backend, _: *mut ggml_backend_event) {}

/// See [`event_record`].
pub(crate) unsafe extern "C" fn event_synchronize(_: *mut ggml_backend_device, _: *mut ggml_backend_event) {}
