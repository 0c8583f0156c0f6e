"""CUDA-only behaviour: the caller's current stream is used; CUDA tensors go through DLPack; calls captured in
CUDA graphs replay the eager results."""
import pytest
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


def _capture(step, warmup_args, args):
    """step(*warmup_args) once on a side stream (the warm-up torch asks for before a capture), then step(*args)
    captured in a CUDA graph. Returns the graph and the captured call's outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(*warmup_args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(*args)
    return graph, captured


def _decode_step(k_cache, v_cache, q, k, v, seqlens, cos, sin, block_table, num_splits):
    return flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                             cache_seqlens=seqlens, block_table=block_table, causal=True,
                                             rotary_interleaved=False, num_splits=num_splits,
                                             return_softmax_lse=True)


@requires_cuda
@pytest.mark.parametrize("page,num_splits", [(16, 0), (0, 3)], ids=["paged16", "contiguous_splits3"])
def test_decode_step_replays_from_a_cuda_graph(page, num_splits):
    """A serving loop's decode step (append + NeoX rotary, GQA 8) captured once in a CUDA graph, then replayed
    with new tokens and longer rows written into its static inputs, gives step after step the bytes of the same
    call run eagerly: outputs, LSE and cache. Capture fails on a host sync or an allocation outside torch's
    allocator, so passing also shows the call has neither."""
    b, h, hkv, d, capacity, steps = 3, 16, 2, 128, 128, 5
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    if page:
        blocks = capacity // page
        table = torch.randperm(b * blocks + 3, dtype=torch.int32, device="cuda")[: b * blocks].view(b, blocks)
        cache_shape = (b * blocks + 3, page, hkv, d)
    else:
        table, cache_shape = None, (b, capacity, hkv, d)
    k_cache, v_cache = torch.randn(cache_shape, **cuda), torch.randn(cache_shape, **cuda)
    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    angles = torch.arange(capacity, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
    cos, sin = angles.cos().to(**cuda), angles.sin().to(**cuda)

    static_q, static_k, static_v = torch.randn(b, 1, h, d, **cuda), *torch.randn(2, b, 1, hkv, d, **cuda)
    static_lens = torch.tensor([0, 37, 100], dtype=torch.int32, device="cuda")
    inputs = (static_q, static_k, static_v, static_lens, cos, sin, table, num_splits)
    # The warm-up appends into scratch caches: the real ones stay as they are.
    graph, (graph_out, graph_lse) = _capture(_decode_step, (k_cache.clone(), v_cache.clone(), *inputs),
                                             (k_cache, v_cache, *inputs))
    assert torch.equal(k_cache, eager_k), "capturing the step ran it"

    previous = None
    for step in range(steps):
        q, k, v = torch.randn(b, 1, h, d, **cuda), *torch.randn(2, b, 1, hkv, d, **cuda)
        lens = torch.tensor([step, 37 + 3 * step, 100 + step], dtype=torch.int32, device="cuda")
        for static, new in ((static_q, q), (static_k, k), (static_v, v), (static_lens, lens)):
            static.copy_(new)
        graph.replay()
        out, lse = _decode_step(eager_k, eager_v, q, k, v, lens, cos, sin, table, num_splits)
        assert torch.equal(graph_out, out), f"step {step}: output of the replay differs from the eager call"
        assert torch.equal(graph_lse, lse), f"step {step}: LSE of the replay differs from the eager call"
        assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v), f"step {step}: caches differ"
        assert previous is None or not torch.equal(out, previous), f"step {step}: the replay repeated its output"
        previous = out.clone()


@requires_cuda
def test_training_step_replays_from_a_cuda_graph():
    """flash_attn_func forward and backward (deterministic) captured in one CUDA graph, the way whole-network
    capture records a training step, give on replay the eager call's output and gradients bit for bit."""
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    static = [torch.randn(2, 256, 4, 64, **cuda).requires_grad_() for _ in range(3)]
    static_dout = torch.randn(2, 256, 4, 64, **cuda)

    def step(q, k, v, dout):
        out = flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    graph, captured = _capture(step, (*static, static_dout), (*static, static_dout))
    for _ in range(2):
        fresh = [torch.randn(2, 256, 4, 64, **cuda).requires_grad_() for _ in range(3)]
        dout = torch.randn(2, 256, 4, 64, **cuda)
        with torch.no_grad():
            for s, new in zip(static + [static_dout], fresh + [dout]):
                s.copy_(new)
        graph.replay()
        for name, got, want in zip(("out", "dq", "dk", "dv"), captured, step(*fresh, dout)):
            assert torch.equal(got, want), f"{name} of the replay differs from the eager call"


@requires_cuda
def test_dropout_step_draws_a_new_mask_on_each_graph_replay(monkeypatch):
    """With dropout, the captured forward and backward read {seed, offset} from a CUDA tensor that torch's generator
    refills on each replay: every replay drops another mask, and gives the eager call's output and gradients for
    the seed it drew, bit for bit."""
    drawn, forced = [], []
    draw = flashattn._ops.new_rng_state

    def recording_draw(dropout_p, device):
        state = forced[-1] if forced else draw(dropout_p, device)
        drawn.append(state)
        return state

    monkeypatch.setattr(flashattn._ops, "new_rng_state", recording_draw)
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    static = [torch.randn(2, 256, 4, 64, **cuda).requires_grad_() for _ in range(3)]
    dout = torch.randn(2, 256, 4, 64, **cuda)

    def step(q, k, v):
        out = flashattn.flash_attn_func(q, k, v, dropout_p=0.2, causal=True, deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    graph, captured = _capture(step, static, static)
    captured_state = drawn[-1]
    assert captured_state.is_cuda
    seeds, outs = set(), []
    for replay in range(3):
        graph.replay()
        state = captured_state.clone()
        seeds.add(tuple(state.tolist()))
        outs.append(captured[0].clone())
        forced.append(state)
        eager_inputs = [x.detach().clone().requires_grad_() for x in static]
        for name, got, want in zip(("out", "dq", "dk", "dv"), captured, step(*eager_inputs)):
            assert torch.equal(got, want), f"replay {replay}: {name} differs from the eager call with its seed"
        forced.clear()
    assert len(seeds) == 3, "each replay must draw its own {seed, offset}"
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])
