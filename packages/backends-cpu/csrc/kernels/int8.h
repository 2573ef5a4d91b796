// LLM.int8(): row/column-wise int8 quantization, the exact int8 GEMM and its dequantization
// (semantics: bitsandbytes/_reference/int8.py). A tensor [..., K] is handled as `rows` rows of K values.
#pragma once

#include "common.h"

#define BNB_INT8_DECLS                                                                                                 \
  /* Row-wise codes and absmax of A (rows x K). With col_flags (K bytes, zeroed by the caller; null: no  */            \
  /* outlier handling) values with |a| >= threshold (rounded to A's dtype) are left out of the absmax,   */            \
  /* col_flags[k] becomes 1 for every column holding one, and those columns are coded 0 in every row.    */            \
  void int8_vectorwise_quant(const void* A, DType dtype, int64_t rows, int64_t K, float threshold, int8_t* codes,      \
                             float* stats, uint8_t* col_flags, int threads);                                           \
  /* Column-wise codes and absmax of A (rows x K); with `outliers`, |a| >= threshold left out and coded 0. */          \
  void int8_colwise_quant(const void* A, DType dtype, int64_t rows, int64_t K, bool outliers, float threshold,         \
                          int8_t* codes, float* stats, int threads);                                                   \
  void int8_vectorwise_dequant(const int8_t* A, const float* stats, int64_t rows, int64_t K, float* out, int threads); \
  /* out[r, n] = float(A[r, n]) * (row_stats[r] * col_stats[n]) * MM_DEQUANT_SCALE (+ bias[n]), as out_dtype. */       \
  void int8_mm_dequant(const int32_t* A, const float* row_stats, const float* col_stats, const void* bias,             \
                       DType bias_dtype, int64_t rows, int64_t N, void* out, DType out_dtype, int threads);            \
  /* out[M, N] = A[M, K] @ B[N, K]^T exactly, modulo 2**32. vnni: the CPU has AVX512-VNNI (avx512 only). */            \
  void int8_linear_matmul(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, int32_t* out, bool vnni,  \
                          int threads);                                                                                \
  /* int8_linear_matmul followed by int8_mm_dequant, fused (the int32 tile never leaves registers). */                 \
  void int8_scaled_mm(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, const float* row_stats,       \
                      const float* col_stats, const void* bias, DType bias_dtype, void* out, DType out_dtype,          \
                      bool vnni, int threads);

BNB_FOR_EACH_ISA(BNB_INT8_DECLS)
