// metal:: math, integer, relational and geometric functions for the emulator. Each works on scalars
// and elementwise on vectors; half and bfloat are computed in float and rounded back. Every function
// is computed accurately (correctly rounded where the C library is): metal::fast:: and
// metal::precise:: are the same functions here, so fast-math error bounds are not emulated.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>

#include "vec.h"

namespace metal {

using bnb_emu::metal_detail::is_f16;
using bnb_emu::metal_detail::is_scalar;
using bnb_emu::metal_detail::is_swz;
using bnb_emu::metal_detail::is_vec;
using bnb_emu::metal_detail::norm;
using bnb_emu::metal_detail::norm_t;

namespace detail {

// Result of applying a float function to x: f16 -> round back, vector -> per component.
template <class X, class F>
inline auto map1(const X& x0, F f) {
  auto x = norm(x0);
  using V = decltype(x);
  if constexpr (is_vec<V>::value) {
    V r;
    for (int i = 0; i < V::size; ++i) r[i] = map1(x[i], f);
    return r;
  } else if constexpr (is_f16<V>::value) {
    return V(f(static_cast<float>(x)));
  } else {
    return static_cast<V>(f(x));
  }
}

template <class X, class Y, class F>
inline auto map2(const X& x0, const Y& y0, F f) {
  auto x = norm(x0);
  auto y = norm(y0);
  using VX = decltype(x);
  using VY = decltype(y);
  if constexpr (is_vec<VX>::value) {
    VX r;
    if constexpr (is_vec<VY>::value) {
      for (int i = 0; i < VX::size; ++i) r[i] = map2(x[i], y[i], f);
    } else {
      for (int i = 0; i < VX::size; ++i) r[i] = map2(x[i], static_cast<typename VX::value_type>(y), f);
    }
    return r;
  } else if constexpr (is_vec<VY>::value) {
    VY r;
    for (int i = 0; i < VY::size; ++i) r[i] = map2(static_cast<typename VY::value_type>(x), y[i], f);
    return r;
  } else if constexpr (is_f16<VX>::value) {
    return VX(f(static_cast<float>(x), static_cast<float>(static_cast<VX>(y))));
  } else {
    using C = std::common_type_t<VX, VY>;
    return static_cast<C>(f(static_cast<C>(x), static_cast<C>(y)));
  }
}

template <class X>
constexpr bool is_floatish() {
  using V = norm_t<X>;
  if constexpr (is_vec<V>::value) {
    return std::is_floating_point<typename V::value_type>::value || is_f16<typename V::value_type>::value;
  } else {
    return std::is_floating_point<V>::value || is_f16<V>::value;
  }
}

template <class X>
constexpr bool is_msl_value() {
  using V = norm_t<X>;
  return is_vec<V>::value || is_scalar<V>::value;
}

}  // namespace detail

#define BNB_EMU_FLOAT_FN1(NAME, EXPR)                                     \
  template <class X, std::enable_if_t<detail::is_floatish<X>(), int> = 0> \
  inline auto NAME(const X& x) {                                          \
    return detail::map1(x, [](auto v) { return EXPR; });                  \
  }
BNB_EMU_FLOAT_FN1(sqrt, std::sqrt(v))
BNB_EMU_FLOAT_FN1(rsqrt, 1.0f / std::sqrt(v))
BNB_EMU_FLOAT_FN1(exp, std::exp(v))
BNB_EMU_FLOAT_FN1(exp2, std::exp2(v))
BNB_EMU_FLOAT_FN1(exp10, std::pow(10.0f, v))
BNB_EMU_FLOAT_FN1(log, std::log(v))
BNB_EMU_FLOAT_FN1(log2, std::log2(v))
BNB_EMU_FLOAT_FN1(log10, std::log10(v))
BNB_EMU_FLOAT_FN1(sin, std::sin(v))
BNB_EMU_FLOAT_FN1(cos, std::cos(v))
BNB_EMU_FLOAT_FN1(tan, std::tan(v))
BNB_EMU_FLOAT_FN1(asin, std::asin(v))
BNB_EMU_FLOAT_FN1(acos, std::acos(v))
BNB_EMU_FLOAT_FN1(atan, std::atan(v))
BNB_EMU_FLOAT_FN1(sinh, std::sinh(v))
BNB_EMU_FLOAT_FN1(cosh, std::cosh(v))
BNB_EMU_FLOAT_FN1(tanh, std::tanh(v))
BNB_EMU_FLOAT_FN1(floor, std::floor(v))
BNB_EMU_FLOAT_FN1(ceil, std::ceil(v))
BNB_EMU_FLOAT_FN1(round, std::round(v))
BNB_EMU_FLOAT_FN1(rint, std::nearbyint(v))
BNB_EMU_FLOAT_FN1(trunc, std::trunc(v))
BNB_EMU_FLOAT_FN1(fabs, std::fabs(v))
BNB_EMU_FLOAT_FN1(fract, std::fmin(v - std::floor(v), 0x1.fffffep-1f))
BNB_EMU_FLOAT_FN1(saturate, std::fmin(std::fmax(v, 0.0f), 1.0f))
BNB_EMU_FLOAT_FN1(sign, (v > 0 ? 1.0f : (v < 0 ? -1.0f : (v == 0 ? 0.0f * v : v))))
#undef BNB_EMU_FLOAT_FN1

#define BNB_EMU_FLOAT_FN2(NAME, EXPR)                                                                          \
  template <class X, class Y, std::enable_if_t<detail::is_floatish<X>() || detail::is_floatish<Y>(), int> = 0> \
  inline auto NAME(const X& x, const Y& y) {                                                                   \
    return detail::map2(x, y, [](auto a, auto b) { return EXPR; });                                            \
  }
BNB_EMU_FLOAT_FN2(pow, std::pow(a, b))
BNB_EMU_FLOAT_FN2(powr, std::pow(a, b))
BNB_EMU_FLOAT_FN2(atan2, std::atan2(a, b))
BNB_EMU_FLOAT_FN2(fmod, std::fmod(a, b))
BNB_EMU_FLOAT_FN2(copysign, std::copysign(a, b))
BNB_EMU_FLOAT_FN2(fmin, std::fmin(a, b))
BNB_EMU_FLOAT_FN2(fmax, std::fmax(a, b))
BNB_EMU_FLOAT_FN2(step, (b < a ? 0.0f : 1.0f))
BNB_EMU_FLOAT_FN2(divide, a / b)
#undef BNB_EMU_FLOAT_FN2

// min/max/abs/clamp for floats (NaN-ignoring like fmin/fmax) and integers.
template <class X, class Y, std::enable_if_t<detail::is_msl_value<X>() && detail::is_msl_value<Y>(), int> = 0>
inline auto min(const X& x, const Y& y) {
  return detail::map2(x, y, [](auto a, auto b) {
    if constexpr (std::is_floating_point<decltype(a)>::value)
      return std::fmin(a, b);
    else
      return b < a ? b : a;
  });
}
template <class X, class Y, std::enable_if_t<detail::is_msl_value<X>() && detail::is_msl_value<Y>(), int> = 0>
inline auto max(const X& x, const Y& y) {
  return detail::map2(x, y, [](auto a, auto b) {
    if constexpr (std::is_floating_point<decltype(a)>::value)
      return std::fmax(a, b);
    else
      return a < b ? b : a;
  });
}
template <class X, class L, class H>
inline auto clamp(const X& x, const L& lo, const H& hi) {
  return min(max(x, lo), hi);
}
template <class X, std::enable_if_t<detail::is_msl_value<X>(), int> = 0>
inline auto abs(const X& x) {
  return detail::map1(x, [](auto v) {
    if constexpr (std::is_floating_point<decltype(v)>::value)
      return std::fabs(v);
    else if constexpr (std::is_signed<decltype(v)>::value)
      return static_cast<decltype(v)>(v < 0 ? -v : v);
    else
      return v;
  });
}

template <class X, class Y, class Z>
inline auto fma(const X& x, const Y& y, const Z& z) {
  using V = norm_t<X>;
  const V a = norm(x), b = static_cast<V>(norm(y)), c = static_cast<V>(norm(z));
  if constexpr (is_vec<V>::value) {
    V r;
    for (int i = 0; i < V::size; ++i) r[i] = fma(a[i], b[i], c[i]);
    return r;
  } else if constexpr (is_f16<V>::value) {
    return V(std::fma(static_cast<float>(a), static_cast<float>(b), static_cast<float>(c)));
  } else {
    return std::fma(a, b, c);
  }
}
template <class X, class Y, class Z>
inline auto mad(const X& x, const Y& y, const Z& z) {
  return fma(x, y, z);
}
template <class X, class Y, class A>
inline auto mix(const X& x, const Y& y, const A& a) {
  return x + (y - x) * a;
}

template <class X>
inline auto isnan(const X& x) {
  auto v = norm(x);
  if constexpr (is_vec<decltype(v)>::value) {
    bnb_emu::metal_detail::vec<bool, decltype(v)::size> r;
    for (int i = 0; i < decltype(v)::size; ++i) r[i] = std::isnan(static_cast<float>(v[i]));
    return r;
  } else {
    return std::isnan(static_cast<float>(v));
  }
}
template <class X>
inline auto isinf(const X& x) {
  auto v = norm(x);
  if constexpr (is_vec<decltype(v)>::value) {
    bnb_emu::metal_detail::vec<bool, decltype(v)::size> r;
    for (int i = 0; i < decltype(v)::size; ++i) r[i] = std::isinf(static_cast<float>(v[i]));
    return r;
  } else {
    return std::isinf(static_cast<float>(v));
  }
}
template <class X>
inline auto isfinite(const X& x) {
  auto v = norm(x);
  if constexpr (is_vec<decltype(v)>::value) {
    bnb_emu::metal_detail::vec<bool, decltype(v)::size> r;
    for (int i = 0; i < decltype(v)::size; ++i) r[i] = std::isfinite(static_cast<float>(v[i]));
    return r;
  } else {
    return static_cast<bool>(std::isfinite(static_cast<float>(v)));
  }
}
template <class X>
inline auto signbit(const X& x) {
  return std::signbit(static_cast<float>(norm(x)));
}

// select(a, b, c): c ? b : a, per component when c is a bool vector.
template <class A, class B, class C>
inline auto select(const A& a0, const B& b0, const C& c0) {
  auto a = norm(a0);
  auto c = norm(c0);
  using V = decltype(a);
  const V b = static_cast<V>(norm(b0));
  if constexpr (is_vec<decltype(c)>::value) {
    V r;
    for (int i = 0; i < V::size; ++i) r[i] = c[i] ? b[i] : a[i];
    return r;
  } else {
    return c ? b : a;
  }
}

template <class X>
inline bool all(const X& x0) {
  auto x = norm(x0);
  if constexpr (is_vec<decltype(x)>::value) {
    for (int i = 0; i < decltype(x)::size; ++i)
      if (!x[i]) return false;
    return true;
  } else {
    return static_cast<bool>(x);
  }
}
template <class X>
inline bool any(const X& x0) {
  auto x = norm(x0);
  if constexpr (is_vec<decltype(x)>::value) {
    for (int i = 0; i < decltype(x)::size; ++i)
      if (x[i]) return true;
    return false;
  } else {
    return static_cast<bool>(x);
  }
}

template <class X, class Y>
inline auto dot(const X& x0, const Y& y0) {
  auto x = norm(x0);
  auto y = norm(y0);
  using T = typename decltype(x)::value_type;
  T s = x[0] * y[0];
  for (int i = 1; i < decltype(x)::size; ++i) s = fma(x[i], y[i], s);
  return s;
}
template <class X>
inline auto length(const X& x) {
  return sqrt(dot(x, x));
}
template <class X>
inline auto normalize(const X& x) {
  return norm(x) * rsqrt(dot(x, x));
}

// Integer bit functions.
template <class X>
inline auto popcount(const X& x) {
  return detail::map1(x, [](auto v) {
    using U = std::make_unsigned_t<decltype(v)>;
    return static_cast<decltype(v)>(__builtin_popcountll(static_cast<unsigned long long>(static_cast<U>(v))));
  });
}
template <class X>
inline auto clz(const X& x) {
  return detail::map1(x, [](auto v) {
    using U = std::make_unsigned_t<decltype(v)>;
    const U u = static_cast<U>(v);
    constexpr int bits = sizeof(U) * 8;
    return static_cast<decltype(v)>(u == 0 ? bits : __builtin_clzll(u) - (64 - bits));
  });
}
template <class X>
inline auto ctz(const X& x) {
  return detail::map1(x, [](auto v) {
    using U = std::make_unsigned_t<decltype(v)>;
    const U u = static_cast<U>(v);
    return static_cast<decltype(v)>(u == 0 ? static_cast<int>(sizeof(U) * 8) : __builtin_ctzll(u));
  });
}
template <class X, class Y>
inline auto mulhi(const X& x, const Y& y) {
  return detail::map2(x, y, [](auto a, auto b) {
    using T = decltype(a);
    using W = std::conditional_t<std::is_signed<T>::value, __int128, unsigned __int128>;
    return static_cast<T>((static_cast<W>(a) * static_cast<W>(b)) >> (sizeof(T) * 8));
  });
}

// as_type<T>(x): reinterpret the bits of a value of the same size.
template <class To, class From>
inline To as_type(const From& from0) {
  const auto from = norm(from0);
  static_assert(sizeof(To) == sizeof(from), "bnb_emu/metal: as_type needs types of the same size");
  To to;
  std::memcpy(static_cast<void*>(&to), static_cast<const void*>(&from), sizeof(To));
  return to;
}

namespace fast {
using namespace ::metal;
}
namespace precise {
using namespace ::metal;
}

template <class T>
struct numeric_limits : std::numeric_limits<T> {};

}  // namespace metal

