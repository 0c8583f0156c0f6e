"""One decode call of fa_fwd_kvcache for a profiler to look at (scripts/device_profile.sh).

    ncu --clock-control none --kernel-name regex:split_kv --launch-skip 1 --launch-count 1 \
        python3 bench/gpu/profile_decode.py --batch 64 --cache 32768 [--paged 16]

Shapes as bench_decode.py's: Sq = 1, bf16, D = 128, Hkv = 8, H = 32. Two calls: the first warms up
(module load, function attributes), the profiler skips it. With --sdpa cudnn|flash|efficient the
calls are torch SDPA's on the same cache instead ((B, Hkv, S, D) views, enable_gqa), as bench_decode.py
times them, so that its kernel can be profiled next to ours.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decode import KvCache, make_paged  # noqa: E402
from fa_ctypes import FlashAttn  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default=None)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cache", type=int, default=32768)
    parser.add_argument("--paged", type=int, default=0, help="page size (0: contiguous cache)")
    parser.add_argument("--splits", type=int, default=0)
    parser.add_argument("--sdpa", choices=("cudnn", "flash", "efficient"), default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    batch, seqlen, heads, heads_kv, dim = args.batch, args.cache, 32, 8, 128
    k_cache = torch.randn(batch, seqlen, heads_kv, dim, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, 1, heads, dim, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
    table = None
    if args.sdpa:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION}[args.sdpa]
        qh, kh, vh = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        for _ in range(2):
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
        torch.cuda.synchronize()
        return
    if args.paged:
        k_cache, v_cache, table = make_paged(k_cache, v_cache, args.paged)
    run = KvCache(FlashAttn(args.lib)).call(q, k_cache, v_cache, out, seqlens, block_table=table,
                                            num_splits=args.splits)
    for _ in range(2):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
