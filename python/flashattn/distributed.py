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

__all__ = ["ring_attention", "ring_attention_varlen", "shard_varlen", "unshard_varlen", "zigzag_shard",
           "zigzag_unshard"]


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


def shard_varlen(x: Tensor, cu_seqlens: Tensor, rank: int, world: int, causal: bool = False, dim: int = 0):
    """Rank `rank`'s shard of packed sequences x (rows in `dim`, offsets cu_seqlens): every sequence is
    split over the ranks, zigzag when causal (its length a multiple of 2*world), else in `world`
    contiguous blocks (a multiple of world). Returns (x_local, cu_seqlens_local), the local offsets
    being cu_seqlens / world on every rank."""
    bounds = cu_seqlens.tolist()
    unit = 2 * world if causal else world
    parts = []
    for b in range(len(bounds) - 1):
        length = bounds[b + 1] - bounds[b]
        if length % unit:
            raise ValueError(f"shard_varlen: sequence {b} has length {length}, expected a multiple of {unit} "
                             f"({'2*world, causal' if causal else 'world'})")
        seq = x.narrow(dim, bounds[b], length)
        parts.append(zigzag_shard(seq, rank, world, dim) if causal else seq.chunk(world, dim=dim)[rank])
    local = torch.cat(parts, dim=dim) if parts else x.narrow(dim, 0, 0)
    return local, torch.div(cu_seqlens, world, rounding_mode="floor")


