// Runs the split-KV decode kernels on the CPU: one std::thread per CUDA thread,
// barriers for __syncthreads and for every warp shuffle, cp.async as a copy,
// exact-size host buffers, built with AddressSanitizer (run.sh). Checks O and
// the LSE against an fp64 reference.
// usage: emu S [page_size (0 = contiguous)] [splits] [kernel: 0 warp, 1 tiles, 2 mma] [H] [Hkv] [rotary]
// rotary 1: q rotated NeoX-style over the first D / 2 dims at each row's position (cache_seqlens).
// Two batch rows: row 0 holds S keys, row 1 S / 3 (so its splits are shorter, some empty). With
// splits > 1 the grid's blocks run in a shuffled order (any block may arrive last at the split
// merge), in two calls on the same workspace, which starts poisoned except for the arrival counters
// (zeroed as the launcher does); the counters must be back at zero after each call.
#include "shim.hpp"
#include "split_kv_mma_host.hpp"
#include "split_kv_tiles_host.hpp"
#include "split_kv_warp_host.hpp"
#include <cstdio>
#include <memory>
#include <random>
using namespace flashattn;
using namespace flashattn::cuda::decode;
using E = __nv_bfloat16;

// One launch of `kernel` over the grid, one block at a time in `order`.
template <class Kernel>
void launch(const std::vector<unsigned>& order, unsigned threads, size_t smem_bytes, Kernel kernel) {
  for (unsigned id : order) {
    const dim3i block_id = {id % emu::grid.x, id / emu::grid.x % emu::grid.y, id / (emu::grid.x * emu::grid.y)};
    std::vector<unsigned char> smem(smem_bytes);
    emu::block_smem = smem.data();
    std::barrier<> bar(threads);
    emu::block_barrier = &bar;
    std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
    for (unsigned w = 0; w < threads / 32; ++w) {
      warp_barriers.emplace_back(new std::barrier<>(32));
      emu::warp_barriers[w] = warp_barriers.back().get();
    }
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        emu::tid = {t, 0, 0};
        emu::bid = block_id;
        kernel();
      });
    for (auto& th : pool) th.join();
  }
}

