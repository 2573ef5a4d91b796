#include "kernels/blockwise.h"

#include "kernels/block_scale.h"
#include "kernels/search8.h"
#if defined(BNB_ISA_NEON)
#include "kernels/neon_simd.h"
#endif

namespace bnb {
namespace BNB_ISA_NS {

namespace {

#if defined(BNB_ISA_AVX512)
// Slots of the first len - len % 16 values by the key table; returns how many it did. Checked: some
// scaled value may be NaN (a NaN in the block, or inf times the factor 0 of an inf absmax).
template <DType D, bool Full, bool Checked>
int64_t quantize_keyed(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift,
                       const search8::Keyed16& q, uint8_t* o) {
  const __m512 one = _mm512_set1_ps(1.0f), minus_one = _mm512_set1_ps(-1.0f);
  const __m512i fix = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  int64_t i = 0;
  for (; i + 64 <= len; i += 64) {
    __m512i j[4];
    for (int k = 0; k < 4; ++k) {
      const __m512 f = _mm512_set1_ps(fac[(i + 16 * k) >> shift]);
      __m512 v = load16<D>(x + i + 16 * k);
      v = Full ? _mm512_mul_ps(v, f) : _mm512_div_ps(v, f);
      j[k] = q.slot<true, Checked>(Checked ? _mm512_max_ps(minus_one, _mm512_min_ps(one, v)) : v);
    }
    __m512i bytes = _mm512_packus_epi16(_mm512_packs_epi32(j[0], j[1]), _mm512_packs_epi32(j[2], j[3]));
    _mm512_storeu_si512(o + i, _mm512_permutexvar_epi32(fix, bytes));
  }
  for (; i + 16 <= len; i += 16) {
    const __m512 f = _mm512_set1_ps(fac[i >> shift]);
    __m512 v = load16<D>(x + i);
    v = Full ? _mm512_mul_ps(v, f) : _mm512_div_ps(v, f);
    __m512i j = q.slot<true, Checked>(Checked ? _mm512_max_ps(minus_one, _mm512_min_ps(one, v)) : v);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), _mm512_cvtepi32_epi8(j));
  }
  return i;
}

#elif defined(BNB_ISA_AVX2)
// Checked: some scaled value may be NaN (a NaN in the block, or inf times the factor 0 of an inf absmax).
template <DType D, bool Full, bool Checked>
int64_t quantize_simd(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift, const search8::Keyed& q,
                      uint8_t* o) {
  const __m256 one = _mm256_set1_ps(1.0f), minus_one = _mm256_set1_ps(-1.0f);
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256i j[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 f = _mm256_set1_ps(fac[(i + 8 * k) >> shift]);
      __m256 v = load8<D>(x + i + 8 * k);
      v = Full ? _mm256_mul_ps(v, f) : _mm256_div_ps(v, f);
      if (Checked) v = _mm256_max_ps(minus_one, _mm256_min_ps(one, v));  // else no clamp needed (Keyed16)
      j[k] = q.slot<true, Checked>(v);
    }
    __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(j[0], j[1]), _mm256_packs_epi32(j[2], j[3]));
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), bytes);
  }
  return i;
}
#elif defined(BNB_ISA_NEON)
template <DType D, bool Full>
int64_t quantize_simd(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift, const search8::Keyed& q,
                      uint8_t* o) {
  const float32x4_t one = vdupq_n_f32(1.0f), minus_one = vdupq_n_f32(-1.0f);
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    uint32x4_t j[4];
    for (int k = 0; k < 4; ++k) {
      const float32x4_t f = vdupq_n_f32(fac[(i + 4 * k) >> shift]);  // blocks hold whole vectors
      const float32x4_t v = neon_simd::load4<D>(x + i + 4 * k);
      // Clamp to [-1, 1] as scale_value does; FMAX / FMIN return NaN for a NaN operand, so NaN stays.
      j[k] = q.slot(vmaxq_f32(minus_one, vminq_f32(one, Full ? vmulq_f32(v, f) : vdivq_f32(v, f))));
    }
    vst1q_u8(o + i, search8::narrow_slots(j));
  }
  return i;
}
#endif

