// The quant family on Apple GPUs: 8-bit blockwise quantization with a 256-entry map, 4-bit NF4/FP4, and
// gemv_4bit on the packed 4-bit layout. Semantics (the contract): bitsandbytes/_reference/blockwise.py and
// fourbit.py. Launch geometry is computed in one place, bitsandbytes_mps/ops/quant.py; what it must meet
// is stated at each kernel. Instantiations and the 4-bit constants are generated (tables/quant.py).
//
// Floating point: the codes are bytes the format defines, so the arithmetic is pinned down: scaling uses
// precise::divide (fast math would approximate the reciprocal and the tail block's division), NaN tests
// are on the bits (fast math may assume no NaN), no NaN reaches a float comparison (its result would be
// the compiler's choice), and max(|x|) is taken on the magnitude bits as uint.
#include <metal_stdlib>
using namespace metal;

#define BNB_QUANT_ITEMS 8
#define BNB_DEQUANT_ITEMS 8
#define BNB_GEMV_FEATURES 4
#define BNB_GEMV_ROWS 4
#define BNB_GEMV_MAX_SIMDGROUPS 8

// Position and size attributes of one kernel share a type (MSL rule): all uint, or all uint2 in gemv.

// BEGIN GENERATED constants (python -m bitsandbytes_mps.tables.quant; do not edit)
#define BNB_FIRST_VALUE_IN_HIGH_NIBBLE 1
#define BNB_MIN_SCALE 9.99999935e-39f
#define BNB_MIN_SCALE_BITS 0x006ce3eeu
#define BNB_INV_MIN_SCALE 1.00000007e+38f
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

// ---------------------------------------------------------------------------------------- helpers

inline bool nan_bits(float x) { return (as_type<uint>(x) & 0x7fffffffu) > 0x7f800000u; }

// Whether lo + hi (lo <= hi in the map's order) is NaN, from their bits: a NaN, or -inf + inf.
inline bool nan_sum(float lo, float hi) {
  return nan_bits(lo) || nan_bits(hi) || (as_type<uint>(lo) == 0xff800000u && as_type<uint>(hi) == 0x7f800000u);
}

// |x| as uint bits: ordered like |x| for numbers, inf above them and every NaN above inf.
inline uint magnitude_bits(float x) { return as_type<uint>(x) & 0x7fffffffu; }

// The block's absmax from the max magnitude bits (any NaN becomes the quiet NaN, as torch's amax gives).
inline float magnitude_to_absmax(uint m) { return as_type<float>(m > 0x7f800000u ? 0x7fc00000u : m); }

// Max of m over each aligned group of `group` threads (a power of two, 4..512, dividing the threadgroup
// size). Every thread of the threadgroup calls it: above 32 it holds a barrier.
inline uint group_max(uint m, uint group, uint lid, uint sg, uint lane, threadgroup uint* scratch) {
  if (group >= 32) {
    m = simd_max(m);
  } else {
    for (ushort off = ushort(group / 2); off > 0; off >>= 1) m = max(m, simd_shuffle_xor(m, off));
  }
  if (group > 32) {
    if (lane == 0) scratch[sg] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const uint first = (lid / group) * (group / 32);
    m = scratch[first];
    for (uint j = 1; j < group / 32; ++j) m = max(m, scratch[first + j]);
  }
  return m;
}

