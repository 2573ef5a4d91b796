#include "kernels/matmul_4bit.h"

#include <bitsandbytes/formats.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "isa.h"
#include "kernels/bf16_codes.h"
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

// Weights per SIMD step of the fast path: 16 bytes (AVX-512) or 8 bytes (AVX2) of packed codes give one
// register of even-position (high nibble) and one of odd-position (low nibble) weights. A is stored
// de-interleaved to match (each chunk: its even positions, then its odd ones), so no shuffles are needed
// in the inner loop. 0: no fast path at this ISA level (everything takes the generic path).
#if defined(BNB_ISA_AVX512)
constexpr int64_t kChunk = 32;
#elif defined(BNB_ISA_AVX2)
constexpr int64_t kChunk = 16;
#elif defined(BNB_ISA_NEON)
constexpr int64_t kChunk = 16;  // 8 bytes of codes: 8 even-position weights, then 8 odd
#else
constexpr int64_t kChunk = 0;
#endif

// Rows of A handled per pass over a weight row (each decoded weight is reused this many times).
constexpr int kMaxRows = 4;

// Converts A ([M, K] of D) to fp32, de-interleaving each chunk of `chunk` values when chunk > 0.
template <DType D>
void load_A(const typename Elem<D>::T* A, int64_t M, int64_t K, int64_t chunk, float* buf) {
  const int64_t n = M * K;
  if (chunk == 0) {
    for (int64_t i = 0; i < n; ++i) buf[i] = Elem<D>::load(A[i]);
    return;
  }
  const int64_t half = chunk / 2;
  for (int64_t c = 0; c < n; c += chunk) {
    for (int64_t j = 0; j < half; ++j) {
      buf[c + j] = Elem<D>::load(A[c + 2 * j]);
      buf[c + half + j] = Elem<D>::load(A[c + 2 * j + 1]);
    }
  }
}

// The weight row at flat offset `base` walked in segments that share one block scale: calls
// seg(k0, k1, block) for consecutive [k0, k1) covering [0, K). blocksize is a power of two (shifts, not
// divisions: this runs once per block).
template <class Seg>
inline void for_each_segment(int64_t base, int64_t K, int64_t blocksize, Seg&& seg) {
  int shift = 0;
  while ((int64_t(1) << shift) < blocksize) ++shift;
  int64_t k = 0;
  if (((base | K) & (blocksize - 1)) == 0) {  // whole blocks: the common case
    for (int64_t b = base >> shift; k < K; k += blocksize, ++b) seg(k, k + blocksize, b);
    return;
  }
  while (k < K) {
    const int64_t b = (base + k) >> shift;
    const int64_t kend = std::min(K, ((b + 1) << shift) - base);
    seg(k, kend, b);
    k = kend;
  }
}

// Any alignment (odd K, rows starting mid-byte, blocks ending mid-row). A in natural layout.
template <int R>
void row_generic(const uint8_t* B, int64_t base, int64_t K, const float* absmax, int64_t blocksize, const float* code,
                 const float* a, int64_t lda, float* res) {
  float acc_e[R], acc_o[R];
  for (int r = 0; r < R; ++r) acc_e[r] = acc_o[r] = 0.0f;
  for_each_segment(base, K, blocksize, [&](int64_t k, int64_t kend, int64_t b) {
    float tab[16];
    const float s = absmax[b];
    for (int i = 0; i < 16; ++i) tab[i] = code[i] * s;
    if (k < kend && ((base + k) & 1)) {  // row or segment starts on a low nibble
      const float w = tab[B[(base + k) >> 1] & 15];
      for (int r = 0; r < R; ++r) acc_o[r] += w * a[r * lda + k];
      ++k;
    }
    for (; k + 2 <= kend; k += 2) {
      const uint8_t byte = B[(base + k) >> 1];
      const float we = tab[byte >> 4], wo = tab[byte & 15];
      for (int r = 0; r < R; ++r) {
        acc_e[r] += we * a[r * lda + k];
        acc_o[r] += wo * a[r * lda + k + 1];
      }
    }
    if (k < kend) {
      const float w = tab[B[(base + k) >> 1] >> 4];
      for (int r = 0; r < R; ++r) acc_e[r] += w * a[r * lda + k];
    }
  });
  for (int r = 0; r < R; ++r) res[r] = acc_e[r] + acc_o[r];
}

#if defined(BNB_ISA_AVX512)
// K % 32 == 0: rows start on a byte and every block boundary falls on a chunk boundary. The 16-entry
// table scaled by the block's absmax (fp32, exactly the reference's weights) sits in one register;
// vpermps looks up 16 codes at once and ignores the index bits above the low 4, so the low nibble
// needs no masking.
template <int R>
void row_fast(const uint8_t* B, int64_t base, int64_t K, const float* absmax, int64_t blocksize, const float* code,
              const float* a, int64_t lda, float* res) {
  constexpr int U = R <= 2 ? 2 : 1;  // chunks per step: more independent FMA chains for few rows
  const uint8_t* row = B + base / 2;
  const __m512 ctab = _mm512_loadu_ps(code);
  __m512 acc[U][R][2];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) acc[u][r][0] = acc[u][r][1] = _mm512_setzero_ps();
  for_each_segment(base, K, blocksize, [&](int64_t k, int64_t kend, int64_t b) {
    const __m512 tab = _mm512_mul_ps(ctab, _mm512_set1_ps(absmax[b]));
    auto step = [&](int u, int64_t kk) {
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + kk / 2)));
      const __m512 wo = _mm512_permutexvar_ps(bytes, tab);
      const __m512 we = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), tab);
      for (int r = 0; r < R; ++r) {
        acc[u][r][0] = _mm512_fmadd_ps(we, _mm512_loadu_ps(a + r * lda + kk), acc[u][r][0]);
        acc[u][r][1] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(a + r * lda + kk + 16), acc[u][r][1]);
      }
    };
    for (; k + 32 * U <= kend; k += 32 * U)
      for (int u = 0; u < U; ++u) step(u, k + 32 * u);
    for (; k < kend; k += 32) step(0, k);
  });
  for (int r = 0; r < R; ++r) {
    __m512 s = _mm512_add_ps(acc[0][r][0], acc[0][r][1]);
    for (int u = 1; u < U; ++u) s = _mm512_add_ps(s, _mm512_add_ps(acc[u][r][0], acc[u][r][1]));
    res[r] = _mm512_reduce_add_ps(s);
  }
}
#elif defined(BNB_ISA_AVX2)
// K % 16 == 0. Two 8-entry halves of the scaled table; bit 3 of the code (moved to the sign bit)
// chooses between the two permutes.
inline __m256 lookup16(__m256 lo, __m256 hi, __m256i idx, __m256i sel) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                          _mm256_castsi256_ps(sel));
}

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R>
void row_fast(const uint8_t* B, int64_t base, int64_t K, const float* absmax, int64_t blocksize, const float* code,
              const float* a, int64_t lda, float* res) {
  constexpr int U = R <= 2 ? 2 : 1;
  const uint8_t* row = B + base / 2;
  const __m256 clo = _mm256_loadu_ps(code), chi = _mm256_loadu_ps(code + 8);
  __m256 acc[U][R][2];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) acc[u][r][0] = acc[u][r][1] = _mm256_setzero_ps();
  for_each_segment(base, K, blocksize, [&](int64_t k, int64_t kend, int64_t b) {
    const __m256 s = _mm256_set1_ps(absmax[b]);
    const __m256 tlo = _mm256_mul_ps(clo, s), thi = _mm256_mul_ps(chi, s);
    auto step = [&](int u, int64_t kk) {
      const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + kk / 2)));
      const __m256 wo = lookup16(tlo, thi, bytes, _mm256_slli_epi32(bytes, 28));
      const __m256 we = lookup16(tlo, thi, _mm256_srli_epi32(bytes, 4), _mm256_slli_epi32(bytes, 24));
      for (int r = 0; r < R; ++r) {
        acc[u][r][0] = _mm256_fmadd_ps(we, _mm256_loadu_ps(a + r * lda + kk), acc[u][r][0]);
        acc[u][r][1] = _mm256_fmadd_ps(wo, _mm256_loadu_ps(a + r * lda + kk + 8), acc[u][r][1]);
      }
    };
    for (; k + 16 * U <= kend; k += 16 * U)
      for (int u = 0; u < U; ++u) step(u, k + 16 * u);
    for (; k < kend; k += 16) step(0, k);
  });
  for (int r = 0; r < R; ++r) {
    __m256 s = _mm256_add_ps(acc[0][r][0], acc[0][r][1]);
    for (int u = 1; u < U; ++u) s = _mm256_add_ps(s, _mm256_add_ps(acc[u][r][0], acc[u][r][1]));
    res[r] = hsum256(s);
  }
}

