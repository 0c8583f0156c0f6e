// A kernel whose writes land late: it lets the stream's next kernel be scheduled at its start
// (griddepcontrol.launch_dependents, as a kernel of another library launched with programmatic
// dependent launches may), then spins for a while before it copies. A programmatic dependent
// launched after it in the same stream starts during the spin, and reads what was there before
// the copy unless it waits (griddepcontrol.wait) before its first global read.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace fatest::gpu {

struct LateCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};
constexpr int kMaxLateCopies = 4;

// Copies each region (unused ones have bytes 0) after spinning for delay_ns, as one kernel on
// `stream`. Returns the launch's status.
cudaError_t launch_late_copies(const LateCopy (&copies)[kMaxLateCopies], uint64_t delay_ns, cudaStream_t stream);

}  // namespace fatest::gpu
