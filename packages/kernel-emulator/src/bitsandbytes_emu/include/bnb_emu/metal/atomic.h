// metal::atomic<T> and the atomic_*_explicit functions. Lanes of one threadgroup never run at the same
// time in the emulator, but the operations are real host atomics all the same, so they stay correct
// whatever order the runtime runs threadgroups in.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "scalar.h"

namespace metal {

enum memory_order {
  memory_order_relaxed = __ATOMIC_RELAXED,
  memory_order_acquire = __ATOMIC_ACQUIRE,
  memory_order_release = __ATOMIC_RELEASE,
  memory_order_acq_rel = __ATOMIC_ACQ_REL,
  memory_order_seq_cst = __ATOMIC_SEQ_CST,
};
enum class memory_scope { thread, simdgroup, threadgroup, device };

template <class T>
struct atomic {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "bnb_emu/metal: atomics are 32-bit (or 64-bit ulong)");
  T value_;
};
using atomic_int = atomic<int>;
using atomic_uint = atomic<uint>;
using atomic_float = atomic<float>;
using atomic_ulong = atomic<unsigned long>;

namespace detail {
template <class T>
using bits_t = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;

template <class T>
inline bits_t<T>* bits_of(volatile atomic<T>* obj) {
  return reinterpret_cast<bits_t<T>*>(const_cast<atomic<T>*>(obj));
}
template <class T>
inline bits_t<T> to_bits(T v) {
  bits_t<T> b;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T from_bits(bits_t<T> b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
// Read-modify-write through compare-and-swap: works for every T (float add, min, max ...).
template <class T, class F>
inline T rmw(volatile atomic<T>* obj, F f) {
  bits_t<T>* p = bits_of(obj);
  bits_t<T> old = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    const T cur = from_bits<T>(old);
    const bits_t<T> next = to_bits<T>(static_cast<T>(f(cur)));
    if (__atomic_compare_exchange_n(p, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return cur;
  }
}
}  // namespace detail

template <class T, class U>
inline void atomic_store_explicit(volatile atomic<T>* obj, U desired, memory_order = memory_order_relaxed) {
  __atomic_store_n(detail::bits_of(obj), detail::to_bits<T>(static_cast<T>(desired)), __ATOMIC_SEQ_CST);
}
template <class T>
inline T atomic_load_explicit(volatile atomic<T>* obj, memory_order = memory_order_relaxed) {
  return detail::from_bits<T>(__atomic_load_n(detail::bits_of(obj), __ATOMIC_SEQ_CST));
}
template <class T, class U>
inline T atomic_exchange_explicit(volatile atomic<T>* obj, U desired, memory_order = memory_order_relaxed) {
  return detail::from_bits<T>(
      __atomic_exchange_n(detail::bits_of(obj), detail::to_bits<T>(static_cast<T>(desired)), __ATOMIC_SEQ_CST));
}
template <class T, class U>
inline bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* obj, T* expected, U desired,
                                                  memory_order = memory_order_relaxed,
                                                  memory_order = memory_order_relaxed) {
  auto exp_bits = detail::to_bits<T>(*expected);
  const bool ok =
      __atomic_compare_exchange_n(detail::bits_of(obj), &exp_bits, detail::to_bits<T>(static_cast<T>(desired)), false,
                                  __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  if (!ok) *expected = detail::from_bits<T>(exp_bits);
  return ok;
}
template <class T, class U>
inline bool atomic_compare_exchange_strong_explicit(volatile atomic<T>* obj, T* expected, U desired,
                                                    memory_order s = memory_order_relaxed,
                                                    memory_order f = memory_order_relaxed) {
  return atomic_compare_exchange_weak_explicit(obj, expected, desired, s, f);
}

#define BNB_EMU_ATOMIC_RMW(NAME, EXPR)                                                                                \
  template <class T, class U>                                                                                         \
  inline T atomic_fetch_##NAME##_explicit(volatile atomic<T>* obj, U operand0, memory_order = memory_order_relaxed) { \
    const T operand = static_cast<T>(operand0);                                                                       \
    return detail::rmw(obj, [operand](T cur) { return EXPR; });                                                       \
  }
BNB_EMU_ATOMIC_RMW(add, cur + operand)
BNB_EMU_ATOMIC_RMW(sub, cur - operand)
BNB_EMU_ATOMIC_RMW(min, operand < cur ? operand : cur)
BNB_EMU_ATOMIC_RMW(max, cur < operand ? operand : cur)
#undef BNB_EMU_ATOMIC_RMW
#define BNB_EMU_ATOMIC_BITS(NAME, OP)                                                                                 \
  template <class T, class U>                                                                                         \
  inline T atomic_fetch_##NAME##_explicit(volatile atomic<T>* obj, U operand0, memory_order = memory_order_relaxed) { \
    static_assert(std::is_integral<T>::value, "bnb_emu/metal: bitwise atomics need an integer atomic");               \
    const T operand = static_cast<T>(operand0);                                                                       \
    return detail::rmw(obj, [operand](T cur) { return cur OP operand; });                                             \
  }
BNB_EMU_ATOMIC_BITS(and, &)
BNB_EMU_ATOMIC_BITS(or, |)
BNB_EMU_ATOMIC_BITS(xor, ^)
#undef BNB_EMU_ATOMIC_BITS

}  // namespace metal
