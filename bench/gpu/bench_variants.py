"""A/B of the deterministic backward across builds of this library, in one process.

Each variant is another build of libflashattn.so (for example the same tree compiled with a
development switch); every cell times, interleaved in the same rounds, each round in its own random order
(bench_gpu.time_interleaved): this build's default fwd+bwd, this build's deterministic fwd+bwd,
and each variant's deterministic fwd+bwd. TFLOP/s by flash-attn's convention. Shapes as bench_gpu.py
(16k tokens, H * D = 2048).

usage: python3 bench/gpu/bench_variants.py --out DIR label=path/libflashattn.so [label=path ...]
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_gpu import Ours, flops, time_interleaved  # noqa: E402
from fa_ctypes import FlashAttn  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds, each in its own random order")
    parser.add_argument("--variant-default", action="store_true",
                        help="also time each variant's default (non-deterministic) fwd+bwd: a dev switch that "
                             "perturbs the default kernel's registers shows there")
    parser.add_argument("variants", nargs="+", help="label=path of another libflashattn.so")
    args = parser.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    fa = FlashAttn()
    variants = {}
    for item in args.variants:
        label, path = item.split("=", 1)
        variants[label] = FlashAttn(path)
    rows = []
    for D in (int(d) for d in args.dims.split(",")):
        for N in (int(n) for n in args.lengths.split(",")):
            B, H = 16384 // N, 2048 // D
            torch.manual_seed(0)
            q, k, v, dout = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(4))
            for causal in (False, True):
                runners = {"default": Ours(fa, q, k, v, dout, causal).fwdbwd,
                           "det": Ours(fa, q, k, v, dout, causal, deterministic=True).fwdbwd}
                for label, lib in variants.items():
                    runners[label] = Ours(lib, q, k, v, dout, causal, deterministic=True).fwdbwd
                    if args.variant_default:
                        runners[label + "_default"] = Ours(lib, q, k, v, dout, causal).fwdbwd
                medians, errors = time_interleaved(runners, rounds=args.rounds)
                row = {"dtype": args.dtype, "D": D, "N": N, "B": B, "H": H, "causal": causal}
                for name, ms in medians.items():
                    row[name] = None if ms is None else flops(B, H, N, D, causal, "fwdbwd") / ms / 1e9
                for name, error in errors.items():
                    row[name + "_error"] = str(error).splitlines()[0][:160]
                rows.append(row)
                print(f"{D} {N} {'C' if causal else '-'} | " + " ".join(
                    f"{name} {row[name]:.0f} ({row[name] / row['default']:.2f})" if row.get(name) else f"{name} -"
                    for name in runners), flush=True)
            del q, k, v, dout
            torch.cuda.empty_cache()
    with open(os.path.join(args.out, "bench_variants.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "variants": args.variants, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
