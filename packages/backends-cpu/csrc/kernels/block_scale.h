// Block scaling shared by the 8-bit and 4-bit quantizers (compiled into each ISA's translation units).
// Mirrors block_absmax_and_scale in bitsandbytes/_reference/blockwise.py operation for operation, so
// codes are bit-identical to the reference at every ISA level; plus the SIMD loads/stores of the
// three float formats the quantizers share.
#pragma once

#include <bitsandbytes/formats.h>

#include "common.h"

#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
#include <immintrin.h>
#endif
#if defined(BNB_ISA_NEON)
#include "kernels/neon_simd.h"
#endif

namespace bnb {
namespace BNB_ISA_NS {

// |x| as an unsigned integer orders like |x| as a float, and every NaN sorts above inf. So the block
// absmax is an integer max of the magnitude bits (no float compares, no NaN special cases in the
// loop), then one test against the bits of inf.
template <DType D>
struct Magnitude;
template <>
struct Magnitude<DType::f32> {
  using U = uint32_t;
  static constexpr U mask = 0x7fffffffu, inf = 0x7f800000u;
  static float to_float(U u) { return bits_to_float(u); }
};
template <>
struct Magnitude<DType::f16> {
  using U = uint16_t;
  static constexpr U mask = 0x7fffu, inf = 0x7c00u;
  static float to_float(U u) { return f16_to_float(u); }
};
template <>
struct Magnitude<DType::bf16> {
  using U = uint16_t;
  static constexpr U mask = 0x7fffu, inf = 0x7f80u;
  static float to_float(U u) { return bf16_to_float(u); }
};

// Largest magnitude bits of x[0, len) (len may be 0), as Magnitude<D>::U widened to uint32_t.
template <DType D>
inline uint32_t magnitude_max_scalar(const typename Elem<D>::T* x, int64_t len) {
  using M = Magnitude<D>;
  typename M::U m = 0;
  for (int64_t i = 0; i < len; ++i) {
    typename M::U u;
    std::memcpy(&u, x + i, sizeof u);
    u &= M::mask;
    m = u > m ? u : m;
  }
  return m;
}

template <DType D>
inline uint32_t magnitude_max(const typename Elem<D>::T* x, int64_t len) {
#if defined(BNB_ISA_AVX512)
  if constexpr (D == DType::f32) {
    const __m512i mask = _mm512_set1_epi32(int(0x7fffffff));
    __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 64 <= len; i += 64) {
      m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
      m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 16), mask));
      m2 = _mm512_max_epu32(m2, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), mask));
      m3 = _mm512_max_epu32(m3, _mm512_and_si512(_mm512_loadu_si512(x + i + 48), mask));
    }
    for (; i + 16 <= len; i += 16) m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
    if (i < len) {
      __mmask16 k = __mmask16((1u << (len - i)) - 1u);
      m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + i), mask));
    }
    return uint32_t(_mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3))));
  } else {
    const __m512i mask = _mm512_set1_epi16(0x7fff);
    __m512i m0 = _mm512_setzero_si512(), m1 = m0;
    int64_t i = 0;
    for (; i + 64 <= len; i += 64) {
      m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
      m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_loadu_si512(x + i + 32), mask));
    }
    for (; i + 32 <= len; i += 32) m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_loadu_si512(x + i), mask));
    if (i < len) {
      __mmask32 k = __mmask32((uint64_t(1) << (len - i)) - 1u);
      m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_maskz_loadu_epi16(k, x + i), mask));
    }
    m0 = _mm512_max_epu16(m0, m1);
    __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(m0));
    __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(m0, 1));
    return uint32_t(_mm512_reduce_max_epu32(_mm512_max_epu32(lo, hi)));
  }
