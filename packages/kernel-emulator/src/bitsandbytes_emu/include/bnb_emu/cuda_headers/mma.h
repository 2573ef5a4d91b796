// <mma.h> in emulation: the floating-point WMMA API of nvcuda::wmma (CUDA C++ Programming Guide, "Warp
// Matrix Functions") for __half and __nv_bfloat16 A/B fragments in the shapes m16n16k16, m32n8k16 and
// m8n32k16, with float or __half accumulators (bf16: float only), as CUDA defines them.
//
// The guide leaves the mapping of matrix elements to a fragment's x[] unspecified, so any consistent
// mapping is valid. Here slot i of lane l holds element (l * num_elements + i) % (rows * cols) of the
// fragment's matrix in row-major order (the 16x16 __half A/B fragments, 16 per lane, hold every element
// twice, as the hardware's do). num_elements and the storage types are CUDA's, so a kernel sized by them
// has the same fragments here; a kernel that depends on the mapping gets wrong products, as it would on
// another GPU generation.
//
// What CUDA rejects, this rejects:
// - at compile time: fragments CUDA does not define (other shapes or types, A/B without a layout, an
//   accumulator with one; bf16 with a __half accumulator), a load or store of an accumulator without a
//   layout_t or of A/B with one, a pointer whose type is not the fragment's element type;
// - when it runs (an EmulationError naming the call site): a pointer that is not 256-bit (32-byte)
//   aligned, ldm not a multiple of 8 for 16-bit elements or of 4 for float (16 bytes), a call that not
//   all 32 lanes of a full warp make together at the same place (a short warp, lanes that exited,
//   diverged or wait elsewhere), or lanes passing different pointers, ldm or layout.
// load/store/mma are warp collectives: each waits until every lane of the warp has arrived (the PTX
// ".sync.aligned" rule), and no lane leaves until every lane has read its inputs, so a lane that runs
// ahead cannot overwrite what another has still to read.
// The product: exact fp32 products of the 16-bit inputs, summed in fp32 in k order onto C (the hardware's
// order and intermediate rounding are unspecified); a __half D is rounded once at the end.
#pragma once

#include <cstdint>
#include <type_traits>

#include "bnb_emu/cuda.h"

namespace nvcuda {
namespace wmma {

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;

enum layout_t { mem_row_major, mem_col_major };

template <typename T, int size>
struct __attribute__((aligned(8))) __frag_base {
  enum { num_elements = size };
  enum { num_storage_elements = size };
  typedef T element_type;
  typedef T storage_element_type;
  storage_element_type x[num_storage_elements];
};

}  // namespace wmma
}  // namespace nvcuda

namespace bnb_emu {
namespace wmma {

namespace w = ::nvcuda::wmma;

// The call site, taken as a default argument so that qualified calls (wmma::mma_sync(...)) keep working.
struct Site {
  const char* file;
  int line;
  static Site here(const char* file = __builtin_FILE(), int line = __builtin_LINE()) { return Site{file, line}; }
};

// Elements per lane of the fragments CUDA defines (crt/mma.h); 0 = no such fragment.
template <class Use, int M, int N, int K, class T, class Layout>
constexpr int elements() {
  constexpr bool ab_layout = std::is_same<Layout, w::row_major>::value || std::is_same<Layout, w::col_major>::value;
  constexpr bool half = std::is_same<T, __half>::value;
  constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
  constexpr int shape = M == 16 && N == 16 && K == 16  ? 1
                        : M == 32 && N == 8 && K == 16 ? 2
                        : M == 8 && N == 32 && K == 16 ? 3
                                                       : 0;
  if (shape == 0) return 0;
  if (std::is_same<Use, w::accumulator>::value) {
    if (!std::is_void<Layout>::value) return 0;
    return std::is_same<T, float>::value || half ? 8 : 0;
  }
  if (!ab_layout) return 0;
  const bool a = std::is_same<Use, w::matrix_a>::value;
  if (!a && !std::is_same<Use, w::matrix_b>::value) return 0;
  if (half) return 16;
  if (!bf16) return 0;
  if (shape == 1) return 8;
  if (shape == 2) return a ? 16 : 4;  // A is 32x16, B 16x8
  return a ? 4 : 16;                  // A is 8x16, B 16x32
}

}  // namespace wmma
}  // namespace bnb_emu

namespace nvcuda {
namespace wmma {

template <typename Use, int m, int n, int k, typename T, typename Layout = void>
class fragment : public __frag_base<T, ::bnb_emu::wmma::elements<Use, m, n, k, T, Layout>()
                                           ? ::bnb_emu::wmma::elements<Use, m, n, k, T, Layout>()
                                           : 1> {
  static_assert(::bnb_emu::wmma::elements<Use, m, n, k, T, Layout>() > 0,
                "bnb_emu: CUDA defines no such wmma::fragment. Emulated (as in CUDA): matrix_a / matrix_b of "
                "__half or __nv_bfloat16 with layout row_major or col_major, accumulator of float or __half "
                "with no layout, shapes 16x16x16, 32x8x16, 8x32x16 (tf32, double and integer WMMA are "
                "outside the emulated subset)");
};

}  // namespace wmma
}  // namespace nvcuda

