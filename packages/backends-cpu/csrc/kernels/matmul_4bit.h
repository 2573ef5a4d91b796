// Matmuls on the standard packed 4-bit layout (semantics: gemv_4bit / gemm_4bit in
// bitsandbytes/_reference/fourbit.py). W[n, k] is the value at flat index f = n * K + k: its code is the
// high nibble of byte f / 2 when f is even, the low nibble when odd, and its scale absmax[f / blocksize].
// No repacking: any N, K (odd K puts row starts mid-byte) and any block/row alignment.
#pragma once

#include "common.h"

namespace bnb {
// Double-quantized block scales, expanded inside the matmul as it reads them: the scale of block b is
// code[q[b]] * absmax2[b / 256] + offset in fp32, exactly as expand_nested_absmax (and the reference).
struct NestedAbsmax {
  const uint8_t* q;
  const float* code;  // 256 entries
  float offset;
};
}  // namespace bnb

#define BNB_GEMV_4BIT_DECLS                                                                                           \
  /* out[m, n] = sum_k A[m, k] * code[W(n, k)] * absmax[block] (+ bias[n]), fp32 accumulation, written  */            \
  /* as `dtype`; A is [M, K] of `dtype`, bias (nullable) [N] of `dtype`, out [M, N] of `dtype`.         */            \
  /* nested (nullable): absmax holds the absmax2 of double quantization and the scales come from it.    */            \
  void gemv_4bit(const void* A, DType dtype, int64_t M, int64_t N, int64_t K, const uint8_t* B, const float* absmax,  \
                 const NestedAbsmax* nested, const float* code, int64_t blocksize, const void* bias, void* out,       \
                 int threads);                                                                                        \
  /* Whether bf16 A uses the AVX512-BF16 dot product here; mode 0/1 turns it off/on, -1 only asks. */                 \
  void gemv_4bit_bf16_dot(int mode, bool* used);                                                                      \
  /* out[i - i0] = code[code_i] * absmax[i / blocksize] rounded to `dtype`, for flat i in [i0, i1). */                \
  void dequantize_4bit_range(const uint8_t* B, const float* absmax, const float* code, int64_t blocksize, int64_t i0, \
                             int64_t i1, void* out, DType dtype, int threads);                                        \
  /* Double quantization: out[j] = code8[q[j]] * absmax2[j / 256] + offset (fp32, as the reference). */               \
  void expand_nested_absmax(const uint8_t* q, const float* absmax2, const float* code8, float offset, int64_t n,      \
                            float* out, int threads);

BNB_FOR_EACH_ISA(BNB_GEMV_4BIT_DECLS)
