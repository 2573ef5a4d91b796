// LLM.int8() quantization and dequantization (semantics: bitsandbytes/_reference/int8.py).
// Assembled behind the prelude of bitsandbytes_mps/_assemble.py (BNB_HAS_BFLOAT).
#include <metal_stdlib>
using namespace metal;

namespace bnb_int8 {

// NaN, inf and the threshold are decided on the bits: fast math (PYTORCH_MPS_FAST_MATH=1) lets the
// compiler assume no NaN or inf, fold isnan and reorder comparisons whose NaN result matters.
constant constexpr uint kInfBits = 0x7f800000u;
constant constexpr uint kQuietNanBits = 0x7fc00000u;
constant constexpr uint k127Bits = 0x42fe0000u;  // 127.0f

// |x| as uint bits: ordered like |x| for numbers, inf above them and every NaN above inf, so a uint max
// is the reference's amax with NaN propagating.
inline uint magnitude_bits(float x) { return as_type<uint>(x) & 0x7fffffffu; }

// The reference's |a| >= thr (thr >= 0 as its bits): false for NaN, true for inf.
inline bool at_least(uint magnitude, uint thr_bits) { return magnitude >= thr_bits && magnitude <= kInfBits; }

// The reference's code of a nonzero inlier a of a row whose absmax is finite and nonzero: v = a * scale
// rounded half to even and clamped to +-127. v is never NaN there; it is +-inf when 127 / absmax
// overflows (a subnormal absmax), which the clamp takes to +-127. Below 127 in magnitude rint stays within
// the int8 range. Every other code is 0 (codes_are_zero and the caller): the reference's NaN -> 0 for a
// NaN, for 0 * inf (an all-zero row) and for inf * 0 (an inf absmax), and round(0 * scale) = 0.
inline char to_code(float v) {
  if (magnitude_bits(v) >= k127Bits) return as_type<int>(v) < 0 ? char(-127) : char(127);
  return char(rint(v));
}

// Whether every code of a row is 0, from its absmax's bits: 0, inf or NaN (see to_code).
inline bool codes_are_zero(uint absmax_bits) { return absmax_bits == 0u || absmax_bits >= kInfBits; }

}  // namespace bnb_int8

// flags[c] = 1 when some row of column c holds |a| >= thr (an outlier column), else 0. One lane a column.
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void int8_outlier_cols(device const T* A [[buffer(0)]],
                              constant float& thr [[buffer(1)]],
                              device uchar* flags [[buffer(2)]],
                              constant long& rows [[buffer(3)]],
                              constant long& cols [[buffer(4)]],
                              uint col [[thread_position_in_grid]]) {
  if (long(col) >= cols) return;
  const uint thr_bits = as_type<uint>(thr);
  uchar hit = 0;
  for (long r = 0; r < rows && !hit; ++r)
    hit = bnb_int8::at_least(bnb_int8::magnitude_bits(float(A[r * cols + col])), thr_bits) ? 1 : 0;
  flags[col] = hit;
}

