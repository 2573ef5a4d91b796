// The branchless nearest-code search over 255 value-sorted float32 midpoints, with the midpoints held in
// AVX-512 registers (the approach of the 8-bit quantize_blockwise kernel in blockwise.cpp, in a header so
// other kernels can share it). Compiled into each ISA's translation units; the search itself is AVX-512 only.
//
// The slot of s is the number of midpoints below s. The search keeps the slot's top bits j found so far;
// step k (0..7) compares s with mids[j * (256 >> k) + (128 >> k) - 1], then j = 2 j + (that midpoint < s).
// `!(s <= m)` is `m < s` for numbers and true for NaN, so NaN takes the last slot (255).
#pragma once

#include "common.h"

#if defined(BNB_ISA_AVX512)
#include <immintrin.h>
#endif

namespace bnb {
namespace BNB_ISA_NS {
namespace search8 {

// The midpoints rearranged by search step. Steps 6 and 7 go together: with j the 64 slot groups found by
// steps 0-5, step 6 compares with b[j] = mids[4j + 1] and step 7 with a[j] = mids[4j] or c[j] = mids[4j + 2].
struct Tables {
  alignas(64) float l0[16], l1[16], l2[16], l3[16], l4[16], l5[32], a[64], b[64], c[64];
  explicit Tables(const float* mids) {
    float* ls[6] = {l0, l1, l2, l3, l4, l5};
    for (int k = 0; k < 6; ++k) {
      int width = 256 >> k, n = 1 << k;
      for (int j = 0; j < (n < 16 ? 16 : n); ++j) ls[k][j] = mids[(j < n ? j : 0) * width + width / 2 - 1];
    }
    for (int j = 0; j < 64; ++j) {
      a[j] = mids[4 * j];
      b[j] = mids[4 * j + 1];
      c[j] = mids[4 * j + 2];
    }
  }
};

#if defined(BNB_ISA_AVX512)
// Steps 0-4 look up with vpermps (16 entries), step 5 with vpermt2ps (32), steps 6-7 with three 64-entry
// lookups (two vpermt2ps and a blend each) that do not wait for step 6's outcome, shortening the chain.
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
      a[i] = _mm512_load_ps(t.a + 16 * i);
      b[i] = _mm512_load_ps(t.b + 16 * i);
      c[i] = _mm512_load_ps(t.c + 16 * i);
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
#endif

}  // namespace search8
}  // namespace BNB_ISA_NS
}  // namespace bnb
