#include "kernels/int8.h"

#include <bitsandbytes/formats.h>

#include <algorithm>
#include <mutex>
#include <vector>

#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
#include <immintrin.h>
#endif
#if defined(BNB_ISA_NEON)
#include "kernels/neon_simd.h"
#endif

// AVX512-VNNI is not part of the avx512 level's baseline flags, so its GEMM tile is compiled with a
// function-level target and only called when the CPU has it (the binding checks; see `vnni`).
#if defined(BNB_ISA_AVX512) && (defined(__GNUC__) || defined(__clang__))
#define BNB_INT8_VNNI 1
#define BNB_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#endif

namespace bnb {
namespace BNB_ISA_NS {

namespace {

constexpr float kDequantScale = BNB_INT8_DEQUANT_SCALE;
constexpr float kMmDequantScale = BNB_INT8_MM_DEQUANT_SCALE;
// Adding and subtracting 1.5 * 2**23 rounds a float of magnitude < 2**22 to an integer, half to even
// (the default rounding mode), exactly like torch.round; written out so it vectorizes without SSE4.1.
constexpr float kRoundMagic = 12582912.0f;

// ---------------------------------------------------------------------------------------------------
// Scalar building blocks; every SIMD path below computes exactly these float operations.

// The reference's multiplier: fl(fl(1 / absmax) * 127). absmax 0 gives inf, NaN gives NaN.
inline float quant_scale(float absmax) {
  float r = 1.0f / absmax;
  return r * 127.0f;
}

// round(x * s) half to even, NaN -> 0 (0 * inf, NaN rows), clamped to [-127, 127] (inf scales).
inline int8_t code_of(float x, float s) {
  float v = x * s;
  if (v != v) v = 0.0f;
  v = v < -127.0f ? -127.0f : (v > 127.0f ? 127.0f : v);
  v = (v + kRoundMagic) - kRoundMagic;
  return int8_t(v);
}

// Per-chunk outlier column flags, allocated on the first outlier and OR-ed into the shared flags at
// the end of the chunk (so which thread saw an outlier never matters).
struct LocalFlags {
  std::vector<uint8_t> flags;
  void mark(int64_t k, int64_t K) {
    if (flags.empty()) flags.assign(size_t(K), 0);
    flags[size_t(k)] = 1;
  }
};

// Scalar row absmax over [k0, K), continuing from (m, nan); outliers marked and left out.
template <DType D, bool OUTL>
void absmax_tail(const typename Elem<D>::T* x, int64_t k0, int64_t K, float thr, float& m, bool& nan, LocalFlags& lf) {
  for (int64_t k = k0; k < K; ++k) {
    float a = std::fabs(Elem<D>::load(x[k]));
    if (OUTL && a >= thr) {
      lf.mark(k, K);
      continue;
    }
    nan |= a != a;
    m = a > m ? a : m;
  }
}

// |x| of the first NaN of a row (as torch.amax returns a NaN of the row); only called for NaN rows.
template <DType D>
float first_nan(const typename Elem<D>::T* x, int64_t K) {
  for (int64_t k = 0; k < K; ++k) {
    float a = std::fabs(Elem<D>::load(x[k]));
    if (a != a) return a;
  }
  return NAN;
}

// ---------------------------------------------------------------------------------------------------
// SIMD loads/stores of float32/float16/bfloat16 as float32 lanes (exact conversions).

#if defined(BNB_ISA_AVX512)
constexpr int64_t kW = 16;
inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

template <DType D>
inline __m512 load16(const typename Elem<D>::T* p, __mmask16 m) {
  if constexpr (D == DType::f32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (D == DType::f16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
}

template <DType D>
inline void store16(typename Elem<D>::T* p, __m512 v, __mmask16 m) {
  if constexpr (D == DType::f32) {
    _mm512_mask_storeu_ps(p, m, v);
  } else if constexpr (D == DType::f16) {
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    // Round to nearest even as float_to_bf16; NaN keeps its top bits and becomes quiet.
    __m512i u = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(hi, _mm512_set1_epi32(1))),
        16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(r));
  }
}

inline __m512 abs16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

inline __m128i codes16(__m512 x, __m512 s) {
  __m512 v = _mm512_mul_ps(x, s);
  v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  return _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#elif defined(BNB_ISA_AVX2)
constexpr int64_t kW = 8;

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
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), _mm256_and_si256(hi, _mm256_set1_epi32(1))),
        16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
}

inline __m256 abs8(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }

inline void codes8(__m256 x, __m256 s, int8_t* q) {
  __m256 v = _mm256_mul_ps(x, s);
  v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  __m256i i = _mm256_cvttps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(w, w));
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
#elif defined(BNB_ISA_NEON)
// code_of on 4 lanes: NaN -> 0, clamp, FRINTN (nearest even, what the magic-number add gives below 2^22).
inline int32x4_t codes4(float32x4_t x, float32x4_t s) {
  float32x4_t v = vmulq_f32(x, s);
  v = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), vceqq_f32(v, v)));
  v = vminq_f32(vmaxq_f32(v, vdupq_n_f32(-127.0f)), vdupq_n_f32(127.0f));
  return vcvtq_s32_f32(vrndnq_f32(v));
}

