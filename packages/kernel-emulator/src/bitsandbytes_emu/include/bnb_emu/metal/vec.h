// Metal vector types (float4, half2, uchar4, bool3, ...) for the emulator.
// Layout follows MSL: a 3-component vector has the size and alignment of a 4-component one
// (float3 is 16 bytes), every vector is aligned to its own size. Components are reachable as
// .x .y .z .w / .r .g .b .a, by index, and through swizzles (.xy, .zyx, .rgba, ...: every 2-, 3- and
// 4-letter combination of each vector's components, listed in swizzles.inc, which says how to regenerate it).
#pragma once

#include <cstddef>
#include <type_traits>

#include "scalar.h"

namespace bnb_emu {
namespace metal_detail {

template <class T, int N>
struct vec;

constexpr int storage_len(int n) { return n == 3 ? 4 : n; }

// A swizzle: a view of the owning vector's storage that reads and writes components I...
template <class T, int N, int... I>
struct swz {
  T d_[storage_len(N)];
  using result = vec<T, static_cast<int>(sizeof...(I))>;

  operator result() const { return result(d_[I]...); }  // NOLINT
  result get() const { return result(d_[I]...); }

  swz& operator=(const result& v) {
    const T tmp[] = {v[0], v[1], v[2 < sizeof...(I) ? 2 : 0], v[3 < sizeof...(I) ? 3 : 0]};
    int k = 0;
    ((d_[I] = tmp[k++]), ...);
    return *this;
  }
  swz& operator=(const swz& o) { return *this = o.get(); }
  template <int... J>
  swz& operator=(const swz<T, N, J...>& o) {
    return *this = o.get();
  }
  template <class U>
  swz& operator+=(const U& o) {
    return *this = get() + o;
  }
  template <class U>
  swz& operator-=(const U& o) {
    return *this = get() - o;
  }
  template <class U>
  swz& operator*=(const U& o) {
    return *this = get() * o;
  }
  template <class U>
  swz& operator/=(const U& o) {
    return *this = get() / o;
  }
  T operator[](int i) const { return get()[i]; }
};

template <class T, int N>
struct vec_storage;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
template <class T>
struct alignas(sizeof(T) * 2) vec_storage<T, 2> {
  union {
    T v_[2];
    struct {
      T x, y;
    };
    struct {
      T r, g;
    };
#define BNB_EMU_SWZ_N 2
#include "swizzles.inc"
#undef BNB_EMU_SWZ_N
  };
};
template <class T>
struct alignas(sizeof(T) * 4) vec_storage<T, 3> {
  union {
    T v_[4];
    struct {
      T x, y, z;
    };
    struct {
      T r, g, b;
    };
#define BNB_EMU_SWZ_N 3
#include "swizzles.inc"
#undef BNB_EMU_SWZ_N
  };
};
template <class T>
struct alignas(sizeof(T) * 4) vec_storage<T, 4> {
  union {
    T v_[4];
    struct {
      T x, y, z, w;
    };
    struct {
      T r, g, b, a;
    };
#define BNB_EMU_SWZ_N 4
#include "swizzles.inc"
#undef BNB_EMU_SWZ_N
  };
};
#pragma GCC diagnostic pop

template <class X>
struct is_vec : std::false_type {};
template <class T, int N>
struct is_vec<vec<T, N>> : std::true_type {};

template <class X>
struct is_swz : std::false_type {};
template <class T, int N, int... I>
struct is_swz<swz<T, N, I...>> : std::true_type {};

// Scalars of the MSL type system: arithmetic types and the two 16-bit floats.
template <class X>
struct is_scalar : std::integral_constant<bool, std::is_arithmetic<X>::value || is_f16<X>::value> {};

template <class X>
constexpr int comp_count() {
  if constexpr (is_vec<X>::value) {
    return X::size;
  } else if constexpr (is_swz<X>::value) {
    return X::result::size;
  } else {
    return 1;
  }
}

template <class T, int N>
struct vec : vec_storage<T, N> {
  static constexpr int size = N;
  using value_type = T;
  using vec_storage<T, N>::v_;

