// The nearest-code search of the 8-bit map, shared by quantize_blockwise and the 8-bit optimizers: the key
// table of nearest_code.h (one lookup and one integer comparison; the scalar and AVX2 levels) and a
// search through the midpoints (AVX-512 keeps them all in registers, where a gather would cost more).
//
// Search:
// The slot of s is the number of the map's 255 value-sorted float32 midpoints below s. The branchless
// binary search keeps the slot's top bits j found so far; step k (0..7) compares s with
// level[k][j] = mids[j * (256 >> k) + (128 >> k) - 1], then j = 2 j + (that midpoint < s).
// `!(s <= m)` is `m < s` for numbers and true for NaN, so NaN takes the last slot (255), as the
// reference does. Every ISA level runs exactly these compares, so the codes agree bit for bit.
#pragma once

#include "common.h"
#include "kernels/nearest_code.h"

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
#endif

// Value-sorted slot of a scaled value s in [-1, 1] (or NaN) by the key table: the number of midpoints below s.
inline int keyed_slot(const NearestCode& map, float s) {
  if (s != s) return 255;
  uint32_t bits = float_to_bits(s), abs = bits & 0x7fffffffu;
  uint32_t low_mask = (1u << map.shift) - 1, flip = (bits >> 31) ? low_mask : 0u;
  uint32_t key = ((abs > map.floor_bits ? abs : map.floor_bits) - map.floor_bits) >> map.shift;
  uint32_t e = map.entry[key + (flip ? map.keys : 0)];
  int slot = int(e & 0xffu) + ((e >> (32 - map.shift)) < ((bits & low_mask) ^ flip));
  if (e & 0x100u)
    while (map.mids[slot] < s) ++slot;  // mids[255] is +inf
  return slot;
}

#if defined(BNB_ISA_AVX2)
// Table lookups of 8 lanes by scalar loads: on Zen 3 a vpgatherdd of 8 takes about twice as long as 8
// scalar loads put together with inserts (measured: 1.3 vs 0.65 cycles per element for a 256-entry
// float table, 1.8 vs 1.2 for the key table), and the loads run beside the vector work.
inline __m256i lookup8(const uint32_t* table, __m256i idx) {
  __m128i lo = _mm256_castsi256_si128(idx), hi = _mm256_extracti128_si256(idx, 1);
  uint64_t a = uint64_t(_mm_cvtsi128_si64(lo)), b = uint64_t(_mm_extract_epi64(lo, 1));
  uint64_t c = uint64_t(_mm_cvtsi128_si64(hi)), d = uint64_t(_mm_extract_epi64(hi, 1));
  __m128i x =
      _mm_setr_epi32(int(table[uint32_t(a)]), int(table[a >> 32]), int(table[uint32_t(b)]), int(table[b >> 32]));
  __m128i y =
      _mm_setr_epi32(int(table[uint32_t(c)]), int(table[c >> 32]), int(table[uint32_t(d)]), int(table[d >> 32]));
  return _mm256_set_m128i(y, x);
}

// table[q[0..8)] for a 256-entry table and 8 code bytes.
inline __m256 lookup8_codes(const float* table, const uint8_t* q) {
  uint64_t w;
  std::memcpy(&w, q, 8);
  __m128 x = _mm_setr_ps(table[w & 255], table[(w >> 8) & 255], table[(w >> 16) & 255], table[(w >> 24) & 255]);
  __m128 y = _mm_setr_ps(table[(w >> 32) & 255], table[(w >> 40) & 255], table[(w >> 48) & 255], table[w >> 56]);
  return _mm256_set_m128(y, x);
}

