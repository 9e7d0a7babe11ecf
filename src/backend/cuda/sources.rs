//! The kernel sources every GPU vendor compiles: `kernels-cuda/*.cu`, one
//! file per kernel family, each with its `#include "x.cuh"` lines replaced
//! by the header's text (NVRTC and hipRTC compile one file with no include
//! path), embedded by `build.rs`. CUDA (NVRTC) compiles them as they are;
//! HIP (hipRTC, and `hipcc` in the compile check) compiles
//! [`hip_source`]: the same text behind the portability header
//! `kernels-hip/sg_hip.h`, which maps CUDA's names to HIP's and sets the
//! wave size (`SG_WARP`) of the target.

/// Every `kernels-cuda/*.cu` file: `(file stem, CUDA C source)`, in file-name order.
pub const KERNEL_SOURCES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/cuda_kernels.rs"));

/// The HIP portability header (`kernels-hip/sg_hip.h`), put in front of a
/// kernel file to compile it for an AMD GPU.
pub const HIP_HEADER: &str = include_str!("../../../kernels-hip/sg_hip.h");

/// Kernel file `source` (an entry of [`KERNEL_SOURCES`]) as HIP compiles
/// it: [`HIP_HEADER`], then the file, with a `#line` directive so compiler
/// messages keep the file's own line numbers.
pub fn hip_source(name: &str, source: &str) -> String {
    format!("{HIP_HEADER}\n#line 1 \"{name}.cu\"\n{source}")
}
