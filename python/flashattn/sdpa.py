"""torch.nn.functional.scaled_dot_product_attention, served by flashattn.

Same signature and (B, H, S, D) layout as torch's; causal is torch's top-left alignment. The
(B, H, S, D) tensors are handed to the kernels as (B, S, H, D) views with their strides: no copy.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .interface import attention

_MASK_HELP = (
    "attn_mask: flashattn does not take an explicit mask tensor. For a causal mask pass is_causal=True "
    "(top-left aligned, as torch); for padding use flashattn.flash_attn_varlen_func with cu_seqlens (or the "
    "transformers integration, which unpads); for sliding windows, softcap or ALiBi use flashattn.flash_attn_func "
    "(window_size=, softcap=, alibi_slopes=); for an arbitrary mask use "
    "torch.nn.functional.scaled_dot_product_attention")


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """query (B, H, L, E), key (B, Hkv, S, E), value (B, Hkv, S, Ev) -> (B, H, L, Ev); 3-D inputs drop B."""
    if attn_mask is not None:
        raise NotImplementedError(_MASK_HELP)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() not in (3, 4):
            raise ValueError(f"{name}: expected rank 4 (batch, heads, seqlen, head_dim) or rank 3, "
                             f"got shape {tuple(t.shape)}")
    unbatched = query.dim() == 3
    if unbatched:
        query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"key: expected {query.shape[1]} heads like query (pass enable_gqa=True for grouped-query "
                         f"attention), got {key.shape[1]}")
    out, _ = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout_p=dropout_p,
                       softmax_scale=scale, causal=is_causal, top_left=True)
    out = out.transpose(1, 2)  # (B, H, L, Ev) view of (B, L, H, Ev) storage, like torch's flash backend
    return out[0] if unbatched else out
