// NF4 blockwise quantization and dequantization written as an MPS backend kernel would be: one
// threadgroup per block of `blocksize` (= group size) values, the absmax through simd_max and
// threadgroup memory, two codes packed per byte with a SIMD-group shuffle (emulator self-test).
#include <metal_stdlib>
using namespace metal;

// midpoints: the 15 midpoints between neighbouring NF4 values (NF4 is sorted, so a value's code is
// the number of midpoints below it; a value on a midpoint takes the lower code).
kernel void nf4_quantize(device const float* x [[buffer(0)]],
                         device const float* midpoints [[buffer(1)]],
                         device uchar* packed [[buffer(2)]],
                         device float* absmax [[buffer(3)]],
                         constant uint& n [[buffer(4)]],
                         uint gid [[thread_position_in_grid]],
                         uint lid [[thread_index_in_threadgroup]],
                         uint block [[threadgroup_position_in_grid]],
                         uint group_len [[threads_per_threadgroup]],
                         uint blocksize [[dispatch_threads_per_threadgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[32];
  const float v = gid < n ? x[gid] : 0.0f;
  const float m = simd_max(fabs(v));
  if (lane == 0) partial[sg] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float amax = partial[0];
  for (uint i = 1; i < (group_len + 31) / 32; ++i) amax = max(amax, partial[i]);
  if (lid == 0) absmax[block] = amax;

  // A full block multiplies by the reciprocal, the short last block divides (the reference's rule).
  const bool full_block = (block + 1) * blocksize <= n;
  const float scale = max(amax, 1e-38f);
  float s = full_block ? v * (1.0f / scale) : v / scale;
  s = clamp(s, -1.0f, 1.0f);
  uint code = 0;
  for (uint i = 0; i < 15; ++i) code += midpoints[i] < s ? 1u : 0u;
  if (gid >= n) code = 7;  // the pad value after an odd count is 0.0, whose NF4 code is 7
  const uint next = simd_shuffle_down(code, 1);
  if ((gid & 1u) == 0) packed[gid / 2] = uchar((code << 4) | next);
}

kernel void nf4_dequantize(device const uchar* packed [[buffer(0)]],
                           device const float* table [[buffer(1)]],
                           device const float* absmax [[buffer(2)]],
                           device float* out [[buffer(3)]],
                           constant uint& blocksize [[buffer(4)]],
                           uint gid [[thread_position_in_grid]]) {
  const uchar byte = packed[gid / 2];
  const uint code = (gid & 1u) ? (byte & 0xfu) : (byte >> 4);
  out[gid] = table[code] * absmax[gid / blocksize];
}