// One threadgroup a row: the absmax of the row's inliers (|a| < thr when outliers > 0; NaN propagates),
// then codes = round(a * (127 / absmax)) with the outlier columns (flags) zeroed.
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void int8_row_quant(device const T* A [[buffer(0)]],
                           constant float& thr [[buffer(1)]],
                           constant long& outliers [[buffer(2)]],
                           device const uchar* flags [[buffer(3)]],
                           device char* codes [[buffer(4)]],
                           device float* stats [[buffer(5)]],
                           constant long& cols [[buffer(6)]],
                           uint row [[threadgroup_position_in_grid]],
                           uint lid [[thread_index_in_threadgroup]],
                           uint group_len [[threads_per_threadgroup]],
                           uint sg [[simdgroup_index_in_threadgroup]],
                           uint sg_count [[simdgroups_per_threadgroup]]) {
  threadgroup uint partial[32];
  device const T* a = A + long(row) * cols;
  device char* q = codes + long(row) * cols;
  const bool drop = outliers != 0;
  const uint thr_bits = as_type<uint>(thr);

  uint m = 0;
  for (long i = lid; i < cols; i += group_len) {
    const uint v = bnb_int8::magnitude_bits(float(a[i]));
    if (!(drop && bnb_int8::at_least(v, thr_bits))) m = max(m, v);
  }
  m = simd_max(m);
  if (simd_is_first()) partial[sg] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint total = partial[0];
  for (uint i = 1; i < sg_count; ++i) total = max(total, partial[i]);
  // Any NaN becomes the quiet NaN, as torch's amax gives.
  const float amax = as_type<float>(total > bnb_int8::kInfBits ? bnb_int8::kQuietNanBits : total);
  if (lid == 0) stats[row] = amax;

  // reciprocal first, then * 127: the reference's (and upstream's) order, for identical codes. Which codes
  // are 0 is decided on the bits of the loaded values and of the absmax, never on a computed NaN (fast
  // math lets the compiler assume there is none).
  const float scale = precise::divide(1.0f, amax) * 127.0f;
  const bool all_zero = bnb_int8::codes_are_zero(total);
  // A subnormal absmax makes the reference's scale inf (127 / absmax > 2**133): every nonzero inlier is
  // +-127 by its sign. Said on the bits, because a GPU that flushes subnormals reads v * inf as 0 * inf.
  const bool subnormal_row = total != 0u && total < 0x00800000u;
  for (long i = lid; i < cols; i += group_len) {
    const float v = float(a[i]);
    const bool out = drop && flags[i] != 0;  // |v| >= thr flagged its own column
    const bool zero = out || all_zero || bnb_int8::magnitude_bits(v) == 0u;
    const char signed_max = as_type<int>(v) < 0 ? char(-127) : char(127);
    q[i] = zero ? char(0) : (subnormal_row ? signed_max : bnb_int8::to_code(v * scale));
  }
}

// The dequantizers run a 2-D grid, x the column and y the row, so no thread divides to find its row.
// Their indices are 32-bit: the host launches them only for rows * cols < 2^32 (ops/int8.py).

// out = float(code) * stats[row] * scale (scale = 1/127), one lane an element.
[[max_total_threads_per_threadgroup(256)]] kernel void int8_vectorwise_dequant(
    device const char* A [[buffer(0)]],
    device const float* stats [[buffer(1)]],
    device float* out [[buffer(2)]],
    constant float& scale [[buffer(3)]],
    constant long& rows [[buffer(4)]],
    constant long& cols [[buffer(5)]],
    uint2 pos [[thread_position_in_grid]]) {
  if (pos.x >= uint(cols) || pos.y >= uint(rows)) return;
  const uint i = pos.y * uint(cols) + pos.x;
  const float v = float(A[i]) * stats[pos.y];
  out[i] = v * scale;
}

// out = T(float(acc) * (row_stats[r] * col_stats[c]) * scale [+ bias[c]]), one lane an element; the
// reference's fp32 operation order, rounded to T once at the end.
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void int8_mm_dequant(
    device const int* A [[buffer(0)]],
    device const float* row_stats [[buffer(1)]],
    device const float* col_stats [[buffer(2)]],
    device const float* bias [[buffer(3)]],
    constant long& has_bias [[buffer(4)]],
    device T* out [[buffer(5)]],
    constant float& scale [[buffer(6)]],
    constant long& rows [[buffer(7)]],
    constant long& cols [[buffer(8)]],
    uint2 pos [[thread_position_in_grid]]) {
  if (pos.x >= uint(cols) || pos.y >= uint(rows)) return;
  const uint c = pos.x;
  const uint i = pos.y * uint(cols) + c;
  const float s = row_stats[pos.y] * col_stats[c];
  const float v = float(A[i]) * s;
  float w = v * scale;
  if (has_bias != 0) w = w + bias[c];
  out[i] = T(w);
}

// The instances Python calls (names and arguments: tables/int8.py).
template [[host_name("int8_outlier_cols_f32")]] kernel void int8_outlier_cols<float>(
    device const float* A [[buffer(0)]], constant float& thr [[buffer(1)]], device uchar* flags [[buffer(2)]],
    constant long& rows [[buffer(3)]], constant long& cols [[buffer(4)]], uint col [[thread_position_in_grid]]);