namespace std {
template <class Tr>
struct numeric_limits<bnb_emu::metal_detail::f16_base<Tr>> {
  using T = bnb_emu::metal_detail::f16_base<Tr>;
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool is_half = std::is_same<Tr, bnb_emu::metal_detail::half_traits>::value;
  static constexpr int digits = is_half ? 11 : 8;
  static T max() { return T::from_bits(is_half ? 0x7bff : 0x7f7f); }
  static T lowest() { return T::from_bits(is_half ? 0xfbff : 0xff7f); }
  static T min() { return T::from_bits(is_half ? 0x0400 : 0x0080); }
  static T denorm_min() { return T::from_bits(0x0001); }
  static T epsilon() { return T::from_bits(is_half ? 0x1400 : 0x3c00); }
  static T infinity() { return T::from_bits(is_half ? 0x7c00 : 0x7f80); }
  static T quiet_NaN() { return T::from_bits(is_half ? 0x7e00 : 0x7fc0); }
};
}  // namespace std

#define HALF_MAX 65504.0f
#define HALF_MIN 6.103515625e-05f
#define HALF_EPSILON 0.0009765625f
#define MAXHALF HALF_MAX
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.70710678118654752440f
#define M_E_F 2.71828182845904523536f
#define M_LN2_F 0.69314718055994530942f
#define M_LN10_F 2.30258509299404568402f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.43429448190325182765f
#define M_1_PI_F 0.31830988618379067154f
#define M_2_SQRTPI_F 1.12837916709551257390f
#ifndef MAXFLOAT
#define MAXFLOAT 3.402823466e+38f
#endif
