"""A/B of CPU builds of flashattn in one process: forward and forward+backward GFLOP/s.

Each arm is LABEL=LIB. The arms run interleaved per repetition (cpu_vs_torch.interleaved_medians), so that
load from other processes hits all alike; each arm's median is printed with its ratio to the first arm's.

usage: python3 bench/cpu_ab.py --threads 16 base=build-ref/libflashattn.so new=build/libflashattn.so
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_vs_torch import interleaved_medians  # noqa: E402
from fa_ctypes import FlashAttn  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", help="LABEL=LIB")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--cells", default="4,8,1024,64,fp32,0;4,8,1024,64,bf16,0;1,16,4096,128,fp32,0;"
                        "1,16,4096,128,bf16,1", help="B,H,N,D,dtype,causal separated by ';'")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    arms = [arm.partition("=")[::2] for arm in args.arms]
    libraries = [FlashAttn(lib) for _, lib in arms]  # loaded once, used by every cell
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.reps} interleaved; arms: "
          + ", ".join(f"{label}={lib}" for label, lib in arms), flush=True)
    for cell in args.cells.split(";"):
        b, h, n, d, dtype, causal = cell.split(",")
        b, h, n, d, causal = int(b), int(h), int(n), int(d), causal == "1"
        gen = torch.Generator().manual_seed(0)
        q, k, v, dout = (torch.randn(b, n, h, d, generator=gen).to(DTYPES[dtype]) for _ in range(4))
        forwards, both, tensors = [], [], []  # tensors: the outputs the argument structs point into
        for fa in libraries:
            out, lse = torch.empty_like(q), torch.empty(b, h, n)
            dq, dk, dv = (torch.empty_like(q) for _ in range(3))
            tensors.append((out, lse, dq, dk, dv))
            fwd = fa.fwd_args(q, k, v, out, lse, causal=causal, num_threads=args.threads)
            bwd = fa.bwd_args(dout, q, k, v, out, lse, dq, dk, dv, causal=causal, num_threads=args.threads)
            forwards.append(lambda fa=fa, a=fwd: fa.fwd(a))
            both.append(lambda fa=fa, a=fwd, g=bwd: (fa.fwd(a), fa.bwd(g)))
        flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
        for name, fns, factor in (("fwd", forwards, 1.0), ("f+b", both, 3.5)):
            rates = [flops * factor / t / 1e9 for t in interleaved_medians(fns, args.reps)]
            print(f"{cell:22s} {name}: " + "  ".join(f"{label} {rate:7.1f} (x{rate / rates[0]:.3f})"
                                                     for (label, _), rate in zip(arms, rates)), flush=True)


if __name__ == "__main__":
    main()
