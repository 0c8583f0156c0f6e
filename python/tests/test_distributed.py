"""flashattn.distributed.ring_attention on CPUs: 2 and 4 gloo processes, forward and backward.

One spawn per world size runs every case (process start-up dominates the cost); the workers save
their shards' outputs and gradients and the parent reassembles them and checks them against the
fp64 torch reference with the project's rule, where the "naive" term is the single-process
flashattn fp32 result: max|ring - ref64| <= 2 max|single - ref64| + 1e-6 max|ref|.
"""
import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashattn
from flashattn.distributed import (ring_attention, ring_attention_varlen, shard_varlen, unshard_varlen, zigzag_shard,
                                   zigzag_unshard)
from conftest import assert_2x, attention_ref

# (name, B, N total tokens, H, Hkv, causal, Dv, window_size, softcap, dtype); D = 32. Dv != D takes the
# path that sends K and V separately (otherwise they travel stacked in one message). Windows are in
# global positions; with 4 ranks and N = 128 a window of 20 spans chunk boundaries (chunks of 16 or 32
# rows) and skips the far shards.
CASES = [
    ("full", 2, 64, 4, 4, False, 32, (-1, -1), 0.0, torch.float32),
    ("full_gqa", 1, 128, 4, 2, False, 32, (-1, -1), 0.0, torch.float32),
    ("causal", 2, 64, 2, 2, True, 32, (-1, -1), 0.0, torch.float32),
    ("causal_gqa", 1, 128, 4, 2, True, 32, (-1, -1), 0.0, torch.float32),
    ("causal_mqa_dv16", 2, 64, 4, 1, True, 16, (-1, -1), 0.0, torch.float32),
    ("window", 1, 128, 2, 2, False, 32, (20, 9), 0.0, torch.float32),
    ("window_left_only", 1, 128, 2, 1, False, 32, (40, -1), 0.0, torch.float32),
    ("causal_window_gqa", 1, 128, 4, 2, True, 32, (20, -1), 0.0, torch.float32),
    ("causal_softcap_bf16", 2, 64, 2, 2, True, 32, (-1, -1), 5.0, torch.bfloat16),
]
# (name, sequence lengths, H, Hkv, causal, window_size); fp32, D = Dv = 32. Lengths are multiples of
# 2 * 4 (zigzag at 4 ranks); an empty sequence included.
VARLEN_CASES = [
    ("varlen_causal_gqa", [16, 0, 48, 32], 4, 2, True, (-1, -1)),
    ("varlen_window", [24, 8, 40], 2, 2, False, (10, 3)),
    ("varlen_causal_window_mqa", [32, 16, 48], 2, 1, True, (12, 0)),
]
D = 32
WORLDS = [2, 4]


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def _varlen_inputs(case, seed):
    name, lengths, h, hkv, causal, window = case
    g = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    return tuple(torch.randn(t, heads, D, generator=g) for heads in (h, hkv, hkv, h))
JOIN_TIMEOUT_S = 120


def _inputs(case, seed):
    name, b, n, h, hkv, causal, dv, _, _, dtype = case
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, h, D, generator=g)
    k = torch.randn(b, n, hkv, D, generator=g)
    v = torch.randn(b, n, hkv, dv, generator=g)
    dout = torch.randn(b, n, h, dv, generator=g)
    return tuple(x.to(dtype) for x in (q, k, v, dout))


def _shard(x, rank, world, causal):
    return zigzag_shard(x, rank, world) if causal else x.chunk(world, dim=1)[rank]


def _unshard(shards, world, causal, dim=1):
    return zigzag_unshard(shards, world, dim=dim) if causal else torch.cat(shards, dim=dim)