// Scaling into [-1, 1] as the reference: a full block multiplies by the reciprocal of c = max(absmax,
// MIN_SCALE), the short last block divides by c. Which values scale to NaN is read off the bits of the
// block's absmax and of the value (to_nan): a NaN absmax (a NaN in the block), or a value that is inf or
// NaN (its block's absmax is then inf or NaN: inf / inf). So the NaN code is chosen on loaded bits, never
// on the bits of a computed NaN, which fast math lets the compiler assume away. In a block whose absmax is
// inf, a finite value scales to 0 (x / inf).
// A subnormal c (absmax below 2**-126; MIN_SCALE itself is subnormal) would be 0 to a GPU that flushes
// subnormals (Apple's do): 1 / c = inf and x * inf = NaN. Every x of such a block is subnormal or zero
// too, x = mx * 2**-149 and c = mc * 2**-149 with integer mantissas below 2**23, so x / c = mx / mc, and
// x * round(1 / c) = mx * round(1 / mc) exactly (the powers of two cancel, and 1 / mc and the product are
// normal: rounding commutes with them). So such a block scales its values' mantissas, read off the bits,
// by its absmax's: the reference's bits whether or not the GPU flushes.
struct BlockScale {
  float clamped, inv;
  bool full, mantissas, nan_block, inf_block;
  BlockScale(float absmax, bool full_block) {
    const uint a = magnitude_bits(absmax);
    const uint c = max(a, BNB_MIN_SCALE_BITS);
    mantissas = c < 0x00800000u;
    nan_block = a > 0x7f800000u;
    inf_block = a == 0x7f800000u;
    clamped = mantissas ? float(c) : absmax;
    inv = precise::divide(1.0f, clamped);
    full = full_block;
  }
  bool to_nan(float x) const { return nan_block || magnitude_bits(x) >= 0x7f800000u; }
  // x scaled, for an x that does not scale to NaN.
  float operator()(float x) const {
    if (inf_block) return 0.0f;  // +-0: one code
    if (mantissas) {  // +-mx as a float (exact: below 2**23), the sign set on the bits to keep -0
      const uint b = as_type<uint>(x);
      x = as_type<float>(as_type<uint>(float(b & 0x007fffffu)) | (b & 0x80000000u));
    }
    return full ? x * inv : precise::divide(x, clamped);
  }
};

inline float clamp_unit(float s) { return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s); }

// The quantizers' geometry: a group of blocksize / BNB_QUANT_ITEMS threads owns one quantization block,
// each thread BNB_QUANT_ITEMS consecutive values held in registers between the absmax reduction and
// the coding (one pass over A). Threadgroup size max(256, group), every threadgroup full (a uniform
// grid: ops/quant.py quantize_geometry); threadgroup tg owns blocks tg * per_group ... where per_group =
// threadgroup size / group. Threads past the last block load zeros and take part in the reductions.
// Block sizes are powers of two: shifts and masks, no division.
struct QuantPlace {
  long block, start, i;
  uint group;
  QuantPlace(uint tg, uint lid, uint tg_size, long blocksize) {
    const uint shift = ctz(uint(blocksize) / BNB_QUANT_ITEMS);  // log2(group)
    group = 1u << shift;
    block = long(tg) * (tg_size >> shift) + (lid >> shift);
    start = block * blocksize;
    i = start + long(lid & (group - 1u)) * BNB_QUANT_ITEMS;
  }
};

template <typename T>
inline void load_items(device const T* A, long i, long n, thread float* v) {
  for (int k = 0; k < BNB_QUANT_ITEMS; ++k) v[k] = i + k < n ? float(A[i + k]) : 0.0f;
}

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
// threadgroup full: ops/quant.py dequantize_geometry), so that the copy's stride is the number of threads
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

// -------------------------------------------------------------------------------------------- gemv