def unshard_varlen(shards: List[Tensor], cu_seqlens: Tensor, world: int, causal: bool = False, dim: int = 0):
    """Inverse of shard_varlen: the packed global tensor from the shards of ranks 0..world-1
    (cu_seqlens: the global offsets)."""
    if len(shards) != world:
        raise ValueError(f"unshard_varlen: expected {world} shards, got {len(shards)}")
    local = [b // world for b in cu_seqlens.tolist()]
    seqs = []
    for b in range(len(local) - 1):
        pieces = [s.narrow(dim, local[b], local[b + 1] - local[b]) for s in shards]
        seqs.append(zigzag_unshard(pieces, world, dim) if causal else torch.cat(pieces, dim=dim))
    return torch.cat(seqs, dim=dim) if seqs else shards[0].narrow(dim, 0, 0)


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


class _Dense:
    """Shards (B, S_local, H, D); a call's rows and keys are slices of dim 1; LSE (B, H, S_local)."""

    def __init__(self, causal, window, softcap, scale):
        self.causal, self.window, self.softcap, self.scale = causal, window, softcap, scale

    def calls(self, q, rank, src, world):
        return _calls(self.causal, self.window, rank, src, world, q.shape[1])

    def empty(self, q, v):
        b, s, h, _ = q.shape
        return (torch.zeros((b, s, h, v.shape[-1]), dtype=torch.float32, device=q.device),
                torch.full((b, h, s), float("-inf"), dtype=torch.float32, device=q.device))

    def fwd(self, call, q, k, v, out, lse):
        o_i, l_i = torch.ops.flashattn.fwd(*_compute(q[:, call.rows], k[:, call.cols], v[:, call.cols]), None, None,
                                           self.scale, call.causal, call.top_left, call.window_left,
                                           call.window_right, self.softcap, 0.0, False)
        _merge(out[:, call.rows], lse[:, :, call.rows], o_i, l_i)

    def bwd(self, call, dout, q, k, v, out, lse, dq):
        """Adds the call's dQ; returns its dK, dV for add_dkv."""
        rows, cols = call.rows, call.cols
        dq_i, dk_i, dv_i = torch.ops.flashattn.bwd(
            *_compute(dout[:, rows], q[:, rows], k[:, cols], v[:, cols], out[:, rows]), lse[:, :, rows], None, None,
            self.scale, call.causal, call.top_left, call.window_left, call.window_right, self.softcap, 0.0, False)
        dq[:, rows] += dq_i.float()
        return dk_i, dv_i

    def add_dkv(self, call, dkv, dk_i, dv_i):
        dkv[0][:, call.cols] += dk_i.float()
        dkv[1][:, call.cols] += dv_i.float()


class _VarlenCall(NamedTuple):
    rows: Tensor  # packed local query rows of the call's sequences, in order
    cols: Tensor  # packed local key rows
    cu_q: Tensor  # int32 (n+1) offsets of the call's sequences in rows / cols
    cu_k: Tensor
    max_q: int
    max_k: int
    mask: _Call   # causal / alignment / window of every sequence of the call


class _Varlen:
    """Shards (T_local, H, D) of packed sequences, every sequence sharded over the ranks (its local length
    cu_seqlens[b+1] - cu_seqlens[b] is the same on every rank); LSE (H, T_local).

    Each sequence gets the dense plan of its own length; the calls of equal mask and the same place in
    their sequence's plan go into one varlen library call, so a query row appears at most once per call.
    """

    def __init__(self, cu_seqlens, causal, window, softcap, scale):
        self.causal, self.window, self.softcap, self.scale = causal, window, softcap, scale
        self.bounds = cu_seqlens.tolist()

    def calls(self, q, rank, src, world):
        groups = {}
        for b in range(len(self.bounds) - 1):
            start, length = self.bounds[b], self.bounds[b + 1] - self.bounds[b]
            if length == 0:
                continue
            for position, call in enumerate(_calls(self.causal, self.window, rank, src, world, length)):
                key = (position, call.causal, call.top_left, call.window_left, call.window_right)
                rows = range(length)[call.rows]
                cols = range(length)[call.cols]
                groups.setdefault(key, []).append((start, rows, cols, call))
        calls = []
        for members in groups.values():
            def packed(which):
                return torch.cat([torch.arange(start + m[which].start, start + m[which].stop, device=q.device)
                                  for start, *m in members])

            def offsets(which):
                lengths = torch.tensor([len(m[which]) for _, *m in members], dtype=torch.int32)
                return torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0, dtype=torch.int32)]).to(q.device)

            calls.append(_VarlenCall(packed(0), packed(1), offsets(0), offsets(1),
                                     max(len(m[0]) for _, *m in members), max(len(m[1]) for _, *m in members),
                                     members[0][3]))
        return calls

    def empty(self, q, v):
        t, h, _ = q.shape
        return (torch.zeros((t, h, v.shape[-1]), dtype=torch.float32, device=q.device),
                torch.full((h, t), float("-inf"), dtype=torch.float32, device=q.device))

    def fwd(self, call, q, k, v, out, lse):
        m = call.mask
        o_i, l_i = torch.ops.flashattn.fwd_varlen(
            *_compute(q[call.rows], k[call.cols], v[call.cols]), call.cu_q, call.cu_k, call.max_q, call.max_k, None,
            None, self.scale, m.causal, m.top_left, m.window_left, m.window_right, self.softcap, 0.0, False)
        # gather, merge, scatter: (T, H, D) rows and (H, T) columns; _merge takes (B, S, H, D) / (B, H, S)
        o, l_ = out[call.rows].unsqueeze(0), lse[:, call.rows].unsqueeze(0)
        _merge(o, l_, o_i.unsqueeze(0), l_i.unsqueeze(0))
        out[call.rows] = o[0]
        lse[:, call.rows] = l_[0]

    def bwd(self, call, dout, q, k, v, out, lse, dq):
        m, rows, cols = call.mask, call.rows, call.cols
        dq_i, dk_i, dv_i = torch.ops.flashattn.bwd_varlen(
            *_compute(dout[rows], q[rows], k[cols], v[cols], out[rows]), lse[:, rows].contiguous(), call.cu_q,
            call.cu_k, call.max_q, call.max_k, None, None, self.scale, m.causal, m.top_left, m.window_left,
            m.window_right, self.softcap, 0.0, False)
        dq.index_add_(0, rows, dq_i.float())
        return dk_i, dv_i

    def add_dkv(self, call, dkv, dk_i, dv_i):
        dkv[0].index_add_(0, call.cols, dk_i.float())
        dkv[1].index_add_(0, call.cols, dv_i.float())


