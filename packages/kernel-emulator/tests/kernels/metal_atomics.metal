// Atomics from many lanes and threadgroups (emulator self-test kernels).
#include <metal_stdlib>
using namespace metal;

// Every lane adds to one counter, its value to one float sum, and raises a max; each threadgroup also
// counts its lanes in threadgroup memory and publishes the count once.
kernel void count_and_sum(device atomic_uint* counter [[buffer(0)]],
                          device atomic_float* total [[buffer(1)]],
                          device atomic_int* biggest [[buffer(2)]],
                          device const float* x [[buffer(3)]],
                          device uint* per_group [[buffer(4)]],
                          uint gid [[thread_position_in_grid]],
                          uint lid [[thread_index_in_threadgroup]],
                          uint group [[threadgroup_position_in_grid]]) {
  threadgroup atomic_uint local_count;
  if (lid == 0) atomic_store_explicit(&local_count, 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(total, x[gid], memory_order_relaxed);
  atomic_fetch_max_explicit(biggest, int(gid % 1000), memory_order_relaxed);
  atomic_fetch_add_explicit(&local_count, 1u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid == 0) per_group[group] = atomic_load_explicit(&local_count, memory_order_relaxed);
}

// A histogram: many lanes hit few bins.
kernel void histogram(device const uchar* x [[buffer(0)]], device atomic_uint* bins [[buffer(1)]],
                      uint gid [[thread_position_in_grid]]) {
  atomic_fetch_add_explicit(&bins[x[gid] & 15], 1u, memory_order_relaxed);
}
