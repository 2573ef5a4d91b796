#include "kernels/fourbit.h"

#include "kernels/block_scale.h"

namespace bnb {
namespace BNB_ISA_NS {

namespace {

// The constants of one 4-bit format (bitsandbytes/formats.h).
struct Format4 {
  const float* table;    // value of each code
  const float* mids;     // the 15 midpoints of the value-sorted table
  const uint8_t* order;  // code of each value-sorted slot
  uint8_t pad;           // code of the padding value (odd element counts)
};

inline Format4 format4(QuantType qt) {
  if (qt == QuantType::fp4) return {BNB_FP4_TABLE, BNB_FP4_MIDPOINTS, BNB_FP4_ORDER, uint8_t(BNB_FP4_PAD_CODE)};
  return {BNB_NF4_TABLE, BNB_NF4_MIDPOINTS, BNB_NF4_ORDER, uint8_t(BNB_NF4_PAD_CODE)};
}

// Slot of s among the 15 sorted midpoints (how many are < s): a branchless 4-step binary search.
// `!(s <= m)` is `m < s` for numbers and true for NaN, so NaN lands in the last slot, like the
// reference. The SIMD paths below run the same search with the same comparisons. No clamp is needed:
// every midpoint lies strictly inside (-1, 1), so clamping s to [-1, 1] never changes its slot.
inline int slot4(const float* mids, float s) {
  int lo = !(s <= mids[7]) ? 8 : 0;
  lo += !(s <= mids[lo + 3]) ? 4 : 0;
  lo += !(s <= mids[lo + 1]) ? 2 : 0;
  lo += !(s <= mids[lo]) ? 1 : 0;
  return lo;
}

// Midpoint queried at the search step of width h when the slot so far is i (i + h - 1 <= 14 whenever
// the search can reach it; other entries are padding).
inline float step_mid(const float* mids, int i, int h) { return mids[i + h - 1 < 15 ? i + h - 1 : 14]; }

#if defined(BNB_ISA_AVX512)
// 16 lanes: each step looks its midpoint up with one vpermps (it reads only the low 4 index bits).
//
// Where no two midpoints lie close together (NF4), a faster route replaces the search: the scaled
// value s in [-1, 1] falls in one of 32 equal buckets, b = trunc(s * K + K), and each bucket (widened
// by far more than the rounding error of that product) holds at most one midpoint. So the slot is
// lo[b] + (s > mid[b]): one lookup pair and one compare instead of four dependent steps. The answer
// is still the exact count of midpoints below s whatever b's rounding, hence bit-identical to the
// search. It needs |s| <= 1 + a few ulps (true when the block's factor is finite and nonzero: every
// |x| <= absmax) and no NaN (a NaN in a block makes its absmax and so its factor NaN); blocks that
// fail take the search.
struct Buckets4 {
  static constexpr float K = 15.99f;  // (1 + 2 ulp) * K + K < 32, so b <= 31 even past 1
  bool usable = true;
  alignas(64) float mid[32];
  alignas(64) int32_t lo[32];
  explicit Buckets4(const float* mids) {
    const double eps = 1e-5;  // >> the error of one float FMA near 32, scaled back by 1 / K
    for (int b = 0; b < 32; ++b) {
      double l = b / double(K) - 1 - eps, h = (b + 1) / double(K) - 1 + eps;
      int below = 0, inside = 0, at = 0;
      for (int i = 0; i < 15; ++i) {
        if (double(mids[i]) < l)
          ++below;
        else if (double(mids[i]) <= h)
          ++inside, at = i;
      }
      if (inside > 1) usable = false;
      // No midpoint inside: the slot is `below` for every s here; phrase it as lo + (s > mid) with
      // a midpoint every such s exceeds (or, below all midpoints, one that none does).
      if (inside == 1)
        lo[b] = at, mid[b] = mids[at];
      else if (below > 0)
        lo[b] = below - 1, mid[b] = mids[below - 1];
      else
        lo[b] = 0, mid[b] = mids[0];
    }
  }
};

struct Quant4 {
  __m512 m7, t4, t2, t1;
  __m256i order;
  bool bucketed;
  __m512 bmid[2];
  __m512i blo[2];
  explicit Quant4(const Format4& f) {
    const Buckets4 bk(f.mids);
    bucketed = bk.usable;
    for (int i = 0; i < 2; ++i) {
      bmid[i] = _mm512_load_ps(bk.mid + 16 * i);
      blo[i] = _mm512_load_si512(bk.lo + 16 * i);
    }
    alignas(64) float t[3][16];
    for (int i = 0; i < 16; ++i) {
      t[0][i] = step_mid(f.mids, i, 4);
      t[1][i] = step_mid(f.mids, i, 2);
      t[2][i] = step_mid(f.mids, i, 1);
    }
    m7 = _mm512_set1_ps(f.mids[7]);
    t4 = _mm512_load_ps(t[0]);
    t2 = _mm512_load_ps(t[1]);
    t1 = _mm512_load_ps(t[2]);
    order = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f.order)));
  }
  // The search for N vectors, step by step (interleaved, so the lookup -> compare chains overlap).
  template <int N>
  void slots(const __m512* s, __m512i* lo) const {
    const __m512 t[3] = {t4, t2, t1};
    for (int v = 0; v < N; ++v)
      lo[v] = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(s[v], m7, _CMP_NLE_UQ), _mm512_set1_epi32(8));
    for (int k = 0; k < 3; ++k)
      for (int v = 0; v < N; ++v)
        lo[v] = _mm512_mask_add_epi32(lo[v], _mm512_cmp_ps_mask(s[v], _mm512_permutexvar_ps(lo[v], t[k]), _CMP_NLE_UQ),
                                      lo[v], _mm512_set1_epi32(4 >> k));
  }
  // The bucket route for N vectors (see Buckets4); only for vectors whose factors are finite and nonzero.
  template <int N>
  void slots_bucketed(const __m512* s, __m512i* j) const {
    const __m512 k = _mm512_set1_ps(Buckets4::K);
    const __m512i one = _mm512_set1_epi32(1);
    for (int v = 0; v < N; ++v) {
      __m512i b = _mm512_cvttps_epi32(_mm512_fmadd_ps(s[v], k, k));
      __m512 m = _mm512_permutex2var_ps(bmid[0], b, bmid[1]);
      j[v] = _mm512_permutex2var_epi32(blo[0], b, blo[1]);
      j[v] = _mm512_mask_add_epi32(j[v], _mm512_cmp_ps_mask(s[v], m, _CMP_NLE_UQ), j[v], one);
    }
  }
  // Codes of 32 values (two slot vectors) -> 16 packed bytes: slots to bytes, slot -> code with one
  // vpshufb, 16 * first + second with one vpmaddubsw, and the words narrowed to bytes.
  __m128i pack32(__m512i j0, __m512i j1) const {
    __m256i slots =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(j0)), _mm512_cvtepi32_epi8(j1), 1);
    __m256i codes = _mm256_shuffle_epi8(order, slots);
    return _mm256_cvtepi16_epi8(_mm256_maddubs_epi16(codes, _mm256_set1_epi16(0x0110)));
  }
  // The same for 64 values (four slot vectors) -> 32 bytes, narrowing with packs instead.
  __m256i pack64(const __m512i* j) const {
    const __m512i fix = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i slots = _mm512_packus_epi16(_mm512_packs_epi32(j[0], j[1]), _mm512_packs_epi32(j[2], j[3]));
    slots = _mm512_permutexvar_epi32(fix, slots);
    __m512i codes = _mm512_shuffle_epi8(_mm512_broadcast_i64x4(order), slots);
    return _mm512_cvtepi16_epi8(_mm512_maddubs_epi16(codes, _mm512_set1_epi16(0x0110)));
  }
};

