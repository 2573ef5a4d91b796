// One tile of a packed 4-bit weight decoded to float32 for a float32 GEMM (the many-row gemm_4bit
// route): each weight is the reference's fp32 product table[code] * absmax rounded to the dtype of A
// and widened back, so an fp32 GEMM on the tile multiplies by exactly the weights the reference
// multiplies by (bf16 / fp16 values times bf16 / fp16 values are exact in fp32).
#pragma once

#include "common.h"
#include "kernels/matmul_4bit.h"

#define BNB_DEQUANT_TILE_DECLS                                                                                        \
  /* out[i - i0] = widen(round_to_dtype(code[c_i] * scale(i / blocksize))) for flat i in [i0, i1); scale is   */      \
  /* absmax[b], or with nested (double quantization: absmax is then absmax2) code8[q[b]] * absmax2[b / 256]  */       \
  /* + offset, in fp32 as the reference. `round` names the dtype to round to (f32: no rounding).              */      \
  void dequantize_4bit_tile_f32(const uint8_t* B, const float* absmax, const NestedAbsmax* nested, const float* code, \
                                int64_t blocksize, int64_t i0, int64_t i1, DType round, float* out, int threads);

BNB_FOR_EACH_ISA(BNB_DEQUANT_TILE_DECLS)
