// A small persistent thread pool behind bnb::parallel_for. It is our own (not OpenMP) so that the
// extension never loads a second OpenMP runtime beside torch's; the caller passes the thread count
// (torch.get_num_threads()) on every call, so torch.set_num_threads() is honoured.
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

struct Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t begin, end;
  struct Batch* batch;
};

struct Batch {
  std::mutex mu;
  std::condition_variable done;
  int pending;
  std::exception_ptr error;
};

thread_local bool in_worker = false;

class Pool {
 public:
  void run(std::vector<Job>& jobs) {
    ensure_workers(int(jobs.size()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& j : jobs) queue_.push_back(j);
    }
    cv_.notify_all();
  }

 private:
  void ensure_workers(int wanted) {
    std::lock_guard<std::mutex> lock(mu_);
    while (int(workers_.size()) < wanted) {
      workers_.emplace_back([this] { loop(); });
      workers_.back().detach();  // never joined: they live as long as the process
    }
  }

  void loop() {
    in_worker = true;
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        job = queue_.front();
        queue_.pop_front();
      }
      execute(job);
    }
  }

 public:
  static void execute(const Job& job) {
    std::exception_ptr error;
    try {
      (*job.fn)(job.begin, job.end);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(job.batch->mu);
    if (error && !job.batch->error) job.batch->error = error;
    if (--job.batch->pending == 0) job.batch->done.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
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

}  // namespace

void parallel_for(int64_t n, int64_t grain, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t chunks = (n + grain - 1) / grain;
  if (threads < 1) threads = 1;
  if (chunks > threads) chunks = threads;
  if (chunks <= 1 || in_worker) {
    fn(0, n);
    return;
  }
  // Equal contiguous ranges, each a multiple of `grain` except the last.
  int64_t per = ((n + chunks - 1) / chunks + grain - 1) / grain * grain;
  Batch batch;
  std::vector<Job> jobs;
  for (int64_t b = per; b < n; b += per) jobs.push_back({&fn, b, b + per < n ? b + per : n, &batch});
  batch.pending = int(jobs.size()) + 1;
  pool().run(jobs);
  Pool::execute({&fn, 0, per < n ? per : n, &batch});
  std::unique_lock<std::mutex> lock(batch.mu);
  batch.done.wait(lock, [&] { return batch.pending == 0; });
  if (batch.error) std::rethrow_exception(batch.error);
}

}  // namespace bnb
