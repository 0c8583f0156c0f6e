"""flash-attn 2.x compatible functions: same names, argument names, defaults, shapes and returns.

`import flashattn as flash_attn` is enough to switch a flash-attn user over. Conventions are
flash-attn's: (B, S, H, D) layout, causal aligned to the bottom-right corner when Sq != Sk,
window_size=(left, right) with -1 unbounded, LSE (B, H, Sq) or (H, total_q) in fp32.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _ops


def _pad8(x: Tensor) -> Tensor:
    # The kernels take head dims that are multiples of 8; pad with zeros (they change no score and no
    # output column that is kept) and let autograd slice the gradient back, as flash-attn does.
    d = x.shape[-1]
    return x if d % 8 == 0 else F.pad(x, (0, 8 - d % 8))


def _autocast(*tensors: Tensor) -> Tuple[Tensor, ...]:
    """Under autocast, attention runs in the autocast dtype (like torch's SDPA, which autocasts to it)."""
    device_type = tensors[0].device.type
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)
    return tensors


def _scale(softmax_scale: Optional[float], head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(softmax_scale)
    if scale == 0.0:
        # The C API reads 0 as "default"; a literal zero scale (uniform attention) is not served.
        raise NotImplementedError("softmax_scale: 0.0 is not supported (it means uniform attention); "
                                  "use a small positive value or torch.nn.functional.scaled_dot_product_attention")
    return scale


def _window(causal: bool, window_size) -> Tuple[int, int]:
    if window_size is None:
        return -1, -1
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected a pair (left, right), got {window_size!r}") from None
    return left, (0 if causal else right)


def _check_dropout(dropout_p: float) -> float:
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p: expected a probability in [0, 1), got {dropout_p}")
    return p


def _alibi(alibi_slopes: Optional[Tensor]) -> Optional[Tensor]:
    if alibi_slopes is None:
        return None
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes: expected dtype float32, got {alibi_slopes.dtype}")
    return alibi_slopes if alibi_slopes.stride(-1) == 1 else alibi_slopes.contiguous()


def attention(q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
              causal: bool = False, top_left: bool = False, window_size=(-1, -1), softcap: float = 0.0,
              alibi_slopes: Optional[Tensor] = None, deterministic: bool = False) -> Tuple[Tensor, Tensor]:
    """Dense attention in (B, S, H, D); returns (out, lse). The one path every dense API goes through."""
    _ops.check_devices(q=q, k=k, v=v, alibi_slopes=alibi_slopes)
    _ops.check_rank("q", q, 4, "(batch, seqlen, heads, head_dim)")
    _ops.check_rank("k", k, 4, "(batch, seqlen, heads_k, head_dim)")
    _ops.check_rank("v", v, 4, "(batch, seqlen, heads_k, head_dim_v)")
    q, k, v = _autocast(q, k, v)
    p = _check_dropout(dropout_p)
    scale = _scale(softmax_scale, q.shape[-1])
    left, right = _window(causal, window_size)
    dv = v.shape[-1]
    rng_state = _ops.new_rng_state(p, q.device)
    out, lse = torch.ops.flashattn.fwd(_pad8(q), _pad8(k), _pad8(v), _alibi(alibi_slopes), rng_state, scale,
                                       bool(causal), bool(top_left), left, right, float(softcap), p,
                                       bool(deterministic))
    return (out if out.shape[-1] == dv else out[..., :dv]), lse


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, *, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                     causal: bool = False, top_left: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                     alibi_slopes: Optional[Tensor] = None, deterministic: bool = False) -> Tuple[Tensor, Tensor]:
    """Varlen attention in (T, H, D) with cumulative offsets; returns (out, lse (H, Tq))."""
    _ops.check_devices(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                       alibi_slopes=alibi_slopes)
    _ops.check_rank("q", q, 3, "(total_q, heads, head_dim)")
    _ops.check_rank("k", k, 3, "(total_k, heads_k, head_dim)")
    _ops.check_rank("v", v, 3, "(total_k, heads_k, head_dim_v)")
    q, k, v = _autocast(q, k, v)
    p = _check_dropout(dropout_p)
    scale = _scale(softmax_scale, q.shape[-1])
    left, right = _window(causal, window_size)
    dv = v.shape[-1]
    rng_state = _ops.new_rng_state(p, q.device)
    out, lse = torch.ops.flashattn.fwd_varlen(_pad8(q), _pad8(k), _pad8(v), cu_seqlens_q, cu_seqlens_k,
                                              int(max_seqlen_q), int(max_seqlen_k), _alibi(alibi_slopes), rng_state,
                                              scale, bool(causal), bool(top_left), left, right, float(softcap), p,
                                              bool(deterministic))
    return (out if out.shape[-1] == dv else out[..., :dv]), lse


def _result(out: Tensor, lse: Tensor, return_attn_probs: bool):
    # flash-attn returns (out, softmax_lse, S_dmask); the attention probabilities are never materialized.
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (B, Sq, H, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) -> out (B, Sq, H, Dv)."""
    out, lse = attention(q, k, v, dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                         window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                         deterministic=deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (B, S, 3, H, D) -> out (B, S, H, D). The three views are passed without copies."""
    if not isinstance(qkv, Tensor) or qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv: expected shape (batch, seqlen, 3, heads, head_dim), got {_shape(qkv)}")
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (B, Sq, H, D), kv (B, Sk, 2, Hkv, D) -> out (B, Sq, H, D)."""
    if not isinstance(kv, Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv: expected shape (batch, seqlen_k, 2, heads_k, head_dim), got {_shape(kv)}")
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q (Tq, H, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), cu_seqlens int32 (B + 1) -> out (Tq, H, Dv)."""
    if block_table is not None:
        raise NotImplementedError("block_table: paged KV caches are not supported; pass contiguous k and v")
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
                                deterministic=deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (T, 3, H, D) -> out (T, H, D)."""
    if not isinstance(qkv, Tensor) or qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv: expected shape (total, 3, heads, head_dim), got {_shape(qkv)}")
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (Tq, H, D), kv (Tk, 2, Hkv, D) -> out (Tq, H, D)."""
    if not isinstance(kv, Tensor) or kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv: expected shape (total_k, 2, heads_k, head_dim), got {_shape(kv)}")
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                  deterministic, return_attn_probs)


def _shape(x):
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
