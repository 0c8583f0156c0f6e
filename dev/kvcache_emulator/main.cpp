// Runs the split-KV decode kernels on the CPU: one std::thread per CUDA thread,
// barriers for __syncthreads and for every warp shuffle, cp.async as a copy,
// exact-size host buffers, built with AddressSanitizer (run.sh). Checks O
// against an fp64 reference.
// usage: emu S [page_size (0 = contiguous)] [splits] [kernel: 0 warp, 1 tiles, 2 mma] [head dim: 128, 64]
//            [block table: 0 identity, 1 reversed] [strides: 0 dense, 1 padded] [left pad]
//            [ring of the mma kernel: 0 standard, 2 compact (1 was the deep ring, removed in session 22), 3 standard
//             with the contiguous walk of the L2's 256-byte fetch (CacheWalk::kContiguousWide)]
// A reversed table stores logical page i in cache block blocks - 1 - i, so a walk that took a page
// index for its block reads the wrong keys. Padded strides give K rows and V pages a gap, so a walk
// that mixed up the row, page or tensor strides reads the gap, which holds NaN (as do the unused rows
// of a partial page): a read of anything but a present key turns O into NaN. A left pad puts the S
// keys at cache positions pad .. pad + S - 1 (cache_leftpad), NaN before them.
#include "shim.hpp"
#include "split_kv_mma_host.hpp"
#include "split_kv_warp_host.hpp"
#include <cstdio>
#include <random>
using namespace flashattn;
using namespace flashattn::cuda::decode;
using E = __nv_bfloat16;

struct Case {
  int S = 300, page = 0, splits = 1, kernel = 0, head_dim = 128;
  bool reversed = false, padded = false;
  int left_pad = 0;
  int ring = 0;
};