// out[m, n] = sum_k A[m, k] * W[n, k] with W[n, k] = T(code[c] * absmax[f / blocksize]), f = n * K + k
// and c its nibble (the reference's weight, rounded to A's dtype), accumulated in float32 with fma.
// Threadgroup (x, y) computes BNB_GEMV_FEATURES features for BNB_GEMV_ROWS rows of A; its threads
// (at most BNB_GEMV_MAX_SIMDGROUPS SIMD-groups) split K, so each weight byte is read once and every value
// of A loaded serves all the threadgroup's features. Three paths, uniform per launch:
//   words (K % 8 == 0 and B 4-byte aligned, decided by the host): a thread takes 8 weights of each
//     feature per step, one 32-bit load (a SIMD-group reads 128 contiguous bytes of a row); 8 weights
//     never straddle a block of scales (block sizes >= 32), so one scale per load;
//   even K: rows start on a byte, a thread takes the pair k, k + 1 (one byte per feature);
//   odd K: rows start mid-byte every other row, a thread takes one k.
// Then simd_sum per (feature, row) and a fixed-order sum over the SIMD-groups, plus bias[n] (float32, read
// only when has_bias != 0: gemm_4bit's bias) before the result is rounded to T.
template <typename T>
[[max_total_threads_per_threadgroup(128)]] kernel void gemv_4bit(device const T* A [[buffer(0)]],
                      device const uchar* B [[buffer(1)]],
                      device const float* absmax [[buffer(2)]],
                      device const float* code [[buffer(3)]],
                      device T* out [[buffer(4)]],
                      constant long& M [[buffer(5)]],
                      constant long& N [[buffer(6)]],
                      constant long& K [[buffer(7)]],
                      constant long& blocksize [[buffer(8)]],
                      constant long& words [[buffer(9)]],
                      device const float* bias [[buffer(10)]],
                      constant long& has_bias [[buffer(11)]],
                      uint2 tg [[threadgroup_position_in_grid]],
                      uint lid [[thread_index_in_threadgroup]],
                      uint2 tg_size [[threads_per_threadgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]],
                      uint sg_count [[simdgroups_per_threadgroup]]) {
  constexpr int F = BNB_GEMV_FEATURES;
  constexpr int R = BNB_GEMV_ROWS;
  threadgroup float table[16];
  threadgroup float partial[BNB_GEMV_MAX_SIMDGROUPS * F * R];  // one sum per SIMD-group, feature, row
  if (lid < 16) table[lid] = code[lid];
  threadgroup_barrier(mem_flags::mem_threadgroup);

  const long n0 = long(tg.x) * F;
  const long m0 = long(tg.y) * R;
  const int feats = N - n0 < F ? int(N - n0) : F;  // uniform over the threadgroup
  const int rows = M - m0 < R ? int(M - m0) : R;
  const uint shift = ctz(uint(blocksize));
  // The 64-bit products stay out of the loops over K: each feature's first weight (in nibbles) and
  // each row's first value of A, once per thread.
  long w0[F];
  for (int f = 0; f < F; ++f) w0[f] = (n0 + f) * K;
  device const T* a_row[R];
  for (int r = 0; r < R; ++r) a_row[r] = A + (m0 + (r < rows ? r : 0)) * K;  // in bounds even past M
  float acc[F][R];
  for (int f = 0; f < F; ++f)
    for (int r = 0; r < R; ++r) acc[f][r] = 0.0f;

  if (words != 0) {
    device const uint* B32 = reinterpret_cast<device const uint*>(B);
    for (long k = 8 * long(lid); k < K; k += 8 * long(tg_size.x)) {
      float w[F][8];
      for (int f = 0; f < F; ++f) {
        if (f < feats) {
          const long i = w0[f] + k;  // a multiple of 8: word i / 8, one block of scales
          const uint q = B32[i >> 3];
          const float s = absmax[i >> shift];
          for (int j = 0; j < 4; ++j) {  // byte j of the little-endian word is byte j in memory
            const uint byte = (q >> (8 * j)) & 0xffu;
            w[f][2 * j] = float(T(table[byte >> 4] * s));
            w[f][2 * j + 1] = float(T(table[byte & 0xfu] * s));
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          float x[8];
          for (int j = 0; j < 8; ++j) x[j] = float(a_row[r][k + j]);
          for (int f = 0; f < F; ++f)
            if (f < feats)
              for (int j = 0; j < 8; ++j) acc[f][r] = fma(w[f][j], x[j], acc[f][r]);
        }
      }
    }
  } else if ((K & 1) == 0) {
    for (long k = 2 * long(lid); k < K; k += 2 * long(tg_size.x)) {
      float w[F][2];
      for (int f = 0; f < F; ++f) {
        if (f < feats) {
          const long i = w0[f] + k;  // even: the byte holds k (high nibble) and k + 1
          const uint byte = B[i >> 1];
          const float s = absmax[i >> shift];
          w[f][0] = float(T(table[byte >> 4] * s));
          w[f][1] = float(T(table[byte & 0xfu] * s));
        }
      }
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          const float x0 = float(a_row[r][k]);
          const float x1 = float(a_row[r][k + 1]);
          for (int f = 0; f < F; ++f)
            if (f < feats) acc[f][r] = fma(w[f][1], x1, fma(w[f][0], x0, acc[f][r]));
        }
      }
    }
  } else {
    for (long k = long(lid); k < K; k += long(tg_size.x)) {
      float w[F];
      for (int f = 0; f < F; ++f) {
        if (f < feats) {
          const long i = w0[f] + k;
          const uint byte = B[i >> 1];
          w[f] = float(T(table[(i & 1) ? (byte & 0xfu) : (byte >> 4)] * absmax[i >> shift]));
        }
      }
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          const float x = float(a_row[r][k]);
          for (int f = 0; f < F; ++f)
            if (f < feats) acc[f][r] = fma(w[f], x, acc[f][r]);
        }
      }
    }
  }

  for (int f = 0; f < F; ++f) {
    for (int r = 0; r < R; ++r) {
      if (f < feats && r < rows) {  // uniform: every lane takes part in simd_sum
        const float v = simd_sum(acc[f][r]);
        if (lane == 0) partial[sg * (F * R) + r * F + f] = v;
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid < uint(F * R)) {
    const int f = int(lid) % F, r = int(lid) / F;
    if (f < feats && r < rows) {
      float v = partial[r * F + f];
      for (uint j = 1; j < sg_count; ++j) v += partial[j * (F * R) + r * F + f];
      if (has_bias != 0) v += bias[n0 + f];  // in float32 before the one rounding, as the reference
      out[(m0 + r) * N + n0 + f] = T(v);
    }
  }
}

// -------------------------------------------------------------------------------- instantiations

// BEGIN GENERATED instances (python -m bitsandbytes_mps.tables.quant; do not edit)
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
template [[host_name("gemv_4bit_f32")]] kernel void gemv_4bit<float>(
    device const float* A [[buffer(0)]],
    device const uchar* B [[buffer(1)]],
    device const float* absmax [[buffer(2)]],
    device const float* code [[buffer(3)]],
    device float* out [[buffer(4)]],
    constant long& M [[buffer(5)]],
    constant long& N [[buffer(6)]],
    constant long& K [[buffer(7)]],
    constant long& blocksize [[buffer(8)]],
    constant long& words [[buffer(9)]],
    device const float* bias [[buffer(10)]],
    constant long& has_bias [[buffer(11)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint2 tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg_count [[simdgroups_per_threadgroup]]);
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
template [[host_name("gemv_4bit_f16")]] kernel void gemv_4bit<half>(
    device const half* A [[buffer(0)]],
    device const uchar* B [[buffer(1)]],
    device const float* absmax [[buffer(2)]],
    device const float* code [[buffer(3)]],
    device half* out [[buffer(4)]],
    constant long& M [[buffer(5)]],
    constant long& N [[buffer(6)]],
    constant long& K [[buffer(7)]],
    constant long& blocksize [[buffer(8)]],
    constant long& words [[buffer(9)]],
    device const float* bias [[buffer(10)]],
    constant long& has_bias [[buffer(11)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint2 tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg_count [[simdgroups_per_threadgroup]]);
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
template [[host_name("gemv_4bit_bf16")]] kernel void gemv_4bit<bfloat>(
    device const bfloat* A [[buffer(0)]],
    device const uchar* B [[buffer(1)]],
    device const float* absmax [[buffer(2)]],
    device const float* code [[buffer(3)]],
    device bfloat* out [[buffer(4)]],
    constant long& M [[buffer(5)]],
    constant long& N [[buffer(6)]],
    constant long& K [[buffer(7)]],
    constant long& blocksize [[buffer(8)]],
    constant long& words [[buffer(9)]],
    device const float* bias [[buffer(10)]],
    constant long& has_bias [[buffer(11)]],
    uint2 tg [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]],
    uint2 tg_size [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]],
    uint lane [[thread_index_in_simdgroup]],
    uint sg_count [[simdgroups_per_threadgroup]]);
#endif
// END GENERATED instances
