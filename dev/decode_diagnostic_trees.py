"""Source trees of the library whose split-KV decode kernel skips part of its work, for timing only.

Each tree is `git archive REV` with a few edits, most in src/cuda/decode/split_kv_mma.cuh. All but the timeline
tree's outputs are wrong; bench_decode.py times them as reference builds beside ours (device_run.sh:
FA_REFERENCE_SRC names the trees, FA_REFERENCE_BENCH=0, stages "build reference decode"), which shows what each part
of the kernel costs a call (dev/kvcache_decode.md, session 33):
  ring_only   compute() returns at its entry: the ring's copies, Q's staging, the merge and the combine, no math
  s_only      compute() returns after Q K^T
  no_pv       compute() returns after the softmax (no rescale, no P V)
  ring_noepi  ring_only, and the block returns after its ring drains (no merge, no partial store)
  ring_bare   ring_noepi without Q's staging
  timeline    the whole kernel, and globaltimer stamps of every block of the split and combine kernels, per call,
              into a buffer named by fa_debug_set_timeline (dev/decode_timeline.py reads them; device stage timeline)
  timeline_bare  ring_bare with the same stamps
  late_trigger   the whole kernel, and the combine allows the next grid (griddepcontrol.launch_dependents) once its
              wait for the split grid returns: the next call's split blocks are scheduled onto SMs the split grid has
              left while the combine works (v25, session 31, allowed them at the combine's entry, onto busy SMs).
              For revisions before 3e4d2eb, which made it main's (session 35)
  timeline_late_trigger  timeline with late_trigger's edit
  table_free  a paged cache's block of page i of row b is b * block_table_stride + i, as bench_decode.py's in-order
              table holds, with no block-table read: on its paged rounds (shuffled tables) the walk reads the pages
              in order without a lookup, so its paged column against the in-order one is what the lookups cost

usage: python3 dev/decode_diagnostic_trees.py [--rev HEAD] [--out build-deps] [NAME ...]
"""
import argparse
import io
import os
import subprocess
import tarfile

KERNEL = "src/cuda/decode/split_kv_mma.cuh"
PARAMS = "src/common/kvcache_params.hpp"
BACKEND = "src/cuda/decode/backend_kvcache.cpp"
COMBINE = "src/cuda/decode/kvcache_kernel.cuh"

NO_MATH = ("""    const unsigned char* k_rows = stage_of(stage);
    const unsigned char* v_rows = k_rows + kSlabKeys * kRowBytes;
    float s_acc[2][4];""", """    if (j0 >= 0) return;  // diagnostic: the ring's copies only
    const unsigned char* k_rows = stage_of(stage);
    const unsigned char* v_rows = k_rows + kSlabKeys * kRowBytes;
    float s_acc[2][4];""")
SCORES_ONLY = ("""    // Scores in log2 units; s_acc[n][2 half + e] is row g + 8 half, key j0 + 8n + 2t + e.""",
               """    if (j0 >= 0) {  // diagnostic: Q K^T only
      o_acc[0][0] += s_acc[0][0] + s_acc[1][3];
      return;
    }
    // Scores in log2 units; s_acc[n][2 half + e] is row g + 8 half, key j0 + 8n + 2t + e.""")
NO_PV = ("""    // The maximum settles after a few slabs: skip the rescale when no row of the warp moved.""",
         """    if (j0 >= 0) {  // diagnostic: Q K^T and the softmax, no P V
      o_acc[0][0] += s_acc[0][0] + s_acc[1][3];
      return;
    }
    // The maximum settles after a few slabs: skip the rescale when no row of the warp moved.""")
NO_EPILOGUE = ("""  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the merge buffer
""", """  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the merge buffer
  if (keys_end >= 0) return;  // diagnostic: no epilogue
""")
NO_Q_STAGING = ("""      stage_query_fragments();
    }""", """      if (keys_end < 0) stage_query_fragments();  // diagnostic: no Q staging
    }""")

