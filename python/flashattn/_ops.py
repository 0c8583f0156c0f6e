"""torch.library custom ops over flashattn._C: dense and varlen, forward and backward.

The ops take (B, S, H, D) / (T, H, D) views with any strides but a unit last stride, so
(B, H, S, D) storage is passed without copies. Each op has a fake (meta) implementation with
the exact output shapes and dtypes and the forward ops have registered autograd, so models that
use them trace under torch.compile(fullgraph=True) without graph breaks.

The workspace of every call is allocated here, through torch's allocator (on CUDA: the caching
allocator, on the caller's current stream), with the exact size the C API reports, so that
`flashattn.memory_plan` and the real call agree byte for byte.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C

_ALLOWED_DEVICES = ("cpu", "cuda")
_RNG_HIGH = 2**62


def _stream(t: Tensor) -> int:
    # The caller's current CUDA stream, passed explicitly: the C API never guesses it.
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _workspace(nbytes: int, device: torch.device) -> Optional[Tensor]:
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None


def _allocator(device: torch.device):
    """allocate(nbytes) for _C: the call asks for its exact workspace itself, no separate size query."""
    return lambda nbytes: _workspace(nbytes, device)


def _dl(t: Optional[Tensor]):
    # DLPack refuses tensors that require grad; the ops run below autograd, so detach is free.
    return None if t is None else t.detach()


def new_rng_state(dropout_p: float, device: torch.device) -> Optional[Tensor]:
    """{seed, offset} of a dropout call, an int64 (2,) tensor saved by autograd with the inputs, so that the
    backward reproduces the forward's mask exactly.

    Eagerly it is drawn on torch's default CPU generator and passed by value. While a CUDA graph is being
    captured it is drawn on the CUDA generator, which torch advances on every replay, and stays on the GPU: the
    kernels read it when they run (fa_options.dropout_rng_state), so each replay drops a new mask. By value
    the kernels take the keys from their parameters; read from memory they keep them in shared memory or
    registers, which the dropout kernels pay for in speed (docs/python.md, "CUDA graphs"), hence by value where
    it can be.
    """
    if dropout_p <= 0.0:
        return None
    on_gpu = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    return torch.randint(0, _RNG_HIGH, (2,), dtype=torch.int64, device=device if on_gpu else "cpu")


def _rng(rng_state: Optional[Tensor]) -> dict:
    """The _C arguments of a rng_state: its values when on the CPU, else the tensor the kernels read."""
    if rng_state is None:
        return dict(seed=0, offset=0, rng_state=None)
    if rng_state.device.type == "cpu":
        seed, offset = rng_state.tolist()
        return dict(seed=int(seed), offset=int(offset), rng_state=None)
    return dict(seed=0, offset=0, rng_state=rng_state)


def check_devices(**tensors: Optional[Tensor]) -> None:
    """Device checks that must happen before DLPack export (meta, mps, ... cannot be exported)."""
    ref = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type not in _ALLOWED_DEVICES:
            raise ValueError(f"{name}: expected a cpu or cuda tensor, got device {t.device}")
        if ref is None:
            ref = (name, t.device)
        elif t.device != ref[1]:
            raise ValueError(f"{name}: expected the device of {ref[0]} ({ref[1]}), got {t.device}")


def check_rank(name: str, t: Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got shape {tuple(t.shape)}")


def _opts(softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p, rng_state,
          deterministic, device_tensor):
    return dict(softmax_scale=softmax_scale, causal=causal, top_left=top_left, window_left=window_left,
                window_right=window_right, softcap=softcap, dropout_p=dropout_p, **_rng(rng_state),
                deterministic=deterministic, num_threads=0, stream=_stream(device_tensor))


def run_fwd(q, k, v, out, lse, cu_q, cu_k, max_q, max_k, alibi, opts, query=False) -> int:
    """Calls _C.fwd with an exactly sized workspace; query=True returns the size only."""
    args = (_dl(q), _dl(k), _dl(v), out, lse, cu_q, cu_k, max_q, max_k, _dl(alibi))
    if query:
        return _C.fwd(*args, workspace=None, allocate=None, query=True, **opts)
    return _C.fwd(*args, workspace=None, allocate=_allocator(q.device), query=False, **opts)


def run_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, alibi, opts, query=False) -> int:
    args = (_dl(dout), _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), dq, dk, dv, cu_q, cu_k, max_q, max_k, _dl(alibi))
    if query:
        return _C.bwd(*args, workspace=None, allocate=None, query=True, **opts)
    return _C.bwd(*args, workspace=None, allocate=_allocator(q.device), query=False, **opts)


# ----------------------------------------------------------------------------------------------
# Dense: q (B, Sq, H, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) -> out (B, Sq, H, Dv), lse (B, H, Sq)


@torch.library.custom_op("flashattn::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, alibi_slopes: Optional[Tensor], rng_state: Optional[Tensor],
        softmax_scale: float, causal: bool, top_left: bool, window_left: int, window_right: int,
        softcap: float, dropout_p: float, deterministic: bool) -> Tuple[Tensor, Tensor]:
    b, sq, h, _ = q.shape
    out = q.new_empty((b, sq, h, v.shape[-1]))
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    opts = _opts(softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p, rng_state,
                 deterministic, q)
    run_fwd(q, k, v, out, lse, None, None, 0, 0, alibi_slopes, opts)
    return out, lse


@fwd.register_fake
def _(q, k, v, alibi_slopes, rng_state, softmax_scale, causal, top_left, window_left, window_right, softcap,
      dropout_p, deterministic):
    b, sq, h, _ = q.shape
    return q.new_empty((b, sq, h, v.shape[-1])), q.new_empty((b, h, sq), dtype=torch.float32)


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, alibi_slopes: Optional[Tensor],
        rng_state: Optional[Tensor], softmax_scale: float, causal: bool, top_left: bool, window_left: int,
        window_right: int, softcap: float, dropout_p: float, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)
    opts = _opts(softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p, rng_state,
                 deterministic, q)
    run_bwd(dout, q, k, v, out, lse, dq, dk, dv, None, None, 0, 0, alibi_slopes, opts)
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, out, lse, alibi_slopes, rng_state, softmax_scale, causal, top_left, window_left,
      window_right, softcap, dropout_p, deterministic):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _contiguous_last(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, alibi_slopes, rng_state = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, rng_state)
    ctx.params = inputs[5:]
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, dlse):
    # LSE is returned non-differentiable (as in flash-attn): dlse is ignored.
    q, k, v, out, lse, alibi_slopes, rng_state = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd(_contiguous_last(dout), q, k, v, out, lse, alibi_slopes, rng_state,
                                        *ctx.params)
    return (dq, dk, dv) + (None,) * 10


torch.library.register_autograd("flashattn::fwd", _fwd_backward, setup_context=_fwd_setup_context)


# ----------------------------------------------------------------------------------------------
# Varlen: q (Tq, H, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), cu_seqlens int32 (B + 1)
# -> out (Tq, H, Dv), lse (H, Tq)


@torch.library.custom_op("flashattn::fwd_varlen", mutates_args=())
def fwd_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
               max_seqlen_k: int, alibi_slopes: Optional[Tensor], rng_state: Optional[Tensor], softmax_scale: float,
               causal: bool, top_left: bool, window_left: int, window_right: int, softcap: float,
               dropout_p: float, deterministic: bool) -> Tuple[Tensor, Tensor]:
    tq, h, _ = q.shape
    out = q.new_empty((tq, h, v.shape[-1]))
    lse = torch.empty((h, tq), dtype=torch.float32, device=q.device)
    opts = _opts(softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p, rng_state,
                 deterministic, q)
    run_fwd(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, opts)
    return out, lse


@fwd_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state, softmax_scale,
      causal, top_left, window_left, window_right, softcap, dropout_p, deterministic):
    tq, h, _ = q.shape
    return q.new_empty((tq, h, v.shape[-1])), q.new_empty((h, tq), dtype=torch.float32)


@torch.library.custom_op("flashattn::bwd_varlen", mutates_args=())
def bwd_varlen(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
               cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, alibi_slopes: Optional[Tensor],
               rng_state: Optional[Tensor], softmax_scale: float, causal: bool, top_left: bool, window_left: int,
               window_right: int, softcap: float, dropout_p: float,
               deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)
    opts = _opts(softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p, rng_state,
                 deterministic, q)
    run_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            alibi_slopes, opts)
    return dq, dk, dv


@bwd_varlen.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes, rng_state,
      softmax_scale, causal, top_left, window_left, window_right, softcap, dropout_p, deterministic):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _fwd_varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, alibi_slopes, rng_state = inputs[:9]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_state)
    ctx.max_seqlens = (max_q, max_k)
    ctx.params = inputs[9:]
    ctx.mark_non_differentiable(lse)


def _fwd_varlen_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, alibi_slopes, rng_state = ctx.saved_tensors
    dq, dk, dv = torch.ops.flashattn.bwd_varlen(_contiguous_last(dout), q, k, v, out, lse, cu_q, cu_k,
                                               *ctx.max_seqlens, alibi_slopes, rng_state, *ctx.params)
    return (dq, dk, dv) + (None,) * 14


torch.library.register_autograd("flashattn::fwd_varlen", _fwd_varlen_backward, setup_context=_fwd_varlen_setup_context)