#define BNB_GEMV_AVX2_SHUF 1
// K % 64 == 0, blocksize >= 64: the vpermps lookups above cost about 4 shuffles per 8 weights, and that,
// not memory, bounds them. Here vpshufb looks up 32 codes at a time in 16-byte tables of the codes'
// bytes (one table per byte of the weight's encoding), and byte/word unpacks assemble the fp32 weights.
// The tables do not depend on the block: the block's scale multiplies the chunk's partial sum instead
// (one FMA per 64 weights), so nothing is rebuilt per block. A is fp32, each chunk of 64 permuted to the
// order the weights come out in (Decoder::perm).
//
// Bf16Decoder (bf16 A): the codes rounded to bf16, two byte tables, a shift or a mask widens the words
// to fp32: 4 shuffles per 32 weights. Products bf16(code) * a are exact in fp32; the result differs from
// the reference (which rounds code * absmax to bf16) by about one bf16 rounding per weight, inside its
// tolerance (2 bf16 eps per |a| |w|).
// F32Decoder (fp32 and fp16 A): the exact fp32 codes, four byte tables, 12 shuffles per 32 weights
// (against about 16 for vpermps). The weights are the reference's code values; the block scale applied
// to the chunk sum instead of to each weight changes each product by about one fp32 rounding.
//
// Position p of a 64-chunk of A (register p / 8, lane element p % 8) holds the value at k = perm[p]:
// register r = 4 * parity + g (parity 0: high nibbles, the even positions), element i in 128-bit lane
// i / 4, and the byte of the chunk that element came from is what g and i / 4 select per decoder.
struct ChunkPerm {
  int8_t k[64];
  template <class ByteOf>
  constexpr explicit ChunkPerm(ByteOf byte_of) : k() {
    for (int r = 0; r < 8; ++r)
      for (int i = 0; i < 8; ++i) k[r * 8 + i] = int8_t(2 * byte_of(r % 4, i / 4, i % 4) + r / 4);
  }
};

inline __m256i byte_table(const uint8_t (&t)[16]) {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
}

// The 32 high-nibble and 32 low-nibble indices of 32 packed bytes.
inline void nibbles(const uint8_t* p, __m256i (&idx)[2]) {
  const __m256i nib = _mm256_set1_epi8(0x0f);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  idx[0] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
  idx[1] = _mm256_and_si256(v, nib);
}

struct Bf16Decoder {
  __m256i lo, hi;
  explicit Bf16Decoder(const float* code) {
    uint8_t l[16], h[16];
    for (int i = 0; i < 16; ++i) {
      const uint16_t b = float_to_bf16(code[i]);
      l[i] = uint8_t(b & 0xff);
      h[i] = uint8_t(b >> 8);
    }
    lo = byte_table(l);
    hi = byte_table(h);
  }
  // Register g of a parity: unpack lo (g < 2) or hi (g >= 2) of the bytes, then the dword's low word
  // (g even: bytes 0, 2, 4, 6 of the half lane) or its high word (g odd).
  static constexpr int byte_of(int g, int lane, int d) { return 16 * lane + 8 * (g / 2) + 2 * d + g % 2; }
  void decode(const uint8_t* p, __m256 (&w)[8]) const {
    const __m256i himask = _mm256_set1_epi32(int(0xffff0000u));
    __m256i idx[2];
    nibbles(p, idx);
    for (int par = 0; par < 2; ++par) {
      const __m256i L = _mm256_shuffle_epi8(lo, idx[par]), H = _mm256_shuffle_epi8(hi, idx[par]);
      const __m256i u0 = _mm256_unpacklo_epi8(L, H), u1 = _mm256_unpackhi_epi8(L, H);
      w[4 * par + 0] = _mm256_castsi256_ps(_mm256_slli_epi32(u0, 16));
      w[4 * par + 1] = _mm256_castsi256_ps(_mm256_and_si256(u0, himask));
      w[4 * par + 2] = _mm256_castsi256_ps(_mm256_slli_epi32(u1, 16));
      w[4 * par + 3] = _mm256_castsi256_ps(_mm256_and_si256(u1, himask));
    }
  }
};

struct F32Decoder {
  __m256i b[4];  // byte j of each code's fp32 encoding
  explicit F32Decoder(const float* code) {
    uint8_t t[4][16];
    for (int i = 0; i < 16; ++i) {
      uint32_t u;
      std::memcpy(&u, code + i, 4);
      for (int j = 0; j < 4; ++j) t[j][i] = uint8_t(u >> (8 * j));
    }
    for (int j = 0; j < 4; ++j) b[j] = byte_table(t[j]);
  }
  // Register g of a parity: bytes 4g .. 4g + 3 of the half lane, in order.
  static constexpr int byte_of(int g, int lane, int d) { return 16 * lane + 4 * g + d; }
  void decode(const uint8_t* p, __m256 (&w)[8]) const {
    __m256i idx[2];
    nibbles(p, idx);
    for (int par = 0; par < 2; ++par) {
      const __m256i P0 = _mm256_shuffle_epi8(b[0], idx[par]), P1 = _mm256_shuffle_epi8(b[1], idx[par]);
      const __m256i P2 = _mm256_shuffle_epi8(b[2], idx[par]), P3 = _mm256_shuffle_epi8(b[3], idx[par]);
      const __m256i lo0 = _mm256_unpacklo_epi8(P0, P1), lo1 = _mm256_unpackhi_epi8(P0, P1);
      const __m256i hi0 = _mm256_unpacklo_epi8(P2, P3), hi1 = _mm256_unpackhi_epi8(P2, P3);
      w[4 * par + 0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(lo0, hi0));
      w[4 * par + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(lo0, hi0));
      w[4 * par + 2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(lo1, hi1));
      w[4 * par + 3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(lo1, hi1));
    }
  }
};

template <class Dec>
struct PermOf {
  static constexpr ChunkPerm value{[](int g, int lane, int d) { return Dec::byte_of(g, lane, d); }};
};

template <class Dec, int R>
inline void chunk_shuf(const uint8_t* row, int64_t k, const Dec& dec, __m256 s, const float* a, int64_t lda,
                       __m256 (&acc)[R]) {
  __m256 w[8];
  dec.decode(row + k / 2, w);
  for (int r = 0; r < R; ++r) {
    const float* ar = a + r * lda + k;
    __m256 t0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(ar)), t1 = _mm256_mul_ps(w[1], _mm256_loadu_ps(ar + 8));
    for (int j = 2; j < 8; j += 2) {
      t0 = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(ar + 8 * j), t0);
      t1 = _mm256_fmadd_ps(w[j + 1], _mm256_loadu_ps(ar + 8 * j + 8), t1);
    }
    acc[r] = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), s, acc[r]);
  }
}

