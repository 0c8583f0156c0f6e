#!/usr/bin/env python3
"""Train a small character-level GPT on examples/data/public_domain.txt with a choice of attention.

    python examples/train_gpt.py --attn flashattn sdpa math --steps 200 --context 256      # CPU, a minute
    python examples/train_gpt.py --device cuda --dtype bf16 --context 8192 --layers 4 \
        --attn flashattn sdpa math --steps 300 --plot docs/train_gpt.png                    # GPU, long context

Every run of one invocation starts from the same initial weights and sees the same batches, so the
loss curves of the attention implementations can be compared directly; peak memory is printed
(CUDA: torch.cuda.max_memory_allocated; CPU: the process's peak RSS, which includes torch itself).
The text is repeated when the context is longer than it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import resource
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = Path(__file__).resolve().parent / "data" / "public_domain.txt"


def attention_fn(kind: str):
    """(B, S, 3, H, D) packed qkv -> (B, S, H, D), causal."""
    if kind == "flashattn":
        import flashattn
        return lambda qkv: flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(qkv):
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, S, D) views
        ctx = sdpa_kernel(SDPBackend.MATH) if kind == "math" else contextlib.nullcontext()
        with ctx:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    if kind in ("sdpa", "math"):
        return sdpa
    raise ValueError(f"--attn: expected flashattn, sdpa or math, got {kind!r}")


class Block(nn.Module):
    def __init__(self, dim, heads, attn):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, s, c = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, c // self.heads)
        x = x + self.proj(self.attn(qkv).reshape(b, s, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, dim, heads, layers, attn):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, attn) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def peak_memory_bytes(device):
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def train(kind, a, data, vocab, device):
    torch.manual_seed(a.seed)
    model = GPT(vocab, a.context, a.dim, a.heads, a.layers, attention_fn(kind)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    gen = torch.Generator().manual_seed(a.seed + 1)  # same batches for every attention kind
    amp = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, t0 = [], time.perf_counter()
    for step in range(1, a.steps + 1):
        starts = torch.randint(0, len(data) - a.context - 1, (a.batch,), generator=gen)
        chunk = torch.stack([data[s:s + a.context + 1] for s in starts.tolist()]).to(device)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            logits = model(chunk[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % a.log_every == 0 or step == a.steps:
            print(f"[{kind}] step {step:5d}  loss {loss.item():.4f}  {time.perf_counter() - t0:7.1f}s", flush=True)
    peak = peak_memory_bytes(device)
    print(f"[{kind}] final loss {losses[-1]:.4f}  peak memory {peak / 2**20:.1f} MiB", flush=True)
    return dict(attn=kind, losses=losses, peak_bytes=peak, seconds=time.perf_counter() - t0)


def plot(results, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        ax1.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["attn"], alpha=0.8)
    ax1.set_xlabel("step"), ax1.set_ylabel("training loss"), ax1.legend(), ax1.grid(alpha=0.3)
    ax2.bar([r["attn"] for r in results], [r["peak_bytes"] / 2**20 for r in results])
    ax2.set_ylabel("peak memory (MiB)")
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attn", nargs="+", default=["flashattn"], choices=["flashattn", "sdpa", "math"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="autocast dtype")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--plot", type=Path, default=None, help="PNG with the loss curves and peak memory")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    if a.dim % a.heads:
        p.error("--dim must be a multiple of --heads")

    text = a.data.read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    if len(data) < a.context + 2:
        data = data.repeat(math.ceil((a.context + 2) / len(data)))
    device = torch.device(a.device)
    print(f"{len(text)} characters, vocab {len(chars)}, device {device}, dtype {a.dtype}, context {a.context}")
    results = [train(kind, a, data, len(chars), device) for kind in a.attn]
    if len(results) > 1:
        base = results[0]["losses"]
        for r in results[1:]:
            diff = max(abs(x - y) for x, y in zip(base, r["losses"]))
            print(f"max |loss({results[0]['attn']}) - loss({r['attn']})| over the run: {diff:.2e}")
    if a.json:
        a.json.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(a).items()}, results=results), indent=1))
    if a.plot:
        plot(results, a.plot, f"char GPT, context {a.context}, {a.layers} layers, {a.dtype}, {device}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
