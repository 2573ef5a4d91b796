// Threadgroup reductions through threadgroup memory and barriers (emulator self-test kernels).
#include <metal_stdlib>
using namespace metal;

// One sum per threadgroup: a tree over threadgroup memory. The last threadgroup may be short
// (threads not a multiple of the group size); its missing lanes contribute nothing.
kernel void tg_tree_sum(device const float* x [[buffer(0)]],
                        device float* out [[buffer(1)]],
                        constant uint& n [[buffer(2)]],
                        uint gid [[thread_position_in_grid]],
                        uint lid [[thread_index_in_threadgroup]],
                        uint group [[threadgroup_position_in_grid]],
                        uint group_len [[threads_per_threadgroup]]) {
  threadgroup float buf[256];
  buf[lid] = gid < n ? x[gid] : 0.0;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (uint stride = 128; stride > 0; stride >>= 1) {
    if (lid < stride && lid + stride < group_len) buf[lid] += buf[lid + stride];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (lid == 0) out[group] = buf[0];
}

// The same tree without its barriers: lanes read neighbours' slots before they were written.
kernel void tg_tree_sum_no_barrier(device const float* x [[buffer(0)]],
                                   device float* out [[buffer(1)]],
                                   constant uint& n [[buffer(2)]],
                                   uint gid [[thread_position_in_grid]],
                                   uint lid [[thread_index_in_threadgroup]],
                                   uint group [[threadgroup_position_in_grid]],
                                   uint group_len [[threads_per_threadgroup]]) {
  threadgroup float buf[256];
  buf[lid] = gid < n ? x[gid] : 0.0;
  for (uint stride = 128; stride > 0; stride >>= 1) {
    if (lid < stride && lid + stride < group_len) buf[lid] += buf[lid + stride];
  }
  if (lid == 0) out[group] = buf[0];
}

// Two-level reduction: simd_sum inside each SIMD-group, then the first SIMD-group sums the partials.
kernel void simd_then_tg_sum(device const float* x [[buffer(0)]],
                             device float* out [[buffer(1)]],
                             constant uint& n [[buffer(2)]],
                             uint gid [[thread_position_in_grid]],
                             uint lid [[thread_index_in_threadgroup]],
                             uint group [[threadgroup_position_in_grid]],
                             uint group_len [[threads_per_threadgroup]],
                             uint sg [[simdgroup_index_in_threadgroup]],
                             uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float partial[32];
  const float s = simd_sum(gid < n ? x[gid] : 0.0f);
  if (lane == 0) partial[sg] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg == 0) {
    const uint groups = (group_len + 31) / 32;
    const float t = simd_sum(lane < groups ? partial[lane] : 0.0f);
    if (lane == 0) out[group] = t;
  }
}

// A barrier inside a branch only some lanes take: on hardware a hang.
kernel void barrier_in_branch(device float* out [[buffer(0)]], uint lid [[thread_index_in_threadgroup]]) {
  if (lid < 16) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[lid] = 1.0f;
}

// Lanes past the end return before a barrier the others wait at.
kernel void barrier_after_return(device float* out [[buffer(0)]], constant uint& n [[buffer(1)]],
                                 uint gid [[thread_position_in_grid]]) {
  if (gid >= n) return;
  threadgroup_barrier(mem_flags::mem_device);
  out[gid] = 1.0f;
}
