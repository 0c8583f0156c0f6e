"""Where the backward's error comes from in the random option draws that fail the 2x rule (dev/cpu_tuning.md,
session 29). For plain draws of python/tests/test_random_options.py (no softcap, ALiBi or window) it prints, per
gradient that fails the rule: ours, the naive same-precision reference and FA2's backward formulas (delta =
rowsum(dO o O) from the stored output, P = exp(S - LSE) from the stored LSE) evaluated by torch in fp64 and in
fp32, each against the fp64 reference.

usage: FLASHATTN_CPU_ISA=avx512 python3 dev/fa2_backward_error.py [FIRST LAST]   (draw indices, default 68 1068)
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python", "tests"))
import flashattn  # noqa: E402
import test_random_options  # noqa: E402
from conftest import attention_ref, mask_allowed  # noqa: E402


def fa2_grads(q, k, v, dout, out, lse, scale, causal, dtype):
    """FA2's backward from the stored out and lse, in `dtype` arithmetic: (dq, dk, dv)."""
    b, sq, h, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    q, dout, out = q.to(dtype), dout.to(dtype), out.to(dtype)
    k = k.to(dtype).repeat_interleave(h // hkv, 2)
    v = v.to(dtype).repeat_interleave(h // hkv, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    allowed, _ = mask_allowed(sq, sk, causal, (-1, -1))
    p = torch.exp(s - lse.to(dtype)[..., None]).masked_fill(~allowed, 0.0)
    dp = torch.einsum("bihd,bjhd->bhij", dout, v)
    delta = (dout * out).sum(-1).transpose(1, 2)[..., None]
    ds = p * (dp - delta)
    dq = torch.einsum("bhij,bjhd->bihd", ds, k) * scale
    dk = torch.einsum("bhij,bihd->bjhd", ds, q).reshape(b, sk, hkv, h // hkv, d).sum(3) * scale
    dv = torch.einsum("bhij,bihd->bjhd", p, dout).reshape(b, sk, hkv, h // hkv, -1).sum(3)
    return dq, dk, dv


def grads_of(fn, inputs, dout):
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    return torch.autograd.grad(fn(*leaves), leaves, dout)


def main(first, last):
    for index in range(first, last):
        c = test_random_options.draw(index)
        if c["softcap"] or c["alibi"] is not None or c["window"] != (-1, -1):
            continue
        torch.manual_seed(index)
        dtype, scale, causal = c["dtype"], c["scale"] or 1 / math.sqrt(c["d"]), c["causal"]
        q = torch.randn(c["b"], c["sq"], c["h"], c["d"]).to(dtype)
        k = torch.randn(c["b"], c["sk"], c["hkv"], c["d"]).to(dtype)
        v = torch.randn(c["b"], c["sk"], c["hkv"], c["dv"]).to(dtype)
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out, lse, _ = flashattn.flash_attn_func(*leaves, softmax_scale=scale, causal=causal, return_attn_probs=True)
        dout = torch.randn(out.shape).to(dtype)
        ours = torch.autograd.grad(out, leaves, dout)
        ref = grads_of(lambda *x: attention_ref(*x, causal=causal, scale=scale)[0],
                       [x.double() for x in (q, k, v)], dout.double())
        naive = grads_of(lambda *x: attention_ref(*x, causal=causal, scale=scale, dtype=dtype)[0], (q, k, v), dout)
        stored = (q, k, v, dout, out.detach(), lse.detach(), scale, causal)
        fa2_64 = fa2_grads(*stored, torch.float64)
        fa2_32 = fa2_grads(*stored, torch.float32)  # the arithmetic our kernels use for every dtype
        for name, g, r, n, m, m32 in zip("qkv", ours, ref, naive, fa2_64, fa2_32):
            err = lambda x: (x.double() - r).abs().max().item()  # noqa: E731
            if err(g) > 2 * err(n) + 1e-6 * r.abs().max().item():
                print(f"{index} {str(dtype)[6:]} sq={c['sq']} sk={c['sk']} d={c['d']} d{name}: ours {err(g):.2e} "
                      f"naive {err(n):.2e} FA2 fp64 {err(m):.2e} FA2 fp32 {err(m32):.2e}", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (68, 1068))
