#include "kernels/blockwise.h"

#include <atomic>
#include <new>

#include "kernels/block_scale.h"

namespace bnb {
namespace BNB_ISA_NS {

namespace {

// The 255 sorted midpoints rearranged by search step: the branchless binary search for the slot of s
// (how many midpoints are < s) keeps the slot's top bits j found so far, and at step k (0..7) compares
// s with level[k][j] = mids[j * (256 >> k) + (128 >> k) - 1], then j = 2 j + (that midpoint < s).
// `!(s <= m)` is `m < s` for numbers and true for NaN, so NaN takes the last slot (255), as the
// reference does. Every ISA level runs exactly this search, so codes agree bit for bit.
struct SearchLevels {
  alignas(64) float l0[16], l1[16], l2[16], l3[16], l4[16], l5[32], l6[64], l7[128];
  float* level(int k) {
    float* ls[8] = {l0, l1, l2, l3, l4, l5, l6, l7};
    return ls[k];
  }
  const float* level(int k) const { return const_cast<SearchLevels*>(this)->level(k); }
  explicit SearchLevels(const float* mids) {
    for (int k = 0; k < 8; ++k) {
      float* l = level(k);
      int width = 256 >> k, n = 1 << k;
      for (int j = 0; j < (n < 16 ? 16 : n); ++j) l[j] = mids[(j < n ? j : 0) * width + width / 2 - 1];
    }
  }
};

inline int slot8(const SearchLevels& lv, float s) {
  int j = int(!(s <= lv.l0[0]));
  j = 2 * j + int(!(s <= lv.l1[j]));
  j = 2 * j + int(!(s <= lv.l2[j]));
  j = 2 * j + int(!(s <= lv.l3[j]));
  j = 2 * j + int(!(s <= lv.l4[j]));
  j = 2 * j + int(!(s <= lv.l5[j]));
  j = 2 * j + int(!(s <= lv.l6[j]));
  return 2 * j + int(!(s <= lv.l7[j]));
}

// Eight searches interleaved step by step: one search is a chain of dependent loads and compares,
// so a lone search per element leaves the core idle (the scalar and NEON builds run this).
inline void slot8x8(const SearchLevels& lv, const float* s, uint8_t* out) {
  const float* ls[8] = {lv.l0, lv.l1, lv.l2, lv.l3, lv.l4, lv.l5, lv.l6, lv.l7};
  int j[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int k = 0; k < 8; ++k)
    for (int v = 0; v < 8; ++v) j[v] = 2 * j[v] + int(!(s[v] <= ls[k][j[v]]));
  for (int v = 0; v < 8; ++v) out[v] = uint8_t(j[v]);
}

inline bool is_identity(const uint8_t* order) {
  for (int i = 0; i < 256; ++i)
    if (order[i] != i) return false;
  return true;
}

#if defined(BNB_ISA_AVX512)
// All 255 midpoints live in registers: steps 0-4 look up with vpermps (16 entries), step 5 with
// vpermt2ps (32). Steps 6 and 7 go together: with j the 64 slot groups found so far, step 6 compares
// with B[j] = mids[4j + 1] and step 7 with A[j] = mids[4j] or C[j] = mids[4j + 2]; the three 64-entry
// lookups (two vpermt2ps and a blend each) do not wait for step 6's outcome, which shortens the chain.
struct Quant8 {
  __m512 l0, l1, l2, l3, l4, l5[2], a[4], b[4], c[4];
  explicit Quant8(const SearchLevels& lv) {
    l0 = _mm512_set1_ps(lv.l0[0]);
    l1 = _mm512_load_ps(lv.l1);
    l2 = _mm512_load_ps(lv.l2);
    l3 = _mm512_load_ps(lv.l3);
    l4 = _mm512_load_ps(lv.l4);
    for (int i = 0; i < 2; ++i) l5[i] = _mm512_load_ps(lv.l5 + 16 * i);
    alignas(64) float ta[64], tc[64];
    for (int j = 0; j < 64; ++j) {
      ta[j] = lv.l7[2 * j];
      tc[j] = lv.l7[2 * j + 1];
    }
    for (int i = 0; i < 4; ++i) {
      a[i] = _mm512_load_ps(ta + 16 * i);
      b[i] = _mm512_load_ps(lv.l6 + 16 * i);
      c[i] = _mm512_load_ps(tc + 16 * i);
    }
  }
  static __m512 lookup64(const __m512* t, __m512i j, __mmask16 hi) {
    return _mm512_mask_blend_ps(hi, _mm512_permutex2var_ps(t[0], j, t[1]), _mm512_permutex2var_ps(t[2], j, t[3]));
  }
  // The search for N vectors at once, step by step: the steps of one vector form a long dependency
  // chain (lookup -> compare -> index), so interleaving independent vectors keeps the units busy.
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

// N vectors of 16 values starting at x + i -> their slots at o + i.
template <DType D, bool Full, int N>
inline void quantize_vectors(const typename Elem<D>::T* x, int64_t i, const float* fac, int shift, const Quant8& q,
                             uint8_t* o) {
  const __m512 one = _mm512_set1_ps(1.0f), minus_one = _mm512_set1_ps(-1.0f);
  __m512 v[N];
  __m512i j[N];
  for (int k = 0; k < N; ++k) {
    const __m512 f = _mm512_set1_ps(fac[(i + 16 * k) >> shift]);  // blocks hold whole vectors
    v[k] = load16<D>(x + i + 16 * k);
    v[k] = Full ? _mm512_mul_ps(v[k], f) : _mm512_div_ps(v[k], f);
    // Clamp to [-1, 1], NaN kept (min/max return their second operand when one is NaN).
    v[k] = _mm512_max_ps(minus_one, _mm512_min_ps(one, v[k]));
  }
  q.slots<N>(v, j);
  if constexpr (N % 4 == 0) {
    // packs/packus interleave 128-bit lanes; the permute puts the dwords (4 slots each) back in order.
    const __m512i fix = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int k = 0; k < N; k += 4) {
      __m512i bytes = _mm512_packus_epi16(_mm512_packs_epi32(j[k], j[k + 1]), _mm512_packs_epi32(j[k + 2], j[k + 3]));
      _mm512_storeu_si512(o + i + 16 * k, _mm512_permutexvar_epi32(fix, bytes));
    }
  } else {
    for (int k = 0; k < N; ++k)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i + 16 * k), _mm512_cvtepi32_epi8(j[k]));
  }
}

// Slots of the first len - len % 16 values; returns how many it did. Eight vectors at a time hide
// the search's latency; smaller runs finish the group.
template <DType D, bool Full>
int64_t quantize_simd(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift, const Quant8& q,
                      uint8_t* o) {
  int64_t i = 0;
  for (; i + 128 <= len; i += 128) {
    prefetch_next_group(x, i, 128);
    quantize_vectors<D, Full, 8>(x, i, fac, shift, q, o);
  }
  for (; i + 64 <= len; i += 64) quantize_vectors<D, Full, 4>(x, i, fac, shift, q, o);
  for (; i + 16 <= len; i += 16) quantize_vectors<D, Full, 1>(x, i, fac, shift, q, o);
  return i;
}

#if defined(__GNUC__) || defined(__clang__)
#define BNB_VBMI_PATH 1
#define BNB_VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))

inline int reverse_bits(int v, int bits) {
  int r = 0;
  for (int b = 0; b < bits; ++b) r |= ((v >> b) & 1) << (bits - 1 - b);
  return r;
}

// The same search for CPUs with AVX512-VBMI, in fewer instructions. Step k's outcome goes to bit k of
// j (not j = 2 j + outcome), so a step is lookup, compare, masked add: the tables are indexed by the
// bit-reversed prefix, and vpermps / vpermt2ps still read only the low index bits. Steps 6 and 7 put
// their outcomes in bits 6 and 7 the same way. At the end one byte lookup (two vpermi2b and a blend
// for 256 entries) maps this j to the code: order[slot] with slot the bit reversal of j, so maps that
// are not sorted by value cost nothing extra. Same compares on the same values: the same slots.
// (Measured on Zen 4: only a few percent faster than the plain AVX-512 route; the search is bound
// by its permutes and mask compares, about a quarter of it in steps 6 and 7's 64-entry lookups.)
struct Quant8Vbmi {
  __m512 l0, l1, l2, l3, l4, l5[2], a[4], b[4], c[4];
  __m512i code[4];  // 256 bytes: the code of each j
  explicit Quant8Vbmi(const SearchLevels& lv, const uint8_t* order) {
    alignas(64) float t[5][16], t5[32], ta[64], tb[64], tc[64];
    for (int k = 1; k <= 4; ++k)
      for (int r = 0; r < 16; ++r) t[k][r] = lv.level(k)[reverse_bits(r & ((1 << k) - 1), k)];
    for (int r = 0; r < 32; ++r) t5[r] = lv.l5[reverse_bits(r, 5)];
    for (int r = 0; r < 64; ++r) {
      int p = reverse_bits(r, 6);
      ta[r] = lv.l7[2 * p];
      tb[r] = lv.l6[p];
      tc[r] = lv.l7[2 * p + 1];
    }
    l0 = _mm512_set1_ps(lv.l0[0]);
    l1 = _mm512_load_ps(t[1]);
    l2 = _mm512_load_ps(t[2]);
    l3 = _mm512_load_ps(t[3]);
    l4 = _mm512_load_ps(t[4]);
    for (int i = 0; i < 2; ++i) l5[i] = _mm512_load_ps(t5 + 16 * i);
    for (int i = 0; i < 4; ++i) {
      a[i] = _mm512_load_ps(ta + 16 * i);
      b[i] = _mm512_load_ps(tb + 16 * i);
      c[i] = _mm512_load_ps(tc + 16 * i);
    }
    // j = r + 64 d6 + 128 d7 with r the reversed 6-bit prefix p: slot = 4 p + 2 d6 + d7.
    alignas(64) uint8_t bytes[256];
    for (int j = 0; j < 256; ++j) bytes[j] = order[4 * reverse_bits(j & 63, 6) + 2 * ((j >> 6) & 1) + (j >> 7)];
    for (int i = 0; i < 4; ++i) code[i] = _mm512_load_si512(bytes + 64 * i);
  }
  template <int N>
  void slots(const __m512* s, __m512i* j) const {
    const __m512i b5 = _mm512_set1_epi32(32);
    auto step = [&](int v, __m512 m, int bit) {
      j[v] = _mm512_mask_add_epi32(j[v], _mm512_cmp_ps_mask(s[v], m, _CMP_NLE_UQ), j[v], _mm512_set1_epi32(bit));
    };
    for (int v = 0; v < N; ++v)
      j[v] = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(s[v], l0, _CMP_NLE_UQ), _mm512_set1_epi32(1));
    for (int v = 0; v < N; ++v) step(v, _mm512_permutexvar_ps(j[v], l1), 2);
    for (int v = 0; v < N; ++v) step(v, _mm512_permutexvar_ps(j[v], l2), 4);
    for (int v = 0; v < N; ++v) step(v, _mm512_permutexvar_ps(j[v], l3), 8);
    for (int v = 0; v < N; ++v) step(v, _mm512_permutexvar_ps(j[v], l4), 16);
    for (int v = 0; v < N; ++v) step(v, _mm512_permutex2var_ps(l5[0], j[v], l5[1]), 32);
    for (int v = 0; v < N; ++v) {
      __mmask16 hi = _mm512_test_epi32_mask(j[v], b5);
      __m512 ma = Quant8::lookup64(a, j[v], hi), mb = Quant8::lookup64(b, j[v], hi), mc = Quant8::lookup64(c, j[v], hi);
      __mmask16 up = _mm512_cmp_ps_mask(s[v], mb, _CMP_NLE_UQ);
      __mmask16 up2 = _mm512_cmp_ps_mask(s[v], _mm512_mask_blend_ps(up, ma, mc), _CMP_NLE_UQ);
      j[v] = _mm512_mask_add_epi32(j[v], up, j[v], _mm512_set1_epi32(64));
      j[v] = _mm512_mask_add_epi32(j[v], up2, j[v], _mm512_set1_epi32(128));
    }
  }
};

