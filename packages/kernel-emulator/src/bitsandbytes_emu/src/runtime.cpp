// The lane scheduler behind bnb_emu/runtime.h.
//
// Fibers: each lane gets its own stack (with an inaccessible page below it); a lane is entered the first
// time with setcontext and afterwards switched with _setjmp/_longjmp, which, unlike swapcontext, makes no
// system call. Faults (SIGSEGV/SIGBUS/SIGFPE) during a launch are caught on an alternate signal stack and
// turned into an error that names the buffer, then the launch unwinds with siglongjmp. The handlers are
// installed only while a launch runs and restored afterwards.
//
// Under AddressSanitizer (BNB_EMU_SANITIZE=address) every switch between a lane and the scheduler is
// announced with ASan's fiber annotations: ASan keeps one stack per thread, and a jump onto a stack it
// does not know makes its longjmp handling unpoison the wrong range and report false stack errors.
#ifdef _FORTIFY_SOURCE
#undef _FORTIFY_SOURCE  // __longjmp_chk rejects the cross-stack jumps fibers are made of
#endif
#if defined(__APPLE__)  // macOS keeps the ucontext routines behind these (untested here: no Mac in CI)
#define _XOPEN_SOURCE 700
#define _DARWIN_C_SOURCE 1
#endif
#include "bnb_emu/runtime.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define BNB_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BNB_EMU_ASAN 1
#endif
#endif
#ifdef BNB_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace bnb_emu {
namespace {

constexpr unsigned char kPoison = 0xFF;
constexpr unsigned char kCanary = 0xA5;
constexpr size_t kAlign = 16;
constexpr size_t kMaxExchange = 64;

size_t page_size() {
  static size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

#ifdef BNB_EMU_ASAN
constexpr size_t kDefaultStackKb = 256;  // ASan puts redzones around every local: frames grow severalfold
#else
constexpr size_t kDefaultStackKb = 64;
#endif

// Entering another stack: `fake_save` keeps the leaving context's ASan fake stack (null: it never resumes).
void switch_begin(void** fake_save, const void* bottom, size_t size) {
#ifdef BNB_EMU_ASAN
  __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
  (void)fake_save, (void)bottom, (void)size;
#endif
}

// Arrived on the new stack; `from_bottom`/`from_size` receive the bounds of the stack left behind.
void switch_end(void* fake, const void** from_bottom, size_t* from_size) {
#ifdef BNB_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, from_bottom, from_size);
#else
  (void)fake, (void)from_bottom, (void)from_size;
#endif
}

char g_error[8192];

enum class State { Ready, Barrier, Collective, Done };

struct Lane {
  LaneInfo info;
  State state = State::Ready;
  bool started = false;
  jmp_buf jb;
  ucontext_t uc;
  char* stack = nullptr;
  const char* site = nullptr;  // where it waits
  const char* what = nullptr;
  void* fake = nullptr;  // ASan's fake stack of this lane while it is switched out
  // warp collective in progress
  uint32_t mask = 0;
  const void* in = nullptr;
  void* out = nullptr;
  size_t nbytes = 0;
  uint32_t value = 0;  // barrier_sum
  uint64_t* sum_out = nullptr;
};

struct Region {
  const char* begin;
  size_t size;
  std::string name;
};

struct Launch {
  const LaunchConfig* cfg = nullptr;
  KernelBody body = nullptr;
  void* ctx = nullptr;
  std::vector<Lane> lanes;
  Dim3 group;
  size_t current = 0;
  size_t live = 0;
  size_t at_barrier = 0;
  jmp_buf sched;
  sigjmp_buf abort_jb;
  volatile bool in_grid = false;  // the worker is between sigsetjmp and the end of the last block
  bool in_lane = false;
  GuardedBuffer* shared = nullptr;
  bool reverse = false;  // BNB_EMU_ORDER=reverse: lanes run in descending index order
  // The worker thread's own stack (the scheduler's), learnt on the first switch into a lane, and whether
  // execution is on a lane's stack (abort_launch then leaves it for good).
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
  void* sched_fake = nullptr;
  volatile bool on_lane_stack = false;
};

Launch* g_launch = nullptr;
std::vector<Region> g_regions;

// Lane stacks are cached across launches: one mapping of (guard page + stack) per lane.
char* g_stacks = nullptr;
size_t g_stack_count = 0;
size_t g_stack_bytes = 0;

size_t stack_bytes() {
  const char* env = std::getenv("BNB_EMU_STACK_KB");
  size_t kb = env ? static_cast<size_t>(std::strtoul(env, nullptr, 10)) : 0;
  if (kb < 16) kb = kDefaultStackKb;
  return round_up(kb * 1024, page_size());
}

bool ensure_stacks(size_t n) {
  size_t bytes = stack_bytes();
  if (g_stacks && g_stack_count >= n && g_stack_bytes == bytes) return true;
  if (g_stacks) munmap(g_stacks, g_stack_count * (g_stack_bytes + page_size()));
  size_t per = bytes + page_size();
  void* m = mmap(nullptr, n * per, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    g_stacks = nullptr;
    set_error("bnb_emu: could not map %zu lane stacks of %zu KiB", n, bytes / 1024);
    return false;
  }
  g_stacks = static_cast<char*>(m);
  g_stack_count = n;
  g_stack_bytes = bytes;
  for (size_t i = 0; i < n; ++i) mprotect(g_stacks + i * per, page_size(), PROT_NONE);
  return true;
}

void format_dim(char* buf, size_t cap, const Dim3& d) { std::snprintf(buf, cap, "(%u,%u,%u)", d.x, d.y, d.z); }

// "kernel 'k', block (1,0,0), thread (3,0,0)" for the running lane, or just the kernel/block.
std::string where() {
  std::string s;
  if (!g_launch) return s;
  char b[64], t[64];
  format_dim(b, sizeof b, g_launch->group);
  s = std::string("kernel '") + g_launch->cfg->kernel + "', block " + b;
  if (g_launch->in_lane) {
    format_dim(t, sizeof t, g_launch->lanes[g_launch->current].info.thread);
    s += std::string(", thread ") + t;
  }
  return s;
}

[[noreturn]] void abort_launch() {
  Launch& L = *g_launch;
  if (L.on_lane_stack) switch_begin(nullptr, L.sched_bottom, L.sched_size);
  siglongjmp(L.abort_jb, 1);
}

Lane& me() { return g_launch->lanes[g_launch->current]; }

// Back to the scheduler; returns when the scheduler picks this lane again.
void yield_lane() {
  Lane& l = me();
  if (!_setjmp(l.jb)) {
    g_launch->on_lane_stack = false;
    switch_begin(&l.fake, g_launch->sched_bottom, g_launch->sched_size);
    _longjmp(g_launch->sched, 1);
  }
  switch_end(l.fake, nullptr, nullptr);
  g_launch->on_lane_stack = true;
}

// Lane ranges as "3, 5-9, 12" for messages.
std::string ranges(const std::vector<size_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    char buf[48];
    if (j == i)
      std::snprintf(buf, sizeof buf, "%zu", ids[i]);
    else
      std::snprintf(buf, sizeof buf, "%zu-%zu", ids[i], ids[j]);
    if (!s.empty()) s += ", ";
    s += buf;
    i = j + 1;
  }
  return s;
}

// Which lanes are where: "12 lanes (0-11) wait at __syncthreads k.cu:20; lanes 12-15 exited".
std::string census() {
  Launch& L = *g_launch;
  std::vector<std::pair<std::string, std::vector<size_t>>> groups;
  std::vector<size_t> exited;
  for (size_t i = 0; i < L.lanes.size(); ++i) {
    const Lane& l = L.lanes[i];
    if (l.state == State::Done) {
      exited.push_back(i);
      continue;
    }
    if (l.state == State::Ready) continue;
    std::string key = std::string(l.what) + " at " + l.site;
    if (l.state == State::Collective) {
      char m[32];
      if (l.mask == 0)
        std::snprintf(m, sizeof m, " (active lanes)");
      else
        std::snprintf(m, sizeof m, " (mask 0x%08x)", l.mask);
      key += m;
    }
    bool found = false;
    for (auto& g : groups)
      if (g.first == key) {
        g.second.push_back(i);
        found = true;
      }
    if (!found) groups.push_back({key, {i}});
  }
  std::string s;
  for (auto& g : groups) {
    char n[64];
    std::snprintf(n, sizeof n, "%zu lane%s (", g.second.size(), g.second.size() == 1 ? "" : "s");
    s += std::string(s.empty() ? "" : "; ") + n + ranges(g.second) + ") wait in " + g.first;
  }
  if (!exited.empty())
    s += std::string(s.empty() ? "" : "; ") + (exited.size() == 1 ? "lane " : "lanes ") + ranges(exited) +
         (exited.size() == 1 ? " has exited" : " have exited");
  return s;
}

void release_barrier() {
  Launch& L = *g_launch;
  const char* site = nullptr;
  bool diverged = false;
  uint64_t sum = 0;
  for (auto& l : L.lanes) {
    if (l.state != State::Barrier) continue;
    if (!site) site = l.site;
    if (std::strcmp(site, l.site) != 0) diverged = true;
    sum += l.value;
  }
  if (diverged || L.live != L.lanes.size()) {
    L.in_lane = false;
    std::string msg = census();
    set_error("%s: barrier not reached by every lane of the block (on hardware: a hang or undefined behaviour): %s",
              where().c_str(), msg.c_str());
    abort_launch();
  }
  for (auto& l : L.lanes) {
    if (l.sum_out) *l.sum_out = sum;
    l.sum_out = nullptr;
    l.state = State::Ready;
  }
  L.at_barrier = 0;
}

// Completes the collective of `mask` in `warp` if every named lane has arrived.
void try_complete_collective(uint32_t warp, uint32_t mask) {
  Launch& L = *g_launch;
  const size_t ws = L.cfg->warp_size;
  const size_t base = static_cast<size_t>(warp) * ws;
  uint32_t named = mask;
  if (mask == 0) {  // Metal-style: every lane of the warp that has not exited
    for (size_t k = 0; k < ws && base + k < L.lanes.size(); ++k)
      if (L.lanes[base + k].state != State::Done) named |= 1u << k;
  }
  Lane* members[32];
  size_t n = 0;
  for (size_t k = 0; k < ws; ++k) {
    if (!(named >> k & 1u)) continue;
    Lane& l = L.lanes[base + k];
    if (l.state == State::Done) {
      L.in_lane = false;
      std::string msg = census();
      set_error(
          "%s: warp %u collective with mask 0x%08x names lane %zu, which has exited (on hardware: undefined "
          "behaviour): %s",
          where().c_str(), warp, mask, k, msg.c_str());
      abort_launch();
    }
    if (l.state != State::Collective || l.mask != mask) return;
    members[n++] = &l;
  }
  const char* what = members[0]->what;
  size_t nbytes = members[0]->nbytes;
  for (size_t i = 1; i < n; ++i) {
    if (std::strcmp(members[i]->what, what) != 0 || members[i]->nbytes != nbytes) {
      std::string msg = census();
      set_error("%s: lanes of warp %u meet with mask 0x%08x in different collectives: %s", where().c_str(), warp, mask,
                msg.c_str());
      abort_launch();
    }
    // Metal's rule (mask 0): a SIMD-group function runs with the lanes active at that point, so lanes
    // reaching it from different places took different branches; hardware would run separate groups.
    if (mask == 0 && std::strcmp(members[i]->site, members[0]->site) != 0) {
      std::string msg = census();
      set_error("%s: lanes of SIMD-group %u reach %s at different places (divergent control flow): %s", where().c_str(),
                warp, what, msg.c_str());
      abort_launch();
    }
  }
  for (size_t i = 0; i < n; ++i) {
    char* out = static_cast<char*>(members[i]->out);
    std::memset(out, 0, ws * nbytes);
    for (size_t j = 0; j < n; ++j) {
      size_t lane_j = members[j]->info.lane;
      std::memcpy(out + lane_j * nbytes, members[j]->in, nbytes);
    }
  }
  for (size_t i = 0; i < n; ++i) members[i]->state = State::Ready;
}

void lane_exited() {
  Launch& L = *g_launch;
  Lane& l = me();
  l.state = State::Done;
  --L.live;
  if (L.at_barrier > 0 && L.at_barrier == L.live) release_barrier();
  // A collective that names this lane can now never complete.
  const size_t ws = L.cfg->warp_size;
  const size_t base = static_cast<size_t>(l.info.warp) * ws;
  for (size_t k = 0; k < l.info.warp_lanes; ++k) {
    Lane& o = L.lanes[base + k];
    if (o.state == State::Collective && (o.mask == 0 || (o.mask >> l.info.lane & 1u)))
      try_complete_collective(o.info.warp, o.mask);
  }
}

void trampoline() {
  Launch& L = *g_launch;
  switch_end(nullptr, &L.sched_bottom, &L.sched_size);
  L.on_lane_stack = true;
  L.body(L.ctx);
  lane_exited();
  L.on_lane_stack = false;
  switch_begin(nullptr, L.sched_bottom, L.sched_size);  // this lane's stack is done with
  _longjmp(L.sched, 1);
}

// ---- faults ----
struct sigaction g_old[3];
const int kSignals[3] = {SIGSEGV, SIGBUS, SIGFPE};
stack_t g_old_alt;
char* g_alt = nullptr;
constexpr size_t kAltSize = 1 << 16;

std::string describe_address(const char* addr, const char* access) {
  char buf[512];
  if (g_launch && g_stacks) {
    size_t per = g_stack_bytes + page_size();
    if (addr >= g_stacks && addr < g_stacks + g_stack_count * per &&
        static_cast<size_t>(addr - g_stacks) % per < page_size())
      return "lane stack overflow (a kernel's local arrays are too large; raise BNB_EMU_STACK_KB)";
  }
  // The faulting address is attributed to the nearest kernel buffer (within 64 MiB): a guard page
  // touches each buffer's end, and an index gone wrong usually lands close to its buffer.
  const Region* best = nullptr;
  size_t best_dist = size_t{64} << 20;
  bool after = false;
  for (const Region& r : g_regions) {
    const char* end = r.begin + r.size;
    if (addr >= end && static_cast<size_t>(addr - end) < best_dist) {
      best = &r;
      best_dist = static_cast<size_t>(addr - end);
      after = true;
    } else if (addr < r.begin && static_cast<size_t>(r.begin - addr) < best_dist) {
      best = &r;
      best_dist = static_cast<size_t>(r.begin - addr);
      after = false;
    }
  }
  if (best && after)
    std::snprintf(buf, sizeof buf, "out-of-bounds %s near buffer '%s' (+%zu bytes past its end; it has %zu bytes)",
                  access, best->name.c_str(), best_dist, best->size);
  else if (best)
    std::snprintf(buf, sizeof buf, "out-of-bounds %s near buffer '%s' (%zu bytes before its start)", access,
                  best->name.c_str(), best_dist);
  else
    std::snprintf(buf, sizeof buf, "invalid memory %s at %p (not near any kernel buffer)", access,
                  static_cast<const void*>(addr));
  return buf;
}

// Set by the launching thread when the launch ran past BNB_EMU_TIMEOUT; the worker is then sent kTimeoutSignal.
std::atomic<bool> g_timed_out{false};
double g_timeout_s = 0;
constexpr int kTimeoutSignal = SIGUSR2;

void on_timeout(int, siginfo_t*, void*) {
  // The handler stays installed after a launch (a late signal must never kill the process), so check
  // that this thread is a launch's worker that was told to stop.
  if (!g_launch || !g_timed_out.load() || !g_launch->in_grid) return;
  set_error(
      "%s: the launch did not finish within %g s (BNB_EMU_TIMEOUT): a lane loops without reaching a barrier "
      "or collective (spinning on a value another block or lane writes? blocks run one after another here)",
      where().c_str(), g_timeout_s);
  abort_launch();
}

void on_fault(int sig, siginfo_t* info, void* uctx) {
  (void)uctx;
  const char* access = "access";
#if defined(__x86_64__)
  // The page-fault error code says whether the access was a write.
  if (sig == SIGSEGV) access = (static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0 ? "write" : "read";
#endif
  std::string what;
  if (sig == SIGFPE)
    what = "arithmetic exception (integer division by zero?)";
  else
    what = describe_address(static_cast<const char*>(info->si_addr), access);
  set_error("%s: %s", where().c_str(), what.c_str());
  abort_launch();
}

bool install_handlers() {
  if (!g_alt) {
    g_alt = static_cast<char*>(std::malloc(kAltSize));
    if (!g_alt) return false;
  }
  stack_t ss{};
  ss.ss_sp = g_alt;
  ss.ss_size = kAltSize;
  ss.ss_flags = 0;
  sigaltstack(&ss, &g_old_alt);
  struct sigaction sa{};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &g_old[i]);
  sa.sa_sigaction = on_timeout;
  sigaction(kTimeoutSignal, &sa, nullptr);
  return true;
}

void restore_handlers() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &g_old[i], nullptr);
  sigaltstack(&g_old_alt, nullptr);
}

