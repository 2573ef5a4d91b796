// LLM.int8() quantization and dequantization (semantics: bitsandbytes/_reference/int8.py).
// Assembled behind the prelude of bitsandbytes_mps/_assemble.py (BNB_HAS_BFLOAT).
#include <metal_stdlib>
using namespace metal;

namespace bnb_int8 {

// max(m, a) that keeps a NaN: metal::max drops it, the reference's amax propagates it.
inline float nan_max(float m, float a) { return (isnan(m) || isnan(a)) ? NAN : max(m, a); }

// The reference's code: round-half-even(x * scale), NaN (0 * inf of an all-zero row) -> 0, clamped.
inline char to_code(float v) { return isnan(v) ? char(0) : char(clamp(rint(v), -127.0f, 127.0f)); }

}  // namespace bnb_int8

// flags[c] = 1 when some row of column c holds |a| >= thr (an outlier column), else 0. One lane a column.
template <typename T>
kernel void int8_outlier_cols(device const T* A [[buffer(0)]],
                              constant float& thr [[buffer(1)]],
                              device uchar* flags [[buffer(2)]],
                              constant long& rows [[buffer(3)]],
                              constant long& cols [[buffer(4)]],
                              uint col [[thread_position_in_grid]]) {
  if (long(col) >= cols) return;
  uchar hit = 0;
  for (long r = 0; r < rows && !hit; ++r) hit = fabs(float(A[r * cols + col])) >= thr ? 1 : 0;
  flags[col] = hit;
}

// One threadgroup a row: the absmax of the row's inliers (|a| < thr when outliers > 0; NaN propagates),
// then codes = round(a * (127 / absmax)) with the outlier columns (flags) zeroed.
template <typename T>
kernel void int8_row_quant(device const T* A [[buffer(0)]],
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
  threadgroup float partial[32];
  device const T* a = A + long(row) * cols;
  device char* q = codes + long(row) * cols;
  const bool drop = outliers != 0;

  float m = 0.0f;
  for (long i = lid; i < cols; i += group_len) {
    const float v = fabs(float(a[i]));
    if (!(drop && v >= thr)) m = bnb_int8::nan_max(m, v);
  }
  const bool any_nan = simd_any(isnan(m));
  m = simd_max(m);
  if (simd_is_first()) partial[sg] = any_nan ? NAN : m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float amax = partial[0];
  for (uint i = 1; i < sg_count; ++i) amax = bnb_int8::nan_max(amax, partial[i]);
  if (lid == 0) stats[row] = amax;

  // reciprocal first, then * 127: the reference's (and upstream's) order, for identical codes.
  const float scale = precise::divide(1.0f, amax) * 127.0f;
  for (long i = lid; i < cols; i += group_len) {
    const float v = float(a[i]);
    const bool out = drop && flags[i] != 0;  // |v| >= thr flagged its own column
    q[i] = out ? char(0) : bnb_int8::to_code(v * scale);
  }
}

// out = float(code) * stats[row] * scale (scale = 1/127), one lane an element.
kernel void int8_vectorwise_dequant(device const char* A [[buffer(0)]],
                                    device const float* stats [[buffer(1)]],
                                    device float* out [[buffer(2)]],
                                    constant float& scale [[buffer(3)]],
                                    constant long& cols [[buffer(4)]],
                                    constant long& n [[buffer(5)]],
                                    uint gid [[thread_position_in_grid]]) {
  if (long(gid) >= n) return;
  const float v = float(A[gid]) * stats[long(gid) / cols];
  out[gid] = v * scale;
}

// out = T(float(acc) * (row_stats[r] * col_stats[c]) * scale [+ bias[c]]), one lane an element; the
// reference's fp32 operation order, rounded to T once at the end.
template <typename T>
kernel void int8_mm_dequant(device const int* A [[buffer(0)]],
                            device const float* row_stats [[buffer(1)]],
                            device const float* col_stats [[buffer(2)]],
                            device const float* bias [[buffer(3)]],
                            constant long& has_bias [[buffer(4)]],
                            device T* out [[buffer(5)]],
                            constant float& scale [[buffer(6)]],
                            constant long& cols [[buffer(7)]],
                            constant long& n [[buffer(8)]],
                            uint gid [[thread_position_in_grid]]) {
  if (long(gid) >= n) return;
  const long r = long(gid) / cols;
  const long c = long(gid) - r * cols;
  const float s = row_stats[r] * col_stats[c];
  const float v = float(A[gid]) * s;
  float w = v * scale;
  if (has_bias != 0) w = w + bias[c];
  out[gid] = T(w);
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
    constant long& cols [[buffer(7)]], constant long& n [[buffer(8)]], uint gid [[thread_position_in_grid]]);
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
    constant long& cols [[buffer(7)]], constant long& n [[buffer(8)]], uint gid [[thread_position_in_grid]]);
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
    constant long& cols [[buffer(7)]], constant long& n [[buffer(8)]], uint gid [[thread_position_in_grid]]);
#endif  // BNB_HAS_BFLOAT
