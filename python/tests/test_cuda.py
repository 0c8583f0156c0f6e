"""CUDA-only behaviour: the caller's current stream is used; CUDA tensors go through DLPack."""
import torch

import flashattn
from conftest import assert_2x, attention_ref, requires_cuda


@requires_cuda
def test_runs_on_the_current_stream():
    q, k, v = (torch.randn(2, 512, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    expected = flashattn.flash_attn_func(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Inputs produced on the side stream, consumed there: no sync with the default stream is needed.
        q2 = q * 1.0
        out = flashattn.flash_attn_func(q2, k, v, causal=True)
    side.synchronize()
    assert torch.equal(out, expected)


@requires_cuda
def test_cuda_matches_reference_and_cpu():
    q, k, v = (torch.randn(1, 300, 4, 128) for _ in range(3))
    ours = flashattn.flash_attn_func(*(t.cuda().half() for t in (q, k, v)), causal=True).cpu()
    ref, _ = attention_ref(q, k, v, causal=True)
    naive, _ = attention_ref(q.half().cuda(), k.half().cuda(), v.half().cuda(), causal=True, dtype=torch.float16)
    assert_2x(ours, naive.cpu(), ref)


@requires_cuda
def test_memory_plan_on_cuda():
    q = torch.randn(1, 1024, 8, 64, device="cuda", dtype=torch.bfloat16)
    plan = flashattn.memory_plan(q, q, q, causal=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = flashattn.flash_attn_func(q, q, q, causal=True)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= plan.fwd_bytes + 4096  # allocator rounding
    del out