// 16 codes (4 x 4 lanes, each in [-127, 127]) narrowed to bytes.
inline int8x16_t narrow16(const int32x4_t* c) {
  const int16x8_t lo = vcombine_s16(vmovn_s32(c[0]), vmovn_s32(c[1]));
  const int16x8_t hi = vcombine_s16(vmovn_s32(c[2]), vmovn_s32(c[3]));
  return vcombine_s8(vmovn_s16(lo), vmovn_s16(hi));
}

inline uint32x4_t is_nan4(float32x4_t v) { return vmvnq_u32(vceqq_f32(v, v)); }
#endif

// ---------------------------------------------------------------------------------------------------
// Row-wise quantization.

// One row: absmax over the inliers (outliers marked), then the codes of every value (an outlier's code
// does not matter: its column is zeroed afterwards).
template <DType D, bool OUTL>
void quant_row(const typename Elem<D>::T* x, int64_t K, float thr, int8_t* q, float* stat, LocalFlags& lf) {
  float m = 0.0f;
  bool nan = false;
  int64_t k = 0;
#if defined(BNB_ISA_AVX512)
  {
    __m512 vm = _mm512_setzero_ps(), vthr = _mm512_set1_ps(thr);
    __mmask16 nanm = 0;
    for (; k < K; k += 16) {
      __mmask16 tm = tail_mask(K - k);
      __m512 a = abs16(load16<D>(x + k, tm));
      if (OUTL) {
        __mmask16 o = _mm512_mask_cmp_ps_mask(tm, a, vthr, _CMP_GE_OQ);
        if (o) {
          for (int j = 0; j < 16; ++j)
            if (o >> j & 1) lf.mark(k + j, K);
          a = _mm512_mask_mov_ps(a, o, _mm512_setzero_ps());
        }
      }
      nanm |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
      vm = _mm512_max_ps(vm, a);
    }
    nan = nanm != 0;
    if (!nan) m = _mm512_reduce_max_ps(vm);
  }
#elif defined(BNB_ISA_AVX2)
  {
    __m256 vm = _mm256_setzero_ps(), vthr = _mm256_set1_ps(thr);
    int nanm = 0;
    for (; k + 8 <= K; k += 8) {
      __m256 a = abs8(load8<D>(x + k));
      if (OUTL) {
        __m256 o = _mm256_cmp_ps(a, vthr, _CMP_GE_OQ);
        int om = _mm256_movemask_ps(o);
        if (om) {
          for (int j = 0; j < 8; ++j)
            if (om >> j & 1) lf.mark(k + j, K);
          a = _mm256_andnot_ps(o, a);
        }
      }
      nanm |= _mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q));
      vm = _mm256_max_ps(vm, a);
    }
    nan = nanm != 0;
    if (!nan) m = hmax8(vm);
  }
#elif defined(BNB_ISA_NEON)
  {
    float32x4_t vm = vdupq_n_f32(0.0f);
    const float32x4_t vthr = vdupq_n_f32(thr);
    uint32x4_t nanm = vdupq_n_u32(0);
    for (; k + 4 <= K; k += 4) {
      float32x4_t a = vabsq_f32(neon_simd::load4<D>(x + k));
      if (OUTL) {
        const uint32x4_t o = vcgeq_f32(a, vthr);
        if (vmaxvq_u32(o)) {
          alignas(16) uint32_t ol[4];
          vst1q_u32(ol, o);
          for (int j = 0; j < 4; ++j)
            if (ol[j]) lf.mark(k + j, K);
          a = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(a), o));
        }
      }
      nanm = vorrq_u32(nanm, is_nan4(a));
      vm = vmaxq_f32(vm, a);
    }
    nan = vmaxvq_u32(nanm) != 0;
    if (!nan) m = vmaxvq_f32(vm);
  }
#endif
  absmax_tail<D, OUTL>(x, k, K, thr, m, nan, lf);
  if (nan) m = first_nan<D>(x, K);
  *stat = m;
  float s = quant_scale(m);
  k = 0;
#if defined(BNB_ISA_AVX512)
  __m512 vs = _mm512_set1_ps(s);
  for (; k < K; k += 16) {
    __mmask16 tm = tail_mask(K - k);
    _mm_mask_storeu_epi8(q + k, tm, codes16(load16<D>(x + k, tm), vs));
  }
