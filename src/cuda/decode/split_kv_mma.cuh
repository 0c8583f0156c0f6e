// Split-KV ("flash-decoding") attention against a KV cache on tensor cores,
// for sm_80 and sm_90a, head-dim classes 64 and 128.
//
// Why tensor cores for a memory-bound kernel: the CUDA-core kernel of
// split_kv_warp.cuh issued 174 warp instructions per key (ncu, H200, B = 64,
// 32k: 2.9 G instructions, 1.6 IPC, 20 % of DRAM bandwidth) — the dot products'
// shuffles and a softmax replicated on every lane of a key row. Here S = Q K^T
// and O += P V are mma.sync m16n8k16 with the packed query rows as M (16,
// padded), and the softmax runs once per element of the accumulators, so a key
// costs about ten instructions and the kernel can wait on DRAM only.
//
// No block barrier in the loop: each warp streams its own slabs
// of 16 keys through a private ring of kStages stages filled by cp.async, whole
// 128-byte lines per key row (ncu: copying the 64 bytes a lane group reads
// itself left the L2 at 94 % busy with DRAM at 67 %), and the fragments are read
// back with 16-byte shared loads from swizzled rows. The fragment layouts leave
// freedom in the order of the reduced dimension:
//   S = Q K^T reduces over dims. Lane (g, t) = (lane / 4, lane % 4) of n-tile
//     n holds key 8n + g; it reads chunk 4 blk + t (dims 32 blk + 8t .. + 7) of
//     that key, and the mma's k index 2t + e (+8) stands for dim 32 blk + 8t + e
//     (+2) in the first k-step of the block and + 4 (+6) in the second. Q's A
//     fragments are built once with the same order, so the sum is the dot product.
//   O += P V reduces over keys, which P's accumulator layout fixes (lane (g, t)
//     holds keys 2t, 2t+1, 2t+8, 2t+9 of the slab): B (keys x dims) pairs two
//     keys of one dim in a word, which ldmatrix.trans of 8 keys x one 16-byte
//     chunk delivers; n-tile j is output dims 8j .. 8j + 7 (chunk j).
// Swizzles (16-byte chunk c of key k stored at chunk c ^ x(k) of its row) make
// both the line copies and these reads conflict-free: the 8 lanes of a quarter
// warp read keys 2q, 2q+1 x chunks 4 blk .. +3 of K (x = 4 (k & 1)), and an
// ldmatrix phase reads one chunk of 8 consecutive keys of V (x = k & 7).
// Block: kWarps warps on one (split, row block, batch row x kv head); each warp
// streams every kWarps-th slab of the split; the warps' softmax states are
// merged at the end (block_merge.cuh).
#pragma once

#include <type_traits>

#include "cuda/decode/block_merge.cuh"
#include "cuda/decode/cache_walk.hpp"
#include "cuda/decode/kvcache_kernel.cuh"
#include "cuda/decode/kvcache_launch.hpp"
#include "cuda/decode/query_staging.cuh"
#include "cuda/decode/split_plan.hpp"
#include "cuda/sm80/mma.cuh"

namespace flashattn::cuda::decode {

// The ring's depth: Ring and mma_ring_stages (cache_walk.hpp), which the split plan reads too.
template <typename Element, int kHeadDim_, Ring kRing_ = Ring::kStandard>
struct SplitKvMmaTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr Ring kRing = kRing_;
  static constexpr int kRows = 16;  // M of the mma: packed query rows per block
  static constexpr int kWarps = kMmaWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSlabKeys = kMmaSlabKeys;        // keys per warp step: the k of P V
  static constexpr int kKeyBlocks = kHeadDim / 32;      // S: chunks a lane reads per key (n-tile)
  static constexpr int kOutTiles = kHeadDim / 8;        // P V: n-tiles of 8 output dims
  static constexpr int kRowChunks = kHeadDim / 8;       // 16-byte chunks of a key row
  static constexpr int kRowBytes = kHeadDim * 2;
  static constexpr int kLaneKeys = kSlabKeys * kRowChunks / 32;  // keys whose chunk a lane copies per slab
  static constexpr int kStageBytes = 2 * kSlabKeys * kRowBytes;  // K then V, (kSlabKeys, kRowBytes) each
  // Slabs per warp, kStages - 1 of them in flight.
  static constexpr int kStages = mma_ring_stages(kRing, kHeadDim);
  static constexpr int kKeysPerBlockIter = kWarps * kSlabKeys;
  static constexpr int kMinBlocks = kRing == Ring::kStandard ? 2 : 1;
  static_assert(kHeadDim % 64 == 0, "the dim orders above need 64-dim halves");
  static_assert(kKeysPerBlockIter == kKeysPerTile, "splits come in whole block steps");
  // Ring (kWarps, kStages, kStageBytes): at hdim 128 96 KiB (2 blocks per SM), compact 64; then Q
  // staged as fp32 (kRows, kHeadDim) for the fragments. The ring becomes the merge buffer after the loop.
  static constexpr size_t ring_bytes() { return size_t(kWarps) * kStages * kStageBytes; }
  static constexpr size_t q_bytes() { return size_t(kRows) * kHeadDim * sizeof(float); }
  static constexpr size_t merge_bytes() { return BlockStates<kWarps, kRows, kHeadDim>::bytes(); }
  static constexpr size_t smem_bytes() {
    return (ring_bytes() > merge_bytes() ? ring_bytes() : merge_bytes()) + q_bytes();
  }
  static_assert(int64_t(kWarps) * (kStages - 1) * kStageBytes == mma_bytes_in_flight(kRing, kHeadDim) &&
                    ring_bytes() >= merge_bytes() && int64_t(smem_bytes()) == mma_smem_bytes(kRing, kHeadDim),
                "the split plan (split_plan.hpp) counts this block's bytes in flight and shared memory");
};

