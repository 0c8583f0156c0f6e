"""flashattn: exact attention with the FlashAttention-2 algorithm (CPU and CUDA backends).

Drop-in for flash-attn 2.x (`import flashattn as flash_attn`, `flash_attn_with_kvcache` included) and for torch's
`scaled_dot_product_attention`; torch.library custom ops with autograd and fake kernels
(`torch.ops.flashattn.fwd`, `.bwd`, `.fwd_varlen`, `.bwd_varlen`); `memory_plan` to size a batch.
The compiled core, `flashattn._C`, takes DLPack tensors and does not link libtorch.
"""
from . import _C

__version__ = _C.version()


def has_cuda() -> bool:
    """True when this build has the CUDA backend."""
    return _C.has_cuda()


def set_num_threads(n: int) -> None:
    """Thread count of the CPU backend (0 = hardware count)."""
    _C.set_default_num_threads(int(n))


try:
    import torch as _torch  # noqa: F401
except ImportError:  # the DLPack core (flashattn._C) works without torch
    pass
else:
    from . import _ops  # noqa: F401  (registers torch.ops.flashattn.*)
    from .interface import (  # noqa: F401
        flash_attn_func,
        flash_attn_kvpacked_func,
        flash_attn_qkvpacked_func,
        flash_attn_varlen_func,
        flash_attn_varlen_kvpacked_func,
        flash_attn_varlen_qkvpacked_func,
    )
    from .kvcache import flash_attn_with_kvcache  # noqa: F401
    from .memory import MemoryPlan, memory_plan  # noqa: F401
    from .sdpa import scaled_dot_product_attention  # noqa: F401
    from .distributed import ring_attention  # noqa: F401
