//! SIMD dot-product kernels, chosen at run time.
//!
//! One binary runs everywhere: [`best`] asks the CPU (`is_x86_feature_detected!`)
//! and returns the fastest kernel it supports, else `None` and the caller
//! uses the scalar kernel from `dot.rs`, which is always compiled and is the
//! reference every SIMD kernel is tested against.
//!
//! All `unsafe` of the quant module lives under this directory.

use crate::tensor::GgmlType;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_iq;

/// Name of the instruction set [`best`] selects on this machine
/// (`"avx2+fma+f16c"` or `"scalar"`).
pub(crate) fn isa_name() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        return "avx2+fma+f16c";
    }
    "scalar"
}

/// The fastest SIMD dot kernel for weight type `ty` on this CPU, if any.
pub(crate) fn best(ty: GgmlType) -> Option<super::VecDotFn> {
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        return avx2::kernel(ty).or_else(|| avx2_iq::kernel(ty));
    }
    let _ = ty;
    None
}