template [[host_name("int8_row_quant_f32")]] kernel void int8_row_quant<float>(
    device const float* A [[buffer(0)]], constant float& thr [[buffer(1)]], constant long& outliers [[buffer(2)]],
    device const uchar* flags [[buffer(3)]], device char* codes [[buffer(4)]], device float* stats [[buffer(5)]],
    constant long& cols [[buffer(6)]], uint row [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]], uint group_len [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]], uint sg_count [[simdgroups_per_threadgroup]]);
template [[host_name("int8_mm_dequant_f32")]] kernel void int8_mm_dequant<float>(
    device const int* A [[buffer(0)]], device const float* row_stats [[buffer(1)]],
    device const float* col_stats [[buffer(2)]], device const float* bias [[buffer(3)]],
    constant long& has_bias [[buffer(4)]], device float* out [[buffer(5)]], constant float& scale [[buffer(6)]],
    constant long& rows [[buffer(7)]], constant long& cols [[buffer(8)]], uint2 pos [[thread_position_in_grid]]);
template [[host_name("int8_outlier_cols_f16")]] kernel void int8_outlier_cols<half>(
    device const half* A [[buffer(0)]], constant float& thr [[buffer(1)]], device uchar* flags [[buffer(2)]],
    constant long& rows [[buffer(3)]], constant long& cols [[buffer(4)]], uint col [[thread_position_in_grid]]);
template [[host_name("int8_row_quant_f16")]] kernel void int8_row_quant<half>(
    device const half* A [[buffer(0)]], constant float& thr [[buffer(1)]], constant long& outliers [[buffer(2)]],
    device const uchar* flags [[buffer(3)]], device char* codes [[buffer(4)]], device float* stats [[buffer(5)]],
    constant long& cols [[buffer(6)]], uint row [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]], uint group_len [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]], uint sg_count [[simdgroups_per_threadgroup]]);
template [[host_name("int8_mm_dequant_f16")]] kernel void int8_mm_dequant<half>(
    device const int* A [[buffer(0)]], device const float* row_stats [[buffer(1)]],
    device const float* col_stats [[buffer(2)]], device const float* bias [[buffer(3)]],
    constant long& has_bias [[buffer(4)]], device half* out [[buffer(5)]], constant float& scale [[buffer(6)]],
    constant long& rows [[buffer(7)]], constant long& cols [[buffer(8)]], uint2 pos [[thread_position_in_grid]]);
#if BNB_HAS_BFLOAT
template [[host_name("int8_outlier_cols_bf16")]] kernel void int8_outlier_cols<bfloat>(
    device const bfloat* A [[buffer(0)]], constant float& thr [[buffer(1)]], device uchar* flags [[buffer(2)]],
    constant long& rows [[buffer(3)]], constant long& cols [[buffer(4)]], uint col [[thread_position_in_grid]]);
template [[host_name("int8_row_quant_bf16")]] kernel void int8_row_quant<bfloat>(
    device const bfloat* A [[buffer(0)]], constant float& thr [[buffer(1)]], constant long& outliers [[buffer(2)]],
    device const uchar* flags [[buffer(3)]], device char* codes [[buffer(4)]], device float* stats [[buffer(5)]],
    constant long& cols [[buffer(6)]], uint row [[threadgroup_position_in_grid]],
    uint lid [[thread_index_in_threadgroup]], uint group_len [[threads_per_threadgroup]],
    uint sg [[simdgroup_index_in_threadgroup]], uint sg_count [[simdgroups_per_threadgroup]]);
template [[host_name("int8_mm_dequant_bf16")]] kernel void int8_mm_dequant<bfloat>(
    device const int* A [[buffer(0)]], device const float* row_stats [[buffer(1)]],
    device const float* col_stats [[buffer(2)]], device const float* bias [[buffer(3)]],
    constant long& has_bias [[buffer(4)]], device bfloat* out [[buffer(5)]], constant float& scale [[buffer(6)]],
    constant long& rows [[buffer(7)]], constant long& cols [[buffer(8)]], uint2 pos [[thread_position_in_grid]]);
#endif  // BNB_HAS_BFLOAT
