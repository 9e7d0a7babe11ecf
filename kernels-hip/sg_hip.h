// sg_hip.h — the HIP portability header: kernels-cuda/*.cu compile for AMD
// GPUs with this file in front (hipRTC at run time, `hipcc --genco` in the
// compile check, and the emulator's HIP devices). It maps the few CUDA
// names the kernels use that HIP spells differently, and fixes the wave
// size. Everything vendor-specific in the kernels is behind `SG_HIP` or
// `SG_WARP`, in common.cuh (conversions, shuffles) and block_reduce.cuh
// (block reductions); search for them to find every such place.

#define SG_HIP 1

// The HIP runtime's device names (threadIdx, __syncthreads, __shfl_xor,
// math functions). hipRTC has them built in; the emulator brings its own.
#if !defined(SG_CUDA_EMU) && !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif

// SG_WARP, the hardware wave size the block reductions are written for:
// 64 on GCN and CDNA (gfx8, gfx9: MI50/MI100/MI200/MI300), 32 on RDNA
// (gfx10, gfx11, gfx12: the compiler's default wave size there). The
// emulator sets it itself (an emulated CDNA device has 64-wide waves).
#ifndef SG_WARP
#if defined(__GFX8__) || defined(__GFX9__)
#define SG_WARP 64
#elif defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__)
#define SG_WARP 32
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define SG_WARP __AMDGCN_WAVEFRONT_SIZE
#else
#define SG_WARP 64
#endif
#endif
