// 8-bit blockwise quantization with a 256-entry map on Apple GPUs. Semantics (the contract):
// bitsandbytes/_reference/blockwise.py. Launch geometry is computed in one place,
// bitsandbytes_mps/ops/blockwise.py; what it must meet is stated at each kernel. Instantiations and the
// format constants are generated (tables/_generate.py).
//
// Floating point: the codes are bytes the format defines, so the arithmetic is pinned down: scaling uses
// precise::divide (fast math would approximate the reciprocal and the tail block's division), NaN tests
// are on the bits (fast math may assume no NaN), no NaN reaches a float comparison (its result would be
// the compiler's choice), and max(|x|) is taken on the magnitude bits as uint.
#include <metal_stdlib>
using namespace metal;

// Position and size attributes of one kernel share a type (MSL rule): all uint.

// BEGIN GENERATED constants (python -m bitsandbytes_mps.tables._generate; do not edit)
#define BNB_MIN_SCALE_BITS 0x006ce3eeu
// END GENERATED constants
#include "quantize.h"

inline bool nan_bits(float x) { return (as_type<uint>(x) & 0x7fffffffu) > 0x7f800000u; }

// Whether lo + hi (lo <= hi in the map's order) is NaN, from their bits: a NaN, or -inf + inf.
inline bool nan_sum(float lo, float hi) {
  return nan_bits(lo) || nan_bits(hi) || (as_type<uint>(lo) == 0xff800000u && as_type<uint>(hi) == 0x7f800000u);
}

inline float clamp_unit(float s) { return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s); }

// ------------------------------------------------------------------------------------------- 8-bit

// The nearest-code search needs the map sorted by value (stably; NaN after every number):
// mids[i] = (v[i] + v[i + 1]) / 2 in float32 and order[i] = the code of v[i]; mids[255] = +inf (unused).
// A NaN midpoint (next to a NaN entry) is stored as -inf: the reference's search (torch.bucketize) goes
// right at a NaN boundary, as it does at -inf, and the search below then never compares with a NaN.
// One threadgroup of 256 threads, each finding the stable rank of one entry.
inline bool sorts_before(float a, float b) { return !nan_bits(a) && (nan_bits(b) || a < b); }

[[max_total_threads_per_threadgroup(256)]] kernel void quant_map_prepare(device const float* code [[buffer(0)]],
                              device float* mids [[buffer(1)]],
                              device uchar* order [[buffer(2)]],
                              uint i [[thread_index_in_threadgroup]]) {
  threadgroup float values[256];
  threadgroup float sorted[256];
  const float c = code[i];
  values[i] = c;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint rank = 0;
  for (uint j = 0; j < 256; ++j) {
    const float d = values[j];
    rank += (sorts_before(d, c) || (j < i && !sorts_before(c, d))) ? 1u : 0u;
  }
  sorted[rank] = c;
  order[rank] = uchar(i);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (i == 255) {
    mids[i] = as_type<float>(0x7f800000u);
  } else {
    const float lo = sorted[i], hi = sorted[i + 1];
    mids[i] = nan_sum(lo, hi) ? as_type<float>(0xff800000u) : (lo + hi) / 2.0f;
  }
}

// Slot of the scaled value s (not NaN) in the sorted map: how many of the 255 midpoints are < clamp(s, -1,
// 1) (the reference's bucketize), by a branchless binary search over the sorted midpoints. A value that
// scales to NaN takes the last slot (the largest map value): kNanSlot.
constant constexpr uint kNanSlot = 255u;
inline uint slot256(threadgroup const float* mids, float s) {
  s = clamp_unit(s);
  uint j = 0;
  for (uint step = 128; step > 0; step >>= 1) j += s > mids[j + step - 1] ? step : 0u;
  return j;
}