#elif defined(BNB_ISA_AVX2)
  uint32_t lanes[8];
  int64_t i = 0;
  if constexpr (D == DType::f32) {
    const __m256i mask = _mm256_set1_epi32(int(0x7fffffff));
    __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
    for (; i + 32 <= len; i += 32) {
      auto p = reinterpret_cast<const __m256i*>(x + i);
      m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(p), mask));
      m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(p + 1), mask));
      m2 = _mm256_max_epu32(m2, _mm256_and_si256(_mm256_loadu_si256(p + 2), mask));
      m3 = _mm256_max_epu32(m3, _mm256_and_si256(_mm256_loadu_si256(p + 3), mask));
    }
    m0 = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), m0);
  } else {
    const __m256i mask = _mm256_set1_epi16(0x7fff);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0;
    for (; i + 32 <= len; i += 32) {
      auto p = reinterpret_cast<const __m256i*>(x + i);
      m0 = _mm256_max_epu16(m0, _mm256_and_si256(_mm256_loadu_si256(p), mask));
      m1 = _mm256_max_epu16(m1, _mm256_and_si256(_mm256_loadu_si256(p + 1), mask));
    }
    m0 = _mm256_max_epu16(m0, m1);
    // Widen the 16 halves to 8 x 32 bits: the max of each pair (lo and hi half of a lane).
    m0 = _mm256_max_epu32(_mm256_and_si256(m0, _mm256_set1_epi32(0xffff)), _mm256_srli_epi32(m0, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), m0);
  }
  uint32_t m = magnitude_max_scalar<D>(x + i, len - i);
  for (uint32_t v : lanes) m = v > m ? v : m;
  return m;
#elif defined(BNB_ISA_NEON)
  int64_t i = 0;
  uint32_t m;
  if constexpr (D == DType::f32) {
    const uint32x4_t mask = vdupq_n_u32(0x7fffffffu);
    const uint32_t* u = reinterpret_cast<const uint32_t*>(x);
    uint32x4_t m0 = vdupq_n_u32(0), m1 = m0, m2 = m0, m3 = m0;
    for (; i + 16 <= len; i += 16) {
      m0 = vmaxq_u32(m0, vandq_u32(vld1q_u32(u + i), mask));
      m1 = vmaxq_u32(m1, vandq_u32(vld1q_u32(u + i + 4), mask));
      m2 = vmaxq_u32(m2, vandq_u32(vld1q_u32(u + i + 8), mask));
      m3 = vmaxq_u32(m3, vandq_u32(vld1q_u32(u + i + 12), mask));
    }
    m = neon_simd::max_u32(vmaxq_u32(vmaxq_u32(m0, m1), vmaxq_u32(m2, m3)));
  } else {
    const uint16x8_t mask = vdupq_n_u16(0x7fff);
    const uint16_t* u = reinterpret_cast<const uint16_t*>(x);
    uint16x8_t m0 = vdupq_n_u16(0), m1 = m0;
    for (; i + 16 <= len; i += 16) {
      m0 = vmaxq_u16(m0, vandq_u16(vld1q_u16(u + i), mask));
      m1 = vmaxq_u16(m1, vandq_u16(vld1q_u16(u + i + 8), mask));
    }
    m = neon_simd::max_u16(vmaxq_u16(m0, m1));
  }
  uint32_t t = magnitude_max_scalar<D>(x + i, len - i);
  return t > m ? t : m;
#else
  return magnitude_max_scalar<D>(x, len);
#endif
}

// Largest |x| of a block, NaN if the block holds a NaN (like torch.amax), in float32.
template <DType D>
inline float block_absmax(const typename Elem<D>::T* x, int64_t len) {
  using M = Magnitude<D>;
  uint32_t m = magnitude_max<D>(x, len);
  return m > M::inf ? NAN : M::to_float(typename M::U(m));
}