// 64 G values at x + i -> their codes at o + i. Clamp: whether s must be clamped to [-1, 1] (not when
// every midpoint lies strictly inside, where the clamp never changes a slot).
template <DType D, bool Full, bool Clamp, bool Stream, int G>
BNB_VBMI_TARGET inline void quantize64_vbmi(const typename Elem<D>::T* x, int64_t i, const float* fac, int shift,
                                            const Quant8Vbmi& q, uint8_t* o) {
  constexpr int N = 4 * G;
  __m512 v[N];
  __m512i j[N];
  for (int k = 0; k < N; ++k) {
    const __m512 f = _mm512_set1_ps(fac[(i + 16 * k) >> shift]);
    v[k] = load16<D>(x + i + 16 * k);
    v[k] = Full ? _mm512_mul_ps(v[k], f) : _mm512_div_ps(v[k], f);
    // min/max return their second operand when one is NaN: NaN is kept.
    if (Clamp) v[k] = _mm512_max_ps(_mm512_set1_ps(-1.0f), _mm512_min_ps(_mm512_set1_ps(1.0f), v[k]));
  }
  q.slots<N>(v, j);
  alignas(64) static const uint8_t pick[64] = {
      0,  2,  4,  6,  16, 18, 20, 22, 32, 34, 36,  38,  48,  50,  52,  54,    // j0
      8,  10, 12, 14, 24, 26, 28, 30, 40, 42, 44,  46,  56,  58,  60,  62,    // j1
      64, 66, 68, 70, 80, 82, 84, 86, 96, 98, 100, 102, 112, 114, 116, 118,  // j2
      72, 74, 76, 78, 88, 90, 92, 94, 104, 106, 108, 110, 120, 122, 124, 126};  // j3
  for (int g = 0; g < G; ++g) {
    // Words of j0 j1 and of j2 j3 (lane-interleaved by packs); one vpermt2b takes their low bytes in order.
    __m512i w01 = _mm512_packs_epi32(j[4 * g], j[4 * g + 1]), w23 = _mm512_packs_epi32(j[4 * g + 2], j[4 * g + 3]);
    __m512i idx = _mm512_permutex2var_epi8(w01, _mm512_load_si512(pick), w23);
    // code[idx]: bit 6 picks within each 128-byte half, bit 7 between the halves.
    __m512i lo = _mm512_permutex2var_epi8(q.code[0], idx, q.code[1]);
    __m512i hi = _mm512_permutex2var_epi8(q.code[2], idx, q.code[3]);
    __m512i codes = _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi);
    if (Stream)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(o + i + 64 * g), codes);
    else
      _mm512_storeu_si512(o + i + 64 * g, codes);
  }
}

