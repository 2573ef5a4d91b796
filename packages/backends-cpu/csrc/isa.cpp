#include "isa.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <intrin.h>
#elif defined(BNB_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace bnb {
namespace {

bool cpu_has_avx2() {
#if defined(BNB_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  // F16C from cpuid: clang 16 and older reject __builtin_cpu_supports("f16c") (found building for ci/fuzz).
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#elif defined(BNB_HAVE_AVX2) && defined(_MSC_VER)
  int r[4];
  __cpuid(r, 1);
  bool fma = r[2] & (1 << 12), f16c = r[2] & (1 << 29), osxsave = r[2] & (1 << 27);
  if (!(fma && f16c && osxsave)) return false;
  if ((_xgetbv(0) & 0x6) != 0x6) return false;
  __cpuidex(r, 7, 0);
  return r[1] & (1 << 5);
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(BNB_HAVE_AVX512) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#elif defined(BNB_HAVE_AVX512) && defined(_MSC_VER)
  if (!cpu_has_avx2() || (_xgetbv(0) & 0xe6) != 0xe6) return false;
  int r[4];
  __cpuidex(r, 7, 0);
  const int f = 1 << 16, dq = 1 << 17, bw = 1 << 30, vl = 1 << 31;
  return (r[1] & f) && (r[1] & dq) && (r[1] & bw) && (r[1] & vl);
#else
  return false;
#endif
}

Isa detect() {
#if defined(BNB_HAVE_NEON)
  return Isa::neon;  // Advanced SIMD is part of the aarch64 baseline.
#else
  if (cpu_has_avx512()) return Isa::avx512;
  if (cpu_has_avx2()) return Isa::avx2;
  return Isa::scalar;
#endif
}

std::atomic<int>& active() {
  static std::atomic<int> level{int(detect())};
  return level;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
    case Isa::neon:
      return "neon";
    default:
      return "scalar";
  }
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out{Isa::scalar};
  Isa best = best_isa();
  if (best == Isa::neon) out.push_back(Isa::neon);
  if (best == Isa::avx2 || best == Isa::avx512) out.push_back(Isa::avx2);
  if (best == Isa::avx512) out.push_back(Isa::avx512);
  return out;
}

Isa best_isa() {
  static const Isa best = detect();
  return best;
}

Isa active_isa() { return Isa(active().load(std::memory_order_relaxed)); }

void set_active_isa(const std::string& name) {
  std::string known;
  for (Isa isa : supported_isas()) {
    if (name == isa_name(isa)) {
      active().store(int(isa), std::memory_order_relaxed);
      return;
    }
    known += known.empty() ? "" : ", ";
    known += isa_name(isa);
  }
  throw std::invalid_argument("BNB_CPU_ISA / isa must be one of the levels this CPU and build support (" + known +
                              "); got '" + name + "'");
}

}  // namespace bnb