// Runs one block to completion (or aborts the launch).
void run_block(Launch& L) {
  const LaunchConfig& c = *L.cfg;
  const size_t n = L.lanes.size();
  const size_t per = g_stack_bytes + page_size();
  for (size_t i = 0; i < n; ++i) {
    Lane& l = L.lanes[i];
    l.info.group = L.group;
    l.state = State::Ready;
    l.started = false;
    l.sum_out = nullptr;
    l.stack = g_stacks + i * per + page_size();
  }
  L.live = n;
  L.at_barrier = 0;
  if (L.shared) L.shared->fill(kPoison);
  (void)c;
  while (L.live > 0) {
    bool progressed = false;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = L.reverse ? n - 1 - k : k;
      Lane& l = L.lanes[i];
      if (l.state != State::Ready) continue;
      progressed = true;
      L.current = i;
      L.in_lane = true;
      if (!_setjmp(L.sched)) {
        switch_begin(&L.sched_fake, l.stack, g_stack_bytes);
        if (!l.started) {
          l.started = true;
          getcontext(&l.uc);
          l.uc.uc_stack.ss_sp = l.stack;
          l.uc.uc_stack.ss_size = g_stack_bytes;
          l.uc.uc_link = nullptr;
          makecontext(&l.uc, trampoline, 0);
          setcontext(&l.uc);
        } else {
          _longjmp(l.jb, 1);
        }
      }
      switch_end(L.sched_fake, nullptr, nullptr);
      L.in_lane = false;
    }
    if (!progressed) {
      std::string msg = census();
      set_error("%s: deadlock, no lane can continue: %s", where().c_str(), msg.c_str());
      abort_launch();
    }
  }
}