#elif defined(BNB_ISA_AVX2)
  __m256 vs = _mm256_set1_ps(s);
  for (; k + 8 <= K; k += 8) codes8(load8<D>(x + k), vs, q + k);
#elif defined(BNB_ISA_NEON)
  const float32x4_t vs = vdupq_n_f32(s);
  for (; k + 16 <= K; k += 16) {
    int32x4_t c[4];
    for (int j = 0; j < 4; ++j) c[j] = codes4(neon_simd::load4<D>(x + k + 4 * j), vs);
    vst1q_s8(q + k, narrow16(c));
  }
#endif
  for (; k < K; ++k) q[k] = code_of(Elem<D>::load(x[k]), s);
}

template <DType D>
void vectorwise_quant(const typename Elem<D>::T* A, int64_t rows, int64_t K, float threshold, int8_t* codes,
                      float* stats, uint8_t* col_flags, int threads) {
  const bool outl = col_flags != nullptr;
  std::mutex mu;
  bool any = false;
  parallel_for(rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(K, 1)), threads, [&](int64_t r0, int64_t r1) {
    LocalFlags lf;
    for (int64_t r = r0; r < r1; ++r) {
      if (outl)
        quant_row<D, true>(A + r * K, K, threshold, codes + r * K, stats + r, lf);
      else
        quant_row<D, false>(A + r * K, K, threshold, codes + r * K, stats + r, lf);
    }
    if (!lf.flags.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      any = true;
      for (int64_t k = 0; k < K; ++k) col_flags[k] |= lf.flags[size_t(k)];
    }
  });
  if (!any) return;
  // Outlier columns go to the floating-point path: code 0 in every row.
  std::vector<int64_t> cols;
  for (int64_t k = 0; k < K; ++k)
    if (col_flags[k]) cols.push_back(k);
  parallel_for(rows, std::max<int64_t>(1, (1 << 16) / int64_t(cols.size())), threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c : cols) codes[r * K + c] = 0;
  });
}

// Column-wise absmax, one row of a band at a time into m[] (L1-resident). The first NaN of a column
// sticks (MAXPS returns its second operand when either is NaN, so a NaN m stays; a new NaN a is taken
// only while m is not NaN), matching the scalar rule below.
template <DType D, bool OUTL>
void col_absmax_row(const typename Elem<D>::T* x, int64_t w, float thr, float* m) {
  int64_t j = 0;
#if defined(BNB_ISA_AVX512)
  const __m512 vthr = _mm512_set1_ps(thr);
  for (; j < w; j += 16) {
    __mmask16 tm = tail_mask(w - j);
    __m512 a = abs16(load16<D>(x + j, tm));
    if (OUTL) a = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(a, vthr, _CMP_GE_OQ), _mm512_setzero_ps());
    __m512 mm = _mm512_maskz_loadu_ps(tm, m + j);
    __m512 r = _mm512_max_ps(a, mm);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(mm, mm, _CMP_ORD_Q), a);
    _mm512_mask_storeu_ps(m + j, tm, r);
  }
#elif defined(BNB_ISA_AVX2)
  const __m256 vthr = _mm256_set1_ps(thr);
  for (; j + 8 <= w; j += 8) {
    __m256 a = abs8(load8<D>(x + j));
    if (OUTL) a = _mm256_andnot_ps(_mm256_cmp_ps(a, vthr, _CMP_GE_OQ), a);
    __m256 mm = _mm256_loadu_ps(m + j);
    __m256 r = _mm256_max_ps(a, mm);
    __m256 take = _mm256_and_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(mm, mm, _CMP_ORD_Q));
    _mm256_storeu_ps(m + j, _mm256_blendv_ps(r, a, take));
  }
#elif defined(BNB_ISA_NEON)
  const float32x4_t vthr = vdupq_n_f32(thr);
  for (; j + 4 <= w; j += 4) {
    float32x4_t a = vabsq_f32(neon_simd::load4<D>(x + j));
    if (OUTL) a = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(a), vcgeq_f32(a, vthr)));
    const float32x4_t mm = vld1q_f32(m + j);
    const float32x4_t r = vbslq_f32(vcgtq_f32(a, mm), a, mm);  // a > mm ? a : mm (a NaN mm stays)
    vst1q_f32(m + j, vbslq_f32(vandq_u32(is_nan4(a), vceqq_f32(mm, mm)), a, r));
  }
#endif
  for (; j < w; ++j) {
    float a = std::fabs(Elem<D>::load(x[j]));
    if (OUTL && a >= thr) a = 0.0f;
    float mm = m[j];
    m[j] = a != a ? (mm == mm ? a : mm) : (a > mm ? a : mm);
  }
}

