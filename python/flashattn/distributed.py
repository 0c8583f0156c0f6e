"""Context parallelism: ring attention over torch.distributed (gloo on CPUs, NCCL on GPUs).

Each rank of a process group holds one shard of the sequence: q (B, S_local, H, D), k/v
(B, S_local, Hkv, D) (GQA allowed). K/V shards travel around the ring with point-to-point calls
(`dist.batch_isend_irecv`); the transfer of the next shard is posted before the current shard is
computed, so it overlaps that compute. Partial results are merged exactly with their LSE in fp32:
lse = logsumexp_i(lse_i), out = sum_i exp(lse_i - lse) out_i; a shard that a row does not see
(the library reports LSE +inf and out 0 for such rows) contributes nothing.

Backward runs the ring again. The library's backward recomputes P = exp(S - LSE) with the LSE it is
given and D = rowsum(dO * O) with the O it is given, so calling it on one K/V shard with the GLOBAL
(merged) out and LSE yields exactly that shard's contribution to dQ, dK, dV. dQ is accumulated
locally (fp32); the dK/dV accumulators (fp32) travel around the ring with their shard and arrive
back at the owner after a full loop.

Causal attention uses the load-balanced "zigzag" sharding: the global sequence (length N) is cut
into 2*world chunks and rank r holds chunks r and 2*world-1-r, concatenated (`zigzag_shard`,
`zigzag_unshard`). Every ring step then costs each rank the same work (half a full block), except
the first, which is one causal call on the local shard.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from . import _ops
from .interface import _pad8, _scale

__all__ = ["ring_attention", "zigzag_shard", "zigzag_unshard"]


# ----------------------------------------------------------------------------------------------
# Sharding helpers


def zigzag_shard(x: Tensor, rank: int, world: int, dim: int = 1) -> Tensor:
    """Rank `rank`'s causal shard of the global sequence x: chunks rank and 2*world-1-rank of 2*world."""
    n = x.shape[dim]
    if n % (2 * world):
        raise ValueError(f"zigzag_shard: sequence length {n} is not a multiple of 2*world = {2 * world}")
    chunks = x.chunk(2 * world, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim)


def zigzag_unshard(shards: List[Tensor], world: int, dim: int = 1) -> Tensor:
    """Inverse of zigzag_shard: the global sequence from the shards of ranks 0..world-1."""
    if len(shards) != world:
        raise ValueError(f"zigzag_unshard: expected {world} shards, got {len(shards)}")
    chunks: List[Optional[Tensor]] = [None] * (2 * world)
    for r, s in enumerate(shards):
        a, b = s.chunk(2, dim=dim)
        chunks[r], chunks[2 * world - 1 - r] = a, b
    return torch.cat(chunks, dim=dim)


# ----------------------------------------------------------------------------------------------
# Ring plumbing


class _Ring:
    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if group is None or group is dist.group.WORLD:
            glob = lambda r: r  # noqa: E731
        else:
            glob = lambda r: dist.get_global_rank(group, r)  # noqa: E731
        self.next = glob((self.rank + 1) % self.world)
        self.prev = glob((self.rank - 1) % self.world)

    def shift(self, send: Tensor, tag: int):
        """Posts send -> next rank and a receive from the previous rank; returns (recv buffer, requests)."""
        recv = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        return recv, dist.batch_isend_irecv(ops)


def _wait(reqs) -> None:
    for r in reqs or ():
        r.wait()


def _fwd(q, k, v, scale, causal):
    return torch.ops.flashattn.fwd(q, k, v, None, None, scale, causal, True, -1, 0 if causal else -1, 0.0, 0.0,
                                   False)


def _bwd(dout, q, k, v, out, lse, scale, causal):
    return torch.ops.flashattn.bwd(dout, q, k, v, out, lse, None, None, scale, causal, True, -1,
                                   0 if causal else -1, 0.0, 0.0, False)


def _merge(out: Tensor, lse: Tensor, out_i: Tensor, lse_i: Tensor) -> None:
    """In place: (out, lse) <- exact merge with (out_i, lse_i). out (B, S, H, D) fp32, lse (B, H, S) fp32.

    lse uses -inf for "no key seen yet"; the library's +inf (empty row) is read as -inf.
    """
    lse_i = torch.where(torch.isposinf(lse_i), torch.full_like(lse_i, float("-inf")), lse_i)
    new = torch.logaddexp(lse, lse_i)
    empty = torch.isneginf(new)
    safe = torch.where(empty, torch.zeros_like(new), new)
    w_old = torch.where(empty, torch.zeros_like(new), torch.exp(lse - safe))
    w_new = torch.where(empty, torch.zeros_like(new), torch.exp(lse_i - safe))
    # (B, H, S) -> (B, S, H, 1)
    out.mul_(w_old.transpose(1, 2).unsqueeze(-1)).add_(w_new.transpose(1, 2).unsqueeze(-1) * out_i.float())
    lse.copy_(new)