template <class Dec, int R>
void row_shuf(const uint8_t* B, int64_t base, int64_t K, const float* absmax, int shift, const Dec& dec, const float* a,
              int64_t lda, float* res) {
  const uint8_t* row = B + base / 2;
  __m256 acc0[R], acc1[R];  // even and odd chunks: two dependency chains
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 128 <= K; k += 128) {
    chunk_shuf<Dec, R>(row, k, dec, _mm256_broadcast_ss(absmax + ((base + k) >> shift)), a, lda, acc0);
    chunk_shuf<Dec, R>(row, k + 64, dec, _mm256_broadcast_ss(absmax + ((base + k + 64) >> shift)), a, lda, acc1);
  }
  if (k < K) chunk_shuf<Dec, R>(row, k, dec, _mm256_broadcast_ss(absmax + ((base + k) >> shift)), a, lda, acc0);
  for (int r = 0; r < R; ++r) res[r] = hsum256(_mm256_add_ps(acc0[r], acc1[r]));
}
#elif defined(BNB_ISA_NEON)
// K % 16 == 0. The 8 high nibbles (even positions) and 8 low nibbles (odd) of 8 code bytes form one index
// vector in the order of A's de-interleaved chunk; four TBLs on the byte planes of the block's scaled
// table (fp32, exactly the reference's weights) give the 16 weights.
template <int R>
void row_fast(const uint8_t* B, int64_t base, int64_t K, const float* absmax, int64_t blocksize, const float* code,
              const float* a, int64_t lda, float* res) {
  const uint8_t* row = B + base / 2;
  float32x4_t acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = vdupq_n_f32(0.0f);
  for_each_segment(base, K, blocksize, [&](int64_t k, int64_t kend, int64_t b) {
    alignas(16) float tab[16];
    const float s = absmax[b];
    for (int i = 0; i < 16; ++i) tab[i] = code[i] * s;
    const neon_simd::Planes32 pl(tab);
    for (; k < kend; k += 16) {
      const uint8x8_t bytes = vld1_u8(row + k / 2);
      float32x4_t w[4];
      pl.lookup(vcombine_u8(vshr_n_u8(bytes, 4), vand_u8(bytes, vdup_n_u8(15))), w);
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = vfmaq_f32(acc[r][j], w[j], vld1q_f32(a + r * lda + k + 4 * j));
    }
  });
  for (int r = 0; r < R; ++r)
    res[r] = vaddvq_f32(vaddq_f32(vaddq_f32(acc[r][0], acc[r][1]), vaddq_f32(acc[r][2], acc[r][3])));
}
#else
template <int R>
void row_fast(const uint8_t* B, int64_t base, int64_t K, const float* absmax, int64_t blocksize, const float* code,
              const float* a, int64_t lda, float* res) {
  row_generic<R>(B, base, K, absmax, blocksize, code, a, lda, res);
}
#endif

#if defined(BNB_ISA_AVX512)
#define BNB_GEMV_NIBBLE_SHIFT 1
// M == 1 with fp32 A (fp16 and bf16 A converted to it), K % 128 == 0, blocksize >= 64. 64 packed bytes are
// 128 weights; shifting the 16 dwords right by 4 s bits brings nibble s of each dword to its low 4 bits,
// and vpermps reads only those: 8 lookups per 128 weights and no unpacking (vpmovzxbd per 32 weights, a
// cross-lane shuffle like the lookups, made the row_fast loop shuffle-bound). A is permuted once per call to
// the order the weights come out in (perm_A128). The table holds the exact fp32 codes and each block's
// partial sum is scaled by its absmax (lanes 0-7 and 8-15 are two blocks when blocksize is 64): the
// weights are the reference's code values, each product differs from the reference's (code * absmax) * a
// by about one fp32 rounding.
//
// Register s, lane j of a 128-chunk holds k = 8 j + (s ^ 1): nibble s of dword j is the low nibble (odd
// position) of byte s / 2 when s is even, its high nibble (even position) when s is odd.
void perm_A128(const float* a, int64_t K, float* out) {
  for (int64_t c = 0; c < K; c += 128)
    for (int s = 0; s < 8; ++s)
      for (int j = 0; j < 16; ++j) out[c + 16 * s + j] = a[c + 8 * j + (s ^ 1)];
}

// The batch-1 kernels read ROWS weight rows side by side: streams too short for the hardware prefetcher to
// train on, so each step prefetches the line at the same offset of the next ROWS rows into L1 (measured
// on Zen 5, weights streaming from DRAM: 0.42 ms per 4096 x 4096 layer without, 0.20 with; two pairs
// ahead was no better), and the line kFarPrefetch further on into L2. One core has only so many L1 misses
// in flight; the L2 prefetch keeps more DRAM reads going (an AMX Xeon, 2 threads, bf16, 100 layers of
// 4096 x 4096 streaming: 0.90-0.98 ms per layer without it, 0.77-0.85 with it at 8-32 KiB or 3-4 pairs
// ahead; 4096 x 11008 and 11008 x 4096: 2.21-2.25 against 1.79-1.94; the same within noise with the
// weight in L3). A prefetch past the end of the weights never faults.
constexpr int64_t kFarPrefetch = 12 << 10;
inline void prefetch_rows(const char* next) {
  _mm_prefetch(next, _MM_HINT_T0);
  _mm_prefetch(next + kFarPrefetch, _MM_HINT_T1);
}

