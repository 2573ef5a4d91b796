// Optimizer steps (semantics: bitsandbytes/_reference/optimizers.py).
//
// The element math mirrors the reference operation for operation (same float32 roundings, no
// contraction into FMA), so every ISA level gives the same bits and they match the reference in the
// common case; the conformance tolerances still apply. The 8-bit step is one pass per block of 256:
// dequantize the states, step in float32, write p, then the new absmax and codes of each state.
#include "kernels/optimizers.h"

#include <vector>

#include "kernels/block_scale.h"
#include "kernels/search8.h"

#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
#include <immintrin.h>
#endif
#if defined(BNB_ISA_NEON)
#include "kernels/neon_simd.h"
#endif

namespace bnb {
namespace BNB_ISA_NS {

namespace {

constexpr int64_t kBlock = BNB_OPTIMIZER_BLOCKSIZE;
constexpr int64_t kPrefetchBlocks = 2;  // how far ahead the 8-bit step prefetches (step_block_vec)

template <class T>
struct Type {
  using type = T;
};

// ---------------------------------------------------------------------------------------------------
// g / p in their dtype <-> float32 (exact; the same bits as Elem<D> on every level)

template <DType D>
void load_floats(const typename Elem<D>::T* __restrict src, float* __restrict dst, int64_t len) {
  int64_t i = 0;
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
  if constexpr (D == DType::f16) {
    for (; i + 8 <= len; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
#if defined(BNB_ISA_NEON)
  if constexpr (D != DType::f32) {
    for (; i + 4 <= len; i += 4) vst1q_f32(dst + i, neon_simd::load4<D>(src + i));
  }
#endif
  for (; i < len; ++i) dst[i] = Elem<D>::load(src[i]);
}

// float32 -> bfloat16, round to nearest even, NaN kept quiet: float_to_bf16 without a branch, so loops vectorize.
inline uint16_t to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

template <DType D>
void store_floats(const float* __restrict src, typename Elem<D>::T* __restrict dst, int64_t len) {
  int64_t i = 0;
  if constexpr (D == DType::bf16) {
    for (; i < len; ++i) dst[i] = to_bf16(src[i]);
    return;
  }
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
  if constexpr (D == DType::f16) {
    // F16C rounds to nearest even like float_to_f16 (subnormals, overflow to inf and NaN included).
    for (; i + 8 <= len; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
#if defined(BNB_ISA_NEON)
  if constexpr (D == DType::f16) {
    for (; i + 4 <= len; i += 4) vst1_u16(dst + i, neon_simd::round_f16(vld1q_f32(src + i)));
  }
#endif
  for (; i < len; ++i) dst[i] = Elem<D>::store(src[i]);
}

// ---------------------------------------------------------------------------------------------------
// The step of one run of elements, in place on float32 arrays. g holds the raw gradient (float32 of
// its dtype; skip_zeros tests it before gnorm_scale). `scale` is the max_unorm update scale (1 without).
// States: adam [m, v], ademamix [m1, m2, nu], the others [s].

template <int R, bool WD, bool SKIP>
void step_math(const OptStep& c, float scale, const float* __restrict g, float* __restrict p, float* __restrict s1,
               float* __restrict s2, float* __restrict s3, int64_t len) {
  const float gnorm = c.gnorm_scale;
  if constexpr (R == kAdam) {
    const float step_size = scale * c.adam_step_size;  // update_scale * step_size: one float32 product
    for (int64_t i = 0; i < len; ++i) {
      float gr = g[i], gi = gr * gnorm, p0 = p[i], m0 = s1[i], v0 = s2[i];
      float pd = WD ? p0 * c.decay_factor : p0;
      float m = c.beta1 * m0 + c.one_minus_beta1 * gi;
      float v = c.beta2 * v0 + c.one_minus_beta2 * gi * gi;
      float pn = pd + step_size * (m / (std::sqrt(v) + c.adam_eps));
      bool keep = SKIP && gr == 0.0f;
      p[i] = keep ? p0 : pn;
      s1[i] = keep ? m0 : m;
      s2[i] = keep ? v0 : v;
    }
  } else if constexpr (R == kAdemamix) {
    for (int64_t i = 0; i < len; ++i) {
      float gr = g[i], gi = gr * gnorm, p0 = p[i], a0 = s1[i], b0 = s2[i], n0 = s3[i];
      float pd = WD ? p0 * c.decay_factor : p0;
      float m1 = c.beta1 * a0 + c.one_minus_beta1 * gi;
      float m2 = c.beta3 * b0 + c.one_minus_beta3 * gi;
      float nu = c.beta2 * n0 + c.one_minus_beta2 * gi * gi;
      float pn = pd - c.lr * ((m1 / c.correction1 + c.alpha * m2) / (std::sqrt(nu) / c.correction2 + c.eps));
      bool keep = SKIP && gr == 0.0f;
      p[i] = keep ? p0 : pn;
      s1[i] = keep ? a0 : m1;
      s2[i] = keep ? b0 : m2;
      s3[i] = keep ? n0 : nu;
    }
  } else if constexpr (R == kLion) {
    const float scaled_lr = scale * c.lr;
    for (int64_t i = 0; i < len; ++i) {
      float gr = g[i], gi = gr * gnorm, p0 = p[i], s0 = s1[i];
      float pd = WD ? p0 * c.decay_factor : p0;
      float d = c.beta1 * s0 + c.one_minus_beta1 * gi;
      // sign(d), with NaN kept so a NaN gradient shows in p (torch.sign(NaN) may be 0): +-1 or +0 from
      // the bits, integer selects only, so the loop vectorizes (branches on the sign mispredict).
      uint32_t db = float_to_bits(d), mag = db & 0x7fffffffu;
      uint32_t nonzero = 0u - uint32_t(mag != 0u), nan = 0u - uint32_t(mag > 0x7f800000u);
      uint32_t unit = nonzero & ((db & 0x80000000u) | 0x3f800000u);
      float sg = bits_to_float((nan & db) | (~nan & unit));
      float pn = pd - scaled_lr * sg;
      float s = c.beta2 * s0 + c.one_minus_beta2 * gi;
      bool keep = SKIP && gr == 0.0f;
      p[i] = keep ? p0 : pn;
      s1[i] = keep ? s0 : s;
    }
  } else {  // momentum, rmsprop, adagrad: coupled weight decay
    const float scaled_lr = (R == kAdagrad ? 1.0f : scale) * c.lr;
    for (int64_t i = 0; i < len; ++i) {
      float gr = g[i], gi = gr * gnorm, p0 = p[i], s0 = s1[i];
      if (WD) gi = gi + c.coupled_decay * p0;
      float s, pn;
      if constexpr (R == kMomentum) {
        s = c.first_step ? gi : c.beta1 * s0 + gi;
        pn = p0 - scaled_lr * s;
      } else {
        s = R == kRmsprop ? c.beta1 * s0 + c.one_minus_beta1 * gi * gi : s0 + gi * gi;
        pn = p0 - scaled_lr * gi / (std::sqrt(s) + c.eps);
      }
      bool keep = SKIP && gr == 0.0f;
      p[i] = keep ? p0 : pn;
      s1[i] = keep ? s0 : s;
    }
  }
}

// Calls fn(rule, weight-decay, skip-zeros tags) with the three known at compile time.
template <class Fn>
void visit_step(const OptStep& c, Fn&& fn) {
  auto with_flags = [&](auto rule) {
    if (c.weight_decay) {
      if (c.skip_zeros)
        fn(rule, std::true_type{}, std::true_type{});
      else
        fn(rule, std::true_type{}, std::false_type{});
    } else {
      if (c.skip_zeros)
        fn(rule, std::false_type{}, std::true_type{});
      else
        fn(rule, std::false_type{}, std::false_type{});
    }
  };
  switch (c.rule) {
    case kAdam:
      return with_flags(std::integral_constant<int, kAdam>{});
    case kAdemamix:
      return with_flags(std::integral_constant<int, kAdemamix>{});
    case kMomentum:
      return with_flags(std::integral_constant<int, kMomentum>{});
    case kRmsprop:
      return with_flags(std::integral_constant<int, kRmsprop>{});
    case kAdagrad:
      return with_flags(std::integral_constant<int, kAdagrad>{});
    default:
      return with_flags(std::integral_constant<int, kLion>{});
  }
}

// ---------------------------------------------------------------------------------------------------
// max_unorm: the reference's unorm_vec sums, from the old states and g (without weight decay), reading only.
// Returns the sum of one run; ademamix adds its second sum (m2) to *second.

template <int R>
double norm_sum(const OptStep& c, const float* __restrict g, const float* __restrict s1, const float* __restrict s2,
                int64_t len, double* second) {
  double acc = 0.0, acc2 = 0.0;
  for (int64_t i = 0; i < len; ++i) {
    float gi = g[i] * c.gnorm_scale;
    if constexpr (R == kAdam) {
      float m = (c.beta1 * s1[i] + c.one_minus_beta1 * gi) / c.norm_correction1;
      float v = (c.beta2 * s2[i] + c.one_minus_beta2 * gi * gi) / c.norm_correction2;
      float x = m / (std::sqrt(v) + c.eps);
      acc += double(x * x);
    } else if constexpr (R == kAdemamix) {
      acc += double(s1[i]);
      acc2 += double(s2[i]);
    } else if constexpr (R == kMomentum) {
      float x = c.first_step ? gi : c.beta1 * s1[i] + gi;
      acc += double(x * x);
    } else if constexpr (R == kLion) {
      // The plain sum of beta2 * m_new + (1 - beta2) * g (an upstream quirk kept by the reference).
      float s = c.beta2 * s1[i] + c.one_minus_beta2 * gi;
      acc += double(c.beta2 * s + c.one_minus_beta2 * gi);
    } else {
      float s = R == kRmsprop ? c.beta1 * s1[i] + c.one_minus_beta1 * gi * gi : s1[i] + gi * gi;
      float x = gi / (std::sqrt(s) + c.eps);
      acc += double(x * x);
    }
  }
  if (second) *second += acc2;
  return acc;
}

// ---------------------------------------------------------------------------------------------------
// 8-bit state: dequantize, absmax, nearest code

void dequantize_block(const uint8_t* __restrict q, int64_t len, const float* __restrict qmap, float scale,
                      float* __restrict out) {
  int64_t i = 0;
#if defined(BNB_ISA_AVX512)
  // The last, partial block only (full blocks take step_block_vec): the map in 16 registers.
  const search8::MapInRegisters map(qmap);
  const __m512 vs = _mm512_set1_ps(scale);
  for (; i + 16 <= len; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(map.codes(q + i), vs));
#elif defined(BNB_ISA_AVX2)
  const __m256 vs = _mm256_set1_ps(scale);
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(search8::lookup8_codes(qmap, q + i), vs));
#endif
  for (; i < len; ++i) out[i] = qmap[q[i]] * scale;
}

// Largest |x| (0 for an all-zero run), NaN if any x is NaN: block_absmax's result, vectorized. *signs:
// whether some x may carry the sign bit (exact at AVX2, always true elsewhere).
float absmax_of(const float* __restrict x, int64_t len, bool* signs) {
  int64_t i = 0;
  float m = 0.0f;
  bool nan = false;
  *signs = true;
#if defined(BNB_ISA_AVX512)
  __m512 acc = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (; i + 16 <= len; i += 16) {
    __m512 v = _mm512_loadu_ps(x + i);
    bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    acc = _mm512_max_ps(_mm512_abs_ps(v), acc);  // a NaN lane keeps acc (second operand)
  }
  m = _mm512_reduce_max_ps(acc);
  nan = bad != 0;
#elif defined(BNB_ISA_AVX2)
  // The magnitude bits order like |x| and every NaN's sort above inf's: one integer max per vector.
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i acc = _mm256_setzero_si256(), any = acc;
  for (; i + 8 <= len; i += 8) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    acc = _mm256_max_epu32(acc, _mm256_and_si256(v, abs_mask));
    any = _mm256_or_si256(any, v);
  }
  bool tail_signs = false;
  for (int64_t k = i; k < len; ++k) tail_signs |= std::signbit(x[k]);
  *signs = _mm256_movemask_ps(_mm256_castsi256_ps(any)) != 0 || tail_signs;
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
  uint32_t top = 0;
  for (uint32_t l : lanes) top = l > top ? l : top;
  nan = top > 0x7f800000u;
  m = nan ? 0.0f : bits_to_float(top);
#elif defined(BNB_ISA_NEON)
  // The same integer max of the magnitude bits (every NaN's sort above inf's).
  const uint32x4_t abs_mask = vdupq_n_u32(0x7fffffffu);
  const uint32_t* u = reinterpret_cast<const uint32_t*>(x);
  uint32x4_t acc0 = vdupq_n_u32(0), acc1 = acc0;
  for (; i + 8 <= len; i += 8) {
    acc0 = vmaxq_u32(acc0, vandq_u32(vld1q_u32(u + i), abs_mask));
    acc1 = vmaxq_u32(acc1, vandq_u32(vld1q_u32(u + i + 4), abs_mask));
  }
  const uint32_t top = vmaxvq_u32(vmaxq_u32(acc0, acc1));
  nan = top > 0x7f800000u;
  m = nan ? 0.0f : bits_to_float(top);
#endif
  for (; i < len; ++i) {
    float v = std::fabs(x[i]);
    nan |= v != v;
    m = v > m ? v : m;
  }
  return nan ? NAN : m;
}

// Codes of a block whose absmax is `absmax` (the reference's block_absmax_and_scale + nearest_code).
void quantize_block(const float* __restrict x, int64_t len, float absmax, bool signs, const NearestCode& map,
                    uint8_t* __restrict out) {
  (void)signs;  // used by the AVX2 and AVX-512 levels only
  BlockScaler scale(absmax, len == kBlock);
  int64_t i = 0;
#if defined(BNB_ISA_AVX512)
  {
    const search8::Keyed16 keyed(map);
    const __m512 f = _mm512_set1_ps(scale.full ? scale.inv : scale.clamped);
    const __m512 lo = _mm512_set1_ps(-1.0f), hi = _mm512_set1_ps(1.0f);
    const int32_t* order = map.order;
    const bool full = scale.full, identity = map.identity;
    auto run = [&](auto sign, auto check) {
      for (; i + 16 <= len; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        v = full ? _mm512_mul_ps(v, f) : _mm512_div_ps(v, f);
        constexpr bool Checked = decltype(check)::value;  // unchecked s needs no clamp (Keyed16)
        __m512i slot =
            keyed.slot<decltype(sign)::value, Checked, false>(Checked ? _mm512_min_ps(hi, _mm512_max_ps(lo, v)) : v);
        if (!identity) slot = _mm512_i32gather_epi32(_mm512_and_si512(slot, _mm512_set1_epi32(0xff)), order, 4);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(slot));
      }
    };
    if (!std::isfinite(absmax))
      run(std::true_type{}, std::true_type{});
    else if (signs)
      run(std::true_type{}, std::false_type{});
    else
      run(std::false_type{}, std::false_type{});
  }
#elif defined(BNB_ISA_AVX2)
  {
    const search8::Keyed keyed(map);
    const __m256 inv = _mm256_set1_ps(scale.inv), clamped = _mm256_set1_ps(scale.clamped);
    const __m256 lo = _mm256_set1_ps(-1.0f), hi = _mm256_set1_ps(1.0f);
    // Low byte of each 32-bit lane to the front of its 128-bit half, then both halves' first 4 bytes together.
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
    const int32_t* order = map.order;
    const bool full = scale.full, identity = map.identity;
    // A finite absmax means finite x, so no scaled value is NaN; without sign bits none is negative.
    auto run = [&](auto sign, auto check) {
      for (; i + 8 <= len; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 s = full ? _mm256_mul_ps(v, inv) : _mm256_div_ps(v, clamped);
        constexpr bool Checked = decltype(check)::value;  // unchecked s needs no clamp (search8::Keyed16)
        if (Checked) s = _mm256_min_ps(hi, _mm256_max_ps(lo, s));
        __m256i slot = keyed.slot<decltype(sign)::value, Checked>(s);
        if (!identity) slot = _mm256_i32gather_epi32(order, slot, 4);
        __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(slot, pick), join);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
      }
    };
    if (!std::isfinite(absmax))
      run(std::true_type{}, std::true_type{});
    else if (signs)
      run(std::true_type{}, std::false_type{});
    else
      run(std::false_type{}, std::false_type{});
  }
#elif defined(BNB_ISA_NEON)
  {
    const search8::Keyed keyed(map);
    const float32x4_t inv = vdupq_n_f32(scale.inv), clamped = vdupq_n_f32(scale.clamped);
    const float32x4_t lo = vdupq_n_f32(-1.0f), hi = vdupq_n_f32(1.0f);
    const bool full = scale.full;
    for (; i + 16 <= len; i += 16) {
      uint32x4_t j[4];
      for (int k = 0; k < 4; ++k) {
        const float32x4_t v = vld1q_f32(x + i + 4 * k);
        const float32x4_t s = full ? vmulq_f32(v, inv) : vdivq_f32(v, clamped);
        j[k] = keyed.slot(vminq_f32(hi, vmaxq_f32(lo, s)));  // FMAX / FMIN keep NaN, like scale()
      }
      vst1q_u8(out + i, search8::narrow_slots(j));
      if (!map.identity)
        for (int k = 0; k < 16; ++k) out[i + k] = uint8_t(map.order[out[i + k]]);
    }
  }
#endif
  for (; i < len; ++i) out[i] = uint8_t(map.order[search8::keyed_slot(map, scale(x[i]))]);
}

// Dequantized state of one block; `codes`/`absmax`/`qmap`/`map` describe its storage.
struct QState {
  uint8_t* codes;
  float* absmax;
  const float* qmap;
  const NearestCode* map;
};

#if defined(BNB_ISA_AVX2) || defined(BNB_ISA_AVX512)
// The vector operations the fused 8-bit step needs, one struct per width: Avx2 (8 lanes) at the AVX2
// level, Avx512 (16 lanes, masks for compares) at the AVX-512 level.
#if defined(BNB_ISA_AVX2)
struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  // step_math's Lion sign from the bits: +-1 or +0, NaN kept.
  static F sign(F d) {
    const I db = _mm256_castps_si256(d);
    const I mag = _mm256_and_si256(db, _mm256_set1_epi32(0x7fffffff));
    const I zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
    const I nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    const I unit = _mm256_andnot_si256(zero, _mm256_or_si256(_mm256_and_si256(db, _mm256_set1_epi32(int(0x80000000u))),
                                                             _mm256_set1_epi32(0x3f800000)));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(unit, db, nan));
  }
  // Per lane: `old` where the raw gradient is zero, else `fresh`.
  static F keep_if_zero(F gr, F fresh, F old) {
    return _mm256_blendv_ps(fresh, old, _mm256_cmp_ps(gr, _mm256_setzero_ps(), _CMP_EQ_OQ));
  }
  template <DType D>
  static F load(const typename Elem<D>::T* p) {
    return load8<D>(p);
  }
  template <DType D>
  static void store(typename Elem<D>::T* p, F v) {
    store8<D>(p, v);
  }
  // The 256-entry map, looked up by 8 code bytes.
  struct Codes {
    const float* qmap;
    explicit Codes(const float* q) : qmap(q) {}
    F operator()(const uint8_t* q) const { return search8::lookup8_codes(qmap, q); }
  };
  // Running max of the magnitude bits and OR of all bits (for the sign), then their reductions.
  static I zero() { return _mm256_setzero_si256(); }
  static I max_magnitude(I top, F v) {
    return _mm256_max_epu32(top, _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
  }
  static I or_bits(I any, F v) { return _mm256_or_si256(any, _mm256_castps_si256(v)); }
  static uint32_t reduce_max(I m) {
    m = _mm256_max_epu32(m, _mm256_permute2x128_si256(m, m, 1));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0x4e));
    m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0xb1));
    return uint32_t(_mm256_cvtsi256_si32(m));
  }
  static bool any_sign(I any) { return _mm256_movemask_ps(_mm256_castsi256_ps(any)) != 0; }
  static void store_aligned(float* p, F v) { _mm256_store_ps(p, v); }
};
using Vec = Avx2;
#else
struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F sign(F d) {
    const I db = _mm512_castps_si512(d);
    const I mag = _mm512_and_si512(db, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nonzero = _mm512_test_epi32_mask(mag, mag);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f800000));
    const I unit = _mm512_maskz_or_epi32(nonzero, _mm512_and_si512(db, _mm512_set1_epi32(int(0x80000000u))),
                                         _mm512_set1_epi32(0x3f800000));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(unit, nan, db));
  }
  static F keep_if_zero(F gr, F fresh, F old) {
    return _mm512_mask_mov_ps(fresh, _mm512_cmp_ps_mask(gr, _mm512_setzero_ps(), _CMP_EQ_OQ), old);
  }
  template <DType D>
  static F load(const typename Elem<D>::T* p) {
    return load16<D>(p);
  }
  template <DType D>
  static void store(typename Elem<D>::T* p, F v) {
    store16<D>(p, v);
  }
  // The 256-entry map read by 16 codes, two ways with the same bits (OptStep::map_in_registers picks):
  // one vpgatherdd of 16 from L1, which on the Xeon measured (AVX-512, AMX) beat the permutes (Adam8bit
  // step about 0.8x the time), or the map held in 16 registers, which on AMD's Zen 4 beat the gather
  // (one thread: Adam8bit 0.89x, Lion8bit 0.81x; a vpgatherdd of 16 costs about 22 cycles there, measured by taking
  // the gathers out of the step).
  struct GatherCodes {
    const float* qmap;
    explicit GatherCodes(const float* q) : qmap(q) {}
    F operator()(const uint8_t* q) const {
      return _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))), qmap, 4);
    }
  };
  struct RegisterCodes {
    search8::MapInRegisters map;
    explicit RegisterCodes(const float* q) : map(q) {}
    F operator()(const uint8_t* q) const { return map.codes(q); }
  };
  static I zero() { return _mm512_setzero_si512(); }
  static I max_magnitude(I top, F v) {
    return _mm512_max_epu32(top, _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
  }
  static I or_bits(I any, F v) { return _mm512_or_si512(any, _mm512_castps_si512(v)); }
  static uint32_t reduce_max(I m) { return _mm512_reduce_max_epu32(m); }
  static bool any_sign(I any) { return _mm512_movepi32_mask(any) != 0; }
  static void store_aligned(float* p, F v) { _mm512_store_ps(p, v); }
};
using Vec = Avx512;
#endif

