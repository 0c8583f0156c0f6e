// Tile sizes of the CPU backend and the bump allocator that carves the
// caller's workspace. Both the sizing (workspace_bytes) and the kernels carve
// through the same functions, so the size is exact by construction.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashattn {
namespace cpu {

// 64 queries x 64 keys: the score tile (16 KiB fp32) and the Q, K, V tiles
// (up to 64 KiB each at D = 256) stay in the 2 MiB L2 of one core, and 64 is a
// multiple of the 32-column register block and of Philox's 4 columns.
struct TileConfig {
  static constexpr int kBlockM = 64;  // query rows per tile
  static constexpr int kBlockN = 64;  // key rows per tile
};
constexpr int kBlockM = TileConfig::kBlockM;
constexpr int kBlockN = TileConfig::kBlockN;
static_assert(kBlockN % 4 == 0, "dropout draws 4 key columns per Philox call");

constexpr size_t kScratchAlignment = 64;  // one cache line, one zmm register

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
