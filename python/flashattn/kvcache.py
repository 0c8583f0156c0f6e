"""flash-attn's `flash_attn_with_kvcache`: attention of a few query tokens against a KV cache.

Same argument names, defaults, shapes and semantics as flash-attn 2.x, with two extensions: a paged
cache (`block_table`) may use any page size >= 1 (flash-attn 2 needs multiples of 256), and fp32
caches run on the CPU. The cache is updated in place when `k`, `v` are given; the function is not
differentiable (neither is flash-attn's). `torch.ops.flashattn.fwd_kvcache` is the custom op under it
(it declares the cache mutation, so torch.compile keeps the in-place append).
"""
from __future__ import annotations

from typing import List, Optional, Union

import torch
from torch import Tensor

from . import _C, _ops


@torch.library.custom_op("flashattn::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
                cache_seqlens: Optional[Tensor], cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor],
                block_table: Optional[Tensor], rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                rotary_interleaved: bool, alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool,
                window_left: int, window_right: int, softcap: float, num_splits: int) -> List[Tensor]:
    b, sq, h, _ = q.shape
    out = q.new_empty((b, sq, h, v_cache.shape[-1]))
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    dl = _ops._dl
    args = dict(q=dl(q), k_cache=dl(k_cache), v_cache=dl(v_cache), k=dl(k), v=dl(v), cache_seqlens=cache_seqlens,
                cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, block_table=block_table,
                rotary_cos=dl(rotary_cos), rotary_sin=dl(rotary_sin), rotary_interleaved=rotary_interleaved,
                alibi_slopes=dl(alibi_slopes), out=out, lse=lse, softmax_scale=softmax_scale, causal=causal,
                window_left=window_left, window_right=window_right, softcap=softcap, num_splits=num_splits,
                num_threads=0, stream=_ops._stream(q))
    _C.fwd_kvcache(**args, workspace=None, allocate=_ops._allocator(q.device), query=False)
    return [out, lse]


@fwd_kvcache.register_fake
def _(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin,
      rotary_interleaved, alibi_slopes, softmax_scale, causal, window_left, window_right, softcap, num_splits):
    b, sq, h, _ = q.shape
    return [q.new_empty((b, sq, h, v_cache.shape[-1])), q.new_empty((b, h, sq), dtype=torch.float32)]


def _int32_vector(name: str, x, batch: int, device) -> Optional[Tensor]:
    if x is None:
        return None
    if isinstance(x, int):
        return torch.full((batch,), x, dtype=torch.int32, device=device)
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected an int32 tensor of shape ({batch},) or an int, got {type(x).__name__}")
    return x


def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor] = None,
                            v: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                            rotary_sin: Optional[Tensor] = None,
                            cache_seqlens: Optional[Union[int, Tensor]] = None,
                            cache_batch_idx: Optional[Tensor] = None, cache_leftpad: Optional[Tensor] = None,
                            block_table: Optional[Tensor] = None, softmax_scale: Optional[float] = None,
                            causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[Tensor] = None,
                            num_splits: int = 0, return_softmax_lse: bool = False):
    """q (B, Sq, H, D) against k_cache, v_cache (B_cache, S_cache, Hkv, D) or, with block_table
    (B, max_blocks) int32, a paged cache (num_blocks, page_size, Hkv, D).

    k, v (B, S_new, Hkv, D): appended in place at cache_seqlens (int32 (B,) or an int) before attending.
    rotary_cos / rotary_sin (S_ro, rotary_dim / 2): rotate the new keys at positions cache_seqlens + t and
    q at cache_seqlens (+ i when causal or local); interleaved pairs (2i, 2i+1) or NeoX halves.
    cache_batch_idx (B,): cache row of each batch row; cache_leftpad (B,): first cache position of a row.
    The causal mask is aligned to the bottom-right corner of (Sq, cache_seqlens + S_new - leftpad).
    num_splits: split-KV partitions (0: heuristic). Returns out (B, Sq, H, D) and, with
    return_softmax_lse, lse (B, H, Sq) fp32.
    """
    from .interface import _scale, _window  # the flash-attn conventions shared with flash_attn_func

    _ops.check_devices(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, rotary_cos=rotary_cos,
                       rotary_sin=rotary_sin, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
                       block_table=block_table, alibi_slopes=alibi_slopes)
    _ops.check_rank("q", q, 4, "(batch, seqlen_q, heads, head_dim)")
    if (k is None) != (v is None):
        raise ValueError(f"{'k' if k is None else 'v'}: expected k and v together, got None")
    window_left, window_right = _window(causal, window_size)
    batch = q.shape[0]
    seqlens = _int32_vector("cache_seqlens", cache_seqlens, batch, q.device)
    out, lse = torch.ops.flashattn.fwd_kvcache(
        q, k_cache, v_cache, k, v, seqlens, cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin,
        bool(rotary_interleaved), alibi_slopes, _scale(softmax_scale, q.shape[-1]), bool(causal), window_left,
        window_right, float(softcap), int(num_splits))
    return (out, lse) if return_softmax_lse else out
