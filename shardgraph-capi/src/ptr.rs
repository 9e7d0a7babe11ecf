//! Pointer helpers: the crate's only `unsafe` code. Each function turns a
//! pointer a C caller passed into a Rust reference, slice or string after
//! checking what can be checked here — NULL, alignment, a length whose
//! bytes fit `isize`, UTF-8 — and returns `Fail::Arg`
//! (`SG_ERR_INVALID_ARGUMENT`) otherwise. What cannot be checked is the C
//! caller's contract, stated once in `include/shardgraph.h`: a non-NULL
//! pointer points to live memory of the documented type and length,
//! handles come from the matching `sg_*_new`/`sg_*_load` and were not
//! freed, and no other thread uses the same handle or buffer during the
//! call. The references live for the call only (the entry points never
//! keep them).

use crate::status::{arg, R};
use std::ffi::{c_char, CStr};
use std::mem::MaybeUninit;

/// Checks a pointer for `n` values of `T`: non-NULL (unless `n == 0`),
/// aligned, and `n · size_of::<T>()` bytes no more than `isize::MAX`.
fn check<T>(p: *const T, n: usize, what: &str) -> R {
    if n == 0 {
        return Ok(());
    }
    if p.is_null() {
        return arg(format!("{what} is NULL"));
    }
    if !p.is_aligned() {
        return arg(format!("{what} ({p:p}) is not aligned to {} bytes", std::mem::align_of::<T>()));
    }
    if n.checked_mul(std::mem::size_of::<T>()).is_none_or(|b| b > isize::MAX as usize) {
        return arg(format!("{what}: a length of {n} elements is too large"));
    }
    Ok(())
}

/// The object a handle points to, shared.
pub(crate) fn obj<'a, T>(p: *const T, what: &str) -> R<&'a T> {
    check(p, 1, what)?;
    // SAFETY: `p` is non-NULL and aligned (checked); the C caller passes a
    // live handle of this type that no other thread mutates during the call
    // (the header's contract).
    Ok(unsafe { &*p })
}

/// The object a handle points to, exclusive.
pub(crate) fn obj_mut<'a, T>(p: *mut T, what: &str) -> R<&'a mut T> {
    check(p, 1, what)?;
    // SAFETY: `p` is non-NULL and aligned (checked); the C caller passes a
    // live handle of this type that nothing else uses during the call.
    Ok(unsafe { &mut *p })
}

/// A slot the result is written to (`T *out`): a C out-parameter, which
/// may hold anything before the call.
pub(crate) fn slot<'a, T>(p: *mut T, what: &str) -> R<&'a mut MaybeUninit<T>> {
    check(p, 1, what)?;
    // SAFETY: `p` is non-NULL and aligned (checked) and points to writable
    // memory for one `T` (the header's contract); `MaybeUninit` makes no
    // claim about what it holds before the write.
    Ok(unsafe { &mut *p.cast::<MaybeUninit<T>>() })
}

