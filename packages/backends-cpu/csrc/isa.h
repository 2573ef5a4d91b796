// Which instruction-set level the kernels run at: detected once, lowered by BNB_CPU_ISA or set_isa().
#pragma once

#include <string>
#include <vector>

namespace bnb {

// x86: scalar < avx2 < avx512. arm64: scalar < neon (Armv8.0 Advanced SIMD, the aarch64 baseline) <
// neon_dotprod (+FEAT_DotProd) < neon_bf16 (+DotProd, FEAT_BF16, FEAT_FHM, FEAT_I8MM).
enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2, neon = 3, neon_dotprod = 4, neon_bf16 = 5 };

const char* isa_name(Isa isa);
// Levels this build compiled and this CPU can run, lowest first.
std::vector<Isa> supported_isas();
// Levels this build compiled, lowest first (a CPU may run fewer).
std::vector<Isa> compiled_isas();
Isa best_isa();
Isa active_isa();
// Throws std::invalid_argument (ValueError in Python) for an unknown or unsupported level.
void set_active_isa(const std::string& name);
// Whether the CPU's vendor is AMD (x86 CPUID); false elsewhere.
bool cpu_is_amd();
// How AVX-512 kernels read a 256-entry table of floats by 8-bit codes (the 8-bit optimizers' maps, double
// quantization's scale codes): from 16 registers (permutes) or by a vpgatherdd of 16. Both give the same
// bits; the faster differs by core (measured: registers on AMD's Zen 4, the gather on an Intel Xeon), so
// "auto" picks by vendor. set_map_lookup throws std::invalid_argument for a name not auto, gather, registers.
bool map_in_registers();
void set_map_lookup(const std::string& name);

}  // namespace bnb

// Calls the kernel `fn` of the active ISA namespace with the given arguments.
#if defined(BNB_HAVE_AVX512) || defined(BNB_HAVE_AVX2)
#define BNB_DISPATCH(fn, ...)           \
  do {                                  \
    switch (::bnb::active_isa()) {      \
      case ::bnb::Isa::avx512:          \
        ::bnb::avx512::fn(__VA_ARGS__); \
        break;                          \
      case ::bnb::Isa::avx2:            \
        ::bnb::avx2::fn(__VA_ARGS__);   \
        break;                          \
      default:                          \
        ::bnb::scalar::fn(__VA_ARGS__); \
        break;                          \
    }                                   \
  } while (0)
#elif defined(BNB_HAVE_NEON_BF16)
#define BNB_DISPATCH(fn, ...)                 \
  do {                                        \
    switch (::bnb::active_isa()) {            \
      case ::bnb::Isa::neon_bf16:             \
        ::bnb::neon_bf16::fn(__VA_ARGS__);    \
        break;                                \
      case ::bnb::Isa::neon_dotprod:          \
        ::bnb::neon_dotprod::fn(__VA_ARGS__); \
        break;                                \
      case ::bnb::Isa::neon:                  \
        ::bnb::neon::fn(__VA_ARGS__);         \
        break;                                \
      default:                                \
        ::bnb::scalar::fn(__VA_ARGS__);       \
        break;                                \
    }                                         \
  } while (0)
#elif defined(BNB_HAVE_NEON_DOTPROD)
// MSVC ARM64 builds stop here (CMakeLists.txt): Windows cannot report FEAT_BF16, so no neon_bf16.
#define BNB_DISPATCH(fn, ...)                 \
  do {                                        \
    switch (::bnb::active_isa()) {            \
      case ::bnb::Isa::neon_dotprod:          \
        ::bnb::neon_dotprod::fn(__VA_ARGS__); \
        break;                                \
      case ::bnb::Isa::neon:                  \
        ::bnb::neon::fn(__VA_ARGS__);         \
        break;                                \
      default:                                \
        ::bnb::scalar::fn(__VA_ARGS__);       \
        break;                                \
    }                                         \
  } while (0)
#elif defined(BNB_HAVE_NEON)
#define BNB_DISPATCH(fn, ...)                    \
  do {                                           \
    if (::bnb::active_isa() == ::bnb::Isa::neon) \
      ::bnb::neon::fn(__VA_ARGS__);              \
    else                                         \
      ::bnb::scalar::fn(__VA_ARGS__);            \
  } while (0)
#else
#define BNB_DISPATCH(fn, ...) ::bnb::scalar::fn(__VA_ARGS__)
#endif
