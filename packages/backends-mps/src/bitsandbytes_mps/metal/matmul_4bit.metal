// gemv_4bit on Apple GPUs: a few rows of A times the packed 4-bit weight (fourbit.metal's layout), in one
// pass over the weight. Semantics (the contract): the reference's gemv_4bit (bitsandbytes._reference).
// Launch geometry is computed in one place, bitsandbytes_mps/ops/matmul_4bit.py; what it must meet is
// stated at the kernel. Instantiations are generated (tables/_generate.py).
#include <metal_stdlib>
using namespace metal;

#define BNB_GEMV_FEATURES 4
#define BNB_GEMV_ROWS 4
#define BNB_GEMV_MAX_SIMDGROUPS 8

// Position and size attributes of one kernel share a type (MSL rule): uint2 for the
// threadgroup's position and size.

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

// BEGIN GENERATED instances (python -m bitsandbytes_mps.tables._generate; do not edit)
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
