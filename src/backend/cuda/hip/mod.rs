//! The HIP runtime behind the `Gpu` interface (AMD GPUs). Being written.

use super::api::{DevPtr, Gpu, GpuInfo, KArg};
use crate::error::{Error, Result};

/// One (virtual) device on an AMD GPU.
#[derive(Debug)]
pub(crate) struct HipGpu;

impl HipGpu {
    /// `n` devices on GPU `ordinal`, each with its own stream.
    pub(crate) fn open(ordinal: usize, n: usize) -> Result<Vec<HipGpu>> {
        let _ = n;
        Err(Error::Hip { detail: format!("GPU {ordinal}: the HIP runtime is not written yet") })
    }
}

impl Gpu for HipGpu {
    fn info(&self) -> GpuInfo {
        GpuInfo { name: String::new(), memory_total: 0, multiprocessors: 1, memory_bandwidth: 0.0, warp_size: 64 }
    }
    fn alloc(&self, _bytes: usize) -> Result<DevPtr> {
        Err(Error::Hip { detail: "not written".into() })
    }
    unsafe fn free(&self, _ptr: DevPtr) {}
    unsafe fn write(&self, _dst: DevPtr, _src: &[u8]) -> Result<()> {
        Err(Error::Hip { detail: "not written".into() })
    }
    unsafe fn read(&self, _src: DevPtr, _dst: &mut [u8]) -> Result<()> {
        Err(Error::Hip { detail: "not written".into() })
    }
    unsafe fn memset(&self, _dst: DevPtr, _value: u8, _n: usize) -> Result<()> {
        Err(Error::Hip { detail: "not written".into() })
    }
    unsafe fn launch(&self, _kernel: &str, _grid: [u32; 3], _block: [u32; 3], _args: &[KArg]) -> Result<()> {
        Err(Error::Hip { detail: "not written".into() })
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
