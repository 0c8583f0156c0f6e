"""Random combinations of every option of flash_attn_func against the fp64 reference (2x rule), forward and
backward: shapes, dtypes, GQA, causal, windows, softcap, ALiBi (with slopes up to 4, whose far keys get
probabilities below 2^-110) and scales. The draws come from a fixed seed per case, so a failure reproduces
alone; the fixed option lists elsewhere test each option by itself, these test how they meet.

A fuzz run of this kind (session 21) found the AMX forward's packing of P writing garbage into a key's
word when its neighbour's smallest bf16 piece was subnormal."""
import functools
import random

import pytest
import torch

import flashattn
from conftest import DTYPES, attention_ref, check_fwd_bwd, mask_allowed

CASES = 48


def draw(index):
    rng = random.Random(1000 + index)
    hkv = rng.choice([1, 2, 3])
    cfg = dict(
        dtype=DTYPES[index % len(DTYPES)],
        b=rng.randint(1, 2), hkv=hkv, h=hkv * rng.choice([1, 2, 4]),
        d=8 * rng.randint(1, 24), sq=rng.choice([1, 3, 17, rng.randint(1, 200)]),
        sk=rng.choice([2, 5, 33, rng.randint(1, 300), rng.randint(100, 300)]),
        causal=rng.random() < 0.4,
        window=(-1, -1) if rng.random() < 0.5 else (rng.choice([-1, 0, 16, rng.randint(0, 150)]),
                                                    rng.choice([-1, 0, 8, rng.randint(0, 150)])),
        softcap=rng.choice([0.0, 0.0, 5.0, 30.0]),
        alibi=rng.choice([None, None, "h", "bh"]),
        alibi_max=rng.choice([0.5, 4.0, 4.0]),
        scale=rng.choice([None, None, 0.3]),
    )
    cfg["dv"] = cfg["d"] if rng.random() < 0.6 else 8 * rng.randint(1, 24)
    if cfg["alibi"] is not None and cfg["sq"] > cfg["sk"]:
        # Rows above the first key (bottom-right alignment) then see only keys hundreds of slopes away: their
        # scores and LSE reach hundreds, and FA2's P = exp(s - LSE) carries the fp32 rounding of that LSE,
        # which a naive softmax normalizes away (the fp32 gradients land at 3-7x the naive error).
        cfg["sq"], cfg["sk"] = cfg["sk"], cfg["sq"]
    if mask_allowed(cfg["sq"], cfg["sk"], cfg["causal"], cfg["window"])[0].sum(-1).max() < 2:
        # No row sees two keys: dQ and dK are exactly 0 and the 2x rule has nothing to measure.
        cfg["window"] = (-1, -1)
    return cfg


@pytest.mark.parametrize("index", range(CASES))
def test_random_options(index, device):
    c = draw(index)
    if device == "cuda" and c["dtype"] == torch.float32:
        c["dtype"] = torch.bfloat16  # the CUDA backend serves fp16 and bf16
    slopes = None
    if c["alibi"] is not None:
        shape = (c["h"],) if c["alibi"] == "h" else (c["b"], c["h"])
        slopes = (torch.rand(shape) * c["alibi_max"]).to(device)
    q = torch.randn(c["b"], c["sq"], c["h"], c["d"])
    k = torch.randn(c["b"], c["sk"], c["hkv"], c["d"])
    v = torch.randn(c["b"], c["sk"], c["hkv"], c["dv"])
    ours = functools.partial(flashattn.flash_attn_func, softmax_scale=c["scale"], causal=c["causal"],
                             window_size=c["window"], softcap=c["softcap"], alibi_slopes=slopes)
    ref = functools.partial(attention_ref, causal=c["causal"], window=c["window"], softcap=c["softcap"],
                            alibi=slopes, scale=c["scale"])
    check_fwd_bwd(ours, ref, (q, k, v), c["dtype"], device)