namespace bnb_emu {
namespace wmma {

template <class F>
struct Traits;
template <class Use, int M, int N, int K, class T, class Layout>
struct Traits<w::fragment<Use, M, N, K, T, Layout>> {
  using use = Use;
  using elem = T;
  static constexpr int rows = std::is_same<Use, w::matrix_b>::value ? K : M;
  static constexpr int cols = std::is_same<Use, w::matrix_a>::value ? K : N;
  static constexpr int count = elements<Use, M, N, K, T, Layout>();
  static constexpr bool col = std::is_same<Layout, w::col_major>::value;
};

inline float as_float(float v) { return v; }
inline float as_float(__half v) { return __half2float(v); }
inline float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
inline T from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// What each lane deposits at a WMMA call: the call site and the arguments that must be warp-uniform.
struct Call {
  const char* file;
  int line;
  const void* p0;
  const void* p1;
  const void* p2;
  unsigned ldm;
  int layout;
};

// Meets the 31 other lanes of the full warp at `what`; checks they came from the same call with the same
// uniform arguments. Returns every lane's deposit.
inline void meet(const char* what, const Call& mine, Call (&all)[32], bool uniform_pointers) {
  if (::bnb_emu::lane().warp_lanes != 32)
    fail(
        "%s at %s:%d: this warp has %u lanes; WMMA needs every lane of a full 32-lane warp (on hardware: "
        "undefined behaviour)",
        what, mine.file, mine.line, ::bnb_emu::lane().warp_lanes);
  static_assert(sizeof(Call) <= 64, "one warp_exchange deposit");
  ::bnb_emu::warp_exchange(BNB_EMU_SITE, what, 0xffffffffu, &mine, all, sizeof(Call));
  for (int l = 0; l < 32; ++l) {
    const Call& c = all[l];
    if (c.line != mine.line || std::strcmp(c.file, mine.file) != 0)
      fail(
          "%s: lanes of the warp call it from different places (lane %d at %s:%d, lane %u at %s:%d); every lane "
          "must execute the same WMMA call, converged (on hardware: undefined behaviour)",
          what, l, c.file, c.line, ::bnb_emu::lane().lane, mine.file, mine.line);
    if (uniform_pointers && (c.p0 != mine.p0 || c.ldm != mine.ldm || c.layout != mine.layout))
      fail(
          "%s at %s:%d: lane %d passes pointer %p, ldm %u, layout %d, lane %u pointer %p, ldm %u, layout %d; "
          "they must be the same for every lane of the warp",
          what, mine.file, mine.line, l, c.p0, c.ldm, c.layout, ::bnb_emu::lane().lane, mine.p0, mine.ldm, mine.layout);
  }
}

// The second meeting: no lane goes on (and may overwrite memory or its fragments) before all have read.
inline void done(const char* what) {
  unsigned char token = 0, all[32];
  ::bnb_emu::warp_exchange(BNB_EMU_SITE, what, 0xffffffffu, &token, all, 1);
}

template <class T>
inline void check_memory(const char* what, Site s, const T* p, unsigned ldm) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    fail(
        "%s at %s:%d: pointer %p is not 256-bit (32-byte) aligned, as WMMA requires (on hardware: a "
        "misaligned-address fault or wrong data)",
        what, s.file, s.line, static_cast<const void*>(p));
  constexpr unsigned unit = 16 / sizeof(T);
  if (ldm % unit != 0)
    fail("%s at %s:%d: ldm %u is not a multiple of %u (%zu-byte elements: ldm must span a multiple of 16 bytes)", what,
         s.file, s.line, ldm, unit, sizeof(T));
}

// Matrix element index (row-major in the fragment's rows x cols) of slot i of lane l.
template <class Tr>
inline int element_of(int l, int i) {
  return (l * Tr::count + i) % (Tr::rows * Tr::cols);
}

template <class F>
inline void load(const char* what, F& f, const typename Traits<F>::elem* p, unsigned ldm, bool col, Site s) {
  using Tr = Traits<F>;
  Call all[32];
  const Call mine{s.file, s.line, p, nullptr, nullptr, ldm, col ? 1 : 0};
  meet(what, mine, all, true);
  check_memory(what, s, p, ldm);
  const int me = static_cast<int>(::bnb_emu::lane().lane);
  for (int i = 0; i < Tr::count; ++i) {
    const int e = element_of<Tr>(me, i), r = e / Tr::cols, c = e % Tr::cols;
    f.x[i] = p[col ? static_cast<size_t>(c) * ldm + r : static_cast<size_t>(r) * ldm + c];
  }
  done(what);
}

template <class F>
inline void store(const char* what, typename Traits<F>::elem* p, const F& f, unsigned ldm, bool col, Site s) {
  using Tr = Traits<F>;
  Call all[32];
  const Call mine{s.file, s.line, p, nullptr, nullptr, ldm, col ? 1 : 0};
  meet(what, mine, all, true);
  check_memory(what, s, p, ldm);
  const int me = static_cast<int>(::bnb_emu::lane().lane);
  for (int i = 0; i < Tr::count; ++i) {
    const int e = element_of<Tr>(me, i), r = e / Tr::cols, c = e % Tr::cols;
    p[col ? static_cast<size_t>(c) * ldm + r : static_cast<size_t>(r) * ldm + c] = f.x[i];
  }
  done(what);
}

// The whole matrix of a fragment type from the 32 lanes' fragments (the first slot holding each element).
template <class F>
inline void gather(const Call (&all)[32], int which, float* out) {
  using Tr = Traits<F>;
  bool seen[Tr::rows * Tr::cols] = {};
  for (int l = 0; l < 32; ++l) {
    const void* p = which == 0 ? all[l].p0 : which == 1 ? all[l].p1 : all[l].p2;
    const F& f = *static_cast<const F*>(p);
    for (int i = 0; i < Tr::count; ++i) {
      const int e = element_of<Tr>(l, i);
      if (!seen[e]) out[e] = as_float(f.x[i]);
      seen[e] = true;
    }
  }
}

}  // namespace wmma
}  // namespace bnb_emu

