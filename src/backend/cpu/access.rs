//! The one place where CPU kernels touch raw memory.
//!
//! A [`TView`] is a tensor's layout plus a pointer to its first byte inside a
//! live [`super::CpuBuffer`]. Invariants, established by
//! [`super::CpuBackend::compute`] before any kernel runs:
//! 1. `[ptr, ptr + span)` lies inside one CPU buffer that outlives the compute
//!    call (the storage map holds an `Arc` to it), where `span` is the
//!    tensor's `nbytes`.
//! 2. Kernels only pass indices `i[k] < ne[k]` (checked with `debug_assert!`),
//!    so every computed address is inside the span.
//! 3. Within one node, threads write disjoint destination elements, and
//!    reads of a source never overlap writes of the destination except in
//!    the in-place case, where element `e` of the destination is written only
//!    after element `e` (and no other element) of the source was read into
//!    scratch by the same thread ([`TView::load_row_f32`] copies, it does not
//!    borrow).
//!
//! No `&mut` reference to buffer memory is created here but one: reads and
//! writes go through `ptr::read_unaligned`/`ptr::write_unaligned` and
//! byte-wise `ptr::copy_nonoverlapping` into caller-owned scratch (tensor
//! data may sit at any byte offset, so no typed pointer into a buffer is ever
//! dereferenced or copied through), so aliasing views
//! (a view and its source, in-place results) never form overlapping Rust
//! references. The one exception, [`TView::f32_rows_mut`], lends a task a
//! slice of packed, aligned F32 rows that it alone reads and writes while it
//! holds it (a recurrent state updated in place), so no other view touches
//! those bytes for the slice's lifetime.

use crate::error::Result;
use crate::tensor::{quant, GgmlType, Tensor};
use half::{bf16, f16};

/// A tensor's layout and data pointer for kernels (see the module invariants).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TView {
    ptr: *mut u8,
    /// Element type.
    pub ty: GgmlType,
    /// Extents, `ne[0]` innermost.
    pub ne: [usize; 4],
    /// Byte strides.
    pub nb: [usize; 4],
    span: usize,
}

// SAFETY: a TView is a pointer into a buffer kept alive by the compute call;
// concurrent use follows invariant 3 of the module docs.
unsafe impl Send for TView {}
// SAFETY: as above.
unsafe impl Sync for TView {}

impl TView {
    /// # Safety
    /// `ptr` must point to the first byte of `t`'s data and `[ptr, ptr + t.nbytes())`
    /// must be valid for reads and writes for as long as the view is used.
    pub(crate) unsafe fn new(ptr: *mut u8, t: &Tensor) -> Self {
        TView {
            ptr,
            ty: t.ty,
            ne: [t.ne[0] as usize, t.ne[1] as usize, t.ne[2] as usize, t.ne[3] as usize],
            nb: t.nb,
            span: t.nbytes(),
        }
    }

    /// The bytes the view spans, `[start, end)` as addresses (for overlap
    /// checks; never dereferenced).
    pub(crate) fn addr_range(&self) -> (usize, usize) {
        let start = self.ptr as usize;
        (start, start.saturating_add(self.span))
    }

    /// A view with the same pointer and a different layout, used by kernels
    /// that reinterpret a tensor (e.g. as rows). The new layout must not reach
    /// past the original span.
    pub(crate) fn with_layout(&self, ty: GgmlType, ne: [usize; 4], nb: [usize; 4]) -> Option<TView> {
        let ne_i = [ne[0] as i64, ne[1] as i64, ne[2] as i64, ne[3] as i64];
        let span = crate::tensor::nbytes(ty, &ne_i, &nb);
        (span <= self.span).then_some(TView { ptr: self.ptr, ty, ne, nb, span })
    }

    /// Element count.
    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Rows (`ne1·ne2·ne3`).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Splits a flat row index into (i1, i2, i3).
    pub fn row_index(&self, r: usize) -> (usize, usize, usize) {
        let i1 = r % self.ne[1].max(1);
        let i2 = (r / self.ne[1].max(1)) % self.ne[2].max(1);
        let i3 = r / (self.ne[1].max(1) * self.ne[2].max(1));
        (i1, i2, i3)
    }

