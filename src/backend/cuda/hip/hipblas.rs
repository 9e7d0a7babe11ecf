//! hipBLAS, loaded at run time when present (`libhipblas.so.3` in ROCm 7,
//! `.2` in 6, `.1`/`.0` in 5): F32 GEMM for `mul_mat`. Without it the
//! backend uses its own kernels.
//!
//! Enum values, from hipBLAS's `hipblas.h` (ROCm 5.x/6.x) and
//! hipBLAS-common's `hipblas-common.h` (ROCm 7), the same in each:
//! `HIPBLAS_OP_N` = 111, `HIPBLAS_OP_T` = 112 (cblas's values),
//! `HIPBLAS_STATUS_SUCCESS` = 0. The pointer mode is left at its default,
//! `HIPBLAS_POINTER_MODE_HOST` (alpha and beta are host scalars).

use super::runtime::{candidates, load_first, Handle};
use std::sync::OnceLock;

/// `hipblasOperation_t::HIPBLAS_OP_N`.
pub(crate) const OP_N: i32 = 111;
/// `hipblasOperation_t::HIPBLAS_OP_T`.
pub(crate) const OP_T: i32 = 112;

type Status = i32;
type FnCreate = unsafe extern "C" fn(*mut Handle) -> Status;
type FnDestroy = unsafe extern "C" fn(Handle) -> Status;
type FnSetStream = unsafe extern "C" fn(Handle, Handle) -> Status;
type FnSgemm = unsafe extern "C" fn(
    Handle,
    i32,
    i32,
    i32,
    i32,
    i32,
    *const f32,
    *const f32,
    i32,
    *const f32,
    i32,
    *const f32,
    *mut f32,
    i32,
) -> Status;

/// The bound hipBLAS entry points.
pub(crate) struct Blas {
    _lib: libloading::Library,
    /// The library loaded.
    pub(crate) soname: String,
    create: FnCreate,
    destroy: FnDestroy,
    set_stream: FnSetStream,
    sgemm: FnSgemm,
}

/// hipBLAS, loaded once per process; `None` when absent.
pub(crate) fn blas() -> Option<&'static Blas> {
    static BLAS: OnceLock<Option<Blas>> = OnceLock::new();
    BLAS.get_or_init(|| {
        let (lib, soname) = load_first(&candidates("libhipblas", &["3", "2", "1", "0"])).ok()?;
        fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
            // SAFETY: each `T` requested below is `name`'s C declaration in
            // hipblas.h (handles and streams are pointers, enums `int`).
            unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
        }
        Some(Blas {
            create: sym(&lib, "hipblasCreate")?,
            destroy: sym(&lib, "hipblasDestroy")?,
            set_stream: sym(&lib, "hipblasSetStream")?,
            sgemm: sym(&lib, "hipblasSgemm")?,
            soname,
            _lib: lib,
        })
    })
    .as_ref()
}

impl Blas {
    /// A handle for the current device, bound to `stream`; `None` (and
    /// nothing leaked) when either step fails.
    pub(crate) fn create(&self, stream: Handle) -> Option<Handle> {
        let mut h = Handle(std::ptr::null_mut());
        // SAFETY: writes one handle.
        if unsafe { (self.create)(&mut h) } != 0 {
            return None;
        }
        // SAFETY: a fresh handle and a live stream of the current device.
        if unsafe { (self.set_stream)(h, stream) } != 0 {
            // SAFETY: the handle is not used again.
            let _ = unsafe { (self.destroy)(h) };
            return None;
        }
        Some(h)
    }

    /// Destroys a handle from [`Blas::create`].
    ///
    /// # Safety
    /// `h` is live and not used afterwards.
    pub(crate) unsafe fn destroy(&self, h: Handle) {
        // SAFETY: the caller's guarantee.
        let _ = unsafe { (self.destroy)(h) };
    }

    /// `C = op(A)·op(B)` in F32, column-major (`hipblasSgemm` with alpha 1,
    /// beta 0); returns hipBLAS's status (0 is success).
    ///
    /// # Safety
    /// `h` is a live handle and the three matrices, with their leading
    /// dimensions, lie in device memory of the handle's device.
    pub(crate) unsafe fn sgemm(
        &self,
        h: Handle,
        (ta, tb): (i32, i32),
        (m, n, k): (i32, i32, i32),
        (a, lda): (u64, i32),
        (b, ldb): (u64, i32),
        (c, ldc): (u64, i32),
    ) -> i32 {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller's guarantee; alpha/beta are host scalars read
        // during the call (the default host pointer mode).
        unsafe {
            (self.sgemm)(
                h,
                ta,
                tb,
                m,
                n,
                k,
                &alpha,
                a as *const f32,
                lda,
                b as *const f32,
                ldb,
                &beta,
                c as *mut f32,
                ldc,
            )
        }
    }
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blas({})", self.soname)
    }
}
