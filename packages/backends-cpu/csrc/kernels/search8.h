// The nearest-code search of the 8-bit map, shared by quantize_blockwise and the 8-bit optimizers: the key
// table of nearest_code.h (one lookup and one integer comparison) at every level. The slot of s is the
// number of the map's 255 value-sorted float32 midpoints below s; NaN takes the last slot (255), as the
// reference does. Every level computes the same slots, so the codes agree bit for bit.
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

#if defined(BNB_ISA_AVX512)
// The 256 entries of an 8-bit map in 16 registers, looked up 16 codes at a time: vpermt2ps reads 32 entries
// by the low 5 index bits, bits 5-7 pick among the 8 results (8 permutes, 7 blends).
struct MapInRegisters {
  __m512 t[16];
  explicit MapInRegisters(const float* code) {
    for (int k = 0; k < 16; ++k) t[k] = _mm512_loadu_ps(code + 16 * k);
  }
  __m512 operator()(__m512i idx) const {
    const __mmask16 k5 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(32));
    const __mmask16 k6 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(64));
    const __mmask16 k7 = _mm512_test_epi32_mask(idx, _mm512_set1_epi32(128));
    __m512 r[4];
    for (int q = 0; q < 4; ++q)
      r[q] = _mm512_mask_blend_ps(k5, _mm512_permutex2var_ps(t[4 * q], idx, t[4 * q + 1]),
                                  _mm512_permutex2var_ps(t[4 * q + 2], idx, t[4 * q + 3]));
    return _mm512_mask_blend_ps(k7, _mm512_mask_blend_ps(k6, r[0], r[1]), _mm512_mask_blend_ps(k6, r[2], r[3]));
  }
  // The entries of 16 code bytes.
  __m512 codes(const uint8_t* q) const {
    return (*this)(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
  }
};

// keyed_slot for 16 values. The entry lookup is one vpgatherdd: on the Xeon measured (AVX-512, AMX) this
// beat the 8-step search through the midpoints held in registers, which the level ran before (Adam8bit step
// 4096x4096: about 0.75x its time). The arithmetic is keyed_slot's, rearranged to fewer operations (the code
// pass is most of an 8-bit optimizer step's arithmetic):
// - floor_bits is a multiple of 2^shift, so the key's "- floor_bits" moves into the table's base address;
// - |s|'s bits below the key are compared in the top bits of a lane against the whole entry, unsigned: the
//   entry's threshold sits in its top bits, and its low bits (slot, flag) only break a tie, toward "not below",
//   as keyed_slot's strict comparison does;
// - the slot is the entry's low byte (plus one), so the other bytes need no clearing before a narrowing
//   store (Clean = false).
// Signed / Checked as Keyed::slot. Checked = false also takes s unclamped: the caller's s is x times the
// reciprocal of its block's finite absmax (or x over the absmax), which never exceeds 1 in magnitude while
// the reciprocal is normal (checked over every float32 mantissa) and by at most 2 ulps when it is subnormal
// (absmax >= 2^126). Such s share the keys of -1 and 1, whose entries are built for -1 and 1 themselves
// (nearest_code_build.h caps values at one), so they get the clamped value's slot
// (test_quantize_blocks_of_extreme_absmax_match_reference).
struct Keyed16 {
  const NearestCode& map;
  const void* entries;  // map.entry - floor_bits >> shift: indexed by keys that still hold the floor
  __m512i abs_bits, floor_key, neg_keys, shift, top_shift, top_mask, byte, last;
  explicit Keyed16(const NearestCode& m)
      : map(m),
        // Integer arithmetic: the base lies before the table, and only keys at or above the floor reach it.
        entries(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(m.entry) -
                                              uintptr_t(m.floor_bits >> m.shift) * sizeof(uint32_t))),
        abs_bits(_mm512_set1_epi32(0x7fffffff)),
        floor_key(_mm512_set1_epi32(int(m.floor_bits >> m.shift))),
        neg_keys(_mm512_set1_epi32(m.keys)),
        shift(_mm512_set1_epi32(m.shift)),
        top_shift(_mm512_set1_epi32(32 - m.shift)),
        top_mask(_mm512_set1_epi32(int(~0u << (32 - m.shift)))),
        byte(_mm512_set1_epi32(0xff)),
        last(_mm512_set1_epi32(255)) {}
  template <bool Signed = true, bool Checked = true, bool Clean = true>
  __m512i slot(__m512 s) const {
    const __m512i bits = _mm512_castps_si512(s);
    const __mmask16 ok = Checked ? _mm512_cmp_ps_mask(s, s, _CMP_ORD_Q) : __mmask16(0xffff);
    __m512i key =
        _mm512_max_epu32(_mm512_srlv_epi32(Signed ? _mm512_and_si512(bits, abs_bits) : bits, shift), floor_key);
    __m512i low = _mm512_sllv_epi32(bits, top_shift);
    if constexpr (Signed) {
      const __mmask16 neg = _mm512_movepi32_mask(bits);
      key = _mm512_mask_add_epi32(key, neg, key, neg_keys);
      low = _mm512_mask_xor_epi32(low, neg, low, top_mask);
    }
    if constexpr (Checked) key = _mm512_mask_mov_epi32(floor_key, ok, key);  // NaN: any valid key
    const __m512i e = _mm512_i32gather_epi32(key, entries, 4);
    __m512i j = _mm512_mask_add_epi32(e, _mm512_cmpgt_epu32_mask(low, e), e, _mm512_set1_epi32(1));
    if (Clean || map.flagged) j = _mm512_and_si512(j, byte);
    if (map.flagged) {
      __mmask16 more = ok & _mm512_test_epi32_mask(e, _mm512_set1_epi32(0x100));
      for (int k = 0; more && k < map.width; ++k) {
        const __m512 mid = _mm512_mask_i32gather_ps(s, more, j, map.mids, 4);
        more &= _mm512_cmp_ps_mask(mid, s, _CMP_LT_OQ);
        j = _mm512_mask_add_epi32(j, more, j, _mm512_set1_epi32(1));
      }
    }
    if constexpr (Checked) j = _mm512_mask_mov_epi32(last, ok, j);
    return j;
  }
};

#endif

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
