"""python -m flashattn.bench: flashattn side by side with torch's SDPA backends and FlexAttention.

One process, the same inputs for every backend: progress while it runs, a table at the end, JSON,
and PNG plots (TFLOP/s vs sequence length; peak memory vs sequence length, where the math path runs
out of memory) when matplotlib is installed. On the CPU use small sizes, e.g.
    python -m flashattn.bench --device cpu --seqlens 128 256 --heads 2 --head-dim 64
Peak memory is measured on CUDA (torch.cuda.max_memory_allocated above the inputs); on the CPU it
is not measured and reported as null.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import flashattn

SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-math": "MATH"}
ALL_BACKENDS = ["flashattn", *SDPA_BACKENDS, "flex"]


def _flops(b, h, s, d, causal, mode):
    f = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd_bwd" else 1.0)  # backward = 2.5x forward


def _make_fn(backend, causal):
    if backend == "flashattn":
        return lambda q, k, v: flashattn.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if backend in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kind = getattr(SDPBackend, SDPA_BACKENDS[backend])

        def fn(q, k, v):
            with sdpa_kernel(kind):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fn
    if backend == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        compiled = torch.compile(flex_attention)
        masks = {}

        def fn(q, k, v):
            if not causal:
                return compiled(q, k, v)
            s = q.shape[-2]
            if s not in masks:
                masks[s] = create_block_mask(lambda b, h, i, j: i >= j, None, None, s, s, device=q.device)
            return compiled(q, k, v, block_mask=masks[s])
        return fn
    raise ValueError(f"backend: expected one of {ALL_BACKENDS}, got {backend!r}")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_one(backend, b, h, s, d, dtype, device, causal, mode, warmup, repeats):
    """Median seconds and peak bytes of one configuration; status 'ok', 'OOM' or 'unsupported: ...'."""
    fn = _make_fn(backend, causal)
    q, k, v = (torch.randn(b, h, s, d, dtype=dtype, device=device, requires_grad=mode == "fwd_bwd")
               for _ in range(3))
    dout = torch.randn(b, h, s, d, dtype=dtype, device=device)

    def step():
        out = fn(q, k, v)
        if mode == "fwd_bwd":
            torch.autograd.grad(out, (q, k, v), dout)
    try:
        for _ in range(warmup):
            step()
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else None
        return "ok", sorted(times)[len(times) // 2], peak
    except torch.OutOfMemoryError:
        return "OOM", None, None
    except MemoryError:
        return "OOM", None, None
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "out of memory" in msg.lower():
            return "OOM", None, None
        return f"unsupported: {msg[:80]}", None, None
    finally:
        del q, k, v, dout
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _table(rows):
    header = f"{'backend':<15} {'seqlen':>7} {'ms':>10} {'TFLOP/s':>9} {'peak MiB':>9}  status"
    lines = [header, "-" * len(header)]
    for r in rows:
        ms = f"{r['seconds'] * 1e3:.3f}" if r["seconds"] else "-"
        tf = f"{r['tflops']:.3f}" if r["tflops"] else "-"
        mem = f"{r['peak_bytes'] / 2**20:.1f}" if r["peak_bytes"] is not None else "-"
        lines.append(f"{r['backend']:<15} {r['seqlen']:>7} {ms:>10} {tf:>9} {mem:>9}  {r['status']}")
    return "\n".join(lines)


def _plots(rows, plot_dir, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return []
    plot_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, ylabel, fname in (("tflops", "TFLOP/s", "tflops.png"), ("peak_bytes", "peak memory (MiB)", "memory.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        drew = False
        for backend in dict.fromkeys(r["backend"] for r in rows):
            pts = [(r["seqlen"], r[key] / (2**20 if key == "peak_bytes" else 1)) for r in rows
                   if r["backend"] == backend and r[key] is not None]
            ooms = [r["seqlen"] for r in rows if r["backend"] == backend and r["status"] == "OOM"]
            if pts:
                line, = ax.plot(*zip(*pts), marker="o", label=backend)
                drew = True
                for s in ooms:
                    ax.axvline(s, color=line.get_color(), linestyle=":", alpha=0.6)
                    ax.annotate(f"{backend} OOM", (s, ax.get_ylim()[1] * 0.9), rotation=90, fontsize=7,
                                color=line.get_color())
        if not drew:
            plt.close(fig)
            continue
        ax.set_xscale("log", base=2)
        if key == "peak_bytes":
            ax.set_yscale("log")  # materialized attention grows as N^2, the others as N
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = plot_dir / fname
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(str(path))
    return paths


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m flashattn.bench", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, choices=["fp32", "fp16", "bf16"],
                   help="default: bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--seqlens", type=int, nargs="+", default=None)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--mode", choices=["fwd", "fwd_bwd"], default="fwd")
    p.add_argument("--backends", nargs="+", default=None, choices=ALL_BACKENDS,
                   help="default: all on CUDA; flashattn, sdpa-flash and sdpa-math on the CPU")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="CPU threads for both libraries (0: default)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--plot-dir", type=Path, default=None, help="write tflops.png and memory.png here")
    a = p.parse_args(argv)

    device = torch.device(a.device)
    cuda = device.type == "cuda"
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.dtype or ("bf16" if cuda else "fp32")]
    seqlens = a.seqlens or ([512, 1024, 2048, 4096, 8192, 16384, 32768] if cuda else [128, 256, 512])
    heads = a.heads or (16 if cuda else 2)
    batch = a.batch or 1
    backends = a.backends or (ALL_BACKENDS if cuda else ["flashattn", "sdpa-flash", "sdpa-math"])
    if "flex" in backends:
        try:
            importlib.import_module("torch.nn.attention.flex_attention")
        except ImportError:
            print("FlexAttention is not available in this torch: skipped", file=sys.stderr)
            backends = [b for b in backends if b != "flex"]
    if a.threads:
        torch.set_num_threads(a.threads)
        flashattn.set_num_threads(a.threads)

    rows = []
    total = len(seqlens) * len(backends)
    for n, (s, backend) in enumerate(((s, b) for s in seqlens for b in backends), 1):
        print(f"[{n}/{total}] {backend} seqlen={s} ...", end=" ", flush=True, file=sys.stderr)
        status, secs, peak = run_one(backend, batch, heads, s, a.head_dim, dtype, device, a.causal, a.mode,
                                     a.warmup, a.repeats)
        tflops = _flops(batch, heads, s, a.head_dim, a.causal, a.mode) / secs / 1e12 if secs else None
        rows.append(dict(backend=backend, seqlen=s, status=status, seconds=secs, tflops=tflops, peak_bytes=peak))
        print(status if status != "ok" else f"{secs * 1e3:.3f} ms", file=sys.stderr, flush=True)

    config = dict(device=str(device), dtype=str(dtype).replace("torch.", ""), batch=batch, heads=heads,
                  head_dim=a.head_dim, causal=a.causal, mode=a.mode, torch=torch.__version__,
                  flashattn=flashattn.__version__,
                  gpu=torch.cuda.get_device_name(device) if cuda else None)
    title = (f"{config['gpu'] or 'CPU'} {config['dtype']} B={batch} H={heads} D={a.head_dim} "
             f"{'causal ' if a.causal else ''}{a.mode}")
    print(title)
    print(_table(rows))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(dict(config=config, results=rows), indent=2))
        print(f"wrote {a.json}")
    if a.plot_dir:
        for path in _plots(rows, a.plot_dir, title):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
