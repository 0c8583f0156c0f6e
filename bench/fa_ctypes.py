"""A small ctypes binding of the flashattn C API for the benchmarks (CPU and GPU).

Loads build/libflashattn.so (or $FLASHATTN_LIB), describes torch tensors as
fa_tensor views (data_ptr, shape, strides in elements) and passes
torch.cuda.current_stream().cuda_stream as the call's stream. The structures
mirror include/flashattn/flashattn.h field for field.
"""
import ctypes
import os

import torch

FA_MAX_RANK = 4
FA_DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int32: 3}
FA_DEVICE_CPU, FA_DEVICE_CUDA = 0, 1
FA_ALIGN_BOTTOM_RIGHT, FA_ALIGN_TOP_LEFT = 0, 1


class FaTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("device", ctypes.c_int),
        ("device_index", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * FA_MAX_RANK),
        ("strides", ctypes.c_int64 * FA_MAX_RANK),
    ]


class FaOptions(ctypes.Structure):
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
        ("dropout_rng_state", ctypes.c_void_p),  # last: older builds lack it and read the fields before it
    ]


class FaFwdArgs(ctypes.Structure):
    _fields_ = [
        ("q", FaTensor), ("k", FaTensor), ("v", FaTensor), ("out", FaTensor), ("lse", FaTensor),
        ("cu_seqlens_q", FaTensor), ("cu_seqlens_k", FaTensor),
        ("max_seqlen_q", ctypes.c_int32), ("max_seqlen_k", ctypes.c_int32),
        ("alibi_slopes", FaTensor), ("opts", FaOptions),
    ]


class FaBwdArgs(ctypes.Structure):
    _fields_ = [
        ("dout", FaTensor), ("q", FaTensor), ("k", FaTensor), ("v", FaTensor), ("out", FaTensor),
        ("lse", FaTensor), ("dq", FaTensor), ("dk", FaTensor), ("dv", FaTensor),
        ("cu_seqlens_q", FaTensor), ("cu_seqlens_k", FaTensor),
        ("max_seqlen_q", ctypes.c_int32), ("max_seqlen_k", ctypes.c_int32),
        ("alibi_slopes", FaTensor), ("opts", FaOptions),
    ]


class FaKvcacheArgs(ctypes.Structure):
    _fields_ = [
        ("q", FaTensor), ("k_cache", FaTensor), ("v_cache", FaTensor), ("k_new", FaTensor), ("v_new", FaTensor),
        ("cache_seqlens", FaTensor), ("cache_batch_idx", FaTensor), ("cache_leftpad", FaTensor),
        ("block_table", FaTensor), ("rotary_cos", FaTensor), ("rotary_sin", FaTensor),
        ("rotary_interleaved", ctypes.c_int32), ("alibi_slopes", FaTensor), ("out", FaTensor), ("lse", FaTensor),
        ("num_splits", ctypes.c_int32), ("opts", FaOptions),
    ]


def _default_library():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("FLASHATTN_LIB", os.path.join(here, "..", "build", "libflashattn.so"))


