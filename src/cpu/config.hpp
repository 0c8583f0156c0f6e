// Tile sizes of the CPU backend and the bump allocator that carves the
// caller's workspace. Both the sizing (workspace_bytes) and the kernels carve
// through the same functions, so the size is exact by construction.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashattn {
namespace cpu {

// 256 queries x 128 keys, chosen by measurement on a 2-core Sapphire Rapids
// (fwd bf16, N = 4096, D = 128): each K/V tile is read once per 256 queries,
// halving the K/V traffic of 128-query tiles (+10%), and 128 keys per tile
// halve the per-tile O accumulator traffic of the P V product (+5..10%).
// The score tile (128 KiB fp32), the Q^T and O tiles (128 KiB each at
// D = 128) stay in the 2 MiB L2 of one core. Both are multiples of 16 (AMX
// tile rows), of the 32-column register block and of Philox's 4 columns.
struct TileConfig {
  static constexpr int kBlockM = 256;  // query rows per tile
  static constexpr int kBlockN = 128;  // key rows per tile
};
constexpr int kBlockM = TileConfig::kBlockM;
constexpr int kBlockN = TileConfig::kBlockN;
static_assert(kBlockN % 4 == 0, "dropout draws 4 key columns per Philox call");
static_assert(kBlockM % 16 == 0 && kBlockN % 16 == 0, "AMX tiles hold 16 rows");

constexpr size_t kScratchAlignment = 64;  // one cache line, one zmm register
constexpr int kTransposeRows = 16;        // rows per block of load_tile_transposed: one cache line of fp32

// Hands out 64-byte aligned float arrays from one region. With a null base it
// only measures, which is how the workspace size is computed.
class ScratchArena {
 public:
  explicit ScratchArena(char* base = nullptr) : base_(base) {}

  float* take_floats(int64_t count) { return static_cast<float*>(take_bytes(static_cast<size_t>(count) * 4)); }

  void* take_bytes(size_t bytes) {
    const size_t offset = used_;
    used_ += (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
    return base_ == nullptr ? nullptr : base_ + offset;
  }

  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// The caller's workspace is only guaranteed 16-byte aligned, so the first
// region starts at the next 64-byte boundary; the slack is part of the size.
inline char* align_workspace(void* workspace) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(workspace);
  const uintptr_t aligned = (address + kScratchAlignment - 1) & ~static_cast<uintptr_t>(kScratchAlignment - 1);
  return reinterpret_cast<char*>(aligned);
}
constexpr size_t kWorkspaceSlack = kScratchAlignment;

}  // namespace cpu
}  // namespace flashattn