  vec() = default;
  vec(const vec& o) { copy_from(o); }
  vec& operator=(const vec& o) {
    copy_from(o);
    return *this;
  }
  // A scalar fills every component (MSL converts a scalar to a vector implicitly).
  template <class S, std::enable_if_t<is_scalar<S>::value, int> = 0>
  vec(S s) {  // NOLINT
    for (int i = 0; i < N; ++i) v_[i] = static_cast<T>(s);
  }
  // Component lists: float4(a, b, c, d), float4(v2, z, w), float4(v3, w), float4(v2a, v2b) ...
  template <class A, class B, class... Rest,
            std::enable_if_t<comp_count<A>() + comp_count<B>() + (0 + ... + comp_count<Rest>()) == N, int> = 0>
  vec(const A& a, const B& b, const Rest&... rest) {
    int k = 0;
    put(k, a);
    put(k, b);
    (put(k, rest), ...);
  }
  // Between element types only explicitly, as in MSL: float4(int4_value).
  template <class U, std::enable_if_t<!std::is_same<U, T>::value, int> = 0>
  explicit vec(const vec<U, N>& o) {
    for (int i = 0; i < N; ++i) v_[i] = static_cast<T>(o.v_[i]);
  }
  template <int M, int... I, std::enable_if_t<sizeof...(I) == N, int> = 0>
  vec(const swz<T, M, I...>& s) : vec(s.get()) {}  // NOLINT

  T& operator[](int i) { return v_[i]; }
  const T& operator[](int i) const { return v_[i]; }

