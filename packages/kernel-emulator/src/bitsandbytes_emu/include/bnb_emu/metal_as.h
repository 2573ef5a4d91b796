// Address-space check for Metal sources (bitsandbytes_emu.check_metal_address_spaces): a header
// that stands in for bnb_emu/metal.h when clang only type-checks (-fsyntax-only) the front end's C++ text.
// Nothing here runs.
//
// The emulating shim erases MSL's address spaces (device, constant, threadgroup, thread are empty macros
// there), so a kernel that hands a threadgroup pointer to a device parameter, or writes through a
// constant one, runs fine in emulation and is rejected by Apple's compiler. Here each space is one of
// clang's numbered address spaces, between which C++ allows no implicit conversion:
//   device = 1, constant = 2 (and const: MSL's constant memory is read-only), threadgroup = 3,
//   thread = the generic space (what unqualified locals and their addresses have, as in MSL).
// Clang rejects member functions on objects in a numbered space (a method's `this` is generic, and plain
// C++ cannot qualify it), so every type a kernel keeps in device or threadgroup memory must be a builtin
// type: half is __fp16, vectors are clang ext_vector_types, atomics are enums. bfloat has no builtin
// 16-bit type on every host clang, so it is a distinct arithmetic type of another size; sizes are not
// what this check is about.
#pragma once

#if !defined(__clang__)
#error "bnb_emu/metal_as.h: the address-space check needs clang (address_space attributes)"
#endif

#define device __attribute__((address_space(1)))
#define constant const __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define kernel
#define METAL_FUNC inline
// The front end's rewrite of `threadgroup T name[N];` inside a kernel. A local with an address space
// must be static for clang (automatic variables cannot have one), which changes nothing checked here.
#define BNB_EMU_THREADGROUP_VAR static threadgroup

namespace bnb_emu {
namespace metal_launch {
template <class P>
inline void note_threadgroup(P, unsigned long) {}
}  // namespace metal_launch
}  // namespace bnb_emu

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef __fp16 half;
typedef long double bfloat;
typedef decltype(sizeof(0)) size_t;
typedef long ptrdiff_t;

#define BNB_EMU_AS_VECTORS(T)                         \
  typedef T T##2 __attribute__((ext_vector_type(2))); \
  typedef T T##3 __attribute__((ext_vector_type(3))); \
  typedef T T##4 __attribute__((ext_vector_type(4)));
// clang-format off
BNB_EMU_AS_VECTORS(float)
BNB_EMU_AS_VECTORS(half)
BNB_EMU_AS_VECTORS(int)
BNB_EMU_AS_VECTORS(uint)
BNB_EMU_AS_VECTORS(short)
BNB_EMU_AS_VECTORS(ushort)
BNB_EMU_AS_VECTORS(char)
BNB_EMU_AS_VECTORS(uchar)
BNB_EMU_AS_VECTORS(long)
BNB_EMU_AS_VECTORS(ulong)
// clang-format on
typedef uchar2 bool2;
typedef uchar3 bool3;
typedef uchar4 bool4;  // clang has no bool vectors; only the spaces matter here
#undef BNB_EMU_AS_VECTORS

// check_metal_address_spaces rewrites MSL's vector constructors and conversions, `float4(a, b, c, d)`,
// `float4(half4_value)`, which C++ has no spelling for on ext_vector_types, into calls of this. Only its
// type matters here: any scalars or vectors, read from any address space, make a vector.
template <class V, class... A>
V bnb_emu_as_vector(A...);

#define NAN __builtin_nanf("")
#define INFINITY __builtin_inff()
#define HUGE_VALF __builtin_huge_valf()
#define MAXFLOAT 0x1.fffffep+127f
#define FLT_MAX 0x1.fffffep+127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f