def _plan(causal: bool, rank: int, src: int, c: int):
    """(q rows, k rows, causal) of the one library call for the K/V shard of rank src, or None.

    Zigzag: q = [chunk r, chunk 2W-1-r], k = [chunk s, chunk 2W-1-s], each chunk c rows.
    s == r: one causal call on the whole shard (top-left = bottom-right, equal lengths).
    s <  r: both q chunks see k chunk s fully and not k chunk 2W-1-s.
    s >  r: q chunk 2W-1-r sees both k chunks fully; q chunk r sees nothing.
    """
    full = slice(None)
    if not causal:
        return full, full, False
    if src == rank:
        return full, full, True
    if src < rank:
        return full, slice(0, c), False
    return slice(c, None), full, False


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, group):
        ring = _Ring(group)
        b, s, h, _ = q.shape
        c = s // 2
        out = torch.zeros((b, s, h, v.shape[-1]), dtype=torch.float32, device=q.device)
        lse = torch.full((b, h, s), float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]) if k.shape == v.shape else None
        cur_k, cur_v = k, v
        for step in range(ring.world):
            reqs = None
            if step + 1 < ring.world:  # post the next shard's transfer before this shard's compute
                if kv is not None:
                    nxt, reqs = ring.shift(kv, tag=0)
                else:
                    (nk, rk), (nv, rv) = ring.shift(cur_k.contiguous(), 0), ring.shift(cur_v.contiguous(), 1)
                    reqs = list(rk) + list(rv)
            src = (ring.rank - step) % ring.world
            plan = _plan(causal, ring.rank, src, c)
            if plan is not None:
                rows, cols, cz = plan
                o_i, l_i = _fwd(q[:, rows], cur_k[:, cols], cur_v[:, cols], scale, cz)
                _merge(out[:, rows], lse[:, :, rows], o_i, l_i)
            _wait(reqs)
            if step + 1 < ring.world:
                if kv is not None:
                    kv = nxt
                    cur_k, cur_v = kv[0], kv[1]
                else:
                    cur_k, cur_v = nk, nv
        lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)  # library convention
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.causal, ctx.group = scale, causal, group
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal = ctx.scale, ctx.causal
        ring = _Ring(ctx.group)
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        b, s, h, _ = q.shape
        c = s // 2
        same = k.shape == v.shape
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]) if same else None
        cur_k, cur_v = k, v
        dkv_recv, dkv_reqs = None, None  # the travelling fp32 dK/dV accumulator and its requests
        for step in range(ring.world):
            kv_reqs = None
            if step + 1 < ring.world:
                if same:
                    nxt, kv_reqs = ring.shift(kv, tag=0)
                else:
                    (nk, rk), (nv, rv) = ring.shift(cur_k.contiguous(), 0), ring.shift(cur_v.contiguous(), 1)
                    kv_reqs = list(rk) + list(rv)
            src = (ring.rank - step) % ring.world
            plan = _plan(causal, ring.rank, src, c)
            contrib = None
            if plan is not None:
                rows, cols, cz = plan
                dq_i, dk_i, dv_i = _bwd(dout[:, rows], q[:, rows], cur_k[:, cols], cur_v[:, cols], out[:, rows],
                                        lse[:, :, rows], scale, cz)
                dq[:, rows] += dq_i.float()
                contrib = (cols, dk_i, dv_i)
            # the accumulator of the shard held now arrives from the previous rank (posted last step)
            _wait(dkv_reqs)
            if dkv_recv is None:
                dkv = [torch.zeros(cur_k.shape, dtype=torch.float32, device=q.device),
                       torch.zeros(cur_v.shape, dtype=torch.float32, device=q.device)]
            else:
                dkv = dkv_recv
            if contrib is not None:
                cols, dk_i, dv_i = contrib
                dkv[0][:, cols] += dk_i.float()
                dkv[1][:, cols] += dv_i.float()
            if ring.world > 1:  # send it on; after the last step it reaches its owner
                (rk_, r1), (rv_, r2) = ring.shift(dkv[0], 2), ring.shift(dkv[1], 3)
                dkv_recv, dkv_reqs = [rk_, rv_], list(r1) + list(r2)
            else:
                dkv_recv = dkv
            _wait(kv_reqs)
            if step + 1 < ring.world:
                if same:
                    kv = nxt
                    cur_k, cur_v = kv[0], kv[1]
                else:
                    cur_k, cur_v = nk, nv
        _wait(dkv_reqs)
        dk, dv = dkv_recv
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group=None, causal: bool = False,
                   softmax_scale: Optional[float] = None, return_lse: bool = False):
    """Exact attention over a sequence sharded across the ranks of `group` (default: the world group).

    q (B, S_local, H, D), k (B, S_local, Hkv, D), v (B, S_local, Hkv, Dv), the same S_local on every
    rank. Non-causal: any contiguous sharding (rank r holds the r-th block of the sequence; the order
    of blocks does not matter). Causal: the shards must be `zigzag_shard(x, rank, world)` of the
    global tensors (S_local even); the output is in the same zigzag layout. Returns out
    (B, S_local, H, Dv) and, with return_lse=True, also the global LSE (B, H, S_local) fp32
    (non-differentiable). Differentiable in q, k, v.
    """
    _ops.check_devices(q=q, k=k, v=v)
    _ops.check_rank("q", q, 4, "(batch, seqlen_local, heads, head_dim)")
    _ops.check_rank("k", k, 4, "(batch, seqlen_local, heads_k, head_dim)")
    _ops.check_rank("v", v, 4, "(batch, seqlen_local, heads_k, head_dim_v)")
    if not (q.shape[1] == k.shape[1] == v.shape[1]):
        raise ValueError(f"ring_attention: q, k, v must have the same local sequence length, got "
                         f"{q.shape[1]}, {k.shape[1]}, {v.shape[1]}")
    if causal and q.shape[1] % 2:
        raise ValueError(f"ring_attention: causal needs an even local sequence length (zigzag sharding), "
                         f"got {q.shape[1]}")
    scale = _scale(softmax_scale, q.shape[-1])
    dv = v.shape[-1]
    out, lse = _RingAttention.apply(_pad8(q), _pad8(k), _pad8(v), scale, bool(causal), group)
    out = out if out.shape[-1] == dv else out[..., :dv]
    return (out, lse) if return_lse else out