// Where one lane's key of a stream is in a paged cache, advanced slab step by
// slab step without a division: (page, within) with within < page_rows, and the
// block of `page` read one step ahead.
struct KeyStream {
  int key;          // key index (relative to the row's leftpad) of the next slab to issue
  uint32_t page, within;
  int block;        // cache block of `page`, -1 when outside the cache or past the keys
};

// Byte offset of chunk c of key k in a stage's K or V rows (see the swizzles above).
template <int kRowBytes>
__device__ __forceinline__ int key_chunk_offset(int k, int c) { return k * kRowBytes + ((c ^ ((k & 1) << 2)) << 4); }
template <int kRowBytes>
__device__ __forceinline__ int value_chunk_offset(int k, int c) {
  return k * kRowBytes + ((c ^ (k & 7)) << 4);
}

// A lane's chunk of one tensor of a paged cache, for the long-pages walk: the address of the chunk
// in block 0, row 0, and the page and row strides in bytes. The row stride fits 32 bits (cache_walk).
struct PagedTensor {
  uintptr_t lane = 0;
  uint64_t page_bytes = 0;
  uint32_t row_bytes = 0;
};
template <typename Element>
__device__ __forceinline__ PagedTensor paged_tensor(const Element* lane, const TensorLayout& layout) {
  static_assert(sizeof(Element) == 2, "cache_walk's row-stride bound counts 2-byte elements");
  PagedTensor t;
  t.lane = opaque(reinterpret_cast<uintptr_t>(lane));
  t.page_bytes = static_cast<uint64_t>(layout.batch) * sizeof(Element);
  t.row_bytes = opaque(static_cast<uint32_t>(layout.row * int64_t(sizeof(Element))));
  return t;
}

