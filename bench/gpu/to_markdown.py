"""Markdown tables for BENCHMARKS.md from bench_gpu.py's JSON (grid or --fwd-only).

usage: python3 bench/gpu/to_markdown.py bench_gpu.json        (fwd+bwd grid: one row per cell)
       python3 bench/gpu/to_markdown.py bench_gpu_fwd.json    (forward table, every variant column)
"""
import json
import sys


def fmt(x, digits=0):
    return "-" if x is None else f"{x:.{digits}f}"


def ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}"


def grid(results):
    cells = {}
    for r in results:
        cells.setdefault((r["dtype"], r["D"], r["N"], r["causal"]), {})[r["mode"]] = r
    print("| dtype | D | N | causal | fwd+bwd ours | FA2 | cuDNN | ours/FA2 | sm80 bwd | deterministic | det/ours "
          "| fwd ours | FA2 | cuDNN | ours/FA2 | ours/cuDNN | fwd tile | fwd persistent |")
    print("|" + "---|" * 18)
    for (dtype, D, N, causal), modes in cells.items():
        fb, f = modes.get("fwdbwd", {}), modes.get("fwd", {})
        print(f"| {dtype} | {D} | {N} | {'yes' if causal else 'no'} | {fmt(fb.get('ours'))} | {fmt(fb.get('fa2'))} "
              f"| {fmt(fb.get('cudnn'))} | {ratio(fb.get('ours'), fb.get('fa2'))} | {fmt(fb.get('ours_bwd_sm80'))} "
              f"| {fmt(fb.get('ours_det'))} | {ratio(fb.get('ours_det'), fb.get('ours'))} | {fmt(f.get('ours'))} "
              f"| {fmt(f.get('fa2'))} | {fmt(f.get('cudnn'))} | {ratio(f.get('ours'), f.get('fa2'))} "
              f"| {ratio(f.get('ours'), f.get('cudnn'))} | {fmt(f.get('ours_fwd_tile'))} "
              f"| {fmt(f.get('ours_fwd_persistent'))} |")


def forward(results, matmul):
    variants = [k for k in results[0] if k.startswith("ours")]
    print("| dtype | D | N | causal | " + " | ".join(variants)
          + " | FA2 | cuDNN | ours/cuDNN | ours/FA2 | ours/matmul |")
    print("|" + "---|" * (9 + len(variants)))
    for r in results:
        print(f"| {r['dtype']} | {r['D']} | {r['N']} | {'yes' if r['causal'] else 'no'} | "
              + " | ".join(fmt(r.get(v)) for v in variants)
              + f" | {fmt(r.get('fa2'))} | {fmt(r.get('cudnn'))} | {ratio(r.get('ours'), r.get('cudnn'))} "
              f"| {ratio(r.get('ours'), r.get('fa2'))} | {ratio(r.get('ours'), matmul)} |")


def main():
    data = json.load(open(sys.argv[1]))
    results = data["results"]
    print(f"GPU {data['gpu']}, torch {data['torch']}, cuDNN {data['cudnn']}; "
          f"bf16 8192^3 matmul {data['matmul_bf16_8192_tflops']:.0f} TFLOP/s\n")
    if any(r.get("mode") == "fwdbwd" for r in results):
        grid(results)
    else:
        forward(results, data["matmul_bf16_8192_tflops"])


if __name__ == "__main__":
    main()