// N vectors of 16 values starting at x + i (i even) -> their codes at o + i / 2.
template <DType D, bool Full, int N>
inline void quantize_vectors(const typename Elem<D>::T* x, int64_t i, const float* fac, int shift, const Quant4& q,
                             uint8_t* o) {
  __m512 v[N];
  __m512i j[N];
  for (int k = 0; k < N; ++k) {
    const __m512 f = _mm512_set1_ps(fac[(i + 16 * k) >> shift]);  // blocks hold whole vectors
    v[k] = load16<D>(x + i + 16 * k);
    v[k] = Full ? _mm512_mul_ps(v[k], f) : _mm512_div_ps(v[k], f);
  }
  bool finite = q.bucketed;
  for (int k = 0; k < N; ++k) {
    float f = fac[(i + 16 * k) >> shift];
    finite &= (f - f == 0.0f) & (f != 0.0f);
  }
  if (finite)
    q.slots_bucketed<N>(v, j);
  else
    q.slots<N>(v, j);
  if constexpr (N % 4 == 0) {
    for (int k = 0; k < N; k += 4)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + (i + 16 * k) / 2), q.pack64(j + k));
  } else {
    for (int k = 0; k < N; k += 2)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + (i + 16 * k) / 2), q.pack32(j[k], j[k + 1]));
  }
}