// ROWS consecutive weight rows from base0, every row's sum computed by the same steps whatever ROWS is (a
// row's result does not depend on the thread split). The next rows are prefetched (prefetch_rows).
template <int ROWS>
void rows_nibble_shift(const uint8_t* B, int64_t base0, int64_t K, const float* absmax, int shift, __m512 ctab,
                       const float* a, float* res) {
  const uint8_t* row0 = B + base0 / 2;
  const char* pf = reinterpret_cast<const char*>(row0 + ROWS * K / 2);
  const bool two_blocks = shift == 6;  // blocksize 64: each half of a chunk has its own scale
  __m512 acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < K; c += 128) {
    for (int r = 0; r < ROWS; ++r) prefetch_rows(pf + r * 64 + ROWS * (c / 2));
    __m512i v[ROWS];
    __m512 p[ROWS][2];
    for (int r = 0; r < ROWS; ++r) v[r] = _mm512_loadu_si512(row0 + r * K / 2 + c / 2);
#define BNB_NIBBLE_STEP(S)                                                                         \
  {                                                                                                \
    const __m512 x = _mm512_loadu_ps(a + c + 16 * (S));                                            \
    for (int r = 0; r < ROWS; ++r) {                                                               \
      const __m512 w = _mm512_permutexvar_ps((S) ? _mm512_srli_epi32(v[r], 4 * (S)) : v[r], ctab); \
      p[r][(S) & 1] = (S) < 2 ? _mm512_mul_ps(w, x) : _mm512_fmadd_ps(w, x, p[r][(S) & 1]);        \
    }                                                                                              \
  }
    BNB_NIBBLE_STEP(0)
    BNB_NIBBLE_STEP(1)
    BNB_NIBBLE_STEP(2)
    BNB_NIBBLE_STEP(3)
    BNB_NIBBLE_STEP(4)
    BNB_NIBBLE_STEP(5)
    BNB_NIBBLE_STEP(6)
    BNB_NIBBLE_STEP(7)
#undef BNB_NIBBLE_STEP
    const int parity = int(c >> 7) & 1;
    for (int r = 0; r < ROWS; ++r) {
      const int64_t b = (base0 + r * K + c) >> shift;
      __m512 scale = _mm512_set1_ps(absmax[b]);
      if (two_blocks) scale = _mm512_insertf32x8(scale, _mm256_set1_ps(absmax[b + 1]), 1);
      acc[r][parity] = _mm512_fmadd_ps(_mm512_add_ps(p[r][0], p[r][1]), scale, acc[r][parity]);
    }
  }
  for (int r = 0; r < ROWS; ++r) res[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

#endif

#if defined(BNB_ISA_AVX512) && (defined(__GNUC__) || defined(__clang__))
#define BNB_GEMV_BF16_DOT 1
// bf16 A on CPUs with AVX512-BF16: vdpbf16ps does 32 multiply-adds per instruction (twice the fp32 FMA
// rate) with fp32 accumulation. The block's table is scaled in fp32 and rounded to bf16: exactly the
// reference's weight rounded to A's dtype, so products are exact and only the summation order differs.
// A stays bf16, laid out once per call in the order the decode produces the weights. Needs halves of 64
// that never straddle a block: K % 64 == 0 and blocksize >= 64.
bool cpu_has_avx512bf16() {
  static const bool v = __builtin_cpu_supports("avx512bf16");
  return v;
}

// A (bf16) for the row kernels below: each 128-chunk of k in the order the weights come out of
// word_nibble_weights (four planes of 32: nibble s of word j is k = 4j + kWordNibbleK[s]), zeros past K up to
// the next multiple of 128 (a K % 128 == 64 tail reads the zero upper half of the table there).
inline int64_t bf16_chunked_len(int64_t K) { return (K + 127) / 128 * 128; }
void perm_A128_bf16(const uint16_t* x, int64_t K, uint16_t* out) {
  for (int64_t c = 0; c < K; c += 128)
    for (int s = 0; s < 4; ++s)
      for (int64_t j = 0; j < 32; ++j) {
        const int64_t k = c + 4 * j + kWordNibbleK[s];
        out[c + 32 * s + j] = k < K ? x[k] : uint16_t(0);
      }
}

// ROWS consecutive weight rows from base0 times R rows of A (lda apart, laid out by perm_A128_bf16).
// Every row's sum takes the same steps whatever ROWS and R are: four accumulators (one per nibble plane)
// over the chunks in order, added in one fixed order at the end, so a row's result does not depend on
// the thread split or on whether it ran in a pair. Pairs (ROWS 2, M == 1) share every load of A and
// prefetch the next pair (prefetch_rows).
template <int ROWS, int R>
BNB_BF16_TARGET void rows_bf16(const uint8_t* B, int64_t base0, int64_t K, const float* absmax, int64_t blocksize,
                               const float* code, const uint16_t* a, int64_t lda, float* res) {
  int shift = 0;
  while ((int64_t(1) << shift) < blocksize) ++shift;
  const uint8_t* row0 = B + base0 / 2;
  const char* pf = reinterpret_cast<const char*>(row0 + ROWS * K / 2);
  const __m512 ctab = _mm512_loadu_ps(code);
  __m512 acc[ROWS][R][4];
  for (int i = 0; i < ROWS; ++i)
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < 4; ++s) acc[i][r][s] = _mm512_setzero_ps();
  int64_t cur[ROWS][2];
  __m512i tab[ROWS];
  for (int i = 0; i < ROWS; ++i) {
    cur[i][0] = cur[i][1] = -1;
    tab[i] = _mm512_setzero_si512();
  }
  auto step = [&](int i, __m512i w, int64_t k) BNB_BF16_TARGET {
    const __m512i ws[4] = {word_nibble_weights<0>(w, tab[i]), word_nibble_weights<1>(w, tab[i]),
                           word_nibble_weights<2>(w, tab[i]), word_nibble_weights<3>(w, tab[i])};
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < 4; ++s)
        acc[i][r][s] =
            _mm512_dpbf16_ps(acc[i][r][s], (__m512bh)ws[s], (__m512bh)_mm512_loadu_si512(a + r * lda + k + 32 * s));
  };
  int64_t k = 0;
  for (; k + 128 <= K; k += 128) {
    if (ROWS > 1)
      for (int i = 0; i < ROWS; ++i) prefetch_rows(pf + i * 64 + ROWS * (k / 2));
    for (int i = 0; i < ROWS; ++i) {
      const int64_t f = base0 + i * K + k, lo = f >> shift, hi = (f + 64) >> shift;
      if (lo != cur[i][0] || hi != cur[i][1]) {
        tab[i] = bf16_table2(ctab, absmax[lo], absmax[hi]);
        cur[i][0] = lo;
        cur[i][1] = hi;
      }
      step(i, _mm512_loadu_si512(row0 + i * K / 2 + k / 2), k);
    }
  }
  if (k < K) {  // K % 128 == 64: one block's half; the upper half of the table is zero, as A is there
    for (int i = 0; i < ROWS; ++i) {
      tab[i] = bf16_table2(ctab, absmax[(base0 + i * K + k) >> shift], 0.0f);
      step(i, _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row0 + i * K / 2 + k / 2))),
           k);
    }
  }
  for (int i = 0; i < ROWS; ++i)
    for (int r = 0; r < R; ++r)
      res[i * R + r] = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(acc[i][r][0], acc[i][r][1]), _mm512_add_ps(acc[i][r][2], acc[i][r][3])));
}

// Many rows of A (bf16, AVX512-BF16): a register-blocked GEMM on weights decoded once per tile of C weight
// rows into a small bf16 buffer, multiplied against R rows of A at a time with R x C accumulators in
// registers. The weight never exists dequantized in memory beyond the tile. Both operands are stored
// tile-interleaved ([k / 32][row][32]): one sequential stream each, where rows K * 2 bytes apart would
// all land in the same L1 sets. Each output element is one fp32 accumulator over 32-value chunks in k
// order, then one horizontal sum: the same for every tile shape, so the result does not depend on how
// N or M are split (thread count, tails).
constexpr int kTileR = 6;  // rows of A per register tile (measured: 6 x 4 beats 8 x 3)
constexpr int kTileC = 4;  // weight rows per register tile (6 x 4 accumulators + 4 weights + 1 A)

// 64 bf16 of `src` de-interleaved: even positions to dst_e[0..32), odd to dst_o[0..32).
BNB_BF16_TARGET inline __attribute__((always_inline)) void split64(const uint16_t* src, uint16_t* dst_e,
                                                                   uint16_t* dst_o) {
  const __m512i ie = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24,
                                      22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i io = _mm512_add_epi16(ie, _mm512_set1_epi16(1));
  const __m512i x0 = _mm512_loadu_si512(src), x1 = _mm512_loadu_si512(src + 32);
  _mm512_storeu_si512(dst_e, _mm512_permutex2var_epi16(x0, ie, x1));
  _mm512_storeu_si512(dst_o, _mm512_permutex2var_epi16(x0, io, x1));
}

// A rows [0, M) into tiles of kTileR rows, tile t at t * kTileR * K, laid out [k / 32][r][32] with each
// 64-chunk de-interleaved (even positions as chunk 2c, odd as 2c + 1, matching the weight decode).
BNB_BF16_TARGET void pack_A_tiles(const uint16_t* x, int64_t M, int64_t K, uint16_t* dst, int threads) {
  const int64_t tiles = (M + kTileR - 1) / kTileR;
  parallel_for(tiles, 1, threads, [&](int64_t t0, int64_t t1) BNB_BF16_TARGET {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t R = std::min<int64_t>(kTileR, M - t * kTileR);
      uint16_t* d = dst + t * kTileR * K;
      for (int64_t r = 0; r < R; ++r) {
        const uint16_t* xr = x + (t * kTileR + r) * K;
        for (int64_t c = 0; c < K / 64; ++c)
          split64(xr + 64 * c, d + ((2 * c) * R + r) * 32, d + ((2 * c + 1) * R + r) * 32);
      }
    }
  });
}

// C weight rows from n0 decoded to bf16 as [k / 32][c][32] (chunk 2c: even positions of the 64-chunk).
BNB_BF16_TARGET void decode_rows_bf16(const uint8_t* B, int64_t n0, int64_t C, int64_t K, const float* absmax,
                                      int64_t blocksize, const float* code, uint16_t* wb) {
  int shift = 0;
  while ((int64_t(1) << shift) < blocksize) ++shift;
  const __m512 ctab = _mm512_loadu_ps(code);
  for (int64_t c = 0; c < C; ++c) {
    const int64_t base = (n0 + c) * K;
    const uint8_t* row = B + base / 2;
    int64_t cur = -1;
    __m512i tab = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 64) {
      const int64_t b = (base + k) >> shift;
      if (b != cur) tab = bf16_table(ctab, absmax[cur = b]);
      const __m512i w = load_codes64(row + k / 2);
      uint16_t* o = wb + (k / 32) * C * 32 + c * 32;
      _mm512_storeu_si512(o, even_weights(w, tab));
      _mm512_storeu_si512(o + C * 32, odd_weights(w, tab));
    }
  }
}