#if defined(BNB_ISA_AVX512)
// absmax and the full-block factor 1 / clamped absmax of 16 consecutive blocks at once, for small
// blocks of whole 64-byte vectors: one horizontal max per block costs more than the block's own
// maxima, so the 16 per-block vectors are reduced together by a transpose tree. Same integer maxima
// and the same float division as block_absmax + BlockScaler, so the same bits.
template <DType D>
inline void absmax16(const typename Elem<D>::T* x, int64_t blocksize, float* absmax, float* fac) {
  using M = Magnitude<D>;
  constexpr int64_t kVec = 64 / int64_t(sizeof(typename Elem<D>::T));
  const __m512i mask = D == DType::f32 ? _mm512_set1_epi32(int(0x7fffffff)) : _mm512_set1_epi16(0x7fff);
  __m512i r[16];
  for (int b = 0; b < 16; ++b) {
    const typename Elem<D>::T* p = x + b * blocksize;
    __m512i m = _mm512_and_si512(_mm512_loadu_si512(p), mask);
    for (int64_t i = kVec; i < blocksize; i += kVec) {
      __m512i u = _mm512_and_si512(_mm512_loadu_si512(p + i), mask);
      m = D == DType::f32 ? _mm512_max_epu32(m, u) : _mm512_max_epu16(m, u);
    }
    if (D != DType::f32)  // the two halves of each dword
      m = _mm512_max_epu32(_mm512_and_si512(m, _mm512_set1_epi32(0xffff)), _mm512_srli_epi32(m, 16));
    r[b] = m;
  }
  // Transpose tree: after it, element i holds the max of r[i].
  __m512i t[8], u[4], w[2];
  for (int p = 0; p < 8; ++p)
    t[p] =
        _mm512_max_epu32(_mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]), _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]));
  for (int p = 0; p < 4; ++p)
    u[p] =
        _mm512_max_epu32(_mm512_unpacklo_epi64(t[2 * p], t[2 * p + 1]), _mm512_unpackhi_epi64(t[2 * p], t[2 * p + 1]));
  for (int p = 0; p < 2; ++p)
    w[p] = _mm512_max_epu32(_mm512_shuffle_i32x4(u[2 * p], u[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(u[2 * p], u[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  __m512i z = _mm512_max_epu32(_mm512_shuffle_i32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_i32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  __m512 m;
  if constexpr (D == DType::f32)
    m = _mm512_castsi512_ps(z);
  else if constexpr (D == DType::f16)
    m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(z));
  else
    m = _mm512_castsi512_ps(_mm512_slli_epi32(z, 16));
  // Any NaN block -> the same NaN block_absmax returns.
  m = _mm512_mask_mov_ps(m, _mm512_cmpgt_epu32_mask(z, _mm512_set1_epi32(int(M::inf))), _mm512_set1_ps(NAN));
  _mm512_storeu_ps(absmax, m);
  __m512 clamped = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(m, _mm512_set1_ps(BNB_MIN_SCALE), _CMP_LT_OQ),
                                      _mm512_set1_ps(BNB_MIN_SCALE));
  _mm512_storeu_ps(fac, _mm512_div_ps(_mm512_set1_ps(1.0f), clamped));
}
#endif

// Maps a value into [-1, 1] the way the reference does: a full block multiplies by the reciprocal of
// its clamped absmax, the short last block divides by it (upstream does both; they can differ in the
// last bit). NaN stays NaN.
struct BlockScaler {
  float clamped, inv;
  bool full;
  BlockScaler(float absmax, bool full_block)
      : clamped(absmax != absmax ? absmax : (absmax < BNB_MIN_SCALE ? BNB_MIN_SCALE : absmax)),
        inv(1.0f / clamped),
        full(full_block) {}
  // Before the clamp: enough where every midpoint lies strictly inside (-1, 1) (the 4-bit tables).
  float unclamped(float x) const { return full ? x * inv : x / clamped; }
  float operator()(float x) const {
    float s = unclamped(x);
    return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
  }
};

// The scaled value of x given its block's factor f (BlockScaler: the reciprocal of the clamped
// absmax for a full block, Full = true; the clamped absmax for the short last block), clamped.
template <bool Full>
inline float scale_value(float x, float f) {
  float s = Full ? x * f : x / f;
  return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
}

// Values per group of blocks in scale_blocks (a group's values fit in L1 between its two passes).
constexpr int64_t kGroupValues = 4096;

// Asks for the values one group ahead of x + i .. x + i + count while the current group is being
// coded, so the next absmax pass finds them in cache instead of waiting on DRAM. (Prefetches never
// fault, so running past the end of the input is harmless.)
template <class T>
inline void prefetch_next_group(const T* x, int64_t i, int64_t count) {
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
  const char* p = reinterpret_cast<const char*>(x + i + kGroupValues);
  for (int64_t b = 0; b < count * int64_t(sizeof(T)); b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
#else
  (void)x;
  (void)i;
  (void)count;
#endif
}

// Drives a blockwise quantizer over blocks [b0, b1): in groups of whole blocks (about 4096 values, so
// the second pass finds them in cache) it stores each block's absmax, then calls
//   body(std::integral_constant<bool, Full>, first, count, fac, shift)
// for the values [first, first + count), where value first + i has the factor fac[i >> shift]. Full
// blocks (Full = true) come in runs of several blocks so the body's SIMD loop can interleave many
// vectors even for small blocks; the short last block (Full = false) comes alone.
template <DType D, class Body>
void scale_blocks(const typename Elem<D>::T* A, int64_t n, int64_t blocksize, float* absmax, int64_t b0, int64_t b1,
                  Body&& body) {
  int shift = 0;
  while ((int64_t(1) << shift) < blocksize) ++shift;
  const int64_t group = blocksize >= kGroupValues ? 1 : kGroupValues / blocksize;
  const int64_t full_blocks = n / blocksize;
  float fac[kGroupValues / 32];
  for (int64_t b = b0; b < b1; b += group) {
    int64_t e = b + group < b1 ? b + group : b1, ef = e < full_blocks ? e : full_blocks;
    int64_t k = b;
#if defined(BNB_ISA_AVX512)
    if (blocksize * int64_t(sizeof(typename Elem<D>::T)) % 64 == 0 && blocksize <= 512)
      for (; k + 16 <= ef; k += 16) absmax16<D>(A + k * blocksize, blocksize, absmax + k, fac + (k - b));
#endif
    for (; k < ef; ++k) {
      float m = block_absmax<D>(A + k * blocksize, blocksize);
      absmax[k] = m;
      fac[k - b] = BlockScaler(m, true).inv;
    }
    if (ef > b) body(std::true_type{}, b * blocksize, (ef - b) * blocksize, static_cast<const float*>(fac), shift);
    if (e > ef) {
      int64_t start = ef * blocksize;
      float m = block_absmax<D>(A + start, n - start);
      absmax[ef] = m;
      float clamped = BlockScaler(m, false).clamped;
      body(std::false_type{}, start, n - start, static_cast<const float*>(&clamped), 62);
    }
  }
}

// Number of midpoints strictly below s (the value-sorted slot of the nearest code); NaN -> last slot.
inline int sorted_slot(const float* mids, int n_mids, float s) {
  if (s != s) return n_mids;
  int lo = 0, len = n_mids;
  while (len > 0) {
    int half = len / 2;
    bool below = mids[lo + half] < s;
    lo = below ? lo + half + 1 : lo;
    len = below ? len - half - 1 : half;
  }
  return lo;
}

// SIMD loads of `lanes` consecutive elements widened to float32 (exact: f16 and bf16 embed in f32),
// and stores rounding float32 to the element type exactly as Elem<D>::store does.
#if defined(BNB_ISA_AVX512)
template <DType D>
inline __m512 load16(const typename Elem<D>::T* p) {
  if constexpr (D == DType::f32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (D == DType::f16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

// 16 floats rounded to f16 / bf16 bits, exactly as float_to_f16 / float_to_bf16.
template <DType D>
inline __m256i round16(__m512 v) {
  static_assert(D != DType::f32, "16-bit formats only");
  if constexpr (D == DType::f16) {
    // vcvtps2ph rounds to nearest even, overflows to inf and quiets NaN keeping the top payload bits,
    // exactly float_to_f16 (an explicit rounding mode: MXCSR is not consulted).
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    // Round to nearest even on the bits; NaN -> (u >> 16) | 0x40. (vcvtneps2bf16 flushes subnormals,
    // so it would not match.)
    __m512i u = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r =
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    r = _mm512_srli_epi32(r, 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
  }
}

template <DType D>
inline void store16(typename Elem<D>::T* p, __m512 v) {
  if constexpr (D == DType::f32) {
    _mm512_storeu_ps(p, v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), round16<D>(v));
  }
}
#endif

#if defined(BNB_ISA_AVX2)
template <DType D>
inline __m256 load8(const typename Elem<D>::T* p) {
  if constexpr (D == DType::f32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (D == DType::f16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

template <DType D>
inline void store8(typename Elem<D>::T* p, __m256 v) {
  if constexpr (D == DType::f32) {
    _mm256_storeu_ps(p, v);
  } else if constexpr (D == DType::f16) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    __m256i u = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r =
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // Pack 8 x 32 -> 8 x 16 (values fit in 16 bits unsigned), fixing the per-lane order of packus.
    __m128i lo128 = _mm256_castsi256_si128(r), hi128 = _mm256_extracti128_si256(r, 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(lo128, hi128));
  }
}
#endif

}  // namespace BNB_ISA_NS
}  // namespace bnb