 private:
  void copy_from(const vec& o) {
    for (int i = 0; i < storage_len(N); ++i) v_[i] = o.v_[i];
  }
  template <class X>
  void put(int& k, const X& x) {
    if constexpr (is_vec<X>::value) {
      for (int i = 0; i < X::size; ++i) v_[k++] = static_cast<T>(x[i]);
    } else if constexpr (is_swz<X>::value) {
      put(k, x.get());
    } else {
      v_[k++] = static_cast<T>(x);
    }
  }
};

// Normalise an operand: swizzles become vectors, everything else stays as is.
template <class X>
inline auto norm(const X& x) {
  if constexpr (is_swz<X>::value) {
    return x.get();
  } else {
    return x;
  }
}
template <class X>
using norm_t = decltype(norm(std::declval<X>()));

template <class X>
struct elem_of {
  using type = X;
};
template <class T, int N>
struct elem_of<vec<T, N>> {
  using type = T;
};

template <class A, class B>
constexpr bool vec_operands() {
  using NA = norm_t<A>;
  using NB = norm_t<B>;
  return (is_vec<NA>::value || is_vec<NB>::value) && (is_vec<NA>::value || is_scalar<NA>::value) &&
         (is_vec<NB>::value || is_scalar<NB>::value);
}

// The vector type of a vector/scalar pair: a scalar converts to the vector's element type.
template <class A, class B>
struct vec_of_pair {
  using NA = norm_t<A>;
  using NB = norm_t<B>;
  using type = std::conditional_t<is_vec<NA>::value, NA, NB>;
};

template <class V, class X>
inline V as_vec(const X& x) {
  auto n = norm(x);
  if constexpr (is_vec<decltype(n)>::value) {
    static_assert(std::is_same<decltype(n), V>::value,
                  "bnb_emu/metal: vector operands must have the same type (convert explicitly)");
    return n;
  } else {
    return V(static_cast<typename V::value_type>(n));
  }
}

#define BNB_EMU_VEC_BINOP(OP)                                                                     \
  template <class A, class B, std::enable_if_t<vec_operands<A, B>(), int> = 0>                    \
  inline auto operator OP(const A& a, const B& b) {                                               \
    using V = typename vec_of_pair<A, B>::type;                                                   \
    const V va = as_vec<V>(a), vb = as_vec<V>(b);                                                 \
    V r;                                                                                          \
    for (int i = 0; i < V::size; ++i) r[i] = static_cast<typename V::value_type>(va[i] OP vb[i]); \
    return r;                                                                                     \
  }
BNB_EMU_VEC_BINOP(+)
BNB_EMU_VEC_BINOP(-)
BNB_EMU_VEC_BINOP(*)
BNB_EMU_VEC_BINOP(/)
BNB_EMU_VEC_BINOP(%)
BNB_EMU_VEC_BINOP(&)
BNB_EMU_VEC_BINOP(|)
BNB_EMU_VEC_BINOP(^)
BNB_EMU_VEC_BINOP(<<)
BNB_EMU_VEC_BINOP(>>)
#undef BNB_EMU_VEC_BINOP

#define BNB_EMU_VEC_CMP(OP)                                                    \
  template <class A, class B, std::enable_if_t<vec_operands<A, B>(), int> = 0> \
  inline auto operator OP(const A& a, const B& b) {                            \
    using V = typename vec_of_pair<A, B>::type;                                \
    const V va = as_vec<V>(a), vb = as_vec<V>(b);                              \
    vec<bool, V::size> r;                                                      \
    for (int i = 0; i < V::size; ++i) r[i] = va[i] OP vb[i];                   \
    return r;                                                                  \
  }
BNB_EMU_VEC_CMP(==)
BNB_EMU_VEC_CMP(!=)
BNB_EMU_VEC_CMP(<)
BNB_EMU_VEC_CMP(<=)
BNB_EMU_VEC_CMP(>)
BNB_EMU_VEC_CMP(>=)
BNB_EMU_VEC_CMP(&&)
BNB_EMU_VEC_CMP(||)
#undef BNB_EMU_VEC_CMP

#define BNB_EMU_VEC_COMPOUND(OP)                                  \
  template <class T, int N, class B>                              \
  inline vec<T, N>& operator OP## = (vec<T, N> & a, const B& b) { \
    return a = a OP b;                                            \
  }
BNB_EMU_VEC_COMPOUND(+)
BNB_EMU_VEC_COMPOUND(-)
BNB_EMU_VEC_COMPOUND(*)
BNB_EMU_VEC_COMPOUND(/)
BNB_EMU_VEC_COMPOUND(%)
BNB_EMU_VEC_COMPOUND(&)
BNB_EMU_VEC_COMPOUND(|)
BNB_EMU_VEC_COMPOUND(^)
BNB_EMU_VEC_COMPOUND(<<)
BNB_EMU_VEC_COMPOUND(>>)
#undef BNB_EMU_VEC_COMPOUND

template <class T, int N>
inline vec<T, N> operator-(const vec<T, N>& a) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = static_cast<T>(-a[i]);
  return r;
}
template <class T, int N>
inline vec<T, N> operator+(const vec<T, N>& a) {
  return a;
}
template <class T, int N>
inline vec<T, N> operator~(const vec<T, N>& a) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = static_cast<T>(~a[i]);
  return r;
}
template <class T, int N>
inline vec<bool, N> operator!(const vec<T, N>& a) {
  vec<bool, N> r;
  for (int i = 0; i < N; ++i) r[i] = !a[i];
  return r;
}

}  // namespace metal_detail
}  // namespace bnb_emu

#define BNB_EMU_VEC_ALIASES(T, NAME)                \
  using NAME##2 = bnb_emu::metal_detail::vec<T, 2>; \
  using NAME##3 = bnb_emu::metal_detail::vec<T, 3>; \
  using NAME##4 = bnb_emu::metal_detail::vec<T, 4>;
BNB_EMU_VEC_ALIASES(float, float)
BNB_EMU_VEC_ALIASES(half, half)
BNB_EMU_VEC_ALIASES(bfloat, bfloat)
BNB_EMU_VEC_ALIASES(int, int)
BNB_EMU_VEC_ALIASES(uint, uint)
BNB_EMU_VEC_ALIASES(short, short)
BNB_EMU_VEC_ALIASES(ushort, ushort)
BNB_EMU_VEC_ALIASES(signed char, char)
BNB_EMU_VEC_ALIASES(uchar, uchar)
BNB_EMU_VEC_ALIASES(bool, bool)
BNB_EMU_VEC_ALIASES(long, long)
BNB_EMU_VEC_ALIASES(ulong, ulong)
#undef BNB_EMU_VEC_ALIASES

static_assert(sizeof(float3) == 16 && alignof(float3) == 16, "float3 must be laid out as in MSL");
static_assert(sizeof(half4) == 8 && sizeof(uchar4) == 4 && sizeof(float2) == 8, "vector sizes as in MSL");
