// Shared by every kernel and binding: element types, float16/bfloat16 conversion, the thread pool
// entry point and the per-ISA namespaces. Kernels see only raw pointers and sizes (no Python, no
// nanobind), so each kernel file can be compiled once per ISA level.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

namespace bnb {

// Element types crossing the binding layer (floats kernels read or write).
enum class DType : int { f32 = 0, f16 = 1, bf16 = 2 };

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// Round to nearest even, as torch does; NaN stays a quiet NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// IEEE binary16 <-> binary32, exact (round to nearest even), written out so every ISA level and
// compiler gives the same bits as F16C and as torch.
inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // Subnormal: value = man * 2^-24, exact in float32.
    float v = float(man) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t float_to_f16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);                        // overflow -> inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): scale so the float adder does the rounding.
    float v = bits_to_float(a) + 0.5f;  // 0.5 = 2^-1: ulp of v is 2^-24, the f16 subnormal step
    return uint16_t(sign | uint16_t(float_to_bits(v) - 0x3f000000u));
  }
  uint32_t mant_odd = (a >> 13) & 1u;
  a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return uint16_t(sign | uint16_t(a >> 13));
}

template <DType D>
struct Elem;
template <>
struct Elem<DType::f32> {
  using T = float;
  static float load(T v) { return v; }
  static T store(float v) { return v; }
};
template <>
struct Elem<DType::f16> {
  using T = uint16_t;
  static float load(T v) { return f16_to_float(v); }
  static T store(float v) { return float_to_f16(v); }
};
template <>
struct Elem<DType::bf16> {
  using T = uint16_t;
  static float load(T v) { return bf16_to_float(v); }
  static T store(float v) { return float_to_bf16(v); }
};

template <DType D>
using DTypeTag = std::integral_constant<DType, D>;

// Calls fn(DTypeTag<D>{}) with the DType known at compile time:
//   visit_dtype(d, [&](auto tag) { constexpr DType D = decltype(tag)::value; ... });
template <class Fn>
decltype(auto) visit_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::f16:
      return fn(DTypeTag<DType::f16>{});
    case DType::bf16:
      return fn(DTypeTag<DType::bf16>{});
    default:
      return fn(DTypeTag<DType::f32>{});
  }
}

// Runs fn(begin, end) over [0, n) split into at most `threads` contiguous ranges of at least `grain`
// items, on the caller and the pool's workers. Each index is handled by exactly one call, and which
// call handles it never changes what is computed, so results do not depend on the thread count.
void parallel_for(int64_t n, int64_t grain, int threads, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace bnb

// Declares the same functions in every ISA namespace this build compiles (see CMakeLists.txt).
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#define BNB_FOR_EACH_ISA(DECLS) \
  namespace bnb {               \
  namespace scalar {            \
  DECLS                         \
  }                             \
  namespace avx2 {              \
  DECLS                         \
  }                             \
  namespace avx512 {            \
  DECLS                         \
  }                             \
  }
#elif defined(__aarch64__) || defined(_M_ARM64)
#define BNB_FOR_EACH_ISA(DECLS) \
  namespace bnb {               \
  namespace scalar {            \
  DECLS                         \
  }                             \
  namespace neon {              \
  DECLS                         \
  }                             \
  namespace neon_dotprod {      \
  DECLS                         \
  }                             \
  namespace neon_bf16 {         \
  DECLS                         \
  }                             \
  }
#else
#define BNB_FOR_EACH_ISA(DECLS) \
  namespace bnb {               \
  namespace scalar {            \
  DECLS                         \
  }                             \
  }
#endif
