// SIMD-group functions, one output per lane so tests can check every lane (emulator self-test kernels).
#include <metal_stdlib>
using namespace metal;

// out rows (each `threads` long): sum, max, min, prefix inclusive, prefix exclusive, shuffle_down 1,
// shuffle_up 2, shuffle_xor 5, broadcast of lane 3, shuffle from lane (31 - lane), ballot low bits.
kernel void simd_all_ops(device const float* x [[buffer(0)]],
                         device float* out [[buffer(1)]],
                         constant uint& threads [[buffer(2)]],
                         uint gid [[thread_position_in_grid]],
                         ushort lane [[thread_index_in_simdgroup]]) {
  const float v = x[gid];
  out[0 * threads + gid] = simd_sum(v);
  out[1 * threads + gid] = simd_max(v);
  out[2 * threads + gid] = simd_min(v);
  out[3 * threads + gid] = simd_prefix_inclusive_sum(v);
  out[4 * threads + gid] = simd_prefix_exclusive_sum(v);
  out[5 * threads + gid] = simd_shuffle_down(v, 1);
  out[6 * threads + gid] = simd_shuffle_up(v, 2);
  out[7 * threads + gid] = simd_shuffle_xor(v, 5);
  out[8 * threads + gid] = simd_broadcast(v, 3);
  out[9 * threads + gid] = simd_shuffle(v, ushort(31 - lane));
  out[10 * threads + gid] = float(uint(static_cast<ulong>(simd_ballot(v > 0.0f)) & 0xffffu));
}

// The classic shuffle-down tree: lane 0 ends with the SIMD-group's sum.
kernel void shuffle_tree(device const uint* x [[buffer(0)]], device uint* out [[buffer(1)]],
                         uint gid [[thread_position_in_grid]], uint lane [[thread_index_in_simdgroup]],
                         uint sg_global [[threadgroup_position_in_grid]], uint sg [[simdgroup_index_in_threadgroup]],
                         uint sgs [[simdgroups_per_threadgroup]]) {
  uint v = x[gid];
  for (ushort offset = 16; offset > 0; offset >>= 1) v += simd_shuffle_down(v, offset);
  if (lane == 0) out[sg_global * sgs + sg] = v;
}

// Lanes at or past n return first; the SIMD-group functions then run over the lanes still active.
kernel void active_lanes(device const int* x [[buffer(0)]], device int* out [[buffer(1)]],
                         constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
  if (gid >= n) return;
  const int v = x[gid];
  out[3 * gid + 0] = simd_sum(v);
  out[3 * gid + 1] = simd_any(v == 7) ? 1 : 0;
  out[3 * gid + 2] = simd_all(v > 0) ? 1 : 0;
}

// Half and integer vectors through simd_sum (per component).
kernel void simd_sum_vectors(device const half4* x [[buffer(0)]], device half4* out [[buffer(1)]],
                             uint gid [[thread_position_in_grid]]) {
  out[gid] = simd_sum(x[gid]);
}

// A SIMD-group function inside a branch only some lanes of the SIMD-group take.
kernel void simd_in_branch(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  float v = 1.0f;
  if (lane < 8) {
    v = simd_sum(v);
  } else {
    threadgroup_barrier(mem_flags::mem_none);
  }
  out[lane] = v;
}

// The same SIMD-group function on both sides of a branch that splits the SIMD-group: hardware runs
// two separate groups of lanes.
kernel void simd_sum_both_branches(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  float v;
  if (lane < 8) {
    v = simd_sum(1.0f);
  } else {
    v = simd_sum(2.0f);
  }
  out[lane] = v;
}

// A shuffle delta that differs between lanes (MSL requires the same delta in the whole SIMD-group).
kernel void nonuniform_delta(device float* out [[buffer(0)]], ushort lane [[thread_index_in_simdgroup]]) {
  out[lane] = simd_shuffle_down(float(lane), ushort(lane & 1));
}
