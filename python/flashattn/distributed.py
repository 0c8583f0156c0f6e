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

Sliding windows (and softcap) pass through: a window in global positions becomes, for each pair of
query and key chunks, a call on the rows and keys the window can reach, with the window shifted by
the chunks' distance (`_calls`); pairs the window misses cost nothing.

Causal attention uses the load-balanced "zigzag" sharding: the global sequence (length N) is cut
into 2*world chunks and rank r holds chunks r and 2*world-1-r, concatenated (`zigzag_shard`,
`zigzag_unshard`). Every ring step then costs each rank the same work (half a full block), except
the first, which is one causal call on the local shard.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _ops
from .interface import _pad8, _scale, _window

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


def _compute(*tensors: Tensor) -> Tuple[Tensor, ...]:
    """The operands of one call. On the CPU, 16-bit shards are computed in fp32 (the CPU backend takes
    fp32): a 16-bit partial result would be rounded once per ring step before the fp32 merge, and the
    dK/dV of a shard sum world such partials, up to world times the rounding of one call. The CUDA
    backend has no fp32 path yet, so on GPUs the partials are 16-bit (docs/python.md)."""
    if tensors[0].device.type != "cpu":
        return tensors
    return tuple(t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for t in tensors)


def _fwd(q, k, v, scale, call, softcap):
    return torch.ops.flashattn.fwd(*_compute(q, k, v), None, None, scale, call.causal, call.top_left,
                                   call.window_left, call.window_right, softcap, 0.0, False)


def _bwd(dout, q, k, v, out, lse, scale, call, softcap):
    return torch.ops.flashattn.bwd(*_compute(dout, q, k, v, out), lse, None, None, scale, call.causal,
                                   call.top_left, call.window_left, call.window_right, softcap, 0.0, False)


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


class _Call(NamedTuple):
    """One library call: query rows and key rows of the local shards, and its mask."""
    rows: slice
    cols: slice
    causal: bool
    top_left: bool = False
    window_left: int = -1
    window_right: int = -1