namespace nvcuda {
namespace wmma {

// Not a collective (as in CUDA): each lane fills its own slots.
template <typename T, int size>
inline void fill_fragment(__frag_base<T, size>& f, const typename __frag_base<T, size>::element_type& v) {
  for (int i = 0; i < size; ++i) f.x[i] = v;
}

template <typename Use, int m, int n, int k, typename T, typename L>
inline void load_matrix_sync(fragment<Use, m, n, k, T, L>& f, const T* p, unsigned ldm,
                             ::bnb_emu::wmma::Site s = ::bnb_emu::wmma::Site::here()) {
  static_assert(!std::is_same<Use, accumulator>::value,
                "bnb_emu: load_matrix_sync of an accumulator takes a layout_t (mem_row_major or mem_col_major), "
                "as in CUDA");
  ::bnb_emu::wmma::load("wmma::load_matrix_sync", f, p, ldm, std::is_same<L, col_major>::value, s);
}

template <typename Use, int m, int n, int k, typename T, typename L>
inline void load_matrix_sync(fragment<Use, m, n, k, T, L>& f, const T* p, unsigned ldm, layout_t layout,
                             ::bnb_emu::wmma::Site s = ::bnb_emu::wmma::Site::here()) {
  static_assert(std::is_same<Use, accumulator>::value,
                "bnb_emu: load_matrix_sync of a matrix_a / matrix_b fragment takes no layout_t: the fragment's "
                "layout is its template argument, as in CUDA");
  ::bnb_emu::wmma::load("wmma::load_matrix_sync", f, p, ldm, layout == mem_col_major, s);
}

template <int m, int n, int k, typename T>
inline void store_matrix_sync(T* p, const fragment<accumulator, m, n, k, T>& f, unsigned ldm, layout_t layout,
                              ::bnb_emu::wmma::Site s = ::bnb_emu::wmma::Site::here()) {
  ::bnb_emu::wmma::store("wmma::store_matrix_sync", p, f, ldm, layout == mem_col_major, s);
}

template <int m, int n, int k, typename TD, typename TI, typename LA, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, m, n, k, TD>& d, const fragment<matrix_a, m, n, k, TI, LA>& a,
                     const fragment<matrix_b, m, n, k, TI, LB>& b, const fragment<accumulator, m, n, k, TC>& c,
                     ::bnb_emu::wmma::Site s = ::bnb_emu::wmma::Site::here()) {
  static_assert(std::is_same<TI, __half>::value || (std::is_same<TD, float>::value && std::is_same<TC, float>::value),
                "bnb_emu: __nv_bfloat16 WMMA accumulates in float only (C and D float), as in CUDA");
  using namespace ::bnb_emu::wmma;
  using FA = fragment<matrix_a, m, n, k, TI, LA>;
  using FB = fragment<matrix_b, m, n, k, TI, LB>;
  using FC = fragment<accumulator, m, n, k, TC>;
  using FD = fragment<accumulator, m, n, k, TD>;
  const char* what = "wmma::mma_sync";
  Call all[32];
  const Call mine{s.file, s.line, &a, &b, &c, 0, 0};
  meet(what, mine, all, false);
  float A[m * k], B[k * n], C[m * n];
  gather<FA>(all, 0, A);
  gather<FB>(all, 1, B);
  gather<FC>(all, 2, C);
  const int me = static_cast<int>(::bnb_emu::lane().lane);
  typename FD::storage_element_type mine_d[Traits<FD>::count];
  for (int i = 0; i < Traits<FD>::count; ++i) {
    const int e = element_of<Traits<FD>>(me, i), r = e / n, col = e % n;
    float acc = C[e];
    for (int j = 0; j < k; ++j) acc += A[r * k + j] * B[j * n + col];  // exact products (16-bit inputs)
    mine_d[i] = from_float<TD>(acc);
  }
  done(what);  // every lane has read a, b and c: d may be one of them
  for (int i = 0; i < Traits<FD>::count; ++i) d.x[i] = mine_d[i];
}

}  // namespace wmma
}  // namespace nvcuda