// Codes of the first len - len % 32 values; returns how many it did.
template <DType D, bool Full>
int64_t quantize_simd(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift, const Quant4& q,
                      uint8_t* o) {
  int64_t i = 0;
  for (; i + 128 <= len; i += 128) {
    prefetch_next_group(x, i, 128);
    quantize_vectors<D, Full, 8>(x, i, fac, shift, q, o);
  }
  for (; i + 32 <= len; i += 32) quantize_vectors<D, Full, 2>(x, i, fac, shift, q, o);
  return i;
}
#elif defined(BNB_ISA_AVX2)
// 8 lanes: vpermps reaches 8 entries, so after the first step each lookup reads both halves of the
// step's table and blends by the first step's outcome.
struct Quant4 {
  __m256 m7, lo_t[3], hi_t[3];
  __m256i order;
  explicit Quant4(const Format4& f) {
    alignas(32) float t[16];
    for (int k = 0; k < 3; ++k) {
      for (int i = 0; i < 16; ++i) t[i] = step_mid(f.mids, i, 4 >> k);
      lo_t[k] = _mm256_load_ps(t);
      hi_t[k] = _mm256_load_ps(t + 8);
    }
    m7 = _mm256_set1_ps(f.mids[7]);
    order = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f.order)));
  }
  __m256i slot(__m256 s) const {
    __m256 upper = _mm256_cmp_ps(s, m7, _CMP_NLE_UQ);
    __m256i lo = _mm256_and_si256(_mm256_castps_si256(upper), _mm256_set1_epi32(8));
    for (int k = 0; k < 3; ++k) {
      __m256 m = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo_t[k], lo), _mm256_permutevar8x32_ps(hi_t[k], lo), upper);
      __m256i up = _mm256_castps_si256(_mm256_cmp_ps(s, m, _CMP_NLE_UQ));
      lo = _mm256_add_epi32(lo, _mm256_and_si256(up, _mm256_set1_epi32(4 >> k)));
    }
    return lo;
  }
  // 32 scaled values (4 x 8) -> 16 packed bytes.
  __m128i pack(__m256 s0, __m256 s1, __m256 s2, __m256 s3) const {
    __m256i a = _mm256_packs_epi32(slot(s0), slot(s1));  // per lane: s0 quarter, s1 quarter
    __m256i b = _mm256_packs_epi32(slot(s2), slot(s3));
    __m256i c = _mm256_packus_epi16(a, b);  // dwords: s0[0:4] s1[0:4] s2[0:4] s3[0:4] s0[4:8] ...
    c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    __m256i pairs = _mm256_maddubs_epi16(_mm256_shuffle_epi8(order, c), _mm256_set1_epi16(0x0110));
    return _mm_packus_epi16(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
  }
};

template <DType D, bool Full>
int64_t quantize_simd(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift, const Quant4& q,
                      uint8_t* o) {
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256 v[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 f = _mm256_set1_ps(fac[(i + 8 * k) >> shift]);
      v[k] = load8<D>(x + i + 8 * k);
      v[k] = Full ? _mm256_mul_ps(v[k], f) : _mm256_div_ps(v[k], f);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i / 2), q.pack(v[0], v[1], v[2], v[3]));
  }
  return i;
}
#elif defined(BNB_ISA_NEON)
// 4 lanes: the slot is counted outright, 15 compares against the broadcast midpoints (a search would
// need a float table lookup per step). `s <= m` is false for NaN, so NaN counts all 15: the last slot.
struct Quant4 {
  float32x4_t mid[15];
  uint8x16_t order;
  explicit Quant4(const Format4& f) {
    for (int i = 0; i < 15; ++i) mid[i] = vdupq_n_f32(f.mids[i]);
    order = vld1q_u8(f.order);
  }
  uint32x4_t slot(float32x4_t s) const {
    uint32x4_t le = vcleq_f32(s, mid[0]);  // all ones (-1) per midpoint at or above s
    for (int i = 1; i < 15; ++i) le = vaddq_u32(le, vcleq_f32(s, mid[i]));
    return vaddq_u32(le, vdupq_n_u32(15));
  }
};

