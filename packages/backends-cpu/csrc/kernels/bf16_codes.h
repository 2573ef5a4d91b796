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

// 128 weights per step without widening: 64 packed bytes read as 32 words. Word j holds the codes of
// k = 4j .. 4j + 3 of the chunk as its four nibbles (bits 0-3: 4j + 1, 4-7: 4j, 8-11: 4j + 3, 12-15: 4j + 2;
// a byte's high nibble is the even position). Nibble s, shifted down and masked, is vpermw's index, with
// bit 4 set in words 16-31: those are the chunk's second 64 weights, which read the table's upper half
// (the next block's when blocksize is 64). This saves the widening shuffle (vpmovzxbw) that each 64-weight
// step paid. Measured on an AMX Xeon, one thread, ns per 64 weights with the dot products, against the
// 64-weight step: 3.08 against 3.18 from L3, 2.87 against 3.08 in L2.
constexpr int kWordNibbleK[4] = {1, 0, 3, 2};  // nibble s of word j: k = 4j + kWordNibbleK[s]

// The two 64-weight halves' tables, 32 bf16: lo's block in words 0-15, hi's in 16-31.
BNB_BF16_TARGET inline __attribute__((always_inline)) __m512i bf16_table2(__m512 ctab, float lo, float hi) {
  return (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(ctab, _mm512_set1_ps(hi)), _mm512_mul_ps(ctab, _mm512_set1_ps(lo)));
}

// The 32 weights of nibble S of each word of w (see kWordNibbleK), looked up in a bf16_table2.
template <int S>
BNB_BF16_TARGET inline __attribute__((always_inline)) __m512i word_nibble_weights(__m512i w, __m512i tab) {
  const __m512i upper = _mm512_mask_set1_epi16(_mm512_setzero_si512(), 0xFFFF0000u, 16);
  __m512i idx;
  if (S == 3)
    idx = _mm512_or_si512(_mm512_srli_epi16(w, 12), upper);
  else  // (w >> 4S) & 15 | upper in one ternary-logic op
    idx = _mm512_ternarylogic_epi32(S ? _mm512_srli_epi16(w, 4 * S) : w, _mm512_set1_epi16(15), upper, 0xEA);
  return _mm512_permutexvar_epi16(idx, tab);
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
#endif
