#include "kernels/matmul_4bit_amx.h"

#include <bitsandbytes/formats.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/bf16_codes.h"

#if defined(BNB_ISA_AVX512) && defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BNB_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace bnb {
namespace BNB_ISA_NS {

#if defined(BNB_AMX)
namespace {

#define BNB_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
// gcc's tile intrinsics are asm statements that name only part of the memory they touch: a compiler
// barrier keeps stores to a buffer before the tile load that reads it (and a config's bytes in place).
#define BNB_COMPILER_BARRIER() asm volatile("" ::: "memory")

// The layout. Every tile is 16 rows of 64 bytes (1 KiB, contiguous): tdpbf16ps C[16 x 16 fp32] +=
// A[16 x 32 bf16] . B[16 pairs x 16 x 2 bf16]. A is 16 weight rows (the weight as it is decoded, no
// transpose), B is 16 rows of x in the pair layout ("VNNI"), so C holds out^T, transposed on the way out.
// Within each 64-value group of k both operands take the even positions first (chunk 2g) and then the odd
// ones (2g + 1), the order the decode produces them in; a sum over k does not care about the order, and
// the order is the same for every shape and thread count, so the result does not depend on either.
constexpr int64_t kTile = 512;  // bf16 per tile
constexpr int64_t kRows = 32;   // weight rows per decoded panel: two A tiles
// The loops, measured on a Xeon with AMX (2 threads, [M, 4096] x [4096, 4096], medians of interleaved runs):
// - A pass takes kPassRows rows of x (16 per tile, in pairs). Within it, each thread walks its weight panels
//   (32 rows), and each panel k-slice by k-slice: the slice's weights are decoded into L1 (kSlice values of
//   k: 16 KiB), then every pair of x tiles of the pass is multiplied by them, its x read from L2. A weight
//   is decoded once per pass.
// - The C tiles of a pair stay in the tile registers from slice to slice when the pass has one pair (up to
//   32 rows); with more, each pair's C tiles are stored and reloaded per slice (about a third of the tile
//   time; keeping them instead means reading the weights from L2 as well: 7.4-9.6 ns per tdpbf16ps against
//   5.0 in L1).
// - Whole-K panels in L2 (no slices): 0.79 / 1.08 / 11.1 ms at 8 / 32 / 512 rows against 0.55 / 0.77 / 9.6 with
//   slices of 256 (128: the same; 512: 0.61 / 1.06 / 11.2). Passes of 128 rows: 256 rows took 11.1 ms, 64
//   rows 10.4 (fewer passes decode less, but their C tiles and x slices no longer fit beside the weights).
constexpr int64_t kSlice = 256;
constexpr int64_t kPassRows = 128;
constexpr int64_t kPassBytes = 1 << 20;

struct alignas(64) TileConfig {
  uint8_t palette = 0, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "the tile configuration is 64 bytes");

// Our tile shapes for the scope of one chunk of work on one thread. The thread's previous configuration
// is put back afterwards, not just released: code that keeps a configuration loaded between its calls
// and reloads it only when it knows another of its own kernels ran (torch's cpublas brgemm notes the
// current kernel per thread until brgemm_release) would otherwise run on ours. torch's own ops release at
// their end (measured: no configuration is loaded after SDPA or a bf16 F.linear), so this guards code
// around us, not torch's ops. A thread that had none gets its tiles released.
class TileScope {
 public:
  BNB_AMX_TARGET TileScope() {
    BNB_COMPILER_BARRIER();
    _tile_storeconfig(&saved_);
    BNB_COMPILER_BARRIER();
    TileConfig c;
    c.palette = 1;
    for (int t = 0; t < 8; ++t) {
      c.colsb[t] = 64;
      c.rows[t] = 16;
    }
    BNB_COMPILER_BARRIER();
    _tile_loadconfig(&c);
  }
  BNB_AMX_TARGET ~TileScope() {
    BNB_COMPILER_BARRIER();
    if (saved_.palette != 0)
      _tile_loadconfig(&saved_);
    else
      _tile_release();
  }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;

