// 8-bit blockwise quantization with a 256-entry map (semantics: bitsandbytes/_reference/blockwise.py).
#pragma once

#include "common.h"

#define BNB_BLOCKWISE_DECLS                                                                                         \
  /* mids: the 255 float32 midpoints of the value-sorted map; order: the code of each sorted slot. */               \
  void quantize_blockwise(const void* A, DType dtype, int64_t n, const float* mids, const uint8_t* order,           \
                          int64_t blocksize, uint8_t* out, float* absmax, int threads);                             \
  void dequantize_blockwise(const uint8_t* A, const float* absmax, const float* code, int64_t n, int64_t blocksize, \
                            void* out, DType dtype, int threads);

BNB_FOR_EACH_ISA(BNB_BLOCKWISE_DECLS)
