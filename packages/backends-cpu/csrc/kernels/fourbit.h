// 4-bit (NF4 / FP4) blockwise quantization (semantics: bitsandbytes/_reference/fourbit.py).
#pragma once

#include "common.h"

namespace bnb {
// Which 16-entry table (bitsandbytes/formats.h) the codes index.
enum class QuantType : int { nf4 = 0, fp4 = 1 };
}  // namespace bnb

#define BNB_FOURBIT_DECLS                                                                                            \
  /* out: (n + 1) / 2 bytes, first value of a pair in the high nibble; absmax: one float per block. */               \
  void quantize_4bit(const void* A, DType dtype, int64_t n, QuantType qt, int64_t blocksize, uint8_t* out,           \
                     float* absmax, int threads);                                                                    \
  /* A: at least (n + 1) / 2 bytes; out: n elements of dtype. */                                                     \
  void dequantize_4bit(const uint8_t* A, const float* absmax, QuantType qt, int64_t n, int64_t blocksize, void* out, \
                       DType dtype, int threads);

BNB_FOR_EACH_ISA(BNB_FOURBIT_DECLS)