template <DType D, bool Full>
int64_t quantize_simd(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift, const Quant4& q,
                      uint8_t* o) {
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    uint32x4_t j[4];
    for (int k = 0; k < 4; ++k) {
      const float32x4_t f = vdupq_n_f32(fac[(i + 4 * k) >> shift]);  // blocks hold whole vectors
      const float32x4_t v = neon_simd::load4<D>(x + i + 4 * k);
      j[k] = q.slot(Full ? vmulq_f32(v, f) : vdivq_f32(v, f));
    }
    const uint16x8_t lo = vcombine_u16(vmovn_u32(j[0]), vmovn_u32(j[1]));
    const uint16x8_t hi = vcombine_u16(vmovn_u32(j[2]), vmovn_u32(j[3]));
    const uint8x16_t codes = vqtbl1q_u8(q.order, vcombine_u8(vmovn_u16(lo), vmovn_u16(hi)));
    vst1_u8(o + i / 2, neon_simd::pack_nibbles(codes));
  }
  return i;
}
#endif

template <DType D>
void quantize_blocks(const typename Elem<D>::T* A, int64_t n, const Format4& f, int64_t blocksize, uint8_t* out,
                     float* absmax, int64_t b0, int64_t b1) {
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
  const Quant4 q(f);
#endif
#if defined(BNB_ISA_NEON)
  const Quant4 q(f);
#endif
  // Runs start on block boundaries (even), so on byte boundaries too.
  auto body = [&](auto full, int64_t first, int64_t len, const float* fac, int shift) {
    constexpr bool Full = decltype(full)::value;
    const typename Elem<D>::T* x = A + first;
    uint8_t* o = out + first / 2;
    int64_t i = 0;
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
    i = quantize_simd<D, Full>(x, len, fac, shift, q, o);
#endif
#if defined(BNB_ISA_NEON)
    i = quantize_simd<D, Full>(x, len, fac, shift, q, o);
#endif
    // No clamp: it never changes the slot (see slot4).
    auto code = [&](int64_t k) {
      float v = Elem<D>::load(x[k]), fk = fac[k >> shift];
      return f.order[slot4(f.mids, Full ? v * fk : v / fk)];
    };
    // Eight searches interleaved step by step (one alone is a chain of dependent loads and compares).
    for (; i + 8 <= len; i += 8) {
      float sv[8];
      int lo[8];
      for (int v = 0; v < 8; ++v) {
        float xv = Elem<D>::load(x[i + v]), fk = fac[(i + v) >> shift];
        sv[v] = Full ? xv * fk : xv / fk;
      }
      for (int v = 0; v < 8; ++v) lo[v] = !(sv[v] <= f.mids[7]) ? 8 : 0;
      for (int v = 0; v < 8; ++v) lo[v] += !(sv[v] <= f.mids[lo[v] + 3]) ? 4 : 0;
      for (int v = 0; v < 8; ++v) lo[v] += !(sv[v] <= f.mids[lo[v] + 1]) ? 2 : 0;
      for (int v = 0; v < 8; ++v) lo[v] += !(sv[v] <= f.mids[lo[v]]) ? 1 : 0;
      for (int v = 0; v < 8; v += 2) o[(i + v) / 2] = uint8_t(f.order[lo[v]] << 4 | f.order[lo[v + 1]]);
    }
    for (; i + 1 < len; i += 2) o[i / 2] = uint8_t(code(i) << 4 | code(i + 1));
    if (i < len) o[i / 2] = uint8_t(code(i) << 4 | f.pad);  // odd n: the missing value is the pad
  };
  scale_blocks<D>(A, n, blocksize, absmax, b0, b1, body);
}