def _calls(causal: bool, window: Tuple[int, int], rank: int, src: int, world: int, s_local: int) -> List[_Call]:
    """The library calls that bring the K/V shard of rank `src` to rank `rank`'s queries.

    Without a window (zigzag causal, or full attention) whole shards or halves go in one call:
    s == r: one causal call on the whole shard (top-left = bottom-right, equal lengths);
    s <  r: both q chunks see k chunk s fully and k chunk 2W-1-s not at all;
    s >  r: q chunk 2W-1-r sees both k chunks fully, q chunk r sees nothing.

    With a window (left, right) in global positions (causal: right = 0) every (q chunk, k chunk)
    pair is one call. Query chunk at global start qs and key chunk at ks, d = qs - ks: local query i
    sees local key j iff i + d - left <= j <= i + d + right. The call drops the r leading query rows
    that see no key of the chunk and the s leading keys that no query sees, so that the remaining
    offset e = d + r - s lies in [-right, left], and passes the window (left - e, right + e) with
    top-left alignment, which then means exactly the global window.
    """
    if window == (-1, -1) or (causal and window == (-1, 0)):
        full = slice(None)
        if not causal:
            return [_Call(full, full, False)]
        c = s_local // 2
        if src == rank:
            return [_Call(full, full, True)]
        if src < rank:
            return [_Call(full, slice(0, c), False)]
        return [_Call(slice(c, None), full, False)]
    left, right = window
    length = s_local // 2 if causal else s_local

    def chunks(r):
        return [(r, 0), (2 * world - 1 - r, length)] if causal else [(r, 0)]

    calls = []
    for q_index, q_off in chunks(rank):
        for k_index, k_off in chunks(src):
            d = (q_index - k_index) * length
            skip_rows = max(0, -right - d) if right >= 0 else 0
            skip_keys = max(0, d - left) if left >= 0 else 0
            if skip_rows >= length or skip_keys >= length:
                continue  # the window misses this pair of chunks
            e = d + skip_rows - skip_keys
            calls.append(_Call(slice(q_off + skip_rows, q_off + length), slice(k_off + skip_keys, k_off + length),
                               False, True, left - e if left >= 0 else -1, right + e if right >= 0 else -1))
    return calls


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, window, softcap, group):
        ring = _Ring(group)
        b, s, h, _ = q.shape
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
            for call in _calls(causal, window, ring.rank, src, ring.world, s):
                o_i, l_i = _fwd(q[:, call.rows], cur_k[:, call.cols], cur_v[:, call.cols], scale, call, softcap)
                _merge(out[:, call.rows], lse[:, :, call.rows], o_i, l_i)
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
        ctx.scale, ctx.causal, ctx.window, ctx.softcap, ctx.group = scale, causal, window, softcap, group
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, window, softcap = ctx.scale, ctx.causal, ctx.window, ctx.softcap
        ring = _Ring(ctx.group)
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        b, s, h, _ = q.shape
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
            contribs = []
            for call in _calls(causal, window, ring.rank, src, ring.world, s):
                rows, cols = call.rows, call.cols
                dq_i, dk_i, dv_i = _bwd(dout[:, rows], q[:, rows], cur_k[:, cols], cur_v[:, cols], out[:, rows],
                                        lse[:, :, rows], scale, call, softcap)
                dq[:, rows] += dq_i.float()
                contribs.append((cols, dk_i, dv_i))
            # the accumulator of the shard held now arrives from the previous rank (posted last step)
            _wait(dkv_reqs)
            if dkv_recv is None:
                dkv = [torch.zeros(cur_k.shape, dtype=torch.float32, device=q.device),
                       torch.zeros(cur_v.shape, dtype=torch.float32, device=q.device)]
            else:
                dkv = dkv_recv
            for cols, dk_i, dv_i in contribs:
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
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group=None, causal: bool = False,
                   softmax_scale: Optional[float] = None, window_size=(-1, -1), softcap: float = 0.0,
                   alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0, return_lse: bool = False):
    """Exact attention over a sequence sharded across the ranks of `group` (default: the world group).

    q (B, S_local, H, D), k (B, S_local, Hkv, D), v (B, S_local, Hkv, Dv), the same S_local on every
    rank. Non-causal: any contiguous sharding (rank r holds the r-th block of the sequence; with a
    window the blocks must be in rank order, otherwise their order does not matter). Causal: the
    shards must be `zigzag_shard(x, rank, world)` of the global tensors (S_local even); the output is
    in the same zigzag layout. window_size (left, right) and softcap mean what they mean in
    flash_attn_func, in global positions (causal sets right = 0); shard pairs outside the window cost
    nothing. Returns out (B, S_local, H, Dv) and, with return_lse=True, also the global LSE
    (B, H, S_local) fp32 (non-differentiable). Differentiable in q, k, v.
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
    if alibi_slopes is not None:
        raise NotImplementedError("ring_attention: alibi_slopes are not supported (the library's ALiBi distance "
                                  "is relative to each call's local alignment); gather the sequence and use "
                                  "flashattn.flash_attn_func(..., alibi_slopes=...)")
    if dropout_p != 0.0:
        raise NotImplementedError("ring_attention: dropout_p > 0 is not supported (the keep mask is indexed by "
                                  "local positions); gather the sequence and use flashattn.flash_attn_func(..., "
                                  "dropout_p=...)")
    window = _window(causal, window_size)
    if window[0] < -1 or window[1] < -1:
        raise ValueError(f"window_size: expected values >= -1 (-1: unbounded), got {tuple(window_size)}")
    softcap = float(softcap)
    if not softcap >= 0.0:
        raise ValueError(f"softcap: expected a value >= 0 (0: off), got {softcap}")
    scale = _scale(softmax_scale, q.shape[-1])
    dv = v.shape[-1]
    out, lse = _RingAttention.apply(_pad8(q), _pad8(k), _pad8(v), scale, bool(causal), window, softcap, group)
    out = out if out.shape[-1] == dv else out[..., :dv]
    return (out, lse) if return_lse else out