int run_grid(Launch& L) {
  const LaunchConfig& cfg = *L.cfg;
  if (!install_handlers()) {
    set_error("bnb_emu: could not allocate the signal stack");
    return 1;
  }
  int rc = 0;
  if (sigsetjmp(L.abort_jb, 1) == 0) {
    L.in_grid = true;
    for (uint32_t z = 0; z < cfg.grid.z; ++z)
      for (uint32_t y = 0; y < cfg.grid.y; ++y)
        for (uint32_t x = 0; x < cfg.grid.x; ++x) {
          L.group = Dim3{x, y, z};
          run_block(L);
        }
  } else {
    rc = 1;
    if (L.on_lane_stack) {  // aborted from a lane (or a signal taken on one): back on the worker's stack
      switch_end(L.sched_fake, nullptr, nullptr);
      L.on_lane_stack = false;
    }
#ifdef BNB_EMU_ASAN
    // The abandoned lanes' frames leave their redzones poisoned; the next launch reuses these stacks.
    ASAN_UNPOISON_MEMORY_REGION(g_stacks, g_stack_count * (g_stack_bytes + page_size()));
#endif
  }
  L.in_grid = false;
  restore_handlers();
  return rc;
}

}  // namespace

// ---- public API ----

const LaunchConfig& config() { return *g_launch->cfg; }
const LaneInfo& lane() { return g_launch->lanes[g_launch->current].info; }
uint32_t warp_mask() {
  uint32_t n = lane().warp_lanes;
  return n >= 32 ? 0xffffffffu : ((1u << n) - 1u);
}
void* dynamic_shared() { return g_launch->shared ? g_launch->shared->data() : nullptr; }

