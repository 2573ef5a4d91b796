// The 4-bit codes of one block as bf16 weights, for the kernels that multiply in bf16 (AVX512-BF16
// dot products in matmul_4bit.cpp, AMX tiles in matmul_4bit_amx.cpp). Each weight is the reference's
// fp32 product code[c] * absmax rounded to bf16, so a bf16 product of it with bf16 A is exact in fp32.
#pragma once

#if defined(BNB_ISA_AVX512) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define BNB_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace bnb {
namespace BNB_ISA_NS {

BNB_BF16_TARGET inline __attribute__((always_inline)) __m512i low_nibbles(__m512i w) {
  return _mm512_and_si512(w, _mm512_set1_epi16(15));
}

// The 16 codes times a block's scale, as bf16, in the low 16 words (vpermw reads 5 index bits: the low
// nibble is masked, an ALU op, where storing the table twice took one more shuffle per block, and the
// batch-1 loop is bound by the shuffle ports: 3-5% on a Zen 4; the same bits).
BNB_BF16_TARGET inline __attribute__((always_inline)) __m512i bf16_table(__m512 ctab, float scale) {
  return _mm512_zextsi256_si512((__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(ctab, _mm512_set1_ps(scale))));
}

// 64 weights from 32 packed bytes (w: the bytes widened to words) looked up in a block's table: the even
// positions (high nibbles) and the odd ones (low nibbles), 32 bf16 each.
BNB_BF16_TARGET inline __attribute__((always_inline)) __m512i even_weights(__m512i w, __m512i tab) {
  return _mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), tab);
}
BNB_BF16_TARGET inline __attribute__((always_inline)) __m512i odd_weights(__m512i w, __m512i tab) {
  return _mm512_permutexvar_epi16(low_nibbles(w), tab);
}
BNB_BF16_TARGET inline __attribute__((always_inline)) __m512i load_codes64(const uint8_t* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
#endif