/// `n` values of `T` read from `p` (NULL allowed when `n == 0`).
pub(crate) fn slice<'a, T>(p: *const T, n: usize, what: &str) -> R<&'a [T]> {
    check(p, n, what)?;
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: `p` is non-NULL, aligned and `n` elements fit `isize` bytes
    // (checked); the C caller passes `n` readable, initialised values that
    // nothing writes during the call.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// `n` values of `T` written at `p` (NULL allowed when `n == 0`).
pub(crate) fn slice_mut<'a, T>(p: *mut T, n: usize, what: &str) -> R<&'a mut [T]> {
    check(p, n, what)?;
    if n == 0 {
        return Ok(&mut []);
    }
    // SAFETY: `p` is non-NULL, aligned and `n` elements fit `isize` bytes
    // (checked); the C caller passes `n` writable values of a plain C type
    // (every bit pattern valid, so reading them is fine too) that nothing
    // else touches during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

/// A NUL-terminated UTF-8 string.
pub(crate) fn string<'a>(p: *const c_char, what: &str) -> R<&'a str> {
    check(p, 1, what)?;
    // SAFETY: `p` is non-NULL (checked) and the C caller passes a
    // NUL-terminated string that nothing writes during the call.
    let c = unsafe { CStr::from_ptr(p) };
    match c.to_str() {
        Ok(s) => Ok(s),
        Err(e) => arg(format!("{what} is not UTF-8 ({e})")),
    }
}

/// [`string`], with NULL meaning "none".
pub(crate) fn opt_string<'a>(p: *const c_char, what: &str) -> R<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    string(p, what).map(Some)
}

/// A new handle owning `v` (freed by [`free`]).
pub(crate) fn into_handle<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Frees a handle made by [`into_handle`]; NULL is a no-op.
pub(crate) fn free<T>(p: *mut T) {
    if p.is_null() {
        return;
    }
    // SAFETY: a non-NULL `p` came from `into_handle::<T>` (`Box::into_raw`)
    // and is freed once (the header's contract: a handle is freed by its
    // own `sg_*_free`, once, and not used afterwards).
    drop(unsafe { Box::from_raw(p) });
}

/// A C callback told of each generated token (`sg_token_callback`):
/// `token` and the caller's `user_data`; non-zero goes on, 0 ends the
/// generation after this token.
pub type TokenCallback = unsafe extern "C" fn(token: i32, user_data: *mut std::ffi::c_void) -> i32;

/// Calls the C caller's token callback `f` with `token` and `user`; whether
/// to go on (non-zero).
pub(crate) fn call_token_callback(f: TokenCallback, token: i32, user: *mut std::ffi::c_void) -> bool {
    // SAFETY: `f` is the caller's `sg_token_callback` (the header's
    // contract: a function of that signature, safe to call from the thread
    // that called `sg_engine_generate_ex` with the `user_data` it gave, which
    // is passed through unread).
    unsafe { f(token, user) != 0 }
}

/// Writes `text` NUL-terminated into the `len` bytes at `buf` as
/// `snprintf` does: at most `len - 1` bytes of text then a NUL (nothing
/// when `len == 0`, and `buf` may then be NULL), cut on a UTF-8 character
/// boundary. Returns the bytes the whole text needs, the NUL included.
pub(crate) fn write_text(text: &str, buf: *mut c_char, len: usize, what: &str) -> R<usize> {
    let out = slice_mut(buf.cast::<u8>(), len, what)?;
    if let Some(room) = len.checked_sub(1) {
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        out[..end].copy_from_slice(&text.as_bytes()[..end]);
        out[end] = 0;
    }
    Ok(text.len() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Fail;

    fn is_arg<T: std::fmt::Debug>(r: R<T>, needle: &str) {
        match r {
            Err(Fail::Arg(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("expected an argument error with {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn null_misaligned_and_oversized_pointers_are_argument_errors() {
        is_arg(obj::<u64>(std::ptr::null(), "ctx"), "ctx is NULL");
        is_arg(obj_mut::<u64>(std::ptr::null_mut(), "graph"), "graph is NULL");
        is_arg(slot::<u32>(std::ptr::null_mut(), "out"), "out is NULL");
        is_arg(slice::<f32>(std::ptr::null(), 3, "values"), "values is NULL");
        let v = [0u64; 2];
        let odd = (v.as_ptr() as *const u8).wrapping_add(1).cast::<u64>();
        is_arg(slice(odd, 1, "ne"), "not aligned");
        is_arg(slice(v.as_ptr(), usize::MAX / 4, "ne"), "too large");
        is_arg(string(std::ptr::null(), "name"), "name is NULL");
    }

    #[test]
    fn valid_pointers_read_and_write() {
        assert_eq!(slice::<f32>(std::ptr::null(), 0, "values").unwrap(), &[] as &[f32]);
        let v = [1i64, 2, 3];
        assert_eq!(slice(v.as_ptr(), 3, "ne").unwrap(), &[1, 2, 3]);
        let mut w = [0i32; 2];
        slice_mut(w.as_mut_ptr(), 2, "out").unwrap().copy_from_slice(&[7, 8]);
        assert_eq!(w, [7, 8]);
        let mut x = 5u32;
        slot(&mut x, "out").unwrap().write(9);
        assert_eq!(x, 9);
        *obj_mut(&mut x, "x").unwrap() += 1;
        assert_eq!(*obj(&x, "x").unwrap(), 10);
        assert_eq!(string(c"blk.0.ffn_up.weight".as_ptr(), "name").unwrap(), "blk.0.ffn_up.weight");
        assert_eq!(opt_string(std::ptr::null(), "name").unwrap(), None);
        let bad = [0xffu8, 0xfe, 0];
        is_arg(string(bad.as_ptr().cast(), "name"), "not UTF-8");
        let h = into_handle(vec![1u8, 2, 3]);
        assert_eq!(obj(h, "h").unwrap(), &vec![1u8, 2, 3]);
        free(h);
        free::<Vec<u8>>(std::ptr::null_mut());
    }

    #[test]
    fn text_is_cut_like_snprintf() {
        let mut buf = [0x55u8; 6];
        let p = buf.as_mut_ptr().cast::<c_char>();
        assert_eq!(write_text("plan over 3", p, 6, "buf").unwrap(), 12);
        assert_eq!(&buf, b"plan \0");
        assert_eq!(write_text("ab", p, 6, "buf").unwrap(), 3);
        assert_eq!(&buf[..3], b"ab\0");
        // Only the needed length, nothing written.
        assert_eq!(write_text("abc", std::ptr::null_mut(), 0, "buf").unwrap(), 4);
        // Not cut inside a character: "×" is 2 bytes.
        let mut b3 = [0x55u8; 3];
        assert_eq!(write_text("a×b", b3.as_mut_ptr().cast(), 3, "buf").unwrap(), 5);
        assert_eq!(&b3[..2], b"a\0");
    }
}