// Codes (not slots) of the first len - len % 64 values; returns how many it did.
template <DType D, bool Full, bool Clamp>
BNB_VBMI_TARGET int64_t quantize_simd_vbmi(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift,
                                           const Quant8Vbmi& q, uint8_t* o) {
  int64_t i = 0;
  // Streaming stores (aligned, so only when o is) skip reading the output lines before writing them.
  if (reinterpret_cast<uintptr_t>(o) % 64 == 0) {
    for (; i + 128 <= len; i += 128) {
      prefetch_next_group(x, i, 128);
      quantize64_vbmi<D, Full, Clamp, true, 2>(x, i, fac, shift, q, o);
    }
  }
  for (; i + 128 <= len; i += 128) {
    prefetch_next_group(x, i, 128);
    quantize64_vbmi<D, Full, Clamp, false, 2>(x, i, fac, shift, q, o);
  }
  for (; i + 64 <= len; i += 64) quantize64_vbmi<D, Full, Clamp, false, 1>(x, i, fac, shift, q, o);
  return i;
}
#endif  // GNUC
#elif defined(BNB_ISA_AVX2)
// Steps 0-3 look up with vpermps (8 entries), step 4 blends two of them, steps 5-7 gather from L1.
struct Quant8 {
  const SearchLevels& lv;
  __m256 l0, l1, l2, l3, l4[2];
  explicit Quant8(const SearchLevels& levels) : lv(levels) {
    l0 = _mm256_set1_ps(lv.l0[0]);
    l1 = _mm256_load_ps(lv.l1);
    l2 = _mm256_load_ps(lv.l2);
    l3 = _mm256_load_ps(lv.l3);
    l4[0] = _mm256_load_ps(lv.l4);
    l4[1] = _mm256_load_ps(lv.l4 + 8);
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
    j = step(j, s, _mm256_i32gather_ps(lv.l5, j, 4));
    j = step(j, s, _mm256_i32gather_ps(lv.l6, j, 4));
    return step(j, s, _mm256_i32gather_ps(lv.l7, j, 4));
  }
};

