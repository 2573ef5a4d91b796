// Metal scalar types for the emulator: half (IEEE binary16) and bfloat, both stored as their
// 16 bits and converted to and from float with round-to-nearest-even. Arithmetic on them is done
// in float and rounded back after every operation, which gives the correctly rounded result of
// the 16-bit operation (float carries more than twice the bits of either format).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace bnb_emu {
namespace metal_detail {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
  }
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (ax < 0x38800000u) {
    // Subnormal half (or zero): scale so the half's smallest step is one unit, round to even.
    if (ax < 0x33000000u) return sign;  // below half of the smallest subnormal
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14 - (e - 127) + 13 - 1 ... keeps one guard bit below
    uint32_t q = m >> (shift - 1);
    const uint32_t rest = m & ((1u << (shift - 1)) - 1u);
    const uint32_t guard = q & 1u;
    q >>= 1;
    if (guard && (rest || (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((ax >> 13) - (112u << 10));
  const uint32_t dropped = ax & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    // zero or subnormal: m * 2^-24, exact in float
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (e == 31) return f32_from(sign | 0x7f800000u | (m << 13));
  return f32_from(sign | ((e + 112u) << 23) | (m << 13));
}

// True while a dispatch emulates an Apple GPU's flushing of float32 subnormals (BNB_EMU_METAL_FTZ; set by
// metal_launch::run). The host's FTZ/DAZ bits cover float arithmetic; this covers the one conversion done
// in integer code here that Apple's hardware also flushes: float -> bfloat (pytorch/pytorch#193897).
inline bool& flush_subnormals_active() {
  static bool on = false;
  return on;
}

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7f800000u) == 0 && flush_subnormals_active()) return static_cast<uint16_t>((x >> 16) & 0x8000u);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;  // canonical quiet nan, as torch writes it
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

inline float bf16_to_f32(uint16_t b) { return f32_from(static_cast<uint32_t>(b) << 16); }

struct half_traits {
  static uint16_t from_float(float f) { return f32_to_f16(f); }
  static float to_float(uint16_t b) { return f16_to_f32(b); }
};
struct bfloat_traits {
  static uint16_t from_float(float f) { return f32_to_bf16(f); }
  static float to_float(uint16_t b) { return bf16_to_f32(b); }
};

// One 16-bit float type per traits. Implicit conversions both ways, as MSL allows between scalar
// types; operators are spelled out so mixed expressions resolve as MSL's usual arithmetic
// conversions do (16-bit op integer -> 16-bit, 16-bit op float -> float).
template <class Traits>
struct f16_base {
  uint16_t bits;

  f16_base() = default;
  f16_base(float f) : bits(Traits::from_float(f)) {}  // NOLINT: implicit like MSL
  f16_base(double d) : bits(Traits::from_float(static_cast<float>(d))) {}
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
  f16_base(I i) : bits(Traits::from_float(static_cast<float>(i))) {}
  operator float() const { return Traits::to_float(bits); }  // NOLINT

  static f16_base from_bits(uint16_t b) {
    f16_base h;
    h.bits = b;
    return h;
  }

  template <class U>
  f16_base& operator+=(const U& o) {
    return *this = f16_base(float(*this) + float(o));
  }
  template <class U>
  f16_base& operator-=(const U& o) {
    return *this = f16_base(float(*this) - float(o));
  }
  template <class U>
  f16_base& operator*=(const U& o) {
    return *this = f16_base(float(*this) * float(o));
  }
  template <class U>
  f16_base& operator/=(const U& o) {
    return *this = f16_base(float(*this) / float(o));
  }
  f16_base& operator++() { return *this += 1.0f; }
  f16_base& operator--() { return *this -= 1.0f; }
  f16_base operator++(int) {
    f16_base t = *this;
    *this += 1.0f;
    return t;
  }
  f16_base operator--(int) {
    f16_base t = *this;
    *this -= 1.0f;
    return t;
  }
  f16_base operator-() const { return from_bits(static_cast<uint16_t>(bits ^ 0x8000u)); }
  f16_base operator+() const { return *this; }
};

template <class T>
struct is_f16 : std::false_type {};
template <class Tr>
struct is_f16<f16_base<Tr>> : std::true_type {};

#define BNB_EMU_F16_OPS(OP)                                                                                     \
  template <class Tr>                                                                                           \
  inline f16_base<Tr> operator OP(f16_base<Tr> a, f16_base<Tr> b) {                                             \
    return f16_base<Tr>(float(a) OP float(b));                                                                  \
  }                                                                                                             \
  template <class Tr, class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>                           \
  inline f16_base<Tr> operator OP(f16_base<Tr> a, I b) {                                                        \
    return f16_base<Tr>(float(a) OP float(f16_base<Tr>(b)));                                                    \
  }                                                                                                             \
  template <class Tr, class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>                           \
  inline f16_base<Tr> operator OP(I a, f16_base<Tr> b) {                                                        \
    return f16_base<Tr>(float(f16_base<Tr>(a)) OP float(b));                                                    \
  }                                                                                                             \
  template <class Tr, class F, std::enable_if_t<std::is_floating_point<F>::value, int> = 0>                     \
  inline float operator OP(f16_base<Tr> a, F b) {                                                               \
    return float(a) OP static_cast<float>(b);                                                                   \
  }                                                                                                             \
  template <class Tr, class F, std::enable_if_t<std::is_floating_point<F>::value, int> = 0>                     \
  inline float operator OP(F a, f16_base<Tr> b) {                                                               \
    return static_cast<float>(a) OP float(b);                                                                   \
  }                                                                                                             \
  inline float operator OP(f16_base<half_traits> a, f16_base<bfloat_traits> b) { return float(a) OP float(b); } \
  inline float operator OP(f16_base<bfloat_traits> a, f16_base<half_traits> b) { return float(a) OP float(b); }
BNB_EMU_F16_OPS(+)
BNB_EMU_F16_OPS(-)
BNB_EMU_F16_OPS(*)
BNB_EMU_F16_OPS(/)
#undef BNB_EMU_F16_OPS

#define BNB_EMU_F16_CMP(OP)                                                             \
  template <class Tr>                                                                   \
  inline bool operator OP(f16_base<Tr> a, f16_base<Tr> b) {                             \
    return float(a) OP float(b);                                                        \
  }                                                                                     \
  template <class Tr, class U, std::enable_if_t<std::is_arithmetic<U>::value, int> = 0> \
  inline bool operator OP(f16_base<Tr> a, U b) {                                        \
    return float(a) OP static_cast<float>(b);                                           \
  }                                                                                     \
  template <class Tr, class U, std::enable_if_t<std::is_arithmetic<U>::value, int> = 0> \
  inline bool operator OP(U a, f16_base<Tr> b) {                                        \
    return static_cast<float>(a) OP float(b);                                           \
  }
BNB_EMU_F16_CMP(==)
BNB_EMU_F16_CMP(!=)
BNB_EMU_F16_CMP(<)
BNB_EMU_F16_CMP(<=)
BNB_EMU_F16_CMP(>)
BNB_EMU_F16_CMP(>=)
#undef BNB_EMU_F16_CMP

}  // namespace metal_detail
}  // namespace bnb_emu

using half = bnb_emu::metal_detail::f16_base<bnb_emu::metal_detail::half_traits>;
using bfloat = bnb_emu::metal_detail::f16_base<bnb_emu::metal_detail::bfloat_traits>;
static_assert(sizeof(half) == 2 && sizeof(bfloat) == 2, "16-bit float types must be 2 bytes");

using uchar = unsigned char;
using ushort = unsigned short;
using uint = unsigned int;
using ulong = unsigned long;
static_assert(sizeof(long) == 8, "MSL long is 64 bits; the emulator needs an LP64 host");