// step_math for one vector: the same operations in the same order (so the same bits); the 8-bit step's
// update scale is 1, which step_math's products with it keep exact.
template <int R, bool WD, bool SKIP>
struct StepVec {
  using V = Vec;
  using F = typename V::F;
  F gnorm, decay, coupled, b1, omb1, b2, omb2, b3, omb3, alpha, eps, lr, step_size, adam_eps, c1, c2;
  bool first;
  explicit StepVec(const OptStep& c)
      : gnorm(V::set1(c.gnorm_scale)),
        decay(V::set1(c.decay_factor)),
        coupled(V::set1(c.coupled_decay)),
        b1(V::set1(c.beta1)),
        omb1(V::set1(c.one_minus_beta1)),
        b2(V::set1(c.beta2)),
        omb2(V::set1(c.one_minus_beta2)),
        b3(V::set1(c.beta3)),
        omb3(V::set1(c.one_minus_beta3)),
        alpha(V::set1(c.alpha)),
        eps(V::set1(c.eps)),
        lr(V::set1(c.lr)),
        step_size(V::set1(c.adam_step_size)),
        adam_eps(V::set1(c.adam_eps)),
        c1(V::set1(c.correction1)),
        c2(V::set1(c.correction2)),
        first(c.first_step) {}

  // p and the states s[0..] in place; gr is the raw gradient.
  void operator()(F gr, F& p, F* s) const {
    const F gi0 = V::mul(gr, gnorm), p0 = p;
    F pn, ns[3];
    if constexpr (R == kAdam) {
      const F gi = gi0, pd = WD ? V::mul(p0, decay) : p0;
      ns[0] = V::add(V::mul(b1, s[0]), V::mul(omb1, gi));
      ns[1] = V::add(V::mul(b2, s[1]), V::mul(V::mul(omb2, gi), gi));
      pn = V::add(pd, V::mul(step_size, V::div(ns[0], V::add(V::sqrt(ns[1]), adam_eps))));
    } else if constexpr (R == kAdemamix) {
      const F gi = gi0, pd = WD ? V::mul(p0, decay) : p0;
      ns[0] = V::add(V::mul(b1, s[0]), V::mul(omb1, gi));
      ns[1] = V::add(V::mul(b3, s[1]), V::mul(omb3, gi));
      ns[2] = V::add(V::mul(b2, s[2]), V::mul(V::mul(omb2, gi), gi));
      pn = V::sub(pd, V::mul(lr, V::div(V::add(V::div(ns[0], c1), V::mul(alpha, ns[1])),
                                        V::add(V::div(V::sqrt(ns[2]), c2), eps))));
    } else if constexpr (R == kLion) {
      const F gi = gi0, pd = WD ? V::mul(p0, decay) : p0;
      const F d = V::add(V::mul(b1, s[0]), V::mul(omb1, gi));
      pn = V::sub(pd, V::mul(lr, V::sign(d)));
      ns[0] = V::add(V::mul(b2, s[0]), V::mul(omb2, gi));
    } else {
      const F gi = WD ? V::add(gi0, V::mul(coupled, p0)) : gi0;
      if constexpr (R == kMomentum) {
        ns[0] = first ? gi : V::add(V::mul(b1, s[0]), gi);
        pn = V::sub(p0, V::mul(lr, ns[0]));
      } else {
        ns[0] = R == kRmsprop ? V::add(V::mul(b1, s[0]), V::mul(V::mul(omb1, gi), gi)) : V::add(s[0], V::mul(gi, gi));
        pn = V::sub(p0, V::div(V::mul(lr, gi), V::add(V::sqrt(ns[0]), eps)));
      }
    }
    constexpr int kStates = R == kAdam ? 2 : (R == kAdemamix ? 3 : 1);
    if constexpr (SKIP) {
      p = V::keep_if_zero(gr, pn, p0);
      for (int k = 0; k < kStates; ++k) s[k] = V::keep_if_zero(gr, ns[k], s[k]);
    } else {
      p = pn;
      for (int k = 0; k < kStates; ++k) s[k] = ns[k];
    }
  }
};

