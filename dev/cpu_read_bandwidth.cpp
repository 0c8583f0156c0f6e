// What the machine reads in the CPU decode's two access patterns (2 threads):
// a KV cache (S, Hkv = 8, D = 128) bf16, K and V, read one head's rows at a
// time (256 bytes in each 2 KiB, as an item of one kv head does), read
// sequentially (as a group of all kv heads does, src/cpu/kvcache_impl.hpp),
// and read as pages of 16 positions (32 KiB of each tensor) in a shuffled
// order (a paged cache of 16-row pages, as bench/cpu_decode.py --page-size 16).
// Best of 10 passes; prints GB/s of K and V.
//
//   g++ -O2 -mavx512f -fopenmp dev/cpu_read_bandwidth.cpp -o /tmp/read_bw && /tmp/read_bw 131072
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <random>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int64_t positions = argc > 1 ? std::atoll(argv[1]) : 131072;
  constexpr int64_t kHeads = 8, kDim = 128;
  std::vector<uint16_t> k(positions * kHeads * kDim, 1), v(positions * kHeads * kDim, 2);
  constexpr int64_t kPageRows = 16;
  std::vector<int64_t> pages(positions / kPageRows);
  std::iota(pages.begin(), pages.end(), int64_t{0});
  std::shuffle(pages.begin(), pages.end(), std::mt19937(1));
  const char* const kNames[] = {"one head at a time", "sequential", "shuffled pages"};
  for (int pattern = 0; pattern < 3; ++pattern) {
    double best = 1e30;
    int checksum = 0;
    for (int pass = 0; pass < 10; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      __m512i total = _mm512_setzero_si512();
#pragma omp parallel num_threads(2)
      {
        __m512i sum = _mm512_setzero_si512();
        if (pattern == 0) {
#pragma omp for
          for (int64_t h = 0; h < kHeads; ++h)
            for (int64_t s = 0; s < positions; ++s)
              for (int64_t c = 0; c < kDim; c += 32) {
                sum = _mm512_add_epi32(sum, _mm512_loadu_si512(&k[(s * kHeads + h) * kDim + c]));
                sum = _mm512_add_epi32(sum, _mm512_loadu_si512(&v[(s * kHeads + h) * kDim + c]));
              }
        } else if (pattern == 2) {
#pragma omp for
          for (int64_t page = 0; page < static_cast<int64_t>(pages.size()); ++page)
            for (int64_t i = 0; i < kPageRows * kHeads * kDim; i += 32) {
              const int64_t at = pages[page] * kPageRows * kHeads * kDim + i;
              sum = _mm512_add_epi32(sum, _mm512_loadu_si512(&k[at]));
              sum = _mm512_add_epi32(sum, _mm512_loadu_si512(&v[at]));
            }
        } else {
#pragma omp for
          for (int64_t i = 0; i < positions * kHeads * kDim; i += 32) {
            sum = _mm512_add_epi32(sum, _mm512_loadu_si512(&k[i]));
            sum = _mm512_add_epi32(sum, _mm512_loadu_si512(&v[i]));
          }
        }
#pragma omp critical
        total = _mm512_add_epi32(total, sum);
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = seconds < best ? seconds : best;
      checksum += _mm512_reduce_add_epi32(total);  // keeps the loads
    }
    std::printf("%-18s %8.2f ms  %5.1f GB/s  (checksum %d)\n", kNames[pattern], best * 1e3, 2.0 * positions * kHeads * kDim * 2 / best / 1e9, checksum);
  }
}