    /// True if each row is packed (`nb[0] == type_size`).
    pub fn rows_packed(&self) -> bool {
        self.ne[0] <= 1 || self.nb[0] == self.ty.type_size()
    }

    /// True if the whole tensor is packed in ggml order.
    pub fn is_contiguous(&self) -> bool {
        let ne_i = [self.ne[0] as i64, self.ne[1] as i64, self.ne[2] as i64, self.ne[3] as i64];
        crate::tensor::is_contiguous(self.ty, &ne_i, &self.nb)
    }

    /// Rows `i1 .. i1 + rows` of (i2, i3) as one mutable `f32` slice of
    /// `rows · ne[0]` values, when the view holds F32 rows packed one after
    /// another (`nb[0] = 4`, `nb[1] = 4·ne[0]`) at a 4-byte-aligned address;
    /// `None` otherwise (the caller then copies rows through scratch), and
    /// for rows or indices outside the view.
    ///
    /// # Safety
    /// While the slice lives, no other thread and no other view reads or
    /// writes these elements: the caller's task owns them (module invariant
    /// 3, strengthened from "element by element" to "the whole run").
    pub(crate) unsafe fn f32_rows_mut<'a>(
        &self,
        i1: usize,
        i2: usize,
        i3: usize,
        rows: usize,
    ) -> Option<&'a mut [f32]> {
        let packed = self.ty == GgmlType::F32 && self.nb[0] == 4 && self.nb[1] == 4 * self.ne[0];
        let inside = i1.checked_add(rows).is_some_and(|e| e <= self.ne[1]) && i2 < self.ne[2] && i3 < self.ne[3];
        if !packed || !inside || rows == 0 || self.ne[0] == 0 {
            return None;
        }
        let o = self.offset(0, i1, i2, i3);
        let n = rows * self.ne[0];
        if o.checked_add(4 * n).is_none_or(|e| e > self.span) {
            return None;
        }
        // SAFETY: `o` is inside the span (checked above).
        let p = unsafe { self.ptr.add(o) };
        if p as usize % std::mem::align_of::<f32>() != 0 {
            return None;
        }
        // SAFETY: `[o, o + 4n)` lies inside the span (checked above; module
        // invariant 1: valid for reads and writes while the compute call
        // runs), `p` is 4-byte aligned, any bit pattern is an f32, and the
        // caller guarantees exclusive access for the slice's lifetime.
        Some(unsafe { std::slice::from_raw_parts_mut(p as *mut f32, n) })
    }

    #[inline]
    fn offset(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> usize {
        debug_assert!(
            i0 < self.ne[0].max(1) && i1 < self.ne[1].max(1) && i2 < self.ne[2].max(1) && i3 < self.ne[3].max(1)
        );
        (i0 / self.ty.block_size()) * self.nb[0] + i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3]
    }

    #[inline]
    fn read<T: Copy>(&self, off: usize) -> T {
        debug_assert!(off + std::mem::size_of::<T>() <= self.span);
        // SAFETY: module invariants 1-2 keep `off` inside the span.
        unsafe { std::ptr::read_unaligned(self.ptr.add(off) as *const T) }
    }

    #[inline]
    fn write<T: Copy>(&self, off: usize, v: T) {
        debug_assert!(off + std::mem::size_of::<T>() <= self.span);
        // SAFETY: module invariants 1-3 (inside the span, disjoint writers).
        unsafe { std::ptr::write_unaligned(self.ptr.add(off) as *mut T, v) }
    }

    /// Reads element (i0, i1, i2, i3) of a non-quantized tensor as f32
    /// (integers are converted).
    #[inline]
    pub fn get_f32(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> f32 {
        let o = self.offset(i0, i1, i2, i3);
        match self.ty {
            GgmlType::F32 => self.read::<f32>(o),
            GgmlType::F16 => f16::from_bits(self.read::<u16>(o)).to_f32(),
            GgmlType::BF16 => bf16::from_bits(self.read::<u16>(o)).to_f32(),
            GgmlType::F64 => self.read::<f64>(o) as f32,
            GgmlType::I8 => self.read::<i8>(o) as f32,
            GgmlType::I16 => self.read::<i16>(o) as f32,
            GgmlType::I32 => self.read::<i32>(o) as f32,
            GgmlType::I64 => self.read::<i64>(o) as f32,
            _ => f32::NAN,
        }
    }

    /// Writes element (i0, i1, i2, i3) of a non-quantized tensor from f32.
    #[inline]
    pub fn set_f32(&self, i0: usize, i1: usize, i2: usize, i3: usize, v: f32) {
        let o = self.offset(i0, i1, i2, i3);
        match self.ty {
            GgmlType::F32 => self.write(o, v),
            GgmlType::F16 => self.write(o, f16::from_f32(v).to_bits()),
            GgmlType::BF16 => self.write(o, bf16::from_f32(v).to_bits()),
            GgmlType::F64 => self.write(o, v as f64),
            GgmlType::I8 => self.write(o, v as i8),
            GgmlType::I16 => self.write(o, v as i16),
            GgmlType::I32 => self.write(o, v as i32),
            GgmlType::I64 => self.write(o, v as i64),
            _ => {}
        }
    }

    /// Reads an integer element (I8/I16/I32/I64; floats are truncated) as i64.
    #[inline]
    pub fn get_i64(&self, i0: usize, i1: usize, i2: usize, i3: usize) -> i64 {
        let o = self.offset(i0, i1, i2, i3);
        match self.ty {
            GgmlType::I32 => self.read::<i32>(o) as i64,
            GgmlType::I64 => self.read::<i64>(o),
            GgmlType::I16 => self.read::<i16>(o) as i64,
            GgmlType::I8 => self.read::<i8>(o) as i64,
            _ => self.get_f32(i0, i1, i2, i3) as i64,
        }
    }

    /// Writes an I64 element (exact; other types take it as [`Self::set_i32`] does).
    #[inline]
    pub fn set_i64(&self, i0: usize, i1: usize, i2: usize, i3: usize, v: i64) {
        let o = self.offset(i0, i1, i2, i3);
        match self.ty {
            GgmlType::I64 => self.write(o, v),
            _ => self.write(o, v as i32),
        }
    }

    /// Writes an I32 element (argmax/top_k/argsort results).
    #[inline]
    pub fn set_i32(&self, i0: usize, i1: usize, i2: usize, i3: usize, v: i32) {
        let o = self.offset(i0, i1, i2, i3);
        match self.ty {
            GgmlType::I64 => self.write(o, v as i64),
            _ => self.write(o, v),
        }
    }

    /// Copies the raw bytes of row (i1, i2, i3) into `out` (`out.len()` =
    /// row bytes). Rows must be packed ([`Self::rows_packed`]).
    pub fn load_row_bytes(&self, i1: usize, i2: usize, i3: usize, out: &mut [u8]) {
        let o = self.offset(0, i1, i2, i3);
        let n = out.len().min(self.span.saturating_sub(o));
        // SAFETY: `[o, o+n)` is inside the span (clamped); `out` is caller-owned, so no overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(o), out.as_mut_ptr(), n) }
    }

    /// Copies the raw bytes of elements `i0 ..` of row (i1, i2, i3) into
    /// `out` (`out.len()` bytes, clamped to the span; `i0` at a block start
    /// for block types). Rows must be packed. Used by kernels that stream a
    /// long row in pieces (attention masks).
    pub fn load_run_bytes(&self, i0: usize, i1: usize, i2: usize, i3: usize, out: &mut [u8]) {
        let o = self.offset(i0, i1, i2, i3);
        let n = out.len().min(self.span.saturating_sub(o));
        // SAFETY: `[o, o+n)` is inside the span (clamped); `out` is caller-owned, so no overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(o), out.as_mut_ptr(), n) }
    }

    /// Copies `data` into the raw bytes of row (i1, i2, i3). Rows must be packed.
    pub fn store_row_bytes(&self, i1: usize, i2: usize, i3: usize, data: &[u8]) {
        let o = self.offset(0, i1, i2, i3);
        let n = data.len().min(self.span.saturating_sub(o));
        // SAFETY: inside the span; `data` is caller-owned scratch (invariant 3).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(o), n) }
    }

    /// True when the two views' spans share a byte.
    pub(crate) fn overlaps(&self, other: &TView) -> bool {
        let ((a0, a1), (b0, b1)) = (self.addr_range(), other.addr_range());
        a0 < b1 && b0 < a1
    }

    /// Copies bytes `start .. start + len` of packed row (j1, j2, j3) of
    /// `src` to the same bytes of packed row (i1, i2, i3) of this view, with
    /// no scratch in between (one `memcpy`). The two views must not overlap
    /// (chunks of one row go to different threads: an overlapping copy
    /// would race; [`TView::overlaps`] tells). Both views have the same
    /// type; the range is clamped to both spans.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy_row_bytes_from(
        &self,
        (i1, i2, i3): (usize, usize, usize),
        src: &TView,
        (j1, j2, j3): (usize, usize, usize),
        start: usize,
        len: usize,
    ) {
        let (o, so) = (self.offset(0, i1, i2, i3) + start, src.offset(0, j1, j2, j3) + start);
        let n = len.min(self.span.saturating_sub(o)).min(src.span.saturating_sub(so));
        if n == 0 {
            return;
        }
        // SAFETY: both ranges are inside their spans (clamped, and non-empty,
        // so `o` and `so` are inside them; invariant 1); no reference to
        // either is formed. The caller copies between views that do not
        // overlap, and threads copy disjoint destination ranges (invariant 3).
        unsafe { std::ptr::copy_nonoverlapping(src.ptr.add(so), self.ptr.add(o), n) }
    }

    /// The whole span as a shared byte slice, for read-heavy kernels (the
    /// matrix product reads weight rows in place instead of copying them).
    /// Element (i0, i1, i2, i3) starts at byte
    /// `(i0 / block_size)·nb[0] + i1·nb[1] + i2·nb[2] + i3·nb[3]` of the slice.
    ///
    /// # Safety
    /// Nothing may write any byte of the span while the slice lives: call it
    /// only on sources of ops whose result never shares memory with them (ops
    /// outside [`crate::ops::Op::can_inplace`], e.g. `mul_mat`), never on a destination.
    pub(crate) unsafe fn src_bytes(&self) -> &[u8] {
        // SAFETY: invariant 1 (the span is live for the compute call); the
        // caller guarantees no concurrent writer, so a shared slice is sound.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.span) }
    }

    /// Writes `data` into consecutive elements `i0 .. i0 + data.len()` of row
    /// (i1, i2, i3), converting to the tensor's type (non-quantized types;
    /// one copy for packed F32 rows). Elements past `ne[0]` are dropped.
    pub fn store_f32_run(&self, i0: usize, i1: usize, i2: usize, i3: usize, data: &[f32]) {
        let n = data.len().min(self.ne[0].saturating_sub(i0));
        if n == 0 || self.ty.is_quantized() {
            return;
        }
        if self.ty == GgmlType::F32 && self.rows_packed() {
            let o = self.offset(i0, i1, i2, i3);
            debug_assert!(o + 4 * n <= self.span);
            // SAFETY: elements i0..i0+n of the row are inside the span
            // (invariant 2); `data` is caller-owned scratch (invariant 3).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr() as *const u8, self.ptr.add(o), 4 * n) }
            return;
        }
        for (k, &v) in data[..n].iter().enumerate() {
            self.set_f32(i0 + k, i1, i2, i3, v);
        }
    }

    /// Copies the raw bytes of one element (one block for block types; `i0`
    /// is then an element index at a block start) into `out`
    /// (`out.len()` = type size). Works for any strides.
    pub fn load_elem_bytes(&self, i0: usize, i1: usize, i2: usize, i3: usize, out: &mut [u8]) {
        let o = self.offset(i0, i1, i2, i3);
        let n = out.len().min(self.ty.type_size()).min(self.span.saturating_sub(o));
        // SAFETY: `[o, o+n)` is inside the span (clamped); `out` is caller-owned, so no overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(o), out.as_mut_ptr(), n) }
    }

    /// True for the types [`TView::copy_elems_rows`] copies: non-block
    /// types of 1, 2 or 4 bytes.
    pub(crate) fn copies_by_element(&self) -> bool {
        self.ty.block_size() == 1 && matches!(self.ty.type_size(), 1 | 2 | 4)
    }

    /// Copies elements `s0 .. s0 + n` of each flat row `r` in `rows` of
    /// `src` to elements `d0 ..` of flat row `r` of this view (each view's
    /// rows in its own ggml order), one element at a time through both
    /// views' strides: the short rows of `concat` and `cpy`, e.g. a conv
    /// state's 3 columns per channel. No scratch row and no call per
    /// element, and each view's row index is stepped, not divided out, from
    /// one row to the next (a row of 4 elements cost more in index
    /// arithmetic than in copying when each row was placed alone). Both
    /// views must hold one non-block type of 1, 2 or 4 bytes; otherwise
    /// nothing is copied and the result is false. `n` is clamped to both
    /// rows and `rows` to both views' row counts.
    pub(crate) fn copy_elems_rows(
        &self,
        rows: std::ops::Range<usize>,
        d0: usize,
        src: &TView,
        s0: usize,
        n: usize,
    ) -> bool {
        if self.ty != src.ty || !self.copies_by_element() {
            return false;
        }
        let n = n.min(self.ne[0].saturating_sub(d0)).min(src.ne[0].saturating_sub(s0));
        let end = rows.end.min(self.nrows()).min(src.nrows());
        if n == 0 || rows.start >= end {
            return true;
        }
        let (mut di, mut si) = (self.row_index(rows.start), src.row_index(rows.start));
        let (od0, os0) = (self.offset(d0, 0, 0, 0), src.offset(s0, 0, 0, 0));
        let at = |v: &TView, i: (usize, usize, usize)| i.0 * v.nb[1] + i.1 * v.nb[2] + i.2 * v.nb[3];
        for _ in rows.start..end {
            // Rows below both row counts and elements d0 + e < ne[0],
            // s0 + e < src.ne[0] (clamped above): inside both spans
            // (invariant 2).
            let (od, os) = (od0 + at(self, di), os0 + at(src, si));
            match self.ty.type_size() {
                4 => self.copy_run::<u32>(od, src, os, n),
                2 => self.copy_run::<u16>(od, src, os, n),
                _ => self.copy_run::<u8>(od, src, os, n),
            }
            self.step_row(&mut di);
            src.step_row(&mut si);
        }
        true
    }

    /// `n` elements of type `T` from byte `os` of `src` to byte `od` here,
    /// each view's `nb[0]` apart (the caller keeps both runs in their spans).
    #[inline(always)]
    fn copy_run<T: Copy>(&self, od: usize, src: &TView, os: usize, n: usize) {
        for e in 0..n {
            self.write(od + e * self.nb[0], src.read::<T>(os + e * src.nb[0]));
        }
    }

    /// The row after `i` (i1, i2, i3) in flat order ([`TView::row_index`]
    /// of the next index).
    #[inline(always)]
    fn step_row(&self, i: &mut (usize, usize, usize)) {
        i.0 += 1;
        if i.0 >= self.ne[1].max(1) {
            i.0 = 0;
            i.1 += 1;
            if i.1 >= self.ne[2].max(1) {
                i.1 = 0;
                i.2 += 1;
            }
        }
    }

    /// Writes the raw bytes of one element (one block for block types) from
    /// `data` (`data.len()` = type size). Works for any strides.
    pub fn store_elem_bytes(&self, i0: usize, i1: usize, i2: usize, i3: usize, data: &[u8]) {
        let o = self.offset(i0, i1, i2, i3);
        let n = data.len().min(self.ty.type_size()).min(self.span.saturating_sub(o));
        // SAFETY: inside the span (clamped); `data` is caller-owned scratch (invariant 3).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(o), n) }
    }

    /// Loads row (i1, i2, i3) as f32 into `out` (`out.len()` = `ne[0]`),
    /// converting from any float, integer or quantized type and following
    /// `nb[0]` for strided rows.
    pub fn load_row_f32(&self, i1: usize, i2: usize, i3: usize, out: &mut [f32]) -> Result<()> {
        let n = self.ne[0].min(out.len());
        if self.ty.is_quantized() {
            let rb = (n / self.ty.block_size()) * self.ty.type_size();
            let mut raw = vec![0u8; rb];
            self.load_row_bytes(i1, i2, i3, &mut raw);
            return quant::dequantize_row(self.ty, &raw, &mut out[..n]);
        }
        if self.ty == GgmlType::F32 && self.rows_packed() {
            let o = self.offset(0, i1, i2, i3);
            debug_assert!(o + 4 * n <= self.span);
            // SAFETY: inside the span; `out` is caller-owned.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(o), out.as_mut_ptr() as *mut u8, 4 * n) }
            return Ok(());
        }
        for (i0, v) in out[..n].iter_mut().enumerate() {
            *v = self.get_f32(i0, i1, i2, i3);
        }
        Ok(())
    }

    /// Stores `data` (`ne[0]` values) into row (i1, i2, i3), converting to the
    /// tensor's type (quantized types as ggml's CPU `from_float` converts
    /// them: [`quant::from_float`]).
    pub fn store_row_f32(&self, i1: usize, i2: usize, i3: usize, data: &[f32]) -> Result<()> {
        let n = self.ne[0].min(data.len());
        if self.ty.is_quantized() {
            let rb = (n / self.ty.block_size()) * self.ty.type_size();
            let mut raw = vec![0u8; rb];
            quant::from_float(self.ty, &data[..n], &mut raw)?;
            self.store_row_bytes(i1, i2, i3, &raw);
            return Ok(());
        }
        if self.ty == GgmlType::F32 && self.rows_packed() {
            let o = self.offset(0, i1, i2, i3);
            debug_assert!(o + 4 * n <= self.span);
            // SAFETY: inside the span; `data` is caller-owned scratch (invariant 3).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr() as *const u8, self.ptr.add(o), 4 * n) }
            return Ok(());
        }
        for (i0, &v) in data[..n].iter().enumerate() {
            self.set_f32(i0, i1, i2, i3, v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Context;

    #[test]
    fn strided_rows_round_trip_through_scratch() {
        let mut ctx = Context::new();
        let id = ctx.new_tensor_2d(GgmlType::F16, 3, 2).unwrap();
        let t = ctx.tensor(id).unwrap().clone();
        let mut mem = vec![0u8; t.nbytes()];
        // SAFETY: `mem` holds exactly the tensor's bytes and outlives `v`.
        let v = unsafe { TView::new(mem.as_mut_ptr(), &t) };
        v.store_row_f32(1, 0, 0, &[1.0, -2.5, 3.0]).unwrap();
        let mut out = [0f32; 3];
        v.load_row_f32(1, 0, 0, &mut out).unwrap();
        assert_eq!(out, [1.0, -2.5, 3.0]);
        assert_eq!(v.get_f32(1, 1, 0, 0), -2.5);
        // A transposed layout over the same bytes reads column-wise.
        let tv = v.with_layout(GgmlType::F16, [2, 3, 1, 1], [6, 2, 12, 12]).unwrap();
        assert_eq!(tv.get_f32(1, 2, 0, 0), 3.0);
        assert!(v.with_layout(GgmlType::F16, [4, 2, 1, 1], [2, 8, 16, 16]).is_none());
    }
}