 private:
  TileConfig saved_;
};

// 16 rows of 16 dwords transposed in registers (64 shuffles).
BNB_AMX_TARGET inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[g][c]: lane L holds column 4L + c of rows 4g .. 4g + 3.
  __m512i u[4][4];
  for (int g = 0; g < 4; ++g) {
    u[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // Column 4L + c: lane g from u[g][c]'s lane L (a 4 x 4 transpose of 128-bit lanes).
  for (int c = 0; c < 4; ++c) {
    const __m512i s0 = _mm512_shuffle_i32x4(u[0][c], u[1][c], 0x44), s1 = _mm512_shuffle_i32x4(u[0][c], u[1][c], 0xee);
    const __m512i s2 = _mm512_shuffle_i32x4(u[2][c], u[3][c], 0x44), s3 = _mm512_shuffle_i32x4(u[2][c], u[3][c], 0xee);
    r[c] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
  }
}

// x rows [16 mt, 16 mt + 16) (zeros past M) of one 64-group of k as the B tiles of chunks 2g and 2g + 1:
// row t of chunk 2g + p holds, for each of the 16 rows m, the pair x[m][64g + 4t + p], x[m][64g + 4t + 2 + p].
BNB_AMX_TARGET void pack_x_group(const uint16_t* x, int64_t M, int64_t K, int64_t mt, int64_t g, uint16_t* xb) {
  const __m512i ie = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24,
                                      22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i io = _mm512_add_epi16(ie, _mm512_set1_epi16(1));
  __m512i e[16], o[16];
  for (int r = 0; r < 16; ++r) {
    const int64_t m = mt * 16 + r;
    if (m < M) {
      const uint16_t* src = x + m * K + 64 * g;
      const __m512i x0 = _mm512_loadu_si512(src), x1 = _mm512_loadu_si512(src + 32);
      e[r] = _mm512_permutex2var_epi16(x0, ie, x1);
      o[r] = _mm512_permutex2var_epi16(x0, io, x1);
    } else {
      e[r] = o[r] = _mm512_setzero_si512();
    }
  }
  transpose16(e);
  transpose16(o);
  uint16_t* de = xb + (mt * (K / 32) + 2 * g) * kTile;
  for (int t = 0; t < 16; ++t) {
    _mm512_storeu_si512(de + 32 * t, e[t]);
    _mm512_storeu_si512(de + kTile + 32 * t, o[t]);
  }
}

inline float block_scale(const float* absmax, const NestedAbsmax* nested, int64_t b) {
  if (!nested) return absmax[b];
  // Two roundings, product then offset, as the reference's dequantize_blockwise + add.
  const float v = nested->code[nested->q[b]] * absmax[b / BNB_DOUBLE_QUANT_BLOCKSIZE];
  return v + nested->offset;
}

// Weight rows [n0, n0 + 32) (zeros past N), k in [k0, k0 + klen), as A tiles: chunk c (32 values of k)
// holds the two tiles of rows 0-15 and 16-31 back to back, each row 32 bf16. The rows are walked inside
// each 64-group, so the stores are sequential: row by row, they went 2 KiB apart into two L1 sets
// (0.69 against 0.45 ms for a 4096 x 4096 weight on 2 threads).
BNB_AMX_TARGET void decode_panel(const uint8_t* B, int64_t N, int64_t K, int64_t n0, int64_t k0, int64_t klen,
                                 const float* absmax, const NestedAbsmax* nested, const float* code, int shift,
                                 uint16_t* wb) {
  const __m512 ctab = _mm512_loadu_ps(code);
  const int64_t rows = std::min<int64_t>(kRows, N - n0);
  for (int64_t k = 0; k < klen; k += 64) {
    uint16_t* dst = wb + k * kRows;
    for (int64_t c = 0; c < rows; ++c) {
      const int64_t f = (n0 + c) * K + k0 + k;
      const __m512i tab = bf16_table(ctab, block_scale(absmax, nested, f >> shift));
      // The row's codes of the next slice, while its tiles are multiplied (8.9 against 9.3 ms at 512 rows).
      _mm_prefetch(reinterpret_cast<const char*>(B + f / 2 + klen / 2), _MM_HINT_T0);
      const __m512i w = load_codes64(B + f / 2);
      _mm512_storeu_si512(dst + c * 32, even_weights(w, tab));
      _mm512_storeu_si512(dst + kRows * 32 + c * 32, odd_weights(w, tab));
    }
    for (int64_t c = rows; c < kRows; ++c) {
      _mm512_storeu_si512(dst + c * 32, _mm512_setzero_si512());
      _mm512_storeu_si512(dst + kRows * 32 + c * 32, _mm512_setzero_si512());
    }
  }
}

// Where a call of tiles() takes its C tiles from: zeros (the first values of k), the fp32 tiles stored in c
// by the previous call (stored and reloaded exactly, so a k split into slices sums in the same order), or
// the tile registers as the previous call left them (one pair of x tiles per pass: nothing else ran).
enum class Acc { zero, load, keep };

// C tiles of 32 weight rows x 16 J rows of x over `chunks` chunks of k; stored into c when `store`: tile
// 2j + i is weight rows 16i.., x rows 16j...
template <int J>
BNB_AMX_TARGET void tiles(const uint16_t* wb, const uint16_t* xb0, const uint16_t* xb1, int64_t chunks, Acc acc,
                          bool store, float* c) {
  if (acc == Acc::zero) {
    _tile_zero(0);
    _tile_zero(1);
    if (J == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else if (acc == Acc::load) {
    _tile_loadd(0, c, 64);
    _tile_loadd(1, c + 256, 64);
    if (J == 2) {
      _tile_loadd(2, c + 512, 64);
      _tile_loadd(3, c + 768, 64);
    }
  }
  for (int64_t k = 0; k < chunks; ++k, wb += 2 * kTile, xb0 += kTile, xb1 += kTile) {
    _tile_loadd(4, wb, 64);
    _tile_loadd(5, wb + kTile, 64);
    _tile_loadd(6, xb0, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if (J == 2) {
      _tile_loadd(7, xb1, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  if (store) {
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    if (J == 2) {
      _tile_stored(2, c + 512, 64);
      _tile_stored(3, c + 768, 64);
    }
  }
  BNB_COMPILER_BARRIER();
}

// fp32 to bf16, nearest even, NaN kept quiet: float_to_bf16 (common.h) on 16 lanes.
BNB_AMX_TARGET inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
  const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, nan);
  return _mm512_cvtepi32_epi16(r);
}

// One C tile (weight rows n0.., x rows m0..; c is C^T) into y[m0.., n0..] + bias, rows < M, columns < N.
BNB_AMX_TARGET void store_tile(const float* c, int64_t m0, int64_t n0, int64_t M, int64_t N, const uint16_t* bias,
                               uint16_t* y) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(c + 16 * i);
  transpose16(r);
  const int64_t nv = std::min<int64_t>(16, N - n0);
  const __mmask16 cols = __mmask16((1u << nv) - 1u);
  __m512 b = _mm512_setzero_ps();
  if (bias)
    b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(cols, bias + n0)), 16));
  const int64_t mv = std::min<int64_t>(16, M - m0);
  for (int64_t q = 0; q < mv; ++q) {
    __m512 v = _mm512_castsi512_ps(r[q]);
    if (bias) v = _mm512_add_ps(v, b);
    _mm256_mask_storeu_epi16(y + (m0 + q) * N + n0, cols, to_bf16(v));
  }
}

// Buffers of one thread, kept: its OpenMP threads live as long as torch's team.
struct ThreadBuffers {
  std::vector<__m512i> wb, c;
  uint16_t* panel(int64_t klen) {
    const size_t v = size_t(kRows * klen / 32);
    if (wb.size() < v) wb.resize(v);
    return reinterpret_cast<uint16_t*>(wb.data());
  }
  float* acc(int64_t tiles) {
    const size_t v = size_t(tiles * 16);
    if (c.size() < v) c.resize(v);
    return reinterpret_cast<float*>(c.data());
  }
};

BNB_AMX_TARGET void gemm_amx(const uint16_t* x, int64_t M, int64_t N, int64_t K, const uint8_t* B, const float* absmax,
                             const NestedAbsmax* nested, const float* code, int64_t blocksize, const uint16_t* bias,
                             uint16_t* y, uint16_t* xb, int threads) {
  const int64_t MT = (M + 15) / 16, KC = K / 32, G = K / 64;
  parallel_for(MT * G, 16, threads, [&](int64_t i0, int64_t i1) BNB_AMX_TARGET {
    for (int64_t i = i0; i < i1; ++i) pack_x_group(x, M, K, i / G, i % G, xb);
  });
  int shift = 0;
  while ((int64_t(1) << shift) < blocksize) ++shift;
  const int64_t pass_tiles = std::min(MT, kPassRows / 16), pairs = (pass_tiles + 1) / 2;
  // k per pass over x: the pass's x (at most kPassBytes) stays in L2 while every panel of the thread
  // multiplies it; a whole-K pass at K = 11008 would stream 2.75 MiB from L3 for each panel.
  const int64_t pass_k = std::min(K, std::max(kSlice, kPassBytes / (pass_tiles * 16 * 2) / kSlice * kSlice));
  const int64_t panels = (N + kRows - 1) / kRows;
  parallel_for(panels, 1, threads, [&](int64_t p0, int64_t p1) BNB_AMX_TARGET {
    static thread_local ThreadBuffers buf;
    uint16_t* wb = buf.panel(kSlice);
    // C tiles between k passes: one set per panel of this thread's share when K takes several passes.
    float* acc = buf.acc((pass_k < K ? p1 - p0 : 1) * pairs * 4);
    TileScope scope;
    for (int64_t t0 = 0; t0 < MT; t0 += pass_tiles) {
      const int64_t t1 = std::min(MT, t0 + pass_tiles);
      const bool one_pair = t1 - t0 <= 2;
      for (int64_t k0 = 0; k0 < K; k0 += pass_k) {
        const int64_t k1 = std::min(K, k0 + pass_k);
        for (int64_t p = p0; p < p1; ++p) {
          const int64_t n0 = p * kRows;
          float* cp = acc + (pass_k < K ? p - p0 : 0) * pairs * 4 * 256;
          for (int64_t ks = k0; ks < k1; ks += kSlice) {
            const int64_t slen = std::min(kSlice, k1 - ks);
            decode_panel(B, N, K, n0, ks, slen, absmax, nested, code, shift, wb);
            BNB_COMPILER_BARRIER();
            const bool last = ks + slen >= K, pass_end = ks + slen >= k1;
            const Acc mode = ks == 0 ? Acc::zero : (one_pair && ks > k0) ? Acc::keep : Acc::load;
            const bool store = pass_end || !one_pair;
            for (int64_t t = t0; t < t1; t += 2) {
              float* c = cp + (t - t0) / 2 * 4 * 256;
              const uint16_t* x0 = xb + (t * KC + ks / 32) * kTile;
              if (t + 1 < t1)
                tiles<2>(wb, x0, x0 + KC * kTile, slen / 32, mode, store, c);
              else
                tiles<1>(wb, x0, x0, slen / 32, mode, store, c);
              if (!last) continue;
              for (int64_t j = 0; j < std::min<int64_t>(2, t1 - t); ++j)
                for (int64_t i = 0; i < 2; ++i)
                  if (n0 + 16 * i < N) store_tile(c + (2 * j + i) * 256, (t + j) * 16, n0 + 16 * i, M, N, bias, y);
            }
          }
        }
      }
    }
  });
}

// x as 16-row tiles, and 64 bytes to align them to a line.
int64_t workspace_bytes(int64_t M, int64_t K) { return (M + 15) / 16 * 16 * K * 2 + 64; }

// Exact products of small integers: any correct tile unit gives these sums bit for bit.
BNB_AMX_TARGET bool self_test() {
  constexpr int64_t M = 3, N = 40, K = 128;
  float code[16];
  for (int i = 0; i < 16; ++i) code[i] = float(i - 8);
  std::vector<uint8_t> B(N * K / 2);
  std::vector<float> absmax(N * K / 64);
  std::vector<uint16_t> x(M * K), bias(N), y(M * N), xb(size_t(workspace_bytes(M, K) / 2));
  for (size_t i = 0; i < B.size(); ++i) B[i] = uint8_t((i * 37 + 11) & 0xff);
  for (size_t i = 0; i < absmax.size(); ++i) absmax[i] = float(1 + i % 3);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(float(int(i * 7 % 9) - 4));
  for (int64_t n = 0; n < N; ++n) bias[n] = float_to_bf16(float(n % 5));
  gemm_amx(x.data(), M, N, K, B.data(), absmax.data(), nullptr, code, 64, bias.data(), y.data(), xb.data(), 1);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float s = bf16_to_float(bias[n]);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t f = n * K + k;
        const int c = (f & 1) ? (B[f / 2] & 15) : (B[f / 2] >> 4);
        s += bf16_to_float(x[m * K + k]) * code[c] * absmax[f / 64];
      }
      if (y[m * N + n] != float_to_bf16(s)) return false;
    }
  return true;
}

std::string probe() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22)))
    return "this CPU has no AMX-TILE / AMX-BF16 (CPUID leaf 7)";
  if (!__builtin_cpu_supports("avx512bf16")) return "this CPU has AMX but no AVX512-BF16";
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return "the OS does not enable XSAVE";
  uint32_t lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return "the OS does not enable the AMX tile state (XCR0 bits 17-18)";
  // Linux 5.16+: a process asks for the tile data state (XFEATURE_XTILEDATA = 18) before its first use.
  constexpr long kArchReqXcompPerm = 0x1023, kXtileData = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXtileData) != 0)
    return std::string("Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) +
           "; needs Linux 5.16 or later)";
  if (!self_test()) return "the AMX self-test gave wrong sums";
  return "";
}

}  // namespace

