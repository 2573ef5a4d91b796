// bnb::parallel_for runs on one of two sets of threads:
//
// - "openmp": the OpenMP runtime torch already loaded (libgomp on Linux). Our parallel regions go to GOMP_parallel, so
// they run on the very team torch's ops use:
//   the thread that finishes torch's op and spins waiting for the next region picks ours up at once,
//   and no second set of threads competes with torch's spinning ones for the cores. The runtime is
//   looked up in the process (dlopen with RTLD_NOLOAD, by soname or by a loaded object's file name),
//   never linked: the wheel carries no OpenMP and can never load a second copy beside torch's.
// - "pool": a small persistent pool of our own, used where no OpenMP runtime is loaded, and always in a
//   child after fork() (an OpenMP team cannot be used in a forked child: its threads are gone; a known
//   libgomp limitation, which torch's own ops hit too).
// - "auto", the default where a runtime is found: the openmp team, falling back to the pool for a while
//   when the machine is oversubscribed (note_region below).
//
// Either way the caller passes the thread count (torch.get_num_threads()) on every call, so
// torch.set_num_threads() is honoured, and work is cut into more chunks than threads and claimed
// dynamically: which chunk runs where never changes what is computed, and a thread that is slow to wake
// costs at most the chunk it holds.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
#endif
#if defined(__linux__)
#include <link.h>
#elif defined(__APPLE__)
#include <mach-o/dyld.h>
#endif

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common.h"
#include "thread_pool.h"

namespace bnb {
namespace {

// One parallel_for call. Shared with the workers it was posted to, so a worker that wakes after the
// caller returned finds no chunk left and touches nothing but this object.
struct Batch {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n, per, chunks;
  std::atomic<int64_t> next{0};  // next chunk to claim
  std::atomic<int64_t> done{0};  // chunks finished
  std::mutex mu;
  std::condition_variable finished;
  std::exception_ptr error;

  // Claims and runs chunks until none are left.
  void work() {
    for (;;) {
      int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      int64_t begin = c * per, end = begin + per < n ? begin + per : n;
      try {
        (*fn)(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
        std::lock_guard<std::mutex> lock(mu);
        finished.notify_all();
      }
    }
  }
};

// True while this thread runs chunks of a parallel_for: a nested call runs inline.
thread_local bool in_worker = false;

struct WorkerScope {
  bool saved = in_worker;
  WorkerScope() { in_worker = true; }
  ~WorkerScope() { in_worker = saved; }
};

class Pool {
 public:
  void post(const std::shared_ptr<Batch>& batch, int helpers) {
    std::lock_guard<std::mutex> lock(mu_);
    while (int(workers_.size()) < helpers) {
      workers_.emplace_back([this] { loop(); });
      workers_.back().detach();  // never joined: they live as long as the process
    }
    for (int i = 0; i < helpers; ++i) queue_.push_back(batch);
    cv_.notify_all();
  }