// One R x C register tile over k in [0, klen): accumulators start at zero (first) or from acc, end as
// horizontal sums in res (last) or back in acc. Stored and reloaded fp32 accumulators are exact, so a
// K split into pieces sums every lane in the same order as one pass.
template <int R, int C>
BNB_BF16_TARGET __attribute__((noinline)) void tile_bf16(const uint16_t* a, const uint16_t* wb, int64_t klen,
                                                         __m512* accm, bool first, bool last, float (*res)[kTileC]) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = first ? _mm512_setzero_ps() : accm[r * C + c];
  for (int64_t k = 0; k < klen; k += 32, a += R * 32, wb += C * 32) {
    __m512i w[C];
    for (int c = 0; c < C; ++c) w[c] = _mm512_loadu_si512(wb + c * 32);
    for (int r = 0; r < R; ++r) {
      const __m512i x = _mm512_loadu_si512(a + r * 32);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)w[c], (__m512bh)x);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      if (last)
        res[r][c] = _mm512_reduce_add_ps(acc[r][c]);
      else
        accm[r * C + c] = acc[r][c];
    }
}

template <int C>
BNB_BF16_TARGET void tile_rows_bf16(int64_t R, const uint16_t* a, const uint16_t* wb, int64_t klen, __m512* accm,
                                    bool first, bool last, float (*res)[kTileC]) {
  switch (R) {
    case 1:
      tile_bf16<1, C>(a, wb, klen, accm, first, last, res);
      break;
    case 2:
      tile_bf16<2, C>(a, wb, klen, accm, first, last, res);
      break;
    case 3:
      tile_bf16<3, C>(a, wb, klen, accm, first, last, res);
      break;
    case 4:
      tile_bf16<4, C>(a, wb, klen, accm, first, last, res);
      break;
    case 5:
      tile_bf16<5, C>(a, wb, klen, accm, first, last, res);
      break;
    default:
      tile_bf16<kTileR, C>(a, wb, klen, accm, first, last, res);
      break;
  }
}

// Measured on Zen 4 (1 MiB L2): one weight tile per group and whole-K passes (4096) beat smaller k-slices
// (the accumulator store/reload per slice costs more than the L1 reuse gains).
constexpr int64_t bf16_group_tiles = 1;           // weight tiles decoded together
constexpr int64_t bf16_ablock_bytes = 512 << 10;  // rows of A per pass over the weights: this much bf16 A
constexpr int64_t bf16_kblock = 4096;  // k per pass; larger K is split so an A block of many rows still fits in L2

// out = A @ W.T for all M x N; a = pack_A_tiles output. Parallel over groups of weight tiles: each group
// is decoded once, then every A tile is multiplied into it one k-slice at a time.
BNB_BF16_TARGET void gemm_tiles_bf16(const uint16_t* a, int64_t M, int64_t N, int64_t K, const uint8_t* B,
                                     const float* absmax, int64_t blocksize, const float* code, const uint16_t* bias,
                                     uint16_t* y, int threads) {
  const int64_t G = bf16_group_tiles, KB = bf16_kblock, rows = G * kTileC;
  const int64_t groups = (N + rows - 1) / rows;
  // Rows of A per pass over the weights: that block of A stays in L2 while the weights stream past.
  const int64_t mb = std::max<int64_t>(kTileR, (bf16_ablock_bytes / (2 * std::min(K, KB))) / kTileR * kTileR);
  for (int64_t mb0 = 0; mb0 < M; mb0 += mb)
    parallel_for(groups, 1, threads, [&](int64_t g0, int64_t g1) BNB_BF16_TARGET {
      std::vector<uint16_t> wbuf(size_t(rows * K));
      std::vector<__m512> accbuf(size_t((mb / kTileR) * G * kTileR * kTileC));
      float res[kTileR][kTileC];
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t gn0 = g * rows, tiles = (std::min(N, gn0 + rows) - gn0 + kTileC - 1) / kTileC;
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t n0 = gn0 + t * kTileC;
          decode_rows_bf16(B, n0, std::min<int64_t>(kTileC, N - n0), K, absmax, blocksize, code,
                           wbuf.data() + t * kTileC * K);
        }
        const int64_t mend = std::min(M, mb0 + mb);
        for (int64_t k0 = 0; k0 < K; k0 += KB) {
          const int64_t klen = std::min(KB, K - k0);
          const bool first = k0 == 0, last = k0 + klen >= K;
          for (int64_t m = mb0; m < mend; m += kTileR) {
            const int64_t R = std::min<int64_t>(kTileR, mend - m);
            const uint16_t* am = a + m * K + k0 * R;
            for (int64_t t = 0; t < tiles; ++t) {
              const int64_t n0 = gn0 + t * kTileC, C = std::min<int64_t>(kTileC, N - n0);
              const uint16_t* wt = wbuf.data() + t * kTileC * K + k0 * C;
              __m512* acc = accbuf.data() + (((m - mb0) / kTileR) * G + t) * kTileR * kTileC;
              switch (C) {
                case 1:
                  tile_rows_bf16<1>(R, am, wt, klen, acc, first, last, res);
                  break;
                case 2:
                  tile_rows_bf16<2>(R, am, wt, klen, acc, first, last, res);
                  break;
                case 3:
                  tile_rows_bf16<3>(R, am, wt, klen, acc, first, last, res);
                  break;
                default:
                  tile_rows_bf16<kTileC>(R, am, wt, klen, acc, first, last, res);
                  break;
              }
              if (last)
                for (int64_t r = 0; r < R; ++r)
                  for (int64_t c = 0; c < C; ++c)
                    y[(m + r) * N + n0 + c] = float_to_bf16(res[r][c] + (bias ? bf16_to_float(bias[n0 + c]) : 0.0f));
            }
          }
        }
      }
    });
}
#endif

int bf16_dot_mode = 1;                     // gemv_4bit_bf16_dot(): 0 forces the fp32 path (tests)
constexpr int64_t bf16_tile_min_rows = 8;  // M above this: gemm_tiles_bf16 (rows_bf16 below: no packing, no tiles)

template <int R>
void row_dot(bool fast, const uint8_t* B, int64_t base, int64_t K, const float* absmax, int64_t blocksize,
             const float* code, const float* a, int64_t lda, float* res) {
  if (fast)
    row_fast<R>(B, base, K, absmax, blocksize, code, a, lda, res);
  else
    row_generic<R>(B, base, K, absmax, blocksize, code, a, lda, res);
}

#if defined(BNB_ISA_AVX512)
// Round to nearest even like float_to_bf16 (NaN -> quiet NaN), 16 lanes.
inline __m256i bf16x16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

#endif

#if defined(BNB_ISA_AVX512)
// The block's 16 weights rounded to a 16-bit dtype (exactly Elem<D>::store), as one ymm of words.
template <DType D>
inline __m256i table16(const float* tab) {
  const __m512 t = _mm512_loadu_ps(tab);
  if constexpr (D == DType::f16)
    return _mm512_cvtps_ph(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  else
    return bf16x16(t);
}
#endif

// Flat weights [f, fend) of one block (scaled table `tab`) into out[f - i0 ...].
template <DType D>
void dequant_segment(const uint8_t* B, const float* tab, int64_t f, int64_t fend, typename Elem<D>::T* out) {
  auto one = [&](int64_t i) {
    const uint8_t byte = B[i >> 1];
    *out++ = Elem<D>::store(tab[(i & 1) ? (byte & 15) : (byte >> 4)]);
  };
#if defined(BNB_ISA_AVX512)
  for (; f < fend && (f & 31); ++f) one(f);
  if (f + 32 <= fend) {
    if constexpr (D == DType::f32) {
      const __m512 t = _mm512_loadu_ps(tab);
      const __m512i ilo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
      const __m512i ihi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
      for (; f + 32 <= fend; f += 32, out += 32) {
        const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + f / 2)));
        const __m512 wo = _mm512_permutexvar_ps(bytes, t);
        const __m512 we = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), t);
        _mm512_storeu_ps(out, _mm512_permutex2var_ps(we, ilo, wo));
        _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(we, ihi, wo));
      }
    } else {
      // 16-bit output: look the rounded weights up directly (vpermw reads the low 4 bits of each index).
      const __m256i t = table16<D>(tab);
      const __m256i ilo = _mm256_setr_epi16(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
      const __m256i ihi = _mm256_setr_epi16(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
      for (; f + 32 <= fend; f += 32, out += 32) {
        const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B + f / 2)));
        const __m256i wo = _mm256_permutexvar_epi16(w, t);
        const __m256i we = _mm256_permutexvar_epi16(_mm256_srli_epi16(w, 4), t);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutex2var_epi16(we, ilo, wo));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_permutex2var_epi16(we, ihi, wo));
      }
    }
  }
