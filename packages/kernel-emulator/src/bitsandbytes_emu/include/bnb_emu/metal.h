// Metal Shading Language shim for the kernel emulator: compiles a .metal kernel source as C++ on the
// host and runs it on the lane scheduler of runtime.h. The Python front end
// (bitsandbytes_emu.metal) rewrites the few constructs a header cannot express (threadgroup
// variable declarations, attributes, 'h'-suffixed literals), includes this header first and appends one
// C entry point per kernel, which calls bnb_emu::metal_launch::run.
//
// The documented subset is in docs/pages/emulator.md ("Metal"). Anything outside it fails to compile
// with a message that starts with "bnb_emu/metal:".
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "metal/atomic.h"
#include "metal/math.h"
#include "metal/scalar.h"
#include "metal/simd.h"
#include "metal/vec.h"
#include "runtime.h"

// Threadgroup variables live in their own section (see BNB_EMU_THREADGROUP_VAR below); the linker marks
// its bounds, so every threadgroup can start with it filled with 0xFF bytes.
extern "C" {
extern char __start_bnb_emu_metal_tg[] __attribute__((weak, visibility("hidden")));
extern char __stop_bnb_emu_metal_tg[] __attribute__((weak, visibility("hidden")));
}

namespace bnb_emu {
template <>
struct ScalarCode<half> {
  static constexpr const char* code = "h";
};
template <>
struct ScalarCode<bfloat> {
  static constexpr const char* code = "b";
};

namespace metal_launch {

// The dispatch being emulated: torch.mps.compile_shader's dispatchThreads(threads, group_size). A
// grid that group_size does not divide ends in smaller threadgroups, which run as separate runtime
// launches ("regions") whose group indices start at `region_offset`.
struct Dispatch {
  uint32_t threads[3];
  uint32_t group[3];
  uint32_t region_offset[3];
  uint32_t flags;  // DispatchFlags
};
// Emulation options of one dispatch (bitsandbytes_emu.metal: BNB_EMU_METAL_EDGE, BNB_EMU_METAL_FTZ).
enum DispatchFlags : uint32_t {
  // threads_per_threadgroup (and simdgroups/quadgroups_per_threadgroup) of a short edge threadgroup
  // report the dispatched size instead of the actual one: Apple documents neither reading, so a kernel
  // that is right under both does not depend on it.
  EDGE_REPORTS_DISPATCHED = 1,
  // float32 subnormals read and written as zero, as Apple GPUs do.
  FLUSH_SUBNORMALS = 2,
};
inline Dispatch*& current() {
  static Dispatch* d = nullptr;
  return d;
}

enum BuiltinId : int {
  THREAD_POSITION_IN_GRID,
  THREAD_POSITION_IN_THREADGROUP,
  THREADGROUP_POSITION_IN_GRID,
  THREADS_PER_THREADGROUP,
  DISPATCH_THREADS_PER_THREADGROUP,
  THREADS_PER_GRID,
  THREADGROUPS_PER_GRID,
  THREAD_INDEX_IN_THREADGROUP,
  THREAD_INDEX_IN_SIMDGROUP,
  SIMDGROUP_INDEX_IN_THREADGROUP,
  THREADS_PER_SIMDGROUP,
  THREAD_EXECUTION_WIDTH,
  SIMDGROUPS_PER_THREADGROUP,
  DISPATCH_SIMDGROUPS_PER_THREADGROUP,
  THREAD_INDEX_IN_QUADGROUP,
  QUADGROUP_INDEX_IN_THREADGROUP,
  QUADGROUPS_PER_THREADGROUP,
};

// A position/size attribute's value; converts to whichever of uint, ushort, uint2, uint3, ... the
// kernel declared (a scalar type gets the x component).
struct Builtin {
  uint32_t v[3];
  template <class V>
  operator V() const {  // NOLINT
    if constexpr (metal_detail::is_vec<V>::value) {
      using E = typename V::value_type;
      static_assert(V::size <= 3, "bnb_emu/metal: position attributes have at most 3 components");
      V r;
      for (int i = 0; i < V::size; ++i) r[i] = static_cast<E>(v[i]);
      return r;
    } else {
      static_assert(std::is_integral<V>::value, "bnb_emu/metal: position attributes are uint/ushort (vectors)");
      return static_cast<V>(v[0]);
    }
  }
};

inline uint32_t ceil_div(uint32_t a, uint32_t b) { return (a + b - 1) / b; }

// The host's floating-point control for FLUSH_SUBNORMALS: x86 MXCSR FTZ (bit 15) and DAZ (bit 6),
// AArch64 FPCR.FZ (bit 24; FZ16 stays clear, and the shim's half is integer code anyway, so float16
// subnormals survive as on Apple GPUs). Set while a dispatch runs, restored after.
inline uint64_t read_fp_control() {
#if defined(__x86_64__) || defined(__i386__)
  return _mm_getcsr();
#elif defined(__aarch64__)
  uint64_t v;
  __asm__ volatile("mrs %0, fpcr" : "=r"(v));
  return v;
#else
  return 0;
#endif
}
inline void write_fp_control(uint64_t v) {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(static_cast<unsigned>(v));
#elif defined(__aarch64__)
  __asm__ volatile("msr fpcr, %0" : : "r"(v));
#else
  (void)v;
#endif
}
inline uint64_t flushing(uint64_t v) {
#if defined(__x86_64__) || defined(__i386__)
  return v | 0x8040u;
#elif defined(__aarch64__)
  return v | (uint64_t{1} << 24);
#else
  return v;
#endif
}
inline bool can_flush_subnormals() {
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

// Threadgroup memory is undefined when a threadgroup starts; all-ones bits (NaN for floats) make a read
// before any write, or a race a missing barrier lets through, show in results.
inline void poison_threadgroup_memory() {
  if (__start_bnb_emu_metal_tg && __stop_bnb_emu_metal_tg > __start_bnb_emu_metal_tg)
    std::memset(__start_bnb_emu_metal_tg, 0xff,
                static_cast<size_t>(__stop_bnb_emu_metal_tg - __start_bnb_emu_metal_tg));
}

inline Builtin builtin(BuiltinId id) {
  const Dispatch& d = *current();
  const LaneInfo& l = lane();
  const Dim3& blk = config().block;
  const uint32_t actual[3] = {blk.x, blk.y, blk.z};
  const uint32_t t[3] = {l.thread.x, l.thread.y, l.thread.z};
  const uint32_t g[3] = {l.group.x + d.region_offset[0], l.group.y + d.region_offset[1],
                         l.group.z + d.region_offset[2]};
  const uint32_t dispatch_lanes = d.group[0] * d.group[1] * d.group[2];
  const bool edge_dispatched = (d.flags & EDGE_REPORTS_DISPATCHED) != 0;
  const uint32_t lanes = edge_dispatched ? dispatch_lanes : blk.x * blk.y * blk.z;
  Builtin b{{0, 0, 0}};
  switch (id) {
    case THREAD_POSITION_IN_GRID:
      for (int i = 0; i < 3; ++i) b.v[i] = g[i] * d.group[i] + t[i];
      break;
    case THREAD_POSITION_IN_THREADGROUP:
      for (int i = 0; i < 3; ++i) b.v[i] = t[i];
      break;
    case THREADGROUP_POSITION_IN_GRID:
      for (int i = 0; i < 3; ++i) b.v[i] = g[i];
      break;
    case THREADS_PER_THREADGROUP:
      for (int i = 0; i < 3; ++i) b.v[i] = edge_dispatched ? d.group[i] : actual[i];
      break;
    case DISPATCH_THREADS_PER_THREADGROUP:
      for (int i = 0; i < 3; ++i) b.v[i] = d.group[i];
      break;
    case THREADS_PER_GRID:
      for (int i = 0; i < 3; ++i) b.v[i] = d.threads[i];
      break;
    case THREADGROUPS_PER_GRID:
      for (int i = 0; i < 3; ++i) b.v[i] = ceil_div(d.threads[i], d.group[i]);
      break;
    case THREAD_INDEX_IN_THREADGROUP:
      b.v[0] = l.linear;
      break;
    case THREAD_INDEX_IN_SIMDGROUP:
      b.v[0] = l.lane;
      break;
    case SIMDGROUP_INDEX_IN_THREADGROUP:
      b.v[0] = l.warp;
      break;
    case THREADS_PER_SIMDGROUP:
    case THREAD_EXECUTION_WIDTH:
      b.v[0] = 32;
      break;
    case SIMDGROUPS_PER_THREADGROUP:
      b.v[0] = ceil_div(lanes, 32);
      break;
    case DISPATCH_SIMDGROUPS_PER_THREADGROUP:
      b.v[0] = ceil_div(dispatch_lanes, 32);
      break;
    case THREAD_INDEX_IN_QUADGROUP:
      b.v[0] = l.linear % 4;
      break;
    case QUADGROUP_INDEX_IN_THREADGROUP:
      b.v[0] = l.linear / 4;
      break;
    case QUADGROUPS_PER_THREADGROUP:
      b.v[0] = ceil_div(lanes, 4);
      break;
  }
  return b;
}

// Threadgroup memory of the running dispatch: every threadgroup variable a lane reaches reports itself
// once; together they must fit Apple GPUs' 32 KiB. The first lane of each threadgroup to reach a variable
// fills it with 0xFF bytes: the section poisoning above misses the variables of template kernels (the
// compiler gives a template's statics their own COMDAT section), and a lane passes the declaration before
// it can touch the variable, so this comes before any write of the threadgroup.
constexpr size_t kThreadgroupMemoryLimit = 32 * 1024;
constexpr size_t kThreadgroupVars = 64;
struct ThreadgroupUse {
  const void* seen[kThreadgroupVars];
  uint64_t poisoned_in[kThreadgroupVars];  // the threadgroup (generation) that last poisoned it
  size_t count = 0;
  size_t bytes = 0;
  uint64_t generation = 0;  // counts the threadgroups started in this dispatch
};
inline ThreadgroupUse& threadgroup_use() {
  static ThreadgroupUse use;
  return use;
}
inline void note_threadgroup(const void* var, size_t bytes) {
  ThreadgroupUse& u = threadgroup_use();
  for (size_t i = 0; i < u.count; ++i) {
    if (u.seen[i] == var) {
      if (u.poisoned_in[i] != u.generation) {
        u.poisoned_in[i] = u.generation;
        std::memset(const_cast<void*>(var), 0xff, bytes);
      }
      return;
    }
  }
  if (u.count < kThreadgroupVars) {
    u.seen[u.count] = var;
    u.poisoned_in[u.count++] = u.generation;
  }
  std::memset(const_cast<void*>(var), 0xff, bytes);
  u.bytes += bytes;
  if (u.bytes > kThreadgroupMemoryLimit)
    fail("%zu bytes of threadgroup memory; Metal allows at most %zu per threadgroup", u.bytes, kThreadgroupMemoryLimit);
}

// A [[buffer(n)]] argument; converts to the pointer or reference type the kernel declared.
struct BufferRef {
  const char* kernel;
  int index;
  GuardedBuffer* buf;
  template <class T, std::enable_if_t<!std::is_pointer<T>::value, int> = 0>
  operator T&() const {  // NOLINT
    if (buf->size() < sizeof(T))
      fail("buffer '%s' has %zu bytes but the kernel reads a %zu-byte value from it", buf->name(), buf->size(),
           sizeof(T));
    return *static_cast<T*>(buf->data());
  }
  template <class T>
  operator T*() const {  // NOLINT
    return static_cast<T*>(buf->data());
  }
};

struct Bind {
  const char* kernel;
  GuardedBuffer* buffers;
  int nbuffers;
  BufferRef buffer(int i) const { return BufferRef{kernel, i, &buffers[i]}; }
  Builtin builtin(BuiltinId id) const { return metal_launch::builtin(id); }
};

// The runtime names "block (x,y,z)" of its own launch; say "threadgroup" and give the position in the whole
// grid (edge threadgroups run as a separate launch whose block indices start at zero).
inline void name_threadgroup_in_error(const Dispatch& d) {
  std::string msg = last_error();
  const size_t at = msg.find("block (");
  unsigned x, y, z;
  if (at == std::string::npos || std::sscanf(msg.c_str() + at, "block (%u,%u,%u)", &x, &y, &z) != 3) return;
  const size_t end = msg.find(')', at);
  char pos[96];
  std::snprintf(pos, sizeof pos, "threadgroup (%u,%u,%u)", x + d.region_offset[0], y + d.region_offset[1],
                z + d.region_offset[2]);
  msg.replace(at, end + 1 - at, pos);
  set_error("%s", msg.c_str());
}

// Runs `call(bind)` in every lane of the dispatch. `dispatch` holds threads[3], group_size[3], flags.
// Every argument is a buffer (torch passes Python scalars as small constant buffers too).
template <class Call>
int run(const char* kernel, const Arg* args, int nargs, const uint32_t* dispatch, Call call) {
  Dispatch d{};
  d.flags = dispatch[6];
  if ((d.flags & FLUSH_SUBNORMALS) && !can_flush_subnormals()) {
    set_error("kernel '%s': BNB_EMU_METAL_FTZ: this host's floating-point control is not known to the emulator",
              kernel);
    return 1;
  }
  uint64_t group_lanes = 1;
  for (int i = 0; i < 3; ++i) {
    d.threads[i] = dispatch[i];
    d.group[i] = dispatch[3 + i];
    if (d.group[i] == 0) {
      set_error("kernel '%s': group_size has a zero dimension", kernel);
      return 1;
    }
    group_lanes *= d.group[i];
  }
  if (group_lanes > 1024) {
    set_error("kernel '%s': a threadgroup of %llu threads; Metal allows at most 1024", kernel,
              static_cast<unsigned long long>(group_lanes));
    return 1;
  }
  std::unique_ptr<GuardedBuffer[]> buffers(new GuardedBuffer[nargs > 0 ? nargs : 1]);
  for (int i = 0; i < nargs; ++i) {
    if (args[i].kind != ARG_BUFFER) {
      set_error("kernel '%s': argument %d must be passed as a buffer", kernel, i);
      return 1;
    }
    char name[64];
    if (args[i].name && args[i].name[0])
      std::snprintf(name, sizeof name, "%s", args[i].name);
    else
      std::snprintf(name, sizeof name, "buffer(%d)", i);
    if (!buffers[i].allocate(name, args[i].ptr, static_cast<size_t>(args[i].nbytes))) return 1;
  }
  Bind bind{kernel, buffers.get(), nargs};
  current() = &d;
  threadgroup_use() = ThreadgroupUse{};
  // Per dimension: the full threadgroups, then the one short threadgroup of the remainder.
  struct Part {
    uint32_t count, block, offset;
  };
  Part parts[3][2];
  int nparts[3];
  for (int i = 0; i < 3; ++i) {
    nparts[i] = 0;
    const uint32_t full = d.threads[i] / d.group[i], rest = d.threads[i] % d.group[i];
    if (full) parts[i][nparts[i]++] = Part{full, d.group[i], 0};
    if (rest) parts[i][nparts[i]++] = Part{1, rest, full};
  }
  int rc = 0;
  // Threadgroups run one at a time and each starts all its lanes before the next begins, so the first
  // lane to start with a new threadgroup position is the first of its threadgroup (whatever the lane order).
  uint64_t last_group = ~uint64_t{0};
  const uint64_t fp_saved = read_fp_control();
  const uint64_t fp_kernel = (d.flags & FLUSH_SUBNORMALS) ? flushing(fp_saved) : fp_saved;
  // Lanes run on worker threads and fiber contexts that may carry their own copy of the control
  // register: each lane sets it on entry, and this thread's own copy is restored after the dispatch.
  write_fp_control(fp_kernel);
  metal_detail::flush_subnormals_active() = (d.flags & FLUSH_SUBNORMALS) != 0;
  auto body = [&]() {
    write_fp_control(fp_kernel);
    const Dim3& g = lane().group;
    const uint64_t key = uint64_t{g.x} | (uint64_t{g.y} << 21) | (uint64_t{g.z} << 42);
    if (key != last_group) {
      last_group = key;
      poison_threadgroup_memory();
      ++threadgroup_use().generation;
    }
    call(bind);
  };
  for (int pz = 0; pz < nparts[2] && rc == 0; ++pz)
    for (int py = 0; py < nparts[1] && rc == 0; ++py)
      for (int px = 0; px < nparts[0] && rc == 0; ++px) {
        const Part &X = parts[0][px], &Y = parts[1][py], &Z = parts[2][pz];
        LaunchConfig cfg;
        cfg.kernel = kernel;
        cfg.grid = Dim3{X.count, Y.count, Z.count};
        cfg.block = Dim3{X.block, Y.block, Z.block};
        cfg.dynamic_shared = 0;
        cfg.warp_size = 32;
        d.region_offset[0] = X.offset;
        d.region_offset[1] = Y.offset;
        d.region_offset[2] = Z.offset;
        last_group = ~uint64_t{0};
        rc = launch(cfg, body);
      }
  current() = nullptr;
  write_fp_control(fp_saved);
  metal_detail::flush_subnormals_active() = false;
  if (rc != 0) {
    name_threadgroup_in_error(d);
    return rc;
  }
  for (int i = 0; i < nargs; ++i)
    if (!buffers[i].check_canary(kernel)) return 1;
  for (int i = 0; i < nargs; ++i)
    if (args[i].nbytes > 0) std::memcpy(args[i].ptr, buffers[i].data(), static_cast<size_t>(args[i].nbytes));
  return 0;
}

}  // namespace metal_launch
}  // namespace bnb_emu

// ---- Outside the subset: named, so that using them fails to compile with a clear message ----
namespace metal {
namespace unsupported {
template <class T>
struct always_false : std::false_type {};
}  // namespace unsupported
enum class access { sample, read, write, read_write };
#define BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(NAME)                                                            \
  template <class T = float, access A = access::sample, class... More>                                      \
  struct NAME {                                                                                             \
    static_assert(unsupported::always_false<T>::value,                                                      \
                  "bnb_emu/metal: " #NAME " is outside the emulated Metal subset (see the emulator docs)"); \
  };
BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(texture1d)
BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(texture2d)
BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(texture3d)
BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(texture2d_array)
BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(texture_buffer)
BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(depth2d)
BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(sampler_t)
BNB_EMU_METAL_UNSUPPORTED_TEMPLATE(imageblock)
#undef BNB_EMU_METAL_UNSUPPORTED_TEMPLATE
template <class T, int R = 8, int C = 8>
struct simdgroup_matrix {
  static_assert(unsupported::always_false<T>::value,
                "bnb_emu/metal: simdgroup_matrix is outside the emulated Metal subset (see the emulator docs)");
};
using simdgroup_float8x8 = simdgroup_matrix<float, 8, 8>;
using simdgroup_half8x8 = simdgroup_matrix<half, 8, 8>;
using simdgroup_bfloat8x8 = simdgroup_matrix<bfloat, 8, 8>;
using sampler = sampler_t<>;
#define BNB_EMU_METAL_UNSUPPORTED_FN(NAME)                                                                  \
  template <class... A>                                                                                     \
  inline void NAME(A&&...) {                                                                                \
    static_assert(unsupported::always_false<A...>::value,                                                   \
                  "bnb_emu/metal: " #NAME " is outside the emulated Metal subset (see the emulator docs)"); \
  }
BNB_EMU_METAL_UNSUPPORTED_FN(simdgroup_load)
BNB_EMU_METAL_UNSUPPORTED_FN(simdgroup_store)
BNB_EMU_METAL_UNSUPPORTED_FN(simdgroup_multiply_accumulate)
BNB_EMU_METAL_UNSUPPORTED_FN(quad_shuffle)
BNB_EMU_METAL_UNSUPPORTED_FN(quad_shuffle_down)
BNB_EMU_METAL_UNSUPPORTED_FN(quad_shuffle_up)
BNB_EMU_METAL_UNSUPPORTED_FN(quad_shuffle_xor)
BNB_EMU_METAL_UNSUPPORTED_FN(quad_sum)
BNB_EMU_METAL_UNSUPPORTED_FN(quad_broadcast)
BNB_EMU_METAL_UNSUPPORTED_FN(threadgroup_imageblock)
#undef BNB_EMU_METAL_UNSUPPORTED_FN
}  // namespace metal

// ---- Address spaces and function qualifiers ----
// Address spaces do not exist on the host; `constant` keeps its read-only meaning. Threadgroup
// variables are rewritten by the front end to BNB_EMU_THREADGROUP_VAR: a static is one copy per
// threadgroup because the runtime runs threadgroups one at a time; each starts filled with 0xFF bytes.
#define BNB_EMU_THREADGROUP_VAR __attribute__((section("bnb_emu_metal_tg"))) static
#define METAL_FUNC inline
#define kernel
#define device
#define constant const
#define thread
#define threadgroup
