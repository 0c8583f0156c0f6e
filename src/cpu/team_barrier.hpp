// A barrier for the threads of one OpenMP team that spins briefly, then
// sleeps.
//
// Why not `#pragma omp barrier` or a worksharing loop's closing barrier:
// libgomp's waiting threads spin for milliseconds (GOMP_SPINCOUNT) unless
// OMP_WAIT_POLICY=passive, which a library cannot set (the runtime reads it
// once, and torch loads it first). On the H100's host with 16 threads the
// forward at 4,8,1024,64 ran 1.42x (fp32) and 1.63x (bf16) faster with
// OMP_WAIT_POLICY=passive, torch not at all: the spinning of the threads
// that had finished a step took CPU time from those still working
// (dev/cpu_tuning.md, "Session 22"). Here a waiting thread spins for
// spin_microseconds(), which covers a well-balanced step's stragglers, then
// blocks on a condition variable.
//
// Every thread of the team calls arrive_and_wait() the same number of times.
// Writes made before a thread arrives are visible to every thread after it
// leaves (each arrival releases, the last one acquires them all and releases
// the new generation, which the waiters acquire).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace flashattn {
namespace cpu {

inline void spin_pause() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// FLASHATTN_CPU_SPIN_US: how long a waiting thread spins before it sleeps,
// read per call so that bench/cpu_ab.py can time several values in one
// process. Unset: 200 us (20 us measured 1-3 % slower at 2 threads, where
// a wake-up is not small against a step).
inline int spin_microseconds() {
  const char* value = std::getenv("FLASHATTN_CPU_SPIN_US");
  return value == nullptr ? 200 : std::max(0, std::atoi(value));
}

class TeamBarrier {
 public:
  // Each thread of the team, at the top of the parallel region, with the
  // region's omp_get_num_threads() (all pass the same value, and each before
  // its first arrival).
  void join(int threads) { threads_.store(threads, std::memory_order_relaxed); }

  void arrive_and_wait() {
    const uint32_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_.load(std::memory_order_relaxed)) {
      arrived_.store(0, std::memory_order_relaxed);
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        generation_.store(generation + 1, std::memory_order_release);
      }
      wake_.notify_all();
      return;
    }
    const auto passed = [&] { return generation_.load(std::memory_order_acquire) != generation; };
    const auto deadline = std::chrono::steady_clock::now() + spin_;
    for (int round = 0;; ++round) {
      if (passed()) return;
      spin_pause();
      if (round % 64 == 63 && std::chrono::steady_clock::now() > deadline) break;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait(lock, passed);
  }

 private:
  const std::chrono::microseconds spin_{spin_microseconds()};
  std::atomic<int> threads_{1};
  std::atomic<int> arrived_{0};
  std::atomic<uint32_t> generation_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace cpu
}  // namespace flashattn
