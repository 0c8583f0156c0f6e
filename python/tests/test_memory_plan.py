"""memory_plan returns exactly what the calls allocate."""
import torch

import flashattn
from flashattn import _ops


def _record(monkeypatch):
    sizes = []
    real = _ops._workspace

    def spy(nbytes, device):
        sizes.append(nbytes)
        return real(nbytes, device)
    monkeypatch.setattr(_ops, "_workspace", spy)
    return sizes


def test_dense_plan_matches_allocations(monkeypatch):
    q = torch.randn(2, 70, 4, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 90, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 90, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    plan = flashattn.memory_plan(q, k, v, causal=True)
    # Shapes only, or meta tensors, give the same plan.
    assert flashattn.memory_plan(q.shape, k.shape, v.shape, causal=True, dtype=torch.bfloat16) == plan
    assert flashattn.memory_plan(*(t.to("meta") for t in (q, k, v)), causal=True) == plan
    sizes = _record(monkeypatch)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    out.sum().backward()
    assert sizes == [plan.fwd_workspace_bytes, plan.bwd_workspace_bytes]
    assert plan.fwd_workspace_bytes > 0 and plan.bwd_workspace_bytes > 0
    assert plan.out_bytes == out.numel() * out.element_size()
    assert plan.lse_bytes == lse.numel() * 4
    assert plan.grad_bytes == sum(t.numel() * t.element_size() for t in (q, k, v))
    assert plan.pad_bytes == 0
    assert plan.total_bytes == plan.fwd_bytes + plan.bwd_bytes


def test_varlen_plan_matches_allocations(monkeypatch):
    cu = torch.tensor([0, 30, 31, 80], dtype=torch.int32)
    q, k, v = (torch.randn(80, 4, 32, requires_grad=True) for _ in range(3))
    plan = flashattn.memory_plan(q, k, v, cu, cu, 49, 49, window_size=(16, 0))
    sizes = _record(monkeypatch)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 49, 49, window_size=(16, 0))
    out.sum().backward()
    assert sizes == [plan.fwd_workspace_bytes, plan.bwd_workspace_bytes]
    assert plan.lse_bytes == 4 * 80 * 4


def test_padded_head_dim_plan():
    plan = flashattn.memory_plan((1, 10, 2, 20), (1, 10, 2, 20), (1, 10, 2, 20), dtype=torch.float16, backward=False)
    assert plan.pad_bytes == 3 * 10 * 2 * 24 * 2
    assert plan.out_bytes == 10 * 2 * 24 * 2 and plan.bwd_bytes == 0