class FlashAttn:
    def __init__(self, path=None):
        self.lib = ctypes.CDLL(path or _default_library())
        lib = self.lib
        lib.fa_fwd_args_init.argtypes = [ctypes.POINTER(FaFwdArgs)]
        lib.fa_bwd_args_init.argtypes = [ctypes.POINTER(FaBwdArgs)]
        for name, args_type in (("fa_fwd", FaFwdArgs), ("fa_bwd", FaBwdArgs)):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.POINTER(args_type), ctypes.c_void_p, ctypes.c_size_t]
            fn.restype = ctypes.c_int
            size_fn = getattr(lib, name + "_workspace_size")
            size_fn.argtypes = [ctypes.POINTER(args_type), ctypes.POINTER(ctypes.c_size_t)]
            size_fn.restype = ctypes.c_int
        lib.fa_kvcache_args_init.argtypes = [ctypes.POINTER(FaKvcacheArgs)]
        lib.fa_fwd_kvcache.argtypes = [ctypes.POINTER(FaKvcacheArgs), ctypes.c_void_p, ctypes.c_size_t]
        lib.fa_fwd_kvcache.restype = ctypes.c_int
        lib.fa_fwd_kvcache_workspace_size.argtypes = [ctypes.POINTER(FaKvcacheArgs), ctypes.POINTER(ctypes.c_size_t)]
        lib.fa_fwd_kvcache_workspace_size.restype = ctypes.c_int
        lib.fa_last_error.restype = ctypes.c_char_p
        lib.fa_has_cuda.restype = ctypes.c_int32

    @staticmethod
    def tensor(t):
        """fa_tensor view of a torch tensor (None: absent)."""
        view = FaTensor()
        if t is None:
            return view
        view.data = t.data_ptr()
        view.dtype = FA_DTYPE[t.dtype]
        view.device = FA_DEVICE_CUDA if t.is_cuda else FA_DEVICE_CPU
        view.device_index = (t.device.index or 0) if t.is_cuda else 0
        view.rank = t.dim()
        for d in range(t.dim()):
            view.shape[d] = t.shape[d]
            view.strides[d] = t.stride(d)
        return view

    def _check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed ({status}): {self.lib.fa_last_error().decode()}")

    @staticmethod
    def _options(opts, on_cuda, causal, deterministic, softmax_scale, dropout_p, seed, num_threads, softcap,
                 rng_state):
        opts.causal = 1 if causal else 0
        opts.num_threads = num_threads
        opts.deterministic = 1 if deterministic else 0
        opts.softmax_scale = softmax_scale
        opts.softcap = softcap
        opts.dropout_p = dropout_p
        opts.dropout_seed = seed
        opts.dropout_rng_state = None if rng_state is None else rng_state.data_ptr()
        opts.stream = torch.cuda.current_stream().cuda_stream if on_cuda else None

    def fwd_args(self, q, k, v, out, lse=None, causal=False, softmax_scale=0.0, dropout_p=0.0, seed=0,
                 num_threads=0, softcap=0.0, rng_state=None):
        """rng_state: an int64 tensor {seed, offset} read when the call runs (instead of seed)."""
        args = FaFwdArgs()
        self.lib.fa_fwd_args_init(ctypes.byref(args))
        args.q, args.k, args.v = self.tensor(q), self.tensor(k), self.tensor(v)
        args.out, args.lse = self.tensor(out), self.tensor(lse)
        self._options(args.opts, q.is_cuda, causal, False, softmax_scale, dropout_p, seed, num_threads, softcap,
                      rng_state)
        return args

    def bwd_args(self, dout, q, k, v, out, lse, dq, dk, dv, causal=False, deterministic=False, softmax_scale=0.0,
                 dropout_p=0.0, seed=0, num_threads=0, softcap=0.0, rng_state=None):
        args = FaBwdArgs()
        self.lib.fa_bwd_args_init(ctypes.byref(args))
        args.dout, args.q, args.k, args.v = self.tensor(dout), self.tensor(q), self.tensor(k), self.tensor(v)
        args.out, args.lse = self.tensor(out), self.tensor(lse)
        args.dq, args.dk, args.dv = self.tensor(dq), self.tensor(dk), self.tensor(dv)
        self._options(args.opts, q.is_cuda, causal, deterministic, softmax_scale, dropout_p, seed, num_threads,
                      softcap, rng_state)
        return args

    def fwd_workspace_size(self, args):
        size = ctypes.c_size_t(0)
        self._check(self.lib.fa_fwd_workspace_size(ctypes.byref(args), ctypes.byref(size)), "fa_fwd_workspace_size")
        return size.value

    def bwd_workspace_size(self, args):
        size = ctypes.c_size_t(0)
        self._check(self.lib.fa_bwd_workspace_size(ctypes.byref(args), ctypes.byref(size)), "fa_bwd_workspace_size")
        return size.value

    def fwd(self, args, workspace=None):
        ptr = workspace.data_ptr() if workspace is not None and workspace.numel() > 0 else None
        nbytes = workspace.numel() if workspace is not None else 0
        self._check(self.lib.fa_fwd(ctypes.byref(args), ptr, nbytes), "fa_fwd")

    def bwd(self, args, workspace=None):
        ptr = workspace.data_ptr() if workspace is not None and workspace.numel() > 0 else None
        nbytes = workspace.numel() if workspace is not None else 0
        self._check(self.lib.fa_bwd(ctypes.byref(args), ptr, nbytes), "fa_bwd")

    def kvcache_args(self, q, k_cache, v_cache, out, cache_seqlens=None, block_table=None, causal=False,
                     num_splits=0, num_threads=0):
        """Decode or chunked prefill against a cache (no append, no rotary)."""
        args = FaKvcacheArgs()
        self.lib.fa_kvcache_args_init(ctypes.byref(args))
        args.q, args.k_cache, args.v_cache, args.out = (self.tensor(t) for t in (q, k_cache, v_cache, out))
        args.cache_seqlens, args.block_table = self.tensor(cache_seqlens), self.tensor(block_table)
        args.num_splits = num_splits
        self._options(args.opts, q.is_cuda, causal, False, 0.0, 0.0, 0, num_threads)
        return args

    def fwd_kvcache(self, args):
        self._check(self.lib.fa_fwd_kvcache(ctypes.byref(args), None, 0), "fa_fwd_kvcache")
