// Block quantization machinery shared by the 8-bit (blockwise.cu) and 4-bit NF4/FP4 (fourbit.cu) kernels:
// vectorised element loads/stores widened to float32, and the group max used for block absmax.
// Semantics: bitsandbytes/_reference/blockwise.py and fourbit.py; constants: bitsandbytes/formats.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// The format tables live in constant memory, one private copy per translation unit.
#ifndef BNB_CONSTANT
#define BNB_CONSTANT static __constant__
#endif
#include <bitsandbytes/formats.h>

#include "common.cuh"

namespace bnb_quant {

// Values each thread quantizes or dequantizes: 16 bytes of fp16/bf16 input, 32 of fp32. The block
// sizes the core accepts (32..4096, powers of two) are multiples, so a thread's values never straddle
// a block boundary and 4-bit pairs never straddle a thread.
constexpr int kItems = 8;

__device__ __forceinline__ bool aligned(const void* p, unsigned bytes) {
  return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

using bnb::from_float;
using bnb::to_float;

// Element bits <-> float32, for the vector paths (which move 32-bit words).
__device__ __forceinline__ float half_bits_to_float(unsigned u, const __half*) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(u)));
}
__device__ __forceinline__ float half_bits_to_float(unsigned u, const __nv_bfloat16*) {
  return __uint_as_float(u << 16);  // exact: bf16 is the top half of a float32
}
__device__ __forceinline__ unsigned float_to_half_bits(float v, const __half*) {
  return __half_as_ushort(__float2half_rn(v));
}
__device__ __forceinline__ unsigned float_to_half_bits(float v, const __nv_bfloat16*) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// v[k] = p[i + k] as float32 for i + k < n, 0 past the end. One or two 16-byte loads when the whole
// run is in bounds and the base pointer is 16-byte aligned (torch's allocations are; an offset view
// may not be, and then the scalar loop runs).
__device__ __forceinline__ void load_items(const float* p, long long i, long long n, bool vec, float (&v)[kItems]) {
  if (vec && i + kItems <= n) {
    const uint4* q = reinterpret_cast<const uint4*>(p + i);
    const uint4 a = q[0], b = q[1];
    v[0] = __uint_as_float(a.x), v[1] = __uint_as_float(a.y), v[2] = __uint_as_float(a.z);
    v[3] = __uint_as_float(a.w), v[4] = __uint_as_float(b.x), v[5] = __uint_as_float(b.y);
    v[6] = __uint_as_float(b.z), v[7] = __uint_as_float(b.w);
  } else {
#pragma unroll
    for (int k = 0; k < kItems; ++k) v[k] = i + k < n ? p[i + k] : 0.0f;
  }
}

template <class T>
__device__ __forceinline__ void load_items(const T* p, long long i, long long n, bool vec, float (&v)[kItems]) {
  if (vec && i + kItems <= n) {
    const uint4 a = *reinterpret_cast<const uint4*>(p + i);
    const unsigned w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = half_bits_to_float(w[k] & 0xffffu, p);  // little endian: element 2k is the low half
      v[2 * k + 1] = half_bits_to_float(w[k] >> 16, p);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kItems; ++k) v[k] = i + k < n ? to_float(p[i + k]) : 0.0f;
  }
}

// p[i + k] = v[k] rounded to the element type, for i + k < n.
__device__ __forceinline__ void store_items(float* p, long long i, long long n, bool vec, const float (&v)[kItems]) {
  if (vec && i + kItems <= n) {
    uint4* q = reinterpret_cast<uint4*>(p + i);
    q[0] = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    q[1] = make_uint4(__float_as_uint(v[4]), __float_as_uint(v[5]), __float_as_uint(v[6]), __float_as_uint(v[7]));
  } else {
#pragma unroll
    for (int k = 0; k < kItems; ++k)
      if (i + k < n) p[i + k] = v[k];
  }
}

template <class T>
__device__ __forceinline__ void store_items(T* p, long long i, long long n, bool vec, const float (&v)[kItems]) {
  if (vec && i + kItems <= n) {
    unsigned w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = float_to_half_bits(v[2 * k], p) | (float_to_half_bits(v[2 * k + 1], p) << 16);
    *reinterpret_cast<uint4*>(p + i) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int k = 0; k < kItems; ++k)
      if (i + k < n) p[i + k] = from_float<T>(v[k]);
  }
}

// |x| as unsigned bits orders like |x| as a float and every NaN sorts above inf, so a block's absmax
// is an integer max (no NaN special cases in the loop) and one test against inf's bits at the end.
__device__ __forceinline__ unsigned magnitude_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

__device__ __forceinline__ float magnitude_to_absmax(unsigned m) {
  return m > 0x7f800000u ? __uint_as_float(0x7fc00000u) : __uint_as_float(m);  // any NaN -> the quiet NaN
}

// Max of v over each aligned group of `group` threads (a power of two, 2..1024, dividing blockDim.x);
// every thread of the group gets it. Every thread of the block must call it (it may hold a barrier).
// Groups within a warp reduce with shuffles alone; larger groups combine their warps through `scratch`
// (blockDim.x / 32 entries).
__device__ __forceinline__ unsigned group_max(unsigned v, int group, unsigned* scratch) {
  const int width = group < 32 ? group : 32;
  for (int offset = width / 2; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (group <= 32) return v;
  const int warp = threadIdx.x / 32;
  __syncthreads();  // scratch may still be read from the previous round
  if (threadIdx.x % 32 == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = group / 32, first = warp / warps * warps;
  v = scratch[first];
  for (int w = 1; w < warps; ++w) v = max(v, scratch[first + w]);
  return v;
}

// What a block's values are scaled by (the reference's block_absmax_and_scale): a full block multiplies
// by the float32 reciprocal of its absmax clamped to BNB_MIN_SCALE, the short last block divides by the
// clamped absmax (upstream does both; they can differ in the last bit). A NaN absmax stays NaN.
struct BlockScale {
  float clamped, inv;
  bool full;
  __device__ __forceinline__ BlockScale(float absmax, bool full_block)
      : clamped(absmax < BNB_MIN_SCALE ? BNB_MIN_SCALE : absmax), inv(1.0f / clamped), full(full_block) {}
  __device__ __forceinline__ float operator()(float x) const { return full ? x * inv : x / clamped; }
};

__device__ __forceinline__ float clamp_unit(float s) { return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s); }

}  // namespace bnb_quant
