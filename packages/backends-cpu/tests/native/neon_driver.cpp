// Checks every NEON level's kernels against the scalar level of the same build, on random and edge
// inputs: bytes where the format defines them (quantize / dequantize outputs, optimizer states and
// parameters, int8 results), a stated tolerance where only float summation order differs (gemv).
// Built and run under qemu-aarch64 by tests/test_neon_native.py (tests/native/build_driver.py).
//
//   neon_driver [level ...]    levels to check (default: all four); exit status 1 on any mismatch.
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/blockwise.h"
#include "kernels/fourbit.h"
#include "kernels/gemv_4bit.h"
#include "kernels/int8.h"
#include "kernels/optimizers.h"

// The kernel headers declare the levels the build's common.h knows; the driver compiles all four itself.
#define BNB_DRIVER_DECLS \
  BNB_FOURBIT_DECLS      \
  BNB_GEMV_4BIT_DECLS    \
  BNB_BLOCKWISE_DECLS    \
  BNB_INT8_DECLS         \
  BNB_OPTIMIZER_DECLS
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

#define BNB_KERNELS(ns)                                                                                           \
  Kernels {                                                                                                       \
#ns, &ns::quantize_4bit, &ns::dequantize_4bit, &ns::gemv_4bit, &ns::gemv_4bit_bf16_dot,                       \
        &ns::dequantize_4bit_range, &ns::quantize_blockwise, &ns::dequantize_blockwise,                           \
        &ns::optimizer_update_32bit, &ns::optimizer_update_8bit_blockwise, &ns::int8_vectorwise_quant,            \
        &ns::int8_colwise_quant, &ns::int8_vectorwise_dequant, &ns::int8_mm_dequant, &ns::int8_linear_matmul, \
        &ns::int8_scaled_mm                                                                                       \
  }

const Kernels kScalar = BNB_KERNELS(scalar);
const Kernels kLevels[] = {BNB_KERNELS(neon), BNB_KERNELS(neon_dotprod), BNB_KERNELS(neon_bf16)};

int g_failures = 0;
int g_checks = 0;

void fail(const Kernels& k, const std::string& what) {
  if (++g_failures <= 40) std::printf("FAIL [%s] %s\n", k.name, what.c_str());
}

std::mt19937_64 rng(20261201);

float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(rng); }

// Edge values spliced into random data: NaN, infinities, subnormals, signed zeros, huge and tiny.
const float kEdges[] = {NAN, -NAN, INFINITY, -INFINITY, 1e-40f, -1e-40f, 1.4e-45f, 0.0f, -0.0f, 3e38f, -3e38f,
                        1e-30f, 65504.0f, 65520.0f, 6e-8f, 1.0f, -1.0f};

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
          for (int edges : {0, 3}) {
            auto A = random_floats(d, n, edges, edges ? 1.0f : 3.0f);
            const int64_t blocks = (n + bs - 1) / bs, bytes = (n + 1) / 2;
            std::vector<uint8_t> q0(bytes), q1(bytes);
            std::vector<float> a0(blocks), a1(blocks);
            kScalar.quantize_4bit(A.data(), d, n, qt, bs, q0.data(), a0.data(), 1);
            k.quantize_4bit(A.data(), d, n, qt, bs, q1.data(), a1.data(), 2);
            ++g_checks;
            if (!same_bytes(q0, q1) || !same_bytes(a0, a1))
              fail(k, fmt("quantize_4bit %s qt=%d bs=%lld n=%lld edges=%d", dname(d), int(qt), (long long)bs,
                          (long long)n, edges));
            // Dequantize those codes (and their absmax, edges included) back into every dtype.
            for (DType od : kDtypes) {
              std::vector<uint8_t> y0(n * esize(od)), y1(n * esize(od));
              kScalar.dequantize_4bit(q0.data(), a0.data(), qt, n, bs, y0.data(), od, 1);
              k.dequantize_4bit(q0.data(), a0.data(), qt, n, bs, y1.data(), od, 2);
              ++g_checks;
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
      if (first_float_diff(y0, y1, od) >= 0) fail(k, fmt("dequantize_4bit edge absmax %s bs=%lld", dname(od), (long long)bs));
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
  const Shape shapes[] = {{1, 7, 64, 64},   {1, 33, 256, 32},  {2, 5, 1024, 128}, {3, 9, 4096, 4096}, {4, 3, 96, 32},
                          {5, 6, 160, 64},  {9, 4, 512, 256},  {1, 5, 333, 64},   {2, 3, 17, 32},     {1, 4, 48, 64},
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
          k.gemv_4bit(A.data(), d, s.M, s.N, s.K, B.data(), am.data(), code, s.bs, bp, y.data(), 1);
          k.gemv_4bit(A.data(), d, s.M, s.N, s.K, B.data(), am.data(), code, s.bs, bp, y3.data(), 3);
          ++g_checks;
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
                fail(k, fmt("gemv_4bit %s mode=%d M=%lld N=%lld K=%lld bs=%lld [%lld,%lld]: %g vs %g (tol %g)", dname(d),
                            mode, (long long)s.M, (long long)s.N, (long long)s.K, (long long)s.bs, (long long)m,
                            (long long)n, got, ref, tol));
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
    k.gemv_4bit(A.data(), DType::f32, 1, N, K, B.data(), am.data(), code, 64, nullptr, y.data(), 1);
    ++g_checks;
    for (float v : y)
      if (v == v) fail(k, "gemv_4bit NaN in A lost");
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
    std::printf("no such level; known: neon neon_dotprod neon_bf16\n");
    return 2;
  }
  for (const Kernels* k : todo) {
    const int before = g_failures;
    check_fourbit(*k);
    check_dequantize_range(*k);
    check_gemv(*k);
    std::printf("%s: %s\n", k->name, g_failures == before ? "ok" : "FAILED");
  }
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