template <DType D, bool Full>
int64_t quantize_simd(const typename Elem<D>::T* x, int64_t len, const float* fac, int shift, const Quant8& q,
                      uint8_t* o) {
  const __m256 one = _mm256_set1_ps(1.0f), minus_one = _mm256_set1_ps(-1.0f);
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256i j[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 f = _mm256_set1_ps(fac[(i + 8 * k) >> shift]);
      __m256 v = load8<D>(x + i + 8 * k);
      v = Full ? _mm256_mul_ps(v, f) : _mm256_div_ps(v, f);
      v = _mm256_max_ps(minus_one, _mm256_min_ps(one, v));
      j[k] = q.slot(v);
    }
    __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(j[0], j[1]), _mm256_packs_epi32(j[2], j[3]));
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), bytes);
  }
  return i;
}
#endif

// Whether quantize_blockwise may take the AVX512-VBMI route (tests turn it off to run the other).
std::atomic<bool> g_vbmi{true};

bool cpu_has_vbmi() {
#if defined(BNB_VBMI_PATH)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vbmi");
#else
  return false;
#endif
}

template <DType D>
void quantize_blocks(const typename Elem<D>::T* A, int64_t n, const SearchLevels& lv, const uint8_t* order,
                     bool identity, bool inside, bool vbmi, int64_t blocksize, uint8_t* out, float* absmax,
                     int64_t b0, int64_t b1) {
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
  const Quant8 q(lv);
#endif
#if defined(BNB_VBMI_PATH)
  alignas(64) unsigned char qv_storage[sizeof(Quant8Vbmi)];
  const Quant8Vbmi* qv = vbmi ? new (qv_storage) Quant8Vbmi(lv, order) : nullptr;
#else
  (void)vbmi;
  (void)inside;
#endif
  auto body = [&](auto full, int64_t first, int64_t len, const float* fac, int shift) {
    constexpr bool Full = decltype(full)::value;
    const typename Elem<D>::T* x = A + first;
    uint8_t* o = out + first;
    int64_t i = 0, coded = 0;  // o[0, coded) hold codes already, o[coded, i) slots
#if defined(BNB_VBMI_PATH)
    if (qv) {
      // Codes of all but the last len % 64 values, which the slot loops below finish.
      coded = i = inside ? quantize_simd_vbmi<D, Full, false>(x, len, fac, shift, *qv, o)
                         : quantize_simd_vbmi<D, Full, true>(x, len, fac, shift, *qv, o);
    } else
#endif
    {
#if defined(BNB_ISA_AVX512) || defined(BNB_ISA_AVX2)
      i = quantize_simd<D, Full>(x, len, fac, shift, q, o);
#endif
    }
    for (; i + 8 <= len; i += 8) {
      float s[8];
      for (int v = 0; v < 8; ++v) s[v] = scale_value<Full>(Elem<D>::load(x[i + v]), fac[(i + v) >> shift]);
      slot8x8(lv, s, o + i);
    }
    for (; i < len; ++i) o[i] = uint8_t(slot8(lv, scale_value<Full>(Elem<D>::load(x[i]), fac[i >> shift])));
    // Slot -> code (a map that is not sorted by value; the maps bitsandbytes builds all are).
    if (!identity)
      for (int64_t k = coded; k < len; ++k) o[k] = order[o[k]];
  };
  scale_blocks<D>(A, n, blocksize, absmax, b0, b1, body);
#if defined(BNB_VBMI_PATH)
  if (qv) _mm_sfence();  // streamed stores are weakly ordered
#endif
}