class _RingAttention(torch.autograd.Function):
    """The ring loop, for either layout (_Dense or _Varlen): both keep the sequence's rows in dim -3."""

    @staticmethod
    def forward(ctx, q, k, v, layout, group):
        ring = _Ring(group)
        out, lse = layout.empty(q, v)
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
            for call in layout.calls(q, ring.rank, src, ring.world):
                layout.fwd(call, q, cur_k, cur_v, out, lse)
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
        ctx.layout, ctx.group = layout, group
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        layout = ctx.layout
        ring = _Ring(ctx.group)
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
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
            contribs = [(call, *layout.bwd(call, dout, q, cur_k, cur_v, out, lse, dq))
                        for call in layout.calls(q, ring.rank, src, ring.world)]
            # the accumulator of the shard held now arrives from the previous rank (posted last step)
            _wait(dkv_reqs)
            if dkv_recv is None:
                dkv = [torch.zeros(cur_k.shape, dtype=torch.float32, device=q.device),
                       torch.zeros(cur_v.shape, dtype=torch.float32, device=q.device)]
            else:
                dkv = dkv_recv
            for call, dk_i, dv_i in contribs:
                layout.add_dkv(call, dkv, dk_i, dv_i)
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
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def _options(causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p, head_dim):
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
    return window, softcap, _scale(softmax_scale, head_dim)


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
    window, softcap, scale = _options(causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p,
                                      q.shape[-1])
    dv = v.shape[-1]
    out, lse = _RingAttention.apply(_pad8(q), _pad8(k), _pad8(v), _Dense(bool(causal), window, softcap, scale), group)
    out = out if out.shape[-1] == dv else out[..., :dv]
    return (out, lse) if return_lse else out


def ring_attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, group=None,
                          causal: bool = False, softmax_scale: Optional[float] = None, window_size=(-1, -1),
                          softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, dropout_p: float = 0.0,
                          return_lse: bool = False):
    """ring_attention for packed variable-length sequences, each one sharded over all ranks.

    q (T_local, H, D), k (T_local, Hkv, D), v (T_local, Hkv, Dv) hold this rank's shard of every
    sequence, as `shard_varlen` makes them; cu_seqlens (int32, B+1) are the LOCAL offsets, the same on
    every rank (each sequence's local length is its length / world), max_seqlen the longest local
    length. Causal: zigzag shards of each sequence. Options as ring_attention. Returns out
    (T_local, H, Dv) and, with return_lse=True, the global LSE (H, T_local) fp32.
    """
    _ops.check_devices(q=q, k=k, v=v)
    _ops.check_rank("q", q, 3, "(total_local, heads, head_dim)")
    _ops.check_rank("k", k, 3, "(total_local, heads_k, head_dim)")
    _ops.check_rank("v", v, 3, "(total_local, heads_k, head_dim_v)")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"ring_attention_varlen: q, k, v must have the same number of local rows, got "
                         f"{q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens: expected int32 offsets of shape (batch + 1,), got {cu_seqlens.dtype} "
                         f"{tuple(cu_seqlens.shape)}")
    bounds = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    if bounds[0] != 0 or min(lengths) < 0 or bounds[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to the {q.shape[0]} local rows, "
                         f"got {bounds}")
    if causal and any(n % 2 for n in lengths):
        raise ValueError(f"ring_attention_varlen: causal needs even local sequence lengths (zigzag), got {lengths}")
    if max_seqlen < max(lengths):
        raise ValueError(f"max_seqlen: expected at least the longest local sequence, {max(lengths)}, got {max_seqlen}")
    window, softcap, scale = _options(causal, softmax_scale, window_size, softcap, alibi_slopes, dropout_p,
                                      q.shape[-1])
    dv = v.shape[-1]
    layout = _Varlen(cu_seqlens, bool(causal), window, softcap, scale)
    out, lse = _RingAttention.apply(_pad8(q), _pad8(k), _pad8(v), layout, group)
    out = out if out.shape[-1] == dv else out[..., :dv]
    return (out, lse) if return_lse else out