const char* last_error() { return g_error; }

void set_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_error, sizeof g_error, fmt, ap);
  va_end(ap);
}

void fail(const char* fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!g_launch) {
    set_error("%s", msg);
    std::fprintf(stderr, "bnb_emu: %s (outside a launch)\n", msg);
    std::abort();
  }
  set_error("%s: %s", where().c_str(), msg);
  abort_launch();
}

void barrier(const char* site, const char* what) {
  if (!g_launch || !g_launch->in_lane) fail("%s called outside a kernel", what);
  Launch& L = *g_launch;
  Lane& l = me();
  l.state = State::Barrier;
  l.site = site;
  l.what = what;
  l.value = 0;
  ++L.at_barrier;
  if (L.at_barrier == L.live) release_barrier();
  yield_lane();
}

uint64_t barrier_sum(const char* site, const char* what, uint32_t value) {
  if (!g_launch || !g_launch->in_lane) fail("%s called outside a kernel", what);
  Launch& L = *g_launch;
  Lane& l = me();
  uint64_t sum = 0;
  l.state = State::Barrier;
  l.site = site;
  l.what = what;
  l.value = value;
  l.sum_out = &sum;
  ++L.at_barrier;
  if (L.at_barrier == L.live) release_barrier();
  yield_lane();
  return sum;
}

