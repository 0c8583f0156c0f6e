"""flashattn.scaled_dot_product_attention against torch's, in (B, H, S, D), top-left causal."""
import pytest
import torch
import torch.nn.functional as F

import flashattn
from conftest import DTYPES, assert_2x, attention_ref


def _naive(q, k, v, is_causal=False, scale=None, enable_gqa=False):
    # Same-precision naive attention (torch's CPU math SDPA upcasts reduced precision internally).
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    return t(attention_ref(t(q), t(k), t(v), causal=is_causal, top_left=True, scale=scale, dtype=q.dtype)[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [
    dict(shape=(2, 4, 4, 25, 25, 32)),
    dict(shape=(2, 4, 4, 17, 33, 64), is_causal=True),     # top-left causal, Sq < Sk
    dict(shape=(1, 4, 4, 30, 12, 32), is_causal=True),     # top-left causal, Sq > Sk: every row sees a key
    dict(shape=(2, 6, 2, 21, 21, 16), enable_gqa=True, is_causal=True),
    dict(shape=(1, 2, 2, 19, 23, 20), scale=0.7),          # head dim 20: padded inside
], ids=str)
def test_matches_torch(case, dtype):
    b, h, hkv, sq, sk, d = case["shape"]
    kw = {k: v for k, v in case.items() if k != "shape"}
    # (B, S, H, D) storage seen as (B, H, S, D): strided views go to the kernel without copies.
    q = torch.randn(b, sq, h, d).transpose(1, 2).to(dtype).requires_grad_()
    k = torch.randn(b, sk, hkv, d).transpose(1, 2).to(dtype).requires_grad_()
    v = torch.randn(b, sk, hkv, d).transpose(1, 2).to(dtype).requires_grad_()
    out = flashattn.scaled_dot_product_attention(q, k, v, **kw)
    assert out.shape == (b, h, sq, d) and out.dtype == dtype
    dout = torch.randn(out.shape).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    res = {}
    for prec in (torch.float64, dtype):
        xs = [x.detach().to(prec).requires_grad_() for x in (q, k, v)]
        if prec == torch.float64:  # the reference is torch's own SDPA (math backend) in fp64
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                o = F.scaled_dot_product_attention(*xs, **kw)
        else:
            o = _naive(*xs, **kw)
        res[prec] = (o, torch.autograd.grad(o, xs, dout.to(prec)))
    assert_2x(out, res[dtype][0], res[torch.float64][0])
    scale = max(g.abs().max().item() for g in res[torch.float64][1])
    for name, g, gn, gr in zip("qkv", grads, res[dtype][1], res[torch.float64][1]):
        assert_2x(g, gn, gr, "d" + name, scale)


def test_unbatched_and_default_backend():
    q, k, v = (torch.randn(3, 10, 16) for _ in range(3))
    out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert out.shape == (3, 10, 16) and (out.double() - ref).abs().max() < 1e-5


def test_attn_mask_not_implemented_names_alternatives():
    q = torch.randn(1, 2, 8, 16)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    with pytest.raises(NotImplementedError, match="attn_mask.*is_causal=True.*flash_attn_varlen_func"):
        flashattn.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_gqa_requires_flag():
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="key: .*enable_gqa"):
        flashattn.scaled_dot_product_attention(q, k, k)
