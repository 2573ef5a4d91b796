// 8-bit blockwise quantization with a 256-entry map (semantics: bitsandbytes/_reference/blockwise.py).
#pragma once

#include "common.h"
#include "kernels/nearest_code.h"

#define BNB_BLOCKWISE_DECLS                                                                                         \
  /* map: the nearest-code search of the 256-entry code (nearest_code_build.h). */                                  \
  void quantize_blockwise(const void* A, DType dtype, int64_t n, const NearestCode& map, int64_t blocksize,         \
                          uint8_t* out, float* absmax, int threads);                                                \
  void dequantize_blockwise(const uint8_t* A, const float* absmax, const float* code, int64_t n, int64_t blocksize, \
                            void* out, DType dtype, int threads);

BNB_FOR_EACH_ISA(BNB_BLOCKWISE_DECLS)
