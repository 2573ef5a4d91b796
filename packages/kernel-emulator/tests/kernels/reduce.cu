// Block reduction through shared memory and barriers, and a warp-shuffle reduction.
#include <cuda_runtime.h>

template <int BLOCK>
__global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
  __shared__ float partial[BLOCK];
  const int t = threadIdx.x;
  const int i = blockIdx.x * BLOCK + t;
  partial[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int s = BLOCK / 2; s > 0; s >>= 1) {
    if (t < s) partial[t] += partial[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Dynamic shared memory: one partial per warp.
__global__ void warp_block_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
  extern __shared__ float warp_partials[];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = warp_sum(i < n ? x[i] : 0.0f);
  const int warp = threadIdx.x / warpSize, lane = threadIdx.x % warpSize;
  if (lane == 0) warp_partials[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + warpSize - 1) / warpSize;
    float w = lane < warps ? warp_partials[lane] : 0.0f;
    w = warp_sum(w);
    if (lane == 0) atomicAdd(out, w);
  }
}

template __global__ void block_sum<64>(const float* __restrict__, float* __restrict__, int);
template __global__ void block_sum<128>(const float* __restrict__, float* __restrict__, int);
template __global__ void block_sum<256>(const float* __restrict__, float* __restrict__, int);