// Grid (splits, row blocks, B * Hkv). Writes out/lse directly when splits == 1,
// else fp32 partials: o_partial (splits, B * Hkv, rows_padded, Dv), lse_partial (splits, B * Hkv, rows_padded).
// kWalk: how the instance steps a lane's key streams through the cache (the host
// picks it with cache_walk, cache_walk.hpp).
template <typename Traits, typename Element, CacheWalk kWalk>
__global__ void __launch_bounds__(Traits::kThreads, Traits::kMinBlocks)
    split_kv_mma_kernel(const KvCacheParams p, float* o_partial, float* lse_partial, int rows_padded) {
  constexpr int kRows = Traits::kRows, kHeadDim = Traits::kHeadDim, kRowBytes = Traits::kRowBytes;
  constexpr int kKeyBlocks = Traits::kKeyBlocks;
  constexpr int kRowChunks = Traits::kRowChunks, kStages = Traits::kStages, kSlabKeys = Traits::kSlabKeys;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char smem[];
  float* q_stage = reinterpret_cast<float*>(smem + Traits::smem_bytes() - Traits::q_bytes());  // (kRows, kHeadDim)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair
  // Divisions in 32 bits (run_kvcache bounds the heads, and grid indices fit): a 64-bit division is
  // a chain of some 80 dependent instructions, and the prologue and epilogue are a call's fixed cost.
  const uint32_t heads_kv = static_cast<uint32_t>(p.heads_kv);
  const uint32_t group = static_cast<uint32_t>(p.heads) / heads_kv;  // query heads per kv head
  const int64_t b = blockIdx.z / heads_kv, hkv = blockIdx.z % heads_kv;
  const int64_t heads_per_kv = group;
  const uint32_t first_row = blockIdx.y * kRows;  // packed row r0 + r: query (r0 + r) / G, head hkv G + (r0 + r) % G
  const int64_t r0 = first_row;
  const int nrows = static_cast<int>(min(int64_t(kRows), p.seqlen_q * heads_per_kv - r0));
  const QueryRowWalk<Traits, Element> query_walk(p, b, hkv, r0);
  // Launched early after the stream's previous kernel: the index math above reads only the
  // parameters, and runs while that kernel drains; no global memory is read before this wait (the
  // L2 prefetches of the row's entries and block-table lines return nothing to the thread).
  prefetch_row_entries(p, b);
  if constexpr (paged_walk(kWalk)) prefetch_table_share<kKeysPerTile>(p, b, blockIdx.x, gridDim.x);
  wait_for_prerequisite_grids();
  // The cache length's loads first (everything below waits for them), then Q's, which nothing uses
  // before turn 0, while the length's are on their way; then the length's first use. Q's not in the
  // short-pages walk, whose streams' bookkeeping left no registers to hold Q (16 bytes of spills
  // at hdim 128), and whose pages of under 16 rows are rare: it loads Q in turn 0.
  const CacheRow::Entries row_entries = CacheRow::read(p, b);
  constexpr bool kShortPages = kWalk == CacheWalk::kShortPages;
  const QueryElements<Traits, Element> q_loaded =
      kShortPages ? QueryElements<Traits, Element>{} : load_queries(p, query_walk, nrows);
  const CacheRow row = bounded_row(p, b, row_entries);
  const MaskPolicy mask = row.mask(p);
  const int d_count = static_cast<int>(p.head_dim), dv_count = static_cast<int>(p.head_dim_v);

  const int64_t i_first = first_row / group, i_last = (first_row + nrows - 1) / group;
  const KeyRange range = split_range<kKeysPerTile>(mask.key_begin(i_first), mask.key_end(i_last + 1),
                                                   blockIdx.x, gridDim.x);
  const int keys_begin = static_cast<int>(range.begin), keys_end = static_cast<int>(range.end);
  // Slabs inside [plain_lo, plain_hi) are visible to every row of the block: no mask arithmetic.
  const bool plain_scores = p.softcap <= 0.0f && p.alibi_slopes == nullptr;
  const int plain_lo = static_cast<int>(mask.key_begin(i_last));
  const int plain_hi = min(static_cast<int>(mask.key_end(i_first + 1)), keys_end);
  const float score_scale = p.softmax_scale * kLog2e;  // scores in log2 units

  // Short pages: the lane copies chunk c_lane of kLaneKeys keys per slab (K and V alike): key
  // stream i holds slab key i * kKeysPerCopy + lane / kRowChunks.
  constexpr int kKeysPerCopy = 32 / kRowChunks;  // keys one warp-wide copy covers, whole rows
  constexpr int kStreams = Traits::kLaneKeys;
  constexpr bool kPaged = paged_walk(kWalk);
  const int c_lane = lane % kRowChunks;
  const int base0 = keys_begin + warp * kSlabKeys;
  const Element* k_lane = static_cast<const Element*>(p.k_cache) + hkv * p.k_cache_layout.head + 8 * c_lane;
  const Element* v_lane = static_cast<const Element*>(p.v_cache) + hkv * p.v_cache_layout.head + 8 * c_lane;
  const bool k_chunk = 8 * c_lane < d_count, v_chunk = 8 * c_lane < dv_count;
  auto stage_of = [&](int stage) { return smem + (warp * kStages + stage) * Traits::kStageBytes; };
  // Where the lane's V chunk of stream s goes in a stage: V's swizzle repeats every 8 keys, so at
  // the offset of stream s % kValuePhases plus whole 8-key groups, a constant of the copy's address.
  // The compiler derived each stream's offset anew from its key, three instructions a copy.
  constexpr int kValuePhases = 8 / kKeysPerCopy < kStreams ? 8 / kKeysPerCopy : kStreams;
  static_assert(8 % kKeysPerCopy == 0, "streams of a phase are whole 8-key groups apart");
  int value_phase[kValuePhases];
#pragma unroll
  for (int j = 0; j < kValuePhases; ++j)
    value_phase[j] = value_chunk_offset<kRowBytes>(j * kKeysPerCopy + lane / kRowChunks, c_lane);
  auto value_offset = [&](int s) {
    return value_phase[s % kValuePhases] + s / kValuePhases * kValuePhases * kKeysPerCopy * kRowBytes;
  };

  // Short pages: each stream keeps its page, its row in the page and the page's cache block,
  // stepped without a division.
  const uint32_t page_rows = kPaged ? static_cast<uint32_t>(p.page_rows) : 1u;
  const uint32_t step_pages = kPaged ? Traits::kKeysPerBlockIter / page_rows : 0u;
  const uint32_t step_within = kPaged ? Traits::kKeysPerBlockIter % page_rows : 0u;
  // The cache block of `page` for a key of this split (-1: past the split's end, which looks
  // nothing up, so every page read is inside the block table, or an out-of-range block).
  const int32_t* table_row = kPaged ? opaque(p.block_table + b * p.block_table_stride) : nullptr;
  auto read_block = [&](uint32_t page, int key) -> int { return key < keys_end ? __ldg(table_row + page) : -1; };
  auto lookup = [&](uint32_t page, int key) -> int {
    const int block = read_block(page, key);
    return block >= 0 && block < p.cache_batch ? block : -1;
  };
  KeyStream streams[kShortPages ? kStreams : 1];
  if constexpr (kShortPages) {
#pragma unroll
    for (int s = 0; s < kStreams; ++s) {
      streams[s].key = base0 + s * kKeysPerCopy + lane / kRowChunks;
      const uint32_t position = static_cast<uint32_t>(row.leftpad + streams[s].key);
      streams[s].page = position / page_rows;
      streams[s].within = position % page_rows;
      streams[s].block = lookup(streams[s].page, streams[s].key);
    }
  }
  // Contiguous and long pages: kLineRows rows a copy instruction, lane (r, c) = (lane / 8, lane % 8)
  // copying chunk c of every 128-byte line of rows r, r + kLineRows, ... of the slab. So a lane's
  // copies of a row differ by immediate offsets and its rows by one stride: one address per row and
  // tensor a step. (Streams of single chunks, as the short pages walk, took ~9 instructions a copy
  // for their own addresses and presence on a contiguous cache: 152 a step at sm_90a bf16 hdim 128.)
  constexpr int kLineChunks = 8, kLineBytes = 16 * kLineChunks, kLineRows = 32 / kLineChunks;
  constexpr int kRowLines = kRowChunks / kLineChunks;  // 128-byte lines per key row
  constexpr int kRowGroups = kSlabKeys / kLineRows;    // rows a lane copies per slab and tensor
  constexpr int kLineSpan = (kRowGroups - 1) * kLineRows;  // a lane's last row, rows after its first
  static_assert(kLineSpan < kSlabKeys, "a page of kSlabKeys rows holds a lane's rows or splits them once");
  const int line_row = lane / kLineChunks, line_chunk = lane % kLineChunks;
  int first_key = base0 + line_row;  // long pages: the key of the lane's first row in the next slab
  const Element* k_line = static_cast<const Element*>(p.k_cache) + hkv * p.k_cache_layout.head + 8 * line_chunk;
  const Element* v_line = static_cast<const Element*>(p.v_cache) + hkv * p.v_cache_layout.head + 8 * line_chunk;
  int base0_step = base0;  // the first key of the warp's next slab
  const Element* k_row_first = k_line;
  const Element* v_row_first = v_line;
  if constexpr (!kPaged) {
    const int64_t position = row.leftpad + base0 + line_row;
    k_row_first += row.cache_index * p.k_cache_layout.batch + position * p.k_cache_layout.row;
    v_row_first += row.cache_index * p.v_cache_layout.batch + position * p.v_cache_layout.row;
  }
  const int64_t k_group_step = opaque(kLineRows * p.k_cache_layout.row);
  const int64_t v_group_step = opaque(kLineRows * p.v_cache_layout.row);
  // Where the lane's chunks land (the swizzles above): row group i and line h add constants, as
  // K's swizzle depends on a row's parity and V's repeats every 8 rows (groups i and i + 2).
  const int k_dest = opaque(key_chunk_offset<kRowBytes>(line_row, line_chunk));
  const int v_dest[2] = {opaque(value_chunk_offset<kRowBytes>(line_row, line_chunk)),
                         opaque(value_chunk_offset<kRowBytes>(line_row + kLineRows, line_chunk))};
  // The chunk this lane reads in compute()'s S = Q K^T, key_chunk_offset(8n + g, 4 blk + t): as K's
  // swizzle flips bit 2 of the chunk on odd keys, g RB + 16 t + 64 ((blk % 2) ^ (g % 2)) plus whole
  // lines and n-tiles, two lane constants (the compiler derived each read's offset anew every slab).
  const int k_read[2] = {opaque(g * kRowBytes + 16 * t + 64 * (g % 2)),
                         opaque(g * kRowBytes + 16 * t + 64 * (1 - g % 2))};
  // The row this lane addresses in compute()'s ldmatrix of V: key (lane & 7) + 8 ((lane >> 3) & 1)
  // of the slab, chunk 2 jj + (lane >> 4) at chunk (2 jj + (lane >> 4)) ^ (lane & 7) of the row, that is
  // 8 (jj / 4) + ((2 (jj % 4)) ^ (lane >> 4) ^ (lane & 7)): four lane constants and whole lines.
  int v_read[4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
    v_read[q] = opaque(((lane & 7) + 8 * ((lane >> 3) & 1)) * kRowBytes + (((2 * q) ^ (lane >> 4) ^ (lane & 7)) << 4));
  // A lane's chunks inside the head dims, per line: all of them but where D or Dv is below the class.
  const bool full_dims = d_count == kHeadDim && dv_count == kHeadDim;
  // Long pages (at least kSlabKeys rows): a lane's rows lie in the page of its first row (page a) or,
  // past that page's end, in the next one (page b). The copies step the first row (its row in the
  // page and its key); the block-table entries of both pages are read two steps ahead, before a
  // step's copies, and range-checked where a step uses them. Read one step ahead after the copies,
  // a block alone on an H100 SM ran 17 % slower than with no table reads (B = 8, 4k keys, one split:
  // 55.1 against 46.9 us; two steps ahead 49.4; session 41): as if a read returned behind the copies
  // issued before it, so that the next step waited for this step's slabs to land.
  uint32_t first_within = 0;
  uint32_t ahead_page = 0, ahead_within = 0;  // the lane's first row two steps on
  int ahead_key = 0;
  int block_a = -1, block_b = -1;  // this step's pages
  int next_a = -1, next_b = -1;    // the next step's
  auto read_ahead = [&]() {        // next_* = the entries at ahead_*, which step on
    next_a = read_block(ahead_page, ahead_key);
    next_b = ahead_within + kLineSpan >= page_rows
                 ? read_block(ahead_page + 1, ahead_key + static_cast<int>(page_rows - ahead_within))
                 : -1;
    ahead_key += Traits::kKeysPerBlockIter;
    ahead_page += step_pages;
    ahead_within += step_within;
    if (ahead_within >= page_rows) {
      ahead_within -= page_rows;
      ++ahead_page;
    }
  };
  // A step's copy addresses: one base per page and tensor, computed once per step, plus a stream's
  // rows times the row stride in bytes, a 32-bit value in a 64-bit product (so only the stride must
  // fit 32 bits: cache_walk sends larger ones to the short-pages walk). With a 64-bit block * batch
  // + row * row multiply-add per stream and tensor a step took 448-469 instructions (sm_90a, bf16,
  // hdim 128; contiguous 174). Addresses are integers since page b's base may point before its page.
  // Blocks: [0, cache_blocks) is the cache (cache_batch clamped to 2^31, above every int block), and
  // -1, no entry read, falls outside.
  // (opaque: the compiler derived it from the parameter again every step, six instructions.)
  const uint32_t cache_blocks =
      opaque(static_cast<uint32_t>(min(max(p.cache_batch, int64_t(0)), int64_t(1) << 31)));
  const PagedTensor k_paged = kWalk == CacheWalk::kLongPages ? paged_tensor(k_line, p.k_cache_layout) : PagedTensor{};
  const PagedTensor v_paged = kWalk == CacheWalk::kLongPages ? paged_tensor(v_line, p.v_cache_layout) : PagedTensor{};
  if constexpr (kWalk == CacheWalk::kLongPages) {
    const uint32_t position = static_cast<uint32_t>(row.leftpad + first_key);
    ahead_page = position / page_rows;
    ahead_within = first_within = position - ahead_page * page_rows;
    ahead_key = first_key;
    read_ahead();
    block_a = next_a, block_b = next_b;
    read_ahead();
  }

  // Copies the next slab of every stream into `stage` (absent keys and pages: zeros), then steps on.
  auto issue = [&](int stage) {
    unsigned char* k_rows = stage_of(stage);
    unsigned char* v_rows = k_rows + kSlabKeys * kRowBytes;
    if constexpr (kShortPages) {
#pragma unroll
      for (int s = 0; s < kStreams; ++s) {
        const KeyStream& st = streams[s];
        const bool present = st.block >= 0;
        const int key = s * kKeysPerCopy + lane / kRowChunks;
        const int64_t k_off =
            present ? int64_t(st.block) * p.k_cache_layout.batch + int64_t(st.within) * p.k_cache_layout.row : 0;
        const int64_t v_off =
            present ? int64_t(st.block) * p.v_cache_layout.batch + int64_t(st.within) * p.v_cache_layout.row : 0;
        cp_async_16(k_rows + key_chunk_offset<kRowBytes>(key, c_lane), k_lane + k_off, present && k_chunk);
        cp_async_16(v_rows + value_offset(s), v_lane + v_off, present && v_chunk);
      }
      cp_async_commit();
#pragma unroll
      for (int s = 0; s < kStreams; ++s) {
        KeyStream& st = streams[s];
        st.key += Traits::kKeysPerBlockIter;
        st.page += step_pages;
        st.within += step_within;
        if (st.within >= page_rows) {
          st.within -= page_rows;
          ++st.page;
        }
        st.block = lookup(st.page, st.key);
      }
    } else if constexpr (kWalk == CacheWalk::kLongPages) {
      const int step_block_a = block_a, step_block_b = block_b;
      block_a = next_a, block_b = next_b;
      read_ahead();
      // Row group i, kLineRows i rows after the lane's first, is in page a while that is below
      // rows_left, else in page b at row kLineRows i - rows_left: so with page b's base rows_left rows
      // before the page, both pages' addresses are base + kLineRows i * row_bytes.
      const uint32_t rows_left = page_rows - first_within;
      const bool a_in = static_cast<uint32_t>(step_block_a) < cache_blocks;
      const uint32_t cache_a = a_in ? step_block_a : 0;  // absent: any address
      const uintptr_t k_a = k_paged.lane + cache_a * k_paged.page_bytes + uint64_t(first_within) * k_paged.row_bytes;
      const uintptr_t v_a = v_paged.lane + cache_a * v_paged.page_bytes + uint64_t(first_within) * v_paged.row_bytes;
      const int keys_left = keys_end - first_key;
      // A row group copies (its page in the cache, its key before keys_end) when from <= kLineRows i
      // < to; a line also needs its chunk inside the head dim (per tensor). Most steps keep all of a
      // lane's rows in page a (pages of 16 rows without a left pad: every step), so the copies come
      // three times: `straddles` false drops page b (whose addresses the compiler otherwise computed
      // every step), and `checked` false, where every row and chunk is in, drops the 16 predicates.
      // Lanes that disagree run more than one, in the rare steps at a page end.
      auto copy_rows = [&](auto straddles, auto checked) {
        uintptr_t k_b = 0, v_b = 0;
        int from = 0, to = a_in ? keys_left : 0;
        if constexpr (decltype(straddles)::value) {
          const bool b_in = static_cast<uint32_t>(step_block_b) < cache_blocks;
          const uint32_t cache_b = b_in ? step_block_b : 0;
          k_b = k_paged.lane + cache_b * k_paged.page_bytes - uint64_t(rows_left) * k_paged.row_bytes;
          v_b = v_paged.lane + cache_b * v_paged.page_bytes - uint64_t(rows_left) * v_paged.row_bytes;
          from = a_in ? 0 : static_cast<int>(rows_left);
          to = b_in ? keys_left : min(keys_left, static_cast<int>(rows_left));
        }
#pragma unroll
        for (int i = 0; i < kRowGroups; ++i) {
          const int rows_on = i * kLineRows;
          const bool in_b = decltype(straddles)::value && static_cast<uint32_t>(rows_on) >= rows_left;
          const uintptr_t k_src = (in_b ? k_b : k_a) + uint64_t(rows_on) * k_paged.row_bytes;
          const uintptr_t v_src = (in_b ? v_b : v_a) + uint64_t(rows_on) * v_paged.row_bytes;
          const bool row_in = !decltype(checked)::value || (rows_on >= from && rows_on < to);
#pragma unroll
          for (int h = 0; h < kRowLines; ++h) {
            const int chunk = h * kLineChunks + line_chunk;
            const bool k_in = !decltype(checked)::value || (row_in && 8 * chunk < d_count);
            const bool v_in = !decltype(checked)::value || (row_in && 8 * chunk < dv_count);
            cp_async_16(k_rows + k_dest + i * kLineRows * kRowBytes + h * kLineBytes,
                        reinterpret_cast<const void*>(k_src + h * kLineBytes), k_in);
            cp_async_16(v_rows + v_dest[i % 2] + (i / 2) * 2 * kLineRows * kRowBytes + h * kLineBytes,
                        reinterpret_cast<const void*>(v_src + h * kLineBytes), v_in);
          }
        }
      };
      if (rows_left <= kLineSpan) {
        copy_rows(std::true_type{}, std::true_type{});
      } else if (!a_in || keys_left <= kLineSpan || !full_dims) {
        copy_rows(std::false_type{}, std::true_type{});
      } else {
        copy_rows(std::false_type{}, std::false_type{});
      }
      cp_async_commit();
      first_key += Traits::kKeysPerBlockIter;
      first_within += step_within;
      if (first_within >= page_rows) first_within -= page_rows;
    } else {
      // Row group i is rows kLineRows i + line_row of the slab; line h its dims 64 h .. + 63.
      // `partial` (the split's last slab, or D or Dv below the class) checks each copy.
      auto contiguous_copy = [](void* smem, const void* gmem, bool valid) {
        if constexpr (kWalk == CacheWalk::kContiguousWide) {
          cp_async_16_l2_256(smem, gmem, valid);
        } else {
          cp_async_16(smem, gmem, valid);
        }
      };
      auto copy_rows = [&](auto partial) {
        const Element* k_src = k_row_first;
        const Element* v_src = v_row_first;
#pragma unroll
        for (int i = 0; i < kRowGroups; ++i) {
          const bool present = !partial || base0_step + kLineRows * i + line_row < keys_end;  // absent: nothing read
#pragma unroll
          for (int h = 0; h < kRowLines; ++h) {
            const int chunk = h * kLineChunks + line_chunk;
            const bool k_in = !partial || (present && 8 * chunk < d_count);
            const bool v_in = !partial || (present && 8 * chunk < dv_count);
            constexpr int kLineElements = kLineBytes / int(sizeof(Element));
            contiguous_copy(k_rows + k_dest + i * kLineRows * kRowBytes + h * kLineBytes,
                            (k_in ? k_src : k_line) + kLineElements * h, k_in);
            contiguous_copy(v_rows + v_dest[i % 2] + (i / 2) * 2 * kLineRows * kRowBytes + h * kLineBytes,
                            (v_in ? v_src : v_line) + kLineElements * h, v_in);
          }
          k_src += k_group_step;
          v_src += v_group_step;
        }
      };
      if (full_dims && base0_step + kSlabKeys <= keys_end) {
        copy_rows(std::false_type{});
      } else {
        copy_rows(std::true_type{});
      }
      cp_async_commit();
      base0_step += Traits::kKeysPerBlockIter;
      k_row_first += Traits::kKeysPerBlockIter / kLineRows * k_group_step;
      v_row_first += Traits::kKeysPerBlockIter / kLineRows * v_group_step;
    }
  };

  // Q as A fragments in the dim order above: q_frag[blk][half] holds dims 32 blk + 8t .. + 7 of
  // row g + 8 half. Each of this lane's two rows sees keys [key_lo, key_hi). Set in turn 0 of the
  // loop below, once the first slabs are on their way.
  uint4 q_frag[kKeyBlocks][2];
  int key_lo[2], key_hi[2], diagonal[2];
  float slope[2];
  auto stage_query_fragments = [&]() {
    stage_queries<Traits, Element>(p, row, b, hkv, r0, nrows,
                                   kShortPages ? load_queries(p, QueryRowWalk<Traits, Element>(p, b, hkv, r0), nrows)
                                               : q_loaded,
                                   q_stage);
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half;
      const int64_t query = (first_row + r) / group;
      const bool real = r < nrows;
      key_lo[half] = static_cast<int>(mask.key_begin(query));
      key_hi[half] = real ? static_cast<int>(mask.key_end(query + 1)) : 0;
      diagonal[half] = static_cast<int>(query + mask.shift);
      const int64_t h = hkv * heads_per_kv + (first_row + r) % group;
      slope[half] = real && p.alibi_slopes != nullptr ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
#pragma unroll
      for (int blk = 0; blk < kKeyBlocks; ++blk) {
        const float* q8 = q_stage + r * kHeadDim + 32 * blk + 8 * t;
        uint32_t words[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) words[w] = sm80::Pack2<Element>::pack(q8[2 * w], q8[2 * w + 1]);
        q_frag[blk][half] = make_uint4(words[0], words[1], words[2], words[3]);
      }
    }
  };

  // Online softmax state of rows g and g + 8 over this lane's columns (m is the same on the 4 lanes
  // of a row, l a partial sum): o = sum_j 2^(x_j - m) v_j, l = sum_j 2^(x_j - m), x in log2 units.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o_acc[Traits::kOutTiles][4];
#pragma unroll
  for (int n = 0; n < Traits::kOutTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[n][e] = 0.0f;

  auto compute = [&](int j0, int stage) {
    const unsigned char* k_rows = stage_of(stage);
    const unsigned char* v_rows = k_rows + kSlabKeys * kRowBytes;
    float s_acc[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s_acc[n][e] = 0.0f;
#pragma unroll
      for (int blk = 0; blk < kKeyBlocks; ++blk) {
        const uint4 k =
            *reinterpret_cast<const uint4*>(k_rows + k_read[blk % 2] + blk / 2 * kLineBytes + 8 * n * kRowBytes);
        const uint4 q_lo = q_frag[blk][0], q_hi = q_frag[blk][1];
        sm80::mma_16816<Element>(s_acc[n], {q_lo.x, q_hi.x, q_lo.y, q_hi.y}, k.x, k.y);
        sm80::mma_16816<Element>(s_acc[n], {q_lo.z, q_hi.z, q_lo.w, q_hi.w}, k.z, k.w);
      }
    }
    // Scores in log2 units; s_acc[n][2 half + e] is row g + 8 half, key j0 + 8n + 2t + e.
    // One branch for the slab, not one per element (the compiler kept the per-element test).
    if (plain_scores && j0 >= plain_lo && j0 + Traits::kSlabKeys <= plain_hi) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[n][e] *= score_scale;
    } else {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s_acc[n][2 * half + e];
            const int j = j0 + 8 * n + 2 * t + e;
            float score = x * p.softmax_scale;
            if (p.softcap > 0.0f) score = p.softcap * tanhf(score / p.softcap);
            score -= slope[half] * static_cast<float>(abs(diagonal[half] - j));
            x = j >= key_lo[half] && j < key_hi[half] && j < keys_end ? score * kLog2e : -INFINITY;
          }
    }
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float slab_max = fmaxf(fmaxf(s_acc[0][2 * half], s_acc[0][2 * half + 1]),
                             fmaxf(s_acc[1][2 * half], s_acc[1][2 * half + 1]));
      slab_max = fmaxf(slab_max, __shfl_xor_sync(0xffffffffu, slab_max, 1));
      slab_max = fmaxf(slab_max, __shfl_xor_sync(0xffffffffu, slab_max, 2));
      const float m_new = fmaxf(m[half], slab_max);
      const bool any = m_new != -INFINITY;  // else every probability is 0 and nothing rescales
      alpha[half] = any ? exp2_flush(m[half] - m_new) : 1.0f;
      const float m_use = any ? m_new : 0.0f;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s_acc[n][2 * half + e];
          x = exp2_flush(x - m_use);
          l[half] = l[half] * (e == 0 && n == 0 ? alpha[half] : 1.0f) + x;
        }
      m[half] = m_new;
    }
    // The maximum settles after a few slabs: skip the rescale when no row of the warp moved.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < Traits::kOutTiles; ++n) {
        o_acc[n][0] *= alpha[0];
        o_acc[n][1] *= alpha[0];
        o_acc[n][2] *= alpha[1];
        o_acc[n][3] *= alpha[1];
      }
    }
    // P as the A fragment of the slab (k = 16 keys): the accumulator layout of the two n-tiles.
    const uint32_t p_frag[4] = {sm80::Pack2<Element>::pack(s_acc[0][0], s_acc[0][1]),
                                sm80::Pack2<Element>::pack(s_acc[0][2], s_acc[0][3]),
                                sm80::Pack2<Element>::pack(s_acc[1][0], s_acc[1][1]),
                                sm80::Pack2<Element>::pack(s_acc[1][2], s_acc[1][3])};
    // ldmatrix.x4.trans: matrices (keys 0-7, chunk 2jj), (keys 8-15, 2jj), (0-7, 2jj + 1), (8-15,
    // 2jj + 1), the B fragments of n-tiles 2jj and 2jj + 1.
    const uint32_t v_shared = static_cast<uint32_t>(__cvta_generic_to_shared(v_rows));
