#include "kernels/matmul_4bit_tile.h"

#include <bitsandbytes/formats.h>

#include <algorithm>

#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
#include <immintrin.h>
#endif
#if defined(BNB_ISA_NEON)
#include "kernels/neon_simd.h"
#endif

namespace bnb {
namespace BNB_ISA_NS {

namespace {

#if defined(BNB_ISA_AVX512)
// v rounded to D (nearest even, as torch) and widened back to fp32.
template <DType D>
inline __m512 round16(__m512 v) {
  if constexpr (D == DType::f16) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else if constexpr (D == DType::bf16) {
    const __m512i u = _mm512_castps_si512(v), hi_mask = _mm512_set1_epi32(int(0xffff0000u));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), hi_mask);
    // NaN: truncated and made quiet, as float_to_bf16 (rounding could carry it into the exponent).
    const __m512i nan = _mm512_or_si512(_mm512_and_si512(u, hi_mask), _mm512_set1_epi32(0x400000));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, nan);
    return _mm512_castsi512_ps(r);
  } else {
    return v;
  }
}
#elif defined(BNB_ISA_AVX2)
template <DType D>
inline __m256 round8(__m256 v) {
  if constexpr (D == DType::f16) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else if constexpr (D == DType::bf16) {
    const __m256i u = _mm256_castps_si256(v), hi_mask = _mm256_set1_epi32(int(0xffff0000u));
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), hi_mask);
    const __m256i nan = _mm256_or_si256(_mm256_and_si256(u, hi_mask), _mm256_set1_epi32(0x400000));
    r = _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    return _mm256_castsi256_ps(r);
  } else {
    return v;
  }
}
#endif

// The 16 values one block's codes stand for: code[c] * scale in fp32 (the reference's product),
// rounded to D and widened back; in registers where the vector loop looks them up.
template <DType D>
struct BlockTable {
  alignas(64) float s[16];
#if defined(BNB_ISA_AVX512)
  __m512 v;
  BlockTable(const float* code, float scale) {
    v = round16<D>(_mm512_mul_ps(_mm512_loadu_ps(code), _mm512_set1_ps(scale)));
    _mm512_store_ps(s, v);
  }
#elif defined(BNB_ISA_AVX2)
  __m256 lo, hi;
  BlockTable(const float* code, float scale) {
    const __m256 sc = _mm256_set1_ps(scale);
    lo = round8<D>(_mm256_mul_ps(_mm256_loadu_ps(code), sc));
    hi = round8<D>(_mm256_mul_ps(_mm256_loadu_ps(code + 8), sc));
    _mm256_store_ps(s, lo);
    _mm256_store_ps(s + 8, hi);
  }
#else
  BlockTable(const float* code, float scale) {
    for (int c = 0; c < 16; ++c) s[c] = Elem<D>::load(Elem<D>::store(code[c] * scale));
  }
#endif
};

// Flat weights [f, fend) of one block, whose 16 possible values are t, into out[0 ...].
template <DType D>
void decode_segment(const uint8_t* B, const BlockTable<D>& t, int64_t f, int64_t fend, float* out) {
  auto one = [&](int64_t i) {
    const uint8_t byte = B[i >> 1];
    *out++ = t.s[(i & 1) ? (byte & 15) : (byte >> 4)];
  };
  // The vector loops start on a byte boundary (an odd K starts rows mid-byte).
  if (f < fend && (f & 1)) one(f++);
#if defined(BNB_ISA_AVX512)
  const __m256i c15 = _mm256_set1_epi16(15);
  for (; f + 32 <= fend; f += 32, out += 32) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + f / 2)));
    // Bytes hi0 lo0 hi1 lo1 ...: one code per byte, in output order.
    const __m256i nib = _mm256_or_si256(_mm256_srli_epi16(w, 4), _mm256_slli_epi16(_mm256_and_si256(w, c15), 8));
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(nib)), t.v));
    _mm512_storeu_ps(out + 16, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(nib, 1)), t.v));
  }
#elif defined(BNB_ISA_AVX2)
  const __m256i c15 = _mm256_set1_epi16(15);
  for (; f + 32 <= fend; f += 32, out += 32) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + f / 2)));
    const __m256i nib = _mm256_or_si256(_mm256_srli_epi16(w, 4), _mm256_slli_epi16(_mm256_and_si256(w, c15), 8));
    const __m128i halves[2] = {_mm256_castsi256_si128(nib), _mm256_extracti128_si256(nib, 1)};
    for (int k = 0; k < 4; ++k) {
      const __m128i h = halves[k / 2];
      const __m256i idx = _mm256_cvtepu8_epi32(k % 2 ? _mm_srli_si128(h, 8) : h);
      const __m256 lo = _mm256_permutevar8x32_ps(t.lo, idx), hi = _mm256_permutevar8x32_ps(t.hi, idx);
      // Bit 3 of the code picks the half of the table: moved to the sign bit for blendv.
      _mm256_storeu_ps(out + 8 * k, _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28))));
    }
  }
#elif defined(BNB_ISA_NEON)
  const neon_simd::Planes32 pl(t.s);
  for (; f + 32 <= fend; f += 32, out += 32) {
    const uint8x16x2_t c = neon_simd::unpack_nibbles(vld1q_u8(B + f / 2));
    pl.lookup_store(c.val[0], out);
    pl.lookup_store(c.val[1], out + 16);
  }
#endif
  for (; f < fend; ++f) one(f);
}

template <DType D>
void decode_range(const uint8_t* B, const float* absmax, const NestedAbsmax* nested, const float* code,
                  int64_t blocksize, int64_t i0, int64_t f, int64_t fend, float* out) {
  while (f < fend) {
    const int64_t b = f / blocksize;
    const int64_t send = std::min(fend, (b + 1) * blocksize);
    // Two roundings for a nested scale (product, then + offset), as the reference's dequantize_blockwise + add.
    // Nested, absmax is absmax2 (one per 256 blocks): absmax[b] would read past it (found by ASan).
    float scale;
    if (nested) {
      const float v = nested->code[nested->q[b]] * absmax[b / BNB_DOUBLE_QUANT_BLOCKSIZE];
      scale = v + nested->offset;
    } else {
      scale = absmax[b];
    }
    decode_segment<D>(B, BlockTable<D>(code, scale), f, send, out + (f - i0));
    f = send;
  }
}

}  // namespace

void dequantize_4bit_tile_f32(const uint8_t* B, const float* absmax, const NestedAbsmax* nested, const float* code,
                              int64_t blocksize, int64_t i0, int64_t i1, DType round, float* out, int threads) {
  if (i1 <= i0) return;
  visit_dtype(round, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    // Pieces of whole 64-value groups, so that every piece but the first starts on a byte boundary. Each
    // value is computed the same way whichever piece holds it: the thread count changes nothing.
    const int64_t groups = (i1 - i0 + 63) / 64;
    parallel_for(groups, 1024, threads, [&](int64_t g0, int64_t g1) {
      decode_range<D>(B, absmax, nested, code, blocksize, i0, i0 + g0 * 64, std::min(i1, i0 + g1 * 64), out);
    });
  });
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
