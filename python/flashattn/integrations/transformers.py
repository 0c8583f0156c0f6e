"""Hugging Face transformers backend: attn_implementation="flashattn".

    import flashattn.integrations.transformers as fa_hf
    fa_hf.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="flashattn")

The attention function follows transformers' flash-attention path: with a 2-D padding mask it unpads
to a varlen call (left or right padding), with packed rows (position_ids that restart, or the
cu_seq_lens_* kwargs of DataCollatorWithFlattening) it runs one varlen call over the packed
sequences, otherwise one dense call on (B, S, H, D) views of the (B, H, S, D) inputs, without copies.
Decode steps (at most 16 new queries against a longer cache, no autograd) run flash_attn_with_kvcache on
the cache as it is, left padding becoming cache_leftpad.
Causal masks are bottom-right aligned, which is what a KV cache needs (queries are the last tokens).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..interface import attention, attention_varlen

NAME = "flashattn"


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _packed_cu_seqlens(position_ids: torch.Tensor, batch: int, seqlen: int) -> Optional[torch.Tensor]:
    """cu_seqlens of the sequences packed in the rows, or None when every row is one sequence."""
    pos = position_ids.expand(batch, seqlen)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1  # a new sequence wherever the positions do not continue
    starts = starts.flatten()
    if int(starts.sum()) == batch:
        return None
    idx = starts.nonzero().flatten().to(torch.int32)
    return torch.cat([idx, torch.tensor([batch * seqlen], dtype=torch.int32, device=idx.device)])


# Decode steps (a few new queries against a longer cache) go through flash_attn_with_kvcache: split-KV
# on the GPU, the query heads of a KV head packed together. Training and autograd stay on the dense path.
_DECODE_MAX_QUERIES = 16


def _decode_with_kvcache(q, k, v, attention_mask, opts):
    """q (B, Sq, H, D), k/v (B, Sk, Hkv, D) views; None when the step is not a decode step it can serve.

    Left padding (a 2-D mask of zeros then ones, the queries unpadded) becomes cache_leftpad.
    """
    from ..kvcache import flash_attn_with_kvcache

    b, sq, _, d = q.shape
    sk = k.shape[1]
    if sq > _DECODE_MAX_QUERIES or sq >= sk or opts["dropout_p"] > 0.0 or d % 8 or v.shape[-1] % 8:
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return None
    leftpad = None
    if attention_mask is not None:
        kmask = attention_mask[:, -sk:].bool()
        ones = kmask.sum(1, dtype=torch.int32)
        pads = sk - ones
        first_one = kmask.to(torch.int8).argmax(1).to(torch.int32)
        if not bool(kmask[:, -sq:].all()) or not bool(((first_one == pads) & (ones > 0)).all()):
            return None  # not plain left padding: the varlen path
        leftpad = pads if bool((pads > 0).any()) else None
    seqlens = torch.full((b,), sk, dtype=torch.int32, device=q.device)
    return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, cache_leftpad=leftpad,
                                   softmax_scale=opts["softmax_scale"], causal=opts["causal"],
                                   window_size=opts["window_size"], softcap=opts["softcap"])


def flashattn_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                value: torch.Tensor, attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                                scaling: Optional[float] = None, sliding_window: Optional[int] = None,
                                softcap: Optional[float] = None, is_causal: Optional[bool] = None, **kwargs):
    """transformers attention function: query (B, H, Sq, D), key/value (B, Hkv, Sk, D) -> ((B, Sq, H, Dv), None)."""
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("s_aux: attention sinks are not supported by flashattn; use attn_implementation='eager'")
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("output_attentions: flashattn never materializes attention weights; "
                                  "use attn_implementation='eager'")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (-1, -1) if sliding_window is None else (int(sliding_window) - 1, int(sliding_window) - 1)
    opts = dict(dropout_p=float(dropout), softmax_scale=scaling, causal=bool(causal), window_size=window,
                softcap=float(softcap or 0.0))
    b, h, sq, _ = query.shape
    sk = key.shape[2]
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, S, H, D) views

    if kwargs.get("cu_seq_lens_q") is None and (attention_mask is None or attention_mask.dim() == 2):
        out = _decode_with_kvcache(q, k, v, attention_mask, opts)
        if out is not None:
            return out, None

    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise NotImplementedError(
                "attention_mask: flashattn takes the 2-D padding mask (transformers >= 4.53 passes it through "
                "AttentionMaskInterface after flashattn.integrations.transformers.register()); got shape "
                f"{tuple(attention_mask.shape)}")
        kmask = attention_mask[:, -sk:].bool()
        qmask = kmask[:, -sq:]
        len_k, len_q = kmask.sum(1, dtype=torch.int32), qmask.sum(1, dtype=torch.int32)
        idx_k, idx_q = kmask.flatten().nonzero().flatten(), qmask.flatten().nonzero().flatten()
        out_unpad, _ = attention_varlen(q.reshape(b * sq, h, -1)[idx_q], k.reshape(b * sk, k.shape[2], -1)[idx_k],
                                        v.reshape(b * sk, v.shape[2], -1)[idx_k], _cu_seqlens(len_q),
                                        _cu_seqlens(len_k), int(len_q.max()), int(len_k.max()), **opts)
        out = out_unpad.new_zeros(b * sq, h, out_unpad.shape[-1]).index_copy(0, idx_q, out_unpad)
        return out.view(b, sq, h, -1), None

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    position_ids = kwargs.get("position_ids")
    if cu_q is None and position_ids is not None and sq == sk and sq > 1:
        cu_q = cu_k = _packed_cu_seqlens(position_ids, b, sq)
        if cu_q is not None:
            max_q = max_k = int((cu_q[1:] - cu_q[:-1]).max())
    if cu_q is not None:
        cu_q, cu_k = cu_q.to(torch.int32), (cu_q if cu_k is None else cu_k).to(torch.int32)
        max_q = int(max_q) if max_q is not None else int((cu_q[1:] - cu_q[:-1]).max())
        max_k = int(max_k) if max_k is not None else int((cu_k[1:] - cu_k[:-1]).max())
        out, _ = attention_varlen(q.reshape(b * sq, h, -1), k.reshape(b * sk, k.shape[2], -1),
                                  v.reshape(b * sk, v.shape[2], -1), cu_q, cu_k, max_q, max_k, **opts)
        return out.view(b, sq, h, -1), None

    out, _ = attention(q, k, v, **opts)
    return out, None


def _serve_flash_loader(name: str) -> None:
    """transformers >= 5 treats every implementation name containing "flash" as a flash-attention flavor and
    preloads its flash_attn_func / flash_attn_varlen_func at model init (from flash-attn or the kernels hub).
    For `name` we hand it our flash-attn compatible functions instead, so the check passes without a download."""
    try:
        from transformers import modeling_flash_attention_utils as mfa
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:
        return
    if not hasattr(mfa, "_lazy_imports") or not is_flash_attention_requested(requested_attention_implementation=name):
        return
    original = getattr(mfa._lazy_imports, "_flashattn_original", mfa._lazy_imports)
    names = set(getattr(mfa._lazy_imports, "_flashattn_names", ())) | {name}

    def _lazy_imports(implementation, *args, **kwargs):
        if implementation in names:
            from ..interface import flash_attn_func, flash_attn_varlen_func
            return flash_attn_func, flash_attn_varlen_func, None, mfa._pad_input, mfa._unpad_input
        return original(implementation, *args, **kwargs)

    _lazy_imports._flashattn_original = original
    _lazy_imports._flashattn_names = names
    mfa._lazy_imports = _lazy_imports


def register(name: str = NAME) -> None:
    """Registers `name` with transformers' AttentionInterface (and AttentionMaskInterface when present)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, flashattn_attention_forward)
    _serve_flash_loader(name)
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:  # transformers < 4.53: no mask interface
        return
    AttentionMaskInterface.register(name, flash_attention_mask)