// Column-wise codes of one row of a band (outliers coded 0).
template <DType D, bool OUTL>
void col_codes_row(const typename Elem<D>::T* x, int64_t w, float thr, const float* s, int8_t* q) {
  int64_t j = 0;
#if defined(BNB_ISA_AVX512)
  const __m512 vthr = _mm512_set1_ps(thr);
  for (; j < w; j += 16) {
    __mmask16 tm = tail_mask(w - j);
    __m512 v = load16<D>(x + j, tm);
    if (OUTL) v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(abs16(v), vthr, _CMP_GE_OQ), _mm512_setzero_ps());
    _mm_mask_storeu_epi8(q + j, tm, codes16(v, _mm512_maskz_loadu_ps(tm, s + j)));
  }
#elif defined(BNB_ISA_AVX2)
  const __m256 vthr = _mm256_set1_ps(thr);
  for (; j + 8 <= w; j += 8) {
    __m256 v = load8<D>(x + j);
    if (OUTL) v = _mm256_andnot_ps(_mm256_cmp_ps(abs8(v), vthr, _CMP_GE_OQ), v);
    codes8(v, _mm256_loadu_ps(s + j), q + j);
  }
#elif defined(BNB_ISA_NEON)
  const float32x4_t vthr = vdupq_n_f32(thr);
  for (; j + 16 <= w; j += 16) {
    int32x4_t c[4];
    for (int t = 0; t < 4; ++t) {
      float32x4_t v = neon_simd::load4<D>(x + j + 4 * t);
      if (OUTL) v = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), vcgeq_f32(vabsq_f32(v), vthr)));
      c[t] = codes4(v, vld1q_f32(s + j + 4 * t));
    }
    vst1q_s8(q + j, narrow16(c));
  }
#endif
  for (; j < w; ++j) {
    float v = Elem<D>::load(x[j]);
    if (OUTL && std::fabs(v) >= thr) v = 0.0f;
    q[j] = code_of(v, s[j]);
  }
}

// Column-wise: a band of columns at a time, all rows (each column's stats and codes are independent of
// the banding, so of the thread count).
template <DType D, bool OUTL>
void colwise_quant(const typename Elem<D>::T* A, int64_t rows, int64_t K, float thr, int8_t* codes, float* stats,
                   int threads) {
  constexpr int64_t kBand = 1024;
  const int64_t band = std::min(kBand, std::max<int64_t>(64, (K / std::max(threads, 1) + 63) / 64 * 64));
  parallel_for((K + band - 1) / band, 1, threads, [&](int64_t b0, int64_t b1) {
    float m[kBand], s[kBand];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * band, w = std::min(band, K - c0);
      std::fill(m, m + w, 0.0f);
      for (int64_t r = 0; r < rows; ++r) col_absmax_row<D, OUTL>(A + r * K + c0, w, thr, m);
      for (int64_t j = 0; j < w; ++j) {
        stats[c0 + j] = m[j];
        s[j] = quant_scale(m[j]);
      }
      for (int64_t r = 0; r < rows; ++r) col_codes_row<D, OUTL>(A + r * K + c0, w, thr, s, codes + r * K + c0);
    }
  });
}

// ---------------------------------------------------------------------------------------------------
// Dequantization.

void dequant_rows(const int8_t* A, const float* stats, int64_t K, float* out, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* q = A + r * K;
    float* y = out + r * K;
    const float st = stats[r];
    int64_t k = 0;
#if defined(BNB_ISA_AVX512)
    __m512 vst = _mm512_set1_ps(st), c = _mm512_set1_ps(kDequantScale);
    for (; k < K; k += 16) {
      __mmask16 tm = tail_mask(K - k);
      __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(tm, q + k)));
      _mm512_mask_storeu_ps(y + k, tm, _mm512_mul_ps(_mm512_mul_ps(v, vst), c));
    }
#elif defined(BNB_ISA_AVX2)
    __m256 vst = _mm256_set1_ps(st), c = _mm256_set1_ps(kDequantScale);
    for (; k + 8 <= K; k += 8) {
      __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k)));
      _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(w), vst), c));
    }
#elif defined(BNB_ISA_NEON)
    const float32x4_t vst = vdupq_n_f32(st), c = vdupq_n_f32(kDequantScale);
    for (; k + 8 <= K; k += 8) {
      const int16x8_t w = vmovl_s8(vld1_s8(q + k));
      const float32x4_t lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), hi = vcvtq_f32_s32(vmovl_high_s16(w));
      vst1q_f32(y + k, vmulq_f32(vmulq_f32(lo, vst), c));
      vst1q_f32(y + k + 4, vmulq_f32(vmulq_f32(hi, vst), c));
    }
#endif
    for (; k < K; ++k) y[k] = (float(q[k]) * st) * kDequantScale;
  }
}