#pragma unroll
    for (int jj = 0; jj < Traits::kOutTiles / 2; ++jj) {
      uint32_t b[4];
      sm80::ldmatrix_x4_trans(b, v_shared + v_read[jj % 4] + jj / 4 * kLineBytes);
      sm80::mma_16816<Element>(o_acc[2 * jj], p_frag, b[0], b[1]);
      sm80::mma_16816<Element>(o_acc[2 * jj + 1], p_frag, b[2], b[3]);
    }
  };

  // Step n of this warp is the slab at base0 + n * kKeysPerBlockIter; kStages - 1 slabs in flight.
  // The first kStages - 1 turns only issue: one loop, so the code of issue() and compute()
  // exists once (a block with few keys runs it cold, and instruction fetch was its cost).
  // Turn 0 stages Q (loaded at the entry) after its issue: by then its loads have landed, and the
  // copies went out first. Q has its own shared memory (smem_bytes()), apart from the ring the
  // copies fill. Every warp runs turn 0, even one without a slab, because the staging ends in a
  // block barrier.
  constexpr int stride = Traits::kKeysPerBlockIter;
  const int steps = base0 < keys_end ? (keys_end - base0 + stride - 1) / stride : 0;
  const int turns = steps > 0 ? steps : 1;
#pragma unroll 1
  for (int n = 1 - kStages; n < turns; ++n) {
    __syncwarp();  // every lane is done reading the stage of step n - 1, which the issue below refills
    const int fill = n + kStages - 1;
    if (fill < steps) {
      issue(fill % kStages);
    } else {
      cp_async_commit();  // empty group: the wait count below stays uniform
    }
    if (n < 0) continue;
    if (n == 0) {
      allow_dependent_grids();  // the combine's blocks may be scheduled: they wait for this grid
      stage_query_fragments();
    }
    if (n >= steps) break;
    cp_async_wait<kStages - 1>();  // this lane's copies of step n have landed
    __syncwarp();                  // and every other lane's
    compute(base0 + n * stride, n % kStages);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the merge buffer

  // This warp's state: l summed over the 4 lanes of each row, m to natural-log units.
  const BlockStates<Traits::kWarps, kRows, kHeadDim> states(reinterpret_cast<float*>(smem));
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float row_l = l[half];
    row_l += __shfl_xor_sync(0xffffffffu, row_l, 1);
    row_l += __shfl_xor_sync(0xffffffffu, row_l, 2);
    const int r = g + 8 * half;
    if (t == 0) {
      states.m[warp * kRows + r] = m[half] == -INFINITY ? -INFINITY : m[half] / kLog2e;
      states.l[warp * kRows + r] = row_l;
    }
    if (r >= nrows) continue;  // a padding row: the merge reads rows below nrows only
    float* o_row = states.o + (warp * kRows + r) * kHeadDim;
#pragma unroll
    for (int j = 0; j < Traits::kOutTiles; ++j)
      *reinterpret_cast<float2*>(o_row + 8 * j + 2 * t) = make_float2(o_acc[j][2 * half], o_acc[j][2 * half + 1]);
  }
  __syncthreads();
  merge_and_store<Traits::kWarps, kRows, kHeadDim, Element>(p, states, nrows, r0, b, hkv, o_partial, lse_partial,
                                                            rows_padded);
}

}  // namespace flashattn::cuda::decode