def _worker(rank, world, tmp):
    torch.set_num_threads(1)
    flashattn.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        inputs = torch.load(os.path.join(tmp, "inputs.pt"))
        results = {}
        for case in CASES:
            causal, window, softcap = case[5], case[7], case[8]
            q, k, v, dout = (_shard(x, rank, world, causal) for x in inputs[case[0]])
            q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
            out, lse = ring_attention(q, k, v, causal=causal, window_size=window, softcap=softcap, return_lse=True)
            out.backward(dout)
            results[case[0]] = (out.detach(), lse, q.grad, k.grad, v.grad)
        for case in VARLEN_CASES:
            name, lengths, _, _, causal, window = case
            cu = _cu(lengths)
            shards = [shard_varlen(x, cu, rank, world, causal) for x in inputs[name]]
            cu_local = shards[0][1]
            q, k, v, dout = (x for x, _ in shards)
            q, k, v = (x.clone().requires_grad_(True) for x in (q, k, v))
            local_max = max(b - a for a, b in zip(cu_local.tolist(), cu_local.tolist()[1:]))
            out, lse = ring_attention_varlen(q, k, v, cu_local, local_max, causal=causal, window_size=window,
                                             return_lse=True)
            out.backward(dout)
            results[name] = (out.detach(), lse, q.grad, k.grad, v.grad)
        torch.save(results, os.path.join(tmp, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(world, tmp):
    ctx = mp.start_processes(_worker, args=(world, tmp), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ring_attention workers (world {world}) did not finish in {JOIN_TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"world{w}")
def ring_run(request, tmp_path_factory):
    """Runs every case on `world` gloo processes; returns (world, inputs, per-case reassembled results)."""
    world = request.param
    tmp = str(tmp_path_factory.mktemp(f"ring{world}"))
    inputs = {case[0]: _inputs(case, 1234 + i) for i, case in enumerate(CASES)}
    inputs.update({case[0]: _varlen_inputs(case, 4321 + i) for i, case in enumerate(VARLEN_CASES)})
    torch.save(inputs, os.path.join(tmp, "inputs.pt"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    _spawn(world, tmp)
    per_rank = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
    results = {}
    for case in CASES:
        causal = case[5]
        parts = [[per_rank[r][case[0]][i] for r in range(world)] for i in range(5)]
        # lse is (B, H, S): its sequence dim is 2
        out, lse, dq, dk, dv = (_unshard(p, world, causal, dim=2 if i == 1 else 1) for i, p in enumerate(parts))
        results[case[0]] = (out, lse, dq, dk, dv)
    for case in VARLEN_CASES:
        name, lengths, _, _, causal, _ = case
        parts = [[per_rank[r][name][i] for r in range(world)] for i in range(5)]
        # lse is (H, T): its row dim is 1
        results[name] = tuple(unshard_varlen(p, _cu(lengths), world, causal, dim=1 if i == 1 else 0)
                              for i, p in enumerate(parts))
    return world, inputs, results


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ring_attention_matches_single_process(ring_run, case):
    world, inputs, results = ring_run
    name, b, n, h, hkv, causal, head_dim_v, window, softcap, dtype = case
    q, k, v, dout = inputs[name]
    out, lse, dq, dk, dv = results[name]

    # single-process flashattn (same dtype) and the fp64 reference, out and grads
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    single, single_lse, _ = flashattn.flash_attn_func(*leaves, causal=causal, window_size=window, softcap=softcap,
                                                      return_attn_probs=True)
    single_grads = torch.autograd.grad(single, leaves, dout)
    leaves64 = [x.double().requires_grad_(True) for x in (q, k, v)]
    ref, ref_lse = attention_ref(*leaves64, causal=causal, window=window, softcap=softcap)
    ref_grads = torch.autograd.grad(ref, leaves64, dout.double())

    assert out.shape == (b, n, h, head_dim_v) and out.dtype == dtype
    assert_2x(out, single.detach(), ref, f"{name} world{world} out")
    assert_2x(lse, single_lse, ref_lse, f"{name} world{world} lse")
    scale = max(g.abs().max().item() for g in ref_grads)
    for gname, g, gs, gr in zip(("dq", "dk", "dv"), (dq, dk, dv), single_grads, ref_grads):
        assert g.shape == gr.shape and g.dtype == dtype
        assert_2x(g, gs, gr, f"{name} world{world} {gname}", scale)


@pytest.mark.parametrize("case", VARLEN_CASES, ids=[c[0] for c in VARLEN_CASES])
def test_ring_attention_varlen_matches_single_process(ring_run, case):
    """Packed sequences, each sharded over every rank: against flash_attn_varlen_func (the naive term) and
    a per-sequence fp64 reference."""
    world, inputs, results = ring_run
    name, lengths, h, hkv, causal, window = case
    q, k, v, dout = inputs[name]
    out, lse, dq, dk, dv = results[name]
    cu = _cu(lengths)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    single, single_lse, _ = flashattn.flash_attn_varlen_func(*leaves, cu, cu, max(lengths), max(lengths),
                                                             causal=causal, window_size=window,
                                                             return_attn_probs=True)
    single_grads = torch.autograd.grad(single, leaves, dout)
    ref_out, ref_lse, ref_grads = torch.zeros_like(single, dtype=torch.float64), \
        torch.full_like(single_lse, float("inf"), dtype=torch.float64), [torch.zeros_like(x, dtype=torch.float64)
                                                                       for x in (q, k, v)]
    for a, b in zip(cu.tolist(), cu.tolist()[1:]):
        if a == b:
            continue
        xs = [x[a:b].double()[None].requires_grad_(True) for x in (q, k, v)]
        o, l = attention_ref(*xs, causal=causal, window=window)
        ref_out[a:b], ref_lse[:, a:b] = o[0].detach(), l[0].detach()
        for g_all, g in zip(ref_grads, torch.autograd.grad(o, xs, dout[a:b].double()[None])):
            g_all[a:b] = g[0]
    assert out.shape == (sum(lengths), h, D) and lse.shape == (h, sum(lengths))
    assert_2x(out, single.detach(), ref_out, f"{name} world{world} out")
    assert_2x(lse, single_lse, ref_lse, f"{name} world{world} lse")
    scale = max(g.abs().max().item() for g in ref_grads)
    for gname, g, gs, gr in zip(("dq", "dk", "dv"), (dq, dk, dv), single_grads, ref_grads):
        assert_2x(g, gs, gr, f"{name} world{world} {gname}", scale)


def test_shard_varlen_roundtrip():
    cu = _cu([8, 0, 16])
    x = torch.arange(24 * 3).reshape(24, 3)
    for causal in (False, True):
        shards = [shard_varlen(x, cu, r, 2, causal) for r in range(2)]
        assert shards[0][1].tolist() == [0, 4, 4, 12]
        assert torch.equal(unshard_varlen([s for s, _ in shards], cu, 2, causal), x)
    assert shards[1][0][:4, 0].tolist() == [6, 9, 12, 15]  # causal, rank 1: chunks 1 and 2 (rows 2-5) of sequence 0
    with pytest.raises(ValueError, match="sequence 0 has length 8"):
        shard_varlen(x, cu, 0, 3)


def test_zigzag_roundtrip_and_layout():
    world, n = 3, 12
    x = torch.arange(2 * n).reshape(2, n)
    shards = [zigzag_shard(x, r, world) for r in range(world)]
    # rank r holds chunks r and 2*world-1-r (chunk length n / (2*world) = 2)
    assert shards[0][0].tolist() == [0, 1, 10, 11]
    assert shards[2][0].tolist() == [4, 5, 6, 7]
    assert torch.equal(zigzag_unshard(shards, world), x)
    with pytest.raises(ValueError):
        zigzag_shard(torch.zeros(1, 10), 0, 3)


def test_ring_attention_world1(tmp_path):
    """A group of one rank: no transfers, the result is the single-process one (causal, GQA)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        q, k, v = torch.randn(2, 32, 4, D), torch.randn(2, 32, 2, D), torch.randn(2, 32, 2, D)
        dout = torch.randn(2, 32, 4, D)
        for causal in (False, True):
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
            out = ring_attention(*leaves, causal=causal)
            grads = torch.autograd.grad(out, leaves, dout)
            leaves1 = [x.clone().requires_grad_(True) for x in (q, k, v)]
            single = flashattn.flash_attn_func(*leaves1, causal=causal)
            single_grads = torch.autograd.grad(single, leaves1, dout)
            torch.testing.assert_close(out, single, rtol=1e-5, atol=1e-6)
            for g, gs in zip(grads, single_grads):
                torch.testing.assert_close(g, gs, rtol=1e-5, atol=1e-5)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_call_plan_matches_single_process(causal):
    """The per-step call plan (_calls) against single-process attention, without processes: every rank's
    shards are computed in one process, step by step, and merged as the ring merges them. Worlds 1-4,
    windows that fall inside one chunk, span chunk boundaries, are one-sided or wider than the sequence."""
    from flashattn.distributed import _Dense

    g = torch.Generator().manual_seed(7)
    n, scale = 96, 0.25
    q, k, v = (torch.randn(1, n, 2, 16, generator=g) for _ in range(3))
    for window in [(-1, -1), (5, 0), (0, 0), (7, 3), (20, -1), (-1, 9), (40, 40), (1, 2), (200, 0)]:
        window = (window[0], 0) if causal else window
        ref = flashattn.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window)
        for world in (1, 2, 3, 4):
            outs = []
            for rank in range(world):
                q_local = _shard(q, rank, world, causal)
                layout = _Dense(causal, window, 0.0, scale)
                out, lse = layout.empty(q_local, q_local)
                for src in range(world):
                    k_local, v_local = _shard(k, src, world, causal), _shard(v, src, world, causal)
                    for call in layout.calls(q_local, rank, src, world):
                        layout.fwd(call, q_local, k_local, v_local, out, lse)
                outs.append(out)
            err = (_unshard(outs, world, causal) - ref).abs().max().item()
            assert err < 2e-6, f"window {window} world {world}: max error {err:.2e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_varlen_call_plan_matches_single_process(causal):
    """_Varlen's grouped calls against flash_attn_varlen_func, in one process, worlds 1-4 (lengths that are
    multiples of 24 = 2 * 3 * 4, an empty sequence included)."""
    from flashattn.distributed import _Varlen

    g = torch.Generator().manual_seed(11)
    lengths = [24, 0, 48, 72]
    cu = _cu(lengths)
    q, k, v = (torch.randn(sum(lengths), 2, 16, generator=g) for _ in range(3))
    for window in [(-1, -1), (5, 0), (7, 3), (30, -1), (0, 0)]:
        window = (window[0], 0) if causal else window
        ref = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), softmax_scale=0.25,
                                               causal=causal, window_size=window)
        for world in (1, 2, 3, 4):
            outs = []
            for rank in range(world):
                q_local, cu_local = shard_varlen(q, cu, rank, world, causal)
                layout = _Varlen(cu_local, causal, window, 0.0, 0.25)
                out, lse = layout.empty(q_local, q_local)
                for src in range(world):
                    k_local, v_local = shard_varlen(k, cu, src, world, causal)[0], shard_varlen(v, cu, src, world,
                                                                                                causal)[0]
                    for call in layout.calls(q_local, rank, src, world):
                        layout.fwd(call, q_local, k_local, v_local, out, lse)
                outs.append(out)
            err = (unshard_varlen(outs, cu, world, causal) - ref).abs().max().item()
            assert err < 2e-6, f"window {window} world {world}: max error {err:.2e}"


def test_ring_attention_rejects_what_it_cannot_serve():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        ring_attention(q, q, q, alibi_slopes=torch.ones(2))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        ring_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="window_size"):
        ring_attention(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match="softcap"):
        ring_attention(q, q, q, softcap=-1.0)
