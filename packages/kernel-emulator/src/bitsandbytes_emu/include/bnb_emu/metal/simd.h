// SIMD-group functions (simd_sum, simd_shuffle_down, simd_ballot, ...) and barriers, on the runtime's
// warp collective. Metal has no masks: a SIMD-group function is performed by the SIMD-group's active
// lanes, which the emulator takes to be its lanes that have not exited (member mask 0 in the runtime).
// A lane that diverges around a SIMD-group function while its neighbours call it is reported, not
// emulated. Reading a lane that takes no part (exited, or past the end of a short last SIMD-group)
// gives all-ones bits (NaN for floats): on hardware the value is undefined.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "../runtime.h"
#include "atomic.h"
#include "math.h"
#include "vec.h"

namespace metal {

enum class mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return static_cast<mem_flags>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}

// Fences order nothing in emulation: lanes do not run at the same time, so every write is visible at once.
inline void atomic_thread_fence(mem_flags, memory_order = memory_order_relaxed) {}
inline void atomic_thread_fence(mem_flags, memory_order, memory_scope) {}

namespace simd_detail {

// Sites are compared by text and kept while lanes wait, so each distinct one is stored once.
inline const char* intern_site(const char* file, int line) {
  static std::set<std::string> sites;
  return sites.insert(std::string(file) + ":" + std::to_string(line)).first->c_str();
}

// Every active lane's value of x, with a flag saying which lanes took part.
template <class T>
struct Slot {
  unsigned char present;
  unsigned short arg;  // the lane's shuffle delta / mask / source lane, where MSL wants it uniform
  T value;
};

template <class T>
struct Gathered {
  Slot<T> slot[32];
  unsigned me;
  uint32_t active() const {
    uint32_t m = 0;
    for (unsigned i = 0; i < 32; ++i)
      if (slot[i].present) m |= 1u << i;
    return m;
  }
  // The value lane i contributed, or all-ones bits when it took no part.
  T at(unsigned i) const {
    if (i < 32 && slot[i].present) return slot[i].value;
    T poison;
    std::memset(static_cast<void*>(&poison), 0xff, sizeof(T));
    return poison;
  }
};

// `uniform_arg` names an argument MSL requires to be the same in every lane (nullptr: none).
template <class T>
inline Gathered<T> gather(const T& x, const char* what, const char* file, int line, unsigned short arg = 0,
                          const char* uniform_arg = nullptr) {
  static_assert(sizeof(Slot<T>) <= 64, "bnb_emu/metal: SIMD-group function on a value of more than 48 bytes");
  Slot<T> mine;
  std::memset(static_cast<void*>(&mine), 0, sizeof mine);
  mine.present = 1;
  mine.arg = arg;
  mine.value = x;
  Gathered<T> g;
  const char* site = intern_site(file, line);
  bnb_emu::warp_exchange(site, what, 0u, &mine, g.slot, sizeof(Slot<T>));
  g.me = bnb_emu::lane().lane;
  if (uniform_arg) {
    for (unsigned i = 0; i < 32; ++i)
      if (g.slot[i].present && g.slot[i].arg != arg)
        bnb_emu::fail(
            "%s at %s: its %s must be the same in every lane of the SIMD-group (MSL rule); lane %u passes "
            "%u, lane %u passes %u",
            what, site, uniform_arg, g.me, arg, i, g.slot[i].arg);
  }
  return g;
}

// MSL has no SIMD-group shuffle or broadcast of bool (kernels cast to ushort and back).
template <class T>
constexpr bool shuffleable() {
  using E = typename bnb_emu::metal_detail::elem_of<T>::type;
  return !std::is_same<E, bool>::value;
}

template <class T, class F>
inline T fold(const Gathered<T>& g, unsigned upto, bool inclusive, F f, bool* any = nullptr) {
  T acc{};
  bool have = false;
  for (unsigned i = 0; i < upto + (inclusive ? 1u : 0u) && i < 32; ++i) {
    if (!g.slot[i].present) continue;
    acc = have ? static_cast<T>(f(acc, g.slot[i].value)) : g.slot[i].value;
    have = true;
  }
  if (any) *any = have;
  return acc;
}

}  // namespace simd_detail

// Threadgroup barrier. Every emulated lane sees every other lane's writes once they have met, whatever
// the flags say: a barrier with too weak a flag (mem_none where threadgroup memory is shared) is not
// caught.
inline void threadgroup_barrier(mem_flags flags, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  (void)flags;
  bnb_emu::barrier(simd_detail::intern_site(file, line), "threadgroup_barrier");
}