#elif defined(BNB_ISA_NEON)
  if (f < fend && (f & 1)) one(f++);
  if constexpr (D == DType::f32) {
    const neon_simd::Planes32 pl(tab);
    for (; f + 32 <= fend; f += 32, out += 32) {
      const uint8x16x2_t c = neon_simd::unpack_nibbles(vld1q_u8(B + f / 2));
      pl.lookup_store(c.val[0], out);
      pl.lookup_store(c.val[1], out + 16);
    }
  } else {
    alignas(16) uint16_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = Elem<D>::store(tab[i]);
    const neon_simd::Planes16 pl(t);
    for (; f + 32 <= fend; f += 32, out += 32) {
      const uint8x16x2_t c = neon_simd::unpack_nibbles(vld1q_u8(B + f / 2));
      pl.lookup_store(c.val[0], out);
      pl.lookup_store(c.val[1], out + 16);
    }
  }
#endif
  for (; f < fend; ++f) one(f);
}

inline float nested_scale(const float* absmax2, const NestedAbsmax& nested, int64_t b) {
  const float v = nested.code[nested.q[b]] * absmax2[b / BNB_DOUBLE_QUANT_BLOCKSIZE];
  return v + nested.offset;  // two roundings, as expand_nested_absmax and the reference
}

// The fp32 scales that rows [n0, n1) read: absmax itself, or (double quantization) their blocks expanded
// into buf, at most a few KiB per chunk of rows and still in L1 when the rows read them: no separate
// pass over all scales. The pointer returned is indexed with absolute block numbers (buf is offset).
inline const float* row_scales(const float* absmax, const NestedAbsmax* nested, int64_t n0, int64_t n1, int64_t K,
                               int64_t blocksize, std::vector<float>& buf) {
  if (!nested) return absmax;
  const int64_t b0 = n0 * K / blocksize, b1 = (n1 * K + blocksize - 1) / blocksize;
  buf.resize(size_t(std::max<int64_t>(b1 - b0, 1)));
  int64_t b = b0;
#if defined(BNB_ISA_AVX512)
  // 16 blocks at a time: the codes looked up (by a gather, or from 16 registers: map_in_registers), then
  // nested_scale's multiply and add (two roundings, no FMA): the same bits. A run of 16 crosses at most one
  // group of BNB_DOUBLE_QUANT_BLOCKSIZE blocks (its lanes past the boundary take the next absmax2), and the
  // last run is masked, so no run falls back to scalar code (no speed change measured on an AMX Xeon: the
  // expansion is about 5% of a batch-1 call there).
  auto expand = [&](auto lookup) {
    const __m512 offset = _mm512_set1_ps(nested->offset);
    for (; b < b1; b += 16) {
      const int64_t n = std::min<int64_t>(16, b1 - b);
      const __mmask16 live = __mmask16((1u << n) - 1);
      const int64_t g = b / BNB_DOUBLE_QUANT_BLOCKSIZE, next = (g + 1) * BNB_DOUBLE_QUANT_BLOCKSIZE - b;
      __m512 a2 = _mm512_set1_ps(absmax[g]);
      if (next < n) a2 = _mm512_mask_mov_ps(a2, __mmask16(0xFFFFu << next), _mm512_set1_ps(absmax[g + 1]));
      const __m512i idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, nested->q + b));  // 0 past b1
      _mm512_mask_storeu_ps(buf.data() + (b - b0), live, _mm512_add_ps(_mm512_mul_ps(lookup(idx), a2), offset));
    }
  };
  if (b1 - b0 >= 256 && map_in_registers()) {  // the 16 registers' load pays off over many blocks
    const search8::MapInRegisters map(nested->code);
    expand([&](__m512i idx) { return map(idx); });
  } else {
    expand([&](__m512i idx) { return _mm512_i32gather_ps(idx, nested->code, 4); });
  }
#endif
  for (; b < b1; ++b) buf[size_t(b - b0)] = nested_scale(absmax, *nested, b);
  return buf.data() - b0;
}

// Splits a thread's rows [n0, n1) into pieces whose expanded scales (double quantization) take at most
// about 16 KiB, so that row_scales' buffer is still in L1 when the piece's rows read it (a chunk of 512
// rows at K = 4096 would expand 128 KiB first). Pieces hold an even number of rows (row pairs stay
// whole); without double quantization the range is one piece.
template <class Body>
inline void scale_pieces(int64_t n0, int64_t n1, int64_t K, int64_t blocksize, const NestedAbsmax* nested,
                         Body&& body) {
  if (!nested) return body(n0, n1);
  const int64_t step = std::max<int64_t>(2, (4096 * blocksize / std::max<int64_t>(K, 1)) & ~int64_t(1));
  for (int64_t p = n0; p < n1; p += step) body(p, std::min(n1, p + step));
}

#if defined(BNB_GEMV_NIBBLE_SHIFT)
template <DType D>
void gemv1_nibble_shift(const typename Elem<D>::T* x, int64_t N, int64_t K, const uint8_t* B, const float* absmax_in,
                        const NestedAbsmax* nested, const float* code, int64_t blocksize,
                        const typename Elem<D>::T* bias, typename Elem<D>::T* y, int threads) {
  std::vector<float> xf(static_cast<size_t>(K)), a(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) xf[size_t(k)] = Elem<D>::load(x[k]);
  perm_A128(xf.data(), K, a.data());
  int shift = 0;
  while ((int64_t(1) << shift) < blocksize) ++shift;
  const __m512 ctab = _mm512_loadu_ps(code);
  const int64_t grain = std::max<int64_t>(2, 32768 / K / 2 * 2);  // even: pairs never straddle chunks
  parallel_for(N, grain, threads, [&](int64_t c0, int64_t c1) {
    std::vector<float> sbuf;
    scale_pieces(c0, c1, K, blocksize, nested, [&](int64_t n0, int64_t n1) {
      const float* absmax = row_scales(absmax_in, nested, n0, n1, K, blocksize, sbuf);
      float res[2];
      int64_t n = n0;
      for (; n + 2 <= n1; n += 2) {
        rows_nibble_shift<2>(B, n * K, K, absmax, shift, ctab, a.data(), res);
        for (int i = 0; i < 2; ++i) y[n + i] = Elem<D>::store(res[i] + (bias ? Elem<D>::load(bias[n + i]) : 0.0f));
      }
      if (n < n1) {
        rows_nibble_shift<1>(B, n * K, K, absmax, shift, ctab, a.data(), res);
        y[n] = Elem<D>::store(res[0] + (bias ? Elem<D>::load(bias[n]) : 0.0f));
      }
    });
  });
}
#endif

