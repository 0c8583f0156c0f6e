"""memory_plan: the exact bytes a call will need, before running it.

Asks the C API (fa_fwd_workspace_size / fa_bwd_workspace_size) with zero-stride stand-ins of
the real shapes, so nothing of the size of the inputs is allocated. The sizes are the ones the
ops allocate (flashattn._ops allocates exactly the queried workspace), byte for byte.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from . import _ops
from .interface import _check_dropout, _scale, _window

ShapeLike = Union[Tensor, Sequence[int]]


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of one call. Forward: workspace + out + lse (+ padded copies); backward: workspace + grads."""
    fwd_workspace_bytes: int
    out_bytes: int
    lse_bytes: int
    bwd_workspace_bytes: int
    grad_bytes: int
    pad_bytes: int  # padded copies of q, k, v when a head dim is not a multiple of 8 (0 otherwise)

    @property
    def fwd_bytes(self) -> int:
        return self.fwd_workspace_bytes + self.out_bytes + self.lse_bytes + self.pad_bytes

    @property
    def bwd_bytes(self) -> int:
        return self.bwd_workspace_bytes + self.grad_bytes

    @property
    def total_bytes(self) -> int:
        """Everything the library allocates for a forward and a backward, beyond the inputs."""
        return self.fwd_bytes + self.bwd_bytes


def _stand_in(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
    # A view with the real shape over shape[-1] elements: validation reads shapes and strides only.
    shape = tuple(int(s) for s in shape)
    base = torch.empty((max(shape[-1], 1),), dtype=dtype, device=device)[: shape[-1]]
    return base.expand(shape)


def _padded(shape):
    return tuple(shape[:-1]) + (shape[-1] + (-shape[-1]) % 8,)


def memory_plan(q: ShapeLike, k: ShapeLike, v: ShapeLike, cu_seqlens_q: Optional[Tensor] = None,
                cu_seqlens_k: Optional[Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_k: Optional[int] = None, *, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                alibi_slopes: Optional[Tensor] = None, deterministic: bool = False, backward: bool = True,
                dtype: Optional[torch.dtype] = None, device=None) -> MemoryPlan:
    """Exact workspace and output bytes of flash_attn_func (or, with cu_seqlens, flash_attn_varlen_func).

    q, k, v are tensors (any device, "meta" included: only shape and dtype are read) or shapes, in the
    flash-attn layouts (B, S, H, D) or (T, H, D). dtype and device default to q's (else bf16, cpu).
    For varlen on the CPU, cu_seqlens must be the real offsets (their values are validated).
    """
    def info(x):
        if isinstance(x, Tensor):
            return tuple(x.shape), x.dtype, x.device
        return tuple(int(s) for s in x), None, None

    (qs, qd, qdev), (ks, _, _), (vs, _, _) = info(q), info(k), info(v)
    dtype = dtype or qd or torch.bfloat16
    device = torch.device(device) if device is not None else (
        qdev if qdev is not None and qdev.type != "meta" else torch.device("cpu"))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    rank = 3 if varlen else 4
    for name, s in (("q", qs), ("k", ks), ("v", vs)):
        if len(s) != rank:
            raise ValueError(f"{name}: expected rank {rank}, got shape {s}")
    pq, pk, pv = _padded(qs), _padded(ks), _padded(vs)
    esize = torch.empty((), dtype=dtype).element_size()
    numel = lambda s: int(torch.Size(s).numel())  # noqa: E731
    pad_bytes = sum(numel(p) * esize for p, s in ((pq, qs), (pk, ks), (pv, vs)) if p != s)

    sq, sk, sv = (_stand_in(s, dtype, device) for s in (pq, pk, pv))
    out_shape = pq[:-1] + (pv[-1],)
    lse_shape = (pq[1], pq[0]) if varlen else (pq[0], pq[2], pq[1])
    out = _stand_in(out_shape, dtype, device)
    lse = _stand_in(lse_shape, torch.float32, device)
    p = _check_dropout(dropout_p)
    left, right = _window(causal, window_size)
    opts = _ops._opts(_scale(softmax_scale, qs[-1]), bool(causal), False, left, right, float(softcap), p,
                      None, bool(deterministic), sq)
    opts["dropout_p"] = p
    cu = (cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q or 0), int(max_seqlen_k or 0))
    fwd_ws = _ops.run_fwd(sq, sk, sv, out, lse, *cu, alibi_slopes, opts, query=True)
    bwd_ws = 0
    grad_bytes = 0
    if backward:
        dq, dk, dv = (_stand_in(s, dtype, device) for s in (pq, pk, pv))
        bwd_ws = _ops.run_bwd(out, sq, sk, sv, out, lse, dq, dk, dv, *cu, alibi_slopes, opts, query=True)
        grad_bytes = (numel(pq) + numel(pk) + numel(pv)) * esize
    # out is allocated with the padded head dim; the unpadded result is a view of it.
    return MemoryPlan(fwd_workspace_bytes=fwd_ws, out_bytes=numel(out_shape) * esize, lse_bytes=numel(lse_shape) * 4,
                      bwd_workspace_bytes=bwd_ws, grad_bytes=grad_bytes, pad_bytes=pad_bytes)
