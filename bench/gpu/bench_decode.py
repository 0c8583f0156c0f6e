"""Decode benchmark of fa_fwd_kvcache (split-KV) against a device-to-device copy and torch SDPA.

Sq = 1, bf16, D = 128, Hkv = 8, H = 32 (GQA 4), batch 1, 8, 64, cache 4k, 32k, 128k, all in one process:
  * copy: dst.copy_(src) of 4 GiB; bandwidth = bytes read + bytes written per second (the DRAM roof)
  * ours: fa_fwd_kvcache on the contiguous cache (B, S, Hkv, D) and on a paged cache of page size 16
    (pages in a random order); bandwidth = K/V bytes read per second
  * torch SDPA, backends cuDNN / flash / efficient, on the same cache ((B, Hkv, S, D) views, enable_gqa)
Timing: CUDA graphs of at least 8 calls (MIN_CALLS_PER_GRAPH), CUDA events with a GPU spin queued ahead of the
start event (no launch or Python overhead in the numbers), after untimed rounds that keep the GPU busy for 0.2 s
(warm_up), median of 9 rounds (--rounds) that replay every column's graph once, each round in its own random
order (ours, the references, the SDPA backends; the paged caches in rounds of their own with ours again,
paged16_vs_contig their ratio). Caches smaller than 4x the L2 are replicated and the graph's calls walk the
copies, so every call reads from DRAM. Also: a num_splits sweep (the heuristic's justification;
--sweep picks its cells, its counts timed in the same interleaved rounds) and a decode step with append + rotary.
Columns *_plain_ms: ours again with FLASHATTN_DECODE_PDL=0 (no programmatic dependent launch of the decode
kernels), an A/B of that launch in one process; paged16_one_per_sm_ms: paged 16 again with
FLASHATTN_DECODE_PAGED_BLOCKS_PER_SM=1 (the split count of a contiguous cache; paged16_ms takes the default, two
blocks per SM on paged caches); paged16_in_order_ms: the paged walk on the contiguous cache's own bytes, each row's
pages in order (pages_in_order), which tells the walk's cost from the shuffled pages'. --reference-lib builds are
timed on the contiguous cache with ours (ref_ms, ...), on the paged one in the paged rounds (ref_paged16_ms) and at
each count of the sweeps (keys "ref:N").

usage: python3 bench/gpu/bench_decode.py --lib build/libflashattn.so --out DIR
"""
import argparse
import contextlib
import ctypes
import json
import math
import os
import random
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from fa_ctypes import FaKvcacheArgs, FlashAttn  # noqa: E402
from gpu_monitor import GpuMonitor, describe  # noqa: E402

GIB = 1 << 30
L2_BYTES = 60 << 20


class KvCache:
    def __init__(self, fa):
        self.fa = fa  # FlashAttn declares the fa_*kvcache* entry points (fa_ctypes.py)

    def call(self, q, k_cache, v_cache, out, cache_seqlens, block_table=None, num_splits=0, k_new=None, v_new=None,
             cos=None, sin=None, causal=True):
        """Returns a closure that runs the call with a workspace allocated once."""
        t = self.fa.tensor
        args = FaKvcacheArgs()
        self.fa.lib.fa_kvcache_args_init(ctypes.byref(args))
        args.q, args.k_cache, args.v_cache, args.out = t(q), t(k_cache), t(v_cache), t(out)
        args.cache_seqlens, args.block_table = t(cache_seqlens), t(block_table)
        args.k_new, args.v_new, args.rotary_cos, args.rotary_sin = t(k_new), t(v_new), t(cos), t(sin)
        args.num_splits = num_splits
        args.opts.causal = 1 if causal else 0
        args.opts.stream = torch.cuda.current_stream().cuda_stream
        size = ctypes.c_size_t(0)
        self._check(self.fa.lib.fa_fwd_kvcache_workspace_size(ctypes.byref(args), ctypes.byref(size)))
        ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)

        def run():
            args.opts.stream = torch.cuda.current_stream().cuda_stream
            self._check(self.fa.lib.fa_fwd_kvcache(ctypes.byref(args), ws.data_ptr(), size.value))
        return run

    def _check(self, status):
        if status != 0:
            raise RuntimeError(f"fa_fwd_kvcache failed ({status}): {self.fa.lib.fa_last_error().decode()}")