template <DType D>
void dequantize_block(const uint8_t* A, float scale, const float* code, int64_t len, typename Elem<D>::T* out) {
  int64_t i = 0;
#if defined(BNB_ISA_AVX512)
  // The 256-entry map in 16 registers: vpermt2ps reads 32 entries by the low 5 index bits, and bits
  // 5-7 pick among the 8 results (cheaper than a gather on cores where gathers are microcoded).
  const __m512 s = _mm512_set1_ps(scale);
  __m512 t[16];
  for (int k = 0; k < 16; ++k) t[k] = _mm512_loadu_ps(code + 16 * k);
  const __m512i b5 = _mm512_set1_epi32(32), b6 = _mm512_set1_epi32(64), b7 = _mm512_set1_epi32(128);
  for (; i + 16 <= len; i += 16) {
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(A + i)));
    __mmask16 k5 = _mm512_test_epi32_mask(idx, b5), k6 = _mm512_test_epi32_mask(idx, b6),
              k7 = _mm512_test_epi32_mask(idx, b7);
    __m512 r[4];
    for (int q = 0; q < 4; ++q)
      r[q] = _mm512_mask_blend_ps(k5, _mm512_permutex2var_ps(t[4 * q], idx, t[4 * q + 1]),
                                  _mm512_permutex2var_ps(t[4 * q + 2], idx, t[4 * q + 3]));
    __m512 v = _mm512_mask_blend_ps(k7, _mm512_mask_blend_ps(k6, r[0], r[1]), _mm512_mask_blend_ps(k6, r[2], r[3]));
    store16<D>(out + i, _mm512_mul_ps(v, s));
  }