// Dequantizes one block of len values (starting on a byte boundary) from its table of 16 scaled
// values st (table[code] * absmax, rounded to the output type: the same float32 product the
// reference computes, so the bits are identical).
// Stream: o + i is aligned to the vector width (64 bytes with AVX-512, 32 with AVX2) at every
// multiple i of 32 (the caller checked), and the stores bypass the cache (see dequantize_4bit).
template <DType D, bool Stream>
void dequantize_block(const uint8_t* in, int64_t len, const float* table, float scale, typename Elem<D>::T* o) {
  using T = typename Elem<D>::T;
  alignas(64) T st[16];
  int64_t i = 0;
#if defined(BNB_ISA_AVX512)
  __m512 stf = _mm512_mul_ps(_mm512_loadu_ps(table), _mm512_set1_ps(scale));
  store16<D>(st, stf);
  if constexpr (D == DType::f32) {
    const __m256i c15 = _mm256_set1_epi16(15);
    for (; i + 32 <= len; i += 32) {
      __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i / 2)));
      // Bytes hi0 lo0 hi1 lo1 ...: one code per byte, in output order.
      __m256i nib = _mm256_or_si256(_mm256_srli_epi16(w, 4), _mm256_slli_epi16(_mm256_and_si256(w, c15), 8));
      __m512 lo = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(nib)), stf);
      __m512 hi = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(nib, 1)), stf);
      if constexpr (Stream) {
        _mm512_stream_ps(o + i, lo);
        _mm512_stream_ps(o + i + 16, hi);
      } else {
        _mm512_storeu_ps(o + i, lo);
        _mm512_storeu_ps(o + i + 16, hi);
      }
    }
  } else {
    // 32 x 16-bit table (the 16 entries twice: vpermw reads 5 index bits).
    const __m512i st16 = _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(st)));
    const __m512i c15 = _mm512_set1_epi32(15);
    for (; i + 32 <= len; i += 32) {
      __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i / 2)));
      // Each dword: high nibble in its low word, low nibble in its high word (output order).
      __m512i idx = _mm512_or_si512(_mm512_srli_epi32(d, 4), _mm512_slli_epi32(_mm512_and_si512(d, c15), 16));
      __m512i r = _mm512_permutexvar_epi16(idx, st16);
      if constexpr (Stream)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(o + i), r);
      else
        _mm512_storeu_si512(o + i, r);
    }
  }
#elif defined(BNB_ISA_AVX2)
  const __m256 s = _mm256_set1_ps(scale);
  __m256 st_lo = _mm256_mul_ps(_mm256_loadu_ps(table), s), st_hi = _mm256_mul_ps(_mm256_loadu_ps(table + 8), s);
  store8<D>(st, st_lo);
  store8<D>(st + 8, st_hi);
  const __m256i c15 = _mm256_set1_epi16(15);
  auto nibbles = [&](int64_t at) {
    __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + at / 2)));
    return _mm256_or_si256(_mm256_srli_epi16(w, 4), _mm256_slli_epi16(_mm256_and_si256(w, c15), 8));
  };
  if constexpr (D == DType::f32) {
    for (; i + 32 <= len; i += 32) {
      __m256i nib = nibbles(i);
      __m128i halves[2] = {_mm256_castsi256_si128(nib), _mm256_extracti128_si256(nib, 1)};
      for (int k = 0; k < 4; ++k) {
        __m128i h = halves[k / 2];
        __m256i idx = _mm256_cvtepu8_epi32(k % 2 ? _mm_srli_si128(h, 8) : h);
        __m256 lo = _mm256_permutevar8x32_ps(st_lo, idx), hi = _mm256_permutevar8x32_ps(st_hi, idx);
        // Bit 3 of the code picks the half: move it to the sign bit for blendv.
        __m256 r = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
        if constexpr (Stream)
          _mm256_stream_ps(o + i + 8 * k, r);
        else
          _mm256_storeu_ps(o + i + 8 * k, r);
      }
    }
  } else {
    // vpshufb on two 16-entry byte tables: the low and the high bytes of the 16-bit values.
    __m256i words = _mm256_load_si256(reinterpret_cast<const __m256i*>(st));
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,  //
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    words = _mm256_shuffle_epi8(words, split);  // per lane: 8 low bytes, 8 high bytes
    __m128i w0 = _mm256_castsi256_si128(words), w1 = _mm256_extracti128_si256(words, 1);
    const __m256i t_lo = _mm256_broadcastsi128_si256(_mm_unpacklo_epi64(w0, w1));
    const __m256i t_hi = _mm256_broadcastsi128_si256(_mm_unpackhi_epi64(w0, w1));
    for (; i + 32 <= len; i += 32) {
      __m256i nib = nibbles(i);
      __m256i lo = _mm256_shuffle_epi8(t_lo, nib), hi = _mm256_shuffle_epi8(t_hi, nib);
      __m256i a = _mm256_unpacklo_epi8(lo, hi);  // outputs 0-7 | 16-23
      __m256i b = _mm256_unpackhi_epi8(lo, hi);  // outputs 8-15 | 24-31
      __m256i r0 = _mm256_permute2x128_si256(a, b, 0x20), r1 = _mm256_permute2x128_si256(a, b, 0x31);
      if constexpr (Stream) {
        _mm256_stream_si256(reinterpret_cast<__m256i*>(o + i), r0);
        _mm256_stream_si256(reinterpret_cast<__m256i*>(o + i + 16), r1);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), r0);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i + 16), r1);
      }
    }
  }
