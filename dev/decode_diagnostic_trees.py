"""Source trees of the library whose split-KV decode kernel skips part of its work, for timing only.

Each tree is `git archive REV` with one to three edits in src/cuda/decode/split_kv_mma.cuh. Their outputs are
wrong; bench_decode.py times them as reference builds beside ours (device_run.sh: FA_REFERENCE_SRC names the trees,
FA_REFERENCE_BENCH=0, stages "build reference decode"), which shows what each part of the kernel costs a call
(dev/kvcache_decode.md, session 33):
  ring_only   compute() returns at its entry: the ring's copies, Q's staging, the merge and the combine, no math
  s_only      compute() returns after Q K^T
  no_pv       compute() returns after the softmax (no rescale, no P V)
  ring_noepi  ring_only, and the block returns after its ring drains (no merge, no partial store)
  ring_bare   ring_noepi without Q's staging

usage: python3 dev/decode_diagnostic_trees.py [--rev HEAD] [--out build-deps] [NAME ...]
"""
import argparse
import io
import os
import subprocess
import tarfile

KERNEL = "src/cuda/decode/split_kv_mma.cuh"

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

TREES = {
    "ring_only": [NO_MATH],
    "s_only": [SCORES_ONLY],
    "no_pv": [NO_PV],
    "ring_noepi": [NO_MATH, NO_EPILOGUE],
    "ring_bare": [NO_MATH, NO_EPILOGUE, NO_Q_STAGING],
}


def make_tree(rev, directory, edits):
    archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
    os.makedirs(directory, exist_ok=False)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(directory)
    path = os.path.join(directory, KERNEL)
    with open(path) as f:
        source = f.read()
    for old, new in edits:
        if source.count(old) != 1:
            raise SystemExit(f"{directory}: an edit does not match {KERNEL} of {rev} exactly once:\n{old}")
        source = source.replace(old, new)
    with open(path, "w") as f:
        f.write(source)


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