template <int D>
int run(const Case& c) {
  const int B = 1, H = 32, Hkv = 8, S = c.S, page = c.page, pad = c.left_pad, filled = S + pad;
  const bool paged = page > 0;
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  // Logical K and V (key j, kv head hk, dim e) at (j * Hkv + hk) * D + e: the reference reads these.
  std::vector<E> q(B * 1 * H * D), kl(B * S * Hkv * D), vl(B * S * Hkv * D), out(B * H * D);
  for (auto& x : q) x = __float2bfloat16_rn(nd(rng));
  for (auto& x : kl) x = __float2bfloat16_rn(nd(rng));
  for (auto& x : vl) x = __float2bfloat16_rn(nd(rng));
  std::vector<int32_t> seqlens(B, filled), leftpads(B, pad), table;
  std::vector<float> lse(B * H);
  KvCacheParams p;
  p.dtype = FA_DTYPE_BF16; p.batch = B; p.heads = H; p.heads_kv = Hkv; p.head_dim = D; p.head_dim_v = D; p.seqlen_q = 1;
  p.cache_batch = B; p.page_rows = filled; p.capacity = filled;
  const int blocks = paged ? (filled + page - 1) / page : 1, rows = paged ? page : filled;
  const int64_t dense_row = int64_t(Hkv) * D;
  const TensorLayout k_layout{(c.padded ? dense_row + 16 : dense_row) * rows, c.padded ? dense_row + 16 : dense_row, D};
  const TensorLayout v_layout{dense_row * rows + (c.padded ? 64 : 0), dense_row, D};
  // Exact-size cache buffers: the dense contiguous and identity-table cases hold just the S keys, as before.
  const bool exact = !c.reversed && !c.padded && pad == 0;
  auto cache_of = [&](const std::vector<E>& logical, const TensorLayout& layout) {
    if (exact) return logical;
    std::vector<E> cache(size_t(blocks) * layout.batch, E{0x7fc0});  // NaN
    for (int j = 0; j < S; ++j) {
      const int position = pad + j, logical_page = paged ? position / page : 0;
      const int block = c.reversed ? blocks - 1 - logical_page : logical_page;
      for (int hk = 0; hk < Hkv; ++hk)
        for (int e = 0; e < D; ++e)
          cache[block * layout.batch + (paged ? position % page : position) * layout.row + hk * layout.head + e] =
              logical[(size_t(j) * Hkv + hk) * D + e];
    }
    return cache;
  };
  std::vector<E> kc = cache_of(kl, k_layout), vc = cache_of(vl, v_layout);
  if (paged) { p.paged = true; p.cache_batch = B * blocks; p.page_rows = page; p.max_blocks = blocks; p.capacity = int64_t(blocks) * page;
    for (int i = 0; i < blocks; ++i) table.push_back(c.reversed ? blocks - 1 - i : i); p.block_table = table.data(); p.block_table_stride = blocks; }
  p.q = q.data(); p.k_cache = kc.data(); p.v_cache = vc.data(); p.o = out.data(); p.lse = lse.data();
  p.q_layout = {int64_t(H) * D, int64_t(H) * D, D};
  p.k_cache_layout = k_layout;
  p.v_cache_layout = v_layout;
  p.o_layout = {int64_t(H) * D, int64_t(H) * D, D};
  p.lse_layout = {H, 1, 1};
  p.cache_seqlens = seqlens.data();
  if (pad > 0) p.cache_leftpad = leftpads.data();
  p.softmax_scale = 1.0f / std::sqrt(float(D)); p.causal = true; p.window_right = 0;
  const bool tiles = c.kernel == 1, mma = c.kernel == 2;  // 1: the tile kernel, 2: the mma kernel (16 rows per block)
  using Traits = SplitKvWarpTraits<E, D, 4>;
  using TileTraits = DecodeTraits<E, D>;
  using MmaTraits = SplitKvMmaTraits<E, D>;
  using CompactTraits = SplitKvMmaTraits<E, D, Ring::kCompact>;
  const bool compact = mma && c.ring == 2;
  const bool wide = mma && c.ring == 3 && !paged;  // 3: the contiguous walk with the L2's 256-byte fetch
  const int rows_padded = tiles || mma ? 16 : 4;
  const int splits = c.splits;
  std::vector<float> o_part(size_t(splits) * B * Hkv * 16 * D), lse_part(size_t(splits) * B * Hkv * 16);
  float* op = splits > 1 ? o_part.data() : nullptr; float* lp = splits > 1 ? lse_part.data() : nullptr;
  emu::grid = {unsigned(splits), 1, unsigned(B * Hkv)}; emu::block = {128, 1, 1};
  for (unsigned xz = 0; xz < emu::grid.z * emu::grid.x; ++xz) { const unsigned z = xz / emu::grid.x, x = xz % emu::grid.x;
    std::vector<unsigned char> smem(tiles ? TileTraits::smem_bytes() : compact ? CompactTraits::smem_bytes() : mma ? MmaTraits::smem_bytes() : Traits::smem_bytes());
    emu::block_smem = smem.data();
    std::barrier<> bar(128); emu::block_barrier = &bar;
    std::vector<std::unique_ptr<std::barrier<>>> wb; for (int w = 0; w < 4; ++w) { wb.emplace_back(new std::barrier<>(32)); emu::warp_barriers[w] = wb.back().get(); }
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 128; ++t) threads.emplace_back([&, t, z] { emu::tid = {t, 0, 0}; emu::bid = {x, 0, z}; if (tiles) split_kv_kernel<TileTraits, E>(p, op, lp, rows_padded); else if (compact && cache_walk(p) == CacheWalk::kContiguous) split_kv_mma_kernel<CompactTraits, E, CacheWalk::kContiguous>(p, op, lp, rows_padded); else if (compact && cache_walk(p) == CacheWalk::kLongPages) split_kv_mma_kernel<CompactTraits, E, CacheWalk::kLongPages>(p, op, lp, rows_padded); else if (compact) split_kv_mma_kernel<CompactTraits, E, CacheWalk::kShortPages>(p, op, lp, rows_padded); else if (wide) split_kv_mma_kernel<MmaTraits, E, CacheWalk::kContiguousWide>(p, op, lp, rows_padded); else if (mma && cache_walk(p) == CacheWalk::kContiguous) split_kv_mma_kernel<MmaTraits, E, CacheWalk::kContiguous>(p, op, lp, rows_padded); else if (mma && cache_walk(p) == CacheWalk::kLongPages) split_kv_mma_kernel<MmaTraits, E, CacheWalk::kLongPages>(p, op, lp, rows_padded); else if (mma) split_kv_mma_kernel<MmaTraits, E, CacheWalk::kShortPages>(p, op, lp, rows_padded); else split_kv_warp_kernel<Traits, E>(p, op, lp, rows_padded); });
    for (auto& th : threads) th.join();
  }
  if (splits > 1) {
    const unsigned blocks = B * Hkv * 4;  // one per packed row
    emu::grid = {blocks, 1, 1};
    for (unsigned x = 0; x < blocks; ++x) {
      std::barrier<> bar(128); emu::block_barrier = &bar;
      std::vector<std::unique_ptr<std::barrier<>>> wb; for (int w = 0; w < 4; ++w) { wb.emplace_back(new std::barrier<>(32)); emu::warp_barriers[w] = wb.back().get(); }
      std::vector<std::thread> threads;
      for (unsigned t = 0; t < 128; ++t) threads.emplace_back([&, t, x] { emu::tid = {t, 0, 0}; emu::bid = {x, 0, 0}; combine_kernel<E, D>(p, op, lp, splits, rows_padded); });
      for (auto& th : threads) th.join();
    }
  }
  // reference
  double worst = 0;
  for (int h = 0; h < H; ++h) { int hk = h / 4; std::vector<double> s(S); double m = -1e300;
    for (int j = 0; j < S; ++j) { double d = 0; for (int e = 0; e < D; ++e) d += double(__bfloat162float(q[h*D+e])) * __bfloat162float(kl[(j*Hkv+hk)*D+e]); s[j] = d * p.softmax_scale; m = std::max(m, s[j]); }
    double l = 0; for (int j = 0; j < S; ++j) { s[j] = std::exp(s[j] - m); l += s[j]; }
    for (int e = 0; e < D; ++e) { double o = 0; for (int j = 0; j < S; ++j) o += s[j] * __bfloat162float(vl[(j*Hkv+hk)*D+e]); o /= l;
      const double got = __bfloat162float(out[h*D+e]); worst = std::isnan(got) ? INFINITY : std::max(worst, std::fabs(o - got)); }
  }
  // FNV-1a over the bits of O and the LSE: a kernel change that should not move a result shows the same hash.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) hash = (hash ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  };
  mix(out.data(), out.size() * sizeof(E));
  mix(lse.data(), lse.size() * sizeof(float));
  std::printf("S=%d page=%d splits=%d %s", S, page, splits, tiles ? "tiles" : mma ? "mma" : "warp");
  if (D != 128 || c.reversed || c.padded || pad > 0)
    std::printf(" hdim=%d%s%s", D, c.reversed ? " reversed" : "", c.padded ? " padded" : "");
  if (pad > 0) std::printf(" left pad %d", pad);
  if (compact) std::printf(" compact ring");
  if (wide) std::printf(" wide fetch");
  std::printf(": max |O - fp64| %.3e, lse[0] %f, bits %016llx\n", worst, lse[0], static_cast<unsigned long long>(hash));
  return worst <= 2e-2 ? 0 : 1;  // bf16 outputs of magnitude < 1: a few ulps
}

int main(int argc, char** argv) {
  Case c;
  if (argc > 1) c.S = atoi(argv[1]);
  if (argc > 2) c.page = std::max(0, atoi(argv[2]));
  if (argc > 3) c.splits = atoi(argv[3]);
  if (argc > 4) c.kernel = atoi(argv[4]);
  if (argc > 5) c.head_dim = atoi(argv[5]);
  if (argc > 6) c.reversed = atoi(argv[6]) != 0;
  if (argc > 7) c.padded = atoi(argv[7]) != 0;
  if (argc > 8) c.left_pad = std::max(0, atoi(argv[8]));
  if (argc > 9) c.ring = atoi(argv[9]);
  if (c.ring != 0 && c.kernel != 2) { std::fprintf(stderr, "rings are instances of the mma kernel\n"); return 2; }
  if (c.ring == 1) { std::fprintf(stderr, "ring 1 (deep) was removed: 0 standard, 2 compact\n"); return 2; }
  if (c.reversed && c.page == 0) { std::fprintf(stderr, "a reversed block table needs a paged cache\n"); return 2; }
  return c.head_dim == 64 ? run<64>(c) : run<128>(c);
}
