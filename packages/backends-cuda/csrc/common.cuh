// Helpers shared by the kernel families: element conversions and NaN-aware reductions.
// Written in the emulator's CUDA subset (docs/pages/emulator.md), like every kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bnb {

// Loads widen exactly; stores round to nearest even, as torch's .to(dtype) does.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// max that propagates NaN, as torch.amax does (fmaxf would drop it).
__device__ __forceinline__ float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

// Max over a block of THREADS lanes (a multiple of 32, at most 1024); every lane gets the result.
// Every lane of the block must call it (it has barriers); `scratch` holds THREADS / 32 floats.
template <int THREADS>
__device__ __forceinline__ float block_nan_max(float v, float* scratch) {
  static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS must be a multiple of 32, at most 1024");
  for (int offset = 16; offset > 0; offset /= 2) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < THREADS / 32 ? scratch[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // scratch may be reused by the caller right away
  return v;
}

}  // namespace bnb
