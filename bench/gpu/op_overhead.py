"""Where the host time of one flashattn fwd+bwd goes through the Python op layer, on CUDA tensors.

A small problem (B=2, H=16, N=1024, D=128, bf16) is GPU-light, so a step's wall time is the host's.
Prints, per step: wall time with a sync (what `python -m flashattn.bench` reports), the enqueue time
without a sync (host cost alone), the GPU time from CUDA events, the same for torch SDPA (flash),
then a cProfile of 50 steps sorted by own time, which names the Python or C calls the host time goes to.

    python3 bench/gpu/op_overhead.py
"""
import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import flashattn


def step_fns(q, k, v, dout):
    def ours():
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        torch.autograd.grad(out, (q, k, v), dout)

    def sdpa():
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        torch.autograd.grad(out, (q, k, v), dout.transpose(1, 2))
    return {"flashattn": ours, "sdpa": sdpa}


def enqueue_us(fn, reps=200):
    """Host microseconds per call of fn, launched back to back (GPU work of a call is far shorter)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t0) / reps
    torch.cuda.synchronize()
    return host * 1e6


def layers(q, k, v):
    """Forward only, one layer at a time: the C call through nanobind, the custom op, the public function."""
    from flashattn import _C, _ops
    out, lse = torch.empty_like(q), torch.empty(q.shape[0], q.shape[2], q.shape[1], device="cuda")
    opts = _ops._opts(q.shape[-1] ** -0.5, True, False, -1, 0, 0.0, 0.0, None, False, q)
    args = (q.detach(), k.detach(), v.detach(), out, lse, None, None, 0, 0, None)
    nbytes = _C.fwd(*args, workspace=None, query=True, **opts)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    with torch.no_grad():
        rows = {
            "_C.fwd (workspace given)": enqueue_us(lambda: _C.fwd(*args, workspace=ws, query=False, **opts)),
            "_C.fwd (query only)": enqueue_us(lambda: _C.fwd(*args, workspace=None, query=True, **opts)),
            "torch.ops.flashattn.fwd": enqueue_us(lambda: torch.ops.flashattn.fwd(
                qd, kd, vd, None, None, q.shape[-1] ** -0.5, True, False, -1, 0, 0.0, 0.0, False)),
            "flash_attn_func (no grad)": enqueue_us(lambda: flashattn.flash_attn_func(qd, kd, vd, causal=True)),
            "sdpa flash (no grad)": enqueue_us(lambda: F.scaled_dot_product_attention(
                qd.transpose(1, 2), kd.transpose(1, 2), vd.transpose(1, 2), is_causal=True)),
        }
    for name, us in rows.items():
        print(f"forward host cost  {name:28s} {us:8.1f} us per call", flush=True)


def backward_layers(q, k, v, dout):
    """Where the backward side's host time goes: the bwd op alone, the graph-recording forward, the
    whole step with the autograd engine on the calling thread."""
    with torch.no_grad():
        out, lse = torch.ops.flashattn.fwd(q.detach(), k.detach(), v.detach(), None, None, q.shape[-1] ** -0.5, True,
                                           False, -1, 0, 0.0, 0.0, False)
    args = (dout, q.detach(), k.detach(), v.detach(), out, lse, None, None, q.shape[-1] ** -0.5, True, False, -1, 0,
            0.0, 0.0, False)
    with torch.no_grad():
        bwd_us = enqueue_us(lambda: torch.ops.flashattn.bwd(*args))
    print(f"backward host cost torch.ops.flashattn.bwd        {bwd_us:8.1f} us per call", flush=True)
    record_us = enqueue_us(lambda: flashattn.flash_attn_func(q, k, v, causal=True))
    print(f"backward host cost fwd recording the graph       {record_us:8.1f} us per call", flush=True)
    for name, fn in step_fns(q, k, v, dout).items():
        torch.autograd.set_multithreading_enabled(False)
        try:
            us = enqueue_us(fn, reps=50)
        finally:
            torch.autograd.set_multithreading_enabled(True)
        print(f"backward host cost {name} step, engine on caller {us:8.1f} us per step", flush=True)


def timings(fn, reps=50):
    """Microseconds per step: median wall time with a sync, host enqueue time, back-to-back GPU time."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    enqueue = enqueue_us(fn, reps)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return sorted(walls)[reps // 2] * 1e6, enqueue, start.elapsed_time(end) / reps * 1e3


def main():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 1024, 16, 128, device="cuda", dtype=torch.bfloat16)
    fns = step_fns(q, k, v, dout)
    for name, fn in fns.items():
        wall, enqueue, gpu = timings(fn)
        print(f"{name:10s} wall+sync {wall:8.1f} us  enqueue only {enqueue:8.1f} us  "
              f"back-to-back per step {gpu:8.1f} us", flush=True)
    layers(q, k, v)
    backward_layers(q, k, v, dout)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(50):
        fns["flashattn"]()
    torch.cuda.synchronize()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