void warp_exchange(const char* site, const char* what, uint32_t member_mask, const void* in, void* out, size_t nbytes) {
  if (!g_launch || !g_launch->in_lane) fail("%s called outside a kernel", what);
  Lane& l = me();
  if (nbytes == 0 || nbytes > kMaxExchange)
    fail("%s at %s: a lane value of %zu bytes (at most %zu)", what, site, nbytes, kMaxExchange);
  if (member_mask != 0 && !(member_mask >> l.info.lane & 1u))
    fail("%s at %s: mask 0x%08x does not include the calling lane %u", what, site, member_mask, l.info.lane);
  uint32_t exists = warp_mask();
  if (member_mask & ~exists)
    fail("%s at %s: mask 0x%08x names lanes that do not exist in this warp (it has %u lanes)", what, site, member_mask,
         l.info.warp_lanes);
  l.state = State::Collective;
  l.site = site;
  l.what = what;
  l.mask = member_mask;
  l.in = in;
  l.out = out;
  l.nbytes = nbytes;
  try_complete_collective(l.info.warp, member_mask);
  yield_lane();
}

int launch(const LaunchConfig& cfg, KernelBody body, void* ctx) {
  g_error[0] = 0;
  if (g_launch) {
    set_error("kernel '%s': a launch from inside a launch is not supported", cfg.kernel);
    return 1;
  }
  const size_t threads = static_cast<size_t>(cfg.block.x) * cfg.block.y * cfg.block.z;
  const size_t blocks = static_cast<size_t>(cfg.grid.x) * cfg.grid.y * cfg.grid.z;
  if (cfg.warp_size == 0 || cfg.warp_size > 32) {
    set_error("kernel '%s': warp size %u is not in 1..32", cfg.kernel, cfg.warp_size);
    return 1;
  }
  if (threads == 0 || threads > 1024) {
    set_error("kernel '%s': %zu threads per block (block (%u,%u,%u)); must be 1..1024", cfg.kernel, threads,
              cfg.block.x, cfg.block.y, cfg.block.z);
    return 1;
  }
  if (blocks == 0) return 0;  // an empty grid runs nothing, as on hardware for a zero-size launch
  if (!ensure_stacks(threads)) return 1;

  Launch L;
  L.cfg = &cfg;
  L.body = body;
  L.ctx = ctx;
  L.lanes.resize(threads);
  for (size_t i = 0; i < threads; ++i) {
    LaneInfo& in = L.lanes[i].info;
    in.thread.x = static_cast<uint32_t>(i % cfg.block.x);
    in.thread.y = static_cast<uint32_t>(i / cfg.block.x % cfg.block.y);
    in.thread.z = static_cast<uint32_t>(i / (static_cast<size_t>(cfg.block.x) * cfg.block.y));
    in.linear = static_cast<uint32_t>(i);
    in.warp = static_cast<uint32_t>(i / cfg.warp_size);
    in.lane = static_cast<uint32_t>(i % cfg.warp_size);
    size_t warp_start = static_cast<size_t>(in.warp) * cfg.warp_size;
    size_t left = threads - warp_start;
    in.warp_lanes = static_cast<uint32_t>(left < cfg.warp_size ? left : cfg.warp_size);
  }
  GuardedBuffer shared;
  if (cfg.dynamic_shared > 0) {
    if (!shared.allocate("dynamic shared memory", nullptr, cfg.dynamic_shared)) return 1;
    L.shared = &shared;
  }

  // Each launch runs on a fresh host thread: the shims keep static __shared__ arrays thread_local, so
  // every launch starts them zeroed, whatever an earlier launch left there (determinism across runs).
  // A lane that spins forever (waiting on another block, which never runs concurrently here) would hang
  // the process; past BNB_EMU_TIMEOUT seconds (default 120, 0 = never) the worker is interrupted.
  const char* env = std::getenv("BNB_EMU_TIMEOUT");
  g_timeout_s = env ? std::strtod(env, nullptr) : 120.0;
  // The other fixed lane order: a race that one order hides, the other usually shows.
  const char* order = std::getenv("BNB_EMU_ORDER");
  L.reverse = order && std::strcmp(order, "reverse") == 0;
  if (order && *order && !L.reverse && std::strcmp(order, "forward") != 0) {
    set_error("kernel '%s': BNB_EMU_ORDER must be 'forward' or 'reverse', got '%s'", cfg.kernel, order);
    return 1;
  }
  g_timed_out = false;
  g_launch = &L;
  int rc = 0;
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread worker([&]() {
    int r = run_grid(L);
    std::lock_guard<std::mutex> lock(m);
    rc = r;
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(m);
    if (g_timeout_s > 0) {
      auto limit = std::chrono::duration<double>(g_timeout_s);
      if (!cv.wait_for(lock, limit, [&] { return done; })) {
        g_timed_out = true;
        pthread_kill(worker.native_handle(), kTimeoutSignal);
      }
    }
    cv.wait(lock, [&] { return done; });
  }
  worker.join();
  g_timed_out = false;
  g_launch = nullptr;
  if (rc == 0 && L.shared && !shared.check_canary(cfg.kernel)) rc = 1;
  return rc;
}

// ---- guarded buffers ----

void register_region(const void* begin, size_t nbytes, const char* name) {
  g_regions.push_back(Region{static_cast<const char*>(begin), nbytes, name ? name : "?"});
}

void unregister_region(const void* begin) {
  for (size_t i = 0; i < g_regions.size(); ++i)
    if (g_regions[i].begin == begin) {
      g_regions.erase(g_regions.begin() + static_cast<long>(i));
      return;
    }
}

GuardedBuffer::~GuardedBuffer() {
  if (map_) {
    unregister_region(data_);
    munmap(map_, map_size_);
  }
}

// Each guard is this much inaccessible address space (no memory behind it), so a stray index up to 64 KiB
// beyond either end faults for certain; a one-page guard let far strays land in whatever mapping
// happened to sit next to it, silently.
static size_t guard_bytes() { return round_up(size_t{64} << 10, page_size()); }

bool GuardedBuffer::allocate(const char* name, const void* src, size_t nbytes) {
  std::snprintf(name_, sizeof name_, "%s", name ? name : "?");
  const size_t pg = page_size();
  const size_t guard = guard_bytes();
  // [guard][.. canary | data | canary (< 16 bytes)][guard]: the data's end touches the second guard
  // up to the slack that 16-byte alignment of its start leaves.
  const size_t body = round_up(nbytes + kAlign, pg);
  map_size_ = body + 2 * guard;
  void* m = mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    map_ = nullptr;
    set_error("bnb_emu: could not map %zu bytes for buffer '%s'", nbytes, name_);
    return false;
  }
  map_ = static_cast<char*>(m);
  mprotect(map_, guard, PROT_NONE);
  mprotect(map_ + guard + body, guard, PROT_NONE);
  char* end = map_ + guard + body;
  data_ = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(end - nbytes) & ~(uintptr_t)(kAlign - 1));
  size_ = nbytes;
  std::memset(map_ + guard, kCanary, body);
  if (src && nbytes)
    std::memcpy(data_, src, nbytes);
  else if (nbytes)
    std::memset(data_, kPoison, nbytes);
  register_region(data_, nbytes, name_);
  return true;
}

