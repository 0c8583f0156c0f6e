"""One fwd+bwd of our CUDA kernels for a profiler to look at (scripts/device_run.sh, stage `profile`).

    ncu --clock-control none --kernel-name regex:bwd_kernel --launch-skip 1 --launch-count 1 \
        python3 bench/gpu/profile_bwd.py --dim 128 --seqlen 16384 [--causal] [--deterministic]

Shapes as the benchmark's: 16k tokens per batch (B = 16384 / N), H = 2048 / D, bf16. Two fwd+bwd
calls: the first warms up (module load, smem attributes), the profiler skips it.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu import Ours  # noqa: E402
from fa_ctypes import FlashAttn  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    batch, heads = 16384 // args.seqlen, 2048 // args.dim
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(batch, args.seqlen, heads, args.dim, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    ours = Ours(FlashAttn(), q, k, v, dout, args.causal, deterministic=args.deterministic)
    for _ in range(2):
        ours.fwdbwd()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