def eager_time_ms(fns, reps=5):
    """Median time of one call, launched from Python (for calls that cannot be captured)."""
    for fn in fns:
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for fn in fns:
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(fns))
    return statistics.median(times)


@contextlib.contextmanager
def environment(name, value):
    """os.environ[name] = value for the calls (and captures) inside: the library reads its FLASHATTN_DECODE_*
    variables per call. Make the calls' closures inside too: their workspace is sized when they are made."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


def plain_stream_order():
    """FLASHATTN_DECODE_PDL=0: the decode kernels in plain stream order."""
    return environment("FLASHATTN_DECODE_PDL", "0")


def capture_graph(fns):
    """fns (one per cache copy) run once, warmed up on the capture stream, then captured into one CUDA graph."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for fn in fns:  # warm-up on the capture stream (cuBLAS / cuDNN handles, func attributes)
            fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for fn in fns:
                fn()
    torch.cuda.synchronize()
    graph.replay()
    # The graph holds the calls' addresses, not their buffers: kept alive with it, or each workspace (a closure's
    # tensor) is freed here, and the next capture's empty_cache unmaps it before this graph's next replay
    # (session 30: an illegal address in a sweep).
    graph.calls = list(fns)
    return graph


ROUNDS = 9  # --rounds
WARMUP_SECONDS = 0.2
# A spin of the GPU queued ahead of each timed replay, some 100 us at 2 GHz: the host queues the start event, the
# replay and the end event while it spins, so the interval holds the graph's calls and not the host's latency to
# launch it. (Without it that latency fell inside every interval, divided by the graph's calls: 0.5 us a call at
# B = 1 32k, 1.7-6.5 us where a graph held one call, on an H100 in session 34.)
HOST_COVER_CYCLES = 200_000
# Calls in a timed graph, the cache copies in turn (at 537 MB and more, one copy read again, which leaves none of
# it in the L2 for the next call): a graph replay's own start on the GPU is no call's cost. With one call a graph
# at 537 MB and more, and two at 134 MB, that start fell on each call whole or by half (session 34).
MIN_CALLS_PER_GRAPH = 8


def warm_up(graphs):
    """Untimed rounds of every graph until they have kept the GPU busy for WARMUP_SECONDS. Right after heavy DRAM
    traffic (the copy benchmark, the B = 64 cells) the next graphs run 12-17 % slow until some tens of ms of GPU
    work have passed; idling does not end it (decode_after_load.py, session 32: 50 replays of the decode step, 18
    ms, left it slow, 200 replays, 72 ms, did not)."""
    busy_ms = 0.0
    while busy_ms < WARMUP_SECONDS * 1e3:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for graph in graphs.values():
            graph.replay()
        end.record()
        end.synchronize()
        busy_ms += start.elapsed_time(end)


def time_graphs_interleaved(graphs, calls, rounds=None, uncovered=()):
    """Median time of one call of each graph ({name: graph of `calls` calls}), in rounds that replay every graph
    once: a clock ramp or drift falls on every column alike. (Timing each column in its own block put the first
    one 0.4-0.5 us above the same kernels timed again after the others at B = 1 4k, session 24.) Each round
    replays the columns in a fresh random order (seeded), so no column always runs first or right after the same
    one: with the order only rotated, ours ran right after SDPA flash in every round it did not open and read 1.7,
    2.9 and 60 us slower at B = 8 4k, 32k and 128k than the same build as a reference column (H200, session 37).
    Columns named in `uncovered` are timed without the spin ahead of the start event (HOST_COVER_CYCLES). `calls`:
    the calls of every graph, or {name: calls}."""
    names = list(graphs)
    times = {name: [] for name in names}
    warm_up(graphs)
    order = random.Random(0)
    for _ in range(rounds or ROUNDS):
        for name in order.sample(names, len(names)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if name not in uncovered:
                torch.cuda._sleep(HOST_COVER_CYCLES)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / (calls[name] if isinstance(calls, dict) else calls))
    return {name: statistics.median(values) for name, values in times.items()}


def graph_time_ms(fns, reps=5):
    """Median time of one call: fns (one per cache copy) captured into a CUDA graph, replayed."""
    return time_graphs_interleaved({"one": capture_graph(fns)}, len(fns), rounds=reps)["one"]


