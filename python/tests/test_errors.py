"""The C API's messages surface as TypeError / ValueError / NotImplementedError, naming the argument."""
import numpy as np
import pytest
import torch

import flashattn
from flashattn import _C


def _qkv(d=16, dtype=torch.float32):
    return (torch.randn(1, 8, 2, d, dtype=dtype) for _ in range(3))


def test_wrong_dtype_is_type_error():
    q, k, v = _qkv(dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^q: expected dtype"):
        flashattn.flash_attn_func(q, k, v)
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"^k: expected dtype fp32, got fp16"):
        flashattn.flash_attn_func(q, k.half(), v)
    with pytest.raises(TypeError, match=r"^alibi_slopes: expected dtype"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.ones(2, dtype=torch.float64))


def test_wrong_shape_is_value_error():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^k: expected a number of heads that divides the 3 heads of q, got 2"):
        flashattn.flash_attn_func(torch.randn(1, 8, 3, 16), k, v)
    with pytest.raises(ValueError, match=r"^v: expected shape"):
        flashattn.flash_attn_func(q, k, v[:, :5])
    with pytest.raises(ValueError, match=r"^q: expected a head dimension that is a multiple of 8 in \[8, 256\], got 264"):
        flashattn.flash_attn_func(*(torch.randn(1, 4, 1, 264) for _ in range(3)))
    with pytest.raises(ValueError, match=r"^q: expected rank 4"):
        flashattn.flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match=r"^alibi_slopes: expected shape"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.ones(3))


def test_bad_values_are_value_errors():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^dropout_p: expected a probability in \[0, 1\)"):
        flashattn.flash_attn_func(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match=r"^softcap: expected a finite value >= 0"):
        flashattn.flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match=r"^window_left: expected -1"):
        flashattn.flash_attn_func(q, k, v, window_size=(-5, 0))
    with pytest.raises(ValueError, match=r"^window_size: expected a pair"):
        flashattn.flash_attn_func(q, k, v, window_size=3)


def test_non_contiguous_last_dim():
    q = torch.randn(1, 8, 2, 32)[..., ::2]  # stride 2 in the head dim
    k, v = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match=r"^q: expected a contiguous last dimension \(stride 1\), got stride 2"):
        flashattn.flash_attn_func(q, k, v)


def test_wrong_device():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^k: expected a cpu or cuda tensor, got device meta"):
        flashattn.flash_attn_func(q, k.to("meta"), v)
    if torch.cuda.is_available():
        with pytest.raises((ValueError, NotImplementedError), match=r"^k: expected the device of q"):
            flashattn.flash_attn_func(q, k.cuda(), v)


@pytest.mark.skipif(flashattn.has_cuda() or not torch.cuda.is_available(),
                    reason="needs a GPU with a CPU-only flashattn build (FA_ERROR_UNSUPPORTED path)")
def test_cuda_tensor_on_cpu_build_is_not_implemented():
    q, k, v = (t.cuda() for t in _qkv())
    with pytest.raises(NotImplementedError, match=r"^q: expected a CPU tensor"):
        flashattn.flash_attn_func(q, k, v)


def test_varlen_errors():
    q, k, v = (torch.randn(10, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(TypeError, match=r"^cu_seqlens_q: expected dtype"):
        flashattn.flash_attn_varlen_func(q, k, v, cu.long(), cu, 6, 6)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: expected sequence lengths <= max_seqlen_q = 5"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 5, 6)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected non-decreasing offsets"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, torch.tensor([0, 7, 4], dtype=torch.int32), 6, 7)
    with pytest.raises(NotImplementedError, match=r"^block_table"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, block_table=torch.zeros(2, 1, dtype=torch.int32))


def _c_fwd(q, k, v, out, lse=None, **kw):
    args = dict(softmax_scale=0.0, causal=False, top_left=False, window_left=-1, window_right=-1, softcap=0.0,
                dropout_p=0.0, seed=0, offset=0, deterministic=False, num_threads=0, stream=0, workspace=None,
                query=False)
    args.update(kw)
    return _C.fwd(q, k, v, out, lse, None, None, 0, 0, None, **args)


def test_c_rng_state_tensor_matches_seed_values():
    q, k, v = (torch.randn(1, 9, 2, 16) for _ in range(3))
    no_dropout, by_value, from_tensor = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
    _c_fwd(q, k, v, no_dropout)
    _c_fwd(q, k, v, by_value, dropout_p=0.3, seed=2**40 + 7, offset=3)
    # The tensor wins over the seed and offset values.
    _c_fwd(q, k, v, from_tensor, dropout_p=0.3, rng_state=torch.tensor([2**40 + 7, 3]))
    assert torch.equal(by_value, from_tensor) and not torch.equal(by_value, no_dropout)
    with pytest.raises(TypeError, match=r"^rng_state: expected dtype int64, got int32"):
        _c_fwd(q, k, v, from_tensor, dropout_p=0.3, rng_state=torch.tensor([1, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^rng_state: expected 2 contiguous elements \{seed, offset\}, got 3"):
        _c_fwd(q, k, v, from_tensor, dropout_p=0.3, rng_state=torch.tensor([1, 3, 4]))


def test_dlpack_from_numpy():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 9, 2, 16), dtype=np.float32) for _ in range(3))
    out = np.zeros_like(q)
    lse = np.zeros((1, 2, 9), dtype=np.float32)
    _c_fwd(q, k, v, out, lse, causal=True)
    ref, ref_lse, _ = flashattn.flash_attn_func(*(torch.from_numpy(x) for x in (q, k, v)), causal=True,
                                                return_attn_probs=True)
    assert np.abs(out).max() > 0
    np.testing.assert_array_equal(out, ref.numpy())
    np.testing.assert_array_equal(lse, ref_lse.numpy())
    with pytest.raises(TypeError, match=r"^q: expected dtype fp32, fp16, bf16 .*got float64"):
        _c_fwd(q.astype(np.float64), k, v, out)
    need = _c_fwd(q, k, v, out, lse, query=True)
    assert need > 0  # the CPU backend's per-thread tiles
    with pytest.raises(ValueError, match=r"^workspace_bytes: expected at least"):
        _c_fwd(q, k, v, out, lse, workspace=np.zeros(need - 1, dtype=np.uint8))