#if defined(BNB_ISA_NEON_BF16)
// f16 / bf16 A at neon_bf16: FMLAL (FEAT_FHM) and BFMLALB/T (FEAT_BF16) widen 16-bit values to fp32 and
// multiply-add them fused into fp32 accumulators, reading A in place. The weight is the block's fp32
// table entry rounded to A's dtype (exactly the reference's W.to(A.dtype)), so every product is exact in
// fp32 and only the summation order differs from the reference. Needs K % 16 == 0 (rows start on a byte
// and blocks, powers of two of at least 16 values, end on a step).
template <DType D, int R>
void row_half(const uint8_t* B, int64_t base, int64_t K, const float* absmax, int64_t blocksize, const float* code,
              const uint16_t* a, int64_t lda, float* res) {
  const uint8_t* row = B + base / 2;
  float32x4_t acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = vdupq_n_f32(0.0f);
  for_each_segment(base, K, blocksize, [&](int64_t k, int64_t kend, int64_t b) {
    alignas(16) uint16_t tab[16];
    const float s = absmax[b];
    for (int i = 0; i < 16; ++i) tab[i] = Elem<D>::store(code[i] * s);
    const neon_simd::Planes16 pl(tab);
    for (; k < kend; k += 16) {
      const uint8x8_t bytes = vld1_u8(row + k / 2);
      const uint8x8_t hi = vshr_n_u8(bytes, 4), lo = vand_u8(bytes, vdup_n_u8(15));
      uint16x8_t w[2];
      pl.lookup(vcombine_u8(vzip1_u8(hi, lo), vzip2_u8(hi, lo)), w);  // 16 weights in k order
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) {
          const uint16x8_t x = vld1q_u16(a + r * lda + k + 8 * h);
          if constexpr (D == DType::f16) {
            const float16x8_t wh = vreinterpretq_f16_u16(w[h]), xh = vreinterpretq_f16_u16(x);
            acc[r][2 * h] = vfmlalq_low_f16(acc[r][2 * h], wh, xh);
            acc[r][2 * h + 1] = vfmlalq_high_f16(acc[r][2 * h + 1], wh, xh);
          } else {
            const bfloat16x8_t wb = vreinterpretq_bf16_u16(w[h]), xb = vreinterpretq_bf16_u16(x);
            acc[r][2 * h] = vbfmlalbq_f32(acc[r][2 * h], wb, xb);
            acc[r][2 * h + 1] = vbfmlaltq_f32(acc[r][2 * h + 1], wb, xb);
          }
        }
    }
  });
  for (int r = 0; r < R; ++r)
    res[r] = vaddvq_f32(vaddq_f32(vaddq_f32(acc[r][0], acc[r][1]), vaddq_f32(acc[r][2], acc[r][3])));
}

template <DType D>
void gemv_half(const uint16_t* A, int64_t M, int64_t N, int64_t K, const uint8_t* B, const float* absmax_in,
               const NestedAbsmax* nested, const float* code, int64_t blocksize, const uint16_t* bias, uint16_t* y,
               int threads) {
  // Each output element is produced by one call of row_half, so the thread count changes nothing.
  const int64_t grain = std::max<int64_t>(1, 32768 / (K * std::min<int64_t>(M, kMaxRows)));
  parallel_for(N, grain, threads, [&](int64_t n0, int64_t n1) {
    float res[kMaxRows];
    std::vector<float> sbuf;
    const float* absmax = row_scales(absmax_in, nested, n0, n1, K, blocksize, sbuf);
    for (int64_t n = n0; n < n1; ++n) {
      const float bn = bias ? Elem<D>::load(bias[n]) : 0.0f;
      for (int64_t m = 0; m < M; m += kMaxRows) {
        const int64_t R = std::min<int64_t>(kMaxRows, M - m);
        const uint16_t* am = A + m * K;
        switch (R) {
          case 1:
            row_half<D, 1>(B, n * K, K, absmax, blocksize, code, am, K, res);
            break;
          case 2:
            row_half<D, 2>(B, n * K, K, absmax, blocksize, code, am, K, res);
            break;
          case 3:
            row_half<D, 3>(B, n * K, K, absmax, blocksize, code, am, K, res);
            break;
          default:
            row_half<D, 4>(B, n * K, K, absmax, blocksize, code, am, K, res);
            break;
        }
        for (int64_t r = 0; r < R; ++r) y[(m + r) * N + n] = Elem<D>::store(res[r] + bn);
      }
    }
  });
}
#endif

#if defined(BNB_GEMV_AVX2_SHUF)
template <DType D, class Dec>
void gemv_shuf(const typename Elem<D>::T* x, int64_t M, int64_t N, int64_t K, const uint8_t* B, const float* absmax_in,
               const NestedAbsmax* nested, const Dec& dec, int64_t blocksize, const typename Elem<D>::T* bias,
               typename Elem<D>::T* y, int threads) {
  constexpr ChunkPerm perm = PermOf<Dec>::value;
  std::vector<float> abuf(size_t(M * K));
  for (int64_t c = 0; c < M * K; c += 64)
    for (int p = 0; p < 64; ++p) abuf[size_t(c + p)] = Elem<D>::load(x[c + perm.k[p]]);
  int shift = 0;
  while ((int64_t(1) << shift) < blocksize) ++shift;
  const float* a = abuf.data();
  // Each output element is produced by one call of row_shuf, so the thread count changes nothing.
  const int64_t grain = std::max<int64_t>(1, 32768 / (K * std::min<int64_t>(M, kMaxRows)));
  parallel_for(N, grain, threads, [&](int64_t n0, int64_t n1) {
    float res[kMaxRows];
    std::vector<float> sbuf;
    const float* absmax = row_scales(absmax_in, nested, n0, n1, K, blocksize, sbuf);
    for (int64_t n = n0; n < n1; ++n) {
      const float bn = bias ? Elem<D>::load(bias[n]) : 0.0f;
      for (int64_t m = 0; m < M; m += kMaxRows) {
        const int64_t R = std::min<int64_t>(kMaxRows, M - m);
        const float* am = a + m * K;
        switch (R) {
          case 1:
            row_shuf<Dec, 1>(B, n * K, K, absmax, shift, dec, am, K, res);
            break;
          case 2:
            row_shuf<Dec, 2>(B, n * K, K, absmax, shift, dec, am, K, res);
            break;
          case 3:
            row_shuf<Dec, 3>(B, n * K, K, absmax, shift, dec, am, K, res);
            break;
          default:
            row_shuf<Dec, 4>(B, n * K, K, absmax, shift, dec, am, K, res);
            break;
        }
        for (int64_t r = 0; r < R; ++r) y[(m + r) * N + n] = Elem<D>::store(res[r] + bn);
      }
    }
  });
}
#endif

}  // namespace