int main(int argc, char** argv) {
  const int S = argc > 1 ? atoi(argv[1]) : 300;
  const int page = argc > 2 ? atoi(argv[2]) : 0;
  const bool paged = page > 0;
  const int splits = argc > 3 ? atoi(argv[3]) : 1;
  const int kernel = argc > 4 ? atoi(argv[4]) : 0;  // 0 warp, 1 tiles, 2 mma
  const int H = argc > 5 ? atoi(argv[5]) : 32, Hkv = argc > 6 ? atoi(argv[6]) : 8;
  const bool rotary = argc > 7 && atoi(argv[7]) != 0;
  const int B = 2, D = 128, G = H / Hkv, rotary_dim = D / 2;
  const int filled[B] = {S, S / 3};
  const int blocks_per_row = paged ? (S + page - 1) / page : 1;
  const int rows_in_cache = paged ? B * blocks_per_row : B;
  const int cache_rows = paged ? page : S;  // positions per cache row (page)
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<E> q(size_t(B) * H * D), kc(size_t(rows_in_cache) * cache_rows * Hkv * D), vc(kc.size());
  std::vector<E> out(size_t(B) * H * D);
  for (auto& x : q) x = __float2bfloat16_rn(nd(rng));
  for (auto& x : kc) x = __float2bfloat16_rn(nd(rng));
  for (auto& x : vc) x = __float2bfloat16_rn(nd(rng));
  std::vector<int32_t> seqlens(filled, filled + B), table;
  std::vector<float> lse(size_t(B) * H);

  KvCacheParams p;
  p.dtype = FA_DTYPE_BF16; p.batch = B; p.heads = H; p.heads_kv = Hkv; p.head_dim = D; p.head_dim_v = D;
  p.seqlen_q = 1; p.cache_batch = rows_in_cache; p.page_rows = cache_rows;
  p.capacity = int64_t(blocks_per_row) * cache_rows;
  if (paged) {  // batch row b owns blocks b, b + B, b + 2B, ...: interleaved, not in order
    p.paged = true; p.max_blocks = blocks_per_row;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < blocks_per_row; ++i) table.push_back(i * B + b);
    p.block_table = table.data(); p.block_table_stride = blocks_per_row;
  }
  p.q = q.data(); p.k_cache = kc.data(); p.v_cache = vc.data(); p.o = out.data(); p.lse = lse.data();
  p.q_layout = {int64_t(H) * D, int64_t(H) * D, D};
  p.k_cache_layout = {int64_t(cache_rows) * Hkv * D, int64_t(Hkv) * D, D};
  p.v_cache_layout = p.k_cache_layout;
  p.o_layout = {int64_t(H) * D, int64_t(H) * D, D};
  p.lse_layout = {H, H, 1};
  p.cache_seqlens = seqlens.data();
  p.softmax_scale = 1.0f / std::sqrt(float(D)); p.causal = true; p.window_right = 0;
  std::vector<E> cos_table(size_t(S + 1) * rotary_dim / 2), sin_table(cos_table.size());
  for (size_t e = 0; e < cos_table.size(); ++e) {
    const int position = int(e / (rotary_dim / 2)), pair = int(e % (rotary_dim / 2));
    const double angle = position * std::pow(10000.0, -2.0 * pair / rotary_dim);
    cos_table[e] = __float2bfloat16_rn(float(std::cos(angle)));
    sin_table[e] = __float2bfloat16_rn(float(std::sin(angle)));
  }
  if (rotary) {
    p.rotary_cos = cos_table.data(); p.rotary_sin = sin_table.data(); p.rotary_dim = rotary_dim;
    p.rotary_cos_stride = p.rotary_sin_stride = rotary_dim / 2; p.rotary_interleaved = false;
  }

  const bool tiles = kernel == 1, mma = kernel == 2;
  using WarpTraits = SplitKvWarpTraits<E, 128, 4>;
  using TileTraits = DecodeTraits<E, 128>;
  using MmaTraits = SplitKvMmaTraits<E, 128>;
  const int block_rows = tiles || mma ? 16 : 4;
  if (kernel == 0 && G > 4) { std::printf("the emulated warp kernel has 4 rows per block: G <= 4\n"); return 2; }
  const int row_blocks = (G + block_rows - 1) / block_rows;
  const size_t smem_bytes = tiles ? TileTraits::smem_bytes() : mma ? MmaTraits::smem_bytes() : WarpTraits::smem_bytes();

  // The workspace as KvCachePlan lays it out, poisoned (NaN partials) but for the counters.
  SplitPartials partials;
  partials.rows_padded = row_blocks * block_rows;
  std::vector<float> o_part(size_t(splits) * B * Hkv * partials.rows_padded * D, NAN);
  std::vector<float> lse_part(size_t(splits) * B * Hkv * partials.rows_padded, NAN);
  std::vector<unsigned int> arrivals(size_t(B) * Hkv * row_blocks, 0u);
  if (splits > 1) { partials.o = o_part.data(); partials.lse = lse_part.data(); partials.arrivals = arrivals.data(); }

  emu::grid = {unsigned(splits), unsigned(row_blocks), unsigned(B * Hkv)};
  emu::block = {128, 1, 1};
  std::vector<unsigned> order(size_t(splits) * row_blocks * B * Hkv);
  for (unsigned i = 0; i < order.size(); ++i) order[i] = i;
  bool counters_reset = true;
  for (int call = 0; call < (splits > 1 ? 2 : 1); ++call) {
    std::shuffle(order.begin(), order.end(), rng);
    std::fill(out.begin(), out.end(), __float2bfloat16_rn(NAN));
    std::fill(lse.begin(), lse.end(), NAN);
    launch(order, 128, smem_bytes, [&] {
      if (tiles) split_kv_kernel<TileTraits, E>(p, partials);
      else if (mma) split_kv_mma_kernel<MmaTraits, E>(p, partials);
      else split_kv_warp_kernel<WarpTraits, E>(p, partials);
    });
    for (unsigned count : arrivals) counters_reset = counters_reset && count == 0;
  }

  // fp64 reference of the second call: every query attends to its row's keys (causal, Sq = 1).
  double worst = 0, worst_lse = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int hk = h / G, keys = filled[b];
      auto k_at = [&](const std::vector<E>& cache, int j, int e) {
        const int row = paged ? table[b * blocks_per_row + j / page] : b, within = paged ? j % page : j;
        return double(__bfloat162float(cache[((size_t(row) * cache_rows + within) * Hkv + hk) * D + e]));
      };
      const float o_lse = lse[b * H + h];
      if (keys == 0) {  // no key: O = 0, LSE = +inf
        for (int e = 0; e < D; ++e)
          worst = std::max(worst, std::fabs(double(__bfloat162float(out[(b * H + h) * D + e]))));
        if (!(std::isinf(o_lse) && o_lse > 0)) worst_lse = INFINITY;
        continue;
      }
      // q as the kernel sees it: rotated at position filled (Sq = 1, causal) and rounded to bf16.
      std::vector<double> q_row(D);
      for (int e = 0; e < D; ++e) {
        auto q_at = [&](int64_t d) { return double(__bfloat162float(q[(b * H + h) * D + d])); };
        q_row[e] = q_at(e);
        if (!rotary || e >= rotary_dim) continue;
        const RotaryPair pair = rotary_pair(rotary_dim, false, e);
        const size_t at = size_t(keys) * (rotary_dim / 2) + pair.column;
        const double c = __bfloat162float(cos_table[at]), sn = __bfloat162float(sin_table[at]);
        const double rotated = rotate<double>(q_at(pair.first), q_at(pair.second), c, sn, e == pair.first);
        q_row[e] = __bfloat162float(__float2bfloat16_rn(float(rotated)));
      }
      std::vector<double> s(keys);
      double m = -1e300;
      for (int j = 0; j < keys; ++j) {
        double dot = 0;
        for (int e = 0; e < D; ++e) dot += q_row[e] * k_at(kc, j, e);
        s[j] = dot * p.softmax_scale;
        m = std::max(m, s[j]);
      }
      double l = 0;
      for (int j = 0; j < keys; ++j) l += s[j] = std::exp(s[j] - m);
      worst_lse = std::max(worst_lse, std::fabs(m + std::log(l) - o_lse));
      for (int e = 0; e < D; ++e) {
        double o = 0;
        for (int j = 0; j < keys; ++j) o += s[j] * k_at(vc, j, e);
        const double got = __bfloat162float(out[(b * H + h) * D + e]);
        worst = std::isnan(got) ? INFINITY : std::max(worst, std::fabs(o / l - got));
      }
    }
  std::printf("S=%d page=%d splits=%d %s H=%d Hkv=%d%s: max |O - fp64| %.3e, max |LSE - fp64| %.3e, counters %s\n", S,
              page, splits, tiles ? "tiles" : mma ? "mma" : "warp", H, Hkv, rotary ? " rotary" : "", worst, worst_lse,
              counters_reset ? "reset" : "LEFT NONZERO");
  // bf16 outputs of magnitude < 1: a few ulps; the LSE is fp32.
  return worst <= 2e-2 && worst_lse <= 1e-3 && counters_reset ? 0 : 1;
}
