// The lane scheduler shared by the CUDA and Metal shims (test-only; compiled by the host C++ compiler).
//
// A launch runs every block (threadgroup) of the grid, one after the other, in a fixed order, on a fresh
// host thread (so thread_local data, such as the CUDA shim's static __shared__ arrays, starts zeroed at
// every launch). Within a block every thread is a fiber; that host thread runs them round-robin in index
// order. A lane runs until it reaches a yield point: a block barrier or a warp (SIMD-group) collective,
// where all participating lanes meet. Nothing else switches lanes, so the result of a launch is the same
// on every run.
//
// Everything a launch can get wrong (a barrier some lanes never reach, a fault in a kernel buffer, an
// unsupported use of a collective, a lane spinning past BNB_EMU_TIMEOUT seconds) ends the launch with an
// error message; `launch` returns nonzero and `last_error()` says what happened, naming the kernel, the
// block and lane, and the source site.
//
// API stability: the shims (cuda.h, metal.h) and the Python loader build on this header; it only grows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>

// Yield points record where they were called from, so errors can name the line of kernel source.
#define BNB_EMU_STR2(x) #x
#define BNB_EMU_STR(x) BNB_EMU_STR2(x)
#define BNB_EMU_SITE __FILE__ ":" BNB_EMU_STR(__LINE__)

#if defined(__GNUC__)
#define BNB_EMU_EXPORT_C extern "C" __attribute__((visibility("default")))
#else
#define BNB_EMU_EXPORT_C extern "C"
#endif

namespace bnb_emu {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

// What one launch runs: grid of blocks, threads per block, bytes of dynamic shared memory per block.
struct LaunchConfig {
  const char* kernel = "kernel";  // named in every error message
  Dim3 grid;
  Dim3 block;
  size_t dynamic_shared = 0;
  uint32_t warp_size = 32;  // lanes per warp / SIMD-group (1..32)
};

// The calling lane's coordinates; valid inside a kernel body during a launch.
struct LaneInfo {
  Dim3 thread;          // index within the block
  Dim3 group;           // index of the block within the grid
  uint32_t linear;      // thread.x + block.x * (thread.y + block.y * thread.z)
  uint32_t warp;        // linear / warp_size
  uint32_t lane;        // linear % warp_size
  uint32_t warp_lanes;  // lanes that exist in this warp (a block's last warp may be short)
};

const LaunchConfig& config();
const LaneInfo& lane();
// Mask of the lanes that exist in the calling lane's warp (bit i = lane i).
uint32_t warp_mask();

// This block's dynamic shared memory (config().dynamic_shared bytes, 16-byte aligned, guarded at its end,
// filled with 0xFF bytes at the start of every block so reads of never-written shared memory show).
void* dynamic_shared();

// Block-wide barrier: every lane of the block must reach the same barrier site. A lane that exits while
// others wait, or lanes waiting at different sites, is an error (hardware would hang or misbehave).
// `what` names the construct in messages (e.g. "__syncthreads").
void barrier(const char* site, const char* what);

// Block-wide barrier that also combines one 32-bit value per lane (for __syncthreads_count/and/or):
// returns the sum over the lanes of the block.
uint64_t barrier_sum(const char* site, const char* what, uint32_t value);

// The one warp collective everything else is built on. Every lane named in `member_mask` (lanes of the
// caller's warp; the caller must be one of them) deposits `nbytes` from `in`; when all have arrived, each
// gets in `out` (config().warp_size * nbytes bytes) every deposit, slot i from lane i. Slots of lanes not in
// the mask are zero. A named lane that has exited, or never arrives, is an error, not a hang. Lanes meet
// only with lanes that passed the same mask; a collective of a different kind (`what`) with the same mask
// at the same time is an error. nbytes <= 64.
// member_mask 0 asks for Metal's rule instead: the members are the lanes of the warp that have not exited
// (decided when the last of them arrives; a lane exiting meanwhile just drops out).
void warp_exchange(const char* site, const char* what, uint32_t member_mask, const void* in, void* out, size_t nbytes);

// Ends the launch with an error message (printf-style); the message gets the kernel, block and lane added.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Runs body(ctx) in every lane of every block. Returns 0, or nonzero with last_error() set.
using KernelBody = void (*)(void* ctx);
int launch(const LaunchConfig& cfg, KernelBody body, void* ctx);

template <class F>
int launch(const LaunchConfig& cfg, F& f) {
  return launch(cfg, [](void* c) { (*static_cast<F*>(c))(); }, static_cast<void*>(&f));
}

const char* last_error();
void set_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// ---- Guarded buffers --------------------------------------------------------------------------------
// Kernel buffers live in memory that ends exactly at an inaccessible page (and starts after one), so an
// access past the end faults; a fault during a launch is reported as an out-of-bounds access naming the
// buffer. The few bytes of slack that 16-byte alignment leaves before the guard, and the bytes before the
// start on the same page, are filled with a canary that is checked after the launch (catches writes).
class GuardedBuffer {
 public:
  GuardedBuffer() = default;
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  ~GuardedBuffer();
  // Copies `nbytes` from `src` (may be null: contents are then 0xFF bytes). Returns false and sets
  // last_error() if memory could not be mapped.
  bool allocate(const char* name, const void* src, size_t nbytes);
  void* data() const { return data_; }
  size_t size() const { return size_; }
  const char* name() const { return name_; }
  void fill(unsigned char byte);
  // Canary check; returns false and sets last_error() naming the buffer if bytes around it were written.
  bool check_canary(const char* kernel) const;

