// gemm_4bit for bf16 A on AMX tiles (Intel Sapphire Rapids and later): the packed 4-bit weight is decoded
// into bf16 tiles as it is multiplied, never into a dequantized copy. Linux on x86-64 with gcc or clang
// only (the tile state needs the kernel's permission, arch_prctl); everywhere else amx_bf16_unavailable()
// says why and the glue takes another route.
#pragma once

#include "common.h"
#include "kernels/matmul_4bit.h"

#define BNB_GEMM_4BIT_AMX_DECLS                                                                                      \
  /* Why the AMX GEMM cannot run at this level, or "" when it can: the CPU (AMX-TILE, AMX-BF16,            */        \
  /* AVX512-BF16), the OS's permission for the tile data, and a self-test on the tiles. Probed once.      */         \
  void amx_bf16_unavailable(const char** why);                                                                       \
  /* Bytes of the `work` buffer gemm_4bit_amx_bf16 needs for M rows of K (x laid out as tile operands). */           \
  void amx_workspace_bytes(int64_t M, int64_t K, int64_t* bytes);                                                    \
  /* The calling thread's 64-byte tile configuration into out, then `load` loaded (null: nothing; palette */         \
  /* 0: the tiles released). For tests: our kernel must leave a thread's configuration as it found it.     */        \
  void amx_tile_config(const uint8_t* load, uint8_t* out);                                                           \
  /* y[M, N] = x[M, K] @ W.T (+ bias[N]) in bf16, fp32 accumulation; W the packed 4-bit [N, K] weight with   */      \
  /* its 16-entry fp32 table `code`, each weight bf16(code * scale) as the reference's dequantized weight.  */       \
  /* nested (nullable): absmax is absmax2 of double quantization. Needs K % 64 == 0 and blocksize >= 64.   */        \
  void gemm_4bit_amx_bf16(const uint16_t* x, int64_t M, int64_t N, int64_t K, const uint8_t* B, const float* absmax, \
                          const NestedAbsmax* nested, const float* code, int64_t blocksize, const uint16_t* bias,    \
                          uint16_t* y, void* work, int threads);

BNB_FOR_EACH_ISA(BNB_GEMM_4BIT_AMX_DECLS)
