"""torch.library ops: opcheck, torch.compile(fullgraph=True) without graph breaks, matching eager."""
import pytest
import torch

import flashattn


class TinyAttention(torch.nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, c = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, c // self.heads)
        y = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
        q, k, v = qkv.transpose(1, 3).unbind(2)  # (B, H, S, D) views for the SDPA-style call
        y = y + flashattn.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        return self.proj(y.reshape(b, s, c))


def _varlen_fn(q, k, v, cu):
    return flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True).sum()


def test_opcheck():
    q, k, v = (torch.randn(1, 9, 2, 16, requires_grad=True) for _ in range(3))
    args = (q, k, v, None, None, 0.25, True, False, -1, -1, 0.0, 0.0, False)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    vq, vk, vv = (torch.randn(9, 2, 16, requires_grad=True) for _ in range(3))
    torch.library.opcheck(torch.ops.flashattn.fwd_varlen.default,
                          (vq, vk, vv, cu, cu, 5, 5, None, None, 0.25, False, False, -1, -1, 0.0, 0.0, False))


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v = torch.empty(2, 7, 4, 32), torch.empty(2, 9, 2, 32), torch.empty(2, 9, 2, 24)
        out, lse = torch.ops.flashattn.fwd(q, k, v, None, None, 0.1, False, False, -1, -1, 0.0, 0.0, False)
        assert out.shape == (2, 7, 4, 24) and out.dtype == q.dtype
        assert lse.shape == (2, 4, 7) and lse.dtype == torch.float32


def test_compile_fullgraph_no_graph_break():
    torch._dynamo.reset()
    model = TinyAttention()
    x = torch.randn(2, 16, 32)
    explain = torch._dynamo.explain(model)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    eager_out = model(x)
    eager_grads = torch.autograd.grad(eager_out.square().sum(), list(model.parameters()))
    out = compiled(x)
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-6)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_compile_varlen_and_dropout_fullgraph():
    torch._dynamo.reset()
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = (torch.randn(12, 2, 16, requires_grad=True) for _ in range(3))
    explain = torch._dynamo.explain(_varlen_fn)(q, k, v, cu)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(_varlen_fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, cu), _varlen_fn(q, k, v, cu))

    def drop(q, k, v):
        return flashattn.flash_attn_func(q, k, v, dropout_p=0.2)
    qd, kd, vd = (x[None] for x in (q, k, v))
    explain = torch._dynamo.explain(drop)(qd, kd, vd)
    assert explain.graph_break_count == 0, explain.break_reasons
    out = torch.compile(drop, fullgraph=True, backend="aot_eager")(qd, kd, vd)
    assert out.shape == qd.shape and torch.isfinite(out).all()


def test_compile_inductor_forward():
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True) * 2, fullgraph=True)
    q, k, v = (torch.randn(1, 10, 2, 16) for _ in range(3))
    try:
        out = fn(q, k, v)
    except Exception as e:  # inductor needs a working C++ toolchain; aot_eager tests above cover tracing
        if "CppCompileError" in type(e).__name__ or "compiler" in str(e).lower():
            pytest.skip(f"inductor cannot compile here: {type(e).__name__}")
        raise
    torch.testing.assert_close(out, flashattn.flash_attn_func(q, k, v, causal=True) * 2)
