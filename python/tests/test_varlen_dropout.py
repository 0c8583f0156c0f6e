"""Varlen functions against per-sequence references; dropout against the documented Philox mask."""
import functools

import pytest
import torch

import flashattn
from flashattn import _C
from conftest import assert_2x, attention_ref, fp64_reference


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(causal, dtype):
    lq, lk = [5, 0, 17, 9], [7, 3, 17, 20]  # an empty query sequence included
    h, hkv, d = 4, 2, 32
    q = torch.randn(sum(lq), h, d).to(dtype).requires_grad_()
    k = torch.randn(sum(lk), hkv, d).to(dtype).requires_grad_()
    v = torch.randn(sum(lk), hkv, d).to(dtype).requires_grad_()
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, _cu(lq), _cu(lk), max(lq), max(lk), causal=causal,
                                                   return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (h, sum(lq)) and lse.dtype == torch.float32
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = functools.partial(attention_ref, causal=causal)
    oq = ok = 0
    for b, (sq, sk) in enumerate(zip(lq, lk)):
        if sq == 0:
            oq, ok = oq + sq, ok + sk
            continue
        sl_q, sl_k = slice(oq, oq + sq), slice(ok, ok + sk)
        xs = [t.detach()[s][None].requires_grad_() for t, s in ((q, sl_q), (k, sl_k), (v, sl_k))]
        r, rl, rg, given_output = fp64_reference(ref, xs, out.detach()[sl_q][None], dout[sl_q][None])
        n, nl = ref(*xs, dtype=dtype)
        ng = torch.autograd.grad(n, xs, dout[sl_q][None])
        assert_2x(out[sl_q][None], n, r, f"out[{b}]")
        assert_2x(lse[:, sl_q][None], nl, rl, f"lse[{b}]")
        scale = max(g.abs().max().item() for g in rg)
        for name, g, gn, gr, term in zip("qkv", grads, ng, rg, given_output):
            sl = sl_q if name == "q" else sl_k
            assert_2x(g[sl][None], gn, gr, f"d{name}[{b}]", scale, term)
        oq, ok = oq + sq, ok + sk


def test_varlen_packed():
    lens = [6, 11, 4]
    cu = _cu(lens)
    qkv = torch.randn(sum(lens), 3, 2, 16, requires_grad=True)
    out = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True)
    ref = flashattn.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, max(lens), max(lens), causal=True)
    assert torch.equal(out, ref)
    kv = qkv[:, 1:]
    out2 = flashattn.flash_attn_varlen_kvpacked_func(qkv[:, 0], kv, cu, cu, max(lens), max(lens), causal=True)
    assert torch.equal(out2, ref)
    g = torch.autograd.grad(out.sum(), qkv)[0]
    assert g.shape == qkv.shape and g.abs().max() > 0


def _keep_mask(seed, offset, b, h, sq, sk, p):
    m = torch.empty(b, h, sq, sk)
    for bi in range(b):
        for hi in range(h):
            for i in range(sq):
                for j in range(sk):
                    m[bi, hi, i, j] = _C.dropout_keep(seed, offset, bi, hi, h, i, j, p)
    return m


def test_dropout_matches_philox_mask_and_backward():
    b, s, h, d, p = 1, 12, 2, 16, 0.3
    q, k, v = (torch.randn(b, s, h, d, requires_grad=True) for _ in range(3))
    torch.manual_seed(1234)
    out = flashattn.flash_attn_func(q, k, v, dropout_p=p, causal=True)
    torch.manual_seed(1234)  # the op draws (seed, offset) from torch's default generator
    seed, offset = torch.randint(0, 2**62, (2,), dtype=torch.int64).tolist()
    mask = _keep_mask(seed, offset, b, h, s, s, p)
    assert 0 < mask.mean() < 1
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    xs = [x.detach().requires_grad_() for x in (q, k, v)]
    res = {}
    for prec in (torch.float64, torch.float32):
        o, _ = attention_ref(*xs, causal=True, dropout_mask=mask, dropout_p=p, dtype=prec)
        res[prec] = (o, torch.autograd.grad(o, xs, dout.to(prec)))
    assert_2x(out, res[torch.float32][0], res[torch.float64][0])
    scale = max(g.abs().max().item() for g in res[torch.float64][1])
    for g, gn, gr in zip(grads, res[torch.float32][1], res[torch.float64][1]):
        assert_2x(g, gn, gr, "grad", scale)  # the backward reproduced the forward's mask


def test_dropout_draws_fresh_masks():
    q, k, v = (torch.randn(1, 16, 2, 16) for _ in range(3))
    a = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)
    b = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)
    assert not torch.equal(a, b)
    torch.manual_seed(7)
    c = flashattn.flash_attn_func(q, k, v, dropout_p=0.5)
    torch.manual_seed(7)
    assert torch.equal(c, flashattn.flash_attn_func(q, k, v, dropout_p=0.5))