// out = (float(acc) * (row * col)) * MM_DEQUANT_SCALE (+ bias), the reference's operation order.
inline float mm_dequant_value(int32_t acc, float row, float col, const float* bias, int64_t n) {
  float v = (float(acc) * (row * col)) * kMmDequantScale;
  return bias ? v + bias[n] : v;
}

template <DType D>
void mm_dequant_rows(const int32_t* A, const float* row_stats, const float* col_stats, const float* bias, int64_t N,
                     typename Elem<D>::T* out, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* a = A + r * N;
    auto* y = out + r * N;
    const float row = row_stats[r];
    int64_t n = 0;
#if defined(BNB_ISA_AVX512)
    __m512 vrow = _mm512_set1_ps(row), c = _mm512_set1_ps(kMmDequantScale);
    for (; n < N; n += 16) {
      __mmask16 tm = tail_mask(N - n);
      __m512 v = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(tm, a + n));
      v = _mm512_mul_ps(_mm512_mul_ps(v, _mm512_mul_ps(vrow, _mm512_maskz_loadu_ps(tm, col_stats + n))), c);
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(tm, bias + n));
      store16<D>(y + n, v, tm);
    }
#elif defined(BNB_ISA_AVX2)
    __m256 vrow = _mm256_set1_ps(row), c = _mm256_set1_ps(kMmDequantScale);
    for (; n + 8 <= N; n += 8) {
      __m256 v = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + n)));
      v = _mm256_mul_ps(_mm256_mul_ps(v, _mm256_mul_ps(vrow, _mm256_loadu_ps(col_stats + n))), c);
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n));
      store8<D>(y + n, v);
    }
#elif defined(BNB_ISA_NEON)
    const float32x4_t vrow = vdupq_n_f32(row), c = vdupq_n_f32(kMmDequantScale);
    for (; n + 4 <= N; n += 4) {
      float32x4_t v = vcvtq_f32_s32(vld1q_s32(a + n));  // SCVTF rounds to nearest, as float(acc) does
      v = vmulq_f32(vmulq_f32(v, vmulq_f32(vrow, vld1q_f32(col_stats + n))), c);
      if (bias) v = vaddq_f32(v, vld1q_f32(bias + n));
      neon_simd::store4<D>(y + n, v);
    }
#endif
    for (; n < N; ++n) y[n] = Elem<D>::store(mm_dequant_value(a[n], row, col_stats[n], bias, n));
  }
}

// The bias as float32 (exact), so the inner loops see one type; empty when there is none.
std::vector<float> bias_f32(const void* bias, DType dt, int64_t N) {
  std::vector<float> b;
  if (!bias) return b;
  b.resize(size_t(N));
  visit_dtype(dt, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* p = static_cast<const typename Elem<D>::T*>(bias);
    for (int64_t n = 0; n < N; ++n) b[size_t(n)] = Elem<D>::load(p[n]);
  });
  return b;
}

// ---------------------------------------------------------------------------------------------------
// int8 GEMM: C[M, N] = A[M, K] . B[N, K]^T, exact modulo 2**32 (int32 accumulators wrap, which is the
// reference's int64 sum converted to int32). A tile computes MR x NR dot products over the whole K
// and writes them to out[i * kOutStride + j]; the driver adds the epilogue.

constexpr int kOutStride = 4;
using TileFn = void (*)(const int8_t* A, const int8_t* B, int64_t K, int32_t* out);

// Portable tile: MR x NR int32 sums in one pass over K, over chunks short enough never to overflow
// (2**16 products of at most 2**14), each chunk added modulo 2**32. Every loaded byte is used MR or NR
// times; compilers vectorize the k loop where they can.
template <int MR, int NR>
void tile_portable(const int8_t* A, const int8_t* B, int64_t K, int32_t* out) {
  uint32_t total[MR][NR] = {};
  for (int64_t k0 = 0; k0 < K; k0 += 65536) {
    const int64_t k1 = std::min(K, k0 + 65536);
    int32_t s[MR][NR] = {};
    for (int64_t k = k0; k < k1; ++k)
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) s[i][j] += int32_t(A[i * K + k]) * int32_t(B[j * K + k]);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) total[i][j] += uint32_t(s[i][j]);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) out[i * kOutStride + j] = int32_t(total[i][j]);
}

