// The nearest-code search of the 8-bit map, shared by quantize_blockwise and the 8-bit optimizers.
//
// The slot of s is the number of the map's 255 value-sorted float32 midpoints below s. The branchless
// binary search keeps the slot's top bits j found so far; step k (0..7) compares s with
// level[k][j] = mids[j * (256 >> k) + (128 >> k) - 1], then j = 2 j + (that midpoint < s).
// `!(s <= m)` is `m < s` for numbers and true for NaN, so NaN takes the last slot (255), as the
// reference does. Every ISA level runs exactly these compares, so the codes agree bit for bit.
#pragma once

#include "common.h"

#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
#include <immintrin.h>
#endif
#if defined(BNB_ISA_NEON)
#include <arm_neon.h>
#endif

namespace bnb {
namespace BNB_ISA_NS {
namespace search8 {

// The midpoints by search step, plus (for AVX-512) step 7's table split into even and odd entries.
struct Tables {
  alignas(64) float l0[16], l1[16], l2[16], l3[16], l4[16], l5[32], l6[64], l7[128], even7[64], odd7[64];
  explicit Tables(const float* mids) {
    float* ls[8] = {l0, l1, l2, l3, l4, l5, l6, l7};
    for (int k = 0; k < 8; ++k) {
      int width = 256 >> k, n = 1 << k;
      for (int j = 0; j < (n < 16 ? 16 : n); ++j) ls[k][j] = mids[(j < n ? j : 0) * width + width / 2 - 1];
    }
    for (int j = 0; j < 64; ++j) {
      even7[j] = l7[2 * j];
      odd7[j] = l7[2 * j + 1];
    }
  }
};

inline int slot(const Tables& t, float s) {
  int j = int(!(s <= t.l0[0]));
  j = 2 * j + int(!(s <= t.l1[j]));
  j = 2 * j + int(!(s <= t.l2[j]));
  j = 2 * j + int(!(s <= t.l3[j]));
  j = 2 * j + int(!(s <= t.l4[j]));
  j = 2 * j + int(!(s <= t.l5[j]));
  j = 2 * j + int(!(s <= t.l6[j]));
  return 2 * j + int(!(s <= t.l7[j]));
}

// Eight searches interleaved step by step: one search is a chain of dependent loads and compares, so a
// lone search per element leaves the core idle (the scalar and NEON builds run this).
inline void slots8(const Tables& t, const float* s, uint8_t* out) {
  const float* ls[8] = {t.l0, t.l1, t.l2, t.l3, t.l4, t.l5, t.l6, t.l7};
  int j[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int k = 0; k < 8; ++k)
    for (int v = 0; v < 8; ++v) j[v] = 2 * j[v] + int(!(s[v] <= ls[k][j[v]]));
  for (int v = 0; v < 8; ++v) out[v] = uint8_t(j[v]);
}

#if defined(BNB_ISA_AVX512)
// All 255 midpoints live in registers. Steps 0-4 look up with vpermps (16 entries), step 5 with
// vpermt2ps (32). Steps 6 and 7 go together: with j the 64 slot groups found so far, step 6 compares with
// l6[j] and step 7 with even7[j] or odd7[j]; the three 64-entry lookups (two vpermt2ps and a blend each)
// do not wait for step 6's outcome, which shortens the chain.
struct Search {
  __m512 l0, l1, l2, l3, l4, l5[2], a[4], b[4], c[4];
  explicit Search(const Tables& t) {
    l0 = _mm512_set1_ps(t.l0[0]);
    l1 = _mm512_load_ps(t.l1);
    l2 = _mm512_load_ps(t.l2);
    l3 = _mm512_load_ps(t.l3);
    l4 = _mm512_load_ps(t.l4);
    for (int i = 0; i < 2; ++i) l5[i] = _mm512_load_ps(t.l5 + 16 * i);
    for (int i = 0; i < 4; ++i) {
      a[i] = _mm512_load_ps(t.even7 + 16 * i);
      b[i] = _mm512_load_ps(t.l6 + 16 * i);
      c[i] = _mm512_load_ps(t.odd7 + 16 * i);
    }
  }
  static __m512 lookup64(const __m512* t, __m512i j, __mmask16 hi) {
    return _mm512_mask_blend_ps(hi, _mm512_permutex2var_ps(t[0], j, t[1]), _mm512_permutex2var_ps(t[2], j, t[3]));
  }
  // The slots of N vectors at once, step by step: one vector's steps form a long dependency chain
  // (lookup -> compare -> index), so interleaving independent vectors keeps the units busy.
  template <int N>
  void slots(const __m512* s, __m512i* j) const {
    const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2), b5 = _mm512_set1_epi32(32);
    auto step = [&](int v, __m512 m) {
      j[v] = _mm512_add_epi32(j[v], j[v]);
      j[v] = _mm512_mask_add_epi32(j[v], _mm512_cmp_ps_mask(s[v], m, _CMP_NLE_UQ), j[v], one);
    };
    for (int v = 0; v < N; ++v) j[v] = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(s[v], l0, _CMP_NLE_UQ), one);
    for (int v = 0; v < N; ++v) step(v, _mm512_permutexvar_ps(j[v], l1));
    for (int v = 0; v < N; ++v) step(v, _mm512_permutexvar_ps(j[v], l2));
    for (int v = 0; v < N; ++v) step(v, _mm512_permutexvar_ps(j[v], l3));
    for (int v = 0; v < N; ++v) step(v, _mm512_permutexvar_ps(j[v], l4));
    for (int v = 0; v < N; ++v) step(v, _mm512_permutex2var_ps(l5[0], j[v], l5[1]));
    for (int v = 0; v < N; ++v) {
      __mmask16 hi = _mm512_test_epi32_mask(j[v], b5);
      __m512 ma = lookup64(a, j[v], hi), mb = lookup64(b, j[v], hi), mc = lookup64(c, j[v], hi);
      __mmask16 up = _mm512_cmp_ps_mask(s[v], mb, _CMP_NLE_UQ);
      __mmask16 up2 = _mm512_cmp_ps_mask(s[v], _mm512_mask_blend_ps(up, ma, mc), _CMP_NLE_UQ);
      j[v] = _mm512_slli_epi32(j[v], 2);
      j[v] = _mm512_mask_add_epi32(j[v], up, j[v], two);
      j[v] = _mm512_mask_add_epi32(j[v], up2, j[v], one);
    }
  }
};
#elif defined(BNB_ISA_AVX2)
// Steps 0-3 look up with vpermps (8 entries), step 4 blends two of them, steps 5-7 gather from L1.
struct Search {
  const Tables& t;
  __m256 l0, l1, l2, l3, l4[2];
  explicit Search(const Tables& tables) : t(tables) {
    l0 = _mm256_set1_ps(t.l0[0]);
    l1 = _mm256_load_ps(t.l1);
    l2 = _mm256_load_ps(t.l2);
    l3 = _mm256_load_ps(t.l3);
    l4[0] = _mm256_load_ps(t.l4);
    l4[1] = _mm256_load_ps(t.l4 + 8);
  }
  static __m256i step(__m256i j, __m256 s, __m256 m) {
    __m256i up = _mm256_castps_si256(_mm256_cmp_ps(s, m, _CMP_NLE_UQ));
    return _mm256_sub_epi32(_mm256_add_epi32(j, j), up);  // up is 0 or -1
  }
  __m256i slot(__m256 s) const {
    __m256i j = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_castps_si256(_mm256_cmp_ps(s, l0, _CMP_NLE_UQ)));
    j = step(j, s, _mm256_permutevar8x32_ps(l1, j));
    j = step(j, s, _mm256_permutevar8x32_ps(l2, j));
    j = step(j, s, _mm256_permutevar8x32_ps(l3, j));
    __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(j, 28));  // bit 3 -> sign, for blendv
    j = step(j, s, _mm256_blendv_ps(_mm256_permutevar8x32_ps(l4[0], j), _mm256_permutevar8x32_ps(l4[1], j), hi));
    j = step(j, s, _mm256_i32gather_ps(t.l5, j, 4));
    j = step(j, s, _mm256_i32gather_ps(t.l6, j, 4));
    return step(j, s, _mm256_i32gather_ps(t.l7, j, 4));
  }
};
#elif defined(BNB_ISA_NEON)
// 16 searches per call, step by step. Each step's midpoints are looked up by TBL on the byte planes of
// its table (16, 32, 64 or 128 entries; TBL reads up to 64 table bytes, TBX continues past them), and
// the four planes zipped back together are the 16 midpoints. The compares are slot()'s.
struct Search {
  static constexpr int kEntries[8] = {16, 16, 16, 16, 16, 32, 64, 128};
  alignas(16) uint8_t planes[8][4][128];  // [step][byte of the float][entry]
  explicit Search(const Tables& t) {
    const float* ls[8] = {t.l0, t.l1, t.l2, t.l3, t.l4, t.l5, t.l6, t.l7};
    for (int k = 0; k < 8; ++k)
      for (int e = 0; e < kEntries[k]; ++e) {
        uint8_t b[4];
        std::memcpy(b, ls[k] + e, 4);
        for (int p = 0; p < 4; ++p) planes[k][p][e] = b[p];
      }
  }
  template <int K>
  uint8x16_t lookup(int p, uint8x16_t j) const {
    const uint8_t* t = planes[K][p];
    if constexpr (kEntries[K] == 16) {
      return vqtbl1q_u8(vld1q_u8(t), j);
    } else if constexpr (kEntries[K] == 32) {
      return vqtbl2q_u8(vld1q_u8_x2(t), j);
    } else if constexpr (kEntries[K] == 64) {
      return vqtbl4q_u8(vld1q_u8_x4(t), j);
    } else {
      return vqtbx4q_u8(vqtbl4q_u8(vld1q_u8_x4(t), j), vld1q_u8_x4(t + 64), vsubq_u8(j, vdupq_n_u8(64)));
    }
  }
  template <int K>
  uint8x16_t step(const float32x4_t* s, uint8x16_t j) const {
    const uint8x16_t b0 = lookup<K>(0, j), b1 = lookup<K>(1, j), b2 = lookup<K>(2, j), b3 = lookup<K>(3, j);
    const uint16x8_t l01 = vreinterpretq_u16_u8(vzip1q_u8(b0, b1)), h01 = vreinterpretq_u16_u8(vzip2q_u8(b0, b1));
    const uint16x8_t l23 = vreinterpretq_u16_u8(vzip1q_u8(b2, b3)), h23 = vreinterpretq_u16_u8(vzip2q_u8(b2, b3));
    const float32x4_t m[4] = {vreinterpretq_f32_u16(vzip1q_u16(l01, l23)), vreinterpretq_f32_u16(vzip2q_u16(l01, l23)),
                              vreinterpretq_f32_u16(vzip1q_u16(h01, h23)), vreinterpretq_f32_u16(vzip2q_u16(h01, h23))};
    uint32x4_t up[4];  // !(s <= m): all ones (-1 as a byte after narrowing) where the slot goes up
    for (int v = 0; v < 4; ++v) up[v] = vmvnq_u32(vcleq_f32(s[v], m[v]));
    const uint16x8_t u01 = vcombine_u16(vmovn_u32(up[0]), vmovn_u32(up[1]));
    const uint16x8_t u23 = vcombine_u16(vmovn_u32(up[2]), vmovn_u32(up[3]));
    return vsubq_u8(vaddq_u8(j, j), vcombine_u8(vmovn_u16(u01), vmovn_u16(u23)));
  }
  // Slots (value-sorted) of 16 scaled values s[0..3].
  uint8x16_t slots(const float32x4_t* s) const {
    uint8x16_t j = vdupq_n_u8(0);
    j = step<0>(s, j);
    j = step<1>(s, j);
    j = step<2>(s, j);
    j = step<3>(s, j);
    j = step<4>(s, j);
    j = step<5>(s, j);
    j = step<6>(s, j);
    return step<7>(s, j);
  }
};
#endif

}  // namespace search8
}  // namespace BNB_ISA_NS
}  // namespace bnb
