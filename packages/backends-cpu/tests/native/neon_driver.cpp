// Checks every NEON level's kernels against the scalar level of the same build, on random and edge
// inputs: bytes where the format defines them (quantize / dequantize outputs, optimizer states and
// parameters, int8 results), a stated tolerance where only float summation order differs (gemv).
// Built and run under qemu-aarch64 by tests/test_neon_native.py (tests/native/build_driver.py), and
// built for the host with -DBNB_DRIVER_SCALAR_ONLY, where it only prints the digest of the scalar
// kernels' outputs (the arm64 run prints the same digest when its results are the host's bytes).
//
//   neon_driver [level ...]    levels to check (default: all); exit status 1 on any mismatch.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/blockwise.h"
#include "kernels/fourbit.h"
#include "kernels/int8.h"
#include "kernels/matmul_4bit.h"
#include "kernels/optimizers.h"
#include "nearest_code_build.h"

// The kernel headers declare the levels the build's common.h knows; the driver compiles all four itself.
#define BNB_DRIVER_DECLS \
  BNB_FOURBIT_DECLS      \
  BNB_GEMV_4BIT_DECLS    \
  BNB_BLOCKWISE_DECLS    \
  BNB_INT8_DECLS         \
  BNB_OPTIMIZER_DECLS
#if !defined(BNB_DRIVER_SCALAR_ONLY)
namespace bnb {
namespace neon {
BNB_DRIVER_DECLS
}
namespace neon_dotprod {
BNB_DRIVER_DECLS
}
namespace neon_bf16 {
BNB_DRIVER_DECLS
}
}  // namespace bnb
#endif

using namespace bnb;

namespace {

struct Kernels {
  const char* name;
  decltype(&scalar::quantize_4bit) quantize_4bit;
  decltype(&scalar::dequantize_4bit) dequantize_4bit;
  decltype(&scalar::gemv_4bit) gemv_4bit;
  decltype(&scalar::gemv_4bit_bf16_dot) gemv_4bit_bf16_dot;
  decltype(&scalar::dequantize_4bit_range) dequantize_4bit_range;
  decltype(&scalar::quantize_blockwise) quantize_blockwise;
  decltype(&scalar::dequantize_blockwise) dequantize_blockwise;
  decltype(&scalar::optimizer_update_32bit) optimizer_update_32bit;
  decltype(&scalar::optimizer_update_8bit_blockwise) optimizer_update_8bit_blockwise;
  decltype(&scalar::int8_vectorwise_quant) int8_vectorwise_quant;
  decltype(&scalar::int8_colwise_quant) int8_colwise_quant;
  decltype(&scalar::int8_vectorwise_dequant) int8_vectorwise_dequant;
  decltype(&scalar::int8_mm_dequant) int8_mm_dequant;
  decltype(&scalar::int8_linear_matmul) int8_linear_matmul;
  decltype(&scalar::int8_scaled_mm) int8_scaled_mm;
};

#define BNB_KERNELS(ns)                                                                                              \
  Kernels {                                                                                                          \
    #ns, &ns::quantize_4bit, &ns::dequantize_4bit, &ns::gemv_4bit, &ns::gemv_4bit_bf16_dot,                          \
        &ns::dequantize_4bit_range, &ns::quantize_blockwise, &ns::dequantize_blockwise, &ns::optimizer_update_32bit, \
        &ns::optimizer_update_8bit_blockwise, &ns::int8_vectorwise_quant, &ns::int8_colwise_quant,                   \
        &ns::int8_vectorwise_dequant, &ns::int8_mm_dequant, &ns::int8_linear_matmul, &ns::int8_scaled_mm             \
  }

const Kernels kScalar = BNB_KERNELS(scalar);
#if defined(BNB_DRIVER_SCALAR_ONLY)
// x86 (or any) host: the scalar kernels against themselves, for the digest of their outputs.
const Kernels kLevels[] = {BNB_KERNELS(scalar)};
#else
const Kernels kLevels[] = {BNB_KERNELS(neon), BNB_KERNELS(neon_dotprod), BNB_KERNELS(neon_bf16)};
#endif

int g_failures = 0;
int g_checks = 0;

std::map<std::string, int> g_failed_ops;  // "level op" -> failures, summarized at the end

void fail(const Kernels& k, const std::string& what) {
  if (++g_failures <= 40) std::printf("FAIL [%s] %s\n", k.name, what.c_str());
  ++g_failed_ops[std::string(k.name) + " " + what.substr(0, what.find(' '))];
}

std::mt19937_64 rng(20261201);

float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }

