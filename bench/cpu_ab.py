"""A/B of CPU builds or settings of flashattn in one process: forward and forward+backward GFLOP/s.

Each arm is LABEL=LIB[:NAME=VALUE,...]: a library and environment variables set before each of its calls
(for knobs that a build reads per call). Arms run interleaved per repetition (a, b, c, a, b,
c, ...) after one warm-up each, so that load from other processes hits all alike; medians are printed
with each arm's ratio to the first.

usage: python3 bench/cpu_ab.py --threads 16 base=build-ref/libflashattn.so new=build/libflashattn.so
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fa_ctypes import FlashAttn  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_arm(text):
    label, _, rest = text.partition("=")
    lib, _, env = rest.partition(":")
    settings = dict(item.split("=", 1) for item in env.split(",") if item)
    return label, lib, settings


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("arms", nargs="+", help="LABEL=LIB[:NAME=VALUE,...]")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--cells", default="4,8,1024,64,fp32,0;4,8,1024,64,bf16,0;1,16,4096,128,fp32,0;"
                        "1,16,4096,128,bf16,1", help="B,H,N,D,dtype,causal separated by ';'")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    arms = [parse_arm(a) for a in args.arms]
    libraries = {lib: FlashAttn(lib) for _, lib, _ in arms}
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.reps} interleaved; arms: "
          + ", ".join(f"{label}={lib}{' ' + str(env) if env else ''}" for label, lib, env in arms), flush=True)
    for cell in args.cells.split(";"):
        b, h, n, d, dtype, causal = cell.split(",")
        b, h, n, d, causal = int(b), int(h), int(n), int(d), causal == "1"
        gen = torch.Generator().manual_seed(0)
        q, k, v, dout = (torch.randn(b, n, h, d, generator=gen).to(DTYPES[dtype]) for _ in range(4))
        calls, keep = [], []
        for label, lib, env in arms:
            fa = libraries[lib]
            out, lse = torch.empty_like(q), torch.empty(b, h, n)
            dq, dk, dv = (torch.empty_like(q) for _ in range(3))
            fwd = fa.fwd_args(q, k, v, out, lse, causal=causal, num_threads=args.threads)
            bwd = fa.bwd_args(dout, q, k, v, out, lse, dq, dk, dv, causal=causal, num_threads=args.threads)
            keep.append((out, lse, dq, dk, dv, fwd, bwd))
            calls.append((env, lambda fa=fa, a=fwd: fa.fwd(a), lambda fa=fa, a=fwd, g=bwd: (fa.fwd(a), fa.bwd(g))))
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        rates = []
        for which, factor in ((1, 1.0), (2, 3.5)):
            times = [[] for _ in calls]
            for rep in range(args.reps + 1):
                for arm, sample in zip(calls, times):
                    env = arm[0]
                    saved = {name: os.environ.get(name) for name in env}
                    os.environ.update(env)
                    start = time.perf_counter()
                    arm[which]()
                    elapsed = time.perf_counter() - start
                    for name, value in saved.items():
                        if value is None:
                            os.environ.pop(name)
                        else:
                            os.environ[name] = value
                    if rep > 0:  # the first round warms up
                        sample.append(elapsed)
            rates.append([flops * factor / statistics.median(t) / 1e9 for t in times])
        for name, row in zip(("fwd", "f+b"), rates):
            print(f"{cell:22s} {name}: " + "  ".join(f"{label} {rate:7.1f} (x{rate / row[0]:.3f})"
                                                     for (label, _, _), rate in zip(arms, row)), flush=True)


if __name__ == "__main__":
    main()