 private:
  void loop() {
    in_worker = true;
    for (;;) {
      std::shared_ptr<Batch> batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        batch = std::move(queue_.front());
        queue_.pop_front();
      }
      batch->work();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Batch>> queue_;
  std::vector<std::thread> workers_;
};

// The pool of this process. After fork() the child has none of the parent's threads and its mutexes
// and condition variables may be in any state, so the child drops (leaks) the parent's pool and
// builds a fresh one on first use.
std::atomic<Pool*> g_pool{nullptr};
std::mutex* g_pool_mu = new std::mutex();

// ---- the OpenMP runtime of the process ----------------------------------------------------------

// GOMP_parallel(fn, data, num_threads, flags): what `#pragma omp parallel num_threads(n)` compiles to
// with gcc since 4.9 (libgomp's GOMP_4.0 ABI); LLVM's and Intel's runtimes export it too.
using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);

#if !defined(_WIN32)
// The OpenMP runtimes, by the start of their file names.
constexpr const char* kOpenMPNames[] = {"libgomp", "libomp", "libiomp5"};

bool is_openmp_file(const char* path) {
  const char* slash = std::strrchr(path, '/');
  const char* base = slash ? slash + 1 : path;
  for (const char* name : kOpenMPNames) {
    const size_t n = std::strlen(name);
    // "libgomp.so.1", and auditwheel's renamed copies such as "libgomp-a49a47f9.so.1.0.0".
    if (std::strncmp(base, name, n) == 0 && (base[n] == '.' || base[n] == '-')) return true;
  }
  return false;
}

GompParallel gomp_in(const char* name) {
  void* h = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);  // RTLD_NOLOAD: only a runtime already loaded, never a new one
  if (!h) return nullptr;
  auto fn = reinterpret_cast<GompParallel>(dlsym(h, "GOMP_parallel"));
  if (!fn) dlclose(h);  // else the handle is kept: the runtime stays loaded as long as torch is
  return fn;
}
#endif

GompParallel find_openmp() {
#if defined(_WIN32)
  return nullptr;
#else
  for (const char* name : {"libgomp.so.1", "libomp.so", "libiomp5.so", "libomp.dylib", "libiomp5.dylib"}) {
    if (GompParallel fn = gomp_in(name)) return fn;
  }
  // Wheels repaired by auditwheel/delocate carry the runtime under a mangled name and soname (torch's
  // aarch64 wheel: torch.libs/libgomp-<hash>.so.1.0.0), which no soname above matches: walk the loaded
  // objects by file name and ask the one found by its full path.
  std::string found;
#if defined(__linux__)
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (!info->dlpi_name || !*info->dlpi_name || !is_openmp_file(info->dlpi_name)) return 0;
        *static_cast<std::string*>(out) = info->dlpi_name;
        return 1;
      },
      &found);
#elif defined(__APPLE__)
  for (uint32_t i = 0, n = _dyld_image_count(); i < n && found.empty(); ++i) {
    const char* path = _dyld_get_image_name(i);
    if (path && is_openmp_file(path)) found = path;
  }
#endif
  return found.empty() ? nullptr : gomp_in(found.c_str());
#endif
}

// kAuto: the openmp team, except while the machine is oversubscribed (see below).
enum Mode : int { kUndecided = -1, kPool = 0, kOpenMP = 1, kAuto = 2 };
std::atomic<int> g_mode{kUndecided};
std::atomic<GompParallel> g_gomp{nullptr};
std::atomic<bool> g_forked{false};

void choose_auto() {
  GompParallel fn = g_forked.load() ? nullptr : find_openmp();
  g_gomp.store(fn);
  g_mode.store(fn ? kAuto : kPool);
}

int mode() {
  int m = g_mode.load(std::memory_order_acquire);
  if (m != kUndecided) return m;
  // BNB_CPU_THREADS=pool|openmp|auto (default auto), read once: for benchmarks and diagnosis.
  const char* env = std::getenv("BNB_CPU_THREADS");
  try {
    set_thread_runtime(env && *env ? env : "auto");
  } catch (const std::invalid_argument&) {
    choose_auto();  // a bad value must not break every kernel; python -m bitsandbytes shows the choice
  }
  return g_mode.load(std::memory_order_acquire);
}

// An OpenMP region ends at a barrier that waits for every thread of the team, also one the OS has not
// scheduled yet: on an oversubscribed machine (more runnable threads than cores) a call then waits a
// scheduler time slice, several times the work (measured on 2 busy cores: 24 ms against 7 ms on one
// thread), where our pool's caller just does the chunks no worker took. So in auto mode a call whose
// closing wait exceeded both its own work and kStrikeWait counts as a strike; after kStrikes in a row
// the pool is used for kPoolSpell, then the team is tried again.
using Clock = std::chrono::steady_clock;
constexpr int kStrikes = 3;
constexpr auto kPoolSpell = std::chrono::seconds(2);
// A wait this long is the scheduler's doing: waking an idle team thread takes tens of microseconds, so
// tiny calls on a quiet machine (whose wait may exceed their work) never count.
constexpr auto kStrikeWait = std::chrono::milliseconds(1);
std::atomic<int> g_strikes{0};
std::atomic<int64_t> g_pool_until{0};  // Clock ticks; auto mode uses the pool before this

bool auto_uses_pool() {
  const int64_t until = g_pool_until.load(std::memory_order_relaxed);
  return until != 0 && Clock::now().time_since_epoch().count() < until;
}

// start/end: around GOMP_parallel; begin/done: the caller's own chunks. The team's waits are at both
// ends (the start waits for a team thread still on its way back from the previous region).
void note_region(Clock::time_point start, Clock::time_point begin, Clock::time_point done, Clock::time_point end) {
  const auto wait = (begin - start) + (end - done);
  if (wait > done - begin && wait > kStrikeWait) {
    if (g_strikes.fetch_add(1, std::memory_order_relaxed) + 1 >= kStrikes) {
      g_strikes.store(0, std::memory_order_relaxed);
      g_pool_until.store((end + kPoolSpell).time_since_epoch().count(), std::memory_order_relaxed);
    }
  } else {
    g_strikes.store(0, std::memory_order_relaxed);
  }
}