#if defined(BNB_ISA_AVX512)
// Sums modulo 2**32 like the reference: every add is a (wrapping) vector add. _mm512_reduce_add_epi32
// ends in a scalar signed add, whose overflow is undefined (UBSan reports it for large K).
inline int32_t hsum16(__m512i v) {
  __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// AVX-512BW: sign-extend 32 int8 to int16, vpmaddwd into 16 int32 lanes (pairs of products fit).
template <int MR, int NR>
void tile_avx512bw(const int8_t* A, const int8_t* B, int64_t K, int32_t* out) {
  __m512i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 32) {
    __mmask32 m = K - k >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << (K - k)) - 1);
    __m512i a[MR], b[NR];
    for (int i = 0; i < MR; ++i) a[i] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, A + i * K + k));
    for (int j = 0; j < NR; ++j) b[j] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, B + j * K + k));
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_add_epi32(acc[i][j], _mm512_madd_epi16(a[i], b[j]));
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) out[i * kOutStride + j] = hsum16(acc[i][j]);
}

#if defined(BNB_INT8_VNNI)
// AVX512-VNNI: vpdpbusd multiplies unsigned by signed bytes, so B is offset by 128 (xor 0x80) and the
// driver subtracts 128 * sum_k A[m, k] afterwards (all modulo 2**32, hence exact). Four u8 x s8
// products sum to at most 130560 in magnitude: no saturation (this is the non-saturating form).
template <int MR, int NR>
BNB_VNNI_TARGET void tile_vnni(const int8_t* A, const int8_t* B, int64_t K, int32_t* out) {
  __m512i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    __m512i a[MR], b[NR];
    for (int i = 0; i < MR; ++i) a[i] = _mm512_loadu_si512(A + i * K + k);
    for (int j = 0; j < NR; ++j) b[j] = _mm512_xor_si512(_mm512_loadu_si512(B + j * K + k), flip);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], b[j], a[i]);
  }
  if (k < K) {
    // A's masked-off bytes are 0, so whatever B' holds there contributes nothing.
    __mmask64 m = ~0ULL >> (64 - (K - k));
    __m512i a[MR], b[NR];
    for (int i = 0; i < MR; ++i) a[i] = _mm512_maskz_loadu_epi8(m, A + i * K + k);
    for (int j = 0; j < NR; ++j) b[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, B + j * K + k), flip);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], b[j], a[i]);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) out[i * kOutStride + j] = hsum16(acc[i][j]);
}
#endif
#elif defined(BNB_ISA_AVX2)
inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// AVX2: sign-extend 16 int8 to int16 and vpmaddwd into 8 int32 lanes; the K % 16 tail is scalar.
template <int MR, int NR>
void tile_avx2(const int8_t* A, const int8_t* B, int64_t K, int32_t* out) {
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256i a[MR], b[NR];
    for (int i = 0; i < MR; ++i)
      a[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(A + i * K + k)));
    for (int j = 0; j < NR; ++j)
      b[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + j * K + k)));
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(a[i], b[j]));
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      uint32_t s = uint32_t(hsum8(acc[i][j]));
      for (int64_t t = k; t < K; ++t) s += uint32_t(int32_t(A[i * K + t]) * int32_t(B[j * K + t]));
      out[i * kOutStride + j] = int32_t(s);
    }
}
#elif defined(BNB_ISA_NEON)
// Adds the scalar K % 16 tail to the lane sums, all modulo 2**32 (ADDV and vector adds wrap).
template <int MR, int NR>
inline void finish_tile(const int32x4_t (&acc)[MR][NR], const int8_t* A, const int8_t* B, int64_t k, int64_t K,
                        int32_t* out) {
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      uint32_t s = vaddvq_u32(vreinterpretq_u32_s32(acc[i][j]));
      for (int64_t t = k; t < K; ++t) s += uint32_t(int32_t(A[i * K + t]) * int32_t(B[j * K + t]));
      out[i * kOutStride + j] = int32_t(s);
    }
}

#if defined(BNB_ISA_NEON_DOTPROD)
// FEAT_DotProd: SDOT adds four int8 x int8 products into each int32 lane (at most 4 * 2^14: no overflow
// before the wrapping accumulate).
template <int MR, int NR>
void tile_neon(const int8_t* A, const int8_t* B, int64_t K, int32_t* out) {
  int32x4_t acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vdupq_n_s32(0);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    int8x16_t a[MR], b[NR];
    for (int i = 0; i < MR; ++i) a[i] = vld1q_s8(A + i * K + k);
    for (int j = 0; j < NR; ++j) b[j] = vld1q_s8(B + j * K + k);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] = vdotq_s32(acc[i][j], a[i], b[j]);
  }
  finish_tile<MR, NR>(acc, A, B, k, K, out);
}
#else
// Armv8.0: SMULL / SMULL2 multiply 8 int8 pairs into int16 (|product| <= 2^14 fits), SADALP adds
// neighbouring products into the int32 lanes (wrapping).
template <int MR, int NR>
void tile_neon(const int8_t* A, const int8_t* B, int64_t K, int32_t* out) {
  int32x4_t acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = vdupq_n_s32(0);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    int8x16_t a[MR], b[NR];
    for (int i = 0; i < MR; ++i) a[i] = vld1q_s8(A + i * K + k);
    for (int j = 0; j < NR; ++j) b[j] = vld1q_s8(B + j * K + k);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = vpadalq_s16(acc[i][j], vmull_s8(vget_low_s8(a[i]), vget_low_s8(b[j])));
        acc[i][j] = vpadalq_s16(acc[i][j], vmull_high_s8(a[i], b[j]));
      }
  }
  finish_tile<MR, NR>(acc, A, B, k, K, out);
}
#endif
#endif

