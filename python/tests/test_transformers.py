"""HF transformers backend: a small random Llama, "flashattn" vs "sdpa", fp32."""
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")

import flashattn.integrations.transformers as fa_hf  # noqa: E402

if not hasattr(transformers, "AttentionInterface"):
    pytest.skip(f"transformers {transformers.__version__} has no AttentionInterface (needs >= 4.48)",
                allow_module_level=True)


def _models():
    from transformers import LlamaConfig, LlamaForCausalLM
    fa_hf.register()
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    ref = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").float()
    ours = LlamaForCausalLM._from_config(config, attn_implementation="flashattn").float()
    ours.load_state_dict(ref.state_dict())
    assert ours.config._attn_implementation == "flashattn"
    return ref, ours


def _step(model, **inputs):
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads(ga, gb):
    assert ga.keys() == gb.keys() and len(ga) > 0
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], rtol=1e-4, atol=1e-5, msg=name)


def test_logits_and_gradients_match_sdpa():
    ref, ours = _models()
    ids = torch.randint(0, 96, (2, 24))
    la, ga = _step(ref, input_ids=ids, labels=ids)
    lb, gb = _step(ours, input_ids=ids, labels=ids)
    torch.testing.assert_close(lb, la, rtol=1e-4, atol=1e-4)
    _assert_grads(ga, gb)


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_mask(side):
    ref, ours = _models()
    ids = torch.randint(0, 96, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    for row, n in ((1, 6), (2, 11)):
        if side == "right":
            mask[row, 20 - n:] = 0
        else:
            mask[row, :n] = 0
    labels = ids.masked_fill(mask == 0, -100)
    la, ga = _step(ref, input_ids=ids, attention_mask=mask, labels=labels)
    lb, gb = _step(ours, input_ids=ids, attention_mask=mask, labels=labels)
    keep = mask.bool()
    torch.testing.assert_close(lb[keep], la[keep], rtol=1e-4, atol=1e-4)
    _assert_grads(ga, gb)


def test_packed_batch_position_ids():
    ref, ours = _models()
    lens = [7, 12, 5]
    seqs = [torch.randint(0, 96, (1, n)) for n in lens]
    ids = torch.cat(seqs, dim=1)
    position_ids = torch.cat([torch.arange(n) for n in lens])[None]
    packed = ours(input_ids=ids, position_ids=position_ids).logits.detach()
    separate = torch.cat([ref(input_ids=s).logits.detach() for s in seqs], dim=1)
    torch.testing.assert_close(packed, separate, rtol=1e-4, atol=1e-4)

    # Gradients: the packed batch with flashattn equals the packed batch with sdpa (block mask from position_ids).
    labels = ids.clone()
    la, ga = _step(ref, input_ids=ids, position_ids=position_ids, labels=labels)
    lb, gb = _step(ours, input_ids=ids, position_ids=position_ids, labels=labels)
    torch.testing.assert_close(la, separate, rtol=1e-4, atol=1e-4)  # transformers builds the packed mask for sdpa
    torch.testing.assert_close(lb, la, rtol=1e-4, atol=1e-4)
    _assert_grads(ga, gb)


def test_packed_batch_cu_seq_lens_kwargs():
    # DataCollatorWithFlattening passes cu_seq_lens_q/k and max_length_q/k through the model's kwargs.
    _, ours = _models()
    lens = [9, 4, 11]
    ids = torch.randint(0, 96, (1, sum(lens)))
    position_ids = torch.cat([torch.arange(n) for n in lens])[None]
    cu = torch.tensor([0, 9, 13, 24], dtype=torch.int32)
    by_positions = ours(input_ids=ids, position_ids=position_ids).logits
    by_kwargs = ours(input_ids=ids, position_ids=position_ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                     max_length_q=11, max_length_k=11).logits
    torch.testing.assert_close(by_kwargs, by_positions, rtol=0, atol=0)


def test_generate_with_cache_matches_sdpa():
    ref, ours = _models()
    ids = torch.randint(0, 96, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding, as generation uses
    kw = dict(max_new_tokens=5, do_sample=False, attention_mask=mask, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **kw), ref.generate(ids, **kw))