void GuardedBuffer::fill(unsigned char byte) {
  if (data_ && size_) std::memset(data_, byte, size_);
}

bool GuardedBuffer::check_canary(const char* kernel) const {
  if (!map_) return true;
  const size_t guard = guard_bytes();
  const char* lo = map_ + guard;
  const char* hi = map_ + map_size_ - guard;
  for (const char* p = lo; p < data_; ++p)
    if (static_cast<unsigned char>(*p) != kCanary) {
      set_error("kernel '%s': out-of-bounds write before buffer '%s' (%zu bytes before its start)", kernel, name_,
                static_cast<size_t>(data_ - p));
      return false;
    }
  for (const char* p = data_ + size_; p < hi; ++p)
    if (static_cast<unsigned char>(*p) != kCanary) {
      set_error("kernel '%s': out-of-bounds write near buffer '%s' (+%zu bytes past its end; it has %zu bytes)", kernel,
                name_, static_cast<size_t>(p - (data_ + size_)), size_);
      return false;
    }
  return true;
}

bool check_arg(const char* kernel, size_t index, const Arg& a, ArgKind want, size_t value_bytes) {
  static const char* names[] = {"a buffer (tensor)", "an integer", "a float", "bytes"};
  if (a.kind != want) {
    const char* got = (a.kind >= 0 && a.kind <= 3) ? names[a.kind] : "an unknown kind";
    set_error("kernel '%s': argument %zu must be %s, got %s", kernel, index, names[want], got);
    return false;
  }
  if (want == ARG_BUFFER && (a.nbytes < 0 || (a.nbytes > 0 && !a.ptr))) {
    set_error("kernel '%s': argument %zu: a buffer of %lld bytes without data", kernel, index,
              static_cast<long long>(a.nbytes));
    return false;
  }
  if (want == ARG_BYTES && (static_cast<size_t>(a.nbytes) != value_bytes || !a.ptr)) {
    set_error("kernel '%s': argument %zu is a %zu-byte struct, got %lld bytes", kernel, index, value_bytes,
              static_cast<long long>(a.nbytes));
    return false;
  }
  return true;
}