// Tile functions for every edge size: table[mr - 1][nr - 1].
template <int MR, int NR>
struct TileTable {
  TileFn fn[MR][NR];
};

template <template <int, int> class Tile, int MR, int NR>
TileTable<MR, NR> make_table() {
  TileTable<MR, NR> t{};
  auto set = [&](auto mi, auto nj) {
    constexpr int i = decltype(mi)::value, j = decltype(nj)::value;
    t.fn[i - 1][j - 1] = &Tile<i, j>::run;
  };
  auto row = [&](auto mi) {
    set(mi, std::integral_constant<int, 1>{});
    if constexpr (NR >= 2) set(mi, std::integral_constant<int, 2>{});
    if constexpr (NR >= 3) set(mi, std::integral_constant<int, 3>{});
    if constexpr (NR >= 4) set(mi, std::integral_constant<int, 4>{});
  };
  row(std::integral_constant<int, 1>{});
  if constexpr (MR >= 2) row(std::integral_constant<int, 2>{});
  if constexpr (MR >= 3) row(std::integral_constant<int, 3>{});
  if constexpr (MR >= 4) row(std::integral_constant<int, 4>{});
  return t;
}

#define BNB_TILE_WRAPPER(name, fn)                                                                           \
  template <int MR, int NR>                                                                                  \
  struct name {                                                                                              \
    static void run(const int8_t* A, const int8_t* B, int64_t K, int32_t* out) { fn<MR, NR>(A, B, K, out); } \
  };
BNB_TILE_WRAPPER(PortableTile, tile_portable)
#if defined(BNB_ISA_AVX512)
BNB_TILE_WRAPPER(Avx512bwTile, tile_avx512bw)
#if defined(BNB_INT8_VNNI)
BNB_TILE_WRAPPER(VnniTile, tile_vnni)
#endif
#elif defined(BNB_ISA_AVX2)
BNB_TILE_WRAPPER(Avx2Tile, tile_avx2)
#elif defined(BNB_ISA_NEON)
BNB_TILE_WRAPPER(NeonTile, tile_neon)
#endif
#undef BNB_TILE_WRAPPER

// Parallel over column tiles of C (rows of B), each thread walking all of A in row blocks that stay
// in L2 while its B tile (NR x K) stays in L1. Every C element is computed by exactly one tile, with
// integer arithmetic, so the result does not depend on the thread count. corr (may be null): value
// subtracted from row m's sums (modulo 2**32).
template <int MR, int NR, class Epi>
void gemm(const TileTable<MR, NR>& table, const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K,
          const uint32_t* corr, int threads, const Epi& epi) {
  if (M == 0 || N == 0) return;
  const int64_t n_tiles = (N + NR - 1) / NR;
  const int64_t mc = std::max<int64_t>(MR, (int64_t(1) << 18) / std::max<int64_t>(K, 1) / MR * MR);
  const int64_t work_per_tile = std::max<int64_t>(1, M * std::max<int64_t>(K, 1) * NR);
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / work_per_tile);
  parallel_for(n_tiles, grain, threads, [&](int64_t t0, int64_t t1) {
    int32_t vals[MR * kOutStride];
    for (int64_t mb = 0; mb < M; mb += mc) {
      const int64_t me = std::min(M, mb + mc);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * NR;
        const int nr = int(std::min<int64_t>(NR, N - n0));
        for (int64_t m0 = mb; m0 < me; m0 += MR) {
          const int mr = int(std::min<int64_t>(MR, me - m0));
          table.fn[mr - 1][nr - 1](A + m0 * K, B + n0 * K, K, vals);
          if (corr)
            for (int i = 0; i < mr; ++i)
              for (int j = 0; j < nr; ++j)
                vals[i * kOutStride + j] = int32_t(uint32_t(vals[i * kOutStride + j]) - corr[m0 + i]);
          epi(m0, n0, mr, nr, vals);
        }
      }
    }
  });
}

