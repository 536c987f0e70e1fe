//===- ThreadPool.cpp - Persistent worker pool behind parallelFor --------===//
//
// One process-wide pool. A job is a fixed list of chunks; workers and the
// caller take chunks from an atomic counter, and the caller waits until every
// worker has checked out of the job before returning, so a later job can
// never be confused with this one.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/ThreadPool.h"
#include "runtime/cpu/CpuKernels.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace dlopt::rt::cpu {
namespace {

thread_local bool inPoolWorker = false;

class ThreadPool {
public:
  explicit ThreadPool(int numThreads) : numThreads_(std::max(1, numThreads)) {
    for (int i = 1; i < numThreads_; ++i)
      workers_.emplace_back([this] { workerLoop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wakeCv_.notify_all();
    for (std::thread &t : workers_)
      t.join();
  }
  int numThreads() const { return numThreads_; }

  /// Runs chunk(c) for c in [0, numChunks) on the pool and the caller.
  void run(int64_t numChunks, const std::function<void(int64_t)> &chunk) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      chunk_ = &chunk;
      numChunks_ = numChunks;
      next_.store(0, std::memory_order_relaxed);
      active_ = int(workers_.size());
      ++generation_;
    }
    wakeCv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mu_);
    doneCv_.wait(lock, [this] { return active_ == 0; });
    chunk_ = nullptr;
  }

private:
  void drain() {
    for (;;) {
      int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
      if (c >= numChunks_)
        return;
      (*chunk_)(c);
    }
  }

  void workerLoop() {
    inPoolWorker = true;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        wakeCv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_)
          return;
        seen = generation_;
      }
      drain();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--active_ == 0)
          doneCv_.notify_one();
      }
    }
  }

  int numThreads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wakeCv_, doneCv_;
  const std::function<void(int64_t)> *chunk_ = nullptr;
  int64_t numChunks_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

/// Guards the pool pointer and serializes jobs: a caller that finds the pool
/// busy runs its loop serially instead of waiting.
std::mutex poolMu;
std::unique_ptr<ThreadPool> pool;
std::atomic<int> requestedThreads{0}; // 0: hardware concurrency

int defaultThreads() {
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : int(hc);
}

} // namespace

void setNumThreads(int n) {
  std::lock_guard<std::mutex> lock(poolMu);
  requestedThreads = n < 1 ? 0 : n;
  pool.reset();
}

int numThreads() {
  int n = requestedThreads.load();
  return n > 0 ? n : defaultThreads();
}

void parallelFor(int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0)
    return;
  grain = std::max<int64_t>(grain, 1);
  if (n <= grain || inPoolWorker) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(poolMu, std::try_to_lock);
  if (!lock.owns_lock()) {
    fn(0, n);
    return;
  }
  int threads = numThreads();
  if (threads <= 1) {
    lock.unlock();
    fn(0, n);
    return;
  }
  if (!pool || pool->numThreads() != threads)
    pool = std::make_unique<ThreadPool>(threads);
  int64_t numChunks = std::min<int64_t>((n + grain - 1) / grain, threads);
  if (numChunks <= 1) {
    lock.unlock();
    fn(0, n);
    return;
  }
  pool->run(numChunks, [&](int64_t c) {
    int64_t begin = n * c / numChunks, end = n * (c + 1) / numChunks;
    if (begin < end)
      fn(begin, end);
  });
}

} // namespace dlopt::rt::cpu