void gemv_4bit(const void* A, DType dtype, int64_t M, int64_t N, int64_t K, const uint8_t* B, const float* absmax_in,
               const NestedAbsmax* nested, const float* code, int64_t blocksize, const void* bias, void* out,
               int threads) {
  if (M <= 0 || N <= 0) return;
  const bool fast = kChunk > 0 && K % (kChunk > 0 ? kChunk : 1) == 0;
#if defined(BNB_GEMV_BF16_DOT)
  // K == 0 takes the generic path (out = bias): the tiles' grain divides by K (SIGFPE found by ci/fuzz).
  if (dtype == DType::bf16 && bf16_dot_mode && K > 0 && K % 64 == 0 && blocksize >= 64 && cpu_has_avx512bf16()) {
    if (M > bf16_tile_min_rows) {
      // Rows of A per pass over the weights: that block of A stays in L2 while every weight tile is
      // multiplied into it; the weight is decoded once per block.
      std::vector<float> all_scales;
      const float* absmax = row_scales(absmax_in, nested, 0, N, K, blocksize, all_scales);
      std::vector<uint16_t> apack(size_t(M * K));
      pack_A_tiles(static_cast<const uint16_t*>(A), M, K, apack.data(), threads);
      gemm_tiles_bf16(apack.data(), M, N, K, B, absmax, blocksize, code, static_cast<const uint16_t*>(bias),
                      static_cast<uint16_t*>(out), threads);
      return;
    }
    const int64_t lda = bf16_chunked_len(K);
    std::vector<uint16_t> abuf(size_t(M * lda));
    for (int64_t m = 0; m < M; ++m) perm_A128_bf16(static_cast<const uint16_t*>(A) + m * K, K, abuf.data() + m * lda);
    const uint16_t* bias_t = static_cast<const uint16_t*>(bias);
    uint16_t* y = static_cast<uint16_t*>(out);
    const uint16_t* a = abuf.data();
    const int64_t grain = std::max<int64_t>(1, 32768 / (K * std::min<int64_t>(M, kMaxRows)));
    parallel_for(N, grain, threads, [&](int64_t c0, int64_t c1) {
      float res[kMaxRows];
      std::vector<float> sbuf;
      scale_pieces(c0, c1, K, blocksize, nested, [&](int64_t n0, int64_t n1) {
        const float* absmax = row_scales(absmax_in, nested, n0, n1, K, blocksize, sbuf);
        if (M == 1) {
          // Row pairs from n0: which pair a row falls in depends on n0, but each row's sum is computed
          // the same way in rows_bf16<2, 1> and rows_bf16<1, 1> (same steps, same accumulator split).
          int64_t n = n0;
          for (; n + 2 <= n1; n += 2) {
            rows_bf16<2, 1>(B, n * K, K, absmax, blocksize, code, a, lda, res);
            for (int i = 0; i < 2; ++i)
              y[n + i] = float_to_bf16(res[i] + (bias_t ? bf16_to_float(bias_t[n + i]) : 0.0f));
          }
          n0 = n;
        }
        for (int64_t n = n0; n < n1; ++n) {
          const float bn = bias_t ? bf16_to_float(bias_t[n]) : 0.0f;
          for (int64_t m = 0; m < M; m += kMaxRows) {
            const int64_t R = std::min<int64_t>(kMaxRows, M - m);
            const uint16_t* am = a + m * lda;
            switch (R) {
              case 1:
                rows_bf16<1, 1>(B, n * K, K, absmax, blocksize, code, am, lda, res);
                break;
              case 2:
                rows_bf16<1, 2>(B, n * K, K, absmax, blocksize, code, am, lda, res);
                break;
              case 3:
                rows_bf16<1, 3>(B, n * K, K, absmax, blocksize, code, am, lda, res);
                break;
              default:
                rows_bf16<1, 4>(B, n * K, K, absmax, blocksize, code, am, lda, res);
                break;
            }
            for (int64_t r = 0; r < R; ++r) y[(m + r) * N + n] = float_to_bf16(res[r] + bn);
          }
        }
      });
    });
    return;
  }
#endif
#if defined(BNB_GEMV_AVX2_SHUF)
  if (K > 0 && K % 64 == 0 && blocksize >= 64) {
    visit_dtype(dtype, [&](auto tag) {
      constexpr DType D = decltype(tag)::value;
      using Dec = std::conditional_t<D == DType::bf16, Bf16Decoder, F32Decoder>;
      gemv_shuf<D, Dec>(static_cast<const typename Elem<D>::T*>(A), M, N, K, B, absmax_in, nested, Dec(code), blocksize,
                        static_cast<const typename Elem<D>::T*>(bias), static_cast<typename Elem<D>::T*>(out), threads);
    });
    return;
  }
#endif
#if defined(BNB_ISA_NEON_BF16)
  // gemv_4bit_bf16_dot(0) turns this off too (tests compare it with the fp32 path); `used` keeps
  // naming the AVX512-BF16 GEMM only, which the Python side sizes its row limit by.
  if (dtype != DType::f32 && bf16_dot_mode && K > 0 && K % 16 == 0 && blocksize >= 16) {
    auto* a16 = static_cast<const uint16_t*>(A);
    auto* b16 = static_cast<const uint16_t*>(bias);
    auto* y16 = static_cast<uint16_t*>(out);
    if (dtype == DType::f16)
      gemv_half<DType::f16>(a16, M, N, K, B, absmax_in, nested, code, blocksize, b16, y16, threads);
    else
      gemv_half<DType::bf16>(a16, M, N, K, B, absmax_in, nested, code, blocksize, b16, y16, threads);
    return;
  }
#endif
#if defined(BNB_GEMV_NIBBLE_SHIFT)
  if (M == 1 && K > 0 && K % 128 == 0 && blocksize >= 64) {
    visit_dtype(dtype, [&](auto tag) {
      constexpr DType D = decltype(tag)::value;
      using T = typename Elem<D>::T;
      gemv1_nibble_shift<D>(static_cast<const T*>(A), N, K, B, absmax_in, nested, code, blocksize,
                            static_cast<const T*>(bias), static_cast<T*>(out), threads);
    });
    return;
  }
#endif
  std::vector<float> abuf(size_t(M * K));
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using T = typename Elem<D>::T;
    load_A<D>(static_cast<const T*>(A), M, K, fast ? kChunk : 0, abuf.data());
    const T* bias_t = static_cast<const T*>(bias);
    T* y = static_cast<T*>(out);
    const float* a = abuf.data();
    // Each output element is produced by one call of row_dot, so the thread count changes nothing.
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(K * std::min<int64_t>(M, kMaxRows), 1));
    parallel_for(N, grain, threads, [&](int64_t n0, int64_t n1) {
      float res[kMaxRows];
      std::vector<float> sbuf;
      const float* absmax = row_scales(absmax_in, nested, n0, n1, K, blocksize, sbuf);
      for (int64_t n = n0; n < n1; ++n) {
        const float bn = bias_t ? Elem<D>::load(bias_t[n]) : 0.0f;
        for (int64_t m = 0; m < M; m += kMaxRows) {
          const int64_t R = std::min<int64_t>(kMaxRows, M - m);
          const float* am = a + m * K;
          switch (R) {
            case 1:
              row_dot<1>(fast, B, n * K, K, absmax, blocksize, code, am, K, res);
              break;
            case 2:
              row_dot<2>(fast, B, n * K, K, absmax, blocksize, code, am, K, res);
              break;
            case 3:
              row_dot<3>(fast, B, n * K, K, absmax, blocksize, code, am, K, res);
              break;
            default:
              row_dot<4>(fast, B, n * K, K, absmax, blocksize, code, am, K, res);
              break;
          }
          for (int64_t r = 0; r < R; ++r) y[(m + r) * N + n] = Elem<D>::store(res[r] + bn);
        }
      }
    });
  });
}

void gemv_4bit_bf16_dot(int mode, bool* used) {
  if (mode >= 0) bf16_dot_mode = mode;
#if defined(BNB_GEMV_BF16_DOT)
  *used = bf16_dot_mode && cpu_has_avx512bf16();
#else
  *used = false;
#endif
}

void dequantize_4bit_range(const uint8_t* B, const float* absmax, const float* code, int64_t blocksize, int64_t i0,
                           int64_t i1, void* out, DType dtype, int threads) {
  if (i1 <= i0) return;
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using T = typename Elem<D>::T;
    T* y = static_cast<T*>(out);
    // Pieces of whole 64-value groups so that each piece's vector part starts aligned.
    const int64_t groups = (i1 - i0 + 63) / 64;
    parallel_for(groups, 2048, threads, [&](int64_t g0, int64_t g1) {
      int64_t f = i0 + g0 * 64;
      const int64_t fend = std::min(i1, i0 + g1 * 64);
      while (f < fend) {
        const int64_t b = f / blocksize;
        const int64_t send = std::min(fend, (b + 1) * blocksize);
        float tab[16];
        for (int i = 0; i < 16; ++i) tab[i] = code[i] * absmax[b];
        dequant_segment<D>(B, tab, f, send, y + (f - i0));
        f = send;
      }
    });
  });
}

void expand_nested_absmax(const uint8_t* q, const float* absmax2, const float* code8, float offset, int64_t n,
                          float* out, int threads) {
  parallel_for(n, 1 << 15, threads, [&](int64_t j0, int64_t j1) {
    const NestedAbsmax nested{q, code8, offset};
    for (int64_t j = j0; j < j1; ++j) out[j] = nested_scale(absmax2, nested, j);
  });
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
