"""flash-attn compatible functions against the fp64 reference (2x rule), forward and backward."""
import functools

import pytest
import torch

import flashattn
from conftest import DTYPES, assert_2x, attention_ref, check_fwd_bwd

# (B, Sq, Sk, H, Hkv, D, Dv)
SHAPES = [
    (2, 33, 33, 4, 4, 64, 64),
    (1, 17, 45, 4, 2, 32, 32),   # Sk > Sq, GQA
    (2, 40, 24, 6, 1, 16, 16),   # Sq > Sk (bottom-right: first rows see nothing when causal), MQA
    (1, 29, 29, 2, 2, 36, 36),   # head dim not a multiple of 8: padded inside
    (1, 20, 31, 2, 2, 24, 40),   # Dv != D
]


def _qkv(b, sq, sk, h, hkv, d, dv):
    return torch.randn(b, sq, h, d), torch.randn(b, sk, hkv, d), torch.randn(b, sk, hkv, dv)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_func(shape, causal, dtype, device):
    b, sq, sk, h, hkv, d, dv = shape
    ours = functools.partial(flashattn.flash_attn_func, causal=causal)
    ref = functools.partial(attention_ref, causal=causal)
    out = check_fwd_bwd(ours, ref, _qkv(*shape), dtype, device)
    assert out.shape == (b, sq, h, dv)


OPTIONS = [
    dict(window_size=(8, 0)),
    dict(window_size=(5, 3)),
    dict(window_size=(-1, 4)),
    dict(causal=True, window_size=(6, -1)),
    dict(softcap=2.0),
    dict(alibi=(4,)),
    dict(alibi=(2, 4), causal=True),
    dict(softmax_scale=0.3),
    dict(softcap=1.5, alibi=(4,), window_size=(10, 10)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("opts", OPTIONS, ids=str)
def test_options(opts, dtype, device):
    opts = dict(opts)
    alibi = opts.pop("alibi", None)
    slopes = torch.rand(alibi, device=device) * 0.5 + 0.05 if alibi is not None else None
    causal = opts.get("causal", False)
    window = opts.get("window_size", (-1, -1))
    q, k, v = _qkv(2, 24, 30, 4, 2, 32, 32)
    ours = functools.partial(flashattn.flash_attn_func, alibi_slopes=slopes, **opts)
    ref = functools.partial(attention_ref, causal=causal, window=window, softcap=opts.get("softcap", 0.0),
                            alibi=slopes, scale=opts.get("softmax_scale"))
    check_fwd_bwd(ours, ref, (q, k, v), dtype, device)


def test_return_attn_probs_lse():
    q, k, v = _qkv(2, 19, 27, 4, 2, 32, 32)
    out, lse, probs = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert probs is None
    assert lse.shape == (2, 4, 19) and lse.dtype == torch.float32
    ref_out, ref_lse = attention_ref(q, k, v, causal=True)
    _, naive_lse = attention_ref(q, k, v, causal=True, dtype=torch.float32)
    assert_2x(lse, naive_lse, ref_lse, "lse")
    assert (out.double() - ref_out).abs().max() < 1e-5


def test_empty_rows():
    # Sq > Sk, bottom-right causal: the first Sq - Sk rows see no key -> O = 0, LSE = +inf.
    q, k, v = _qkv(1, 12, 5, 2, 2, 16, 16)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert (out[:, :7] == 0).all() and torch.isinf(lse[:, :, :7]).all() and (lse[:, :, :7] > 0).all()
    ref, _ = attention_ref(q, k, v, causal=True)
    naive, _ = attention_ref(q, k, v, causal=True, dtype=torch.float32)
    assert_2x(out[:, 7:], naive[:, 7:], ref[:, 7:])


def test_packed_match_unpacked():
    qkv = torch.randn(2, 21, 3, 4, 32, requires_grad=True)
    out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    out.backward(torch.ones_like(out))
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    ref = flashattn.flash_attn_func(q, k, v, causal=True)
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(qkv.grad, torch.stack([q.grad, k.grad, v.grad], dim=2), rtol=0, atol=0)

    q = torch.randn(2, 13, 4, 32, requires_grad=True)
    kv = torch.randn(2, 17, 2, 2, 32, requires_grad=True)
    out = flashattn.flash_attn_kvpacked_func(q, kv)
    ref = flashattn.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1])
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    g = torch.autograd.grad(out.sum(), kv)[0]
    assert g.shape == kv.shape and g.abs().max() > 0


def test_deterministic_backward():
    q, k, v = (x.requires_grad_() for x in _qkv(2, 40, 40, 4, 2, 32, 32))
    grads = []
    for _ in range(2):
        out = flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out.sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:Input #:UserWarning")
def test_gradcheck_tiny():
    # The kernels compute in fp32 (no fp64 path), so gradcheck runs in fp32 with matching tolerances.
    q, k, v = (torch.randn(1, 5, 2, 8, dtype=torch.float32, requires_grad=True) for _ in range(3))
    fn = functools.partial(flashattn.flash_attn_func, causal=True, softcap=3.0)
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-2, atol=2e-2, rtol=2e-2, nondet_tol=1e-6)


def test_autocast_bf16():
    lin = torch.nn.Linear(32, 3 * 32)
    x = torch.randn(2, 24, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = lin(x).view(2, 24, 3, 2, 16).unbind(2)
        out = flashattn.flash_attn_func(q, k.float(), v, causal=True)  # mixed inputs: autocast dtype wins
        ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                               v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert out.dtype == torch.bfloat16
    ref64, _ = attention_ref(q, k, v, causal=True)
    naive, _ = attention_ref(q, k, v, causal=True, dtype=torch.bfloat16)
    assert_2x(out, naive, ref64)
    assert (out.float() - ref.float()).abs().max() < 3e-2
    out.float().sum().backward()
    assert lin.weight.grad is not None and torch.isfinite(lin.weight.grad).all()


_COMMON = dict(dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
               deterministic=False, return_attn_probs=False)
FLASH_ATTN_SIGNATURES = {  # flash-attn 2.x (flash_attn/flash_attn_interface.py)
    "flash_attn_func": (["q", "k", "v"], _COMMON),
    "flash_attn_qkvpacked_func": (["qkv"], _COMMON),
    "flash_attn_kvpacked_func": (["q", "kv"], _COMMON),
    "flash_attn_varlen_func": (["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"],
                               dict(_COMMON, block_table=None)),
    "flash_attn_varlen_qkvpacked_func": (["qkv", "cu_seqlens", "max_seqlen"], _COMMON),
    "flash_attn_varlen_kvpacked_func": (["q", "kv", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"],
                                        _COMMON),
}


@pytest.mark.parametrize("name", sorted(FLASH_ATTN_SIGNATURES))
def test_signatures_match_flash_attn(name):
    import inspect
    positional, defaults = FLASH_ATTN_SIGNATURES[name]
    params = inspect.signature(getattr(flashattn, name)).parameters
    assert list(params) == positional + list(defaults)
    for arg, default in defaults.items():
        assert params[arg].default == default, arg


def test_sdpa_signature_matches_torch():
    import inspect
    params = inspect.signature(flashattn.scaled_dot_product_attention).parameters
    assert list(params) == ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    assert [params[p].default for p in list(params)[3:]] == [None, 0.0, False, None, False]
