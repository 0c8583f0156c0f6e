"""flashattn.flash_attn_with_kvcache against a torch reference on the gathered cache (2x rule), the
in-place append checked exactly, on the CPU and (where present) the GPU."""
import math
import random

import pytest
import torch

import flashattn
from conftest import assert_2x


def apply_rotary(x, cos, sin, positions, interleaved):
    """x (B, S, H, D) rotated at positions (B, S); products exact in fp32 for half dtypes, one rounding."""
    rd = cos.shape[1] * 2
    wide = torch.float64 if x.dtype == torch.float32 else torch.float32
    c = cos[positions].to(wide)[:, :, None, :]  # (B, S, 1, rd/2)
    s = sin[positions].to(wide)[:, :, None, :]
    xr = x[..., :rd].to(wide)
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
    else:
        x0, x1 = xr[..., : rd // 2], xr[..., rd // 2:]
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    y = torch.stack([y0, y1], dim=-1).flatten(-2) if interleaved else torch.cat([y0, y1], dim=-1)
    return torch.cat([y.to(torch.float32).to(x.dtype), x[..., rd:]], dim=-1)


def reference(q, k_rows, v_rows, causal, window, softcap, alibi, dtype):
    """One batch row: q (Sq, H, D) against its N keys (N, Hkv, D); bottom-right mask."""
    sq, h, d = q.shape
    n, hkv = k_rows.shape[0], k_rows.shape[1]
    qf, kf, vf = q.to(dtype), k_rows.to(dtype).repeat_interleave(h // hkv, 1), v_rows.to(dtype).repeat_interleave(h // hkv, 1)
    s = torch.einsum("ihd,jhd->hij", qf, kf) / math.sqrt(d)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq)[:, None] + n - sq
    j = torch.arange(n)[None, :]
    allowed = torch.ones(sq, n, dtype=torch.bool)
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    if alibi is not None:
        s = s - alibi.to(dtype)[:, None, None] * (i - j).abs().to(dtype)
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("hij,jhd->ihd", p, vf)


CASES = [
    # name, dict of options
    ("contig_decode_append", dict(sq=1, seqlens=[5, 30], s_new=1, page=0)),
    ("contig_chunk7_causal_rotary_interleaved", dict(sq=7, seqlens=[3, 20], s_new=7, causal=True, rotary="inter")),
    ("contig_chunk7_rotary_neox_noncausal", dict(sq=7, seqlens=[0, 11], s_new=7, rotary="neox")),
    ("paged1_decode_append", dict(sq=1, seqlens=[0, 9], s_new=1, page=1)),
    ("paged16_gqa8_causal_rotary", dict(sq=1, seqlens=[40, 17], s_new=1, page=16, h=16, hkv=2, causal=True,
                                        rotary="neox")),
    ("paged256_noappend_window_softcap_alibi", dict(sq=7, seqlens=[300, 8], s_new=0, page=256, causal=True,
                                                     window=(10, 0), softcap=5.0, alibi=True)),
    ("contig_batchidx_leftpad", dict(sq=7, seqlens=[12, 25], s_new=7, batch_idx=True, leftpad=[3, 25],
                                     causal=True, rotary="inter")),
    ("contig_int_seqlens_splits3", dict(sq=1, seqlens=40, s_new=1, num_splits=3)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name,cfg", CASES, ids=[c[0] for c in CASES])
def test_flash_attn_with_kvcache(name, cfg, dtype, device):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("the CUDA backend serves fp16 and bf16")
    torch.manual_seed(hash(name) % 2**31)
    b, h, hkv, d = 2, cfg.get("h", 4), cfg.get("hkv", 2), 64
    sq, s_new, page = cfg["sq"], cfg["s_new"], cfg.get("page", 0)
    seqlens = cfg["seqlens"]
    lens = [seqlens] * b if isinstance(seqlens, int) else seqlens
    capacity = max(lens) + s_new + 5
    if page:
        max_blocks = -(-capacity // page)
        capacity = max_blocks * page
        num_blocks = b * max_blocks + 1
        block_table = torch.randperm(num_blocks, dtype=torch.int32)[: b * max_blocks].view(b, max_blocks)
        k_cache = torch.randn(num_blocks, page, hkv, d)
        v_cache = torch.randn(num_blocks, page, hkv, d)
        batch_idx = None
    else:
        block_table = None
        rows = b + 2 if cfg.get("batch_idx") else b
        k_cache = torch.randn(rows, capacity, hkv, d)
        v_cache = torch.randn(rows, capacity, hkv, d)
        batch_idx = torch.randperm(rows, dtype=torch.int32)[:b] if cfg.get("batch_idx") else None
    q = torch.randn(b, sq, h, d)
    k = torch.randn(b, s_new, hkv, d) if s_new else None
    v = torch.randn(b, s_new, hkv, d) if s_new else None
    leftpad = torch.tensor(cfg["leftpad"], dtype=torch.int32) if "leftpad" in cfg else None
    rotary = cfg.get("rotary")
    cos = sin = None
    if rotary:
        angles = torch.arange(capacity, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
        cos, sin = angles.cos(), angles.sin()
    alibi = torch.rand(h) * 0.3 if cfg.get("alibi") else None
    causal, window, softcap = cfg.get("causal", False), cfg.get("window", (-1, -1)), cfg.get("softcap", 0.0)

    to = dict(device=device, dtype=dtype)
    q, k_cache, v_cache = q.to(**to), k_cache.to(**to), v_cache.to(**to)
    k, v = (None, None) if k is None else (k.to(**to), v.to(**to))
    cos, sin = (None, None) if cos is None else (cos.to(**to), sin.to(**to))
    seq_arg = seqlens if isinstance(seqlens, int) else torch.tensor(seqlens, dtype=torch.int32, device=device)
    dev = lambda t: None if t is None else t.to(device)
    k_before, v_before = k_cache.clone(), v_cache.clone()

    out, lse = flashattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seq_arg,
        cache_batch_idx=dev(batch_idx), cache_leftpad=dev(leftpad), block_table=dev(block_table), causal=causal,
        window_size=window, softcap=softcap, rotary_interleaved=rotary == "inter", alibi_slopes=dev(alibi),
        num_splits=cfg.get("num_splits", 0), return_softmax_lse=True)
    assert out.shape == (b, sq, h, d) and lse.shape == (b, h, sq)

    # Expected cache after the append and the per-row reference, on the CPU.
    q, k_cache, v_cache, k_before, v_before = (t.cpu() for t in (q, k_cache, v_cache, k_before, v_before))
    k, v, cos, sin = (None if t is None else t.cpu() for t in (k, v, cos, sin))

    def locate(row, pos):
        if page:
            return int(block_table[row, pos // page]), pos % page
        return (int(batch_idx[row]) if batch_idx is not None else row), pos

    ordered = causal or window != (-1, -1)
    outs_ref, outs_naive = [], []
    for row in range(b):
        filled = lens[row]
        pad = int(leftpad[row]) if leftpad is not None else 0
        if s_new:
            knew = k[row:row + 1]
            if rotary:
                pos = torch.arange(filled, filled + s_new)[None]
                knew = apply_rotary(knew, cos, sin, pos, rotary == "inter")
            for t in range(s_new):
                c, slot = locate(row, filled + t)
                k_before[c, slot] = knew[0, t]
                v_before[c, slot] = v[row, t]
        n = filled - pad + s_new
        where = [locate(row, pad + j) for j in range(n)]
        k_rows = torch.stack([k_before[c, slot] for c, slot in where]) if n else torch.zeros(0, hkv, d, dtype=dtype)
        v_rows = torch.stack([v_before[c, slot] for c, slot in where]) if n else torch.zeros(0, hkv, d, dtype=dtype)
        qr = q[row:row + 1]
        if rotary:
            pos = (filled + (torch.arange(sq) if ordered else torch.zeros(sq, dtype=torch.long)))[None]
            qr = apply_rotary(qr, cos, sin, pos, rotary == "inter")
        outs_ref.append(reference(qr[0], k_rows, v_rows, causal, window, softcap, alibi, torch.float64))
        outs_naive.append(reference(qr[0], k_rows, v_rows, causal, window, softcap, alibi, dtype))
    assert torch.equal(k_cache, k_before), "k_cache after the append differs from the expected cache"
    assert torch.equal(v_cache, v_before), "v_cache after the append differs from the expected cache"
    assert_2x(out.cpu(), torch.stack(outs_naive), torch.stack(outs_ref))
    assert torch.isfinite(lse).all()



def _random_cache_case(index):
    """Options of CASES drawn together from a fixed seed: page sizes 1-256 (and none), GQA up to 16, Sq 1-16,
    append or not, rotary, batch_idx, leftpad, splits. Every query row sees a key (each row holds at least Sq keys
    after its left pad), so the LSE is finite."""
    rng = random.Random(7000 + index)
    sq = rng.choice([1, 1, 2, 7, 16])
    s_new = rng.choice([0, sq])
    hkv = rng.choice([1, 2])
    cfg = dict(sq=sq, s_new=s_new, page=rng.choice([0, 0, 1, 7, 16, 64, 256]), hkv=hkv,
               h=hkv * rng.choice([1, 2, 4, 8, 16 // hkv]), causal=rng.random() < 0.5)
    lens = [rng.choice([sq, rng.randint(sq, 80), rng.randint(sq, 600)]) for _ in range(2)]
    cfg["seqlens"] = lens
    if rng.random() < 0.3:
        cfg["window"] = (rng.choice([-1, 0, 3, 40]), rng.choice([-1, 0, 5]))
    if rng.random() < 0.3:
        cfg["softcap"] = rng.choice([5.0, 30.0])
    if rng.random() < 0.3:
        cfg["alibi"] = True
    if s_new and rng.random() < 0.5:
        cfg["rotary"] = rng.choice(["inter", "neox"])
    if cfg["page"] == 0 and rng.random() < 0.3:
        cfg["batch_idx"] = True
    if rng.random() < 0.3:
        cfg["leftpad"] = [rng.randint(0, n + s_new - sq) for n in lens]
    if rng.random() < 0.3:
        cfg["num_splits"] = rng.choice([1, 2, 3, 8])
    return cfg, [torch.float32, torch.bfloat16, torch.float16][index % 3]


@pytest.mark.parametrize("index", range(18))
def test_random_cache_combinations(index, device):
    cfg, dtype = _random_cache_case(index)
    test_flash_attn_with_kvcache(f"random{index}", cfg, dtype, device)

def test_errors_name_the_argument():
    q = torch.randn(1, 1, 4, 64)
    cache = torch.randn(1, 16, 2, 64)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), torch.randn(1, 1, 2, 64), torch.randn(1, 1, 2, 64),
                                          cache_seqlens=16)
    with pytest.raises(ValueError, match="cache_seqlens"):  # k without cache_seqlens
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), torch.randn(1, 1, 2, 64), torch.randn(1, 1, 2, 64))
    with pytest.raises(ValueError, match="block_table"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=3,
                                          block_table=torch.tensor([[5]], dtype=torch.int32))
    with pytest.raises(TypeError, match="v_cache"):
        flashattn.flash_attn_with_kvcache(q, cache, cache.half(), cache_seqlens=3)


def test_decode_loop_matches_full_attention():
    """Token-by-token decode through a paged cache of page size 16 equals one causal call."""
    torch.manual_seed(0)
    b, s, h, hkv, d, page = 2, 37, 8, 2, 64, 16
    q, k, v = torch.randn(b, s, h, d), torch.randn(b, s, hkv, d), torch.randn(b, s, hkv, d)
    full = flashattn.flash_attn_func(q, k, v, causal=True)
    blocks = -(-s // page)
    k_cache, v_cache = torch.zeros(b * blocks, page, hkv, d), torch.zeros(b * blocks, page, hkv, d)
    table = torch.arange(b * blocks, dtype=torch.int32).flip(0).view(b, blocks)
    outs = []
    for t in range(s):
        seqlens = torch.full((b,), t, dtype=torch.int32)
        outs.append(flashattn.flash_attn_with_kvcache(q[:, t:t + 1], k_cache, v_cache, k[:, t:t + 1], v[:, t:t + 1],
                                                      cache_seqlens=seqlens, block_table=table, causal=True))
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("left_pad", [False, True])
def test_hf_generate_decodes_through_the_cache(left_pad, monkeypatch):
    """HF greedy generate with attn_implementation="flashattn": decode steps run flash_attn_with_kvcache
    (left padding as cache_leftpad) and give the tokens of "sdpa" on a small random-init Llama."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    if not hasattr(transformers, "AttentionInterface"):
        pytest.skip("transformers has no AttentionInterface (needs >= 4.48)")
    import flashattn.integrations.transformers as fa_hf
    import flashattn.kvcache as kvcache

    calls = []
    original = kvcache.flash_attn_with_kvcache

    def counting(*args, **kwargs):
        calls.append(kwargs.get("cache_leftpad") is not None)
        return original(*args, **kwargs)

    monkeypatch.setattr(kvcache, "flash_attn_with_kvcache", counting)
    fa_hf.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    ref = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa").float().eval()
    ours = transformers.LlamaForCausalLM._from_config(config, attn_implementation="flashattn").float().eval()
    ours.load_state_dict(ref.state_dict())
    ids = torch.randint(1, 96, (2, 11))
    mask = torch.ones_like(ids)
    if left_pad:
        mask[0, :4] = 0
    kw = dict(max_new_tokens=8, do_sample=False, attention_mask=mask, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(ours.generate(ids, **kw), ref.generate(ids, **kw))
    assert len(calls) >= 7 * config.num_hidden_layers, "decode steps did not use flash_attn_with_kvcache"
    assert any(calls) == left_pad
