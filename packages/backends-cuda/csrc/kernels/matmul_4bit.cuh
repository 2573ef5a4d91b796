// Helpers of the 4-bit matmul kernels (matmul_4bit.cu): 16-byte vector loads/stores and the nibble rule.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common.cuh"

namespace bnb_matmul_4bit {

using bnb::from_float;
using bnb::to_float;

// Loads N consecutive elements of T (16-byte aligned, N * sizeof(T) a multiple of 16) as floats, with
// 16-byte loads through the read-only cache.
template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* __restrict__ src, float (&dst)[N]) {
  constexpr int kPerVec = 16 / sizeof(T);
  static_assert(N % kPerVec == 0, "whole 16-byte vectors only");
  const uint4* v = reinterpret_cast<const uint4*>(src);
#pragma unroll
  for (int i = 0; i < N / kPerVec; ++i) {
    const uint4 q = __ldg(v + i);
    const T* e = reinterpret_cast<const T*>(&q);
#pragma unroll
    for (int j = 0; j < kPerVec; ++j) dst[i * kPerVec + j] = to_float(e[j]);
  }
}

// Stores N floats rounded to T at dst (16-byte aligned, N * sizeof(T) a multiple of 16) with 16-byte
// stores.
template <typename T, int N>
__device__ __forceinline__ void store_floats(T* __restrict__ dst, const float (&src)[N]) {
  constexpr int kPerVec = 16 / sizeof(T);
  static_assert(N % kPerVec == 0, "whole 16-byte vectors only");
  uint4* v = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int i = 0; i < N / kPerVec; ++i) {
    uint4 q;
    T* e = reinterpret_cast<T*>(&q);
#pragma unroll
    for (int j = 0; j < kPerVec; ++j) e[j] = from_float<T>(src[i * kPerVec + j]);
    v[i] = q;
  }
}

// The 4-bit code of flat weight index f: the high nibble of byte f / 2 for even f, the low one for odd.
__device__ __forceinline__ int code_at(const unsigned char* __restrict__ B, long long f) {
  const int byte = B[f >> 1];
  return (f & 1) ? (byte & 15) : (byte >> 4);
}

}  // namespace bnb_matmul_4bit
