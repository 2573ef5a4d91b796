#include "isa.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <intrin.h>
#elif defined(BNB_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#if defined(BNB_HAVE_NEON) && defined(__linux__)
#include <sys/auxv.h>
#elif defined(BNB_HAVE_NEON) && defined(__APPLE__)
#include <sys/sysctl.h>
#elif defined(BNB_HAVE_NEON) && defined(_WIN32)
#include <windows.h>
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

#if defined(BNB_HAVE_NEON)
// The optional arm64 extensions the neon_dotprod and neon_bf16 levels need, as the OS reports them (user
// space cannot read the ID registers everywhere; the kernel and macOS filter them anyway).
struct ArmFeatures {
  bool dotprod = false, bf16 = false, fhm = false, i8mm = false;
};

#if defined(__linux__)
// Bit values from the Linux kernel's arch/arm64/include/uapi/asm/hwcap.h, for older libc headers.
constexpr unsigned long kHwcapAsimddp = 1ul << 20;
constexpr unsigned long kHwcapAsimdfhm = 1ul << 23;
constexpr unsigned long kHwcap2I8mm = 1ul << 13;
constexpr unsigned long kHwcap2Bf16 = 1ul << 14;
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif

ArmFeatures arm_features() {
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  ArmFeatures f;
  f.dotprod = hw & kHwcapAsimddp;
  f.fhm = hw & kHwcapAsimdfhm;
  f.i8mm = hw2 & kHwcap2I8mm;
  f.bf16 = hw2 & kHwcap2Bf16;
  return f;
}
#elif defined(__APPLE__)
bool sysctl_flag(const char* name) {
  int value = 0;
  size_t size = sizeof value;
  // A name this macOS does not know (FEAT_* came with macOS 12) reads as absent.
  return sysctlbyname(name, &value, &size, nullptr, 0) == 0 && value != 0;
}

ArmFeatures arm_features() {
  ArmFeatures f;
  f.dotprod = sysctl_flag("hw.optional.arm.FEAT_DotProd");
  f.bf16 = sysctl_flag("hw.optional.arm.FEAT_BF16");
  f.fhm = sysctl_flag("hw.optional.arm.FEAT_FHM");
  f.i8mm = sysctl_flag("hw.optional.arm.FEAT_I8MM");
  return f;
}
#elif defined(_WIN32)
#ifndef PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE
#define PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE 43
#endif

// Windows reports DotProd but no BF16 / I8MM feature: neon_dotprod is the most it can pick.
ArmFeatures arm_features() {
  ArmFeatures f;
  f.dotprod = IsProcessorFeaturePresent(PF_ARM_V82_DP_INSTRUCTIONS_AVAILABLE);
  return f;
}
#else
ArmFeatures arm_features() { return {}; }
#endif
#endif

Isa detect() {
#if defined(BNB_HAVE_NEON)
  // Advanced SIMD is part of the aarch64 baseline; the higher levels need what their kernels may use.
  const ArmFeatures f = arm_features();
#if defined(BNB_HAVE_NEON_BF16)
  if (f.dotprod && f.bf16 && f.fhm && f.i8mm) return Isa::neon_bf16;
#endif
#if defined(BNB_HAVE_NEON_DOTPROD)
  if (f.dotprod) return Isa::neon_dotprod;
#endif
  return Isa::neon;
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
    case Isa::neon_dotprod:
      return "neon_dotprod";
    case Isa::neon_bf16:
      return "neon_bf16";
    default:
      return "scalar";
  }
}

std::vector<Isa> compiled_isas() {
  std::vector<Isa> out{Isa::scalar};
#if defined(BNB_HAVE_AVX2)
  out.push_back(Isa::avx2);
#endif
#if defined(BNB_HAVE_AVX512)
  out.push_back(Isa::avx512);
#endif
#if defined(BNB_HAVE_NEON)
  out.push_back(Isa::neon);
#endif
#if defined(BNB_HAVE_NEON_DOTPROD)
  out.push_back(Isa::neon_dotprod);
#endif
#if defined(BNB_HAVE_NEON_BF16)
  out.push_back(Isa::neon_bf16);
#endif
  return out;
}

std::vector<Isa> supported_isas() {
  // Each architecture's levels build on the one below: a CPU that runs one runs every lower one.
  std::vector<Isa> out;
  const Isa best = best_isa();
  for (Isa isa : compiled_isas()) {
    out.push_back(isa);
    if (isa == best) break;
  }
  return out;
}

Isa best_isa() {
  static const Isa best = detect();
  return best;
}

Isa active_isa() { return Isa(active().load(std::memory_order_relaxed)); }

namespace {
std::atomic<int> map_lookup{0};  // 0 auto, 1 gather, 2 registers
constexpr const char* kMapLookups[] = {"auto", "gather", "registers"};
}  // namespace

bool map_in_registers() {
  const int m = map_lookup.load(std::memory_order_relaxed);
  return m == 2 || (m == 0 && cpu_is_amd());
}

void set_map_lookup(const std::string& name) {
  for (int i = 0; i < 3; ++i)
    if (name == kMapLookups[i]) return map_lookup.store(i, std::memory_order_relaxed);
  throw std::invalid_argument("name must be one of auto, gather, registers; got '" + name + "'");
}

bool cpu_is_amd() {
#if defined(BNB_HAVE_AVX2) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  static const bool amd = __builtin_cpu_is("amd");
  return amd;
#elif defined(BNB_HAVE_AVX2) && defined(_MSC_VER)
  int r[4];
  __cpuid(r, 0);  // vendor string in EBX, EDX, ECX: "AuthenticAMD"
  return r[1] == 0x68747541 && r[3] == 0x69746e65 && r[2] == 0x444d4163;
#else
  return false;
#endif
}

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