#elif defined(BNB_ISA_AVX2)
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= len; i += 8) {
    __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(A + i)));
    store8<D>(out + i, _mm256_mul_ps(_mm256_i32gather_ps(code, idx, 4), s));
  }
#endif
  for (; i < len; ++i) out[i] = Elem<D>::store(code[A[i]] * scale);
}

}  // namespace

void quantize_blockwise(const void* A, DType dtype, int64_t n, const float* mids, const uint8_t* order,
                        int64_t blocksize, uint8_t* out, float* absmax, int threads) {
  if (n <= 0) return;
  int64_t blocks = (n + blocksize - 1) / blocksize;
  const SearchLevels lv(mids);
  const bool identity = is_identity(order);
  bool inside = true;  // every midpoint strictly inside (-1, 1): the clamp never changes a slot
  for (int i = 0; i < 255; ++i) inside &= mids[i] > -1.0f && mids[i] < 1.0f;
  const bool vbmi = g_vbmi.load(std::memory_order_relaxed) && cpu_has_vbmi();
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* x = static_cast<const typename Elem<D>::T*>(A);
    parallel_for(blocks, (1 << 16) / blocksize + 1, threads, [&](int64_t b0, int64_t b1) {
      quantize_blocks<D>(x, n, lv, order, identity, inside, vbmi, blocksize, out, absmax, b0, b1);
    });
  });
}

void set_quantize_blockwise_vbmi(bool on) { g_vbmi.store(on); }
bool quantize_blockwise_vbmi() { return g_vbmi.load() && cpu_has_vbmi(); }

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