// Runs the GEMM with this ISA's best tile (the same exact integers whichever is chosen).
template <class Epi>
void run_gemm(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, bool vnni, int threads,
              const Epi& epi) {
#if defined(BNB_ISA_AVX512)
#if defined(BNB_INT8_VNNI)
  if (vnni) {
    static const auto table = make_table<VnniTile, 4, 4>();
    // 128 * sum_k A[m, k] for the +128 offset of B (see tile_vnni).
    std::vector<uint32_t> corr(static_cast<size_t>(M));
    parallel_for(M, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(K, 1)), threads, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        uint32_t s = 0;
        for (int64_t k = 0; k < K; ++k) s += uint32_t(int32_t(A[r * K + k]));
        corr[size_t(r)] = s * 128u;
      }
    });
    gemm(table, A, B, M, N, K, corr.data(), threads, epi);
    return;
  }
#endif
  (void)vnni;
  static const auto table = make_table<Avx512bwTile, 4, 4>();
  gemm(table, A, B, M, N, K, nullptr, threads, epi);
#elif defined(BNB_ISA_AVX2)
  (void)vnni;
  static const auto table = make_table<Avx2Tile, 2, 4>();
  gemm(table, A, B, M, N, K, nullptr, threads, epi);
#elif defined(BNB_ISA_NEON)
  (void)vnni;
  static const auto table = make_table<NeonTile, 4, 4>();  // 16 accumulators + 8 operands of 32 registers
  gemm(table, A, B, M, N, K, nullptr, threads, epi);
#else
  (void)vnni;
  static const auto table = make_table<PortableTile, 2, 4>();
  gemm(table, A, B, M, N, K, nullptr, threads, epi);
#endif
}

}  // namespace

// ---------------------------------------------------------------------------------------------------

void int8_vectorwise_quant(const void* A, DType dtype, int64_t rows, int64_t K, float threshold, int8_t* codes,
                           float* stats, uint8_t* col_flags, int threads) {
  if (K == 0) {
    for (int64_t r = 0; r < rows; ++r) stats[r] = 0.0f;
    return;
  }
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    vectorwise_quant<D>(static_cast<const typename Elem<D>::T*>(A), rows, K, threshold, codes, stats, col_flags,
                        threads);
  });
}

void int8_colwise_quant(const void* A, DType dtype, int64_t rows, int64_t K, bool outliers, float threshold,
                        int8_t* codes, float* stats, int threads) {
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* x = static_cast<const typename Elem<D>::T*>(A);
    if (outliers)
      colwise_quant<D, true>(x, rows, K, threshold, codes, stats, threads);
    else
      colwise_quant<D, false>(x, rows, K, threshold, codes, stats, threads);
  });
}

void int8_vectorwise_dequant(const int8_t* A, const float* stats, int64_t rows, int64_t K, float* out, int threads) {
  parallel_for(rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(K, 1)), threads,
               [&](int64_t r0, int64_t r1) { dequant_rows(A, stats, K, out, r0, r1); });
}

void int8_mm_dequant(const int32_t* A, const float* row_stats, const float* col_stats, const void* bias,
                     DType bias_dtype, int64_t rows, int64_t N, void* out, DType out_dtype, int threads) {
  std::vector<float> b = bias_f32(bias, bias_dtype, N);
  const float* bp = bias ? b.data() : nullptr;
  visit_dtype(out_dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* y = static_cast<typename Elem<D>::T*>(out);
    parallel_for(rows, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(N, 1)), threads,
                 [&](int64_t r0, int64_t r1) { mm_dequant_rows<D>(A, row_stats, col_stats, bp, N, y, r0, r1); });
  });
}

void int8_linear_matmul(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, int32_t* out, bool vnni,
                        int threads) {
  run_gemm(A, B, M, N, K, vnni, threads, [&](int64_t m0, int64_t n0, int mr, int nr, const int32_t* vals) {
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < nr; ++j) out[(m0 + i) * N + n0 + j] = vals[i * kOutStride + j];
  });
}

void int8_scaled_mm(const int8_t* A, const int8_t* B, int64_t M, int64_t N, int64_t K, const float* row_stats,
                    const float* col_stats, const void* bias, DType bias_dtype, void* out, DType out_dtype, bool vnni,
                    int threads) {
  std::vector<float> b = bias_f32(bias, bias_dtype, N);
  const float* bp = bias ? b.data() : nullptr;
  visit_dtype(out_dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* y = static_cast<typename Elem<D>::T*>(out);
    run_gemm(A, B, M, N, K, vnni, threads, [&](int64_t m0, int64_t n0, int mr, int nr, const int32_t* vals) {
      for (int i = 0; i < mr; ++i) {
        const float row = row_stats[m0 + i];
        for (int j = 0; j < nr; ++j)
          y[(m0 + i) * N + n0 + j] =
              Elem<D>::store(mm_dequant_value(vals[i * kOutStride + j], row, col_stats[n0 + j], bp, n0 + j));
      }
    });
  });
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