#elif defined(BNB_ISA_NEON)
  // The same rounded table, looked up 16 codes per TBL on its byte planes.
  for (int c = 0; c < 16; ++c) st[c] = Elem<D>::store(table[c] * scale);
  if constexpr (D == DType::f32) {
    const neon_simd::Planes32 pl(st);
    for (; i + 32 <= len; i += 32) {
      const uint8x16x2_t c = neon_simd::unpack_nibbles(vld1q_u8(in + i / 2));
      pl.lookup_store(c.val[0], o + i);
      pl.lookup_store(c.val[1], o + i + 16);
    }
  } else {
    const neon_simd::Planes16 pl(st);
    for (; i + 32 <= len; i += 32) {
      const uint8x16x2_t c = neon_simd::unpack_nibbles(vld1q_u8(in + i / 2));
      pl.lookup_store(c.val[0], o + i);
      pl.lookup_store(c.val[1], o + i + 16);
    }
  }
#else
  for (int c = 0; c < 16; ++c) st[c] = Elem<D>::store(table[c] * scale);
#endif
  for (; i + 1 < len; i += 2) {
    uint8_t byte = in[i / 2];
    o[i] = st[byte >> 4];
    o[i + 1] = st[byte & 15];
  }
  if (i < len) o[i] = st[in[i / 2] >> 4];
}

// Outputs from this size on are written with streaming stores (the last-level cache is a few MiB per
// core on the machines this targets).
constexpr int64_t kStreamBytes = int64_t(16) << 20;

}  // namespace

void quantize_4bit(const void* A, DType dtype, int64_t n, QuantType qt, int64_t blocksize, uint8_t* out, float* absmax,
                   int threads) {
  if (n <= 0) return;
  int64_t blocks = (n + blocksize - 1) / blocksize;
  const Format4 f = format4(qt);
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* x = static_cast<const typename Elem<D>::T*>(A);
    parallel_for(blocks, (1 << 16) / blocksize + 1, threads,
                 [&](int64_t b0, int64_t b1) { quantize_blocks<D>(x, n, f, blocksize, out, absmax, b0, b1); });
  });
}

void dequantize_4bit(const uint8_t* A, const float* absmax, QuantType qt, int64_t n, int64_t blocksize, void* out,
                     DType dtype, int threads) {
  if (n <= 0) return;
  int64_t blocks = (n + blocksize - 1) / blocksize;
  const float* table = format4(qt).table;
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* y = static_cast<typename Elem<D>::T*>(out);
    auto run = [&](auto stream) {
      parallel_for(blocks, (1 << 16) / blocksize + 1, threads, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          int64_t start = b * blocksize, len = n - start < blocksize ? n - start : blocksize;
          dequantize_block<D, decltype(stream)::value>(A + start / 2, len, table, absmax[b], y + start);
        }
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
        if (decltype(stream)::value) _mm_sfence();  // streamed stores are weakly ordered
#endif
      });
    };
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
    // An output much larger than the caches would only evict everything else on its way to DRAM,
    // and ordinary stores first read each line they overwrite (for a bf16 output that read is as
    // large as the write, and twice the packed input): streaming stores skip both. They need stores
    // aligned to the vector width: every block (and so every 32-value step) starts on such a boundary.
#if defined(BNB_ISA_AVX512)
    constexpr int64_t kAlign = 64;
#else
    constexpr int64_t kAlign = 32;
#endif
    const int64_t bytes = n * int64_t(sizeof(typename Elem<D>::T));
    if (bytes >= kStreamBytes && reinterpret_cast<uintptr_t>(y) % kAlign == 0 &&
        blocksize * int64_t(sizeof(typename Elem<D>::T)) % kAlign == 0) {
      run(std::true_type{});
      return;
    }
#endif
    run(std::false_type{});
  });
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
