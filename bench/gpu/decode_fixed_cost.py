"""Where the fixed cost of one decode call goes (Sq = 1, bf16, D = 128, Hkv = 8, H = 32).

bench_decode.py's linear fit of its contiguous times (session 15, run 3: B = 8 with 4k keys 45 us and 32k keys
254 us, both with 128 blocks) leaves about 15 us per call that does not grow with the keys. This times, in CUDA
graphs of back-to-back calls as bench_decode.py does:
  * ours on caches of 16, 256 and 4,096 keys, with 1 split, 2 splits and the heuristic's count, with and without
    programmatic dependent launch (FLASHATTN_DECODE_PDL=0);
  * cuDNN's SDPA on the same caches;
  * graphs of one and of two trivial kernels per call: what a kernel node costs by itself.
Each call of a graph reads its own copy of the cache (at least 8 copies, and at least 4x the L2 in all), so
consecutive calls do not find their keys in the L2.

usage: python3 bench/gpu/decode_fixed_cost.py --lib build/libflashattn.so --out DIR
"""
import argparse
import json
import math
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_decode import L2_BYTES, KvCache, graph_time_ms, plain_stream_order  # noqa: E402
from fa_ctypes import FlashAttn  # noqa: E402


def trivial_kernels_us(per_call):
    """Median time of one 'call' of per_call one-element kernels, each depending on the last."""
    x = torch.zeros(1, device="cuda")

    def call():
        for _ in range(per_call):
            x.add_(1.0)
    return graph_time_ms([call] * 32, reps=7) * 1e3


def cache_copies(B, S, H=32, Hkv=8, D=128):
    kv_bytes = 2 * B * S * Hkv * D * 2
    copies = max(8, math.ceil(4 * L2_BYTES / kv_bytes))
    caches = []
    for _ in range(copies):
        k = torch.randn(B, S, Hkv, D, dtype=torch.bfloat16, device="cuda")
        caches.append((torch.randn(B, 1, H, D, dtype=torch.bfloat16, device="cuda"), k, torch.randn_like(k),
                       torch.empty(B, 1, H, D, dtype=torch.bfloat16, device="cuda")))
    return caches


def time_config(kv, B, S):
    caches = cache_copies(B, S)
    seqlens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    row = dict(batch=B, cache=S, copies=len(caches))
    for label, splits in (("ours_1split", 1), ("ours_2splits", 2), ("ours_heuristic", 0)):
        row[label + "_us"] = graph_time_ms([kv.call(q, k, v, o, seqlens, num_splits=splits)
                                            for q, k, v, o in caches], reps=7) * 1e3
        with plain_stream_order():
            row[label + "_plain_us"] = graph_time_ms([kv.call(q, k, v, o, seqlens, num_splits=splits)
                                                      for q, k, v, o in caches], reps=7) * 1e3
    fns = []
    for q, k, v, _ in caches:
        def fn(qh=q.transpose(1, 2), kh=k.transpose(1, 2), vh=v.transpose(1, 2)):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
        fns.append(fn)
    try:
        row["cudnn_us"] = graph_time_ms(fns, reps=7) * 1e3
    except Exception as error:  # noqa: BLE001 (a refusal is reported in the row)
        row["cudnn_us"] = None
        row["cudnn_error"] = str(error).splitlines()[0][:160]
    del caches
    torch.cuda.empty_cache()
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default=None)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    kv = KvCache(FlashAttn(args.lib))
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
    result["trivial_kernel_us"] = {str(n): trivial_kernels_us(n) for n in (1, 2)}
    print("graph of one-element kernels, per call: "
          + ", ".join(f"{n} kernel(s) {us:.2f} us" for n, us in result["trivial_kernel_us"].items()), flush=True)
    rows = []
    print("B  cache | ours 1 split (no PDL) | 2 splits (no PDL) | heuristic (no PDL) | cuDNN   (us per call)")
    for B in (1, 8):
        for S in (16, 256, 4096):
            row = time_config(kv, B, S)
            rows.append(row)
            cudnn = f"{row['cudnn_us']:.1f}" if row["cudnn_us"] else "n/a"
            print(f"{B} {S:6d} | " + " | ".join(
                f"{row[label + '_us']:.1f} ({row[label + '_plain_us']:.1f})"
                for label in ("ours_1split", "ours_2splits", "ours_heuristic")) + f" | {cudnn}", flush=True)
    result["rows"] = rows
    with open(os.path.join(args.out, "decode_fixed_cost.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
