//===- ThreadPool.cpp - Persistent worker pool behind parallelFor --------===//
//
// One process-wide pool. A job is a fixed list of at most `threads` chunks;
// the caller and the workers claim chunks from one atomic word holding the
// job's generation, its next chunk and its chunk count, so a worker that
// arrives late (the job already drained, or replaced by the next one) can
// never run a chunk of the wrong job. The caller returns as soon as every
// chunk has run: it waits only for workers that are inside a chunk, never
// for a sleeping worker to wake up and check out.
//
// Waking a sleeping thread costs tens of microseconds on the dev box (a
// fork-join through a condition variable measured 20 us back to back and
// 58 us after 1 ms of idle; dlopt-bench-cpu-parallel-for), and a small
// model's step runs a few hundred short parallel loops. So an idle worker
// first spins on the job word for kSpinMicros, then sleeps on a futex
// (std::atomic::wait) that the caller only signals when someone sleeps.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/ThreadPool.h"
#include "runtime/cpu/CpuKernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DLOPT_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define DLOPT_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define DLOPT_CPU_RELAX() ((void)0)
#endif

namespace dlopt::rt::cpu {
namespace {

thread_local bool inPoolWorker = false;

/// How long an idle worker spins before it sleeps. Long enough to bridge
/// the host code between two kernels' loops (a few microseconds) and most
/// gaps between instructions; short enough that an idle process gives its
/// cores back within a fraction of a millisecond.
constexpr std::chrono::microseconds kSpinMicros{50};

/// The job word: generation (high 32 bits), next chunk (16), chunk count
/// (16). Chunk counts never exceed the thread count.
constexpr uint64_t kNextOne = uint64_t(1) << 16;
constexpr uint64_t kMaxChunks = (uint64_t(1) << 16) - 1;
inline uint32_t genOf(uint64_t w) { return uint32_t(w >> 32); }
inline uint64_t nextOf(uint64_t w) { return (w >> 16) & 0xffff; }
inline uint64_t countOf(uint64_t w) { return w & 0xffff; }

class ThreadPool {
public:
  explicit ThreadPool(int numThreads)
      : numThreads_(std::clamp(numThreads, 1, int(kMaxChunks))) {
    for (int i = 1; i < numThreads_; ++i)
      workers_.emplace_back([this] { workerLoop(); });
  }
  ~ThreadPool() {
    stop_.store(true);
    wake_.fetch_add(1);
    wake_.notify_all();
    for (std::thread &t : workers_)
      t.join();
  }
  int numThreads() const { return numThreads_; }

  /// Runs chunk(c) for c in [0, numChunks) on the pool and the caller;
  /// numChunks <= numThreads(). One caller at a time (parallelFor's lock).
  void run(int64_t numChunks, const std::function<void(int64_t)> &chunk) {
    chunk_.store(&chunk, std::memory_order_relaxed);
    ++gen_;
    // The seq_cst store publishes chunk_ to whoever claims from this word.
    job_.store((uint64_t(gen_) << 32) | uint64_t(numChunks));
    wake_.fetch_add(1);
    if (sleepers_.load() > 0)
      wake_.notify_all();
    claimAll(gen_);
    // Every chunk is claimed; wait for the ones still running elsewhere. A
    // worker counts itself in running_ before it claims, so one that is not
    // counted here can only find the job drained.
    for (int spins = 0; running_.load() != 0; ++spins) {
      DLOPT_CPU_RELAX();
      if (spins > 256)
        std::this_thread::yield(); // a preempted worker: give it the core
    }
  }

private:
  /// Claims and runs chunks of generation `gen` until none is left.
  void claimAll(uint32_t gen) {
    uint64_t w = job_.load();
    while (genOf(w) == gen && nextOf(w) < countOf(w)) {
      if (job_.compare_exchange_weak(w, w + kNextOne)) {
        // Acquired through the job word: chunk_ is this job's.
        (*chunk_.load(std::memory_order_relaxed))(int64_t(nextOf(w)));
        w = job_.load();
      }
    }
  }

  /// Waits until the job word's generation differs from `seen` or the pool
  /// stops; returns false on stop.
  bool waitForJob(uint32_t seen) {
    auto spinEnd = std::chrono::steady_clock::now() + kSpinMicros;
    for (int i = 0;; ++i) {
      if (stop_.load(std::memory_order_relaxed))
        return false;
      if (genOf(job_.load(std::memory_order_relaxed)) != seen)
        return true;
      DLOPT_CPU_RELAX();
      if ((i & 63) == 63) {
        if (std::chrono::steady_clock::now() >= spinEnd)
          break;
        // A woken worker can land on the core of the thread that woke it
        // (the caller, preempted in notify): let that one run.
        std::this_thread::yield();
      }
    }
    for (;;) {
      sleepers_.fetch_add(1);
      // Read the wake counter before the last look at the job word: a job
      // published after that look bumps the counter, so wait() returns.
      uint32_t w = wake_.load();
      bool idle = !stop_.load() && genOf(job_.load()) == seen;
      if (idle)
        wake_.wait(w);
      sleepers_.fetch_sub(1);
      if (stop_.load())
        return false;
      if (genOf(job_.load()) != seen)
        return true;
    }
  }

  void workerLoop() {
    inPoolWorker = true;
    uint32_t seen = 0;
    while (waitForJob(seen)) {
      running_.fetch_add(1);
      seen = genOf(job_.load());
      claimAll(seen);
      running_.fetch_sub(1);
    }
  }

  int numThreads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> job_{0};
  std::atomic<const std::function<void(int64_t)> *> chunk_{nullptr};
  std::atomic<int> running_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<bool> stop_{false};
  uint32_t gen_ = 0; // the caller's (under parallelFor's lock)
};

/// Guards the pool pointer and serializes jobs: a caller that finds the pool
/// busy runs its loop serially instead of waiting.
std::mutex poolMu;
std::unique_ptr<ThreadPool> pool;
std::atomic<int> requestedThreads{0}; // 0: hardware concurrency

/// The cores this process may run on: its CPU affinity (mpirun and srun
/// bind each rank to its share of a node), else the machine's count.
int defaultThreads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0)
      return n;
  }
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
