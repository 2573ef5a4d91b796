// NF4/FP4 quantize and dequantize as an MPS backend would write them, run by the conformance suite in
// emulation (emulated_mps_backend.py). Semantics: bitsandbytes/_reference/fourbit.py.
#include <metal_stdlib>
using namespace metal;

// max(|a|, m) that keeps a NaN (metal::max would drop it; the reference's absmax propagates it).
inline float nan_max(float m, float a) { return (isnan(m) || isnan(a)) ? NAN : max(m, a); }

// One threadgroup per block of `blocksize` values; each lane quantizes pairs of values into bytes.
// midpoints: the 15 midpoints between neighbours of the code table sorted by value; order[k]: the code
// of the k-th smallest entry. A value's code is order[number of midpoints below it] (NaN: the last).
template <typename T>
kernel void quantize_4bit(device const T* A [[buffer(0)]],
                          device const float* midpoints [[buffer(1)]],
                          device const uchar* order [[buffer(2)]],
                          device uchar* packed [[buffer(3)]],
                          device float* absmax [[buffer(4)]],
                          constant long& n [[buffer(5)]],
                          constant long& blocksize [[buffer(6)]],
                          uint block [[threadgroup_position_in_grid]],
                          uint lid [[thread_index_in_threadgroup]],
                          uint group_len [[threads_per_threadgroup]],
                          uint sg [[simdgroup_index_in_threadgroup]],
                          uint sg_count [[simdgroups_per_threadgroup]]) {
  threadgroup float partial[32];
  const long start = long(block) * blocksize;
  const long len = min(blocksize, n - start);

  float m = 0.0f;
  for (long i = lid; i < len; i += group_len) m = nan_max(m, fabs(float(A[start + i])));
  const bool any_nan = simd_any(isnan(m));
  m = simd_max(m);
  if (simd_is_first()) partial[sg] = any_nan ? NAN : m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float amax = partial[0];
  for (uint i = 1; i < sg_count; ++i) amax = nan_max(amax, partial[i]);
  if (lid == 0) absmax[block] = amax;

  // Full blocks multiply by the reciprocal, the short last block divides: the reference's arithmetic.
  const float denom = isnan(amax) ? amax : max(amax, 1e-38f);
  const float recip = 1.0f / denom;
  const bool full = len == blocksize;
  for (long p = lid; p < (len + 1) / 2; p += group_len) {
    uint codes[2];
    for (int k = 0; k < 2; ++k) {
      const long i = 2 * p + k;
      float s = 0.0f;  // the pad after an odd count is quantized as 0.0
      if (i < len) {
        const float x = float(A[start + i]);
        s = full ? x * recip : x / denom;
        if (!isnan(s)) s = clamp(s, -1.0f, 1.0f);
      }
      uint below = 0;
      for (uint j = 0; j < 15; ++j) below += midpoints[j] < s ? 1u : 0u;
      codes[k] = order[isnan(s) ? 15u : below];
    }
    packed[start / 2 + p] = uchar((codes[0] << 4) | codes[1]);
  }
}

template <typename T>
kernel void dequantize_4bit(device const uchar* packed [[buffer(0)]],
                            device const float* table [[buffer(1)]],
                            device const float* absmax [[buffer(2)]],
                            device T* out [[buffer(3)]],
                            constant long& blocksize [[buffer(4)]],
                            uint gid [[thread_position_in_grid]]) {
  const uchar byte = packed[gid / 2];
  const uint code = (gid & 1u) ? (byte & 0xfu) : (byte >> 4);
  out[gid] = T(table[code] * absmax[gid / blocksize]);
}

template [[host_name("quantize_4bit_float")]] kernel void quantize_4bit<float>(
    device const float* A [[buffer(0)]], device const float* midpoints [[buffer(1)]],
    device const uchar* order [[buffer(2)]], device uchar* packed [[buffer(3)]], device float* absmax [[buffer(4)]],
    constant long& n [[buffer(5)]], constant long& blocksize [[buffer(6)]],
    uint block [[threadgroup_position_in_grid]], uint lid [[thread_index_in_threadgroup]],
    uint group_len [[threads_per_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],
    uint sg_count [[simdgroups_per_threadgroup]]);
template [[host_name("quantize_4bit_half")]] kernel void quantize_4bit<half>(
    device const half* A [[buffer(0)]], device const float* midpoints [[buffer(1)]],
    device const uchar* order [[buffer(2)]], device uchar* packed [[buffer(3)]], device float* absmax [[buffer(4)]],
    constant long& n [[buffer(5)]], constant long& blocksize [[buffer(6)]],
    uint block [[threadgroup_position_in_grid]], uint lid [[thread_index_in_threadgroup]],
    uint group_len [[threads_per_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],
    uint sg_count [[simdgroups_per_threadgroup]]);
template [[host_name("quantize_4bit_bfloat")]] kernel void quantize_4bit<bfloat>(
    device const bfloat* A [[buffer(0)]], device const float* midpoints [[buffer(1)]],
    device const uchar* order [[buffer(2)]], device uchar* packed [[buffer(3)]], device float* absmax [[buffer(4)]],
    constant long& n [[buffer(5)]], constant long& blocksize [[buffer(6)]],
    uint block [[threadgroup_position_in_grid]], uint lid [[thread_index_in_threadgroup]],
    uint group_len [[threads_per_threadgroup]], uint sg [[simdgroup_index_in_threadgroup]],
    uint sg_count [[simdgroups_per_threadgroup]]);
template [[host_name("dequantize_4bit_float")]] kernel void dequantize_4bit<float>(
    device const uchar* packed [[buffer(0)]], device const float* table [[buffer(1)]],
    device const float* absmax [[buffer(2)]], device float* out [[buffer(3)]], constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
template [[host_name("dequantize_4bit_half")]] kernel void dequantize_4bit<half>(
    device const uchar* packed [[buffer(0)]], device const float* table [[buffer(1)]],
    device const float* absmax [[buffer(2)]], device half* out [[buffer(3)]], constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
template [[host_name("dequantize_4bit_bfloat")]] kernel void dequantize_4bit<bfloat>(
    device const uchar* packed [[buffer(0)]], device const float* table [[buffer(1)]],
    device const float* absmax [[buffer(2)]], device bfloat* out [[buffer(3)]], constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