template <DType D>
void quantize_blocks(const typename Elem<D>::T* A, int64_t n, const NearestCode& map, int64_t blocksize, uint8_t* out,
                     float* absmax, int64_t b0, int64_t b1) {
#if defined(BNB_ISA_AVX512)
  const search8::Keyed16 keyed(map);
#elif defined(BNB_ISA_AVX2)
  const search8::Keyed q(map);
#elif defined(BNB_ISA_NEON)
  const search8::Keyed q(map);
#endif
  auto body = [&](auto full, int64_t first, int64_t len, const float* fac, int shift) {
    constexpr bool Full = decltype(full)::value;
    const typename Elem<D>::T* x = A + first;
    uint8_t* o = out + first;
    int64_t i = 0;
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
    // A finite absmax bounds its block's values, and then its factor is finite and non-zero: no scaled
    // value is NaN, so the search skips its NaN handling.
    bool finite = true;
    for (int64_t k = 0, factors = Full ? len >> shift : 1; k < factors; ++k)
      finite &= std::isfinite(fac[k]) && fac[k] != 0.0f;
#endif
#if defined(BNB_ISA_AVX512)
    i = finite ? quantize_keyed<D, Full, false>(x, len, fac, shift, keyed, o)
               : quantize_keyed<D, Full, true>(x, len, fac, shift, keyed, o);
#elif defined(BNB_ISA_AVX2)
    i = finite ? quantize_simd<D, Full, false>(x, len, fac, shift, q, o)
               : quantize_simd<D, Full, true>(x, len, fac, shift, q, o);
#endif
#if defined(BNB_ISA_NEON)
    i = quantize_simd<D, Full>(x, len, fac, shift, q, o);
#endif
    for (; i < len; ++i)
      o[i] = uint8_t(search8::keyed_slot(map, scale_value<Full>(Elem<D>::load(x[i]), fac[i >> shift])));
    // Slot -> code (a map that is not sorted by value; the maps bitsandbytes builds all are).
    if (!map.identity)
      for (int64_t k = 0; k < len; ++k) o[k] = uint8_t(map.order[o[k]]);
  };
  scale_blocks<D>(A, n, blocksize, absmax, b0, b1, body);
}

template <DType D>
void dequantize_block(const uint8_t* A, float scale, const float* code, int64_t len, typename Elem<D>::T* out) {
  int64_t i = 0;
#if defined(BNB_ISA_AVX512)
  // The map in 16 registers: cheaper than a gather on cores where gathers are microcoded.
  const __m512 s = _mm512_set1_ps(scale);
  const search8::MapInRegisters map(code);
  for (; i + 16 <= len; i += 16) store16<D>(out + i, _mm512_mul_ps(map.codes(A + i), s));
#elif defined(BNB_ISA_AVX2)
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= len; i += 8) store8<D>(out + i, _mm256_mul_ps(search8::lookup8_codes(code, A + i), s));
#elif defined(BNB_ISA_NEON)
  // No gather: the four map entries by lane, then one multiply and the dtype's exact rounding.
  const float32x4_t s = vdupq_n_f32(scale);
  for (; i + 4 <= len; i += 4) {
    float32x4_t v = vdupq_n_f32(code[A[i]]);
    v = vsetq_lane_f32(code[A[i + 1]], v, 1);
    v = vsetq_lane_f32(code[A[i + 2]], v, 2);
    v = vsetq_lane_f32(code[A[i + 3]], v, 3);
    neon_simd::store4<D>(out + i, vmulq_f32(v, s));
  }
#endif
  for (; i < len; ++i) out[i] = Elem<D>::store(code[A[i]] * scale);
}

}  // namespace

void quantize_blockwise(const void* A, DType dtype, int64_t n, const NearestCode& map, int64_t blocksize, uint8_t* out,
                        float* absmax, int threads) {
  if (n <= 0) return;
  int64_t blocks = (n + blocksize - 1) / blocksize;
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* x = static_cast<const typename Elem<D>::T*>(A);
    parallel_for(blocks, (1 << 16) / blocksize + 1, threads,
                 [&](int64_t b0, int64_t b1) { quantize_blocks<D>(x, n, map, blocksize, out, absmax, b0, b1); });
  });
}

void dequantize_blockwise(const uint8_t* A, const float* absmax, const float* code, int64_t n, int64_t blocksize,
                          void* out, DType dtype, int threads) {
  if (n <= 0) return;
  int64_t blocks = (n + blocksize - 1) / blocksize;
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* y = static_cast<typename Elem<D>::T*>(out);
    parallel_for(blocks, (1 << 16) / blocksize + 1, threads, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        int64_t start = b * blocksize, len = n - start < blocksize ? n - start : blocksize;
        dequantize_block<D>(A + start, absmax[b], code, len, y + start);
      }
    });
  });
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
