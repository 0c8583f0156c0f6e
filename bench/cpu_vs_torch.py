"""flashattn's CPU backend side by side with torch's CPU SDPA (FLASH_ATTENTION backend), one process.

Same inputs for both, (B, H, N, D) storage (ours reads it through strides), the same thread count,
median over repetitions, GFLOP/s by flash-attn's convention (fwd 4*B*H*N^2*D, halved for causal;
fwd+bwd 3.5x fwd). Prints a table and writes JSON.

    python3 bench/cpu_vs_torch.py --threads 2 [--reps 5] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fa_ctypes import FlashAttn  # noqa: E402

SHAPES = [(1, 16, 4096, 128), (4, 8, 1024, 64)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def interleaved_medians(fns, reps):
    """Median seconds of each function, repetitions interleaved (a, b, a, b, ...) after one warm-up
    each, so that load from other processes on a shared machine hits both sides alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, samples in zip(fns, times):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def run_case(fa, b, h, n, d, dtype, causal, threads, reps):
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(b, h, n, d, generator=gen).to(dtype) for _ in range(4))

    def torch_fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def torch_fwdbwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        out.backward(dout)

    out = torch.empty_like(q)
    lse = torch.empty(b, h, n, dtype=torch.float32)
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    bshd = lambda t: t.transpose(1, 2)  # noqa: E731  (B,H,N,D) storage seen as (B,N,H,D)
    fwd_args = fa.fwd_args(bshd(q), bshd(k), bshd(v), bshd(out), lse, causal=causal, num_threads=threads)
    bwd_args = fa.bwd_args(bshd(dout), bshd(q), bshd(k), bshd(v), bshd(out), lse, bshd(dq), bshd(dk), bshd(dv),
                           causal=causal, num_threads=threads)

    def ours_fwdbwd():
        fa.fwd(fwd_args)
        fa.bwd(bwd_args)

    row = {"B": b, "H": h, "N": n, "D": d, "dtype": str(dtype).split(".")[-1], "causal": causal, "threads": threads}
    row["torch_fwd_s"], row["ours_fwd_s"] = interleaved_medians([torch_fwd, lambda: fa.fwd(fwd_args)], reps)
    row["torch_fwdbwd_s"], row["ours_fwdbwd_s"] = interleaved_medians([torch_fwdbwd, ours_fwdbwd], reps)
    # Same function: our output against torch's, in fp32.
    row["max_abs_diff_vs_torch"] = (out.float() - torch_fwd().float()).abs().max().item()
    flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
    for who in ("torch", "ours"):
        row[f"{who}_fwd_gflops"] = flops / row[f"{who}_fwd_s"] / 1e9
        row[f"{who}_fwdbwd_gflops"] = 3.5 * flops / row[f"{who}_fwdbwd_s"] / 1e9
    row["fwd_speedup"] = row["torch_fwd_s"] / row["ours_fwd_s"]
    row["fwdbwd_speedup"] = row["torch_fwdbwd_s"] / row["ours_fwdbwd_s"]
    return row


def openmp_runtimes():
    """The OpenMP runtimes mapped into this process. torch's and ours should be one libgomp: with two,
    each keeps its own pool of threads, and one pool's spinning waits run beside the other's work."""
    if not os.path.exists("/proc/self/maps"):  # not Linux
        return []
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    return sorted(p for p in paths if any(name in os.path.basename(p) for name in ("gomp", "iomp", "libomp")))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--shapes", default="all", help="'all' or a comma list of indices into SHAPES")
    parser.add_argument("--causal", default="both", choices=["both", "no", "yes"])
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.reps} interleaved, "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    fa = FlashAttn()
    runtimes = openmp_runtimes()
    print(f"OpenMP runtimes in this process: {', '.join(runtimes) or 'none found'}", flush=True)
    header = f"{'B,H,N,D':<14} {'dtype':<9} {'causal':<6} | {'torch fwd':>9} {'ours fwd':>9} {'x':>5} | " \
             f"{'torch f+b':>9} {'ours f+b':>9} {'x':>5} | {'max diff':>8}"
    print(header)
    rows = []
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    causals = {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]
    for b, h, n, d in shapes:
        for name in args.dtypes.split(","):
            for causal in causals:
                r = run_case(fa, b, h, n, d, DTYPES[name], causal, args.threads, args.reps)
                rows.append(r)
                print(f"{f'{b},{h},{n},{d}':<14} {r['dtype']:<9} {str(causal):<6} | {r['torch_fwd_gflops']:9.1f} "
                      f"{r['ours_fwd_gflops']:9.1f} {r['fwd_speedup']:5.2f} | {r['torch_fwdbwd_gflops']:9.1f} "
                      f"{r['ours_fwdbwd_gflops']:9.1f} {r['fwdbwd_speedup']:5.2f} | {r['max_abs_diff_vs_torch']:8.1e}",
                      flush=True)
    if args.json:
        end_load = os.getloadavg()
        Path(args.json).write_text(json.dumps({"torch": torch.__version__, "openmp_runtimes": runtimes,
                                               "load_start": load, "load_end": end_load, "reps": args.reps,
                                               "results": rows}, indent=1))
    print(f"load at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
