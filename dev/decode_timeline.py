"""Where a split-KV decode call's time goes, block by block, in a CUDA graph of back-to-back calls.

Runs a build of a `timeline` tree (dev/decode_diagnostic_trees.py: the library with globaltimer stamps of thread 0
of every block of the split and combine kernels, written to a buffer named per call by fa_debug_set_timeline) on
the decode table's caches, as bench_decode.py times them (one cache copy per call, 4x the L2 in all, a spin ahead
of the start event). Every call of the graph gets its own buffer, so the stamps show each call and the gaps
between calls. Prints, as medians over the calls of the median replay (us):
  period        one call's wait release to the next one's (the call's time in the graph)
  to 1st copy   a block's wait release to its first slab's copies issued (the prologue: cache length, Q, ranges)
  ring          the first block's wait release to the last block's ring drained; "spread": first to last drain
  epilogue      the last drain to the last exit (merge, partial or output store)
  to combine    the split kernel's last exit to the combine's first wait release (the grid dependency)
  combine       the combine's first wait release to its last exit
  to next       the last exit of the call (combine, or split kernel) to the next call's first wait release
and, on a second line, the combine's blocks: the spread of their wait releases, and each block's own work (its wait
release to its exit), median and max over the blocks, and of that work the part up to the block's LSEs loaded and
their max shared (trees that stamp it, from session 36). The JSON keeps the stamps of the median replay's first three
calls (ns from the first call's first wait release) for a closer look.

usage: python3 dev/decode_timeline.py --lib build-timeline/libflashattn.so [--cells 1x4096,1x4096p16] [--out DIR]
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
from bench_decode import (HOST_COVER_CYCLES, L2_BYTES, MIN_CALLS_PER_GRAPH, KvCache, capture_graph,  # noqa: E402
                          make_paged, parse_cell, warm_up)
from fa_ctypes import FlashAttn  # noqa: E402

# The tree's layout of a call's buffer (uint64): split block k's events at [8 k, 8 k + 8), combine block k's at
# [8192 + 4 k, 8192 + 4 k + 4).
SPLIT_EVENTS, COMBINE_BASE, COMBINE_EVENTS, MAX_BLOCKS = 8, 8 * 1024, 4, 1024
CALL_WORDS = COMBINE_BASE + COMBINE_EVENTS * MAX_BLOCKS
ENTRY, WAITED, FIRST_COPY, DRAINED, EXITED, Q_STAGED = range(6)
C_ENTRY, C_WAITED, C_EXITED, C_LSE_IN = range(4)  # C_LSE_IN: the block's LSEs loaded and their max shared


def call_events(words):
    """{name: list of stamps in ns} of one call's buffer (a list of ints), blocks that stamped only. Every list holds
    globaltimer stamps (summarize takes their differences), so the JSON's raw stamps can all be read alike."""
    split = [words[k * SPLIT_EVENTS:(k + 1) * SPLIT_EVENTS] for k in range(MAX_BLOCKS)]
    split = [block for block in split if block[WAITED] != 0]
    combine = [words[COMBINE_BASE + k * COMBINE_EVENTS:COMBINE_BASE + (k + 1) * COMBINE_EVENTS]
               for k in range(MAX_BLOCKS)]
    combine = [block for block in combine if block[C_WAITED] != 0]
    exits = [block[EXITED] or block[DRAINED] for block in split]  # a tree without the epilogue stamps no exit
    return dict(blocks=len(split), combine_blocks=len(combine),
                waited=[b[WAITED] for b in split], first_copy=[b[FIRST_COPY] for b in split],
                drained=[b[DRAINED] for b in split], exited=exits,
                combine_waited=[b[C_WAITED] for b in combine], combine_exited=[b[C_EXITED] for b in combine],
                # a tree from before session 36 stamps no C_LSE_IN
                combine_lse_in=[b[C_LSE_IN] for b in combine] if all(b[C_LSE_IN] for b in combine) else [])


def summarize(calls):
    """Medians over the calls (all but the last, which has no next call) of the quantities in the docstring."""
    rows = []
    for this, following in zip(calls, calls[1:]):
        start = min(this["waited"])
        split_end = max(this["exited"])
        end = max(this["combine_exited"]) if this["combine_exited"] else split_end
        to_first_copy = [c - w for w, c in zip(this["waited"], this["first_copy"])]
        row = dict(period=min(following["waited"]) - start,
                   first_copy=statistics.median(to_first_copy), first_copy_max=max(to_first_copy),
                   ring=max(this["drained"]) - start, spread=max(this["drained"]) - min(this["drained"]),
                   epilogue=split_end - max(this["drained"]), to_next=min(following["waited"]) - end)
        if this["combine_exited"]:
            row["to_combine"] = min(this["combine_waited"]) - split_end
            row["combine"] = end - min(this["combine_waited"])
            row["combine_release_spread"] = max(this["combine_waited"]) - min(this["combine_waited"])
            work = [e - w for w, e in zip(this["combine_waited"], this["combine_exited"])]
            row["combine_block_work"] = statistics.median(work)
            row["combine_block_work_max"] = max(work)
            if this["combine_lse_in"]:
                row["combine_lse_in"] = statistics.median(
                    l - w for w, l in zip(this["combine_waited"], this["combine_lse_in"]))
        rows.append(row)
    return {key: statistics.median(row[key] for row in rows) / 1e3 for key in rows[0]}