// Edge values spliced into random data: NaN, infinities, subnormals, signed zeros, huge and tiny.
const float kEdges[] = {NAN,   -NAN,   INFINITY, -INFINITY, 1e-40f,   -1e-40f, 1.4e-45f, 0.0f, -0.0f,
                        3e38f, -3e38f, 1e-30f,   65504.0f,  65520.0f, 6e-8f,   1.0f,     -1.0f};

size_t esize(DType d) { return d == DType::f32 ? 4 : 2; }
const char* dname(DType d) { return d == DType::f32 ? "f32" : (d == DType::f16 ? "f16" : "bf16"); }

// n random floats of dtype d as raw bytes; edges: how many edge values to splice in (at random places).
std::vector<uint8_t> random_floats(DType d, int64_t n, int edges, float scale = 1.0f) {
  std::vector<uint8_t> out(size_t(n) * esize(d));
  for (int64_t i = 0; i < n; ++i) {
    float v = normal() * scale;
    if (edges > 0 && std::uniform_int_distribution<int>(0, int(n > 0 ? n : 1))(rng) < edges)
      v = kEdges[std::uniform_int_distribution<size_t>(0, sizeof kEdges / sizeof *kEdges - 1)(rng)];
    if (d == DType::f32)
      std::memcpy(out.data() + 4 * i, &v, 4);
    else {
      uint16_t h = d == DType::f16 ? float_to_f16(v) : float_to_bf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

void store_float(uint8_t* p, DType d, int64_t i, float v) {
  if (d == DType::f32) {
    std::memcpy(p + 4 * i, &v, 4);
  } else {
    uint16_t h = d == DType::f16 ? float_to_f16(v) : float_to_bf16(v);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

// Ties: values exactly on the midpoints (and on +-1) in blocks whose absmax is 1, so the scaled value
// equals a midpoint and only the `<=` vs `<` choice of the search decides the code.
std::vector<uint8_t> tie_floats(DType d, int64_t n, int64_t bs, const float* mids, int n_mids) {
  std::vector<uint8_t> out(size_t(n) * esize(d));
  for (int64_t i = 0; i < n; ++i) {
    float v = i % bs == 0 ? 1.0f : mids[std::uniform_int_distribution<int>(0, n_mids - 1)(rng)];
    if (i % 5 == 3) v = -1.0f;
    store_float(out.data(), d, i, v);
  }
  return out;
}

float load_float(const uint8_t* p, DType d, int64_t i) {
  if (d == DType::f32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return d == DType::f16 ? f16_to_float(h) : bf16_to_float(h);
}

// Byte equality, except that two NaNs of one element type count as equal: which NaN an operation makes
// from NaN operands is not fixed by the formats (x86 and arm64 already differ in their default NaN).
template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

int64_t first_float_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, DType d) {
  const int64_t n = int64_t(a.size() / esize(d));
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a.data() + i * esize(d), b.data() + i * esize(d), esize(d)) == 0) continue;
    float x = load_float(a.data(), d, i), y = load_float(b.data(), d, i);
    if (x != x && y != y) continue;
    return i;
  }
  return -1;
}

// A digest of the scalar level's outputs (FNV-1a over their bytes, every NaN of a float output replaced
// by one canonical NaN of its type: which NaN an operation creates is the architecture's choice). The
// same driver built for x86 (BNB_DRIVER_SCALAR_ONLY) prints the digest of x86's scalar kernels on the
// same inputs: equal digests mean the arm64 results, NEON levels included, are x86's bytes.
uint64_t g_digest = 0xcbf29ce484222325ull;
bool g_digesting = true;  // the first level's pass only (every pass draws the same inputs)

void digest_raw(const void* p, size_t n) {
  if (!g_digesting) return;
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) g_digest = (g_digest ^ b[i]) * 0x100000001b3ull;
}

template <class T>
void digest(const std::vector<T>& v) {
  digest_raw(v.data(), v.size() * sizeof(T));
}

template <class T>
void digest_floats(const std::vector<T>& v, DType d) {
  if (!g_digesting) return;
  const uint8_t* b = reinterpret_cast<const uint8_t*>(v.data());
  const size_t es = esize(d), n = v.size() * sizeof(T) / es;
  for (size_t i = 0; i < n; ++i) {
    float x = load_float(b, d, int64_t(i));
    if (x != x) {
      const uint32_t nan = d == DType::f32 ? 0x7fc00000u : (d == DType::f16 ? 0x7e00u : 0x7fc0u);
      digest_raw(&nan, es);
    } else {
      digest_raw(b + i * es, es);
    }
  }
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};
const int64_t kBlocks4[] = {32, 64, 128, 256, 512, 1024, 2048, 4096};

// ---- 4-bit ---------------------------------------------------------------------------------------------

void check_fourbit(const Kernels& k) {
  const int64_t sizes[] = {1, 2, 3, 15, 16, 17, 31, 33, 63, 64, 65, 100, 255, 1000, 4097, 12345};
  for (DType d : kDtypes)
    for (QuantType qt : {QuantType::nf4, QuantType::fp4})
      for (int64_t bs : kBlocks4)
        for (int64_t n : sizes) {
          if (n > 4 * bs + 100 && n != 12345) continue;
          for (int edges : {0, 3, -1}) {
            const float* mids = qt == QuantType::nf4 ? BNB_NF4_MIDPOINTS : BNB_FP4_MIDPOINTS;
            auto A = edges < 0 ? tie_floats(d, n, bs, mids, 15) : random_floats(d, n, edges, edges ? 1.0f : 3.0f);
            const int64_t blocks = (n + bs - 1) / bs, bytes = (n + 1) / 2;
            std::vector<uint8_t> q0(bytes), q1(bytes);
            std::vector<float> a0(blocks), a1(blocks);
            kScalar.quantize_4bit(A.data(), d, n, qt, bs, q0.data(), a0.data(), 1);
            k.quantize_4bit(A.data(), d, n, qt, bs, q1.data(), a1.data(), 2);
            ++g_checks;
            digest(q0);
            digest_floats(a0, DType::f32);
            if (!same_bytes(q0, q1) || !same_bytes(a0, a1))
              fail(k, fmt("quantize_4bit %s qt=%d bs=%lld n=%lld edges=%d", dname(d), int(qt), (long long)bs,
                          (long long)n, edges));
            // Dequantize those codes (and their absmax, edges included) back into every dtype.
            for (DType od : kDtypes) {
              std::vector<uint8_t> y0(n * esize(od)), y1(n * esize(od));
              kScalar.dequantize_4bit(q0.data(), a0.data(), qt, n, bs, y0.data(), od, 1);
              k.dequantize_4bit(q0.data(), a0.data(), qt, n, bs, y1.data(), od, 2);
              ++g_checks;
              digest_floats(y0, od);
              if (first_float_diff(y0, y1, od) >= 0)
                fail(k, fmt("dequantize_4bit %s qt=%d bs=%lld n=%lld at %lld", dname(od), int(qt), (long long)bs,
                            (long long)n, (long long)first_float_diff(y0, y1, od)));
            }
          }
        }
  // Random codes with absmax edges (0, subnormal, inf, NaN, huge), every output dtype.
  for (int64_t bs : {32, 64, 256}) {
    const int64_t n = 7 * bs + 19;
    std::vector<uint8_t> q((n + 1) / 2);
    for (auto& b : q) b = uint8_t(rng());
    std::vector<float> am((n + bs - 1) / bs);
    for (size_t i = 0; i < am.size(); ++i) am[i] = i < 6 ? kEdges[i + 2] : uniform(0.0f, 10.0f);
    am[0] = NAN;
    for (DType od : kDtypes) {
      std::vector<uint8_t> y0(n * esize(od)), y1(n * esize(od));
      kScalar.dequantize_4bit(q.data(), am.data(), QuantType::nf4, n, bs, y0.data(), od, 1);
      k.dequantize_4bit(q.data(), am.data(), QuantType::nf4, n, bs, y1.data(), od, 1);
      ++g_checks;
      digest_floats(y0, od);
      if (first_float_diff(y0, y1, od) >= 0)
        fail(k, fmt("dequantize_4bit edge absmax %s bs=%lld", dname(od), (long long)bs));
    }
  }
}

void check_dequantize_range(const Kernels& k) {
  float code[16];
  for (int i = 0; i < 16; ++i) code[i] = BNB_NF4_TABLE[i];
  for (int64_t bs : {32, 64, 4096}) {
    const int64_t total = 3 * bs + 77;
    std::vector<uint8_t> q((total + 1) / 2);
    for (auto& b : q) b = uint8_t(rng());
    std::vector<float> am((total + bs - 1) / bs);
    for (auto& v : am) v = uniform(0.0f, 4.0f);
    am[1] = 1e-40f;
    for (int t = 0; t < 12; ++t) {
      int64_t i0 = std::uniform_int_distribution<int64_t>(0, total - 1)(rng);
      int64_t i1 = std::uniform_int_distribution<int64_t>(i0, total)(rng);
      if (t == 0) i0 = 0, i1 = total;
      for (DType od : kDtypes) {
        std::vector<uint8_t> y0((i1 - i0) * esize(od)), y1((i1 - i0) * esize(od));
        kScalar.dequantize_4bit_range(q.data(), am.data(), code, bs, i0, i1, y0.data(), od, 1);
        k.dequantize_4bit_range(q.data(), am.data(), code, bs, i0, i1, y1.data(), od, 2);
        ++g_checks;
        digest_floats(y0, od);
        if (first_float_diff(y0, y1, od) >= 0)
          fail(k, fmt("dequantize_4bit_range %s bs=%lld [%lld, %lld)", dname(od), (long long)bs, (long long)i0,
                      (long long)i1));
      }
    }
  }
}

// gemv: every level against a double-precision sum of the reference's products (A times the weight
// rounded to A's dtype); the tolerance covers fp32 accumulation in any order plus the final rounding.
// Also: the same level's result does not depend on the thread count (bitwise).
void check_gemv(const Kernels& k) {
  const float* code = BNB_NF4_TABLE;
  struct Shape {
    int64_t M, N, K, bs;
  };
  const Shape shapes[] = {{1, 7, 64, 64},    {1, 33, 256, 32}, {2, 5, 1024, 128}, {3, 9, 4096, 4096}, {4, 3, 96, 32},
                          {5, 6, 160, 64},   {9, 4, 512, 256}, {1, 5, 333, 64},   {2, 3, 17, 32},     {1, 4, 48, 64},
                          {6, 11, 200, 128}, {1, 2, 1, 32},    {3, 4, 4128, 2048}};
  for (int mode : {1, 0}) {
    bool used = false;
    k.gemv_4bit_bf16_dot(mode, &used);
    kScalar.gemv_4bit_bf16_dot(mode, &used);
    for (const Shape& s : shapes)
      for (DType d : kDtypes)
        for (bool with_bias : {false, true}) {
          const int64_t nW = s.N * s.K;
          std::vector<uint8_t> B((nW + 1) / 2);
          for (auto& b : B) b = uint8_t(rng());
          std::vector<float> am((nW + s.bs - 1) / s.bs);
          for (auto& v : am) v = uniform(0.1f, 2.0f);
          auto A = random_floats(d, s.M * s.K, 0);
          auto bias = random_floats(d, s.N, 0);
          const void* bp = with_bias ? bias.data() : nullptr;
          std::vector<uint8_t> y(s.M * s.N * esize(d)), y3(y.size());
          k.gemv_4bit(A.data(), d, s.M, s.N, s.K, B.data(), am.data(), nullptr, code, s.bs, bp, y.data(), 1);
          k.gemv_4bit(A.data(), d, s.M, s.N, s.K, B.data(), am.data(), nullptr, code, s.bs, bp, y3.data(), 3);
          ++g_checks;
          if (g_digesting) {
            std::vector<uint8_t> ys(y.size());
            kScalar.gemv_4bit(A.data(), d, s.M, s.N, s.K, B.data(), am.data(), nullptr, code, s.bs, bp, ys.data(), 1);
            digest_floats(ys, d);
          }
          if (!same_bytes(y, y3))
            fail(k, fmt("gemv_4bit thread count changes result %s M=%lld N=%lld K=%lld", dname(d), (long long)s.M,
                        (long long)s.N, (long long)s.K));
          const double eps = d == DType::f32 ? 1.0 / (1 << 23) : (d == DType::f16 ? 1.0 / (1 << 10) : 1.0 / (1 << 7));
          for (int64_t m = 0; m < s.M; ++m)
            for (int64_t n = 0; n < s.N; ++n) {
              double ref = 0, mag = 0;
              for (int64_t kk = 0; kk < s.K; ++kk) {
                const int64_t f = n * s.K + kk;
                const uint8_t c = (f & 1) ? (B[f / 2] & 15) : (B[f / 2] >> 4);
                float w = code[c] * am[f / s.bs];
                if (d == DType::f16) w = f16_to_float(float_to_f16(w));
                if (d == DType::bf16) w = bf16_to_float(float_to_bf16(w));
                const double p = double(load_float(A.data(), d, m * s.K + kk)) * w;
                ref += p;
                mag += std::fabs(p);
              }
              if (with_bias) ref += load_float(bias.data(), d, n), mag += std::fabs(load_float(bias.data(), d, n));
              const double got = load_float(y.data(), d, m * s.N + n);
              // fp32 accumulation (K terms, any order) + rounding to d; fp32 weights on the f16/bf16 fp32
              // path differ from the rounded reference weights by eps per term.
              const double tol = mag * (double(s.K + 2) / (1 << 23) + eps) + 1e-30;
              if (!(std::fabs(got - ref) <= tol)) {
                fail(k, fmt("gemv_4bit %s mode=%d M=%lld N=%lld K=%lld bs=%lld [%lld,%lld]: %g vs %g (tol %g)",
                            dname(d), mode, (long long)s.M, (long long)s.N, (long long)s.K, (long long)s.bs,
                            (long long)m, (long long)n, got, ref, tol));
                m = s.M;
                break;
              }
            }
        }
  }
  bool used;
  k.gemv_4bit_bf16_dot(1, &used);
  kScalar.gemv_4bit_bf16_dot(1, &used);
  // NaN in A reaches the output at every level.
  {
    const int64_t N = 3, K = 64;
    std::vector<uint8_t> B(N * K / 2, 0x77);
    std::vector<float> am(N, 1.0f), A(K, 1.0f), y(N);
    A[5] = NAN;
    k.gemv_4bit(A.data(), DType::f32, 1, N, K, B.data(), am.data(), nullptr, code, 64, nullptr, y.data(), 1);
    ++g_checks;
    for (float v : y)
      if (v == v) fail(k, "gemv_4bit NaN in A lost");
  }
}

// ---- 8-bit maps ----------------------------------------------------------------------------------------

// Test maps: sorted signed values in [-1, 1] with a cluster of tiny ones (exercises the key floor and
// flagged keys), the same unsigned in [0, 1], and a shuffled copy (not value-sorted: the order table).
std::vector<float> make_map(bool is_signed, bool shuffled) {
  std::vector<float> m(256);
  for (int i = 0; i < 256; ++i) {
    float u = uniform(is_signed ? -1.0f : 0.0f, 1.0f);
    if (i % 7 == 0) u = u * 1e-6f;
    if (i % 31 == 0) u = u * 1e-30f;
    m[i] = u;
  }
  m[0] = 0.0f;
  m[1] = 1.0f;
  if (is_signed) m[2] = -1.0f;
  m[3] = m[4];  // a repeated value
  std::sort(m.begin(), m.end());
  if (shuffled) std::shuffle(m.begin(), m.end(), rng);
  return m;
}

struct Map8 {
  std::vector<float> code;
  NearestCode nc;
  explicit Map8(std::vector<float> c) : code(std::move(c)) { build_nearest_code(code.data(), nc); }
};

void check_blockwise(const Kernels& k) {
  for (bool is_signed : {true, false})
    for (bool shuffled : {false, true}) {
      auto map = std::make_unique<Map8>(make_map(is_signed, shuffled));
      for (DType d : kDtypes)
        for (int64_t bs : kBlocks4)
          for (int64_t n : {1, 15, 17, 64, 100, 1000, 4097, 9000})
            for (bool ties : {false, true}) {
              if (n > 3 * bs + 1000 && n != 9000) continue;
              auto A = ties ? tie_floats(d, n, bs, map->nc.mids, 255) : random_floats(d, n, 4, 2.0f);
              const int64_t blocks = (n + bs - 1) / bs;
              std::vector<uint8_t> q0(n), q1(n);
              std::vector<float> a0(blocks), a1(blocks);
              kScalar.quantize_blockwise(A.data(), d, n, map->nc, bs, q0.data(), a0.data(), 1);
              k.quantize_blockwise(A.data(), d, n, map->nc, bs, q1.data(), a1.data(), 2);
              ++g_checks;
              digest(q0);
              digest_floats(a0, DType::f32);
              if (!same_bytes(q0, q1) || !same_bytes(a0, a1))
                fail(k, fmt("quantize_blockwise %s signed=%d shuffled=%d bs=%lld n=%lld", dname(d), is_signed, shuffled,
                            (long long)bs, (long long)n));
              for (DType od : kDtypes) {
                std::vector<uint8_t> y0(n * esize(od)), y1(n * esize(od));
                kScalar.dequantize_blockwise(q0.data(), a0.data(), map->code.data(), n, bs, y0.data(), od, 1);
                k.dequantize_blockwise(q0.data(), a0.data(), map->code.data(), n, bs, y1.data(), od, 2);
                ++g_checks;
                digest_floats(y0, od);
                if (first_float_diff(y0, y1, od) >= 0)
                  fail(k, fmt("dequantize_blockwise %s bs=%lld n=%lld", dname(od), (long long)bs, (long long)n));
              }
            }
    }
}

// ---- optimizers ----------------------------------------------------------------------------------------

OptStep make_step(int rule, bool wd, bool skip, bool first) {
  OptStep s{};
  s.rule = rule;
  s.beta1 = 0.9f, s.one_minus_beta1 = 0.1f, s.beta2 = 0.999f, s.one_minus_beta2 = 0.001f;
  s.beta3 = 0.9999f, s.one_minus_beta3 = 1e-4f, s.alpha = 5.0f, s.eps = 1e-8f;
  s.gnorm_scale = 0.75f, s.lr = 1e-3f;
  s.weight_decay = wd, s.coupled_decay = 0.01f, s.decay_factor = 1.0f - 1e-5f;
  s.adam_step_size = -1e-3f * 0.0447f / 0.271f, s.adam_eps = 1e-8f * 0.0447f;
  s.correction1 = 0.271f, s.correction2 = 0.0447f, s.norm_correction1 = 0.271f, s.norm_correction2 = 0.002f;
  s.first_step = first, s.skip_zeros = skip;
  return s;
}

std::vector<float> positive(int64_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = uniform(0.0f, 2.0f);
  return v;
}

void check_optimizers(const Kernels& k) {
  const int64_t sizes[] = {1, 5, 255, 256, 257, 1000, 4099};
  for (int rule = kAdam; rule <= kLion; ++rule)
    for (int flags = 0; flags < 8; ++flags)
      for (DType d : kDtypes)
        for (int64_t n : sizes) {
          const bool wd = flags & 1, skip = flags & 2, first = flags & 4;
          const OptStep st = make_step(rule, wd, skip, first);
          auto g = random_floats(d, n, 3);
          if (skip)  // zeros in g: skip_zeros keeps those elements
            for (int64_t i = 0; i < n; i += 3) std::memset(g.data() + i * esize(d), 0, esize(d));
          auto p = random_floats(d, n, 2);
          const int64_t rows = rule == kAdemamix ? 2 : 1;
          // 32-bit states (with and without max_unorm).
          for (bool unorm : {false, true}) {
            if (unorm && n > 1000) continue;
            std::vector<float> s1(rows * n), s2(n);
            for (auto& x : s1) x = normal();
            s2 = positive(n);
            auto p0 = p, p1 = p;
            auto s10 = s1, s11 = s1, s20 = s2, s21 = s2;
            float u0 = 0.5f, u1 = 0.5f;
            kScalar.optimizer_update_32bit(st, d, g.data(), p0.data(), s10.data(), s20.data(), n, unorm ? &u0 : nullptr,
                                           1.0f, 1);
            k.optimizer_update_32bit(st, d, g.data(), p1.data(), s11.data(), s21.data(), n, unorm ? &u1 : nullptr, 1.0f,
                                     2);
            ++g_checks;
            std::vector<uint8_t> b10(s10.size() * 4), b11(b10.size()), b20(s20.size() * 4), b21(b20.size());
            std::memcpy(b10.data(), s10.data(), b10.size());
            std::memcpy(b11.data(), s11.data(), b11.size());
            std::memcpy(b20.data(), s20.data(), b20.size());
            std::memcpy(b21.data(), s21.data(), b21.size());
            digest_floats(p0, d);
            digest_floats(s10, DType::f32);
            digest_floats(s20, DType::f32);
            digest_floats(std::vector<float>{u0}, DType::f32);
            if (first_float_diff(p0, p1, d) >= 0 || first_float_diff(b10, b11, DType::f32) >= 0 ||
                first_float_diff(b20, b21, DType::f32) >= 0 || std::memcmp(&u0, &u1, 4) != 0)
              fail(k, fmt("optimizer_update_32bit rule=%d flags=%d %s n=%lld unorm=%d", rule, flags, dname(d),
                          (long long)n, unorm));
          }
          // 8-bit blockwise states.
          static std::unique_ptr<Map8> m1, m2;
          if (!m1)
            m1 = std::make_unique<Map8>(make_map(true, false)), m2 = std::make_unique<Map8>(make_map(false, false));
          const int64_t blocks = (n + BNB_OPTIMIZER_BLOCKSIZE - 1) / BNB_OPTIMIZER_BLOCKSIZE;
          std::vector<uint8_t> c1(rows * n), c2(n);
          for (auto& b : c1) b = uint8_t(rng());
          for (auto& b : c2) b = uint8_t(rng());
          std::vector<float> am1 = positive(rows * blocks), am2 = positive(blocks);
          auto p0 = p, p1 = p;
          auto c10 = c1, c11 = c1, c20 = c2, c21 = c2;
          auto am10 = am1, am11 = am1, am20 = am2, am21 = am2;
          const bool two = rule == kAdam || rule == kAdemamix;
          kScalar.optimizer_update_8bit_blockwise(st, d, g.data(), p0.data(), c10.data(), two ? c20.data() : nullptr,
                                                  am10.data(), two ? am20.data() : nullptr, m1->code.data(),
                                                  m2->code.data(), &m1->nc, two ? &m2->nc : nullptr, n, 1);
          k.optimizer_update_8bit_blockwise(st, d, g.data(), p1.data(), c11.data(), two ? c21.data() : nullptr,
                                            am11.data(), two ? am21.data() : nullptr, m1->code.data(), m2->code.data(),
                                            &m1->nc, two ? &m2->nc : nullptr, n, 2);
          ++g_checks;
          digest_floats(p0, d);
          digest(c10);
          digest(c20);
          digest_floats(am10, DType::f32);
          digest_floats(am20, DType::f32);
          if (first_float_diff(p0, p1, d) >= 0 || !same_bytes(c10, c11) || !same_bytes(c20, c21) ||
              !same_bytes(am10, am11) || !same_bytes(am20, am21))
            fail(k, fmt("optimizer_update_8bit_blockwise rule=%d flags=%d %s n=%lld (p %lld)", rule, flags, dname(d),
                        (long long)n, (long long)first_float_diff(p0, p1, d)));
        }
}

// ---- int8 ----------------------------------------------------------------------------------------------

template <class T>
std::vector<T> random_ints(int64_t n, int lo, int hi) {
  std::vector<T> v(n);
  std::uniform_int_distribution<int> u(lo, hi);
  for (auto& x : v) x = T(u(rng));
  return v;
}

void check_int8(const Kernels& k) {
  const int64_t Ks[] = {1, 3, 15, 16, 17, 64, 100, 1000};
  for (DType d : kDtypes)
    for (int64_t rows : {1, 2, 5})
      for (int64_t K : Ks)
        for (bool outl : {false, true}) {
          auto A = random_floats(d, rows * K, 4, 2.0f);
          const float thr = outl ? 2.5f : 0.0f;
          std::vector<int8_t> q0(rows * K), q1(rows * K);
          std::vector<float> st0(rows), st1(rows);
          std::vector<uint8_t> f0(K, 0), f1(K, 0);
          kScalar.int8_vectorwise_quant(A.data(), d, rows, K, thr, q0.data(), st0.data(), outl ? f0.data() : nullptr,
                                        1);
          k.int8_vectorwise_quant(A.data(), d, rows, K, thr, q1.data(), st1.data(), outl ? f1.data() : nullptr, 2);
          ++g_checks;
          digest(q0);
          digest_floats(st0, DType::f32);
          digest(f0);
          if (!same_bytes(q0, q1) || !same_bytes(st0, st1) || !same_bytes(f0, f1))
            fail(k, fmt("int8_vectorwise_quant %s rows=%lld K=%lld outliers=%d", dname(d), (long long)rows,
                        (long long)K, outl));
          std::vector<float> cs0(K), cs1(K);
          kScalar.int8_colwise_quant(A.data(), d, rows, K, outl, thr, q0.data(), cs0.data(), 1);
          k.int8_colwise_quant(A.data(), d, rows, K, outl, thr, q1.data(), cs1.data(), 2);
          ++g_checks;
          digest(q0);
          digest_floats(cs0, DType::f32);
          if (!same_bytes(q0, q1) || !same_bytes(cs0, cs1))
            fail(k, fmt("int8_colwise_quant %s rows=%lld K=%lld outliers=%d", dname(d), (long long)rows, (long long)K,
                        outl));
        }
  for (int64_t K : Ks) {
    const int64_t rows = 3;
    auto q = random_ints<int8_t>(rows * K, -127, 127);
    std::vector<float> st = {0.5f, 1e-40f, 3e38f};
    std::vector<float> y0(rows * K), y1(rows * K);
    kScalar.int8_vectorwise_dequant(q.data(), st.data(), rows, K, y0.data(), 1);
    k.int8_vectorwise_dequant(q.data(), st.data(), rows, K, y1.data(), 2);
    ++g_checks;
    digest_floats(y0, DType::f32);
    if (!same_bytes(y0, y1)) fail(k, fmt("int8_vectorwise_dequant K=%lld", (long long)K));
  }
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{1, 1, 1},
                          {1, 7, 16},
                          {3, 5, 17},
                          {4, 4, 64},
                          {5, 9, 100},
                          {9, 13, 1000},
                          {2, 3, 4099},
                          {1, 2, 200000},
                          // with the above, every edge tile of the 4 x 4 NEON tiles
                          {6, 14, 33},
                          {7, 11, 20},
                          {2, 5, 18},
                          {3, 6, 40}};
  for (const Shape& sh : shapes) {
    auto A = random_ints<int8_t>(sh.M * sh.K, -128, 127);
    auto B = random_ints<int8_t>(sh.N * sh.K, -128, 127);
    if (sh.K == 200000) {  // all -128: 200000 * 2^14 wraps int32, as the reference's int64 sum cast does
      std::fill(A.begin(), A.end(), int8_t(-128));
      std::fill(B.begin(), B.begin() + sh.K, int8_t(-128));
    }
    std::vector<int32_t> c0(sh.M * sh.N), c1(sh.M * sh.N), c3(sh.M * sh.N);
    kScalar.int8_linear_matmul(A.data(), B.data(), sh.M, sh.N, sh.K, c0.data(), false, 1);
    k.int8_linear_matmul(A.data(), B.data(), sh.M, sh.N, sh.K, c1.data(), false, 1);
    k.int8_linear_matmul(A.data(), B.data(), sh.M, sh.N, sh.K, c3.data(), false, 3);
    ++g_checks;
    digest(c0);
    if (!same_bytes(c0, c1) || !same_bytes(c0, c3))
      fail(k, fmt("int8_linear_matmul M=%lld N=%lld K=%lld", (long long)sh.M, (long long)sh.N, (long long)sh.K));
    std::vector<float> rs(sh.M), cs(sh.N);
    for (auto& v : rs) v = uniform(0.0f, 3.0f);
    for (auto& v : cs) v = uniform(0.0f, 3.0f);
    for (DType od : kDtypes)
      for (DType bd : kDtypes)
        for (bool with_bias : {false, true}) {
          auto bias = random_floats(bd, sh.N, 0);
          const void* bp = with_bias ? bias.data() : nullptr;
          std::vector<uint8_t> y0(sh.M * sh.N * esize(od)), y1(y0.size()), y2(y0.size());
          kScalar.int8_mm_dequant(c0.data(), rs.data(), cs.data(), bp, bd, sh.M, sh.N, y0.data(), od, 1);
          k.int8_mm_dequant(c0.data(), rs.data(), cs.data(), bp, bd, sh.M, sh.N, y1.data(), od, 2);
          k.int8_scaled_mm(A.data(), B.data(), sh.M, sh.N, sh.K, rs.data(), cs.data(), bp, bd, y2.data(), od, false, 2);
          ++g_checks;
          digest_floats(y0, od);
          if (first_float_diff(y0, y1, od) >= 0 || first_float_diff(y0, y2, od) >= 0)
            fail(k, fmt("int8_mm_dequant / int8_scaled_mm out=%s bias=%s M=%lld N=%lld K=%lld", dname(od), dname(bd),
                        (long long)sh.M, (long long)sh.N, (long long)sh.K));
        }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<const Kernels*> todo;
  for (const Kernels& k : kLevels) {
    bool want = argc <= 1;
    for (int i = 1; i < argc; ++i) want |= std::strcmp(argv[i], k.name) == 0;
    if (want) todo.push_back(&k);
  }
  if (todo.empty()) {
    std::printf("no such level; known:");
    for (const Kernels& k : kLevels) std::printf(" %s", k.name);
    std::printf("\n");
    return 2;
  }
  for (const Kernels* k : todo) {
    const int before = g_failures;
    check_fourbit(*k);
    check_dequantize_range(*k);
    check_gemv(*k);
    check_blockwise(*k);
    check_optimizers(*k);
    check_int8(*k);
    std::printf("%s: %s\n", k->name, g_failures == before ? "ok" : "FAILED");
    if (g_digesting) std::printf("scalar digest: %016llx\n", (unsigned long long)g_digest);
    g_digesting = false;
  }
  for (const auto& [op, count] : g_failed_ops) std::printf("failed: %s x%d\n", op.c_str(), count);
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