// absmax[b] and the code of every value of A[0, n) (map prepared by quant_map_prepare).
template <typename T>
[[max_total_threads_per_threadgroup(512)]] kernel void quantize_blockwise(device const T* A [[buffer(0)]],
                               device const float* map_mids [[buffer(1)]],
                               device const uchar* map_order [[buffer(2)]],
                               device uchar* out [[buffer(3)]],
                               device float* absmax [[buffer(4)]],
                               constant long& n [[buffer(5)]],
                               constant long& blocksize [[buffer(6)]],
                               uint tg [[threadgroup_position_in_grid]],
                               uint lid [[thread_index_in_threadgroup]],
                               uint tg_size [[threads_per_threadgroup]],
                               uint sg [[simdgroup_index_in_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]]) {
  threadgroup float mids[256];
  threadgroup uchar order[256];
  threadgroup uint scratch[32];
  for (uint t = lid; t < 256; t += tg_size) {
    mids[t] = map_mids[t];
    order[t] = map_order[t];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  const QuantPlace p(tg, lid, tg_size, blocksize);
  float v[BNB_QUANT_ITEMS];
  load_items(A, p.i, n, v);
  uint m = 0;
  for (int k = 0; k < BNB_QUANT_ITEMS; ++k) m = max(m, magnitude_bits(v[k]));
  const float amax = magnitude_to_absmax(group_max(m, p.group, lid, sg, lane, scratch));
  if (p.i >= n) return;  // after the last barrier (past the last block too: its start is >= n)
  if ((lid & (p.group - 1u)) == 0) absmax[p.block] = amax;  // the block's first thread

  const BlockScale scale(amax, p.start + blocksize <= n);
  for (int k = 0; k < BNB_QUANT_ITEMS && p.i + k < n; ++k)
    out[p.i + k] = order[scale.to_nan(v[k]) ? kNanSlot : slot256(mids, scale(v[k]))];
}

// out[i] = code[A[i]] * absmax[i / blocksize] in float32, rounded once to T. A thread writes
// BNB_DEQUANT_ITEMS consecutive values (all in one block: block sizes are >= 32), so one scale load and
// the threadgroup's copy of the map serve many values. Any threadgroup size, in a uniform grid (every
// threadgroup full: ops/_quantize.py dequantize_geometry), so that the copy's stride is the number of threads
// that run: what Metal reports as threads_per_threadgroup in a partial edge group is not relied on.
// Threads past n copy their share of the map, then return.
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void dequantize_blockwise(device const uchar* A [[buffer(0)]],
                                 device const float* absmax [[buffer(1)]],
                                 device const float* code [[buffer(2)]],
                                 device T* out [[buffer(3)]],
                                 constant long& n [[buffer(4)]],
                                 constant long& blocksize [[buffer(5)]],
                                 uint gid [[thread_position_in_grid]],
                                 uint lid [[thread_index_in_threadgroup]],
                                 uint tg_size [[threads_per_threadgroup]]) {
  threadgroup float table[256];
  for (uint t = lid; t < 256; t += tg_size) table[t] = code[t];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const long i0 = long(gid) * BNB_DEQUANT_ITEMS;
  if (i0 >= n) return;
  const float s = absmax[i0 >> ctz(uint(blocksize))];
  for (int k = 0; k < BNB_DEQUANT_ITEMS && i0 + k < n; ++k) out[i0 + k] = T(table[A[i0 + k]] * s);
}

// -------------------------------------------------------------------------------- instantiations

// BEGIN GENERATED instances (python -m bitsandbytes_mps.tables._generate; do not edit)
template [[host_name("quantize_blockwise_f32")]] kernel void quantize_blockwise<float>(
    device const float* A [[buffer(0)]],
    device const float* map_mids [[buffer(1)]],
    device const uchar* map_order [[buffer(2)]],
    device uchar* out [[buffer(3)]],
    device float* absmax [[buffer(4)]],
    constant long& n [[buffer(5)]],
    constant long& blocksize [[buffer(6)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_blockwise_f32")]] kernel void dequantize_blockwise<float>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device const float* code [[buffer(2)]],
    device float* out [[buffer(3)]],
    constant long& n [[buffer(4)]],
    constant long& blocksize [[buffer(5)]],
    uint gid [[thread_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]);
template [[host_name("quantize_blockwise_f16")]] kernel void quantize_blockwise<half>(
    device const half* A [[buffer(0)]],
    device const float* map_mids [[buffer(1)]],
    device const uchar* map_order [[buffer(2)]],
    device uchar* out [[buffer(3)]],
    device float* absmax [[buffer(4)]],
    constant long& n [[buffer(5)]],
    constant long& blocksize [[buffer(6)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_blockwise_f16")]] kernel void dequantize_blockwise<half>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device const float* code [[buffer(2)]],
    device half* out [[buffer(3)]],
    constant long& n [[buffer(4)]],
    constant long& blocksize [[buffer(5)]],
    uint gid [[thread_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]);
#if BNB_HAS_BFLOAT
template [[host_name("quantize_blockwise_bf16")]] kernel void quantize_blockwise<bfloat>(
    device const bfloat* A [[buffer(0)]],
    device const float* map_mids [[buffer(1)]],
    device const uchar* map_order [[buffer(2)]],
    device uchar* out [[buffer(3)]],
    device float* absmax [[buffer(4)]],
    constant long& n [[buffer(5)]],
    constant long& blocksize [[buffer(6)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_blockwise_bf16")]] kernel void dequantize_blockwise<bfloat>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device const float* code [[buffer(2)]],
    device bfloat* out [[buffer(3)]],
    constant long& n [[buffer(4)]],
    constant long& blocksize [[buffer(5)]],
    uint gid [[thread_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]]);
#endif
// END GENERATED instances
