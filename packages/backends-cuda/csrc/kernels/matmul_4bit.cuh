// Helpers of the 4-bit matmul kernels (matmul_4bit.cu): vector loads/stores, the nibble rule, block scales.
#pragma once

#include <bitsandbytes/formats.h>
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

// CB bytes of packed codes at p (CB-byte aligned) as CB / 4 little-endian words, in one load; zeros
// where !live (no load). STREAM: read once by the whole grid (a single tile of rows), so the load is
// marked evict-first (ld.global.cs) and leaves L1 and L2 to A, which every warp re-reads; otherwise
// the blocks of the other row tiles read the same bytes again right after, from L2.
template <int CB, bool STREAM>
__device__ __forceinline__ void load_words(const unsigned char* __restrict__ p, bool live, unsigned int (&q)[CB / 4]) {
  static_assert(CB == 4 || CB == 16, "4 or 16 bytes");
  if constexpr (CB == 16) {
    const uint4* v = reinterpret_cast<const uint4*>(p);
    const uint4 w = live ? (STREAM ? __ldcs(v) : __ldg(v)) : make_uint4(0u, 0u, 0u, 0u);
    q[0] = w.x;
    q[1] = w.y;
    q[2] = w.z;
    q[3] = w.w;
  } else {
    const unsigned int* v = reinterpret_cast<const unsigned int*>(p);
    q[0] = live ? (STREAM ? __ldcs(v) : __ldg(v)) : 0u;
  }
}

// The fp32 scale of the block holding flat weight index f: absmax[b] or, double-quantized (q8 set),
// code8[q8[b]] * absmax[b / 256] + offset with both roundings kept (no FMA contraction), as the reference.
struct Scales {
  const float* __restrict__ absmax;
  const unsigned char* __restrict__ q8;
  const float* __restrict__ code8;
  int shift;  // log2(blocksize)

  __device__ __forceinline__ float at(long long f, float offset) const {
    const long long b = f >> shift;
    if (q8 == nullptr) return __ldg(absmax + b);
    return __fadd_rn(__fmul_rn(__ldg(code8 + __ldg(q8 + b)), __ldg(absmax + b / BNB_DOUBLE_QUANT_BLOCKSIZE)), offset);
  }
};

}  // namespace bnb_matmul_4bit