// One full block of the 8-bit step in a single sweep: dequantize every state, step, write p and keep the
// new states in L1 with their absmax (integer max of the magnitude bits, as absmax_of) in registers;
// then the new codes. No scalar pass over the block in between.
template <DType D, int R, bool WD, bool SKIP, class Codes>
void step_block_vec(const OptStep& st, const typename Elem<D>::T* g, typename Elem<D>::T* p, const QState* q,
                    const Codes* codes, int64_t b) {
  using V = Vec;
  using F = typename V::F;
  using I = typename V::I;
  constexpr int kStates = R == kAdam ? 2 : (R == kAdemamix ? 3 : 1), L = V::kLanes;
  const StepVec<R, WD, SKIP> step(st);
  const int64_t start = b * kBlock;
  alignas(64) float buf[kStates][kBlock];
  F scale[kStates];
  I top[kStates], any[kStates];
  for (int k = 0; k < kStates; ++k) {
    scale[k] = V::set1(q[k].absmax[b]);
    top[k] = any[k] = V::zero();
  }
  for (int64_t i = 0; i < kBlock; i += L) {
    // g, p and the codes of the block after next, from L3 or DRAM, while this block's code pass (which
    // reads only L1) runs: without it the step waits on the reads one core keeps in flight, then the codes
    // wait on the arithmetic (one thread, Adam8bit 4096 x 4096, AMX Xeon: 25 -> 20.5 ms; 1 or 4 blocks
    // ahead the same). A prefetch past the end of the arrays never faults.
    const int64_t ahead = start + kPrefetchBlocks * kBlock + i;
    _mm_prefetch(reinterpret_cast<const char*>(g + ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
    if (i % 64 == 0)
      for (int k = 0; k < kStates; ++k) _mm_prefetch(reinterpret_cast<const char*>(q[k].codes + ahead), _MM_HINT_T0);
    F s[kStates];
    for (int k = 0; k < kStates; ++k) s[k] = V::mul(codes[k](q[k].codes + start + i), scale[k]);
    F pv = V::template load<D>(p + start + i);
    step(V::template load<D>(g + start + i), pv, s);
    V::template store<D>(p + start + i, pv);
    for (int k = 0; k < kStates; ++k) {
      top[k] = V::max_magnitude(top[k], s[k]);
      any[k] = V::or_bits(any[k], s[k]);
      V::store_aligned(buf[k] + i, s[k]);
    }
  }
  for (int k = 0; k < kStates; ++k) {
    // Every NaN's magnitude bits sort above inf's, so NaN shows as top > inf.
    const uint32_t t = V::reduce_max(top[k]);
    const float absmax = t > 0x7f800000u ? NAN : bits_to_float(t);
    q[k].absmax[b] = absmax;
    quantize_block(buf[k], kBlock, absmax, V::any_sign(any[k]), *q[k].map, q[k].codes + start);
  }
}
#endif
}  // namespace

// ---------------------------------------------------------------------------------------------------

void optimizer_update_32bit(const OptStep& st, DType dtype, const void* g, void* p, float* state1, float* state2,
                            int64_t n, float* unorm_vec, float limit, int threads) {
  float* s1 = state1;
  float* s2 = st.rule == kAdam ? state2 : (st.rule == kAdemamix ? state1 + n : nullptr);
  float* s3 = st.rule == kAdemamix ? state2 : nullptr;
  const int64_t chunks = (n + kBlock - 1) / kBlock;
  const int64_t grain = 64;  // chunks per task: 16k elements

  visit_dtype(dtype, [&](auto dtag) {
    constexpr DType D = decltype(dtag)::value;
    using T = typename Elem<D>::T;
    const T* gt = static_cast<const T*>(g);
    T* pt = static_cast<T*>(p);

    float scale = 1.0f, new_unorm = 0.0f;
    if (unorm_vec) {
      // Pass 1: one partial sum per chunk, added in chunk order, so no thread count changes the result.
      std::vector<double> part(size_t(chunks) * 2, 0.0);
      visit_step(st, [&](auto rule, auto, auto) {
        constexpr int R = decltype(rule)::value;
        parallel_for(chunks, grain, threads, [&](int64_t c0, int64_t c1) {
          float gbuf[kBlock];
          for (int64_t c = c0; c < c1; ++c) {
            int64_t start = c * kBlock, len = n - start < kBlock ? n - start : kBlock;
            const float* gc;
            if constexpr (D == DType::f32) {
              gc = gt + start;
            } else {
              load_floats<D>(gt + start, gbuf, len);
              gc = gbuf;
            }
            const float* a = R == kAdemamix ? s1 + start : s1 + start;
            const float* b = R == kAdam ? s2 + start : (R == kAdemamix ? s2 + start : nullptr);
            part[2 * c] = norm_sum<R>(st, gc, a, b, len, &part[2 * c + 1]);
          }
        });
      });
      double sum = 0.0, sum2 = 0.0;
      for (int64_t c = 0; c < chunks; ++c) sum += part[2 * c], sum2 += part[2 * c + 1];
      new_unorm = st.rule == kAdemamix ? float(sum) + float(sum2) : float(sum);
      // Lion scales by the norm its previous step stored; adagrad and ademamix never scale (upstream quirks).
      float current = std::sqrt(st.rule == kLion ? *unorm_vec : new_unorm);
      if (st.rule != kAdagrad && st.rule != kAdemamix && current > limit) scale = limit / current;
    }

    // Pass 2: the step.
    visit_step(st, [&](auto rule, auto wd, auto skip) {
      constexpr int R = decltype(rule)::value;
      constexpr bool WD = decltype(wd)::value, SKIP = decltype(skip)::value;
      parallel_for(chunks, grain, threads, [&](int64_t c0, int64_t c1) {
        int64_t begin = c0 * kBlock, end = c1 * kBlock < n ? c1 * kBlock : n;
        auto state = [&](float* s, int64_t at) { return s ? s + at : nullptr; };
        if constexpr (D == DType::f32) {
          step_math<R, WD, SKIP>(st, scale, gt + begin, pt + begin, state(s1, begin), state(s2, begin),
                                 state(s3, begin), end - begin);
        } else {
          float gbuf[kBlock], pbuf[kBlock];
          for (int64_t start = begin; start < end; start += kBlock) {
            int64_t len = end - start < kBlock ? end - start : kBlock;
            load_floats<D>(gt + start, gbuf, len);
            load_floats<D>(pt + start, pbuf, len);
            step_math<R, WD, SKIP>(st, scale, gbuf, pbuf, state(s1, start), state(s2, start), state(s3, start), len);
            store_floats<D>(pbuf, pt + start, len);
          }
        }
      });
    });
    if (unorm_vec) *unorm_vec = new_unorm;
  });
}

void optimizer_update_8bit_blockwise(const OptStep& st, DType dtype, const void* g, void* p, uint8_t* state1,
                                     uint8_t* state2, float* absmax1, float* absmax2, const float* qmap1,
                                     const float* qmap2, const NearestCode* map1, const NearestCode* map2, int64_t n,
                                     int threads) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  // The states in the order step_math takes them.
  QState q[3];
  int n_states = 1;
  q[0] = {state1, absmax1, qmap1, map1};
  if (st.rule == kAdam) {
    q[1] = {state2, absmax2, qmap2, map2};
    n_states = 2;
  } else if (st.rule == kAdemamix) {
    q[1] = {state1 + n, absmax1 + blocks, qmap1, map1};  // second EMA: its own row of codes and absmax
    q[2] = {state2, absmax2, qmap2, map2};
    n_states = 3;
  }

  visit_dtype(dtype, [&](auto dtag) {
    constexpr DType D = decltype(dtag)::value;
    using T = typename Elem<D>::T;
    const T* gt = static_cast<const T*>(g);
    T* pt = static_cast<T*>(p);
    visit_step(st, [&](auto rule, auto wd, auto skip) {
      constexpr int R = decltype(rule)::value;
      constexpr bool WD = decltype(wd)::value, SKIP = decltype(skip)::value;
      parallel_for(blocks, 16, threads, [&](int64_t b0, int64_t b1) {
        alignas(64) float gbuf[kBlock], pbuf[kBlock], sbuf[3][kBlock];
        int64_t b = b0;
#if defined(BNB_ISA_AVX2) || defined(BNB_ISA_AVX512)
        auto full_blocks = [&](auto codes_tag) {
          using C = typename decltype(codes_tag)::type;
          const C codes[3] = {C(q[0].qmap), C(q[n_states > 1 ? 1 : 0].qmap), C(q[n_states > 2 ? 2 : 0].qmap)};
          for (; b < b1 && (b + 1) * kBlock <= n; ++b) step_block_vec<D, R, WD, SKIP>(st, gt, pt, q, codes, b);
        };
#if defined(BNB_ISA_AVX512)
        if (st.map_in_registers)
          full_blocks(Type<Vec::RegisterCodes>{});
        else
          full_blocks(Type<Vec::GatherCodes>{});
#else
        full_blocks(Type<Vec::Codes>{});
#endif
#endif
        for (; b < b1; ++b) {
          int64_t start = b * kBlock, len = n - start < kBlock ? n - start : kBlock;
          const float* gc;
          float* pc;
          if constexpr (D == DType::f32) {
            gc = gt + start;
            pc = pt + start;  // in place: each element reads its p before writing it
          } else {
            load_floats<D>(gt + start, gbuf, len);
            load_floats<D>(pt + start, pbuf, len);
            gc = gbuf;
            pc = pbuf;
          }
          for (int k = 0; k < n_states; ++k)
            dequantize_block(q[k].codes + start, len, q[k].qmap, q[k].absmax[b], sbuf[k]);
          step_math<R, WD, SKIP>(st, 1.0f, gc, pc, sbuf[0], sbuf[1], sbuf[2], len);
          if constexpr (D != DType::f32) store_floats<D>(pbuf, pt + start, len);
          for (int k = 0; k < n_states; ++k) {
            bool signs;
            float m = absmax_of(sbuf[k], len, &signs);
            q[k].absmax[b] = m;
            quantize_block(sbuf[k], len, m, signs, *q[k].map, q[k].codes + start);
          }
        }
      });
    });
  });
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
