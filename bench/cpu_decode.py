"""flashattn's CPU KV-cache decode side by side with torch's CPU SDPA, one process.

Issue 6's decode shape (bf16, head dim 128, Hkv = 8, H = 32, one query token) on a contiguous cache,
B in 1 and 8, cache lengths 4k and 32k (and 128k at B = 1); the same thread count for both. Ours runs
through the C API (fa_ctypes, $FLASHATTN_LIB); torch's is F.scaled_dot_product_attention on the
same cache seen as (B, Hkv, S, D) with enable_gqa. The anchor is the machine's memory: a torch copy
of K and V (read + write bytes) in the same run. Medians over interleaved repetitions; prints a
table and writes JSON.

    FLASHATTN_LIB=build-cpu/libflashattn.so python3 bench/cpu_decode.py --threads 2 [--json out.json]

--base LIB adds another build of the library (an A/B) as a column timed in the same interleaved rounds;
--page-size N adds ours on a paged copy of the cache (pages of N rows in a shuffled block table), likewise.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_vs_torch import interleaved_medians  # noqa: E402
from fa_ctypes import FlashAttn  # noqa: E402

CELLS = [(1, 4096), (1, 32768), (1, 131072), (8, 4096), (8, 32768)]
HKV, H, D = 8, 32, 128


def paged_copy(cache, page, table):
    """cache (B, S, Hkv, D) as pages of `page` rows, page i of row b at block table[b, i]."""
    b, s = cache.shape[:2]
    padded = torch.zeros(b, table.shape[1] * page, *cache.shape[2:], dtype=cache.dtype)
    padded[:, :s] = cache
    blocks = torch.empty(table.numel(), page, *cache.shape[2:], dtype=cache.dtype)
    blocks[table.flatten().long()] = padded.view(-1, page, *cache.shape[2:])
    return blocks


def run_cell(fa, b, s, threads, reps, base=None, page_size=0):
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(b, s, HKV, D, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(b, s, HKV, D, generator=gen).to(torch.bfloat16)
    q = torch.randn(b, 1, H, D, generator=gen).to(torch.bfloat16)
    seqlens = torch.full((b,), s, dtype=torch.int32)
    out = torch.empty_like(q)
    args = fa.kvcache_args(q, k_cache, v_cache, out, cache_seqlens=seqlens, num_threads=threads)
    base_out = torch.empty_like(q)
    base_args = base.kvcache_args(q, k_cache, v_cache, base_out, cache_seqlens=seqlens, num_threads=threads) \
        if base is not None else None
    if page_size:  # a shuffled block table, as a serving engine's pages end up
        table = torch.randperm(b * ((s + page_size - 1) // page_size), generator=gen).view(b, -1).to(torch.int32)
        k_pages, v_pages = paged_copy(k_cache, page_size, table), paged_copy(v_cache, page_size, table)
        paged_out = torch.empty_like(q)
        paged_args = fa.kvcache_args(q, k_pages, v_pages, paged_out, cache_seqlens=seqlens, block_table=table,
                                     num_threads=threads)
    q_t, k_t, v_t = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    source = torch.cat([k_cache.flatten(), v_cache.flatten()])
    target = torch.empty_like(source)

    def ours():
        fa.fwd_kvcache(args)

    def sdpa():
        return F.scaled_dot_product_attention(q_t, k_t, v_t, enable_gqa=True)

    def copy():
        target.copy_(source)

    def base_call():
        base.fwd_kvcache(base_args)

    def paged():
        fa.fwd_kvcache(paged_args)

    # Each build runs right after a copy (the copy evicts the cache from L3), so that a cache that
    # fits L3 does not favour the call that follows another one on the same cache.
    arms = [ours, sdpa, copy] + ([base_call, copy] if base is not None else []) + ([paged, copy] if page_size else [])
    t_ours, t_sdpa, t_copy, *t_more = interleaved_medians(arms, reps)
    t_base = t_more[:2] if base is not None else []
    t_paged = t_more[-2:] if page_size else []
    diff = (out.float() - sdpa().transpose(1, 2).float()).abs().max().item()
    kv_bytes = 2 * b * s * HKV * D * 2
    extra = {}
    if page_size:
        extra |= {"page_size": page_size, "paged_ms": t_paged[0] * 1e3, "paged_gbs": kv_bytes / t_paged[0] / 1e9,
                  "paged_vs_contiguous": t_paged[0] / t_ours,
                  "max_abs_diff_paged": (out.float() - paged_out.float()).abs().max().item()}
    if base is not None:
        extra |= {"base_ms": t_base[0] * 1e3, "base_gbs": kv_bytes / t_base[0] / 1e9, "ours_vs_base": t_base[0] / t_ours,
                  "max_abs_diff_vs_base": (out.float() - base_out.float()).abs().max().item()}
    return extra | {
        "B": b, "cache": s, "threads": threads, "kv_bytes": kv_bytes,
        "ours_ms": t_ours * 1e3, "sdpa_ms": t_sdpa * 1e3, "copy_ms": t_copy * 1e3,
        "ours_gbs": kv_bytes / t_ours / 1e9, "sdpa_gbs": kv_bytes / t_sdpa / 1e9,
        "copy_gbs_read_plus_write": 2 * kv_bytes / t_copy / 1e9,
        "ours_vs_sdpa": t_sdpa / t_ours, "max_abs_diff_vs_sdpa": diff,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--cells", help="B:cache pairs, comma-separated (default: the issue's five)")
    parser.add_argument("--base", help="another build of libflashattn.so, timed in the same rounds")
    parser.add_argument("--page-size", type=int, default=0, help="also time ours on a paged copy of the cache")
    parser.add_argument("--json")
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    fa = FlashAttn()
    base = FlashAttn(a.base) if a.base else None
    load = os.getloadavg()
    print(f"torch {torch.__version__}, {a.threads} threads, median of {a.reps} interleaved, "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'B':>2} {'cache':>7} | {'ours ms':>8} {'GB/s':>6} | {'sdpa ms':>8} {'GB/s':>6} | {'x':>5} | "
          f"{'copy r+w GB/s':>13} | max diff" + (f" | {'base ms':>8} {'GB/s':>6} {'x base':>6}" if base else "")
          + (f" | {'paged ms':>8} {'/ contig':>8}" if a.page_size else ""))
    rows = []
    cells = [tuple(int(x) for x in c.split(":")) for c in a.cells.split(",")] if a.cells else CELLS
    for b, s in cells:
        r = run_cell(fa, b, s, a.threads, a.reps, base, a.page_size)
        rows.append(r)
        line = (f"{b:>2} {s:>7} | {r['ours_ms']:8.2f} {r['ours_gbs']:6.1f} | {r['sdpa_ms']:8.2f} {r['sdpa_gbs']:6.1f} | "
                f"{r['ours_vs_sdpa']:5.2f} | {r['copy_gbs_read_plus_write']:13.1f} | {r['max_abs_diff_vs_sdpa']:.1e}")
        if base:
            line += f" | {r['base_ms']:8.2f} {r['base_gbs']:6.1f} {r['ours_vs_base']:6.2f}"
        if a.page_size:
            line += f" | {r['paged_ms']:8.2f} {r['paged_vs_contiguous']:8.3f}"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": a.threads, "reps": a.reps, "base": a.base,
                       "page_size": a.page_size,
                       "load_start": load,
                       "load_end": os.getloadavg(), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
