// Kernels whose results depend on the emulator's Metal options (test_metal_modes.py).
#include <metal_stdlib>
using namespace metal;

// What a lane is told about its threadgroup: in a short edge threadgroup the actual or the dispatched size.
kernel void group_sizes(device uint* out [[buffer(0)]],
                        uint gid [[thread_position_in_grid]],
                        uint tpt [[threads_per_threadgroup]],
                        uint sgs [[simdgroups_per_threadgroup]]) {
  out[2 * gid] = tpt;
  out[2 * gid + 1] = sgs;
}

// Fills a threadgroup table with stride threads_per_threadgroup, as a kernel that trusts it would: with
// the dispatched size, a short edge threadgroup leaves entries it never writes.
kernel void strided_fill(device const float* table [[buffer(0)]],
                         device float* out [[buffer(1)]],
                         uint gid [[thread_position_in_grid]],
                         uint lid [[thread_index_in_threadgroup]],
                         uint tpt [[threads_per_threadgroup]]) {
  threadgroup float copy[64];
  for (uint t = lid; t < 64; t += tpt) copy[t] = table[t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float sum = 0.0f;
  for (uint t = 0; t < 64; ++t) sum += copy[t];
  out[gid] = sum;
}

// isnan/isinf of each input (1 or 0): under fast math the compiler may fold them to 0.
kernel void classify(device const float* x [[buffer(0)]], device uint* out [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
  const float v = x[i];
  out[2 * i] = isnan(v) ? 1u : 0u;
  out[2 * i + 1] = isinf(v) ? 1u : 0u;
}

// Subnormal behaviour: a float32 read (x * one, one = 1 at run time so the compiler cannot drop it), a
// float32 result that is subnormal (x * 2^-100), a half subnormal through float and back, a bfloat
// subnormal through float, and a float32 subnormal converted to bfloat without arithmetic.
kernel void subnormals(device const float* x [[buffer(0)]],
                       device const half* h [[buffer(1)]],
                       device const bfloat* b [[buffer(2)]],
                       device float* out [[buffer(3)]],
                       device half* hout [[buffer(4)]],
                       constant float& one [[buffer(5)]],
                       device bfloat* bout [[buffer(6)]],
                       uint i [[thread_position_in_grid]]) {
  out[4 * i] = x[i] * one;
  out[4 * i + 1] = x[i] * 0x1p-100f;
  out[4 * i + 2] = float(h[i]) * one;
  out[4 * i + 3] = float(b[i]) * one;
  hout[i] = half(float(h[i]) * one);
  bout[i] = bfloat(x[i]);
}

// Reads its threadgroup array before any lane writes it, then writes it: every threadgroup must read the
// emulator's poison (NaN), not zeros or what the previous threadgroup left, template kernels included.
template <typename T>
kernel void read_before_write(device T* out [[buffer(0)]],
                              uint gid [[thread_position_in_grid]],
                              uint lid [[thread_index_in_threadgroup]]) {
  threadgroup T scratch[32];
  out[gid] = scratch[lid];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  scratch[lid] = T(1.0f);
}
template [[host_name("read_before_write_f32")]] kernel void read_before_write<float>(
    device float* out [[buffer(0)]], uint gid [[thread_position_in_grid]], uint lid [[thread_index_in_threadgroup]]);