# The timeline: globaltimer stamps of thread 0 of every block, of the split kernel (0 entry, 1 past its wait for the
# previous kernel, 2 its first slab issued, 3 its ring drained, 4 exit; 5 Q staged) and of the combine (0 entry, 1
# past its wait, 2 exit), into the buffer that fa_debug_set_timeline named when the call was enqueued (null: none).
# dev/decode_timeline.py reads them. Layout of a call's buffer: split block k at [8 k, 8 k + 8), combine block k at
# [kTimelineCombine + 4 k, + 4), in uint64.
TIMELINE_STAMP = """
// Diagnostic (dev/decode_diagnostic_trees.py, timeline): thread 0's globaltimer at `event` of this block.
constexpr int kTimelineCombine = 8 * 1024;
__device__ __forceinline__ void timeline_stamp(const KvCacheParams& p, int base, int slots, int event) {
  if (p.timeline == nullptr || threadIdx.x != 0) return;
  const int block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  p.timeline[base + block * slots + event] = now;
}
"""
TIMELINE = [
    (PARAMS, "  void* stream = nullptr;   // CUDA\n",
     "  void* stream = nullptr;   // CUDA\n  unsigned long long* timeline = nullptr;  // diagnostic\n"),
    (BACKEND, "fa_status fwd_kvcache(const KvCacheParams& p, void* workspace) {\n",
     "unsigned long long* g_timeline = nullptr;\n"
     "extern \"C\" __attribute__((visibility(\"default\"))) void fa_debug_set_timeline(void* timeline) {\n"
     "  g_timeline = static_cast<unsigned long long*>(timeline);\n}\n"
     "fa_status fwd_kvcache(const KvCacheParams& p_in, void* workspace) {\n"
     "  KvCacheParams p = p_in;\n  p.timeline = g_timeline;\n"),
    (COMBINE, "__device__ __forceinline__ void wait_for_prerequisite_grids() {",
     TIMELINE_STAMP + "__device__ __forceinline__ void wait_for_prerequisite_grids() {"),
    (COMBINE, """  // touched only after that grid has completed.
  wait_for_prerequisite_grids();
""", """  // touched only after that grid has completed.
  timeline_stamp(p, kTimelineCombine, 4, 0);
  wait_for_prerequisite_grids();
  timeline_stamp(p, kTimelineCombine, 4, 1);
"""),
    (COMBINE, "  if (lane == 0 && lse_out != nullptr) *lse_out = lse;\n",
     "  if (lane == 0 && lse_out != nullptr) *lse_out = lse;\n  timeline_stamp(p, kTimelineCombine, 4, 2);\n"),
    (COMBINE, "  lse_max = partial_max[0];\n",
     "  lse_max = partial_max[0];\n  timeline_stamp(p, kTimelineCombine, 4, 3);  // the block's LSEs are in\n"),
    ("""  wait_for_prerequisite_grids();
  // The cache length's loads first""", """  timeline_stamp(p, 0, 8, 0);
  wait_for_prerequisite_grids();
  timeline_stamp(p, 0, 8, 1);
  // The cache length's loads first"""),
    ("""    if (n < 0) continue;
    if (n == 0) {""", """    if (n == 1 - kStages) timeline_stamp(p, 0, 8, 2);
    if (n < 0) continue;
    if (n == 0) {"""),
    ("""    if (n >= steps) break;
    cp_async_wait<kStages - 1>();""", """    if (n == 0) timeline_stamp(p, 0, 8, 5);
    if (n >= steps) break;
    cp_async_wait<kStages - 1>();"""),
    ("""  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the merge buffer
""", """  cp_async_wait<0>();
  __syncthreads();  // the ring becomes the merge buffer
  timeline_stamp(p, 0, 8, 3);
"""),
    ("""                                                            rows_padded);
}""", """                                                            rows_padded);
  timeline_stamp(p, 0, 8, 4);
}"""),
]

LATE_TRIGGER = (COMBINE, """  wait_for_prerequisite_grids();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // 32-bit divisions""", """  wait_for_prerequisite_grids();
  allow_dependent_grids();  // diagnostic: the next grid's blocks onto the SMs the split grid left
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // 32-bit divisions""")
TIMELINE_LATE_TRIGGER = (COMBINE, "  timeline_stamp(p, kTimelineCombine, 4, 1);\n",
                         "  timeline_stamp(p, kTimelineCombine, 4, 1);\n  allow_dependent_grids();  // diagnostic\n")

# The block-table entries computed instead of read (right for bench_decode.py's in-order table only).
TABLE_FREE = ("auto read_block = [&](uint32_t page, int key) -> int { return key < keys_end ? __ldg(table_row + page) : -1; };",
              "auto read_block = [&](uint32_t page, int key) -> int {  // diagnostic: the in-order table's entries\n"
              "    return key < keys_end ? static_cast<int>(b * p.block_table_stride + page) : -1;\n"
              "  };")

TREES = {
    "ring_only": [NO_MATH],
    "s_only": [SCORES_ONLY],
    "no_pv": [NO_PV],
    "ring_noepi": [NO_MATH, NO_EPILOGUE],
    "ring_bare": [NO_MATH, NO_EPILOGUE, NO_Q_STAGING],
    "timeline": TIMELINE,
    "timeline_bare": [NO_MATH, NO_EPILOGUE, NO_Q_STAGING] + TIMELINE,
    "late_trigger": [LATE_TRIGGER],
    "timeline_late_trigger": TIMELINE + [TIMELINE_LATE_TRIGGER],
    "table_free": [TABLE_FREE],
}


def make_tree(rev, directory, edits):
    archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
    os.makedirs(directory, exist_ok=False)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory)
    for edit in edits:
        file, old, new = edit if len(edit) == 3 else (KERNEL, *edit)
        path = os.path.join(directory, file)
        with open(path) as f:
            source = f.read()
        if source.count(old) != 1:
            raise SystemExit(f"{directory}: an edit does not match {file} of {rev} exactly once:\n{old}")
        with open(path, "w") as f:
            f.write(source.replace(old, new))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--out", default="build-deps")
    parser.add_argument("names", nargs="*", help=f"trees to make (default: all): {', '.join(TREES)}")
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in TREES]
    if unknown:
        parser.error(f"unknown trees {unknown}; known: {', '.join(TREES)}")
    for name in args.names or TREES:
        make_tree(args.rev, os.path.join(args.out, name), TREES[name])
        print(os.path.join(args.out, name))


if __name__ == "__main__":
    main()