 private:
  char* map_ = nullptr;
  size_t map_size_ = 0;
  char* data_ = nullptr;
  size_t size_ = 0;
  char name_[64] = {0};
};

// Registers a guarded region for fault reports while it is alive (GuardedBuffer does this itself).
void register_region(const void* begin, size_t nbytes, const char* name);
void unregister_region(const void* begin);

// ---- The C ABI a compiled kernel module exposes to Python ---------------------------------------------
// One argument of a launch, in kernel-parameter order.
enum ArgKind : int32_t { ARG_BUFFER = 0, ARG_INT = 1, ARG_FLOAT = 2, ARG_BYTES = 3 };
struct Arg {
  int32_t kind;
  int32_t readonly;  // unused (the parameter type decides); keep 0
  int64_t nbytes;    // buffers and bytes: size of `ptr`
  int64_t i;
  double f;
  void* ptr;
  const char* name;  // buffers: named in out-of-bounds reports
};

// Describes a kernel parameter type for the signature string Python checks arguments against:
// "i<bits>", "u<bits>", "f<bits>", "?" (bool), a shim's code for its 16-bit float types ("h" half, "b"
// bfloat16), "s<bytes>" (anything else trivially copyable: vector types, structs, passed as bytes); a
// pointer is "p" (+ "c" when it points to const) + the code of what it points to, or "v" for void.
template <class T, class = void>
struct ScalarCode {  // shims specialise this for their half/bfloat types
  static constexpr const char* code = nullptr;
};

template <class T>
void describe_type(char* buf, size_t cap) {
  if constexpr (std::is_pointer<T>::value) {
    using Elem = std::remove_pointer_t<T>;
    char inner[24] = "v";
    if constexpr (!std::is_void<Elem>::value) describe_type<std::remove_cv_t<Elem>>(inner, sizeof(inner));
    std::snprintf(buf, cap, "p%s%s", std::is_const<Elem>::value ? "c" : "", inner);
  } else if constexpr (std::is_same<T, bool>::value) {
    std::snprintf(buf, cap, "?");
  } else if constexpr (std::is_integral<T>::value) {
    std::snprintf(buf, cap, "%c%zu", std::is_signed<T>::value ? 'i' : 'u', sizeof(T) * 8);
  } else if constexpr (std::is_floating_point<T>::value) {
    std::snprintf(buf, cap, "f%zu", sizeof(T) * 8);
  } else if constexpr (ScalarCode<T>::code != nullptr) {
    std::snprintf(buf, cap, "%s", ScalarCode<T>::code);
  } else {
    static_assert(std::is_trivially_copyable<T>::value,
                  "bnb_emu: a kernel parameter passed by value must be trivially copyable");
    std::snprintf(buf, cap, "s%zu", sizeof(T));
  }
}

// The signature string ("p4,pc4,i32,f32") of a parameter list.
template <class... Args>
void describe_args(char* buf, size_t cap) {
  buf[0] = 0;
  size_t used = 0;
  char part[32];
  auto one = [&](auto tag) {
    using T = typename decltype(tag)::type;
    describe_type<T>(part, sizeof(part));
    used += std::snprintf(buf + used, used < cap ? cap - used : 0, "%s%s", used ? "," : "", part);
  };
  (one(std::common_type<std::decay_t<Args>>{}), ...);
  (void)one;
}

// The kind of C ABI argument a parameter type takes.
template <class T>
constexpr ArgKind kind_of() {
  if constexpr (std::is_pointer<T>::value)
    return ARG_BUFFER;
  else if constexpr (std::is_integral<T>::value)
    return ARG_INT;
  else if constexpr (std::is_floating_point<T>::value || ScalarCode<T>::code != nullptr)
    return ARG_FLOAT;
  else
    return ARG_BYTES;
}

template <class T>
constexpr bool points_to_const() {
  if constexpr (std::is_pointer<T>::value)
    return std::is_const<std::remove_pointer_t<T>>::value;
  else
    return false;
}

// Turns one C ABI argument into a kernel parameter; `buffers[index]` is the guarded copy for pointers.
template <class T>
T decode_arg(const Arg& a, GuardedBuffer* buffers, size_t index) {
  if constexpr (std::is_pointer<T>::value) {
    return static_cast<T>(buffers[index].data());
  } else if constexpr (std::is_integral<T>::value) {
    return static_cast<T>(a.i);
  } else if constexpr (std::is_floating_point<T>::value) {
    return static_cast<T>(a.f);
  } else if constexpr (ScalarCode<T>::code != nullptr) {
    return T(static_cast<float>(a.f));  // 16-bit floats round the way the shim's conversion does
  } else {
    T v;
    std::memcpy(static_cast<void*>(&v), a.ptr, sizeof(T));
    return v;
  }
}

// Checks one argument against its parameter; false with last_error() naming the argument on mismatch.
bool check_arg(const char* kernel, size_t index, const Arg& a, ArgKind want, size_t value_bytes);

// Copies buffer arguments into guarded memory (false with last_error() on failure), and back after.
bool stage_buffers(const char* kernel, const Arg* args, const ArgKind* kinds, size_t n, GuardedBuffer* buffers);
// `readonly[i]`: parameter i points to const, so buffer i is not copied back.
bool unstage_buffers(const char* kernel, const Arg* args, const bool* readonly, size_t n, const GuardedBuffer* buffers);

template <class... Args, class Call, size_t... I>
void call_decoded(Call& call, const Arg* args, GuardedBuffer* buffers, std::index_sequence<I...>) {
  call(decode_arg<std::decay_t<Args>>(args[I], buffers, I)...);
}

// The whole of an exported entry point: checks the arguments against the parameter list Args, stages
// the buffers, runs `call(args...)` in every lane, checks canaries and copies writable buffers back.
template <class... Args, class Call>
int run_with_args(const LaunchConfig& cfg, const Arg* args, int nargs, Call call) {
  constexpr size_t N = sizeof...(Args);
  if (nargs < 0 || static_cast<size_t>(nargs) != N) {
    set_error("kernel '%s' takes %zu arguments, got %d", cfg.kernel, N, nargs);
    return 1;
  }
  const ArgKind kinds[N + 1] = {kind_of<std::decay_t<Args>>()..., ARG_INT};
  const size_t sizes[N + 1] = {sizeof(std::decay_t<Args>)..., 0};
  const bool readonly[N + 1] = {points_to_const<std::decay_t<Args>>()..., false};
  for (size_t i = 0; i < N; ++i)
    if (!check_arg(cfg.kernel, i, args[i], kinds[i], sizes[i])) return 1;
  GuardedBuffer buffers[N + 1];
  if (!stage_buffers(cfg.kernel, args, kinds, N, buffers)) return 1;
  auto body = [&]() { call_decoded<Args...>(call, args, buffers, std::index_sequence_for<Args...>{}); };
  if (launch(cfg, body) != 0) return 1;
  return unstage_buffers(cfg.kernel, args, readonly, N, buffers) ? 0 : 1;
}

// Deduces the parameter list of a function (pointer) for run_with_args / describe_args.
template <class F>
struct Signature;
template <class... Args>
struct Signature<void (*)(Args...)> {
  template <class Call>
  static int run(const LaunchConfig& cfg, const Arg* args, int nargs, Call call) {
    return run_with_args<Args...>(cfg, args, nargs, call);
  }
  static void describe(char* buf, size_t cap) { describe_args<Args...>(buf, cap); }
};
template <class... Args>
struct Signature<void (&)(Args...)> : Signature<void (*)(Args...)> {};
template <class... Args>
struct Signature<void(Args...)> : Signature<void (*)(Args...)> {};

}  // namespace bnb_emu
