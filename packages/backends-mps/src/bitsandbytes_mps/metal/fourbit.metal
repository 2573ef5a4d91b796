// 4-bit NF4/FP4 quantization on Apple GPUs. Semantics (the contract): bitsandbytes/_reference/fourbit.py.
// Launch geometry is computed in one place, bitsandbytes_mps/ops/fourbit.py; what it must meet is stated
// at each kernel. Instantiations and the format constants are generated (tables/_generate.py).
//
// Floating point: the codes are bytes the format defines, so the arithmetic is pinned down: scaling uses
// precise::divide (fast math would approximate the reciprocal and the tail block's division), NaN tests
// are on the bits (fast math may assume no NaN), no NaN reaches a float comparison (its result would be
// the compiler's choice), and max(|x|) is taken on the magnitude bits as uint.
#include <metal_stdlib>
using namespace metal;

// Position and size attributes of one kernel share a type (MSL rule): all uint.

// BEGIN GENERATED constants (python -m bitsandbytes_mps.tables._generate; do not edit)
#define BNB_FIRST_VALUE_IN_HIGH_NIBBLE 1
#define BNB_MIN_SCALE_BITS 0x006ce3eeu
constant float NF4_TABLE[16] = {-1.0f, -0.696192801f, -0.525073051f, -0.394917488f, -0.284441382f, -0.18477343f, -0.0910500363f, 0.0f, 0.0795802996f, 0.160930201f, 0.246112302f, 0.337915242f, 0.440709829f, 0.562617004f, 0.722956836f, 1.0f};
constant float NF4_MIDPOINTS[15] = {-0.848096371f, -0.610632896f, -0.45999527f, -0.33967942f, -0.234607399f, -0.137911737f, -0.0455250181f, 0.0397901498f, 0.120255247f, 0.203521252f, 0.292013764f, 0.389312536f, 0.501663446f, 0.64278692f, 0.861478448f};
constant uchar NF4_ORDER[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#define NF4_PAD_CODE 7u
constant float FP4_TABLE[16] = {0.0f, 0.00520833349f, 0.666666687f, 1.0f, 0.333333343f, 0.5f, 0.166666672f, 0.25f, 0.0f, -0.00520833349f, -0.666666687f, -1.0f, -0.333333343f, -0.5f, -0.166666672f, -0.25f};
constant float FP4_MIDPOINTS[15] = {-0.833333373f, -0.583333373f, -0.416666687f, -0.291666687f, -0.208333343f, -0.0859375f, -0.00260416674f, 0.0f, 0.00260416674f, 0.0859375f, 0.208333343f, 0.291666687f, 0.416666687f, 0.583333373f, 0.833333373f};
constant uchar FP4_ORDER[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};
#define FP4_PAD_CODE 0u
// END GENERATED constants
static_assert(BNB_FIRST_VALUE_IN_HIGH_NIBBLE == 1, "the packing below puts the first value in the high nibble");
#include "quantize.h"

// ------------------------------------------------------------------------------------------- 4-bit

template <int QT>
inline float value4(uint c) {
  return QT == 1 ? FP4_TABLE[c] : NF4_TABLE[c];
}

// The code of scaled value s (not NaN): how many of the 15 midpoints are < s, then that slot's code.
// Fifteen compares against constants: no search, no divergence. No clamp needed: every midpoint lies
// strictly inside [-1, 1]. A value that scales to NaN is above all of them: code4_nan.
template <int QT>
inline uint code4_nan() {
  return QT == 1 ? FP4_ORDER[15] : NF4_ORDER[15];
}

template <int QT>
inline uint code4(float s) {
  uint slot = 0;
  for (int i = 0; i < 15; ++i) slot += s > (QT == 1 ? FP4_MIDPOINTS[i] : NF4_MIDPOINTS[i]) ? 1u : 0u;
  return QT == 1 ? FP4_ORDER[slot] : NF4_ORDER[slot];
}

// absmax[b] and the packed codes of A[0, n): two per byte, the first in the high nibble
// (BNB_FIRST_VALUE_IN_HIGH_NIBBLE); for odd n the last low nibble is the code of the padding value 0.0.
template <typename T, int QT>
[[max_total_threads_per_threadgroup(512)]] kernel void quantize_4bit(device const T* A [[buffer(0)]],
                          device uchar* out [[buffer(1)]],
                          device float* absmax [[buffer(2)]],
                          constant long& n [[buffer(3)]],
                          constant long& blocksize [[buffer(4)]],
                          uint tg [[threadgroup_position_in_grid]],
                          uint lid [[thread_index_in_threadgroup]],
                          uint tg_size [[threads_per_threadgroup]],
                          uint sg [[simdgroup_index_in_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
  threadgroup uint scratch[32];
  const QuantPlace p(tg, lid, tg_size, blocksize);
  float v[BNB_QUANT_ITEMS];
  load_items(A, p.i, n, v);
  uint m = 0;
  for (int k = 0; k < BNB_QUANT_ITEMS; ++k) m = max(m, magnitude_bits(v[k]));
  const float amax = magnitude_to_absmax(group_max(m, p.group, lid, sg, lane, scratch));
  if (p.i >= n) return;  // after the last barrier (past the last block too: its start is >= n)
  if ((lid & (p.group - 1u)) == 0) absmax[p.block] = amax;  // the block's first thread

  const BlockScale scale(amax, p.start + blocksize <= n);
  const uint pad = QT == 1 ? FP4_PAD_CODE : NF4_PAD_CODE;
  for (int k = 0; k < BNB_QUANT_ITEMS && p.i + k < n; k += 2) {
    const uint hi = scale.to_nan(v[k]) ? code4_nan<QT>() : code4<QT>(scale(v[k]));
    // The padding value is 0.0 after scaling: its code is fixed, even in a NaN block.
    const uint lo = p.i + k + 1 >= n ? pad : (scale.to_nan(v[k + 1]) ? code4_nan<QT>() : code4<QT>(scale(v[k + 1])));
    out[(p.i + k) >> 1] = uchar((hi << 4) | lo);
  }
}

// out[i] = table[nibble i] * absmax[i / blocksize] in float32, rounded once to T. A thread decodes
// BNB_DEQUANT_ITEMS / 2 consecutive bytes (BNB_DEQUANT_ITEMS values, all in one block), one scale load.
template <typename T, int QT>
[[max_total_threads_per_threadgroup(256)]] kernel void dequantize_4bit(device const uchar* A [[buffer(0)]],
                            device const float* absmax [[buffer(1)]],
                            device T* out [[buffer(2)]],
                            constant long& n [[buffer(3)]],
                            constant long& blocksize [[buffer(4)]],
                            uint gid [[thread_position_in_grid]]) {
  const long i0 = long(gid) * BNB_DEQUANT_ITEMS;
  if (i0 >= n) return;
  const float s = absmax[i0 >> ctz(uint(blocksize))];
  for (int k = 0; k < BNB_DEQUANT_ITEMS && i0 + k < n; k += 2) {
    const uint byte = A[(i0 + k) >> 1];
    out[i0 + k] = T(value4<QT>(byte >> 4) * s);
    if (i0 + k + 1 < n) out[i0 + k + 1] = T(value4<QT>(byte & 0xfu) * s);
  }
}

// -------------------------------------------------------------------------------- instantiations

// BEGIN GENERATED instances (python -m bitsandbytes_mps.tables._generate; do not edit)
template [[host_name("quantize_4bit_nf4_f32")]] kernel void quantize_4bit<float, 0>(
    device const float* A [[buffer(0)]],
    device uchar* out [[buffer(1)]],
    device float* absmax [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_4bit_nf4_f32")]] kernel void dequantize_4bit<float, 0>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device float* out [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
template [[host_name("quantize_4bit_fp4_f32")]] kernel void quantize_4bit<float, 1>(
    device const float* A [[buffer(0)]],
    device uchar* out [[buffer(1)]],
    device float* absmax [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_4bit_fp4_f32")]] kernel void dequantize_4bit<float, 1>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device float* out [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
template [[host_name("quantize_4bit_nf4_f16")]] kernel void quantize_4bit<half, 0>(
    device const half* A [[buffer(0)]],
    device uchar* out [[buffer(1)]],
    device float* absmax [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_4bit_nf4_f16")]] kernel void dequantize_4bit<half, 0>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device half* out [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
template [[host_name("quantize_4bit_fp4_f16")]] kernel void quantize_4bit<half, 1>(
    device const half* A [[buffer(0)]],
    device uchar* out [[buffer(1)]],
    device float* absmax [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_4bit_fp4_f16")]] kernel void dequantize_4bit<half, 1>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device half* out [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
#if BNB_HAS_BFLOAT
template [[host_name("quantize_4bit_nf4_bf16")]] kernel void quantize_4bit<bfloat, 0>(
    device const bfloat* A [[buffer(0)]],
    device uchar* out [[buffer(1)]],
    device float* absmax [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_4bit_nf4_bf16")]] kernel void dequantize_4bit<bfloat, 0>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device bfloat* out [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
template [[host_name("quantize_4bit_fp4_bf16")]] kernel void quantize_4bit<bfloat, 1>(
    device const bfloat* A [[buffer(0)]],
    device uchar* out [[buffer(1)]],
    device float* absmax [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]]);
template [[host_name("dequantize_4bit_fp4_bf16")]] kernel void dequantize_4bit<bfloat, 1>(
    device const uchar* A [[buffer(0)]],
    device const float* absmax [[buffer(1)]],
    device bfloat* out [[buffer(2)]],
    constant long& n [[buffer(3)]],
    constant long& blocksize [[buffer(4)]],
    uint gid [[thread_position_in_grid]]);
#endif
// END GENERATED instances