#if !defined(_WIN32)
void forget_threads_in_child() {
  g_pool.store(nullptr);
  g_pool_mu = new std::mutex();
  g_forked.store(true);
  if (g_mode.load() == kOpenMP || g_mode.load() == kAuto) g_mode.store(kPool);
}
const bool g_atfork_registered = pthread_atfork(nullptr, nullptr, forget_threads_in_child) == 0;
#endif

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  std::lock_guard<std::mutex> lock(*g_pool_mu);
  p = g_pool.load(std::memory_order_acquire);
  if (!p) {
    p = new Pool();  // leaked on purpose: detached workers block on it until the process exits
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

// Chunks per thread: enough that a late or preempted worker holds up little of the call.
constexpr int64_t kChunksPerThread = 4;

void run_batch(void* p) {
  WorkerScope scope;
  static_cast<Batch*>(p)->work();
}

// GOMP_parallel's body: the caller (thread 0 of the team) records when it ran out of chunks.
struct OmpCall {
  Batch* batch;
  std::thread::id caller;
  Clock::time_point caller_begin, caller_done;
};

void run_omp(void* p) {
  auto* call = static_cast<OmpCall*>(p);
  const bool caller = std::this_thread::get_id() == call->caller;
  if (caller) call->caller_begin = Clock::now();
  run_batch(call->batch);
  if (caller) call->caller_done = Clock::now();
}

}  // namespace

const char* thread_runtime() {
  const int m = mode();
  return m == kOpenMP ? "openmp" : m == kAuto ? "auto" : "pool";
}

void set_thread_runtime(const char* name) {
  const std::string n = name ? name : "";
  if (n == "auto") {
    g_pool_until.store(0);
    choose_auto();
  } else if (n == "pool") {
    g_mode.store(kPool);
  } else if (n == "openmp") {
    if (g_forked.load()) throw std::invalid_argument("the openmp thread runtime cannot be used after fork()");
    GompParallel fn = find_openmp();
    if (!fn) throw std::invalid_argument("no OpenMP runtime (GOMP_parallel) is loaded in this process");
    g_gomp.store(fn);
    g_mode.store(kOpenMP);
  } else {
    throw std::invalid_argument("thread runtime must be 'openmp', 'pool' or 'auto'; got '" + n + "'");
  }
}

void parallel_for(int64_t n, int64_t grain, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (threads < 1) threads = 1;
  int64_t max_chunks = (n + grain - 1) / grain;
  if (threads == 1 || max_chunks <= 1 || in_worker) {
    fn(0, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(max_chunks, threads * kChunksPerThread);
  // Equal contiguous ranges, each a multiple of `grain` except the last.
  int64_t per = ((n + chunks - 1) / chunks + grain - 1) / grain * grain;
  auto batch = std::make_shared<Batch>();
  batch->fn = &fn;
  batch->n = n;
  batch->per = per;
  batch->chunks = (n + per - 1) / per;
  const int m = mode();
  if (m == kOpenMP || (m == kAuto && !auto_uses_pool())) {
    // Returns when every thread of the team has finished (the region's closing barrier).
    OmpCall call{batch.get(), std::this_thread::get_id(), {}, {}};
    const Clock::time_point start = Clock::now();
    g_gomp.load(std::memory_order_relaxed)(run_omp, &call, unsigned(std::min<int64_t>(threads, batch->chunks)), 0);
    // The caller is thread 0 of the team, so it always ran run_omp and set both times.
    if (m == kAuto) note_region(start, call.caller_begin, call.caller_done, Clock::now());
    if (batch->error) std::rethrow_exception(batch->error);
    return;
  }
  pool().post(batch, int(std::min<int64_t>(threads - 1, batch->chunks - 1)));
  run_batch(batch.get());
  if (batch->done.load(std::memory_order_acquire) != batch->chunks) {
    std::unique_lock<std::mutex> lock(batch->mu);
    batch->finished.wait(lock, [&] { return batch->done.load(std::memory_order_acquire) == batch->chunks; });
  }
  if (batch->error) std::rethrow_exception(batch->error);
}

}  // namespace bnb