namespace metal {

enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return static_cast<mem_flags>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
inline void threadgroup_barrier(mem_flags) {}
inline void simdgroup_barrier(mem_flags) {}

enum memory_order { memory_order_relaxed };
enum class thread_scope { thread_scope_device, thread_scope_threadgroup, thread_scope_simdgroup };
inline void atomic_thread_fence(mem_flags, memory_order) {}

// Values: by value, so an operand read from any address space is just its value (as in MSL).
#define BNB_EMU_AS_FN1(NAME) \
  template <class X>         \
  inline X NAME(X x) {       \
    return x;                \
  }
#define BNB_EMU_AS_FN2(NAME) \
  template <class X>         \
  inline X NAME(X x, X) {    \
    return x;                \
  }
// clang-format off
BNB_EMU_AS_FN1(sqrt)
BNB_EMU_AS_FN1(rsqrt)
BNB_EMU_AS_FN1(exp)
BNB_EMU_AS_FN1(exp2)
BNB_EMU_AS_FN1(log)
BNB_EMU_AS_FN1(log2)
BNB_EMU_AS_FN1(sin)
BNB_EMU_AS_FN1(cos)
BNB_EMU_AS_FN1(tanh)
BNB_EMU_AS_FN1(floor)
BNB_EMU_AS_FN1(ceil)
BNB_EMU_AS_FN1(round)
BNB_EMU_AS_FN1(rint)
BNB_EMU_AS_FN1(trunc)
BNB_EMU_AS_FN1(fabs)
BNB_EMU_AS_FN1(abs)
BNB_EMU_AS_FN1(fract)
BNB_EMU_AS_FN1(saturate)
BNB_EMU_AS_FN1(sign)
BNB_EMU_AS_FN1(popcount)
BNB_EMU_AS_FN1(clz)
BNB_EMU_AS_FN1(ctz)
BNB_EMU_AS_FN1(reverse_bits)
BNB_EMU_AS_FN1(exp10)
BNB_EMU_AS_FN1(log10)
BNB_EMU_AS_FN1(tan)
BNB_EMU_AS_FN1(asin)
BNB_EMU_AS_FN1(acos)
BNB_EMU_AS_FN1(atan)
BNB_EMU_AS_FN1(sinh)
BNB_EMU_AS_FN1(cosh)
BNB_EMU_AS_FN2(min)
BNB_EMU_AS_FN2(max)
BNB_EMU_AS_FN2(fmin)
BNB_EMU_AS_FN2(fmax)
BNB_EMU_AS_FN2(pow)
BNB_EMU_AS_FN2(copysign)
BNB_EMU_AS_FN2(fmod)
BNB_EMU_AS_FN2(step)
BNB_EMU_AS_FN2(mulhi)
BNB_EMU_AS_FN2(divide)
BNB_EMU_AS_FN2(powr)
BNB_EMU_AS_FN2(atan2)
// clang-format on
template <class X, class L, class H>
inline X clamp(X x, L, H) {
  return x;
}
template <class X>
inline X fma(X x, X, X) {
  return x;
}
template <class X>
inline X mad(X x, X, X) {
  return x;
}
template <class X, class A>
inline X mix(X x, X, A) {
  return x;
}
template <class A, class C>
inline A select(A a, A, C) {
  return a;
}
template <class X>
inline bool isnan(X) {
  return false;
}
template <class X>
inline bool isinf(X) {
  return false;
}
template <class X>
inline bool isfinite(X) {
  return true;
}
template <class X>
inline bool signbit(X) {
  return false;
}
template <class X>
inline bool all(X) {
  return true;
}
template <class X>
inline bool any(X) {
  return true;
}
template <class To, class From>
inline To as_type(From) {
  return To();
}
template <class V>
inline auto dot(V a, V) -> __typeof__(a.x) {
  return a.x;
}
template <class V>
inline auto length(V a) -> __typeof__(a.x) {
  return a.x;
}
template <class V>
inline auto distance(V a, V) -> __typeof__(a.x) {
  return a.x;
}
template <class V>
inline V normalize(V a) {
  return a;
}
template <class V>
inline V cross(V a, V) {
  return a;
}
namespace precise {
using namespace metal;
}  // namespace precise
namespace fast {
using namespace metal;
}  // namespace fast

// SIMD-group functions take and return values.
// clang-format off
BNB_EMU_AS_FN1(simd_sum)
BNB_EMU_AS_FN1(simd_product)
BNB_EMU_AS_FN1(simd_max)
BNB_EMU_AS_FN1(simd_min)
BNB_EMU_AS_FN1(simd_and)
BNB_EMU_AS_FN1(simd_or)
BNB_EMU_AS_FN1(simd_xor)
BNB_EMU_AS_FN1(simd_prefix_inclusive_sum)
BNB_EMU_AS_FN1(simd_prefix_exclusive_sum)
BNB_EMU_AS_FN1(simd_prefix_inclusive_product)
BNB_EMU_AS_FN1(simd_prefix_exclusive_product)
BNB_EMU_AS_FN1(simd_broadcast_first)
// clang-format on
#undef BNB_EMU_AS_FN1
#undef BNB_EMU_AS_FN2
#define BNB_EMU_AS_SHUFFLE(NAME) \
  template <class X>             \
  inline X NAME(X x, ushort) {   \
    return x;                    \
  }
// clang-format off
BNB_EMU_AS_SHUFFLE(simd_shuffle)
BNB_EMU_AS_SHUFFLE(simd_shuffle_xor)
BNB_EMU_AS_SHUFFLE(simd_shuffle_down)
BNB_EMU_AS_SHUFFLE(simd_shuffle_up)
BNB_EMU_AS_SHUFFLE(simd_broadcast)
BNB_EMU_AS_SHUFFLE(simd_shuffle_rotate_down)
BNB_EMU_AS_SHUFFLE(simd_shuffle_rotate_up)
// clang-format on
#undef BNB_EMU_AS_SHUFFLE
inline bool simd_any(bool) { return true; }
inline bool simd_all(bool) { return true; }
inline bool simd_is_first() { return true; }
inline ulong simd_ballot(bool) { return 0; }
inline ulong simd_active_threads_mask() { return 0; }

// Atomics exist in device and threadgroup memory only (MSL): only those pointers are accepted.
enum atomic_int : int {};
enum atomic_uint : unsigned {};
enum atomic_float : int {};
template <class A>
struct atomic_value;
template <>
struct atomic_value<atomic_int> {
  typedef int type;
};
template <>
struct atomic_value<atomic_uint> {
  typedef uint type;
};
template <>
struct atomic_value<atomic_float> {
  typedef float type;
};
#define BNB_EMU_AS_ATOMICS(SPACE)                                                                                 \
  template <class A>                                                                                              \
  inline typename atomic_value<A>::type atomic_load_explicit(SPACE A*, memory_order) {                            \
    return {};                                                                                                    \
  }                                                                                                               \
  template <class A>                                                                                              \
  inline void atomic_store_explicit(SPACE A*, typename atomic_value<A>::type, memory_order) {}                    \
  template <class A>                                                                                              \
  inline typename atomic_value<A>::type atomic_exchange_explicit(SPACE A*, typename atomic_value<A>::type,        \
                                                                 memory_order) {                                  \
    return {};                                                                                                    \
  }                                                                                                               \
  template <class A>                                                                                              \
  inline bool atomic_compare_exchange_weak_explicit(SPACE A*, thread typename atomic_value<A>::type*,             \
                                                    typename atomic_value<A>::type, memory_order, memory_order) { \
    return true;                                                                                                  \
  }
// clang-format off
BNB_EMU_AS_ATOMICS(device)
BNB_EMU_AS_ATOMICS(threadgroup)
// clang-format on
#undef BNB_EMU_AS_ATOMICS
#define BNB_EMU_AS_ATOMIC_RMW(NAME)                                                                          \
  template <class A>                                                                                         \
  inline typename atomic_value<A>::type NAME(device A*, typename atomic_value<A>::type, memory_order) {      \
    return {};                                                                                               \
  }                                                                                                          \
  template <class A>                                                                                         \
  inline typename atomic_value<A>::type NAME(threadgroup A*, typename atomic_value<A>::type, memory_order) { \
    return {};                                                                                               \
  }
// clang-format off
BNB_EMU_AS_ATOMIC_RMW(atomic_fetch_add_explicit)
BNB_EMU_AS_ATOMIC_RMW(atomic_fetch_sub_explicit)
BNB_EMU_AS_ATOMIC_RMW(atomic_fetch_max_explicit)
BNB_EMU_AS_ATOMIC_RMW(atomic_fetch_min_explicit)
BNB_EMU_AS_ATOMIC_RMW(atomic_fetch_and_explicit)
BNB_EMU_AS_ATOMIC_RMW(atomic_fetch_or_explicit)
BNB_EMU_AS_ATOMIC_RMW(atomic_fetch_xor_explicit)
// clang-format on
#undef BNB_EMU_AS_ATOMIC_RMW

}  // namespace metal