#define BNB_EMU_SIMD_SITE const char *file = __builtin_FILE(), int line = __builtin_LINE()

#define BNB_EMU_SIMD_REDUCE(NAME, EXPR)                                                 \
  template <class X>                                                                    \
  inline norm_t<X> NAME(const X& x0, BNB_EMU_SIMD_SITE) {                               \
    using T = norm_t<X>;                                                                \
    const auto g = simd_detail::gather<T>(norm(x0), #NAME, file, line);                 \
    return simd_detail::fold(g, 31, true, [](const T& a, const T& b) { return EXPR; }); \
  }
BNB_EMU_SIMD_REDUCE(simd_sum, a + b)
BNB_EMU_SIMD_REDUCE(simd_product, a* b)
BNB_EMU_SIMD_REDUCE(simd_max, max(a, b))
BNB_EMU_SIMD_REDUCE(simd_min, min(a, b))
BNB_EMU_SIMD_REDUCE(simd_and, a& b)
BNB_EMU_SIMD_REDUCE(simd_or, a | b)
BNB_EMU_SIMD_REDUCE(simd_xor, a ^ b)
#undef BNB_EMU_SIMD_REDUCE

// Prefix sums run over the active lanes below the caller (and the caller itself when inclusive).
template <class X>
inline norm_t<X> simd_prefix_inclusive_sum(const X& x0, BNB_EMU_SIMD_SITE) {
  using T = norm_t<X>;
  const auto g = simd_detail::gather<T>(norm(x0), "simd_prefix_inclusive_sum", file, line);
  return simd_detail::fold(g, g.me, true, [](const T& a, const T& b) { return a + b; });
}
template <class X>
inline norm_t<X> simd_prefix_exclusive_sum(const X& x0, BNB_EMU_SIMD_SITE) {
  using T = norm_t<X>;
  const auto g = simd_detail::gather<T>(norm(x0), "simd_prefix_exclusive_sum", file, line);
  bool any = false;
  T r = simd_detail::fold(g, g.me, false, [](const T& a, const T& b) { return a + b; }, &any);
  return any ? r : T(0);
}
template <class X>
inline norm_t<X> simd_prefix_inclusive_product(const X& x0, BNB_EMU_SIMD_SITE) {
  using T = norm_t<X>;
  const auto g = simd_detail::gather<T>(norm(x0), "simd_prefix_inclusive_product", file, line);
  return simd_detail::fold(g, g.me, true, [](const T& a, const T& b) { return a * b; });
}
template <class X>
inline norm_t<X> simd_prefix_exclusive_product(const X& x0, BNB_EMU_SIMD_SITE) {
  using T = norm_t<X>;
  const auto g = simd_detail::gather<T>(norm(x0), "simd_prefix_exclusive_product", file, line);
  bool any = false;
  T r = simd_detail::fold(g, g.me, false, [](const T& a, const T& b) { return a * b; }, &any);
  return any ? r : T(1);
}

template <class X>
inline norm_t<X> simd_shuffle(const X& x0, ushort lane_id, BNB_EMU_SIMD_SITE) {
  static_assert(simd_detail::shuffleable<norm_t<X>>(), "bnb_emu/metal: MSL cannot shuffle bool values");
  const auto g = simd_detail::gather<norm_t<X>>(norm(x0), "simd_shuffle", file, line);
  return g.at(lane_id);
}
template <class X>
inline norm_t<X> simd_broadcast(const X& x0, ushort lane_id, BNB_EMU_SIMD_SITE) {
  static_assert(simd_detail::shuffleable<norm_t<X>>(), "bnb_emu/metal: MSL cannot shuffle bool values");
  const auto g = simd_detail::gather<norm_t<X>>(norm(x0), "simd_broadcast", file, line, lane_id, "lane");
  return g.at(lane_id);
}
template <class X>
inline norm_t<X> simd_broadcast_first(const X& x0, BNB_EMU_SIMD_SITE) {
  static_assert(simd_detail::shuffleable<norm_t<X>>(), "bnb_emu/metal: MSL cannot shuffle bool values");
  const auto g = simd_detail::gather<norm_t<X>>(norm(x0), "simd_broadcast_first", file, line);
  return g.at(static_cast<unsigned>(__builtin_ctz(g.active())));
}
// Lanes past the SIMD-group's end keep their own value (no wrap-around), as MSL specifies.
template <class X>
inline norm_t<X> simd_shuffle_down(const X& x0, ushort delta, BNB_EMU_SIMD_SITE) {
  static_assert(simd_detail::shuffleable<norm_t<X>>(), "bnb_emu/metal: MSL cannot shuffle bool values");
  const auto g = simd_detail::gather<norm_t<X>>(norm(x0), "simd_shuffle_down", file, line, delta, "delta");
  const unsigned src = g.me + delta;
  return src >= 32 ? g.slot[g.me].value : g.at(src);
}
template <class X>
inline norm_t<X> simd_shuffle_up(const X& x0, ushort delta, BNB_EMU_SIMD_SITE) {
  static_assert(simd_detail::shuffleable<norm_t<X>>(), "bnb_emu/metal: MSL cannot shuffle bool values");
  const auto g = simd_detail::gather<norm_t<X>>(norm(x0), "simd_shuffle_up", file, line, delta, "delta");
  return delta > g.me ? g.slot[g.me].value : g.at(g.me - delta);
}
template <class X>
inline norm_t<X> simd_shuffle_xor(const X& x0, ushort mask, BNB_EMU_SIMD_SITE) {
  static_assert(simd_detail::shuffleable<norm_t<X>>(), "bnb_emu/metal: MSL cannot shuffle bool values");
  const auto g = simd_detail::gather<norm_t<X>>(norm(x0), "simd_shuffle_xor", file, line, mask, "mask");
  return g.at((g.me ^ mask) & 31u);
}
template <class X>
inline norm_t<X> simd_shuffle_rotate_down(const X& x0, ushort delta, BNB_EMU_SIMD_SITE) {
  static_assert(simd_detail::shuffleable<norm_t<X>>(), "bnb_emu/metal: MSL cannot shuffle bool values");
  const auto g = simd_detail::gather<norm_t<X>>(norm(x0), "simd_shuffle_rotate_down", file, line, delta, "delta");
  return g.at((g.me + delta) & 31u);
}
template <class X>
inline norm_t<X> simd_shuffle_rotate_up(const X& x0, ushort delta, BNB_EMU_SIMD_SITE) {
  static_assert(simd_detail::shuffleable<norm_t<X>>(), "bnb_emu/metal: MSL cannot shuffle bool values");
  const auto g = simd_detail::gather<norm_t<X>>(norm(x0), "simd_shuffle_rotate_up", file, line, delta, "delta");
  return g.at((g.me + 32u - (delta & 31u)) & 31u);
}

struct simd_vote {
  using vote_t = unsigned long;
  vote_t v;
  explicit constexpr operator vote_t() const { return v; }
  // all(): every active lane voted true; any(): some lane did.
  bool all() const { return v == active; }
  bool any() const { return v != 0; }
  vote_t active;
};

inline simd_vote simd_ballot(bool pred, BNB_EMU_SIMD_SITE) {
  const auto g = simd_detail::gather<unsigned char>(pred ? 1 : 0, "simd_ballot", file, line);
  simd_vote r{0, g.active()};
  for (unsigned i = 0; i < 32; ++i)
    if (g.slot[i].present && g.slot[i].value) r.v |= 1ul << i;
  return r;
}
inline simd_vote simd_active_threads_mask(BNB_EMU_SIMD_SITE) {
  const auto g = simd_detail::gather<unsigned char>(1, "simd_active_threads_mask", file, line);
  return simd_vote{g.active(), g.active()};
}
inline bool simd_any(bool pred, BNB_EMU_SIMD_SITE) { return simd_ballot(pred, file, line).any(); }
inline bool simd_all(bool pred, BNB_EMU_SIMD_SITE) { return simd_ballot(pred, file, line).all(); }
inline bool simd_is_first(BNB_EMU_SIMD_SITE) {
  const auto g = simd_detail::gather<unsigned char>(1, "simd_is_first", file, line);
  return static_cast<unsigned>(__builtin_ctz(g.active())) == g.me;
}
inline bool simd_is_helper_thread() { return false; }
inline void simdgroup_barrier(mem_flags, BNB_EMU_SIMD_SITE) {
  (void)simd_detail::gather<unsigned char>(1, "simdgroup_barrier", file, line);
}

#undef BNB_EMU_SIMD_SITE

}  // namespace metal
