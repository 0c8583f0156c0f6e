"""Whether our decode step reads slow after heavy DRAM traffic, and whether the benchmark's warm-up ends it.

Sweeps and the decode step timed right after the copy benchmark or the decode table's B = 64 cells read 10-18 %
slow (BENCHMARKS.md session 32). This times bench_decode's decode step (append + rotary, paged 16, B = 8, 32k; a
fresh cache and graph each time) eight times in a row: in a fresh process; after the copy benchmark and a 1 s
sleep; after our B = 64 128k cell with no warm-up before each step's timed rounds (bench_decode.warm_up), and after
that cell again with the default warm-up. Each line gives the step's time and nvidia-smi's clocks over it
(gpu_monitor.py; without the warm-up a step takes ~15 ms, often too short for a sample).

usage: FLASHATTN_LIB=build/libflashattn.so python3 bench/gpu/decode_after_load.py
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_decode  # noqa: E402
from gpu_monitor import GpuMonitor, describe  # noqa: E402


def steps_in_a_row(kv, monitor, label, count=8):
    start = time.time()
    for i in range(count):
        with monitor.phase(f"{label}_{i}") as state:
            step = bench_decode.decode_step_with_append(kv)
        print(f"{label} {i} t={time.time() - start:5.2f} s: {step['ms'] * 1e3:6.1f} us; GPU: {describe(state)}",
              flush=True)


def main():
    kv = bench_decode.KvCache(bench_decode.FlashAttn(os.environ.get("FLASHATTN_LIB")))
    monitor = GpuMonitor(torch.cuda.current_device())
    bench_decode.ROUNDS = 15
    steps_in_a_row(kv, monitor, "fresh process")
    with monitor.phase("copy") as state:
        bench_decode.copy_bandwidth()
    print("copy benchmark; GPU:", describe(state), flush=True)
    time.sleep(1.0)
    steps_in_a_row(kv, monitor, "after the copy and 1 s")
    for warmup in (0.0, bench_decode.WARMUP_SECONDS):
        with monitor.phase("b64") as state:
            row = bench_decode.bench_config(kv, 64, 131072, sdpa=False)
        print(f"B = 64 128k: ours {row['ours_ms'] * 1e3:.1f} us; GPU: {describe(state)}", flush=True)
        bench_decode.WARMUP_SECONDS = warmup
        steps_in_a_row(kv, monitor, f"after B = 64 128k, {warmup * 1e3:.0f} ms of untimed replays first")


if __name__ == "__main__":
    main()