void amx_bf16_unavailable(const char** why) {
  static const std::string reason = probe();
  *why = reason.c_str();
}

void amx_workspace_bytes(int64_t M, int64_t K, int64_t* bytes) { *bytes = workspace_bytes(M, K); }

BNB_AMX_TARGET void amx_tile_config(const uint8_t* load, uint8_t* out) {
  TileConfig c;
  BNB_COMPILER_BARRIER();
  _tile_storeconfig(&c);
  BNB_COMPILER_BARRIER();
  std::memcpy(out, &c, sizeof c);
  if (!load) return;
  std::memcpy(&c, load, sizeof c);
  BNB_COMPILER_BARRIER();
  if (c.palette)
    _tile_loadconfig(&c);
  else
    _tile_release();
}

void gemm_4bit_amx_bf16(const uint16_t* x, int64_t M, int64_t N, int64_t K, const uint8_t* B, const float* absmax,
                        const NestedAbsmax* nested, const float* code, int64_t blocksize, const uint16_t* bias,
                        uint16_t* y, void* work, int threads) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  // Tile loads and stores of the packed x stay within 64-byte lines.
  const uintptr_t p = (reinterpret_cast<uintptr_t>(work) + 63) & ~uintptr_t(63);
  gemm_amx(x, M, N, K, B, absmax, nested, code, blocksize, bias, y, reinterpret_cast<uint16_t*>(p), threads);
}

#else

void amx_bf16_unavailable(const char** why) {
#if defined(BNB_ISA_AVX512)
  *why = "the AMX kernel is built for Linux on x86-64 with gcc or clang only";
#elif defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
  *why = "the AMX kernel runs at the avx512 level only";
#else
  *why = "AMX tiles are an x86-64 feature";
#endif
}

void amx_workspace_bytes(int64_t, int64_t, int64_t* bytes) { *bytes = 0; }

void amx_tile_config(const uint8_t*, uint8_t* out) { std::memset(out, 0, 64); }

void gemm_4bit_amx_bf16(const uint16_t*, int64_t, int64_t, int64_t, const uint8_t*, const float*, const NestedAbsmax*,
                        const float*, int64_t, const uint16_t*, uint16_t*, void*, int) {}

#endif

}  // namespace BNB_ISA_NS
}  // namespace bnb
