// What the tile unit costs next to the vector units, on one core: the
// measurements behind the AMX forward's plain-tile pipeline (dev/cpu_tuning.md,
// "Session 18"). Not part of the build; on a Linux machine with AMX-BF16:
//   g++ -O2 -mamx-tile -mamx-bf16 -mavx512f -mavx512bw -mavx512dq -mavx512bf16
//       dev/amx_microbench.cpp -o /tmp/amx_microbench (one line), then run it.
// Prints ns per unit of work, best of 5 repetitions:
//   1. a 2 x 2 block of 8 TDPBF16PS (k = 64) with and without its tile loads and
//      C stores, an exp2-and-pack chunk of the softmax (16 rows of 16 lanes), and
//      the two interleaved per block and per product;
//   2. one tile load per product from buffers of growing size (L1, then L2).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
  TileConfig() {
    for (int t = 0; t < 8; ++t) {
      bytes_per_row[t] = 64;
      rows[t] = 16;
    }
  }
};

alignas(64) uint16_t a_tiles[8][512], b_tiles[8][512];
alignas(64) float c_tiles[16][256];
alignas(64) float scores[128 * 32];
alignas(64) uint32_t packed[64 * 32];
bool with_loads = true, with_stores = true;
float sink;

template <class Work>
double best_seconds(Work work) {
  double best = 1e30;
  for (int repetition = 0; repetition < 5; ++repetition) {
    const auto start = std::chrono::steady_clock::now();
    work();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// The A and B tiles of one 32-wide k step (tiles 4-7), from four rotating sets.
void load_operands(long step) {
  const int set = static_cast<int>(step & 3);
  _tile_loadd(4, a_tiles[2 * set], 64);
  _tile_loadd(5, a_tiles[2 * set + 1], 64);
  _tile_loadd(6, b_tiles[2 * set], 64);
  _tile_loadd(7, b_tiles[2 * set + 1], 64);
}

void block_begin() {
  if (!with_stores) return;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

void block_end(long block) {
  if (!with_stores) return;
  float* c = c_tiles[(block & 3) * 4];
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
}

// exp2 as the plain tile computes it (exp2_unmasked_ps, degree 3).
__m512 exp2_reduced(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-125.0f), x);
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(7.7058047e-2f), f, _mm512_set1_ps(2.2764558e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9512290e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, x);
}

// `count` pairs of score rows: exp2, column sums, packed as bf16 pairs.
__m512 softmax_pairs(int first_pair, int count, __m512 total) {
  const __m512 factor = _mm512_set1_ps(0.18f), subtrahend = _mm512_set1_ps(1.0f);
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int t = 0; t < count; ++t) {
    const int pair = (first_pair + t) & 63;
    const __m512 p0 = exp2_reduced(_mm512_fmsub_ps(_mm512_load_ps(scores + 2 * pair * 32), factor, subtrahend));
    const __m512 p1 = exp2_reduced(_mm512_fmsub_ps(_mm512_load_ps(scores + (2 * pair + 1) * 32), factor, subtrahend));
    total = _mm512_add_ps(total, _mm512_add_ps(p0, p1));
    _mm512_store_si512(packed + pair * 16,
                       _mm512_permutexvar_epi16(order, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0))));
  }
  return total;
}

void interleaving(long blocks) {
  const auto products = [](long block, __m512* total, int pairs_between) {
    block_begin();
    for (int l = 0; l < 2; ++l) {
      if (with_loads) load_operands(2 * block + l);
      _tile_dpbf16ps(0, 4, 6);
      if (total) *total = softmax_pairs(static_cast<int>(block * 8 + 4 * l), pairs_between, *total);
      _tile_dpbf16ps(1, 4, 7);
      if (total) *total = softmax_pairs(static_cast<int>(block * 8 + 4 * l + 1), pairs_between, *total);
      _tile_dpbf16ps(2, 5, 6);
      if (total) *total = softmax_pairs(static_cast<int>(block * 8 + 4 * l + 2), pairs_between, *total);
      _tile_dpbf16ps(3, 5, 7);
      if (total) *total = softmax_pairs(static_cast<int>(block * 8 + 4 * l + 3), pairs_between, *total);
    }
    block_end(block);
  };
  for (int mode = 0; mode < 3; ++mode) {
    with_loads = mode != 1;
    with_stores = mode == 0;
    const double tiles = best_seconds([&] {
      for (long block = 0; block < blocks; ++block) products(block, nullptr, 0);
    });
    const double vector = best_seconds([&] {
      __m512 total = _mm512_setzero_ps();
      for (long block = 0; block < blocks; ++block) total = softmax_pairs(static_cast<int>(block * 8), 8, total);
      sink += _mm512_reduce_add_ps(total);
    });
    const double per_block = best_seconds([&] {
      __m512 total = _mm512_setzero_ps();
      for (long block = 0; block < blocks; ++block) {
        products(block, nullptr, 0);
        total = softmax_pairs(static_cast<int>(block * 8), 8, total);
      }
      sink += _mm512_reduce_add_ps(total);
    });
    const double per_product = best_seconds([&] {
      __m512 total = _mm512_setzero_ps();
      for (long block = 0; block < blocks; ++block) products(block, &total, 1);
      sink += _mm512_reduce_add_ps(total);
    });
    const double scale = 1e9 / static_cast<double>(blocks);
    std::printf("block of 8 products (loads %d, C stores %d): %.1f ns; 16 exp2 rows: %.1f ns; sum %.1f; "
                "interleaved per block %.1f, per product %.1f\n",
                with_loads, with_stores, tiles * scale, vector * scale, (tiles + vector) * scale, per_block * scale,
                per_product * scale);
  }
}

void load_sources() {
  for (const long kib : {16L, 32L, 64L, 256L, 1024L}) {
    std::vector<uint16_t> a(kib * 512, 0x3f80), b(kib * 512, 0x3f80);
    for (int stores = 0; stores < 2; ++stores) {
      const long products = 2000000;
      const double seconds = best_seconds([&] {
        long tile = 0;
        for (long block = 0; block < products / 8; ++block) {
          if (stores) block_begin();
          for (int l = 0; l < 2; ++l, tile += 2) {
            _tile_loadd(4, &a[(tile % kib) * 512], 64);
            _tile_loadd(5, &a[((tile + 1) % kib) * 512], 64);
            _tile_loadd(6, &b[(tile % kib) * 512], 64);
            _tile_loadd(7, &b[((tile + 1) % kib) * 512], 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
          if (stores) block_end(block);
        }
      });
      std::printf("one tile load per product, A and B %4ld KiB each, C stores %d: %.2f ns per product\n", kib, stores,
                  seconds / static_cast<double>(products) * 1e9);
    }
  }
}

}  // namespace

int main() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    std::puts("no AMX tile state granted");
    return 1;
  }
  const TileConfig config;
  _tile_loadconfig(&config);
  for (int i = 0; i < 8 * 512; ++i) {
    a_tiles[i / 512][i % 512] = 0x3f80;  // bf16 1.0
    b_tiles[i / 512][i % 512] = 0x3f80;
  }
  for (int i = 0; i < 128 * 32; ++i) scores[i] = static_cast<float>(i % 97) * 0.1f;
  interleaving(400000);
  with_stores = true;
  load_sources();
  _tile_release();
  std::printf("(%g)\n", static_cast<double>(sink));
  return 0;
}
