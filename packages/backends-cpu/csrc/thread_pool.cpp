// A small persistent thread pool behind bnb::parallel_for. It is our own (not OpenMP) so that the
// extension never loads a second OpenMP runtime beside torch's; the caller passes the thread count
// (torch.get_num_threads()) on every call, so torch.set_num_threads() is honoured.
//
// Work is cut into more chunks than threads and claimed dynamically; the caller claims chunks too and
// only waits for chunks that a worker has actually started. So a worker that is slow to wake (torch's
// OpenMP threads keep spinning for a while after each torch op and compete for the same cores) costs
// at most the chunk it holds, never the whole call.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <pthread.h>
#include <unistd.h>
#endif

#include "common.h"

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

thread_local bool in_worker = false;

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

#if !defined(_WIN32)
void forget_pool_in_child() {
  g_pool.store(nullptr);
  g_pool_mu = new std::mutex();
}
const bool g_atfork_registered = pthread_atfork(nullptr, nullptr, forget_pool_in_child) == 0;
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

}  // namespace

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
  pool().post(batch, int(std::min<int64_t>(threads - 1, batch->chunks - 1)));
  batch->work();
  if (batch->done.load(std::memory_order_acquire) != batch->chunks) {
    std::unique_lock<std::mutex> lock(batch->mu);
    batch->finished.wait(lock, [&] { return batch->done.load(std::memory_order_acquire) == batch->chunks; });
  }
  if (batch->error) std::rethrow_exception(batch->error);
}

}  // namespace bnb