def copy_bandwidth():
    """The best of a few device-to-device copies of 4 GiB (bytes read + written per second)."""
    best = 0.0
    for dtype in (torch.uint8, torch.float32, torch.bfloat16):
        src = torch.empty(4 * GIB // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device="cuda")
        dst = torch.empty_like(src)
        for timer in (graph_time_ms, eager_time_ms):
            ms = timer([lambda: dst.copy_(src)])
            best = max(best, 2 * 4 * GIB / (ms * 1e-3) / 1e9)
        del src, dst
    return best


def parse_cell(cell):
    """(B, S, page) of "BxS", or of "BxSpP" for a paged cache of P-row pages (page 0: contiguous)."""
    batch, rest = cell.split("x")
    keys, _, page = rest.partition("p")
    return int(batch), int(keys), int(page or 0)


def make_paged(k_cache, v_cache, page):
    """The same keys in pages of `page` rows, pages shuffled; returns (k_pages, v_pages, block_table)."""
    b, s, hkv, d = k_cache.shape
    blocks = s // page
    order = torch.randperm(b * blocks, device="cuda")
    k_pages = torch.empty(b * blocks, page, hkv, d, dtype=k_cache.dtype, device="cuda")
    v_pages = torch.empty_like(k_pages)
    k_pages[order] = k_cache.view(b * blocks, page, hkv, d)
    v_pages[order] = v_cache.view(b * blocks, page, hkv, d)
    return k_pages, v_pages, order.view(b, blocks).to(torch.int32)


def pages_in_order(k_cache, v_cache, page):
    """The contiguous cache itself as pages of `page` rows, each row's pages in order (views, no copy): the paged
    walk on the contiguous cache's bytes, which tells its own cost from the shuffled pages'."""
    b, s, hkv, d = k_cache.shape
    table = torch.arange(b * (s // page), dtype=torch.int32, device="cuda").view(b, s // page)
    return k_cache.view(-1, page, hkv, d), v_cache.view(-1, page, hkv, d), table


def sdpa_calls(caches, backend):
    """torch SDPA on each cache copy ((B, Hkv, S, D) views, enable_gqa)."""
    fns = []
    for q, k, v, _ in caches:
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

        def fn(qh=qh, kh=kh, vh=vh):
            # A backend that refuses the shape warns at every call; its error is reported in the row instead.
            with sdpa_kernel(backend), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
        fns.append(fn)
    return fns


def bench_config(kv, B, S, H=32, Hkv=8, D=128, dtype=torch.bfloat16, sdpa=True, paged=True, references=()):
    """One (B, S) cell. Round 1 times ours (also without the spin that hides the host's launch latency: the
    same graph, "ours_uncovered"), ours without PDL, the reference builds and the SDPA backends in
    the same rounds; round 2, once the SDPA graphs are freed, ours against the paged caches (which need a
    second copy of the keys) in rounds of their own."""
    kv_bytes = 2 * B * S * Hkv * D * 2
    copies = max(1, math.ceil(4 * L2_BYTES / kv_bytes))
    calls = max(copies, MIN_CALLS_PER_GRAPH)
    row = dict(batch=B, cache=S, kv_bytes=kv_bytes, copies=copies, calls=calls)
    unique = []
    for _ in range(copies):
        k_cache = torch.randn(B, S, Hkv, D, dtype=dtype, device="cuda")
        v_cache = torch.randn(B, S, Hkv, D, dtype=dtype, device="cuda")
        q = torch.randn(B, 1, H, D, dtype=dtype, device="cuda")
        unique.append((q, k_cache, v_cache, torch.empty(B, 1, H, D, dtype=dtype, device="cuda")))
    caches = [unique[i % copies] for i in range(calls)]  # a graph's calls, the copies in turn
    seqlens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    ours = capture_graph([kv.call(q, k, v, o, seqlens) for q, k, v, o in caches])
    q, k_cache, v_cache, out = caches[0]
    qh, kh, vh = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    if B * S <= 32768:  # a spot check of our output (the last replay's) against fp32 math on batch row 0
        ref = F.scaled_dot_product_attention(qh[:1].float(), kh[:1].float().repeat_interleave(H // Hkv, 1),
                                             vh[:1].float().repeat_interleave(H // Hkv, 1))
        row["max_abs_err_vs_fp32"] = (out[:1].transpose(1, 2).float() - ref).abs().max().item()
    graphs = {"ours": ours, "ours_uncovered": ours}
    with plain_stream_order():
        graphs["ours_plain"] = capture_graph([kv.call(q, k, v, o, seqlens) for q, k, v, o in caches])
    for label, reference in references:  # other builds of the library on the same caches
        graphs[label] = capture_graph([reference.call(q, k, v, o, seqlens) for q, k, v, o in caches])
    graph_calls = {name: calls for name in graphs}
    if copies < calls:  # ours in a graph of one call per copy, as timed until session 34
        graphs["ours_per_copy"] = capture_graph([kv.call(q, k, v, o, seqlens) for q, k, v, o in unique])
        graph_calls["ours_per_copy"] = copies
    eager = {}
    if sdpa:
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                fns = sdpa_calls(caches, backend)
                try:
                    graphs[f"sdpa_{name}"] = capture_graph(fns)
                except RuntimeError as capture_error:  # not capturable: timed eagerly after the rounds, and said so
                    torch.cuda.synchronize()
                    eager[name] = fns
                    row[f"sdpa_{name}_timing"] = "eager: " + str(capture_error).splitlines()[0][:100]
            except Exception as error:  # noqa: BLE001 (a backend that refuses the shape is reported, not fatal)
                row[f"sdpa_{name}_ms"] = None
                row[f"sdpa_{name}_error"] = str(error).splitlines()[0][:160]
    graph_calls.update({name: calls for name in graphs if name not in graph_calls})  # the SDPA backends
    for name, ms in time_graphs_interleaved(graphs, graph_calls, uncovered=("ours_uncovered",)).items():
        row[f"{name}_ms"] = ms
    for name, fns in eager.items():
        try:
            row[f"sdpa_{name}_ms"] = eager_time_ms(fns)
        except RuntimeError as error:  # the capture failed because the backend refuses the shape
            row[f"sdpa_{name}_ms"] = None
            row[f"sdpa_{name}_error"] = str(error).splitlines()[0][:160]
    row["ours_GBps"] = kv_bytes / (row["ours_ms"] * 1e-3) / 1e9
    del graphs, eager
    torch.cuda.empty_cache()
    if paged:
        paged_args, in_order_args = [], []
        for q, k, v, o in unique:
            k_pages, v_pages, table = make_paged(k, v, 16)
            paged_args.append((q, k_pages, v_pages, o, table))
            k_in_order, v_in_order, in_order_table = pages_in_order(k, v, 16)
            in_order_args.append((q, k_in_order, v_in_order, o, in_order_table))
        paged_args = [paged_args[i % copies] for i in range(calls)]
        in_order_args = [in_order_args[i % copies] for i in range(calls)]
        graphs = {"ours": ours}
        graphs["paged16"] = capture_graph(
            [kv.call(q, k, v, o, seqlens, block_table=t) for q, k, v, o, t in paged_args])
        graphs["paged16_in_order"] = capture_graph(
            [kv.call(q, k, v, o, seqlens, block_table=t) for q, k, v, o, t in in_order_args])
        with environment("FLASHATTN_DECODE_PAGED_BLOCKS_PER_SM", "1"):  # the contiguous cache's split count
            graphs["paged16_one_per_sm"] = capture_graph(
                [kv.call(q, k, v, o, seqlens, block_table=t) for q, k, v, o, t in paged_args])
        for label, reference in references:  # the reference builds on the same paged caches, same rounds
            graphs[f"{label}_paged16"] = capture_graph(
                [reference.call(q, k, v, o, seqlens, block_table=t) for q, k, v, o, t in paged_args])
        paged_ms = time_graphs_interleaved(graphs, len(caches))
        for label, _ in references:
            row[f"{label}_paged16_ms"] = paged_ms[f"{label}_paged16"]
        row["paged16_ms"] = paged_ms["paged16"]
        row["paged16_one_per_sm_ms"] = paged_ms["paged16_one_per_sm"]
        row["paged16_in_order_ms"] = paged_ms["paged16_in_order"]
        row["ours_ms_paged_rounds"] = paged_ms["ours"]
        row["paged16_vs_contig"] = paged_ms["paged16"] / paged_ms["ours"]
        row["paged16_one_per_sm_vs_contig"] = paged_ms["paged16_one_per_sm"] / paged_ms["ours"]
        row["paged16_in_order_vs_contig"] = paged_ms["paged16_in_order"] / paged_ms["ours"]
        del graphs, paged_args, in_order_args, k_pages, v_pages
    del ours, caches, unique
    torch.cuda.empty_cache()
    return row


def split_sweep(kv, B, S, H=32, Hkv=8, D=128, page=0, references=()):
    """Our call at each num_splits (0: the heuristic's), on a contiguous cache or, with `page`, a paged one;
    each reference build's at the same counts in the same rounds (keys "label:count")."""
    k = torch.randn(B, S, Hkv, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    copies = max(1, math.ceil(4 * L2_BYTES / (2 * k.numel() * 2)))
    ks = [(k, v)] + [(torch.randn_like(k), torch.randn_like(v)) for _ in range(copies - 1)]
    ks = [(kc, vc, None) for kc, vc in ks] if not page else [make_paged(kc, vc, page) for kc, vc in ks]
    ks = [ks[i % copies] for i in range(max(copies, MIN_CALLS_PER_GRAPH))]
    q = torch.randn(B, 1, H, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    seqlens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    # Every count's graph in the same rounds, as the table's columns: timed one after another, a clock drift
    # during the sweep read as a trend over the counts (session 29: 215 us at 0-16 splits, 190 at 64, B = 1 128k).
    builds = [("", kv)] + [(f"{label}:", reference) for label, reference in references]
    graphs = {f"{prefix}{splits}": capture_graph([build.call(q, kc, vc, out, seqlens, block_table=table,
                                                             num_splits=splits) for kc, vc, table in ks])
              for prefix, build in builds for splits in (0, 1, 2, 4, 8, 16, 24, 32, 48, 64, 128)}
    return time_graphs_interleaved(graphs, len(ks))


def decode_step_with_append(kv, B=8, S=32768, H=32, Hkv=8, D=128):
    """One real decode step: append one token with NeoX rotary into a paged (16) cache, then attend."""
    k_cache = torch.randn(B * S // 16, 16, Hkv, D, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    table = torch.randperm(B * S // 16, device="cuda").view(B, S // 16).to(torch.int32)
    q = torch.randn(B, 1, H, D, dtype=torch.bfloat16, device="cuda")
    k_new, v_new = torch.randn(B, 1, Hkv, D, dtype=torch.bfloat16, device="cuda"), torch.randn(
        B, 1, Hkv, D, dtype=torch.bfloat16, device="cuda")
    angles = torch.arange(S, device="cuda", dtype=torch.float32)[:, None] * 10000.0 ** (
        -torch.arange(0, D, 2, device="cuda") / D)
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    seqlens = torch.full((B,), S - 1, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    fn = kv.call(q, k_cache, v_cache, out, seqlens, block_table=table, k_new=k_new, v_new=v_new, cos=cos, sin=sin)
    ms = graph_time_ms([fn])
    with plain_stream_order():
        plain_ms = graph_time_ms([fn])
    return dict(batch=B, cache=S, ms=ms, plain_ms=plain_ms, GBps=2 * B * S * Hkv * D * 2 / (ms * 1e-3) / 1e9)


def main():
    global ROUNDS
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", default=None)
    parser.add_argument("--out", default=".")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reference-lib", action="append", default=[],
                        help="another build (e.g. the previous commit): its contiguous and paged decode timed on "
                             "the same caches in the same rounds as ours (column ref_ms), and each count of the "
                             "sweeps (keys ref:N); repeat it for more builds (ref2_ms, ref3_ms, ...)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="rounds of the interleaved timing of each cell (the median is reported)")
    parser.add_argument("--sweep", default="1x4096,1x32768,1x131072,8x4096,8x32768",
                        help="cells BxS of the num_splits sweep, comma-separated ('' for none); BxSpP: paged, "
                             "pages of P rows")
    parser.add_argument("--no-table", action="store_true", help="skip the decode table (the sweep and the rest only)")
    args = parser.parse_args()
    ROUNDS = args.rounds
    sweep_cells = [parse_cell(cell) for cell in args.sweep.split(",") if cell]
    kv = KvCache(FlashAttn(args.lib))
    references = [("ref" if i == 0 else f"ref{i + 1}", KvCache(FlashAttn(lib)))
                  for i, lib in enumerate(args.reference_lib)]
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
    result["references"] = {label: lib for (label, _), lib in zip(references, args.reference_lib)}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    # The DRAM's peak as the split plan reads it (split_plan.hpp): double data rate, clock in kHz.
    result["dram_peak_GBps"] = 2 * props.memory_clock_rate * 1e3 * props.memory_bus_width / 8 / 1e9
    # Clocks, temperatures and power beside each phase's timings (gpu_monitor.py), for the slow state below.
    monitor = GpuMonitor(torch.cuda.current_device())
    result["gpu_state"] = []
    with monitor.phase("copy") as state:
        result["copy_GBps"] = copy_bandwidth()
    result["gpu_state"].append(state)
    print(f"device-to-device copy: {result['copy_GBps']:.0f} GB/s (read + write); DRAM peak "
          f"{result['dram_peak_GBps']:.0f} GB/s; GPU: {describe(state)}", flush=True)
    # The sweeps and the decode step first: right after the table's B = 64 cells they read 10-18 % slow
    # (session 32: B = 8 4k's heuristic 45.0 us in a sweep after the table against 40.8 in the table and 39.9
    # in a sweep of a process without it, H200; paged B = 8 32k 428 against 364, H100). warm_up() ends that
    # state before every set of timed rounds; this order is kept as a second guard.
    for B, S, page in sweep_cells:
        name = f"split_sweep_B{B}_S{S // 1024}k" if S % 1024 == 0 else f"split_sweep_B{B}_S{S}"
        name += f"_paged{page}" if page else ""
        with monitor.phase(name) as state:
            result[name] = split_sweep(kv, B, S, page=page, references=references)
        result["gpu_state"].append(state)
        print(f"num_splits sweep B={B} S={name.split('_S')[-1]} (ms):",
              {k: round(v, 4) for k, v in result[name].items()}, f"GPU: {describe(state)}", flush=True)
    with monitor.phase("decode_step") as state:
        result["decode_step_append_rotary_paged16"] = decode_step_with_append(kv)
    result["gpu_state"].append(state)
    print("decode step with append + rotary, paged 16:", result["decode_step_append_rotary_paged16"],
          f"GPU: {describe(state)}", flush=True)
    rows = []
    for B in () if args.no_table else (1, 8, 64):
        for S in (4096, 32768, 131072):
            if args.quick and B * S > 8 * 32768:
                continue
            with monitor.phase(f"table_B{B}_S{S // 1024}k") as state:
                row = bench_config(kv, B, S, references=references)
            row["gpu"] = state
            row["ours_vs_copy"] = row["ours_GBps"] / result["copy_GBps"]
            rows.append(row)
            sd = {n: row.get(f"sdpa_{n}_ms") for n in ("cudnn", "flash", "efficient")}
            print(f"B={B:3d} S={S:6d}: ours {row['ours_ms'] * 1e3:8.1f} us {row['ours_GBps']:6.0f} GB/s "
                  f"({100 * row['ours_vs_copy']:.0f}% of copy; without PDL {row['ours_plain_ms'] * 1e3:.1f} us, "
                  f"with the host's launch latency {row['ours_uncovered_ms'] * 1e3:.1f} us"
                  + (f", in graphs of {row['copies']} calls {row['ours_per_copy_ms'] * 1e3:.1f} us"
                     if "ours_per_copy_ms" in row else "") + "), "
                  f"paged16 x{row.get('paged16_vs_contig', 0):.3f} "
                  f"(one block per SM x{row.get('paged16_one_per_sm_vs_contig', 0):.3f}, pages in order "
                  f"x{row.get('paged16_in_order_vs_contig', 0):.3f}), "
                  + ", ".join(f"{n} {v * 1e3:.1f} us" if v else f"{n} n/a" for n, v in sd.items())
                  + "".join(f"; {label} {row[f'{label}_ms'] * 1e3:.1f} us" for label, _ in references)
                  + "".join(f"; {label} paged16 x{row[f'{label}_paged16_ms'] / row['ours_ms_paged_rounds']:.3f}"
                            for label, _ in references if f"{label}_paged16_ms" in row),
                  flush=True)
    result["decode"] = rows
    with open(os.path.join(args.out, "bench_decode.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