// keyed_slot for 8 values.
struct Keyed {
  const NearestCode& map;
  __m256i abs_bits, floor, neg_keys, low_mask, flag, byte, last;
  __m128i shift, threshold_shift;
  explicit Keyed(const NearestCode& m)
      : map(m),
        abs_bits(_mm256_set1_epi32(0x7fffffff)),
        floor(_mm256_set1_epi32(int(m.floor_bits))),
        neg_keys(_mm256_set1_epi32(m.keys)),
        low_mask(_mm256_set1_epi32((1 << m.shift) - 1)),
        flag(_mm256_set1_epi32(0x100)),
        byte(_mm256_set1_epi32(0xff)),
        last(_mm256_set1_epi32(255)),
        shift(_mm_cvtsi32_si128(m.shift)),
        threshold_shift(_mm_cvtsi32_si128(32 - m.shift)) {}
  // Signed: some s may carry the sign bit (negatives, -0); Checked: some s may be NaN. A block known to
  // hold neither (finite absmax, no sign bit: Adam's second moment) skips their handling.
  template <bool Signed = true, bool Checked = true>
  __m256i slot(__m256 s) const {
    __m256i bits = _mm256_castps_si256(s), ok = _mm256_set1_epi32(-1), key, low;
    if constexpr (Checked) ok = _mm256_castps_si256(_mm256_cmp_ps(s, s, _CMP_ORD_Q));
    if constexpr (Signed) {
      __m256i neg = _mm256_srai_epi32(bits, 31);
      key = _mm256_srl_epi32(_mm256_sub_epi32(_mm256_max_epu32(_mm256_and_si256(bits, abs_bits), floor), floor), shift);
      key = _mm256_add_epi32(key, _mm256_and_si256(neg, neg_keys));
      low = _mm256_xor_si256(_mm256_and_si256(bits, low_mask), _mm256_and_si256(neg, low_mask));
    } else {
      key = _mm256_srl_epi32(_mm256_sub_epi32(_mm256_max_epu32(bits, floor), floor), shift);
      low = _mm256_and_si256(bits, low_mask);
    }
    if constexpr (Checked) key = _mm256_and_si256(ok, key);  // NaN: any valid key
    __m256i e = lookup8(map.entry, key);
    // Both sides are below 2^23, so a signed comparison is exact; true is all ones (-1): subtracting steps.
    __m256i j = _mm256_and_si256(e, byte);
    j = _mm256_sub_epi32(j, _mm256_cmpgt_epi32(low, _mm256_srl_epi32(e, threshold_shift)));
    if (map.flagged) {
      __m256i more = _mm256_and_si256(ok, _mm256_cmpeq_epi32(_mm256_and_si256(e, flag), flag));
      for (int k = 0; !_mm256_testz_si256(more, more) && k < map.width; ++k) {
        __m256 mid = _mm256_mask_i32gather_ps(s, map.mids, j, _mm256_castsi256_ps(more), 4);
        more = _mm256_and_si256(more, _mm256_castps_si256(_mm256_cmp_ps(mid, s, _CMP_LT_OQ)));
        j = _mm256_sub_epi32(j, more);
      }
    }
    if constexpr (Checked) j = _mm256_blendv_epi8(last, j, ok);
    return j;
  }
};
#elif defined(BNB_ISA_NEON)
// keyed_slot for 4 values: the key arithmetic and the entry compare in vectors, the entry loads by lane
// (no gathers), flagged keys stepped on by lane exactly as keyed_slot does.
struct Keyed {
  const NearestCode& map;
  uint32x4_t floor, keys, low_mask;
  int32x4_t down, down_thr;
  explicit Keyed(const NearestCode& m)
      : map(m),
        floor(vdupq_n_u32(m.floor_bits)),
        keys(vdupq_n_u32(uint32_t(m.keys))),
        low_mask(vdupq_n_u32((1u << m.shift) - 1)),
        down(vdupq_n_s32(-m.shift)),
        down_thr(vdupq_n_s32(m.shift - 32)) {}
  uint32x4_t slot(float32x4_t s) const {
    const uint32x4_t ok = vceqq_f32(s, s);
    const uint32x4_t bits = vreinterpretq_u32_f32(s);
    const uint32x4_t flip = vandq_u32(vreinterpretq_u32_s32(vshrq_n_s32(vreinterpretq_s32_u32(bits), 31)), low_mask);
    uint32x4_t key = vshlq_u32(vsubq_u32(vmaxq_u32(vandq_u32(bits, vdupq_n_u32(0x7fffffffu)), floor), floor), down);
    key = vandq_u32(ok, vaddq_u32(key, vandq_u32(vtstq_u32(flip, flip), keys)));  // NaN: any valid key
    alignas(16) uint32_t k4[4], e4[4];
    vst1q_u32(k4, key);
    for (int l = 0; l < 4; ++l) e4[l] = map.entry[k4[l]];
    const uint32x4_t e = vld1q_u32(e4);
    const uint32x4_t low = veorq_u32(vandq_u32(bits, low_mask), flip);
    // True (all ones, -1) where the key's one midpoint lies below s: one slot up.
    uint32x4_t j = vsubq_u32(vandq_u32(e, vdupq_n_u32(0xffu)), vcltq_u32(vshlq_u32(e, down_thr), low));
    j = vbslq_u32(ok, j, vdupq_n_u32(255));
    if (map.flagged && vmaxvq_u32(vandq_u32(ok, vandq_u32(e, vdupq_n_u32(0x100u))))) {
      alignas(16) uint32_t j4[4];
      alignas(16) float s4[4];
      vst1q_u32(j4, j);
      vst1q_f32(s4, s);
      for (int l = 0; l < 4; ++l)
        if ((e4[l] & 0x100u) && s4[l] == s4[l])
          while (map.mids[j4[l]] < s4[l]) ++j4[l];  // mids[255] is +inf
      j = vld1q_u32(j4);
    }
    return j;
  }
};

// 16 slots (4 x 4 lanes, each <= 255) narrowed to bytes.
inline uint8x16_t narrow_slots(const uint32x4_t* j) {
  const uint16x8_t lo = vcombine_u16(vmovn_u32(j[0]), vmovn_u32(j[1]));
  const uint16x8_t hi = vcombine_u16(vmovn_u32(j[2]), vmovn_u32(j[3]));
  return vcombine_u8(vmovn_u16(lo), vmovn_u16(hi));
}
#endif

}  // namespace search8
}  // namespace BNB_ISA_NS
}  // namespace bnb
