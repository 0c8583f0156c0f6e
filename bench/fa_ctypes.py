"""ctypes binding of the flashattn C API for the benchmarks (torch tensors in, no copies).

The Python package proper is a separate piece of work; this module only lets a
benchmark call libflashattn in the same process as torch.
"""
import ctypes
import os
from pathlib import Path

FA_MAX_RANK = 4
_DTYPES = {"torch.float32": 0, "torch.float16": 1, "torch.bfloat16": 2, "torch.int32": 3}


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("device", ctypes.c_int),
        ("device_index", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * FA_MAX_RANK),
        ("strides", ctypes.c_int64 * FA_MAX_RANK),
    ]


class Options(ctypes.Structure):
    _fields_ = [
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("alignment", ctypes.c_int),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("deterministic", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
    ]


class FwdArgs(ctypes.Structure):
    _fields_ = [(name, Tensor) for name in ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")] + [
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
        ("alibi_slopes", Tensor),
        ("opts", Options),
    ]


class BwdArgs(ctypes.Structure):
    _fields_ = [
        (name, Tensor)
        for name in ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv", "cu_seqlens_q", "cu_seqlens_k")
    ] + [
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
        ("alibi_slopes", Tensor),
        ("opts", Options),
    ]


def _load():
    path = os.environ.get("FLASHATTN_LIB") or str(Path(__file__).resolve().parents[1] / "build" / "libflashattn.so")
    lib = ctypes.CDLL(path)
    lib.fa_fwd.argtypes = [ctypes.POINTER(FwdArgs), ctypes.c_void_p, ctypes.c_size_t]
    lib.fa_bwd.argtypes = [ctypes.POINTER(BwdArgs), ctypes.c_void_p, ctypes.c_size_t]
    lib.fa_fwd_workspace_size.argtypes = [ctypes.POINTER(FwdArgs), ctypes.POINTER(ctypes.c_size_t)]
    lib.fa_bwd_workspace_size.argtypes = [ctypes.POINTER(BwdArgs), ctypes.POINTER(ctypes.c_size_t)]
    lib.fa_options_init.argtypes = [ctypes.POINTER(Options)]
    lib.fa_last_error.restype = ctypes.c_char_p
    return lib


_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def tensor(t):
    """A view of a torch tensor (or an absent tensor for None)."""
    view = Tensor()
    if t is None:
        return view
    view.data = t.data_ptr()
    view.dtype = _DTYPES[str(t.dtype)]
    view.device = 1 if t.is_cuda else 0
    view.device_index = (t.device.index or 0) if t.is_cuda else 0
    view.rank = t.dim()
    for d in range(t.dim()):
        view.shape[d] = t.shape[d]
        view.strides[d] = t.stride(d)
    return view


def options(causal=False, top_left=False, window=(-1, -1), softcap=0.0, scale=0.0, dropout_p=0.0, seed=0,
            offset=0, deterministic=False, num_threads=0, stream=None):
    opts = Options()
    lib().fa_options_init(ctypes.byref(opts))
    opts.causal = int(causal)
    opts.alignment = 1 if top_left else 0
    opts.window_left, opts.window_right = window
    opts.softcap = softcap
    opts.softmax_scale = scale
    opts.dropout_p = dropout_p
    opts.dropout_seed = seed
    opts.dropout_offset = offset
    opts.deterministic = int(deterministic)
    opts.num_threads = num_threads
    opts.stream = stream
    return opts


def _check(status):
    if status != 0:
        raise RuntimeError(lib().fa_last_error().decode())


def forward_args(q, k, v, out, lse, opts, alibi=None):
    args = FwdArgs()
    args.q, args.k, args.v, args.out, args.lse = (tensor(t) for t in (q, k, v, out, lse))
    args.alibi_slopes = tensor(alibi)
    args.opts = opts
    return args


def backward_args(dout, q, k, v, out, lse, dq, dk, dv, opts, alibi=None):
    args = BwdArgs()
    (args.dout, args.q, args.k, args.v, args.out, args.lse, args.dq, args.dk, args.dv) = (
        tensor(t) for t in (dout, q, k, v, out, lse, dq, dk, dv))
    args.alibi_slopes = tensor(alibi)
    args.opts = opts
    return args


def fwd(args):
    _check(lib().fa_fwd(ctypes.byref(args), None, 0))


def bwd(args):
    _check(lib().fa_bwd(ctypes.byref(args), None, 0))


def fwd_workspace_bytes(args):
    size = ctypes.c_size_t()
    _check(lib().fa_fwd_workspace_size(ctypes.byref(args), ctypes.byref(size)))
    return size.value


def bwd_workspace_bytes(args):
    size = ctypes.c_size_t()
    _check(lib().fa_bwd_workspace_size(ctypes.byref(args), ctypes.byref(size)))
    return size.value