bool stage_buffers(const char* kernel, const Arg* args, const ArgKind* kinds, size_t n, GuardedBuffer* buffers) {
  (void)kernel;
  for (size_t i = 0; i < n; ++i) {
    if (kinds[i] != ARG_BUFFER) continue;
    if (!args[i].ptr && args[i].nbytes == 0) continue;  // None: the kernel gets a null pointer
    char name[64];
    if (args[i].name && args[i].name[0])
      std::snprintf(name, sizeof name, "%s", args[i].name);
    else
      std::snprintf(name, sizeof name, "argument %zu", i);
    if (!buffers[i].allocate(name, args[i].ptr, static_cast<size_t>(args[i].nbytes))) return false;
  }
  return true;
}

bool unstage_buffers(const char* kernel, const Arg* args, const bool* readonly, size_t n,
                     const GuardedBuffer* buffers) {
  for (size_t i = 0; i < n; ++i) {
    if (args[i].kind != ARG_BUFFER) continue;
    if (!buffers[i].check_canary(kernel)) return false;
  }
  for (size_t i = 0; i < n; ++i) {
    if (args[i].kind != ARG_BUFFER || readonly[i] || args[i].nbytes <= 0) continue;
    std::memcpy(args[i].ptr, buffers[i].data(), static_cast<size_t>(args[i].nbytes));
  }
  return true;
}

}  // namespace bnb_emu

// The error of the last failed call, for the Python loader.
BNB_EMU_EXPORT_C const char* bnb_emu_last_error() { return bnb_emu::last_error(); }