def timeline_cell(fa, kv, B, S, H=32, Hkv=8, D=128, page=0, rounds=15):
    """The stamps of a cell; with `page`, on the same keys in shuffled pages of `page` rows (as the table's)."""
    kv_bytes = 2 * B * S * Hkv * D * 2
    copies = max(1, math.ceil(4 * L2_BYTES / kv_bytes))
    calls = max(copies, MIN_CALLS_PER_GRAPH)
    caches = []
    for _ in range(copies):
        k, v = (torch.randn(B, S, Hkv, D, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        k, v, table = make_paged(k, v, page) if page else (k, v, None)
        caches.append((torch.randn(B, 1, H, D, dtype=torch.bfloat16, device="cuda"), k, v,
                       torch.empty(B, 1, H, D, dtype=torch.bfloat16, device="cuda"), table))
    seqlens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    fns = [kv.call(q, k, v, o, seqlens, block_table=table) for q, k, v, o, table in caches]
    timeline = torch.zeros(calls, CALL_WORDS, dtype=torch.int64, device="cuda")
    set_timeline = fa.lib.fa_debug_set_timeline
    set_timeline.argtypes = [ctypes.c_void_p]

    def stamped(i):
        def call():
            set_timeline(timeline[i].data_ptr())  # read when the call is enqueued, so captured per call
            fns[i % copies]()
        return call
    graph = capture_graph([stamped(i) for i in range(calls)])
    set_timeline(None)
    warm_up({"timeline": graph})
    replays = []
    for _ in range(rounds):
        timeline.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(HOST_COVER_CYCLES)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replays.append((start.elapsed_time(end) * 1e3 / calls, timeline.cpu().tolist()))
    replays.sort(key=lambda replay: replay[0])
    us_per_call, words = replays[len(replays) // 2]
    events = [call_events(call) for call in words]
    stamps = sorted({t for call in events for t in call["waited"] + call["drained"] + call["exited"]})
    steps = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
    origin = min(events[0]["waited"])
    raw = [{key: [t - origin for t in values] for key, values in call.items() if isinstance(values, list)}
           for call in events[:3]]
    result = dict(batch=B, cache=S, page=page, calls=calls, copies=copies, us_per_call_events=us_per_call,
                  split_blocks=events[0]["blocks"], combine_blocks=events[0]["combine_blocks"],
                  timer_step_ns=min(steps) if steps else None, **summarize(events), raw_first_calls_ns=raw)
    del graph, caches, timeline
    torch.cuda.empty_cache()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="libflashattn.so of a timeline tree")
    parser.add_argument("--label", default=None)
    parser.add_argument("--cells", default="1x4096,1x32768,8x4096,1x131072",
                        help="BxS, comma-separated; BxSpP for a paged cache of P-row pages")
    parser.add_argument("--out", default=None, help="directory for timeline_LABEL.json")
    args = parser.parse_args()
    fa = FlashAttn(args.lib)
    kv = KvCache(fa)
    label = args.label or os.path.basename(os.path.dirname(os.path.abspath(args.lib)))
    print(f"{label} on {torch.cuda.get_device_name()}: medians over the calls, us "
          "(period | to 1st copy median/max | ring, spread | epilogue | to combine | combine | to next)")
    results = []
    for cell in args.cells.split(","):
        B, S, page = parse_cell(cell)
        r = timeline_cell(fa, kv, B, S, page=page)
        results.append(r)
        combine = (f"{r['to_combine']:5.2f} | {r['combine']:5.2f}" if "combine" in r else "  -   |   -  ")
        paged = f" paged {page}" if page else ""
        print(f"B={B:2d} S={S:6d}{paged} ({r['split_blocks']} + {r['combine_blocks']} blocks, {r['calls']} calls, "
              f"{r['us_per_call_events']:.2f} us a call by events, timer step {r['timer_step_ns']} ns): "
              f"{r['period']:6.2f} | {r['first_copy']:4.2f}/{r['first_copy_max']:4.2f} | {r['ring']:6.2f}, "
              f"{r['spread']:5.2f} | {r['epilogue']:4.2f} | {combine} | {r['to_next']:5.2f}", flush=True)
        if "combine" in r:
            print(f"      combine blocks: wait releases spread {r['combine_release_spread']:4.2f}, work a block "
                  f"{r['combine_block_work']:4.2f} median, {r['combine_block_work_max']:4.2f} max"
                  + (f", of which to the LSEs' max {r['combine_lse_in']:4.2f}" if "combine_lse_in" in r else ""),
                  flush=True)
    if args.out:
        with open(os.path.join(args.out, f"timeline_{label}.json"), "w") as f:
            json.dump(dict(label=label, gpu=torch.cuda.get_device_name(), cells=results), f, indent=1)


if __name__ == "__main__":
    main()
